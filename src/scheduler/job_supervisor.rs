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

use super::attempt::{us, Attempt};
use super::lease_manager::JobFinished;
use super::shared::Registered;
use super::{Event, Shared};
use crate::clock::Clock;
use crate::handler::{JobContext, JobError, JobOutcome, JobResult, Next};
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
            if !gate.try_start(shared.clock.monotonic()) {
                return Ran::NotStarted;
            }
            let now = shared.clock.now();
            job_ctx.deadline = now + timeout;
            shared.events.emit(Event::Started { id, attempt, claim });
            let pickup = (now - due).to_std().unwrap_or(Duration::ZERO);
            metrics.started(pickup);
            let t0 = std::time::Instant::now();
            // The task fences itself too: the lease manager's deadline check runs on the
            // actors' arbiter, which the application shares and can block.
            let ran = run_fenced(reg.handler.call(job_ctx), gate, &*shared.clock).await;
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
            Err(Some(p)) => self.failed(&p.into_error()),
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

    /// The attempt's failure: code `panic`, the location in the message, the site in
    /// `detail` (`{"panic": {"file", "line", "column", "backtrace"?}}`).
    fn into_error(self) -> JobError {
        match self.site {
            Some(site) => JobError::retry(format!(
                "the handler panicked at {}: {}",
                site.location(),
                self.message
            ))
            .with_code("panic")
            .with_detail(site.detail()),
            None => JobError::retry(format!("the handler panicked: {}", self.message))
                .with_code("panic"),
        }
    }
}

/// How a handler task ended.
#[derive(Debug)]
enum Ran {
    /// The lease was not safe to start on (or was taken away first): never started.
    NotStarted,
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

/// A supervisor run alone: its peer is a `Recipient<JobFinished>`, here a stub that hands
/// each report to the test, with no lease manager, fetcher or database write involved.
#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use chrono::{DateTime, Utc};
    use serde_json::{json, Value};
    use tokio::sync::mpsc;

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::config::SchedulerConfig;
    use crate::handler::{handler_fn, Erased};
    use crate::job::JobId;
    use crate::lease::NodeId;
    use crate::scheduler::event::EventBus;
    use crate::scheduler::shared::Registered;
    use crate::scheduler::start_hold::StartHold;
    use crate::scheduler::stats::Stats;

    /// Stands in for the lease manager: forwards every report.
    struct Reports(mpsc::UnboundedSender<JobFinished>);

    impl Actor for Reports {
        type Context = Context<Self>;
    }

    impl Handler<JobFinished> for Reports {
        type Result = ();

        fn handle(&mut self, m: JobFinished, _ctx: &mut Context<Self>) {
            let _ = self.0.send(m);
        }
    }

    async fn shared(dir: &tempfile::TempDir) -> Arc<Shared> {
        let handler = handler_fn(|n: i64, _ctx| async move { JobOutcome::success(n * 2) });
        let rt = tokio::runtime::Handle::current();
        shared_with(dir, Arc::new(Erased(handler)), rt).await
    }

    /// A node whose kind `double` runs `handler`.
    async fn shared_with(
        dir: &tempfile::TempDir,
        handler: Arc<dyn crate::handler::ErasedHandler>,
        handler_rt: tokio::runtime::Handle,
    ) -> Arc<Shared> {
        let url = format!("sqlite://{}", dir.path().join("alone.db").display());
        let options = crate::store::StoreOptions::default().migrate(true);
        let store = crate::store::Store::connect_with(&url, options)
            .await
            .unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let handlers: crate::scheduler::shared::Handlers = [(
            "double".to_string(),
            Registered {
                handler,
                retry: None,
            },
        )]
        .into_iter()
        .collect();
        Arc::new(Shared {
            client: crate::client::Client::with_clock(store.clone(), clock.clone()),
            store,
            clock,
            node: NodeId::new("alone").unwrap(),
            config: SchedulerConfig::default(),
            queues: HashMap::new(),
            kinds: handlers.keys().cloned().collect(),
            handlers,
            events: EventBus::new(),
            handler_rt,
            stats: Stats::default(),
            start_hold: StartHold::default(),
            leader: Default::default(),
            reconcilers: Vec::new(),
            schedules: Vec::new(),
            schedules_stored: tokio::sync::watch::Sender::new(true),
            queue_gates: HashMap::new(),
        })
    }

