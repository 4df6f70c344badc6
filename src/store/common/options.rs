//! What a store is opened with: [`Backend`], [`StoreOptions`] with its defaults (each a named
//! constant), [`TcpKeepalive`]; checked before anything is opened.

use std::time::Duration;

use super::tls::TlsMode;
use crate::error::{Error, Result};
use crate::new_job::DEFAULT_MAX_PAYLOAD_BYTES;

/// Which database a store talks to.
///
/// # MariaDB and MySQL
/// MariaDB 10.6 or later is supported and tested (CI runs MariaDB 10.11). MySQL 8.0.1 or
/// later has its own code paths (no `INSERT … RETURNING`, `max_execution_time`) but **no test
/// has run against it**: treat it as untested.
///
/// * **URL**: `mysql://user:password@host:3306/database`, TLS by `ssl-mode` (or `sslmode`),
///   see [`TlsMode`]. Create the database first (`CREATE DATABASE app`); the schema comes from
///   [`StoreOptions::migrate`] or `jobvisor migrate --database-url …`, which need `CREATE`,
///   `ALTER`, `INDEX` and `DROP` on it; running nodes need `SELECT`, `INSERT`, `UPDATE`,
///   `DELETE`.
/// * **Sessions** are set by jobvisor on every connection: READ COMMITTED (no gap-lock
///   deadlocks between claimers), `time_zone = '+00:00'`, and the server-side statement bound
///   ([`StoreOptions::server_statement_timeout`]; MariaDB `max_statement_time`, MySQL
///   `max_execution_time`, which bounds `SELECT`s only). Times are stored as integer
///   microseconds, so the server's own time zone does not matter.
/// * **Wake-ups** from other processes' enqueues come from a change signal each node reads
///   every 80 ms; a node's own enqueues wake it at once.
/// * **Prepared statements**: each connection keeps a few shapes of every hot statement
///   prepared; with many nodes and large pools mind the server-wide
///   `max_prepared_stmt_count` (16,382 by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL 13+.
    Postgres,
    /// MariaDB 10.6+ (tested); MySQL 8.0.1+ (untested).
    Mysql,
    /// SQLite 3.35+ (bundled).
    Sqlite,
}

