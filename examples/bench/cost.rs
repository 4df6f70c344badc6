//! The `cost` mode: what one job costs, for jobvisor's drain and raw SQL's (k = 100) in the
//! same run — statements, round trips and commits per 1,000 jobs, client and server CPU per
//! job.
//!
//! Each side drains twice, each time on a fresh database with its N jobs enqueued
//! beforehand (not measured):
//!
//! 1. **counted**: every connection carries `jobvisor::testing::count_statements`'s diesel
//!    instrumentation (what each figure includes is in its docs: `BEGIN`, `COMMIT` and
//!    MariaDB's checkout ping are statements; a pipeline is one round trip; commits are
//!    transactions that wrote). Raw SQL on PostgreSQL runs on tokio-postgres and counts its
//!    own statements (each an autocommitted `UPDATE`, one round trip). Figures include the
//!    node's start and shutdown; the change signal of MariaDB and SQLite (a read every 80 ms
//!    on its own connection, whatever the drain) is reported apart (`signal_per_1k`).
//! 2. **timed**, `--rounds` times (medians; ranges in the JSON line): no instrumentation. Client CPU is this process's threads' (`/proc/self/task/*/schedstat`)
//!    over the drain, per job. Server CPU is that of the server processes
//!    (PostgreSQL backends, found by `application_name`) or threads (MariaDB, found by their
//!    database in `information_schema.PROCESSLIST`, `TID`) serving this drain's connections,
//!    from `/proc/<id>/schedstat`, sampled every 100 ms (so a connection closed meanwhile
//!    counts up to its last sample); `server_all_us_per_job` is every process of the server,
//!    other clients of a shared server included. SQLite runs inside the process: its work is
//!    client CPU.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncMysqlConnection};
use jobvisor::testing::{base_url, count_statements, sent, Sent, TestDb};
use jobvisor::{Backend, Store, StoreOptions};
use serde_json::{json, Value};

use crate::modes::{drain_on, fill};
use crate::raw::{raw_drain_diesel, raw_drain_pg, PG_STATEMENTS};

/// The raw drain's claim size in this mode (the ratio's reference elsewhere too).
const RAW_K: i64 = 100;

/// Who drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Jobvisor,
    Raw,
}

/// One side's cost, per 1,000 jobs and per job.
#[derive(Debug, Clone)]
pub(crate) struct Cost {
    pub(crate) statements: f64,
    pub(crate) round_trips: f64,
    pub(crate) commits: f64,
    pub(crate) signal: f64,
    pub(crate) client_us: f64,
    pub(crate) server_us: Option<f64>,
    pub(crate) server_all_us: Option<f64>,
    pub(crate) jobs_per_sec: f64,
    extra: Value,
}

impl Cost {
    pub(crate) fn json(&self) -> Value {
        let r1 = |x: f64| (x * 10.0).round() / 10.0;
        let mut v = json!({
            "statements_per_1k": r1(self.statements),
            "round_trips_per_1k": r1(self.round_trips),
            "commits_per_1k": r1(self.commits),
            "signal_per_1k": r1(self.signal),
            "client_us_per_job": r1(self.client_us),
            "server_us_per_job": self.server_us.map(r1),
            "server_all_us_per_job": self.server_all_us.map(r1),
            "timed_jobs_per_sec": self.jobs_per_sec.round(),
        });
        if let (Value::Object(m), Value::Object(e)) = (&mut v, &self.extra) {
            m.extend(e.clone());
        }
        v
    }
}

/// jobvisor's cost and raw SQL's, on `backend`, for drains of `n` jobs at concurrency `c`.
pub(crate) async fn cost(
    backend: Backend,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
    rounds: usize,
) -> (Cost, Cost) {
    let jv = side(backend, Side::Jobvisor, n, c, prefetch, rounds).await;
    let raw = side(backend, Side::Raw, n, c, prefetch, rounds).await;
    (jv, raw)
}

