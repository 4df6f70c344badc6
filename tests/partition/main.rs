//! The network-partition test (issue 16, item 4): three node processes
//! (`examples/crash_node/main.rs`), each in its own network namespace, reach a private database
//! server over their own veth pair. While jobs flow, one node's link is cut *silently* —
//! `ip link set <host end> down`: its TCP connections hang, nothing is reset — for longer
//! than the 6 s lease (15 s), later another node's for shorter (3 s); then each is healed.
//! Some jobs run for several seconds, so the cut node is in the middle of them.
//!
//! Afterwards the test checks, from the job table, the side table `crash_executions` (shared
//! with the crash test, `tests/harness/side.rs`) and the node journals, which carry a timeline
//! of claims, finalizations, renewals and fences (`JournalLine::At`):
//!
//! * **safety** (a violation fails the test): no two executions of one job overlapped; no
//!   late write was accepted — the result is a completed execution's, no handler failure was
//!   recorded (the handler fails only once it lost its lease), and no finalization succeeded
//!   for an attempt that a later claim had superseded; no handler started for a lease that
//!   was already gone (after its job was re-claimed, or after the execution whose result
//!   counts); every interrupted handler stopped before its job was re-claimed (the *fence
//!   margin*: re-claim − handler end, from the database's reclaim stamp or the next claim,
//!   whichever is first, is positive); every job succeeded.
//! * **the issue's goals** (asserted too; missing them fails the test after the report):
//!   after the heal the cut node claims again within 2 s (200 ms allowed for the poll
//!   tick's phase), and renews within 2 s of when a renewal was due (the heal if it held leases then, otherwise its first claim after the
//!   heal; 250 ms allowed for the renewal tick's phase and the statement's round trip); and
//!   the cut burns no attempt of a job that never started (an attempt number no execution
//!   ever had); and a cut shorter than the documented tolerance (`TOLERATED_CUT`, 3.5 s with
//!   this test's 6 s lease and 1 s renewals) re-runs no job.
//! * **reported**: per cut the worst fence margin, heal → first claim / renewal /
//!   finalization, re-runs caused by the cut (executions of a job after one on the cut node)
//!   and burnt attempts; per backend the worst of each.
//!
//! Nothing here touches the machine's shared database servers. Each run creates:
//! * namespaces `jvpart1..3`, veth pairs `jvph<i>` (host end, root namespace,
//!   `10.213.<i>.1/30`) / `jvpn<i>` (in the namespace, `10.213.<i>.2/30`) with fixed
//!   neighbour entries (so a cut is not reported to the node's sockets by a failed ARP:
//!   see `Net::pin_neighbours`), and a blackhole route for `10.213.0.0/16`, so that while a
//!   host end is down the server's answers to that node are dropped here instead of
//!   following the default route out of the machine;
//! * a private server under `/tmp/jobvisor-partition/` (`tests/harness/server.rs`):
//!   PostgreSQL (`initdb` from the newest `/usr/lib/postgresql/*/bin`, run as `postgres`,
//!   trust auth for `10.213.0.0/16`) or MariaDB (`mariadb-install-db`, `mariadbd` as
//!   `mysql`), on a free port, listening on 127.0.0.1 (the driver) and the three host ends
//!   (the nodes).
//!
//! All of it is stopped and removed when the test ends, passes or fails (guards with `Drop`;
//! a failed run keeps the server's directory, for its log, until the next run); what an
//! aborted run left behind is removed at the start of the next one. A lock file
//! (`/tmp/jobvisor-partition.lock`) keeps two runs on one machine from sharing the names.
//!
//! The tests are `#[ignore]`d (they need root, `ip` and the server binaries); `.ci/crash`
//! runs them, about 45 s per backend. As root:
//!
//! ```sh
//! cargo test --all-features --test partition -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Settings: `JOBVISOR_CRASH_NODE_BIN` (a prebuilt `crash_node`, as for the crash test) and
//! `JOBVISOR_CRASH_KEEP` (keep the node logs and journals of a passing run; a failing run
//! always keeps them, and the private server's directory until the next run).

#![allow(clippy::unwrap_used)]

#[path = "../harness/mod.rs"]
mod harness;

