//! The runtime: actix actors that claim jobs, run them under supervision and write every
//! state change through the store (DESIGN §5).
//!
//! * [`Scheduler`] (this file) builds and wires the others, owns every interval timer, and
//!   runs graceful shutdown.
//! * [`Fetcher`] (one per queue) claims up to its free slots whenever woken.
//! * [`JobSupervisor`] (one per running job) runs the handler on the handler threads, enforces
//!   timeout, cancel and lease loss, and reports the outcome.
//! * [`LeaseManager`] (one per node) renews all leases in one statement per heartbeat, tells
//!   supervisors when a lease is lost or about to expire, and batches finalizations.
//! * [`Sweeper`] and [`Archiver`] do bounded maintenance batches.
//!
//! Actors hold no connection and build no SQL: they call the [`Store`]. All of them run on
//! the arbiter that called [`SchedulerBuilder::start`]; handlers run on a separate
//! multi-threaded runtime so a slow or CPU-heavy handler never delays a claim or a renewal.
//! Durability never depends on actix supervision: a message lost with a crashed process is
//! recovered by lease expiry and the sweeper.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::broadcast;

use crate::backoff::RetryPolicy;
use crate::clock::{Clock, SystemClock};
use crate::config::{QueueConfig, SchedulerConfig};
use crate::error::{Error, Result};
use crate::handler::{Erased, ErasedHandler, JobHandler};
use crate::lease::NodeId;
use crate::store::Store;

mod archiver;
mod event;
mod fetcher;
mod job_supervisor;
mod lease_manager;
mod sweeper;

pub use archiver::{ArchiveNow, ArchiveReport, Archiver, VACUUM_AFTER_MOVED};
pub use event::{Event, EVENT_BUFFER};
pub use fetcher::{
    FetchNow, Fetcher, FetcherStatus, GetFetcherStatus, SlotFreed, StopClaiming, Wake,
    PREFETCH_MAX_WAIT,
};
pub use job_supervisor::{JobSupervisor, StopJob, StopReason};
pub use lease_manager::{
    CheckDeadlines, FlushFinalizations, GetLeaseManagerStatus, JobFinished, LeaseManager,
    LeaseManagerStatus, ReleaseAll, RenewLeases, RenewReport, TokenOf, TrackLease, TrackLeases,
};
pub use sweeper::{SweepNow, Sweeper};

pub(crate) use event::EventBus;

/// A registered handler with its own retry policy, if any.
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) retry: Option<RetryPolicy>,
}

/// What every actor of one node shares (read-only after start).
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) node: NodeId,
    pub(crate) config: SchedulerConfig,
    pub(crate) queues: HashMap<String, QueueConfig>,
    pub(crate) handlers: HashMap<String, Registered>,
    pub(crate) events: EventBus,
    /// Where handlers run: never the actors' arbiter.
    pub(crate) handler_rt: tokio::runtime::Handle,
    /// Running totals, readable from any thread.
    pub(crate) stats: Stats,
}

/// Running totals of one node (monotonic counters, cheap to read from any thread).
#[derive(Debug, Default)]
pub struct Stats {
    claimed: std::sync::atomic::AtomicU64,
    finished: std::sync::atomic::AtomicU64,
    lease_lost: std::sync::atomic::AtomicU64,
    claim_statements: std::sync::atomic::AtomicU64,
    finalize_statements: std::sync::atomic::AtomicU64,
    renew_statements: std::sync::atomic::AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Jobs claimed by this node.
    pub claimed: u64,
    /// Finalizations written (succeeded, retrying, dead, cancelled, requeued).
    pub finished: u64,
    /// Jobs whose lease this node found lost (renewal or finalization refused, or fenced).
    pub lease_lost: u64,
    /// Claim statements sent (each claims a batch).
    pub claim_statements: u64,
    /// Finalization statements sent (each writes a batch).
    pub finalize_statements: u64,
    /// Renewal statements sent (one per heartbeat).
    pub renew_statements: u64,
}

