//! The ordinary modes: `drain`, `enqueue`, `enqueue-batch`, `latency`, `latency-remote`.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobvisor::testing::{EnqueueParams, StoreEngine as _, TestDb};
use jobvisor::{handler_fn, Backend, Client, JobOutcome, NewJob, QueueConfig, Scheduler, Store};
use serde_json::{json, Value};

use crate::raw::RawInserter;
use crate::stages::{self, Stages};

pub(crate) async fn fill(store: &Store, n: usize) {
    let mut left = n;
    while left > 0 {
        let k = left.min(5_000);
        let jobs = (0..k).map(|_| NewJob::new("noop", json!({}))).collect();
        store
            .job_enqueue_many(EnqueueParams::many(jobs))
            .await
            .expect("pre-enqueue");
        left -= k;
    }
}

pub(crate) async fn drain(
    backend: Backend,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill(&store, n).await;
    drain_on(store, n, c, prefetch).await
}

/// Runs a scheduler on `store` until `n` jobs have finished (more may be waiting).
pub(crate) async fn drain_on(
    store: Store,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
) -> (f64, Value) {
    drain_working(vec![store], n, c, prefetch, Duration::ZERO).await
}

/// [`drain_on`] with handlers that each take `work` (a sleep) instead of returning at once,
/// on one node per store (each with concurrency `c`), until they have finished `n` between
/// them. Besides jobs per second: statements per job, the mean number of handlers running and
/// of jobs held (claimed, finish not yet confirmed) over the drain, and with several nodes each
/// node's share of the jobs as a multiple of an even split (`node_shares`, 1.0 = fair) and the
/// furthest from it (`worst_share_off`: 0.2 = 20 % off).
pub(crate) async fn drain_working(
    stores: Vec<Store>,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
    work: Duration,
) -> (f64, Value) {
    let exec = Arc::new(AtomicI64::new(0));
    let handles: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let exec = exec.clone();
            Scheduler::builder(store)
                .queue("default", {
                    let q = QueueConfig::default().concurrency(c);
                    match prefetch {
                        Some(p) => q.prefetch(p),
                        None => q,
                    }
                })
                .handler(
                    "noop",
                    handler_fn(move |_: Value, _ctx| {
                        let exec = exec.clone();
                        async move {
                            exec.fetch_add(1, Relaxed);
                            if !work.is_zero() {
                                tokio::time::sleep(work).await;
                            }
                            exec.fetch_sub(1, Relaxed);
                            JobOutcome::done()
                        }
                    }),
                )
                .start()
                .expect("scheduler")
        })
        .collect();
    let finished = || handles.iter().map(|h| h.stats().finished).sum::<u64>();
    let t0 = Instant::now();
    // Sampled every 2 ms: handlers running, and jobs the nodes hold (claimed, not yet
    // confirmed finished) — under a limit that binds, what the limit's slots are doing.
    let (mut samples, mut running, mut held) = (0u64, 0i64, 0i64);
    while finished() < n as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        samples += 1;
        running += exec.load(Relaxed);
        held += handles
            .iter()
            .map(|h| {
                let st = h.stats();
                i64::try_from(st.claimed.saturating_sub(st.finished)).unwrap_or(i64::MAX)
            })
            .sum::<i64>();
        if t0.elapsed() > Duration::from_secs(600) {
            panic!("drain did not finish: {} of {n}", finished());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let nodes = handles.len();
    let (mut claims, mut finals, mut shares) = (0, 0, Vec::with_capacity(nodes));
    for h in handles {
        let st = h.stats();
        claims += st.claim_statements;
        finals += st.finalize_statements;
        shares.push(st.finished);
        h.shutdown().await;
    }
    // Each node's share of the jobs, as a multiple of an even split (1.0 = fair), and the
    // furthest from it: the fairness column of a drain over several nodes.
    let total = shares.iter().sum::<u64>().max(1) as f64;
    let shares: Vec<f64> = shares
        .iter()
        .map(|&f| (f as f64 / total * nodes as f64 * 100.0).round() / 100.0)
        .collect();
    let worst = shares
        .iter()
        .map(|s| (s - 1.0).abs())
        .fold(0.0_f64, f64::max);
    let per = |x: u64| (x as f64 / n as f64 * 1000.0).round() / 1000.0;
    let mean = |sum: i64| (sum as f64 / samples.max(1) as f64 * 10.0).round() / 10.0;
    let stats = json!({
        "claim_stmts_per_job": per(claims),
        "finalize_stmts_per_job": per(finals),
        "mean_running": mean(running),
        "mean_held": mean(held),
    });
    let stats = if nodes > 1 {
        let mut stats = stats;
        stats["node_shares"] = json!(shares);
        stats["worst_share_off"] = json!((worst * 100.0).round() / 100.0);
        stats
    } else {
        stats
    };
    (n as f64 / secs, stats)
}

