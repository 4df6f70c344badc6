//! The crash test's side tables, shared by the node program (`examples/crash_node.rs`
//! includes this file with `#[path]`) and the driver (`tests/crash.rs`, as `mod side`).
//!
//! * `crash_executions` — one row per handler execution, keyed by `(job_id, attempt, node)`:
//!   when the handler started, when it ended (NULL until it recorded its end) and whether it
//!   completed its work (`completed = 1`: it recorded its end and was about to return
//!   success). Node names are unique per process and a node never runs one attempt of a job
//!   twice, so the key identifies one execution.
//! * `crash_nodes` — one row per node process, written by the driver after the run: when it
//!   was spawned and when it was killed (SIGKILL) or stopped (graceful), so an execution whose
//!   end was never recorded is bounded by its process's death.
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
    /// The node that ran it.
    #[diesel(sql_type = Text)]
    pub(crate) node: String,
    /// Handler entry.
    #[diesel(sql_type = BigInt)]
    pub(crate) started_at_us: i64,
    /// When the handler's work ended, if that was recorded.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) ended_at_us: Option<i64>,
    /// 1 when the handler finished its work and recorded it (it then returns success).
    #[diesel(sql_type = SmallInt)]
    pub(crate) completed: i16,
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

const CREATE_EXECUTIONS: &str = "CREATE TABLE IF NOT EXISTS crash_executions (
    job_id        BIGINT      NOT NULL,
    attempt       INTEGER     NOT NULL,
    node          VARCHAR(64) NOT NULL,
    started_at_us BIGINT      NOT NULL,
    ended_at_us   BIGINT      NULL,
    completed     SMALLINT    NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, attempt, node)
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
                // Several processes write this file: wait for the lock rather than fail.
                cfg.custom_setup = Box::new(|path: &str| {
                    let path = path.to_string();
                    Box::pin(async move {
                        let mut c = SqliteConn::establish(&path).await?;
                        c.batch_execute("PRAGMA busy_timeout = 10000;")
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

    /// Creates both side tables if they are missing.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn create_tables(&self) -> SideResult<()> {
        for ddl in [CREATE_EXECUTIONS, CREATE_NODES] {
            on_side!(self, ddl.to_string(), execute)?;
        }
        Ok(())
    }

    /// Records that a handler started (a second call for the same execution changes
    /// nothing, so a write whose answer was lost can simply be repeated).
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn record_start(
        &self,
        job_id: i64,
        attempt: i32,
        node: &str,
        started_at_us: i64,
    ) -> SideResult<()> {
        let sql = self.insert_unless_present(
            "crash_executions (job_id, attempt, node, started_at_us) VALUES (?, ?, ?, ?)",
        );
        on_side!(self, sql, execute,
            BigInt => job_id, Integer => attempt, Text => node, BigInt => started_at_us)?;
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
        ended_at_us: i64,
    ) -> SideResult<bool> {
        let sql = self.sql(
            "UPDATE crash_executions SET ended_at_us = ?, completed = 1 \
             WHERE job_id = ? AND attempt = ? AND node = ?",
        );
        let n = on_side!(self, sql, execute,
            BigInt => ended_at_us, BigInt => job_id, Integer => attempt, Text => node)?;
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
        ended_at_us: i64,
    ) -> SideResult<()> {
        let sql = self.sql(
            "UPDATE crash_executions SET ended_at_us = ? \
             WHERE job_id = ? AND attempt = ? AND node = ? AND ended_at_us IS NULL",
        );
        on_side!(self, sql, execute,
            BigInt => ended_at_us, BigInt => job_id, Integer => attempt, Text => node)?;
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

    /// Every recorded execution, by job, then start.
    ///
    /// # Errors
    /// The database's error, as text.
    pub(crate) async fn executions(&self) -> SideResult<Vec<Execution>> {
        let sql = "SELECT job_id, attempt, node, started_at_us, ended_at_us, completed \
                   FROM crash_executions ORDER BY job_id, started_at_us, node"
            .to_string();
        on_side!(self, sql, load::<Execution>)
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
        /// Handler entry.
        started_at_us: i64,
    },
    /// A handler ended: it returned (`returned`) or its future was dropped.
    End {
        /// The job.
        job_id: i64,
        /// The attempt.
        attempt: i32,
        /// When the handler's future returned or was dropped.
        ended_at_us: i64,
        /// It returned (rather than being dropped mid-way).
        returned: bool,
    },
    /// An event of the node's scheduler (`lease_lost`, `self_fenced`, `reclaimed`,
    /// `lagged`), with the job id (or, for `lagged`, how many events were missed).
    Event {
        /// Which.
        what: String,
        /// Its job, or a count.
        n: i64,
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
                started_at_us,
            } => write!(f, "start\t{job_id}\t{attempt}\t{started_at_us}"),
            JournalLine::End {
                job_id,
                attempt,
                ended_at_us,
                returned,
            } => {
                let how = if *returned { "returned" } else { "dropped" };
                write!(f, "end\t{job_id}\t{attempt}\t{ended_at_us}\t{how}")
            }
            JournalLine::Event { what, n } => write!(f, "event\t{what}\t{n}"),
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
            ["start", job, att, at] => Ok(JournalLine::Start {
                job_id: int(job)?,
                attempt: attempt(att)?,
                started_at_us: int(at)?,
            }),
            ["end", job, att, at, how] => Ok(JournalLine::End {
                job_id: int(job)?,
                attempt: attempt(att)?,
                ended_at_us: int(at)?,
                returned: match *how {
                    "returned" => true,
                    "dropped" => false,
                    other => return Err(format!("unknown end {other:?} in {s:?}")),
                },
            }),
            ["event", what, n] => Ok(JournalLine::Event {
                what: (*what).to_string(),
                n: int(n)?,
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
