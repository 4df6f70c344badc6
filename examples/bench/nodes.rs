//! The `nodes` mode: the drain of `modes::drain` by K node **processes** (this binary,
//! started again with `--serve-node`) of concurrency C each, against one node process of
//! concurrency K×C — the same total — alternating for `--rounds` rounds on fresh databases.
//! Reports each drain's jobs per second, the median ratio of K processes to one, and each
//! process's share of the jobs it started (an even split is 1/K).
//!
//! Each drain: the node processes start on an empty queue and say when they run; then this
//! process enqueues the N jobs in one call (so every node sees them at once: a
//! notification on PostgreSQL, the change signal elsewhere) and times from the enqueue's
//! return until the database counts N succeeded jobs (read every 20 ms).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, Client, JobOutcome, JobState, NewJob, QueueConfig, Scheduler};
use serde_json::{json, Value};

/// The node process: `--serve-node <url> <concurrency>`. Prints `ready` once its scheduler
/// runs, then `started <n>` after its standard input closes and it has shut down.
pub(crate) async fn serve_node(url: &str, c: u32) {
    let store = jobvisor::Store::connect(url).await.expect("connect");
    let started = Arc::new(AtomicU64::new(0));
    let count = started.clone();
    let sched = Scheduler::builder(store)
        .queue("default", QueueConfig::default().concurrency(c))
        .handler(
            "noop",
            handler_fn(move |_: Value, _ctx| {
                count.fetch_add(1, Relaxed);
                async { JobOutcome::done() }
            }),
        )
        .start()
        .expect("start");
    println!("ready");
    std::io::stdout().flush().ok();
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    })
    .await
    .ok();
    sched.shutdown_within(Duration::from_secs(10)).await;
    println!("started {}", started.load(Relaxed));
}

/// One drain of `n` jobs by `procs` node processes of concurrency `c` each: jobs per second
/// and each process's share of the starts.
pub(crate) async fn drain_processes(
    backend: Backend,
    n: usize,
    c: u32,
    procs: usize,
) -> (f64, Vec<f64>) {
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let exe = std::env::current_exe().expect("own path");
    let mut children: Vec<(Child, BufReader<std::process::ChildStdout>)> = (0..procs)
        .map(|_| {
            let mut child = Command::new(&exe)
                .args(["--serve-node", &db.url, &c.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a node process");
            let out = BufReader::new(child.stdout.take().expect("stdout"));
            (child, out)
        })
        .collect();
    for (_, out) in &mut children {
        let mut line = String::new();
        out.read_line(&mut line).expect("node output");
        assert_eq!(line.trim(), "ready", "a node process failed to start");
    }
    // Registered and settled (first claims, the signal's first read).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new("noop", json!({}))).collect();
    client.enqueue_many(jobs).await.expect("enqueue");
    let t0 = Instant::now();
    loop {
        let done: u64 = client
            .counts()
            .await
            .expect("counts")
            .iter()
            .filter(|s| s.state == JobState::Succeeded)
            .map(|s| s.count)
            .sum();
        if done >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    let mut shares = Vec::new();
    for (mut child, mut out) in children {
        drop(child.stdin.take());
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|k| k > 0) {
            if let Some(v) = line.trim().strip_prefix("started ") {
                shares.push(v.parse::<f64>().unwrap_or(0.0) / n as f64);
            }
            line.clear();
        }
        child.wait().ok();
    }
    (rate, shares)
}

/// `--rounds` alternating pairs: K processes of C, one process of K×C. The row's figures.
pub(crate) async fn nodes_vs_one(
    backend: Backend,
    n: usize,
    c: u32,
    procs: usize,
    rounds: usize,
) -> Value {
    let (mut many, mut one, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    let total = c * u32::try_from(procs).unwrap_or(1);
    for _ in 0..rounds {
        let (r, s) = drain_processes(backend, n, c, procs).await;
        many.push(r);
        shares.push(s);
        let (r, _) = drain_processes(backend, n, total, 1).await;
        one.push(r);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (m, o) = (median(&mut many.clone()), median(&mut one.clone()));
    json!({
        "processes": procs,
        "concurrency_each": c,
        "jobs_per_sec_processes": many.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "jobs_per_sec_one": one.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "median_processes": m.round(),
        "median_one": o.round(),
        "ratio_processes_to_one": (m / o * 100.0).round() / 100.0,
        "shares": shares
            .iter()
            .map(|s| s.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
    })
}
