//! MariaDB 10.6+ (tested) and MySQL 8 (untested): row locks and `SKIP LOCKED` like PostgreSQL, but no
//! `UPDATE … RETURNING`.
//!
//! How it differs from the others, up front:
//! * **No `UPDATE … RETURNING`** (neither flavour): a claim selects with `FOR UPDATE SKIP
//!   LOCKED`, updates and reads back in one transaction; a renewal updates and reads back;
//!   a finalization locks the held rows, then writes them all in one `UPDATE … JOIN (SELECT …
//!   UNION ALL …)` and derives each row's new state from the locked row (nothing read back).
//!   Both batch statements are chunked ([`CHUNK`]) under the 65,535-bind limit.
//! * **No `LIMIT` in `IN (subquery)`** on MariaDB, hence the separate select.
//! * **`INSERT … RETURNING` and `JSON_TABLE` only on MariaDB 10.6+** (the store reads the
//!   server's version at connect, [`MysqlDriver::insert_returning`]): there a batch is one
//!   insert; on MySQL each job is its own insert and `LAST_INSERT_ID()`.
//! * **Duplicate keys are errors**, not `ON CONFLICT DO NOTHING`: an insert that hits a live
//!   unique key looks the existing row up with a shared lock.
//! * Sessions run READ COMMITTED (no gap locks between claimers) in UTC; pooled connections
//!   are pinged at checkout, since a server restart is otherwise not noticed. No `LISTEN`:
//!   nodes poll. Migrations serialise on a row that replicates (and `GET_LOCK`): see
//!   [`run_migrations`].

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::columns::{
    batch_json, keyless_run, new_ids, new_row, overwrite, release, run_at_parts, sorted_ids,
    FinalRow, LastId, RenewedRow,
};
use super::dedicated_conn::{Held, OwnConn};
use super::expr::{in_list, DbNow, RUNNING};
use super::keyed::{enqueue_keyed, Holder, KeyedSteps, Release};
use super::ledger::{Ending, LedgerRow};
use super::params::{ClaimArgs, OpenError, RenewArgs};
use super::pool::{pool_with, Lanes, Reuse};
use super::rows::{dur_ms, dur_us, ClaimRow};
use super::schema::{jobvisor_jobs as jobs, jobvisor_queues as queues};
use super::timeout::PooledConn;
use super::{Enqueued, Finalize, LeaseRef, StoreOptions, DEFAULT_POOL_SIZE, RENEW_LANE_SIZE};
use crate::error::Result;
use crate::job::{JobId, JobState, NewJob};
use diesel_async::pooled_connection::RecyclingMethod;

pub(crate) mod connect;
pub(crate) mod galera_guard;
pub(crate) mod members;
pub(crate) mod sql;

use connect::MysqlConnector;
use sql::{padded_rows, Bind, BoundSql, ClaimQueueIs, LeasePairs};

/// The migrations, embedded.
const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");

/// Most jobs in one renew or finalize statement (at most 9 binds each, under the 65,535
/// limit).
const CHUNK: usize = 1000;

/// A MySQL/MariaDB store's connections and what its server can do.
pub(crate) struct MysqlDriver {
    /// The main pool and the renewal lane.
    lanes: Lanes<AsyncMysqlConnection>,
    /// MariaDB 10.6+: `INSERT … RETURNING` (MySQL has none) and `JSON_TABLE`, so an enqueue
    /// is one statement and a batch one insert.
    pub(crate) insert_returning: bool,
    /// The server is a Galera member (`wsrep_on`): the store's transactions run guarded
    /// ([`galera_guard`]).
    pub(crate) galera: bool,
    /// How connections are opened (the migration connection's too).
    pub(crate) connector: MysqlConnector,
    /// The change signal's connection ([`MysqlDriver::signal_conn`]).
    signal: OwnConn<AsyncMysqlConnection>,
}

