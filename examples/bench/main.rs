//! Benchmarks jobvisor against the raw-SQL limit measured in the same run, per backend.
//!
//! ```sh
//! cargo run --release --features test-util,prometheus --example bench                       # all backends
//! cargo run --release --features test-util,prometheus --example bench -- --backend postgres --jobs 200000
//! cargo run --release --features test-util,prometheus --example bench -- --only drain,baseline --concurrency 10
//! ```
//!
//! Modes (`--only a,b,…`; default all):
//! * `drain`: N no-op jobs enqueued beforehand (untimed); a scheduler with default settings and
//!   queue concurrency C runs them; time until every finalization is written.
//! * `enqueue`: N/10 single enqueues, each its own statement/transaction; `enqueue-batch`: N
//!   in one call. `enqueue-concurrent` (only when named): T tasks enqueueing one job at a
//!   time (`concurrent.rs`).
//! * `latency`: idle workers; one job every 10 ms, 1,000 of them; time from just before the
//!   enqueue to the handler's start (p50/p95/p99/max). `latency` enqueues through the node's
//!   own client (in-process wake-up); `latency-remote` through a separate client, as another
//!   process would (PostgreSQL wakes through LISTEN/NOTIFY, other backends wait for the poll).
//!   `latency-raw` (PostgreSQL): the same for raw SQL — raw inserts from another connection,
//!   one idle worker that `LISTEN`s and claims one job at a time; the latencies' `p50_to_raw`
//!   and `p99_to_raw` are to it. Each latency row splits its samples into stages
//!   (`stages_p50_ms`: the enqueue, the wake-up, the claim's round trip, the handler's start;
//!   see `stages.rs`).
//! * `limits`: four drains in turn — unlimited, under a global concurrency limit equal to
//!   C (`drain-limit-global`), under one of 100,000 that never binds (`drain-limit-loose`:
//!   the controlled claim's own cost), and with the jobs in 100 partitions limited to 1 running job
//!   each (`drain-limit-partitions`) — repeated `--rounds` times (default 3); each limited
//!   drain's `ratio_to_unlimited` is to the median unlimited drain of those rounds.
//!   `--job-ms M` makes every job of these drains take M ms (a sleep), so the node's
//!   concurrency, not the database, bounds the unlimited drain: the limit's own cost.
//!   `--nodes K` drains with K nodes in this process, each with its own store (pool) and
//!   `--concurrency`; the global limit is then their total. Each row also reports
//!   `mean_running` and `mean_held`: handlers running and jobs held (claimed, finish not yet
//!   confirmed) on average over a drain — under a limit that binds, held ≤ the limit, and the
//!   difference between the two is slots spent claiming, starting and finalizing. With
//!   several nodes, `worst_share_off` is the furthest any node's share of a drain's jobs was
//!   from an even split (0.2 = 20 % off), at most over the rounds.
//! * `nodes` (only when named): the drain by K node processes (`--nodes`, default 3) of
//!   concurrency C each against one process of K×C, alternating `--rounds` pairs; the
//!   median ratio and each process's share of the starts (`nodes.rs`).
//! * `limits-burst` (only when named): the partitioned drain of `limits` with `--backlog` jobs
//!   of one more partition enqueued first — one tenant's burst at the head of the queue, its
//!   partition at its limit — against the same drain without it, `--rounds` pairs; the drain
//!   ends when N jobs have finished (the burst's partition runs one job at a time meanwhile,
//!   and those count).
//! * `baseline`: the same drain by raw SQL — C workers, each claiming k jobs with
//!   `FOR UPDATE SKIP LOCKED` (MySQL: select then update) and marking them done, each in its
//!   own transaction — for k = 1 and k = 100; and raw single / multi-row inserts.
//!
//! * `cost` (only when named): what a job costs, jobvisor's drain beside raw SQL's (k = 100)
//!   in the same run — statements, round trips and commits per 1,000 jobs (counted on every
//!   connection), client and server CPU per job (from `/proc`, medians of `--rounds` uncounted
//!   drains)
//!   — printed as a table after the others; what each figure includes is in `cost.rs`.
//!
//! Observability modes (only when named):
//! * `metrics`: `--rounds` pairs of drains (as `drain`), one with metrics off and one with a
//!   Prometheus recorder taking every metric a node records; `ratio_on_to_off` of the medians.
//! * `gauges`: the database-wide gauges over `--backlog` live jobs (half succeeded, half
//!   waiting, five queues): a refresh that takes the turn and counts, and one that reads.
//!
//! Scale modes (minutes each; only when named, or all four with `--only scale`):
//! * `drain-backlog`: drain N jobs while `--backlog` (default 1,000,000) more wait behind
//!   them; `ratio_to_drain` compares with the empty-table `drain` of the same run.
//! * `drain-archive`: drain N jobs with `--backlog` jobs in the archive table.
//! * `archive-cycle`: `--through` (default 1,000,000) jobs pass through the live table in
//!   rounds of 100,000 while the archiver runs (archive 1 s after finishing); reports the live
//!   table's size empty, at its peak, at the end, and once everything is archived (and, on
//!   PostgreSQL, vacuumed as autovacuum would).
//! * `rss`: resident memory with `--in-flight` (default 10,000) handlers running at once.
//!
//! Dependency mode (only when named): `deps` — a `--fan` (default 10,000) job batch with one
//! fan-in callback against as many plain jobs, and a `--chain` (default 1,000) of jobs each
//! `after` the previous against the same chain built by hand; the overhead per dependency
//! edge, same run (`dependencies.rs`).
//!
//! Steady modes (only when named; `steady.rs`): `steady` — jobs arrive at `--rate` per second
//! (default 800, an open loop) for `--minutes` (default 2), each sleeping a seeded random
//! `--job-ms A-B` (default 1–50 ms), run by one node with default settings; every `--every`
//! seconds (default 60) a row: arrivals, finishes, pickup p50/p99, the jobs table's size and
//! bloat (`bloat.rs`) and this process's CPU. `steady-raw` (PostgreSQL): the same arrivals run by
//! raw SQL's workers (`steady_raw.rs`). Their queue concurrency / workers: `--concurrency`,
//! default 50 in these modes.
//!
//! Every result prints as a table row and as one JSON line (`{"bench":…}`); ratios are to the
//! raw-SQL figures of the same run, since absolute numbers drift on shared machines.
//! Each mode gets a fresh isolated database (schema / database / temp file).
//!
//! A tool, not an example of how to use jobvisor (see `examples/README.md`). This file parses
//! the arguments, runs the modes and prints the table; `modes.rs` holds the ordinary modes,
//! `scale.rs` the scale modes and `raw.rs` the raw-SQL baselines.