mod check;
#[cfg(test)]
mod checker;
mod net;

use check::*;
use net::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::testing::{EnqueueParams, StoreEngine as _};
use jobvisor::{Backend, JobFailure, JobId, JobState, NewJob, Store, StoreOptions};
use serde_json::json;

use harness::journal::{self, same_claim, JobFacts, NodeJournal};
use harness::ledger;
use harness::server::{is_root, stop_leftover, PrivateServer};
use harness::side::{now_us, Execution, NodeRow, SideDb};
use harness::{all_jobs, block_on, node_binary, retry, run_cmd, NodeProc, RunDir};

/// Node processes.
const NODES: usize = 3;
/// The queue the nodes work.
const QUEUE: &str = "partition";
/// The nodes' lease (the issue's setting) and renewal interval: renewals every second
/// rather than the issue's two, so that the short cut (3 s) is inside the documented
/// tolerance, [`TOLERATED_CUT`] (3.5 s; with 2 s renewals it would be 2 s).
const LEASE: Duration = Duration::from_secs(6);
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The longest cut that costs nothing whatever its phase (ARCHITECTURE.md §7.4): lease −
/// fence margin (a sixth of the lease) − renewal interval − hedge delay (half the interval,
/// at most 1 s), less the round trips of a renewal on a fresh connection. A cut shorter than
/// this must re-run no job.
const TOLERATED_CUT: Duration = LEASE
    .saturating_sub(Duration::from_secs(LEASE.as_secs() / 6))
    .saturating_sub(RENEW_EVERY)
    .saturating_sub(Duration::from_millis(500)); // the hedge delay of 1 s renewals
/// Worker slots per node.
const CONCURRENCY: u32 = 4;
/// Short jobs work a random 0..=this many ms.
const MAX_WORK_MS: u64 = 300;
/// Long jobs enqueued just before each cut, so that the cut node is running some.
const LONG_JOBS: usize = 6;
/// Long jobs are claimed before the short backlog (smaller runs first; the default is 10).
const LONG_PRIORITY: i16 = 0;
/// Attempts per job: enough that no job dies of this test's reclaims.
const MAX_ATTEMPTS: u32 = 100;
/// The driver keeps at least this many jobs not yet terminal, so a node that can claim
/// always finds work...
const BACKLOG_LOW: u64 = 40;
/// ...by enqueueing this many short jobs at a time.
const BACKLOG_BATCH: usize = 40;

/// One planned cut.
#[derive(Debug, Clone, Copy)]
struct CutPlan {
    /// How long the link stays down.
    down_for: Duration,
    /// How long the long jobs enqueued before it work.
    long_work: Duration,
}

/// The cuts, in order, each on a node not cut before: one longer than the lease, one
/// shorter than [`TOLERATED_CUT`].
const CUTS: [CutPlan; 2] = [
    CutPlan {
        down_for: Duration::from_secs(15),
        long_work: Duration::from_secs(10),
    },
    CutPlan {
        down_for: Duration::from_secs(3),
        long_work: Duration::from_secs(6),
    },
];

