//! The vocabulary the engine passes to the store and gets back: one `*Params` struct per
//! operation (each carries `now`: `None`, the database's clock decides; `Some`, a test clock's
//! instant is bound instead) and one outcome type per result.
//!
//! Application-facing types ([`Enqueued`], [`CancelOutcome`], [`ListParams`],
//! [`StateCount`], [`ReclaimReason`]) are re-exported by [`crate::store`]; the lease holder's
//! vocabulary (claim, renew, finalize, reclaim, archive, prune) is crate-private and reachable
//! from outside only through the hidden `testing::internal` (feature `test-util`, not a
//! stable API).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::job::{Job, JobFailure, JobId, JobState, NewJob};
use crate::lease::{LeaseToken, NodeId};

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

// The result of an enqueue is the job's noun (`crate::job`), named here for the store's modules.
pub use crate::job::Enqueued;

/// Enqueue one or many jobs.
#[derive(Debug, Clone, Default)]
pub struct EnqueueParams {
    /// The jobs, validated before anything is written.
    pub jobs: Vec<NewJob>,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

// Constructors used by the engine's tests (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
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
    /// Only jobs of these kinds — the kinds the claiming node has handlers for; `None`:
    /// any kind. Jobs of other kinds stay waiting for a node that can run them.
    pub kinds: Option<Vec<String>>,
    /// Lease length.
    pub lease: Duration,
    /// `None`: the database clock; `Some`: a test clock.
    pub now: Option<DateTime<Utc>>,
}

/// A job just claimed: what its attempt runs with, and the token its holder must present.
/// The claim reads no more of the row than this (each column is a cost per job); the rest
/// of the job (its state is `running` now) is read with `job_get`.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Its priority (lower runs first).
    pub priority: i16,
    /// Its arguments.
    pub payload: Value,
    /// The progress an earlier attempt last reported (`None`: none did).
    pub progress: Option<Value>,
    /// Attempts so far, this one counted.
    pub attempts: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// When it was due.
    pub run_at: DateTime<Utc>,
    /// How long an attempt may run.
    pub timeout: Duration,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// µs from the claim's "now" to the job's start-by deadline
    /// ([`NewJob::start_by`](crate::NewJob::start_by)), negative once past; `None` without
    /// one.
    pub start_within_us: Option<i64>,
    /// The lease token of this claim.
    pub token: LeaseToken,
}

/// The route a queue's claims take (see `store/claim/`): the backend's one-statement claim,
/// or a controlled claim that locks the queue's settings row first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Route {
    /// The queue has no settings row: one statement, which also refuses a queue that has one.
    #[default]
    Fast,
    /// The queue has a settings row (a pause or a limit): its lock, its settings, its counts.
    Controlled,
}

/// What a claim took, by either route: the jobs (`J`: the rows as the backends return them,
/// or [`ClaimedJob`] as the fetcher receives them) and what the fetcher needs besides.
#[derive(Debug)]
pub(crate) struct Claimed<J = ClaimedJob> {
    /// The jobs claimed; [`ClaimedJob`]s in claim order.
    pub(crate) jobs: Vec<J>,
    /// The route that answered. A controlled claim answers [`Route::Fast`], with no jobs,
    /// when it found no settings row (any more): the queue is then claimed the fast way.
    /// [`Route::Controlled`]: fewer jobs than asked may mean a limit held them back, not
    /// that none were due.
    pub(crate) route: Route,
    /// How long the queue's rate limit holds claims back, when it took nothing for that
    /// reason.
    pub(crate) wait: Option<std::time::Duration>,
    /// The jobs were counted in the queue's rate window at a time the database read after
    /// the claim had been running this long: each must start within
    /// [`RATE_START_MARGIN`](crate::RATE_START_MARGIN) of the claim's send time plus this,
    /// or go back unstarted.
    pub(crate) rated: Option<std::time::Duration>,
}

impl<J> Claimed<J> {
    /// Nothing claimed, by `route`.
    pub(crate) fn none(route: Route) -> Self {
        Claimed {
            jobs: Vec::new(),
            route,
            wait: None,
            rated: None,
        }
    }

    /// `jobs`, claimed by `route`.
    pub(crate) fn of(route: Route, jobs: Vec<J>) -> Self {
        Claimed {
            jobs,
            ..Claimed::none(route)
        }
    }

    /// Whether the queue's settings controlled the claim.
    pub(crate) fn controlled(&self) -> bool {
        self.route == Route::Controlled
    }
}

/// One lease to renew.
#[derive(Debug, Clone)]
pub struct LeaseRef {
    /// The job.
    pub id: JobId,
    /// The token of the holder's claim.
    pub token: LeaseToken,
    /// How long ago the attempt's handler started, if it has and its start is not yet
    /// recorded: the renewal records `started_at = now - started_ago` (and, from it,
    /// `first_started_at` and the timeout deadline) once per attempt.
    pub started_ago: Option<Duration>,
    /// Progress the handler reported since the last applied renewal (JSON text), written in
    /// the same guarded statement; `None` keeps the stored progress.
    pub progress: Option<String>,
}

