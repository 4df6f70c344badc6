//! The multi-process crash test: DESIGN §6 invariants 1, 2, 3, 6 and (for schedules) 10 with real processes,
//! real kills and a real database restart, on PostgreSQL, MariaDB/MySQL and SQLite (several
//! processes sharing one file).
//!
//! For each backend it enqueues N jobs and starts three node processes
//! (`examples/crash_node/main.rs`). Every 0.5–2.5 s it takes a random node down — SIGKILL three
//! times in four, a graceful stop (leases of running jobs given back) otherwise — and starts
//! a replacement. Every few seconds it also freezes a node (SIGSTOP) for 3–5 s, longer than
//! the 2 s lease, and then continues it (SIGCONT): the frozen node's leases expire and are
//! taken while its handlers and prefetched jobs are paused, and on waking it must start none
//! of the jobs it lost. Once 40 % of the jobs are done it stops the database server, keeps it
//! down for 3 s (longer than the lease, so every lease expires meanwhile and every running
//! handler must fence itself) and starts it again; SQLite has no server, so all nodes are
//! killed at once instead.
//!
//! Besides the N quick jobs (queue `crash`, 8 workers per node), waves of a prefetch mix go
//! to a second queue (`mix`, 2 workers per node, prefetch up to 1,000): long jobs (2.5–3.5 s)
//! ahead of short jobs with short timeouts and few attempts, so short jobs wait in a node's
//! prefetch for longer than their timeout. A claimed job that never started must neither be
//! timed out nor lose its attempt for it.
//!
//! With each wave also go dependent jobs (`deps.rs`: a chain, a fan-in batch and a join,
//! each completing in its own transaction), two ordered sequences of eight members (a
//! fresh key each, one member failing once so that its retry holds the sequence) and six
//! jobs with a start-by deadline, some comfortable, some 300 ms away ahead of or behind the
//! quick jobs' backlog so that some expire (`sequences.rs`): members must run one at a time,
//! in order, each after the one before succeeded, and all succeed; no deadline job may start
//! at or after its deadline, and each ends succeeded or cancelled `expired`.
//!
//! The nodes also declare a periodic schedule (every second, every missed fire run) and a
//! reconciler (every 2 s, one job per row of the side table `crash_wanted`), under a 3 s
//! leader lease, both enqueueing into a queue no node works. Every half second the driver
//! adds a business row without its job — and every fifth time deletes an earlier row's job
//! by hand instead. Through the kills, freezes and the restart, the leader changes many
//! times; at the end every fire has exactly one job, and every row has its job, created at
//! most 16 s (two reconciler intervals, a leader takeover, the database down, slack) after it
//! went missing.
//!
//! When every job is terminal it stops the nodes gracefully and checks, from the tables and
//! the nodes' journals, that no job was lost, ran twice at once, or had its outcome written
//! by anyone but the holder of its last lease; that no job failed for a timeout or a lost
//! lease without having started, that every timeout came after the job really ran for its
//! timeout, and that no handler started after its lease had been taken; and that every node
//! that ran through the restart recovered by itself. See [`check`] for every rule and why it
//! is as strict as it is.
//!
//! `crash_galera` runs the same on a private three-member MariaDB Galera cluster, each of
//! the three nodes working through a member of its own (its URL names every member, its own
//! first, so it fails over), with Galera's faults in place of the restart: a member
//! SIGKILLed mid-drain and restarted (rejoining by IST), then a member cut off from the
//! others for longer than the lease and let back; it prints the time back to work after each
//! fault, jobs/s and certification conflicts per 1,000 jobs. `galera_topology` (not in
//! `.ci/crash`) drains without faults through one member and spread over three, and
//! compares them. See `galera.rs`.
//!
//! Each run starts a private database server of its own (`tests/harness/server.rs`: own
//! port, own data directory, stopped and removed afterwards, even when the test panics) and
//! restarts that one; the machine's shared servers are never touched. The tests are
//! `#[ignore]`d all the same — they take a minute or two each, need root (the private server
//! runs as its own user) and load the machine — and run one at a time, as `.ci/crash` does:
//!
//! ```sh
//! cargo test --all-features --test crash -- --ignored --test-threads=1
//! ```
//!
//! Settings (environment; a value that does not parse fails the test):
//! * `JOBVISOR_CRASH_JOBS` — jobs per backend (default 5,000, on Galera 3,000, at least 500;
//!   jobs per drain of `galera_topology`, default 5,000).
//! * `JOBVISOR_TOPOLOGY_RUNS` — drains per topology of `galera_topology` (default 3).
//! * `JOBVISOR_CRASH_SECONDS` — long mode: keep jobs coming for this many seconds, restart
//!   the server every 60 s (at least once), then drain and check.
//! * `JOBVISOR_CRASH_SEED` — seed of the kill schedule (printed by every run).
//! * `JOBVISOR_CRASH_KEEP` — set to keep the directory of node logs and journals after a
//!   passing run too (a failing run always keeps it).
//! * `JOBVISOR_CRASH_NODE_BIN` — a prebuilt `crash_node`; by default the test builds it with
//!   `cargo build --all-features --example crash_node` into the target directory the test
//!   binary itself runs from (examples have no `CARGO_BIN_EXE_*`), so the node always matches
//!   the library under test.
//!
//! Node processes are killed when the test ends, and each node also stops by itself when its
//! standard input (a pipe from the test) closes; then the private server is stopped. On
//! failure the directory with every node's log and journal is kept and printed, and so is the
//! private server's directory (with its log) until the next run; each violation is printed
//! with what explains it (see `Evidence`).

