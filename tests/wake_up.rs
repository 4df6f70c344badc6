//! Wake-ups across processes: a job enqueued through another store — as another process
//! would — starts on an idle node well within its poll interval, on every backend: by the
//! insert's notification on PostgreSQL, by the queue watch's change signal (read every
//! 50 ms) on MariaDB and SQLite. The node polls every 30 s, so only a wake-up can start the
//! jobs in time.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, Client, JobOutcome, NewJob, QueueConfig, Scheduler};
use serde_json::Value;
use tokio::sync::mpsc;

async fn another_process_s_job_starts_at_once(backend: Backend) {
    let db = TestDb::create(backend).await;
    let (started, mut starts) = mpsc::unbounded_channel::<Instant>();
    let scheduler = Scheduler::builder(db.store().await)
        .queue(
            "default",
            QueueConfig::default().poll_interval(Duration::from_secs(30)),
        )
        .handler(
            "ping",
            handler_fn(move |_: Value, _ctx| {
                let started = started.clone();
                async move {
                    let _ = started.send(Instant::now());
                    JobOutcome::success(())
                }
            }),
        )
        .start()
        .unwrap();
    // The other "process": a store and client of its own, which cannot wake the node.
    let other = Client::new(db.store().await);
    // Let the node settle (its first claims and its first read of the signal).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut waits = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        other
            .enqueue(NewJob::new("ping", serde_json::json!(0)))
            .await
            .unwrap();
        let at = tokio::time::timeout(Duration::from_secs(5), starts.recv())
            .await
            .expect("started within 5 s, not at the 30 s poll")
            .unwrap();
        waits.push(at - t0);
        // Apart, so that each is a fresh wake-up of an idle node.
        tokio::time::sleep(Duration::from_millis(137)).await;
    }
    waits.sort_unstable();
    eprintln!(
        "wake-up [{backend:?}]: enqueue to start p50 {:?}, max {:?} (10 jobs)",
        waits[waits.len() / 2],
        waits[waits.len() - 1]
    );
    assert!(
        waits[waits.len() - 1] < Duration::from_secs(1),
        "a job of another process waited {:?} for an idle node",
        waits[waits.len() - 1]
    );
    scheduler.shutdown_within(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    another_process_s_job_starts_at_once(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    another_process_s_job_starts_at_once(Backend::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    another_process_s_job_starts_at_once(Backend::Sqlite).await;
}