/// A schedule's fire as the store writes it: the owned copy of
/// [`Fire`](crate::store::Fire) that a test's fault plan can hold and apply late (a deposed
/// leader's statement landing after its term ended, the write the term guard exists for).
#[derive(Debug, Clone)]
pub(crate) struct FireParams {
    /// The schedule.
    pub(crate) name: String,
    /// `next_fire_at` as read (the guard).
    pub(crate) expected_next: i64,
    /// Its new value; `None` when the expression never matches again.
    pub(crate) next: Option<i64>,
    /// The schedule's last fire afterwards.
    pub(crate) last_fire: Option<i64>,
    /// The fire's jobs, validated.
    pub(crate) jobs: Vec<NewJob>,
    /// `(node, term)`: only while this leadership holds.
    pub(crate) leader: Option<(String, i64)>,
    /// `None`: the database clock; `Some`: a test clock.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// A leader election or renewal as the store writes it (`Store::leader_keep_or_take`'s
/// arguments, owned so that a test's fault plan can hold it).
#[derive(Debug, Clone)]
pub(crate) struct ElectParams {
    /// The node.
    pub(crate) node: String,
    /// The term it holds, to renew; else it takes the row if its lease has expired.
    pub(crate) held: Option<i64>,
    /// The lease's length, from now.
    pub(crate) lease: Duration,
    /// `None`: the database clock; `Some`: a test clock.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// One transaction of a parent's settle: `children` settled against the ended `parents`
/// (owned, so that a test's fault plan can hold it and apply it late — after the sweeper's
/// backstop released the child, the write the release-once guard exists for).
#[derive(Debug, Clone)]
pub(crate) struct SettleParams {
    /// The children, in id order.
    pub(crate) children: Vec<i64>,
    /// The parents that ended.
    pub(crate) parents: Vec<i64>,
    /// `None`: the database clock; `Some`: a test clock.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// A take of the gauges' turn (`Store::gauges_take_turn`), owned so that a test's fault
/// plan can hold it and apply it late (a deposed leader's take landing after its term
/// ended, the write the term guard exists for).
#[derive(Debug, Clone)]
pub(crate) struct GaugeTurnParams {
    /// The node taking it.
    pub(crate) node: String,
    /// The least age of the last turn.
    pub(crate) every: std::time::Duration,
    /// `Some(term)`: only while `node` leads the database under it.
    pub(crate) leader_term: Option<i64>,
    /// `None`: the database clock; `Some`: a test clock.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Renew many leases in one statement.
#[derive(Debug, Clone)]
pub struct RenewParams {
    /// The leases.
    pub leases: Vec<LeaseRef>,
    /// New lease length, from now.
    pub lease: Duration,
    /// Added to a recorded start plus the job's timeout to give the sweeper's timeout
    /// deadline (`timeout_at`): the holder stops a handler at its timeout itself; the
    /// sweeper only steps in when that did not happen (a stuck node that still renews).
    pub timeout_grace: Duration,
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
    /// How long ago the attempt's handler started, if it has and no renewal recorded its
    /// start yet (a job shorter than a heartbeat): the finalization then records
    /// `started_at = now - started_ago` and `first_started_at` if unset. `None` leaves both
    /// as they are.
    pub started_ago: Option<Duration>,
    /// How long before the attempt's fence point its holder ended it (ms; negative: after
    /// it), for the execution ledger; `None`: not known.
    pub fence_margin_ms: Option<i64>,
}

// Some constructors are used only by the engine's tests (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
impl Finalize {
    /// Succeeded with `result`.
    pub fn succeeded(id: JobId, token: LeaseToken, result: Value) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Succeeded { result },
            started_ago: None,
            fence_margin_ms: None,
        }
    }

    /// Failed; retry after `delay`.
    pub fn retry(id: JobId, token: LeaseToken, error: JobFailure, delay: Duration) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Retry { error, delay },
            started_ago: None,
            fence_margin_ms: None,
        }
    }

