//! `Client::wait` pushed on PostgreSQL: a waiter in another process (a store and client of
//! its own) hears the finalize's notification and returns within 50 ms of its job's end,
//! where the poll alone (5 ms doubling to 250 ms) misses jobs that end at random moments by
//! up to 250 ms.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, Client, JobOutcome, JobState, NewJob, QueueConfig, Scheduler};
use serde_json::{json, Value};

/// Waits on the node's jobs.
const WAITS: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wait_returns_within_50_ms_of_the_end() {
    let db = TestDb::create(Backend::Postgres).await;
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
    lags.sort_unstable();
    // Nearest rank: with 30 waits, p99 is the slowest.
    let p99 = lags[(lags.len() * 99).div_ceil(100) - 1];
    eprintln!(
        "wait pushed [Postgres]: end to wait's return p50 {:?}, p99 {p99:?} ({WAITS} waits)",
        lags[lags.len() / 2]
    );
    assert!(
        p99 <= Duration::from_millis(50),
        "wait returned {p99:?} after its job's end at p99"
    );
    scheduler.shutdown_within(Duration::from_secs(5)).await;
}
