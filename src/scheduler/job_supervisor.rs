//! JobSupervisor: one per running job. It runs the handler on the handler threads (never on
//! the actors' arbiter), turns a panic into a failure with code `panic`, reports the outcome
//! to the [`LeaseManager`] and stops.
//!
//! Told to stop ([`StopJob`]) it signals and aborts the handler. On timeout it writes a
//! `timeout` failure and on release (shutdown) it gives the lease back — but only once the
//! handler has actually stopped, so the job can never run here and on another node at once.
//! A handler that does not stop within the grace period is fenced by the lease manager: its
//! lease is no longer renewed and the sweeper reclaims the job after it expires. On lease loss
//! or self-fencing the supervisor reports nothing: the job belongs to someone else now, or will
//! once the sweeper reclaims it.
//!
//! Durability never depends on this actor: if the process dies with the job running, the
//! lease expires and the sweeper on any node reclaims the job.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinError};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::lease_manager::{JobFinished, LeaseManager};
use super::{Event, Shared, StopActor};
use crate::handler::{JobContext, JobError, JobOutcome, JobResult, Next};
use crate::job::{Job, JobFailure};
use crate::lease::LeaseToken;
use crate::store::Finalization;

/// `started` value of a job whose handler has not started.
pub(crate) const NOT_STARTED: i64 = i64::MIN;

/// Supervises one running job.
pub struct JobSupervisor {
    shared: Arc<Shared>,
    job: Job,
    token: LeaseToken,
    /// The queue's worker permits: the handler starts only once it holds one.
    workers: Arc<Semaphore>,
    /// When the handler started (epoch µs, [`NOT_STARTED`] before): the lease manager counts
    /// the timeout from it, not from the claim, since a prefetched job may wait for a worker.
    started: Arc<AtomicI64>,
    lease_manager: Addr<LeaseManager>,
    /// Signalled on cancel, timeout, lease loss and shutdown; handlers can await it.
    cancel: CancellationToken,
    /// Stops the handler task at its next await.
    abort: Option<AbortHandle>,
    /// A cancel was requested: whatever the handler returns, the job ends `cancelled`.
    cancel_requested: bool,
    /// The outcome decided when the handler was told to stop (timeout, release); written only
    /// once the handler has actually stopped, so the job never runs here and elsewhere at once.
    decided: Option<Finalization>,
    /// The outcome was reported (or deliberately withheld): ignore anything later.
    done: bool,
}

impl std::fmt::Debug for JobSupervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSupervisor")
            .field("job", &self.job.id)
            .field("kind", &self.job.kind)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl JobSupervisor {
    pub(crate) fn new(
        shared: Arc<Shared>,
        job: Job,
        token: LeaseToken,
        workers: Arc<Semaphore>,
        started: Arc<AtomicI64>,
        lease_manager: Addr<LeaseManager>,
    ) -> Self {
        JobSupervisor {
            shared,
            job,
            token,
            workers,
            started,
            lease_manager,
            cancel: CancellationToken::new(),
            abort: None,
            cancel_requested: false,
            decided: None,
            done: false,
        }
    }

    fn failure(&self, code: &str, message: String) -> JobFailure {
        JobFailure::new(code, message, self.job.attempts).at(self.shared.clock.now())
    }

    /// A failed attempt: retry with backoff while attempts remain, else dead.
    fn failed(&self, err: &JobError) -> Finalization {
        let error = err.to_failure(self.job.attempts, self.shared.clock.now());
        match err.next {
            Next::Fail => Finalization::Dead { error },
            Next::Retry(_) if self.job.attempts >= self.job.max_attempts => {
                Finalization::Dead { error }
            }
            Next::Retry(after) => {
                let delay = after.unwrap_or_else(|| {
                    self.shared
                        .retry_policy(&self.job.kind, &self.job.queue)
                        .delay(self.job.attempts)
                });
                Finalization::Retry { error, delay }
            }
        }
    }

    fn report(&mut self, outcome: Finalization, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        self.done = true;
        self.lease_manager.do_send(JobFinished {
            id: self.job.id,
            token: self.token.clone(),
            outcome,
            queue: self.job.queue.clone(),
            kind: self.job.kind.clone(),
            attempt: self.job.attempts,
        });
        ctx.stop();
    }

    fn withhold(&mut self, ctx: &mut Context<Self>) {
        self.done = true;
        ctx.stop();
    }

    fn handler_done(&mut self, res: Result<JobResult, JoinError>, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        if let Some(outcome) = self.decided.take() {
            self.report(outcome, ctx);
            return;
        }
        if self.cancel_requested {
            let error = self.failure("cancelled", "cancelled on request while running".into());
            self.report(Finalization::Cancelled { error }, ctx);
            return;
        }
        let outcome = match res {
            Ok(Ok(JobOutcome::Succeeded(result))) => Finalization::Succeeded { result },
            Ok(Ok(JobOutcome::Snooze(delay))) => Finalization::Requeue { delay },
            Ok(Err(e)) => self.failed(&e),
            Err(join) if join.is_panic() => {
                let msg = panic_message(join);
                self.failed(
                    &JobError::retry(format!("the handler panicked: {msg}")).with_code("panic"),
                )
            }
            Err(_) => {
                // Aborted without a stop reason: only shutdown aborts tasks, so give it back.
                Finalization::Requeue {
                    delay: std::time::Duration::ZERO,
                }
            }
        };
        self.report(outcome, ctx);
    }
}

