//! The crash test's side tables and the node's journal lines, shared by the node program
//! (`examples/crash_node/main.rs` includes this file with `#[path]`) and the drivers
//! (`tests/harness/mod.rs` has it as `harness::side`).
//!
//! * `crash_executions` — one row per handler execution, keyed by `(job_id, attempt, node,
//!   started_at_us)`: when the handler started, when the runtime started the attempt (the
//!   instant it stamped the start, right after its last check of the lease:
//!   `JobContext::deadline` minus the job's timeout), when it ended (NULL until it recorded
//!   its end) and whether it completed its work (`completed = 1`: it recorded its end and was
//!   about to return success). Node names are unique per process. An attempt number alone
//!   does not identify a claim: a claim whose attempt is given back (graceful shutdown, a
//!   `not_started` refund, a dropped prefetched job) leaves its number to the next claim —
//!   which may be the same node's, so even `(job, attempt, node)` can recur. The claim id
//!   (`claim`, `JobContext::claim_id`) is unique per claim and names the execution: checks
//!   key executions by `(job_id, claim)` (see `tests/harness/journal.rs`).
//! * `crash_nodes` — one row per node process, written by the driver after the run: when it
//!   was spawned and when it was killed (SIGKILL) or stopped (graceful), so an execution whose
//!   end was never recorded is bounded by its process's death.
//! * `crash_freezes` — one row per freeze (SIGSTOP) of a node, written by the driver after the
//!   run: when SIGSTOP was sent, when the node was seen stopped (every thread; it may run on
//!   briefly after the signal) and when it was continued (SIGCONT), or killed while still
//!   frozen. A frozen node is alive but does nothing: its leases expire and are taken while its
//!   handlers are paused mid-way.
//!
//! All times are microseconds since the Unix epoch from the machine's real-time clock; every
//! process runs on this one machine, so node times compare with each other exactly. The SQL
//! is the same on all three backends except for placeholders (`$n` on PostgreSQL) and
//! "insert unless present" (`INSERT IGNORE` on MySQL). It lives here, not in `src/store/`,
//! because these tables belong to the test, not to jobvisor.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Nullable, SmallInt, Text};
use diesel::sqlite::SqliteConnection;
use diesel::QueryableByName;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};

type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

/// Errors are carried as text: every caller either retries or reports them.
pub(crate) type SideResult<T> = Result<T, String>;

/// A pool of connections to the test database, for the side tables only.
pub(crate) enum SideDb {
    /// PostgreSQL.
    Pg(Pool<AsyncPgConnection>),
    /// MySQL / MariaDB.
    Mysql(Pool<AsyncMysqlConnection>),
    /// SQLite (the same file as the job tables).
    Sqlite(Pool<SqliteConn>),
}

impl std::fmt::Debug for SideDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SideDb::Pg(_) => "SideDb::Pg",
            SideDb::Mysql(_) => "SideDb::Mysql",
            SideDb::Sqlite(_) => "SideDb::Sqlite",
        })
    }
}

/// One handler execution, as stored.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub(crate) struct Execution {
    /// The job.
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    /// The attempt the handler was given (`JobContext::attempt`).
    #[diesel(sql_type = Integer)]
    pub(crate) attempt: i32,
    /// The claim it ran under (`JobContext::claim_id`, 16 hex digits): unique per claim, so
    /// it tells apart two claims that share an attempt number (a given-back attempt's number
    /// is reused by the next claim).
    #[diesel(sql_type = Text)]
    pub(crate) claim: String,
    /// The node that ran it.
    #[diesel(sql_type = Text)]
    pub(crate) node: String,
    /// Handler entry.
    #[diesel(sql_type = BigInt)]
    pub(crate) started_at_us: i64,
    /// When the runtime started the attempt: `JobContext::deadline` minus the job's timeout
    /// (the handler knows its timeout from its payload). The runtime stamps it on the node's
    /// clock right before it hands the job to the handler, so it is at or just before
    /// `started_at_us`; unknown (NULL) for a job whose payload does not say its timeout.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) runtime_started_at_us: Option<i64>,
    /// When the handler's work ended, if that was recorded.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) ended_at_us: Option<i64>,
    /// 1 when the handler finished its work and recorded it (it then returns success).
    #[diesel(sql_type = SmallInt)]
    pub(crate) completed: i16,
    /// What the job's row said just before the node recorded the start: 1 if it was
    /// `running` on this node with this attempt (the node held a lease on it), 0 if not;
    /// NULL when the start was only known from the journal (folded in after the run). Only
    /// ever used to clear a start, never to accuse one: a start recorded late (the database
    /// was down) may find the row already moved on.
    #[diesel(sql_type = Nullable<SmallInt>)]
    pub(crate) held: Option<i16>,
}

