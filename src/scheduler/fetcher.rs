//! Fetcher: one per queue. Whenever woken — poll tick, a local enqueue, a freed slot — it
//! claims up to its free slots in one statement and starts a [`JobSupervisor`] per job.
//!
//! At most one claim is in flight: a wake that arrives meanwhile waits in the mailbox and is
//! served when the claim returns, so no wake is lost and no two claims race for the same
//! slots. Freed slots coalesce into one queued wake.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::job_supervisor::JobSupervisor;
use super::lease_manager::{LeaseManager, TrackLease};
use super::{report_store_error, Event, Shared, StopActor};
use crate::config::QueueConfig;
use crate::store::ClaimParams;

/// Store errors are logged at most this often per fetcher.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// Claims jobs of one queue.
pub struct Fetcher {
    shared: Arc<Shared>,
    queue: String,
    config: QueueConfig,
    lease_manager: Addr<LeaseManager>,
    /// Slots taken: running jobs plus jobs whose finalization is not yet confirmed.
    busy: u32,
    /// A `FetchNow` is already queued for a freed slot: don't queue another.
    wake_queued: bool,
    /// Shutdown began: claim nothing more.
    stopped: bool,
    last_error: Option<Instant>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("queue", &self.queue)
            .field("busy", &self.busy)
            .field("wake_queued", &self.wake_queued)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    pub(crate) fn new(
        shared: Arc<Shared>,
        queue: String,
        config: QueueConfig,
        lease_manager: Addr<LeaseManager>,
    ) -> Self {
        Fetcher {
            shared,
            queue,
            config,
            lease_manager,
            busy: 0,
            wake_queued: false,
            stopped: false,
            last_error: None,
        }
    }

    fn free(&self) -> u32 {
        self.config.concurrency.saturating_sub(self.busy)
    }
}

impl Actor for Fetcher {
    type Context = Context<Self>;
}

/// Wake up: claim up to the free slots now, in one statement. Answers how many jobs were
/// claimed. Wakes that arrive during a claim wait for it (see the handler).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct FetchNow;

impl Handler<FetchNow> for Fetcher {
    // Atomic: one claim at a time per fetcher. Two claims in flight would both be sized to the
    // same free slots and together exceed the queue's concurrency.
    type Result = AtomicResponse<Self, usize>;

    fn handle(&mut self, _: FetchNow, _ctx: &mut Context<Self>) -> Self::Result {
        self.wake_queued = false;
        if self.stopped || self.free() == 0 {
            return AtomicResponse::new(Box::pin(fut::ready(0)));
        }
        let limit = self.free();
        let shared = self.shared.clone();
        let params = ClaimParams {
            queue: self.queue.clone(),
            owner: shared.node.clone(),
            limit,
            lease: shared.config.lease,
            now: shared.clock.bound_now(),
        };
        let fut = async move { shared.store.job_claim(params).await };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            move |res, act, _ctx| match res {
                Ok(jobs) => {
                    let n = jobs.len();
                    for claimed in jobs {
                        act.start(claimed);
                    }
                    n
                }
                Err(e) => {
                    report_store_error(
                        &act.shared.events,
                        "fetcher",
                        &mut act.last_error,
                        ERROR_LOG_EVERY,
                        &e,
                    );
                    0
                }
            },
        )))
    }
}

impl Fetcher {
    /// Takes a slot, starts the job's supervisor and hands its lease to the lease manager.
    fn start(&mut self, claimed: crate::store::ClaimedJob) {
        self.busy += 1;
        let claimed_at = self.shared.clock.now();
        self.shared.events.emit(Event::Claimed {
            id: claimed.job.id,
            kind: claimed.job.kind.clone(),
            queue: claimed.job.queue.clone(),
            attempt: claimed.job.attempts,
        });
        let deadline = claimed_at
            + chrono::Duration::from_std(claimed.job.timeout).unwrap_or(chrono::Duration::MAX);
        let (id, kind) = (claimed.job.id, claimed.job.kind.clone());
        let supervisor = JobSupervisor::new(
            self.shared.clone(),
            claimed.job,
            claimed.token.clone(),
            deadline,
            self.lease_manager.clone(),
        )
        .start();
        // Sent before the supervisor can report anything: it has not run yet.
        self.lease_manager.do_send(TrackLease {
            id,
            token: claimed.token,
            queue: self.queue.clone(),
            kind,
            supervisor: supervisor.recipient(),
            claimed_at,
            deadline,
        });
    }
}

/// A job of this queue finished (its finalization confirmed) or lost its lease: its slot is
/// free again.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SlotFreed;

impl Handler<SlotFreed> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: SlotFreed, ctx: &mut Context<Self>) {
        self.busy = self.busy.saturating_sub(1);
        if !self.stopped && !self.wake_queued {
            self.wake_queued = true;
            ctx.notify(FetchNow);
        }
    }
}

/// Shutdown: claim nothing more.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopClaiming;

impl Handler<StopClaiming> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: StopClaiming, _ctx: &mut Context<Self>) {
        self.stopped = true;
    }
}

/// What a fetcher is doing (for tests and operators).
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct FetcherStatus {
    /// Slots taken.
    pub busy: u32,
    /// Its concurrency.
    pub concurrency: u32,
    /// Whether it still claims.
    pub claiming_enabled: bool,
}

/// Asks a fetcher for its [`FetcherStatus`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "FetcherStatus")]
pub struct GetFetcherStatus;

impl Handler<GetFetcherStatus> for Fetcher {
    type Result = FetcherStatus;

    fn handle(&mut self, _: GetFetcherStatus, _ctx: &mut Context<Self>) -> FetcherStatus {
        FetcherStatus {
            busy: self.busy,
            concurrency: self.config.concurrency,
            claiming_enabled: !self.stopped,
        }
    }
}

impl Handler<StopActor> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
