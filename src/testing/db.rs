//! [`TestDb`]: a fresh, isolated database for one test on any backend — a schema on
//! PostgreSQL, a database on MySQL/MariaDB, a temp file on SQLite — created from
//! `JOBVISOR_PG_URL` / `JOBVISOR_MYSQL_URL` (default: the local services, [`base_url`]) and
//! dropped afterwards. Every test family provisions its databases here: the conformance
//! suite, the simulations, hostile-input, secrets, crash and partition tests, the benchmark.
//! A server that cannot be reached panics: a skipped backend is never a pass.
//!
//! [`simulated_store`] turns this thread's SQLite databases into the fleet simulation's
//! store (a file on tmpfs, calls inline, a fault plan consulted before every guarded
//! operation), so the conformance suite can run unchanged against exactly that store.

#![allow(clippy::unwrap_used)]

#[cfg(feature = "mysql")]
use diesel_async::AsyncMysqlConnection;
#[cfg(feature = "postgres")]
use diesel_async::AsyncPgConnection;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel_async::{AsyncConnection, SimpleAsyncConnection};

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::store::faults::{Fault, FaultPlan, StoreOp};
#[cfg(feature = "postgres")]
use crate::store::with_query;
use crate::store::{Backend, Store, StoreOptions};

/// Default PostgreSQL URL for tests.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Default MySQL URL for tests.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The base URL for a backend's tests, from the environment or the local default.
pub fn base_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => {
            std::env::var("JOBVISOR_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into())
        }
        Backend::Mysql => {
            std::env::var("JOBVISOR_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.into())
        }
        Backend::Sqlite => String::new(),
    }
}

/// Set by [`postgres_switches_off`]: process-wide, so that stores opened on any thread
/// (a case's spawned tasks) agree, as every migrator of one database must.
static SWITCHED: AtomicBool = AtomicBool::new(false);

/// Makes every PostgreSQL store that [`TestDb::store_with`] (and [`TestDb::store`]) opens in
/// this process run without `LISTEN`/`NOTIFY` and advisory locks
/// ([`StoreOptions::notifications`], [`StoreOptions::advisory_locks`]): the conformance suite
/// then proves the switches for PostgreSQL-compatible engines on plain PostgreSQL. For a
/// test binary of its own: it cannot be undone.
pub fn postgres_switches_off() {
    SWITCHED.store(true, Ordering::Relaxed);
}

thread_local! {
    static SIMULATED: Cell<bool> = const { Cell::new(false) };
    /// Operations the simulated stores' fault plans were asked about on this thread.
    static SIMULATED_OPS: Cell<u64> = const { Cell::new(0) };
}

/// Makes the SQLite [`TestDb`]s created on this thread the fleet simulation's store (`on`):
/// the file on tmpfs (`/dev/shm` where there is one), every SQLite call made on this thread
/// inline ([`sqlite_calls_inline`](super::internal::sqlite_calls_inline)), and a fault plan
/// on every store [`TestDb::store_with`] opens that lets each operation through and counts
/// it ([`simulated_store_ops`]). Other backends are unaffected.
#[cfg(feature = "sqlite")]
pub fn simulated_store(on: bool) {
    SIMULATED.with(|s| s.set(on));
    crate::store::driver::sqlite_calls_inline(on);
}

/// How many operations the simulated stores' fault plans were asked about on this thread
/// so far (their calls run inline, so on the thread that made them).
pub fn simulated_store_ops() -> u64 {
    SIMULATED_OPS.with(Cell::get)
}

/// The simulated store's plan with faults off: every operation runs, each is counted.
struct PassThrough;

impl FaultPlan for PassThrough {
    fn begin(&self, _op: StoreOp) -> Fault {
        SIMULATED_OPS.with(|n| n.set(n.get() + 1));
        Fault::None
    }

    fn end(&self, _op: StoreOp) {}
}

fn simulated() -> bool {
    SIMULATED.with(Cell::get)
}

