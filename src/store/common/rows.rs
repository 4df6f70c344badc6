//! Rows ↔ domain types: the one place that knows how a [`Job`] is laid out in a table.
//!
//! Reading is fallible on purpose: a row written by something other than jobvisor (an unknown
//! state, an error record that is not an object) becomes [`Error::Corrupt`] naming the job and
//! the problem, never a panic.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde_json::Value;

use diesel::expression::{
    is_aggregate, AppearsOnTable, Expression, SelectableExpression, ValidGrouping,
};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};

use super::params::ClaimedJob;
use super::schema::{jobvisor_jobs, jobvisor_jobs_archive};
use crate::error::{Error, Result};
use crate::job::{Job, JobFailure, JobId, JobState, LeaseInfo, UniqueScope};
use crate::lease::{LeaseToken, NodeId};

/// A live row, exactly as stored.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = jobvisor_jobs)]
#[cfg_attr(
    all(feature = "postgres", feature = "mysql", feature = "sqlite"),
    diesel(check_for_backend(diesel::pg::Pg, diesel::mysql::Mysql, diesel::sqlite::Sqlite))
)]
pub(crate) struct JobRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) unique_key: Option<String>,
    pub(crate) state: String,
    pub(crate) priority: i32,
    pub(crate) payload: Value,
    pub(crate) result: Option<Value>,
    pub(crate) last_error: Option<Value>,
    pub(crate) errors: Value,
    pub(crate) attempts: i32,
    pub(crate) max_attempts: i32,
    pub(crate) run_at: i64,
    pub(crate) timeout_ms: i64,
    pub(crate) timeout_at: Option<i64>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_expires_at: Option<i64>,
    pub(crate) heartbeat_at: Option<i64>,
    pub(crate) version: i64,
    pub(crate) cancel_requested_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) first_started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) started_at: Option<i64>,
    pub(crate) refunds: i32,
    pub(crate) partition_key: Option<String>,
    pub(crate) unique_hold: Option<String>,
    pub(crate) unique_until: Option<i64>,
    pub(crate) unique_scope: Option<String>,
    pub(crate) progress: Option<Value>,
    #[diesel(embed)]
    pub(crate) unlisted: Unlisted,
}

/// A job's columns that are not in its table's `table!` (see [`unlisted_column!`]), nested
/// so a row's selection stays within diesel's 32 elements.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = jobvisor_jobs)]
pub(crate) struct Unlisted {
    #[diesel(
        select_expression = JobsStartBy,
        sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>
    )]
    pub(crate) start_by: Option<i64>,
    #[diesel(
        select_expression = JobsSequenceKey,
        sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>
    )]
    pub(crate) sequence_key: Option<String>,
}

/// A column of a jobs table that its `table!` does not list (both are at diesel's 32-column
/// limit), as an expression of that table: a type of its own, not a SQL literal, so the
/// statements that select it keep their prepared statement cache entry (a literal has no
/// static query id). Qualified by the table's name, as diesel writes its own columns; a
/// `diesel::Column`, so an update sets it and an insert lists it by name.
macro_rules! unlisted_column {
    ($(#[$doc:meta])* $name:ident, $table:ident, $column:literal, $ty:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, QueryId)]
        pub(crate) struct $name;

        impl Expression for $name {
            type SqlType = $ty;
        }
        // A column to diesel, so an update can set it and an insert list it.
        impl diesel::Column for $name {
            type Table = $table::table;
            const NAME: &'static str = $column;
        }
        impl AppearsOnTable<$table::table> for $name {}
        impl SelectableExpression<$table::table> for $name {}
        impl<GB> ValidGrouping<GB> for $name {
            type IsAggregate = is_aggregate::Never;
        }

        impl<DB: diesel::backend::Backend> QueryFragment<DB> for $name {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
                out.push_identifier(stringify!($table))?;
                out.push_sql(".");
                out.push_identifier($column)
            }
        }
    };
}

