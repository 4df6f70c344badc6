//! Graceful shutdown with a wait longer than the lease, on every backend: the node keeps
//! renewing the leases of the jobs it waits for, so a job that finishes during the wait
//! succeeds, and one still running at the deadline is given back — `pending`, its attempt
//! not counted, no `fenced` error — instead of being fenced at the fence point
//! (lease − fence margin) and burning an attempt.
//!
//! Scaled down from the defaults (lease 30 s, fence margin 5 s, wait 30 s): lease 3 s,
//! fence margin 0.5 s, so the fence point is 2.5 s after the last renewal; the shutdown wait
//! is 4 s, longer than the lease itself.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use jobvisor::testing::TestDb;
use jobvisor::{
    handler_fn, Backend, Event, JobOutcome, JobState, NewJob, QueueConfig, Scheduler,
    SchedulerConfig,
};
use serde_json::Value;

const LEASE: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(4);

async fn shutdown_renews_while_it_waits_and_gives_back_what_still_runs(backend: Backend) {
    let db = TestDb::create(backend).await;
    let scheduler = Scheduler::builder(db.store().await)
        .config(
            SchedulerConfig::default()
                .lease(LEASE)
                .renew_every(Duration::from_secs(1))
                .deadline_check_every(Duration::from_millis(50))
                .shutdown_timeout(WAIT),
        )
        .queue(
            "default",
            QueueConfig::default().poll_interval(Duration::from_millis(50)),
        )
        // A 60 s job: still running when the wait ends.
        .handler(
            "long",
            handler_fn(|_: Value, _ctx| async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                JobOutcome::success(())
            }),
        )
        // Ends 3.5 s after its start: during the wait, after the fence point.
        .handler(
            "medium",
            handler_fn(|_: Value, _ctx| async move {
                tokio::time::sleep(Duration::from_millis(3500)).await;
                JobOutcome::success(())
            }),
        )
        .start()
        .unwrap();
    let mut events = scheduler.events();
    let client = scheduler.client();
    let long = client
        .enqueue(NewJob::new("long", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let medium = client
        .enqueue(NewJob::new("medium", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let mut started = 0;
    while started < 2 {
        let e = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("both handlers start within 10 s")
            .unwrap();
        if matches!(e, Event::Started { .. }) {
            started += 1;
        }
    }
    // The configured wait, as SIGTERM handling calls it.
    let report = scheduler.shutdown().await;
    let mut fenced = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let Event::SelfFenced { id, .. } | Event::LeaseLost { id, .. } = e {
            fenced.push(id);
        }
    }
    assert!(
        fenced.is_empty(),
        "[{backend:?}] fenced or lost: {fenced:?}"
    );
    assert_eq!(
        (report.finished, report.released),
        (1, 1),
        "[{backend:?}] one finished during the wait, one given back: {report:?}"
    );
    let job = client.get(long).await.unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Pending, 0),
        "[{backend:?}] given back with its attempt not counted: {job:?}"
    );
    assert!(
        job.last_error.is_none(),
        "[{backend:?}] no fenced error: {:?}",
        job.last_error
    );
    assert!(job.lease.is_none(), "[{backend:?}] {job:?}");
    let job = client.get(medium).await.unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Succeeded, 1),
        "[{backend:?}] finished during the wait: {job:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    shutdown_renews_while_it_waits_and_gives_back_what_still_runs(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    shutdown_renews_while_it_waits_and_gives_back_what_still_runs(Backend::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    shutdown_renews_while_it_waits_and_gives_back_what_still_runs(Backend::Sqlite).await;
}
