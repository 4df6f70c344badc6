//! The job store: the only code in jobvisor that speaks SQL.
//!
//! [`Store`] is a cheap-to-clone handle on a connection pool for one of three backends
//! (PostgreSQL, MySQL/MariaDB, SQLite), chosen by the URL given to [`Store::connect`]. Every
//! state transition of DESIGN §4 is one method taking a `*Params` struct that carries `now`
//! (`None`: the database's clock decides; `Some`: a test clock's instant is bound instead).
//! Writes by a lease holder present its [`LeaseToken`] in the SQL and report a lost guard as
//! [`Guarded::LeaseLost`] — an outcome, not an error.
//!
//! Layout: `connect` (URLs, pools, error mapping), `migrate` (embedded migrations, schema
//! check), `write` (enqueue, claim, renew, finalize, reclaim), `maintain` (archive, prune,
//! cancel, retry), `read` (get, list, counts), `outbox` (enqueue inside the caller's
//! transaction), `bulk` (large batches by `COPY` on PostgreSQL), `sql` (custom SQL expressions), `rows` (row ↔ domain), `schema`
//! (`table!`). Backend differences are `match` arms inside each operation.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::job::{Job, JobFailure, JobId, JobState, NewJob};
use crate::lease::{LeaseToken, NodeId};

mod bulk;
mod connect;
mod listen;
mod maintain;
mod migrate;
mod outbox;
mod read;
mod rows;
mod schema;
mod sql;

pub use connect::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE, DEFAULT_SQLITE_POOL_SIZE,
};
pub use read::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
mod write;

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;

pub use connect::{Backend, StoreOptions};
pub use listen::Listener;
pub use outbox::OutboxConnection;

/// Default largest payload accepted, in bytes of JSON (1 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// A handle on the job tables of one database. Clone it freely: clones share the pool.
#[derive(Clone)]
pub struct Store {
    inner: Arc<connect::Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.inner.backend)
            .field("url", &self.inner.url_redacted)
            .finish_non_exhaustive()
    }
}

/// The outcome of a guarded write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarded<T> {
    /// The guard held and the write was applied.
    Applied(T),
    /// The presented lease token is no longer the job's (its lease expired and it was
    /// reclaimed, possibly re-claimed by someone else), or the job is no longer running.
    /// Nothing was written.
    LeaseLost,
    /// The job's version moved on since it was read (someone else changed it first).
    /// Nothing was written.
    Stale,
}

impl<T> Guarded<T> {
    /// True for [`Guarded::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, Guarded::Applied(_))
    }
}

/// Result of enqueueing one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job's id, or the existing job's id for a duplicate.
    pub id: JobId,
    /// True when a live job with the same (kind, unique_key) already existed: nothing new was
    /// written.
    pub duplicate: bool,
}

/// Enqueue one or many jobs.
#[derive(Debug, Clone, Default)]
pub struct EnqueueParams {
    /// The jobs, validated before anything is written.
    pub jobs: Vec<NewJob>,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

impl EnqueueParams {
    /// Params for one job at the database's clock.
    pub fn one(job: NewJob) -> Self {
        EnqueueParams {
            jobs: vec![job],
            now: None,
        }
    }

    /// Params for many jobs at the database's clock.
    pub fn many(jobs: Vec<NewJob>) -> Self {
        EnqueueParams { jobs, now: None }
    }

    /// Binds a test clock's instant.
    pub fn at(mut self, now: Option<DateTime<Utc>>) -> Self {
        self.now = now;
        self
    }
}

/// Claim up to `limit` due jobs of a queue.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// The queue.
    pub queue: String,
    /// The claiming node.
    pub owner: NodeId,
    /// Most jobs to claim (0 claims nothing).
    pub limit: u32,
    /// Lease length.
    pub lease: Duration,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// A job just claimed, with the token its holder must present.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// The job as it is now (state `running`, attempts counted).
    pub job: Job,
    /// The lease token of this claim.
    pub token: LeaseToken,
}

/// One lease to renew.
#[derive(Debug, Clone)]
pub struct LeaseRef {
    /// The job.
    pub id: JobId,
    /// The token of the holder's claim.
    pub token: LeaseToken,
}

/// Renew many leases in one statement.
#[derive(Debug, Clone)]
pub struct RenewParams {
    /// The leases.
    pub leases: Vec<LeaseRef>,
    /// New lease length, from now.
    pub lease: Duration,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// A renewed lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// The lease's new end.
    pub expires_at: DateTime<Utc>,
    /// Set when someone asked to cancel the job: the holder should stop the handler and
    /// finalize it `cancelled`.
    pub cancel_requested: bool,
}