unlisted_column!(
    /// A live job's start-by deadline (µs), `NULL` without one.
    JobsStartBy,
    jobvisor_jobs,
    "start_by",
    diesel::sql_types::Nullable<diesel::sql_types::BigInt>
);
unlisted_column!(
    /// A live job's sequence key, `NULL` outside a sequence.
    JobsSequenceKey,
    jobvisor_jobs,
    "sequence_key",
    diesel::sql_types::Nullable<diesel::sql_types::Text>
);
unlisted_column!(
    /// An archived job's start-by deadline (µs), copied with its row.
    ArchiveStartBy,
    jobvisor_jobs_archive,
    "start_by",
    diesel::sql_types::Nullable<diesel::sql_types::BigInt>
);
unlisted_column!(
    /// An archived job's sequence key, copied with its row.
    ArchiveSequenceKey,
    jobvisor_jobs_archive,
    "sequence_key",
    diesel::sql_types::Nullable<diesel::sql_types::Text>
);

/// `start_by - updated_at`: the µs a claimed job has left before its start-by deadline,
/// counted from the claim's "now" (the `updated_at` the claim just wrote); `NULL` without a
/// deadline. `start_by` is not a column of the `table!` (at diesel's 32-column limit); a type
/// of its own, not a SQL literal, so the statements that select it keep their prepared
/// statement cache entry (a literal has no static query id).
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct StartWithin;

impl Expression for StartWithin {
    type SqlType = diesel::sql_types::Nullable<diesel::sql_types::BigInt>;
}
impl AppearsOnTable<jobvisor_jobs::table> for StartWithin {}
impl SelectableExpression<jobvisor_jobs::table> for StartWithin {}
impl<GB> ValidGrouping<GB> for StartWithin {
    type IsAggregate = is_aggregate::Never;
}

impl<DB: diesel::backend::Backend> QueryFragment<DB> for StartWithin {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("start_by - updated_at");
        Ok(())
    }
}

/// What a claim reads of each row it takes: what the attempt runs with, and the claim
/// order. Nothing else: every column returned costs the server and the client per job (a
/// full row is 31 columns, this is 11), and the rest of the row stays the store's until a
/// read asks for it. Its fields are in `claim_columns!`'s order, so the claim statements'
/// rows are read by position (`expr.rs`).
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = jobvisor_jobs)]
#[cfg_attr(
    all(feature = "postgres", feature = "mysql", feature = "sqlite"),
    diesel(check_for_backend(diesel::pg::Pg, diesel::mysql::Mysql, diesel::sqlite::Sqlite))
)]
pub(crate) struct ClaimRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) priority: i32,
    pub(crate) payload: Value,
    pub(crate) progress: Option<Value>,
    pub(crate) attempts: i32,
    pub(crate) max_attempts: i32,
    pub(crate) run_at: i64,
    pub(crate) timeout_ms: i64,
    pub(crate) created_at: i64,
    /// µs from the claim's "now" (the `updated_at` it just wrote) to the job's start-by
    /// deadline; `NULL` without one. Not a column of the `table!` (at diesel's 32-column
    /// limit): [`StartWithin`].
    #[diesel(
        select_expression = StartWithin,
        select_expression_type = StartWithin,
        sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>
    )]
    pub(crate) start_within: Option<i64>,
}

impl ClaimRow {
    /// The job as its claimer runs it, under `token`; a row whose numbers cannot be what
    /// jobvisor wrote (written by something else) is [`Error::Corrupt`], naming the field.
    pub(crate) fn into_claimed(self, token: LeaseToken) -> Result<ClaimedJob> {
        let id = self.id;
        let count = |v: i32, what: &str| {
            u32::try_from(v).map_err(|_| corrupt(id, format!("{what} {v} is negative")))
        };
        Ok(ClaimedJob {
            id: JobId(id),
            queue: self.queue,
            kind: self.kind,
            priority: i16::try_from(self.priority)
                .map_err(|_| corrupt(id, format!("priority {} out of range", self.priority)))?,
            payload: self.payload,
            progress: self.progress,
            attempts: count(self.attempts, "attempts")?,
            max_attempts: count(self.max_attempts, "max_attempts")?,
            run_at: from_us(self.run_at),
            timeout: Duration::from_millis(
                u64::try_from(self.timeout_ms).map_err(|_| {
                    corrupt(id, format!("timeout_ms {} is negative", self.timeout_ms))
                })?,
            ),
            created_at: from_us(self.created_at),
            start_within_us: self.start_within,
            token,
        })
    }
}

