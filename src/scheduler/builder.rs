//! [`SchedulerBuilder`]: queues, handlers and settings of one node, validated before
//! anything starts; [`SchedulerBuilder::start`] wires the actors and hands back the
//! [`SchedulerHandle`].

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::prelude::*;

use crate::backoff::RetryPolicy;
use crate::client::Client;
use crate::clock::{Clock, SystemClock};
use crate::config::{QueueConfig, SchedulerConfig};
use crate::error::{Error, Result};
use crate::handler::{Erased, JobHandler};
use crate::job::NewJob;
use crate::lease::NodeId;
use crate::schedule::Schedule;
use crate::store::Store;

use super::archiver::Archiver;
use super::event::EventBus;
use super::fetcher::{Fetcher, Wake};
use super::handle::SchedulerHandle;
use super::leader_elector::LeaderElector;
use super::leader_term::LeaderTerm;
use super::lease_manager::{self, LeaseManager};
use super::queue_watch::QueueWatch;
use super::reconciler::Reconciler;
use super::registrar::Registrar;
use super::root::{HandlerRuntime, NodeActors, Scheduler};
use super::shared::{Registered, Shared};
use super::start_hold::StartHold;
use super::stats::Stats;
use super::sweeper::Sweeper;

/// Builds a scheduler: queues, handlers, settings. See [`Scheduler::builder`].
pub struct SchedulerBuilder {
    store: Store,
    config: SchedulerConfig,
    queues: Vec<(String, QueueConfig)>,
    handlers: HashMap<String, Registered>,
    duplicate_kind: Option<String>,
    reconcilers: Vec<Reconciler>,
    schedules: Vec<Schedule>,
    clock: Arc<dyn Clock>,
    node: Option<NodeId>,
    /// Handlers run on the runtime the node starts on, not on threads of their own
    /// (simulation only: [`SchedulerBuilder::handlers_on_current_runtime`]).
    handlers_here: bool,
    /// The application's hooks, if registered ([`SchedulerBuilder::hooks`]).
    hooks: Option<crate::hooks::Hooks>,
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
    #[doc(hidden)]
    #[cfg(feature = "test-util")]
    /// Runs the handlers on the runtime the node starts on (the actors' own, one thread)
    /// instead of a multi-threaded runtime of their own: a simulation that drives every
    /// node on one thread then decides the order of everything the handlers do. Not for
    /// production: a handler that blocks stops the actors.
    pub fn handlers_on_current_runtime(mut self) -> Self {
        self.handlers_here = true;
        self
    }

    /// Adds a queue to work on, with its settings.
    pub fn queue(mut self, name: impl Into<String>, config: QueueConfig) -> Self {
        self.queues.push((name.into(), config));
        self
    }

    /// Registers the handler for a job kind.
    pub fn handler<H: JobHandler>(self, kind: impl Into<String>, handler: H) -> Self {
        self.register(kind.into(), handler, None)
    }

