//! JobSupervisor: one per claimed job. Its handler's task runs on the handler threads (never
//! on the actors' arbiter), turns a panic into a failure with code `panic` (with where it was
//! raised, `panic_site.rs`), reports the outcome to the [`LeaseManager`] and ends.
//!
//! A supervisor is the state its handler's task and the lease manager share, not an actor of
//! its own: the lease manager tells it to stop ([`JobSupervisor::stop`]) under its lock, and
//! the task reports when it ends. (An actor per job cost a mailbox, an address and a task on
//! the arbiter for every job, and two more hops through the arbiter: ARCHITECTURE.md §5.)
//!
//! The handler starts only once it holds a worker permit, no pause is being revalidated, and
//! its attempt's fence point has not been reached ([`Attempt::try_start`], ARCHITECTURE.md §6
//! invariant 9); otherwise the job is given back unstarted, its attempt not counted.
//!
//! The handler's task also reads the fence point itself, before every poll of the handler
//! ([`run_fenced`]), and drops the handler once it is reached — so a handler stops in time
//! even while the actors' arbiter (shared with the application) is blocked and the lease
//! manager cannot run, and a handler whose task is first polled at or past it never runs.
//!
//! Told to stop, the supervisor signals the handler and drops it at its next await (the
//! task's next poll). On timeout it writes a `timeout` failure, on release (shutdown) it gives
//! the lease back, and on self-fencing (the lease could not be renewed in time) it gives the
//! job back as a `fenced` failure to run again at once — each only once the handler has
//! actually stopped, so the job can never run here and on another node at once. A handler
//! that does not stop within the grace period is abandoned by the lease manager: its lease is
//! no longer renewed and the sweeper reclaims the job after it expires. On lease loss, or when
//! the lease manager already gave an unstarted job back, the supervisor reports nothing.
//!
//! Durability never depends on the supervisor: if the process dies with the job running, the
//! lease expires and the sweeper on any node reclaims the job.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use actix::prelude::*;
use futures_util::task::AtomicWaker;

use super::panic_site::{self, PanicSite};
use futures_util::FutureExt as _;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::attempt::{us, Attempt, Start};
use super::lease_manager::JobFinished;
use super::shared::Registered;
use super::{Event, Shared};
use crate::clock::Clock;
use crate::handler::{JobContext, JobError, JobOutcome, JobResult, Next};
use crate::hooks;
use crate::job::{JobFailure, JobId};
use crate::lease::LeaseToken;
use crate::metrics::KindMetrics;
use crate::store::{ClaimedJob, Finalization};

/// Supervises one claimed job: shared by its handler's task, which reports how it ended,
/// and the lease manager, which tells it to stop.
pub struct JobSupervisor {
    shared: Arc<Shared>,
    id: JobId,
    /// The job's queue and kind, as the fetcher shares them.
    queue: Arc<str>,
    kind: Arc<str>,
    /// The attempt's lease token, carried only to hand it back with the outcome: the lease
    /// manager holds the lease (renews, fences and gives it back); the token names which
    /// attempt the outcome is for.
    token: LeaseToken,
    /// The attempt (1-based) and how many are allowed.
    attempts: u32,
    max_attempts: u32,
    /// The attempt's timeout.
    timeout: Duration,
    /// The attempt's start gate, shared with the lease manager: the timeout counts from the
    /// start it records, not from the claim, since a prefetched job may wait for a worker.
    attempt: Arc<Attempt>,
    /// Where the outcome goes: the lease manager (a `Recipient`, so a supervisor can be run
    /// alone in a test).
    finished: Arc<Recipient<JobFinished>>,
    /// Signalled on cancel, timeout, lease loss and shutdown, and when the job ends; handlers
    /// can await it.
    cancel: CancellationToken,
    /// Set to drop the handler (and its task's wait for a worker) at the task's next poll.
    aborted: AtomicBool,
    /// Wakes the task to see `aborted`.
    waker: AtomicWaker,
    /// What the lease manager asked, and whether the outcome was reported.
    stops: Mutex<Stops>,
}

/// A supervisor's decisions, under its lock.
#[derive(Debug, Default)]
struct Stops {
    /// A cancel was requested: whatever the handler returns, the job ends `cancelled`.
    cancel_requested: bool,
    /// The outcome decided when the handler was told to stop (timeout, release); written only
    /// once the handler has actually stopped, so the job never runs here and elsewhere at once.
    decided: Option<Finalization>,
    /// The lease could not be renewed in time and the handler was told to stop: once it
    /// has, the job is given back as a `fenced` failure.
    fenced: bool,
    /// The outcome was reported (or deliberately withheld): ignore anything later.
    done: bool,
}

