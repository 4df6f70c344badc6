//! PostgreSQL: the reference backend, and the one with the most to offer.
//!
//! How it differs from the others, up front:
//! * **`UPDATE … RETURNING` and arrays**: claim, renew and finalize are each one prepared
//!   statement for the whole batch (`unnest` of array binds, rows found through the primary
//!   key: see [`sql`] for why each is shaped as it is); no transaction is needed around them.
//! * **`COPY`** ([`copy`]): batches of 1,000 or more jobs without unique keys are copied on a
//!   connection of their own, twice as fast as an `INSERT` at 20,000 jobs.
//! * **`LISTEN`/`NOTIFY`** ([`listen`]): an insert trigger wakes every node's fetchers at
//!   commit — the store's own inserts are announced just after it ([`after_commit`]), so
//!   they commit side by side; the other backends poll.
//! * **`VACUUM`**: the archiver vacuums the live table after large moves; the others need
//!   nothing.
//! * Connections ([`connect`]) get keepalives, `TCP_USER_TIMEOUT` and server-side bounds at
//!   both ends; migrations serialise on an advisory lock.

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::columns::{
    holder, overwrite, release, unique_parts, FinalRow, Finalized, FinalizedRows, LastId,
    RenewedRow,
};
use super::keyed::{after_conflict, enqueue_keyed, Holder, KeyedSteps, Release};
use super::params::{ClaimArgs, OpenError, RenewArgs};
use super::params::{Claimed, Route};
use super::pool::{pool, Lanes, Reuse};
use super::rows::{dur_ms, dur_us, to_us, ClaimRow};
use super::timeout::PooledConn;
use super::{Enqueued, Finalize, StoreOptions, DEFAULT_POOL_SIZE, RENEW_LANE_SIZE};
use crate::error::{Error, Result, StoreError};
use crate::job::{JobId, JobState, NewJob, OnDuplicate, RunAt};

pub(crate) mod after_commit;
pub(crate) mod connect;
pub(crate) mod copy;
pub(crate) mod listen;
pub(crate) mod sql;

use connect::PgConnector;
use copy::CopyConn;
use listen::PgListener;

/// The migrations, embedded.
const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Advisory lock key for migrations on PostgreSQL ("jobvisor" in ASCII, as a number).
const MIGRATION_LOCK_KEY: i64 = 0x6a6f_6276_6973_6f72;

/// A PostgreSQL store's connections and state.
pub(crate) struct PgDriver {
    /// The main pool and the renewal lane.
    lanes: Lanes<AsyncPgConnection>,
    /// How the listening and `COPY` connections are opened.
    pub(crate) connector: PgConnector,
    /// The connection large batches are copied over.
    copy: CopyConn,
    /// How long a controlled claim waits for its queue's row lock (`lock_timeout`): half the
    /// client's bound on the claim, so the server gives up first (see `claim_controlled`).
    claim_lock_wait: String,
    /// The queues whose lock last reported a per-partition limit: claimed with
    /// [`sql::CLAIM_PARTITIONED`]. Only a choice of statement — both are exact whatever
    /// the row says.
    partitioned: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Announces the queues of this store's own enqueues once they committed.
    after_commit: after_commit::AfterCommit,
    /// `LISTEN`/`NOTIFY` in use ([`StoreOptions::notifications`]).
    pub(crate) notify: bool,
    /// Migrations serialise on an advisory lock ([`StoreOptions::advisory_locks`]), else on
    /// a row.
    pub(crate) advisory: bool,
}

impl PgDriver {
    /// The main pool's state (see [`Driver::pool_state`](super::driver::Driver::pool_state)).
    pub(crate) fn pool_state(&self) -> bb8::State {
        self.lanes.state()
    }

