//! One stream of facts about jobs and actors. Each fact is emitted once, here: it is logged
//! with `tracing` and broadcast to subscribers (metrics, tests, the quickstart's progress).

use std::time::Duration;

use tokio::sync::broadcast;

use crate::job::{JobId, JobState};
use crate::store::ReclaimReason;

/// Events kept for a slow subscriber before it starts missing some.
pub const EVENT_BUFFER: usize = 4096;

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
    },
    /// A job's handler started (it got a worker; its timeout counts from now).
    Started {
        /// The job.
        id: JobId,
        /// This attempt.
        attempt: u32,
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
    },
    /// This node learned it no longer holds a job's lease (a renewal or finalization was
    /// refused): its handler was stopped and its result discarded.
    LeaseLost {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
    },
    /// A running job's lease could not be renewed before it expired, so its handler was
    /// stopped before another node could claim it (self-fencing).
    SelfFenced {
        /// The job.
        id: JobId,
        /// Its kind.
        kind: String,
    },
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

    pub(crate) fn emit(&self, e: Event) {
        match &e {
            Event::Claimed {
                id,
                kind,
                queue,
                attempt,
            } => {
                tracing::debug!(job.id = id.0, job.kind = %kind, job.queue = %queue, attempt, "claimed")
            }
            Event::Started { id, attempt } => {
                tracing::trace!(job.id = id.0, attempt, "handler started")
            }
            Event::Finished {
                id,
                kind,
                state,
                code,
                attempt,
                ..
            } => match state {
                JobState::Dead => {
                    tracing::warn!(job.id = id.0, job.kind = %kind, attempt, code = ?code, "job is dead")
                }
                JobState::Retrying => {
                    tracing::info!(job.id = id.0, job.kind = %kind, attempt, code = ?code, "will retry")
                }
                _ => {
                    tracing::debug!(job.id = id.0, job.kind = %kind, attempt, state = %state, "finished")
                }
            },
            Event::LeaseLost { id, kind } => {
                tracing::warn!(job.id = id.0, job.kind = %kind, "lease lost; handler stopped, result discarded")
            }
            Event::SelfFenced { id, kind } => {
                tracing::warn!(job.id = id.0, job.kind = %kind, "lease could not be renewed in time; handler stopped")
            }
            Event::TimedOut { id, kind } => {
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
                tracing::warn!(job.id = id.0, job.kind = %kind, reason = reason.code(), state = %state, "reclaimed")
            }
            Event::LeasesRenewed { renewed, lost } => {
                tracing::trace!(renewed, lost, "leases renewed")
            }
            Event::Archived { moved, pruned } => tracing::debug!(moved, pruned, "archived"),
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