/// An archived row, exactly as stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = jobvisor_jobs_archive)]
#[cfg_attr(
    all(feature = "postgres", feature = "mysql", feature = "sqlite"),
    diesel(check_for_backend(diesel::pg::Pg, diesel::mysql::Mysql, diesel::sqlite::Sqlite))
)]
pub(crate) struct ArchiveRow {
    #[diesel(embed)]
    pub(crate) job: ArchivedJobColumns,
    pub(crate) archived_at: i64,
}

/// The live-table columns of an archived row (same names, other table).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = jobvisor_jobs_archive)]
#[cfg_attr(
    all(feature = "postgres", feature = "mysql", feature = "sqlite"),
    diesel(check_for_backend(diesel::pg::Pg, diesel::mysql::Mysql, diesel::sqlite::Sqlite))
)]
pub(crate) struct ArchivedJobColumns {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) unique_key: Option<String>,
    pub(crate) state: String,
    pub(crate) priority: i32,
    pub(crate) payload: Value,
    pub(crate) result: Option<Value>,
    pub(crate) last_error: Option<Value>,
    pub(crate) errors: Value,
    pub(crate) attempts: i32,
    pub(crate) max_attempts: i32,
    pub(crate) run_at: i64,
    pub(crate) timeout_ms: i64,
    pub(crate) timeout_at: Option<i64>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_expires_at: Option<i64>,
    pub(crate) heartbeat_at: Option<i64>,
    pub(crate) version: i64,
    pub(crate) cancel_requested_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) first_started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) started_at: Option<i64>,
    pub(crate) refunds: i32,
    pub(crate) partition_key: Option<String>,
    pub(crate) unique_until: Option<i64>,
    pub(crate) unique_scope: Option<String>,
    pub(crate) progress: Option<Value>,
    #[diesel(select_expression = ArchiveStartBy)]
    pub(crate) start_by: Option<i64>,
    #[diesel(select_expression = ArchiveSequenceKey)]
    pub(crate) sequence_key: Option<String>,
}

impl From<ArchivedJobColumns> for JobRow {
    fn from(a: ArchivedJobColumns) -> Self {
        JobRow {
            id: a.id,
            queue: a.queue,
            kind: a.kind,
            unique_key: a.unique_key,
            state: a.state,
            priority: a.priority,
            payload: a.payload,
            result: a.result,
            last_error: a.last_error,
            errors: a.errors,
            attempts: a.attempts,
            max_attempts: a.max_attempts,
            run_at: a.run_at,
            timeout_ms: a.timeout_ms,
            timeout_at: a.timeout_at,
            lease_owner: a.lease_owner,
            lease_expires_at: a.lease_expires_at,
            heartbeat_at: a.heartbeat_at,
            version: a.version,
            cancel_requested_at: a.cancel_requested_at,
            created_at: a.created_at,
            updated_at: a.updated_at,
            first_started_at: a.first_started_at,
            finished_at: a.finished_at,
            started_at: a.started_at,
            refunds: a.refunds,
            partition_key: a.partition_key,
            progress: a.progress,
            // An archived job holds nothing.
            unique_hold: None,
            unique_until: a.unique_until,
            unique_scope: a.unique_scope,
            unlisted: Unlisted {
                start_by: a.start_by,
                sequence_key: a.sequence_key,
            },
        }
    }
}

