//! Rebuilds the crate when a migration is added or changed (they are embedded).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
