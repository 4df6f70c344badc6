//! The public error type: one variant per thing a caller can do about it.
//!
//! A write that loses its guard (a zombie's renew or finalize, a stale version) is *not* an
//! error: it is the [`Guarded::LeaseLost`](crate::store::Guarded) / `Stale` outcome. Errors are
//! reserved for bad input, missing rows, schema or configuration problems and an unavailable
//! database; [`Error::is_transient`] tells the caller when trying again may help.

use crate::job::{JobId, JobState};

/// Result alias used across jobvisor.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when calling jobvisor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything was written: `field` names it, `reason` says
    /// what was expected.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The offending argument (`kind`, `queue`, `payload`, `url`, …).
        field: &'static str,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// The application's [`JobHooks::on_enqueue`](crate::hooks::JobHooks::on_enqueue)
    /// refused a job (or panicked on it): nothing of the call was written.
    #[error("the hook {hook} refused a {kind} job: {reason}")]
    Refused {
        /// The hooks' type.
        hook: &'static str,
        /// The refused job's kind.
        kind: String,
        /// The hook's reason (or its panic's message).
        reason: String,
    },
    /// No job has this id (neither live nor archived).
    #[error("job {id} not found")]
    NotFound {
        /// The id that was looked up.
        id: JobId,
    },
    /// The job is not in a state the requested transition starts from.
    #[error("job {id} cannot go from {from} to {to}")]
    InvalidTransition {
        /// The job.
        id: JobId,
        /// Its current state.
        from: JobState,
        /// The state that was asked for.
        to: JobState,
    },
    /// A configuration value is out of range: `field` names it.
    #[error("invalid configuration {field}: {reason}")]
    Config {
        /// The offending setting.
        field: &'static str,
        /// What was expected.
        reason: String,
    },
    /// The database schema is missing or older than this version of jobvisor.
    #[error(
        "the jobvisor schema in {url} is {found}, this build needs version {expected}: \
         run `jobvisor migrate --database-url {url}` (the binary of the crate's `cli` \
         feature; give the password if the database needs one) or connect with \
         `StoreOptions::default().migrate(true)`"
    )]
    SchemaOutOfDate {
        /// The latest migration version this build embeds.
        expected: String,
        /// What the database has (`missing` or `at version …`).
        found: String,
        /// The database URL, password redacted.
        url: String,
    },
    /// The database could not be reached at connect time.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The database URL, password redacted.
        url: String,
        /// Why, and what was expected.
        reason: String,
    },
    /// A stored row could not be read back (for instance a payload that is no longer JSON).
    #[error("job {id} is corrupt: {reason}")]
    Corrupt {
        /// The job whose row is unreadable.
        id: JobId,
        /// What is wrong with it.
        reason: String,
    },
    /// [`Client::wait`](crate::Client::wait) gave up before the job finished.
    #[error("job {id} did not finish within {waited:?} (it is {state})")]
    WaitTimeout {
        /// The job.
        id: JobId,
        /// How long was waited.
        waited: std::time::Duration,
        /// Its state when the wait ended.
        state: JobState,
    },
    /// The database failed the operation; see [`Error::is_transient`].
    #[error("database error: {0}")]
    Database(#[from] StoreError),
}

impl Error {
    /// True when the same call may succeed if tried again (connection lost, deadlock,
    /// serialization failure, `SQLITE_BUSY`, pool timeout).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Database(StoreError::Transient(_)))
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }
}

/// A database failure, classified once per backend so callers never match on strings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Connection lost, deadlock, serialization failure, lock timeout, `SQLITE_BUSY`, or no
    /// pooled connection in time: retrying may help.
    #[error("transient: {0}")]
    Transient(String),
    /// A constraint was violated (`name` is the constraint or index when the database says).
    #[error("constraint {name} violated: {message}")]
    Constraint {
        /// Constraint or index name, or `unknown`.
        name: String,
        /// The database's message.
        message: String,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Redacts the password of a database URL so it can appear in errors and logs.
pub(crate) fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if u.password().is_some() => {
            // set_password only fails for URLs that cannot have one; we just checked it has one.
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        // Not a URL the parser takes (a MySQL host list `h1:3401,h2:3402`): the password is
        // cut out by hand.
        Err(_) => match password_span(raw) {
            Some((from, to)) => format!("{}***{}", &raw[..from], &raw[to..]),
            None => raw.to_string(),
        },
    }
}

/// Where the password of `scheme://user:password@hosts…` is, found without parsing the
/// hosts (which may be a list).
pub(crate) fn password_span(raw: &str) -> Option<(usize, usize)> {
    let after = raw.find("://")? + 3;
    let end = raw[after..]
        .find(['/', '?'])
        .map_or(raw.len(), |i| after + i);
    let at = after + raw[after..end].rfind('@')?;
    let colon = after + raw[after..at].find(':')?;
    (colon + 1 < at).then_some((colon + 1, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_password_only() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("mysql://root@h/db"), "mysql://root@h/db");
        assert!(!redact_url("postgres://u:s3cr%40t@h/db").contains("s3cr"));
        assert_eq!(
            redact_url("mysql://u:p@ss,w@h1:3401,h2:3402/db?members=spread"),
            "mysql://u:***@h1:3401,h2:3402/db?members=spread"
        );
        assert_eq!(redact_url("mysql://u@h1,h2/db"), "mysql://u@h1,h2/db");
    }
}
