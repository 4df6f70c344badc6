//! Simulation tests of the runtime: actors on a real store, a manual clock, ticks sent to
//! mailboxes — no timers, no sleeps. Key scenarios also run with two nodes sharing one
//! database on PostgreSQL, MySQL and SQLite (`two_nodes::*`). One file per topic; the helpers
//! each defines are shared through the globs below.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobvisor::clock::Clock as _;
use jobvisor::scheduler::Event;
use jobvisor::testing::{Simulation, StoreEngine as _, TestDb, TokenOf};
use jobvisor::{
    handler_fn, Backend, CancelOutcome, JobError, JobId, JobOutcome, JobState, NewJob,
    ParentPolicy, QueueConfig, RetryPolicy,
};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

const SEC: Duration = Duration::from_secs(1);

mod late_answers;
mod lease_model;
mod node;
mod retention;
mod two_nodes;

#[allow(unused_imports)]
use {late_answers::*, lease_model::*, node::*, retention::*, two_nodes::*};