mod bloat;
mod concurrent;
mod cost;
mod dependencies;
mod limits;
mod modes;
mod nodes;
mod observability;
mod raw;
mod scale;
mod stages;
mod steady;
mod steady_raw;

use jobvisor::Backend;
use serde_json::{json, Value};

use limits::{drain_limited, Limit};
use modes::{drain, enqueue_batch, enqueue_single, latency, latency_raw};
use nodes::nodes_vs_one;
use observability::{drain_with_metrics, gauge_cost, maintenance_cost};
use raw::{raw_drain, raw_inserts};
use scale::{archive_cycle, drain_archive, drain_backlog, rss};

/// Pickups a latency mode times: with 200, its p99 was the second-worst sample alone.
const LATENCY_SAMPLES: usize = 1000;

struct Args {
    backends: Vec<Backend>,
    jobs: usize,
    concurrency: u32,
    /// Overrides the queue's prefetch (default: jobvisor's default).
    prefetch: Option<u32>,
    /// Jobs waiting (`drain-backlog`) or archived (`drain-archive`) beforehand.
    backlog: usize,
    /// Jobs passed through the live table by `archive-cycle`.
    through: usize,
    /// Handlers running at once in `rss`.
    in_flight: usize,
    /// Rounds of the `limits` mode.
    rounds: usize,
    /// How long each job of the `limits` mode takes (a sleep; default none).
    job_ms: u64,
    /// The steady modes' jobs' shortest and longest time, ms (`--job-ms A-B`).
    job_range: Option<(u64, u64)>,
    /// Whether `--concurrency` was given (the steady modes' default differs).
    concurrency_given: bool,
    /// Arrivals per second of the steady modes.
    rate: f64,
    /// Minutes the steady modes' jobs arrive.
    minutes: f64,
    /// Seconds between the steady modes' rows.
    every: u64,
    /// Seed of the steady modes' job times.
    seed: u64,
    /// Nodes the `limits` mode drains with, each with its own store and `--concurrency`
    /// (default 1); a global limit is their total concurrency.
    nodes: usize,
    /// Members of the `deps` mode's batch.
    fan: usize,
    /// Tasks enqueueing at once in `enqueue-concurrent`, one run per entry.
    tasks: Vec<usize>,
    /// Seconds each `enqueue-concurrent` run lasts.
    seconds: u64,
    /// Length of the `deps` mode's chain.
    chain: usize,
    only: Option<Vec<String>>,
}

