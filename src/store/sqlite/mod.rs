//! SQLite: one file, one writer at a time, no server.
//!
//! How it differs from the others, up front:
//! * **One writer.** Every write of this process goes through [`SqliteDriver::writer`], which
//!   takes the in-process writer lock before it hands out a connection; the pools are private
//!   to this module, so no operation can write without the lock. Waiting in the lock, the
//!   next write starts the moment the last ends; waiting in SQLite's busy handler instead
//!   sleeps in steps of up to 100 ms (measured: claims waiting ~30 ms behind a 3 ms
//!   finalize). Other processes on the same file still meet the busy timeout, which is why
//!   the statement bound is `statement_timeout + busy_timeout` here.
//! * **No row locks, no `SKIP LOCKED`**: a claim is `UPDATE … WHERE id IN (SELECT …)
//!   RETURNING` inside `BEGIN IMMEDIATE`, so a read-then-write never fails on a lock upgrade.
//! * **Batches as one JSON bind** (`jsonb_each`): renew is one cached statement, and so is
//!   finalize but for its successes (an `IN` list padded to two widths,
//!   [`sql::FinalizeSucceeded`]); keyless enqueue runs one multi-row insert. The claim's and
//!   the finalization's transactions are each one call into the connection's thread.
//! * No network: no keepalives, no server-side bounds, no `LISTEN` (nodes poll and wake
//!   in-process). WAL mode; migrations run in an exclusive transaction.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel::result::ConnectionError;
use diesel::sqlite::SqliteConnection;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::columns::{
    batch_json, holder, keyless_run, new_ids, new_row, overwrite, release, sorted_ids, FinalRow,
    Finalized, FinalizedRows, LastId, RenewedRow,
};
use super::keyed::{enqueue_keyed, Holder, KeyedSteps, Release};
use super::ledger::{Ending, Held, LedgerRow};
use super::params::{ClaimArgs, RenewArgs};
use super::pool::Lanes;
use super::rows::{dur_us, ClaimRow};
use super::schema::jobvisor_jobs as jobs;
use super::timeout::{in_bounded_op, set_phase, ConnPool, Connector, Manager, Phase, PooledConn};
use super::{Enqueued, Finalize, StoreOptions, DEFAULT_SQLITE_POOL_SIZE, RENEW_LANE_SIZE};
use crate::error::{Error, Result, StoreError};
use crate::job::{JobId, JobState, NewJob};

mod conn;
pub(crate) mod sql;

#[cfg(feature = "test-util")]
pub(crate) use conn::set_inline;
pub use conn::Detached as SqliteRunner;
pub(crate) use conn::{begin_immediate, commit, immediate, rollback, SqliteConn};

/// A SQLite connection diesel-async drives: the store's own, or an application's (the
/// outbox enqueues on it).
pub(crate) trait SqliteAsync:
    diesel_async::AsyncConnection<Backend = diesel::sqlite::Sqlite> + Send
{
}

impl<C> SqliteAsync for C where
    C: diesel_async::AsyncConnection<Backend = diesel::sqlite::Sqlite> + Send
{
}
use conn::Detached;

/// The migrations, embedded.
const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// A SQLite store's connections and its writer lock.
pub(crate) struct SqliteDriver {
    /// The main pool and the renewal lane.
    lanes: Lanes<SqliteConn>,
    /// This process's writes queue here (see the module doc). Taken only by
    /// [`SqliteDriver::writer`].
    writer: tokio::sync::Mutex<()>,
    /// The longest wait for the writer lock outside a bounded operation.
    lock_bound: Duration,
}

/// A connection that may write: it holds the writer lock until dropped (the connection goes
/// back to its pool first).
pub(crate) struct Writer<'a> {
    conn: PooledConn<'a, SqliteConn>,
    _lock: tokio::sync::MutexGuard<'a, ()>,
}

impl std::ops::Deref for Writer<'_> {
    type Target = SqliteConn;
    fn deref(&self) -> &SqliteConn {
        &self.conn
    }
}

impl std::ops::DerefMut for Writer<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConn {
        &mut self.conn
    }
}

impl SqliteDriver {
    /// The main pool's state (see [`Driver::pool_state`](super::driver::Driver::pool_state)).
    pub(crate) fn pool_state(&self) -> bb8::State {
        self.lanes.state()
    }

