//! JobSupervisor: one per running job. It runs the handler on the handler threads (never on
//! the actors' arbiter), turns a panic into a failure with code `panic`, reports the outcome
//! to the [`LeaseManager`] and stops.
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
//! Told to stop ([`StopJob`]) it signals and aborts the handler. On timeout it writes a
//! `timeout` failure, on release (shutdown) it gives the lease back, and on self-fencing (the
//! lease could not be renewed in time) it gives the job back as a `fenced` failure to run
//! again at once — each only once the handler has actually stopped, so the job can never run
//! here and on another node at once. A handler that does not stop within the grace period is
//! abandoned by the lease manager: its lease is no longer renewed and the sweeper reclaims
//! the job after it expires. On lease loss, or when the lease manager already gave an
//! unstarted job back, the supervisor reports nothing.
//!
//! Durability never depends on this actor: if the process dies with the job running, the
//! lease expires and the sweeper on any node reclaims the job.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinError};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::attempt::{us, Attempt};
use super::lease_manager::JobFinished;
use super::{Event, Shared, StopActor};
use crate::clock::Clock;
use crate::handler::{JobContext, JobError, JobOutcome, JobResult, Next};
use crate::job::{Job, JobFailure};
use crate::lease::LeaseToken;
use crate::metrics::KindMetrics;
use crate::store::Finalization;

/// Supervises one running job.
pub struct JobSupervisor {
    shared: Arc<Shared>,
    job: Job,
    /// The attempt's lease token, carried only to hand it back with the outcome: the lease
    /// manager holds the lease (renews, fences and gives it back); the token names which
    /// attempt the outcome is for.
    token: LeaseToken,
    /// The queue's worker permits: the handler starts only once it holds one.
    workers: Arc<Semaphore>,
    /// The attempt's start gate, shared with the lease manager: the timeout counts from the
    /// start it records, not from the claim, since a prefetched job may wait for a worker.
    attempt: Arc<Attempt>,
    /// Where the outcome goes: the lease manager (a `Recipient`, so a supervisor can be run
    /// alone in a test).
    finished: Recipient<JobFinished>,
    /// Signalled on cancel, timeout, lease loss and shutdown; handlers can await it.
    cancel: CancellationToken,
    /// Stops the handler task at its next await.
    abort: Option<AbortHandle>,
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
    /// Its queue and kind's handler instruments.
    metrics: Arc<KindMetrics>,
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
        attempt: Arc<Attempt>,
        finished: Recipient<JobFinished>,
        metrics: Arc<KindMetrics>,
    ) -> Self {
        JobSupervisor {
            metrics,
            shared,
            job,
            token,
            workers,
            attempt,
            finished,
            cancel: CancellationToken::new(),
            abort: None,
            cancel_requested: false,
            decided: None,
            fenced: false,
            done: false,
        }
    }

    fn failure(&self, code: &str, message: String) -> JobFailure {
        JobFailure::new(code, message, self.job.attempts)
            .at(self.shared.clock.now())
            .with_claim(self.token.claim())
    }

    /// A failed attempt: retry with backoff while attempts remain, else dead.
    fn failed(&self, err: &JobError) -> Finalization {
        let error = err
            .to_failure(self.job.attempts, self.shared.clock.now())
            .with_claim(self.token.claim());
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
        self.report_as(outcome, true, ctx);
    }

    fn report_as(&mut self, outcome: Finalization, started: bool, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        self.done = true;
        // The handler's transaction completed the job: whatever it returned afterwards (or
        // however it was stopped), the job is `succeeded` in the database with that result.
        let (outcome, written) = match self.attempt.completed() {
            Some(result) => {
                if !matches!(outcome, Finalization::Succeeded { .. }) {
                    tracing::warn!(
                        id = self.job.id.0,
                        kind = %self.job.kind,
                        "the handler completed its job in a transaction, then returned \
                         another outcome; the job stays succeeded"
                    );
                }
                (Finalization::Succeeded { result }, true)
            }
            None => (outcome, false),
        };
        self.finished.do_send(JobFinished {
            id: self.job.id,
            token: self.token.clone(),
            outcome,
            // The supervisor stops with this report: its job's names move into it.
            queue: std::mem::take(&mut self.job.queue),
            kind: std::mem::take(&mut self.job.kind),
            attempt: self.job.attempts,
            started,
            written,
        });
        ctx.stop();
    }

    fn withhold(&mut self, ctx: &mut Context<Self>) {
        self.done = true;
        ctx.stop();
    }

    fn handler_done(&mut self, res: Result<Ran, JoinError>, ctx: &mut Context<Self>) {
        if self.done {
            return;
        }
        if let Some(result) = self.attempt.completed() {
            // Completed in the handler's transaction: `report` says so, whatever came after.
            self.report(Finalization::Succeeded { result }, ctx);
            return;
        }
        let res = match res {
            // The lease might be gone before the handler started: give the job back, its
            // attempt not counted.
            Ok(Ran::NotStarted) => {
                let outcome = Finalization::Requeue {
                    delay: Duration::ZERO,
                };
                self.report_as(outcome, false, ctx);
                return;
            }
            Ok(Ran::Returned(r)) => Ok(r),
            // Stopped by its own task's lease watch: as if told to self-fence.
            Ok(Ran::Fenced) => {
                self.fenced = true;
                Ok(Err(JobError::retry("stopped: the lease ran short")))
            }
            Err(e) => Err(e),
        };
        if let Some(outcome) = self.decided.take() {
            self.report(outcome, ctx);
            return;
        }
        if self.fenced {
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
                    delay: Duration::ZERO,
                }
            }
        };
        self.report(outcome, ctx);
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

