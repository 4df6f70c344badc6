//! The seam between the store and its backends: [`Driver`], one variant per backend module
//! (`postgres`, `mysql`, `sqlite`, each behind its Cargo feature), and the only place that
//! dispatches on the backend.
//!
//! **Enum, not trait.** The set of backends is closed and known at compile time; an enum
//! keeps dispatch static (no boxed futures: async functions in a `dyn` trait would need
//! them on every hot-path call), lets a variant vanish with its feature, and lets
//! [`with_conn!`] / [`with_tx!`] / [`with_write!`] type-check one portable body once per
//! backend with that backend's connection type — the Rust shape for a closed set (as
//! mini-redis dispatches commands). Not a stable API: nothing outside `store/` names it.
//!
//! # The operations whose SQL differs per backend
//! Each contract is written once, here; every backend's function of the same name honours it
//! and says only *how* (its module doc states how its backend differs). `now` is the bound
//! test-clock instant in epoch µs, or `None` for the database's clock, which every time
//! written by one statement is then read from.
//!
//! * [`enqueue`](Driver::enqueue) — inserts each job of `batch` as `pending`, `attempts` 0,
//!   `version` 1, `errors` `[]`, `run_at` from its [`RunAt`](crate::job::RunAt),
//!   `created_at = updated_at = now`, `partition_key`, and for a keyed job `unique_hold =
//!   unique_key`, `unique_scope`, `unique_until = now + period` (scope `for`). A job whose
//!   (kind, unique key) another job holds is not inserted — unless the holder's period has
//!   ended (`unique_until <= now`): then, in one transaction, a guarded row-locking `UPDATE`
//!   clears the holder's `unique_hold` and the job is inserted (ARCHITECTURE.md, *Unique
//!   scopes*). A holder still open (pending, never started, no children) is, as the job's
//!   [`OnDuplicate`](crate::job::OnDuplicate) asks, overwritten (payload, priority, run_at) or
//!   cancelled with the job inserted in its place, in one transaction, each write guarded by
//!   its version and openness (`keyed.rs`). Result, in input order: `Some` new id, `Some`
//!   holder's id with `duplicate: true` (also for a repeat of a key within the batch, which a
//!   replacing mode resolves against the first as a later enqueue would), or `None` when the key
//!   kept changing hands (holders released or archived) before it could be resolved — the
//!   caller tries that job again. Atomic per batch.
//! * [`claim`](Driver::claim) — guard: `queue` matches, state `pending`/`retrying`,
//!   `run_at <= now`, `kind` one of `kinds` when given (the node's handlers: a rolling deploy
//!   never burns an attempt on a node without the kind), skipping rows another claimer holds; up to `limit` in (priority,
//!   run_at, id) order. Writes `running`, `lease_owner`, `lease_token`, `lease_expires_at =
//!   now + lease`, `heartbeat_at = now`, `attempts + 1`, `version + 1`, `updated_at`, and
//!   clears `started_at` / `timeout_at`. Returns, in any order, each claimed row's
//!   `claim_columns!` (`expr.rs`: what the attempt runs with, and the claim order) as they
//!   now are — no more, since every column returned costs per job on both sides.
//! * [`renew`](Driver::renew) — guard per row: `(id, lease_token)` presented and state
//!   `running`. Writes `lease_expires_at = now + lease`, `heartbeat_at = now`; for a lease
//!   carrying `started_ago` whose start is not recorded yet: `started_at = now − ago`,
//!   `first_started_at` if unset, `timeout_at = started_at + timeout + grace`. Returns the
//!   renewed rows' (id, token, new expiry, cancel request); a missing row is a lost lease.
//!   Sent on the renewal lane, or — a hedge for an overdue renewal — on a connection opened
//!   for it alone (`RenewArgs::fresh`; SQLite uses its lane either way).
//! * [`finalize`](Driver::finalize) — guard per row: `(id, lease_token)` and `running`.
//!   Writes the outcome's state (a retry with its attempts used up becomes `dead`),
//!   `result`, `last_error` (cleared on success), appends the error to `errors`, `attempts −
//!   1` for a requeue, `run_at = now + delay` when there is a delay, `finished_at` for a
//!   terminal state, clears the lease columns and `timeout_at`, `version + 1`, `updated_at`;
//!   `started_at` and `first_started_at`, where still unset, `= now − started_ago` for an
//!   item carrying it (a handler that started and ended between two heartbeats);
//!   and `unique_hold = NULL` when the state reached is terminal and the key's scope is
//!   `while_active`.
//!   Returns the state each applied row reached and its `has_children` flag, read in the
//!   same statement (so a job without children costs nothing more); a missing row is a lost
//!   lease.
//! * [`vacuum_live`](Driver::vacuum_live) and [`listen`](Driver::listen) — PostgreSQL only;
//!   nothing (or no listener) elsewhere.
//! * [`wait_register`](Driver::wait_register) / [`wait_unregister`](Driver::wait_unregister)
//!   — PostgreSQL only (`store/waits.rs`): the job's row read `FOR SHARE` (an uncommitted end
//!   is waited for), and one more waiter in `jobvisor_waits` for a job that has not ended;
//!   one less. Elsewhere nothing is written and nothing is registered.
//! * On a connection the layer above holds itself — a caller's (the outbox, `outbox.rs`) or a
//!   handler's transaction's (`handler_tx/`) — what differs per backend is a method of
//!   [`BackendConnection`] and [`HandlerConnection`], implemented here for each backend's
//!   connection type: the enqueue (the contract of [`enqueue`](Driver::enqueue), in the
//!   caller's transaction), the checkout, `BEGIN` (SQLite: `BEGIN IMMEDIATE`), and the effect
//!   insert: of concurrent inserts of one
//!   `(job_id, effect_key)` exactly one writes, the others change nothing and report so
//!   without failing the transaction (PostgreSQL, SQLite: `ON CONFLICT DO NOTHING`; MySQL:
//!   the duplicate-key error, which rolls back that statement only).
//! * Migrations ([`run_migrations`], [`latest_migration`]) — each backend embeds its own
//!   folder and serialises concurrent migrators its own way.
//!
//! Everything else is written once, in the layer above this seam, with diesel's query builder
//! through the macros below: reclaim, archive, prune, cancel and manual retry in `maintain.rs`,
//! get, list and counts in `read.rs`, the portable controlled claim in `claim/steps.rs`, and
//! the rest in the files `mod.rs` maps each operation to.

