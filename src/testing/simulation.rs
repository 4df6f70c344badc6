//! [`Simulation`]: a node under a [`ManualClock`] with no timers, driven through its actors'
//! mailboxes. The node reads time through the manual clock itself ([`Simulation::on_store`])
//! or through any [`Clock`] the test derives from it ([`Simulation::on_store_with_clock`]:
//! a node whose wall clock jumps or whose monotonic clock drifts, over the one instant the
//! simulation advances). The methods documented here are the stable surface (see the module docs of
//! [`testing`](super)); the hidden ones drive engine internals for jobvisor's own tests.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use tokio::sync::broadcast;

use super::TestDb;
use crate::client::Client;
use crate::clock::{Clock, ManualClock};
use crate::config::{QueueConfig, SchedulerConfig};
use crate::job::{JobId, JobState};
use crate::scheduler::archiver::{ArchiveNow, ArchiveReport};
use crate::scheduler::fetcher::{FetchNow, Fetcher};
use crate::scheduler::lease_manager::{CheckDeadlines, LeaseManager, RenewLeases, RenewReport};
use crate::scheduler::sweeper::SweepNow;
use crate::scheduler::{Event, Scheduler, SchedulerBuilder, SchedulerHandle};
use crate::store::params::{CancelParams, RetryParams};
use crate::store::{CancelOutcome, Guarded, Store};

/// Real-time safety net for waiting on events; only reached when something is broken.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Settings for simulation: no timers, a 30 s lease renewed every 10 s, two handler threads,
/// and a 1 s fixed retry backoff so tests can reason about `run_at`.
pub fn sim_config() -> SchedulerConfig {
    SchedulerConfig {
        timers: false,
        handler_threads: 2,
        retry: crate::backoff::RetryPolicy::fixed(Duration::from_secs(1)),
        ..SchedulerConfig::default()
    }
}

/// A running node under a manual clock, driven by the test: nothing happens until it asks
/// (no poll, no heartbeat, no sweep timers), so every step is deterministic.
pub struct Simulation {
    /// The node.
    pub handle: SchedulerHandle,
    /// The clock [`Simulation::advance`] moves: the one every statement of this node binds,
    /// unless the node reads time through a view of its own
    /// ([`Simulation::on_store_with_clock`]).
    pub clock: ManualClock,
    /// A client on the same store and clock (it wakes nothing: tests fetch explicitly).
    pub client: Client,
    events: broadcast::Receiver<Event>,
    /// Received but not yet matched by `next_event`.
    backlog: std::collections::VecDeque<Event>,
    seen: Vec<Event>,
    _db: Option<Arc<TestDb>>,
}

impl std::fmt::Debug for Simulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("node", self.handle.node_id())
            .finish_non_exhaustive()
    }
}

