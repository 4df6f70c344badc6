//! The raw-SQL baselines every ratio is taken to: C workers claiming k jobs at a time with
//! `FOR UPDATE SKIP LOCKED` (MySQL: select then update) and marking them done, and raw single
//! and multi-row inserts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use jobvisor::testing::TestDb;
use jobvisor::Backend;

use crate::modes::fill;
use crate::scale::sqlite_conn;
use crate::stages::Stages;

pub(crate) const PG_CLAIM: &str =
    "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'raw', \
     lease_token = md5(random()::text), attempts = attempts + 1 \
     WHERE id IN (SELECT id FROM jobvisor_jobs WHERE queue = 'default' \
     AND state IN ('pending', 'retrying') AND run_at <= $1 \
     ORDER BY priority, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id";
/// The raw pickup's claim: one job, its payload returned.
pub(crate) const PG_CLAIM_ONE: &str =
    "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'raw', \
     lease_token = md5(random()::text), attempts = attempts + 1 \
     WHERE id IN (SELECT id FROM jobvisor_jobs WHERE queue = 'default' \
     AND state IN ('pending', 'retrying') AND run_at <= $1 \
     ORDER BY priority, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, payload::text";
pub(crate) const PG_DONE: &str = "UPDATE jobvisor_jobs SET state = 'succeeded', finished_at = $1, \
     lease_token = NULL WHERE id = ANY($2)";

