//! The embedded-migration helpers every backend uses, below the backends: the latest version
//! a build embeds, and the one locked-migrate routine of the network backends (lock, run,
//! unlock). `migrate.rs`, above the seam, decides when to migrate and checks the schema.

use diesel::migration::MigrationSource;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel::Connection;
use diesel_migrations::EmbeddedMigrations;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel_migrations::MigrationHarness;

/// An error of the migration harness.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The latest version in `source`, read as backend `DB`'s migrations.
pub(crate) fn latest_version<DB: diesel::backend::Backend>(source: &EmbeddedMigrations) -> String
where
    EmbeddedMigrations: MigrationSource<DB>,
{
    MigrationSource::<DB>::migrations(source)
        .ok()
        .and_then(|ms| ms.iter().map(|m| m.name().version().to_string()).max())
        .unwrap_or_default()
}

/// Runs `source`'s pending migrations on `conn` (a dedicated synchronous connection) between
/// the statements `lock` and `unlock`: diesel_migrations takes no lock, and several processes
/// migrating one database at once would race. The lock is released even when a migration
/// fails; the migration's error wins over the unlock's.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn migrate_locked<C, S>(
    conn: &mut C,
    lock: &str,
    unlock: &str,
    source: S,
) -> Result<(), BoxError>
where
    C: Connection + MigrationHarness<C::Backend>,
    S: MigrationSource<C::Backend>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>
        + diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(diesel::sql_query(lock), conn)?;
    let res = conn.run_pending_migrations(source).map(|_| ());
    let unlocked = diesel::RunQueryDsl::execute(diesel::sql_query(unlock), conn);
    res?;
    unlocked?;
    Ok(())
}