impl MysqlDriver {
    /// The main pool's state (see [`Driver::pool_state`](super::driver::Driver::pool_state)).
    pub(crate) fn pool_state(&self) -> bb8::State {
        self.lanes.state()
    }

    /// Reads the server's version on a first connection (which also reports the real reason
    /// a server cannot be reached: `Err(reason)`), then opens the pools.
    pub(crate) async fn open(
        url: &str,
        opts: &StoreOptions,
    ) -> std::result::Result<MysqlDriver, OpenError> {
        let connector = MysqlConnector::new(url, opts).map_err(OpenError::Url)?;
        let (version, galera) = connect::server_version(&connector).await.map_err(|r| {
            OpenError::Connect(super::errors::with_server_hint(
                r,
                "a MySQL or MariaDB server",
            ))
        })?;
        let connector = connector.for_flavour(opts, version.contains("MariaDB"));
        let setup = |c: &MysqlConnector| -> diesel_async::pooled_connection::SetupCallback<
            AsyncMysqlConnection,
        > {
            let c = c.clone();
            Box::new(move |_: &str| {
                let c = c.clone();
                Box::pin(async move { c.diesel().await })
            })
        };
        let size = opts.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        // On several members, the checkout ping also drops a connection whose member left
        // the primary component (`connect::still_primary`).
        let ping = |clustered: bool| -> RecyclingMethod<AsyncMysqlConnection> {
            if clustered {
                RecyclingMethod::CustomFunction(Box::new(|c| Box::pin(connect::still_primary(c))))
            } else {
                RecyclingMethod::Verified
            }
        };
        let clustered = connector.clustered();
        Ok(MysqlDriver {
            lanes: Lanes::new(
                pool_with(
                    opts,
                    size,
                    ping(clustered),
                    Reuse::Oldest,
                    setup(&connector),
                ),
                pool_with(
                    opts,
                    RENEW_LANE_SIZE,
                    ping(clustered),
                    Reuse::Oldest,
                    setup(&connector),
                ),
            ),
            connector,
            insert_returning: connect::supports_insert_returning(&version),
            galera,
            signal: OwnConn::new(),
        })
    }

