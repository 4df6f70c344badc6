//! The job store: the only code in jobvisor that speaks SQL.
//!
//! [`Store`] is a cheap-to-clone connection handle for one of three backends (PostgreSQL,
//! MySQL/MariaDB, SQLite), chosen by the URL given to [`Store::connect`]. Every state
//! transition of ARCHITECTURE §4 is one crate-private method taking a `*Params` struct that carries
//! `now` (`None`: the database's clock decides; `Some`: a test clock's instant is bound
//! instead). Writes by a lease holder present its lease token in the
//! SQL and report a lost guard as `Guarded::LeaseLost` — an outcome, not an error.
//!
//! # Layout, in layers — one per place in the tree
//! 1. **The entry points on [`Store`]**, a file or folder per noun at this root, written once
//!    for every backend with diesel's query builder: `claim/` (the claim's one home: its
//!    entry, each queue's route, the controlled claim as named steps, the partition search),
//!    `jobs` (enqueue, renew, finalize: validation, bounds, retries, matching results),
//!    `maintain` (reclaim, archive, prune, cancel, manual retry), `read` (get, list, counts),
//!    `gauges`, `outbox` (enqueue in the caller's transaction), `handler_tx/` (a handler's own
//!    transaction on the store's connection: the lease guard, the completion, effect
//!    records), `migrate`, `connect` (URL → backend, open), `browse` (the dashboard's reads),
//!    `dependencies`, `nodes`, `leader`, `schedules`, `queues`, `audit` (operator actions),
//!    `watch` (the versions the dashboard's live pages show), `throughput` (the history's
//!    rollup), `waits` (the waits a job's end is announced to); `conformance/` is the suite
//!    that runs each case on every backend.
//! 2. **The seam, `driver.rs`**: `Driver`, one variant per backend, the contract of each
//!    operation whose SQL differs (columns written, guard, result), one `dispatch!` per
//!    operation, and what differs per connection type (`BackendConnection`,
//!    `HandlerConnection`). No other file above names a backend's variant or module (CI's
//!    boundary check; its one exception, `connect.rs`, is listed there with its reason).
//! 3. **One folder per backend**, each behind its Cargo feature, each opening with how its
//!    backend differs: `postgres/` (`COPY`, `LISTEN`, array statements), `mysql/` (no
//!    `UPDATE … RETURNING`; MariaDB's `INSERT … RETURNING`), `sqlite/` (one writer, taken
//!    structurally). Each owns its connection setup, its state and its statements (`sql.rs`).
//!    No backend module imports another.
//! 4. **`common/`, below the backends**: `params` (the vocabulary, and the seam's arguments and
//!    answers), `rows`, `schema`, `columns` (what several backends' statements share), `expr`
//!    (custom SQL expressions), `errors` (classification), `options`, `pool` (the two-lane
//!    pool, connection attempts), `timeout` (bounded operations, poisoned connections), `tls`,
//!    `embedded` (migration helpers), `keyed` (the keyed-enqueue loop), `retry`, `wakes`,
//!    `ledger` (the execution ledger's rows), `dedicated_conn` (a connection outside the pools),
//!    `statement_count` and `faults` (test
//!    builds only). This file names them by their short path (`super::rows`).
//!
//! A module imports its own layer or those below it, never one above, and no modules import
//! each other in a circle: CI checks both from the imports and reads each module's layer from
//! where it lives (`.ci/store-layers`).
//!
//! # Operation → file
//! A new operation goes in the file of its noun (a new noun: a new file at this root).
//!
//! | operation | entry point | SQL |
//! |---|---|---|
//! | claim (the fetcher's one entry, `Store::claim`) and each queue's route | `claim/mod.rs`, `claim/route.rs` | `driver.rs` → each backend's `mod.rs` + `sql.rs` |
//! | claim of a paused or limited queue | `claim/controlled.rs` (steps in order) | PostgreSQL's own in `postgres/`; else portable, `claim/steps.rs` |
//! | the partition search of a limited claim | `claim/partitions.rs` | scan text per backend (`ScanSql`) in each backend's `sql.rs` |
//! | enqueue, renew, finalize (the rest of the hot path) | `jobs.rs` | `driver.rs` → each backend's `mod.rs` + `sql.rs` |
//! | queue settings (pause, limits), the change signal | `queues.rs` (the types: `crate::queue`) | portable |
//! | reclaim, archive, prune, cancel, manual retry | `maintain.rs` | portable (diesel's query builder) |
//! | enqueue after parents, batches, settle a parent's children, cascade cancel | `dependencies.rs` | portable, each backend's enqueue |
//! | start-by deadlines: write at enqueue, the sweeper's expiry | `deadlines.rs` | portable |
//! | append to an ordered sequence, prune its row | `sequences.rs` (from `dependencies.rs`'s enqueue) | portable |
//! | get, list, counts, lags, search | `read.rs` | portable |
//! | enqueue in the caller's transaction | `outbox.rs` | each backend's enqueue, through `driver.rs` |
//! | a handler's transaction: lease guard, completion, effect records | `handler_tx/` | portable; `BEGIN` and the effect insert through `driver.rs` |
//! | node registry, unserved jobs | `nodes.rs` | portable |
//! | database-wide gauges | `gauges.rs` | portable |
//! | leader election | `leader.rs` | portable |
//! | periodic schedules | `schedules.rs` | portable |
//! | connect, options, TLS | `connect.rs`, `common/options.rs`, `common/tls.rs` | each backend's connection set-up |
//! | the audit log: record, read newest first, prune | `audit.rs` | portable |
//! | throughput history: roll up with the gauges, read a day | `throughput.rs` | portable |
//! | migrations and the schema check | `migrate.rs` | `migrations/<backend>/` |