/// Options for [`Store::connect_with`](crate::store::Store::connect_with). Every default is a named constant.
///
/// # Bounded waits
/// A node whose network to the database is cut silently — its TCP connections hang, nothing
/// is reset — must not sit on a hung statement, and must be back at full speed within about
/// two seconds of the heal. So, with the defaults:
/// * every hot-path operation (claim, lease renewal, finalization, enqueue, reclaim) is
///   abandoned after [`statement_timeout`](Self::statement_timeout) (1.5 s), its connection
///   closed rather than reused, and reported as a transient [`Error::Database`]; the next call
///   runs on a fresh connection, so an operation sent just before the heal has given up
///   1.5 s after it at the latest;
/// * each attempt to open a connection is abandoned after
///   [`connect_attempt_timeout`](Self::connect_attempt_timeout) (1 s) and tried again, so a
///   connection attempt that hung in the cut is replaced within a second of the heal;
/// * renewals have their own connections (two per store);
/// * the server bounds statements and idle transactions to
///   [`server_statement_timeout`](Self::server_statement_timeout) (10 s), so what a vanished
///   client left running or holding locks is rolled back well within the default 30 s lease;
/// * TCP keepalives ([`tcp_keepalive`](Self::tcp_keepalive), 5 s idle then 3 probes 1 s apart)
///   and [`tcp_user_timeout`](Self::tcp_user_timeout) (10 s), at both ends on PostgreSQL,
///   close connections whose peer is gone (idle pooled connections, the listener), well
///   within a lease.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Pooled connections (default 10; SQLite 4), plus two for lease renewals.
    pub pool_size: Option<u32>,
    /// How long to wait for a connection in all: at connect, and from the pool (default
    /// 10 s, [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
    /// How long one attempt to open a connection may take — TCP connect, startup and
    /// authentication, session setup — before it is abandoned and a new one started, until
    /// [`connect_timeout`](Self::connect_timeout) (default 1 s,
    /// [`DEFAULT_CONNECT_ATTEMPT_TIMEOUT`]). A refused connection fails at once.
    pub connect_attempt_timeout: Duration,
    /// Client-side bound on each hot-path operation: claim, renew, finalize, reclaim, and
    /// enqueue per started 1,000 jobs or 4 MiB of payload (default 1.5 s,
    /// [`DEFAULT_STATEMENT_TIMEOUT`]). It includes the wait for a pooled connection. An
    /// operation that runs out fails with a transient [`Error::Database`] naming it, and its
    /// connection is closed, never reused. On SQLite, where a write may first wait up to
    /// [`busy_timeout`](Self::busy_timeout) for another process, the bound is the sum of both.
    ///
    /// Keep it well under the lease. The default leaves a wide margin over the largest
    /// operations the scheduler sends, measured on a 2-core machine under a load average of
    /// 5 (`examples/hot_path_times`, 20 rounds release / 50 rounds debug, slowest of
    /// PostgreSQL 15, MariaDB 10.11 and SQLite): a 500-job claim at most 71 ms release /
    /// 106 ms debug, a 1,000-job finalization 98 / 150 ms, a renewal of 1,000 leases 48 /
    /// 61 ms, a 1,000-job enqueue 62 / 104 ms, a 100-job reclaim 130 / 230 ms — a healthy
    /// statement is 6 to 10 times faster than the bound. And it is short enough that a node
    /// is claiming, renewing and finalizing again within 2 s of a network heal: an operation
    /// sent into the cut just before the heal gives up 1.5 s later, and the next runs on a
    /// fresh connection (each attempt to open one is bounded by
    /// [`connect_attempt_timeout`](Self::connect_attempt_timeout), 1 s).
    pub statement_timeout: Duration,
    /// Server-side bound on every statement and on every transaction left idle, for the
    /// store's pooled and listening connections (default 10 s,
    /// [`DEFAULT_SERVER_STATEMENT_TIMEOUT`]); `None` keeps the server's settings.
    /// PostgreSQL: `statement_timeout` and `idle_in_transaction_session_timeout`. MariaDB:
    /// `max_statement_time` and `idle_transaction_timeout` (whole seconds, rounded up).
    /// MySQL: `max_execution_time`, which bounds `SELECT` statements only (MySQL has no bound
    /// on other statements nor on idle transactions). It releases the locks and rolls back
    /// the work of a client that vanished mid-operation. A `COPY` of a large batch is exempt;
    /// any other single statement (a PostgreSQL batch with unique keys is one) must fit.
    pub server_statement_timeout: Option<Duration>,
    /// TCP keepalive on every connection (default [`TcpKeepalive::default`]: 5 s idle, then 3
    /// probes 1 s apart); `None` turns keepalives off. PostgreSQL: on the client's socket and,
    /// through `tcp_keepalives_*`, on the server's. MySQL/MariaDB: the driver sets the idle
    /// time only; the interval and probe count are the operating system's.
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// PostgreSQL: how long sent data may stay unacknowledged before the connection is closed
    /// (`TCP_USER_TIMEOUT`, Linux), on the client's socket and, through `tcp_user_timeout`,
    /// on the server's (default 10 s, [`DEFAULT_TCP_USER_TIMEOUT`]); `None` leaves it unset.
    /// MySQL drivers have no such setting.
    pub tcp_user_timeout: Option<Duration>,
    /// SQLite only: how long a writer waits for the write lock (default 5 s).
    pub busy_timeout: Duration,
    /// Largest payload accepted, in bytes of JSON (default 1 MiB).
    pub max_payload_bytes: usize,
    /// Run pending migrations (under a lock) before checking the schema (default false).
    pub migrate: bool,
    /// PostgreSQL and MySQL/MariaDB: the TLS mode; `None` (the default) takes the URL's
    /// `sslmode`, and [`TlsMode::Prefer`] if it has none. Set, it overrides the URL.
    pub tls_mode: Option<TlsMode>,
    /// PostgreSQL and MySQL/MariaDB: a PEM file of root certificates to trust; `None` (the
    /// default) takes the URL's `sslrootcert`, and the compiled-in Mozilla roots if it has
    /// none. See [`TlsMode`] for which modes check the certificate.
    pub tls_root_cert: Option<std::path::PathBuf>,
    /// PostgreSQL only: wake nodes by `LISTEN`/`NOTIFY` (default true). See
    /// [`notifications`](Self::notifications).
    pub notifications: bool,
    /// PostgreSQL only: serialise migrations on a session advisory lock (default true). See
    /// [`advisory_locks`](Self::advisory_locks).
    pub advisory_locks: bool,
}

/// TCP keepalive settings: after `idle` without traffic, `retries` probes `interval` apart;
/// a connection whose peer answers none is closed. Whole seconds (the operating system counts
/// in seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpKeepalive {
    /// Idle time before the first probe (default 5 s).
    pub idle: Duration,
    /// Time between probes (default 1 s).
    pub interval: Duration,
    /// Probes without an answer before the connection is closed (default 3).
    pub retries: u32,
}

impl TcpKeepalive {
    /// Keepalive settings; see [`TcpKeepalive`].
    pub fn new(idle: Duration, interval: Duration, retries: u32) -> Self {
        TcpKeepalive {
            idle,
            interval,
            retries,
        }
    }
}