use std::collections::HashMap;
use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use diesel::QueryResult;

use super::columns::RenewedRow;
pub(crate) use super::params::Notice;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::params::OpenError;
use super::params::{ClaimArgs, Claimed, NewEffect, RenewArgs};
use super::rows::ClaimRow;
use super::{Backend, Enqueued, Finalize, StoreOptions};
use crate::error::{Error, Result};
use crate::job::{JobState, NewJob};

#[cfg(feature = "mysql")]
use super::mysql::MysqlDriver;
#[cfg(feature = "postgres")]
use super::postgres::PgDriver;
#[cfg(feature = "sqlite")]
use super::sqlite::{SqliteAsync, SqliteDriver};

/// A store's backend: its connections, its own state, its statements.
// One per store, behind the store's `Arc`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driver {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(PgDriver),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(MysqlDriver),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteDriver),
}

/// The store's SQLite connection type (a handler's transaction runs on it).
#[cfg(feature = "sqlite")]
pub(crate) use super::sqlite::SqliteConn;

/// Makes the SQLite calls made on this thread run inline, to their end, before their futures
/// are handed back (`on`), or on tokio's blocking threads as usual: for a simulation that
/// runs every node on one thread (the other backends' calls are network I/O, which a
/// single-threaded runtime already drives in order).
#[cfg(all(feature = "test-util", feature = "sqlite"))]
pub(crate) fn sqlite_calls_inline(on: bool) {
    super::sqlite::set_inline(on);
}