/// How long to wait for a long job to start on a node that may still be cut.
const LONG_WAIT: Duration = Duration::from_secs(8);
/// The cut comes this long after a long job started on the chosen node.
const LONG_RUN_BEFORE_CUT: Duration = Duration::from_secs(1);
/// After a heal, the run goes on until the cut node claimed and renewed again, plus this...
const RECOVERY_AFTER: Duration = Duration::from_secs(3);
/// ...but no longer than this after the heal.
const RECOVERY_MAX: Duration = Duration::from_secs(25);
/// After the last cut, every job must be terminal within this.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// Every node must have started a job this soon after being spawned.
const START_LIMIT: Duration = Duration::from_secs(90);
/// How long nodes get to shut down gracefully at the end.
const STOP_WITHIN: Duration = Duration::from_secs(30);
/// The driver's pace.
const TICK: Duration = Duration::from_millis(100);
/// The issue's target: claims and renewals resume within this of the heal.
const HEAL_TARGET: Duration = Duration::from_secs(2);
/// A renewal is due at a fixed tick: allowed past [`HEAL_TARGET`] for the tick's phase and
/// the statement's round trip.
const RENEWAL_SLACK: Duration = Duration::from_millis(250);
/// An idle node claims at its poll tick (every 200 ms here, `--poll-ms`): allowed past
/// [`HEAL_TARGET`] for the tick's phase.
const CLAIM_SLACK: Duration = Duration::from_millis(200);
/// Comparisons with a time the database stamped allow this much.
const DB_CLOCK_SLACK_US: i64 = 1_000;
/// The codes of the failures `crash_node`'s handler returns (`JobError::retry`'s default,
/// and its own for a side-table write it gave up on). The handler fails only when it was told
/// to stop — its lease lost or fenced — or could not record anything for 20 s, so such a
/// failure in a job's errors is a finalization from a node that no longer held the lease
/// (or a stalled node): either way a write that should have been refused. The failures the
/// library records itself (the sweeper's `lease_expired`, and whatever give-backs may
/// record) are counted by code in the report.
const HANDLER_CODES: &[&str] = &["error", "record"];
/// Re-runs and burnt attempts are put down to a cut when the interrupted execution started
/// at most this long before it...
const ATTRIBUTE_BEFORE: Duration = Duration::from_secs(20);
/// ...or at most this long after its heal.
const ATTRIBUTE_AFTER: Duration = Duration::from_secs(30);

/// The addresses of the veth pairs: `10.213.<i>.0/30`.
const SUBNET: &str = "10.213";
const NS_PREFIX: &str = "jvpart";
const HOST_IF_PREFIX: &str = "jvph";
const NS_IF_PREFIX: &str = "jvpn";
/// Private servers live under here (one directory per run).
const BASE_DIR: &str = "/tmp/jobvisor-partition";
/// Held for the whole run.
const LOCK_FILE: &str = "/tmp/jobvisor-partition.lock";

#[test]
#[ignore = "needs root, network namespaces and the PostgreSQL server binaries; run with .ci/crash"]
fn partition_postgres() {
    run_blocking(Backend::Postgres);
}

#[test]
#[ignore = "needs root, network namespaces and the MariaDB server binaries; run with .ci/crash"]
fn partition_mysql() {
    run_blocking(Backend::Mysql);
}

// ---------------------------------------------------------------------------------------------
// Node processes

/// The node processes; killed if still running when dropped.
#[derive(Debug)]
struct Fleet {
    dir: PathBuf,
    live: Vec<NodeProc>,
    gone: Vec<NodeRow>,
}

impl Fleet {
    fn journal(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.journal"))
    }

    fn log(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.log"))
    }