impl std::fmt::Debug for JobSupervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSupervisor")
            .field("job", &self.id)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl JobSupervisor {
    /// The supervisor of `job`'s attempt under `token`; its handler's task starts with
    /// [`start`](Self::start), once the lease manager tracks the lease.
    pub(crate) fn new(
        shared: Arc<Shared>,
        job: &ClaimedJob,
        (queue, kind): (Arc<str>, Arc<str>),
        attempt: Arc<Attempt>,
        finished: Arc<Recipient<JobFinished>>,
    ) -> Self {
        JobSupervisor {
            shared,
            id: job.id,
            queue,
            kind,
            token: job.token.clone(),
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            timeout: job.timeout,
            attempt,
            finished,
            cancel: CancellationToken::new(),
            aborted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            stops: Mutex::default(),
        }
    }

    /// Its decisions. A panic while they were held (none is expected) leaves them as they
    /// were: each field is set in one step.
    fn stops(&self) -> MutexGuard<'_, Stops> {
        self.stops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failure(&self, code: &str, message: String) -> JobFailure {
        JobFailure::new(code, message, self.attempts)
            .at(self.shared.clock.now())
            .with_claim(self.token.claim())
    }

    /// A failed attempt: retry with backoff while attempts remain, else dead.
    fn failed(&self, err: &JobError) -> Finalization {
        let error = err
            .to_failure(self.attempts, self.shared.clock.now())
            .with_claim(self.token.claim());
        match err.next {
            Next::Fail => Finalization::Dead { error },
            Next::Retry(_) if self.attempts >= self.max_attempts => Finalization::Dead { error },
            Next::Retry(after) => {
                let delay = after.unwrap_or_else(|| {
                    self.shared
                        .retry_policy(&self.kind, &self.queue)
                        .delay(self.attempts)
                });
                Finalization::Retry { error, delay }
            }
        }
    }

    /// Reports `outcome` of a started attempt (unless something was reported already).
    fn report(&self, stops: &mut Stops, outcome: Finalization) {
        self.report_as(stops, outcome, true);
    }

    fn report_as(&self, stops: &mut Stops, outcome: Finalization, started: bool) {
        if stops.done {
            return;
        }
        stops.done = true;
        // The handler's transaction completed the job: whatever it returned afterwards (or
        // however it was stopped), the job is `succeeded` in the database with that result.
        let (outcome, written) = match self.attempt.completed() {
            Some(result) => {
                if !matches!(outcome, Finalization::Succeeded { .. }) {
                    tracing::warn!(
                        id = self.id.0,
                        kind = %self.kind,
                        "the handler completed its job in a transaction, then returned \
                         another outcome; the job stays succeeded"
                    );
                }
                (Finalization::Succeeded { result }, true)
            }
            None => (outcome, false),
        };
        self.finished.do_send(JobFinished {
            id: self.id,
            token: self.token.clone(),
            outcome,
            queue: self.queue.clone(),
            kind: self.kind.clone(),
            attempt: self.attempts,
            started,
            written,
        });
    }

    /// Drops the handler at its task's next poll, and whatever it waits for first.
    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Starts the handler's task on the handler threads: it waits for a worker permit, then
    /// starts the handler if the attempt may still start, and reports how it ended. Called
    /// once, after the lease manager was told of the lease (so no report can overtake it).
    pub(crate) fn start(
        self: &Arc<Self>,
        job: ClaimedJob,
        workers: Arc<Semaphore>,
        metrics: Arc<KindMetrics>,
    ) {
        let shared = &self.shared;
        let Some(reg) = shared.handlers.get(&job.kind).cloned() else {
            // Perhaps another node (a newer deploy) knows this kind: retry with backoff, and
            // say plainly why; after max_attempts it is dead.
            let err = JobError::retry(format!(
                "no handler is registered for kind {:?} on node {}",
                job.kind, shared.node
            ))
            .with_code("unknown_kind");
            let outcome = self.failed(&err);
            self.report(&mut self.stops(), outcome);
            return;
        };
        // OpenTelemetry's messaging conventions, so that tracing-opentelemetry exports a
        // consumer span named "process <queue>" with the standard attributes; what only a job
        // system has goes under `jobvisor.*`.
        let span = tracing::info_span!(
            "job",
            otel.name = %format_args!("process {}", job.queue),
            otel.kind = "consumer",
            messaging.system = "jobvisor",
            messaging.operation.type = "process",
            messaging.destination.name = %job.queue,
            messaging.message.id = job.id.0,
            jobvisor.job.kind = %job.kind,
            jobvisor.job.attempt = job.attempts,
            jobvisor.claim = %self.token.claim(),
            jobvisor.node = %shared.node,
        );
        // The handler's context takes the names, the payload and the progress: the supervisor
        // has no further use for them (a copy of each would cost an allocation or a deep clone
        // per job).
        let run_at = job.run_at;
        let job_ctx = JobContext::new(
            job,
            shared.clock.now(),
            self.cancel.clone(),
            shared.client.clone(),
            self.attempt.clone(),
            shared.clock.clone(),
        );
        let task = self.clone().run(reg, job_ctx, workers, metrics, run_at);
        shared.handler_rt.spawn(task.instrument(span));
    }

    /// The handler's task: runs the handler unless told to stop first, then reports.
    async fn run(
        self: Arc<Self>,
        reg: Registered,
        mut job_ctx: JobContext,
        workers: Arc<Semaphore>,
        metrics: Arc<KindMetrics>,
        due: chrono::DateTime<chrono::Utc>,
    ) {
        let this = &*self;
        // Reports even if this task is dropped unfinished (its runtime shut down).
        let _finish = Finish(this);
        let (shared, gate) = (&this.shared, &this.attempt);
        let (id, attempt, claim) = (self.id, self.attempts, self.token.claim());
        let timeout = chrono::Duration::from_std(self.timeout).unwrap_or(chrono::Duration::MAX);
        let body = async move {
            // A closed semaphore only happens at teardown; run anyway rather than hang.
            let _permit = workers.acquire_owned().await.ok();
            shared.start_hold.wait().await;
            match gate.start(shared.clock.monotonic()) {
                Start::Started => {}
                Start::NotStarted => return Ran::NotStarted,
                Start::Expired => return Ran::Expired,
            }
            let now = shared.clock.now();
            job_ctx.deadline = now + timeout;
            shared.events.emit(Event::Started { id, attempt, claim });
            let pickup = (now - due).to_std().unwrap_or(Duration::ZERO);
            metrics.started(pickup);
            let t0 = std::time::Instant::now();
            // The task fences itself too: the lease manager's deadline check runs on the
            // actors' arbiter, which the application shares and can block.
            let handler = hooks::handler_future(shared.hooks.as_ref(), reg.handler, job_ctx);
            let ran = run_fenced(handler, gate, &*shared.clock).await;
            if matches!(ran, Ran::Fenced) && gate.fence() {
                let kind = this.kind.to_string();
                shared.events.emit(Event::SelfFenced { id, kind, claim });
            }
            metrics.handler_ran(t0.elapsed());
            ran
        };
        let mut slot = pin!(Some(AssertUnwindSafe(body).catch_unwind()));
        let ended = match slot.as_mut().as_pin_mut() {
            Some(body) => {
                Stoppable {
                    body,
                    supervisor: this,
                }
                .await
            }
            None => Ended::Aborted,
        };
        // The body (and the handler in it) is dropped before anything is reported: once
        // reported, the job may run elsewhere. A panic in the handler's drop is caught as
        // one in its poll is.
        let drop_body = || panic_site::in_handler(|| slot.set(None));
        let ended = match std::panic::catch_unwind(AssertUnwindSafe(drop_body)) {
            Ok(()) => ended,
            Err(payload) => Ended::Panicked(Panicked::caught(&*payload)),
        };
        self.handler_done(ended);
    }

    fn handler_done(&self, ended: Ended) {
        let mut stops = self.stops();
        let stops = &mut *stops;
        if stops.done {
            return;
        }
        if let Some(result) = self.attempt.completed() {
            // Completed in the handler's transaction: `report` says so, whatever came after.
            self.report(stops, Finalization::Succeeded { result });
            return;
        }
        let res = match ended {
            // The lease might be gone before the handler started: give the job back, its
            // attempt not counted.
            Ended::Ran(Ran::NotStarted) => {
                let outcome = Finalization::Requeue {
                    delay: Duration::ZERO,
                };
                self.report_as(stops, outcome, false);
                return;
            }
            // Not started by its start-by deadline: ended `expired`, never started.
            Ended::Ran(Ran::Expired) => {
                let error = self.failure(
                    crate::deadline::EXPIRED,
                    "not started by its start-by deadline".into(),
                );
                self.report_as(stops, Finalization::Cancelled { error }, false);
                return;
            }
            Ended::Ran(Ran::Returned(r)) => Ok(r),
            // Stopped by its own task's lease watch: as if told to self-fence.
            Ended::Ran(Ran::Fenced) => {
                stops.fenced = true;
                Ok(Err(JobError::retry("stopped: the lease ran short")))
            }
            Ended::Panicked(p) => Err(Some(p)),
            Ended::Aborted => Err(None),
        };
        if let Some(outcome) = stops.decided.take() {
            self.report(stops, outcome);
            return;
        }
        if stops.fenced {
            // Stopped because the lease could not be renewed in time: a success it still
            // returned is written (guarded by the token); anything else gives the job back as
            // a counted `fenced` failure, to run again at once.
            let outcome = match res {
                Ok(Ok(JobOutcome::Succeeded(result))) => Finalization::Succeeded { result },
                _ => self.failed(
                    &JobError::retry_after(
                        "the node could not renew the lease in time and stopped the handler",
                        Duration::ZERO,
                    )
                    .with_code("fenced"),
                ),
            };
            self.report(stops, outcome);
            return;
        }
        if stops.cancel_requested {
            let error = self.failure("cancelled", "cancelled on request while running".into());
            self.report(stops, Finalization::Cancelled { error });
            return;
        }
        let outcome = match res {
            Ok(Ok(JobOutcome::Succeeded(result))) => Finalization::Succeeded { result },
            Ok(Ok(JobOutcome::Snooze(delay))) => Finalization::Requeue { delay },
            Ok(Err(e)) => self.failed(&e),
            Err(Some(p)) => self.failed(&p.into_error("the handler")),
            // Dropped without a stop reason: only a task dropped unfinished (its runtime shut
            // down; see `Finish`), so give it back.
            Err(None) => Finalization::Requeue {
                delay: Duration::ZERO,
            },
        };
        self.report(stops, outcome);
    }

    /// Tells the supervisor to stop its handler, and why (the lease manager, on its
    /// arbiter). Ignored once the outcome was reported.
    pub(crate) fn stop(&self, reason: StopReason) {
        let mut stops = self.stops();
        let stops = &mut *stops;
        if stops.done {
            return;
        }
        self.cancel.cancel();
        match reason {
            StopReason::Cancel => {
                // Let the handler see the signal and return within the grace period.
                stops.cancel_requested = true;
                return;
            }
            StopReason::CancelGraceOver => {
                let error = self.failure(
                    "cancelled",
                    "cancelled on request; the handler was stopped after its grace period".into(),
                );
                self.report(stops, Finalization::Cancelled { error });
            }
            StopReason::Timeout => {
                let timeout = self.timeout;
                let err = JobError::retry(format!(
                    "the attempt ran longer than its timeout of {timeout:?}"
                ))
                .with_code("timeout");
                let outcome = self.failed(&err);
                stops.decided.get_or_insert(outcome);
            }
            StopReason::SelfFence => stops.fenced = true,
            // Withheld: nothing is reported.
            StopReason::LeaseLost | StopReason::Dropped => stops.done = true,
            StopReason::Release => {
                stops.decided.get_or_insert(Finalization::Requeue {
                    delay: Duration::ZERO,
                });
            }
        }
        self.abort();
    }
}