/// `--help`: the flags, their defaults and the modes (the module doc has what each measures).
const USAGE: &str = "\
usage: bench [flags]
  --backend postgres|mysql|sqlite|all   (default all)
  --jobs N          jobs per drain (default 20000)
  --concurrency C   queue concurrency per node (default 10; steady: 50)
  --prefetch P      the queue's prefetch (default: jobvisor's)
  --only a,b,...    modes: baseline, drain, limits, enqueue, enqueue-batch, latency,
                    latency-remote, latency-raw (default: these);
                    cost, metrics, gauges, maintenance, limits-burst, nodes, deps,
                    steady, steady-raw, enqueue-concurrent,
                    drain-backlog, drain-archive, archive-cycle, rss, scale (only when named)
  --rounds R        rounds of limits / metrics (default 3)
  --job-ms M        each job of the limits mode sleeps M ms (default 0); steady: A-B
                    for a random time in [A, B] ms (default 1-50)
  --rate R          steady: arrivals per second (default 800)
  --minutes M       steady: how long jobs arrive (default 2)
  --every S         steady: seconds between rows (default 60)
  --seed S          steady: seed of the job times (default 56)
  --tasks T,...     enqueue-concurrent: tasks enqueueing at once (default 16,64)
  --seconds S       enqueue-concurrent: seconds each runs (default 20)
  --nodes K         nodes the limits mode drains with (default 1); node processes of
                    the nodes mode (default 3)
  --backlog N       jobs waiting / archived beforehand (default 1000000)
  --through N       jobs through the live table in archive-cycle (default 1000000)
  --in-flight N     handlers running at once in rss (default 10000)
  --fan N           members of the deps mode's batch (default 10000)
  --chain N         length of the deps mode's chain (default 1000)
PostgreSQL and MariaDB from JOBVISOR_PG_URL / JOBVISOR_MYSQL_URL.";

fn parse_args() -> Args {
    let mut args = Args {
        backends: vec![Backend::Postgres, Backend::Mysql, Backend::Sqlite],
        jobs: 20_000,
        concurrency: 10,
        prefetch: None,
        backlog: 1_000_000,
        through: 1_000_000,
        in_flight: 10_000,
        rounds: 3,
        job_ms: 0,
        job_range: None,
        concurrency_given: false,
        rate: 800.0,
        minutes: 2.0,
        every: 60,
        seed: 56,
        tasks: vec![16, 64],
        seconds: 20,
        nodes: 1,
        fan: 10_000,
        chain: 1_000,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--backend" => {
                args.backends = match val().as_str() {
                    "postgres" | "pg" => vec![Backend::Postgres],
                    "mysql" | "mariadb" => vec![Backend::Mysql],
                    "sqlite" => vec![Backend::Sqlite],
                    "all" => args.backends.clone(),
                    other => {
                        panic!("unknown backend {other:?}; expected postgres, mysql, sqlite or all")
                    }
                }
            }
            "--jobs" => args.jobs = val().parse().expect("--jobs takes a number"),
            "--concurrency" => {
                args.concurrency = val().parse().expect("--concurrency takes a number");
                args.concurrency_given = true;
            }
            "--prefetch" => args.prefetch = Some(val().parse().expect("--prefetch takes a number")),
            "--backlog" => args.backlog = val().parse().expect("--backlog takes a number"),
            "--through" => args.through = val().parse().expect("--through takes a number"),
            "--in-flight" => args.in_flight = val().parse().expect("--in-flight takes a number"),
            "--rounds" => args.rounds = val().parse().expect("--rounds takes a number"),
            "--job-ms" => {
                let v = val();
                let ms = |x: &str| x.parse::<u64>().expect("--job-ms takes M or A-B (ms)");
                match v.split_once('-') {
                    Some((a, b)) => args.job_range = Some((ms(a), ms(b))),
                    None => {
                        args.job_ms = ms(&v);
                        args.job_range = Some((args.job_ms, args.job_ms));
                    }
                }
            }
            "--rate" => args.rate = val().parse().expect("--rate takes a number"),
            "--minutes" => args.minutes = val().parse().expect("--minutes takes a number"),
            "--every" => args.every = val().parse().expect("--every takes a number"),
            "--seed" => args.seed = val().parse().expect("--seed takes a number"),
            "--tasks" => {
                args.tasks = val()
                    .split(',')
                    .map(|t| t.parse().expect("--tasks takes numbers, e.g. 16,64"))
                    .collect()
            }
            "--seconds" => args.seconds = val().parse().expect("--seconds takes a number"),
            "--nodes" => args.nodes = val().parse().expect("--nodes takes a number"),
            "--fan" => args.fan = val().parse().expect("--fan takes a number"),
            "--chain" => args.chain = val().parse().expect("--chain takes a number"),
            "--only" => args.only = Some(val().split(',').map(str::to_string).collect()),
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument {other:?}\n\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    args
}

