//! [`SchedulerHandle`]: what the application keeps of a running node — a client wired to
//! wake its fetchers, its events and totals, shutdown, and (for tests) its actors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::broadcast;

use crate::lease::NodeId;
use crate::store::Store;

use super::archiver::Archiver;
use super::event::Event;
use super::fetcher::Fetcher;
use super::leader_elector::LeaderElector;
use super::lease_manager::LeaseManager;
use super::queue_watch::QueueWatch;
use super::registrar::Registrar;
use super::root::{Scheduler, Shutdown, ShutdownReport};
use super::shared::Shared;
use super::stats::StatsSnapshot;
use super::sweeper::Sweeper;

/// A running scheduler: its actors' addresses, its event stream, a client wired to wake its
/// fetchers, and shutdown.
#[derive(Clone)]
// Some addresses are read only by `crate::testing::NodeActors` (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub struct SchedulerHandle {
    pub(crate) scheduler: Addr<Scheduler>,
    pub(crate) fetchers: HashMap<String, Addr<Fetcher>>,
    pub(crate) lease_manager: Addr<LeaseManager>,
    pub(crate) sweeper: Addr<Sweeper>,
    pub(crate) archiver: Addr<Archiver>,
    pub(crate) registrar: Addr<Registrar>,
    pub(crate) elector: Addr<LeaderElector>,
    // Read by tests only; the root keeps its own address to stop it.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) watch: Addr<QueueWatch>,
    pub(crate) shared: Arc<Shared>,
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
    /// A client whose enqueues wake this node's fetchers at once. It works from any
    /// runtime (an actix-web or axum handler, a job's handler, a CLI's `#[tokio::main]`).
    pub fn client(&self) -> crate::client::Client {
        self.shared.client.clone()
    }

    /// Subscribes to the event stream.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// This node's running totals.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The term under which this node leads the database, if it does (as it last confirmed:
    /// see [`Client::leader`](crate::Client::leader) for the database's view).
    pub fn leader_term(&self) -> Option<u64> {
        self.shared
            .leader
            .current(self.shared.clock.monotonic())
            .and_then(|t| u64::try_from(t).ok())
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.shared.node
    }

    /// The store it works on.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Graceful shutdown with the configured timeout
    /// ([`SchedulerConfig::shutdown_timeout`](crate::SchedulerConfig::shutdown_timeout),
    /// default 30 s).
    ///
    /// The node's fetchers stop claiming at once; the jobs the node holds get up to the
    /// timeout to finish, and those that do are written as usual. Their leases are renewed
    /// all the while, so the timeout may be longer than the lease and no job is fenced while
    /// it is waited for. Then each job still held is
    /// given back: one not started yet goes back to `pending` at once; a running handler sees
    /// [`JobContext::cancelled`](crate::JobContext::cancelled) complete and its task is
    /// aborted at its next `.await`, and its job goes back to `pending` with the attempt not
    /// counted, to run again elsewhere (keep handlers idempotent). A handler stuck in blocking
    /// code cannot be aborted: after `cancel_grace` (5 s) its lease is left to expire and
    /// another node reclaims the job, as after a crash. The node then leaves the node
    /// registry and resigns the lead. [`ShutdownReport`] says how many jobs finished and how
    /// many were given back.
    ///
    /// Call it when the process is asked to stop: SIGTERM is what `docker stop`, Kubernetes
    /// and systemd send. Under `#[actix_web::main]`, `HttpServer` handles the signals and
    /// `run()` returns; shut the scheduler down after it (`examples/actix_web.rs`). Under
    /// `#[tokio::main]`, wait for the signal yourself (`examples/axum.rs`):
    ///
    /// ```ignore
    /// axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await?;
    /// scheduler.shutdown().await;
    /// ```
    ///
    /// Give the orchestrator's grace period (Kubernetes' `terminationGracePeriodSeconds`, 30 s
    /// by default) more than the timeout plus your server's own drain, or lower the timeout.
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
    #[cfg(feature = "test-util")]
    pub(crate) fn fetcher(&self, queue: &str) -> Option<Addr<Fetcher>> {
        self.fetchers.get(queue).cloned()
    }

    /// The queue watch (tests read the settings through it).
    #[cfg(feature = "test-util")]
    pub(crate) fn watch(&self) -> Addr<QueueWatch> {
        self.watch.clone()
    }

    /// The lease manager.
    #[cfg(feature = "test-util")]
    pub(crate) fn lease_manager(&self) -> Addr<LeaseManager> {
        self.lease_manager.clone()
    }

    /// The sweeper.
    #[cfg(feature = "test-util")]
    pub(crate) fn sweeper(&self) -> Addr<Sweeper> {
        self.sweeper.clone()
    }

    /// The archiver.
    #[cfg(feature = "test-util")]
    pub(crate) fn archiver(&self) -> Addr<Archiver> {
        self.archiver.clone()
    }

    /// The scheduler actor.
    #[cfg(feature = "test-util")]
    pub(crate) fn scheduler(&self) -> Addr<Scheduler> {
        self.scheduler.clone()
    }

    /// The leader elector.
    #[cfg(feature = "test-util")]
    pub(crate) fn elector(&self) -> Addr<LeaderElector> {
        self.elector.clone()
    }

    /// The registrar (the node registry and unserved-job reports).
    #[cfg(feature = "test-util")]
    pub(crate) fn registrar(&self) -> Addr<Registrar> {
        self.registrar.clone()
    }
}