impl Stats {
    pub(crate) fn add_claimed(&self, n: u64) {
        self.claimed
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn add_finished(&self, n: u64) {
        self.finished
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn add_lease_lost(&self, n: u64) {
        self.lease_lost
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn count_claim(&self) {
        self.claim_statements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn count_finalize(&self) {
        self.finalize_statements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn count_renew(&self) {
        self.renew_statements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn snapshot(&self) -> StatsSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        StatsSnapshot {
            claimed: self.claimed.load(Relaxed),
            finished: self.finished.load(Relaxed),
            lease_lost: self.lease_lost.load(Relaxed),
            claim_statements: self.claim_statements.load(Relaxed),
            finalize_statements: self.finalize_statements.load(Relaxed),
            renew_statements: self.renew_statements.load(Relaxed),
        }
    }
}

impl Shared {
    /// The retry policy for a job: its kind's, else its queue's, else the node's.
    pub(crate) fn retry_policy(&self, kind: &str, queue: &str) -> RetryPolicy {
        self.handlers
            .get(kind)
            .and_then(|h| h.retry)
            .or_else(|| self.queues.get(queue).and_then(|q| q.retry))
            .unwrap_or(self.config.retry)
    }
}

/// Owns the handler runtime; shutting it down without blocking the arbiter on drop.
struct HandlerRuntime(Option<tokio::runtime::Runtime>);

impl Drop for HandlerRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Builds a scheduler: queues, handlers, settings. See [`Scheduler::builder`].
pub struct SchedulerBuilder {
    store: Store,
    config: SchedulerConfig,
    queues: Vec<(String, QueueConfig)>,
    handlers: HashMap<String, Registered>,
    duplicate_kind: Option<String>,
    clock: Arc<dyn Clock>,
    node: Option<NodeId>,
}

impl std::fmt::Debug for SchedulerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerBuilder")
            .field("queues", &self.queues)
            .field("kinds", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl SchedulerBuilder {
    /// Adds a queue to work on, with its settings.
    pub fn queue(mut self, name: impl Into<String>, config: QueueConfig) -> Self {
        self.queues.push((name.into(), config));
        self
    }

    /// Registers the handler for a job kind.
    pub fn handler<H: JobHandler>(self, kind: impl Into<String>, handler: H) -> Self {
        self.register(kind.into(), handler, None)
    }

    /// Registers the handler for a job kind, with a retry policy of its own.
    pub fn handler_with_retry<H: JobHandler>(
        self,
        kind: impl Into<String>,
        handler: H,
        retry: RetryPolicy,
    ) -> Self {
        self.register(kind.into(), handler, Some(retry))
    }

    fn register<H: JobHandler>(mut self, kind: String, h: H, retry: Option<RetryPolicy>) -> Self {
        let reg = Registered {
            handler: Arc::new(Erased(h)),
            retry,
        };
        if self.handlers.insert(kind.clone(), reg).is_some() {
            self.duplicate_kind.get_or_insert(kind);
        }
        self
    }

    /// Replaces the node-wide settings.
    pub fn config(mut self, config: SchedulerConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses another clock (a [`ManualClock`](crate::clock::ManualClock) in simulation).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Names this node (default: random).
    pub fn node_id(mut self, node: NodeId) -> Self {
        self.node = Some(node);
        self
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn has_queues(&self) -> bool {
        !self.queues.is_empty()
    }

    fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.queues.is_empty() {
            return Err(Error::Config {
                field: "queues",
                reason: "no queue configured; add one with .queue(name, QueueConfig::default())"
                    .into(),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for (name, q) in &self.queues {
            q.validate(name)?;
            if !seen.insert(name) {
                return Err(Error::Config {
                    field: "queues",
                    reason: format!("queue {name:?} is configured twice"),
                });
            }
        }
        if self.handlers.is_empty() {
            return Err(Error::Config {
                field: "handlers",
                reason: "no handler registered; add one with .handler(kind, handler)".into(),
            });
        }
        if let Some(kind) = &self.duplicate_kind {
            return Err(Error::Config {
                field: "handlers",
                reason: format!("kind {kind:?} has two handlers"),
            });
        }
        for (kind, reg) in &self.handlers {
            crate::job::check_name("kind", kind, crate::job::MAX_KIND_LEN).map_err(|e| {
                Error::Config {
                    field: "handlers",
                    reason: e.to_string(),
                }
            })?;
            if let Some(r) = &reg.retry {
                r.validate()?;
            }
        }
        Ok(())
    }

    /// Validates the settings and starts the actors on the current actix arbiter.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad setting; nothing is started then.
    ///
    /// # Panics
    /// Outside an actix system (there is no arbiter to start the actors on).
    pub fn start(self) -> Result<SchedulerHandle> {
        self.validate()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.config.handler_threads)
            .thread_name("jobvisor-handler")
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                field: "handler_threads",
                reason: format!("cannot start the handler threads: {e}"),
            })?;
        let node = self.node.unwrap_or_else(NodeId::random);
        let shared = Arc::new(Shared {
            store: self.store,
            clock: self.clock,
            node,
            config: self.config,
            queues: self.queues.iter().cloned().collect(),
            handlers: self.handlers,
            events: EventBus::new(),
            handler_rt: rt.handle().clone(),
            stats: Stats::default(),
        });
        let lease_manager = LeaseManager::new(shared.clone()).start();
        let mut fetchers = HashMap::new();
        for (name, q) in &self.queues {
            let f = Fetcher::new(
                shared.clone(),
                name.clone(),
                q.clone(),
                lease_manager.clone(),
            )
            .start();
            fetchers.insert(name.clone(), f);
        }
        lease_manager.do_send(lease_manager::RegisterFetchers(fetchers.clone()));
        let sweeper = Sweeper::new(shared.clone()).start();
        let archiver = Archiver::new(shared.clone()).start();
        let scheduler = Scheduler {
            shared: shared.clone(),
            fetchers: fetchers.clone(),
            lease_manager: lease_manager.clone(),
            sweeper: sweeper.clone(),
            archiver: archiver.clone(),
            timers: Vec::new(),
            runtime: Some(HandlerRuntime(Some(rt))),
        }
        .start();
        tracing::info!(node = %shared.node, queues = fetchers.len(), "scheduler started");
        Ok(SchedulerHandle {
            scheduler,
            fetchers,
            lease_manager,
            sweeper,
            archiver,
            shared,
        })
    }
}

/// The node's root actor: owns the timers and the handler runtime; runs shutdown.
pub struct Scheduler {
    shared: Arc<Shared>,
    fetchers: HashMap<String, Addr<Fetcher>>,
    lease_manager: Addr<LeaseManager>,
    sweeper: Addr<Sweeper>,
    archiver: Addr<Archiver>,
    /// Interval timers, cancelled at shutdown.
    timers: Vec<SpawnHandle>,
    /// Dropped (shut down in the background) when the scheduler stops.
    runtime: Option<HandlerRuntime>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("node", &self.shared.node)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Starts building a scheduler on `store`.
    pub fn builder(store: Store) -> SchedulerBuilder {
        SchedulerBuilder {
            store,
            config: SchedulerConfig::default(),
            queues: Vec::new(),
            handlers: HashMap::new(),
            duplicate_kind: None,
            clock: Arc::new(SystemClock),
            node: None,
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.config.timers {
            return;
        }
        let cfg = self.shared.config.clone();
        for (name, f) in &self.fetchers {
            let every = self
                .shared
                .queues
                .get(name)
                .map_or(cfg.deadline_check_every, |q| q.poll_interval);
            let f = f.clone();
            f.do_send(FetchNow);
            self.timers
                .push(ctx.run_interval(every, move |_, _| f.do_send(FetchNow)));
        }
        let lm = self.lease_manager.clone();
        self.timers
            .push(ctx.run_interval(cfg.renew_every, move |_, _| lm.do_send(RenewLeases)));
        let lm = self.lease_manager.clone();
        self.timers
            .push(ctx.run_interval(cfg.deadline_check_every, move |_, _| {
                lm.do_send(CheckDeadlines)
            }));
        let sw = self.sweeper.clone();
        self.timers
            .push(ctx.run_interval(cfg.sweep_every, move |_, _| sw.do_send(SweepNow)));
        let ar = self.archiver.clone();
        self.timers
            .push(ctx.run_interval(cfg.archive_every, move |_, _| ar.do_send(ArchiveNow)));
        let wakers: HashMap<String, Recipient<Wake>> = self
            .fetchers
            .iter()
            .map(|(q, a)| (q.clone(), a.clone().recipient()))
            .collect();
        let listener = listen_loop(self.shared.clone(), wakers);
        self.timers.push(ctx.spawn(fut::wrap_future(listener)));
    }
}

/// First pause before listening again after the connection failed; doubles up to the max.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest pause before listening again.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(10);

/// Wakes fetchers on database notifications (PostgreSQL), reconnecting with backoff; the
/// poll covers whatever is missed while disconnected, and every fetcher is woken once after
/// each (re)connect for the same reason. Ends at once on backends without notifications.
async fn listen_loop(shared: Arc<Shared>, wakers: HashMap<String, Recipient<Wake>>) {
    let mut pause = LISTEN_RETRY_MIN;
    let mut last_error = None;
    let every = Duration::from_secs(30);
    loop {
        match shared.store.listen().await {
            Ok(None) => return,
            Ok(Some(mut listener)) => {
                pause = LISTEN_RETRY_MIN;
                for w in wakers.values() {
                    w.do_send(Wake);
                }
                while let Some(item) = listener.next().await {
                    match item {
                        Ok(queue) => {
                            if let Some(w) = wakers.get(&queue) {
                                w.do_send(Wake);
                            }
                        }
                        Err(e) => {
                            report_store_error(
                                &shared.events,
                                "listener",
                                &mut last_error,
                                every,
                                &e,
                            );
                            break;
                        }
                    }
                }
            }
            Err(e) => report_store_error(&shared.events, "listener", &mut last_error, every, &e),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LISTEN_RETRY_MAX);
    }
}

/// Stop claiming, wait for running jobs up to `timeout`, give back the leases of the rest,
/// then stop every actor. Answers with what happened.
#[derive(Debug, Message)]
#[rtype(result = "ShutdownReport")]
pub struct Shutdown {
    /// How long to wait for running jobs.
    pub timeout: Duration,
}

/// What graceful shutdown did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Jobs that finished while shutdown waited.
    pub finished: usize,
    /// Jobs whose leases were given back (they run again promptly, elsewhere or later).
    pub released: usize,
}

/// Pause between checks while shutdown waits.
const SHUTDOWN_POLL: Duration = Duration::from_millis(20);

impl Handler<Shutdown> for Scheduler {
    type Result = ResponseActFuture<Self, ShutdownReport>;

    fn handle(&mut self, msg: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        for t in self.timers.drain(..) {
            ctx.cancel_future(t);
        }
        let fetchers: Vec<Addr<Fetcher>> = self.fetchers.values().cloned().collect();
        let lm = self.lease_manager.clone();
        let events = self.shared.events.clone();
        let started = Instant::now();
        let fut = async move {
            for f in &fetchers {
                let _ = f.send(StopClaiming).await;
            }
            let at_start = lm
                .send(GetLeaseManagerStatus)
                .await
                .map(|s| s.tracked)
                .unwrap_or(0);
            // Wait for running jobs (real time: this is the process shutting down).
            let deadline = Instant::now() + msg.timeout;
            loop {
                let s = lm.send(GetLeaseManagerStatus).await.unwrap_or_default();
                if s.tracked == 0 || Instant::now() >= deadline {
                    break;
                }
                lm.do_send(CheckDeadlines);
                tokio::time::sleep(SHUTDOWN_POLL).await;
            }
            let released = lm.send(ReleaseAll).await.unwrap_or(0);
            // Let the give-backs be written (they are finalizations like any other).
            let flush_deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let s = lm.send(GetLeaseManagerStatus).await.unwrap_or_default();
                if (s.tracked == 0 && s.pending == 0) || Instant::now() >= flush_deadline {
                    break;
                }
                lm.do_send(CheckDeadlines);
                tokio::time::sleep(SHUTDOWN_POLL).await;
            }
            let report = ShutdownReport {
                finished: at_start.saturating_sub(released),
                released,
            };
            events.emit(Event::ShutDown {
                finished: report.finished,
                released: report.released,
                took: started.elapsed(),
            });
            report
        };
        Box::pin(fut.into_actor(self).map(|report, act, ctx| {
            for f in act.fetchers.values() {
                f.do_send(StopActor);
            }
            act.lease_manager.do_send(StopActor);
            act.sweeper.do_send(StopActor);
            act.archiver.do_send(StopActor);
            act.runtime.take();
            ctx.stop();
            report
        }))
    }
}

/// Stops the receiving actor (sent by the scheduler at the end of shutdown).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopActor;

/// A running scheduler: its actors' addresses, its event stream, a client wired to wake its
/// fetchers, and shutdown.
#[derive(Clone)]
pub struct SchedulerHandle {
    scheduler: Addr<Scheduler>,
    fetchers: HashMap<String, Addr<Fetcher>>,
    lease_manager: Addr<LeaseManager>,
    sweeper: Addr<Sweeper>,
    archiver: Addr<Archiver>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerHandle")
            .field("node", &self.shared.node)
            .field("queues", &self.fetchers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl SchedulerHandle {
    /// A client whose enqueues wake this node's fetchers at once.
    pub fn client(&self) -> crate::client::Client {
        let wakers: HashMap<String, Recipient<Wake>> = self
            .fetchers
            .iter()
            .map(|(q, a)| (q.clone(), a.clone().recipient()))
            .collect();
        crate::client::Client::with_clock(self.shared.store.clone(), self.shared.clock.clone())
            .with_wake(Arc::new(move |queue: &str| {
                if let Some(r) = wakers.get(queue) {
                    r.do_send(Wake);
                }
            }))
    }

    /// Subscribes to the event stream.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// This node's running totals.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.shared.node
    }

    /// The store it works on.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Graceful shutdown with the configured timeout.
    pub async fn shutdown(&self) -> ShutdownReport {
        self.shutdown_within(self.shared.config.shutdown_timeout)
            .await
    }

    /// Graceful shutdown, waiting at most `timeout` for running jobs.
    pub async fn shutdown_within(&self, timeout: Duration) -> ShutdownReport {
        self.scheduler
            .send(Shutdown { timeout })
            .await
            .unwrap_or_default()
    }

    /// The fetcher of a queue (for tests driving it through its mailbox).
    pub fn fetcher(&self, queue: &str) -> Option<Addr<Fetcher>> {
        self.fetchers.get(queue).cloned()
    }

    /// The lease manager.
    pub fn lease_manager(&self) -> Addr<LeaseManager> {
        self.lease_manager.clone()
    }

    /// The sweeper.
    pub fn sweeper(&self) -> Addr<Sweeper> {
        self.sweeper.clone()
    }

    /// The archiver.
    pub fn archiver(&self) -> Addr<Archiver> {
        self.archiver.clone()
    }

    /// The scheduler actor.
    pub fn scheduler(&self) -> Addr<Scheduler> {
        self.scheduler.clone()
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