/// A backend this build leaves out.
fn not_built(backend: Backend) -> Error {
    let feature = match backend {
        Backend::Postgres => "postgres",
        Backend::Mysql => "mysql",
        Backend::Sqlite => "sqlite",
    };
    Error::InvalidInput {
        field: "url",
        reason: format!(
            "{backend:?} is not compiled into this build of jobvisor; expected a URL of an \
             enabled backend, or the Cargo feature {feature:?}"
        ),
    }
}

/// Runs `$call` with `$d` bound to the driver of whichever backend `$driver` is: the one
/// dispatch of an operation every backend implements under the same name and signature.
macro_rules! dispatch {
    ($driver:expr, |$d:ident| $call:expr) => {
        match $driver {
            #[cfg(feature = "postgres")]
            $crate::store::driver::Driver::Postgres($d) => $call,
            #[cfg(feature = "mysql")]
            $crate::store::driver::Driver::Mysql($d) => $call,
            #[cfg(feature = "sqlite")]
            $crate::store::driver::Driver::Sqlite($d) => $call,
        }
    };
}

impl Driver {
    /// Opens `backend` on `target` (a URL, or SQLite's file path); `url` is the URL as given
    /// (for error messages, redacted).
    #[allow(unused_variables)] // each parameter is unused when its backends are left out
    pub(crate) async fn open(
        backend: Backend,
        target: &str,
        url: &str,
        opts: &StoreOptions,
    ) -> Result<Driver> {
        let connect_err = |reason: String| Error::Connect {
            url: crate::error::redact_url(url),
            reason,
        };
        match backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => match PgDriver::open(target, opts).await {
                Ok(d) => Ok(Driver::Postgres(d)),
                Err(OpenError::Url(e)) => Err(Error::InvalidInput {
                    field: "url",
                    reason: format!("{e} in {:?}", crate::error::redact_url(url)),
                }),
                Err(OpenError::Connect(e)) => Err(connect_err(e)),
            },
            #[cfg(feature = "mysql")]
            Backend::Mysql => match MysqlDriver::open(target, opts).await {
                Ok(d) => Ok(Driver::Mysql(d)),
                Err(OpenError::Url(e)) => Err(Error::InvalidInput {
                    field: "url",
                    reason: format!("{e} in {:?}", crate::error::redact_url(url)),
                }),
                Err(OpenError::Connect(e)) => Err(connect_err(e)),
            },
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let bound = statement_bound(Backend::Sqlite, opts);
                SqliteDriver::open(target, opts, bound)
                    .await
                    .map(Driver::Sqlite)
                    .map_err(connect_err)
            }
            #[allow(unreachable_patterns)] // reachable when a backend is left out
            other => Err(not_built(other)),
        }
    }

    /// Which backend.
    pub(crate) fn backend(&self) -> Backend {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Driver::Mysql(_) => Backend::Mysql,
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The main pool's connections and checkout statistics (the renewal lane is not
    /// counted: it is the node's own, one or two connections).
    pub(crate) fn pool_state(&self) -> bb8::State {
        dispatch!(self, |d| d.pool_state())
    }

    /// Enqueues a validated batch (see the module doc).
    pub(crate) async fn enqueue(
        &self,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        dispatch!(self, |d| d.enqueue(batch, now).await)
    }

    /// Whether the backend inserts with `INSERT … RETURNING` (MariaDB 10.6+, see the `mysql`
    /// module), which the outbox's enqueue on a caller's connection uses too.
    pub(crate) fn insert_returning(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(_) => false,
            #[cfg(feature = "mysql")]
            Driver::Mysql(d) => d.insert_returning,
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(_) => false,
        }
    }

    /// Claims due jobs (see the module doc).
    pub(crate) async fn claim(&self, a: &ClaimArgs) -> Result<Vec<ClaimRow>> {
        dispatch!(self, |d| d.claim(a).await)
    }

    /// Renews leases, on the renewal lane or, for a hedge, on a fresh connection (see the
    /// module doc).
    pub(crate) async fn renew(&self, a: &RenewArgs<'_>) -> Result<Vec<RenewedRow>> {
        dispatch!(self, |d| d.renew(a).await)
    }

    /// A controlled claim in fewer round trips than the portable one
    /// (`claim/controlled.rs`), for a queue whose row has at most a pause, a global limit and
    /// a per-partition limit: on PostgreSQL the row lock and one claim statement in one round
    /// trip with its `BEGIN` and `COMMIT`, so the lock every claim of the queue waits for is
    /// held through one statement and the commit instead of up to nine statements and the
    /// commit. Same contract; answers [`Route::Fast`](super::params::Route::Fast) with no jobs when the queue has no
    /// settings row. `None`: the backend has no claim of its own for these settings (MySQL,
    /// SQLite: none at all; PostgreSQL: a rate limit) — nothing was claimed, the portable
    /// claim is to run.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn claim_controlled(
        &self,
        a: &ClaimArgs,
    ) -> Result<Option<Claimed<ClaimRow>>> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) => d.claim_controlled(a).await,
            #[cfg(feature = "mysql")]
            Driver::Mysql(_) => Ok(None),
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(_) => Ok(None),
        }
    }

    /// Whether the backend's own controlled claim ([`Driver::claim_controlled`]) takes a
    /// per-partition limit (PostgreSQL); a queue with one otherwise goes straight to the
    /// portable claim.
    pub(crate) fn claims_partitions(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(_) => true,
            #[cfg(feature = "mysql")]
            Driver::Mysql(_) => false,
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(_) => false,
        }
    }

    /// Finalizes a batch, each job at most once (see the module doc).
    pub(crate) async fn finalize(
        &self,
        items: &[Finalize],
        now: Option<i64>,
    ) -> Result<HashMap<i64, (JobState, bool)>> {
        dispatch!(self, |d| d.finalize(items, now).await)
    }

    /// Reclaims the live table's dead space: `VACUUM` on PostgreSQL; nothing elsewhere
    /// (InnoDB purges by itself, SQLite reuses freed pages).
    pub(crate) async fn vacuum_live(&self) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) => d.vacuum_live().await,
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => Ok(()),
        }
    }

    /// Whether the backend notifies listeners of new jobs and changed settings
    /// ([`Driver::listen`]): PostgreSQL unless its notifications are off
    /// ([`StoreOptions::notifications`](super::StoreOptions::notifications)); the others
    /// are polled.
    pub(crate) fn notifies(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) => d.notify,
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => false,
        }
    }

    /// Registers a wait on job `id` for `ttl_us` µs (see the module docs); whether it did.
    #[allow(unused_variables)] // unused without PostgreSQL
    pub(crate) async fn wait_register(&self, id: i64, ttl_us: i64) -> Result<bool> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) if d.notify => d.wait_register(id, ttl_us).await,
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => Ok(false),
        }
    }

    /// Removes one wait on job `id` that [`Driver::wait_register`] counted.
    #[allow(unused_variables)] // unused without PostgreSQL
    pub(crate) async fn wait_unregister(&self, id: i64) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) => d.wait_unregister(id).await,
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => Ok(()),
        }
    }

    /// A wake-up listener (PostgreSQL's `LISTEN`), for a node or (`done`) for the waited
    /// jobs that ended; `None` elsewhere.
    #[allow(unused_variables)] // `limit` and `done` are unused without PostgreSQL
    pub(crate) async fn listen(&self, limit: Duration, done: bool) -> Result<Option<Listener>> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) if d.notify => {
                use super::postgres::listen::{DONE_CHANNEL, NODE_CHANNELS};
                let channels = if done { &[DONE_CHANNEL] } else { NODE_CHANNELS };
                Ok(Some(Listener {
                    pg: d.listen(limit, channels).await?,
                }))
            }
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => Ok(None),
        }
    }
}