/// Ends a supervisor's task however it ends: if nothing was reported yet (the task was
/// dropped unfinished, or unwound), the job is given back; the cancel signal fires.
struct Finish<'a>(&'a JobSupervisor);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.handler_done(Ended::Aborted);
        self.0.cancel.cancel();
    }
}

/// How a supervisor's task ended.
#[derive(Debug)]
enum Ended {
    /// Its body ran to its end.
    Ran(Ran),
    /// The handler panicked.
    Panicked(Panicked),
    /// Told to stop: the handler (or the wait before it) was dropped.
    Aborted,
}

/// A supervisor's task body, dropped at its next poll once the supervisor is told to stop
/// (what aborting a task does), with a panic in it caught.
struct Stoppable<'a, F> {
    body: Pin<&'a mut F>,
    supervisor: &'a JobSupervisor,
}

impl<F> Future for Stoppable<'_, F>
where
    F: Future<Output = std::thread::Result<Ran>>,
{
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Ended> {
        self.supervisor.waker.register(cx.waker());
        if self.supervisor.aborted.load(Ordering::Acquire) {
            return Poll::Ready(Ended::Aborted);
        }
        let body = self.body.as_mut();
        panic_site::in_handler(|| body.poll(cx)).map(|r| match r {
            Ok(ran) => Ended::Ran(ran),
            Err(payload) => Ended::Panicked(Panicked::caught(&*payload)),
        })
    }
}

