//! Opening a store: URL parsing, connection pools per backend, and the one mapping of
//! database errors to [`StoreError`] (transient or not).

use std::path::{Path, PathBuf};
use std::time::Duration;

use diesel::result::{ConnectionError, DatabaseErrorKind};
use diesel::sqlite::SqliteConnection;
use diesel_async::pooled_connection::bb8::Pool as Bb8Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, SimpleAsyncConnection,
};

use super::{Store, DEFAULT_MAX_PAYLOAD_BYTES};
use crate::error::{redact_url, Error, Result, StoreError};

pub(crate) type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL 13+.
    Postgres,
    /// MySQL 8.0.1+ or MariaDB 10.6+.
    Mysql,
    /// SQLite 3.35+ (bundled).
    Sqlite,
}

/// Options for [`Store::connect_with`]. Every default is a named constant.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Pooled connections (default 10; SQLite 4).
    pub pool_size: Option<u32>,
    /// How long to wait for a connection, at connect and from the pool (default 10 s).
    pub connect_timeout: Duration,
    /// SQLite only: how long a writer waits for the write lock (default 5 s).
    pub busy_timeout: Duration,
    /// Largest payload accepted, in bytes of JSON (default 1 MiB).
    pub max_payload_bytes: usize,
    /// Run pending migrations (under a lock) before checking the schema (default false).
    pub migrate: bool,
}

/// Default wait for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default SQLite busy timeout.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default pool size for PostgreSQL and MySQL.
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default pool size for SQLite (one writer at a time anyway).
pub const DEFAULT_SQLITE_POOL_SIZE: u32 = 4;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            pool_size: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            migrate: false,
        }
    }
}

impl StoreOptions {
    /// Sets the pool size. On PostgreSQL the store also opens, at first need, one listening
    /// connection per scheduler and one connection for batches of 1,000 jobs or more, which
    /// it copies (`COPY`) instead of inserting.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = Some(n);
        self
    }

    /// Sets the connect / checkout timeout.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Sets the SQLite busy timeout.
    pub fn busy_timeout(mut self, d: Duration) -> Self {
        self.busy_timeout = d;
        self
    }

    /// Sets the payload size limit.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Runs pending migrations at connect.
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.pool_size == Some(0) {
            return Err(Error::Config {
                field: "pool_size",
                reason: "must be at least 1".into(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::Config {
                field: "connect_timeout",
                reason: "must be more than 0".into(),
            });
        }
        if self.max_payload_bytes == 0 {
            return Err(Error::Config {
                field: "max_payload_bytes",
                reason: "must be more than 0".into(),
            });
        }
        Ok(())
    }
}

pub(crate) enum Pool {
    Pg(Bb8Pool<AsyncPgConnection>),
    Mysql(Bb8Pool<AsyncMysqlConnection>),
    Sqlite(Bb8Pool<SqliteConn>),
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) backend: Backend,
    /// The URL as given, for migrations (which open their own connection). Never logged.
    pub(crate) url: String,
    pub(crate) url_redacted: String,
    pub(crate) opts: StoreOptions,
    /// SQLite has one writer at a time: this process's writes queue here, where the next one
    /// starts the moment the last ends. Waiting in SQLite's busy handler instead sleeps in
    /// steps of up to 100 ms (measured: claims waiting ~30 ms behind a 3 ms finalize).
    /// Other processes on the same file still meet the busy timeout.
    pub(crate) sqlite_writer: tokio::sync::Mutex<()>,
    /// PostgreSQL: the connection large batches are copied over.
    pub(crate) pg_bulk: super::bulk::BulkConn,
    /// MariaDB 10.6+: `INSERT … RETURNING` (MySQL has none) and `JSON_TABLE`, so an enqueue
    /// is one statement and a batch one insert.
    pub(crate) insert_returning: bool,
}

/// A parsed database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Pg(String),
    Mysql(String),
    Sqlite(PathBuf),
}

pub(crate) fn parse_url(url: &str) -> Result<Target> {
    let bad = |reason: String| Error::InvalidInput {
        field: "url",
        reason: format!("{} in {:?}", reason, redact_url(url)),
    };
    let expected = "expected postgres://user@host/db, mysql://user@host/db or sqlite://path";
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(bad(format!("no URL scheme; {expected}")));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "postgres" | "postgresql" => Ok(Target::Pg(url.to_string())),
        "mysql" | "mariadb" => Ok(Target::Mysql(format!("mysql:{rest}"))),
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            let path = path.split('?').next().unwrap_or(path);
            if path.is_empty() {
                return Err(bad(format!("no file path; {expected}")));
            }
            if path == ":memory:" {
                return Err(bad(
                    "an in-memory SQLite database cannot be shared by a pool; \
                     expected a file path such as sqlite://jobs.db"
                        .to_string(),
                ));
            }
            Ok(Target::Sqlite(PathBuf::from(path)))
        }
        other => Err(bad(format!("unknown scheme {other:?}; {expected}"))),
    }
}