    /// The connection the change signal is read on, 20 times a second per node: one of its
    /// own, so no checkout ping doubles the reads; reopened after any failed read
    /// ([`OwnConn`]).
    pub(crate) async fn signal_conn(&self) -> Result<Held<'_, AsyncMysqlConnection>> {
        self.signal
            .take(|| self.connector.diesel())
            .await
            .map_err(|e| {
                crate::Error::Database(crate::error::StoreError::Transient(format!(
                    "cannot open a database connection: {e}"
                )))
            })
    }

    /// A pooled connection (renewals: `renew`, from their own lane).
    pub(crate) async fn conn(&self, renew: bool) -> Result<PooledConn<'_, AsyncMysqlConnection>> {
        self.lanes.checkout(renew).await
    }

    /// A pooled connection for reads (the seam's `with_conn!`): any of the pool's.
    pub(crate) async fn reader(&self) -> Result<PooledConn<'_, AsyncMysqlConnection>> {
        self.conn(false).await
    }

    /// A pooled connection for a write (the seam's `with_write!`): any of the pool's, there
    /// being no writer lock.
    pub(crate) async fn writer(&self, renew: bool) -> Result<PooledConn<'_, AsyncMysqlConnection>> {
        self.conn(renew).await
    }

    /// [`Driver::enqueue`](super::driver::Driver::enqueue): see [`enqueue`]; a batch in
    /// one transaction.
    pub(crate) async fn enqueue(
        &self,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        let mut c = self.conn(false).await?;
        let (returning, galera) = (self.insert_returning, self.galera);
        Ok(if batch.len() == 1 {
            // One insert is atomic by itself, and LAST_INSERT_ID belongs to the connection:
            // no transaction, two round trips fewer.
            enqueue(&mut c, batch, now, returning, false, galera).await?
        } else {
            galera_guard::transaction!(&mut *c, galera, |c| {
                enqueue(c, batch, now, returning, true, false).await
            })?
        })
    }

    /// [`Driver::claim`](super::driver::Driver::claim): select with `SKIP LOCKED`, update,
    /// read back by the new token, in one transaction.
    pub(crate) async fn claim(&self, a: &ClaimArgs) -> Result<Vec<ClaimRow>> {
        let now = DbNow::new(a.now);
        let (lease_us, limit) = (a.lease_us, a.limit);
        let (owner, tok) = (&a.owner, &a.token);
        macro_rules! claim_set {
            () => {
                (
                    jobs::state.eq(JobState::Running.as_str()),
                    jobs::lease_owner.eq(Some(owner.clone())),
                    jobs::lease_token.eq(Some(tok.clone())),
                    jobs::lease_expires_at.eq(now.plus(lease_us).nullable()),
                    jobs::heartbeat_at.eq(now.nullable()),
                    jobs::attempts.eq(jobs::attempts + 1),
                    jobs::version.eq(jobs::version + 1),
                    jobs::updated_at.eq(now),
                    // The attempt has not started: its start (and from it the timeout
                    // deadline) is recorded by the holder's renewal once its handler starts.
                    jobs::started_at.eq(None::<i64>),
                    jobs::timeout_at.eq(None::<i64>),
                )
            };
        }
        // Only the kinds this node runs (a rolling deploy burns no attempt); `any_kind`
        // keeps the statement's shape one.
        let any_kind = a.kinds.is_none();
        let kinds = a.kinds.clone().unwrap_or_default();
        let mut c = self.conn(false).await?;
        Ok(galera_guard::transaction!(&mut *c, self.galera, |c| {
            let ids: Vec<i64> = jobs::table
                .select(jobs::id)
                .filter(ClaimQueueIs(a.queue.clone()))
                .filter(
                    any_kind
                        .into_sql::<diesel::sql_types::Bool>()
                        .or(in_list(jobs::kind, kinds)),
                )
                .filter(jobs::run_at.le(now))
                .filter(diesel::dsl::not(diesel::dsl::exists(
                    queues::table.filter(queues::name.eq(&a.queue)),
                )))
                .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                .limit(limit)
                .for_update()
                .skip_locked()
                .load(c)
                .await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // Diesel prepares an `UPDATE` anew each time whatever its list: `eq_any` as it is.
            diesel::update(jobs::table.filter(jobs::id.eq_any(&ids)))
                .set(claim_set!())
                .execute(c)
                .await?;
            jobs::table
                .filter(in_list(jobs::id, ids))
                .filter(jobs::lease_token.eq(tok))
                .select(ClaimRow::as_select())
                .load(c)
                .await
        })?)
    }

    /// [`Driver::renew`](super::driver::Driver::renew): see [`renew`].
    pub(crate) async fn renew(&self, a: &RenewArgs<'_>) -> Result<Vec<RenewedRow>> {
        let mut c = self.lanes.renewal(a.fresh).await?;
        Ok(galera_guard::transaction!(&mut *c, self.galera, |c| {
            renew(c, a.leases, a.now, a.lease_us, a.grace_us).await
        })?)
    }

    /// [`Driver::finalize`](super::driver::Driver::finalize): see [`finalize`].
    pub(crate) async fn finalize(
        &self,
        items: &[Finalize],
        now: Option<i64>,
    ) -> Result<HashMap<i64, (JobState, bool)>> {
        let mut c = self.conn(false).await?;
        Ok(galera_guard::transaction!(&mut *c, self.galera, |c| {
            finalize(c, items, now).await
        })?)
    }
}

/// The latest migration version embedded.
pub(crate) fn latest_migration() -> String {
    super::embedded::latest_version::<diesel::mysql::Mysql>(&MIGRATIONS)
}