    /// Opens the pools on `url`; a first connection reports the real reason a server cannot
    /// be reached (`Err(reason)`, password scrubbed).
    pub(crate) async fn open(
        url: &str,
        opts: &StoreOptions,
    ) -> std::result::Result<PgDriver, OpenError> {
        let connector = PgConnector::new(url, opts).map_err(OpenError::Url)?;
        connector.diesel().await.map_err(|e| {
            OpenError::Connect(super::errors::with_server_hint(
                super::errors::scrub(&super::errors::connection_error_text(&e), url),
                "a PostgreSQL server",
            ))
        })?;
        let setup =
            |c: &PgConnector| -> diesel_async::pooled_connection::SetupCallback<AsyncPgConnection> {
                let c = c.clone();
                Box::new(move |_: &str| {
                    let c = c.clone();
                    Box::pin(async move { c.diesel().await })
                })
            };
        let size = opts.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        Ok(PgDriver {
            lanes: Lanes::new(
                pool(opts, size, false, Reuse::Latest, setup(&connector)),
                pool(
                    opts,
                    RENEW_LANE_SIZE,
                    false,
                    Reuse::Oldest,
                    setup(&connector),
                ),
            ),
            connector,
            copy: CopyConn::default(),
            claim_lock_wait: lock_wait(opts.statement_timeout),
            partitioned: std::sync::Mutex::default(),
            after_commit: after_commit::AfterCommit::new(opts.statement_timeout),
            notify: opts.notifications,
            advisory: opts.advisory_locks,
        })
    }

