//! The dashboard on a big table: loads N live and N archived jobs (default 1,000,000 each)
//! into a fresh PostgreSQL schema with `generate_series`, then requests each page of the
//! dashboard in-process (actix-web's test service, so the time is the server's: routing,
//! authentication, the queries, rendering) and prints p50/p95 per page. With `--explain`
//! it also prints `EXPLAIN ANALYZE` of the list statements the pages send.
//!
//! ```text
//! cargo run --release --features test-util,web --example dashboard_bench -- [--jobs N] [--samples N] [--explain]
//! ```
//!
//! The live jobs: 8 queues, 20 kinds; 60 % succeeded, 30 % pending, 5 % dead (7 error
//! codes), 3 % cancelled, 2 % retrying; created over the last day. The archive: the same
//! shape, all succeeded, archived over the last week. A day of throughput history, 100,000
//! audit entries and a batch of 1,000 members. Needs `JOBVISOR_PG_URL`.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use actix_web::test::{self, TestRequest};
use actix_web::App;
use jobvisor::testing::{exec_sql, StoreEngine as _, TestDb};
use jobvisor::web::{Dashboard, DashboardConfig};
use jobvisor::{Backend, Client};

const TOKEN: &str = "bench-token-0123456789abcdef";

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn explain(url: &str, n: i64) {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let cols = "id, queue, kind, state, payload, last_error, version";
    let now = chrono::Utc::now().timestamp_micros();
    let mid = n + n / 2;
    let sort_edge = 2 * n - 10_000;
    let scan_edge = 2 * n - 100_000;
    let statements = [
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 ORDER BY id DESC LIMIT 51"),
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 AND state = 'dead' ORDER BY id DESC LIMIT 1000"),
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 AND queue = 'q3' AND state = 'pending' ORDER BY id DESC LIMIT 51"),
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 AND kind = 'kind_7' ORDER BY id DESC LIMIT 51"),
        format!("SELECT {cols} FROM jobvisor_jobs_archive WHERE id < 9223372036854775807 ORDER BY id DESC LIMIT 51"),
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id = {}", n + n / 2),
        // The run-time order, exact: one queue's pending jobs of one priority (the claim
        // index), first page and a keyset page; the priorities probe before it.
        format!("SELECT {cols} FROM jobvisor_jobs WHERE queue = 'q3' AND state IN ('pending') AND priority = 10 ORDER BY run_at ASC, id ASC LIMIT 51"),
        format!("SELECT {cols} FROM jobvisor_jobs WHERE queue = 'q3' AND state IN ('pending') AND priority = 10 AND run_at >= {now} AND (run_at > {now} OR id > {mid}) ORDER BY run_at ASC, id ASC LIMIT 51"),
        "SELECT min(priority), max(priority) FROM jobvisor_jobs WHERE queue = 'q3' AND state IN ('pending')".to_string(),
        // A window's far edge (scan window 100,000; sort window 10,000).
        "SELECT id FROM jobvisor_jobs WHERE id < 9223372036854775807 ORDER BY id DESC LIMIT 1 OFFSET 99999".to_string(),
        // The run-time order elsewhere: the newest 10,000 ids, sorted.
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id >= {sort_edge} ORDER BY run_at DESC, id DESC LIMIT 51"),
        // A rare kind (none at all): bounded by the scan window.
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 AND id >= {scan_edge} AND kind = 'absent' ORDER BY id DESC LIMIT 51"),
        // A rarer state with a kind: the dead index.
        format!("SELECT {cols} FROM jobvisor_jobs WHERE id < 9223372036854775807 AND id >= {scan_edge} AND state IN ('cancelled') AND kind = 'kind_3' ORDER BY id DESC LIMIT 51"),
        // Dead letters: the exact-or-window probe, and the grouping.
        "SELECT id FROM jobvisor_jobs WHERE state IN ('dead') LIMIT 1 OFFSET 100000".to_string(),
        "SELECT kind, (last_error->>'code'), count(*), max(id) FROM jobvisor_jobs WHERE state IN ('dead') AND id >= -9223372036854775808 GROUP BY kind, (last_error->>'code') LIMIT 1000".to_string(),
        // A schedule's recent fires (live; the archive's (kind, unique_key) index likewise).
        format!("SELECT {cols} FROM jobvisor_jobs WHERE kind = 'kind_1' AND unique_key LIKE 'schedule:nightly@%' ESCAPE '\\' AND unique_key >= 'schedule:nightly@' ORDER BY unique_key DESC LIMIT 5"),
        format!("SELECT {cols} FROM jobvisor_jobs_archive WHERE kind = 'kind_1' AND unique_key LIKE 'schedule:nightly@%' ESCAPE '\\' AND unique_key >= 'schedule:nightly@' ORDER BY unique_key DESC LIMIT 5"),
        "SELECT count(*) FROM jobvisor_jobs WHERE state IN ('succeeded', 'dead', 'cancelled') \
         AND finished_at >= (extract(epoch from now()) * 1000000)::bigint - 300000000 \
         AND finished_at < (extract(epoch from now()) * 1000000)::bigint"
            .to_string(),
    ];
    for s in statements {
        println!("\n-- {s}");
        for row in c
            .query(&format!("EXPLAIN (ANALYZE, COSTS OFF) {s}"), &[])
            .await
            .unwrap()
        {
            let line: String = row.get(0);
            println!("   {line}");
        }
    }
}