/// Statements the raw PostgreSQL drain has executed (its claims and its updates, each a
/// round trip and an autocommitted write; the two preparations per worker not counted):
/// tokio-postgres has no diesel instrumentation to count them, so the drain counts itself.
pub(crate) static PG_STATEMENTS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Raw drain on PostgreSQL with tokio-postgres prepared statements.
pub(crate) async fn raw_drain_pg(url: &str, c: u32, k: i64) -> usize {
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
                PG_STATEMENTS.fetch_add(1, Ordering::Relaxed);
                if rows.is_empty() {
                    return;
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                tokio_postgres::Client::execute(&client, &fin, &[&now_us(), &ids])
                    .await
                    .expect("done");
                PG_STATEMENTS.fetch_add(1, Ordering::Relaxed);
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
pub(crate) async fn raw_drain_diesel(backend: Backend, url: &str, c: u32, k: i64) -> usize {
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

pub(crate) async fn raw_drain(backend: Backend, n: usize, c: u32, k: i64) -> f64 {
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

const COLS: &str = "(queue, kind, state, priority, payload, errors, attempts, max_attempts, run_at, timeout_ms, version, created_at, updated_at)";

/// Row `i` of the raw inserts, as SQL values.
fn raw_row(i: usize) -> String {
    format!("('default', 'noop', 'pending', 10, '{{\"i\": {i}}}', '[]', 0, 5, {t}, 1800000, 1, {t}, {t})", t = now_us())
}

/// A connection that inserts raw rows one statement at a time: on PostgreSQL a prepared
/// tokio-postgres statement, elsewhere diesel's SQL strings.
pub(crate) enum RawInserter {
    Pg(tokio_postgres::Client, tokio_postgres::Statement),
    Mysql(AsyncMysqlConnection),
    Sqlite(crate::scale::SqliteAsync),
}

impl RawInserter {
    pub(crate) async fn open(backend: Backend, url: &str) -> Self {
        match backend {
            Backend::Postgres => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(conn);
                let stmt = client
                    .prepare(&format!("INSERT INTO jobvisor_jobs {COLS} VALUES ('default', 'noop', 'pending', 10, ($1::text)::json, '[]', 0, 5, $2, 1800000, 1, $2, $2) RETURNING id"))
                    .await
                    .expect("prepare");
                RawInserter::Pg(client, stmt)
            }
            Backend::Mysql => {
                RawInserter::Mysql(AsyncMysqlConnection::establish(url).await.expect("connect"))
            }
            Backend::Sqlite => {
                // jobvisor's own durability (`synchronous = NORMAL` in WAL): with SQLite's
                // default (`FULL`) every raw insert waited for a flush jobvisor's did not.
                let mut c = sqlite_conn(url).await;
                c.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA synchronous = NORMAL;")
                    .await
                    .expect("pragma");
                RawInserter::Sqlite(c)
            }
        }
    }

    /// PostgreSQL, as the store's own enqueues insert: the statement marks its transaction
    /// (`jobvisor.notify`), so the insert trigger stays silent and the commit does not queue
    /// for the notification lock; the caller announces after the commit
    /// (`steady_raw::Announcer`).
    pub(crate) async fn open_quiet(url: &str) -> Self {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let stmt = client
            .prepare(&format!("INSERT INTO jobvisor_jobs {COLS} SELECT 'default', 'noop', 'pending', 10, ($1::text)::json, '[]', 0, 5, $2, 1800000, 1, $2, $2 FROM (SELECT set_config('jobvisor.notify', 'after_commit', true) AS quiet) AS q RETURNING id"))
            .await
            .expect("prepare");
        RawInserter::Pg(client, stmt)
    }

    /// Inserts row `i` in a statement of its own.
    pub(crate) async fn insert(&mut self, i: usize) {
        match self {
            RawInserter::Pg(..) => self.insert_payload(&format!("{{\"i\": {i}}}")).await,
            RawInserter::Mysql(c) => Self::sql(c, i).await,
            RawInserter::Sqlite(c) => Self::sql(c, i).await,
        }
    }

    /// PostgreSQL: inserts one row with `payload` (JSON text) by the prepared statement.
    pub(crate) async fn insert_payload(&mut self, payload: &str) {
        if let RawInserter::Pg(client, stmt) = self {
            client
                .query_one(&*stmt, &[&payload, &now_us()])
                .await
                .expect("insert");
        }
    }

    async fn sql<C: SimpleAsyncConnection>(c: &mut C, i: usize) {
        c.batch_execute(&format!(
            "INSERT INTO jobvisor_jobs {COLS} VALUES {}",
            raw_row(i)
        ))
        .await
        .expect("insert");
    }

    /// Inserts `n` rows in one statement.
    async fn insert_many(&mut self, n: usize) {
        let values: Vec<String> = (0..n).map(raw_row).collect();
        let sql = format!(
            "INSERT INTO jobvisor_jobs {COLS} VALUES {}",
            values.join(",")
        );
        match self {
            RawInserter::Pg(client, _) => client.batch_execute(&sql).await.expect("batch"),
            RawInserter::Mysql(c) => c.batch_execute(&sql).await.expect("batch"),
            RawInserter::Sqlite(c) => c.batch_execute(&sql).await.expect("batch"),
        }
    }
}

/// Raw single inserts (each its own statement) and one multi-row insert.
pub(crate) async fn raw_inserts(backend: Backend, n: usize, batch: usize) -> (f64, f64) {
    let db = TestDb::create(backend).await;
    let _store = db.store().await;
    let mut raw = RawInserter::open(backend, &db.url).await;
    let t0 = Instant::now();
    for i in 0..n {
        raw.insert(i).await;
    }
    let single = n as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    raw.insert_many(batch).await;
    (single, batch as f64 / t0.elapsed().as_secs_f64())
}

/// Raw SQL's pickup on PostgreSQL, the latency baseline: one idle worker that `LISTEN`s on
/// the channel jobvisor's insert trigger notifies (so a raw insert wakes it as it wakes a
/// node), claims one job at a time until none is left and marks each done, waiting for a
/// notification (or 1 s) between; a raw inserter on another connection sends `n` jobs 10 ms
/// apart. Each sample: milliseconds from just before the insert to the claim's return (the
/// moment a handler could start); beside them, each sample's stages (`stages.rs`; the
/// claim that found the job was sent when the worker woke, or after its previous job).
pub(crate) async fn raw_pickup_pg(n: usize) -> (Vec<f64>, Vec<Stages>) {
    use futures_util::StreamExt;
    let db = TestDb::create(Backend::Postgres).await;
    let _store = db.store().await; // the schema
    let epoch = Instant::now();
    let (client, mut conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(_) = m {
                let _ = wake.send(());
            }
        }
    });
    client
        .batch_execute("LISTEN jobvisor_jobs")
        .await
        .expect("listen");
    let claim = client.prepare(PG_CLAIM_ONE).await.expect("prepare");
    let fin = client.prepare(PG_DONE).await.expect("prepare");
    let worker = tokio::spawn(async move {
        // Per job: its number, the pickup (ms), the claim sent and answered.
        let mut samples = Vec::with_capacity(n);
        while samples.len() < n {
            loop {
                let sent = Instant::now();
                let Some(row) = client.query_opt(&claim, &[&now_us()]).await.expect("claim") else {
                    break;
                };
                let answered = Instant::now();
                let started = answered.duration_since(epoch).as_secs_f64() * 1000.0;
                let id: i64 = row.get(0);
                let payload: serde_json::Value = serde_json::from_str(row.get(1)).expect("payload");
                let t_ms = payload["t_ms"].as_f64().unwrap_or(started);
                let i = payload["i"].as_u64().unwrap_or(u64::MAX);
                samples.push((i, started - t_ms, sent, answered));
                tokio_postgres::Client::execute(&client, &fin, &[&now_us(), &vec![id]])
                    .await
                    .expect("done");
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), woken.recv()).await;
            while woken.try_recv().is_ok() {} // one claim loop answers them all
        }
        samples
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await; // let the worker go idle
    let mut raw = RawInserter::open(Backend::Postgres, &db.url).await;
    let mut inserts = Vec::with_capacity(n);
    for i in 0..n {
        let sent = Instant::now();
        let t_ms = sent.duration_since(epoch).as_secs_f64() * 1000.0;
        raw.insert_payload(&format!("{{\"t_ms\": {t_ms}, \"i\": {i}}}"))
            .await;
        inserts.push((sent, Instant::now()));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let samples = worker.await.expect("worker");
    let split = samples
        .iter()
        .filter_map(|&(i, _, sent, answered)| {
            let &(insert, inserted) = inserts.get(usize::try_from(i).ok()?)?;
            Some(Stages::of(insert, inserted, (sent, answered), answered))
        })
        .collect();
    (samples.iter().map(|s| s.1).collect(), split)
}