/// One claim of a rate-limited queue as jobvisor recorded it, on the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub(crate) struct ClaimRecord {
    /// The record's key.
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    /// When the claim took the queue's lock, in microseconds since the Unix epoch.
    #[diesel(sql_type = BigInt)]
    pub(crate) claimed_at: i64,
    /// How many jobs it claimed.
    #[diesel(sql_type = Integer)]
    pub(crate) jobs: i32,
}

/// A `COUNT(*) AS n` answer.
#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

impl Execution {
    /// When the attempt surely started: the runtime's own stamp where known, else the
    /// handler's entry.
    pub(crate) fn start(&self) -> i64 {
        self.runtime_started_at_us.unwrap_or(self.started_at_us)
    }
}

/// One freeze of a node (SIGSTOP, later SIGCONT), as recorded by the driver.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub(crate) struct FreezeRow {
    /// The node.
    #[diesel(sql_type = Text)]
    pub(crate) node: String,
    /// Taken right after SIGSTOP was sent. The node may still run a little after it: a
    /// process stops only once one of its threads takes the signal to the others.
    #[diesel(sql_type = BigInt)]
    pub(crate) signalled_at_us: i64,
    /// Taken once every thread of the node was seen stopped: it surely did nothing after.
    #[diesel(sql_type = BigInt)]
    pub(crate) frozen_at_us: i64,
    /// Taken right before SIGCONT was sent, or when the node was reaped if it was killed
    /// while frozen.
    #[diesel(sql_type = BigInt)]
    pub(crate) resumed_at_us: i64,
}

/// One node process, as recorded by the driver.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub(crate) struct NodeRow {
    /// Its name (the scheduler's node id).
    #[diesel(sql_type = Text)]
    pub(crate) node: String,
    /// Its process id.
    #[diesel(sql_type = BigInt)]
    pub(crate) pid: i64,
    /// When it was spawned.
    #[diesel(sql_type = BigInt)]
    pub(crate) spawned_at_us: i64,
    /// When it was surely gone: after `wait()` returned for it.
    #[diesel(sql_type = BigInt)]
    pub(crate) gone_at_us: i64,
    /// `killed` (SIGKILL) or `stopped` (graceful shutdown, exit status 0).
    #[diesel(sql_type = Text)]
    pub(crate) how: String,
}

/// A row of `crash_wanted`.
#[derive(Debug, QueryableByName)]
struct EffectRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Text)]
    claim: String,
}

#[derive(Debug, QueryableByName)]
struct WantedRow {
    #[diesel(sql_type = Text)]
    wanted_key: String,
    #[diesel(sql_type = BigInt)]
    missing_since_us: i64,
}

const CREATE_EXECUTIONS: &str = "CREATE TABLE IF NOT EXISTS crash_executions (
    job_id        BIGINT      NOT NULL,
    attempt       INTEGER     NOT NULL,
    claim         VARCHAR(32) NOT NULL,
    node          VARCHAR(64) NOT NULL,
    started_at_us BIGINT      NOT NULL,
    runtime_started_at_us BIGINT NULL,
    ended_at_us   BIGINT      NULL,
    completed     SMALLINT    NOT NULL DEFAULT 0,
    held          SMALLINT    NULL,
    PRIMARY KEY (job_id, attempt, node, started_at_us)
)";

const CREATE_FREEZES: &str = "CREATE TABLE IF NOT EXISTS crash_freezes (
    node          VARCHAR(64) NOT NULL,
    signalled_at_us BIGINT    NOT NULL,
    frozen_at_us  BIGINT      NOT NULL,
    resumed_at_us BIGINT      NOT NULL,
    PRIMARY KEY (node, frozen_at_us)
)";