/// One measured figure.
struct Row {
    backend: &'static str,
    bench: String,
    jobs: usize,
    per_sec: Option<f64>,
    extra: Value,
}

fn name(b: Backend) -> &'static str {
    match b {
        Backend::Postgres => "postgres",
        Backend::Mysql => "mysql",
        Backend::Sqlite => "sqlite",
    }
}

fn report(rows: &mut Vec<Row>, row: Row) {
    let mut line = json!({"bench": row.bench, "backend": row.backend, "jobs": row.jobs});
    if let Some(r) = row.per_sec {
        line["jobs_per_sec"] = json!(r.round());
    }
    if let (Value::Object(m), Value::Object(extra)) = (&mut line, &row.extra) {
        m.extend(extra.clone());
    }
    println!("{line}");
    rows.push(row);
}

#[actix::main]
async fn main() {
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};
    use tracing_subscriber::{EnvFilter, Layer};
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()));
    // The fetcher's claim timings, for the latency modes' stages.
    let claims = stages::ClaimRecorder
        .with_filter(Targets::new().with_target(stages::FETCHER, tracing::Level::TRACE));
    tracing_subscriber::registry().with(log).with(claims).init();
    // A node process of the `nodes` mode.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--serve-node") {
        let c = argv
            .get(3)
            .and_then(|c| c.parse().ok())
            .expect("--serve-node URL C");
        nodes::serve_node(&argv[2], c).await;
        return;
    }
    let args = parse_args();
    // Like for like: the raw baselines connect without TLS, so jobvisor does too unless the
    // URL says otherwise (the store's default, `prefer`, would encrypt against a server with
    // TLS switched on, as Debian's PostgreSQL is).
    let pg = jobvisor::testing::base_url(Backend::Postgres);
    if !pg.contains("sslmode=") {
        let sep = if pg.contains('?') { '&' } else { '?' };
        std::env::set_var("JOBVISOR_PG_URL", format!("{pg}{sep}sslmode=disable"));
    }
    const SCALE: [&str; 4] = ["drain-backlog", "drain-archive", "archive-cycle", "rss"];
    const NAMED: [&str; 10] = [
        "enqueue-concurrent",
        "cost",
        "metrics",
        "gauges",
        "maintenance",
        "limits-burst",
        "nodes",
        "deps",
        "steady",
        "steady-raw",
    ];
    let want = |m: &str| match &args.only {
        // The scale modes take minutes: only when asked for (by name or as `scale`); the
        // observability modes only by name.
        None => !SCALE.contains(&m) && !NAMED.contains(&m),
        Some(o) => o
            .iter()
            .any(|x| x == m || (x == "scale" && SCALE.contains(&m))),
    };
    let (n, c) = (args.jobs, args.concurrency);
    let mut rows = Vec::new();
    let mut costs = Vec::new();
    let steady_args = steady::Steady {
        rate: args.rate,
        duration: std::time::Duration::from_secs_f64(args.minutes * 60.0),
        every: std::time::Duration::from_secs(args.every.max(1)),
        job_ms: args.job_range.unwrap_or((1, 50)),
        seed: args.seed,
        concurrency: if args.concurrency_given { c } else { 50 },
    };
    for &b in &args.backends {
        let bn = name(b);
        eprintln!("== {bn}: {n} jobs, concurrency {c} ==");
        let mut raw100 = None;
        let mut raw_single_insert = None;
        if want("baseline") {
            for k in [1_i64, 100] {
                let r = raw_drain(b, n, c, k).await;
                if k == 100 {
                    raw100 = Some(r);
                }
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: format!("raw-drain-k{k}"),
                        jobs: n,
                        per_sec: Some(r),
                        extra: json!({"concurrency": c}),
                    },
                );
            }
            let (single, batch) = raw_inserts(b, (n / 10).max(100), n).await;
            raw_single_insert = Some(single);
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "raw-insert-single".into(),
                    jobs: (n / 10).max(100),
                    per_sec: Some(single),
                    extra: json!({}),
                },
            );
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "raw-insert-batch".into(),
                    jobs: n,
                    per_sec: Some(batch),
                    extra: json!({}),
                },
            );
        }
        if want("deps") {
            for (bench, jobs, extra) in dependencies::deps(b, args.fan, args.chain, c).await {
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench,
                        jobs,
                        per_sec: None,
                        extra,
                    },
                );
            }
        }
        let mut empty_drain = None;
        if want("drain") {
            let (r, mut extra) = drain(b, n, c, args.prefetch).await;
            empty_drain = Some(r);
            extra["concurrency"] = json!(c);
            if let Some(raw) = raw100 {
                extra["ratio_to_raw_k100"] = json!((r / raw * 100.0).round() / 100.0);
            }
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "drain".into(),
                    jobs: n,
                    per_sec: Some(r),
                    extra,
                },
            );
        }
        // Their per-interval tables print as they run; their rows are JSON lines only.
        if want("steady") {
            for row in steady::steady(b, steady_args).await {
                println!("{row}");
            }
        }
        if want("steady-raw") {
            if b == Backend::Postgres {
                for row in steady::steady_raw(steady_args).await {
                    println!("{row}");
                }
            } else {
                eprintln!("steady-raw: PostgreSQL only; skipped on {bn}");
            }
        }
        if want("cost") {
            let (jv, raw) = cost::cost(b, n, c, args.prefetch, args.rounds).await;
            for (bench, x) in [("cost-jobvisor", &jv), ("cost-raw-k100", &raw)] {
                let mut extra = x.json();
                extra["concurrency"] = json!(c);
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: bench.into(),
                        jobs: n,
                        per_sec: None,
                        extra,
                    },
                );
            }
            costs.push((bn, jv, raw));
        }
        if want("limits") {
            let mut runs: Vec<(Limit, f64, Value)> = Vec::new();
            for _ in 0..args.rounds {
                for limit in [Limit::None, Limit::Global, Limit::Loose, Limit::Partitions] {
                    let work = std::time::Duration::from_millis(args.job_ms);
                    let (r, extra) =
                        drain_limited(b, n, c, args.nodes, args.prefetch, limit, work).await;
                    eprintln!("  {limit:?}: {r:.0} jobs/s {extra}");
                    runs.push((limit, r, extra));
                }
            }
            let median = |l: Limit| spread(runs.iter().filter(|x| x.0 == l).map(|x| x.1).collect());
            let (unlimited, ..) = median(Limit::None);
            for (limit, bench) in [
                (Limit::None, "drain-unlimited"),
                (Limit::Global, "drain-limit-global"),
                (Limit::Loose, "drain-limit-loose"),
                (Limit::Partitions, "drain-limit-partitions"),
            ] {
                let (med, lo, hi) = median(limit);
                // Where the limit's slots went: handlers running and jobs held, on average
                // over each drain (medians of the rounds).
                let occupancy = |field: &str| {
                    let (m, ..) = spread(
                        runs.iter()
                            .filter(|x| x.0 == limit)
                            .filter_map(|x| x.2[field].as_f64())
                            .collect(),
                    );
                    (m * 10.0).round() / 10.0
                };
                let mut extra = json!({
                    "mean_running": occupancy("mean_running"),
                    "mean_held": occupancy("mean_held"),
                    "concurrency": c,
                    "nodes": args.nodes,
                    "job_ms": args.job_ms,
                    "rounds": args.rounds,
                    "min": lo.round(),
                    "max": hi.round(),
                });
                if limit != Limit::None {
                    extra["ratio_to_unlimited"] = json!((med / unlimited * 100.0).round() / 100.0);
                }
                if args.nodes > 1 {
                    // The fairness column: the furthest any node's share of a drain's jobs
                    // was from an even split, at most over the rounds (0.2 = 20 % off).
                    let worst = runs
                        .iter()
                        .filter(|x| x.0 == limit)
                        .filter_map(|x| x.2["worst_share_off"].as_f64())
                        .fold(0.0_f64, f64::max);
                    extra["worst_share_off"] = json!(worst);
                }
                if let Some(raw) = raw100 {
                    extra["ratio_to_raw_k100"] = json!((med / raw * 100.0).round() / 100.0);
                }
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: bench.into(),
                        jobs: n,
                        per_sec: Some(med),
                        extra,
                    },
                );
            }
        }
        if want("limits-burst") {
            let work = std::time::Duration::from_millis(args.job_ms);
            let mut plain = Vec::new();
            let mut burst = Vec::new();
            for _ in 0..args.rounds {
                for limit in [Limit::Partitions, Limit::Burst(args.backlog)] {
                    let (r, _) =
                        drain_limited(b, n, c, args.nodes, args.prefetch, limit, work).await;
                    eprintln!("  {limit:?}: {r:.0} jobs/s");
                    match limit {
                        Limit::Burst(_) => burst.push(r),
                        _ => plain.push(r),
                    }
                }
            }
            let (without, ..) = spread(plain);
            let (med, lo, hi) = spread(burst);
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "drain-limit-burst".into(),
                    jobs: n,
                    per_sec: Some(med),
                    extra: json!({
                        "backlog": args.backlog,
                        "concurrency": c,
                        "nodes": args.nodes,
                        "job_ms": args.job_ms,
                        "rounds": args.rounds,
                        "min": lo.round(),
                        "max": hi.round(),
                        "without_burst": without.round(),
                        "ratio_to_without": (med / without * 100.0).round() / 100.0,
                    }),
                },
            );
        }
        if want("nodes") {
            let procs = if args.nodes > 1 { args.nodes } else { 3 };
            let extra = nodes_vs_one(b, n, c, procs, args.rounds).await;
            let per_sec = extra["median_processes"].as_f64();
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "drain-processes".into(),
                    jobs: n,
                    per_sec,
                    extra,
                },
            );
        }
        if want("metrics") {
            let (off, on, mut extra) =
                drain_with_metrics(b, n, c, args.prefetch, args.rounds).await;
            extra["concurrency"] = json!(c);
            extra["median_off"] = json!(off.round());
            extra["ratio_on_to_off"] = json!((on / off * 1000.0).round() / 1000.0);
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "drain-metrics".into(),
                    jobs: n,
                    per_sec: Some(on),
                    extra,
                },
            );
        }
        if want("gauges") {
            let extra = gauge_cost(b, args.backlog, args.rounds.max(5)).await;
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "gauges".into(),
                    jobs: args.backlog,
                    per_sec: None,
                    extra,
                },
            );
        }
        if want("maintenance") {
            let extra = maintenance_cost(b, args.backlog, args.rounds.max(5)).await;
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "maintenance".into(),
                    jobs: args.backlog,
                    per_sec: None,
                    extra,
                },
            );
        }
        if want("enqueue") {
            let m = (n / 10).max(100);
            let (r, raw) = enqueue_single(b, m).await;
            // The ratio to raw inserts alternated with these in one database; the baseline's
            // (run minutes apart) for comparison.
            let mut extra = json!({
                "raw_insert_alternated": raw.round(),
                "ratio_to_raw_insert": (r / raw * 100.0).round() / 100.0,
            });
            if let Some(apart) = raw_single_insert {
                extra["ratio_to_baseline_insert"] = json!((r / apart * 100.0).round() / 100.0);
            }
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "enqueue".into(),
                    jobs: m,
                    per_sec: Some(r),
                    extra,
                },
            );
        }
        if want("enqueue-concurrent") {
            for &t in &args.tasks {
                let (r, extra) = concurrent::enqueue_concurrent(b, t, args.seconds).await;
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: "enqueue-concurrent".into(),
                        jobs: t,
                        per_sec: Some(r),
                        extra,
                    },
                );
            }
        }
        if want("enqueue-batch") {
            let r = enqueue_batch(b, n).await;
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "enqueue-batch".into(),
                    jobs: n,
                    per_sec: Some(r),
                    extra: json!({}),
                },
            );
        }
        for (mode, archived) in [("drain-backlog", false), ("drain-archive", true)] {
            if want(mode) {
                let (r, mut extra) = if archived {
                    drain_archive(b, n, c, args.backlog).await
                } else {
                    drain_backlog(b, n, c, args.backlog).await
                };
                extra[if archived { "archived" } else { "waiting" }] = json!(args.backlog);
                if let Some(e) = empty_drain {
                    extra["ratio_to_drain"] = json!((r / e * 100.0).round() / 100.0);
                }
                if let Some(raw) = raw100 {
                    extra["ratio_to_raw_k100"] = json!((r / raw * 100.0).round() / 100.0);
                }
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: mode.into(),
                        jobs: n,
                        per_sec: Some(r),
                        extra,
                    },
                );
            }
        }
        if want("archive-cycle") {
            let (r, extra) = archive_cycle(b, args.through, c).await;
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "archive-cycle".into(),
                    jobs: args.through,
                    per_sec: Some(r),
                    extra,
                },
            );
        }
        if want("rss") {
            let extra = rss(b, args.in_flight).await;
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "rss".into(),
                    jobs: args.in_flight,
                    per_sec: None,
                    extra,
                },
            );
        }
        // Raw SQL's pickup (PostgreSQL: the one backend whose raw worker can be woken by a
        // notification rather than wait for its poll), which each latency's ratios are to.
        let mut raw_pickup = None;
        if b == Backend::Postgres && want("latency-raw") {
            let l = latency_raw(LATENCY_SAMPLES).await;
            raw_pickup = Some(l.clone());
            report(
                &mut rows,
                Row {
                    backend: bn,
                    bench: "latency-raw".into(),
                    jobs: LATENCY_SAMPLES,
                    per_sec: None,
                    extra: l,
                },
            );
        }
        for (mode, remote) in [("latency", false), ("latency-remote", true)] {
            if want(mode) {
                let mut l = latency(b, LATENCY_SAMPLES, remote).await;
                if let (Some(raw), Some(m)) = (&raw_pickup, l.as_object_mut()) {
                    for p in ["p50", "p99"] {
                        let key = format!("{p}_ms");
                        if let (Some(x), Some(r)) = (m[&key].as_f64(), raw[&key].as_f64()) {
                            m.insert(
                                format!("{p}_to_raw"),
                                json!((x / r * 100.0).round() / 100.0),
                            );
                        }
                    }
                }
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: mode.into(),
                        jobs: LATENCY_SAMPLES,
                        per_sec: None,
                        extra: l,
                    },
                );
            }
        }
    }
    println!(
        "\n{:<10} {:<24} {:>9} {:>12}  notes",
        "backend", "bench", "jobs", "jobs/s"
    );
    for r in &rows {
        let rate = r.per_sec.map_or("-".to_string(), |x| format!("{x:.0}"));
        let notes = r
            .extra
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "{:<10} {:<24} {:>9} {:>12}  {}",
            r.backend, r.bench, r.jobs, rate, notes
        );
    }
    if !costs.is_empty() {
        print_costs(&costs, n, c);
    }
}