use std::sync::Arc;

mod audit;
mod browse;
mod claim;
mod common;
mod connect;
mod deadlines;
pub(crate) mod dependencies;
pub(crate) mod driver;
mod gauges;
pub(crate) mod handler_tx;
mod jobs;
mod leader;
mod maintain;
// The guard catalogue's switch: a guard taken out on purpose (test builds only).
mod migrate;
pub(crate) mod mutation;
#[cfg(feature = "mysql")]
mod mysql;
mod nodes;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
mod queues;
mod read;
mod schedules;
mod sequences;
#[cfg(feature = "sqlite")]
mod sqlite;
mod throughput;
mod waits;
// The dashboard's live stream's read.
#[cfg(feature = "web")]
mod watch;

// The helpers below the backends live in `common/`; every module of the store names them by
// their short path (`super::rows`, `crate::store::params`).
#[cfg(feature = "mysql")]
use common::dedicated_conn;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use common::errors;
pub(crate) use common::ledger;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use common::migrate_lock;
pub(crate) use common::params;
use common::{
    columns, embedded, expr, keyed, options, pool, retry, rows, schema, timeout, tls, wakes,
};
#[cfg(feature = "test-util")]
pub(crate) use common::{faults, statement_count};
use handler_tx::effects;
/// A seeded simulation restarts the spread of retry pauses with each run.
#[cfg(feature = "test-util")]
pub(crate) use retry::restart_spread as restart_retry_spread;

#[cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
pub mod conformance;

pub use crate::new_job::DEFAULT_MAX_PAYLOAD_BYTES;
pub use crate::queue::{
    QueueInfo, QueueLimits, RateLimit, MAX_LIMIT, MAX_PAUSED_BY_LEN, MAX_RATE_PERIOD,
    MIN_RATE_PERIOD, RATE_START_MARGIN,
};
pub use audit::{AuditAction, AuditEntry};
#[cfg_attr(not(feature = "web"), allow(unused_imports))]
pub(crate) use browse::{fire_instant, Browse, MAX_DEAD_GROUPS};
pub(crate) use columns::bound as bound_us;
pub(crate) use driver::{Listener, Notice};
pub(crate) use effects::validate_key as validate_effect_key;
pub use effects::{Effect, Recorded, MAX_EFFECT_KEY_LEN};
pub(crate) use gauges::{GaugeSnapshot, StoredGauges};
#[doc(hidden)]
pub use handler_tx::Completion;
pub use handler_tx::JobConnection;
#[cfg(feature = "sqlite")]
pub use handler_tx::SqliteJobConnection;
pub(crate) use leader::leader_fence;
pub use leader::Leader;
pub use nodes::{NodeInfo, Unserved, UnservedReason, NODE_GONE_AFTER};
pub(crate) use options::RENEW_LANE_SIZE;
pub use options::{
    Backend, StoreOptions, TcpKeepalive, DEFAULT_BUSY_TIMEOUT, DEFAULT_CONNECT_ATTEMPT_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE, DEFAULT_SERVER_STATEMENT_TIMEOUT,
    DEFAULT_SQLITE_POOL_SIZE, DEFAULT_STATEMENT_TIMEOUT, DEFAULT_TCP_USER_TIMEOUT,
};
pub use outbox::OutboxConnection;
pub use params::NewEffect;
pub(crate) use params::{
    ArchiveParams, CancelParams, ClaimParams, Claimed, ClaimedJob, EnqueueParams, Finalization,
    Finalize, FinalizeParams, LeaseRef, PruneParams, ReclaimParams, Reclaimed, RenewParams,
    Renewed, RetryParams,
};
pub use params::{
    CancelOutcome, Enqueued, Guarded, ListParams, QueueLag, ReclaimReason, RetryOutcome, StateCount,
};
#[cfg(all(feature = "test-util", feature = "postgres"))]
pub(crate) use pool::with_query;
pub(crate) use queues::{ChangeSignal, GAP_SPAN};
pub use read::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
pub(crate) use rows::from_us;
pub(crate) use schedules::{Fire, Put, SyncMode};
#[cfg(feature = "sqlite")]
#[doc(hidden)]
pub use sqlite::SqliteRunner;
pub use tls::TlsMode;