const CREATE_WANTED: &str = "CREATE TABLE IF NOT EXISTS crash_wanted (
    wanted_key       VARCHAR(64) NOT NULL PRIMARY KEY,
    missing_since_us BIGINT      NOT NULL
)";

/// The business rows of the jobs that complete in their own transaction (`crash_node`:
/// payload `"effect": true`): one row per committed completion, written in the job's
/// transaction through the store's connection, with no key, so a second commit would show
/// as a second row.
pub(crate) const CREATE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS crash_effects (
    job_id        BIGINT      NOT NULL,
    attempt       INTEGER     NOT NULL,
    claim         VARCHAR(32) NOT NULL,
    node          VARCHAR(64) NOT NULL
)";

const CREATE_NODES: &str = "CREATE TABLE IF NOT EXISTS crash_nodes (
    node          VARCHAR(64) NOT NULL PRIMARY KEY,
    pid           BIGINT      NOT NULL,
    spawned_at_us BIGINT      NOT NULL,
    gone_at_us    BIGINT      NOT NULL,
    how           VARCHAR(16) NOT NULL
)";

/// Runs `diesel::sql_query($sql)` with binds on a pooled connection of whichever backend, as
/// `execute` or `load`.
macro_rules! on_side {
    ($db:expr, $sql:expr, $run:ident $(::<$t:ty>)? $(, $ty:ty => $val:expr)* $(,)?) => {{
        let sql: String = $sql;
        match $db {
            SideDb::Pg(p) => {
                let mut c = p.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql)$(.bind::<$ty, _>($val))*.$run$(::<$t>)?(&mut *c).await
            }
            SideDb::Mysql(p) => {
                let mut c = p.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql)$(.bind::<$ty, _>($val))*.$run$(::<$t>)?(&mut *c).await
            }
            SideDb::Sqlite(p) => {
                let mut c = p.get().await.map_err(|e| e.to_string())?;
                diesel::sql_query(sql)$(.bind::<$ty, _>($val))*.$run$(::<$t>)?(&mut *c).await
            }
        }
        .map_err(|e| e.to_string())
    }};
}

