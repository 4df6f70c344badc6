//! The multi-process crash test: DESIGN §6 invariants 1, 2, 3 and 6 with real processes,
//! real kills and a real database restart, on PostgreSQL, MariaDB/MySQL and SQLite (several
//! processes sharing one file).
//!
//! For each backend it enqueues N jobs and starts three node processes
//! (`examples/crash_node.rs`). Every 0.5–2.5 s it takes a random node down — SIGKILL three
//! times in four, a graceful stop (leases of running jobs given back) otherwise — and starts
//! a replacement. Once 40 % of the jobs are done it stops the database server, keeps it down
//! for 3 s (longer than the nodes' 2 s lease, so every lease expires meanwhile and every
//! running handler must fence itself) and starts it again; SQLite has no server, so all nodes
//! are killed at once instead. When every job is terminal it stops the nodes gracefully and
//! checks, from the tables alone, that no job was lost, ran twice at once, or had its outcome
//! written by anyone but the holder of its last lease, and that every node that ran through
//! the restart recovered by itself. See [`check`] for every rule and why it is as strict as
//! it is.
//!
//! The tests are `#[ignore]`d: they restart the machine's database servers, so the main test
//! run must not include them. Run them one at a time, as `.ci/crash` does:
//!
//! ```sh
//! cargo test --features test-util --test crash -- --ignored --test-threads=1
//! ```
//!
//! Settings (environment; a value that does not parse fails the test):
//! * `JOBVISOR_CRASH_JOBS` — jobs per backend (default 5,000, at least 500).
//! * `JOBVISOR_CRASH_SECONDS` — long mode: keep jobs coming for this many seconds, restart
//!   the server every 60 s (at least once), then drain and check.
//! * `JOBVISOR_CRASH_SEED` — seed of the kill schedule (printed by every run).
//! * `JOBVISOR_CRASH_KEEP` — set to keep the directory of node logs and journals after a
//!   passing run too (a failing run always keeps it).
//! * `JOBVISOR_CRASH_NODE_BIN` — a prebuilt `crash_node`; by default the test builds it with
//!   `cargo build --example crash_node` into the target directory the test binary itself runs
//!   from (examples have no `CARGO_BIN_EXE_*`), so the node always matches the library under
//!   test.
//! * `JOBVISOR_PG_URL` / `JOBVISOR_MYSQL_URL` — as for the other tests; they must point at
//!   the local server, because that is the one the test restarts.
//!
//! The restart is guarded: whatever happens (a failed check, a panic), the server is started
//! again and awaited before the test returns. Node processes are killed when the test ends,
//! and each node also stops by itself when its standard input (a pipe from the test) closes.
//! On failure the directory with every node's log and journal is kept and printed.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)] // the node uses the parts the driver does not
#[path = "crash/side.rs"]
mod side;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use jobvisor::scheduler::Event;
use jobvisor::store::conformance::{base_url, TestDb};
use jobvisor::{
    handler_fn, Backend, EnqueueParams, Job, JobContext, JobFailure, JobId, JobOutcome, JobState,
    ListParams, NewJob, QueueConfig, RetryPolicy, Scheduler, SchedulerConfig, Store,
};
use serde_json::json;

use side::{now_us, Execution, JournalLine, NodeRow, SideDb};

/// Nodes running at any time.
const NODES: usize = 3;
/// Jobs per backend unless `JOBVISOR_CRASH_JOBS` says otherwise.
const DEFAULT_JOBS: usize = 5_000;
/// The queue the nodes work (one queue, concurrency 8 per node).
const QUEUE: &str = "crash";
/// A kill happens this long after the previous one, uniformly at random in between.
const KILL_EVERY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_millis(2_500));
/// The first kill happens this long after the nodes start.
const FIRST_KILL: (Duration, Duration) = (Duration::from_millis(200), Duration::from_millis(1_000));
/// The database restarts once this share of the jobs is terminal (normal mode).
const RESTART_AT: f64 = 0.4;
/// The server stays down this long in a restart: longer than the nodes' 2 s lease, so every
/// running job's lease expires meanwhile — its handler must fence itself and the job be
/// reclaimed once the server is back.
const SERVER_DOWN_FOR: Duration = Duration::from_secs(3);
/// Long mode restarts the server this often.
const LONG_RESTART_EVERY: Duration = Duration::from_secs(60);
/// How long past the planned end the run may take before the test gives up.
const SETTLE_LIMIT: Duration = Duration::from_secs(300);
/// After a server restart no node is killed or stopped for this long, so that the nodes
/// that ran through it can show they recover.
const RECOVERY_WINDOW: Duration = Duration::from_secs(6);
/// The test's own store must answer again this soon after a restart.
const STORE_STALL_LIMIT: Duration = Duration::from_secs(20);
/// How long nodes get to shut down gracefully.
const STOP_WITHIN: Duration = Duration::from_secs(30);
/// The driver looks at the processes and the progress this often.
const TICK: Duration = Duration::from_millis(100);
/// Max attempts per job: high enough that no job can die of this test's reclaims.
const MAX_ATTEMPTS: u32 = 100;
/// Comparisons between a node's clock and a time the database stamped allow this much:
/// SQLite's `unixepoch('subsec')` has millisecond resolution.
const DB_CLOCK_SLACK_US: i64 = 1_000;

#[test]
#[ignore = "restarts the PostgreSQL server; run with .ci/crash"]
fn crash_postgres() {
    run_blocking(Backend::Postgres);
}

#[test]
#[ignore = "restarts the MariaDB/MySQL server; run with .ci/crash"]
fn crash_mysql() {
    run_blocking(Backend::Mysql);
}

#[test]
#[ignore = "kills node processes sharing an SQLite file; run with .ci/crash"]
fn crash_sqlite() {
    run_blocking(Backend::Sqlite);
}

fn run_blocking(backend: Backend) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(backend));
}

// ---------------------------------------------------------------------------------------------
// Settings

/// What this run does, from the environment.
#[derive(Debug, Clone, Copy)]
struct Settings {
    jobs: usize,
    seconds: Option<u64>,
    seed: u64,
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?} is not a valid number: {e}"),
    }
}

fn settings() -> Settings {
    let jobs = env_number("JOBVISOR_CRASH_JOBS").unwrap_or(DEFAULT_JOBS);
    assert!(
        jobs >= 500,
        "JOBVISOR_CRASH_JOBS={jobs}: need at least 500 jobs, or the run ends before the \
         first kill and the restart"
    );
    let seconds = env_number("JOBVISOR_CRASH_SECONDS");
    assert!(
        seconds != Some(0),
        "JOBVISOR_CRASH_SECONDS=0: leave it unset for the normal run"
    );
    let seed = env_number("JOBVISOR_CRASH_SEED")
        .unwrap_or_else(|| u64::try_from(now_us()).unwrap_or_default());
    Settings {
        jobs,
        seconds,
        seed,
    }
}