    fn job(payload: Value) -> ClaimedJob {
        let now: DateTime<Utc> = Utc::now();
        ClaimedJob {
            id: JobId(1),
            queue: "default".into(),
            kind: "double".into(),
            priority: 0,
            payload,
            progress: None,
            attempts: 1,
            max_attempts: 3,
            run_at: now,
            timeout: Duration::from_secs(60),
            created_at: now,
            token: LeaseToken::generate(),
        }
    }

    async fn run_alone(shared: Arc<Shared>, valid_for: Duration) -> JobFinished {
        let (_supervisor, mut reports) = started(shared, valid_for, Arc::new(Semaphore::new(1)));
        tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .unwrap()
            .unwrap()
    }

    /// A supervisor of job 1 (payload 21) started alone, its lease valid for `valid_for`,
    /// with `workers` as its queue's permits; its reports arrive on the receiver.
    fn started(
        shared: Arc<Shared>,
        valid_for: Duration,
        workers: Arc<Semaphore>,
    ) -> (Arc<JobSupervisor>, mpsc::UnboundedReceiver<JobFinished>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reports = Reports(tx).start();
        let lease = shared.config.lease;
        let fence_at = super::super::attempt::fence_point(shared.clock.monotonic(), lease);
        let attempt = Arc::new(Attempt::new(
            fence_at.saturating_sub(lease.saturating_sub(valid_for)),
        ));
        let job = job(json!(21));
        let supervisor = Arc::new(JobSupervisor::new(
            shared,
            &job,
            ("default".into(), "double".into()),
            attempt,
            Arc::new(reports.recipient()),
        ));
        supervisor.start(job, workers, Arc::new(KindMetrics::new("default", "k")));
        (supervisor, rx)
    }

    /// What a handler of these tests did: started, and its future dropped — and whether its
    /// supervisor (once known) had reported by then.
    #[derive(Default)]
    struct Trace {
        started: std::sync::atomic::AtomicBool,
        dropped: std::sync::atomic::AtomicBool,
        supervisor: std::sync::OnceLock<std::sync::Weak<JobSupervisor>>,
        reported_before_drop: std::sync::atomic::AtomicBool,
    }