    /// A pooled connection (renewals: `renew`, from their own lane).
    pub(crate) async fn conn(&self, renew: bool) -> Result<PooledConn<'_, AsyncPgConnection>> {
        self.lanes.checkout(renew).await
    }

    /// A pooled connection for reads (the seam's `with_conn!`): any of the pool's.
    pub(crate) async fn reader(&self) -> Result<PooledConn<'_, AsyncPgConnection>> {
        self.conn(false).await
    }

    /// A pooled connection for a write (the seam's `with_write!`): any of the pool's, there
    /// being no writer lock.
    pub(crate) async fn writer(&self, renew: bool) -> Result<PooledConn<'_, AsyncPgConnection>> {
        self.conn(renew).await
    }

    /// [`Driver::enqueue`](super::driver::Driver::enqueue): one row by a cached single-row
    /// insert, a batch by one `INSERT … SELECT FROM unnest(…)`, or by `COPY` (see [`copy`]).
    /// The inserts are quiet and their due queues announced once committed
    /// ([`after_commit`]); `COPY`'s trigger notifies.
    pub(crate) async fn enqueue(
        &self,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        if copy::eligible(batch) {
            // Boxed: a large batch's path, which would otherwise size every enqueue's future.
            return Box::pin(self.copy.enqueue(&self.connector, batch, now)).await;
        }
        let mut c = self.conn(false).await?;
        let out = enqueue(&mut c, batch, now, true).await?;
        drop(c);
        if !self.notify {
            return Ok(out); // new ids move the change signal the nodes read
        }
        let due = batch
            .iter()
            .zip(&out)
            .filter(|(j, e)| e.as_ref().is_some_and(|e| !e.duplicate) && due_now(j, now))
            .map(|(j, _)| j.queue.as_str());
        self.after_commit.announce(self.lanes.main(), due);
        Ok(out)
    }

    /// [`Driver::claim`](super::driver::Driver::claim): one `UPDATE … RETURNING` over the
    /// candidates locked with `SKIP LOCKED` ([`sql::CLAIM`]).
    pub(crate) async fn claim(&self, a: &ClaimArgs) -> Result<Vec<ClaimRow>> {
        let mut c = self.conn(false).await?;
        Ok(sql::ClaimRows::new(sql::PgClaim {
            now: a.now,
            lease_us: a.lease_us,
            owner: a.owner.clone(),
            token: a.token.clone(),
            queue: a.queue.clone(),
            any_kind: a.kinds.is_none(),
            kinds: a.kinds.clone().unwrap_or_default(),
            queue_again: a.queue.clone(),
            limit: a.limit,
        })
        .load::<ClaimRow>(&mut *c)
        .await?)
    }

    /// [`Driver::claim_controlled`](super::driver::Driver::claim_controlled): `BEGIN`, a
    /// bound on the wait for the queue row's lock, the lock ([`sql::LOCK_QUEUE`]), the
    /// claim within its global and per-partition limits ([`sql::CLAIM_CONTROLLED`], or
    /// [`sql::CLAIM_PARTITIONED`] for a queue whose lock last reported a per-partition
    /// limit) and `COMMIT`, sent together in one round trip. The server runs them in order, and the
    /// claim takes nothing unless it sees the row as its own transaction locked it, so no
    /// reordering could let it count without the lock. A row with a rate limit claims
    /// nothing here and answers `None`; the store then skips this for
    /// the queue until a portable claim finds the rate limit lifted.
    ///
    /// The `COMMIT` is on its way with the rest, so a claim the client abandons (its bound
    /// passed while the lock was held elsewhere) would still commit once the lock frees,
    /// taking jobs no node received: the lock wait is bounded below the client's bound
    /// (`lock_timeout`), so the server gives up first and the `COMMIT` rolls back. The
    /// connection is marked for closing until all five have answered, so one left inside a
    /// transaction is never pooled, whoever abandons the claim.
    pub(crate) async fn claim_controlled(
        &self,
        a: &ClaimArgs,
    ) -> Result<Option<Claimed<ClaimRow>>> {
        let mut c = self.conn(false).await?;
        c.poison();
        let conn: &AsyncPgConnection = &c;
        let wait = sql::PgSetLockWait {
            wait: self.claim_lock_wait.clone(),
        };
        let lock = sql::PgLockQueue {
            queue: a.queue.clone(),
        };
        let partitioned = self
            .partitioned
            .lock()
            .is_ok_and(|set| set.contains(&a.queue));
        let claim = sql::PgClaimControlled {
            now: a.now,
            lease_us: a.lease_us,
            limit: a.limit,
            queue_running: a.queue.clone(),
            limit_again: a.limit,
            queue_row: a.queue.clone(),
            queue_parts: a.queue.clone(),
            queue: a.queue.clone(),
            any_kind: a.kinds.is_none(),
            kinds: a.kinds.clone().unwrap_or_default(),
            owner: a.owner.clone(),
            token: a.token.clone(),
        };
        let claimed = if partitioned {
            futures_util::future::Either::Left(
                sql::ClaimRows::new(sql::PgClaimPartitioned(claim)).load::<ClaimRow>(&mut &*conn),
            )
        } else {
            futures_util::future::Either::Right(
                sql::ClaimRows::new(claim).load::<ClaimRow>(&mut &*conn),
            )
        };
        // Polled in this order, so sent in it (a statement still being prepared holds the
        // connection's statement cache, and the ones after it wait for it; none of these
        // binds a type that needs looking up first).
        let sent = futures_util::future::join5(
            sql::PgBegin.execute(&mut &*conn),
            wait.execute(&mut &*conn),
            lock.load::<LockedQueue>(&mut &*conn),
            claimed,
            sql::PgCommit.execute(&mut &*conn),
        )
        .await;
        let (locked, rows) = match sent {
            (Ok(_), Ok(_), Ok(locked), Ok(rows), Ok(_)) => (locked, rows),
            // A failed statement aborts the transaction and the `COMMIT` rolls it back; the
            // connection stays marked and is closed all the same.
            (begin, wait, locked, rows, commit) => {
                let e = [
                    begin.err(),
                    wait.err(),
                    locked.err(),
                    rows.err(),
                    commit.err(),
                ]
                .into_iter()
                .flatten()
                .next();
                return Err(e
                    .unwrap_or(diesel::result::Error::RollbackTransaction)
                    .into());
            }
        };
        if let (Some(q), Ok(mut set)) = (<[LockedQueue]>::first(&locked), self.partitioned.lock()) {
            if q.partitioned {
                set.insert(a.queue.clone());
            } else {
                set.remove(&a.queue);
            }
        }
        c.keep();
        Ok(match <[LockedQueue]>::first(&locked) {
            None => Some(Claimed::none(Route::Fast)),
            Some(q) if q.involved => None,
            Some(_) => Some(Claimed::of(Route::Controlled, rows)),
        })
    }

    /// [`Driver::renew`](super::driver::Driver::renew): one statement ([`sql::RENEW`]).
    pub(crate) async fn renew(&self, a: &RenewArgs<'_>) -> Result<Vec<RenewedRow>> {
        let mut c = self.lanes.renewal(a.fresh).await?;
        Ok(sql::PgRenew {
            ids: a.leases.iter().map(|l| l.id.0).collect(),
            tokens: a.leases.iter().map(|l| l.token.as_str()).collect(),
            agos: a.leases.iter().map(|l| l.started_ago.map(dur_us)).collect(),
            now: a.now,
            lease_us: a.lease_us,
            grace_us: a.grace_us,
            progress: a.leases.iter().map(|l| l.progress.as_deref()).collect(),
        }
        .load(&mut *c)
        .await?)
    }

    /// [`Driver::finalize`](super::driver::Driver::finalize): one statement
    /// ([`sql::FINALIZE`]).
    pub(crate) async fn finalize(
        &self,
        items: &[Finalize],
        now: Option<i64>,
    ) -> Result<HashMap<i64, (JobState, bool)>> {
        let mut c = self.conn(false).await?;
        Ok(finalize(&mut c, items, now).await?)
    }

    /// `VACUUM (SKIP_LOCKED)` of the live table, on a connection closed afterwards.
    pub(crate) async fn vacuum_live(&self) -> Result<()> {
        use diesel_async::SimpleAsyncConnection;
        let mut c = self.conn(false).await?;
        // A large table takes longer than the session's server-side statement bound: lift
        // it, on a connection that is closed afterwards rather than pooled without it.
        c.poison();
        c.batch_execute("SET statement_timeout = 0").await?;
        c.batch_execute("VACUUM (SKIP_LOCKED) jobvisor_jobs")
            .await?;
        Ok(())
    }

    /// Registers a wait on job `id` for `ttl_us` (see `store/waits.rs`): locks the job's row
    /// `FOR SHARE` — so an uncommitted end is waited for and read — and counts the wait in
    /// `jobvisor_waits` unless the job has ended or is gone; whether it counted it. Stale
    /// rows of other jobs are deleted on the way.
    pub(crate) async fn wait_register(&self, id: i64, ttl_us: i64) -> Result<bool> {
        #[derive(QueryableByName)]
        struct Registered {
            #[diesel(sql_type = BigInt)]
            registered: i64,
        }
        let mut c = self.conn(false).await?;
        let r: Registered = diesel::sql_query(sql::WAIT_REGISTER)
            .bind::<BigInt, _>(id)
            .bind::<BigInt, _>(ttl_us)
            .get_result(&mut *c)
            .await?;
        Ok(r.registered > 0)
    }

    /// Removes one wait on job `id` from `jobvisor_waits` (the row, with its last).
    pub(crate) async fn wait_unregister(&self, id: i64) -> Result<()> {
        let mut c = self.conn(false).await?;
        diesel::sql_query(sql::WAIT_UNREGISTER)
            .bind::<BigInt, _>(id)
            .execute(&mut *c)
            .await?;
        Ok(())
    }

    /// A listening connection to `channels`, opened like the pool's, `LISTEN` bounded by
    /// `limit`.
    pub(crate) async fn listen(
        &self,
        limit: std::time::Duration,
        channels: &[&str],
    ) -> Result<PgListener> {
        let conn = self.connector.diesel().await.map_err(|e| {
            Error::Database(StoreError::Transient(format!("listener connection: {e}")))
        })?;
        PgListener::start(conn, limit, channels).await
    }
}