/// The cost model's table: per backend, jobvisor and raw SQL (k = 100) side by side.
fn print_costs(costs: &[(&str, cost::Cost, cost::Cost)], n: usize, c: u32) {
    let us = |x: Option<f64>| x.map_or("in-process".to_string(), |v| format!("{v:.1}"));
    println!(
        "\nCost per job, drains of {n} no-op jobs at concurrency {c} (jobvisor / raw SQL k=100):\n"
    );
    println!(
        "| backend | statements /1k | round trips /1k | commits /1k | client µs/job | server µs/job \
         (all server processes) | jobs/s (timed drain) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (b, jv, raw) in costs {
        let all = |x: &cost::Cost| {
            x.server_all_us
                .map_or(String::new(), |v| format!(" ({v:.0})"))
        };
        println!(
            "| {b} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {}{} / {}{} | {:.0} / {:.0} |",
            jv.statements,
            raw.statements,
            jv.round_trips,
            raw.round_trips,
            jv.commits,
            raw.commits,
            jv.client_us,
            raw.client_us,
            us(jv.server_us),
            all(jv),
            us(raw.server_us),
            all(raw),
            jv.jobs_per_sec,
            raw.jobs_per_sec,
        );
    }
}

/// The median, lowest and highest of some runs' figures (at least one).
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}
