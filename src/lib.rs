//! jobvisor: durable background jobs for actix services, stored in PostgreSQL, MySQL/MariaDB
//! or SQLite.
//!
//! Jobs live in one table. A node claims due jobs under a lease (a random token per claim,
//! with an expiry it keeps renewing); every write it makes afterwards presents that token, so
//! a node that lost its lease — paused, partitioned, presumed dead and reclaimed — can never
//! overwrite the result of the node that holds the job now. Enqueueing can join the caller's
//! own database transaction (the transactional outbox).
//!
//! # Layout
//! * [`job`] — job ids, states and their transition table, [`NewJob`] and its validation.
//! * [`lease`] — [`NodeId`] and [`LeaseToken`] (redacted in `Debug`).
//! * [`clock`] — where time comes from: the database's clock in production, a
//!   [`ManualClock`](clock::ManualClock) in simulation.
//! * [`error`] — the one public [`Error`] type; lost guards are outcomes, not errors.
//! * [`store`] — the only code that speaks SQL: [`Store`] and one method per guarded
//!   transition, identical on all three backends.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> jobvisor::Result<()> {
//! use jobvisor::{EnqueueParams, NewJob, Store, StoreOptions};
//!
//! let store = Store::connect_with("sqlite://jobs.db", StoreOptions::default().migrate(true)).await?;
//! let e = store.job_enqueue(NewJob::new("send_email", serde_json::json!({"to": "a@example.com"})), None).await?;
//! println!("enqueued job {} (duplicate: {})", e.id, e.duplicate);
//! # Ok(()) }
//! ```

pub mod backoff;
pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod handler;
pub mod job;
pub mod lease;
pub mod scheduler;
pub mod store;
#[cfg(feature = "test-util")]
pub mod testing;

pub use backoff::RetryPolicy;
pub use client::Client;
pub use config::{QueueConfig, SchedulerConfig};
pub use error::{Error, Result, StoreError};
pub use handler::{handler_fn, JobContext, JobError, JobHandler, JobOutcome, JobResult};
pub use job::{Job, JobFailure, JobId, JobState, NewJob, RunAt};
pub use lease::{LeaseToken, NodeId};
pub use scheduler::{Event, Scheduler, SchedulerBuilder, SchedulerHandle, ShutdownReport};
pub use store::{
    ArchiveParams, Backend, CancelOutcome, CancelParams, ClaimParams, ClaimedJob, EnqueueParams,
    Enqueued, Finalization, Finalize, FinalizeParams, Guarded, LeaseRef, ListParams, PruneParams,
    ReclaimParams, ReclaimReason, Reclaimed, RenewParams, Renewed, RetryParams, StateCount, Store,
    StoreOptions,
};