/// [`sql::LOCK_QUEUE`]'s answer.
#[derive(QueryableByName)]
struct LockedQueue {
    /// The queue has a rate limit.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    involved: bool,
    /// The queue has a per-partition limit.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    partitioned: bool,
}

/// `lock_timeout` for a controlled claim under a client bound of `bound`: half of it, at
/// least 1 ms.
fn lock_wait(bound: std::time::Duration) -> String {
    format!("{}ms", (bound.as_millis() / 2).max(1))
}

/// The latest migration version embedded.
pub(crate) fn latest_migration() -> String {
    super::embedded::latest_version::<diesel::pg::Pg>(&MIGRATIONS)
}

/// Runs the pending migrations on a dedicated connection, holding the advisory lock, or
/// (`advisory` false: [`StoreOptions::advisory_locks`]) the row lock of
/// `common/migrate_lock.rs`.
pub(crate) fn run_migrations(
    conn: AsyncPgConnection,
    advisory: bool,
) -> std::result::Result<(), super::embedded::BoxError> {
    use super::migrate_lock::{holder, release, take, LockSql, HOLD_SECS, TABLE};
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
    // Opened by the store's connector (TLS, keepalives, bounds); used synchronously here.
    let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
    if advisory {
        return super::embedded::migrate_locked(
            &mut conn,
            &format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"),
            &format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"),
            MIGRATIONS,
        );
    }
    let sql = LockSql {
        exists: "SELECT COUNT(*) AS n FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = 'jobvisor_migrate_lock'",
        create: format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (name VARCHAR(16) PRIMARY KEY NOT NULL, \
             holder VARCHAR(64) NULL, until TIMESTAMPTZ NULL)"
        ),
        seed: format!("INSERT INTO {TABLE} (name) VALUES ('migrate') ON CONFLICT DO NOTHING"),
        take: format!(
            "UPDATE {TABLE} SET holder = '{{me}}', \
             until = clock_timestamp() + interval '{HOLD_SECS} seconds' \
             WHERE name = 'migrate' AND (holder IS NULL OR until < clock_timestamp())"
        ),
        release: format!(
            "UPDATE {TABLE} SET holder = NULL, until = NULL \
             WHERE name = 'migrate' AND holder = '{{me}}'"
        ),
    };
    let me = holder();
    take(&mut conn, &sql, &me)?;
    let res = super::embedded::run_pending(&mut conn, MIGRATIONS);
    let released = release(&mut conn, &sql, &me);
    res?;
    released
}

