//! Benchmarks jobvisor against the raw-SQL limit measured in the same run, per backend.
//!
//! ```sh
//! cargo run --release --features test-util --example bench                       # all backends
//! cargo run --release --features test-util --example bench -- --backend postgres --jobs 200000
//! cargo run --release --features test-util --example bench -- --only drain,baseline --concurrency 10
//! ```
//!
//! Modes (`--only a,b,…`; default all):
//! * `drain`: N no-op jobs enqueued beforehand (untimed); a scheduler with default settings and
//!   queue concurrency C runs them; time until every finalization is written.
//! * `enqueue`: N/10 single enqueues, each its own statement/transaction; `enqueue-batch`: N
//!   in one call.
//! * `latency`: idle workers; one job every 10 ms; time from just before the enqueue to the
//!   handler's start (p50/p95/p99/max). `latency` enqueues through the node's own client
//!   (in-process wake-up); `latency-remote` through a separate client, as another process
//!   would (PostgreSQL wakes through LISTEN/NOTIFY, other backends wait for the poll).
//! * `baseline`: the same drain by raw SQL — C workers, each claiming k jobs with
//!   `FOR UPDATE SKIP LOCKED` (MySQL: select then update) and marking them done, each in its
//!   own transaction — for k = 1 and k = 100; and raw single / multi-row inserts.
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
//! Every result prints as a table row and as one JSON line (`{"bench":…}`); ratios are to the
//! raw-SQL figures of the same run, since absolute numbers drift on shared machines.
//! Each mode gets a fresh isolated database (schema / database / temp file).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use jobvisor::store::conformance::{exec_sql, TestDb};
use jobvisor::{
    handler_fn, Backend, Client, EnqueueParams, JobOutcome, NewJob, QueueConfig, Scheduler,
    SchedulerConfig, Store,
};
use serde_json::{json, Value};

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
    only: Option<Vec<String>>,
}

