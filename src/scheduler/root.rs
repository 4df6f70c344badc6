//! [`Scheduler`]: the node's root actor. It owns every interval timer and the handler
//! runtime, starts the database listener, and runs graceful shutdown ([`Shutdown`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::archiver::{ArchiveNow, Archiver};
use super::event::Event;
use super::fetcher::{FetchNow, Fetcher, StopClaiming, Wake};
use super::gauges::gauge_loop;
use super::leader_elector::{Elect, LeaderElector, Resign};
use super::lease_manager::{
    CheckDeadlines, GetLeaseManagerStatus, LeaseManager, ReleaseAll, RenewLeases,
};
use super::listen::listen_loop;
use super::queue_watch::QueueWatch;
use super::reconciler::reconcile_loop;
use super::registrar::{CheckUnserved, NodeHeartbeat, RefreshPeers, Registrar, Unregister};
use super::schedule_firer::{schedule_loop, SCHEDULE_TICK};
use super::shared::Shared;
use super::sweeper::{SweepNow, Sweeper};

/// Owns the handler runtime; shutting it down without blocking the arbiter on drop.
pub(crate) struct HandlerRuntime(pub(crate) Option<tokio::runtime::Runtime>);

/// Handler runtimes of schedulers that were shut down, kept for the life of the process.
static KEPT: std::sync::Mutex<Vec<tokio::runtime::Runtime>> = std::sync::Mutex::new(Vec::new());

impl HandlerRuntime {
    /// After graceful shutdown: no handler runs any more, but a connection a handler opened
    /// (through [`JobContext::client`](crate::JobContext::client)) sits in the store's pool,
    /// which the application goes on using, and is driven by this runtime — so it is kept,
    /// its threads idle, instead of being shut down under that connection.
    fn keep(mut self) {
        if let Some(rt) = self.0.take() {
            match KEPT.lock() {
                Ok(mut kept) => kept.push(rt),
                // Poisoned only by a panic while pushing; keeping it is all that matters.
                Err(poisoned) => poisoned.into_inner().push(rt),
            }
        }
    }
}

impl Drop for HandlerRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The node's other actors, as the root starts and stops them.
pub(crate) struct NodeActors {
    pub(crate) fetchers: HashMap<String, Addr<Fetcher>>,
    pub(crate) lease_manager: Addr<LeaseManager>,
    pub(crate) sweeper: Addr<Sweeper>,
    pub(crate) archiver: Addr<Archiver>,
    pub(crate) registrar: Addr<Registrar>,
    pub(crate) elector: Addr<LeaderElector>,
    pub(crate) watch: Addr<QueueWatch>,
}

