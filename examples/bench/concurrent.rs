//! The `enqueue-concurrent` mode: T tasks (`--tasks`, default 16 and 64) each enqueueing
//! one job at a time for `--seconds` (default 20) through one store whose pool holds T
//! connections, as T request handlers of a service would; enqueues per second over all of
//! them. Measures whether concurrent single enqueues commit side by side or one at a time
//! (on PostgreSQL a transaction that notifies holds the server-wide notification lock
//! through its commit's flush).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{Backend, Client, NewJob, Store, StoreOptions};
use serde_json::{json, Value};

/// Enqueues per second of `tasks` tasks enqueueing one job at a time for `secs`, and the
/// row's extra fields.
pub(crate) async fn enqueue_concurrent(backend: Backend, tasks: usize, secs: u64) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let pool = u32::try_from(tasks).expect("--tasks fits a pool size");
    let store = Store::connect_with(
        &db.url,
        StoreOptions::default().pool_size(pool).migrate(true),
    )
    .await
    .expect("store");
    let client = Client::new(store);
    // Every connection opened before the clock starts.
    let warm = (0..tasks).map(|i| client.enqueue(NewJob::new("noop", json!({"warm": i}))));
    for r in futures_util::future::join_all(warm).await {
        r.expect("warm-up enqueue");
    }
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(secs);
    let workers = (0..tasks).map(|t| {
        let (client, done) = (&client, &done);
        async move {
            let mut i = 0u64;
            while Instant::now() < until {
                client
                    .enqueue(NewJob::new("noop", json!({"t": t, "i": i})))
                    .await
                    .expect("enqueue");
                i += 1;
                done.fetch_add(1, Relaxed);
            }
        }
    });
    futures_util::future::join_all(workers).await;
    let n = done.load(Relaxed);
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    (
        rate,
        json!({"tasks": tasks, "seconds": secs, "enqueued": n}),
    )
}