#[actix_web::main]
async fn main() {
    let n: i64 = arg("--jobs").map_or(1_000_000, |v| v.parse().unwrap());
    let samples: usize = arg("--samples").map_or(20, |v| v.parse().unwrap());
    let db = TestDb::create(Backend::Postgres).await;
    let store = db.store().await;
    let t = Instant::now();
    let now = "(extract(epoch from now()) * 1000000)::bigint";
    // Archive: ids 1..n, archived over the last week. Live: ids n+1..2n, created over the
    // last day.
    // In chunks of 50,000 rows: each statement well inside the store's statement timeout.
    let chunk = 50_000;
    let mut lo = 1;
    while lo <= n {
        let hi = (lo + chunk - 1).min(n);
        exec_sql(
            &store,
            &format!(
                "INSERT INTO jobvisor_jobs_archive (id, queue, kind, state, priority, payload, errors, \
                   attempts, max_attempts, run_at, timeout_ms, version, created_at, updated_at, \
                   finished_at, archived_at, refunds)
                 SELECT g, 'q' || (g % 8), 'kind_' || (g % 20), 'succeeded', 10,
                   json_build_object('user', g, 'note', 'order ' || g), '[]', 1, 25,
                   {now} - (8 * {n} - g) * 75000, 1800000, 3,
                   {now} - (8 * {n} - g) * 75000, {now} - (8 * {n} - g) * 75000,
                   {now} - (8 * {n} - g) * 75000, {now} - ({n} - g) * 600000, 0
                 FROM generate_series({lo}::bigint, {hi}) g;
                 INSERT INTO jobvisor_jobs (id, queue, kind, state, priority, payload, last_error, \
                   errors, attempts, max_attempts, run_at, timeout_ms, version, created_at, \
                   updated_at, finished_at)
                 SELECT {n} + g, 'q' || (g % 8), 'kind_' || (g % 20),
                   CASE WHEN g % 100 < 60 THEN 'succeeded' WHEN g % 100 < 90 THEN 'pending'
                        WHEN g % 100 < 95 THEN 'dead' WHEN g % 100 < 98 THEN 'cancelled'
                        ELSE 'retrying' END,
                   10, json_build_object('user', g, 'note', 'order ' || g),
                   CASE WHEN g % 100 BETWEEN 90 AND 94 THEN json_build_object('code', 'err_' || (g % 7),
                        'message', 'failed on ' || g, 'attempt', 1) END,
                   '[]', 1, 25, {now} - ({n} - g) * 86400, 1800000, 2,
                   {now} - ({n} - g) * 86400, {now} - ({n} - g) * 86400,
                   CASE WHEN g % 100 < 60 OR g % 100 BETWEEN 90 AND 97 THEN {now} - ({n} - g) * 86400 END
                 FROM generate_series({lo}::bigint, {hi}) g;
    "
            ),
        )
        .await
        .unwrap();
        lo = hi + 1;
    }
    exec_sql(
        &store,
        &format!("SELECT setval(pg_get_serial_sequence('jobvisor_jobs', 'id'), 2 * {n})"),
    )
    .await
    .unwrap();
    for table in ["jobvisor_jobs", "jobvisor_jobs_archive"] {
        exec_sql(&store, &format!("VACUUM ANALYZE {table}"))
            .await
            .unwrap();
    }
    println!("loaded {n} live + {n} archived jobs in {:.1?}", t.elapsed());
    // The gauges as a scheduler's leader (or the dashboard itself) computes them every 15 s.
    let t = Instant::now();
    jobvisor::metrics::DatabaseGauges::new(store.clone(), "bench", Duration::from_secs(15))
        .unwrap()
        .refresh()
        .await
        .unwrap();
    println!(
        "database gauges computed in {:.1?} (once per database per 15 s at most)",
        t.elapsed()
    );
    // A day of throughput history, as the gauges' turns write it (one roll per 5 minutes
    // here; a turn every 15 s recounts the current bucket), and 100,000 audit entries.
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    let day_end = chrono::Utc::now();
    for i in (0..288).rev() {
        let at = day_end - chrono::Duration::minutes(5 * i);
        let one = Instant::now();
        store.throughput_roll(at).await.unwrap();
        slowest = slowest.max(one.elapsed());
    }
    println!(
        "throughput rollup: 288 turns over the last day in {:.1?}, the slowest {slowest:.1?}",
        t.elapsed()
    );
    exec_sql(
        &store,
        &format!(
            "INSERT INTO jobvisor_audit (at, who, action, target, jobs, outcome, ok)
             SELECT {now} - g::bigint * 1000000, 'dashboard login (token) from 127.0.0.1', 'job.retry',
               'job ' || g, 1, 'job ' || g || ' retried: pending, due now', true
             FROM generate_series(1, 100000) g"
        ),
    )
    .await
    .unwrap();
    if std::env::args().any(|a| a == "--explain") {
        explain(&db.url, n).await;
    }

    let client = Client::new(store);
    // A batch of 1,000 members, a tenth of them cancelled: its page lists them all.
    let members = (0..1000)
        .map(|i| jobvisor::NewJob::new("part", serde_json::json!({ "i": i })).queue("parts"))
        .collect();
    let batch = client
        .enqueue_batch(
            members,
            jobvisor::NewJob::new("all_done", serde_json::json!({})).queue("parts"),
        )
        .await
        .unwrap();
    for m in batch.members.iter().step_by(10) {
        client.cancel(m.id).await.unwrap();
    }
    let callback = batch.callback.id.0;
    let dashboard = Dashboard::new("/ops", client, DashboardConfig::with_token(TOKEN).unwrap());
    let app = test::init_service(App::new().service(dashboard.service())).await;
    let job = n + n / 2;
    let pages = [
        "/ops/".to_string(),
        "/ops/jobs".to_string(),
        "/ops/jobs?state=dead".to_string(),
        "/ops/jobs?queue=q3&state=pending".to_string(),
        "/ops/jobs?kind=kind_7".to_string(),
        "/ops/jobs?kind=absent".to_string(),
        "/ops/jobs?state=cancelled&kind=kind_3".to_string(),
        "/ops/jobs?queue=q3&state=pending&order=run_at_asc".to_string(),
        "/ops/jobs?order=run_at_desc".to_string(),
        "/ops/jobs?archived=1&order=run_at_asc".to_string(),
        format!("/ops/jobs?after={job}"),
        "/ops/jobs?archived=1".to_string(),
        "/ops/jobs?text=%22order+1999%22".to_string(),
        format!("/ops/jobs?id={job}"),
        format!("/ops/jobs/{job}"),
        "/ops/dead".to_string(),
        "/ops/queues".to_string(),
        "/ops/schedules".to_string(),
        "/ops/nodes".to_string(),
        "/ops/jobs/bulk?action=cancel&queue=q3&state=pending".to_string(),
        "/ops/audit".to_string(),
        "/ops/audit?before=50000".to_string(),
        "/ops/history".to_string(),
        format!("/ops/batches/{callback}"),
    ];
    println!(
        "\n{:<56} {:>10} {:>10} {:>8}",
        "page", "p50 ms", "p95 ms", "status"
    );
    for p in &pages {
        let mut times = Vec::with_capacity(samples);
        let mut status = 0;
        for i in 0..=samples {
            let req = TestRequest::get()
                .uri(p)
                .insert_header(("authorization", format!("Bearer {TOKEN}")))
                .to_request();
            let t = Instant::now();
            let resp = test::call_service(&app, req).await;
            status = resp.status().as_u16();
            let _ = test::read_body(resp).await;
            if i > 0 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        println!(
            "{:<56} {:>10.1} {:>10.1} {:>8}",
            p,
            pct(&times, 0.5).as_secs_f64() * 1000.0,
            pct(&times, 0.95).as_secs_f64() * 1000.0,
            status
        );
    }
}