/// The node's root actor: owns the timers and the handler runtime; runs shutdown.
///
/// Built with [`Scheduler::builder`] — queues, handlers, settings — and started into a
/// [`SchedulerHandle`](crate::SchedulerHandle), which the application keeps: its client
/// enqueues, and its `shutdown` stops the node gracefully.
///
/// ```no_run
/// # async fn demo() -> jobvisor::Result<()> {
/// use jobvisor::{handler_fn, JobOutcome, QueueConfig, Scheduler, Store, StoreOptions};
///
/// let store = Store::connect_with("sqlite://jobs.db", StoreOptions::default().migrate(true)).await?;
/// let scheduler = Scheduler::builder(store)
///     .queue("mail", QueueConfig::default().concurrency(20))
///     .handler("send_email", handler_fn(|to: String, _ctx| async move {
///         JobOutcome::success(format!("sent to {to}"))
///     }))
///     .start()?;
/// // ... serve requests, enqueue through `scheduler.client()` ...
/// let report = scheduler.shutdown().await;
/// println!("{} finished, {} given back", report.finished, report.released);
/// # Ok(()) }
/// ```
pub struct Scheduler {
    shared: Arc<Shared>,
    fetchers: HashMap<String, Addr<Fetcher>>,
    lease_manager: Addr<LeaseManager>,
    sweeper: Addr<Sweeper>,
    archiver: Addr<Archiver>,
    registrar: Addr<Registrar>,
    elector: Addr<LeaderElector>,
    watch: Addr<QueueWatch>,
    /// Interval timers, cancelled when shutdown begins.
    timers: Vec<SpawnHandle>,
    /// The lease renewal and deadline check timers: they go on while shutdown waits for
    /// running jobs (a wait longer than the fence point would otherwise fence them) and are
    /// cancelled once the give-backs are written.
    lease_timers: Vec<SpawnHandle>,
    /// Kept at the end of graceful shutdown (see [`HandlerRuntime::keep`]); shut down in the
    /// background if the scheduler is dropped otherwise (its actix system ended).
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
    pub(crate) fn new(shared: Arc<Shared>, actors: NodeActors, runtime: HandlerRuntime) -> Self {
        let NodeActors {
            fetchers,
            lease_manager,
            sweeper,
            archiver,
            registrar,
            elector,
            watch,
        } = actors;
        Scheduler {
            shared,
            fetchers,
            lease_manager,
            sweeper,
            archiver,
            registrar,
            elector,
            watch,
            timers: Vec::new(),
            lease_timers: Vec::new(),
            runtime: Some(runtime),
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
        self.lease_timers
            .push(ctx.run_interval(cfg.renew_every, move |_, _| lm.do_send(RenewLeases)));
        let lm = self.lease_manager.clone();
        self.lease_timers
            .push(ctx.run_interval(cfg.deadline_check_every, move |_, _| {
                lm.do_send(CheckDeadlines)
            }));
        let sw = self.sweeper.clone();
        self.timers
            .push(ctx.run_interval(cfg.sweep_every, move |_, _| sw.do_send(SweepNow)));
        let ar = self.archiver.clone();
        self.timers
            .push(ctx.run_interval(cfg.archive_every, move |_, _| ar.do_send(ArchiveNow)));
        let reg = self.registrar.clone();
        reg.do_send(NodeHeartbeat);
        self.timers
            .push(ctx.run_interval(cfg.node_heartbeat_every, move |_, _| {
                reg.do_send(NodeHeartbeat)
            }));
        let reg = self.registrar.clone();
        self.timers
            .push(ctx.run_interval(cfg.unserved_check_every, move |_, _| {
                reg.do_send(CheckUnserved)
            }));
        // The fair share's view of the live nodes (read only while a served queue has a
        // global limit).
        let reg = self.registrar.clone();
        self.timers
            .push(ctx.run_interval(PEERS_EVERY, move |_, _| reg.do_send(RefreshPeers)));
        let el = self.elector.clone();
        el.do_send(Elect);
        // Every third of the lease: a leader renews twice before its lease can run out.
        self.timers
            .push(ctx.run_interval(cfg.leader_lease / 3, move |_, _| el.do_send(Elect)));
        let wakers: HashMap<String, Recipient<Wake>> = self
            .fetchers
            .iter()
            .map(|(q, a)| (q.clone(), a.clone().recipient()))
            .collect();
        let listener = listen_loop(
            self.shared.clone(),
            wakers,
            self.watch.clone().recipient(),
            self.lease_manager.clone().recipient(),
        );
        self.timers.push(ctx.spawn(fut::wrap_future(listener)));
        let schedules = schedule_loop(self.shared.clone(), SCHEDULE_TICK);
        self.timers.push(ctx.spawn(fut::wrap_future(schedules)));
        for r in &self.shared.reconcilers {
            let pass = reconcile_loop(self.shared.clone(), r.clone());
            self.timers.push(ctx.spawn(fut::wrap_future(pass)));
        }
        if let Some(every) = cfg.gauges_every {
            let gauges = gauge_loop(self.shared.clone(), every);
            self.timers.push(ctx.spawn(fut::wrap_future(gauges)));
        }
    }
}

/// Stop claiming, wait for running jobs up to `timeout` (renewing their leases all along),
/// give back the leases of the rest, then stop every actor. Answers with what happened.
#[derive(Debug, Message)]
#[rtype(result = "ShutdownReport")]
pub struct Shutdown {
    /// How long to wait for running jobs.
    pub timeout: Duration,
}

/// What graceful shutdown did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ShutdownReport {
    /// Jobs that finished while shutdown waited (their result written; a job whose lease
    /// was lost meanwhile is not counted).
    pub finished: usize,
    /// Jobs whose leases were given back (they run again promptly, elsewhere or later).
    pub released: usize,
}

/// How often a node serving a queue with a global limit re-reads the live nodes for its
/// fair share: **1 s** (one statement; none without such a queue).
const PEERS_EVERY: Duration = Duration::from_secs(1);

/// Pause between checks while shutdown waits.
const SHUTDOWN_POLL: Duration = Duration::from_millis(20);

impl Handler<Shutdown> for Scheduler {
    type Result = ResponseActFuture<Self, ShutdownReport>;

    fn handle(&mut self, msg: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        // Every timer but the lease renewal and the deadline check: a job still running is
        // renewed while it is waited for, so no fence stops it and burns its attempt.
        for t in self.timers.drain(..) {
            ctx.cancel_future(t);
        }
        let fetchers: Vec<Addr<Fetcher>> = self.fetchers.values().cloned().collect();
        let lm = self.lease_manager.clone();
        let registrar = self.registrar.clone();
        let elector = self.elector.clone();
        let events = self.shared.events.clone();
        // Jobs fenced or found lost during the wait: neither finished here nor given back.
        let mut lost_events = self.shared.events.subscribe();
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
            // No longer serving anything: jobs only this node ran are reported as unserved.
            let _ = registrar.send(Unregister).await;
            // Another node takes over at its next attempt rather than a lease later.
            let _ = elector.send(Resign).await;
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
            // A job whose lease was lost during the wait (fenced while the database was out
            // of reach, or reclaimed) neither finished here nor was given back.
            let mut lost = std::collections::HashSet::new();
            loop {
                match lost_events.try_recv() {
                    Ok(Event::SelfFenced { id, .. } | Event::LeaseLost { id, .. }) => {
                        lost.insert(id);
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
            let lost = lost.len();
            let report = ShutdownReport {
                finished: at_start.saturating_sub(released).saturating_sub(lost),
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
            for t in act.lease_timers.drain(..) {
                ctx.cancel_future(t);
            }
            for f in act.fetchers.values() {
                f.do_send(StopActor);
            }
            act.lease_manager.do_send(StopActor);
            act.sweeper.do_send(StopActor);
            act.archiver.do_send(StopActor);
            act.registrar.do_send(StopActor);
            act.elector.do_send(StopActor);
            act.watch.do_send(StopActor);
            if let Some(rt) = act.runtime.take() {
                rt.keep();
            }
            ctx.stop();
            report
        }))
    }
}

/// Stops the receiving actor (sent by the scheduler at the end of shutdown).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopActor;