    /// Opens the file (created if missing, WAL mode) and the pools; the first open reports a
    /// bad file with its real cause (`Err(reason)`). `lock_bound`: the store's statement bound.
    pub(crate) async fn open(
        path: &str,
        opts: &StoreOptions,
        lock_bound: Duration,
    ) -> std::result::Result<SqliteDriver, String> {
        check_sqlite_path(Path::new(path))?;
        let busy_ms = opts.busy_timeout.as_millis();
        open(path.to_string(), busy_ms)
            .await
            .map_err(|e| format!("{e}; expected a writable SQLite file"))?;
        let size = opts.pool_size.unwrap_or(DEFAULT_SQLITE_POOL_SIZE);
        Ok(SqliteDriver {
            lanes: Lanes::new(
                sqlite_pool(opts, size, path),
                sqlite_pool(opts, RENEW_LANE_SIZE, path),
            ),
            writer: tokio::sync::Mutex::new(()),
            lock_bound,
        })
    }

    /// A connection for reads (no writer lock).
    pub(crate) async fn reader(&self) -> Result<PooledConn<'_, SqliteConn>> {
        self.lanes.checkout(false).await
    }

    /// A connection that may write, from the renewal lane if `renew`: takes this process's
    /// writer lock first, waiting at most the statement bound — a write that is stuck (an
    /// abandoned operation's statement still running, another process holding the file)
    /// makes the others fail transiently instead of queueing forever.
    pub(crate) async fn writer(&self, renew: bool) -> Result<Writer<'_>> {
        set_phase(Phase::WriterLock);
        let lock = if in_bounded_op() {
            // The operation's own bound covers this wait, and names the operation.
            self.writer.lock().await
        } else {
            let limit = self.lock_bound;
            tokio::time::timeout(limit, self.writer.lock())
                .await
                .map_err(|_| {
                    Error::Database(StoreError::Transient(format!(
                        "the SQLite writer lock was not free within {limit:?}: another write \
                         of this process is stuck"
                    )))
                })?
        };
        let conn = self.lanes.checkout(renew).await?;
        Ok(Writer { conn, _lock: lock })
    }

    /// [`Driver::enqueue`](super::driver::Driver::enqueue): see [`enqueue`], in one
    /// `BEGIN IMMEDIATE` transaction — except one job without a key, whose insert is one
    /// statement in autocommit: atomic alone, it takes the write lock itself and reads
    /// nothing first, so no lock upgrade can fail, and it saves two calls into the
    /// connection's thread (`BEGIN`, `COMMIT`), each a hand-off of its own.
    pub(crate) async fn enqueue(
        &self,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        let mut c = self.writer(false).await?;
        if let [job] = batch {
            if job.unique_key.is_none() {
                let id = insert_one(&mut *c, job, now).await?;
                return Ok(vec![id.map(|id| Enqueued {
                    id: JobId(id),
                    duplicate: false,
                    replaced: false,
                })]);
            }
        }
        Ok(immediate(&mut c, async |c| enqueue(c, batch, now).await).await?)
    }

    /// [`Driver::claim`](super::driver::Driver::claim): one `UPDATE … RETURNING`
    /// ([`sql::CLAIM`]) in `BEGIN IMMEDIATE`, all in one call on the connection's own thread
    /// ([`conn::immediate_in_place`]), its rows read by position there.
    pub(crate) async fn claim(&self, a: &ClaimArgs) -> Result<Vec<ClaimRow>> {
        let q = sql::ClaimRows::new(sql::SqliteClaim {
            now: a.now,
            owner: a.owner.clone(),
            token: a.token.clone(),
            lease_us: a.lease_us,
            queue: a.queue.clone(),
            any_kind: a.kinds.is_none(),
            kinds: serde_json::Value::from(a.kinds.clone().unwrap_or_default()).to_string(),
            limit: a.limit,
        });
        let mut c = self.writer(false).await?;
        Ok(conn::immediate_in_place(&mut c, move |c| diesel::RunQueryDsl::load(q, c)).await?)
    }

    /// [`Driver::renew`](super::driver::Driver::renew): one statement
    /// ([`sql::RENEW`]), the batch as one JSON array.
    pub(crate) async fn renew(&self, a: &RenewArgs<'_>) -> Result<Vec<RenewedRow>> {
        let batch: Vec<(i64, &str, Option<i64>, Option<&str>)> = a
            .leases
            .iter()
            .map(|l| {
                (
                    l.id.0,
                    l.token.as_str(),
                    l.started_ago.map(dur_us),
                    l.progress.as_deref(),
                )
            })
            .collect();
        let batch = serde_json::to_string(&batch)
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
        let mut c = self.writer(true).await?;
        Ok(sql::SqliteRenew {
            now: a.now,
            batch,
            lease_us: a.lease_us,
            grace_us: a.grace_us,
        }
        .load(&mut *c)
        .await?)
    }

    /// [`Driver::finalize`](super::driver::Driver::finalize): see [`finalize`].
    pub(crate) async fn finalize(
        &self,
        items: &[Finalize],
        now: Option<i64>,
    ) -> Result<HashMap<i64, (JobState, bool)>> {
        let mut c = self.writer(false).await?;
        Ok(finalize(&mut c, items, now).await?)
    }
}

