//! The soak test: many short jobs (`JOBVISOR_SOAK_JOBS`, default 100,000) through three node
//! processes (`examples/crash_node/main.rs`) on PostgreSQL; each node's resident memory must
//! stay flat — no growth per job.
//!
//! The database is a private server of the test's own (`tests/harness/server.rs`), stopped
//! and removed afterwards. The test is `#[ignore]`d (minutes of work); `.ci/crash` runs it
//! with 30,000 jobs:
//!
//! ```sh
//! JOBVISOR_SOAK_JOBS=30000 cargo test --all-features --test soak -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used)]

mod harness;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::Backend;

use harness::server::TestDatabase;
use harness::{enqueue, env_number, node_binary, progress, RunDir, QUEUE};

#[test]
#[ignore = "runs 100,000 jobs through three node processes; run with .ci/crash"]
fn soak_postgres() {
    soak(Backend::Postgres);
}

/// Resident memory of a process, from /proc.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `JOBVISOR_SOAK_JOBS` (default 100,000) short jobs through three nodes, sampling each
/// node's RSS every second. After a warm-up of the first 10 % of jobs, the nodes' memory at the
/// end must be within 20 % (+ 8 MiB) of what it was at the start: no growth per job.
fn soak(backend: Backend) {
    let total: usize = env_number("JOBVISOR_SOAK_JOBS").unwrap_or(100_000);
    let bin = node_binary();
    let dir = RunDir::new("soak", tempfile::tempdir().unwrap());
    let db = TestDatabase::create(backend, "soak");
    actix::System::new().block_on(async move {
        let store = db.store().await;
        let mut next = 0;
        assert!(enqueue(&store, &mut next, total).await, "enqueue failed");
        let mut nodes: Vec<Child> = (1..=3)
            .map(|i| {
                let log = std::fs::File::create(dir.path().join(format!("soak{i}.log"))).unwrap();
                Command::new(&bin)
                    .arg(&db.url)
                    .arg(format!("soak{i}"))
                    .args(["--queue", QUEUE, "--concurrency", "8", "--max-work-ms", "2"])
                    .stdin(Stdio::piped())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .unwrap()
            })
            .collect();
        let started = Instant::now();
        let mut samples: Vec<(f64, usize, Vec<u64>)> = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let p = progress(&store).await.unwrap();
            let rss: Vec<u64> = nodes.iter().map(|c| rss_kib(c.id()).unwrap_or(0)).collect();
            samples.push((started.elapsed().as_secs_f64(), p.terminal, rss));
            assert!(
                nodes.iter_mut().all(|c| c.try_wait().unwrap().is_none()),
                "a soak node died"
            );
            if p.terminal >= total {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "soak did not finish: {p:?}"
            );
        }
        for c in &mut nodes {
            drop(c.stdin.take()); // graceful stop
            let _ = c.wait();
        }
        eprintln!(
            "soak {backend:?}: {total} jobs in {:.0} s; RSS per node (KiB) over time:",
            started.elapsed().as_secs_f64()
        );
        let step = (samples.len() / 12).max(1);
        for (t, done, rss) in samples.iter().step_by(step) {
            eprintln!("  {t:6.0} s  {done:>7} done  {rss:?}");
        }
        let warm = samples.iter().position(|s| s.1 >= total / 10).unwrap_or(0);
        let (first, last) = (&samples[warm].2, &samples[samples.len() - 1].2);
        eprintln!("  start (after warm-up) {first:?} KiB, end {last:?} KiB");
        for (a, b) in first.iter().zip(last) {
            assert!(
                *b as f64 <= *a as f64 * 1.2 + 8192.0,
                "memory grew from {a} KiB to {b} KiB over {total} jobs"
            );
        }
    });
}