/// PostgreSQL, one row: [`sql::ENQUEUE_ONE`], a prepared single-row insert — not a batch of
/// one, whose arrays cost the server a tenth more per enqueue (measured), nor the query
/// builder's insert, whose text is built anew each call. `None`: another job holds the key.
async fn insert_one(
    conn: &mut diesel_async::AsyncPgConnection,
    job: &NewJob,
    now: Option<i64>,
    quiet: bool,
) -> diesel::QueryResult<Option<i64>> {
    let (unique_scope, period_us) = unique_parts(job);
    let (run_at, delay_us) = match job.run_at {
        RunAt::Now => (None, 0),
        RunAt::After(d) => (None, dur_us(d)),
        RunAt::At(t) => (Some(to_us(t)), 0),
    };
    let payload = serde_json::to_string(&job.payload)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    let row: Option<LastId> = sql::PgEnqueueOne {
        queue: &job.queue,
        kind: &job.kind,
        unique_key: job.unique_key.as_deref(),
        partition_key: job.partition.as_deref(),
        unique_hold: job.unique_key.as_deref(),
        unique_scope,
        period_us,
        priority: i32::from(job.priority),
        payload,
        max_attempts: i32::try_from(job.max_attempts).unwrap_or(i32::MAX),
        run_at,
        delay_us,
        timeout_ms: dur_ms(job.timeout),
        now,
        quiet,
    }
    .get_result(&mut *conn)
    .await
    .optional()?;
    Ok(row.map(|r| r.id))
}

/// PostgreSQL's steps of the keyed enqueue (`keyed.rs`): the take-over and the insert in
/// its place are one transaction (a savepoint inside the caller's). `quiet`: see
/// [`sql::ENQUEUE_ONE`].
struct PgKeyed<'c>(&'c mut diesel_async::AsyncPgConnection, bool);