    /// Registers the handler of a [`JobArgs`](crate::JobArgs) type, under its kind: the
    /// kind comes from the handler's payload type, never spelled here.
    ///
    /// ```no_run
    /// # fn demo(store: jobvisor::Store) -> jobvisor::Result<()> {
    /// use jobvisor::{handler_fn, JobArgs, JobOutcome, Scheduler};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Resize { image: u64 }
    /// impl JobArgs for Resize { const KIND: &'static str = "resize"; }
    ///
    /// let scheduler = Scheduler::builder(store)
    ///     .handle(handler_fn(|r: Resize, _ctx| async move { JobOutcome::success(r.image) }))
    ///     .start()?;
    /// # Ok(()) }
    /// ```
    pub fn handle<A, H>(self, handler: H) -> Self
    where
        A: crate::JobArgs,
        H: JobHandler<Payload = A>,
    {
        self.register(A::KIND.to_string(), handler, None)
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

    /// Registers a **reconciler**: `expected` returns the jobs that should exist now —
    /// typically one per row of your own table still awaiting work — and, every `every` (at
    /// least [`MIN_RECONCILE_INTERVAL`](crate::scheduler::MIN_RECONCILE_INTERVAL)), the
    /// database's leader calls it and enqueues those missing (a job lost because it was
    /// enqueued outside the transaction that created its row, or deleted by hand).
    ///
    /// Every job it returns needs a [`unique_key`](NewJob::unique_key): a job whose key is
    /// held (waiting, running, retrying — or, by its
    /// [`unique_scope`](NewJob::unique_scope), kept until archived) counts as present, so a
    /// pass re-creates each missing job once however often it runs. What "missing" means
    /// follows the key's scope: with the default
    /// ([`UntilArchived`](crate::UniqueScope::UntilArchived)) a finished job still holds its
    /// key until archived, so a row the function keeps returning gets no second job before
    /// then; with [`WhileActive`](crate::UniqueScope::WhileActive) or
    /// [`For`](crate::UniqueScope::For) a finished job frees its key and the next pass
    /// enqueues the job again. So return only the rows that still need work (the handler
    /// marks its row done, as `welcomed_at` below). A pass that fails (the
    /// function returns an error, panics or has not answered within `every`, a job has no
    /// key, the enqueue fails) is reported
    /// as [`Event::ReconcileFailed`](crate::Event::ReconcileFailed) and retried after 1 s,
    /// doubling up to `every`; a pass that succeeds, as
    /// [`Event::Reconciled`](crate::Event::Reconciled) with how many jobs it re-created. The
    /// function runs on the handler threads and gets the node's [`Client`](crate::Client).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use jobvisor::{NewJob, Scheduler, Store, QueueConfig};
    /// # fn signups_without_welcome_mail() -> Vec<i64> { vec![] }
    /// # fn f(store: Store) -> jobvisor::Result<()> {
    /// let node = Scheduler::builder(store)
    ///     .queue("default", QueueConfig::default())
    ///     # .handler("welcome", jobvisor::handler_fn(|_: serde_json::Value, _ctx| async { jobvisor::JobOutcome::success(()) }))
    ///     .reconciler("welcome-mails", Duration::from_secs(60), |_client| async {
    ///         // e.g. SELECT id FROM users WHERE welcomed_at IS NULL
    ///         let jobs = signups_without_welcome_mail()
    ///             .into_iter()
    ///             .map(|user| {
    ///                 NewJob::new("welcome", serde_json::json!({ "user": user }))
    ///                     .unique_key(format!("user:{user}"))
    ///             })
    ///             .collect();
    ///         Ok::<_, std::io::Error>(jobs)
    ///     })
    ///     .start()?;
    /// # Ok(()) }
    /// ```
    pub fn reconciler<F, Fut, E>(
        mut self,
        name: impl Into<String>,
        every: Duration,
        expected: F,
    ) -> Self
    where
        F: Fn(Client) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::result::Result<Vec<NewJob>, E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        self.reconcilers
            .push(Reconciler::new(name.into(), every, expected));
        self
    }

