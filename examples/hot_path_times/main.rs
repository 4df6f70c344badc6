//! Times the largest hot-path operations the scheduler sends, per backend, to check that
//! `StoreOptions::statement_timeout` never aborts a healthy one: a 1,000-job enqueue, a
//! 500-job claim (the default queue's claim chunk), a renewal of 1,000 leases, a 1,000-job
//! finalization (the lease manager's largest flush) and a 100-job reclaim (the sweeper's
//! batch).
//!
//! ```sh
//! cargo run --release --features test-util --example hot_path_times
//! cargo run --release --features test-util --example hot_path_times -- --backend postgres --rounds 50
//! ```
//!
//! Each operation runs `--rounds` times (default 20) on a fresh isolated database, with the
//! default options; prints p50, p99 and max per operation and backend, and one JSON line each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobvisor::testing::{
    ClaimParams, EnqueueParams, Finalize, FinalizeParams, LeaseRef, ReclaimParams, RenewParams,
    StoreEngine as _, TestDb,
};
use jobvisor::{Backend, NewJob, NodeId, StoreOptions};
use serde_json::json;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run(b: Backend, rounds: usize) -> jobvisor::Result<()> {
    let db = TestDb::create(b).await;
    let store = db.store_with(StoreOptions::default()).await;
    let mut times: Vec<(&str, Vec<Duration>)> = [
        "enqueue_1000",
        "claim_500",
        "renew_1000",
        "finalize_1000",
        "reclaim_100",
    ]
    .into_iter()
    .map(|n| (n, Vec::new()))
    .collect();
    let owner = NodeId::new("timer")?;
    for round in 0..rounds {
        let jobs: Vec<NewJob> = (0..1000)
            .map(|i| NewJob::new("k", json!({"round": round, "i": i, "pad": "x".repeat(100)})))
            .collect();
        let t = Instant::now();
        store.job_enqueue_many(EnqueueParams::many(jobs)).await?;
        times[0].1.push(t.elapsed());
        let mut held = Vec::new();
        for _ in 0..2 {
            let t = Instant::now();
            let c = store
                .job_claim(ClaimParams {
                    queue: "default".into(),
                    owner: owner.clone(),
                    limit: 500,
                    kinds: None,
                    lease: Duration::from_secs(30),
                    now: None,
                })
                .await?;
            times[1].1.push(t.elapsed());
            held.extend(c);
        }
        let t = Instant::now();
        store
            .job_renew_leases(RenewParams {
                timeout_grace: Duration::from_secs(10),
                leases: held
                    .iter()
                    .map(|c| LeaseRef {
                        started_ago: None,
                        progress: None,
                        id: c.id,
                        token: c.token.clone(),
                    })
                    .collect(),
                lease: Duration::from_secs(30),
                now: None,
            })
            .await?;
        times[2].1.push(t.elapsed());
        // 900 succeed; 100 are left to expire and be reclaimed.
        let (done, expire) = held.split_at(held.len().saturating_sub(100));
        let mut items: Vec<Finalize> = done
            .iter()
            .map(|c| Finalize::succeeded(c.id, c.token.clone(), json!({"ok": true})))
            .collect();
        // Make it 1,000 with 100 stale ones (guarded, refused): the same statement size.
        items.extend(expire.iter().map(|c| {
            Finalize::succeeded(c.id, jobvisor::testing::LeaseToken::generate(), json!(null))
        }));
        let t = Instant::now();
        store
            .job_finalize_many(FinalizeParams { items, now: None })
            .await?;
        times[3].1.push(t.elapsed());
        let t = Instant::now();
        store
            .job_reclaim_expired(ReclaimParams {
                limit: 100,
                backoff: Arc::new(|_| Duration::from_secs(1)),
                // An hour later: every lease of this round has expired.
                now: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
            })
            .await?;
        times[4].1.push(t.elapsed());
    }
    for (name, mut v) in times {
        v.sort();
        let (p50, p99, max) = (pct(&v, 0.5), pct(&v, 0.99), pct(&v, 1.0));
        println!(
            "{:<9} {name:<14} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms",
            format!("{b:?}"),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
        println!(
            "{}",
            json!({"bench": "hot_path_times", "backend": format!("{b:?}"), "op": name,
                   "rounds": v.len(), "p50_ms": p50.as_secs_f64() * 1e3,
                   "p99_ms": p99.as_secs_f64() * 1e3, "max_ms": max.as_secs_f64() * 1e3})
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> jobvisor::Result<()> {
    let mut backends = vec![Backend::Postgres, Backend::Mysql, Backend::Sqlite];
    let mut rounds = 20;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--backend", Some(v)) => {
                backends = vec![match v.as_str() {
                    "postgres" => Backend::Postgres,
                    "mysql" => Backend::Mysql,
                    "sqlite" => Backend::Sqlite,
                    other => panic!("unknown backend {other}"),
                }]
            }
            ("--rounds", Some(v)) => rounds = v.parse().expect("--rounds N"),
            (other, _) => panic!("unknown argument {other}"),
        }
    }
    for b in backends {
        run(b, rounds).await?;
    }
    Ok(())
}