impl Default for TcpKeepalive {
    /// 5 s idle, then 3 probes 1 s apart: a dead peer is noticed within about 8 s.
    fn default() -> Self {
        TcpKeepalive::new(Duration::from_secs(5), Duration::from_secs(1), 3)
    }
}

/// Default wait for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on one connection attempt.
pub const DEFAULT_CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default client-side bound on a hot-path operation.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Default server-side bound on a statement or an idle transaction.
pub const DEFAULT_SERVER_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `TCP_USER_TIMEOUT` (PostgreSQL).
pub const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default SQLite busy timeout.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default pool size for PostgreSQL and MySQL.
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default pool size for SQLite (one writer at a time anyway).
pub const DEFAULT_SQLITE_POOL_SIZE: u32 = 4;
/// Connections kept for lease renewals, besides the pool: one per scheduler renews at a time,
/// so two serve two schedulers on one store without waiting.
pub(crate) const RENEW_LANE_SIZE: u32 = 2;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            pool_size: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connect_attempt_timeout: DEFAULT_CONNECT_ATTEMPT_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            server_statement_timeout: Some(DEFAULT_SERVER_STATEMENT_TIMEOUT),
            tcp_keepalive: Some(TcpKeepalive::default()),
            tcp_user_timeout: Some(DEFAULT_TCP_USER_TIMEOUT),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            migrate: false,
            tls_mode: None,
            tls_root_cert: None,
            notifications: true,
            advisory_locks: true,
        }
    }
}