/// A handler's panic: its message and, recorded by the panic hook, where it was raised.
#[derive(Debug)]
struct Panicked {
    message: String,
    site: Option<PanicSite>,
}

impl Panicked {
    /// The panic just caught on this thread, with `payload`.
    fn caught(payload: &(dyn std::any::Any + Send)) -> Self {
        Panicked {
            message: super::panic_site::payload_message(payload),
            site: panic_site::take(),
        }
    }

    /// The attempt's failure when `who` (`the handler`, a hook) panicked: code `panic`, the
    /// location in the message, the site in `detail` (`{"panic": {"file", "line", "column",
    /// "backtrace"?}}`).
    fn into_error(self, who: &str) -> JobError {
        match self.site {
            Some(site) => JobError::retry(format!(
                "{who} panicked at {}: {}",
                site.location(),
                self.message
            ))
            .with_code("panic")
            .with_detail(site.detail()),
            None => JobError::retry(format!("{who} panicked: {}", self.message)).with_code("panic"),
        }
    }
}

/// The attempt's failure for the panic just caught on this thread with `payload`, raised by
/// `who` (`the handler`, or a hook named so): as a handler's panic is reported.
pub(crate) fn panic_error(payload: &(dyn std::any::Any + Send), who: &str) -> JobError {
    Panicked::caught(payload).into_error(who)
}