impl Store {
    /// Opens a store on `url` with default options and checks its schema.
    ///
    /// `postgres://…`, `mysql://…` (MariaDB too) or `sqlite://path` (a file, created if
    /// missing, in WAL mode).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or unknown scheme, [`Error::Connect`] when
    /// the server cannot be reached or the file cannot be opened (URL redacted), and
    /// [`Error::SchemaOutOfDate`] when migrations have not been run.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo() -> jobvisor::Result<()> {
    /// use jobvisor::{Store, StoreOptions};
    /// let store = Store::connect_with("sqlite://jobs.db", StoreOptions::default().migrate(true)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with(url, StoreOptions::default()).await
    }

    /// Opens a store with explicit options; see [`Store::connect`].
    ///
    /// # Errors
    /// As [`Store::connect`], plus [`Error::Config`] for invalid options.
    pub async fn connect_with(url: &str, opts: StoreOptions) -> Result<Store> {
        opts.validate()?;
        let target = parse_url(url)?;
        let url_redacted = redact_url(url);
        let connect_err = |reason: String| Error::Connect {
            url: url_redacted.clone(),
            reason,
        };
        let timeout = opts.connect_timeout;
        let mut insert_returning = false;
        let (pool, backend) = match &target {
            Target::Pg(u) => {
                probe::<AsyncPgConnection>(u, timeout)
                    .await
                    .map_err(|r| connect_err(format!("{r}; expected a PostgreSQL server")))?;
                let mut cfg = ManagerConfig::<AsyncPgConnection>::default();
                cfg.recycling_method = RecyclingMethod::Fast;
                let mgr = AsyncDieselConnectionManager::new_with_config(u.clone(), cfg);
                let pool = builder(&opts, DEFAULT_POOL_SIZE).build_unchecked(mgr);
                (Pool::Pg(pool), Backend::Postgres)
            }
            Target::Mysql(u) => {
                probe::<AsyncMysqlConnection>(u, timeout)
                    .await
                    .map_err(|r| connect_err(format!("{r}; expected a MySQL or MariaDB server")))?;
                let mut cfg = ManagerConfig::<AsyncMysqlConnection>::default();
                // Verified, not Fast: diesel-async cannot tell that the server closed a MySQL
                // connection (it can for PostgreSQL), so after a server restart every pooled
                // connection would stay dead forever. One `SELECT 1` per checkout.
                cfg.recycling_method = RecyclingMethod::Verified;
                // READ COMMITTED: no gap locks, so concurrent `SKIP LOCKED` claims and
                // duplicate-key inserts do not deadlock each other (REPEATABLE READ does).
                cfg.custom_setup = Box::new(|conn_url: &str| {
                    let conn_url = conn_url.to_string();
                    Box::pin(async move {
                        let mut c = AsyncMysqlConnection::establish(&conn_url).await?;
                        c.batch_execute(
                            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                             SET SESSION time_zone = '+00:00'",
                        )
                        .await
                        .map_err(ConnectionError::CouldntSetupConfiguration)?;
                        Ok(c)
                    })
                });
                let mgr = AsyncDieselConnectionManager::new_with_config(u.clone(), cfg);
                let pool = builder(&opts, DEFAULT_POOL_SIZE)
                    .test_on_check_out(true)
                    .build_unchecked(mgr);
                let version = server_version(&pool)
                    .await
                    .map_err(|e| connect_err(format!("reading the server version: {e}")))?;
                insert_returning = supports_insert_returning(&version);
                (Pool::Mysql(pool), Backend::Mysql)
            }
            Target::Sqlite(path) => {
                check_sqlite_path(path).map_err(connect_err)?;
                let path_s = path.to_string_lossy().into_owned();
                let busy_ms = opts.busy_timeout.as_millis();
                // First open here, so a bad file is reported now with its real cause.
                open_sqlite(&path_s, busy_ms)
                    .await
                    .map_err(|e| connect_err(format!("{e}; expected a writable SQLite file")))?;
                let mut cfg = ManagerConfig::<SqliteConn>::default();
                cfg.recycling_method = RecyclingMethod::Fast;
                cfg.custom_setup = Box::new(move |conn_url: &str| {
                    let conn_url = conn_url.to_string();
                    Box::pin(async move { open_sqlite(&conn_url, busy_ms).await })
                });
                let mgr = AsyncDieselConnectionManager::new_with_config(path_s, cfg);
                let pool = builder(&opts, DEFAULT_SQLITE_POOL_SIZE).build_unchecked(mgr);
                (Pool::Sqlite(pool), Backend::Sqlite)
            }
        };
        let store = Store {
            inner: std::sync::Arc::new(Inner {
                pool,
                backend,
                url: url.to_string(),
                url_redacted,
                opts,
                sqlite_writer: tokio::sync::Mutex::new(()),
                pg_bulk: super::bulk::BulkConn::default(),
                insert_returning,
            }),
        };
        if store.inner.opts.migrate {
            store.migrate().await?;
        }
        store.check_schema().await?;
        Ok(store)
    }

    /// Which backend this store talks to.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }
}