/// Runs the pending migrations on a dedicated connection, holding the row lock
/// (`common/migrate_lock.rs`) and `GET_LOCK` on the database's name. `GET_LOCK` alone is
/// local to one server: on a Galera cluster two processes migrating through two members both
/// held it and both ran the first migration (one failed: "Table 'jobvisor_jobs' already
/// exists", 3 runs of 3). The row replicates: of two members' claims on it, one commits and
/// the other fails certification (a deadlock error) or finds it held.
pub(crate) fn run_migrations(
    conn: AsyncMysqlConnection,
) -> std::result::Result<(), super::embedded::BoxError> {
    use super::migrate_lock::{holder, release, take, LockSql, HOLD_SECS, TABLE};
    use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
    // Opened by the store's connector (TLS, keepalives, bounds); used synchronously here.
    let mut conn = AsyncConnectionWrapper::<AsyncMysqlConnection>::from(conn);
    let sql = LockSql {
        exists: "SELECT COUNT(*) AS n FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'jobvisor_migrate_lock'",
        create: format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (name VARCHAR(16) PRIMARY KEY NOT NULL, \
             holder VARCHAR(64) NULL, until DATETIME(6) NULL)"
        ),
        seed: format!("INSERT IGNORE INTO {TABLE} (name) VALUES ('migrate')"),
        take: format!(
            "UPDATE {TABLE} SET holder = '{{me}}', \
             until = UTC_TIMESTAMP(6) + INTERVAL {HOLD_SECS} SECOND \
             WHERE name = 'migrate' AND (holder IS NULL OR until < UTC_TIMESTAMP(6))"
        ),
        release: format!(
            "UPDATE {TABLE} SET holder = NULL, until = NULL \
             WHERE name = 'migrate' AND holder = '{{me}}'"
        ),
    };
    let me = holder();
    take(&mut conn, &sql, &me)?;
    let res = super::embedded::migrate_locked(
        &mut conn,
        "SELECT GET_LOCK(CONCAT('jobvisor_migrate:', DATABASE()), 300)",
        "SELECT RELEASE_LOCK(CONCAT('jobvisor_migrate:', DATABASE()))",
        MIGRATIONS,
    );
    let released = release(&mut conn, &sql, &me);
    res?;
    released
}

/// MySQL/MariaDB. With `returning` (MariaDB 10.6+), each run of jobs without a unique key is
/// one `INSERT … SELECT FROM JSON_TABLE(…) RETURNING id`; otherwise, and for keyed jobs, one
/// insert per job (see [`enqueue_one`]). `in_tx`: `conn` is inside a transaction (the
/// batch's, or the caller's on the outbox path).
pub(crate) async fn enqueue(
    conn: &mut diesel_async::AsyncMysqlConnection,
    batch: &[&NewJob],
    now: Option<i64>,
    returning: bool,
    in_tx: bool,
    galera: bool,
) -> diesel::QueryResult<Vec<Option<Enqueued>>> {
    let mut out = Vec::with_capacity(batch.len());
    let mut i = 0;
    while i < batch.len() {
        let run = if returning {
            keyless_run(&batch[i..])
        } else {
            0
        };
        if run == 1 {
            out.push(Some(Enqueued {
                id: JobId(insert_one_mariadb(conn, batch[i], now).await?),
                duplicate: false,
                replaced: false,
            }));
        } else if run > 1 {
            out.extend(new_ids(
                insert_many_mariadb(conn, &batch[i..i + run], now).await?,
            ));
        } else {
            out.push(enqueue_one(conn, batch[i], now, in_tx, galera).await?);
        }
        i += run.max(1);
    }
    Ok(out)
}