/// What differs per backend on a connection the layer above holds itself: a caller's (the
/// outbox, `outbox.rs`) or a handler's transaction's ([`HandlerConnection`]). Implemented
/// here for each backend's connection type, so no file above names a backend.
pub(crate) trait BackendConnection: diesel_async::AsyncConnection + Send {
    /// The backend this connection talks to.
    const BACKEND: Backend;

    /// Enqueues a validated batch on this connection, inside its transaction if one is open
    /// (outside one, each statement commits by itself: a take-over's release and insert then
    /// commit one after the other, still one holder); the contract of [`Driver::enqueue`].
    /// `insert_returning`: the store's [`Driver::insert_returning`].
    fn enqueue_batch(
        &mut self,
        batch: &[&NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> impl Future<Output = QueryResult<Vec<Option<Enqueued>>>> + Send;
}

/// A connection of the store's own that a handler's transaction runs on (`handler_tx/`).
pub(crate) trait HandlerConnection: BackendConnection + Sized {
    /// Checks one out of the store's pool (on SQLite with the writer lock); `None` when the
    /// store is on another backend.
    fn checkout(
        driver: &Driver,
    ) -> impl Future<Output = Option<Result<Box<dyn DerefMut<Target = Self> + Send + '_>>>> + Send;

    /// Whether this store's transactions run guarded (MySQL on a Galera member:
    /// `mysql/galera_guard.rs`); passed back to the three steps below.
    fn guarded(_driver: &Driver) -> bool {
        false
    }

    /// `BEGIN` (SQLite: `BEGIN IMMEDIATE`, so the transaction is the only writer at once).
    fn begin(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// `COMMIT`.
    fn commit(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// `ROLLBACK`.
    fn rollback(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// Inserts an effect record unless its key is recorded (see the module doc): true if
    /// inserted.
    fn insert_effect(&mut self, e: &NewEffect) -> impl Future<Output = QueryResult<bool>> + Send;
}

/// `HandlerConnection`'s transaction steps for PostgreSQL: diesel-async's own.
#[cfg(feature = "postgres")]
macro_rules! network_transaction {
    () => {
        async fn begin(&mut self, _guarded: bool) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            <Self as diesel_async::AsyncConnection>::TransactionManager::begin_transaction(self)
                .await
        }

        async fn commit(&mut self, _guarded: bool) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            <Self as diesel_async::AsyncConnection>::TransactionManager::commit_transaction(self)
                .await
        }

        async fn rollback(&mut self, _guarded: bool) -> QueryResult<()> {
            use diesel_async::TransactionManager;
            <Self as diesel_async::AsyncConnection>::TransactionManager::rollback_transaction(self)
                .await
        }
    };
}

#[cfg(feature = "postgres")]
impl BackendConnection for diesel_async::AsyncPgConnection {
    const BACKEND: Backend = Backend::Postgres;

    async fn enqueue_batch(
        &mut self,
        batch: &[&NewJob],
        now: Option<i64>,
        _insert_returning: bool,
    ) -> QueryResult<Vec<Option<Enqueued>>> {
        // Inside the caller's transaction: its trigger notifies at the caller's commit.
        super::postgres::enqueue(self, batch, now, false).await
    }
}

#[cfg(feature = "postgres")]
impl HandlerConnection for diesel_async::AsyncPgConnection {
    async fn checkout(
        driver: &Driver,
    ) -> Option<Result<Box<dyn DerefMut<Target = Self> + Send + '_>>> {
        match driver {
            Driver::Postgres(d) => Some(d.conn(false).await.map(|c| Box::new(c) as _)),
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => None,
        }
    }

    network_transaction!();

    async fn insert_effect(&mut self, e: &NewEffect) -> QueryResult<bool> {
        super::postgres::insert_effect(self, e).await
    }
}

#[cfg(feature = "mysql")]
impl BackendConnection for diesel_async::AsyncMysqlConnection {
    const BACKEND: Backend = Backend::Mysql;

    async fn enqueue_batch(
        &mut self,
        batch: &[&NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> QueryResult<Vec<Option<Enqueued>>> {
        super::mysql::enqueue(self, batch, now, insert_returning, true, false).await
    }
}

#[cfg(feature = "mysql")]
impl HandlerConnection for diesel_async::AsyncMysqlConnection {
    async fn checkout(
        driver: &Driver,
    ) -> Option<Result<Box<dyn DerefMut<Target = Self> + Send + '_>>> {
        match driver {
            Driver::Mysql(d) => Some(d.conn(false).await.map(|c| Box::new(c) as _)),
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => None,
        }
    }

    fn guarded(driver: &Driver) -> bool {
        matches!(driver, Driver::Mysql(d) if d.galera)
    }

    async fn begin(&mut self, guarded: bool) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        if guarded {
            super::mysql::galera_guard::begin(self).await
        } else {
            diesel_async::AnsiTransactionManager::begin_transaction(self).await
        }
    }

    async fn commit(&mut self, guarded: bool) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        if guarded {
            super::mysql::galera_guard::commit(self).await
        } else {
            diesel_async::AnsiTransactionManager::commit_transaction(self).await
        }
    }

    async fn rollback(&mut self, guarded: bool) -> QueryResult<()> {
        use diesel_async::TransactionManager;
        if guarded {
            super::mysql::galera_guard::rollback(self).await
        } else {
            diesel_async::AnsiTransactionManager::rollback_transaction(self).await
        }
    }

    async fn insert_effect(&mut self, e: &NewEffect) -> QueryResult<bool> {
        super::mysql::insert_effect(self, e).await
    }
}

/// An application's SQLite connection (diesel-async's default), and the store's own.
#[cfg(feature = "sqlite")]
impl<S> BackendConnection
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection, S>
where
    Self: SqliteAsync,
{
    const BACKEND: Backend = Backend::Sqlite;

    async fn enqueue_batch(
        &mut self,
        batch: &[&NewJob],
        now: Option<i64>,
        _insert_returning: bool,
    ) -> QueryResult<Vec<Option<Enqueued>>> {
        super::sqlite::enqueue(self, batch, now).await
    }
}

#[cfg(feature = "sqlite")]
impl HandlerConnection for SqliteConn {
    async fn checkout(
        driver: &Driver,
    ) -> Option<Result<Box<dyn DerefMut<Target = Self> + Send + '_>>> {
        match driver {
            Driver::Sqlite(d) => Some(d.writer(false).await.map(|c| Box::new(c) as _)),
            #[allow(unreachable_patterns)] // reachable when another backend is compiled in
            _ => None,
        }
    }

