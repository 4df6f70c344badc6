//! jobvisor under plain tokio, with no actix system anywhere: `Scheduler::start()` puts the
//! actors on a `jobvisor-actors` thread of their own, jobs run end to end, a handler enqueues
//! a follow-up through `ctx.client()` (and may `tokio::spawn`), the handle's client works
//! from the caller's runtime, and after shutdown the application's client still works.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use jobvisor::testing::TestDb;
use jobvisor::{
    handler_fn, Backend, JobContext, JobId, JobOutcome, JobState, NewJob, QueueConfig, Scheduler,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// The tests count `jobvisor-actors` threads: one at a time (each leaves its idle thread).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Threads of this process with this name (Linux: `/proc/self/task/*/comm`).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.trim_end() == name)
                .count()
        })
        .unwrap_or(0)
}

async fn pipeline_under_plain_tokio(backend: Backend) {
    assert!(
        actix::System::try_current().is_none(),
        "this test must run outside any actix system"
    );
    let _one = ONE_AT_A_TIME.lock().await;
    let db = TestDb::create(backend).await;
    let actor_threads_before = threads_named("jobvisor-actors");
    let scheduler = Scheduler::builder(db.store().await)
        .queue(
            "default",
            QueueConfig::default().poll_interval(Duration::from_millis(50)),
        )
        .handler(
            "first",
            handler_fn(|n: i64, ctx: JobContext| async move {
                // The follow-up, keyed by this job so a retried attempt does not add another.
                let next = ctx
                    .client()?
                    .enqueue(
                        NewJob::new("second", json!(n + 1)).unique_key(format!("after:{}", ctx.id)),
                    )
                    .await?;
                JobOutcome::success(next.id)
            }),
        )
        .handler(
            "second",
            handler_fn(|n: i64, _ctx| async move {
                // Handlers run on a tokio runtime: tokio::spawn works there.
                let doubled = tokio::spawn(async move { n * 2 }).await?;
                JobOutcome::success(doubled)
            }),
        )
        .start()
        .unwrap();
    let actor_threads = threads_named("jobvisor-actors");
    assert!(
        actor_threads > actor_threads_before,
        "the actors got a thread of their own: {actor_threads_before} -> {actor_threads}"
    );

    let client = scheduler.client();
    let first = client
        .enqueue(NewJob::new("first", json!(20)))
        .await
        .unwrap()
        .id;
    let done = client.wait(first, WAIT).await.unwrap();
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    let second: JobId = serde_json::from_value(done.result.unwrap()).unwrap();
    let second = client.wait(second, WAIT).await.unwrap();
    assert_eq!(
        (second.state, second.result, second.attempts),
        (JobState::Succeeded, Some(json!(42)), 1)
    );
    assert_eq!(second.unique_key, Some(format!("after:{first}")));
    // The database shows a job done once its finalization commits; the node counts it when
    // the confirmation reaches its actor, a moment later.
    let counted = tokio::time::Instant::now() + WAIT;
    while scheduler.stats().finished < 2 && tokio::time::Instant::now() < counted {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(scheduler.stats().finished >= 2, "{:?}", scheduler.stats());

    let report = scheduler.shutdown().await;
    assert_eq!(report.released, 0, "{report:?}");
    // The application's client goes on working after shutdown: the pool's connections the
    // actors opened are still driven by their (now idle) thread.
    for _ in 0..3 {
        assert_eq!(client.get(first).await.unwrap().state, JobState::Succeeded);
    }
    // The handle stays usable: a second shutdown answers at once, nothing to do.
    assert_eq!(
        scheduler.shutdown().await,
        jobvisor::ShutdownReport::default()
    );
}

/// `#[tokio::test]` is a current-thread runtime: starting must not wait on it.
#[tokio::test]
async fn sqlite_on_a_current_thread_runtime() {
    pipeline_under_plain_tokio(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_on_a_multi_thread_runtime() {
    pipeline_under_plain_tokio(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_on_a_multi_thread_runtime() {
    pipeline_under_plain_tokio(Backend::Mysql).await;
}

/// A synchronous `main` (no runtime at all) can start the scheduler too.
#[test]
fn from_a_plain_thread_with_no_runtime() {
    let _one = ONE_AT_A_TIME.blocking_lock();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::create(Backend::Sqlite));
    let store = rt.block_on(db.store());
    let scheduler = Scheduler::builder(store)
        .queue("default", QueueConfig::default())
        .handler(
            "hello",
            handler_fn(|_: serde_json::Value, _ctx| async { JobOutcome::success("hi") }),
        )
        .start()
        .unwrap();
    let client = scheduler.client();
    let job = rt.block_on(async {
        let id = client
            .enqueue(NewJob::new("hello", json!({})))
            .await
            .unwrap()
            .id;
        client.wait(id, WAIT).await.unwrap()
    });
    assert_eq!(
        (job.state, job.result),
        (JobState::Succeeded, Some(json!("hi")))
    );
    rt.block_on(scheduler.shutdown());
}
