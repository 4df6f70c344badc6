//! How the store opens PostgreSQL connections — pooled, renewal, listening and `COPY` ones:
//! the URL's settings plus the store's TCP keepalives, `TCP_USER_TIMEOUT`, attempt timeout and
//! server-side bounds, set at both ends.

use std::time::Duration;

use diesel::result::ConnectionError;
use diesel::ConnectionResult;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

use crate::store::errors::{connect_failure, scrub};
use crate::store::pool::attempts;
use crate::store::tls::{split_url, TlsMode};
use crate::store::StoreOptions;

/// How the store opens PostgreSQL connections — pooled, renewal, listening and `COPY` ones:
/// the URL's settings plus the store's TCP keepalives, `TCP_USER_TIMEOUT`, attempt timeout
/// and server-side bounds. Holds the password: never logged, no `Debug`.
#[derive(Clone)]
pub(crate) struct PgConnector {
    config: tokio_postgres::Config,
    /// TLS for every connection (unused when the mode is `disable`).
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// The statements that set the session's server-side bounds, run once per connection.
    session: String,
    attempt: Duration,
    total: Duration,
}

impl PgConnector {
    pub(crate) fn new(url: &str, opts: &StoreOptions) -> std::result::Result<Self, String> {
        let (url_clean, tls) = split_url(url, opts.tls_mode, opts.tls_root_cert.as_deref())
            .map_err(|e| scrub(&e, url))?;
        let mut config: tokio_postgres::Config = url_clean
            .parse()
            .map_err(|e| scrub(&format!("invalid connection URL: {e}"), url))?;
        config.ssl_mode(match tls.mode {
            TlsMode::Disable => tokio_postgres::config::SslMode::Disable,
            TlsMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls.client_config()?);
        config.connect_timeout(opts.connect_attempt_timeout);
        match &opts.tcp_keepalive {
            Some(k) => {
                config
                    .keepalives(true)
                    .keepalives_idle(k.idle)
                    .keepalives_interval(k.interval)
                    .keepalives_retries(k.retries);
            }
            None => {
                config.keepalives(false);
            }
        }
        if let Some(t) = opts.tcp_user_timeout {
            config.tcp_user_timeout(t);
        }
        Ok(PgConnector {
            config,
            tls,
            session: pg_session_sql(opts),
            attempt: opts.connect_attempt_timeout,
            total: opts.connect_timeout,
        })
    }

    /// A diesel-async connection, for the pools and the listener.
    pub(crate) async fn diesel(&self) -> ConnectionResult<AsyncPgConnection> {
        attempts(self.attempt, self.total, || async {
            let (client, conn) = self
                .config
                .connect(self.tls.clone())
                .await
                .map_err(|e| connect_failure(&pg_error_text(&e)))?;
            let mut c = AsyncPgConnection::try_from_client_and_connection(client, conn)
                .await
                .map_err(|e| e.to_string())?;
            if !self.session.is_empty() {
                c.batch_execute(&self.session)
                    .await
                    .map_err(|e| format!("setting up the session: {e}"))?;
            }
            Ok(c)
        })
        .await
        .map_err(ConnectionError::BadConnection)
    }

    /// A plain client, its connection driven by a spawned task, for `COPY`.
    pub(crate) async fn client(&self) -> std::result::Result<tokio_postgres::Client, String> {
        attempts(self.attempt, self.total, || async {
            let (client, conn) = self
                .config
                .connect(self.tls.clone())
                .await
                .map_err(|e| connect_failure(&pg_error_text(&e)))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "PostgreSQL connection closed");
                }
            });
            if !self.session.is_empty() {
                client
                    .batch_execute(&self.session)
                    .await
                    .map_err(|e| format!("setting up the session: {e}"))?;
            }
            Ok(client)
        })
        .await
    }
}

/// A tokio-postgres error with its cause and, for a server error, its SQLSTATE: the
/// `Display` of a connect error alone is often just "error connecting to server".
fn pg_error_text(e: &tokio_postgres::Error) -> String {
    use std::error::Error as _;
    let mut text = e.to_string();
    if let Some(db) = e.as_db_error() {
        text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    } else if let Some(src) = e.source() {
        let src = src.to_string();
        if !text.contains(&src) {
            text = format!("{text}: {src}");
        }
    }
    text
}

/// PostgreSQL session settings for the store's options: the server-side statement and
/// idle-transaction bounds, and the server's end of keepalives and `TCP_USER_TIMEOUT` (so the
/// server, too, drops a client that vanished, with its locks).
fn pg_session_sql(opts: &StoreOptions) -> String {
    let mut sets = Vec::new();
    if let Some(d) = opts.server_statement_timeout {
        let ms = d.as_millis();
        sets.push(format!("SET statement_timeout = {ms}"));
        sets.push(format!("SET idle_in_transaction_session_timeout = {ms}"));
    }
    if let Some(k) = &opts.tcp_keepalive {
        sets.push(format!("SET tcp_keepalives_idle = {}", k.idle.as_secs()));
        sets.push(format!(
            "SET tcp_keepalives_interval = {}",
            k.interval.as_secs()
        ));
        sets.push(format!("SET tcp_keepalives_count = {}", k.retries));
    }
    if let Some(t) = opts.tcp_user_timeout {
        sets.push(format!("SET tcp_user_timeout = {}", t.as_millis()));
    }
    if !opts.notifications {
        // Without notifications (StoreOptions::notifications): the insert trigger stays
        // silent for every insert on the store's sessions, as it does for a transaction the
        // enqueue statement marked, and the announcements (`announce_due`, `announce_cancel`)
        // move the wake counter instead of notifying.
        sets.push("SET jobvisor.notify = 'after_commit'".into());
        sets.push("SET jobvisor.listen = 'off'".into());
    }
    sets.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DEFAULT_CONNECT_ATTEMPT_TIMEOUT;

    #[test]
    fn postgres_connections_get_keepalives_timeouts_and_server_bounds() {
        let url = "postgres://u:hunter2@db.example:5433/app?options=-c%20search_path%3Dx";
        let c = PgConnector::new(url, &StoreOptions::default()).unwrap();
        assert!(c.config.get_keepalives());
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(
            c.config.get_keepalives_interval(),
            Some(Duration::from_secs(1))
        );
        assert_eq!(c.config.get_keepalives_retries(), Some(3));
        assert_eq!(
            c.config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(10))
        );
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&DEFAULT_CONNECT_ATTEMPT_TIMEOUT)
        );
        // The URL's own settings stay.
        assert_eq!(c.config.get_options(), Some("-c search_path=x"));
        assert_eq!(
            c.session,
            "SET statement_timeout = 10000; SET idle_in_transaction_session_timeout = 10000; \
             SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 1; \
             SET tcp_keepalives_count = 3; SET tcp_user_timeout = 10000"
        );
        let off = StoreOptions::default()
            .server_statement_timeout(None)
            .tcp_keepalive(None)
            .tcp_user_timeout(None);
        let c = PgConnector::new(url, &off).unwrap();
        assert!(!c.config.get_keepalives());
        assert_eq!(c.config.get_tcp_user_timeout(), None);
        assert_eq!(c.session, "");
        let err = PgConnector::new("postgres://u:hunter2@h:notaport/db", &off)
            .err()
            .unwrap();
        assert!(!err.contains("hunter2"), "{err}");
    }
}