    /// Failed permanently.
    pub fn dead(id: JobId, token: LeaseToken, error: JobFailure) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Dead { error },
            started_ago: None,
            fence_margin_ms: None,
        }
    }

    /// Cancelled while running.
    pub fn cancelled(id: JobId, token: LeaseToken, error: JobFailure) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Cancelled { error },
            started_ago: None,
            fence_margin_ms: None,
        }
    }

    /// The same finalization, recording that the handler started `ago` before it is written
    /// (see [`Finalize::started_ago`]).
    pub fn with_started_ago(mut self, ago: Option<Duration>) -> Self {
        self.started_ago = ago;
        self
    }

    /// Back to pending after `delay`, the attempt not counted (snooze, or lease given back).
    pub fn requeue(id: JobId, token: LeaseToken, delay: Duration) -> Self {
        Finalize {
            id,
            token,
            outcome: Finalization::Requeue { delay },
            started_ago: None,
            fence_margin_ms: None,
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
    /// Its lease expired before its handler's start was recorded: the attempt was given back
    /// (the job is `pending` again, its `refunds` counted).
    NotStarted,
}

impl ReclaimReason {
    /// The error code recorded: `lease_expired`, `timeout` or `not_started`.
    pub fn code(self) -> &'static str {
        match self {
            ReclaimReason::LeaseExpired => "lease_expired",
            ReclaimReason::Timeout => "timeout",
            ReclaimReason::NotStarted => "not_started",
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
    /// `Retrying` or `Dead`; `Pending` when the attempt was given back.
    pub new_state: JobState,
    /// Attempts so far (the lost one counted unless it was given back).
    pub attempts: u32,
}

/// Archive terminal jobs finished more than `older_than` ago; dead ones only once they
/// finished more than `dead_older_than` ago as well.
#[derive(Debug, Clone)]
pub struct ArchiveParams {
    /// Retention in the live table.
    pub older_than: Duration,
    /// Retention of dead jobs in the live table (effective: the longer of the two).
    pub dead_older_than: Duration,
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

/// What [`Client::retry`](crate::Client::retry) did.
///
/// A lease holder's writes answer with [`Guarded`] instead (engine-internal).
#[derive(Debug, Clone, PartialEq)]
// Returned once per call and matched at once: boxing the job would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum RetryOutcome {
    /// It was dead or cancelled and is now `pending`, due at once (as returned).
    Retried(Job),
    /// It changed between the read and the write (another operator, a concurrent retry):
    /// nothing was written. Read it again and decide.
    Changed,
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

/// Filters for [`Client::list`](crate::Client::list).
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this state.
    pub state: Option<JobState>,
    /// Keyset paging: only ids past this one in the listing's order — greater, or smaller
    /// with `newest_first` (pass the last id of the previous page).
    pub after: Option<JobId>,
    /// Newest first (by id, descending) instead of oldest first.
    pub newest_first: bool,
    /// Page size; 0 means the default of 100, at most 1,000.
    pub limit: u32,
    /// List the archive instead of the live table.
    pub archived: bool,
    /// Only jobs created after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only jobs created before this instant.
    pub created_before: Option<DateTime<Utc>>,
    /// Only jobs with this unique key.
    pub unique_key: Option<String>,
}

/// How late one queue is: its due jobs waiting to be claimed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueLag {
    /// The queue.
    pub queue: String,
    /// Jobs due now and waiting (pending or retrying).
    pub due: u64,
    /// When the longest-waiting of them became due.
    pub oldest_due: DateTime<Utc>,
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

/// An effect record to insert.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct NewEffect {
    pub(crate) id: i64,
    pub(crate) key: String,
    pub(crate) detail: Option<Value>,
    pub(crate) claim: String,
    pub(crate) now: Option<i64>,
}

// The seam's arguments and answers that each backend takes or gives (`driver.rs` states
// their contracts); they live here, below the backends, so a backend imports nothing above it.

/// What a claim needs (the contract is `Driver::claim`'s, `driver.rs`).
#[derive(Debug)]
pub(crate) struct ClaimArgs {
    pub(crate) queue: String,
    pub(crate) owner: String,
    pub(crate) token: String,
    pub(crate) lease_us: i64,
    pub(crate) limit: i64,
    /// Only these kinds (the claiming node's handlers); `None`: any kind.
    pub(crate) kinds: Option<Vec<String>>,
    pub(crate) now: Option<i64>,
}

/// What a renewal needs (the contract is `Driver::renew`'s, `driver.rs`).
#[derive(Debug)]
pub(crate) struct RenewArgs<'a> {
    pub(crate) leases: &'a [LeaseRef],
    pub(crate) lease_us: i64,
    pub(crate) grace_us: i64,
    pub(crate) now: Option<i64>,
    /// A hedge: sent on a connection opened for it alone (closed afterwards), not one of the
    /// renewal lane's, which may be the one an overdue renewal hangs on or one that sat
    /// through the same cut. SQLite has no network and renews from its lane.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fresh: bool,
}

/// Why a backend could not be opened: a malformed URL, or a server that did not answer.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The URL is malformed (reason, password scrubbed).
    Url(String),
    /// The server cannot be reached (reason, password scrubbed).
    Connect(String),
}

/// What a database's wake-up channel (`driver::Listener`) was told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only PostgreSQL notifies
pub(crate) enum Notice {
    /// Jobs became due in this queue (an insert, a resume, a loosened limit).
    Due(String),
    /// This queue's settings changed (a pause, a resume, new limits).
    Settings(String),
    /// A cancel was asked of this running job (its id).
    Cancel(i64),
    /// These waited jobs reached a terminal state; empty: some may have (re-check).
    Done(Vec<i64>),
}