#![allow(clippy::unwrap_used)]

#[path = "../harness/mod.rs"]
mod harness;

mod check;
#[cfg(test)]
mod checker;
mod deps;
mod fleet;
mod galera;
mod periodic;
mod report;
mod sequences;

use check::*;
use deps::*;
use fleet::*;
use galera::*;
use periodic::*;
use report::*;
use sequences::*;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::testing::{EnqueueParams, StoreEngine as _};
use jobvisor::{Backend, Job, JobFailure, JobId, JobState, NewJob, Store, StoreOptions};
use serde_json::json;

use harness::journal::{self, at_us, owner, same_claim, taken_by_sweeper, JobFacts, NodeJournal};
use harness::ledger::{self, LedgerStats};
use harness::server::TestDatabase;
use harness::side::{now_us, Execution, FreezeRow, JournalLine, NodeRow, SideDb};
use harness::{
    all_jobs, block_on, enqueue, env_number, node_binary, progress, retry, run_cmd, NodeProc,
    Progress, RunDir, CRASHY, QUEUE,
};

/// Nodes running at any time.
const NODES: usize = 3;
/// Jobs per backend unless `JOBVISOR_CRASH_JOBS` says otherwise.
const DEFAULT_JOBS: usize = 5_000;
/// The queue of the prefetch mix: few workers per node and a deep prefetch, so that jobs
/// wait in a node's prefetch behind long ones.
const MIX_QUEUE: &str = "mix";
/// Workers per node on [`MIX_QUEUE`].
const MIX_CONCURRENCY: u32 = 2;
/// The most jobs a node keeps prefetched on [`MIX_QUEUE`] (the library's default).
const MIX_PREFETCH: u32 = 1_000;
/// Waves of the mix in a normal run, one every [`MIX_EVERY`] from the start (long mode: as
/// long as jobs keep coming).
const MIX_WAVES: usize = 8;
/// Time between two waves of the mix.
const MIX_EVERY: Duration = Duration::from_secs(5);

/// One kind of the prefetch mix: how many per wave and how they are enqueued.
#[derive(Debug, Clone, Copy)]
struct MixKind {
    kind: &'static str,
    per_wave: usize,
    /// Smaller is claimed first.
    priority: i16,
    /// The handler works this long, uniformly at random in between.
    work: (Duration, Duration),
    timeout: Duration,
    max_attempts: u32,
}

/// The mix: long jobs ahead of short ones (claimed first, so a short one claimed with them
/// waits behind one in the prefetch: 2.5 s and more, while its timeout plus the lease is
/// 2.3 s), short ones with a short timeout and two attempts, and "tight" ones that sometimes
/// really run past their timeout (so the timeout rules see honest timeouts too). A wave asks
/// about 15 worker-seconds of the mix queue's 30 per wave interval (2 workers on 3 nodes),
/// so that retries after kills and freezes do not pile up.
const MIX: [MixKind; 3] = [
    MixKind {
        kind: "long",
        per_wave: 2,
        priority: 1,
        work: (Duration::from_millis(2_500), Duration::from_millis(3_500)),
        timeout: Duration::from_secs(60),
        max_attempts: 20,
    },
    MixKind {
        kind: "short",
        per_wave: 10,
        priority: 2,
        work: (Duration::ZERO, Duration::from_millis(20)),
        timeout: Duration::from_millis(300),
        max_attempts: 2,
    },
    MixKind {
        kind: "tight",
        per_wave: 2,
        priority: 2,
        work: (Duration::from_millis(400), Duration::from_millis(1_400)),
        timeout: Duration::from_secs(1),
        max_attempts: 3,
    },
];
/// A kill happens this long after the previous one, uniformly at random in between.
const KILL_EVERY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_millis(2_500));
/// The first kill happens this long after the nodes start.
const FIRST_KILL: (Duration, Duration) = (Duration::from_millis(200), Duration::from_millis(1_000));
/// The first freeze happens this long after the nodes start.
const FIRST_FREEZE: (Duration, Duration) =
    (Duration::from_millis(1_000), Duration::from_millis(3_000));
