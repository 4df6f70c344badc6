//! `Client::wait` told of its job's end: a waiter in another process (a store and client of
//! its own) returns at once after its job's end on PostgreSQL, where the poll alone (5 ms
//! doubling to 250 ms) misses jobs that end at random moments by up to 250 ms; on MariaDB
//! and SQLite, which poll as before, within the poll's longest pause.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, Client, JobOutcome, JobState, NewJob, QueueConfig, Scheduler};
use serde_json::{json, Value};

/// Waits on the node's jobs.
const WAITS: usize = 30;

/// Runs `WAITS` jobs ending at spread moments, each waited on by another client; the
/// sorted delays from each job's end to its wait's return.
async fn end_to_return(backend: Backend) -> Vec<Duration> {
    let db = TestDb::create(backend).await;
    let ends: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let seen = Arc::clone(&ends);
    let scheduler = Scheduler::builder(db.store().await)
        .queue("default", QueueConfig::default().concurrency(WAITS as u32))
        .handler(
            "nap",
            handler_fn(move |v: Value, _ctx| {
                let seen = Arc::clone(&seen);
                async move {
                    tokio::time::sleep(Duration::from_millis(v["ms"].as_u64().unwrap())).await;
                    seen.lock()
                        .unwrap()
                        .insert(v["i"].as_u64().unwrap(), Instant::now());
                    JobOutcome::success(())
                }
            }),
        )
        .start()
        .unwrap();
    let other = Client::new(db.store().await);
    // Warmed first, with one wait: the client's listener opens (one connection, on the first
    // wait) and the node's first finalize plans its statement; measured are the waits after.
    let warm = other
        .enqueue(NewJob::new("nap", json!({"i": WAITS, "ms": 0})))
        .await
        .unwrap()
        .id;
    other.wait(warm, Duration::from_secs(10)).await.unwrap();
    // Ends spread over 0.3 to 1.5 s (a fixed-seed spread, not a multiple of the poll's
    // pauses), so that the poll alone would land anywhere in its 250 ms pause.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut waiters = Vec::new();
    for i in 0..WAITS as u64 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let ms = 300 + (seed >> 33) % 1_200;
        let id = other
            .enqueue(NewJob::new("nap", json!({"i": i, "ms": ms})))
            .await
            .unwrap()
            .id;
        let c = other.clone();
        waiters.push(tokio::spawn(async move {
            let job = c.wait(id, Duration::from_secs(10)).await.unwrap();
            (i, job.state, Instant::now())
        }));
    }
    let mut lags = Vec::new();
    for w in waiters {
        let (i, state, back) = w.await.unwrap();
        assert_eq!(state, JobState::Succeeded);
        let end = ends.lock().unwrap()[&i];
        lags.push(back.saturating_duration_since(end));
    }
    scheduler.shutdown_within(Duration::from_secs(5)).await;
    lags.sort_unstable();
    eprintln!(
        "wait [{backend:?}]: end to wait's return p50 {:?}, p99 {:?} ({WAITS} waits)",
        lags[lags.len() / 2],
        p99(&lags)
    );
    lags
}

/// The nearest-rank p99 of sorted `lags`: with 30 waits, the slowest.
fn p99(lags: &[Duration]) -> Duration {
    lags[(lags.len() * 99).div_ceil(100) - 1]
}

/// Pushed: half the waits back within 50 ms of their job's end and all within 150 ms, where
/// the poll alone lands anywhere in its 250 ms pause (p50 about 125 ms). Quiet, the figures
/// are 3–9 ms at p50 and 10–30 ms at p99; the bounds leave room for a loaded machine (two
/// cores shared with builds: p50 up to 42 ms and p99 131 ms were seen at load average 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wait_returns_at_once_after_the_end() {
    let lags = end_to_return(Backend::Postgres).await;
    let p50 = lags[lags.len() / 2];
    assert!(
        p50 <= Duration::from_millis(50) && p99(&lags) <= Duration::from_millis(150),
        "wait returned {p50:?} after its job's end at p50, {:?} at p99",
        p99(&lags)
    );
}

/// The poll, unchanged: its longest pause (250 ms) and a read's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_and_sqlite_waits_poll_within_the_longest_pause() {
    for backend in [Backend::Mysql, Backend::Sqlite] {
        let lags = end_to_return(backend).await;
        assert!(
            p99(&lags) <= Duration::from_millis(300),
            "[{backend:?}] wait returned {:?} after its job's end at p99",
            p99(&lags)
        );
    }
}
