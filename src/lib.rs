//! jobvisor: durable background jobs for Rust services (actix or plain tokio), stored in
//! PostgreSQL, MySQL/MariaDB or SQLite.
//!
//! Jobs live in one table. A node claims due jobs under a lease (a random token per claim,
//! with an expiry it keeps renewing); every write it makes afterwards presents that token, so
//! a node that lost its lease — paused, partitioned, presumed dead and reclaimed — can never
//! overwrite the result of the node that holds the job now. Enqueueing can join the caller's
//! own database transaction (the transactional outbox).
//!
//! # Layout
//! * [`client`] — [`Client`], the application's door: enqueue (also inside the caller's
//!   transaction), get, list, counts, cancel, retry, wait; queue lags, the node registry,
//!   unserved jobs, archive and prune.
//! * `done_watch` — how [`Client::wait`] hears at once that its job ended (PostgreSQL's
//!   `jobvisor_done`; the poll elsewhere, and as the backstop).
//! * [`scheduler`] — the runtime: [`Scheduler`], [`SchedulerBuilder`], [`SchedulerHandle`],
//!   [`Event`]s; its actors (fetcher, lease manager, job supervisor, sweeper, archiver,
//!   registrar) are crate-private.
//! * [`handler`] — [`JobHandler`], [`handler_fn`], [`JobContext`] and what a handler returns.
//! * `handler_tx` — a handler's own transaction on the job's store, fenced by its lease
//!   ([`JobContext::transaction`], [`JobContext::complete_in_transaction`]): [`JobTx`] and
//!   its effect records ([`Recorded`], [`Effect`]), [`TxError`].
//! * [`config`] — [`SchedulerConfig`] and [`QueueConfig`], defaults shown.
//! * [`backoff`] — [`RetryPolicy`]: how long a failed job waits before its next attempt.
//! * [`job`] — job ids, states and their transition table, the job record, its limits.
//! * `new_job` — [`NewJob`], its options and their validation, [`Enqueued`] (named in `job`).
//! * `job_args` — [`JobArgs`]: a payload type tied to its kind, queue, priority, attempts
//!   and timeout (`client.enqueue(args)`, [`SchedulerBuilder::handle`]).
//! * [`dependency`] — jobs that wait for others: [`NewJob::after`], [`ParentPolicy`],
//!   [`Dependencies`] (a job's parents and children), [`Batch`].
//! * [`deadline`] — start-by deadlines: [`NewJob::start_by`], a job not started by then
//!   ends `cancelled` with the code `expired`.
//! * [`sequence`] — ordered sequences per key: [`NewJob::sequence`], one at a time in
//!   enqueue order.
//! * [`lease`] — [`NodeId`] and [`ClaimId`], the public part of a claim's lease token.
//! * `queue` — a queue's shared settings: [`QueueLimits`], [`RateLimit`], [`QueueInfo`].
//! * [`claim`] — [`Claim`], one row of a job's execution ledger: who ran which attempt, when,
//!   and how it ended ([`ClaimOutcome`]).
//! * [`schedule`] — [`Schedule`]: periodic jobs (cron in a time zone, or an interval) and
//!   what happens to missed fires.
//! * [`clock`] — where time comes from: the database's clock in production, a
//!   [`ManualClock`](clock::ManualClock) in simulation.
//! * [`error`] — the one public [`Error`] type; lost guards are outcomes, not errors.
//! * [`metrics`] — what jobvisor records through the `metrics` facade (names, labels),
//!   [`DatabaseGauges`](metrics::DatabaseGauges), and the Prometheus exporter.
//! * [`store`] — the only code that speaks SQL: [`Store`], a connection handle (connect,
//!   options, backend, migrate); the operations behind [`Client`] and the actors are
//!   crate-private. Its layers are its folders: entry points at its root (`claim/`,
//!   `jobs.rs`, `handler_tx/`, …), the seam `driver.rs`, a folder per backend, `common/`.
//! * `web` (feature `web`) — the operator dashboard: pages, actions, logins, the live event
//!   stream, the audit log and history pages.
//! * `testing` (feature `test-util`) — testing handlers: the simulation harness with a manual
//!   clock (stable); hidden in it, the engine internals jobvisor's own tests use (not).
//!
//! # Features
//! * `postgres`, `mysql`, `sqlite` (all on by default): the backends compiled in. A build
//!   with one of them compiles no code, and links no driver, of the others; a URL of a
//!   backend left out is refused with [`Error::InvalidInput`] naming the feature.
//! * `test-util`: the `testing` module (its documented items are stable).
//! * `cli`: the `jobvisor` operator command line (`src/bin/jobvisor/`).
//! * `prometheus`: `metrics::install_prometheus`, a Prometheus recorder.
//! * `web`: `web::Dashboard`, the operator dashboard as an actix-web service.
//! * `actix-web`: `metrics::actix_web_service`, `/metrics` for an actix-web service (implies `prometheus`).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> jobvisor::Result<()> {
//! use jobvisor::{Client, NewJob, Store, StoreOptions};
//!
//! let store = Store::connect_with("sqlite://jobs.db", StoreOptions::default().migrate(true)).await?;
//! let client = Client::new(store);
//! let e = client.enqueue(NewJob::new("send_email", serde_json::json!({"to": "a@example.com"}))).await?;
//! println!("enqueued job {} (duplicate: {})", e.id, e.duplicate);
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("jobvisor needs at least one backend: enable the feature postgres, mysql or sqlite");

pub mod backoff;
pub mod claim;
pub mod client;
pub mod clock;
pub mod config;
pub mod deadline;
pub mod dependency;
mod done_watch;
pub mod error;
pub mod handler;
mod handler_tx;
pub mod hooks;
pub mod job;
mod job_args;
pub mod lease;
pub mod metrics;
mod new_job;
mod parent_results;
mod queue;
pub mod schedule;
pub mod scheduler;
pub mod sequence;
pub mod store;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;
#[cfg(feature = "web")]
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub mod web;

pub use backoff::RetryPolicy;
pub use claim::{Claim, ClaimOutcome};
pub use client::Client;
pub use config::{QueueConfig, SchedulerConfig};
pub use dependency::{Batch, Dependencies, Link, Outcomes, ParentPolicy};
pub use error::{Error, Result, StoreError};
pub use handler::{
    handler_fn, JobContext, JobError, JobHandler, JobOutcome, JobResult, MAX_PROGRESS_BYTES,
};
pub use handler_tx::{JobTx, TxBody, TxError};
pub use job::{
    Enqueued, Job, JobFailure, JobId, JobState, NewJob, OnDuplicate, RunAt, UniqueScope,
};
pub use job_args::JobArgs;
pub use lease::{ClaimId, NodeId};
pub use parent_results::ParentResults;
pub use queue::{QueueInfo, QueueLimits, RateLimit, RATE_START_MARGIN};
pub use schedule::{MissedFires, Schedule, ScheduleInfo, ScheduleOrigin};
pub use scheduler::{Event, Scheduler, SchedulerBuilder, SchedulerHandle, ShutdownReport};
#[cfg(feature = "sqlite")]
pub use store::SqliteJobConnection;
pub use store::{AuditAction, AuditEntry};
pub use store::{
    Backend, CancelOutcome, ListParams, OutboxConnection, ReclaimReason, RetryOutcome, StateCount,
    Store, StoreOptions, TcpKeepalive, TlsMode,
};
pub use store::{Effect, JobConnection, Recorded, MAX_EFFECT_KEY_LEN};
pub use store::{Leader, NodeInfo, QueueLag, Unserved, UnservedReason};