/// The latest migration version embedded.
pub(crate) fn latest_migration() -> String {
    super::embedded::latest_version::<diesel::sqlite::Sqlite>(&MIGRATIONS)
}

/// Runs the pending migrations on a dedicated connection, in an exclusive transaction.
pub(crate) fn run_migrations(
    path: &str,
    busy_ms: u128,
) -> std::result::Result<(), super::embedded::BoxError> {
    use diesel::connection::SimpleConnection;
    let mut conn = SqliteConnection::establish(path)?;
    conn.batch_execute(&format!(
        "PRAGMA busy_timeout = {busy_ms}; PRAGMA journal_mode = WAL;"
    ))?;
    conn.exclusive_transaction(|c| -> std::result::Result<(), super::embedded::BoxError> {
        super::embedded::run_pending(c, MIGRATIONS)
    })
}

fn check_sqlite_path(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{} is a directory", path.display()));
    }
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(format!(
                "directory {} does not exist (the file is created, its directory is not)",
                parent.display()
            ));
        }
    }
    Ok(())
}

/// A pool of the store's SQLite connections to `path` (see [`open`]).
fn sqlite_pool(opts: &StoreOptions, size: u32, path: &str) -> ConnPool<SqliteConn> {
    let busy_ms = opts.busy_timeout.as_millis();
    let path = path.to_string();
    let connector: Connector<SqliteConn> = Box::new(move || {
        let path = path.clone();
        Box::pin(async move {
            open(path, busy_ms)
                .await
                .map_err(diesel_async::pooled_connection::PoolError::ConnectionError)
        })
    });
    // The diesel-async manager only answers whether a connection is broken; the connector
    // opens them. No ping at checkout: there is no server to lose.
    let mut cfg = ManagerConfig::<SqliteConn>::default();
    cfg.recycling_method = RecyclingMethod::Fast;
    let mgr = Manager::with_connector(
        AsyncDieselConnectionManager::new_with_config("", cfg),
        connector,
    );
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(opts.connect_timeout)
        .test_on_check_out(false)
        .build_unchecked(mgr)
}

/// Opens one of the store's connections to `path` (WAL mode, the busy timeout set), with the
/// count of its calls still running.
async fn open(
    path: String,
    busy_ms: u128,
) -> diesel::ConnectionResult<(SqliteConn, Arc<AtomicUsize>)> {
    let raw = if conn::inline() {
        SqliteConnection::establish(&path)?
    } else {
        tokio::task::spawn_blocking(move || SqliteConnection::establish(&path))
            .await
            .map_err(|e| ConnectionError::BadConnection(e.to_string()))??
    };
    let busy = Arc::new(AtomicUsize::new(0));
    let mut c = SqliteConn::with_runtime(raw, Detached::counting(busy.clone()));
    // Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is
    // locked" at once, without its busy handler, while another connection opens the same
    // file: retry within the busy timeout.
    let deadline = std::time::Instant::now()
        + Duration::from_millis(u64::try_from(busy_ms).unwrap_or(u64::MAX));
    loop {
        let res = c
            .batch_execute(&format!(
                "PRAGMA busy_timeout = {busy_ms}; PRAGMA journal_mode = WAL; \
                 PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;"
            ))
            .await;
        match res {
            Ok(()) => return Ok((c, busy)),
            Err(e)
                if e.to_string().contains("is locked") && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(ConnectionError::CouldntSetupConfiguration(e)),
        }
    }
}

/// SQLite: jobs without unique keys in one cached `INSERT … SELECT FROM json_each(?)`
/// (a `VALUES` list compiles in time quadratic in its binds). Ids ascend in array order.
async fn insert_many<C: SqliteAsync>(
    conn: &mut C,
    jobs: &[&NewJob],
    now: Option<i64>,
) -> diesel::QueryResult<Vec<i64>> {
    let batch = batch_json(jobs)?;
    let rows: Vec<LastId> = sql::SqliteInsertMany { now, batch }
        .load(&mut *conn)
        .await?;
    sorted_ids(rows, jobs.len())
}