    async fn begin(&mut self, _guarded: bool) -> QueryResult<()> {
        super::sqlite::begin_immediate(self).await
    }

    async fn commit(&mut self, _guarded: bool) -> QueryResult<()> {
        super::sqlite::commit(self).await
    }

    async fn rollback(&mut self, _guarded: bool) -> QueryResult<()> {
        super::sqlite::rollback(self).await
    }

    async fn insert_effect(&mut self, e: &NewEffect) -> QueryResult<bool> {
        super::sqlite::insert_effect(self, e).await
    }
}

/// The bound of one hot-path operation on `backend` (see
/// [`StoreOptions::statement_timeout`]): SQLite adds its busy timeout, the wait for another
/// process's write.
pub(crate) fn statement_bound(backend: Backend, opts: &StoreOptions) -> Duration {
    match backend {
        Backend::Sqlite => opts.statement_timeout.saturating_add(opts.busy_timeout),
        Backend::Postgres | Backend::Mysql => opts.statement_timeout,
    }
}

/// The connection a store's migrations run on: for the network backends, opened by the
/// store's connector (TLS, keepalives, bounds as every other connection); SQLite opens its
/// file itself.
pub(crate) enum MigrationConn {
    /// PostgreSQL, and whether its migrations take the advisory lock
    /// ([`StoreOptions::advisory_locks`](super::StoreOptions::advisory_locks)).
    #[cfg(feature = "postgres")]
    Postgres(Box<diesel_async::AsyncPgConnection>, bool),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(Box<diesel_async::AsyncMysqlConnection>),
    /// SQLite, at the store's path.
    #[cfg(feature = "sqlite")]
    File,
}