impl SideDb {
    /// A pool of at most `size` connections on the database at `url` (the same URLs the
    /// store takes). No connection is opened yet, so this succeeds while the server is down.
    pub(crate) fn open(url: &str, size: u32) -> SideResult<SideDb> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => {
                let mut cfg = ManagerConfig::<AsyncPgConnection>::default();
                cfg.recycling_method = RecyclingMethod::Fast;
                let mgr = AsyncDieselConnectionManager::new_with_config(url, cfg);
                Ok(SideDb::Pg(pool_builder(size).build_unchecked(mgr)))
            }
            "mysql" | "mariadb" => {
                let mysql_url = format!("mysql:{}", &url[scheme.len() + 1..]);
                // Checked on checkout: diesel-async cannot tell that a MySQL connection was
                // closed by the server (it can for PostgreSQL), so without a ping a pool keeps
                // handing out connections that died in a server restart.
                let mut cfg = ManagerConfig::<AsyncMysqlConnection>::default();
                cfg.recycling_method = RecyclingMethod::Verified;
                if let Some(members) = galera_members(&mysql_url)? {
                    // Several Galera members: each connection goes to the first member in
                    // the list's order that is in the primary component, and a connection
                    // whose member left it fails its checkout, as the store's own do.
                    cfg.custom_setup = Box::new(move |_| {
                        let members = members.clone();
                        Box::pin(async move { first_ready_member(&members).await })
                    });
                    cfg.recycling_method =
                        RecyclingMethod::CustomFunction(Box::new(|c| Box::pin(member_ready(c))));
                }
                let mgr = AsyncDieselConnectionManager::new_with_config(mysql_url, cfg);
                Ok(SideDb::Mysql(
                    pool_builder(size)
                        .test_on_check_out(true)
                        .build_unchecked(mgr),
                ))
            }
            "sqlite" => {
                let rest = &url[scheme.len() + 1..];
                let path = rest.strip_prefix("//").unwrap_or(rest);
                let path = path.split('?').next().unwrap_or(path).to_string();
                let mut cfg = ManagerConfig::<SqliteConn>::default();
                cfg.recycling_method = RecyclingMethod::Fast;
                // Several processes write this file: wait a little for the lock, then fail
                // and let the caller retry. Only a little: diesel-async's SQLite wrapper
                // cannot drop a query in flight (its drop waits for the blocking call), so
                // a handler stopped while waiting here — a frozen node may hold the lock for
                // seconds — would run on until the wait ended, past its fence.
                cfg.custom_setup = Box::new(|path: &str| {
                    let path = path.to_string();
                    Box::pin(async move {
                        let mut c = SqliteConn::establish(&path).await?;
                        c.batch_execute("PRAGMA busy_timeout = 100;")
                            .await
                            .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                        Ok(c)
                    })
                });
                let mgr = AsyncDieselConnectionManager::new_with_config(path, cfg);
                Ok(SideDb::Sqlite(pool_builder(size).build_unchecked(mgr)))
            }
            other => Err(format!(
                "unknown URL scheme {other:?}; expected postgres://, mysql:// or sqlite://"
            )),
        }
    }

    /// `?` placeholders as this backend wants them.
    fn sql(&self, text: &str) -> String {
        match self {
            SideDb::Pg(_) => {
                let mut out = String::with_capacity(text.len() + 8);
                let mut n = 0;
                for ch in text.chars() {
                    if ch == '?' {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(ch);
                    }
                }
                out
            }
            SideDb::Mysql(_) | SideDb::Sqlite(_) => text.to_string(),
        }
    }

    /// "Insert this row unless its key is present" as this backend spells it.
    fn insert_unless_present(&self, rest: &str) -> String {
        match self {
            SideDb::Mysql(_) => self.sql(&format!("INSERT IGNORE INTO {rest}")),
            SideDb::Pg(_) | SideDb::Sqlite(_) => {
                self.sql(&format!("INSERT INTO {rest} ON CONFLICT DO NOTHING"))
            }
        }
    }

    /// Creates the side tables if they are missing.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn create_tables(&self) -> SideResult<()> {
        for ddl in [
            CREATE_EXECUTIONS,
            CREATE_NODES,
            CREATE_FREEZES,
            CREATE_WANTED,
            CREATE_EFFECTS,
        ] {
            on_side!(self, ddl.to_string(), execute)?;
        }
        Ok(())
    }

    /// Records that a handler started (a second call for the same execution changes
    /// nothing, so a write whose answer was lost can simply be repeated). With
    /// `check_lease`, first reads whether the job's row is `running` on `node` with this
    /// attempt and keeps the answer in `held` (see [`Execution::held`]); the driver folding
    /// starts in from the journals after the run passes `false`.
    ///
    /// # Errors
    /// The database's error, as text.
    // One argument per column of the row it writes, plus whether to read the lease first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record_start(
        &self,
        job_id: i64,
        attempt: i32,
        claim: &str,
        node: &str,
        started_at_us: i64,
        runtime_started_at_us: Option<i64>,
        check_lease: bool,
    ) -> SideResult<()> {
        let held = if check_lease {
            let sql = self.sql(
                "SELECT COUNT(*) AS n FROM jobvisor_jobs WHERE id = ? AND state = 'running' \
                 AND lease_owner = ? AND attempts = ?",
            );
            let rows = on_side!(self, sql, load::<CountRow>,
                BigInt => job_id, Text => node, Integer => attempt)?;
            let rows: Vec<CountRow> = rows;
            Some(i16::from(rows.iter().any(|r| r.n > 0)))
        } else {
            None
        };
        let sql = self.insert_unless_present(
            "crash_executions (job_id, attempt, claim, node, started_at_us, \
             runtime_started_at_us, held) VALUES (?, ?, ?, ?, ?, ?, ?)",
        );
        on_side!(self, sql, execute,
            BigInt => job_id, Integer => attempt, Text => claim, Text => node, BigInt => started_at_us,
            Nullable<BigInt> => runtime_started_at_us, Nullable<SmallInt> => held)?;
        Ok(())
    }

    /// Records that a handler finished its work at `ended_at_us` (`completed = 1`).
    /// Answers whether the execution's row was there to update.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn record_completion(
        &self,
        job_id: i64,
        attempt: i32,
        node: &str,
        started_at_us: i64,
        ended_at_us: i64,
    ) -> SideResult<bool> {
        let sql = self.sql(
            "UPDATE crash_executions SET ended_at_us = ?, completed = 1 \
             WHERE job_id = ? AND attempt = ? AND node = ? AND started_at_us = ?",
        );
        let n = on_side!(self, sql, execute,
            BigInt => ended_at_us, BigInt => job_id, Integer => attempt, Text => node,
            BigInt => started_at_us)?;
        Ok(n == 1)
    }

    /// Fills in the end of an execution whose end is not recorded (from a node's journal),
    /// leaving `completed` as it is.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn fill_end(
        &self,
        job_id: i64,
        attempt: i32,
        node: &str,
        started_at_us: i64,
        ended_at_us: i64,
    ) -> SideResult<()> {
        let sql = self.sql(
            "UPDATE crash_executions SET ended_at_us = ? \
             WHERE job_id = ? AND attempt = ? AND node = ? AND started_at_us = ? \
             AND ended_at_us IS NULL",
        );
        on_side!(self, sql, execute,
            BigInt => ended_at_us, BigInt => job_id, Integer => attempt, Text => node,
            BigInt => started_at_us)?;
        Ok(())
    }

    /// Records one node process.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn insert_node(&self, n: &NodeRow) -> SideResult<()> {
        let sql = self.sql(
            "INSERT INTO crash_nodes (node, pid, spawned_at_us, gone_at_us, how) \
             VALUES (?, ?, ?, ?, ?)",
        );
        on_side!(self, sql, execute,
            Text => &n.node, BigInt => n.pid, BigInt => n.spawned_at_us,
            BigInt => n.gone_at_us, Text => &n.how)?;
        Ok(())
    }

    /// Records one freeze.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn insert_freeze(&self, f: &FreezeRow) -> SideResult<()> {
        let sql = self.sql(
            "INSERT INTO crash_freezes (node, signalled_at_us, frozen_at_us, resumed_at_us) \
             VALUES (?, ?, ?, ?)",
        );
        on_side!(self, sql, execute,
            Text => &f.node, BigInt => f.signalled_at_us, BigInt => f.frozen_at_us,
            BigInt => f.resumed_at_us)?;
        Ok(())
    }

    /// Every recorded freeze, by node, then time.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn freezes(&self) -> SideResult<Vec<FreezeRow>> {
        let sql = "SELECT node, signalled_at_us, frozen_at_us, resumed_at_us FROM crash_freezes \
                   ORDER BY node, frozen_at_us"
            .to_string();
        on_side!(self, sql, load::<FreezeRow>)
    }

    /// Every recorded execution, by job, then start.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn executions(&self) -> SideResult<Vec<Execution>> {
        let sql = "SELECT job_id, attempt, claim, node, started_at_us, runtime_started_at_us, \
                   ended_at_us, completed, held FROM crash_executions ORDER BY job_id, started_at_us, node"
            .to_string();
        on_side!(self, sql, load::<Execution>)
    }

    /// The claim records jobvisor keeps for a rate-limited queue (`jobvisor_queue_claims`,
    /// see ARCHITECTURE.md §7.5): `(id, claimed_at, jobs)`. A record leaves once a later claim
    /// finds it older than the period, so a reader polling faster than that sees each one.
    ///
    /// # Errors
    /// The database's error, as text.
    #[allow(dead_code)] // the test driver's
    pub(crate) async fn claim_records(&self, queue: &str) -> SideResult<Vec<ClaimRecord>> {
        let sql = self.sql(
            "SELECT id, claimed_at, jobs FROM jobvisor_queue_claims WHERE queue = ? ORDER BY id",
        );
        on_side!(self, sql, load::<ClaimRecord>, Text => queue)
    }

    /// Adds a business row that should have a job (the crash test's reconciler finds it), or
    /// marks an existing one's job missing again from `at_us` (its job is deleted next).
    ///
    /// # Errors
    /// The database's error, as text.
    #[allow(dead_code)] // the test driver's
    pub(crate) async fn want(&self, key: &str, at_us: i64) -> SideResult<()> {
        let sql = self.sql("UPDATE crash_wanted SET missing_since_us = ? WHERE wanted_key = ?");
        let n = on_side!(self, sql, execute, BigInt => at_us, Text => key)?;
        if n == 0 {
            let sql =
                self.sql("INSERT INTO crash_wanted (wanted_key, missing_since_us) VALUES (?, ?)");
            on_side!(self, sql, execute, Text => key, BigInt => at_us)?;
        }
        Ok(())
    }

    /// Every wanted key and since when its job is (or was) missing, by key.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn wanted(&self) -> SideResult<Vec<(String, i64)>> {
        let sql =
            "SELECT wanted_key, missing_since_us FROM crash_wanted ORDER BY wanted_key".to_string();
        let rows: Vec<WantedRow> = on_side!(self, sql, load::<WantedRow>)?;
        Ok(rows
            .into_iter()
            .map(|r| (r.wanted_key, r.missing_since_us))
            .collect())
    }

    /// Every business row of `crash_effects`: `(job_id, claim)`, one per committed
    /// completion.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn effects(&self) -> SideResult<Vec<(i64, String)>> {
        let sql = "SELECT job_id, claim FROM crash_effects ORDER BY job_id".to_string();
        let rows: Vec<EffectRow> = on_side!(self, sql, load::<EffectRow>)?;
        Ok(rows.into_iter().map(|r| (r.job_id, r.claim)).collect())
    }

    /// Every recorded node.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn nodes(&self) -> SideResult<Vec<NodeRow>> {
        let sql = "SELECT node, pid, spawned_at_us, gone_at_us, how FROM crash_nodes ORDER BY node"
            .to_string();
        on_side!(self, sql, load::<NodeRow>)
    }
}