/// MariaDB: one job without a unique key, by a cached prepared statement (measured 9 %
/// faster than a one-row `JSON_TABLE` batch: 2,890 against 2,650 enqueues/s).
///
/// Its result is read to the end, not just its row: an autocommit `INSERT … RETURNING`
/// sends the row before it commits, and a commit that fails (on Galera a certification
/// conflict, 1213) comes after it, in place of the result's end. Taking the first row and
/// dropping the rest (`get_result`) reported such a job enqueued although nothing was
/// written (`crash_galera`: a chain's parent acknowledged with its id, absent on every
/// member).
async fn insert_one_mariadb(
    conn: &mut diesel_async::AsyncMysqlConnection,
    j: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<i64> {
    let (run_base, run_plus) = run_at_parts(j, None);
    let row: LastId = sql::MariaInsertOne {
        queue: j.queue.clone(),
        kind: j.kind.clone(),
        priority: i32::from(j.priority),
        payload: j.payload.to_string(),
        max_attempts: i32::try_from(j.max_attempts).unwrap_or(i32::MAX),
        run_base,
        run_plus,
        timeout_ms: dur_ms(j.timeout),
        partition_key: j.partition.clone(),
        now,
    }
    .load::<LastId>(&mut *conn)
    .await?
    .pop()
    .ok_or(diesel::result::Error::NotFound)?;
    Ok(row.id)
}

/// MariaDB: jobs without unique keys in one cached `INSERT … SELECT FROM JSON_TABLE(?) …
/// RETURNING id` (a `VALUES` list would be a new, long statement to prepare per batch).
/// Ids ascend in array order.
async fn insert_many_mariadb(
    conn: &mut diesel_async::AsyncMysqlConnection,
    jobs: &[&NewJob],
    now: Option<i64>,
) -> diesel::QueryResult<Vec<i64>> {
    let batch = batch_json(jobs)?;
    let rows: Vec<LastId> = sql::MariaInsertMany { now, batch }.load(&mut *conn).await?;
    sorted_ids(rows, jobs.len())
}

/// MySQL, one row: `INSERT … ON DUPLICATE KEY` reports affected rows differently per client
/// flag, so this is a plain insert and `LAST_INSERT_ID()`. `None`: another job holds the key
/// (a duplicate-key error, which does not abort a MySQL transaction).
async fn insert_one(
    conn: &mut diesel_async::AsyncMysqlConnection,
    j: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<i64>> {
    use diesel::result::{DatabaseErrorKind, Error as D};
    let res = diesel::insert_into(jobs::table)
        .values(new_row!(j, DbNow::new(now)))
        .execute(&mut *conn)
        .await;
    match res {
        Ok(_) => {
            let row: LastId = diesel::sql_query("SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS id")
                .get_result(&mut *conn)
                .await?;
            Ok(Some(row.id))
        }
        Err(D::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) if j.unique_key.is_some() => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The job holding a key, and whether its period has ended (1).
#[derive(QueryableByName)]
struct HolderRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    expired: Option<i64>,
    #[diesel(sql_type = BigInt)]
    version: i64,
    /// Pending, never started, no children (1).
    #[diesel(sql_type = BigInt)]
    open: i64,
}

/// MySQL's steps of the keyed enqueue (`keyed.rs`). The expired hold is released by a
/// guarded, row-locking `UPDATE` and the job inserted in one transaction — the enclosing
/// one when `in_tx`, else one of its own — so concurrent enqueuers serialize on the holder's
/// row. (Not a savepoint inside the enclosing transaction: InnoDB rolls back a deadlock
/// victim's whole transaction, savepoints included, and the rollback to the savepoint would
/// then fail and hide the deadlock, which is transient, behind an error that is not.) The
/// holder is read with a shared lock (compatible with the one the failed insert holds, unlike
/// FOR UPDATE, which deadlocks concurrent losers), so the latest committed row is seen.
struct MysqlKeyed<'c> {
    conn: &'c mut diesel_async::AsyncMysqlConnection,
    /// `conn` is inside a transaction (the batch's, or the caller's on the outbox path).
    in_tx: bool,
    /// Outside one, the server is a Galera member: the take-over's transaction is guarded.
    galera: bool,
}

// MariaDB/MySQL announce by bumping the one-row counter the change signal reads.
super::wakes::announce_by_counter!(diesel::mysql::Mysql);

impl KeyedSteps for MysqlKeyed<'_> {
    async fn insert(&mut self, job: &NewJob, now: Option<i64>) -> diesel::QueryResult<Option<i64>> {
        insert_one(self.conn, job, now).await
    }

    async fn holder(
        &mut self,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<Holder>> {
        // `LOCK IN SHARE MODE` is understood by MySQL and MariaDB.
        let row: Option<HolderRow> = diesel::sql_query(sql::HOLDER)
            .bind::<Nullable<BigInt>, _>(now)
            .bind::<Text, _>(&job.kind)
            .bind::<Nullable<Text>, _>(&job.unique_key)
            .get_result(&mut *self.conn)
            .await
            .optional()?;
        Ok(row.map(|h| Holder {
            id: h.id,
            expired: h.expired == Some(1),
            version: h.version,
            open: h.open == 1,
        }))
    }

    async fn replace(
        &mut self,
        holder: i64,
        release: Release,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<i64>> {
        if self.in_tx {
            replace_hold(self.conn, holder, release, job, now).await
        } else {
            galera_guard::transaction!(&mut *self.conn, self.galera, |c| {
                replace_hold(c, holder, release, job, now).await
            })
        }
    }

    async fn overwrite(
        &mut self,
        holder: i64,
        version: i64,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<bool> {
        let conn = &mut *self.conn;
        Ok(overwrite!(conn, holder, version, job, now) == 1)
    }
}

/// MySQL, one keyed job (`keyed::enqueue_keyed`).
async fn enqueue_one(
    conn: &mut diesel_async::AsyncMysqlConnection,
    j: &NewJob,
    now: Option<i64>,
    in_tx: bool,
    galera: bool,
) -> diesel::QueryResult<Option<Enqueued>> {
    enqueue_keyed(
        &mut MysqlKeyed {
            conn,
            in_tx,
            galera,
        },
        j,
        now,
    )
    .await
}

/// Releases the hold of job `holder` as `release` says and inserts `j` in its place; `None`
/// if the holder moved on or another enqueuer took the hold over first.
async fn replace_hold(
    conn: &mut diesel_async::AsyncMysqlConnection,
    holder: i64,
    release: Release,
    j: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<i64>> {
    if release!(conn, holder, release, now) == 0 {
        return Ok(None);
    }
    insert_one(conn, j, now).await
}

/// MySQL (no `UPDATE … RETURNING`), inside the caller's transaction: one multi-table
/// `UPDATE … JOIN (SELECT … UNION ALL …)` per chunk renews the leases and records the starts
/// they carry, each row guarded by its own token; the renewed rows stay locked by this
/// transaction and keep their tokens, so reading them back gives exactly the renewed set.
/// The timeout deadline is assigned before `started_at`, so it tests the old value whatever
/// order the server assigns in.
async fn renew(
    conn: &mut diesel_async::AsyncMysqlConnection,
    leases: &[LeaseRef],
    now: Option<i64>,
    lease_us: i64,
    grace_us: i64,
) -> diesel::QueryResult<Vec<RenewedRow>> {
    let mut out = Vec::with_capacity(leases.len());
    for chunk in leases.chunks(CHUNK) {
        let mut q = BoundSql::default();
        q.push(sql::UPDATE_BY_ID_HEAD, []);
        for (k, i) in padded_rows(chunk.len()).enumerate() {
            let l = &chunk[i];
            q.push(
                if k == 0 {
                    "SELECT CAST(? AS SIGNED) AS id, ? AS token, CAST(? AS SIGNED) AS ago, \
                     ? AS progress"
                } else {
                    " UNION ALL SELECT ?, ?, ?, ?"
                },
                [
                    Bind::BigInt(l.id.0),
                    Bind::Text(l.token.as_str().to_string()),
                    Bind::NullBigInt(l.started_ago.map(dur_us)),
                    Bind::NullText(l.progress.clone()),
                ],
            );
        }
        q.push(
            sql::RENEW_TAIL,
            [
                Bind::NullBigInt(now),
                Bind::BigInt(grace_us),
                Bind::BigInt(lease_us),
            ],
        );
        q.execute(&mut *conn).await?;
        let pairs = LeasePairs {
            ids: chunk.iter().map(|l| l.id.0).collect(),
            tokens: chunk.iter().map(|l| l.token.as_str().to_string()).collect(),
        };
        let rows: Vec<RenewedRow> = jobs::table
            .filter(in_list(jobs::id, pairs.ids.clone()))
            .filter(pairs)
            .filter(RUNNING)
            .select((
                jobs::id,
                jobs::lease_token,
                jobs::lease_expires_at,
                jobs::cancel_requested_at,
            ))
            .load(&mut *conn)
            .await?;
        out.extend(rows);
    }
    Ok(out)
}

/// MySQL (no `UPDATE … RETURNING`), inside the caller's transaction: one locking read finds
/// the jobs still held by their tokens — locked, they cannot change before the update — and
/// one multi-table `UPDATE … JOIN (SELECT … UNION ALL …)` writes them all, each row still
/// guarded by its own token. The state each reached follows from the locked row (a retry
/// with its attempts used up becomes dead), so nothing is read back.
async fn finalize(
    conn: &mut diesel_async::AsyncMysqlConnection,
    items: &[Finalize],
    now: Option<i64>,
) -> diesel::QueryResult<HashMap<i64, (JobState, bool)>> {
    let mut applied = HashMap::with_capacity(items.len());
    for chunk in items.chunks(CHUNK) {
        let pairs = LeasePairs {
            ids: chunk.iter().map(|f| f.id.0).collect(),
            tokens: chunk.iter().map(|f| f.token.as_str().to_string()).collect(),
        };
        type HeldRow = ((i64, i32, i32, bool), (Option<String>, i64));
        let held: Vec<HeldRow> = jobs::table
            .filter(in_list(jobs::id, pairs.ids.clone()))
            .filter(pairs)
            .filter(RUNNING)
            .select((
                (
                    jobs::id,
                    jobs::attempts,
                    jobs::max_attempts,
                    // Not in `jobs` (diesel's 32 columns): see `schema::jobvisor_jobs_links`.
                    diesel::dsl::sql::<diesel::sql_types::Bool>("jobvisor_jobs.has_children"),
                ),
                // The claim's node and instant, kept on the row (`last_*`, `store::ledger`).
                (jobs::lease_owner, jobs::updated_at),
            ))
            .for_update()
            .load(&mut *conn)
            .await?;
        if held.is_empty() {
            continue;
        }
        let held: HashMap<i64, (bool, bool, String, i32, i64)> = held
            .into_iter()
            .map(|((id, attempts, max, children), (owner, claimed_at))| {
                let node = owner.unwrap_or_default();
                (id, (attempts >= max, children, node, attempts, claimed_at))
            })
            .collect();
        let mut rows = Vec::with_capacity(held.len());
        // The ends other than successes, for their ledger rows after the update.
        let mut others = Vec::new();
        for f in chunk {
            let Some((exhausted, children, node, attempt, claimed_at)) = held.get(&f.id.0) else {
                continue;
            };
            let mut row = FinalRow::from(f);
            if row.state == "retrying" && *exhausted {
                row.state = "dead";
            }
            let finished = matches!(row.state, "succeeded" | "dead" | "cancelled");
            let state = row.state.parse().unwrap_or(JobState::Retrying);
            applied.insert(f.id.0, (state, *children));
            // A success's claim stays on its job row (`last_*`): no ledger row.
            if !matches!(f.outcome, crate::store::Finalization::Succeeded { .. }) {
                others.push((Ending::of(f), node, *attempt, *claimed_at, row.state));
            }
            rows.push((f, row, finished, node, *claimed_at));
        }
        let mut q = BoundSql::default();
        q.push(sql::UPDATE_BY_ID_HEAD, []);
        for (k, i) in padded_rows(rows.len()).enumerate() {
            let (f, row, finished, node, claimed_at) = &rows[i];
            q.push(
                if k == 0 {
                    "SELECT CAST(? AS SIGNED) AS id, ? AS token, ? AS state, ? AS result, \
                     ? AS error, CAST(? AS SIGNED) AS delay_us, CAST(? AS SIGNED) AS refund, \
                     CAST(? AS SIGNED) AS finished, CAST(? AS SIGNED) AS ago, ? AS node, \
                     CAST(? AS SIGNED) AS claimed_at"
                } else {
                    " UNION ALL SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
                },
                [
                    Bind::BigInt(f.id.0),
                    Bind::Text(f.token.as_str().to_string()),
                    Bind::Text(row.state.to_string()),
                    Bind::NullText(row.result.clone()),
                    Bind::NullText(row.error.clone()),
                    Bind::NullBigInt(row.delay_us),
                    Bind::Int(row.refund),
                    Bind::Int(i32::from(*finished)),
                    Bind::NullBigInt(row.ago_us),
                    Bind::Text((*node).clone()),
                    Bind::BigInt(*claimed_at),
                ],
            );
        }
        q.push(sql::FINALIZE_TAIL, [Bind::NullBigInt(now)]);
        // A row repeated to pad the batch matches its job once: the count is of jobs.
        let n = q.execute(&mut *conn).await?;
        if n != rows.len() {
            // The rows were locked by this transaction: anything else is a bug; roll back.
            return Err(diesel::result::Error::QueryBuilderError(
                format!("finalize changed {n} rows of {} locked", rows.len()).into(),
            ));
        }
        // The claims these ends closed but for successes, in the same transaction
        // (`store::ledger`), with the start and end the update recorded; nothing read or
        // written for a batch of successes (the drain's case).
        if !others.is_empty() {
            let ids: Vec<i64> = others.iter().map(|(e, ..)| e.id).collect();
            let ended: HashMap<i64, (Option<i64>, i64)> = jobs::table
                .filter(jobs::id.eq_any(ids))
                .select((jobs::id, (jobs::started_at, jobs::updated_at)))
                .load::<(i64, (Option<i64>, i64))>(&mut *conn)
                .await?
                .into_iter()
                .collect();
            let ledger: Vec<LedgerRow> = others
                .into_iter()
                .filter_map(|(e, node, attempt, claimed_at, state)| {
                    let &(started_at, now) = ended.get(&e.id)?;
                    let held = super::ledger::Held {
                        node: node.clone(),
                        attempt,
                        claimed_at,
                        started_at,
                        now,
                    };
                    Some(LedgerRow::ended(e, held, state))
                })
                .collect();
            diesel::insert_into(super::schema::jobvisor_claims::table)
                .values(&ledger)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(applied)
}

/// Records an effect unless its key is recorded (see `driver.rs`): a plain `INSERT` whose
/// duplicate-key error rolls back that statement only (InnoDB), so the caller's transaction
/// goes on; true if it inserted.
pub(crate) async fn insert_effect(
    conn: &mut AsyncMysqlConnection,
    e: &super::params::NewEffect,
) -> QueryResult<bool> {
    use diesel::result::{DatabaseErrorKind, Error as DieselError};
    match diesel::insert_into(super::schema::jobvisor_effects::table)
        .values(super::columns::effect_values!(e))
        .execute(conn)
        .await
    {
        Ok(n) => Ok(n == 1),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
        Err(other) => Err(other),
    }
}