    /// Sets `dropped` when the handler's future is dropped.
    struct OnDrop(Arc<Trace>);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            use std::sync::atomic::Ordering::SeqCst;
            if let Some(s) = self.0.supervisor.get().and_then(std::sync::Weak::upgrade) {
                self.0.reported_before_drop.store(s.stops().done, SeqCst);
            }
            self.0.dropped.store(true, SeqCst);
        }
    }

    /// A handler that records its start and then waits for ever (ignoring its cancel signal);
    /// its future panics when dropped if `panics_on_drop`.
    fn stuck(trace: &Arc<Trace>, panics_on_drop: bool) -> Arc<dyn crate::handler::ErasedHandler> {
        /// Panics when dropped.
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("the handler's drop panicked");
            }
        }
        let trace = trace.clone();
        Arc::new(Erased(handler_fn(move |_: i64, _ctx| {
            let guard = OnDrop(trace.clone());
            // Made only when asked: a `Bomb` made and dropped here would panic at once.
            let bomb = if panics_on_drop { Some(Bomb) } else { None };
            async move {
                let _bomb = bomb;
                guard
                    .0
                    .started
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                std::future::pending::<()>().await;
                JobOutcome::success(())
            }
        })))
    }

    /// A supervisor of a `stuck` handler, started with `permits` worker permits, its lease
    /// valid for 30 s.
    async fn stuck_and_started(
        permits: usize,
    ) -> (
        tempfile::TempDir,
        Arc<Trace>,
        Arc<Semaphore>,
        Arc<JobSupervisor>,
        mpsc::UnboundedReceiver<JobFinished>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let trace = Arc::new(Trace::default());
        let rt = tokio::runtime::Handle::current();
        let shared = shared_with(&dir, stuck(&trace, false), rt).await;
        let workers = Arc::new(Semaphore::new(permits));
        let (supervisor, reports) = started(shared, Duration::from_secs(30), workers.clone());
        (dir, trace, workers, supervisor, reports)
    }

    #[actix::test]
    async fn a_supervisor_stopped_while_it_waits_for_a_worker_never_starts_and_reports_nothing() {
        use std::sync::atomic::Ordering::SeqCst;
        let (_dir, trace, workers, supervisor, mut reports) = stuck_and_started(0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        supervisor.stop(StopReason::Dropped);
        // The task was dropped at its wait: a permit now starts nothing.
        workers.add_permits(1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!trace.started.load(SeqCst), "the handler never starts");
        assert!(reports.try_recv().is_err(), "a dropped job reports nothing");
    }

    #[actix::test]
    async fn a_timed_out_handler_is_dropped_before_its_outcome_is_reported() {
        use std::sync::atomic::Ordering::SeqCst;
        let (_dir, trace, _workers, supervisor, mut reports) = stuck_and_started(1).await;
        let _ = trace.supervisor.set(Arc::downgrade(&supervisor));
        while !trace.started.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        supervisor.stop(StopReason::Timeout);
        let done = tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(trace.dropped.load(SeqCst), "the handler was dropped");
        assert!(
            !trace.reported_before_drop.load(SeqCst),
            "the handler is dropped before the outcome is reported"
        );
        match done.outcome {
            Finalization::Retry { error, .. } => assert_eq!(error.code, "timeout"),
            other => panic!("expected a timeout retry, got {other:?}"),
        }
        assert!(supervisor.cancel.is_cancelled(), "its cancel signal fired");
    }

    #[actix::test]
    async fn a_supervisor_alone_runs_its_handler_and_reports_the_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let done = run_alone(shared(&dir).await, Duration::from_secs(30)).await;
        assert!(done.started);
        assert_eq!((done.id, done.attempt), (JobId(1), 1));
        match done.outcome {
            Finalization::Succeeded { result } => assert_eq!(result, json!(42)),
            other => panic!("expected success, got {other:?}"),
        }
    }

    /// Records the fields of every span named `job`.
    struct SpanFields(Arc<std::sync::Mutex<Vec<(String, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanFields {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct V<'a>(&'a mut Vec<(String, String)>);
            impl tracing::field::Visit for V<'_> {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0.push((f.name().to_string(), format!("{v:?}")));
                }
            }
            if attrs.metadata().name() == "job" {
                let mut fields = self.0.lock().unwrap();
                attrs.record(&mut V(&mut fields));
            }
        }
    }

    #[actix::test]
    async fn the_job_span_carries_opentelemetry_messaging_fields() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let fields = Arc::new(std::sync::Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(SpanFields(fields.clone()));
        let _guard = tracing::subscriber::set_default(subscriber);
        let mut node = String::new();
        // A test on another thread that hits the `job` callsite first, with no subscriber,
        // can cache "never" for it racing this one's registration (a tracing-core cache, not
        // the span): the interest is rebuilt and the run repeated while nothing was seen.
        for _ in 0..5 {
            tracing::callsite::rebuild_interest_cache();
            let dir = tempfile::tempdir().unwrap();
            let shared = shared(&dir).await;
            node = shared.node.to_string();
            run_alone(shared, Duration::from_secs(30)).await;
            if !fields.lock().unwrap().is_empty() {
                break;
            }
        }
        let fields = fields.lock().unwrap().clone();
        for (name, value) in [
            ("otel.name", "process default"),
            ("otel.kind", "\"consumer\""),
            ("messaging.system", "\"jobvisor\""),
            ("messaging.operation.type", "\"process\""),
            ("messaging.destination.name", "default"),
            ("messaging.message.id", "1"),
            ("jobvisor.job.kind", "double"),
            ("jobvisor.job.attempt", "1"),
            ("jobvisor.node", node.as_str()),
        ] {
            assert!(
                fields.iter().any(|(n, v)| n == name && v == value),
                "{name} = {value} not in {fields:?}"
            );
        }
    }

    /// A handler future that counts its polls and waits until `go` is notified.
    async fn counted(polls: &std::sync::atomic::AtomicU32, go: &tokio::sync::Notify) -> JobResult {
        polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        go.notified().await;
        polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        JobOutcome::success("ran")
    }

    #[tokio::test]
    async fn a_handler_first_polled_at_or_past_its_fence_point_is_never_polled() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let clock = crate::clock::ManualClock::at_fixed_start();
        let go = tokio::sync::Notify::new();
        go.notify_one();
        let now = clock.monotonic();
        for fence_at in [now, now - Duration::from_micros(1)] {
            let gate = Attempt::new(fence_at);
            let polls = AtomicU32::new(0);
            let ran = run_fenced(counted(&polls, &go), &gate, &clock).await;
            assert!(matches!(ran, Ran::Fenced), "{ran:?}");
            assert_eq!(
                polls.load(SeqCst),
                0,
                "fence point at {fence_at:?}: never polled"
            );
        }
        let gate = Attempt::new(clock.monotonic() + Duration::from_micros(1));
        clock.advance(Duration::from_micros(1));
        let polls = AtomicU32::new(0);
        let ran = run_fenced(counted(&polls, &go), &gate, &clock).await;
        assert!(matches!(ran, Ran::Fenced) && polls.load(SeqCst) == 0);
    }

    /// A manual clock, an attempt 5 s before its fence point, and what `counted` needs.
    fn five_seconds_to_fence() -> (
        crate::clock::ManualClock,
        Attempt,
        std::sync::atomic::AtomicU32,
        tokio::sync::Notify,
    ) {
        let clock = crate::clock::ManualClock::at_fixed_start();
        let gate = Attempt::new(clock.monotonic() + Duration::from_secs(5));
        (clock, gate, Default::default(), tokio::sync::Notify::new())
    }

    #[tokio::test]
    async fn a_waiting_handler_is_not_polled_again_once_its_fence_point_has_passed() {
        use std::sync::atomic::Ordering::SeqCst;
        let (clock, gate, polls, go) = five_seconds_to_fence();
        let run = run_fenced(counted(&polls, &go), &gate, &clock);
        let mut run = std::pin::pin!(run);
        assert!(futures_util::poll!(run.as_mut()).is_pending());
        assert_eq!(polls.load(SeqCst), 1);
        // The fence point passes while the handler waits; then its wake-up arrives.
        clock.advance(Duration::from_secs(5));
        go.notify_one();
        let ran = run.await;
        assert!(matches!(ran, Ran::Fenced), "{ran:?}");
        assert_eq!(polls.load(SeqCst), 1, "not polled past its fence point");
    }

    #[tokio::test]
    async fn a_renewal_moves_the_fence_point_of_a_running_handler() {
        use std::sync::atomic::Ordering::SeqCst;
        let (clock, gate, polls, go) = five_seconds_to_fence();
        let run = run_fenced(counted(&polls, &go), &gate, &clock);
        let mut run = std::pin::pin!(run);
        assert!(futures_util::poll!(run.as_mut()).is_pending());
        gate.extend(clock.monotonic() + Duration::from_secs(10));
        clock.advance(Duration::from_secs(5));
        go.notify_one();
        let ran = run.await;
        assert!(matches!(ran, Ran::Returned(Ok(_))), "{ran:?}");
        assert_eq!(polls.load(SeqCst), 2);
    }

    #[actix::test]
    async fn a_supervisor_alone_gives_back_a_job_whose_lease_estimate_ran_out() {
        let dir = tempfile::tempdir().unwrap();
        // Valid for less than the fence margin: its fence point has passed, the gate refuses.
        let done = run_alone(shared(&dir).await, Duration::from_millis(1)).await;
        assert!(!done.started, "the handler must not start");
        assert!(
            matches!(done.outcome, Finalization::Requeue { delay } if delay.is_zero()),
            "{:?}",
            done.outcome
        );
    }

    /// Waits until the `stuck` handler of `trace` has started.
    async fn until_started(trace: &Trace) {
        while !trace.started.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[actix::test]
    async fn a_handler_whose_drop_panics_after_a_timeout_still_has_the_timeout_reported() {
        let dir = tempfile::tempdir().unwrap();
        let trace = Arc::new(Trace::default());
        let rt = tokio::runtime::Handle::current();
        let shared = shared_with(&dir, stuck(&trace, true), rt).await;
        let workers = Arc::new(Semaphore::new(1));
        let (supervisor, mut reports) = started(shared, Duration::from_secs(30), workers);
        until_started(&trace).await;
        supervisor.stop(StopReason::Timeout);
        let done = tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .expect("reported although the handler's drop panicked")
            .unwrap();
        match done.outcome {
            Finalization::Retry { error, .. } => assert_eq!(error.code, "timeout"),
            other => panic!("expected a timeout retry, got {other:?}"),
        }
    }

    #[actix::test]
    async fn a_handler_task_dropped_with_its_runtime_gives_the_job_back() {
        let dir = tempfile::tempdir().unwrap();
        let trace = Arc::new(Trace::default());
        let handlers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let shared = shared_with(&dir, stuck(&trace, false), handlers.handle().clone()).await;
        let workers = Arc::new(Semaphore::new(1));
        let (_supervisor, mut reports) = started(shared, Duration::from_secs(30), workers);
        until_started(&trace).await;
        handlers.shutdown_background();
        let done = tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .expect("a task dropped unfinished still reports")
            .unwrap();
        assert!(
            matches!(done.outcome, Finalization::Requeue { delay } if delay.is_zero()),
            "{:?}",
            done.outcome
        );
    }
}