impl Driver {
    /// Opens the connection migrations run on.
    ///
    /// # Errors
    /// The connection's failure, as text (password scrubbed by the connector).
    pub(crate) async fn migration_conn(&self) -> std::result::Result<MigrationConn, String> {
        match self {
            #[cfg(feature = "postgres")]
            Driver::Postgres(d) => d
                .connector
                .diesel()
                .await
                .map(|c| MigrationConn::Postgres(Box::new(c), d.advisory))
                .map_err(|e| e.to_string()),
            #[cfg(feature = "mysql")]
            Driver::Mysql(d) => d
                .connector
                .diesel()
                .await
                .map(|c| MigrationConn::Mysql(Box::new(c)))
                .map_err(|e| e.to_string()),
            #[cfg(feature = "sqlite")]
            Driver::Sqlite(_) => Ok(MigrationConn::File),
        }
    }
}

/// Runs the pending migrations on `conn` (SQLite: on the file at `target`); blocking, see
/// `migrate.rs`.
#[allow(unused_variables)] // each parameter is unused when its backends are left out
pub(crate) fn run_migrations(
    conn: MigrationConn,
    target: &str,
    busy_ms: u128,
) -> std::result::Result<(), super::embedded::BoxError> {
    match conn {
        #[cfg(feature = "postgres")]
        MigrationConn::Postgres(c, advisory) => super::postgres::run_migrations(*c, advisory),
        #[cfg(feature = "mysql")]
        MigrationConn::Mysql(c) => super::mysql::run_migrations(*c),
        #[cfg(feature = "sqlite")]
        MigrationConn::File => super::sqlite::run_migrations(target, busy_ms),
    }
}

