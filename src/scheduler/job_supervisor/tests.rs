//! The job supervisor's tests: a supervisor run alone; its peer is a
//! `Recipient<JobFinished>`, here a stub that hands each report to the test, with no lease
//! manager, fetcher or database write involved.

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
        hooks: None,
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
        start_within_us: None,
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
