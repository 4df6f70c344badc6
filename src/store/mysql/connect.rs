//! How the store opens MySQL/MariaDB connections: TLS (`store::tls`; `prefer` falls back to
//! plain when the server offers none), the session (READ COMMITTED, UTC, the flavour's
//! server-side bounds), keepalives through the URL, and the server's version, which
//! says whether `INSERT … RETURNING` and `JSON_TABLE` are there.
//!
//! A URL may name several members of a Galera cluster (`members.rs`): each new connection
//! then tries them in turn, each for at most the attempt timeout, and drops a member that
//! is not in the primary component (`wsrep_ready` not `ON`, read once per connection), so a
//! store carries on through the others when one dies, refuses, or is cut off.

use std::time::Duration;

use diesel::result::ConnectionError;
use diesel::ConnectionResult;
use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};

use super::members::{self, Choice};
use crate::store::errors::{connect_failure, scrub};
use crate::store::pool::{attempts, with_query};
use crate::store::tls::{root_certs, split_url, TlsMode, TlsSettings};
use crate::store::StoreOptions;

/// How the store opens MySQL/MariaDB connections. Holds the password: no `Debug`.
#[derive(Clone)]
pub(crate) struct MysqlConnector {
    opts: mysql_async::Opts,
    /// Several members (a Galera cluster): each one's settings and its name for errors.
    /// Empty for a plain URL, whose one server is `opts`.
    members: std::sync::Arc<Vec<(String, mysql_async::Opts)>>,
    choice: Choice,
    /// Where the next connection starts, with [`Choice::Spread`].
    turn: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tls: TlsSettings,
    /// `prefer` met a server that offers no TLS: later connections go plain at once rather
    /// than opening (and dropping) a TCP connection each time to learn it again.
    plain_server: std::sync::Arc<std::sync::atomic::AtomicBool>,
    session: String,
    pub(crate) attempt: Duration,
    pub(crate) total: Duration,
}

impl MysqlConnector {
    /// The connection settings of `url` with the store's TLS and keepalive; the session's
    /// server-side bounds are MySQL's until [`MysqlConnector::for_flavour`] says otherwise.
    pub(crate) fn new(url: &str, opts: &StoreOptions) -> std::result::Result<Self, String> {
        let split = members::split(url).map_err(|e| scrub(&e, url))?;
        let (mut url_clean, tls) =
            split_url(&split.url, opts.tls_mode, opts.tls_root_cert.as_deref())
                .map_err(|e| scrub(&e, url))?;
        if let Some(k) = &opts.tcp_keepalive {
            // mysql_async sets the idle time only (TCP_KEEPIDLE); the URL's own wins if given.
            if !url_clean.contains("tcp_keepalive=") {
                url_clean =
                    with_query(&url_clean, &format!("tcp_keepalive={}", k.idle.as_millis()));
            }
        }
        let parsed = mysql_async::Opts::from_url(&url_clean)
            .map_err(|e| scrub(&format!("invalid connection URL: {e}"), url))?;
        if tls.mode != TlsMode::Disable {
            // Fail now, naming the file, rather than at every connection attempt.
            if let Some(p) = &tls.root_cert {
                root_certs(p)?;
            }
        }
        let list = split
            .list
            .iter()
            .map(|m| {
                let o = mysql_async::OptsBuilder::from_opts(parsed.clone())
                    .ip_or_hostname(m.host.clone())
                    .tcp_port(m.port.unwrap_or(3306));
                (m.to_string(), o.into())
            })
            .collect();
        Ok(MysqlConnector {
            opts: parsed,
            members: std::sync::Arc::new(list),
            choice: split.choice,
            turn: std::sync::Arc::default(),
            tls,
            plain_server: std::sync::Arc::default(),
            session: mysql_session_sql(opts, false),
            attempt: opts.connect_attempt_timeout,
            total: opts.connect_timeout,
        })
    }

    /// The same connector with the session bounds of the server's flavour (`mariadb`: they
    /// are named differently).
    pub(crate) fn for_flavour(mut self, opts: &StoreOptions, mariadb: bool) -> Self {
        self.session = mysql_session_sql(opts, mariadb);
        if mariadb && self.clustered() {
            // Galera applies a commit on the other members after it returns: without this a
            // read on another member (the schema check after a migration, a job just
            // enqueued) may not see it yet. Each read waits until its member has caught up.
            self.session.push_str("; SET SESSION wsrep_sync_wait = 1");
        }
        self
    }