/// Epoch microseconds → UTC instant (saturating at the representable range).
pub(crate) fn from_us(us: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_micros(us).unwrap_or(if us < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// UTC instant → epoch microseconds.
pub(crate) fn to_us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// A duration in microseconds, saturating.
pub(crate) fn dur_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A duration in milliseconds, saturating.
pub(crate) fn dur_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(id: i64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        id: JobId(id),
        reason: reason.into(),
    }
}

fn failure(id: i64, v: Value, what: &str) -> Result<JobFailure> {
    serde_json::from_value(v)
        .map_err(|e| corrupt(id, format!("{what} is not an error record: {e}")))
}

impl JobRow {
    /// Converts to the domain type; `archived_at` is set for archived rows.
    pub(crate) fn into_job(self, archived_at: Option<i64>) -> Result<Job> {
        let id = self.id;
        let state: JobState = self
            .state
            .parse()
            .map_err(|_| corrupt(id, format!("unknown state {:?}", self.state)))?;
        let last_error = self
            .last_error
            .map(|v| failure(id, v, "last_error"))
            .transpose()?;
        let errors = match self.errors {
            Value::Array(items) => items
                .into_iter()
                .map(|v| failure(id, v, "an element of errors"))
                .collect::<Result<Vec<_>>>()?,
            Value::Null => Vec::new(),
            other => {
                return Err(corrupt(
                    id,
                    format!(
                        "errors is not a JSON array: {}",
                        truncate(&other.to_string())
                    ),
                ))
            }
        };
        let lease = match (self.lease_owner, self.lease_expires_at) {
            (Some(owner), Some(exp)) => Some(LeaseInfo {
                owner: NodeId::from_stored(owner),
                expires_at: from_us(exp),
                heartbeat_at: self.heartbeat_at.map(from_us),
            }),
            _ => None,
        };
        let unique_scope = match self.unique_scope.as_deref() {
            None if self.unique_key.is_some() => Some(UniqueScope::UntilArchived),
            None => None,
            Some("until_archived") => Some(UniqueScope::UntilArchived),
            Some("while_active") => Some(UniqueScope::WhileActive),
            Some("for") => {
                let us = self.unique_until.unwrap_or(self.created_at) - self.created_at;
                Some(UniqueScope::For(Duration::from_micros(
                    u64::try_from(us).unwrap_or(0),
                )))
            }
            Some(other) => return Err(corrupt(id, format!("unknown unique_scope {other:?}"))),
        };
        Ok(Job {
            id: JobId(id),
            queue: self.queue,
            kind: self.kind,
            unique_key: self.unique_key,
            unique_scope,
            unique_until: self.unique_until.map(from_us),
            unique_held: self.unique_hold.is_some(),
            partition: self.partition_key,
            sequence: self.unlisted.sequence_key,
            start_by: self.unlisted.start_by.map(from_us),
            progress: self.progress,
            state,
            priority: i16::try_from(self.priority)
                .map_err(|_| corrupt(id, format!("priority {} out of range", self.priority)))?,
            payload: self.payload,
            result: self.result,
            last_error,
            errors,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            max_attempts: u32::try_from(self.max_attempts).unwrap_or(0),
            run_at: from_us(self.run_at),
            timeout: Duration::from_millis(u64::try_from(self.timeout_ms).unwrap_or(0)),
            timeout_at: self.timeout_at.map(from_us),
            lease,
            version: self.version,
            cancel_requested_at: self.cancel_requested_at.map(from_us),
            created_at: from_us(self.created_at),
            updated_at: from_us(self.updated_at),
            first_started_at: self.first_started_at.map(from_us),
            finished_at: self.finished_at.map(from_us),
            started_at: self.started_at.map(from_us),
            refunds: u32::try_from(self.refunds).unwrap_or(0),
            archived_at: archived_at.map(from_us),
        })
    }
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_round_trip() {
        let t = DateTime::<Utc>::from_timestamp_micros(1_795_250_698_229_553).unwrap();
        assert_eq!(from_us(to_us(t)), t);
        assert_eq!(dur_us(Duration::from_millis(3)), 3000);
        assert_eq!(dur_ms(Duration::MAX), i64::MAX);
    }
}