/// The latest migration version this build embeds for `backend`.
pub(crate) fn latest_migration(backend: Backend) -> String {
    match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => super::postgres::latest_migration(),
        #[cfg(feature = "mysql")]
        Backend::Mysql => super::mysql::latest_migration(),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => super::sqlite::latest_migration(),
        #[allow(unreachable_patterns)] // reachable when a backend is left out
        _ => String::new(),
    }
}

/// A wake-up channel from the database: PostgreSQL's `LISTEN` (the other backends have
/// none). Notifications that arrive while no one awaits [`Listener::next`] are buffered.
#[derive(Debug)]
pub(crate) struct Listener {
    #[cfg(feature = "postgres")]
    pg: super::postgres::listen::PgListener,
}

impl Listener {
    /// The next notice; `None` when the connection is gone (listen again).
    #[cfg(feature = "postgres")]
    pub(crate) async fn next(&mut self) -> Option<Result<Notice>> {
        self.pg.next().await
    }

    /// Never constructed without PostgreSQL.
    #[cfg(not(feature = "postgres"))]
    pub(crate) async fn next(&mut self) -> Option<Result<Notice>> {
        None
    }
}

/// Runs `$body` with `$conn` bound to a pooled connection of whichever backend the store
/// uses, for reads (on SQLite: no writer lock). The body is type-checked once per backend,
/// so it may only use portable SQL.
macro_rules! with_conn {
    ($store:expr, |$conn:ident| $body:expr) => {
        $crate::store::driver::dispatch!(&$store.inner.driver, |d| {
            let mut c = d.reader().await?;
            let $conn = &mut *c;
            $body
        })
    };
}

/// Like `with_conn!`, for a single-statement write: on SQLite the connection comes with the
/// writer lock.
macro_rules! with_write {
    ($store:expr, |$conn:ident| $body:expr) => {
        $crate::store::driver::dispatch!(&$store.inner.driver, |d| {
            let mut c = d.writer(false).await?;
            let $conn = &mut *c;
            $body
        })
    };
}