    /// The driver's options for one attempt: TLS on or off. As diesel-async's own
    /// `establish`: no driver statement cache (diesel keeps its own) and found-rows counts.
    fn driver_opts(&self, base: &mysql_async::Opts, tls: bool) -> mysql_async::Opts {
        let mut b = mysql_async::OptsBuilder::from_opts(base.clone())
            .stmt_cache_size(0)
            .client_found_rows(true);
        if tls {
            let mut ssl = mysql_async::SslOpts::default()
                .with_danger_accept_invalid_certs(!self.tls.verifies_chain())
                .with_danger_skip_domain_validation(!self.tls.verifies_host());
            if let Some(p) = &self.tls.root_cert {
                ssl = ssl
                    .with_root_certs(vec![p.clone().into()])
                    .with_disable_built_in_roots(true);
            }
            b = b.ssl_opts(ssl);
        } else {
            b = b.ssl_opts(None);
        }
        b.into()
    }

    /// Whether the URL names several members.
    pub(crate) fn clustered(&self) -> bool {
        !self.members.is_empty()
    }

    /// One driver connection: to the URL's server, or to the first member (in order, or
    /// from the next in turn with `members=spread`) that accepts it within the attempt
    /// timeout and is in the cluster's primary component.
    async fn open(&self) -> std::result::Result<AsyncMysqlConnection, String> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.members.is_empty() {
            return self.open_at(&self.opts).await;
        }
        let n = self.members.len();
        let start = match self.choice {
            Choice::First => 0,
            Choice::Spread => self.turn.fetch_add(1, Relaxed) % n,
        };
        let mut failures = Vec::with_capacity(n);
        for k in 0..n {
            let (name, opts) = &self.members[(start + k) % n];
            let tried = tokio::time::timeout(self.attempt, async {
                let mut c = self.open_at(opts).await?;
                primary(&mut c).await?;
                Ok::<_, String>(c)
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.attempt)));
            match tried {
                Ok(c) => return Ok(c),
                Err(e) => failures.push(format!("member {name}: {e}")),
            }
        }
        Err(format!(
            "no member of the cluster took the connection: {}",
            failures.join("; ")
        ))
    }

    /// One driver connection to `base`, TLS as the mode says (`prefer`: TLS, or plain if
    /// the server offers none).
    async fn open_at(
        &self,
        base: &mysql_async::Opts,
    ) -> std::result::Result<AsyncMysqlConnection, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let plain = || async {
            mysql_async::Conn::new(self.driver_opts(base, false))
                .await
                .map_err(|e| e.to_string())
        };
        let known_plain = self.plain_server.load(Relaxed);
        let conn = match self.tls.mode {
            TlsMode::Disable => plain().await,
            TlsMode::Prefer if known_plain => plain().await,
            mode => match mysql_async::Conn::new(self.driver_opts(base, true)).await {
                Ok(c) => Ok(c),
                Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                )) if mode == TlsMode::Prefer => {
                    self.plain_server.store(true, Relaxed);
                    plain().await
                }
                Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                )) => Err(format!(
                    "the server does not support TLS, which sslmode={mode} requires"
                )),
                Err(e) => Err(e.to_string()),
            },
        }
        .map_err(|e| connect_failure(&e))?;
        AsyncMysqlConnection::try_from(conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// A diesel-async connection with the store's session settings, within the attempt and
    /// total timeouts.
    pub(crate) async fn diesel(&self) -> ConnectionResult<AsyncMysqlConnection> {
        attempts(self.attempt, self.total, || async {
            let mut c = self.open().await?;
            c.batch_execute(&self.session)
                .await
                .map_err(|e| format!("setting up the session: {e}"))?;
            Ok(c)
        })
        .await
        .map_err(ConnectionError::BadConnection)
    }
}

/// Fails unless the server is in its Galera cluster's primary component (`wsrep_ready` is
/// `ON`; a member cut off from the others answers 1047 to every statement on a table). A
/// server without Galera has no such status and passes.
async fn primary(c: &mut AsyncMysqlConnection) -> std::result::Result<(), String> {
    #[derive(diesel::QueryableByName)]
    struct Status {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = Value)]
        value: String,
    }
    let rows: Vec<Status> =
        diesel_async::RunQueryDsl::load(diesel::sql_query("SHOW STATUS LIKE 'wsrep_ready'"), c)
            .await
            .map_err(|e| format!("reading wsrep_ready: {e}"))?;
    match rows.first() {
        Some(s) if s.value != "ON" => Err(format!(
            "not in the cluster's primary component (wsrep_ready={})",
            s.value
        )),
        _ => Ok(()),
    }
}