impl Store {
    /// The main pool's connections and checkout statistics (for the pool metrics).
    pub(crate) fn pool_state(&self) -> bb8::State {
        self.inner.driver.pool_state()
    }

    /// Opens a listener for wake-ups, on PostgreSQL; `None` on backends without one.
    ///
    /// Its connection is opened like the pool's (see [`StoreOptions`]): TCP keepalives and
    /// `TCP_USER_TIMEOUT` close it when the server is cut off, after which
    /// [`Listener::next`] returns `None`, and each attempt to open it is bounded.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) (transient) when the connection or
    /// `LISTEN` fails.
    pub(crate) async fn listen(&self) -> crate::error::Result<Option<Listener>> {
        self.inner
            .driver
            .listen(self.inner.statement_bound(), false)
            .await
    }

    /// A listener of the waited jobs that reached a terminal state ([`Notice::Done`],
    /// PostgreSQL, for [`Client::wait`](crate::Client::wait)); `None` on the other backends.
    ///
    /// # Errors
    /// As [`Store::listen`].
    pub(crate) async fn listen_done(&self) -> crate::error::Result<Option<Listener>> {
        self.inner
            .driver
            .listen(self.inner.statement_bound(), true)
            .await
    }

    /// Whether [`Store::listen`] offers a listener (PostgreSQL); nodes of the other
    /// backends poll a change signal instead.
    pub(crate) fn notifies(&self) -> bool {
        self.inner.driver.notifies()
    }
}

#[cfg(feature = "test-util")]
impl Store {
    /// Runs raw SQL on the store's database (tests corrupt rows as something other than
    /// jobvisor might): [`crate::testing::exec_sql`].
    pub(crate) async fn exec_raw(&self, sql: &str) -> crate::error::Result<()> {
        use diesel_async::SimpleAsyncConnection;
        driver::with_write!(self, |conn| {
            conn.batch_execute(sql).await?;
        });
        Ok(())
    }
}

/// A connection handle on the job tables of one database: [`connect`](Store::connect),
/// [`connect_with`](Store::connect_with), [`options`](Store::options),
/// [`backend`](Store::backend), [`migrate`](Store::migrate). Clone it freely: clones share the
/// pool. Applications enqueue and inspect jobs through a [`Client`](crate::Client) made from
/// it; the scheduler's actors run the lease holder's operations on it.
///
/// The hot-path operations (enqueue, claim, renew, finalize, reclaim) give up after
/// [`StoreOptions::statement_timeout`] (an enqueue after that much per started 1,000 jobs or
/// 4 MiB of payload) with a transient [`Error::Database`](crate::Error::Database) naming the
/// operation, the bound and what it was waiting for; a connection one of them gave up on is
/// closed, never reused. Renewals run on connections of their own. Enqueueing on the
/// caller's connection ([`Client::enqueue_in`](crate::Client::enqueue_in)) is the caller's to
/// bound.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// What a store's clones share.
pub(crate) struct Inner {
    /// The backend: its pools, its own state, its statements.
    pub(crate) driver: driver::Driver,
    /// The URL as given, for migrations (which open their own connection). Never logged.
    pub(crate) url: String,
    pub(crate) url_redacted: String,
    pub(crate) opts: StoreOptions,
    /// The route each queue's claims take, as last seen (see `claim`).
    pub(crate) routes: claim::Routes,
    /// The fault plan a simulation installed, if any (feature `test-util` only).
    #[cfg(feature = "test-util")]
    pub(crate) faults: faults::FaultSlot,
}

impl Inner {
    /// The bound of one hot-path operation (see [`StoreOptions::statement_timeout`]).
    pub(crate) fn statement_bound(&self) -> std::time::Duration {
        driver::statement_bound(self.driver.backend(), &self.opts)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.inner.driver.backend())
            .field("url", &self.inner.url_redacted)
            .finish_non_exhaustive()
    }
}