/// SQLite (inside the caller's `BEGIN IMMEDIATE`): each run of jobs without a unique key is
/// one multi-row insert; a keyed job (or a lone one, whose insert is a cached prepared
/// statement) is one `INSERT … ON CONFLICT DO NOTHING RETURNING` — statements are in-process
/// calls, but each still costs its preparation and step.
pub(crate) async fn enqueue<C: SqliteAsync>(
    conn: &mut C,
    batch: &[&NewJob],
    now: Option<i64>,
) -> diesel::QueryResult<Vec<Option<Enqueued>>> {
    let mut out = Vec::with_capacity(batch.len());
    let mut i = 0;
    while i < batch.len() {
        let run = keyless_run(&batch[i..]);
        if run > 1 {
            out.extend(new_ids(insert_many(conn, &batch[i..i + run], now).await?));
            i += run;
            continue;
        }
        out.push(enqueue_one(conn, batch[i], now).await?);
        i += 1;
    }
    Ok(out)
}

/// SQLite, one row: `INSERT … ON CONFLICT DO NOTHING RETURNING id`; `None`: another job
/// holds the key.
async fn insert_one<C: SqliteAsync>(
    conn: &mut C,
    j: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<i64>> {
    diesel::insert_into(jobs::table)
        .values(new_row!(j, DbNow::new(now)))
        .on_conflict((jobs::kind, jobs::unique_hold))
        .do_nothing()
        .returning(jobs::id)
        .get_result(&mut *conn)
        .await
        .optional()
}

/// SQLite's steps of the keyed enqueue (`keyed.rs`): the hold is released by a guarded
/// `UPDATE`; the caller's transaction — the writer's `BEGIN IMMEDIATE` — makes the take-over
/// and the insert one step, and the only one.
struct SqliteKeyed<'c, C>(&'c mut C);

// SQLite announces by bumping the one-row counter the change signal reads.
super::wakes::announce_by_counter!(diesel::sqlite::Sqlite);