async fn side(
    backend: Backend,
    who: Side,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
    rounds: usize,
) -> Cost {
    // 1. Counted.
    count_statements(true);
    let (db, url) = fresh(backend).await;
    let store = open(&url).await;
    fill(&store, n).await;
    let (before, pg_before) = (sent(), AtomicU64::load(&PG_STATEMENTS, Ordering::Relaxed));
    let mut extra = run(backend, who, &store, &url, n, c, prefetch).await;
    let mut counted = sent().since(&before);
    count_statements(false);
    drop(store);
    drop(db);
    let signal = take_signal(&mut counted);
    if backend == Backend::Postgres && who == Side::Raw {
        let k = AtomicU64::load(&PG_STATEMENTS, Ordering::Relaxed) - pg_before;
        counted.statements += k;
        counted.round_trips += k;
        counted.commits += k;
    }
    let per_k = |x: u64| x as f64 * 1000.0 / n as f64;
    if who == Side::Jobvisor {
        eprintln!("  statements per 1,000 jobs, by kind (jobvisor, {backend:?}):");
        let mut kinds: Vec<_> = counted.by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1));
        for (kind, k) in kinds {
            eprintln!("  {:>9.2}  {kind}", per_k(*k));
        }
    }

    // 2. Timed, uninstrumented, `rounds` times: medians.
    let (mut client, mut ours, mut all, mut rate) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds.max(1) {
        let (db, url) = fresh(backend).await;
        let store = open(&url).await;
        fill(&store, n).await;
        let sampler = Sampler::start(backend, &db, &url).await;
        let cpu0 = self_tasks();
        let t0 = Instant::now();
        run(backend, who, &store, &url, n, c, prefetch).await;
        let secs = t0.elapsed().as_secs_f64();
        let used = self_cpu_since(&cpu0);
        if let Some(s) = sampler {
            let (o, a) = s.stop().await;
            ours.push(o.as_secs_f64() * 1e6 / n as f64);
            all.push(a.as_secs_f64() * 1e6 / n as f64);
        }
        drop(store);
        drop(db);
        client.push(used.as_secs_f64() * 1e6 / n as f64);
        rate.push(n as f64 / secs);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0_f64, f64::max);
        json!([(lo * 10.0).round() / 10.0, (hi * 10.0).round() / 10.0])
    };
    extra["rounds"] = json!(rounds.max(1));
    extra["client_us_range"] = range(&client);
    if !ours.is_empty() {
        extra["server_us_range"] = range(&ours);
    }
    extra["jobs_per_sec_range"] = range(&rate);
    Cost {
        statements: per_k(counted.statements),
        round_trips: per_k(counted.round_trips),
        commits: per_k(counted.commits),
        signal: per_k(signal),
        client_us: median(client).unwrap_or(0.0),
        server_us: median(ours),
        server_all_us: median(all),
        jobs_per_sec: median(rate).unwrap_or(0.0),
        extra,
    }
}

/// Runs one drain: jobvisor's scheduler on `store`, or the raw workers on `url`.
async fn run(
    backend: Backend,
    who: Side,
    store: &Store,
    url: &str,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
) -> Value {
    match who {
        Side::Jobvisor => {
            let (_, stats) = drain_on(store.clone(), n, c, prefetch).await;
            json!({
                "claims_per_1k": stats["claim_stmts_per_job"].as_f64().map(|x| x * 1000.0),
                "finalizations_per_1k": stats["finalize_stmts_per_job"].as_f64().map(|x| x * 1000.0),
            })
        }
        Side::Raw => {
            let got = match backend {
                Backend::Postgres => raw_drain_pg(url, c, RAW_K).await,
                _ => raw_drain_diesel(backend, url, c, RAW_K).await,
            };
            assert_eq!(got, n, "the raw drain claimed every job once");
            json!({ "raw_k": RAW_K })
        }
    }
}

/// Removes the change signal's reads from `sent` (a read alone on its own connection: one
/// statement, one round trip, no commit); answers how many there were.
fn take_signal(sent: &mut Sent) -> u64 {
    let kinds: Vec<String> = sent
        .by_kind
        .keys()
        .filter(|k| k.starts_with("SELECT (SELECT max("))
        .cloned()
        .collect();
    let mut n = 0;
    for k in kinds {
        n += sent.by_kind.remove(&k).unwrap_or(0);
    }
    sent.statements -= n;
    sent.round_trips -= n;
    n
}

/// A fresh database and the URL to drain it with: on PostgreSQL with an `application_name`
/// of its own, so its backends can be told from every other client's.
async fn fresh(backend: Backend) -> (TestDb, String) {
    let db = TestDb::create(backend).await;
    let url = match backend {
        Backend::Postgres => {
            let sep = if db.url.contains('?') { '&' } else { '?' };
            format!("{}{sep}application_name={}", db.url, app_name(&db))
        }
        _ => db.url.clone(),
    };
    (db, url)
}

fn app_name(db: &TestDb) -> String {
    // The schema's name is in the URL's search_path option: unique per database.
    let tail = db.url.rsplit("search_path%3D").next().unwrap_or("x");
    let schema: String = tail
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    format!("cost_{schema}")
}

async fn open(url: &str) -> Store {
    Store::connect_with(url, StoreOptions::default().pool_size(12).migrate(true))
        .await
        .expect("opening the store")
}

/// This process's threads and their CPU time (`/proc/self/task/*/schedstat`, nanoseconds).
fn self_tasks() -> HashMap<u64, u64> {
    let mut out = HashMap::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let tid = t.file_name().to_string_lossy().to_string();
            if let (Ok(id), Some(ns)) = (tid.parse(), task_cpu(&format!("/proc/self/task/{tid}"))) {
                out.insert(id, ns);
            }
        }
    }
    out
}

/// CPU this process's threads used since `before` (a thread that ended meanwhile is lost:
/// none does during a drain).
fn self_cpu_since(before: &HashMap<u64, u64>) -> Duration {
    let ns = self_tasks()
        .iter()
        .map(|(id, &ns)| ns.saturating_sub(*before.get(id).unwrap_or(&0)))
        .sum();
    Duration::from_nanos(ns)
}