impl StoreOptions {
    /// Sets the pool size (default 10; SQLite 4). On PostgreSQL the store also opens, at
    /// first need, one listening connection per scheduler and one connection for batches of
    /// 1,000 jobs or more, which it copies (`COPY`) instead of inserting; every backend keeps
    /// up to two more for lease renewals.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = Some(n);
        self
    }

    /// Sets the connect / checkout timeout (default 10 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Sets the bound on one connection attempt (default 1 s).
    pub fn connect_attempt_timeout(mut self, d: Duration) -> Self {
        self.connect_attempt_timeout = d;
        self
    }

    /// Sets the client-side bound on hot-path operations (default 1.5 s).
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d;
        self
    }

    /// Sets the server-side statement and idle-transaction bound (default 10 s); `None`
    /// keeps the server's settings.
    pub fn server_statement_timeout(mut self, d: Option<Duration>) -> Self {
        self.server_statement_timeout = d;
        self
    }

    /// Sets TCP keepalives (default 5 s idle, 3 probes 1 s apart); `None` turns them off.
    pub fn tcp_keepalive(mut self, k: Option<TcpKeepalive>) -> Self {
        self.tcp_keepalive = k;
        self
    }

    /// Sets PostgreSQL's `TCP_USER_TIMEOUT` (default 10 s); `None` leaves it unset.
    pub fn tcp_user_timeout(mut self, d: Option<Duration>) -> Self {
        self.tcp_user_timeout = d;
        self
    }

    /// Sets the SQLite busy timeout (default 5 s).
    pub fn busy_timeout(mut self, d: Duration) -> Self {
        self.busy_timeout = d;
        self
    }

    /// Sets the payload size limit (default 1 MiB).
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Runs pending migrations at connect (default false).
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// Sets the TLS mode for PostgreSQL and MySQL/MariaDB, overriding the URL's `sslmode`
    /// (default: the URL's, else [`TlsMode::Prefer`]).
    ///
    /// # Examples
    /// ```
    /// use jobvisor::{StoreOptions, TlsMode};
    /// let opts = StoreOptions::default()
    ///     .tls_mode(TlsMode::VerifyFull)
    ///     .tls_root_cert("/etc/ssl/certs/db-ca.pem");
    /// ```
    pub fn tls_mode(mut self, mode: TlsMode) -> Self {
        self.tls_mode = Some(mode);
        self
    }

    /// Trusts the root certificates of a PEM file, overriding the URL's `sslrootcert`
    /// (default: the URL's, else the compiled-in Mozilla roots).
    pub fn tls_root_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_root_cert = Some(path.into());
        self
    }

    /// PostgreSQL only: whether the store uses `LISTEN`/`NOTIFY` (default true).
    ///
    /// Off, for a PostgreSQL-compatible engine without them (CockroachDB, YugabyteDB; see
    /// CONTRIBUTING's "Distributed PostgreSQL"), the store neither listens nor notifies:
    /// nodes read the change signal every 80 ms as on MariaDB (new job ids, queue settings,
    /// a one-row wake counter that releases, retries, refunds and cancels move instead of
    /// notifying), [`Client::wait`](crate::Client::wait) polls, and the store's sessions keep
    /// the insert trigger silent. Wake-ups take up to that poll rather than a millisecond.
    /// Another process's own SQL and the queue-settings trigger still notify: on an engine
    /// without `NOTIFY`, enqueue through jobvisor and change settings through it.
    ///
    /// # Examples
    /// ```
    /// use jobvisor::StoreOptions;
    /// // A PostgreSQL-compatible engine without LISTEN/NOTIFY or advisory locks.
    /// let opts = StoreOptions::default().notifications(false).advisory_locks(false);
    /// ```
    pub fn notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// PostgreSQL only: whether migrations serialise on a session advisory lock (default
    /// true).
    ///
    /// Off, they serialise on a row of their own (`jobvisor_migrate_lock`, held for at most
    /// 300 s), as on MariaDB, where a Galera cluster's named locks are not replicated: for
    /// engines without advisory locks. Every process that migrates one database must set it
    /// alike, or two of them could migrate at once. A migrator that dies holding the row
    /// keeps the others waiting until its hold lapses, where an advisory lock is freed with
    /// its connection.
    pub fn advisory_locks(mut self, on: bool) -> Self {
        self.advisory_locks = on;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::Config { field, reason });
        if self.pool_size == Some(0) {
            return bad("pool_size", "must be at least 1".into());
        }
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("connect_attempt_timeout", self.connect_attempt_timeout),
            ("statement_timeout", self.statement_timeout),
        ] {
            if d < Duration::from_millis(1) {
                return bad(field, format!("is {d:?}; expected at least 1 ms"));
            }
        }
        for (field, d) in [
            ("server_statement_timeout", self.server_statement_timeout),
            ("tcp_user_timeout", self.tcp_user_timeout),
        ] {
            // The servers and the socket option count in milliseconds; 0 would mean "none".
            match d {
                Some(d) if d < Duration::from_millis(1) => {
                    return bad(
                        field,
                        format!("is {d:?}; expected at least 1 ms, or None for no bound"),
                    );
                }
                Some(d) if d.as_millis() > u128::from(i32::MAX.unsigned_abs()) => {
                    return bad(field, format!("is {d:?}; expected at most {} ms", i32::MAX));
                }
                _ => {}
            }
        }
        if let Some(k) = &self.tcp_keepalive {
            for (field, d) in [
                ("tcp_keepalive.idle", k.idle),
                ("tcp_keepalive.interval", k.interval),
            ] {
                if d < Duration::from_secs(1) || d.subsec_nanos() != 0 || d.as_secs() > 32_767 {
                    return bad(
                        field,
                        format!("is {d:?}; expected whole seconds from 1 to 32767"),
                    );
                }
            }
            if k.retries == 0 || k.retries > 127 {
                return bad(
                    "tcp_keepalive.retries",
                    format!("is {}; expected 1 to 127", k.retries),
                );
            }
        }
        if self.max_payload_bytes == 0 {
            return bad("max_payload_bytes", "must be more than 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_timeouts_are_refused_naming_the_field() {
        let cases: Vec<(StoreOptions, &str)> = vec![
            (
                StoreOptions::default().statement_timeout(Duration::ZERO),
                "statement_timeout",
            ),
            (
                StoreOptions::default().connect_attempt_timeout(Duration::from_micros(10)),
                "connect_attempt_timeout",
            ),
            (
                StoreOptions::default().connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                StoreOptions::default().server_statement_timeout(Some(Duration::ZERO)),
                "server_statement_timeout",
            ),
            (
                StoreOptions::default().tcp_user_timeout(Some(Duration::from_secs(10_000_000))),
                "tcp_user_timeout",
            ),
            (
                StoreOptions::default().tcp_keepalive(Some(TcpKeepalive::new(
                    Duration::from_millis(1500),
                    Duration::from_secs(1),
                    3,
                ))),
                "tcp_keepalive.idle",
            ),
            (
                StoreOptions::default().tcp_keepalive(Some(TcpKeepalive::new(
                    Duration::from_secs(5),
                    Duration::ZERO,
                    3,
                ))),
                "tcp_keepalive.interval",
            ),
            (
                StoreOptions::default().tcp_keepalive(Some(TcpKeepalive::new(
                    Duration::from_secs(5),
                    Duration::from_secs(1),
                    0,
                ))),
                "tcp_keepalive.retries",
            ),
        ];
        for (opts, field) in cases {
            match opts.validate() {
                Err(Error::Config { field: f, reason }) => {
                    assert_eq!(f, field, "{reason}");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(StoreOptions::default().validate().is_ok());
        let off = StoreOptions::default()
            .server_statement_timeout(None)
            .tcp_keepalive(None)
            .tcp_user_timeout(None);
        assert!(off.validate().is_ok());
    }
}
