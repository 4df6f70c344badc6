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
//! Each run starts a private database server of its own (`tests/harness/server.rs`: own
//! port, own data directory, stopped and removed afterwards, even when the test panics) and
//! restarts that one; the machine's shared servers are never touched. The tests are
//! `#[ignore]`d all the same — they take a minute or two each, need root (the private server
//! runs as its own user) and load the machine — and run one at a time, as `.ci/crash` does:
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
//!
//! Node processes are killed when the test ends, and each node also stops by itself when its
//! standard input (a pipe from the test) closes; then the private server is stopped. On
//! failure the directory with every node's log and journal is kept and printed, and so is the
//! private server's directory (with its log) until the next run; each violation is printed
//! with what explains it (see `Evidence`).

#![allow(clippy::unwrap_used)]

mod harness;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::testing::{EnqueueParams, StoreEngine as _};
use jobvisor::{Backend, Job, JobFailure, JobId, JobState, NewJob, Store};
use serde_json::json;

use harness::journal::{self, at_us, owner, same_claim, taken_by_sweeper, JobFacts, NodeJournal};
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

fn run_blocking(backend: Backend) {
    block_on(run(backend));
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
// Node processes

/// A node process stopped with SIGSTOP.
#[derive(Debug)]
struct FrozenProc {
    proc: NodeProc,
    /// Taken right after SIGSTOP was sent.
    signalled_at_us: i64,
    /// Taken once every thread of the node was seen stopped.
    frozen_at_us: i64,
    /// Continues it (SIGCONT) when its time is up, or at once when sent `true`; dropped, the
    /// timer stands down and leaves the node frozen (for a kill). Answers when it sent the
    /// signal, if it did.
    /// A thread of its own, not the driver's loop: on SQLite a frozen node can hold the
    /// file's lock, and the driver's progress query then waits for it.
    thaw: std::sync::mpsc::Sender<bool>,
    thawed: std::thread::JoinHandle<Option<i64>>,
}

/// The node processes of one run, live and gone.
#[derive(Debug)]
struct Fleet {
    bin: PathBuf,
    url: String,
    dir: PathBuf,
    next: usize,
    live: Vec<NodeProc>,
    /// Alive but stopped (SIGSTOP): not picked for kills or stops until continued.
    frozen: Vec<FrozenProc>,
    /// Asked to stop gracefully, with when they must be gone by.
    stopping: Vec<(NodeProc, Instant)>,
    gone: Vec<NodeRow>,
    /// Every freeze that ended (continued, or killed while frozen).
    thawed: Vec<FreezeRow>,
    kills: usize,
    stops: usize,
    freezes: usize,
}

/// Sends `signal` (`STOP`, `CONT`) to a process with `kill(1)` (this crate forbids `unsafe`).
fn signal(pid: u32, signal: &str) {
    run_cmd("kill", &[&format!("-{signal}"), &pid.to_string()])
        .unwrap_or_else(|e| panic!("sending SIG{signal} to {pid}: {e}"));
}

/// The thread ids of a process, from `/proc/<pid>/task`.
fn thread_ids(pid: u32) -> Result<Vec<String>, String> {
    let dir = format!("/proc/{pid}/task");
    let mut ids: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Whether thread `tid` of process `pid` can no longer run: stopped (`T`, or `t` under a
/// tracer), or exited (`Z`, `X`, or gone from `/proc`).
fn thread_stopped(pid: u32, tid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
        return true;
    };
    // The state is the first field after the command name, which is in parentheses and may
    // contain anything.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("T" | "t" | "Z" | "X"))
}

/// Waits until every thread of `pid` is stopped after a SIGSTOP; answers when that was
/// seen, which is after the process last ran. SIGSTOP stops a multi-threaded process
/// asynchronously: `kill(2)` wakes one thread, which stops the others once it is scheduled.
/// The set of threads is read again after all were seen stopped: a thread created while the
/// list was being checked would be missed otherwise (a stopped thread creates none).
fn wait_stopped(pid: u32, within: Duration) -> Result<i64, String> {
    let until = Instant::now() + within;
    loop {
        let tids = thread_ids(pid)?;
        if tids.iter().all(|t| thread_stopped(pid, t)) {
            let at = now_us();
            if thread_ids(pid)? == tids {
                return Ok(at);
            }
        }
        if Instant::now() >= until {
            let running: Vec<&String> = tids.iter().filter(|t| !thread_stopped(pid, t)).collect();
            return Err(format!(
                "threads {running:?} of process {pid} still not stopped {within:?} after SIGSTOP"
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Fleet {
    fn new(bin: PathBuf, url: String, dir: &Path) -> Fleet {
        Fleet {
            bin,
            url,
            dir: dir.to_path_buf(),
            next: 0,
            live: Vec::new(),
            frozen: Vec::new(),
            stopping: Vec::new(),
            gone: Vec::new(),
            thawed: Vec::new(),
            kills: 0,
            stops: 0,
            freezes: 0,
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
        let child = Command::new(&self.bin)
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
            .args(["--queue", MIX_QUEUE])
            .arg("--concurrency")
            .arg(MIX_CONCURRENCY.to_string())
            .arg("--prefetch")
            .arg(MIX_PREFETCH.to_string())
            .args(["--kind", CRASHY])
            .args(MIX.iter().flat_map(|m| ["--kind", m.kind]))
            .arg("--schedule-ms")
            .arg(SCHEDULE_EVERY.as_millis().to_string())
            .arg("--reconcile-ms")
            .arg(RECONCILE_EVERY.as_millis().to_string())
            .arg("--leader-lease-ms")
            .arg(LEADER_LEASE.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.live.push(NodeProc::new(name, child));
    }

    fn record_gone(&mut self, n: &NodeProc, how: &str) {
        self.gone.push(n.gone(how));
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

    /// SIGKILLs every node, frozen ones included (a stopped process dies of SIGKILL too;
    /// its freeze ends when it is reaped).
    fn kill_all(&mut self) {
        while !self.live.is_empty() {
            self.kill(self.live.len() - 1);
        }
        while let Some(f) = self.frozen.pop() {
            let FrozenProc {
                proc,
                signalled_at_us,
                frozen_at_us,
                thaw,
                thawed,
            } = f;
            drop(thaw);
            let continued = thawed.join().unwrap();
            self.live.push(proc);
            self.kill(self.live.len() - 1);
            let gone = self.gone.last().unwrap().gone_at_us;
            self.thawed.push(FreezeRow {
                node: self.gone.last().unwrap().node.clone(),
                signalled_at_us,
                frozen_at_us,
                resumed_at_us: continued.unwrap_or(gone),
            });
        }
    }

    /// Freezes a random live node (SIGSTOP) for `for_`, unless one is frozen already or it
    /// would leave no node running.
    fn freeze_random(&mut self, rng: &mut Rng, for_: Duration) -> bool {
        if !self.frozen.is_empty() || self.live.len() < 2 {
            return false;
        }
        let n = self.live.swap_remove(rng.below(self.live.len()));
        let pid = n.child.id();
        signal(pid, "STOP");
        let signalled_at_us = now_us();
        // `kill` returns once the signal is queued, not once the node has stopped: one of
        // its threads must still be scheduled to take the stop to the others, and on a busy
        // machine the node runs on for milliseconds meanwhile (it can start a handler then).
        // The freeze counts from when every thread was seen stopped.
        let frozen_at_us = wait_stopped(pid, STOP_TAKES_EFFECT_WITHIN)
            .unwrap_or_else(|e| panic!("freezing node {}: {e}", n.name));
        let (thaw, asked) = std::sync::mpsc::channel::<bool>();
        let thawed = std::thread::spawn(move || {
            use std::sync::mpsc::RecvTimeoutError;
            match asked.recv_timeout(for_) {
                Ok(true) | Err(RecvTimeoutError::Timeout) => {}
                Ok(false) | Err(RecvTimeoutError::Disconnected) => return None,
            }
            // Taken before the signal: the node cannot run earlier than this.
            let t = now_us();
            signal(pid, "CONT");
            Some(t)
        });
        self.frozen.push(FrozenProc {
            proc: n,
            signalled_at_us,
            frozen_at_us,
            thaw,
            thawed,
        });
        self.freezes += 1;
        true
    }

    /// Takes back the frozen nodes that were continued; with `all`, continues the others
    /// at once first.
    fn thaw(&mut self, all: bool) {
        let mut i = 0;
        while i < self.frozen.len() {
            if all {
                let _ = self.frozen[i].thaw.send(true);
            } else if !self.frozen[i].thawed.is_finished() {
                i += 1;
                continue;
            }
            let f = self.frozen.swap_remove(i);
            let resumed_at_us = f.thawed.join().unwrap().unwrap();
            self.thawed.push(FreezeRow {
                node: f.proc.name.clone(),
                signalled_at_us: f.signalled_at_us,
                frozen_at_us: f.frozen_at_us,
                resumed_at_us,
            });
            self.live.push(f.proc);
        }
    }

    /// The names of the nodes alive now, frozen or not.
    fn alive(&self) -> Vec<String> {
        let frozen = self.frozen.iter().map(|f| &f.proc);
        self.live
            .iter()
            .chain(frozen)
            .map(|n| n.name.clone())
            .collect()
    }

    /// A node must not exit by itself while the run goes on.
    fn assert_all_running(&mut self) {
        let frozen = self.frozen.iter_mut().map(|f| &mut f.proc);
        for n in self.live.iter_mut().chain(frozen) {
            n.assert_running(&self.dir);
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
            let how = n.end_stop(status, &self.log(&n.name), STOP_WITHIN, problems);
            self.record_gone(&n, how);
        }
    }

    /// Continues the frozen nodes, then stops every node gracefully and reaps them all.
    fn stop_all(&mut self, problems: &mut Vec<String>) {
        self.thaw(true);
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
        // Frozen nodes stay frozen until killed: their timers are told to stand down first.
        let mut frozen = Vec::new();
        for f in self.frozen.drain(..) {
            drop(f.thaw);
            let _ = f.thawed.join();
            frozen.push(f.proc);
        }
        let stopping = self.stopping.iter_mut().map(|(n, _)| n);
        for n in self
            .live
            .iter_mut()
            .chain(stopping)
            .chain(frozen.iter_mut())
        {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
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

async fn run(backend: Backend) {
    let s = settings();
    let bin = node_binary();
    let began = Instant::now();
    let began_us = now_us();
    // Declared before the nodes, so that it drops after them: nodes killed first, then the
    // private server stopped.
    let mut db = TestDatabase::create(backend, "crash");
    let store = db.store().await;
    let side = SideDb::open(&db.url, 4).unwrap();
    side.create_tables().await.unwrap();
    let dir = RunDir::new(
        "crash",
        tempfile::Builder::new()
            .prefix("jobvisor-crash-")
            .tempdir()
            .unwrap(),
    );
    let mut fleet = Fleet::new(bin, db.url.clone(), dir.path());
    let mut rng = Rng(s.seed);
    // The mix's work times come from a stream of their own, so that they do not shift with
    // the number of kills and freezes.
    let mut work_rng = Rng(s.seed ^ 0x6D69_7800);
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
    let nodes_started_us = now_us();
    for _ in 0..NODES {
        fleet.spawn();
    }
    let mut wanted = 0usize;
    let mut next_want = Instant::now();

    let long_until = s.seconds.map(|t| began + Duration::from_secs(t));
    let restart_every = s
        .seconds
        .map(|t| LONG_RESTART_EVERY.min(Duration::from_secs(t) / 2));
    let hard_limit = long_until.unwrap_or(began) + SETTLE_LIMIT;
    let mut restarts = 0usize;
    let mut server_down = Duration::ZERO;
    // The first kill comes early, so that even a short run has one.
    let mut next_kill = Instant::now() + rng.between(FIRST_KILL);
    // `None` while a node is frozen: the next freeze is planned when it is continued.
    let mut next_freeze = Some(Instant::now() + rng.between(FIRST_FREEZE));
    // No kill or freeze before this (after a server restart, see RECOVERY_WINDOW).
    let mut quiet_until = Instant::now();
    let mut waves = 0usize;
    let mut mix_jobs = 0usize;
    let mut next_wave = Instant::now();
    let mut p = Progress::default();
    let mut problems = Vec::new();
    let mut server_restarts: Vec<Restart> = Vec::new();
    // SQLite's stand-in for a restart: when every node was killed at once.
    let mut all_killed_at: Vec<i64> = Vec::new();
    let mut answered_at = Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        fleet.assert_all_running();
        fleet.reap(&mut problems);
        fleet.thaw(false);
        if fleet.frozen.is_empty() && next_freeze.is_none() {
            next_freeze = Some(Instant::now() + rng.between(FREEZE_EVERY));
        }
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
        let waves_left = if long_until.is_some() {
            topping_up
        } else {
            waves < MIX_WAVES
        };
        if waves_left && Instant::now() >= next_wave {
            if let Some(n) = enqueue_wave(&store, &mut work_rng, waves).await {
                waves += 1;
                mix_jobs += n;
                enqueued += n;
                next_wave = Instant::now() + MIX_EVERY;
            }
        }
        if !topping_up && !waves_left && p.terminal == enqueued {
            break;
        }
        if Instant::now() >= next_want {
            want_or_delete(&store, &side, &mut wanted).await;
            next_want = Instant::now() + WANT_EVERY;
        }
        let restart_due = match restart_every {
            None => restarts == 0 && p.terminal as f64 >= RESTART_AT * enqueued as f64,
            Some(every) => {
                topping_up && began.elapsed() >= every * u32::try_from(restarts + 1).unwrap()
            }
        };
        if restart_due {
            restarts += 1;
            match &mut db.server {
                Some(server) => {
                    let survivors = fleet.alive();
                    let down_at_us = now_us();
                    let down = tokio::task::block_in_place(|| server.restart(SERVER_DOWN_FOR))
                        .unwrap_or_else(|e| panic!("restarting the server: {e}"));
                    eprintln!(
                        "crash test [{backend:?}]: server restarted in {down:?} at {}/{} jobs",
                        p.terminal, enqueued
                    );
                    server_down += down;
                    server_restarts.push(Restart {
                        down_at_us,
                        up_at_us: now_us(),
                        survivors,
                    });
                    answered_at = Instant::now();
                    quiet_until = Instant::now() + RECOVERY_WINDOW;
                }
                None => {
                    all_killed_at.push(now_us());
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
        if Instant::now() >= next_kill.max(quiet_until) {
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
        if next_freeze.is_some_and(|t| Instant::now() >= t.max(quiet_until)) {
            let for_ = rng.between(FREEZE_FOR);
            if fleet.freeze_random(&mut rng, for_) {
                next_freeze = None;
                eprintln!(
                    "crash test [{backend:?}]: froze {} for {:.1} s at {:.1} s",
                    fleet.frozen[0].proc.name,
                    for_.as_secs_f64(),
                    began.elapsed().as_secs_f64()
                );
            }
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
    let stopped_us = now_us();
    let stops = fleet.stops;
    fleet.stop_all(&mut problems);
    for n in &fleet.gone {
        retry("recording a node", || side.insert_node(n)).await;
    }
    for f in &fleet.thawed {
        retry("recording a freeze", || side.insert_freeze(f)).await;
    }
    let journals = read_journals(&fleet, &mut problems);
    journal::fold(&side, &journals.nodes, &mut problems).await;

    let (periodic, jobs): (Vec<Job>, Vec<Job>) = all_jobs(&store, false)
        .await
        .into_iter()
        .partition(|j| j.queue == PERIODIC_QUEUE);
    let archived = all_jobs(&store, true).await;
    let wanted_rows = retry("reading wanted rows", || side.wanted()).await;
    let (fires, reconciled, periodic_problems) = check_periodic(
        &periodic,
        &wanted_rows,
        &server_restarts,
        nodes_started_us,
        stopped_us,
    );
    let execs = retry("reading executions", || side.executions()).await;
    let nodes = retry("reading nodes", || side.nodes()).await;
    let freezes = retry("reading freezes", || side.freezes()).await;
    let facts: Vec<JobFacts> = jobs.iter().map(JobFacts::from).collect();
    let (stop_lag_max_us, starts_in_stop_lag) = stop_lags(&freezes, &execs);
    let mut verdict = check(&facts, &execs, &nodes, &freezes, &journals.claims);
    verdict.violations.splice(0..0, problems);
    verdict.violations.extend(periodic_problems);
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
        "crash test [{backend:?}]: jobs={} mix_jobs={} succeeded={} dead={} nodes={} kills={} \
         stops={} freezes={} restarts={} reclaims={} fenced={} timeouts={} refunds={} \
         lease_lost={} self_fenced={} sweeper_reclaims={} events_lagged={} \
         superseded_completions={} give_backs={} executions={} unrecorded_claims={} \
         ends_bounded_by_death={} paused_tails={} overlaps={} late_ends={} duplicates={} \
         failed_without_execution={} refunds_exhausted={} early_timeouts={} \
         started_without_lease={} stop_lag_max_us={} starts_in_stop_lag={} violations={} \
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
        verdict.violations.len(),
        server_down.as_secs_f64(),
        run_took.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        s.seed,
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
    if !verdict.violations.is_empty() {
        let evidence = Evidence {
            began_us,
            restarts: &server_restarts,
            all_killed_at: &all_killed_at,
            jobs: &facts,
            nodes: &nodes,
            freezes: &freezes,
            journals: &journals,
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
        drop(fleet);
        panic!("{msg}");
    }
    assert!(restarts >= 1, "the run ended before the restart happened");
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

/// The schedule's and the reconciler's jobs after the run: every fire from the first to the
/// last that was due `MISSING_AT_MOST` before the nodes stopped has exactly one job; every
/// business row missing its job since at least that long before the stop has one, created
/// at most `MISSING_AT_MOST` after it went missing. Answers the fires checked, (rows checked,
/// longest wait in µs) and the violations.
fn check_periodic(
    periodic: &[Job],
    wanted: &[(String, i64)],
    restarts: &[Restart],
    started_us: i64,
    stopped_us: i64,
) -> (usize, (usize, i64), Vec<String>) {
    let bound_us = i64::try_from(MISSING_AT_MOST.as_micros()).unwrap();
    let after_restart_us = i64::try_from(AFTER_RESTART.as_micros()).unwrap();
    // A row's bound: MISSING_AT_MOST, plus for each restart that overlaps its wait the part
    // of the downtime after it went missing beyond the 3 s already allowed, and
    // AFTER_RESTART.
    let row_bound = |since: i64| {
        restarts
            .iter()
            .filter(|r| r.down_at_us < since + bound_us && r.up_at_us > since)
            .map(|r| (r.up_at_us - r.down_at_us.max(since) - 3_000_000).max(0) + after_restart_us)
            .sum::<i64>()
            + bound_us
    };
    let every_us = i64::try_from(SCHEDULE_EVERY.as_micros()).unwrap();
    let mut problems = Vec::new();
    let mut fires: BTreeMap<i64, usize> = BTreeMap::new();
    for j in periodic.iter().filter(|j| j.kind == "tick") {
        let key = j.unique_key.as_deref().unwrap_or("");
        let at = key
            .strip_prefix("schedule:crash-tick@")
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros());
        match at {
            Some(at) if at % every_us == 0 => *fires.entry(at).or_default() += 1,
            _ => problems.push(format!("[schedule] job {} has the key {key:?}", j.id)),
        }
    }
    let last = (stopped_us - bound_us).div_euclid(every_us) * every_us;
    let checked = match fires.keys().next() {
        None => {
            problems.push("[schedule] the schedule never fired".into());
            0
        }
        Some(&first) => {
            if first > started_us + bound_us {
                problems.push(format!(
                    "[schedule] first fire {} ms after the nodes started",
                    (first - started_us) / 1000
                ));
            }
            let mut n = 0;
            let mut at = first;
            while at <= last {
                match fires.get(&at).copied().unwrap_or(0) {
                    1 => {}
                    k => problems.push(format!(
                        "[schedule] the fire at {at} µs has {k} jobs (expected exactly 1)"
                    )),
                }
                n += 1;
                at += every_us;
            }
            n
        }
    };
    let by_key: HashMap<&str, &Job> = periodic
        .iter()
        .filter(|j| j.kind == "wanted")
        .filter_map(|j| Some((j.unique_key.as_deref()?, j)))
        .collect();
    let (mut rows, mut longest) = (0usize, 0i64);
    for (key, since) in wanted.iter().filter(|(_, s)| *s <= stopped_us - bound_us) {
        rows += 1;
        let Some(job) = by_key.get(key.as_str()) else {
            problems.push(format!(
                "[reconciler] row {key} missing its job since {since} µs: never re-created"
            ));
            continue;
        };
        let waited = job.created_at.timestamp_micros() - since;
        longest = longest.max(waited);
        let bound = row_bound(*since);
        if waited > bound {
            problems.push(format!(
                "[reconciler] row {key}: job {} created {} ms after it went missing (bound {} \
                 ms)",
                job.id,
                waited / 1000,
                bound / 1000
            ));
        }
    }
    if rows == 0 {
        problems.push("[reconciler] no wanted row was old enough to check".into());
    }
    (checked, (rows, longest), problems)
}

/// How late freezes took effect: the longest time from SIGSTOP sent to the node seen stopped,
/// and how many executions started in such a gap (on the node being frozen) — handlers a
/// node started after the signal was sent, which were running when it stopped.
fn stop_lags(freezes: &[FreezeRow], execs: &[Execution]) -> (i64, usize) {
    let max = freezes
        .iter()
        .map(|f| f.frozen_at_us - f.signalled_at_us)
        .max()
        .unwrap_or(0);
    let starts = execs
        .iter()
        .filter(|x| {
            freezes.iter().any(|f| {
                f.node == x.node && x.start() >= f.signalled_at_us && x.start() <= f.frozen_at_us
            })
        })
        .count();
    (max, starts)
}

// ---------------------------------------------------------------------------------------------
// Journals

/// Everything the nodes journaled.
#[derive(Debug, Default)]
struct Journals {
    /// Node → its journal.
    nodes: BTreeMap<String, NodeJournal>,
    /// `(job, attempt, node)` → when the node received each of its claims of that attempt.
    claims: Claims,
    /// Event counts by kind, over every node.
    events: BTreeMap<String, i64>,
}

/// Reads every gone node's journal (see [`NodeJournal`]); the fold reports what a journal
/// says wrong.
fn read_journals(fleet: &Fleet, problems: &mut Vec<String>) -> Journals {
    let mut j = Journals::default();
    for n in &fleet.gone {
        let Ok(nj) = NodeJournal::read(&fleet.journal(&n.node), n.how == "killed") else {
            // A node opens its journal before it builds its scheduler, so one killed (or
            // frozen, then killed) that early never claimed anything. One that exited by
            // itself without a journal is broken.
            if n.how == "killed" {
                *j.events.entry("killed_before_journal".into()).or_default() += 1;
            } else {
                problems.push(format!("node {} left no journal", n.node));
            }
            continue;
        };
        // Timeline and fence lines are read by the partition test only (a frozen node's
        // handler ends when the node thaws, past its fence point, having done nothing
        // meanwhile: the end-time rule holds only where nothing freezes).
        if n.how == "stopped" && !nj.exited {
            problems.push(format!(
                "node {} stopped without journaling its exit",
                n.node
            ));
        }
        for ((job, attempt), at) in &nj.claims {
            j.claims
                .entry((*job, *attempt, n.node.clone()))
                .or_default()
                .extend(at);
        }
        for (what, count) in &nj.events {
            *j.events.entry(what.clone()).or_default() += count;
        }
        j.nodes.insert(n.node.clone(), nj);
    }
    j
}

// ---------------------------------------------------------------------------------------------
// Violation reports

/// What the run knows around a violation, printed under it so that the report explains
/// itself: the server's down windows (or, on SQLite, when every node was killed), and for
/// the job the violation names, its row and, per node whose journal mentions it, the node's
/// life, its freezes and its journal lines about the job (claims, starts, ends, lease
/// losses, fences, drops, timeouts) and its detected pauses around them. Times are given
/// since the run began and in µs since the epoch (as in the tables).
#[derive(Debug)]
struct Evidence<'a> {
    began_us: i64,
    restarts: &'a [Restart],
    all_killed_at: &'a [i64],
    jobs: &'a [JobFacts],
    nodes: &'a [NodeRow],
    freezes: &'a [FreezeRow],
    journals: &'a Journals,
}

/// The job a violation names (`job <id>`), if any.
fn job_named(line: &str) -> Option<i64> {
    let mut rest = line;
    while let Some(i) = rest.find("job ") {
        rest = &rest[i + 4..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(id) = digits.parse() {
            return Some(id);
        }
    }
    None
}

/// When a journal line happened, and whether it is about `job`.
fn journal_time_and_job(line: &JournalLine) -> (Option<i64>, Option<i64>) {
    match line {
        JournalLine::Start {
            job_id,
            started_at_us,
            ..
        } => (Some(*started_at_us), Some(*job_id)),
        JournalLine::End {
            job_id,
            ended_at_us,
            ..
        } => (Some(*ended_at_us), Some(*job_id)),
        JournalLine::Claim { job_id, at_us, .. } => (Some(*at_us), Some(*job_id)),
        JournalLine::Fence { job_id, at_us, .. } => (Some(*at_us), Some(*job_id)),
        // The same events as `At` lines, which carry their time.
        JournalLine::Event { .. } => (None, None),
        JournalLine::At { at_us, what, a, .. } => {
            let about_a_job = !matches!(
                what.as_str(),
                "renewed"
                    | "pause_detected"
                    | "leader_elected"
                    | "leader_lost"
                    | "reconciled"
                    | "reconcile_failed"
            );
            (Some(*at_us), about_a_job.then_some(*a))
        }
        JournalLine::Exit { at_us, .. } => (Some(*at_us), None),
    }
}

impl Evidence<'_> {
    /// `t` as "+seconds since the run began (µs since the epoch)".
    fn at(&self, t: i64) -> String {
        format!("+{:.6} s ({t})", (t - self.began_us) as f64 / 1e6)
    }

    /// The lines printed under violation `line`.
    fn explain(&self, line: &str) -> String {
        let mut out = String::new();
        for r in self.restarts {
            let _ = writeln!(
                out,
                "      server down: asked to stop at {}, answering again at {}",
                self.at(r.down_at_us),
                self.at(r.up_at_us)
            );
        }
        for t in self.all_killed_at {
            let _ = writeln!(out, "      every node killed at {}", self.at(*t));
        }
        let Some(id) = job_named(line) else {
            return out;
        };
        if let Some(j) = self.jobs.iter().find(|j| j.id.0 == id) {
            let errors: Vec<String> = j
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "attempt {} {} by {} at {}",
                        e.attempt,
                        e.code,
                        owner(e).unwrap_or("?"),
                        self.at(at_us(e))
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "      job {id} ({}): {}, attempts {}, finished at {}, errors {errors:?}",
                j.kind,
                j.state,
                j.attempts,
                j.finished_at_us.map_or("-".into(), |t| self.at(t)),
            );
        }
        let mut names: Vec<&String> = self.journals.nodes.keys().collect();
        names.sort_by_key(|n| (n.len(), n.as_str()));
        for node in names {
            let lines = &self.journals.nodes[node].lines;
            let about: Vec<(Option<i64>, &JournalLine)> = lines
                .iter()
                .filter_map(|l| {
                    let (t, job) = journal_time_and_job(l);
                    (job == Some(id)).then_some((t, l))
                })
                .collect();
            if about.is_empty() {
                continue;
            }
            let times: Vec<i64> = about.iter().filter_map(|(t, _)| *t).collect();
            let (from, to) = (
                times.iter().min().copied().unwrap_or(i64::MIN),
                times.iter().max().copied().unwrap_or(i64::MAX),
            );
            let life = self.nodes.iter().find(|n| &n.node == node).map_or_else(
                || "never recorded".to_string(),
                |n| {
                    format!(
                        "spawned at {}, {} at {}",
                        self.at(n.spawned_at_us),
                        n.how,
                        self.at(n.gone_at_us)
                    )
                },
            );
            let _ = writeln!(out, "      node {node}: {life}");
            for f in self.freezes.iter().filter(|f| &f.node == node) {
                let _ = writeln!(
                    out,
                    "        freeze: SIGSTOP sent at {}, seen stopped at {}, continued at {}",
                    self.at(f.signalled_at_us),
                    self.at(f.frozen_at_us),
                    self.at(f.resumed_at_us)
                );
            }
            // Its lines about the job, and its detected pauses from a second before the
            // first to ten seconds after the last.
            for l in lines {
                let (t, job) = journal_time_and_job(l);
                let pause = matches!(l, JournalLine::At { what, .. } if what == "pause_detected")
                    && t.is_some_and(|t| t >= from - 1_000_000 && t <= to + 10_000_000);
                if job == Some(id) || pause {
                    let when = t.map_or("-".into(), |t| self.at(t));
                    let _ = writeln!(
                        out,
                        "        journal {when}: {}",
                        l.to_string().replace('\t', " ")
                    );
                }
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The checks

/// Counts the checks produce.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Stats {
    succeeded: usize,
    /// Mix jobs that used up their attempts (on timeouts and lost leases).
    dead: usize,
    executions: usize,
    /// Counted failures: reclaims of an expired lease (`lease_expired`).
    reclaims: usize,
    /// Counted failures: started jobs a node fenced and gave back (`fenced`).
    fenced: usize,
    /// Counted failures: timeouts (`timeout`), written by the node or by a sweeper.
    timeouts: usize,
    /// Reclaims of a job whose start was never recorded: its attempt given back
    /// (`not_started`, not counted).
    refunds: usize,
    /// Claims whose attempt was given back: at graceful shutdown, by a refund, or by a node
    /// dropping a prefetched job whose lease it could no longer trust.
    give_backs: usize,
    /// Claims that never reached a handler start (the node died or never heard of the
    /// claim): claims minus recorded executions.
    unrecorded_claims: usize,
    /// Executions that did their work but were not the one whose result counts.
    superseded_completions: usize,
    /// Executions without a recorded end, bounded by their process's death instead.
    ends_bounded_by_death: usize,
    /// Executions that ran on past their lease, the job's end or a later execution's start
    /// only because their node was frozen, and stopped within [`PAUSE_TAIL_US`] of waking.
    paused_tails: usize,
    /// Pairs of executions of one job that overlapped in time.
    overlaps: usize,
    /// Executions still running after their attempt was reclaimed or the job finished.
    late_ends: usize,
    /// Jobs with any overlap.
    duplicates: usize,
    /// Counted failures (`timeout`, `lease_expired`, `fenced`) of an attempt that never
    /// started on the node that held it.
    failed_without_execution: usize,
    /// The same, by error code.
    unexecuted_by_code: BTreeMap<String, usize>,
    /// `lease_expired` of an attempt that never started, after the job's refunds reached its
    /// `max_attempts`: the bound that keeps a job killing its node at start from being
    /// refunded for ever (allowed).
    refunds_exhausted: usize,
    /// `timeout`s recorded before an execution of the attempt had run for the job's timeout.
    early_timeouts: usize,
    /// Executions that started after their attempt's lease had been taken from their node.
    started_without_lease: usize,
}

/// What the checks found.
#[derive(Debug, Default)]
struct Verdict {
    violations: Vec<String>,
    stats: Stats,
}

/// `(job, attempt, node)` → when the node received each of its claims of that attempt
/// (from the journals).
type Claims = HashMap<(i64, i32, String), Vec<i64>>;

/// What the checks know besides the jobs and their executions.
#[derive(Debug)]
struct World<'a> {
    /// Node → when its process was surely gone.
    gone: HashMap<&'a str, i64>,
    /// Node → its freezes, `(frozen at, continued at)`.
    freezes: HashMap<&'a str, Vec<(i64, i64)>>,
    claims: &'a Claims,
}

impl World<'_> {
    /// Whether `x`, running until `end`, ran past `t` only because its node was frozen: a
    /// freeze of its node began after `x` started and by `t`, and `x` ended within
    /// [`PAUSE_TAIL_US`] of the node being continued. A freeze begins when the node was seen
    /// stopped, not when SIGSTOP was sent (see [`Fleet::freeze_random`]): a node may start a
    /// handler in between, and that handler was running when the node froze.
    fn paused_tail(&self, x: &Execution, end: i64, t: i64) -> bool {
        self.freezes.get(x.node.as_str()).is_some_and(|fs| {
            fs.iter()
                .any(|&(f, u)| f > x.start() && f <= t && end <= u.saturating_add(PAUSE_TAIL_US))
        })
    }

    /// Whether `x`'s node claimed `x`'s attempt again after `since` and by `x`'s start —
    /// with a refund the attempt number comes back, and the next claim may be the same
    /// node's. Needs two claims journaled (a claim's event may be received late, after a
    /// freeze, and must not vouch for itself).
    fn claimed_again(&self, x: &Execution, since: i64) -> bool {
        self.claims
            .get(&(x.job_id, x.attempt, x.node.clone()))
            .is_some_and(|ts| ts.len() >= 2 && ts.iter().any(|&t| t > since && t <= x.start()))
    }
}

/// Checks every job against the executions recorded for it. Nothing here trusts what a node
/// said about itself except through the tables and journals; each rule names the invariant
/// it proves.
///
/// Accounting, from the job row alone: every claim increments `version` and so does every
/// end of a claim (finalization, reclaim, give-back), and enqueue sets it to 1, so a terminal
/// job was claimed `C = (version − 1) / 2` times. `attempts` counts claims too, except that a
/// claim can give its attempt back — at graceful shutdown, when a sweeper finds its start was
/// never recorded (`not_started`), or when its node drops it from the prefetch because its
/// lease may be gone — and the next claim reuses the number; so `C − attempts` claims were
/// given back.
///
/// Why executions can be fewer than attempts, and how strict the check can be: a claim is
/// one committed statement, and the handler's start is recorded later — after the node got
/// the answer and, with prefetch, after the job waited for a free worker. A node killed,
/// frozen, fenced or shut down in between, or one that never got the claim's answer because
/// the server went down mid-reply, leaves a claim with no execution. Such a claim must end
/// in a give-back (attempt returned: at shutdown, a `not_started` refund or a drop) — never
/// in a counted failure, which is only for attempts that started. So `attempts ==
/// executions` is false for honest runs, and `attempts >= executions` alone is too weak (it
/// would accept an execution under a claim that was never made). The exact rules: the final
/// attempt of a job that succeeded has an execution, and it wrote the result; every other
/// attempt ended in exactly one counted failure, recorded once and in order in `errors`
/// (refunds in between repeat the number that comes next); no execution has an attempt
/// number above `attempts`; there are no more executions than claims; and executions
/// sharing an attempt number are explained by give-backs (at most one extra per give-back).
///
/// The lease rules, from the errors' holders (`detail.owner`; any node where an error names
/// none) and the executions' starts as the runtime stamped them:
/// * every counted failure (`timeout`, `lease_expired`, `fenced`) follows an execution of
///   that attempt that started on the node that held it, after that node's previous claim of
///   the number ended (the refunds' `not_started` are exempt: that is what they are for; so
///   is a `lease_expired` once the job's refunds reached its `max_attempts` — past that bound
///   a loss before any recorded start counts, or a job that kills its node at start would be
///   refunded for ever);
/// * every `timeout` follows such an execution that started at least the job's timeout
///   (less [`TIMEOUT_SLACK_US`]) before the timeout was recorded — a job's timeout counts
///   from its start, never from its claim;
/// * no execution started after a sweeper had taken its attempt from its node, unless the
///   node claimed the (refunded) number again in between: a node must check its lease
///   before it starts a handler, and a node that was frozen must not start what it lost.
///
/// Freezes: a handler that was running when its node froze cannot stop while frozen, so its
/// running past its lease or into a later execution is excused if it stopped within
/// [`PAUSE_TAIL_US`] of its node being continued — and only then. Starting is never excused.
fn check(
    jobs: &[JobFacts],
    execs: &[Execution],
    nodes: &[NodeRow],
    freezes: &[FreezeRow],
    claims: &Claims,
) -> Verdict {
    let mut v = Verdict::default();
    let mut world = World {
        gone: nodes
            .iter()
            .map(|n| (n.node.as_str(), n.gone_at_us))
            .collect(),
        freezes: HashMap::new(),
        claims,
    };
    for f in freezes {
        world
            .freezes
            .entry(f.node.as_str())
            .or_default()
            .push((f.frozen_at_us, f.resumed_at_us));
    }
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
        check_job(job, &list, &world, &mut v);
    }
    v
}

fn check_job(job: &JobFacts, list: &[&Execution], w: &World<'_>, v: &mut Verdict) {
    let id = job.id;
    let kind = job.kind.as_str();
    let mix = kind != CRASHY;
    let bad = &mut v.violations;
    // Invariant 2: exactly one terminal state. For the quick jobs that must be success — a
    // handler that never fails, with 100 attempts allowed, has no other honest outcome. A
    // mix job may also be dead, having used up its few attempts on timeouts and lost leases
    // (the rules below say which of those count).
    match job.state {
        JobState::Succeeded => v.stats.succeeded += 1,
        JobState::Dead if mix => v.stats.dead += 1,
        _ => {
            bad.push(format!(
                "job {id} ({kind}) is {} after the run (attempts {}, last error {:?})",
                job.state, job.attempts, job.last_error
            ));
            return;
        }
    }
    let succeeded = job.state == JobState::Succeeded;
    if job.lease_held || job.finished_at_us.is_none() || job.last_error.is_some() == succeeded {
        bad.push(format!(
            "job {id} is {} but lease held {}, finished_at {:?}, last_error {:?}",
            job.state, job.lease_held, job.finished_at_us, job.last_error
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

    // Invariant 3 and invariant 1's "no stale write applied": every attempt but a successful
    // last one ended in exactly one counted failure, recorded once, in order; a refund
    // (`not_started`) repeats the number the next counted failure or the success will carry.
    // A zombie's refused finalization would show up here as a second entry or another code.
    let allowed: &[&str] = if mix {
        &["lease_expired", "fenced", "timeout"]
    } else {
        &["lease_expired", "fenced"]
    };
    let mut counted = 0i64;
    for (i, e) in job.errors.iter().enumerate() {
        let refund = e.code == "not_started";
        let expected = counted + 1;
        if i64::from(e.attempt) != expected
            || e.at.is_none()
            || !(refund || allowed.contains(&e.code.as_str()))
        {
            bad.push(format!(
                "job {id} ({kind}): error #{} is attempt {} code {} ({}); expected attempt \
                 {expected}, code not_started or one of {allowed:?}",
                i + 1,
                e.attempt,
                e.code,
                e.message,
            ));
        }
        match e.code.as_str() {
            "not_started" => v.stats.refunds += 1,
            "lease_expired" => v.stats.reclaims += 1,
            "fenced" => v.stats.fenced += 1,
            "timeout" => v.stats.timeouts += 1,
            _ => {}
        }
        if !refund {
            counted += 1;
        }
    }
    let want = if succeeded { a - 1 } else { a };
    if counted != want {
        bad.push(format!(
            "job {id} ({kind}, {}): {counted} counted errors for {a} attempts: {:?}",
            job.state, job.errors
        ));
    }
    if !succeeded && a < i64::from(job.max_attempts) {
        bad.push(format!(
            "job {id} ({kind}) is dead after {a} of its {} attempts",
            job.max_attempts
        ));
    }

    // Invariant 1: the outcome was written by the holder of the last lease — the last
    // execution of the final attempt, which completed, and whose node and attempt the
    // result names.
    let result_attempt = job.result_attempt();
    let mut last = None;
    if succeeded {
        if result_attempt != Some(a) {
            bad.push(format!(
                "job {id}: result {:?} is not from its final attempt {a}",
                job.result
            ));
        }
        last = list.iter().rev().find(|e| i64::from(e.attempt) == a);
        match last {
            None => bad.push(format!("job {id}: no execution of its final attempt {a}")),
            Some(e) => {
                if e.completed != 1 || !job.written_by(e) {
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
    } else if job.result.is_some() {
        bad.push(format!("job {id} is dead with a result {:?}", job.result));
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
    // by 2 s, and a live node fences its handler before that — unless it is frozen, which
    // the freeze rule (see `check`) allows for.
    let mut ends = Vec::with_capacity(list.len());
    for e in list {
        let end = match (e.ended_at_us, w.gone.get(e.node.as_str())) {
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

    // Invariant 1, in time: an execution whose claim a sweeper took stopped before it was
    // taken (self-fencing stops it before its lease can expire, and a reclaim needs an
    // expired lease), and none ran past the job's finish. A claim its own node ended (its
    // timeout, a fence) is written only once the handler stopped; the overlap rule covers
    // those. Database stamps are compared with a millisecond of slack (SQLite's resolution).
    let finished = job.finished_at_us.unwrap_or(i64::MAX);
    for (x, end) in list.iter().zip(&ends) {
        let Some(end) = *end else { continue };
        let claim_end = job
            .errors
            .iter()
            .filter(|e| same_claim(e, x) && at_us(e) >= x.start() - DB_CLOCK_SLACK_US)
            .min_by_key(|e| at_us(e));
        let (limit, what) = match claim_end {
            Some(e) if taken_by_sweeper(e) => (at_us(e), "its claim was taken"),
            Some(_) => continue,
            None => (finished, "the job finished"),
        };
        if end > limit + DB_CLOCK_SLACK_US {
            if w.paused_tail(x, end, limit) {
                v.stats.paused_tails += 1;
                continue;
            }
            v.stats.late_ends += 1;
            bad.push(format!(
                "job {id}: execution {x:?} ran until {end}, {} µs after {what} at {limit}",
                end - limit
            ));
        }
    }

    // Invariant 1, directly: no two executions of the job overlapped. Sorted by start, each
    // must start after every earlier one ended (or was paused, see `check`).
    let mut overlapped = false;
    for (i, x) in list.iter().enumerate() {
        for (p, pend) in list[..i].iter().zip(&ends[..i]) {
            let pend = pend.unwrap_or(i64::MAX);
            if x.started_at_us >= pend {
                continue;
            }
            if w.paused_tail(p, pend, x.started_at_us) {
                v.stats.paused_tails += 1;
                continue;
            }
            v.stats.overlaps += 1;
            overlapped = true;
            bad.push(format!(
                "job {id}: {x:?} started {} µs before {p:?} ended (at {pend})",
                pend - x.started_at_us
            ));
        }
    }
    if overlapped {
        v.stats.duplicates += 1;
    }

    // The lease rules (see `check`). First: a counted failure needs an execution of its
    // attempt on its holder, started in that holder's claim (after its previous claim of the
    // number ended) and before the failure was recorded; a timeout needs one that ran for
    // the job's timeout.
    for (i, e) in job.errors.iter().enumerate() {
        if e.code == "not_started" {
            continue;
        }
        let at = at_us(e);
        let since = job.errors[..i]
            .iter()
            .filter(|p| p.attempt == e.attempt && (owner(e).is_none() || owner(p) == owner(e)))
            .map(at_us)
            .max()
            .unwrap_or(i64::MIN);
        let runs: Vec<&&Execution> = list
            .iter()
            .filter(|x| {
                same_claim(e, x) && x.start() > since && x.start() <= at + DB_CLOCK_SLACK_US
            })
            .collect();
        let refunds_before = job.errors[..i]
            .iter()
            .filter(|p| p.code == "not_started")
            .count();
        if runs.is_empty()
            && e.code == "lease_expired"
            && refunds_before >= usize::try_from(job.max_attempts).unwrap()
        {
            v.stats.refunds_exhausted += 1;
        } else if runs.is_empty() {
            v.stats.failed_without_execution += 1;
            *v.stats
                .unexecuted_by_code
                .entry(e.code.clone())
                .or_default() += 1;
            bad.push(format!(
                "[failed without execution] job {id} ({kind}, {}): {} of attempt {} (holder {}) recorded at {at} but no \
                 execution of that attempt started on its holder before: {e:?}",
                job.state,
                e.code,
                e.attempt,
                owner(e).unwrap_or("not named"),
            ));
        } else if e.code == "timeout"
            && !runs
                .iter()
                .any(|x| at >= x.start().saturating_add(job.timeout_us) - TIMEOUT_SLACK_US)
        {
            v.stats.early_timeouts += 1;
            let ran: Vec<i64> = runs.iter().map(|x| at - x.start()).collect();
            bad.push(format!(
                "[early timeout] job {id} ({kind}): timeout of attempt {} recorded at {at}, when its \
                 executions had run {ran:?} µs of the job's {} µs timeout: {e:?}",
                e.attempt, job.timeout_us
            ));
        }
    }
    // Second: no execution started after a sweeper took its claim, unless its node claimed
    // the (refunded) attempt number again in between — seen in its journal (a second claim
    // of the number after the take), or in the job's row when the start was recorded (it was
    // running on that node with that attempt: a fresh claim, for the first one's answer
    // may never have been journaled).
    for x in list {
        for e in job
            .errors
            .iter()
            .filter(|e| taken_by_sweeper(e) && same_claim(e, x))
        {
            let at = at_us(e);
            if x.start() <= at + DB_CLOCK_SLACK_US
                || (e.code == "not_started" && owner(e).is_none())
                || w.claimed_again(x, at)
                || x.held == Some(1)
            {
                continue;
            }
            v.stats.started_without_lease += 1;
            bad.push(format!(
                "[started without lease] job {id} ({kind}): {x:?} started {} µs after its claim \
                 was taken ({} at {at})",
                x.start() - at,
                e.code
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checks, checked: each rule catches the fault it is there for.

#[cfg(test)]
mod checker {
    use super::*;
    use crate::harness::{CRASHY_TIMEOUT, MAX_ATTEMPTS};
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
            kind: CRASHY.into(),
            state: JobState::Succeeded,
            attempts,
            max_attempts: MAX_ATTEMPTS,
            timeout_us: i64::try_from(CRASHY_TIMEOUT.as_micros()).unwrap(),
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
            claim: String::new(),
            node: node.into(),
            started_at_us: start,
            runtime_started_at_us: None,
            ended_at_us: end,
            completed: i16::from(completed),
            held: None,
        }
    }

    /// The checks with no freezes and no journaled claims.
    fn check(jobs: &[JobFacts], execs: &[Execution], nodes: &[NodeRow]) -> Verdict {
        super::check(jobs, execs, nodes, &[], &Claims::new())
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
            down_at_us: T0 - 3_000_000,
            up_at_us: T0,
            survivors: vec!["a".into(), "b".into()],
        };
        let after = |node: &str, i: i64| Execution {
            job_id: i,
            attempt: 1,
            claim: format!("{i:016x}"),
            node: node.into(),
            started_at_us: T0 + 1 + i,
            runtime_started_at_us: None,
            ended_at_us: Some(T0 + 100 + i),
            completed: 1,
            held: None,
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
                claim: "00000000000000c1".into(),
                started_at_us: T0,
                runtime_started_at_us: None,
            },
            JournalLine::Start {
                job_id: 7,
                attempt: 2,
                claim: "00000000000000c1".into(),
                started_at_us: T0,
                runtime_started_at_us: Some(T0 - 40),
            },
            JournalLine::End {
                job_id: 7,
                attempt: 2,
                claim: "00000000000000c1".into(),
                started_at_us: T0,
                ended_at_us: T0 + 5,
                returned: false,
            },
            JournalLine::Claim {
                job_id: 7,
                attempt: 2,
                at_us: T0 - 90,
            },
            JournalLine::Event {
                what: "lease_lost".into(),
                n: 7,
            },
            JournalLine::At {
                at_us: T0,
                what: "claimed".into(),
                a: 7,
                b: 2,
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
        assert!("end\t7\t2\t5\tdropped".parse::<JournalLine>().is_err());
    }

    // The lease rules and the freeze rule.

    fn failure(code: &str, attempt: u32, t: i64, holder: Option<&str>) -> JobFailure {
        let e = JobFailure::new(code, format!("{code} (test)"), attempt).at(at(t));
        match holder {
            Some(n) => e.with_detail(json!({ "owner": n })),
            None => e,
        }
    }

    /// A job of the mix (`kind`, timeout `timeout_ms`, `max_attempts`) that ended `state`
    /// on `attempts` attempts after `claims` claims with these errors; if it succeeded, `node`
    /// wrote the result.
    #[allow(clippy::too_many_arguments)]
    fn mix_job(
        kind: &str,
        timeout_ms: i64,
        max_attempts: u32,
        state: JobState,
        attempts: u32,
        claims: i64,
        errors: Vec<JobFailure>,
        finished: i64,
        node: &str,
    ) -> JobFacts {
        let succeeded = state == JobState::Succeeded;
        JobFacts {
            id: JobId(1),
            kind: kind.into(),
            state,
            attempts,
            max_attempts,
            timeout_us: timeout_ms * 1_000,
            version: 1 + 2 * claims,
            last_error: if succeeded {
                None
            } else {
                errors.last().cloned()
            },
            errors,
            result: succeeded.then(|| json!({"node": node, "attempt": attempts})),
            lease_held: false,
            finished_at_us: Some(finished),
        }
    }

    /// An execution whose runtime start (what the lease rules read) is 100 µs before the
    /// handler's entry.
    fn run_exec(attempt: i32, node: &str, start: i64, end: i64, completed: bool) -> Execution {
        Execution {
            runtime_started_at_us: Some(start - 100),
            ..exec(attempt, node, start, Some(end), completed)
        }
    }

    fn all_nodes() -> Vec<NodeRow> {
        ["a", "b", "c"]
            .into_iter()
            .map(|n| node(n, T0 + 20_000_000, "stopped"))
            .collect()
    }

    fn freeze(node: &str, from: i64, to: i64) -> FreezeRow {
        FreezeRow {
            node: node.into(),
            signalled_at_us: from,
            frozen_at_us: from,
            resumed_at_us: to,
        }
    }

    #[test]
    fn a_timeout_of_a_job_that_never_started_is_caught() {
        // Defect 1: a short job waits in a's prefetch behind long ones and is "timed out" at
        // claim + lease + timeout without ever starting; its second attempt runs on b for
        // real and really times out. Dead after its two attempts.
        let j = mix_job(
            "short",
            500,
            2,
            JobState::Dead,
            2,
            2,
            vec![
                failure("timeout", 1, T0 + 2_500_000, Some("a")),
                failure("timeout", 2, T0 + 3_600_000, Some("b")),
            ],
            T0 + 3_600_000,
            "",
        );
        let e = [run_exec(2, "b", T0 + 3_000_000, T0 + 3_550_000, false)];
        let v = super::check(
            std::slice::from_ref(&j),
            &e,
            &all_nodes(),
            &[],
            &Claims::new(),
        );
        assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert_eq!((v.stats.dead, v.stats.timeouts), (1, 2));

        // An execution of attempt 1 on another node than its holder does not count.
        let e2 = [
            run_exec(1, "c", T0, T0 + 600_000, false),
            run_exec(2, "b", T0 + 3_000_000, T0 + 3_550_000, false),
        ];
        let v = super::check(
            std::slice::from_ref(&j),
            &e2,
            &all_nodes(),
            &[],
            &Claims::new(),
        );
        assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);

        // Where the error names no holder (older code), any node's execution counts.
        let mut anon = j;
        for e in &mut anon.errors {
            e.detail = None;
        }
        let v = super::check(&[anon], &e2, &all_nodes(), &[], &Claims::new());
        assert_eq!(v.violations, Vec::<String>::new());
    }

    #[test]
    fn lost_leases_and_fences_of_attempts_that_never_started_are_caught() {
        // A quick job: attempt 1's lease expired on a and attempt 2 was fenced, but neither
        // ever started; attempt 3 succeeded on c.
        let mut j = job(3, &[], T0 + 5_100_000, "c");
        j.errors = vec![
            failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
            failure("fenced", 2, T0 + 4_000_000, None),
        ];
        let e = [run_exec(3, "c", T0 + 5_000_000, T0 + 5_050_000, true)];
        let v = check(std::slice::from_ref(&j), &e, &all_nodes());
        assert_eq!(v.stats.failed_without_execution, 2, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
        assert_eq!((v.stats.reclaims, v.stats.fenced), (1, 1));

        // With both attempts started, it passes.
        let e = [
            run_exec(1, "a", T0, T0 + 10_000, false),
            run_exec(2, "b", T0 + 3_500_000, T0 + 3_900_000, false),
            run_exec(3, "c", T0 + 5_000_000, T0 + 5_050_000, true),
        ];
        let v = check(&[j], &e, &all_nodes());
        assert_eq!(v.violations, Vec::<String>::new());
    }

    #[test]
    fn a_timeout_before_the_job_ran_its_timeout_is_caught() {
        // A tight job (timeout 1 s) started at +2 s after waiting in the prefetch; the
        // timeout came at +2.5 s: counted from the claim, not from the start.
        let early = mix_job(
            "tight",
            1_000,
            3,
            JobState::Succeeded,
            2,
            2,
            vec![failure("timeout", 1, T0 + 2_500_000, Some("a"))],
            T0 + 3_100_000,
            "b",
        );
        let e = [
            run_exec(1, "a", T0 + 2_000_000, T0 + 2_400_000, false),
            run_exec(2, "b", T0 + 3_000_000, T0 + 3_050_000, true),
        ];
        let v = check(std::slice::from_ref(&early), &e, &all_nodes());
        assert_eq!(v.stats.early_timeouts, 1, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);

        // Recorded a full second after the runtime started it: an honest timeout.
        let mut honest = early;
        honest.errors[0] = failure("timeout", 1, T0 + 2_000_000 - 100 + 1_000_000, Some("a"));
        let v = check(&[honest], &e, &all_nodes());
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(v.stats.timeouts, 1);
    }

    #[test]
    fn a_start_after_the_claim_was_taken_is_caught() {
        // Defect 2: a was frozen holding attempt 1 in its prefetch; a sweeper took it at +3 s
        // (never started: refunded); on waking at +4 s a started it anyway. b then ran the
        // refunded attempt 1 and succeeded.
        let j = mix_job(
            "short",
            500,
            2,
            JobState::Succeeded,
            1,
            2,
            vec![failure("not_started", 1, T0 + 3_000_000, Some("a"))],
            T0 + 5_100_000,
            "b",
        );
        let e = [
            run_exec(1, "a", T0 + 4_000_000, T0 + 4_001_000, false),
            run_exec(1, "b", T0 + 5_000_000, T0 + 5_050_000, true),
        ];
        let freezes = [freeze("a", T0 + 500_000, T0 + 4_000_000)];
        let v = super::check(
            std::slice::from_ref(&j),
            &e,
            &all_nodes(),
            &freezes,
            &Claims::new(),
        );
        assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert_eq!(v.stats.refunds, 1);

        // Had a claimed the refunded attempt again after the reclaim, its start is fine.
        let claims: Claims = [((1, 1, "a".to_string()), vec![T0, T0 + 3_900_000])]
            .into_iter()
            .collect();
        let v = super::check(&[j], &e, &all_nodes(), &freezes, &claims);
        assert_eq!(v.violations, Vec::<String>::new());

        // Older code: the reclaim names no holder and counts the attempt; a zombie start of
        // attempt 1 on any node is caught (and the failure has no execution before it).
        let mut old = job(2, &[T0 + 3_000_000], T0 + 5_100_000, "b");
        old.kind = "short".into();
        old.timeout_us = 500_000;
        let e = [
            run_exec(1, "a", T0 + 4_000_000, T0 + 4_001_000, false),
            run_exec(2, "b", T0 + 5_000_000, T0 + 5_050_000, true),
        ];
        let v = super::check(&[old], &e, &all_nodes(), &freezes, &Claims::new());
        assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
        assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
    }

    const C1: &str = "00000000000000c1";
    const C2: &str = "00000000000000c2";

    /// `x` run under claim `claim`.
    fn under(claim: &str, x: Execution) -> Execution {
        Execution {
            claim: claim.into(),
            ..x
        }
    }

    /// `e` written for claim `claim`.
    fn of_claim(claim: &str, mut e: JobFailure) -> JobFailure {
        e.claim = Some(claim.parse().unwrap());
        e
    }

    #[test]
    fn two_claims_of_one_attempt_are_told_apart_by_their_ids() {
        // a started attempt 1 under claim c1 while the database was down (only its journal
        // knew), was fenced at +1 s, and a sweeper refunded c1 at +3 s (`not_started`); a
        // claimed attempt 1 afresh (c2) and ran it from +4 s to success. Neither the row
        // (`held` unknown: folded from the journal) nor the journal's claim lines vouch for
        // c2: only its claim id says it is not c1.
        let mut j = mix_job(
            "short",
            500,
            2,
            JobState::Succeeded,
            1,
            2,
            vec![of_claim(
                C1,
                failure("not_started", 1, T0 + 3_000_000, Some("a")),
            )],
            T0 + 5_100_000,
            "a",
        );
        j.result = Some(json!({ "node": "a", "attempt": 1, "claim": C2 }));
        let e = [
            under(C1, run_exec(1, "a", T0, T0 + 1_000_000, false)),
            under(C2, run_exec(1, "a", T0 + 4_000_000, T0 + 5_000_000, true)),
        ];
        let v = check(std::slice::from_ref(&j), &e, &all_nodes());
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!((v.stats.refunds, v.stats.give_backs), (1, 1));
        // Keyed by attempt (no claim ids), c2's start is c1's taken lease started anyway.
        let blind: Vec<Execution> = e.iter().map(|x| under("", x.clone())).collect();
        let v = check(std::slice::from_ref(&j), &blind, &all_nodes());
        assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
        // And the result must name the claim that completed, not only its attempt and node.
        j.result = Some(json!({ "node": "a", "attempt": 1, "claim": C1 }));
        let v = check(&[j], &e, &all_nodes());
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(v.violations[0].contains("result"), "{:?}", v.violations);
    }

    #[test]
    fn an_error_of_a_claim_that_never_ran_on_its_node_is_caught() {
        // a ran attempt 1 under claim c1; the lease_expired entry of attempt 1, holder a,
        // names claim c2, which never ran there: a counted failure without an execution.
        let j = mix_job(
            "short",
            500,
            2,
            JobState::Succeeded,
            2,
            2,
            vec![of_claim(
                C2,
                failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
            )],
            T0 + 5_100_000,
            "b",
        );
        let e = [
            under(C1, run_exec(1, "a", T0, T0 + 1_000_000, false)),
            run_exec(2, "b", T0 + 4_000_000, T0 + 5_000_000, true),
        ];
        let v = check(std::slice::from_ref(&j), &e, &all_nodes());
        assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        // Keyed by attempt and holder, c1's execution would have vouched for it.
        let mut blind = j;
        blind.errors[0].claim = None;
        let v = check(&[blind], &e, &all_nodes());
        assert_eq!(v.violations, Vec::<String>::new());
    }

    #[test]
    fn a_fresh_claim_after_an_unjournaled_one_is_cleared_by_the_row() {
        // a's first claim of attempt 1 was never journaled (a froze before it heard the
        // answer); a sweeper refunded it at +3 s; a claimed attempt 1 afresh at +3.9 s (its
        // only journaled claim) and ran it. The row showed the lease held at the start.
        let j = mix_job(
            "short",
            500,
            2,
            JobState::Succeeded,
            1,
            2,
            vec![failure("not_started", 1, T0 + 3_000_000, Some("a"))],
            T0 + 4_100_000,
            "a",
        );
        let claims: Claims = [((1, 1, "a".to_string()), vec![T0 + 3_900_000])]
            .into_iter()
            .collect();
        let held = |h: Option<i16>| {
            [Execution {
                held: h,
                ..run_exec(1, "a", T0 + 4_000_000, T0 + 4_050_000, true)
            }]
        };
        let freezes = [freeze("a", T0 + 500_000, T0 + 2_900_000)];
        let v = super::check(
            std::slice::from_ref(&j),
            &held(Some(1)),
            &all_nodes(),
            &freezes,
            &claims,
        );
        assert_eq!(v.violations, Vec::<String>::new());
        // The same start with the row not held (taken, or held by another node), or unknown,
        // is a start without a lease: one journaled claim after the take may be the late
        // answer of the claim that was taken.
        for h in [Some(0), None] {
            let v = super::check(
                std::slice::from_ref(&j),
                &held(h),
                &all_nodes(),
                &freezes,
                &claims,
            );
            assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
        }
    }

    #[test]
    fn refunds_are_counted_not_flagged() {
        // Attempt 1 was claimed by a and refunded (never started), then claimed by b, started
        // and lost when b died; attempt 2 succeeded on c. Three claims, one given back.
        let mut j = job(2, &[], T0 + 6_700_000, "c");
        j.version = 7;
        j.errors = vec![
            failure("not_started", 1, T0 + 3_000_000, Some("a")),
            failure("lease_expired", 1, T0 + 6_000_000, Some("b")),
        ];
        let nodes = vec![
            node("a", T0 + 9_000_000, "stopped"),
            node("b", T0 + 4_000_000, "killed"),
            node("c", T0 + 9_000_000, "stopped"),
        ];
        let e = [
            exec(1, "b", T0 + 3_500_000, None, false),
            run_exec(2, "c", T0 + 6_500_000, T0 + 6_600_000, true),
        ];
        let v = check(std::slice::from_ref(&j), &e, &nodes);
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(
            (v.stats.refunds, v.stats.reclaims, v.stats.give_backs),
            (1, 1, 1)
        );

        // A refund must carry the number the next claim reuses.
        j.errors[0].attempt = 2;
        let v = check(&[j], &e, &nodes);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_loss_before_any_start_counts_once_the_refunds_are_used_up() {
        // A short job (2 attempts) was refunded twice, then lost a third time before any start
        // was recorded: that loss counts (the poison-pill bound), and its second attempt ran
        // and succeeded on c.
        let errors = vec![
            failure("not_started", 1, T0 + 3_000_000, Some("a")),
            failure("not_started", 1, T0 + 6_000_000, Some("b")),
            failure("lease_expired", 1, T0 + 9_000_000, Some("a")),
        ];
        let j = mix_job(
            "short",
            300,
            2,
            JobState::Succeeded,
            2,
            4,
            errors,
            T0 + 9_600_000,
            "c",
        );
        let e = [run_exec(2, "c", T0 + 9_500_000, T0 + 9_510_000, true)];
        let v = check(std::slice::from_ref(&j), &e, &all_nodes());
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!((v.stats.refunds, v.stats.refunds_exhausted), (2, 1));

        // With a refund left, the same loss is a failure without an execution.
        let mut early = j;
        early.max_attempts = 3;
        let v = check(&[early], &e, &all_nodes());
        assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
    }

    #[test]
    fn a_frozen_handler_may_only_finish_its_step_on_waking() {
        // a froze at +0.5 s with attempt 1 running; its lease was taken at +2.5 s and b ran
        // attempt 2 at +2.6 s. a woke at +4 s and stopped its handler 0.2 s later: excused.
        let j = job(2, &[T0 + 2_500_000], T0 + 2_800_000, "b");
        let freezes = [freeze("a", T0 + 500_000, T0 + 4_000_000)];
        let e = [
            run_exec(1, "a", T0, T0 + 4_200_000, false),
            run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
        ];
        let v = super::check(
            std::slice::from_ref(&j),
            &e,
            &all_nodes(),
            &freezes,
            &Claims::new(),
        );
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(
            v.stats.paused_tails, 2,
            "late end and overlap, both excused"
        );

        // Running on for 2 s after waking is not excused.
        let e = [
            run_exec(1, "a", T0, T0 + 6_000_000, false),
            run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
        ];
        let v = super::check(
            std::slice::from_ref(&j),
            &e,
            &all_nodes(),
            &freezes,
            &Claims::new(),
        );
        assert_eq!(
            (v.stats.late_ends, v.stats.overlaps),
            (1, 1),
            "{:?}",
            v.violations
        );

        // Nor is it without a freeze.
        let e = [
            run_exec(1, "a", T0, T0 + 4_200_000, false),
            run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
        ];
        let v = check(&[j], &e, &all_nodes());
        assert_eq!(
            (v.stats.late_ends, v.stats.overlaps),
            (1, 1),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_handler_started_while_the_stop_was_on_its_way_is_a_paused_tail() {
        // CI seed 1795473317025475, job 1648: SIGSTOP was sent to a at +0.5 s, a started
        // attempt 1 at +0.51 s (kill(2) had returned, the stop had not reached every thread
        // yet) and was seen stopped at +0.52 s. Its claim was taken at +4.9 s while it was
        // frozen; b ran attempt 2. a was continued at +5.4 s and stopped its handler 30 ms
        // later. The freeze counts from when a was seen stopped: excused.
        let j = job(2, &[T0 + 4_900_000], T0 + 5_100_000, "b");
        let e = [
            run_exec(1, "a", T0 + 510_000, T0 + 5_430_000, false),
            run_exec(2, "b", T0 + 5_000_000, T0 + 5_050_000, true),
        ];
        let seen_stopped = FreezeRow {
            signalled_at_us: T0 + 500_000,
            ..freeze("a", T0 + 520_000, T0 + 5_400_000)
        };
        assert_eq!(
            stop_lags(std::slice::from_ref(&seen_stopped), &e),
            (20_000, 1),
            "a stop 20 ms late, one start in it"
        );
        let v = super::check(
            std::slice::from_ref(&j),
            &e,
            &all_nodes(),
            &[seen_stopped],
            &Claims::new(),
        );
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(
            v.stats.paused_tails, 2,
            "late end and overlap, both excused"
        );

        // Counted from the signal instead (as the harness once recorded it), the handler
        // seems to have started during the freeze, and its paused run is reported: the
        // violation CI saw.
        let from_signal = freeze("a", T0 + 500_000, T0 + 5_400_000);
        let v = super::check(&[j], &e, &all_nodes(), &[from_signal], &Claims::new());
        assert_eq!(
            (v.stats.late_ends, v.stats.overlaps),
            (1, 1),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn a_violation_report_shows_the_freezes_outages_and_journal_of_its_job() {
        assert_eq!(
            job_named("[started without lease] job 12 (short): x"),
            Some(12)
        );
        assert_eq!(job_named("a job queue; job 7: late"), Some(7));
        assert_eq!(job_named("node n3 ran through the server restart"), None);

        let j = job(2, &[T0 + 4_900_000], T0 + 5_100_000, "b");
        let journals = Journals {
            nodes: [(
                "a".to_string(),
                NodeJournal {
                    lines: vec![
                        JournalLine::Claim {
                            job_id: 1,
                            attempt: 1,
                            at_us: T0 + 400_000,
                        },
                        JournalLine::Claim {
                            job_id: 2,
                            attempt: 1,
                            at_us: T0 + 450_000,
                        },
                        JournalLine::At {
                            at_us: T0 + 5_401_000,
                            what: "pause_detected".into(),
                            a: 4_800_000,
                            b: 0,
                        },
                        JournalLine::At {
                            at_us: T0 + 5_402_000,
                            what: "self_fenced".into(),
                            a: 1,
                            b: 0,
                        },
                    ],
                    ..NodeJournal::default()
                },
            )]
            .into_iter()
            .collect(),
            ..Journals::default()
        };
        let restarts = [Restart {
            down_at_us: T0 + 9_000_000,
            up_at_us: T0 + 12_000_000,
            survivors: vec![],
        }];
        let freezes = [FreezeRow {
            signalled_at_us: T0 + 500_000,
            ..freeze("a", T0 + 520_000, T0 + 5_400_000)
        }];
        let nodes = all_nodes();
        let evidence = Evidence {
            began_us: T0,
            restarts: &restarts,
            all_killed_at: &[],
            jobs: &[j],
            nodes: &nodes,
            freezes: &freezes,
            journals: &journals,
        };
        let text = evidence.explain("job 1: execution … ran until …");
        for want in [
            "server down: asked to stop at +9.000000 s",
            "job 1 (crashy): succeeded, attempts 2",
            "node a: spawned at",
            "SIGSTOP sent at +0.500000 s",
            "seen stopped at +0.520000 s",
            "continued at +5.400000 s",
            "journal +0.400000 s",
            "pause_detected 4800000 0",
            "self_fenced 1 0",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        assert!(
            !text.contains("claim 2 1"),
            "another job's line in:\n{text}"
        );
    }

    #[test]
    fn only_a_mix_job_may_die_and_only_of_its_attempts() {
        // A long job that lost its lease on all its attempts, each having started.
        let dead = mix_job(
            "long",
            60_000,
            2,
            JobState::Dead,
            2,
            2,
            vec![
                failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
                failure("lease_expired", 2, T0 + 7_000_000, Some("b")),
            ],
            T0 + 7_000_000,
            "",
        );
        let nodes = vec![
            node("a", T0 + 1_000_000, "killed"),
            node("b", T0 + 5_000_000, "killed"),
        ];
        let e = [
            exec(1, "a", T0, None, false),
            exec(2, "b", T0 + 3_500_000, None, false),
        ];
        let v = check(std::slice::from_ref(&dead), &e, &nodes);
        assert_eq!(v.violations, Vec::<String>::new());
        assert_eq!(v.stats.dead, 1);

        // Dead with attempts left, or a quick job dead at all: flagged.
        let mut early = dead.clone();
        early.max_attempts = 3;
        assert_eq!(check(&[early], &e, &nodes).violations.len(), 1);
        let mut quick = dead;
        quick.kind = CRASHY.into();
        assert_eq!(check(&[quick], &e, &nodes).violations.len(), 1);
    }
}