fn parse_args() -> Args {
    let mut args = Args {
        backends: vec![Backend::Postgres, Backend::Mysql, Backend::Sqlite],
        jobs: 20_000,
        concurrency: 10,
        prefetch: None,
        backlog: 1_000_000,
        through: 1_000_000,
        in_flight: 10_000,
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
                args.concurrency = val().parse().expect("--concurrency takes a number")
            }
            "--prefetch" => args.prefetch = Some(val().parse().expect("--prefetch takes a number")),
            "--backlog" => args.backlog = val().parse().expect("--backlog takes a number"),
            "--through" => args.through = val().parse().expect("--through takes a number"),
            "--in-flight" => args.in_flight = val().parse().expect("--in-flight takes a number"),
            "--only" => args.only = Some(val().split(',').map(str::to_string).collect()),
            other => panic!("unknown argument {other:?}"),
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

async fn fill(store: &Store, n: usize) {
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

async fn drain(backend: Backend, n: usize, c: u32, prefetch: Option<u32>) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill(&store, n).await;
    drain_on(store, n, c, prefetch).await
}

/// Runs a scheduler on `store` until `n` jobs have finished (more may be waiting).
async fn drain_on(store: Store, n: usize, c: u32, prefetch: Option<u32>) -> (f64, Value) {
    let handle = Scheduler::builder(store)
        .queue("default", {
            let q = QueueConfig::default().concurrency(c);
            match prefetch {
                Some(p) => q.prefetch(p),
                None => q,
            }
        })
        .handler(
            "noop",
            handler_fn(|_: Value, _ctx| async { Ok(JobOutcome::done()) }),
        )
        .start()
        .expect("scheduler");
    let t0 = Instant::now();
    while handle.stats().finished < n as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if t0.elapsed() > Duration::from_secs(600) {
            panic!("drain did not finish: {:?}", handle.stats());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let st = handle.stats();
    handle.shutdown().await;
    let per = |x: u64| (x as f64 / n as f64 * 1000.0).round() / 1000.0;
    let stats = json!({
        "claim_stmts_per_job": per(st.claim_statements),
        "finalize_stmts_per_job": per(st.finalize_statements),
    });
    (n as f64 / secs, stats)
}

async fn enqueue_single(backend: Backend, n: usize) -> f64 {
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let t0 = Instant::now();
    for i in 0..n {
        client
            .enqueue(NewJob::new("noop", json!({"i": i})))
            .await
            .expect("enqueue");
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

async fn enqueue_batch(backend: Backend, n: usize) -> f64 {
    let db = TestDb::create(backend).await;
    let client = Client::new(db.store().await);
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("noop", json!({"i": i})))
        .collect();
    let t0 = Instant::now();
    client.enqueue_many(jobs).await.expect("enqueue_many");
    n as f64 / t0.elapsed().as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn latency(backend: Backend, n: usize, remote: bool) -> Value {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let epoch = Instant::now();
    let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let s2 = samples.clone();
    let handle = Scheduler::builder(store)
        .queue("default", QueueConfig::default())
        .handler(
            "probe",
            handler_fn(move |p: Value, _ctx| {
                let started = epoch.elapsed().as_secs_f64() * 1000.0;
                let sent = p["t_ms"].as_f64().unwrap_or(started);
                if let Ok(mut v) = s2.lock() {
                    v.push(started - sent);
                }
                async { Ok(JobOutcome::done()) }
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
    for _ in 0..n {
        let t_ms = epoch.elapsed().as_secs_f64() * 1000.0;
        client
            .enqueue(NewJob::new("probe", json!({"t_ms": t_ms})))
            .await
            .expect("enqueue");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    while samples.lock().map(|v| v.len()).unwrap_or(0) < n && t0.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    let mut v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return json!({"error": "no samples"});
    }
    json!({
        "p50_ms": (percentile(&v, 0.50) * 100.0).round() / 100.0,
        "p95_ms": (percentile(&v, 0.95) * 100.0).round() / 100.0,
        "p99_ms": (percentile(&v, 0.99) * 100.0).round() / 100.0,
        "max_ms": (v[v.len() - 1] * 100.0).round() / 100.0,
        "samples": v.len(),
    })
}

// ---- scale --------------------------------------------------------------------------------

/// A row source of `n` rows for SQL-side fills: (statement prefix, FROM clause, index column).
fn series(backend: Backend, n: usize) -> (String, String, &'static str) {
    match backend {
        Backend::Postgres => (
            String::new(),
            format!("generate_series(1, {n}) AS s(i)"),
            "s.i",
        ),
        // MariaDB's sequence engine.
        Backend::Mysql => (String::new(), format!("seq_1_to_{n} AS s"), "s.seq"),
        Backend::Sqlite => (
            format!(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
            ),
            "s".to_string(),
            "s.i",
        ),
    }
}

/// Inserts `n` waiting no-op jobs in one SQL statement (as `enqueue` would write them).
async fn fill_sql(backend: Backend, store: &Store, n: usize) {
    let (with, from, _) = series(backend, n);
    let t = now_us();
    exec_sql(
        store,
        &format!(
            "INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, attempts, \
             max_attempts, run_at, timeout_ms, version, created_at, updated_at) {with}\
             SELECT 'default', 'noop', 'pending', 10, '{{}}', '[]', 0, 5, {t}, 1800000, 1, {t}, {t} \
             FROM {from}"
        ),
    )
    .await
    .expect("fill");
    analyze(backend, store).await;
}

/// Inserts `n` succeeded jobs into the archive (ids far above the live table's).
async fn fill_archive(backend: Backend, store: &Store, n: usize) {
    let (with, from, i) = series(backend, n);
    let t = now_us();
    exec_sql(
        store,
        &format!(
            "INSERT INTO jobvisor_jobs_archive (id, queue, kind, state, priority, payload, errors, \
             attempts, max_attempts, run_at, timeout_ms, version, created_at, updated_at, \
             finished_at, archived_at) {with}\
             SELECT 1000000000000 + {i}, 'default', 'noop', 'succeeded', 10, '{{}}', '[]', 1, 5, \
             {t}, 1800000, 3, {t}, {t}, {t}, {t} FROM {from}"
        ),
    )
    .await
    .expect("fill archive");
    analyze(backend, store).await;
}

/// Refreshes planner statistics, as autovacuum / InnoDB would soon after a bulk load.
async fn analyze(backend: Backend, store: &Store) {
    let sql = match backend {
        Backend::Postgres => "ANALYZE jobvisor_jobs; ANALYZE jobvisor_jobs_archive",
        Backend::Mysql => "ANALYZE TABLE jobvisor_jobs, jobvisor_jobs_archive",
        Backend::Sqlite => "ANALYZE",
    };
    exec_sql(store, sql).await.expect("analyze");
}

type SqliteAsync =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

/// A connection of its own to a `sqlite://` test database.
async fn sqlite_conn(url: &str) -> SqliteAsync {
    SqliteAsync::establish(url.trim_start_matches("sqlite://"))
        .await
        .expect("connect")
}

/// One integer from a query, on a connection of its own.
async fn query_i64(backend: Backend, url: &str, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        v: i64,
    }
    match backend {
        Backend::Postgres => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            client.query_one(sql, &[]).await.expect("query").get(0)
        }
        Backend::Mysql => {
            let mut conn = AsyncMysqlConnection::establish(url).await.expect("connect");
            diesel::sql_query(sql)
                .get_result::<V>(&mut conn)
                .await
                .expect("query")
                .v
        }
        Backend::Sqlite => {
            let mut conn = sqlite_conn(url).await;
            diesel::sql_query(sql)
                .get_result::<V>(&mut conn)
                .await
                .expect("query")
                .v
        }
    }
}

/// Bytes the live table takes (PostgreSQL: heap + indexes + TOAST; MySQL: data + indexes
/// after `ANALYZE TABLE`; SQLite: the whole file's pages in use — it has no per-table size
/// without the `dbstat` extension).
async fn hot_table_bytes(backend: Backend, url: &str, store: &Store) -> i64 {
    let sql = match backend {
        Backend::Postgres => "SELECT pg_total_relation_size('jobvisor_jobs')::bigint",
        Backend::Mysql => {
            exec_sql(store, "ANALYZE TABLE jobvisor_jobs")
                .await
                .expect("analyze");
            "SELECT CAST(data_length + index_length AS SIGNED) AS v FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = 'jobvisor_jobs'"
        }
        Backend::Sqlite => {
            "SELECT (p.page_count - f.freelist_count) * s.page_size AS v \
             FROM pragma_page_count() AS p, pragma_freelist_count() AS f, pragma_page_size() AS s"
        }
    };
    query_i64(backend, url, sql).await
}

async fn live_rows(backend: Backend, url: &str) -> i64 {
    let sql = match backend {
        Backend::Mysql => "SELECT COUNT(*) AS v FROM jobvisor_jobs",
        _ => "SELECT COUNT(*)::bigint AS v FROM jobvisor_jobs",
    };
    let sql = if backend == Backend::Sqlite {
        "SELECT COUNT(*) AS v FROM jobvisor_jobs"
    } else {
        sql
    };
    query_i64(backend, url, sql).await
}

/// Drain `n` jobs while `backlog` more wait behind them.
async fn drain_backlog(backend: Backend, n: usize, c: u32, backlog: usize) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill_sql(backend, &store, backlog + n).await;
    drain_on(store, n, c, None).await
}

/// Drain `n` jobs with `archived` jobs in the archive table.
async fn drain_archive(backend: Backend, n: usize, c: u32, archived: usize) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill_archive(backend, &store, archived).await;
    fill(&store, n).await;
    drain_on(store, n, c, None).await
}

/// Passes `through` jobs through the live table in rounds, with the archiver running (jobs
/// archived 1 s after they finish, a pass every second); reports the live table's size.
async fn archive_cycle(backend: Backend, through: usize, c: u32) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let empty = hot_table_bytes(backend, &db.url, &store).await;
    let config = SchedulerConfig::default()
        .archive_after(Duration::from_secs(1))
        .archive_every(Duration::from_secs(1));
    let handle = Scheduler::builder(store.clone())
        .config(config)
        .queue("default", QueueConfig::default().concurrency(c))
        .handler(
            "noop",
            handler_fn(|_: Value, _ctx| async { Ok(JobOutcome::done()) }),
        )
        .start()
        .expect("scheduler");
    let round = through.clamp(1, 100_000);
    let (mut sent, mut peak) = (0, empty);
    let t0 = Instant::now();
    while sent < through {
        let k = round.min(through - sent);
        fill_sql(backend, &store, k).await;
        sent += k;
        while handle.stats().finished < sent as u64 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak = peak.max(hot_table_bytes(backend, &db.url, &store).await);
    }
    let secs = t0.elapsed().as_secs_f64();
    let at_end = hot_table_bytes(backend, &db.url, &store).await;
    // Wait for the archiver to move the rest.
    let t1 = Instant::now();
    while live_rows(backend, &db.url).await > 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(300),
            "archiving did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let archived_after = t1.elapsed().as_secs_f64();
    handle.shutdown().await;
    let archived = query_i64(
        backend,
        &db.url,
        if backend == Backend::Postgres {
            "SELECT COUNT(*)::bigint FROM jobvisor_jobs_archive"
        } else {
            "SELECT COUNT(*) AS v FROM jobvisor_jobs_archive"
        },
    )
    .await;
    assert_eq!(archived as usize, through, "every job was archived");
    // What routine vacuuming leaves once the last rows are archived (the archiver vacuums
    // every 50,000 jobs moved; this is the last one, as the next would be).
    if backend == Backend::Postgres {
        exec_sql(&store, "VACUUM jobvisor_jobs")
            .await
            .expect("vacuum");
    }
    let after = hot_table_bytes(backend, &db.url, &store).await;
    let kb = |b: i64| b / 1024;
    let heap = if backend == Backend::Postgres {
        json!(kb(query_i64(
            backend,
            &db.url,
            "SELECT pg_relation_size('jobvisor_jobs')::bigint"
        )
        .await))
    } else {
        Value::Null
    };
    (
        through as f64 / secs,
        json!({
            "empty_kb": kb(empty),
            "peak_kb": kb(peak),
            "end_kb": kb(at_end),
            "archived_all_s_after_end": (archived_after * 10.0).round() / 10.0,
            "after_archive_vacuum_kb": kb(after),
            "after_heap_kb": heap,
            "archived": archived,
        }),
    )
}

/// Resident set size of this process, in kB.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Memory with `n` jobs in flight: handlers that wait until all `n` run at once.
async fn rss(backend: Backend, n: usize) -> Value {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill_sql(backend, &store, n).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let running = Arc::new(AtomicU64::new(0));
    let (g, r) = (gate.clone(), running.clone());
    let base = rss_kb();
    let c = u32::try_from(n).expect("in-flight fits u32");
    let handle = Scheduler::builder(store)
        .queue("default", QueueConfig::default().concurrency(c))
        .handler(
            "noop",
            handler_fn(move |_: Value, _ctx| {
                let (g, r) = (g.clone(), r.clone());
                async move {
                    r.fetch_add(1, Ordering::Relaxed);
                    let _p = g.acquire().await;
                    Ok(JobOutcome::done())
                }
            }),
        )
        .start()
        .expect("scheduler");
    let t0 = Instant::now();
    while AtomicU64::load(&running, Ordering::Relaxed) < n as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "handlers did not all start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ramp = t0.elapsed().as_secs_f64();
    let full = rss_kb();
    gate.add_permits(n);
    while handle.stats().finished < n as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown().await;
    json!({
        "in_flight": n,
        "rss_before_mb": (base as f64 / 1024.0 * 10.0).round() / 10.0,
        "rss_in_flight_mb": (full as f64 / 1024.0 * 10.0).round() / 10.0,
        "kb_per_job": ((full.saturating_sub(base)) as f64 / n as f64 * 10.0).round() / 10.0,
        "all_started_s": (ramp * 100.0).round() / 100.0,
    })
}

// ---- raw SQL baselines -------------------------------------------------------------------

const PG_CLAIM: &str = "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'raw', \
     lease_token = md5(random()::text), attempts = attempts + 1 \
     WHERE id IN (SELECT id FROM jobvisor_jobs WHERE queue = 'default' \
     AND state IN ('pending', 'retrying') AND run_at <= $1 \
     ORDER BY priority, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id";
const PG_DONE: &str = "UPDATE jobvisor_jobs SET state = 'succeeded', finished_at = $1, \
     lease_token = NULL WHERE id = ANY($2)";

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Raw drain on PostgreSQL with tokio-postgres prepared statements.
async fn raw_drain_pg(url: &str, c: u32, k: i64) -> usize {
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let claim = client.prepare(PG_CLAIM).await.expect("prepare");
            let fin = client.prepare(PG_DONE).await.expect("prepare");
            loop {
                let rows = client.query(&claim, &[&now_us(), &k]).await.expect("claim");
                if rows.is_empty() {
                    return;
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                tokio_postgres::Client::execute(&client, &fin, &[&now_us(), &ids])
                    .await
                    .expect("done");
                done.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    AtomicU64::load(&done, Ordering::Relaxed) as usize
}

/// Raw drain on MySQL / SQLite through diesel's SQL strings (no UPDATE … RETURNING on MySQL).
async fn raw_drain_diesel(backend: Backend, url: &str, c: u32, k: i64) -> usize {
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..c {
        let url = url.to_string();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            #[derive(diesel::QueryableByName)]
            struct Id {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                id: i64,
            }
            match backend {
                Backend::Mysql => {
                    let mut conn = AsyncMysqlConnection::establish(&url).await.expect("connect");
                    conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await.expect("rc");
                    loop {
                        let ids: Vec<i64> = conn
                            .transaction(async |c| {
                                let ids: Vec<Id> = diesel::sql_query(format!(
                                    "SELECT id FROM jobvisor_jobs WHERE claim_queue = 'default' AND run_at <= {} \
                                     ORDER BY priority, run_at, id LIMIT {k} FOR UPDATE SKIP LOCKED",
                                    now_us()
                                ))
                                .load(c)
                                .await?;
                                let ids: Vec<i64> = ids.into_iter().map(|r| r.id).collect();
                                if !ids.is_empty() {
                                    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                                    diesel::sql_query(format!(
                                        "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'raw', \
                                         lease_token = 'x', attempts = attempts + 1 WHERE id IN ({list})"
                                    ))
                                    .execute(c)
                                    .await?;
                                }
                                Ok::<_, diesel::result::Error>(ids)
                            })
                            .await
                            .expect("claim");
                        if ids.is_empty() {
                            return;
                        }
                        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                        diesel::sql_query(format!(
                            "UPDATE jobvisor_jobs SET state = 'succeeded', finished_at = {}, lease_token = NULL WHERE id IN ({list})",
                            now_us()
                        ))
                        .execute(&mut conn)
                        .await
                        .expect("done");
                        done.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    }
                }
                _ => {
                    let mut conn = sqlite_conn(&url).await;
                    conn.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA synchronous = NORMAL;").await.expect("pragma");
                    loop {
                        let ids: Vec<Id> = diesel::sql_query(format!(
                            "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'raw', lease_token = 'x', \
                             attempts = attempts + 1 WHERE id IN (SELECT id FROM jobvisor_jobs \
                             WHERE queue = 'default' AND state IN ('pending', 'retrying') AND run_at <= {} \
                             ORDER BY priority, run_at, id LIMIT {k}) RETURNING id",
                            now_us()
                        ))
                        .load(&mut conn)
                        .await
                        .expect("claim");
                        if ids.is_empty() {
                            return;
                        }
                        let list = ids.iter().map(|r| r.id.to_string()).collect::<Vec<_>>().join(",");
                        diesel::sql_query(format!(
                            "UPDATE jobvisor_jobs SET state = 'succeeded', finished_at = {}, lease_token = NULL WHERE id IN ({list})",
                            now_us()
                        ))
                        .execute(&mut conn)
                        .await
                        .expect("done");
                        done.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    AtomicU64::load(&done, Ordering::Relaxed) as usize
}

async fn raw_drain(backend: Backend, n: usize, c: u32, k: i64) -> f64 {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill(&store, n).await;
    let t0 = Instant::now();
    let got = match backend {
        Backend::Postgres => raw_drain_pg(&db.url, c, k).await,
        _ => raw_drain_diesel(backend, &db.url, c, k).await,
    };
    assert_eq!(got, n, "raw drain claimed every job once");
    n as f64 / t0.elapsed().as_secs_f64()
}

/// Raw single inserts (each its own statement) and one multi-row insert.
async fn raw_inserts(backend: Backend, n: usize, batch: usize) -> (f64, f64) {
    let db = TestDb::create(backend).await;
    let _store = db.store().await;
    let cols = "(queue, kind, state, priority, payload, errors, attempts, max_attempts, run_at, timeout_ms, version, created_at, updated_at)";
    let row = |i: usize| {
        format!("('default', 'noop', 'pending', 10, '{{\"i\": {i}}}', '[]', 0, 5, {t}, 1800000, 1, {t}, {t})", t = now_us())
    };
    match backend {
        Backend::Postgres => {
            let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let stmt = client
                .prepare(&format!("INSERT INTO jobvisor_jobs {cols} VALUES ('default', 'noop', 'pending', 10, ($1::text)::json, '[]', 0, 5, $2, 1800000, 1, $2, $2) RETURNING id"))
                .await
                .expect("prepare");
            let t0 = Instant::now();
            for i in 0..n {
                let payload = format!("{{\"i\": {i}}}");
                client
                    .query_one(&stmt, &[&payload, &now_us()])
                    .await
                    .expect("insert");
            }
            let single = n as f64 / t0.elapsed().as_secs_f64();
            let values: Vec<String> = (0..batch).map(row).collect();
            let t0 = Instant::now();
            client
                .batch_execute(&format!(
                    "INSERT INTO jobvisor_jobs {cols} VALUES {}",
                    values.join(",")
                ))
                .await
                .expect("batch");
            (single, batch as f64 / t0.elapsed().as_secs_f64())
        }
        _ => {
            macro_rules! run {
                ($conn:expr) => {{
                    let mut conn = $conn;
                    let t0 = Instant::now();
                    for i in 0..n {
                        conn.batch_execute(&format!(
                            "INSERT INTO jobvisor_jobs {cols} VALUES {}",
                            row(i)
                        ))
                        .await
                        .expect("insert");
                    }
                    let single = n as f64 / t0.elapsed().as_secs_f64();
                    let values: Vec<String> = (0..batch).map(row).collect();
                    let t0 = Instant::now();
                    conn.batch_execute(&format!(
                        "INSERT INTO jobvisor_jobs {cols} VALUES {}",
                        values.join(",")
                    ))
                    .await
                    .expect("batch");
                    (single, batch as f64 / t0.elapsed().as_secs_f64())
                }};
            }
            if backend == Backend::Mysql {
                run!(AsyncMysqlConnection::establish(&db.url)
                    .await
                    .expect("connect"))
            } else {
                run!(sqlite_conn(&db.url).await)
            }
        }
    }
}

#[actix::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args();
    const SCALE: [&str; 4] = ["drain-backlog", "drain-archive", "archive-cycle", "rss"];
    let want = |m: &str| match &args.only {
        // The scale modes take minutes: only when asked for (by name or as `scale`).
        None => !SCALE.contains(&m),
        Some(o) => o
            .iter()
            .any(|x| x == m || (x == "scale" && SCALE.contains(&m))),
    };
    let (n, c) = (args.jobs, args.concurrency);
    let mut rows = Vec::new();
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
        if want("enqueue") {
            let m = (n / 10).max(100);
            let r = enqueue_single(b, m).await;
            let extra = raw_single_insert.map_or(
                json!({}),
                |raw| json!({"ratio_to_raw_insert": (r / raw * 100.0).round() / 100.0}),
            );
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
        for (mode, remote) in [("latency", false), ("latency-remote", true)] {
            if want(mode) {
                let l = latency(b, 200, remote).await;
                report(
                    &mut rows,
                    Row {
                        backend: bn,
                        bench: mode.into(),
                        jobs: 200,
                        per_sec: None,
                        extra: l,
                    },
                );
            }
        }
    }
    println!(
        "\n{:<10} {:<18} {:>9} {:>12}  notes",
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
            "{:<10} {:<18} {:>9} {:>12}  {}",
            r.backend, r.bench, r.jobs, rate, notes
        );
    }
}