    /// Starts node `n<i+1>` in `link`'s namespace, on the database at `url`.
    fn spawn(&mut self, bin: &Path, link: &Link, i: usize, url: &str) {
        let name = format!("n{}", i + 1);
        let log = std::fs::File::create(self.log(&name)).unwrap();
        let ms = |d: Duration| d.as_millis().to_string();
        let child = Command::new("ip")
            .args(["netns", "exec", &link.ns])
            .arg(bin)
            .arg(url)
            .arg(&name)
            .arg("--journal")
            .arg(self.journal(&name))
            .args(["--queue", QUEUE])
            .args(["--concurrency", &CONCURRENCY.to_string()])
            .args(["--lease-ms", &ms(LEASE)])
            .args(["--renew-ms", &ms(RENEW_EVERY)])
            .args([
                "--sweep-ms",
                "1000",
                "--deadline-ms",
                "100",
                "--poll-ms",
                "200",
            ])
            .args(["--max-work-ms", &MAX_WORK_MS.to_string()])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} in {}: {e}", bin.display(), link.ns));
        self.live.push(NodeProc::new(name, child));
    }

    /// A node must not exit by itself while the run goes on.
    fn assert_all_running(&mut self) {
        for n in &mut self.live {
            n.assert_running(&self.dir);
        }
    }

    /// Asks every node to shut down gracefully and reaps them; a node that exits non-zero or
    /// does not stop within [`STOP_WITHIN`] is a problem (and is killed).
    async fn stop_all(&mut self, problems: &mut Vec<String>) {
        for n in &mut self.live {
            n.stdin.take();
        }
        let until = Instant::now() + STOP_WITHIN;
        while !self.live.is_empty() {
            let mut i = 0;
            while i < self.live.len() {
                let status = self.live[i].child.try_wait().unwrap();
                if status.is_none() && Instant::now() < until {
                    i += 1;
                    continue;
                }
                let mut n = self.live.swap_remove(i);
                let how = n.end_stop(status, &self.log(&n.name), STOP_WITHIN, problems);
                self.gone.push(n.gone(how));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for n in &mut self.live {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Journals

/// What one node journaled.
/// A node's journal, read while it runs (to time the cuts) and after (to check the run).
type Timeline = NodeJournal;

/// What the cut measurements read of a node's `at` lines.
impl NodeJournal {
    /// Jobs of `long` whose handler started and has not ended.
    fn running_of(&self, long: &HashSet<i64>) -> usize {
        self.starts
            .keys()
            .filter(|k| long.contains(&k.0) && !self.ends.contains_key(k))
            .count()
    }

    fn first_at(&self, from_us: i64, what: impl Fn(&str, i64) -> bool) -> Option<i64> {
        self.at
            .iter()
            .find(|(t, w, a, _)| *t >= from_us && what(w, *a))
            .map(|x| x.0)
    }

    fn first_claim_after(&self, t: i64) -> Option<i64> {
        self.first_at(t, |w, _| w == "claimed")
    }

    fn first_renewal_after(&self, t: i64) -> Option<i64> {
        self.first_at(t, |w, renewed| w == "renewed" && renewed > 0)
    }

    fn first_finalization_after(&self, t: i64) -> Option<i64> {
        self.first_at(t, |w, _| w.starts_with("finished_"))
    }

    /// Whether the node held a lease at `t`: it had claimed a job and not yet finalized it,
    /// fenced it or lost it.
    fn held_lease_at(&self, t: i64) -> bool {
        let mut held = HashSet::new();
        for (_, what, a, _) in self.at.iter().take_while(|x| x.0 <= t) {
            match what.as_str() {
                "claimed" => {
                    held.insert(*a);
                }
                "self_fenced" | "lease_lost" => {
                    held.remove(a);
                }
                w if w.starts_with("finished_") => {
                    held.remove(a);
                }
                _ => {}
            }
        }
        !held.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------
// The run

fn run_blocking(backend: Backend) {
    preflight(backend);
    let bin = node_binary();
    // Dropped in reverse: nodes killed (inside `drive`), then the server stopped, the network
    // removed and the lock released.
    let _lock = RunLock::acquire();
    clean_leftovers();
    let dir = RunDir::new(
        "partition",
        tempfile::Builder::new()
            .prefix("jobvisor-partition-")
            .tempdir()
            .unwrap(),
    );
    let net = Net::up();
    let server = PrivateServer::start(
        backend,
        "partition",
        Path::new(BASE_DIR),
        &net.host_ips(),
        Some(SUBNET),
    );
    block_on(drive(backend, &bin, &net, &server, dir.path()));
    drop(server);
    drop(net);
}

/// One cut as it happened.
#[derive(Debug, Clone)]
struct Cut {
    /// Index of the node (and its link).
    index: usize,
    node: String,
    down_for: Duration,
    cut_at_us: i64,
    heal_at_us: i64,
}

/// The driver's side of the run: the store over loopback, the nodes, the job flow.
struct Driver {
    store: Store,
    fleet: Fleet,
    next: usize,
    /// Keep the backlog topped up.
    topping: bool,
    /// Ids of the long jobs.
    long: HashSet<i64>,
}

impl Driver {
    async fn enqueue(&mut self, jobs: Vec<NewJob>) -> Vec<i64> {
        let n = jobs.len();
        let out = retry("enqueueing", || {
            self.store
                .job_enqueue_many(EnqueueParams::many(jobs.clone()))
        })
        .await;
        self.next += n;
        out.into_iter().map(|e| e.id.0).collect()
    }

    async fn enqueue_short(&mut self, n: usize) {
        let jobs = (self.next..self.next + n)
            .map(|i| {
                NewJob::new("crashy", json!({ "i": i }))
                    .queue(QUEUE)
                    .max_attempts(MAX_ATTEMPTS)
            })
            .collect();
        self.enqueue(jobs).await;
    }

    async fn enqueue_long(&mut self, n: usize, work: Duration) {
        let work_ms = u64::try_from(work.as_millis()).unwrap();
        let jobs = (self.next..self.next + n)
            .map(|i| {
                NewJob::new("crashy", json!({ "i": i, "work_ms": work_ms }))
                    .queue(QUEUE)
                    .priority(LONG_PRIORITY)
                    .max_attempts(MAX_ATTEMPTS)
            })
            .collect();
        let ids = self.enqueue(jobs).await;
        self.long.extend(ids);
    }

    /// Jobs not yet terminal.
    async fn open_jobs(&self) -> u64 {
        let counts = retry("counting jobs", || self.store.job_counts()).await;
        counts
            .iter()
            .filter(|c| !c.state.is_terminal())
            .map(|c| c.count)
            .sum()
    }

    async fn tick(&mut self) {
        tokio::time::sleep(TICK).await;
        self.fleet.assert_all_running();
        if self.topping && self.open_jobs().await < BACKLOG_LOW {
            self.enqueue_short(BACKLOG_BATCH).await;
        }
    }

    async fn pace(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.tick().await;
        }
    }

    /// Node `i`'s journal so far.
    fn timeline(&self, i: usize) -> Timeline {
        let name = format!("n{}", i + 1);
        NodeJournal::read(&self.fleet.journal(&name), true).unwrap_or_default()
    }
}

async fn drive(backend: Backend, bin: &Path, net: &Net, server: &PrivateServer, dir: &Path) {
    let began = Instant::now();
    let local = server.url("127.0.0.1");
    let store = Store::connect_with(&local, StoreOptions::default().migrate(true))
        .await
        .unwrap_or_else(|e| panic!("opening a store on the private {backend:?} server: {e}"));
    let side = SideDb::open(&local, 4).unwrap();
    side.create_tables().await.unwrap();
    eprintln!(
        "partition test [{backend:?}]: private server on port {}, journals and logs in {}",
        server.port,
        dir.display()
    );
    let mut d = Driver {
        store,
        fleet: Fleet {
            dir: dir.to_path_buf(),
            live: Vec::new(),
            gone: Vec::new(),
        },
        next: 0,
        topping: true,
        long: HashSet::new(),
    };
    d.enqueue_short(BACKLOG_BATCH * 2).await;
    for (i, link) in net.links.iter().enumerate() {
        d.fleet.spawn(bin, link, i, &server.url(&link.host_ip));
    }
    // Every node works before the first cut.
    let until = Instant::now() + START_LIMIT;
    while (0..NODES).any(|i| d.timeline(i).starts.is_empty()) {
        assert!(
            Instant::now() < until,
            "not every node started a job within {START_LIMIT:?}; logs in {}",
            dir.display()
        );
        d.tick().await;
    }
    d.pace(Duration::from_secs(2)).await;

    let mut cuts: Vec<Cut> = Vec::new();
    for plan in CUTS {
        let eligible: Vec<usize> = (0..NODES)
            .filter(|i| cuts.iter().all(|c| c.index != *i))
            .collect();
        d.enqueue_long(LONG_JOBS, plan.long_work).await;
        // Wait until a long job runs on a node that may be cut, then a little longer.
        let waited = Instant::now();
        let mut seen: Option<Instant> = None;
        while waited.elapsed() < LONG_WAIT && seen.is_none_or(|s| s.elapsed() < LONG_RUN_BEFORE_CUT)
        {
            d.tick().await;
            if seen.is_none()
                && eligible
                    .iter()
                    .any(|i| d.timeline(*i).running_of(&d.long) > 0)
            {
                seen = Some(Instant::now());
            }
        }
        let running: Vec<usize> = eligible
            .iter()
            .map(|i| d.timeline(*i).running_of(&d.long))
            .collect();
        let pick = (0..eligible.len())
            .max_by_key(|k| (running[*k], std::cmp::Reverse(*k)))
            .unwrap();
        let index = eligible[pick];
        let node = format!("n{}", index + 1);
        if running[pick] == 0 {
            eprintln!(
                "partition test [{backend:?}]: no long job runs on {eligible:?}; cutting {node} anyway"
            );
        }
        net.cut(index);
        let cut_at_us = now_us();
        eprintln!(
            "partition test [{backend:?}]: {node} cut for {:?} at +{:.1} s ({} long jobs running on it)",
            plan.down_for,
            began.elapsed().as_secs_f64(),
            running[pick]
        );
        d.pace(plan.down_for).await;
        net.heal(index);
        let heal_at_us = now_us();
        eprintln!(
            "partition test [{backend:?}]: {node} healed at +{:.1} s",
            began.elapsed().as_secs_f64()
        );
        // Let it show how it recovers.
        let healed = Instant::now();
        let mut recovered: Option<Instant> = None;
        while healed.elapsed() < RECOVERY_MAX
            && recovered.is_none_or(|r| r.elapsed() < RECOVERY_AFTER)
        {
            d.tick().await;
            if recovered.is_none() {
                let t = d.timeline(index);
                if t.first_claim_after(heal_at_us).is_some()
                    && t.first_renewal_after(heal_at_us).is_some()
                {
                    recovered = Some(Instant::now());
                }
            }
        }
        cuts.push(Cut {
            index,
            node,
            down_for: plan.down_for,
            cut_at_us,
            heal_at_us,
        });
    }

    // Drain: no more jobs; everything must end.
    d.topping = false;
    let drain = Instant::now();
    while d.open_jobs().await > 0 && drain.elapsed() < DRAIN_LIMIT {
        d.tick().await;
    }
    let run_took = began.elapsed();
    let mut problems = Vec::new();
    d.fleet.stop_all(&mut problems).await;
    for n in &d.fleet.gone {
        retry("recording a node", || side.insert_node(n)).await;
    }
    let mut timelines = BTreeMap::new();
    for n in &d.fleet.gone {
        match NodeJournal::read(&d.fleet.journal(&n.node), false) {
            Ok(t) => {
                if !t.exited && n.how == "stopped" {
                    problems.push(format!(
                        "node {} stopped without journaling its exit",
                        n.node
                    ));
                }
                timelines.insert(n.node.clone(), t);
            }
            Err(e) => problems.push(format!("journal of {}: {e}", n.node)),
        }
    }
    journal::fold(&side, &timelines, &mut problems).await;
    let jobs = all_jobs(&d.store, false).await;
    let archived = all_jobs(&d.store, true).await;
    let execs = retry("reading executions", || side.executions()).await;
    let nodes = retry("reading nodes", || side.nodes()).await;
    let facts: Vec<JobFacts> = jobs.iter().map(JobFacts::from).collect();
    let mut a = analyze(&facts, &execs, &nodes, &timelines, &cuts);
    a.violations.splice(0..0, problems);
    let ledgers = ledger::read_ledgers(&d.store, &facts).await;
    let (ledger_faults, ledger_stats) = ledger::cross_check(&facts, &ledgers, &execs);
    a.violations.extend(ledger_faults);
    if jobs.len() != d.next {
        a.violations.push(format!(
            "{} jobs enqueued but {} in the live table",
            d.next,
            jobs.len()
        ));
    }
    if !archived.is_empty() {
        a.violations
            .push(format!("{} jobs in the archive", archived.len()));
    }
    let report = a.report(backend);
    println!(
        "{report}\npartition test [{backend:?}]: ledger claims={} matched={} unjournaled={}; \
         run {:.1} s, total {:.1} s",
        ledger_stats.claims,
        ledger_stats.matched,
        ledger_stats.unjournaled,
        run_took.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    let goals = a.goals_missed();
    if !a.violations.is_empty() {
        let mut msg = format!(
            "{} SAFETY violation(s) on {backend:?} (logs and journals kept in {}):\n",
            a.violations.len(),
            dir.display()
        );
        for line in a.violations.iter().take(40) {
            let _ = writeln!(msg, "  - {line}");
        }
        for line in &goals {
            let _ = writeln!(msg, "  (goal) {line}");
        }
        panic!("{msg}");
    }
    assert!(
        goals.is_empty(),
        "issue 16 goals missed on {backend:?} (safety held; logs and journals kept in {}):\n  - {}",
        dir.display(),
        goals.join("\n  - ")
    );
}