fn builder<M: bb8::ManageConnection>(opts: &StoreOptions, default_size: u32) -> bb8::Builder<M> {
    bb8::Pool::builder()
        .max_size(opts.pool_size.unwrap_or(default_size))
        .connection_timeout(opts.connect_timeout)
        // No ping per checkout (a `SELECT 1` would double the cost of every short statement):
        // PostgreSQL connections report being closed, SQLite has no server. MySQL opts in.
        .test_on_check_out(false)
}

/// The MySQL server's `VERSION()`, e.g. `8.0.36` or `10.11.6-MariaDB-0+deb12u1`.
async fn server_version(pool: &Bb8Pool<AsyncMysqlConnection>) -> Result<String, String> {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    let mut c = pool.get().await.map_err(|e| e.to_string())?;
    let row: Version =
        diesel_async::RunQueryDsl::get_result(diesel::sql_query("SELECT VERSION() AS v"), &mut *c)
            .await
            .map_err(|e| e.to_string())?;
    Ok(row.v)
}

/// MariaDB has `INSERT … RETURNING` from 10.5 and `JSON_TABLE` from 10.6; MySQL has no
/// `INSERT … RETURNING`.
fn supports_insert_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (10, 6)
}

/// Opens one connection to report the real reason a server cannot be reached.
async fn probe<C: AsyncConnection>(url: &str, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, C::establish(url)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(scrub(&connection_error_text(&e), url)),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

fn connection_error_text(e: &ConnectionError) -> String {
    match e {
        ConnectionError::InvalidConnectionUrl(m) => format!("invalid connection URL: {m}"),
        other => other.to_string(),
    }
}

/// Removes the password from a driver message that may echo the URL.
fn scrub(msg: &str, url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match u.password() {
            Some(p) if !p.is_empty() => msg.replace(p, "***"),
            _ => msg.to_string(),
        },
        Err(_) => msg.to_string(),
    }
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

async fn open_sqlite(path: &str, busy_ms: u128) -> diesel::ConnectionResult<SqliteConn> {
    let mut c = SqliteConn::establish(path).await?;
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
            Ok(()) => return Ok(c),
            Err(e)
                if e.to_string().contains("is locked") && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(ConnectionError::CouldntSetupConfiguration(e)),
        }
    }
}

/// Classifies a diesel error once for all backends: transient (retry may help) or not.
pub(crate) fn classify(e: diesel::result::Error) -> StoreError {
    use diesel::result::Error as D;
    match e {
        D::DatabaseError(kind, info) => {
            let msg = info.message().to_string();
            match kind {
                DatabaseErrorKind::SerializationFailure
                | DatabaseErrorKind::ClosedConnection
                | DatabaseErrorKind::UnableToSendCommand => StoreError::Transient(msg),
                DatabaseErrorKind::UniqueViolation
                | DatabaseErrorKind::ForeignKeyViolation
                | DatabaseErrorKind::NotNullViolation
                | DatabaseErrorKind::CheckViolation => StoreError::Constraint {
                    name: info.constraint_name().unwrap_or("unknown").to_string(),
                    message: msg,
                },
                _ if is_transient_text(&msg) => StoreError::Transient(msg),
                _ => StoreError::Other(msg),
            }
        }
        D::BrokenTransactionManager => StoreError::Transient("broken transaction manager".into()),
        other => {
            let msg = other.to_string();
            if is_transient_text(&msg) {
                StoreError::Transient(msg)
            } else {
                StoreError::Other(msg)
            }
        }
    }
}

/// Messages by which the three drivers report conditions worth retrying.
fn is_transient_text(msg: &str) -> bool {
    const SIGNS: &[&str] = &[
        "deadlock",                 // PG 40P01, MySQL 1213
        "Deadlock found",           // MySQL 1213
        "Lock wait timeout",        // MySQL 1205
        "could not serialize",      // PG 40001
        "database is locked",       // SQLITE_BUSY
        "database table is locked", // SQLITE_LOCKED
        "connection closed",        // tokio-postgres
        "Connection refused",       //
        "connection reset",         //
        "Connection reset",         //
        "broken pipe",              //
        "Broken pipe",              //
        "terminating connection",   // PG admin shutdown
        "the database system is",   // PG starting up / shutting down
        "server has gone away",     // MySQL 2006
        "Lost connection",          // MySQL 2013
        "Server shutdown",          // MySQL 1053
        "Connection was killed",    // MySQL
        "Input/output error",       // mysql_async io
        "error communicating",      // tokio-postgres io
        "unexpected end of file",   //
        "too many clients",         // PG 53300
        "Too many connections",     // MySQL 1040
    ];
    SIGNS.iter().any(|s| msg.contains(s))
}

