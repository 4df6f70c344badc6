//! Test support — **not a stable API**: it exists for jobvisor's own tests, benchmarks and
//! tools, and may change in any release (feature `test-util`).
//!
//! * [`Simulation`] (`simulation`): a harness for testing handlers and the runtime: a
//!   [`ManualClock`](crate::clock::ManualClock), the actors started on a temp SQLite store (or
//!   any store) with **no timers**, and each actor's address, so a test drives everything
//!   through mailboxes — fetch, renew, check deadlines, sweep, archive, advance the clock —
//!   deterministically, without sleeping. Handlers still run on their own threads; a test
//!   waits for the [`Event`](crate::scheduler::Event)s that report what they did
//!   ([`Simulation::next_event`]), with a generous real-time safety net that only fires if
//!   something is broken.
//! * [`StoreEngine`] and [`NodeActors`] (`engine`): the lease holder's store operations and
//!   the actors' addresses, crate-private otherwise; with them the actors and messages and the
//!   engine's parameter and outcome types are re-exported here.
//! * [`TestDb`] (`db`): an isolated database per test on any backend (a PostgreSQL schema, a
//!   MySQL database, a temp SQLite file), dropped afterwards.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use jobvisor::{handler_fn, JobOutcome, NewJob, testing::Simulation};
//!
//! let mut sim = Simulation::sqlite(|b| {
//!     b.handler("hello", handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::success("hi") }))
//! })
//! .await;
//! let id = sim.client.enqueue(NewJob::new("hello", serde_json::json!({}))).await.unwrap().id;
//! sim.fetch("default").await;
//! assert_eq!(sim.finished(id).await, jobvisor::JobState::Succeeded);
//! sim.clock.advance(Duration::from_secs(60));
//! # }
//! ```

#![allow(clippy::missing_panics_doc)]

mod db;
mod engine;
mod simulation;

pub use db::{base_url, exec_sql, unique_name, TestDb, DEFAULT_MYSQL_URL, DEFAULT_PG_URL};
pub use engine::{NodeActors, StoreEngine};
pub use simulation::{sim_config, Simulation, EVENT_TIMEOUT};

pub use crate::scheduler::archiver::{ArchiveNow, ArchiveReport, Archiver};
pub use crate::scheduler::fetcher::{
    FetchNow, Fetcher, FetcherStatus, GetFetcherStatus, SlotFreed, StopClaiming, Wake,
};
pub use crate::scheduler::job_supervisor::{JobSupervisor, StopJob, StopReason};
pub use crate::scheduler::lease_manager::{
    CheckDeadlines, FlushFinalizations, GetLeaseManagerStatus, JobFinished, LeaseManager,
    LeaseManagerStatus, ReleaseAll, RenewLeases, RenewReport, TokenOf,
};
pub use crate::scheduler::sweeper::{SweepNow, Sweeper};
pub use crate::store::params::{
    ArchiveParams, CancelParams, ClaimParams, ClaimedJob, EnqueueParams, Finalization, Finalize,
    FinalizeParams, LeaseRef, PruneParams, ReclaimParams, Reclaimed, RenewParams, Renewed,
    RetryParams,
};
