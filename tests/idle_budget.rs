//! What an idle node sends: statements a second of a node with the default configuration,
//! one queue and nothing to do, counted by a diesel instrumentation on every connection it
//! opens (pings at checkout and transaction statements included) — counts, not times.
//!
//! The budget is an upper bound per second of the window, so a slow machine (ticks late,
//! fewer of them) cannot fail it; a change that adds a periodic statement, or a checkout to
//! the change signal read every 80 ms on MariaDB and SQLite (ARCHITECTURE.md, the queue
//! watch), does. The figures and what each second holds are in the cost model.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use diesel::connection::{set_default_instrumentation, Instrumentation, InstrumentationEvent};
use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, JobOutcome, QueueConfig, Scheduler};
use serde_json::Value;

/// Statements, `BEGIN`s and `COMMIT`s, each counted once.
static SENT: AtomicU64 = AtomicU64::new(0);

fn counting() -> Option<Box<dyn Instrumentation>> {
    Some(Box::new(|e: InstrumentationEvent<'_>| {
        if matches!(
            e,
            InstrumentationEvent::StartQuery { .. }
                | InstrumentationEvent::BeginTransaction { .. }
                | InstrumentationEvent::CommitTransaction { .. }
        ) {
            SENT.fetch_add(1, SeqCst);
        }
    }))
}

/// The most an idle node may send a second. MariaDB and SQLite: the change signal (12.5 a
/// second, on a connection of its own: no checkout ping) and about 11 more — the poll's
/// claim and the leader's schedule tick (each with its checkout ping on MariaDB), the
/// leader's lease renewal, and the heartbeat, sweep and gauges spread over their periods.
/// Under 25 a second to the server (MariaDB), which the signal at 50 ms broke (31).
/// PostgreSQL has no signal (notifications wake it).
fn budget(backend: Backend) -> f64 {
    match backend {
        Backend::Postgres => 8.0,
        Backend::Mysql | Backend::Sqlite => 25.0,
    }
}

/// How long the node settles (its first claims, registration, election) before counting.
const SETTLE: Duration = Duration::from_secs(3);
/// How long it is counted.
const WINDOW: Duration = Duration::from_secs(6);

async fn idle_node_sends(backend: Backend) -> f64 {
    let db = TestDb::create(backend).await;
    let scheduler = Scheduler::builder(db.store().await)
        .queue("default", QueueConfig::default())
        .handler(
            "noop",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        )
        .start()
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let (before, t0) = (SENT.load(SeqCst), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let sent = SENT.load(SeqCst) - before;
    let per_second = sent as f64 / t0.elapsed().as_secs_f64();
    scheduler.shutdown_within(Duration::from_secs(5)).await;
    per_second
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_stays_within_its_statement_budget() {
    set_default_instrumentation(counting).unwrap();
    let mut over = Vec::new();
    // One backend at a time: the counter is the process's.
    for backend in [Backend::Postgres, Backend::Mysql, Backend::Sqlite] {
        let sent = idle_node_sends(backend).await;
        println!(
            "{backend:?}\tidle node: {sent:.1} statements/s (budget {})",
            budget(backend)
        );
        if sent > budget(backend) {
            over.push(format!(
                "{backend:?}: {sent:.1} statements/s, budget {}",
                budget(backend)
            ));
        }
    }
    assert!(
        over.is_empty(),
        "an idle node sends more than its budget (see the cost model):\n{}",
        over.join("\n")
    );
}