/// Like `with_write!`, but runs `$body` inside a transaction (`BEGIN IMMEDIATE` on SQLite,
/// so a read-then-write never fails on a lock upgrade). `$body` returns `QueryResult<T>`.
/// A transaction the server rolled back whole (a deadlock victim, a serialization failure,
/// a Galera certification conflict: `retry.rs`) applied nothing and runs again, after a
/// pause, on the same connection.
macro_rules! with_tx {
    ($store:expr, |$conn:ident| $body:expr) => {
        match &$store.inner.driver {
            #[cfg(feature = "postgres")]
            $crate::store::driver::Driver::Postgres(d) => {
                let mut c = d.conn(false).await?;
                $crate::store::driver::tx_retried!(c, |$conn| $body)
            }
            #[cfg(feature = "mysql")]
            $crate::store::driver::Driver::Mysql(d) => {
                let mut c = d.conn(false).await?;
                $crate::store::driver::tx_retried!(c, galera d.galera, |$conn| $body)
            }
            #[cfg(feature = "sqlite")]
            $crate::store::driver::Driver::Sqlite(d) => {
                let mut c = d.writer(false).await?;
                $crate::store::sqlite::immediate(&mut c, async |$conn| $body).await
            }
        }
    };
}

/// `$body` in a transaction on connection `$c`, again while the server rolls it back whole
/// (`with_tx!`). With `galera $g`, on MySQL: guarded when `$g` (`mysql/galera_guard.rs`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! tx_retried {
    ($c:ident, galera $g:expr, |$conn:ident| $body:expr) => {{
        let guarded: bool = $g;
        $crate::store::driver::tx_retried!(@retry {
            $crate::store::mysql::galera_guard::transaction!(&mut *$c, guarded, |$conn| $body)
        })
    }};
    ($c:ident, |$conn:ident| $body:expr) => {
        $crate::store::driver::tx_retried!(@retry {
            diesel_async::AsyncConnection::transaction(&mut *$c, async |$conn| $body).await
        })
    };
    (@retry $run:block) => {{
        let mut tries = 0;
        loop {
            tries += 1;
            match $run {
                Err(e)
                    if tries < $crate::store::retry::TRANSIENT_TRIES
                        && $crate::store::retry::RolledBack::rolled_back(&e) =>
                {
                    $crate::store::retry::pause_before_retry(tries).await;
                }
                res => break res,
            }
        }
    }};
}

/// Like `with_conn!`, for the change signal, on a connection of its own where the backend
/// has one (MySQL: no checkout ping for a read made 20 times a second; reopened after any
/// failure); elsewhere a pooled one. `$body` returns `QueryResult<T>`; the macro `Result<T>`.
macro_rules! with_signal_conn {
    ($store:expr, |$conn:ident| $body:expr) => {
        match &$store.inner.driver {
            #[cfg(feature = "postgres")]
            $crate::store::driver::Driver::Postgres(d) => {
                let mut c = d.conn(false).await?;
                let $conn = &mut *c;
                $body.map_err($crate::Error::from)
            }
            #[cfg(feature = "mysql")]
            $crate::store::driver::Driver::Mysql(d) => {
                let mut c = d.signal_conn().await?;
                let res = {
                    let $conn = &mut *c;
                    $body
                };
                // Kept only after a read that succeeded: any error closes it.
                if res.is_ok() {
                    c.keep();
                }
                res.map_err($crate::Error::from)
            }
            #[cfg(feature = "sqlite")]
            $crate::store::driver::Driver::Sqlite(d) => {
                let mut c = d.reader().await?;
                let $conn = &mut *c;
                $body.map_err($crate::Error::from)
            }
        }
    };
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use tx_retried;
pub(crate) use {dispatch, with_conn, with_signal_conn, with_tx, with_write};