/// splitmix64: the kill schedule, reproducible from the printed seed.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
    }

    fn between(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        let span = u64::try_from((hi - lo).as_micros()).unwrap();
        lo + Duration::from_micros(self.next() % (span + 1))
    }
}

// ---------------------------------------------------------------------------------------------
// The node binary

/// The `crash_node` example, built once per test process (see the module docs).
fn node_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("JOBVISOR_CRASH_NODE_BIN") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "JOBVISOR_CRASH_NODE_BIN={} is not a file",
                p.display()
            );
            return p;
        }
        // This test runs as <target-dir>/<profile>/deps/crash-<hash>; the example goes to
        // <target-dir>/<profile>/examples/crash_node.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("cannot find the target directory of {}", exe.display()));
        let target_dir = profile_dir.parent().unwrap();
        let profile = profile_dir.file_name().and_then(|s| s.to_str());
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "build",
            "--example",
            "crash_node",
            "--features",
            "test-util",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
        match profile {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            other => panic!(
                "the test runs from profile directory {other:?}; build crash_node yourself and \
                 set JOBVISOR_CRASH_NODE_BIN"
            ),
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running {cargo} build --example crash_node: {e}"));
        assert!(
            status.success(),
            "cargo build --example crash_node: {status}"
        );
        let bin = profile_dir.join("examples").join("crash_node");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
    .clone()
}

// ---------------------------------------------------------------------------------------------
// Node processes

/// A running node process.
#[derive(Debug)]
struct NodeProc {
    name: String,
    child: Child,
    /// Closing it asks the node to shut down gracefully.
    stdin: Option<ChildStdin>,
    spawned_at_us: i64,
}

/// The node processes of one run, live and gone.
#[derive(Debug)]
struct Fleet {
    bin: PathBuf,
    url: String,
    dir: PathBuf,
    next: usize,
    live: Vec<NodeProc>,
    /// Asked to stop gracefully, with when they must be gone by.
    stopping: Vec<(NodeProc, Instant)>,
    gone: Vec<NodeRow>,
    kills: usize,
    stops: usize,
}

impl Fleet {
    fn new(bin: PathBuf, url: String, dir: &Path) -> Fleet {
        Fleet {
            bin,
            url,
            dir: dir.to_path_buf(),
            next: 0,
            live: Vec::new(),
            stopping: Vec::new(),
            gone: Vec::new(),
            kills: 0,
            stops: 0,
        }
    }

    fn journal(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.journal"))
    }

    fn log(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.log"))
    }

    fn spawn(&mut self) {
        self.next += 1;
        let name = format!("n{}", self.next);
        let log = std::fs::File::create(self.log(&name)).unwrap();
        let mut child = Command::new(&self.bin)
            .arg(&self.url)
            .arg(&name)
            .arg("--journal")
            .arg(self.journal(&name))
            // A short shutdown wait: a graceful stop gives back the leases of jobs that
            // are still running after 20 ms rather than letting them all finish.
            .args([
                "--queue",
                QUEUE,
                "--concurrency",
                "8",
                "--shutdown-ms",
                "20",
            ])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        let stdin = child.stdin.take();
        self.live.push(NodeProc {
            name,
            child,
            stdin,
            spawned_at_us: now_us(),
        });
    }

    fn record_gone(&mut self, n: &NodeProc, how: &str) {
        self.gone.push(NodeRow {
            node: n.name.clone(),
            pid: i64::from(n.child.id()),
            spawned_at_us: n.spawned_at_us,
            // Taken after `wait` returned: the process is surely gone by then.
            gone_at_us: now_us(),
            how: how.into(),
        });
    }

    /// SIGKILL, then reap.
    fn kill(&mut self, i: usize) {
        let mut n = self.live.swap_remove(i);
        n.child.kill().unwrap();
        n.child.wait().unwrap();
        self.record_gone(&n, "killed");
        self.kills += 1;
    }

    fn kill_random(&mut self, rng: &mut Rng) {
        if !self.live.is_empty() {
            let i = rng.below(self.live.len());
            self.kill(i);
        }
    }

    fn kill_all(&mut self) {
        while !self.live.is_empty() {
            self.kill(self.live.len() - 1);
        }
    }

    /// A node must not exit by itself while the run goes on.
    fn assert_all_running(&mut self) {
        for n in &mut self.live {
            if let Some(status) = n.child.try_wait().unwrap() {
                panic!(
                    "node {} exited by itself ({status}); its log:\n{}",
                    n.name,
                    tail(&self.dir.join(format!("{}.log", n.name)), 40)
                );
            }
        }
    }

    /// Asks node `i` to shut down gracefully (its standard input is closed); it is reaped
    /// by [`Fleet::reap`].
    fn stop(&mut self, i: usize) {
        let mut n = self.live.swap_remove(i);
        n.stdin.take();
        self.stopping.push((n, Instant::now() + STOP_WITHIN));
        self.stops += 1;
    }

    fn stop_random(&mut self, rng: &mut Rng) {
        if !self.live.is_empty() {
            let i = rng.below(self.live.len());
            self.stop(i);
        }
    }

    /// Reaps nodes that were asked to stop. A node that exits non-zero, or that is still
    /// running [`STOP_WITHIN`] after it was asked, is a problem (and is killed).
    fn reap(&mut self, problems: &mut Vec<String>) {
        let mut i = 0;
        while i < self.stopping.len() {
            let (n, until) = &mut self.stopping[i];
            let status = n.child.try_wait().unwrap();
            if status.is_none() && Instant::now() < *until {
                i += 1;
                continue;
            }
            let (mut n, _) = self.stopping.swap_remove(i);
            match status {
                Some(status) => {
                    if !status.success() {
                        problems.push(format!(
                            "node {} exited with {status} on graceful stop; its log:\n{}",
                            n.name,
                            tail(&self.log(&n.name), 40)
                        ));
                    }
                    self.record_gone(&n, "stopped");
                }
                None => {
                    problems.push(format!(
                        "node {} did not stop within {STOP_WITHIN:?}; killed",
                        n.name
                    ));
                    n.child.kill().unwrap();
                    n.child.wait().unwrap();
                    self.record_gone(&n, "killed");
                }
            }
        }
    }