/// A freeze happens this long after the previous node was continued. One node at most is
/// frozen at a time.
const FREEZE_EVERY: (Duration, Duration) =
    (Duration::from_millis(1_000), Duration::from_millis(4_000));
/// A node stays frozen this long: longer than the 2 s lease, so its leases expire and are
/// taken meanwhile.
const FREEZE_FOR: (Duration, Duration) =
    (Duration::from_millis(3_000), Duration::from_millis(5_000));
/// A node must be seen stopped this soon after SIGSTOP was sent (it usually takes well under
/// a millisecond, tens of milliseconds on a busy machine).
const STOP_TAKES_EFFECT_WITHIN: Duration = Duration::from_secs(10);
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
/// Comparisons between a node's clock and a time the database stamped allow this much:
/// SQLite's `unixepoch('subsec')` has millisecond resolution.
const DB_CLOCK_SLACK_US: i64 = 1_000;
/// A `timeout` must come at least the job's timeout after the attempt started, less this:
/// the runtime stamps the start and the sweeper compares a database deadline computed from
/// it, so only clock resolution and rounding separate them; 50 ms leaves room for both and
/// is still far below the shortest timeout here (300 ms).
const TIMEOUT_SLACK_US: i64 = 50_000;
/// A handler that was running when its node froze cannot be stopped while the node is
/// frozen: once continued, the node has this long to stop it (fence it) before its running
/// past its lease counts as a violation. Nothing can keep a paused process from running a
/// few more instructions when it wakes; what matters is that it stops at once and starts
/// nothing new (see [`check`]).
const PAUSE_TAIL_US: i64 = 1_000_000;

/// The queue of the schedule's and the reconciler's jobs (`crash_node`: no node works it).
const PERIODIC_QUEUE: &str = "periodic";
/// The nodes' periodic schedule fires this often (`crash-tick`, every missed fire run).
const SCHEDULE_EVERY: Duration = Duration::from_secs(1);
/// The nodes' reconciler runs this often on the leader (`crash-wanted`).
const RECONCILE_EVERY: Duration = Duration::from_secs(2);
/// The nodes' leader lease: a killed or frozen leader is replaced within 4/3 of it.
const LEADER_LEASE: Duration = Duration::from_secs(3);
/// A business row is added (its job left for the reconciler to create) this often, and every
/// fifth time an earlier row's job is deleted by hand instead.
const WANT_EVERY: Duration = Duration::from_millis(500);
/// How long a job may stay missing, or a fire unfired: two reconciler intervals (one to come
/// round, one pass) or one schedule tick, plus a leader takeover, plus the database being
/// down, plus slack for a loaded machine.
const MISSING_AT_MOST: Duration = Duration::from_secs(4 + 4 + 3 + 5);
/// A business row whose wait spans a database restart may also wait out the part of the
/// restart beyond the 3 s in [`MISSING_AT_MOST`] (restarts take 3–5 s here), plus this for
/// the pools to reconnect and a leader to be elected again on the restarted server.
const AFTER_RESTART: Duration = Duration::from_secs(3);

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

#[test]
#[ignore = "kills and cuts off members of a private Galera cluster; run with .ci/crash"]
fn crash_galera() {
    block_on(run(Target::Galera));
}

#[test]
#[ignore = "drains on a private Galera cluster, 6 times (several minutes); not in .ci/crash"]
fn galera_topology() {
    block_on(topology());
}

fn run_blocking(backend: Backend) {
    block_on(run(Target::Server(backend)));
}

/// What a run's database is: one server of a backend, or a three-member Galera cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Server(Backend),
    Galera,
}

/// Names the target in the report's lines: `Postgres`, `Mysql`, `Sqlite` or `Galera`.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Server(b) => write!(f, "{b:?}"),
            Target::Galera => f.write_str("Galera"),
        }
    }
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