impl<C: SqliteAsync> KeyedSteps for SqliteKeyed<'_, C> {
    async fn insert(&mut self, job: &NewJob, now: Option<i64>) -> diesel::QueryResult<Option<i64>> {
        insert_one(self.0, job, now).await
    }

    async fn holder(
        &mut self,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<Holder>> {
        let conn = &mut *self.0;
        Ok(holder!(conn, job, now))
    }

    async fn replace(
        &mut self,
        holder: i64,
        release: Release,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<i64>> {
        let conn = &mut *self.0;
        if release!(conn, holder, release, now) == 0 {
            return Ok(None);
        }
        insert_one(conn, job, now).await
    }

    async fn overwrite(
        &mut self,
        holder: i64,
        version: i64,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<bool> {
        let conn = &mut *self.0;
        Ok(overwrite!(conn, holder, version, job, now) == 1)
    }
}

/// SQLite, one keyed job (`keyed::enqueue_keyed`).
async fn enqueue_one<C: SqliteAsync>(
    conn: &mut C,
    j: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    enqueue_keyed(&mut SqliteKeyed(conn), j, now).await
}

/// SQLite: a batch's successes by [`sql::FinalizeSucceeded`] (up to
/// [`sql::SUCCEEDED_MAX`] per statement), the rest by one cached `UPDATE … FROM
/// jsonb_each(…)` ([`sql::FINALIZE`]), in one transaction run in one call on the
/// connection's thread ([`conn::immediate_in_place`]); each row guarded by its own token.
/// The general statement's batch travels as one JSON bind: a `VALUES` list of 8 binds per
/// job made SQLite compile a new, long statement per batch, in time quadratic in its binds (a
/// third of a drain's CPU); the successes' lists are padded to two widths, each compiled once
/// per connection.
async fn finalize(
    conn: &mut SqliteConn,
    items: &[Finalize],
    now: Option<i64>,
) -> diesel::QueryResult<HashMap<i64, (JobState, bool)>> {
    type Item<'a> = (
        i64,
        &'a str,
        &'static str,
        Option<String>,
        Option<String>,
        Option<i64>,
        i32,
        Option<i64>,
    );
    let mut succeeded: Vec<sql::Succeeded> = Vec::new();
    let mut rest: Vec<Item<'_>> = Vec::new();
    for f in items {
        let row = FinalRow::from(f);
        if matches!(f.outcome, crate::store::Finalization::Succeeded { .. }) {
            succeeded.push((f.id.0, f.token.as_str().to_owned(), row.result, row.ago_us));
        } else {
            rest.push((
                f.id.0,
                f.token.as_str(),
                row.state,
                row.result,
                row.error,
                row.delay_us,
                row.refund,
                row.ago_us,
            ));
        }
    }
    let rest = if rest.is_empty() {
        None
    } else {
        Some(
            serde_json::to_string(&rest)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?,
        )
    };
    let n = items.len();
    // What the execution ledger records of each ending other than a success, with its token
    // (`store::ledger`): a success's claim stays on its job row (`last_*`), no row here.
    let endings: HashMap<i64, (String, Ending)> = items
        .iter()
        .filter(|f| !matches!(f.outcome, crate::store::Finalization::Succeeded { .. }))
        .map(|f| (f.id.0, (f.token.as_str().to_owned(), Ending::of(f))))
        .collect();
    let rows: Vec<Finalized> = conn::immediate_in_place(conn, move |c| {
        // The claims as the job rows hold them, read under the write lock before they end
        // (none read for a batch of successes: the drain's case).
        let ids: Vec<i64> = endings.keys().copied().collect();
        type HeldRow = (
            i64,
            Option<String>,
            i32,
            Option<String>,
            i64,
            Option<i64>,
            i64,
        );
        let held: Vec<HeldRow> = if ids.is_empty() {
            Vec::new()
        } else {
            diesel::RunQueryDsl::load(
                jobs::table
                    .select((
                        jobs::id,
                        jobs::lease_token,
                        jobs::attempts,
                        jobs::lease_owner,
                        jobs::updated_at,
                        jobs::started_at,
                        super::expr::DbNow::new(now),
                    ))
                    .filter(jobs::id.eq_any(ids))
                    .filter(super::expr::RUNNING),
                c,
            )?
        };
        let mut rows = Vec::with_capacity(n);
        for jobs in succeeded.chunks(sql::SUCCEEDED_MAX) {
            let q = FinalizedRows::<_, diesel::sqlite::Sqlite>::new(sql::FinalizeSucceeded {
                now,
                jobs,
            });
            rows.extend(diesel::RunQueryDsl::load::<Finalized>(q, c)?);
        }
        if let Some(batch) = rest {
            let q =
                FinalizedRows::<_, diesel::sqlite::Sqlite>::new(sql::SqliteFinalize { now, batch });
            rows.extend(diesel::RunQueryDsl::load::<Finalized>(q, c)?);
        }
        let mut held: HashMap<i64, Held> = held
            .into_iter()
            .filter(|(id, token, ..)| {
                endings
                    .get(id)
                    .is_some_and(|(t, _)| token.as_deref() == Some(t.as_str()))
            })
            .map(|(id, _, attempt, node, claimed_at, started_at, now)| {
                let node = node.unwrap_or_default();
                let h = Held {
                    node,
                    attempt,
                    claimed_at,
                    started_at,
                    now,
                };
                (id, h)
            })
            .collect();
        let mut endings = endings;
        let ledger: Vec<LedgerRow> = rows
            .iter()
            .filter_map(|r| {
                let h = held.remove(&r.id)?;
                let (_, e) = endings.remove(&r.id)?;
                Some(LedgerRow::ended(e, h, &r.state))
            })
            .collect();
        if !ledger.is_empty() {
            let rows: Vec<serde_json::Value> = ledger
                .iter()
                .map(|r| {
                    serde_json::json!([
                        r.job_id,
                        r.claim_id,
                        r.attempt,
                        r.node,
                        r.claimed_at,
                        r.started_at,
                        r.ended_at,
                        r.outcome,
                        r.code,
                        r.fence_margin_ms
                    ])
                })
                .collect();
            let rows = serde_json::Value::Array(rows).to_string();
            diesel::RunQueryDsl::execute(
                diesel::sql_query(sql::INSERT_LEDGER).bind::<diesel::sql_types::Text, _>(rows),
                c,
            )?;
        }
        Ok(rows)
    })
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let state = r.state.parse().unwrap_or(JobState::Retrying);
            (r.id, (state, r.has_children))
        })
        .collect())
}

/// Records an effect unless its key is recorded (see `driver.rs`): `INSERT … ON CONFLICT
/// DO NOTHING`; true if it inserted.
pub(crate) async fn insert_effect(
    conn: &mut SqliteConn,
    e: &super::params::NewEffect,
) -> QueryResult<bool> {
    super::columns::insert_effect_unless_recorded!(conn, e)
}
