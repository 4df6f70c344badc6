//! Shared below the backends: what several backends' statements, the seam and the entry
//! points use alike — no module here imports the store's layers above it.

pub(super) mod columns;
#[cfg(feature = "mysql")]
pub(super) mod dedicated_conn;
pub(super) mod embedded;
pub(super) mod errors;
pub(super) mod expr;
// Store faults for simulation: a plan asked by each hot-path operation.
#[cfg(feature = "test-util")]
pub(crate) mod faults;
pub(super) mod keyed;
// The migration lock in a row, for servers whose session locks do not serialise migrators.
pub(crate) mod ledger;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) mod migrate_lock;
pub(super) mod options;
// Public types in a crate-private module: the lease holder's part is reachable from outside
// only through `crate::testing` (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod params;
pub(super) mod pool;
pub(super) mod retry;
pub(super) mod rows;
pub(super) mod schema;
// Counts the statements of every connection (the cost model and its CI guard).
#[cfg(feature = "test-util")]
pub(crate) mod statement_count;
pub(super) mod timeout;
pub(super) mod tls;
pub(super) mod wakes;