fn settings(target: Target) -> Settings {
    let default = if target == Target::Galera {
        GALERA_DEFAULT_JOBS
    } else {
        DEFAULT_JOBS
    };
    let jobs = env_number("JOBVISOR_CRASH_JOBS").unwrap_or(default);
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
// The run

/// A server restart, for the recovery check.
#[derive(Debug, Clone)]
struct Restart {
    /// When the server was asked to stop.
    down_at_us: i64,
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

/// Enqueues one wave of the prefetch mix (see [`MIX`]), its work times drawn from `rng`;
/// answers how many jobs, or `None` if the database refused (it is restarting): try later.
async fn enqueue_wave(store: &Store, rng: &mut Rng, wave: usize) -> Option<usize> {
    let mut jobs = Vec::new();
    for m in MIX {
        for i in 0..m.per_wave {
            let work_ms = u64::try_from(rng.between(m.work).as_millis()).unwrap();
            let timeout_ms = u64::try_from(m.timeout.as_millis()).unwrap();
            let payload = json!({
                "wave": wave, "i": i, "work_ms": work_ms, "timeout_ms": timeout_ms,
            });
            jobs.push(
                NewJob::new(m.kind, payload)
                    .queue(MIX_QUEUE)
                    .priority(m.priority)
                    .max_attempts(m.max_attempts)
                    .timeout(m.timeout),
            );
        }
    }
    // One statement, so that the long jobs and the short ones behind them become due at once.
    store
        .job_enqueue_many(EnqueueParams::many(jobs))
        .await
        .ok()
        .map(|e| e.len())
}

/// A run in progress: the database, the node fleet, and what the driver did to them.
/// Fields drop in order: the nodes are killed before the private server is stopped.
struct Run {
    backend: Target,
    s: Settings,
    began: Instant,
    began_us: i64,
    fleet: Fleet,
    side: SideDb,
    store: Store,
    dir: RunDir,
    /// The private server (`None` on Galera).
    db: Option<TestDatabase>,
    /// The Galera cluster (`None` on one server).
    galera: Option<Galera>,
    /// Draws the kills and freezes.
    rng: Rng,
    /// Draws the mix's work times: a stream of its own, so that they do not shift with the
    /// number of kills and freezes.
    work_rng: Rng,
    /// Draws the dependent jobs' work times (a stream of its own too).
    dep_rng: Rng,
    /// The chains, batches and joins enqueued with the mix's waves.
    deps: Vec<DepJob>,
    /// Draws the sequences' and deadline jobs' work times and failing members (a stream of
    /// its own too).
    seq_rng: Rng,
    /// The sequence members and deadline jobs enqueued with the mix's waves.
    seqs: Vec<SeqJob>,
    enqueued: usize,
    nodes_started_us: i64,
    /// Business rows added for the reconciler.
    wanted: usize,
    mix_jobs: usize,
    /// Server restarts, or on Galera faults (a member killed, a member cut off).
    restarts: usize,
    server_down: Duration,
    /// Each restart; on Galera, each fault while the cluster could not commit (from the
    /// fault until the member was evicted or seen out of the primary component).
    server_restarts: Vec<Restart>,
    /// SQLite's stand-in for a restart: when every node was killed at once.
    all_killed_at: Vec<i64>,
    /// What went wrong outside the checks (a node that would not stop, a journal that does
    /// not parse).
    problems: Vec<String>,
}

/// What the run left behind, read once the nodes stopped.
struct Collected {
    run_took: Duration,
    /// From the nodes' start until every job was terminal.
    drain: Duration,
    stops: usize,
    journals: Journals,
    jobs: Vec<Job>,
    archived: Vec<Job>,
    fires: usize,
    reconciled: (usize, i64),
    periodic_problems: Vec<String>,
    execs: Vec<Execution>,
    nodes: Vec<NodeRow>,
    freezes: Vec<FreezeRow>,
    facts: Vec<JobFacts>,
    /// `crash_effects`: `(job_id, claim)`, one per committed completion in a transaction.
    effects: Vec<(i64, String)>,
    /// Every job's execution ledger (`Client::claims`).
    ledgers: HashMap<JobId, Vec<jobvisor::Claim>>,
    stop_lag_max_us: i64,
    starts_in_stop_lag: usize,
}

/// The whole test, phase by phase.
async fn run(backend: Target) {
    let mut run = start(backend).await;
    drive(&mut run).await;
    let c = collect(&mut run).await;
    let verdict = judge(&mut run, &c);
    report(run, &c, verdict);
}

/// Phase 1: the private server, the side tables, the jobs, and the three nodes.
async fn start(backend: Target) -> Run {
    let s = settings(backend);
    let bin = node_binary();
    let began = Instant::now();
    let began_us = now_us();
    // Declared before the nodes, so that it drops after them: nodes killed first, then the
    // private server stopped.
    let (db, mut galera, urls) = match backend {
        Target::Server(b) => {
            let db = TestDatabase::create(b, "crash");
            let url = db.url.clone();
            (Some(db), None, vec![url])
        }
        Target::Galera => {
            let g = Galera::start();
            let urls = g.node_urls(harness::server::DB_NAME);
            (None, Some(g), urls)
        }
    };
    let store = Store::connect_with(
        &urls[0],
        StoreOptions::default().pool_size(12).migrate(true),
    )
    .await
    .unwrap_or_else(|e| panic!("opening a store on {}: {e}", urls[0]));
    let side = SideDb::open(&urls[0], 4).unwrap();
    side.create_tables().await.unwrap();
    let dir = RunDir::new(
        "crash",
        tempfile::Builder::new()
            .prefix("jobvisor-crash-")
            .tempdir()
            .unwrap(),
    );
    let mut fleet = Fleet::new(bin, urls, dir.path());
    if galera.is_some() {
        fleet.env.push(("RUST_LOG".into(), RETRY_LOG_FILTER.into()));
    }
    let rng = Rng(s.seed);
    // The mix's work times come from a stream of their own, so that they do not shift with
    // the number of kills and freezes.
    let work_rng = Rng(s.seed ^ 0x6D69_7800);
    let dep_rng = Rng(s.seed ^ 0x6465_7073);
    let seq_rng = Rng(s.seed ^ 0x7365_7173);
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
    if let Some(g) = &mut galera {
        g.count_conflicts_from_now();
    }
    let nodes_started_us = now_us();
    for _ in 0..NODES {
        fleet.spawn();
    }
    Run {
        backend,
        s,
        began,
        began_us,
        fleet,
        side,
        store,
        dir,
        db,
        galera,
        rng,
        work_rng,
        dep_rng,
        deps: Vec::new(),
        seq_rng,
        seqs: Vec::new(),
        enqueued,
        nodes_started_us,
        wanted: 0,
        mix_jobs: 0,
        restarts: 0,
        server_down: Duration::ZERO,
        server_restarts: Vec::new(),
        all_killed_at: Vec::new(),
        problems: Vec::new(),
    }
}

/// Phase 2: kills, stops, freezes, the server restart, the mix's waves and the business
/// rows, until every job is terminal.
async fn drive(run: &mut Run) {
    let (backend, s, began) = (run.backend, run.s, run.began);
    let mut next_want = Instant::now();
    let long_until = s.seconds.map(|t| began + Duration::from_secs(t));
    let restart_every = s
        .seconds
        .map(|t| LONG_RESTART_EVERY.min(Duration::from_secs(t) / 2));
    let hard_limit = long_until.unwrap_or(began) + SETTLE_LIMIT;
    // Normal mode: the server restarts once, at RESTART_AT; on Galera a member is killed, then
    // one is cut off (FAULTS_AT).
    let faults_at: &[f64] = if run.galera.is_some() {
        &FAULTS_AT
    } else {
        &[RESTART_AT]
    };
    // The first kill comes early, so that even a short run has one.
    let mut next_kill = Instant::now() + run.rng.between(FIRST_KILL);
    // `None` while a node is frozen: the next freeze is planned when it is continued.
    let mut next_freeze = Some(Instant::now() + run.rng.between(FIRST_FREEZE));
    // No kill or freeze before this (after a server restart, see RECOVERY_WINDOW).
    let mut quiet_until = Instant::now();
    let mut waves = 0usize;
    let mut next_wave = Instant::now();
    let mut p = Progress::default();
    let mut answered_at = Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        run.fleet.assert_all_running();
        run.fleet.reap(&mut run.problems);
        run.fleet.thaw(false);
        if run.fleet.frozen.is_empty() && next_freeze.is_none() {
            next_freeze = Some(Instant::now() + run.rng.between(FREEZE_EVERY));
        }
        match progress(&run.store).await {
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
        if topping_up && run.enqueued - p.terminal < s.jobs / 2 {
            enqueue(&run.store, &mut run.enqueued, s.jobs / 2).await;
        }
        let waves_left = if long_until.is_some() {
            topping_up
        } else {
            waves < MIX_WAVES
        };
        if waves_left && Instant::now() >= next_wave {
            if let Some(n) = enqueue_wave(&run.store, &mut run.work_rng, waves).await {
                waves += 1;
                run.mix_jobs += n;
                run.enqueued += n;
                run.enqueued +=
                    enqueue_deps(&run.store, &mut run.dep_rng, waves, &mut run.deps).await;
                run.enqueued +=
                    enqueue_sequences(&run.store, &mut run.seq_rng, waves, &mut run.seqs).await;
                next_wave = Instant::now() + MIX_EVERY;
            }
        }
        let faults_left = long_until.is_none() && run.restarts < faults_at.len();
        if !topping_up && !waves_left && !faults_left && p.terminal == run.enqueued {
            break;
        }
        if Instant::now() >= next_want {
            want_or_delete(&run.store, &run.side, &mut run.wanted).await;
            next_want = Instant::now() + WANT_EVERY;
        }
        let restart_due = match restart_every {
            None => faults_at
                .get(run.restarts)
                .is_some_and(|&at| p.terminal as f64 >= at * run.enqueued as f64),
            Some(every) => {
                topping_up && began.elapsed() >= every * u32::try_from(run.restarts + 1).unwrap()
            }
        };
        if restart_due {
            run.restarts += 1;
            if let Some(g) = &mut run.galera {
                // Alternately a member killed and restarted, and a member cut off; which
                // member is drawn.
                let survivors = run.fleet.alive();
                let member = run.rng.below(3);
                let kill = run.restarts % 2 == 1;
                let fault = tokio::task::block_in_place(|| {
                    if kill {
                        g.kill_and_restart(member)
                    } else {
                        g.cut_off(member)
                    }
                });
                eprintln!(
                    "crash test [{backend:?}]: member {} {} at {}/{} jobs: out after {:.1} s, \
                     synced again after {:.1} s",
                    member + 1,
                    fault.what,
                    p.terminal,
                    run.enqueued,
                    (fault.out_us - fault.at_us) as f64 / 1e6,
                    (fault.back_us - fault.at_us) as f64 / 1e6,
                );
                run.server_down += Duration::from_micros(
                    u64::try_from(fault.out_us - fault.at_us).unwrap_or_default(),
                );
                run.server_restarts.push(Restart {
                    down_at_us: fault.at_us,
                    up_at_us: fault.out_us,
                    survivors,
                });
                answered_at = Instant::now();
                quiet_until = Instant::now() + RECOVERY_WINDOW;
            } else {
                match run.db.as_mut().and_then(|d| d.server.as_mut()) {
                    Some(server) => {
                        let survivors = run.fleet.alive();
                        let down_at_us = now_us();
                        let down = tokio::task::block_in_place(|| server.restart(SERVER_DOWN_FOR))
                            .unwrap_or_else(|e| panic!("restarting the server: {e}"));
                        eprintln!(
                            "crash test [{backend:?}]: server restarted in {down:?} at {}/{} jobs",
                            p.terminal, run.enqueued
                        );
                        run.server_down += down;
                        run.server_restarts.push(Restart {
                            down_at_us,
                            up_at_us: now_us(),
                            survivors,
                        });
                        answered_at = Instant::now();
                        quiet_until = Instant::now() + RECOVERY_WINDOW;
                    }
                    None => {
                        run.all_killed_at.push(now_us());
                        run.fleet.kill_all();
                        for _ in 0..NODES {
                            run.fleet.spawn();
                        }
                        eprintln!(
                            "crash test [{backend:?}]: all nodes killed at {}/{} jobs",
                            p.terminal, run.enqueued
                        );
                    }
                }
            }
        }
        if Instant::now() >= next_kill.max(quiet_until) {
            // Mostly SIGKILL; one time in four a graceful stop, so that give-backs (a lease
            // returned at shutdown) happen mid-run too. The first is always a SIGKILL, so even a
            // short run is sure to kill a node.
            if run.fleet.kills > 0 && run.rng.below(4) == 0 {
                run.fleet.stop_random(&mut run.rng);
            } else {
                run.fleet.kill_random(&mut run.rng);
            }
            run.fleet.spawn();
            next_kill = Instant::now() + run.rng.between(KILL_EVERY);
        }
        if next_freeze.is_some_and(|t| Instant::now() >= t.max(quiet_until)) {
            let for_ = run.rng.between(FREEZE_FOR);
            if run.fleet.freeze_random(&mut run.rng, for_) {
                next_freeze = None;
                eprintln!(
                    "crash test [{backend:?}]: froze {} for {:.1} s at {:.1} s",
                    run.fleet.frozen[0].proc.name,
                    for_.as_secs_f64(),
                    began.elapsed().as_secs_f64()
                );
            }
        }
        assert!(
            Instant::now() < hard_limit,
            "the run did not settle: {}/{} jobs terminal after {:?}; counts {:?}",
            p.terminal,
            run.enqueued,
            began.elapsed(),
            run.store.job_counts().await
        );
    }
}

/// Phase 3: the nodes stopped gracefully, their journals folded in, and every table read.
async fn collect(run: &mut Run) -> Collected {
    let run_took = run.began.elapsed();
    let stopped_us = now_us();
    let stops = run.fleet.stops;
    run.fleet.stop_all(&mut run.problems);
    for n in &run.fleet.gone {
        retry("recording a node", || run.side.insert_node(n)).await;
    }
    for f in &run.fleet.thawed {
        retry("recording a freeze", || run.side.insert_freeze(f)).await;
    }
    let journals = read_journals(&run.fleet, &mut run.problems);
    journal::fold(&run.side, &journals.nodes, &mut run.problems).await;

    let (periodic, jobs): (Vec<Job>, Vec<Job>) = all_jobs(&run.store, false)
        .await
        .into_iter()
        .partition(|j| j.queue == PERIODIC_QUEUE);
    let archived = all_jobs(&run.store, true).await;
    let wanted_rows = retry("reading run.wanted rows", || run.side.wanted()).await;
    let (fires, reconciled, periodic_problems) = check_periodic(
        &periodic,
        &wanted_rows,
        &run.server_restarts,
        run.nodes_started_us,
        stopped_us,
    );
    let execs = retry("reading executions", || run.side.executions()).await;
    let nodes = retry("reading nodes", || run.side.nodes()).await;
    let freezes = retry("reading freezes", || run.side.freezes()).await;
    let effects = retry("reading business rows", || run.side.effects()).await;
    // Sequence members wait for the member before them; a deadline job's expiry by the
    // sweeper ends it with one version bump, not two: both only bound their claims.
    let waited: std::collections::HashSet<i64> = run
        .deps
        .iter()
        .filter(|d| !d.parents.is_empty())
        .map(|d| d.id)
        .chain(run.seqs.iter().map(|s| s.id))
        .collect();
    let facts: Vec<JobFacts> = jobs
        .iter()
        .map(|j| JobFacts {
            waited: waited.contains(&j.id.0),
            ..JobFacts::from(j)
        })
        .collect();
    let ledgers = ledger::read_ledgers(&run.store, &facts).await;
    let (stop_lag_max_us, starts_in_stop_lag) = stop_lags(&freezes, &execs);
    Collected {
        run_took,
        drain: Duration::from_micros(
            u64::try_from(stopped_us - run.nodes_started_us).unwrap_or_default(),
        ),
        stops,
        journals,
        jobs,
        archived,
        fires,
        reconciled,
        periodic_problems,
        execs,
        nodes,
        freezes,
        facts,
        effects,
        ledgers,
        stop_lag_max_us,
        starts_in_stop_lag,
    }
}

/// Phase 4: every rule checked (see `check.rs`).
fn judge(run: &mut Run, c: &Collected) -> Verdict {
    let Collected {
        jobs,
        archived,
        periodic_problems,
        execs,
        nodes,
        freezes,
        facts,
        journals,
        effects,
        ledgers,
        ..
    } = c;
    let mut verdict = check(facts, execs, nodes, freezes, &journals.claims);
    let (ledger_faults, ledger_stats) = ledger::cross_check(facts, ledgers, execs);
    verdict.violations.extend(ledger_faults);
    verdict.ledger = ledger_stats;
    let (dep_faults, dep_stats) = check_deps(&run.deps, facts, execs, effects);
    verdict.violations.extend(dep_faults);
    verdict.deps = dep_stats;
    let world = World::new(nodes, freezes, &journals.claims);
    let (seq_faults, seq_stats) = check_sequences(&run.seqs, facts, execs, &world);
    verdict.violations.extend(seq_faults);
    verdict.seqs = seq_stats;
    verdict
        .violations
        .splice(0..0, std::mem::take(&mut run.problems));
    verdict.violations.extend(periodic_problems.iter().cloned());
    verdict
        .violations
        .extend(check_recovery(&run.server_restarts, execs));
    if jobs.len() != run.enqueued {
        verdict.violations.push(format!(
            "{} jobs run.enqueued but {} in the live table",
            run.enqueued,
            jobs.len()
        ));
    }
    if !archived.is_empty() {
        verdict.violations.push(format!(
            "{} jobs in the archive; none was old enough to be archived",
            archived.len()
        ));
    }

    verdict
}

/// Phase 5: the counts printed, and the test failed with the evidence of each violation.
fn report(run: Run, c: &Collected, verdict: Verdict) {
    let Run {
        backend,
        s,
        began,
        began_us,
        ref fleet,
        ref dir,
        restarts,
        server_down,
        ref server_restarts,
        ref all_killed_at,
        mix_jobs,
        wanted,
        ref deps,
        ref galera,
        ..
    } = run;
    let Collected {
        run_took,
        drain,
        stops,
        ref journals,
        ref jobs,
        fires,
        reconciled,
        ref nodes,
        ref freezes,
        ref facts,
        stop_lag_max_us,
        starts_in_stop_lag,
        ..
    } = *c;
    let ev = &journals.events;
    let count = |k: &str| ev.get(k).copied().unwrap_or(0);
    let v = &verdict.stats;
    println!(
        "crash test [{backend:?}]: jobs={} mix_jobs={} succeeded={} dead={} nodes={} kills={} \
         stops={} freezes={} restarts={} reclaims={} fenced={} timeouts={} refunds={} \
         lease_lost={} self_fenced={} sweeper_reclaims={} events_lagged={} \
         superseded_completions={} give_backs={} executions={} unrecorded_claims={} \
         ends_bounded_by_death={} paused_tails={} overlaps={} late_ends={} duplicates={} \
         failed_without_execution={} refunds_exhausted={} early_timeouts={} \
         started_without_lease={} stop_lag_max_us={} starts_in_stop_lag={} ledger_claims={} \
         ledger_matched={} ledger_unjournaled={} violations={} \
         server_down={:.1}s run={:.1}s total={:.1}s seed={}",
        jobs.len(),
        mix_jobs,
        v.succeeded,
        v.dead,
        fleet.gone.len(),
        fleet.kills,
        stops,
        fleet.freezes,
        restarts,
        v.reclaims,
        v.fenced,
        v.timeouts,
        v.refunds,
        count("lease_lost"),
        count("self_fenced"),
        count("reclaimed"),
        count("lagged"),
        v.superseded_completions,
        v.give_backs,
        v.executions,
        v.unrecorded_claims,
        v.ends_bounded_by_death,
        v.paused_tails,
        v.overlaps,
        v.late_ends,
        v.duplicates,
        v.failed_without_execution,
        v.refunds_exhausted,
        v.early_timeouts,
        v.started_without_lease,
        stop_lag_max_us,
        starts_in_stop_lag,
        verdict.ledger.claims,
        verdict.ledger.matched,
        verdict.ledger.unjournaled,
        verdict.violations.len(),
        server_down.as_secs_f64(),
        run_took.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        s.seed,
    );
    let d = &verdict.deps;
    println!(
        "crash test [{backend:?}] dependencies: chains={} callbacks={} dependent_jobs={} \
         edges={} business_rows={} (one per dependent job) min_release_gap_us={:?}",
        d.chains,
        d.callbacks,
        deps.len(),
        d.edges,
        d.effects,
        d.min_release_gap_us
    );
    let q = &verdict.seqs;
    println!(
        "crash test [{backend:?}] sequences: sequences={} members={} (each must succeed) \
         orders={} (each after the one before succeeded and stopped) executions={} (none may \
         overlap) planned_failures={} paused_tails={} min_handover_us={:?}",
        q.sequences,
        q.members,
        q.orders,
        q.executions,
        q.planned_failures,
        q.paused_tails,
        q.min_handover_us
    );
    println!(
        "crash test [{backend:?}] deadlines: deadline_jobs={} succeeded={} expired={} \
         (none may start at or after its deadline) min_margin_us={:?}",
        q.deadline_jobs, q.in_time, q.expired, q.min_margin_us
    );
    println!(
        "crash test [{backend:?}] periodic: fires={fires} (one job each, none missing, \
         none twice) wanted={wanted} reconciled={} max_missing_ms={}",
        reconciled.0,
        reconciled.1 / 1000
    );
    println!(
        "crash test [{backend:?}] summary: kills={} freezes={} restarts={} jobs={} \
         dead_or_retried_without_execution={} {:?} (must be 0) started_without_lease={} \
         (must be 0) refunds_not_started={} timeouts={} early_timeouts={} (must be 0)",
        fleet.kills,
        fleet.freezes,
        restarts,
        jobs.len(),
        v.failed_without_execution,
        v.unexecuted_by_code,
        v.started_without_lease,
        v.refunds,
        v.timeouts,
        v.early_timeouts,
    );
    if let Some(g) = galera {
        report_galera(g, fleet, journals, jobs.len(), drain);
    }
    if !verdict.violations.is_empty() {
        let evidence = Evidence {
            began_us,
            restarts: server_restarts,
            all_killed_at,
            jobs: facts,
            nodes,
            freezes,
            journals,
        };
        let mut msg = format!(
            "{} violation(s) on {backend:?} (seed {}; logs and journals kept in {}):\n",
            verdict.violations.len(),
            s.seed,
            dir.path().display()
        );
        // Up to 10 of each rule's (tagged `[rule] …`), then up to 30 of the others.
        let mut by_rule: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
        for line in &verdict.violations {
            let rule = line
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .map_or("", |(r, _)| r);
            by_rule.entry(rule).or_default().push(line);
        }
        for (rule, lines) in &by_rule {
            let (what, shown) = if rule.is_empty() {
                ("other violations", 30)
            } else {
                (*rule, 10)
            };
            let _ = writeln!(msg, "{} {what}:", lines.len());
            for line in lines.iter().take(shown) {
                let _ = writeln!(msg, "  - {line}");
                msg.push_str(&evidence.explain(line));
            }
        }
        drop(run);
        panic!("{msg}");
    }
    assert!(restarts >= 1, "the run ended before the restart happened");
    if galera.is_some() && s.seconds.is_none() {
        assert!(
            restarts >= FAULTS_AT.len(),
            "the run ended before a member was both killed and cut off"
        );
    }
    assert!(fleet.kills >= 1, "the run ended before any node was killed");
    assert!(
        fleet.freezes >= 1,
        "the run ended before any node was frozen"
    );
}

/// Adds the next wanted business row (its job is for the reconciler to create), or every
/// fifth time marks an earlier row missing again and deletes its job by hand. A database
/// that does not answer (restarting) is simply tried again at the next tick.
async fn want_or_delete(store: &Store, side: &SideDb, wanted: &mut usize) {
    let now = now_us();
    if *wanted >= 5 && (*wanted).is_multiple_of(5) {
        let key = format!("w{}", *wanted / 2);
        if side.want(&key, now).await.is_ok() {
            let sql = format!("DELETE FROM jobvisor_jobs WHERE unique_key = '{key}'");
            if jobvisor::testing::exec_sql(store, &sql).await.is_ok() {
                *wanted += 1;
            }
        }
        return;
    }
    if side.want(&format!("w{wanted}"), now).await.is_ok() {
        *wanted += 1;
    }
}
