//! Sweeper: reclaims running jobs whose lease expired (their node died, paused or was cut
//! off) or whose timeout passed, in bounded batches. Each reclaimed job is logged at warn with
//! its id and kind; store errors are logged and the sweeper carries on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::{report_store_error, Event, Shared, StopActor};
use crate::job::JobId;
use crate::store::ReclaimParams;

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);
/// Batches run back to back in one sweep at most (the next tick continues).
const MAX_BATCHES_PER_SWEEP: usize = 10;

/// Parents a sweep settles at most in its backstop pass.
const STRANDED_PER_SWEEP: u32 = 500;

/// Reclaims expired and over-time jobs, ends jobs past their start-by deadline, settles the
/// children of jobs that ended dead here, and settles children a crashed finalizer left
/// (`store::dependencies`).
pub struct Sweeper {
    shared: Arc<Shared>,
    /// A sweep is in flight; overlapping ticks are skipped.
    sweeping: bool,
    last_error: Option<Instant>,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("sweeping", &self.sweeping)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Sweeper {
            shared,
            sweeping: false,
            last_error: None,
        }
    }
}

impl Actor for Sweeper {
    type Context = Context<Self>;
}

/// Sweep now: reclaim in bounded batches until a batch comes back short. Answers how many
/// jobs were reclaimed.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct SweepNow;

impl Handler<SweepNow> for Sweeper {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, _: SweepNow, _ctx: &mut Context<Self>) -> Self::Result {
        if self.sweeping {
            return Box::pin(fut::ready(0));
        }
        self.sweeping = true;
        let shared = self.shared.clone();
        let fut = async move {
            let retry = shared.config.retry;
            let limit = shared.config.sweep_batch;
            let mut total = 0;
            let mut ended = Vec::new();
            for _ in 0..MAX_BATCHES_PER_SWEEP {
                let params = ReclaimParams {
                    limit,
                    backoff: Arc::new(move |attempt| retry.delay(attempt)),
                    now: shared.clock.bound_now(),
                };
                let batch = shared.store.job_reclaim_expired(params).await?;
                total += batch.len();
                let short = batch.len() < limit as usize;
                for r in batch {
                    if r.new_state.is_terminal() {
                        ended.push(r.id.0);
                    }
                    shared.events.emit(Event::Reclaimed {
                        id: r.id,
                        kind: r.kind,
                        reason: r.reason,
                        state: r.new_state,
                    });
                }
                if short {
                    break;
                }
            }
            // Jobs not started by their start-by deadline end `expired` (`store::deadlines`),
            // a batch a sweep: one statement when none is past.
            let now = shared.clock.bound_now();
            let (expired, mut released) = shared.store.job_expire_due(limit, now).await?;
            for id in expired {
                shared.events.emit(Event::Expired { id: JobId(id) });
            }
            // Children of the jobs that ended dead here, then the backstop: parents whose
            // settle a crash interrupted (`store::dependencies`).
            released.extend(
                shared
                    .store
                    .job_settle_children(&ended, now)
                    .await?
                    .released,
            );
            let stranded = shared
                .store
                .job_settle_stranded(STRANDED_PER_SWEEP, now)
                .await?;
            released.extend(stranded.released);
            shared.client.wake_queues(&released);
            Ok::<_, crate::Error>(total)
        };
        Box::pin(fut.into_actor(self).map(|res, act, _ctx| {
            act.sweeping = false;
            match res {
                Ok(n) => n,
                Err(e) => {
                    report_store_error(
                        &act.shared.events,
                        "sweeper",
                        &mut act.last_error,
                        ERROR_LOG_EVERY,
                        &e,
                    );
                    0
                }
            }
        }))
    }
}

impl Handler<StopActor> for Sweeper {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