    /// Stops every node gracefully and reaps them all.
    fn stop_all(&mut self, problems: &mut Vec<String>) {
        while !self.live.is_empty() {
            self.stop(self.live.len() - 1);
        }
        while !self.stopping.is_empty() {
            self.reap(problems);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let stopping = self.stopping.iter_mut().map(|(n, _)| n);
        for n in self.live.iter_mut().chain(stopping) {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}

/// The last `lines` lines of a file, for failure messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// The database server

/// The local server behind a backend, which the test restarts.
#[derive(Debug, Clone)]
enum Server {
    Postgres { version: String, port: u16 },
    Mysql { port: u16 },
}

fn run_cmd(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Server {
    /// The local server of `backend`, or `None` for SQLite. Fails the test if the URL does
    /// not point at this machine.
    fn of(backend: Backend) -> Option<Server> {
        if backend == Backend::Sqlite {
            return None;
        }
        let u = url::Url::parse(&base_url(backend)).unwrap();
        let host = u.host_str().unwrap_or_default();
        assert!(
            matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]"),
            "the crash test restarts the local {backend:?} server, but its URL points at {host:?}"
        );
        Some(match backend {
            Backend::Postgres => {
                let version = std::fs::read_dir("/etc/postgresql")
                    .expect("the crash test restarts a local Debian PostgreSQL cluster (/etc/postgresql)")
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .max_by_key(|v| v.parse::<u32>().unwrap_or(0))
                    .expect("no cluster under /etc/postgresql");
                Server::Postgres {
                    version,
                    port: u.port().unwrap_or(5432),
                }
            }
            _ => Server::Mysql {
                port: u.port().unwrap_or(3306),
            },
        })
    }

    fn answers(&self) -> bool {
        match self {
            Server::Postgres { port, .. } => run_cmd(
                "pg_isready",
                &["-q", "-h", "127.0.0.1", "-p", &port.to_string()],
            )
            .is_ok(),
            Server::Mysql { port } => run_cmd(
                "mariadb-admin",
                &[
                    "-h127.0.0.1",
                    &format!("-P{port}"),
                    "-uroot",
                    "--connect-timeout=2",
                    "ping",
                ],
            )
            .is_ok(),
        }
    }

    fn wait_up(&self, within: Duration) -> Result<(), String> {
        let until = Instant::now() + within;
        while !self.answers() {
            if Instant::now() >= until {
                return Err(format!("{self:?} does not answer after {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start(&self) -> Result<(), String> {
        match self {
            Server::Postgres { version, .. } => run_cmd(
                "pg_ctlcluster",
                &["--skip-systemctl-redirect", version, "main", "start"],
            ),
            Server::Mysql { .. } => {
                run_cmd(
                    "install",
                    &["-d", "-o", "mysql", "-g", "mysql", "/run/mysqld"],
                )?;
                run_cmd(
                    "start-stop-daemon",
                    &[
                        "--start",
                        "--oknodo",
                        "--background",
                        "--exec",
                        "/usr/sbin/mariadbd",
                    ],
                )
            }
        }
    }

    /// Stops the server, keeps it down for `down_for`, starts it and waits until it
    /// answers; answers how long it was gone.
    fn restart(&self, down_for: Duration) -> Result<Duration, String> {
        let t = Instant::now();
        match self {
            Server::Postgres { version, .. } => run_cmd(
                "pg_ctlcluster",
                &["--skip-systemctl-redirect", version, "main", "stop"],
            )?,
            Server::Mysql { .. } => {
                run_cmd("mariadb-admin", &["-uroot", "shutdown"])?;
                let until = Instant::now() + Duration::from_secs(60);
                while run_cmd("pgrep", &["-x", "mariadbd"]).is_ok() {
                    if Instant::now() >= until {
                        return Err("mariadbd still running 60 s after shutdown".into());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        std::thread::sleep(down_for);
        self.start()?;
        self.wait_up(Duration::from_secs(60))?;
        Ok(t.elapsed())
    }
}

/// Brings the server back when dropped, whatever happened to the test.
#[derive(Debug)]
struct ServerGuard(Server);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if self.0.answers() {
            return;
        }
        eprintln!("crash test: {:?} is down; starting it again", self.0);
        if let Err(e) = self.0.start() {
            eprintln!("crash test: starting {:?}: {e}", self.0);
        }
        if let Err(e) = self.0.wait_up(Duration::from_secs(120)) {
            eprintln!("crash test: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// The run's directory of node logs and journals: removed after a passing run, kept when
/// the test panics (a failed check or anything else) so the evidence survives.
#[derive(Debug)]
struct RunDir(Option<tempfile::TempDir>);

impl RunDir {
    fn path(&self) -> &Path {
        self.0.as_ref().map(tempfile::TempDir::path).unwrap()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("JOBVISOR_CRASH_KEEP").is_some() {
            if let Some(d) = self.0.take() {
                eprintln!(
                    "crash test: logs and journals kept in {}",
                    d.keep().display()
                );
            }
        }
    }
}

/// Progress of the run, from the live table.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    terminal: usize,
    succeeded: usize,
}

async fn progress(store: &Store) -> Result<Progress, String> {
    let counts = store.job_counts().await.map_err(|e| e.to_string())?;
    let mut p = Progress::default();
    for c in counts {
        let n = usize::try_from(c.count).unwrap();
        if c.state.is_terminal() {
            p.terminal += n;
        }
        if c.state == JobState::Succeeded {
            p.succeeded += n;
        }
    }
    Ok(p)
}

/// A server restart, for the recovery check.
#[derive(Debug, Clone)]
struct Restart {
    /// When the server answered again.
    up_at_us: i64,
    /// The nodes that ran through it (their connections died under them).
    survivors: Vec<String>,
}

/// Invariant 2 needs the nodes to carry on after a restart by themselves: every node that
/// ran through one must start executions again afterwards (kills pause for
/// [`RECOVERY_WINDOW`] after each restart so they have the time), as long as there was work
/// left for everyone.
fn check_recovery(restarts: &[Restart], execs: &[Execution]) -> Vec<String> {
    let mut bad = Vec::new();
    for r in restarts {
        let after: Vec<&Execution> = execs
            .iter()
            .filter(|e| e.started_at_us > r.up_at_us)
            .collect();
        if after.len() < 10 * NODES {
            continue;
        }
        for n in &r.survivors {
            if !after.iter().any(|e| &e.node == n) {
                bad.push(format!(
                    "node {n} ran through the server restart (back at {}) and never started \
                     a job again, while others started {}: it did not recover",
                    r.up_at_us,
                    after.len()
                ));
            }
        }
    }
    bad
}

/// Enqueues `n` more jobs; `false` if the database refused (it is restarting): try later.
async fn enqueue(store: &Store, next: &mut usize, n: usize) -> bool {
    let jobs: Vec<NewJob> = (*next..*next + n)
        .map(|i| {
            NewJob::new("crashy", json!({ "i": i }))
                .queue(QUEUE)
                .max_attempts(MAX_ATTEMPTS)
        })
        .collect();
    for chunk in jobs.chunks(500) {
        match store
            .job_enqueue_many(EnqueueParams::many(chunk.to_vec()))
            .await
        {
            Ok(e) => *next += e.len(),
            Err(_) => return false,
        }
    }
    true
}

/// Runs a driver-side database call, retrying a few times: after a restart the first use of
/// each pooled connection fails (the pools recycle connections only on error).
async fn retry<T, E: std::fmt::Display, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if tries >= 20 => panic!("{what}: {e}"),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

async fn all_jobs(store: &Store, archived: bool) -> Vec<Job> {
    let mut out: Vec<Job> = Vec::new();
    loop {
        let after = out.last().map(|j| j.id);
        let page = retry("listing jobs", || {
            store.job_list(ListParams {
                after,
                limit: 1000,
                archived,
                ..ListParams::default()
            })
        })
        .await;
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

async fn run(backend: Backend) {
    let s = settings();
    let bin = node_binary();
    let began = Instant::now();
    // Declared in this order so that they drop in reverse: nodes killed first, then the
    // server brought back, then the test database dropped.
    let db = TestDb::create(backend).await;
    let guard = Server::of(backend).map(ServerGuard);
    let store = db.store().await;
    let side = SideDb::open(&db.url, 4).unwrap();
    side.create_tables().await.unwrap();
    let dir = RunDir(Some(
        tempfile::Builder::new()
            .prefix("jobvisor-crash-")
            .tempdir()
            .unwrap(),
    ));
    let mut fleet = Fleet::new(bin, db.url.clone(), dir.path());
    let mut rng = Rng(s.seed);
    eprintln!(
        "crash test [{backend:?}]: seed {} ({}), journals and logs in {}",
        s.seed,
        s.seconds
            .map_or(format!("{} jobs", s.jobs), |t| format!("long mode, {t} s")),
        dir.path().display()
    );

    let mut enqueued = 0;
    while enqueued < s.jobs {
        let more = s.jobs - enqueued;
        assert!(
            enqueue(&store, &mut enqueued, more).await,
            "enqueueing failed"
        );
    }
    for _ in 0..NODES {
        fleet.spawn();
    }

    let long_until = s.seconds.map(|t| began + Duration::from_secs(t));
    let restart_every = s
        .seconds
        .map(|t| LONG_RESTART_EVERY.min(Duration::from_secs(t) / 2));
    let hard_limit = long_until.unwrap_or(began) + SETTLE_LIMIT;
    let mut restarts = 0usize;
    let mut server_down = Duration::ZERO;
    // The first kill comes early, so that even a short run has one.
    let mut next_kill = Instant::now() + rng.between(FIRST_KILL);
    let mut p = Progress::default();
    let mut problems = Vec::new();
    let mut server_restarts: Vec<Restart> = Vec::new();
    let mut answered_at = Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        fleet.assert_all_running();
        fleet.reap(&mut problems);
        match progress(&store).await {
            Ok(now) => {
                p = now;
                answered_at = Instant::now();
            }
            Err(e) => assert!(
                answered_at.elapsed() < STORE_STALL_LIMIT,
                "the test's own Store has not answered for {:?} (the server is up): {e}",
                answered_at.elapsed()
            ),
        }
        let topping_up = long_until.is_some_and(|t| Instant::now() < t);
        if topping_up && enqueued - p.terminal < s.jobs / 2 {
            enqueue(&store, &mut enqueued, s.jobs / 2).await;
        }
        if !topping_up && p.terminal == enqueued {
            break;
        }
        let restart_due = match restart_every {
            None => restarts == 0 && p.terminal as f64 >= RESTART_AT * enqueued as f64,
            Some(every) => {
                topping_up && began.elapsed() >= every * u32::try_from(restarts + 1).unwrap()
            }
        };
        if restart_due {
            restarts += 1;
            match &guard {
                Some(g) => {
                    let down = tokio::task::block_in_place(|| g.0.restart(SERVER_DOWN_FOR))
                        .unwrap_or_else(|e| panic!("restarting the server: {e}"));
                    eprintln!(
                        "crash test [{backend:?}]: server restarted in {down:?} at {}/{} jobs",
                        p.terminal, enqueued
                    );
                    server_down += down;
                    server_restarts.push(Restart {
                        up_at_us: now_us(),
                        survivors: fleet.live.iter().map(|n| n.name.clone()).collect(),
                    });
                    answered_at = Instant::now();
                    next_kill = next_kill.max(Instant::now() + RECOVERY_WINDOW);
                }
                None => {
                    fleet.kill_all();
                    for _ in 0..NODES {
                        fleet.spawn();
                    }
                    eprintln!(
                        "crash test [{backend:?}]: all nodes killed at {}/{} jobs",
                        p.terminal, enqueued
                    );
                }
            }
        }
        if Instant::now() >= next_kill {
            // Mostly SIGKILL; one time in four a graceful stop, so that give-backs (a lease
            // returned at shutdown) happen mid-run too. The first is always a SIGKILL, so even a
            // short run is sure to kill a node.
            if fleet.kills > 0 && rng.below(4) == 0 {
                fleet.stop_random(&mut rng);
            } else {
                fleet.kill_random(&mut rng);
            }
            fleet.spawn();
            next_kill = Instant::now() + rng.between(KILL_EVERY);
        }
        assert!(
            Instant::now() < hard_limit,
            "the run did not settle: {}/{} jobs terminal after {:?}; counts {:?}",
            p.terminal,
            enqueued,
            began.elapsed(),
            store.job_counts().await
        );
    }
    let run_took = began.elapsed();
    let stops = fleet.stops;
    fleet.stop_all(&mut problems);
    for n in &fleet.gone {
        retry("recording a node", || side.insert_node(n)).await;
    }
    let journals = read_journals(&fleet, &mut problems);
    fold_journals(&side, &journals, &mut problems).await;

    let jobs = all_jobs(&store, false).await;
    let archived = all_jobs(&store, true).await;
    let execs = retry("reading executions", || side.executions()).await;
    let nodes = retry("reading nodes", || side.nodes()).await;
    let facts: Vec<JobFacts> = jobs.iter().map(JobFacts::from).collect();
    let mut verdict = check(&facts, &execs, &nodes);
    verdict.violations.splice(0..0, problems);
    verdict
        .violations
        .extend(check_recovery(&server_restarts, &execs));
    if jobs.len() != enqueued {
        verdict.violations.push(format!(
            "{} jobs enqueued but {} in the live table",
            enqueued,
            jobs.len()
        ));
    }
    if !archived.is_empty() {
        verdict.violations.push(format!(
            "{} jobs in the archive; none was old enough to be archived",
            archived.len()
        ));
    }

    let ev = &journals.events;
    let count = |k: &str| ev.get(k).copied().unwrap_or(0);
    let v = &verdict.stats;
    println!(
        "crash test [{backend:?}]: jobs={} succeeded={} nodes={} kills={} stops={} restarts={} \
         reclaims={} lease_lost={} self_fenced={} sweeper_reclaims={} events_lagged={} \
         superseded_completions={} give_backs={} executions={} unrecorded_claims={} \
         ends_bounded_by_death={} overlaps={} late_ends={} duplicates={} violations={} \
         server_down={:.1}s run={:.1}s total={:.1}s seed={}",
        jobs.len(),
        v.succeeded,
        fleet.gone.len(),
        fleet.kills,
        stops,
        restarts,
        v.reclaims,
        count("lease_lost"),
        count("self_fenced"),
        count("reclaimed"),
        count("lagged"),
        v.superseded_completions,
        v.give_backs,
        v.executions,
        v.unrecorded_claims,
        v.ends_bounded_by_death,
        v.overlaps,
        v.late_ends,
        v.duplicates,
        verdict.violations.len(),
        server_down.as_secs_f64(),
        run_took.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        s.seed,
    );
    if !verdict.violations.is_empty() {
        let mut msg = format!(
            "{} violation(s) on {backend:?} (seed {}; logs and journals kept in {}):\n",
            verdict.violations.len(),
            s.seed,
            dir.path().display()
        );
        for line in verdict.violations.iter().take(40) {
            let _ = writeln!(msg, "  - {line}");
        }
        drop(fleet);
        drop(guard);
        panic!("{msg}");
    }
    assert!(restarts >= 1, "the run ended before the restart happened");
    assert!(fleet.kills >= 1, "the run ended before any node was killed");
}

// ---------------------------------------------------------------------------------------------
// Journals

/// Everything the nodes journaled.
#[derive(Debug, Default)]
struct Journals {
    /// `(job, attempt, node)` → handler entry.
    starts: HashMap<(i64, i32, String), i64>,
    /// `(job, attempt, node)` → (end, returned).
    ends: HashMap<(i64, i32, String), (i64, bool)>,
    /// Event counts by kind.
    events: BTreeMap<String, i64>,
}

fn read_journals(fleet: &Fleet, problems: &mut Vec<String>) -> Journals {
    let mut j = Journals::default();
    for n in &fleet.gone {
        let path = fleet.journal(&n.node);
        let Ok(file) = std::fs::File::open(&path) else {
            problems.push(format!("node {} left no journal", n.node));
            continue;
        };
        let lines: Vec<String> = std::io::BufReader::new(file)
            .lines()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut exited = false;
        for (i, text) in lines.iter().enumerate() {
            let line = match text.parse::<JournalLine>() {
                Ok(l) => l,
                // A node killed in the middle of a write may leave half a last line.
                Err(_) if n.how == "killed" && i + 1 == lines.len() => continue,
                Err(e) => {
                    problems.push(format!("journal of {}: {e}", n.node));
                    continue;
                }
            };
            match line {
                JournalLine::Start {
                    job_id,
                    attempt,
                    started_at_us,
                } => {
                    j.starts
                        .insert((job_id, attempt, n.node.clone()), started_at_us);
                }
                JournalLine::End {
                    job_id,
                    attempt,
                    ended_at_us,
                    returned,
                } => {
                    j.ends
                        .insert((job_id, attempt, n.node.clone()), (ended_at_us, returned));
                }
                JournalLine::Event { what, n: count } => {
                    *j.events.entry(what.clone()).or_default() +=
                        if what == "lagged" { count } else { 1 };
                }
                JournalLine::Exit { .. } => exited = true,
            }
        }
        if n.how == "stopped" && !exited {
            problems.push(format!(
                "node {} stopped without journaling its exit",
                n.node
            ));
        }
    }
    j
}

/// Writes into `crash_executions` what only the journals know: executions whose start row
/// never reached the database, and ends of executions that were stopped from outside or
/// could not write while the database was down.
async fn fold_journals(side: &SideDb, j: &Journals, problems: &mut Vec<String>) {
    let rows: HashMap<(i64, i32, String), Execution> =
        retry("reading executions", || side.executions())
            .await
            .into_iter()
            .map(|e| ((e.job_id, e.attempt, e.node.clone()), e))
            .collect();
    for (key, started) in &j.starts {
        match rows.get(key) {
            None => {
                retry("folding a start", || {
                    side.record_start(key.0, key.1, &key.2, *started)
                })
                .await;
            }
            Some(e) if e.started_at_us != *started => problems.push(format!(
                "job {} attempt {} on {}: started at {} in the table but {} in the journal",
                key.0, key.1, key.2, e.started_at_us, started
            )),
            Some(_) => {}
        }
    }
    for (key, (ended, returned)) in &j.ends {
        if !j.starts.contains_key(key) {
            problems.push(format!(
                "job {} attempt {} on {}: journaled an end but no start",
                key.0, key.1, key.2
            ));
            continue;
        }
        let row = rows.get(key);
        if *returned && row.is_none_or(|e| e.completed != 1) {
            problems.push(format!(
                "job {} attempt {} on {}: the handler returned without its completion recorded",
                key.0, key.1, key.2
            ));
        }
        if row.is_none_or(|e| e.ended_at_us.is_none()) {
            retry("folding an end", || {
                side.fill_end(key.0, key.1, &key.2, *ended)
            })
            .await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checks

/// Counts the checks produce.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Stats {
    succeeded: usize,
    executions: usize,
    /// Failed attempts, all reclaims of an expired lease (`lease_expired`).
    reclaims: usize,
    /// Claims given back at graceful shutdown (attempt not counted).
    give_backs: usize,
    /// Claims that never reached a handler start (the node died or never heard of the
    /// claim): claims minus recorded executions.
    unrecorded_claims: usize,
    /// Executions that did their work but were not the one whose result counts.
    superseded_completions: usize,
    /// Executions without a recorded end, bounded by their process's death instead.
    ends_bounded_by_death: usize,
    /// Pairs of executions of one job that overlapped in time.
    overlaps: usize,
    /// Executions still running after their attempt was reclaimed or the job finished.
    late_ends: usize,
    /// Jobs with any overlap.
    duplicates: usize,
}

/// What the checks found.
#[derive(Debug, Default)]
struct Verdict {
    violations: Vec<String>,
    stats: Stats,
}

fn us(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_micros()
}

/// What the checks read of a job row.
#[derive(Debug, Clone)]
struct JobFacts {
    id: JobId,
    state: JobState,
    attempts: u32,
    version: i64,
    errors: Vec<JobFailure>,
    last_error: Option<JobFailure>,
    result: Option<serde_json::Value>,
    lease_held: bool,
    finished_at_us: Option<i64>,
}

impl From<&Job> for JobFacts {
    fn from(j: &Job) -> JobFacts {
        JobFacts {
            id: j.id,
            state: j.state,
            attempts: j.attempts,
            version: j.version,
            errors: j.errors.clone(),
            last_error: j.last_error.clone(),
            result: j.result.clone(),
            lease_held: j.lease.is_some(),
            finished_at_us: j.finished_at.map(us),
        }
    }
}

/// Checks every job against the executions recorded for it. Nothing here trusts what a node
/// said about itself except through the tables; each rule names the invariant it proves.
///
/// Accounting, from the job row alone: every claim increments `version` and so does every
/// end of a claim (finalization, reclaim, give-back), and enqueue sets it to 1, so a terminal
/// job was claimed `C = (version − 1) / 2` times. `attempts` counts claims too, except that a
/// give-back at graceful shutdown returns its attempt (the next claim reuses the number); so
/// `C − attempts` claims were given back.
///
/// Why executions can be fewer than attempts, and how strict the check can be: a claim is
/// one committed statement, and the handler's start is recorded later — after the node got
/// the answer and, with prefetch, after the job waited for a free worker. A node killed,
/// fenced or shut down in between, or one that never got the claim's answer because the
/// server went down mid-reply, leaves a claim with no execution. Such a claim ends either in
/// a reclaim of its expired lease (attempt counted, one `lease_expired` error) or in a
/// give-back at shutdown (attempt returned, no error). So `attempts == executions` is false
/// for honest runs, and `attempts >= executions` alone is too weak (it would accept an
/// execution under a claim that was never made). The exact rule: the final attempt has an
/// execution, and it wrote the result; every earlier attempt ended in exactly one reclaim,
/// recorded once and in order in `errors`; no execution has an attempt number above
/// `attempts`; there are no more executions than claims; and executions sharing an attempt
/// number are explained by give-backs (at most one extra per give-back).
fn check(jobs: &[JobFacts], execs: &[Execution], nodes: &[NodeRow]) -> Verdict {
    let mut v = Verdict::default();
    let gone: HashMap<&str, i64> = nodes
        .iter()
        .map(|n| (n.node.as_str(), n.gone_at_us))
        .collect();
    let mut by_job: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        by_job.entry(e.job_id).or_default().push(e);
    }
    v.stats.executions = execs.len();
    let known: std::collections::HashSet<i64> = jobs.iter().map(|j| j.id.0).collect();
    for id in by_job.keys().filter(|id| !known.contains(id)) {
        v.violations.push(format!(
            "executions recorded for job {id}, which does not exist"
        ));
    }
    for job in jobs {
        let mut list = by_job.remove(&job.id.0).unwrap_or_default();
        list.sort_by_key(|e| (e.started_at_us, e.node.clone()));
        check_job(job, &list, &gone, &mut v);
    }
    v
}

fn check_job(job: &JobFacts, list: &[&Execution], gone: &HashMap<&str, i64>, v: &mut Verdict) {
    let id = job.id;
    let bad = &mut v.violations;
    // Invariant 2: exactly one terminal state, and here that must be success — a handler
    // that never fails, with 100 attempts allowed, has no other honest outcome.
    if job.state != JobState::Succeeded {
        bad.push(format!(
            "job {id} is {} after the run (attempts {}, last error {:?})",
            job.state, job.attempts, job.last_error
        ));
        return;
    }
    v.stats.succeeded += 1;
    if job.lease_held || job.finished_at_us.is_none() || job.last_error.is_some() {
        bad.push(format!(
            "job {id} succeeded but lease held {}, finished_at {:?}, last_error {:?}",
            job.lease_held, job.finished_at_us, job.last_error
        ));
    }
    let a = i64::from(job.attempts);
    if job.version < 1 || (job.version - 1) % 2 != 0 || (job.version - 1) / 2 < a || a < 1 {
        bad.push(format!(
            "job {id}: version {} does not pair every claim with one end for {a} attempts",
            job.version
        ));
        return;
    }
    let claims = usize::try_from((job.version - 1) / 2).unwrap();
    let give_backs = claims - usize::try_from(a).unwrap();
    v.stats.give_backs += give_backs;

    // Invariant 3 and invariant 1's "no stale write applied": every attempt before the last
    // ended in exactly one reclaim of its expired lease, recorded once, in order. A zombie's
    // refused finalization would show up here as a second entry or another code.
    if job.errors.len() != usize::try_from(a - 1).unwrap() {
        bad.push(format!(
            "job {id}: {} errors recorded for {a} attempts: {:?}",
            job.errors.len(),
            job.errors
        ));
    }
    for (i, e) in job.errors.iter().enumerate() {
        if i64::from(e.attempt) != i64::try_from(i).unwrap() + 1
            || e.code != "lease_expired"
            || e.at.is_none()
        {
            bad.push(format!(
                "job {id}: error #{} is attempt {} code {} ({}); expected attempt {} lease_expired",
                i + 1,
                e.attempt,
                e.code,
                e.message,
                i + 1
            ));
        }
    }
    v.stats.reclaims += job.errors.len();

    // Invariant 1: the outcome was written by the holder of the last lease — the last
    // execution of the final attempt, which completed, and whose node and attempt the
    // result names.
    let result_node = job.result.as_ref().and_then(|r| r["node"].as_str());
    let result_attempt = job.result.as_ref().and_then(|r| r["attempt"].as_i64());
    if result_attempt != Some(a) {
        bad.push(format!(
            "job {id}: result {:?} is not from its final attempt {a}",
            job.result
        ));
    }
    let last = list.iter().rev().find(|e| i64::from(e.attempt) == a);
    match last {
        None => bad.push(format!("job {id}: no execution of its final attempt {a}")),
        Some(e) => {
            if e.completed != 1 || Some(e.node.as_str()) != result_node {
                bad.push(format!(
                    "job {id}: result {:?} but the last execution of attempt {a} is {e:?}",
                    job.result
                ));
            }
            if let Some(later) = list.iter().find(|x| x.started_at_us > e.started_at_us) {
                bad.push(format!(
                    "job {id}: execution {later:?} started after the final one {e:?}"
                ));
            }
        }
    }
    v.stats.superseded_completions += list
        .iter()
        .filter(|e| e.completed == 1 && last.is_none_or(|l| !std::ptr::eq(**e, *l)))
        .count();

    // Claims and executions: see `check`.
    if let Some(e) = list
        .iter()
        .find(|e| e.attempt < 1 || i64::from(e.attempt) > a)
    {
        bad.push(format!(
            "job {id}: execution {e:?} has an attempt outside 1..={a}"
        ));
    }
    if list.len() > claims {
        bad.push(format!(
            "job {id}: {} executions but only {claims} claims",
            list.len()
        ));
    }
    let mut numbers: Vec<i32> = list.iter().map(|e| e.attempt).collect();
    numbers.sort_unstable();
    numbers.dedup();
    if list.len() - numbers.len() > give_backs {
        bad.push(format!(
            "job {id}: {} executions share an attempt number but only {give_backs} claims \
             were given back",
            list.len() - numbers.len()
        ));
    }
    v.stats.unrecorded_claims += claims.saturating_sub(list.len());

    // When each execution surely stopped. A handler that finished records its end in the
    // table before it returns. One stopped from outside (lease lost, self-fenced, given back
    // at shutdown) cannot: its future is dropped at its next await. So the node journals,
    // synchronously in the future's `drop`, the moment the handler surely stopped doing
    // anything, and the fold copied those ends into the table. An execution with no end at
    // all therefore had its future still alive when its process died: it ran until the
    // process was gone, and the node's `gone_at` (taken after `wait` reaped it) is a sound
    // upper bound — neither optimistic (it could hide an overlap) nor needlessly late.
    //
    // This is stricter than "a killed node's execution counts as overlapping only if the next
    // attempt started before its lease could have expired": under that rule a node that kept
    // running past its lease without noticing (a failed fence) would pass. Here, if the next
    // attempt started before the killed node was gone, the old handler was provably still
    // alive then, and that is reported. For a correct runtime it cannot happen: the next
    // claim needs the sweeper to see the lease expired, the lease outlives the last renewal
    // by 2 s, and a live node fences its handler before that.
    let mut ends = Vec::with_capacity(list.len());
    for e in list {
        let end = match (e.ended_at_us, gone.get(e.node.as_str())) {
            (Some(t), _) => Some(t),
            (None, Some(t)) => {
                v.stats.ends_bounded_by_death += 1;
                Some(*t)
            }
            (None, None) => {
                bad.push(format!(
                    "job {id}: execution {e:?} of a node that never ended"
                ));
                None
            }
        };
        ends.push(end);
    }

    // Invariant 1, in time: an execution of an attempt that was reclaimed stopped before the
    // reclaim (self-fencing stops it before its lease can expire, and a reclaim needs an
    // expired lease), and none ran past the job's finish. Database stamps are compared
    // with a millisecond of slack (SQLite's resolution).
    let finished = job.finished_at_us.unwrap_or(i64::MAX);
    for (e, end) in list.iter().zip(&ends) {
        let Some(end) = *end else { continue };
        let idx = usize::try_from(e.attempt - 1).unwrap_or(usize::MAX);
        let (limit, what) = match job.errors.get(idx) {
            Some(err) if i64::from(e.attempt) < a => (
                err.at.map(us).unwrap_or(i64::MAX),
                "its attempt was reclaimed",
            ),
            _ => (finished, "the job finished"),
        };
        if end > limit + DB_CLOCK_SLACK_US {
            v.stats.late_ends += 1;
            bad.push(format!(
                "job {id}: execution {e:?} ran until {end}, {} µs after {what} at {limit}",
                end - limit
            ));
        }
    }

    // Invariant 1, directly: no two executions of the job overlapped. Sorted by start, each
    // must start after every earlier one ended.
    let mut running_until: Option<(i64, &Execution)> = None;
    let mut overlapped = false;
    for (e, end) in list.iter().zip(&ends) {
        if let Some((until, prev)) = running_until {
            if e.started_at_us < until {
                v.stats.overlaps += 1;
                overlapped = true;
                bad.push(format!(
                    "job {id}: {e:?} started {} µs before {prev:?} ended (at {until})",
                    until - e.started_at_us
                ));
            }
        }
        let end = end.unwrap_or(i64::MAX);
        if running_until.is_none_or(|(u, _)| end > u) {
            running_until = Some((end, e));
        }
    }
    if overlapped {
        v.stats.duplicates += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// The checks, checked: each rule catches the fault it is there for.

#[cfg(test)]
mod checker {
    use super::*;
    use chrono::TimeZone;

    const T0: i64 = 1_900_000_000_000_000;

    fn at(t: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc.timestamp_micros(t).unwrap()
    }

    /// A job that succeeded on `attempts` attempts, each earlier one reclaimed at
    /// `reclaims[i]`, finished at `finished`, written by `node`.
    fn job(attempts: u32, reclaims: &[i64], finished: i64, node: &str) -> JobFacts {
        JobFacts {
            id: JobId(1),
            state: JobState::Succeeded,
            attempts,
            version: 1 + 2 * i64::from(attempts),
            errors: reclaims
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let attempt = u32::try_from(i).unwrap() + 1;
                    JobFailure::new("lease_expired", "the lease expired", attempt).at(at(*t))
                })
                .collect(),
            last_error: None,
            result: Some(json!({"node": node, "attempt": attempts})),
            lease_held: false,
            finished_at_us: Some(finished),
        }
    }

    fn exec(attempt: i32, node: &str, start: i64, end: Option<i64>, completed: bool) -> Execution {
        Execution {
            job_id: 1,
            attempt,
            node: node.into(),
            started_at_us: start,
            ended_at_us: end,
            completed: i16::from(completed),
        }
    }

    fn node(name: &str, gone: i64, how: &str) -> NodeRow {
        NodeRow {
            node: name.into(),
            pid: 1,
            spawned_at_us: T0 - 10_000_000,
            gone_at_us: gone,
            how: how.into(),
        }
    }

    fn nodes() -> Vec<NodeRow> {
        vec![
            node("a", T0 + 1_000_000, "killed"),
            node("b", T0 + 9_000_000, "stopped"),
        ]
    }

    #[test]
    fn a_clean_history_passes() {
        // a runs attempt 1 and dies at +1 s without recording an end; the sweeper reclaims
        // at +3 s; b runs attempt 2 and finishes at +3.1 s.
        let j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
        let e = [
            exec(1, "a", T0, None, false),
            exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!((v.stats.reclaims, v.stats.ends_bounded_by_death), (1, 1));
    }

    #[test]
    fn overlapping_executions_are_caught() {
        let j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
        // a's execution has no end and a died at +1 s, but b started at +0.5 s.
        let e = [
            exec(1, "a", T0, None, false),
            exec(2, "b", T0 + 500_000, Some(T0 + 600_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!((v.stats.overlaps, v.stats.duplicates), (1, 1));
    }

    #[test]
    fn an_execution_running_past_its_reclaim_is_caught() {
        let j = job(2, &[T0 + 3_000_000], T0 + 8_100_000, "b");
        let e = [
            exec(1, "b", T0, Some(T0 + 4_000_000), true),
            exec(2, "b", T0 + 5_000_000, Some(T0 + 5_050_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!(v.stats.late_ends, 1, "{:?}", v.violations);
    }

    #[test]
    fn a_result_from_an_older_lease_is_caught() {
        let mut j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "a");
        j.result = Some(json!({"node": "a", "attempt": 1}));
        let e = [
            exec(1, "a", T0, Some(T0 + 50_000), true),
            exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
    }

    #[test]
    fn a_stale_failure_write_is_caught() {
        let mut j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
        j.errors
            .push(JobFailure::new("error", "zombie retry", 1).at(at(T0 + 3_050_000)));
        let e = [
            exec(1, "a", T0, None, false),
            exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert!(v.violations.len() >= 2, "{:?}", v.violations);
    }

    #[test]
    fn lost_stuck_and_unpaired_jobs_are_caught() {
        let mut stuck = job(1, &[], T0 + 100_000, "b");
        stuck.state = JobState::Running;
        let mut unpaired = job(1, &[], T0 + 100_000, "b");
        unpaired.id = JobId(2);
        unpaired.version = 2;
        let e = [exec(1, "b", T0, Some(T0 + 50_000), true)];
        let v = check(&[stuck, unpaired], &e, &nodes());
        assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
        assert_eq!(v.stats.succeeded, 1);
    }

    #[test]
    fn executions_beyond_claims_are_caught() {
        // One claim, two executions of attempt 1 on different nodes.
        let j = job(1, &[], T0 + 3_100_000, "b");
        let e = [
            exec(1, "a", T0, Some(T0 + 10_000), false),
            exec(1, "b", T0 + 20_000, Some(T0 + 50_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
    }

    #[test]
    fn a_give_back_explains_a_repeated_attempt_number() {
        // a was stopped gracefully: its claim was given back (version + 2, attempts kept).
        let mut j = job(1, &[], T0 + 3_100_000, "b");
        j.version += 2;
        let e = [
            exec(1, "a", T0, Some(T0 + 10_000), false),
            exec(1, "b", T0 + 20_000, Some(T0 + 50_000), true),
        ];
        let v = check(&[j], &e, &nodes());
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(v.stats.give_backs, 1);
    }

    #[test]
    fn a_node_that_never_recovers_from_a_restart_is_caught() {
        let restart = Restart {
            up_at_us: T0,
            survivors: vec!["a".into(), "b".into()],
        };
        let after = |node: &str, i: i64| Execution {
            job_id: i,
            attempt: 1,
            node: node.into(),
            started_at_us: T0 + 1 + i,
            ended_at_us: Some(T0 + 100 + i),
            completed: 1,
        };
        let mut e: Vec<Execution> = (0..40).map(|i| after("b", i)).collect();
        let bad = check_recovery(std::slice::from_ref(&restart), &e);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("node a"), "{bad:?}");
        e.push(after("a", 40));
        assert_eq!(check_recovery(&[restart], &e), Vec::<String>::new());
    }

    #[test]
    fn journal_lines_round_trip() {
        for l in [
            JournalLine::Start {
                job_id: 7,
                attempt: 2,
                started_at_us: T0,
            },
            JournalLine::End {
                job_id: 7,
                attempt: 2,
                ended_at_us: T0 + 5,
                returned: false,
            },
            JournalLine::Event {
                what: "lease_lost".into(),
                n: 7,
            },
            JournalLine::Exit {
                at_us: T0,
                finished: 3,
                released: 1,
            },
        ] {
            assert_eq!(l.to_string().parse::<JournalLine>(), Ok(l));
        }
        assert!("end\t7\t2".parse::<JournalLine>().is_err());
    }
}

// ---------------------------------------------------------------------------------------------
// Database outage: the server stops for 30 s under a running scheduler.

#[test]
#[ignore = "stops the PostgreSQL server for 30 s; run with .ci/crash"]
fn outage_postgres() {
    outage(Backend::Postgres);
}

#[test]
#[ignore = "stops the MariaDB/MySQL server for 30 s; run with .ci/crash"]
fn outage_mysql() {
    outage(Backend::Mysql);
}

/// CPU time this process has used (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// While the server is down for 30 s: the running job fences itself before its lease could
/// expire, store errors are logged a bounded number of times (not per attempt), the process
/// does not spin, and every actor still answers. Afterwards work resumes by itself, and the
/// fenced job is reclaimed and runs again.
fn outage(backend: Backend) {
    const DOWN: Duration = Duration::from_secs(30);
    let server = Server::of(backend).unwrap();
    let _guard = ServerGuard(Server::of(backend).unwrap());
    actix::System::new().block_on(async move {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let lease = Duration::from_secs(6);
        let handle = Scheduler::builder(store)
            .config(
                SchedulerConfig::default()
                    .lease(lease)
                    .renew_every(Duration::from_secs(2))
                    .sweep_every(Duration::from_secs(1))
                    .deadline_check_every(Duration::from_millis(100))
                    .retry(RetryPolicy::fixed(Duration::from_millis(200))),
            )
            .queue("default", QueueConfig::default().poll_interval(Duration::from_millis(200)))
            .handler(
                "long",
                handler_fn(|_: serde_json::Value, ctx: JobContext| async move {
                    if ctx.attempt == 1 {
                        ctx.cancelled().await; // runs until stopped
                    }
                    JobOutcome::success(ctx.attempt)
                }),
            )
            .handler("quick", handler_fn(|_: serde_json::Value, _ctx| async { Ok(JobOutcome::done()) }))
            .start()
            .unwrap();
        let client = handle.client();
        let mut events = handle.events();
        let long = client.enqueue(NewJob::new("long", json!({}))).await.unwrap().id;
        loop {
            if let Ok(Event::Started { id, .. }) = events.recv().await {
                if id == long {
                    break;
                }
            }
        }
        // Stop the server on another thread; watch the node meanwhile.
        let cpu0 = cpu_time();
        let stopped_at = Instant::now();
        let outage = std::thread::spawn(move || server.restart(DOWN));
        let mut fenced_after = None;
        let mut store_errors = 0;
        while !outage.is_finished() {
            match tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
                Ok(Ok(Event::SelfFenced { id, .. })) if id == long => fenced_after = Some(stopped_at.elapsed()),
                Ok(Ok(Event::StoreUnavailable { .. })) => store_errors += 1,
                _ => {}
            }
        }
        let down = outage.join().unwrap().unwrap();
        let cpu = cpu_time() - cpu0;
        eprintln!(
            "outage {backend:?}: down {down:?}, fenced after {fenced_after:?}, {store_errors} store errors logged, \
             {cpu:?} CPU"
        );
        let fenced_after = fenced_after.expect("the running job never fenced itself");
        assert!(fenced_after < lease, "fenced after {fenced_after:?}: not before its {lease:?} lease could expire");
        // Each actor logs at most once per interval (30–60 s): a handful, not one per retry.
        assert!(store_errors <= 12, "{store_errors} store errors logged in {down:?}: logged per attempt");
        assert!(cpu < DOWN / 5, "{cpu:?} of CPU in a {down:?} outage: a busy loop");
        // No actor died: each still answers.
        let status = handle.fetcher("default").unwrap().send(jobvisor::scheduler::GetFetcherStatus).await.unwrap();
        assert!(status.claiming_enabled);
        handle.lease_manager().send(jobvisor::scheduler::GetLeaseManagerStatus).await.unwrap();
        // Work resumes by itself; the fenced job is reclaimed and runs again.
        let ids: Vec<JobId> = client
            .enqueue_many((0..20).map(|i| NewJob::new("quick", json!(i))).collect())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        for id in ids {
            let job = client.wait(id, Duration::from_secs(60)).await.unwrap();
            assert_eq!(job.state, JobState::Succeeded);
        }
        let job = client.wait(long, Duration::from_secs(60)).await.unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Succeeded, 2));
        assert_eq!(job.errors[0].code, "lease_expired");
        handle.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Soak: many jobs through three nodes; memory must stay flat.

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
    let dir = RunDir(Some(tempfile::tempdir().unwrap()));
    actix::System::new().block_on(async move {
        let db = TestDb::create(backend).await;
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
