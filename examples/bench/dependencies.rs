//! The `deps` mode: what a dependency edge costs, against plain jobs in the same run.
//!
//! * fan-in: `--fan` (default 10,000) jobs enqueued as one batch with a callback, drained,
//!   against the same number of plain jobs plus one, enqueued in one call and drained; timed
//!   from just before the enqueue to the last finish. `per_edge_us` = the difference divided
//!   by the edges.
//! * chain: `--chain` (default 1,000) jobs, each `after` the one before, all enqueued first,
//!   against the same chain built by hand (each handler enqueues its successor through
//!   `ctx.client()`); timed from the first enqueue to the last finish. `per_edge_us` = the
//!   difference divided by the edges (a negative number: the dependency chain is faster).

use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{
    handler_fn, Backend, JobError, JobId, JobOutcome, NewJob, QueueConfig, Scheduler,
    SchedulerHandle, Store,
};
use serde_json::{json, Value};

/// A node with handlers `noop` and `link` (enqueues `link` with `left - 1` until 0).
fn node(store: Store, c: u32) -> SchedulerHandle {
    Scheduler::builder(store)
        .queue("default", QueueConfig::default().concurrency(c))
        .handler(
            "noop",
            handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
        )
        .handler(
            "link",
            handler_fn(|p: Value, ctx| async move {
                let left = p["left"].as_u64().unwrap_or(0);
                if left > 0 {
                    let next = NewJob::new("link", json!({ "left": left - 1 }));
                    ctx.client()?.enqueue(next).await.map_err(JobError::retry)?;
                }
                JobOutcome::done()
            }),
        )
        .start()
        .expect("scheduler")
}

async fn until_finished(h: &SchedulerHandle, n: u64, t0: Instant) -> f64 {
    while h.stats().finished < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "stuck at {} of {n}",
            h.stats().finished
        );
    }
    t0.elapsed().as_secs_f64()
}

/// One scenario on a fresh database: `enqueue` runs on the node's client, then the node runs
/// until `n` jobs have finished. Seconds from just before the enqueue.
async fn timed(
    backend: Backend,
    c: u32,
    n: u64,
    enqueue: impl AsyncFnOnce(&jobvisor::Client),
) -> f64 {
    let db = TestDb::create(backend).await;
    let h = node(db.store().await, c);
    let client = h.client();
    let t0 = Instant::now();
    enqueue(&client).await;
    let secs = until_finished(&h, n, t0).await;
    h.shutdown().await;
    secs
}

/// Runs the mode; returns `(bench, jobs, extra)` rows.
pub(crate) async fn deps(
    backend: Backend,
    fan: usize,
    chain: usize,
    c: u32,
) -> Vec<(String, usize, Value)> {
    let mut rows = Vec::new();
    let noop = |i: usize| NewJob::new("noop", json!({ "i": i }));

    let plain = timed(backend, c, fan as u64 + 1, async |client| {
        client
            .enqueue_many((0..=fan).map(noop).collect())
            .await
            .expect("enqueue");
    })
    .await;
    let fan_in = timed(backend, c, fan as u64 + 1, async |client| {
        client
            .enqueue_batch((0..fan).map(noop).collect(), noop(fan))
            .await
            .expect("batch");
    })
    .await;
    rows.push((
        "deps-fan-in".to_string(),
        fan,
        json!({
            "plain_ms": (plain * 1000.0).round(),
            "batch_ms": (fan_in * 1000.0).round(),
            "ratio_to_plain": (fan_in / plain * 100.0).round() / 100.0,
            "per_edge_us": ((fan_in - plain) / fan as f64 * 1e6 * 10.0).round() / 10.0,
        }),
    ));

    let by_hand = timed(backend, c, chain as u64, async |client| {
        let first = NewJob::new("link", json!({ "left": chain - 1 }));
        client.enqueue(first).await.expect("enqueue");
    })
    .await;
    let linked = timed(backend, c, chain as u64, async |client| {
        let mut prev: Option<JobId> = None;
        for i in 0..chain {
            let job = match prev {
                Some(p) => noop(i).after(&[p]),
                None => noop(i),
            };
            prev = Some(client.enqueue(job).await.expect("enqueue").id);
        }
    })
    .await;
    let edges = chain.saturating_sub(1).max(1) as f64;
    rows.push((
        "deps-chain".to_string(),
        chain,
        json!({
            "by_hand_ms": (by_hand * 1000.0).round(),
            "after_ms": (linked * 1000.0).round(),
            "ratio_to_by_hand": (linked / by_hand * 100.0).round() / 100.0,
            "per_edge_us": ((linked - by_hand) / edges * 1e6 * 10.0).round() / 10.0,
        }),
    ));
    rows
}