    /// Declares a periodic job ([`Schedule`]): stored in the database when the node starts
    /// (a new schedule first fires after that; an unchanged one keeps its next fire, so
    /// fires missed while no node ran follow its [`MissedFires`](crate::MissedFires)
    /// policy; a changed expression or zone starts afresh), and fired by whichever node
    /// leads the database — exactly one job per fire, keyed `schedule:<name>@<instant>`.
    /// A running node declares its schedules again every
    /// [`DECLARE_EVERY`](crate::schedule::DECLARE_EVERY); a node that declares schedules
    /// retires the stored ones nobody has declared for
    /// [`RETIRE_AFTER`](crate::schedule::RETIRE_AFTER) — so during a rolling deploy a node of
    /// the older release cannot retire a schedule the newer ones declare — and a node that
    /// declares none retires nothing (to stop a schedule no code declares any more, pause
    /// it). A retired schedule declared again starts afresh: the time it was retired is not
    /// caught up. Bad schedules (an invalid cron expression, an unknown time zone, an interval
    /// under 1 s, an expression that never fires again, a job with a unique key, a unique
    /// scope or a `run_at`, or over 60 KiB, a name over 128 bytes or declared twice) are
    /// refused by [`start`](Self::start) with an error naming the schedule.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use jobvisor::{NewJob, Scheduler, Store, QueueConfig, Schedule};
    /// # fn f(store: Store) -> jobvisor::Result<()> {
    /// let node = Scheduler::builder(store)
    ///     .queue("default", QueueConfig::default())
    ///     # .handler("cleanup", jobvisor::handler_fn(|_: serde_json::Value, _ctx| async { jobvisor::JobOutcome::success(()) }))
    ///     .periodic(Schedule::every("cleanup", Duration::from_secs(300), NewJob::new("cleanup", serde_json::json!({}))))
    ///     .start()?;
    /// # Ok(()) }
    /// ```
    pub fn periodic(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
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

    /// Registers the application's [`JobHooks`](crate::hooks::JobHooks) (once; a later
    /// call replaces them): they wrap every attempt this node runs, and see every enqueue of
    /// its client ([`SchedulerHandle::client`](crate::SchedulerHandle::client), its
    /// handlers' [`JobContext::client`](crate::JobContext::client) and transactions). A client
    /// made elsewhere takes them with [`Client::with_hooks`]. Example on
    /// [`JobHooks`](crate::hooks::JobHooks).
    pub fn hooks<H: crate::hooks::JobHooks>(mut self, hooks: H) -> Self {
        self.hooks = Some(crate::hooks::erase(hooks));
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
        let mut names = std::collections::HashSet::new();
        for sch in &self.schedules {
            sch.compile()?;
            if !names.insert(sch.name()) {
                return Err(Error::Config {
                    field: "schedules",
                    reason: format!("schedule {:?} is declared twice", sch.name()),
                });
            }
            // Legal (another node may run them), but usually a mistake worth saying.
            let kind = sch.job_kind();
            if !self.handlers.contains_key(kind) {
                tracing::warn!(
                    schedule = sch.name(),
                    kind,
                    "this node declares a schedule whose kind it has no handler for: its jobs \
                     wait for a node that has one"
                );
            }
        }
        let mut names = std::collections::HashSet::new();
        for r in &self.reconcilers {
            r.validate()?;
            if !names.insert(&r.name) {
                return Err(Error::Config {
                    field: "reconcilers",
                    reason: format!("reconciler {:?} is registered twice", r.name),
                });
            }
        }
        for (kind, reg) in &self.handlers {
            crate::new_job::check_name("kind", kind, crate::job::MAX_KIND_LEN).map_err(|e| {
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

    /// Validates the settings and starts the node's actors.
    ///
    /// * **Inside an actix system** (`#[actix::main]`, `#[actix_web::main]`, `#[actix::test]`)
    ///   the actors start on the current arbiter, beside the application's own.
    /// * **Anywhere else** — under `#[tokio::main]` (axum, tonic, plain tokio), in a plain
    ///   thread, or in a synchronous `main` — they start on a dedicated actix system of their
    ///   own, on a thread named `jobvisor-actors`; the handle, its [`Client`](crate::Client)
    ///   and [`SchedulerHandle::shutdown`] work from any runtime. Shutdown stops the actors;
    ///   the thread then idles for the life of the process, because it drives the database
    ///   connections its actors opened, which the store's pool shares with the application's
    ///   clients. A handle dropped without shutdown leaves the actors running (leases are
    ///   renewed meanwhile) until the process exits.
    ///
    /// Either way handlers run on a multi-threaded tokio runtime of their own (threads named
    /// `jobvisor-handler`, [`SchedulerConfig::handler_threads`] of them), never on the
    /// actors' thread nor on the caller's runtime: `tokio::spawn` inside a handler works,
    /// `actix::spawn` does not (there is no arbiter there); to enqueue follow-up work, use
    /// [`JobContext::client`](crate::JobContext::client).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo() -> jobvisor::Result<()> {
    /// use jobvisor::{handler_fn, JobOutcome, QueueConfig, Scheduler, Store};
    ///
    /// // Under #[tokio::main]: the actors get a thread of their own.
    /// let store = Store::connect("sqlite://jobs.db").await?;
    /// let scheduler = Scheduler::builder(store)
    ///     .queue("default", QueueConfig::default())
    ///     .handler("hello", handler_fn(|_: serde_json::Value, _ctx| async {
    ///         JobOutcome::success("hi")
    ///     }))
    ///     .start()?;
    /// // ... serve requests, enqueue with scheduler.client() ...
    /// scheduler.shutdown().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad setting; nothing is started then.
    pub fn start(self) -> Result<SchedulerHandle> {
        self.validate()?;
        let in_actix =
            actix::System::try_current().is_some() && tokio::runtime::Handle::try_current().is_ok();
        if in_actix {
            self.start_here(false)
        } else {
            self.start_on_own_system()
        }
    }

    /// Starts a dedicated actix system on a thread of its own and the actors on it.
    fn start_on_own_system(self) -> Result<SchedulerHandle> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("jobvisor-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                let started = system.block_on(async move { self.start_here(true) });
                let ok = started.is_ok();
                // The caller waits on the other end; if it is gone there is nobody to serve.
                if tx.send(started).is_ok() && ok {
                    if let Err(e) = system.run() {
                        tracing::error!(error = %e, "the jobvisor actor system ended with an error");
                    }
                }
            })
            .map_err(|e| Error::Config {
                field: "runtime",
                reason: format!("cannot start the jobvisor-actors thread: {e}"),
            })?;
        rx.recv().map_err(|_| Error::Config {
            field: "runtime",
            reason: "the jobvisor-actors thread ended before the scheduler started".into(),
        })?
    }

    /// Starts the actors on the current arbiter; `own_system`: that arbiter's system is
    /// jobvisor's own (logged).
    fn start_here(self, own_system: bool) -> Result<SchedulerHandle> {
        let rt = if self.handlers_here {
            None
        } else {
            Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(self.config.handler_threads)
                    .thread_name("jobvisor-handler")
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Config {
                        field: "handler_threads",
                        reason: format!("cannot start the handler threads: {e}"),
                    })?,
            )
        };
        // A handler's panic is stored with where it was raised (`panic_site.rs`).
        super::panic_site::install();
        let handler_rt = rt
            .as_ref()
            .map_or_else(tokio::runtime::Handle::current, |rt| rt.handle().clone());
        // The node's client wakes its fetchers on enqueue; they exist only further down, so
        // it looks them up once set (weakly: a client kept after shutdown keeps no actor).
        let wakers: Arc<OnceLock<HashMap<String, actix::WeakRecipient<Wake>>>> = Arc::default();
        let lookup = wakers.clone();
        let client = Client::with_clock(self.store.clone(), self.clock.clone()).with_wake(
            Arc::new(move |queue: &str| {
                if let Some(r) = lookup.get().and_then(|m| m.get(queue)?.upgrade()) {
                    r.do_send(Wake);
                }
            }),
        );
        let schedules = self
            .schedules
            .iter()
            .map(Schedule::compile)
            .collect::<Result<Vec<_>>>()?;
        // Stored by the schedule loop, which runs only with timers; without either there is
        // nothing to wait for.
        let (schedules_stored, declared) =
            tokio::sync::watch::channel(schedules.is_empty() || !self.config.timers);
        let mut client = client.with_declared(declared);
        client.set_hooks(self.hooks.clone());
        let node = self.node.unwrap_or_else(NodeId::random);
        let mut kinds: Vec<String> = self.handlers.keys().cloned().collect();
        kinds.sort_unstable();
        let shared = Arc::new(Shared {
            store: self.store,
            clock: self.clock,
            node,
            config: self.config,
            queues: self.queues.iter().cloned().collect(),
            handlers: self.handlers.into_iter().collect(),
            kinds,
            events: EventBus::new(),
            handler_rt,
            stats: Stats::default(),
            start_hold: StartHold::default(),
            client,
            leader: LeaderTerm::default(),
            reconcilers: self.reconcilers,
            schedules,
            schedules_stored,
            queue_gates: self
                .queues
                .iter()
                .map(|(name, _)| (name.clone(), Arc::default()))
                .collect(),
            hooks: self.hooks,
        });
        let lease_manager = LeaseManager::new(shared.clone()).start();
        let mut fetchers = HashMap::new();
        for (name, q) in &self.queues {
            let f = Fetcher::new(
                shared.clone(),
                name.clone(),
                q.clone(),
                lease_manager.clone().recipient(),
                lease_manager.clone().recipient(),
            )
            .start();
            fetchers.insert(name.clone(), f);
        }
        let slots = fetchers
            .iter()
            .map(|(q, f)| (q.clone(), f.clone().recipient()))
            .collect();
        lease_manager.do_send(lease_manager::RegisterFetchers(slots));
        let weak = fetchers
            .iter()
            .map(|(q, f)| (q.clone(), f.clone().recipient::<Wake>().downgrade()))
            .collect();
        // Set exactly once, here.
        let _ = wakers.set(weak);
        let watch = QueueWatch::new(
            shared.clone(),
            fetchers
                .iter()
                .map(|(q, f)| (q.clone(), f.clone().recipient()))
                .collect(),
            fetchers
                .iter()
                .map(|(q, f)| (q.clone(), f.clone().recipient()))
                .collect(),
            lease_manager.clone().recipient(),
            lease_manager.clone().recipient(),
        )
        .start();
        let sweeper = Sweeper::new(shared.clone()).start();
        let archiver = Archiver::new(shared.clone()).start();
        let registrar = Registrar::new(shared.clone()).start();
        let elector = LeaderElector::new(shared.clone()).start();
        let scheduler = Scheduler::new(
            shared.clone(),
            NodeActors {
                fetchers: fetchers.clone(),
                lease_manager: lease_manager.clone(),
                sweeper: sweeper.clone(),
                archiver: archiver.clone(),
                registrar: registrar.clone(),
                elector: elector.clone(),
                watch: watch.clone(),
            },
            HandlerRuntime(rt),
        )
        .start();
        tracing::info!(node = %shared.node, queues = fetchers.len(), own_system, "scheduler started");
        Ok(SchedulerHandle {
            scheduler,
            fetchers,
            lease_manager,
            sweeper,
            archiver,
            registrar,
            elector,
            watch,
            shared,
        })
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
            reconcilers: Vec::new(),
            schedules: Vec::new(),
            clock: Arc::new(SystemClock),
            node: None,
            handlers_here: false,
            hooks: None,
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};

    use crate::{handler_fn, JobOutcome, NewJob, Schedule, Scheduler, Store};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_schedule_of_a_kind_without_a_handler_is_reported_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect_with(&url, crate::StoreOptions::default().migrate(true))
            .await
            .unwrap();
        let builder = Scheduler::builder(store)
            .queue("default", crate::QueueConfig::default())
            .handler(
                "known",
                handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::done() }),
            )
            .periodic(Schedule::every(
                "nightly",
                std::time::Duration::from_secs(60),
                NewJob::new("report", serde_json::json!({})),
            ));
        let buf = Buf::default();
        let w = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || builder.validate().unwrap());
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(
            out.contains("WARN") && out.contains("nightly") && out.contains("report"),
            "{out}"
        );
    }
}
