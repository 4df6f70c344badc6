//! The database outage test: the server stops for 30 s under a running scheduler (in this
//! process), on PostgreSQL and MariaDB/MySQL. While it is down the running job must fence
//! itself before its lease could expire, store errors must be logged a bounded number of
//! times (not per attempt), the process must not spin, and every actor must still answer;
//! afterwards work resumes by itself, and the fenced job is reclaimed and runs again.
//!
//! The server is a private one of the test's own (`tests/harness/server.rs`), stopped and
//! removed afterwards; the machine's shared servers are never touched. The tests are
//! `#[ignore]`d (30 s each, root for the private server); `.ci/crash` runs them:
//!
//! ```sh
//! cargo test --all-features --test outage -- --ignored --test-threads=1 --nocapture
//! ```

#![allow(clippy::unwrap_used)]

mod harness;

use std::time::{Duration, Instant};

use jobvisor::scheduler::Event;
use jobvisor::testing::NodeActors as _;
use jobvisor::{
    handler_fn, Backend, JobContext, JobError, JobId, JobOutcome, JobState, NewJob, QueueConfig,
    RetryPolicy, Scheduler, SchedulerConfig,
};
use serde_json::json;

use harness::server::TestDatabase;
use harness::RunDir;

#[test]
#[ignore = "stops a private PostgreSQL server for 30 s; run with .ci/crash"]
fn outage_postgres() {
    outage(Backend::Postgres);
}

#[test]
#[ignore = "stops a private MariaDB server for 30 s; run with .ci/crash"]
fn outage_mysql() {
    outage(Backend::Mysql);
}

/// CPU time this process has used (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// While the server is down for 30 s: the running job fences itself before its lease could
/// expire, store errors are logged a bounded number of times (not per attempt), the process
/// does not spin, and every actor still answers. Afterwards work resumes by itself, and the
/// fenced job is reclaimed and runs again.
fn outage(backend: Backend) {
    const DOWN: Duration = Duration::from_secs(30);
    // The scheduler's log (`RUST_LOG`, by default jobvisor at debug) and its events, each
    // with the time it was seen, go to files kept when the test fails.
    let dir = RunDir::new(
        "outage",
        tempfile::Builder::new()
            .prefix("jobvisor-outage-")
            .tempdir()
            .unwrap(),
    );
    let log = std::fs::File::create(dir.path().join("scheduler.log")).unwrap();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "jobvisor=debug".into()),
        )
        .with_writer(std::sync::Mutex::new(log))
        .with_ansi(false)
        .try_init();
    let events_log = dir.path().join("events.log");
    let mut db = TestDatabase::create(backend, "outage");
    let mut server = db
        .server
        .take()
        .expect("PostgreSQL and MariaDB have a server");
    actix::System::new().block_on(async move {
        let store = db.store().await;
        let lease = Duration::from_secs(6);
        // Executions of the long job: the first runs until it is stopped.
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let handle = Scheduler::builder(store)
            .config(
                SchedulerConfig::default()
                    .lease(lease)
                    .renew_every(Duration::from_secs(2))
                    .sweep_every(Duration::from_secs(1))
                    .deadline_check_every(Duration::from_millis(100))
                    .retry(RetryPolicy::fixed(Duration::from_millis(200))),
            )
            .queue("default", QueueConfig::default().poll_interval(Duration::from_millis(200)))
            .handler("long", {
                let runs = runs.clone();
                handler_fn(move |_: serde_json::Value, ctx: JobContext| {
                    let first = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                    async move {
                        if first {
                            ctx.cancelled().await; // runs until stopped
                            return Err(JobError::retry("stopped"));
                        }
                        JobOutcome::success(ctx.attempt)
                    }
                })
            })
            .handler("quick", handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::done() }))
            .start()
            .unwrap();
        let client = handle.client();
        let mut all_events = handle.events();
        actix::spawn(async move {
            use std::io::Write as _;
            let mut f = std::fs::File::create(events_log).unwrap();
            while let Ok(e) = all_events.recv().await {
                let _ = writeln!(f, "{} {e:?}", chrono::Utc::now().format("%H:%M:%S%.6f"));
            }
        });
        let mut events = handle.events();
        let long = client.enqueue(NewJob::new("long", json!({}))).await.unwrap().id;
        loop {
            if let Ok(Event::Started { id, .. }) = events.recv().await {
                if id == long {
                    break;
                }
            }
        }
        // Stop the server on another thread; watch the node meanwhile.
        let cpu0 = cpu_time();
        let stopped_at = Instant::now();
        let outage = std::thread::spawn(move || {
            let down = server.restart(DOWN);
            (server, down)
        });
        let mut fenced_after = None;
        let mut store_errors = 0;
        while !outage.is_finished() {
            match tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
                Ok(Ok(Event::SelfFenced { id, .. })) if id == long => fenced_after = Some(stopped_at.elapsed()),
                Ok(Ok(Event::StoreUnavailable { .. })) => store_errors += 1,
                _ => {}
            }
        }
        let (_server, down) = outage.join().unwrap();
        let down = down.unwrap();
        let cpu = cpu_time() - cpu0;
        eprintln!(
            "outage {backend:?}: down {down:?}, fenced after {fenced_after:?}, {store_errors} store errors logged, \
             {cpu:?} CPU"
        );
        let fenced_after = fenced_after.expect("the running job never fenced itself");
        assert!(fenced_after < lease, "fenced after {fenced_after:?}: not before its {lease:?} lease could expire");
        // Each actor logs at most once per interval (30–60 s): a handful, not one per retry.
        assert!(store_errors <= 12, "{store_errors} store errors logged in {down:?}: logged per attempt");
        assert!(cpu < DOWN / 5, "{cpu:?} of CPU in a {down:?} outage: a busy loop");
        // No actor died: each still answers.
        let status = handle.fetcher("default").unwrap().send(jobvisor::testing::GetFetcherStatus).await.unwrap();
        assert!(status.claiming_enabled);
        handle.lease_manager().send(jobvisor::testing::GetLeaseManagerStatus).await.unwrap();
        // Work resumes by itself; the fenced job is reclaimed and runs again.
        let ids: Vec<JobId> = client
            .enqueue_many((0..20).map(|i| NewJob::new("quick", json!(i))).collect())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        for id in ids {
            let job = client.wait(id, Duration::from_secs(60)).await.unwrap();
            assert_eq!(job.state, JobState::Succeeded);
        }
        let job = client.wait(long, Duration::from_secs(60)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2, "it ran again, once");
        // Its first attempt either was given back by its node once the handler stopped
        // (`fenced`, counted), or was reclaimed by the sweeper first: counted (`lease_expired`)
        // if a heartbeat had recorded its start before the outage, else refunded
        // (`not_started`).
        let code = job.errors[0].code.as_str();
        let expect_attempts = if code == "not_started" { 1 } else { 2 };
        assert!(
            matches!(code, "fenced" | "lease_expired" | "not_started"),
            "first attempt ended {code}"
        );
        assert_eq!(job.attempts, expect_attempts, "{:?}", job.errors);
        handle.shutdown().await;
    });
}