/// The URL of each member a host-list URL names (`mysql://u@h1:p1,h2:p2/db`, as the store
/// takes it; its `members=` parameter dropped), in order; `None` for a URL of one server.
fn galera_members(url: &str) -> SideResult<Option<Vec<String>>> {
    let bad = |why: &str| {
        format!("side tables: host-list URL {why}; expected mysql://user@h1:p1,h2:p2/db")
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return Ok(None);
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("members="))
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let mut out = Vec::new();
    for host in hosts.split(',') {
        if host.trim().is_empty() {
            return Err(bad("has an empty member"));
        }
        out.push(format!("{scheme}://{user}{}{path}{query}", host.trim()));
    }
    Ok(Some(out))
}

/// Whether the member a connection is on is in the cluster's primary component
/// (`wsrep_ready` is `ON`); an error otherwise, so the pool drops the connection.
async fn member_ready(c: &mut AsyncMysqlConnection) -> diesel::QueryResult<()> {
    #[derive(QueryableByName)]
    struct Ready {
        #[diesel(sql_type = Text)]
        #[allow(dead_code)]
        ready: String,
    }
    let rows: Vec<Ready> = diesel::sql_query(
        "SELECT VARIABLE_VALUE AS ready FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'WSREP_READY' AND VARIABLE_VALUE = 'ON'",
    )
    .load(c)
    .await?;
    if rows.is_empty() {
        return Err(diesel::result::Error::NotFound);
    }
    Ok(())
}