/// What a holder writes when it is done with a job.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Finalization {
    /// Succeeded with a result; `last_error` is cleared, `attempts` kept.
    Succeeded {
        /// The handler's result.
        result: Value,
    },
    /// Failed; claimable again at `now + delay`. The error is appended to `errors`.
    Retry {
        /// This attempt's error.
        error: JobFailure,
        /// Backoff before the next attempt.
        delay: Duration,
    },
    /// Failed permanently (or out of attempts).
    Dead {
        /// This attempt's error.
        error: JobFailure,
    },
    /// Stopped because a cancel was asked for.
    Cancelled {
        /// What was recorded (code `cancelled`).
        error: JobFailure,
    },
    /// Reschedule at `now + delay` without using an attempt (the handler snoozed, or the node
    /// gave the lease back at shutdown). State becomes `pending`.
    Requeue {
        /// When to run again, from now.
        delay: Duration,
    },
}

/// One job's finalization, presented with its lease token.
#[derive(Debug, Clone)]
pub struct Finalize {
    /// The job.
    pub id: JobId,
    /// The holder's token.
    pub token: LeaseToken,
    /// What to write.
    pub outcome: Finalization,
}

impl Finalize {
    /// Succeeded with `result`.
    pub fn succeeded(id: JobId, token: LeaseToken, result: Value) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Succeeded { result },
        }
    }

    /// Failed; retry after `delay`.
    pub fn retry(id: JobId, token: LeaseToken, error: JobFailure, delay: Duration) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Retry { error, delay },
        }
    }

    /// Failed permanently.
    pub fn dead(id: JobId, token: LeaseToken, error: JobFailure) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Dead { error },
        }
    }

    /// Cancelled while running.
    pub fn cancelled(id: JobId, token: LeaseToken, error: JobFailure) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Cancelled { error },
        }
    }

    /// Back to pending after `delay`, the attempt not counted (snooze, or lease given back).
    pub fn requeue(id: JobId, token: LeaseToken, delay: Duration) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Requeue { delay },
        }
    }
}

/// Finalize many jobs in one round trip.
#[derive(Debug, Clone, Default)]
pub struct FinalizeParams {
    /// The finalizations; each job at most once.
    pub items: Vec<Finalize>,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// Reclaim running jobs whose lease expired or whose timeout passed.
#[derive(Clone)]
pub struct ReclaimParams {
    /// Most jobs handled in this batch.
    pub limit: u32,
    /// Backoff before the retry, given the attempt that was lost (1-based).
    pub backoff: Arc<dyn Fn(u32) -> Duration + Send + Sync>,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for ReclaimParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReclaimParams")
            .field("limit", &self.limit)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// Why a running job was reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimReason {
    /// Its lease expired (its node stopped renewing).
    LeaseExpired,
    /// It ran past its timeout.
    Timeout,
}

impl ReclaimReason {
    /// The error code recorded: `lease_expired` or `timeout`.
    pub fn code(self) -> &'static str {
        match self {
            ReclaimReason::LeaseExpired => "lease_expired",
            ReclaimReason::Timeout => "timeout",
        }
    }
}

/// One reclaimed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    /// The job.
    pub id: JobId,
    /// Its kind.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Why.
    pub reason: ReclaimReason,
    /// `Retrying` or `Dead`.
    pub new_state: JobState,
    /// Attempts so far (the lost one counted).
    pub attempts: u32,
}

/// Archive terminal jobs finished more than `older_than` ago.
#[derive(Debug, Clone)]
pub struct ArchiveParams {
    /// Retention in the live table.
    pub older_than: Duration,
    /// Most jobs moved in this batch.
    pub limit: u32,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// Delete archived jobs archived more than `older_than` ago.
#[derive(Debug, Clone)]
pub struct PruneParams {
    /// Retention in the archive.
    pub older_than: Duration,
    /// Most rows deleted in this batch.
    pub limit: u32,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// Cancel a job.
#[derive(Debug, Clone)]
pub struct CancelParams {
    /// The job.
    pub id: JobId,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// It was pending or retrying and is now `cancelled`.
    Cancelled(Job),
    /// It is running: the request is recorded and its holder will stop it and finalize it
    /// `cancelled` (seen at its next renewal).
    Requested(Job),
    /// It had already finished: nothing changed.
    AlreadyFinished(Job),
}

/// Manually retry a dead or cancelled job.
#[derive(Debug, Clone)]
pub struct RetryParams {
    /// The job.
    pub id: JobId,
    /// Only retry if the job is still at this version (what the operator looked at).
    pub expected_version: Option<i64>,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// Filters for [`Store::job_list`].
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this state.
    pub state: Option<JobState>,
    /// Only ids greater than this (keyset paging: pass the last id of the previous page).
    pub after: Option<JobId>,
    /// Page size; 0 means the default of 100, at most 1,000.
    pub limit: u32,
    /// List the archive instead of the live table.
    pub archived: bool,
}

/// Live jobs of one queue in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// The queue.
    pub queue: String,
    /// The state.
    pub state: JobState,
    /// How many.
    pub count: u64,
}