/// How a handler task ended.
#[derive(Debug)]
enum Ran {
    /// The lease was not safe to start on (or was taken away first): never started.
    NotStarted,
    /// The job's start-by deadline was reached before it started: never started.
    Expired,
    /// The handler returned.
    Returned(JobResult),
    /// The attempt's fence point was reached while the handler ran, and the task dropped it
    /// (see [`run_fenced`]).
    Fenced,
}

/// Runs `handler` unless and until the attempt's fence point is reached: the fence point is
/// read before every poll of the handler (so a handler whose task is first polled at or past
/// it is never polled at all, and none is polled again once it has passed), and a timer wakes
/// the task at it while the handler waits. The timer is armed only once the handler first
/// waits, and re-armed only when a renewal moves the fence point, so a handler that finishes
/// in one poll costs none. The handler task races its handler against this, so a handler
/// stops in time even while the actors' arbiter is blocked and the lease manager's deadline
/// check cannot run.
async fn run_fenced<F: Future<Output = JobResult>>(
    handler: F,
    gate: &Attempt,
    clock: &dyn Clock,
) -> Ran {
    let mut handler = pin!(handler);
    // The timer and the fence point it was armed for.
    let mut timer: Option<(i64, Pin<Box<tokio::time::Sleep>>)> = None;
    std::future::poll_fn(move |cx| loop {
        if gate.committing() {
            // A transaction of the handler holds its lease guard and is committing (no other
            // node can take the job until it ends), or completed the job: its own guard
            // decides, so it is polled on (see `attempt.rs`).
            return handler.as_mut().poll(cx).map(Ran::Returned);
        }
        let fence_at = gate.fence_at_us();
        let left = fence_at.saturating_sub(us(clock.monotonic()));
        let Some(left) = u64::try_from(left).ok().filter(|&l| l > 0) else {
            return Poll::Ready(Ran::Fenced);
        };
        let deadline = tokio::time::Instant::now() + Duration::from_micros(left);
        if let Some((armed_for, sleep)) = &mut timer {
            if *armed_for != fence_at {
                sleep.as_mut().reset(deadline);
                *armed_for = fence_at;
            }
            if sleep.as_mut().poll(cx).is_ready() {
                // Fired: read the fence point again (a renewal may have moved it).
                timer = None;
                continue;
            }
        }
        if let Poll::Ready(res) = handler.as_mut().poll(cx) {
            return Poll::Ready(Ran::Returned(res));
        }
        if timer.is_none() {
            let mut sleep = Box::pin(tokio::time::sleep_until(deadline));
            if sleep.as_mut().poll(cx).is_ready() {
                continue;
            }
            timer = Some((fence_at, sleep));
        }
        return Poll::Pending;
    })
    .await
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
    /// The lease could not be renewed before it would expire: stop, then give the job back
    /// as a `fenced` failure once the handler has stopped.
    SelfFence,
    /// The handler never started and the lease manager gave the job back itself: stop and
    /// report nothing.
    Dropped,
    /// Shutdown: stop and give the lease back.
    Release,
}

#[cfg(test)]
mod tests;