impl Simulation {
    /// A node on a fresh temp SQLite file with one queue `default` (concurrency 10); add
    /// handlers and settings in `configure`. Runs under `#[tokio::test]`,
    /// `#[actix_web::test]` or `#[actix::test]`. Needs the `sqlite` feature: a service on
    /// another backend uses [`Simulation::on_store`] with its own store.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn sqlite(
        configure: impl FnOnce(SchedulerBuilder) -> SchedulerBuilder,
    ) -> Simulation {
        let db = Arc::new(TestDb::create(crate::store::Backend::Sqlite).await);
        let store = db.store().await;
        let mut sim =
            Simulation::on_store(store, ManualClock::at_fixed_start(), "sim-node", configure);
        sim._db = Some(db);
        sim
    }

    /// A node named `node` on `store`, driven by `clock` (share one clock between nodes of
    /// one simulation); with no queue configured, one queue `default`. The store may be the
    /// service's own, on any backend (give each test a database of its own).
    ///
    /// ```no_run
    /// # async fn demo(store: jobvisor::Store) {
    /// use jobvisor::testing::{ManualClock, Simulation};
    /// use jobvisor::{handler_fn, JobOutcome, JobState, NewJob};
    ///
    /// let mut sim = Simulation::on_store(store, ManualClock::at_fixed_start(), "test", |b| {
    ///     b.handler("hello", handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::success("hi") }))
    /// });
    /// let id = sim.client.enqueue(NewJob::new("hello", serde_json::json!({}))).await.unwrap().id;
    /// assert_eq!(sim.fetch("default").await, 1);
    /// assert_eq!(sim.finished(id).await, JobState::Succeeded);
    /// # }
    /// ```
    pub fn on_store(
        store: Store,
        clock: ManualClock,
        node: &str,
        configure: impl FnOnce(SchedulerBuilder) -> SchedulerBuilder,
    ) -> Simulation {
        let node_clock = Arc::new(clock.clone());
        Simulation::on_store_with_clock(store, clock, node_clock, node, configure)
    }

    /// A node named `node` on `store` whose scheduler and client read time from
    /// `node_clock`, a view the test derives from `clock` (the instant it advances): its
    /// [`Clock::now`] may jump and its [`Clock::monotonic`] run fast or slow, while its
    /// [`Clock::bound_now`] — the database's time — should stay `clock`'s, shared by every
    /// node of the simulation.
    pub fn on_store_with_clock(
        store: Store,
        clock: ManualClock,
        node_clock: Arc<dyn Clock>,
        node: &str,
        configure: impl FnOnce(SchedulerBuilder) -> SchedulerBuilder,
    ) -> Simulation {
        let builder = Scheduler::builder(store.clone())
            .config(sim_config())
            .clock(node_clock.clone())
            .node_id(
                crate::lease::NodeId::new(node).unwrap_or_else(|_| crate::lease::NodeId::random()),
            );
        let builder = configure(builder);
        let builder = if builder.has_queues() {
            builder
        } else {
            builder.queue("default", QueueConfig::default())
        };
        let handle = builder
            .start()
            .unwrap_or_else(|e| panic!("simulation did not start: {e}"));
        let events = handle.events();
        Simulation {
            client: Client::with_clock(store, node_clock),
            clock,
            handle,
            events,
            backlog: std::collections::VecDeque::new(),
            seen: Vec::new(),
            _db: None,
        }
    }

    #[doc(hidden)]
    /// Keeps `db` alive as long as this simulation (for nodes sharing a test database).
    pub fn keep(mut self, db: Arc<TestDb>) -> Self {
        self._db = Some(db);
        self
    }

    #[doc(hidden)]
    /// The fetcher of `queue`.
    pub fn fetcher(&self, queue: &str) -> Addr<Fetcher> {
        self.handle
            .fetcher(queue)
            .unwrap_or_else(|| panic!("no queue {queue:?}"))
    }

    #[doc(hidden)]
    /// The lease manager.
    pub fn lease_manager(&self) -> Addr<LeaseManager> {
        self.handle.lease_manager()
    }

    #[doc(hidden)]
    /// This node's view of its queues' pauses, as its start gate reads it: the function
    /// answers whether the node knows `queue` paused (false for a queue it does not serve).
    pub fn pause_view(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        let shared = self.handle.shared.clone();
        move |queue| shared.queue_gates.get(queue).is_some_and(|g| g.paused())
    }

    /// Sends `FetchNow` to a queue's fetcher; answers how many jobs it claimed.
    pub async fn fetch(&self, queue: &str) -> usize {
        self.fetcher(queue).send(FetchNow).await.unwrap_or(0)
    }

    /// Reads the queues' shared settings and applies them, as a running node does when a
    /// notification or its change signal tells it of a change: a pause closes the queues'
    /// start gates and gives back the claimed jobs that have not started; a resume wakes
    /// the fetcher.
    ///
    /// # Panics
    /// If the read fails.
    pub async fn read_settings(&self) {
        self.try_read_settings()
            .await
            .expect("the settings could be read");
    }

    #[doc(hidden)]
    /// As [`read_settings`](Self::read_settings), answering a failed read (the node's view
    /// is then unchanged) instead of panicking.
    ///
    /// # Errors
    /// The read's error; [`Error::Database`](crate::Error::Database) if the queue watch is
    /// no longer running.
    pub async fn try_read_settings(&self) -> crate::Result<()> {
        self.handle
            .watch()
            .send(crate::scheduler::queue_watch::ReadSettings)
            .await
            .map_err(|_| {
                crate::Error::Database(crate::StoreError::Other(
                    "the queue watch is not running".into(),
                ))
            })?
    }

    #[doc(hidden)]
    /// Stops the lease manager, as the end of a shutdown does, whatever it is doing.
    pub fn stop_lease_manager(&self) {
        self.lease_manager().do_send(crate::scheduler::StopActor);
    }

    #[doc(hidden)]
    /// The runtime the node's handlers run on (a simulation waits for it to be idle).
    pub fn handler_runtime(&self) -> tokio::runtime::Handle {
        self.handle.shared.handler_rt.clone()
    }

    #[doc(hidden)]
    /// Stops every actor of the node at once, with no shutdown: nothing is given back or
    /// flushed (a crashed process's node, as far as its actors go; its store and handlers
    /// are the caller's to silence).
    pub fn crash(&self) {
        use crate::scheduler::StopActor;
        for f in self.handle.fetchers.values() {
            f.do_send(StopActor);
        }
        self.handle.lease_manager.do_send(StopActor);
        self.handle.sweeper.do_send(StopActor);
        self.handle.archiver.do_send(StopActor);
        self.handle.registrar.do_send(StopActor);
        self.handle.elector.do_send(StopActor);
        self.handle.watch.do_send(StopActor);
    }

    /// Sends the heartbeat.
    pub async fn renew(&self) -> RenewReport {
        self.lease_manager()
            .send(RenewLeases)
            .await
            .unwrap_or_default()
    }

    /// Checks deadlines; answers how many handlers were told to stop.
    pub async fn check_deadlines(&self) -> usize {
        self.lease_manager().send(CheckDeadlines).await.unwrap_or(0)
    }

    /// Sweeps; answers how many jobs were reclaimed.
    pub async fn sweep(&self) -> usize {
        self.handle.sweeper().send(SweepNow).await.unwrap_or(0)
    }

    #[doc(hidden)]
    /// Keeps or takes the database's leadership (the elector's tick); answers the term this
    /// node leads under afterwards.
    pub async fn elect(&self) -> Option<u64> {
        self.handle
            .elector()
            .send(crate::scheduler::Elect)
            .await
            .unwrap_or(None)
    }

    #[doc(hidden)]
    /// One gauge refresh by this node (the gauge loop's tick): it counts if it leads the
    /// database, reads otherwise. Answers whether it counted.
    pub async fn refresh_gauges(&self) -> crate::Result<bool> {
        let shared = &self.handle.shared;
        let mut gauges = crate::metrics::DatabaseGauges::new(
            shared.store.clone(),
            shared.node.as_str(),
            crate::metrics::DEFAULT_GAUGE_INTERVAL,
        )?;
        crate::scheduler::refresh_gauges(shared, &mut gauges).await
    }

    #[doc(hidden)]
    /// The gauges' last turn as stored: the instant it was taken (µs) and the node that
    /// took it.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub async fn gauge_turn(&self) -> crate::Result<(i64, Option<String>)> {
        let g = self.client.store().gauges_read().await?;
        Ok((g.computed_at, g.computed_by))
    }

    #[doc(hidden)]
    /// One pass of the reconciler `name` (its interval's tick), if this node leads the
    /// database: answers the [`Event::Reconciled`] or [`Event::ReconcileFailed`] it reported
    /// (each call counts failures from zero); `None` if it does not lead.
    ///
    /// # Panics
    /// If no reconciler is called `name`.
    pub async fn reconcile(&self, name: &str) -> Option<Event> {
        let shared = &self.handle.shared;
        let r = shared
            .reconcilers
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no reconciler {name:?}"));
        shared.leader.current(shared.clock.monotonic())?;
        Some(crate::scheduler::reconcile_pass(shared, r, &mut 0).await)
    }

    #[doc(hidden)]
    /// The dashboard's retry of a dead or cancelled job, pinned at the `version` its page
    /// showed: [`Guarded::Stale`](crate::store::Guarded::Stale) if the job changed since.
    /// Time is the simulation's clock.
    ///
    /// # Errors
    /// As [`Client::retry`], for a job in another state.
    pub async fn retry_at(&self, id: JobId, version: i64) -> crate::Result<Guarded<()>> {
        let p = RetryParams {
            id,
            expected_version: Some(version),
            now: self.clock.bound_now(),
        };
        Ok(match self.client.store().job_retry(p).await? {
            Guarded::Applied(_) => Guarded::Applied(()),
            Guarded::Stale => Guarded::Stale,
            Guarded::LeaseLost => Guarded::LeaseLost,
        })
    }

    #[doc(hidden)]
    /// The dashboard's cancel, pinned at `version`: `Applied` if it cancelled the job or
    /// requested its cancel, `Stale` if the job changed since or had already ended.
    ///
    /// # Errors
    /// As [`Client::cancel`].
    pub async fn cancel_at(&self, id: JobId, version: i64) -> crate::Result<Guarded<()>> {
        let p = CancelParams {
            id,
            now: self.clock.bound_now(),
        };
        Ok(
            match self
                .client
                .store()
                .job_cancel_guarded(p, Some(version))
                .await?
            {
                Ok((CancelOutcome::AlreadyFinished(_), _)) | Err(_) => Guarded::Stale,
                Ok(_) => Guarded::Applied(()),
            },
        )
    }

    #[doc(hidden)]
    /// The dashboard's delete of a finished job, pinned at `version`.
    ///
    /// # Errors
    /// A refusal for a job that is not finished; [`Error::NotFound`](crate::Error::NotFound).
    pub async fn delete_at(&self, id: JobId, version: i64) -> crate::Result<Guarded<()>> {
        self.client.store().job_delete_finished(id, version).await
    }

    #[doc(hidden)]
    /// Stores this node's declared schedules (what the node does once at start).
    pub async fn sync_schedules(&self) -> crate::Result<()> {
        crate::scheduler::sync_schedules(&self.handle.shared, crate::store::SyncMode::Start).await
    }

    #[doc(hidden)]
    /// Declares this node's schedules again (what a running node does every
    /// [`DECLARE_EVERY`](crate::schedule::DECLARE_EVERY)), retiring those nobody declared
    /// for [`RETIRE_AFTER`](crate::schedule::RETIRE_AFTER).
    pub async fn declare_schedules(&self) -> crate::Result<()> {
        crate::scheduler::sync_schedules(&self.handle.shared, crate::store::SyncMode::Refresh).await
    }

    #[doc(hidden)]
    /// Fires the due schedules (the firer's tick) if this node leads: answers how many jobs
    /// it enqueued, `None` if it does not lead.
    pub async fn fire_schedules(&self) -> crate::Result<Option<usize>> {
        crate::scheduler::fire_schedules(&self.handle.shared).await
    }

    #[doc(hidden)]
    /// Runs the node's schedule firer as a running node does — it fires the due schedules
    /// whenever this node leads, at each tick and as soon as it begins a term, and declares
    /// the node's schedules again every [`DECLARE_EVERY`](crate::schedule::DECLARE_EVERY) —
    /// but ticking every `tick` (real time; a simulation has no timers). Abort the answered
    /// task to stop it.
    pub fn spawn_schedule_firer(&self, tick: Duration) -> tokio::task::JoinHandle<()> {
        actix::spawn(crate::scheduler::schedule_loop(
            self.handle.shared.clone(),
            tick,
        ))
    }

    #[doc(hidden)]
    /// Refreshes this node's row in the node registry.
    pub async fn node_heartbeat(&self) {
        let _ = self
            .handle
            .registrar()
            .send(crate::scheduler::NodeHeartbeat)
            .await;
    }

    #[doc(hidden)]
    /// Looks for due jobs no live node can run; answers how many groups were reported (as
    /// [`Event::Unserved`](crate::Event::Unserved)).
    pub async fn check_unserved(&self) -> usize {
        self.handle
            .registrar()
            .send(crate::scheduler::CheckUnserved)
            .await
            .unwrap_or(0)
    }

    /// Archives and prunes.
    pub async fn archive(&self) -> ArchiveReport {
        self.handle
            .archiver()
            .send(ArchiveNow)
            .await
            .unwrap_or_default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// Waits for the first not-yet-matched event matching `pred`. Events that do not match
    /// stay available to later calls; all are listed in [`Simulation::seen`].
    pub async fn next_event(&mut self, pred: impl Fn(&Event) -> bool) -> Event {
        if let Some(i) = self.backlog.iter().position(&pred) {
            if let Some(e) = self.backlog.remove(i) {
                return e;
            }
        }
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let got = tokio::time::timeout_at(deadline, self.events.recv()).await;
            match got {
                Ok(Ok(e)) => {
                    self.seen.push(e.clone());
                    if pred(&e) {
                        return e;
                    }
                    self.backlog.push_back(e);
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => panic!(
                    "no matching event within {EVENT_TIMEOUT:?}; events seen: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits until job `id`'s finalization is written and answers the state it reached.
    pub async fn finished(&mut self, id: JobId) -> JobState {
        match self
            .next_event(|e| matches!(e, Event::Finished { id: i, .. } if *i == id))
            .await
        {
            Event::Finished { state, .. } => state,
            _ => unreachable!("filtered above"),
        }
    }

    /// Every event seen so far by [`Simulation::next_event`].
    pub fn seen(&self) -> &[Event] {
        &self.seen
    }
}