/// A connection to the first of `members` that accepts it and is ready, with causal reads
/// (`wsrep_sync_wait = 1`: a read waits until its member applied every earlier commit, so
/// the driver reads every row a node wrote through another member).
async fn first_ready_member(members: &[String]) -> diesel::ConnectionResult<AsyncMysqlConnection> {
    let mut failures = Vec::new();
    for url in members {
        let tried = tokio::time::timeout(Duration::from_secs(2), async {
            let mut c = AsyncMysqlConnection::establish(url)
                .await
                .map_err(|e| e.to_string())?;
            member_ready(&mut c).await.map_err(|e| e.to_string())?;
            c.batch_execute("SET SESSION wsrep_sync_wait = 1")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(c)
        })
        .await
        .unwrap_or_else(|_| Err("no answer within 2 s".into()));
        match tried {
            Ok(c) => return Ok(c),
            Err(e) => failures.push(e),
        }
    }
    Err(diesel::ConnectionError::BadConnection(format!(
        "no Galera member took the side tables' connection: {}",
        failures.join("; ")
    )))
}

fn pool_builder<M: bb8::ManageConnection>(size: u32) -> bb8::Builder<M> {
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_secs(2))
        .test_on_check_out(false)
}

/// Microseconds since the Unix epoch, from the machine's real-time clock.
pub(crate) fn now_us() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// One line of a node's journal: the node's own record of what its handlers did, appended
/// with one `write` per line so that it survives the node being killed (the kernel keeps
/// what was written). The driver folds it into `crash_executions` before checking, because
/// the handler cannot write the end of an execution that was stopped from outside (its
/// future is dropped) and cannot write anything while the database is down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JournalLine {
    /// A handler started (written before its start row is inserted).
    Start {
        /// The job.
        job_id: i64,
        /// The attempt.
        attempt: i32,
        /// The claim id (16 hex digits).
        claim: String,
        /// Handler entry.
        started_at_us: i64,
        /// When the runtime started the attempt, if known (see
        /// [`Execution::runtime_started_at_us`]); a fifth field when present.
        runtime_started_at_us: Option<i64>,
    },
    /// A handler ended: it returned (`returned`) or its future was dropped.
    End {
        /// The job.
        job_id: i64,
        /// The attempt.
        attempt: i32,
        /// The claim id (as in its `Start`).
        claim: String,
        /// Its handler's entry (as in its `Start`): which execution ended.
        started_at_us: i64,
        /// When the handler's future returned or was dropped.
        ended_at_us: i64,
        /// It returned (rather than being dropped mid-way).
        returned: bool,
    },
    /// The node claimed a job (its scheduler's `Claimed` event, journaled when the node
    /// received it: after the claim committed).
    Claim {
        /// The job.
        job_id: i64,
        /// The attempt claimed.
        attempt: i32,
        /// When the event was received.
        at_us: i64,
    },
    /// An event of the node's scheduler (`lease_lost`, `self_fenced`, `reclaimed`,
    /// `lagged`), with the job id (or, for `lagged`, how many events were missed).
    Event {
        /// Which.
        what: String,
        /// Its job, or a count.
        n: i64,
    },
    /// A scheduler event with the time the node saw it, for timelines (the partition test)
    /// and the crash test's violation reports: `claimed` and `started` (`a` = job, `b` =
    /// attempt), `finished_<state>` (a finalization was written, leaving the job in
    /// `<state>`: job, attempt), `renewed` (a renewal statement answered: leases renewed,
    /// leases found lost), `self_fenced`, `lease_lost`, `dropped` (a prefetched job given
    /// back unstarted), `timed_out` and `reclaimed` (by this node's sweeper) (job, 0), and
    /// `pause_detected` (how late the timers fired, µs; 0).
    At {
        /// When the node's event stream delivered it.
        at_us: i64,
        /// Which.
        what: String,
        /// A job, or a count.
        a: i64,
        /// An attempt, a count, or 0.
        b: i64,
    },
    /// A handler's fence point as its node reckoned it (`JobContext::lease_left`, as a wall
    /// clock instant: `at_us` + what was left, never before `at_us`): read at its start
    /// (`start`), whenever it moved while the handler worked (`seen`), and when its future
    /// ended (`end`). `claim` is the attempt's claim id.
    Fence {
        /// The job.
        job_id: i64,
        /// The claim id (16 hex digits).
        claim: String,
        /// `start`, `seen` or `end`.
        what: String,
        /// When it was read.
        at_us: i64,
        /// The fence point read then (`at_us` once it has passed).
        fence_at_us: i64,
    },
    /// The node shut down gracefully.
    Exit {
        /// When.
        at_us: i64,
        /// Jobs that finished during the shutdown wait.
        finished: u64,
        /// Jobs whose leases were given back.
        released: u64,
    },
}

