//! Error classification, in one place for every backend: a database error is transient (a
//! retry may help: deadlock, serialization failure, lost connection, busy file), a named
//! constraint, or something else; driver messages lose any password they echo.

#[cfg(feature = "postgres")]
use diesel::result::ConnectionError;
use diesel::result::DatabaseErrorKind;

use crate::error::{Error, StoreError};

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
        "deadlock",          // PG 40P01, MySQL 1213
        "Deadlock found",    // MySQL 1213
        "Lock wait timeout", // MySQL 1205
        // MariaDB 1467: an `INSERT … SELECT` chosen as a deadlock victim while waiting for
        // the table's auto-increment lock is reported so (InnoDB rolled the transaction back).
        "Failed to read auto-increment value",
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
        // Galera: a member outside the primary component (1047), or one whose replication
        // failed; a certification conflict is reported as a deadlock (1213).
        "WSREP has not yet prepared node",
        "WSREP replication failed",
        // A guarded transaction the cluster aborted silently (`mysql/galera_guard.rs`).
        "Cannot execute statement in a READ ONLY transaction",
        "rolled the transaction back without reporting it",
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

/// A connection error as text (an invalid URL said so).
#[cfg(feature = "postgres")]
pub(crate) fn connection_error_text(e: &ConnectionError) -> String {
    match e {
        ConnectionError::InvalidConnectionUrl(m) => format!("invalid connection URL: {m}"),
        other => other.to_string(),
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Removes the password from a driver message that may echo the URL.
pub(crate) fn scrub(msg: &str, url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match u.password() {
            Some(p) if !p.is_empty() => msg.replace(p, "***"),
            _ => msg.to_string(),
        },
        Err(_) => match crate::error::password_span(url) {
            Some((from, to)) => msg.replace(&url[from..to], "***"),
            None => msg.to_string(),
        },
    }
}

/// Names the kind of a failed connection attempt before the driver's own words: refused,
/// unknown host, TLS, authentication, missing database — what an operator fixes differs
/// for each, and the driver's text alone often does not say which.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn connect_failure(raw: &str) -> String {
    let l = raw.to_ascii_lowercase();
    let kind = if l.contains("connection refused") {
        "connection refused (no server listens at that host and port)"
    } else if l.contains("failed to lookup address")
        || l.contains("name or service not known")
        || l.contains("no such host")
        || l.contains("name resolution")
        || l.contains("nodename nor servname")
    {
        "unknown host (the host name does not resolve)"
    } else if l.contains("server does not support tls")
        || l.contains("server doesn't support ssl")
        || l.contains("doesn't have ssl")
        || l.contains("does not support ssl")
        || l.contains("does not support tls")
    {
        "TLS required but the server does not offer it"
    } else if l.contains("tls")
        || l.contains("ssl")
        || l.contains("certificate")
        || l.contains("handshake")
    {
        "TLS failure"
    } else if l.contains("password authentication failed")
        || l.contains("access denied")
        || l.contains("sqlstate 28p01")
        || l.contains("sqlstate 28000")
        || l.contains("authentication")
        || l.contains("pg_hba.conf")
    {
        "authentication failed"
    } else if (l.contains("database") && l.contains("does not exist"))
        || l.contains("sqlstate 3d000")
        || l.contains("unknown database")
    {
        "the database does not exist"
    } else if l.contains("timed out") || l.contains("no answer within") {
        "no answer (timed out)"
    } else {
        return raw.to_string();
    };
    format!("{kind}: {raw}")
}

/// `reason` with "expected a `server`" after it when the failure is of no known kind — a
/// protocol the driver did not understand, perhaps another kind of server on that port; a
/// refused connection, a wrong password or a missing database needs no such hint.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn with_server_hint(reason: String, server: &str) -> String {
    if connect_failure(&reason) == reason {
        format!("{reason}; expected {server}")
    } else {
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn the_server_hint_only_where_the_failure_has_no_known_kind() {
        let auth = "password authentication failed for user \"app\"".to_string();
        assert_eq!(with_server_hint(auth.clone(), "a PostgreSQL server"), auth);
        assert_eq!(
            with_server_hint(
                "unexpected message from server".into(),
                "a PostgreSQL server"
            ),
            "unexpected message from server; expected a PostgreSQL server"
        );
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn connect_failures_are_named_by_kind() {
        for (raw, kind) in [
            (
                "error connecting to server: Connection refused (os error 111)",
                "connection refused",
            ),
            (
                "failed to lookup address information: Name or service not known",
                "unknown host",
            ),
            (
                "error performing TLS handshake: invalid peer certificate",
                "TLS failure",
            ),
            (
                "server does not support TLS",
                "TLS required but the server does not offer it",
            ),
            (
                "password authentication failed for user \"x\" (SQLSTATE 28P01)",
                "authentication failed",
            ),
            (
                "Access denied for user 'x'@'localhost' (using password: YES)",
                "authentication failed",
            ),
            (
                "database \"nope\" does not exist (SQLSTATE 3D000)",
                "the database does not exist",
            ),
            ("Unknown database 'nope'", "the database does not exist"),
        ] {
            let text = connect_failure(raw);
            assert!(text.starts_with(kind), "{raw:?} -> {text:?}");
            assert!(text.ends_with(raw), "{text:?} keeps the driver's words");
        }
        assert_eq!(connect_failure("something else"), "something else");
    }

    #[test]
    fn transient_errors_are_recognised() {
        assert!(is_transient_text("deadlock detected"));
        assert!(is_transient_text("database is locked"));
        assert!(is_transient_text(
            "Failed to read auto-increment value from storage engine"
        ));
        assert!(is_transient_text(
            "WSREP has not yet prepared node for application use"
        ));
        assert!(!is_transient_text("syntax error at or near"));
    }
}
