//! The runtime: actix actors that claim jobs, run them under supervision and write every
//! state change through the store (`ARCHITECTURE.md`, the runtime).
//!
//! * [`SchedulerBuilder`] (`builder.rs`) validates the settings and wires the others;
//!   [`SchedulerHandle`] (`handle.rs`) is what the application keeps.
//! * `Scheduler` (`root.rs`) owns every interval timer and runs graceful shutdown.
//! * `Fetcher` (one per queue) claims up to its free slots whenever woken.
//! * `JobSupervisor` (one per running job; a task on the handler threads, not an actor) runs
//!   the handler, enforces timeout, cancel and lease loss, and reports the outcome.
//! * `LeaseManager` (one per node) renews all leases in one statement per heartbeat, tells
//!   supervisors when a lease is lost or about to expire, and batches finalizations.
//! * `Sweeper` and `Archiver` do bounded maintenance batches.
//! * The schedule firer (`schedule_firer.rs`) stores the node's schedules and, on the
//!   leader, fires the due ones.
//! * Under a queue's global limit served by several nodes, each node holds at most its
//!   fair share (`fair_share.rs`).
//! * Reconcilers (`reconciler.rs`) re-create missing jobs, run by the leader.
//! * `LeaderElector` keeps or takes the database's leadership (one node per database does
//!   the once-per-database work, fenced by its term).
//!
//! # Periodic services: which idiom
//! * **An actor ticked by the root** (`Sweeper`, `Archiver`, `Registrar`, `LeaderElector`:
//!   the root's `run_interval` sends them a message) when the work must be stepped by a test
//!   or by another actor: the simulation sends the same message the timer sends
//!   (`Simulation::sweep`), so the test decides when it runs, and a message's answer says
//!   what it did. `QueueWatch` is an actor for the same reason but keeps its own timers,
//!   because how often it reads depends on the backend (a notification or an 80 ms signal).
//! * **A self-timed task** (`schedule_loop`, `reconcile_loop`, `gauge_loop`, `listen_loop`)
//!   when no one sends it anything: leader-only work that sleeps on its own interval or a wake
//!   signal (a new term), runs user code on the handler runtime, or blocks on a connection.
//!   It ends when the node's stop signal fires.
//!
//! A new periodic service is an actor if a test must step it, a task otherwise.
//!
//! Actors hold no connection and build no SQL: they call the [`Store`](crate::store::Store). All of them run on
//! the arbiter that called [`SchedulerBuilder::start`] — or, outside any actix system, on a
//! dedicated one of their own (`jobvisor-actors` thread); handlers run on a separate
//! multi-threaded runtime so a slow or CPU-heavy handler never delays a claim or a renewal.
//! Durability never depends on actix supervision: a message lost with a crashed process is
//! recovered by lease expiry and the sweeper.

// The actors and their messages are crate-private: public types in crate-private modules,
// reachable from outside only through `crate::testing` (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod archiver;
pub(crate) mod attempt;
mod builder;
mod event;
mod fair_share;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod fetcher;
mod gauges;
mod handle;
mod id_gaps;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod job_supervisor;
mod leader_elector;
mod leader_term;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod lease_manager;
mod listen;
mod panic_site;
mod progress;
pub(crate) mod queue_gate;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod queue_watch;
mod reconciler;
mod registrar;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod root;
mod schedule_firer;
mod shared;
mod start_hold;
mod stats;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod sweeper;

pub use builder::SchedulerBuilder;
pub use event::Event;
pub use handle::SchedulerHandle;
pub use reconciler::MIN_RECONCILE_INTERVAL;
pub use root::{Scheduler, ShutdownReport};
pub use stats::{Stats, StatsSnapshot};

#[cfg(feature = "test-util")]
pub(crate) use archiver::Archiver;
pub(crate) use attempt::{us as micros, Attempt};
pub(crate) use event::report_store_error;
#[cfg(feature = "test-util")]
pub(crate) use fetcher::Fetcher;
#[cfg(feature = "test-util")]
pub(crate) use gauges::refresh as refresh_gauges;
#[cfg(feature = "web")]
pub(crate) use id_gaps::IdGaps;
pub(crate) use job_supervisor::panic_error;
#[cfg(feature = "test-util")]
pub(crate) use leader_elector::Elect;
#[cfg(feature = "test-util")]
pub(crate) use lease_manager::LeaseManager;
pub(crate) use panic_site::payload_message as panic_message;
pub(crate) use progress::ProgressCell;
#[cfg(feature = "test-util")]
pub(crate) use reconciler::run as reconcile_pass;
#[cfg(feature = "test-util")]
pub(crate) use registrar::{CheckUnserved, NodeHeartbeat};
pub(crate) use root::StopActor;
#[cfg(feature = "test-util")]
pub(crate) use schedule_firer::{
    fire_due as fire_schedules, schedule_loop, sync as sync_schedules,
};
pub(crate) use shared::Shared;
#[cfg(feature = "test-util")]
pub(crate) use sweeper::Sweeper;