/// PostgreSQL announces on the channel its listeners follow (`jobvisor_jobs`, cancels on
/// `jobvisor_cancel`), delivered at commit; a session without notifications
/// ([`StoreOptions::notifications`], `jobvisor.listen = 'off'`, see `connect.rs`) moves the
/// wake counter instead, as MariaDB does. One statement either way: the session's setting
/// picks which half acts.
impl super::wakes::AnnounceDue for diesel::pg::Pg {
    async fn announce_due<C>(conn: &mut C, queues: &[String]) -> QueryResult<()>
    where
        C: diesel_async::AsyncConnection<Backend = Self> + Send,
    {
        diesel::sql_query(sql::ANNOUNCE_DUE)
            .bind::<Array<Text>, _>(queues)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn announce_cancel<C>(conn: &mut C, job: i64) -> QueryResult<()>
    where
        C: diesel_async::AsyncConnection<Backend = Self> + Send,
    {
        diesel::sql_query(sql::ANNOUNCE_CANCEL)
            .bind::<Text, _>(job.to_string())
            .execute(conn)
            .await
            .map(drop)
    }

    /// `jobvisor_announce_done` (migration 000028): a notification on `jobvisor_done` only
    /// for the jobs of `jobs` somebody waits on, delivered at commit.
    async fn announce_done<C>(conn: &mut C, jobs: &[i64]) -> QueryResult<()>
    where
        C: diesel_async::AsyncConnection<Backend = Self> + Send,
    {
        diesel::sql_query("SELECT jobvisor_announce_done($1)")
            .bind::<Array<BigInt>, _>(jobs)
            .execute(conn)
            .await
            .map(drop)
    }
}

impl KeyedSteps for PgKeyed<'_> {
    async fn insert(&mut self, job: &NewJob, now: Option<i64>) -> diesel::QueryResult<Option<i64>> {
        insert_one(self.0, job, now, self.1).await
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
        use diesel_async::AsyncConnection;
        let quiet = self.1;
        self.0
            .transaction(async |c| {
                if release!(c, holder, release, now) == 0 {
                    return Ok::<_, diesel::result::Error>(None);
                }
                insert_one(c, job, now, quiet).await
            })
            .await
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

/// Whether `job`, enqueued at `now` (the statement's clock when given), is due at once: what
/// the insert trigger announces, its `run_at` (from `now`, else the clock) not after the
/// clock. A test clock ahead of the clock makes a job due later, as the trigger sees it.
fn due_now(job: &NewJob, now: Option<i64>) -> bool {
    let clock = to_us(chrono::Utc::now());
    let run_at = match job.run_at {
        RunAt::Now => now.unwrap_or(clock),
        RunAt::After(d) => now.unwrap_or(clock).saturating_add(dur_us(d)),
        RunAt::At(t) => to_us(t),
    };
    run_at <= clock
}

/// PostgreSQL, one keyed job (`keyed::enqueue_keyed`).
async fn enqueue_one(
    conn: &mut diesel_async::AsyncPgConnection,
    job: &NewJob,
    now: Option<i64>,
    quiet: bool,
) -> diesel::QueryResult<Option<Enqueued>> {
    enqueue_keyed(&mut PgKeyed(conn, quiet), job, now).await
}

/// Pairs RETURNING rows (a subsequence of the input, in input order) with the input jobs.
/// `None` marks a duplicate whose existing id must be looked up.
fn match_inserted(
    batch: &[&NewJob],
    inserted: Vec<(i64, String, Option<String>)>,
) -> Vec<Option<Enqueued>> {
    let mut out = Vec::with_capacity(batch.len());
    let mut first_of_key: HashMap<(&str, &str), JobId> = HashMap::new();
    let mut next = inserted.into_iter().peekable();
    for j in batch {
        let key = j.unique_key.as_deref().map(|k| (j.kind.as_str(), k));
        if let Some(k) = key {
            if let Some(id) = first_of_key.get(&k) {
                // A repeat that replaces the first is resolved against it, as one by one.
                if j.on_duplicate != OnDuplicate::Keep {
                    out.push(None);
                    continue;
                }
                out.push(Some(Enqueued {
                    id: *id,
                    duplicate: true,
                    replaced: false,
                }));
                continue;
            }
        }
        let matches = next
            .peek()
            .is_some_and(|(_, kind, uk)| *kind == j.kind && *uk == j.unique_key);
        match next.next_if(|_| matches) {
            Some((id, _, _)) => {
                if let Some(k) = key {
                    first_of_key.insert(k, JobId(id));
                }
                out.push(Some(Enqueued {
                    id: JobId(id),
                    duplicate: false,
                    replaced: false,
                }));
            }
            None => out.push(None),
        }
    }
    out
}

/// PostgreSQL: one job through the query builder (a cached prepared statement); a batch as
/// one `INSERT … SELECT FROM unnest(…)` — thirteen array binds whatever its size, so no bind
/// limit, and rows inserted (and returned) in input order. Jobs whose key another job holds
/// are then resolved one by one (`keyed::after_conflict`).
///
/// `quiet`: the caller commits the insert itself (no transaction of the caller's is open on
/// `conn`) and announces the due queues after the commit ([`after_commit`]), so the insert
/// trigger stays silent; otherwise it notifies at the transaction's commit.
pub(crate) async fn enqueue(
    conn: &mut diesel_async::AsyncPgConnection,
    batch: &[&NewJob],
    now: Option<i64>,
    quiet: bool,
) -> diesel::QueryResult<Vec<Option<Enqueued>>> {
    if let [job] = batch {
        return Ok(vec![enqueue_one(conn, job, now, quiet).await?]);
    }
    // Boxed, so that the batch's larger future does not size the single insert's.
    Box::pin(enqueue_batch(conn, batch, now, quiet)).await
}

/// [`enqueue`] of more than one job.
async fn enqueue_batch(
    conn: &mut diesel_async::AsyncPgConnection,
    batch: &[&NewJob],
    now: Option<i64>,
    quiet: bool,
) -> diesel::QueryResult<Vec<Option<Enqueued>>> {
    let n = batch.len();
    let mut queue: Vec<&str> = Vec::with_capacity(n);
    let mut kind: Vec<&str> = Vec::with_capacity(n);
    let mut unique_key: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut priority = Vec::with_capacity(n);
    // Every payload serialized into one buffer, bound as slices of it: one allocation for
    // the batch instead of one per job.
    let mut text = Vec::new();
    let mut ends = Vec::with_capacity(n);
    let mut max_attempts = Vec::with_capacity(n);
    let mut timeout_ms = Vec::with_capacity(n);
    let mut run_at: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut delay_us: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut partition_key: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut unique_scope: Vec<Option<&'static str>> = Vec::with_capacity(n);
    let mut period_us: Vec<Option<i64>> = Vec::with_capacity(n);
    for j in batch {
        queue.push(&j.queue);
        kind.push(&j.kind);
        unique_key.push(j.unique_key.as_deref());
        priority.push(i32::from(j.priority));
        serde_json::to_writer(&mut text, &j.payload)
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
        ends.push(text.len());
        max_attempts.push(i32::try_from(j.max_attempts).unwrap_or(i32::MAX));
        timeout_ms.push(dur_ms(j.timeout));
        let (at, delay) = match j.run_at {
            RunAt::Now => (None, Some(0)),
            RunAt::After(d) => (None, Some(dur_us(d))),
            RunAt::At(t) => (Some(to_us(t)), None),
        };
        run_at.push(at);
        delay_us.push(delay);
        partition_key.push(j.partition.as_deref());
        let (scope, period) = unique_parts(j);
        unique_scope.push(scope);
        period_us.push(period);
    }
    #[derive(QueryableByName)]
    struct Inserted {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Text)]
        kind: String,
        #[diesel(sql_type = Nullable<Text>)]
        unique_key: Option<String>,
    }
    // serde_json writes UTF-8, so this cannot fail.
    let text = String::from_utf8(text)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    let mut start = 0;
    let payload: Vec<&str> = ends
        .iter()
        .map(|&end| {
            let p = &text[start..end];
            start = end;
            p
        })
        .collect();
    let inserted: Vec<Inserted> = sql::PgEnqueueBatch {
        queue,
        kind,
        unique_key,
        priority,
        payload,
        max_attempts,
        timeout_ms,
        run_at,
        delay_us,
        partition_key,
        unique_scope,
        period_us,
        now,
        quiet,
    }
    .load(&mut *conn)
    .await?;
    let inserted = inserted
        .into_iter()
        .map(|r| (r.id, r.kind, r.unique_key))
        .collect();
    let mut out = match_inserted(batch, inserted);
    for (i, slot) in out.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = after_conflict(&mut PgKeyed(&mut *conn, quiet), batch[i], now).await?;
        }
    }
    Ok(out)
}