impl std::fmt::Display for JournalLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalLine::Start {
                job_id,
                attempt,
                claim,
                started_at_us,
                runtime_started_at_us,
            } => {
                write!(f, "start\t{job_id}\t{attempt}\t{claim}\t{started_at_us}")?;
                match runtime_started_at_us {
                    Some(t) => write!(f, "\t{t}"),
                    None => Ok(()),
                }
            }
            JournalLine::End {
                job_id,
                attempt,
                claim,
                started_at_us,
                ended_at_us,
                returned,
            } => {
                let how = if *returned { "returned" } else { "dropped" };
                write!(
                    f,
                    "end\t{job_id}\t{attempt}\t{claim}\t{ended_at_us}\t{how}\t{started_at_us}"
                )
            }
            JournalLine::Claim {
                job_id,
                attempt,
                at_us,
            } => write!(f, "claim\t{job_id}\t{attempt}\t{at_us}"),
            JournalLine::Event { what, n } => write!(f, "event\t{what}\t{n}"),
            JournalLine::Fence {
                job_id,
                claim,
                what,
                at_us,
                fence_at_us,
            } => write!(
                f,
                "fence\t{job_id}\t{claim}\t{what}\t{at_us}\t{fence_at_us}"
            ),
            JournalLine::At { at_us, what, a, b } => write!(f, "at\t{at_us}\t{what}\t{a}\t{b}"),
            JournalLine::Exit {
                at_us,
                finished,
                released,
            } => write!(f, "exit\t{at_us}\t{finished}\t{released}"),
        }
    }
}