/// The checkout ping of a store on several members: fails on a connection whose member has
/// left the primary component since (1047 on any table), so the pool opens another —
/// elsewhere — in its place. As cheap as `SELECT 1`: no row is read; a database not migrated
/// yet (no such table) passes.
pub(crate) async fn still_primary(c: &mut AsyncMysqlConnection) -> diesel::QueryResult<()> {
    use diesel::result::Error as D;
    match diesel_async::RunQueryDsl::execute(
        diesel::sql_query("SELECT 1 FROM jobvisor_jobs LIMIT 0"),
        c,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(D::DatabaseError(_, info)) if info.message().contains("doesn't exist") => Ok(()),
        Err(e) => Err(e),
    }
}

/// MySQL/MariaDB session settings. READ COMMITTED: no gap locks, so concurrent `SKIP LOCKED`
/// claims and duplicate-key inserts do not deadlock each other (REPEATABLE READ does). UTC.
/// Then the server-side bounds: MariaDB has `max_statement_time` (seconds, any statement)
/// and `idle_transaction_timeout` (whole seconds); MySQL only `max_execution_time`
/// (milliseconds, `SELECT` statements only).
fn mysql_session_sql(opts: &StoreOptions, mariadb: bool) -> String {
    let mut sql = String::from(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION time_zone = '+00:00'",
    );
    if let Some(d) = opts.server_statement_timeout {
        if mariadb {
            sql.push_str(&format!(
                "; SET SESSION max_statement_time = {:.3}; \
                 SET SESSION idle_transaction_timeout = {}",
                d.as_secs_f64(),
                d.as_secs() + u64::from(d.subsec_nanos() > 0)
            ));
        } else {
            sql.push_str(&format!(
                "; SET SESSION max_execution_time = {}",
                d.as_millis()
            ));
        }
    }
    sql
}

/// The MySQL server's `VERSION()`, e.g. `8.0.36` or `10.11.6-MariaDB-0+deb12u1`, and whether
/// it is a Galera member (`wsrep_on`), read on a first connection that also reports the real
/// reason a server cannot be reached.
pub(crate) async fn server_version(
    connector: &MysqlConnector,
) -> std::result::Result<(String, bool), String> {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    #[derive(diesel::QueryableByName)]
    struct Variable {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = Value)]
        value: String,
    }
    attempts(connector.attempt, connector.total, || async {
        let mut c = connector.open().await?;
        let row: Version = diesel_async::RunQueryDsl::get_result(
            diesel::sql_query("SELECT VERSION() AS v"),
            &mut c,
        )
        .await
        .map_err(|e| format!("reading the server version: {e}"))?;
        // MySQL has no such variable (no row); MariaDB without Galera has it `OFF`.
        let wsrep: Vec<Variable> = diesel_async::RunQueryDsl::load(
            diesel::sql_query("SHOW VARIABLES LIKE 'wsrep_on'"),
            &mut c,
        )
        .await
        .map_err(|e| format!("reading wsrep_on: {e}"))?;
        Ok((row.v, wsrep.first().is_some_and(|w| w.value == "ON")))
    })
    .await
}

/// MariaDB has `INSERT … RETURNING` from 10.5 and `JSON_TABLE` from 10.6; MySQL has no
/// `INSERT … RETURNING`.
pub(crate) fn supports_insert_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (10, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn mysql_sessions_get_the_bounds_their_flavour_has() {
        let opts =
            StoreOptions::default().server_statement_timeout(Some(Duration::from_millis(2500)));
        let maria = MysqlConnector::new("mysql://u@h/db", &opts)
            .unwrap()
            .for_flavour(&opts, true);
        assert_eq!(maria.opts.tcp_keepalive(), Some(5000));
        assert!(
            maria.session.ends_with(
                "SET SESSION max_statement_time = 2.500; SET SESSION idle_transaction_timeout = 3"
            ),
            "{}",
            maria.session
        );
        let mysql = MysqlConnector::new("mysql://u@h/db?tcp_keepalive=1000", &opts)
            .unwrap()
            .for_flavour(&opts, false);
        assert_eq!(mysql.opts.tcp_keepalive(), Some(1000));
        assert!(
            mysql
                .session
                .ends_with("SET SESSION max_execution_time = 2500"),
            "{}",
            mysql.session
        );
    }
}