/// PostgreSQL: the whole batch in one statement, each row still guarded by its own token
/// ([`sql::FINALIZE_SUCCESSES`] for a batch of successes, else [`sql::FINALIZE`]).
async fn finalize(
    conn: &mut diesel_async::AsyncPgConnection,
    items: &[Finalize],
    now: Option<i64>,
) -> diesel::QueryResult<HashMap<i64, (JobState, bool)>> {
    let n = items.len();
    let mut ids = Vec::with_capacity(n);
    let mut tokens: Vec<&str> = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    let mut results: Vec<Option<String>> = Vec::with_capacity(n);
    let mut errors: Vec<Option<String>> = Vec::with_capacity(n);
    let mut delays: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut refunds: Vec<i32> = Vec::with_capacity(n);
    let mut agos: Vec<Option<i64>> = Vec::with_capacity(n);
    // A batch of successes (the drain's) writes no ledger row: the statement without the
    // ledger's step and columns, and no vector allocated for them.
    let successes = items
        .iter()
        .all(|f| matches!(f.outcome, super::Finalization::Succeeded { .. }));
    let ledger_n = if successes { 0 } else { n };
    let mut outcomes: Vec<&'static str> = Vec::with_capacity(ledger_n);
    let mut codes: Vec<Option<String>> = Vec::with_capacity(ledger_n);
    let mut margins: Vec<Option<i64>> = Vec::with_capacity(ledger_n);
    for f in items {
        let row = FinalRow::from(f);
        if !successes {
            let (outcome, code) = super::ledger::ending(f);
            outcomes.push(outcome);
            codes.push(code);
            margins.push(f.fence_margin_ms);
        }
        ids.push(f.id.0);
        tokens.push(f.token.as_str());
        states.push(row.state);
        results.push(row.result);
        errors.push(row.error);
        delays.push(row.delay_us);
        refunds.push(row.refund);
        agos.push(row.ago_us);
    }
    let rows: Vec<Finalized> = if successes {
        FinalizedRows::<_, diesel::pg::Pg>::new(sql::PgFinalizeSuccesses {
            ids,
            tokens,
            states,
            results,
            errors,
            delays,
            refunds,
            agos,
            now,
        })
        .load(conn)
        .await?
    } else {
        FinalizedRows::<_, diesel::pg::Pg>::new(sql::PgFinalize {
            ids,
            tokens,
            states,
            results,
            errors,
            delays,
            refunds,
            agos,
            now,
            outcomes,
            codes,
            margins,
        })
        .load(conn)
        .await?
    };
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
    conn: &mut AsyncPgConnection,
    e: &super::params::NewEffect,
) -> QueryResult<bool> {
    super::columns::insert_effect_unless_recorded!(conn, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inserted_rows_are_matched_in_order_and_duplicates_marked() {
        let batch = [
            NewJob::new("a", json!(1)),
            NewJob::new("a", json!(2)).unique_key("k"),
            NewJob::new("a", json!(3)).unique_key("k"),
            NewJob::new("b", json!(4)).unique_key("x"),
            NewJob::new("a", json!(5)),
        ];
        // "x" already existed: the database skipped it.
        let inserted = vec![
            (10, "a".into(), None),
            (11, "a".into(), Some("k".into())),
            (12, "a".into(), None),
        ];
        let m = match_inserted(&batch.iter().collect::<Vec<_>>(), inserted);
        let id = |i: usize| m[i].map(|e| (e.id.0, e.duplicate));
        assert_eq!(id(0), Some((10, false)));
        assert_eq!(id(1), Some((11, false)));
        assert_eq!(id(2), Some((11, true)));
        assert_eq!(id(3), None);
        assert_eq!(id(4), Some((12, false)));
    }
}
