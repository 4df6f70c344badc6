//! One stream of facts about jobs and actors. Each fact is emitted once, here: it is logged
//! with `tracing`, counted in [`crate::metrics`] where it is a counter, and broadcast to
//! subscribers (tests, the quickstart's progress).

use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::error::Error;
use crate::job::{JobId, JobState};
use crate::lease::ClaimId;
use crate::store::ReclaimReason;

/// Events kept for a slow subscriber before it starts missing some: **4,096**.
pub(crate) const EVENT_BUFFER: usize = 4096;

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A job was claimed by this node and its handler is starting.
    Claimed {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// Its queue.
        queue: String,
        /// This attempt (1-based).
        attempt: u32,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// A job's handler started (it got a worker; its timeout counts from now).
    Started {
        /// The job.
        id: JobId,
        /// This attempt.
        attempt: u32,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// A finalization was written: the job reached `state`.
    Finished {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// Its queue.
        queue: String,
        /// The attempt that ended.
        attempt: u32,
        /// `Succeeded`, `Retrying`, `Dead`, `Cancelled` or `Pending` (snoozed / given back).
        state: JobState,
        /// The error code, for failures.
        code: Option<String>,
        /// The error message, for failures.
        message: Option<String>,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// This node learned it no longer holds a job's lease (a renewal or finalization was
    /// refused): its handler was stopped and its result discarded.
    LeaseLost {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// A running job's lease could not be renewed before it expired, so its handler was
    /// stopped before another node could claim it (self-fencing).
    SelfFenced {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// A claimed job was given back before its handler started, because its lease might be
    /// gone: the estimate ran out while it waited for a worker (the node was frozen or cut
    /// off, or the claim was answered too late). Its attempt is not counted.
    Dropped {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// The claim (see [`ClaimId`]): tells apart two claims of one job that share an
        /// attempt number (a claim given back unstarted is not counted).
        claim: ClaimId,
    },
    /// The node's timers fired far later than scheduled (the process was frozen, or starved
    /// of CPU): it revalidates its leases before starting any handler.
    PauseDetected {
        /// How much later than scheduled the timers fired.
        late_by: std::time::Duration,
    },
    /// Due jobs have waited longer than
    /// [`unserved_after`](crate::SchedulerConfig::unserved_after) with no live node able to
    /// run them: no node serves their queue, or none serving it has a handler for their kind
    /// (a rolling deploy that has not reached any node yet, a mistyped queue). Reported by
    /// every node that looks, at each check, while they wait.
    Unserved(crate::store::Unserved),
    /// A handler ran past the job's timeout and was stopped.
    TimedOut {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
    },
    /// A cancel request reached a running job's handler.
    CancelSignalled {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
    },
    /// The sweeper reclaimed a running job of some node.
    Reclaimed {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
        /// Why.
        reason: ReclaimReason,
        /// `Retrying` or `Dead`.
        state: JobState,
    },
    /// The sweeper ended a job that had not started by its start-by deadline
    /// ([`NewJob::start_by`](crate::NewJob::start_by)): `cancelled`, code `expired`. (A job
    /// a start gate refused ends the same way, reported as [`Event::Finished`].)
    Expired {
        /// The job.
        id: JobId,
    },
    /// The heartbeat renewed this node's leases in one statement.
    LeasesRenewed {
        /// Leases renewed.
        renewed: usize,
        /// Leases found lost.
        lost: usize,
    },
    /// The archiver ran a batch.
    Archived {
        /// Jobs moved to the archive.
        moved: u64,
        /// Archived jobs deleted.
        pruned: u64,
    },
    /// An actor's store call failed; it carries on and retries later (logged once per
    /// interval).
    StoreUnavailable {
        /// Which actor.
        actor: &'static str,
        /// The error.
        message: String,
    },
    /// This node became the database's leader (it does the once-per-database work).
    LeaderElected {
        /// The new term (each election raises it).
        term: u64,
    },
    /// This node stopped leading: another node took over, its leadership could not be
    /// renewed in time, or it resigned at shutdown. Work of that term is refused from now on.
    LeaderLost {
        /// The term that ended.
        term: u64,
        /// Why: `taken_over`, `not_renewed` or `resigned`.
        reason: &'static str,
    },
    /// A reconciler's pass ended (see
    /// [`SchedulerBuilder::reconciler`](crate::SchedulerBuilder::reconciler)).
    Reconciled {
        /// The reconciler.
        name: String,
        /// Jobs its function said should exist.
        expected: usize,
        /// Of those, jobs that were missing and were enqueued again.
        recreated: usize,
        /// How long the pass took.
        took: Duration,
    },
    /// A reconciler's pass failed (its function returned an error or panicked, or the
    /// enqueue failed); it is retried after `retry_in`.
    ReconcileFailed {
        /// The reconciler.
        name: String,
        /// What went wrong.
        message: String,
        /// Failed passes in a row.
        failures: u32,
        /// When the next pass runs.
        retry_in: Duration,
    },
    /// A schedule fired (this node leads the database).
    ScheduleFired {
        /// The schedule.
        name: String,
        /// Fires enqueued, one job each.
        fires: usize,
        /// Due fires its missed-fire policy skipped (for a cron expression, counted up to
        /// 1,000).
        skipped: usize,
        /// Its next fire.
        next: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Graceful shutdown ended.
    ShutDown {
        /// Jobs that finished during the wait.
        finished: usize,
        /// Jobs whose leases were given back.
        released: usize,
        /// How long it took.
        took: Duration,
    },
}

/// Emits events: logs them and broadcasts them.
#[derive(Debug, Clone)]
pub(crate) struct EventBus {
    tx: broadcast::Sender<Event>,
}

impl EventBus {
    pub(crate) fn new() -> Self {
        EventBus {
            tx: broadcast::channel(EVENT_BUFFER).0,
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// Whether an event logged at `DEBUG` would reach anyone: a subscriber of the bus, or a
    /// log that takes `DEBUG` from this module. Per-job events of that level are built only
    /// then (each would otherwise copy the job's names for nobody).
    pub(crate) fn heard_at_debug(&self) -> bool {
        self.tx.receiver_count() > 0 || tracing::enabled!(tracing::Level::DEBUG)
    }

    pub(crate) fn emit(&self, e: Event) {
        match &e {
            Event::Claimed {
                id,
                kind,
                queue,
                attempt,
                claim,
            } => {
                tracing::debug!(job.id = id.0, job.kind = %kind, job.queue = %queue, attempt, %claim, "claimed")
            }
            Event::Started { id, attempt, claim } => {
                tracing::trace!(job.id = id.0, attempt, %claim, "handler started")
            }
            Event::Finished {
                id,
                kind,
                state,
                code,
                message,
                attempt,
                claim,
                ..
            } => match state {
                JobState::Dead => {
                    tracing::warn!(job.id = id.0, job.kind = %kind, attempt, %claim, code = code.as_deref().unwrap_or(""), message = message.as_deref().unwrap_or(""), "job is dead")
                }
                JobState::Retrying => {
                    tracing::info!(job.id = id.0, job.kind = %kind, attempt, %claim, code = code.as_deref().unwrap_or(""), message = message.as_deref().unwrap_or(""), "will retry")
                }
                _ => {
                    tracing::debug!(job.id = id.0, job.kind = %kind, attempt, %claim, state = %state, "finished")
                }
            },
            Event::LeaseLost { id, kind, claim } => {
                crate::metrics::count_kind(crate::metrics::LEASES_LOST, kind);
                tracing::warn!(job.id = id.0, job.kind = %kind, %claim, "lease lost; handler stopped, result discarded")
            }
            Event::SelfFenced { id, kind, claim } => {
                crate::metrics::count_kind(crate::metrics::JOBS_FENCED, kind);
                tracing::warn!(job.id = id.0, job.kind = %kind, %claim, "lease could not be renewed in time; handler stopped, job given back once it has")
            }
            Event::Dropped { id, kind, claim } => {
                tracing::warn!(job.id = id.0, job.kind = %kind, %claim, "lease may be gone before the handler started; job given back, attempt not counted")
            }
            Event::Unserved(u) => {
                tracing::warn!(
                    queue = %u.queue,
                    kind = %u.kind,
                    jobs = u.jobs,
                    oldest_due = %u.oldest_due,
                    reason = ?u.reason,
                    "due jobs wait with no live node able to run them"
                )
            }
            Event::PauseDetected { late_by } => {
                tracing::warn!(late_by_ms = late_by.as_millis() as u64, "timers fired late (process frozen or starved); revalidating leases before starting handlers")
            }
            Event::TimedOut { id, kind } => {
                crate::metrics::count_kind(crate::metrics::JOBS_TIMED_OUT, kind);
                tracing::warn!(job.id = id.0, job.kind = %kind, "timed out")
            }
            Event::CancelSignalled { id, kind } => {
                tracing::info!(job.id = id.0, job.kind = %kind, "cancel signalled")
            }
            Event::Reclaimed {
                id,
                kind,
                reason,
                state,
            } => {
                crate::metrics::reclaimed(kind, reason.code());
                tracing::warn!(job.id = id.0, job.kind = %kind, reason = reason.code(), state = %state, "reclaimed")
            }
            Event::Expired { id } => {
                tracing::info!(
                    job.id = id.0,
                    "not started by its start-by deadline: expired"
                )
            }
            Event::LeasesRenewed { renewed, lost } => {
                tracing::trace!(renewed, lost, "leases renewed")
            }
            Event::Archived { moved, pruned } => tracing::debug!(moved, pruned, "archived"),
            Event::LeaderElected { term } => {
                tracing::info!(term, "this node now leads the database")
            }
            // Handing leadership over at shutdown is the plan, not a problem.
            Event::LeaderLost {
                term,
                reason: "resigned",
            } => tracing::info!(term, "this node resigned the lead of the database"),
            Event::LeaderLost { term, reason } => {
                tracing::warn!(term, reason, "this node no longer leads the database")
            }
            Event::Reconciled {
                name,
                expected,
                recreated,
                took,
            } => {
                if *recreated > 0 {
                    tracing::info!(reconciler = %name, expected, recreated, ?took, "missing jobs re-created");
                } else {
                    tracing::debug!(reconciler = %name, expected, ?took, "no job missing");
                }
            }
            Event::ReconcileFailed {
                name,
                message,
                failures,
                retry_in,
            } => {
                tracing::warn!(reconciler = %name, error = %message, failures, ?retry_in, "reconciler failed; will retry")
            }
            Event::ScheduleFired {
                name,
                fires,
                skipped,
                next,
            } => {
                tracing::info!(schedule = %name, fires, skipped, next = ?next, "schedule fired")
            }
            Event::StoreUnavailable { actor, message } => {
                tracing::error!(actor, error = %message, "store call failed; will retry")
            }
            Event::ShutDown {
                finished,
                released,
                took,
            } => {
                tracing::info!(
                    finished,
                    released,
                    took_ms = took.as_millis() as u64,
                    "scheduler shut down"
                )
            }
        }
        // Nobody listening: skip the send (and its clone per subscriber).
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(e);
        }
    }
}

/// Logs a store failure at most once per `every` (callers keep the last time).
pub(crate) fn report_store_error(
    events: &EventBus,
    actor: &'static str,
    last: &mut Option<Instant>,
    every: Duration,
    err: &Error,
) {
    let due = last.is_none_or(|t| t.elapsed() >= every);
    if due {
        *last = Some(Instant::now());
        events.emit(Event::StoreUnavailable {
            actor,
            message: err.to_string(),
        });
    }
}