impl From<diesel::result::Error> for Error {
    fn from(e: diesel::result::Error) -> Self {
        Error::Database(classify(e))
    }
}

/// Maps a failure to check a connection out of the pool (always transient).
pub(crate) fn pool_err<E: std::fmt::Display>(e: bb8::RunError<E>) -> Error {
    match e {
        bb8::RunError::User(e) => Error::Database(StoreError::Transient(format!(
            "cannot open a database connection: {e}"
        ))),
        bb8::RunError::TimedOut => Error::Database(StoreError::Transient(
            "no database connection available within the connect timeout".into(),
        )),
    }
}

/// Runs `$body` with `$conn` bound to a pooled connection of whichever backend the store
/// uses. The body is type-checked once per backend, so it may only use portable SQL.
macro_rules! with_conn {
    ($store:expr, |$conn:ident| $body:expr) => {
        match &$store.inner.pool {
            $crate::store::connect::Pool::Pg(p) => {
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                let $conn = &mut *c;
                $body
            }
            $crate::store::connect::Pool::Mysql(p) => {
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                let $conn = &mut *c;
                $body
            }
            $crate::store::connect::Pool::Sqlite(p) => {
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                let $conn = &mut *c;
                $body
            }
        }
    };
}

/// Like `with_conn!`, but runs `$body` inside a transaction (`BEGIN IMMEDIATE` on SQLite, so
/// a read-then-write never fails on a lock upgrade). `$body` returns `QueryResult<T>`.
macro_rules! with_tx {
    ($store:expr, |$conn:ident| $body:expr) => {
        match &$store.inner.pool {
            $crate::store::connect::Pool::Pg(p) => {
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                diesel_async::AsyncConnection::transaction(&mut *c, async |$conn| $body).await
            }
            $crate::store::connect::Pool::Mysql(p) => {
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                diesel_async::AsyncConnection::transaction(&mut *c, async |$conn| $body).await
            }
            $crate::store::connect::Pool::Sqlite(p) => {
                let _writer = $store.inner.sqlite_writer.lock().await;
                let mut c = p.get().await.map_err($crate::store::connect::pool_err)?;
                c.immediate_transaction(async |$conn| $body).await
            }
        }
    };
}

pub(crate) use {with_conn, with_tx};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_or_rejected_by_name() {
        assert!(matches!(parse_url("postgres://u@h/db"), Ok(Target::Pg(_))));
        assert!(matches!(
            parse_url("postgresql://u@h/db"),
            Ok(Target::Pg(_))
        ));
        assert_eq!(
            parse_url("mariadb://u@h/db").ok(),
            Some(Target::Mysql("mysql://u@h/db".into()))
        );
        assert_eq!(
            parse_url("sqlite://data/jobs.db").ok(),
            Some(Target::Sqlite(PathBuf::from("data/jobs.db")))
        );
        assert_eq!(
            parse_url("sqlite:///tmp/jobs.db").ok(),
            Some(Target::Sqlite(PathBuf::from("/tmp/jobs.db")))
        );
        for bad in ["redis://h", "jobs.db", "sqlite://", "sqlite://:memory:"] {
            let err = parse_url(bad).unwrap_err().to_string();
            assert!(err.contains("url"), "{bad}: {err}");
        }
        let err = parse_url("oracle://u:hunter2@h/db")
            .unwrap_err()
            .to_string();
        assert!(err.contains("oracle") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn insert_returning_is_known_by_server_version() {
        assert!(supports_insert_returning("10.11.6-MariaDB-0+deb12u1"));
        assert!(supports_insert_returning("10.6.0-MariaDB"));
        assert!(!supports_insert_returning("10.5.9-MariaDB"));
        assert!(supports_insert_returning("11.4.2-MariaDB-log"));
        assert!(!supports_insert_returning("10.4.32-MariaDB"));
        assert!(!supports_insert_returning("8.0.36"));
        assert!(!supports_insert_returning("8.4.0-commercial"));
        assert!(!supports_insert_returning(""));
    }

    #[test]
    fn transient_errors_are_recognised() {
        assert!(is_transient_text("deadlock detected"));
        assert!(is_transient_text("database is locked"));
        assert!(!is_transient_text("syntax error at or near"));
    }
}