/// A fresh, isolated database; dropped when this value is.
pub struct TestDb {
    /// Its backend.
    pub backend: Backend,
    /// URL of the isolated database (with the schema / database / file selected).
    pub url: String,
    cleanup: Option<Cleanup>,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

enum Cleanup {
    #[cfg(feature = "postgres")]
    PgSchema { admin_url: String, schema: String },
    #[cfg(feature = "mysql")]
    MysqlDb { admin_url: String, db: String },
}

/// `url` with its path (the database) replaced by `/db`, its host list and query kept.
fn with_path(url: &str, db: &str) -> String {
    let after = url.find("://").map_or(0, |i| i + 3);
    let hosts_end = url[after..]
        .find(['/', '?'])
        .map_or(url.len(), |i| after + i);
    let query = url[hosts_end..]
        .find('?')
        .map_or("", |i| &url[hosts_end + i..]);
    format!("{}/{db}{query}", &url[..hosts_end])
}

/// One URL per member of a MySQL URL's host list (`h1:3401,h2:3402`; see
/// `store/mysql/members.rs`), without the `members=` parameter; a plain URL is its own one.
pub(crate) fn member_urls(url: &str) -> Vec<String> {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..]
        .find(['/', '?'])
        .map_or(url.len(), |i| after + i);
    let at = url[after..end].rfind('@').map_or(after, |i| after + i + 1);
    let (path, query) = url[end..].split_once('?').unwrap_or((&url[end..], ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("members="))
        .collect();
    let tail = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    url[at..end]
        .split(',')
        .map(|h| format!("{}{}{tail}", &url[..at], h.trim()))
        .collect()
}

/// A fresh name for a schema or database: `jv_` and 16 hex digits.
pub fn unique_name() -> String {
    format!("jv_{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

impl TestDb {
    /// Creates the isolated database (nothing in it yet).
    pub async fn create(backend: Backend) -> TestDb {
        match backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let admin = base_url(backend);
                let schema = unique_name();
                let mut c = AsyncPgConnection::establish(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("PostgreSQL at {admin} is required for these tests: {e}")
                    });
                c.batch_execute(&format!("CREATE SCHEMA {schema}"))
                    .await
                    .unwrap();
                let url = with_query(&admin, &format!("options=-c%20search_path%3D{schema}"));
                TestDb {
                    backend,
                    url,
                    cleanup: Some(Cleanup::PgSchema {
                        admin_url: admin,
                        schema,
                    }),
                    _dir: None,
                }
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                let base = base_url(backend);
                // A Galera host list: the admin statements go to its first member.
                let admin = member_urls(&base).swap_remove(0);
                let db = unique_name();
                let mut c = AsyncMysqlConnection::establish(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("MySQL/MariaDB at {admin} is required for these tests: {e}")
                    });
                c.batch_execute(&format!("CREATE DATABASE {db}"))
                    .await
                    .unwrap();
                TestDb {
                    backend,
                    url: with_path(&base, &db),
                    cleanup: Some(Cleanup::MysqlDb {
                        admin_url: admin,
                        db,
                    }),
                    _dir: None,
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let shm = std::path::Path::new("/dev/shm");
                let dir = if simulated() && shm.is_dir() {
                    tempfile::Builder::new().prefix("jv-sim").tempdir_in(shm)
                } else {
                    tempfile::tempdir()
                }
                .unwrap();
                let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
                TestDb {
                    backend,
                    url,
                    cleanup: None,
                    _dir: Some(dir),
                }
            }
            #[allow(unreachable_patterns)] // reachable when a backend is left out
            other => panic!("{other:?} is not compiled into this build (Cargo features)"),
        }
    }

    /// The URL an application's own connection takes: on a Galera host list, each member in
    /// turn (so the application writes through other members than the store's connections
    /// do); otherwise [`TestDb::url`].
    pub fn app_url(&self) -> String {
        static TURN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let members = member_urls(&self.url);
        let k = TURN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % members.len();
        members[k].clone()
    }

    /// Opens a migrated store on it.
    pub async fn store(&self) -> Store {
        self.store_with(StoreOptions::default().pool_size(12)).await
    }

    /// Opens a migrated store with options (on PostgreSQL without notifications and advisory
    /// locks when [`postgres_switches_off`] was called in this process).
    pub async fn store_with(&self, opts: StoreOptions) -> Store {
        let opts = if self.backend == Backend::Postgres && SWITCHED.load(Ordering::Relaxed) {
            opts.notifications(false).advisory_locks(false)
        } else {
            opts
        };
        let store = Store::connect_with(&self.url, opts.migrate(true))
            .await
            .unwrap_or_else(|e| panic!("opening a store on {:?}: {e}", self.backend));
        if simulated() && self.backend == Backend::Sqlite {
            store.inject_faults(Arc::new(PassThrough));
        }
        store
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        // Drop cannot await: clean up on a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                match cleanup {
                    #[cfg(feature = "postgres")]
                    Cleanup::PgSchema { admin_url, schema } => {
                        if let Ok(mut c) = AsyncPgConnection::establish(&admin_url).await {
                            let _ = c
                                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                                .await;
                        }
                    }
                    #[cfg(feature = "mysql")]
                    Cleanup::MysqlDb { admin_url, db } => {
                        if let Ok(mut c) = AsyncMysqlConnection::establish(&admin_url).await {
                            let _ = c.batch_execute(&format!("DROP DATABASE {db}")).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// Runs raw SQL on the store's database (to corrupt rows as something other than jobvisor
/// might).
pub async fn exec_sql(store: &Store, sql: &str) -> Result<()> {
    store.exec_raw(sql).await
}
