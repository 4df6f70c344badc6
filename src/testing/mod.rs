//! Testing your handlers (feature `test-util`, for `[dev-dependencies]`).
//!
//! # The stable surface
//! What this page documents follows semantic versioning like the rest of the crate:
//!
//! * [`Simulation`]: a node started on a temp SQLite file ([`Simulation::sqlite`], feature
//!   `sqlite`) or on any [`Store`](crate::Store) ([`Simulation::on_store`]) with **no timers**
//!   and a [`ManualClock`] — or a clock of the test's own over it
//!   ([`Simulation::on_store_with_clock`]: a node's jumping wall clock or drifting
//!   monotonic clock, the database's time still the manual clock's). The test drives it —
//!   [`fetch`](Simulation::fetch) (claim and start jobs), [`renew`](Simulation::renew) (the
//!   heartbeat),
//!   [`check_deadlines`](Simulation::check_deadlines) (timeouts),
//!   [`sweep`](Simulation::sweep) (expired leases), [`archive`](Simulation::archive) — and
//!   waits for what happened with [`finished`](Simulation::finished) and
//!   [`next_event`](Simulation::next_event): deterministic, no sleeps. Handlers still run
//!   on their own threads; a generous real-time safety net ([`EVENT_TIMEOUT`]) only fires
//!   if something is broken.
//! * **Time travel**: [`Simulation::advance`] (or the shared [`ManualClock`], also
//!   [`jobvisor::clock::ManualClock`](crate::clock::ManualClock)) moves the clock every
//!   statement of the node binds: backoff delays, leases, timeouts and `run_at` pass
//!   without waiting.
//! * [`JobContext::for_test`](crate::JobContext::for_test) (no feature needed): call a
//!   handler directly, without a database.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use jobvisor::{handler_fn, JobOutcome, JobState, NewJob, testing::Simulation};
//!
//! let mut sim = Simulation::sqlite(|b| {
//!     b.handler("hello", handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::success("hi") }))
//! })
//! .await;
//! let id = sim.client.enqueue(NewJob::new("hello", serde_json::json!({}))).await.unwrap().id;
//! sim.fetch("default").await;
//! assert_eq!(sim.finished(id).await, JobState::Succeeded);
//! sim.advance(Duration::from_secs(60));
//! # }
//! ```
//!
//! # Not part of it
//! The engine's operations, actors and messages, and the test databases jobvisor's own
//! suites run on (`TestDb`, per-test PostgreSQL schemas and MySQL databases), are opened to
//! jobvisor's own tests, benchmarks and tools in hidden items of this module; they are not
//! documented and change in any release.

#![allow(clippy::missing_panics_doc)]

mod db;
mod engine;
mod simulation;

pub use crate::clock::ManualClock;
pub use crate::scheduler::archiver::ArchiveReport;
pub use crate::scheduler::lease_manager::RenewReport;
pub use simulation::{sim_config, Simulation, EVENT_TIMEOUT};

/// The engine internals jobvisor's own tests use: not a stable API, not documented.
#[doc(hidden)]
pub mod internal {
    #[cfg(feature = "sqlite")]
    pub use super::db::simulated_store;
    pub use super::db::{
        base_url, exec_sql, postgres_switches_off, simulated_store_ops, unique_name, TestDb,
        DEFAULT_MYSQL_URL, DEFAULT_PG_URL,
    };
    pub use super::engine::{NodeActors, StoreEngine};
    pub use crate::store::faults::{Answering, Fault, FaultPlan, Late, StoreOp};

    /// Makes the SQLite calls made on this thread run inline, to their end, before their
    /// futures are handed back (`on`), or on tokio's blocking threads as usual: with every
    /// node's actors and handlers on one thread too (a current-thread runtime,
    /// [`SchedulerBuilder::handlers_on_current_runtime`](crate::scheduler::SchedulerBuilder::handlers_on_current_runtime)),
    /// the order of everything is the program's, not the threads'.
    #[cfg(feature = "sqlite")]
    pub fn sqlite_calls_inline(on: bool) {
        crate::store::driver::sqlite_calls_inline(on);
    }
    pub use crate::store::statement_count::{count_statements, sent, Sent, KIND_CHARS};

    /// Starts this thread's spread of the pauses between a write's retries afresh: a seeded
    /// simulation calls it as each run begins, so that a seed's runs pause alike whatever
    /// ran on the thread before.
    pub fn restart_retry_spread() {
        crate::store::restart_retry_spread();
    }

    pub use crate::lease::LeaseToken;
    pub use crate::scheduler::archiver::{ArchiveNow, Archiver};
    pub use crate::scheduler::fetcher::PREFETCH_MAX_WAIT;
    pub use crate::scheduler::fetcher::{
        FetchNow, Fetcher, FetcherStatus, GetFetcherStatus, SlotFreed, StopClaiming, Wake,
    };
    pub use crate::scheduler::job_supervisor::{JobSupervisor, StopReason};
    pub use crate::scheduler::lease_manager::{
        CheckDeadlines, FlushFinalizations, GetLeaseManagerStatus, JobFinished, LeaseManager,
        LeaseManagerStatus, ReleaseAll, RenewLeases, TokenOf,
    };
    pub use crate::scheduler::sweeper::{SweepNow, Sweeper};
    pub use crate::store::params::{
        ArchiveParams, CancelParams, ClaimParams, ClaimedJob, EnqueueParams, Finalization,
        Finalize, FinalizeParams, Guarded, LeaseRef, PruneParams, ReclaimParams, Reclaimed,
        RenewParams, Renewed, RetryParams,
    };
}

// The project's own tests name the internals from here as well.
#[doc(hidden)]
pub use internal::*;