impl std::str::FromStr for JournalLine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let int = |v: &str| -> Result<i64, String> {
            v.parse::<i64>()
                .map_err(|e| format!("{v:?} in journal line {s:?}: {e}"))
        };
        let attempt = |v: &str| -> Result<i32, String> {
            i32::try_from(int(v)?).map_err(|e| format!("{v:?} in journal line {s:?}: {e}"))
        };
        let count = |v: &str| -> Result<u64, String> {
            u64::try_from(int(v)?).map_err(|e| format!("{v:?} in journal line {s:?}: {e}"))
        };
        let fields: Vec<&str> = s.split('\t').collect();
        match fields.as_slice() {
            ["start", job, att, claim, at] => Ok(JournalLine::Start {
                job_id: int(job)?,
                attempt: attempt(att)?,
                claim: (*claim).to_string(),
                started_at_us: int(at)?,
                runtime_started_at_us: None,
            }),
            ["start", job, att, claim, at, rt] => Ok(JournalLine::Start {
                job_id: int(job)?,
                attempt: attempt(att)?,
                claim: (*claim).to_string(),
                started_at_us: int(at)?,
                runtime_started_at_us: Some(int(rt)?),
            }),
            ["end", job, att, claim, at, how, started] => Ok(JournalLine::End {
                job_id: int(job)?,
                attempt: attempt(att)?,
                claim: (*claim).to_string(),
                started_at_us: int(started)?,
                ended_at_us: int(at)?,
                returned: match *how {
                    "returned" => true,
                    "dropped" => false,
                    other => return Err(format!("unknown end {other:?} in {s:?}")),
                },
            }),
            ["claim", job, att, at] => Ok(JournalLine::Claim {
                job_id: int(job)?,
                attempt: attempt(att)?,
                at_us: int(at)?,
            }),
            ["fence", job, claim, what, at, fence] => Ok(JournalLine::Fence {
                job_id: int(job)?,
                claim: (*claim).to_string(),
                what: (*what).to_string(),
                at_us: int(at)?,
                fence_at_us: int(fence)?,
            }),
            ["event", what, n] => Ok(JournalLine::Event {
                what: (*what).to_string(),
                n: int(n)?,
            }),
            ["at", at, what, a, b] => Ok(JournalLine::At {
                at_us: int(at)?,
                what: (*what).to_string(),
                a: int(a)?,
                b: int(b)?,
            }),
            ["exit", at, finished, released] => Ok(JournalLine::Exit {
                at_us: int(at)?,
                finished: count(finished)?,
                released: count(released)?,
            }),
            _ => Err(format!("unknown journal line {s:?}")),
        }
    }
}
