//! The scale modes (minutes each, only when named): `drain-backlog`, `drain-archive`,
//! `archive-cycle`, `rss`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
use jobvisor::testing::{exec_sql, TestDb};
use jobvisor::{handler_fn, Backend, JobOutcome, QueueConfig, Scheduler, SchedulerConfig, Store};
use serde_json::{json, Value};

use crate::modes::{drain_on, fill};
use crate::raw::now_us;

/// A row source of `n` rows for SQL-side fills: (statement prefix, FROM clause, index column).
pub(crate) fn series(backend: Backend, n: usize) -> (String, String, &'static str) {
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
pub(crate) async fn fill_sql(backend: Backend, store: &Store, n: usize) {
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
pub(crate) async fn fill_archive(backend: Backend, store: &Store, n: usize) {
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
pub(crate) async fn analyze(backend: Backend, store: &Store) {
    let sql = match backend {
        Backend::Postgres => "ANALYZE jobvisor_jobs; ANALYZE jobvisor_jobs_archive",
        Backend::Mysql => "ANALYZE TABLE jobvisor_jobs, jobvisor_jobs_archive",
        Backend::Sqlite => "ANALYZE",
    };
    exec_sql(store, sql).await.expect("analyze");
}

pub(crate) type SqliteAsync =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

/// A connection of its own to a `sqlite://` test database.
pub(crate) async fn sqlite_conn(url: &str) -> SqliteAsync {
    SqliteAsync::establish(url.trim_start_matches("sqlite://"))
        .await
        .expect("connect")
}

/// One integer from a query, on a connection of its own.
pub(crate) async fn query_i64(backend: Backend, url: &str, sql: &str) -> i64 {
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
pub(crate) async fn hot_table_bytes(backend: Backend, url: &str, store: &Store) -> i64 {
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

pub(crate) async fn live_rows(backend: Backend, url: &str) -> i64 {
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
pub(crate) async fn drain_backlog(
    backend: Backend,
    n: usize,
    c: u32,
    backlog: usize,
) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill_sql(backend, &store, backlog + n).await;
    drain_on(store, n, c, None).await
}

/// Drain `n` jobs with `archived` jobs in the archive table.
pub(crate) async fn drain_archive(
    backend: Backend,
    n: usize,
    c: u32,
    archived: usize,
) -> (f64, Value) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    fill_archive(backend, &store, archived).await;
    fill(&store, n).await;
    drain_on(store, n, c, None).await
}

/// Passes `through` jobs through the live table in rounds, with the archiver running (jobs
/// archived 1 s after they finish, a pass every second); reports the live table's size.
pub(crate) async fn archive_cycle(backend: Backend, through: usize, c: u32) -> (f64, Value) {
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
            handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
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
pub(crate) fn rss_kb() -> u64 {
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
pub(crate) async fn rss(backend: Backend, n: usize) -> Value {
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
                    JobOutcome::done()
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