/// `n` single enqueues and `n` raw single inserts (`raw.rs`) into one database, alternating
/// in blocks of 50: each insert waits for its commit's flush, whose time drifts within a run
/// by more than the two differ, so that drift falls on both alike. Jobs/s of each: (jobvisor,
/// raw).
pub(crate) async fn enqueue_single(backend: Backend, n: usize) -> (f64, f64) {
    const BLOCK: usize = 50;
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let mut raw = RawInserter::open(backend, &db.url).await;
    let (mut ours, mut theirs) = (Duration::ZERO, Duration::ZERO);
    let mut i = 0;
    while i < n {
        let k = BLOCK.min(n - i);
        let t0 = Instant::now();
        for j in i..i + k {
            raw.insert(j).await;
        }
        theirs += t0.elapsed();
        let t0 = Instant::now();
        for j in i..i + k {
            client
                .enqueue(NewJob::new("noop", json!({"i": j})))
                .await
                .expect("enqueue");
        }
        ours += t0.elapsed();
        i += k;
    }
    (
        n as f64 / ours.as_secs_f64(),
        n as f64 / theirs.as_secs_f64(),
    )
}

pub(crate) async fn enqueue_batch(backend: Backend, n: usize) -> f64 {
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("noop", json!({"i": i})))
        .collect();
    let t0 = Instant::now();
    client.enqueue_many(jobs).await.expect("enqueue_many");
    n as f64 / t0.elapsed().as_secs_f64()
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) async fn latency(backend: Backend, n: usize, remote: bool) -> Value {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let epoch = Instant::now();
    // Per job: the pickup (ms) and the handler's start.
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let s2 = samples.clone();
    let handle = Scheduler::builder(store)
        .queue("default", QueueConfig::default())
        .handler(
            "probe",
            handler_fn(move |p: Value, _ctx| {
                let at = Instant::now();
                let started = at.duration_since(epoch).as_secs_f64() * 1000.0;
                let sent = p["t_ms"].as_f64().unwrap_or(started);
                let i = p["i"].as_u64().unwrap_or(u64::MAX);
                if let Ok(mut v) = s2.lock() {
                    v.push((i, started - sent, at));
                }
                async { JobOutcome::done() }
            }),
        )
        .start()
        .expect("scheduler");
    let client = if remote {
        Client::new(db.store().await)
    } else {
        handle.client()
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // let the node go idle
    stages::record(true);
    let mut enqueues = Vec::with_capacity(n);
    for i in 0..n {
        let sent = Instant::now();
        let t_ms = sent.duration_since(epoch).as_secs_f64() * 1000.0;
        client
            .enqueue(NewJob::new("probe", json!({"t_ms": t_ms, "i": i})))
            .await
            .expect("enqueue");
        enqueues.push((sent, Instant::now()));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    while samples.lock().map(|v| v.len()).unwrap_or(0) < n && t0.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    stages::record(false);
    let claims = stages::claims();
    let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();
    let split: Vec<Stages> = samples
        .iter()
        .filter_map(|&(i, _, started)| {
            let &(sent, enqueued) = enqueues.get(usize::try_from(i).ok()?)?;
            let claim = Stages::claim_before(&claims, started)?;
            Some(Stages::of(sent, enqueued, claim, started))
        })
        .collect();
    pickup_summary(samples.iter().map(|s| s.1).collect(), &split)
}

/// Raw SQL's pickup (`raw::raw_pickup_pg`), summarized as [`latency`]'s.
pub(crate) async fn latency_raw(n: usize) -> Value {
    let (samples, split) = crate::raw::raw_pickup_pg(n).await;
    pickup_summary(samples, &split)
}

/// Pickup samples (ms) as p50/p95/p99/max, beside the median time the enqueue (or insert)
/// itself took of them (`enqueue_p50_ms`), the medians of each stage (`stages_p50_ms`, see
/// `stages.rs`) and the slowest 1 %'s stages (`stages_tail_ms`).
fn pickup_summary(mut v: Vec<f64>, split: &[Stages]) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return json!({"error": "no samples"});
    }
    let mut enqueues: Vec<f64> = split.iter().map(|s| s.enqueue).collect();
    enqueues.sort_by(|a, b| a.total_cmp(b));
    json!({
        "p50_ms": (percentile(&v, 0.50) * 100.0).round() / 100.0,
        "p95_ms": (percentile(&v, 0.95) * 100.0).round() / 100.0,
        "p99_ms": (percentile(&v, 0.99) * 100.0).round() / 100.0,
        "max_ms": (v[v.len() - 1] * 100.0).round() / 100.0,
        "enqueue_p50_ms": enqueues.get(enqueues.len() / 2).map(|x| (x * 100.0).round() / 100.0),
        "stages_p50_ms": stages::summary(split),
        "stages_tail_ms": stages::tail(split),
        "samples": v.len(),
    })
}