/// The message of a handler (or reconciler) task's panic.
pub(crate) fn panic_message(e: JoinError) -> String {
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
        // The handler's context takes the payload and the progress: the supervisor has no
        // further use for them (a copy of each would cost a deep clone per job).
        let mut job_ctx = JobContext::new(
            &mut self.job,
            self.shared.clock.now(),
            self.cancel.clone(),
            self.shared.client.clone(),
            self.attempt.clone(),
            self.token.clone(),
            self.shared.clock.clone(),
        );
        // OpenTelemetry's messaging conventions, so that tracing-opentelemetry exports a
        // consumer span named "process <queue>" with the standard attributes; what only a job
        // system has goes under `jobvisor.*`.
        let span = tracing::info_span!(
            "job",
            otel.name = %format_args!("process {}", self.job.queue),
            otel.kind = "consumer",
            messaging.system = "jobvisor",
            messaging.operation.type = "process",
            messaging.destination.name = %self.job.queue,
            messaging.message.id = self.job.id.0,
            jobvisor.job.kind = %self.job.kind,
            jobvisor.job.attempt = self.job.attempts,
            jobvisor.claim = %self.token.claim(),
            jobvisor.node = %self.shared.node,
        );
        let (workers, gate, shared) = (
            self.workers.clone(),
            self.attempt.clone(),
            self.shared.clone(),
        );
        let (id, attempt, kind) = (self.job.id, self.job.attempts, self.job.kind.clone());
        let claim = self.token.claim();
        let (metrics, due) = (self.metrics.clone(), self.job.run_at);
        let timeout = chrono::Duration::from_std(self.job.timeout).unwrap_or(chrono::Duration::MAX);
        let task = self.shared.handler_rt.spawn(
            async move {
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
                let ran = run_fenced(reg.handler.call(job_ctx), &gate, &*shared.clock).await;
                if matches!(ran, Ran::Fenced) && gate.fence() {
                    shared.events.emit(Event::SelfFenced { id, kind, claim });
                }
                metrics.handler_ran(t0.elapsed());
                ran
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
    /// The lease could not be renewed before it would expire: stop, then give the job back
    /// as a `fenced` failure once the handler has stopped.
    SelfFence,
    /// The handler never started and the lease manager gave the job back itself: stop and
    /// report nothing.
    Dropped,
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
            StopReason::SelfFence => self.fenced = true,
            StopReason::LeaseLost | StopReason::Dropped => self.withhold(ctx),
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
    use crate::job::{JobId, JobState};
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
        let url = format!("sqlite://{}", dir.path().join("alone.db").display());
        let options = crate::store::StoreOptions::default().migrate(true);
        let store = crate::store::Store::connect_with(&url, options)
            .await
            .unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let handler = handler_fn(|n: i64, _ctx| async move { JobOutcome::success(n * 2) });
        let handlers = HashMap::from([(
            "double".to_string(),
            Registered {
                handler: Arc::new(Erased(handler)),
                retry: None,
            },
        )]);
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
            handler_rt: tokio::runtime::Handle::current(),
            stats: Stats::default(),
            start_hold: StartHold::default(),
            leader: Default::default(),
            reconcilers: Vec::new(),
            schedules: Vec::new(),
            schedules_stored: tokio::sync::watch::Sender::new(true),
            queue_gates: HashMap::new(),
        })
    }

    fn job(payload: Value) -> Job {
        let now: DateTime<Utc> = Utc::now();
        Job {
            id: JobId(1),
            queue: "default".into(),
            kind: "double".into(),
            unique_key: None,
            unique_scope: None,
            unique_until: None,
            unique_held: false,
            partition: None,
            state: JobState::Running,
            priority: 0,
            payload,
            result: None,
            progress: None,
            last_error: None,
            errors: Vec::new(),
            attempts: 1,
            max_attempts: 3,
            run_at: now,
            timeout: Duration::from_secs(60),
            timeout_at: None,
            lease: None,
            version: 1,
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
            first_started_at: None,
            finished_at: None,
            archived_at: None,
            started_at: None,
            refunds: 0,
        }
    }

    async fn run_alone(shared: Arc<Shared>, valid_for: Duration) -> JobFinished {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let reports = Reports(tx).start();
        let lease = shared.config.lease;
        let fence_at = super::super::attempt::fence_point(shared.clock.monotonic(), lease);
        let attempt = Arc::new(Attempt::new(
            fence_at.saturating_sub(lease.saturating_sub(valid_for)),
        ));
        let _supervisor = JobSupervisor::new(
            shared,
            job(json!(21)),
            LeaseToken::generate(),
            Arc::new(Semaphore::new(1)),
            attempt,
            reports.recipient(),
            Arc::new(KindMetrics::new("default", "k")),
        )
        .start();
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap()
            .unwrap()
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
}
