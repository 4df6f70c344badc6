//! The `limits` mode: the drain of `modes::drain` with queue limits set, each as a ratio to
//! an unlimited drain measured in the same run, alternating so drift hits both alike:
//! `drain-limit-global` (a global concurrency limit equal to the nodes' concurrency, so it
//! binds: prefetched jobs count, and every claim and finalization carries at most that many
//! jobs), `drain-limit-loose` (a limit of 100,000, which never binds: the cost of the
//! controlled claim alone) and `drain-limit-partitions` (jobs spread over 100 partitions,
//! each limited to 1 running job). The named mode `limits-burst` drains the partitioned jobs
//! with a backlog of one more partition ahead of them in claim order (`drain-limit-burst`:
//! one tenant's burst), as a ratio to the same drain without it.

use jobvisor::testing::{EnqueueParams, StoreEngine as _, TestDb};
use jobvisor::{Backend, Client, NewJob, QueueLimits};
use serde_json::{json, Value};

use std::time::Duration;

use crate::modes::{drain_working, fill};

/// Which limit a drain runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    None,
    Global,
    Loose,
    Partitions,
    /// `Partitions` behind a backlog of this many jobs of one more partition.
    Burst(usize),
}

/// Enqueues `n` no-op jobs, the `i`-th in partition `key(i)`.
async fn fill_keyed(store: &jobvisor::Store, n: usize, key: impl Fn(usize) -> String) {
    let mut done = 0;
    while done < n {
        let k = (n - done).min(5_000);
        let jobs = (done..done + k)
            .map(|i| NewJob::new("noop", json!({})).partition(key(i)))
            .collect();
        store
            .job_enqueue_many(EnqueueParams::many(jobs))
            .await
            .expect("pre-enqueue");
        done += k;
    }
}

/// One drain of `n` jobs by `nodes` nodes at concurrency `c` each under `limit`, each job
/// taking `work`: jobs per second and the drain's statement counts.
pub(crate) async fn drain_limited(
    backend: Backend,
    n: usize,
    c: u32,
    nodes: usize,
    prefetch: Option<u32>,
    limit: Limit,
    work: Duration,
) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let client = Client::new(store.clone());
    let total = c.saturating_mul(u32::try_from(nodes).unwrap_or(u32::MAX));
    match limit {
        Limit::None => fill(&store, n).await,
        Limit::Global => {
            fill(&store, n).await;
            client
                .set_queue_limits("default", QueueLimits::default().concurrency(total))
                .await
                .expect("limit");
        }
        Limit::Loose => {
            fill(&store, n).await;
            client
                .set_queue_limits("default", QueueLimits::default().concurrency(100_000))
                .await
                .expect("limit");
        }
        Limit::Partitions | Limit::Burst(_) => {
            if let Limit::Burst(backlog) = limit {
                fill_keyed(&store, backlog, |_| "burst".into()).await;
            }
            fill_keyed(&store, n, |i| format!("p{}", i % 100)).await;
            client
                .set_queue_limits("default", QueueLimits::default().per_partition(1))
                .await
                .expect("limit");
        }
    }
    let mut stores = vec![store];
    for _ in 1..nodes {
        stores.push(db.store().await);
    }
    drain_working(stores, n, c, prefetch, work).await
}