/// A task's CPU time (`schedstat`: nanoseconds on a CPU).
fn task_cpu(dir: &str) -> Option<u64> {
    std::fs::read_to_string(format!("{dir}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn comm(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// MariaDB's process (0 if none is visible).
fn mysqld_pid() -> u64 {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .map(|p| p.file_name().to_string_lossy().to_string())
        .filter(|pid| matches!(comm(pid).as_str(), "mariadbd" | "mysqld"))
        .find_map(|pid| pid.parse().ok())
        .unwrap_or(0)
}

/// The server's tasks and their CPU: PostgreSQL's processes, or MariaDB's threads.
fn server_tasks(backend: Backend) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        match (backend, comm(&pid).as_str()) {
            (Backend::Postgres, "postgres") => {
                if let (Ok(id), Some(ns)) = (pid.parse(), task_cpu(&format!("/proc/{pid}"))) {
                    out.insert(id, ns);
                }
            }
            (Backend::Mysql, "mariadbd" | "mysqld") => {
                let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                    continue;
                };
                for t in tasks.flatten() {
                    let tid = t.file_name().to_string_lossy().to_string();
                    if let (Ok(id), Some(ns)) =
                        (tid.parse(), task_cpu(&format!("/proc/{pid}/task/{tid}")))
                    {
                        out.insert(id, ns);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Samples the CPU of the server tasks serving one drain's connections, every 100 ms.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Duration, Duration)>,
}

impl Sampler {
    /// None on SQLite (no server) or when the server's processes are not visible here.
    async fn start(backend: Backend, db: &TestDb, url: &str) -> Option<Sampler> {
        let before = server_tasks(backend);
        if backend == Backend::Sqlite || before.is_empty() {
            return None;
        }
        let lookup = Lookup::open(backend, db, url).await;
        let mysqld = mysqld_pid();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut lookup = lookup;
            let mut last: HashMap<u64, u64> = HashMap::new();
            loop {
                let done = flag.load(Ordering::Relaxed);
                // Only this drain's tasks each time: a scan of every process would cost
                // this process (the client) more than raw SQL's drain does per job.
                for id in lookup.ids().await {
                    let dir = match backend {
                        Backend::Postgres => format!("/proc/{id}"),
                        _ => format!("/proc/{mysqld}/task/{id}"),
                    };
                    if let Some(ns) = task_cpu(&dir) {
                        last.insert(id, ns);
                    }
                }
                if done {
                    let since =
                        |id: &u64, ns: u64| ns.saturating_sub(*before.get(id).unwrap_or(&0));
                    let ours: u64 = last.iter().map(|(id, &ns)| since(id, ns)).sum();
                    // Every task of the server still there, and this drain's that ended.
                    let mut now = server_tasks(backend);
                    for (id, ns) in &last {
                        now.entry(*id).or_insert(*ns);
                    }
                    let all: u64 = now.iter().map(|(id, &ns)| since(id, ns)).sum();
                    return (Duration::from_nanos(ours), Duration::from_nanos(all));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Some(Sampler { stop, task })
    }

    /// Takes a last sample: the CPU of this drain's server tasks, and of all of them.
    async fn stop(self) -> (Duration, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler")
    }
}

/// Finds the server tasks of one drain's connections.
enum Lookup {
    Pg(tokio_postgres::Client, String),
    Mysql(Box<AsyncMysqlConnection>, String),
}

impl Lookup {
    async fn open(backend: Backend, db: &TestDb, url: &str) -> Lookup {
        match backend {
            Backend::Postgres => {
                let (client, conn) =
                    tokio_postgres::connect(&base_url(backend), tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                tokio::spawn(conn);
                let app = url
                    .rsplit("application_name=")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                Lookup::Pg(client, app)
            }
            _ => {
                let conn = AsyncMysqlConnection::establish(&base_url(backend))
                    .await
                    .expect("connect");
                let name = url::Url::parse(&db.url)
                    .map(|u| u.path().trim_start_matches('/').to_string())
                    .unwrap_or_default();
                Lookup::Mysql(Box::new(conn), name)
            }
        }
    }

    async fn ids(&mut self) -> Vec<u64> {
        match self {
            Lookup::Pg(client, app) => {
                let app: &str = app;
                client
                    .query(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                        &[&app],
                    )
                    .await
                    .map(|rows| {
                        rows.iter()
                            .map(|r| u64::try_from(r.get::<_, i32>(0)).unwrap_or(0))
                            .collect()
                    })
                    .unwrap_or_default()
            }
            Lookup::Mysql(conn, db) => {
                use diesel_async::RunQueryDsl as _;
                #[derive(diesel::QueryableByName)]
                struct Tid {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    tid: i64,
                }
                diesel::sql_query(format!(
                    "SELECT CAST(TID AS SIGNED) AS tid FROM information_schema.PROCESSLIST \
                     WHERE DB = '{db}'"
                ))
                .load::<Tid>(&mut **conn)
                .await
                .map(|v| {
                    v.into_iter()
                        .map(|t| u64::try_from(t.tid).unwrap_or(0))
                        .collect()
                })
                .unwrap_or_default()
            }
        }
    }
}