fn panic_message(e: JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into()),
        Err(_) => "unknown".into(),
    }
}

impl Actor for JobSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(reg) = self.shared.handlers.get(&self.job.kind).cloned() else {
            // Perhaps another node (a newer deploy) knows this kind: retry with backoff, and
            // say plainly why; after max_attempts it is dead.
            let err = JobError::retry(format!(
                "no handler is registered for kind {:?} on node {}",
                self.job.kind, self.shared.node
            ))
            .with_code("unknown_kind");
            let outcome = self.failed(&err);
            self.report(outcome, ctx);
            return;
        };
        let mut job_ctx = JobContext::new(&self.job, self.shared.clock.now(), self.cancel.clone());
        let span = tracing::info_span!(
            "job",
            job.id = self.job.id.0,
            job.kind = %self.job.kind,
            job.queue = %self.job.queue,
            attempt = self.job.attempts,
        );
        let (workers, started, clock) = (
            self.workers.clone(),
            self.started.clone(),
            self.shared.clock.clone(),
        );
        let (events, id, attempt) = (self.shared.events.clone(), self.job.id, self.job.attempts);
        let timeout = chrono::Duration::from_std(self.job.timeout).unwrap_or(chrono::Duration::MAX);
        let task = self.shared.handler_rt.spawn(
            async move {
                // A closed semaphore only happens at teardown; run anyway rather than hang.
                let _permit = workers.acquire_owned().await.ok();
                let now = clock.now();
                started.store(now.timestamp_micros(), Ordering::Release);
                job_ctx.deadline = now + timeout;
                events.emit(Event::Started { id, attempt });
                reg.handler.call(job_ctx).await
            }
            .instrument(span),
        );
        self.abort = Some(task.abort_handle());
        ctx.spawn(
            fut::wrap_future::<_, Self>(task).map(|res, act, ctx| act.handler_done(res, ctx)),
        );
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.cancel.cancel();
        if let Some(a) = self.abort.take() {
            a.abort();
        }
    }
}

/// Why a supervisor must stop its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Someone asked to cancel the job: signal the handler; the job ends `cancelled`.
    Cancel,
    /// The cancel grace is over and the handler has not returned: stop it now.
    CancelGraceOver,
    /// The attempt ran past its timeout: stop it and fail it with code `timeout`.
    Timeout,
    /// The lease was found lost: stop and report nothing.
    LeaseLost,
    /// The lease could not be renewed before it would expire: stop and report nothing.
    SelfFence,
    /// Shutdown: stop and give the lease back.
    Release,
}

/// Tells a supervisor to stop its handler, and why.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopJob(pub StopReason);

impl Handler<StopJob> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, StopJob(reason): StopJob, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        self.cancel.cancel();
        match reason {
            StopReason::Cancel => {
                // Let the handler see the signal and return within the grace period.
                self.cancel_requested = true;
                return;
            }
            StopReason::CancelGraceOver => {
                let error = self.failure(
                    "cancelled",
                    "cancelled on request; the handler was stopped after its grace period".into(),
                );
                self.report(Finalization::Cancelled { error }, ctx);
            }
            StopReason::Timeout => {
                let timeout = self.job.timeout;
                let err = JobError::retry(format!(
                    "the attempt ran longer than its timeout of {timeout:?}"
                ))
                .with_code("timeout");
                let outcome = self.failed(&err);
                self.decided.get_or_insert(outcome);
            }
            StopReason::LeaseLost | StopReason::SelfFence => self.withhold(ctx),
            StopReason::Release => {
                self.decided.get_or_insert(Finalization::Requeue {
                    delay: std::time::Duration::ZERO,
                });
            }
        }
        if let Some(a) = self.abort.take() {
            a.abort();
        }
    }
}

impl Handler<StopActor> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
