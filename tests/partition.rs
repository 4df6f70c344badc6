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
//! cargo test --features test-util --test partition -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Settings: `JOBVISOR_CRASH_NODE_BIN` (a prebuilt `crash_node`, as for the crash test) and
//! `JOBVISOR_CRASH_KEEP` (keep the node logs and journals of a passing run; a failing run
//! always keeps them, and the private server's directory until the next run).

#![allow(clippy::unwrap_used)]

mod harness;

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
// Host commands

/// Runs `ip` with a command line of words (no word here has spaces).
fn try_ip(command: &str) -> Result<String, String> {
    let args: Vec<&str> = command.split_whitespace().collect();
    run_cmd("ip", &args)
}

fn ip(command: &str) -> String {
    try_ip(command).unwrap_or_else(|e| panic!("partition test: {e}"))
}

/// Kills the processes left in one of this test's namespaces (by id).
fn kill_netns_pids(ns: &str) {
    if let Ok(pids) = try_ip(&format!("netns pids {ns}")) {
        for pid in pids.split_whitespace() {
            let _ = run_cmd("kill", &["-KILL", pid]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the machine must have

fn tool_answers(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails loudly, naming what is missing, unless the machine can run the test (the private
/// server checks its own programs: `harness::server::Programs::find`).
fn preflight(backend: Backend) {
    assert!(
        is_root(),
        "the partition test creates network namespaces and veth pairs: run it as root"
    );
    assert!(
        tool_answers("ip", "-V"),
        "the partition test needs the `ip` tool (package iproute2) to build its network"
    );
    assert!(backend != Backend::Sqlite, "SQLite has no network to cut");
}

// ---------------------------------------------------------------------------------------------
// One run at a time, and what an aborted run left behind

/// Held while a run uses the names and addresses above; another run waits for it.
#[derive(Debug)]
struct RunLock;

fn process_is_partition_test(pid: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("partition"))
}

impl RunLock {
    fn acquire() -> RunLock {
        let me = std::process::id().to_string();
        let until = Instant::now() + Duration::from_secs(600);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(LOCK_FILE)
            {
                Ok(mut f) => {
                    f.write_all(me.as_bytes()).unwrap();
                    return RunLock;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(LOCK_FILE).unwrap_or_default();
                    let holder = holder.trim();
                    if !holder.is_empty() && process_is_partition_test(holder) {
                        assert!(
                            Instant::now() < until,
                            "another partition test (pid {holder}) holds {LOCK_FILE}"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    } else {
                        // Its run ended without removing the lock.
                        let _ = std::fs::remove_file(LOCK_FILE);
                    }
                }
                Err(e) => panic!("creating {LOCK_FILE}: {e}"),
            }
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let holder = std::fs::read_to_string(LOCK_FILE).unwrap_or_default();
        if holder.trim() == std::process::id().to_string() {
            let _ = std::fs::remove_file(LOCK_FILE);
        }
    }
}

fn host_if(i: usize) -> String {
    format!("{HOST_IF_PREFIX}{i}")
}

fn subnet() -> String {
    format!("{SUBNET}.0.0/16")
}

/// Removes the namespaces, links, route and servers of a run that did not clean up (killed
/// or aborted). Called with the lock held, so nothing of theirs is in use.
fn clean_leftovers() {
    if let Ok(list) = try_ip("netns list") {
        for ns in list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(NS_PREFIX))
        {
            eprintln!("partition test: removing namespace {ns} left by an earlier run");
            kill_netns_pids(ns);
            let _ = try_ip(&format!("netns del {ns}"));
        }
    }
    for i in 1..=NODES {
        if try_ip(&format!("link del {}", host_if(i))).is_ok() {
            eprintln!(
                "partition test: removed link {} left by an earlier run",
                host_if(i)
            );
        }
    }
    let _ = try_ip(&format!("route del blackhole {}", subnet()));
    for dir in std::fs::read_dir(BASE_DIR)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
    {
        let dir = dir.path();
        eprintln!(
            "partition test: removing {} left by an earlier run",
            dir.display()
        );
        stop_leftover(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let addrs = ip("-4 -o addr show");
    assert!(
        !addrs.contains(&format!(" {SUBNET}.")),
        "{} is in use on this machine; the partition test needs it for its veth pairs:\n{addrs}",
        subnet()
    );
}

// ---------------------------------------------------------------------------------------------
// The network

/// One node's veth pair.
#[derive(Debug, Clone)]
struct Link {
    ns: String,
    host_if: String,
    ns_if: String,
    /// The host end's address: the node reaches the server here.
    host_ip: String,
    ns_ip: String,
}

/// The namespaces and links of this run; removed when dropped.
#[derive(Debug, Default)]
struct Net {
    links: Vec<Link>,
    blackhole: bool,
}

impl Net {
    fn up() -> Net {
        let mut net = Net::default();
        ip(&format!("route add blackhole {}", subnet()));
        net.blackhole = true;
        for i in 1..=NODES {
            let l = Link {
                ns: format!("{NS_PREFIX}{i}"),
                host_if: host_if(i),
                ns_if: format!("{NS_IF_PREFIX}{i}"),
                host_ip: format!("{SUBNET}.{i}.1"),
                ns_ip: format!("{SUBNET}.{i}.2"),
            };
            ip(&format!("netns add {}", l.ns));
            net.links.push(l.clone());
            let (ns, host_if, ns_if) = (&l.ns, &l.host_if, &l.ns_if);
            ip(&format!(
                "link add {host_if} type veth peer name {ns_if} netns {ns}"
            ));
            ip(&format!("addr add {}/30 dev {host_if}", l.host_ip));
            ip(&format!("link set {host_if} up"));
            ip(&format!("-n {ns} addr add {}/30 dev {ns_if}", l.ns_ip));
            ip(&format!("-n {ns} link set {ns_if} up"));
            ip(&format!("-n {ns} link set lo up"));
            net.pin_neighbours(&l);
        }
        net
    }

    /// Fixed neighbour entries on both ends. Without them the node's ARP for the server fails
    /// a few seconds into a cut, the kernel reports the host unreachable to the node's own
    /// sockets, and TCP then keeps retrying every few hundred ms (RFC 6069) instead of backing
    /// off — not the silent hang of a break beyond the first hop, which is what is tested.
    /// The node's end keeps its entry through a cut (it only loses carrier); the host end's,
    /// flushed when it goes down, is set again at the heal.
    fn pin_neighbours(&self, l: &Link) {
        let mac = |prefix: &str, dev: &str| {
            let out = ip(&format!("{prefix} -o link show dev {dev}"));
            let mut words = out.split_whitespace();
            words
                .find(|w| *w == "link/ether")
                .and_then(|_| words.next())
                .unwrap_or_else(|| panic!("no MAC address for {dev} in {out:?}"))
                .to_string()
        };
        let host_mac = mac("", &l.host_if);
        let ns_mac = mac(&format!("-n {}", l.ns), &l.ns_if);
        ip(&format!(
            "-n {} neigh replace {} lladdr {host_mac} dev {} nud permanent",
            l.ns, l.host_ip, l.ns_if
        ));
        ip(&format!(
            "neigh replace {} lladdr {ns_mac} dev {} nud permanent",
            l.ns_ip, l.host_if
        ));
    }

    fn host_ips(&self) -> Vec<String> {
        self.links.iter().map(|l| l.host_ip.clone()).collect()
    }

    /// Cuts node `i` off silently: packets are dropped, nothing is reset.
    fn cut(&self, i: usize) {
        ip(&format!("link set {} down", self.links[i].host_if));
    }

    fn heal(&self, i: usize) {
        ip(&format!("link set {} up", self.links[i].host_if));
        self.pin_neighbours(&self.links[i]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for l in &self.links {
            kill_netns_pids(&l.ns);
            if let Err(e) = try_ip(&format!("netns del {}", l.ns)) {
                eprintln!("partition test: {e}");
            }
            // Gone with the namespace, unless a process still holds it.
            let _ = try_ip(&format!("link del {}", l.host_if));
        }
        if self.blackhole {
            if let Err(e) = try_ip(&format!("route del blackhole {}", subnet())) {
                eprintln!("partition test: {e}");
            }
        }
    }
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
        "{report}\npartition test [{backend:?}]: run {:.1} s, total {:.1} s",
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

// ---------------------------------------------------------------------------------------------
// The checks

/// What was measured around one cut.
#[derive(Debug, Clone, Default)]
struct CutMetrics {
    node: String,
    down_for: Duration,
    /// Fence margins (µs) of the cut node's handlers interrupted around the cut.
    margins: Vec<i64>,
    heal_to_claim: Option<i64>,
    heal_to_renewal: Option<i64>,
    heal_to_finalization: Option<i64>,
    /// When a renewal was due: the heal, or the first claim after it if the node held no
    /// lease at the heal.
    renewal_due_us: Option<i64>,
    /// First successful renewal − when one was due.
    renewal_lag: Option<i64>,
    held_lease_at_heal: bool,
    reruns: usize,
    burnt: usize,
}

/// Everything the checks found.
#[derive(Debug, Default)]
struct Analysis {
    violations: Vec<String>,
    cuts: Vec<CutMetrics>,
    /// Re-runs and burnt attempts not put down to a cut.
    reruns_other: usize,
    burnt_other: usize,
    jobs: usize,
    executions: usize,
    /// Executions that did their work but whose result does not count.
    superseded_completions: usize,
    overlaps: usize,
    late_writes: usize,
    /// Handlers started for a lease that was already gone.
    zombie_starts: usize,
    /// Recorded failures by code.
    error_codes: BTreeMap<String, usize>,
    lagged: i64,
    /// The fence rule from the handlers' own `Fence` lines: starts checked and the smallest
    /// fence point − start; ends past a fence point and the largest end − fence point.
    fence_starts: usize,
    worst_start_to_fence: Option<i64>,
    fence_ends: usize,
    worst_fence_to_end: Option<i64>,
}

/// A claim as a node saw it.
#[derive(Debug, Clone)]
struct Claim {
    at_us: i64,
    node: String,
    attempt: i64,
}

fn secs(us: i64) -> String {
    format!("{:.2} s", us as f64 / 1e6)
}

fn opt_secs(us: Option<i64>) -> String {
    us.map_or_else(|| "never".to_string(), secs)
}

fn within(t: i64, cut: &Cut) -> bool {
    let before = i64::try_from(ATTRIBUTE_BEFORE.as_micros()).unwrap();
    let after = i64::try_from(ATTRIBUTE_AFTER.as_micros()).unwrap();
    t >= cut.cut_at_us - before && t <= cut.heal_at_us + after
}

/// The cut `node` went through around `t`, if any.
fn cut_of(cuts: &[Cut], node: &str, t: i64) -> Option<usize> {
    cuts.iter().position(|c| c.node == node && within(t, c))
}

/// The fence rule (ARCHITECTURE.md §6, invariant 9), from one node's `Fence` lines, keyed
/// by claim: no handler started at or after its claim's fence point, and none ended more
/// than the fence margin past the last fence point it knew — that is, past its lease as its
/// node knew it (0 µs allowed). The last fence point a handler knew is the latest it
/// journaled; it journals every move within `FENCE_CHECK` (100 ms), while a move is a
/// renewal's, a renewal interval later, so a stale value cannot hide an overrun.
fn check_fences(node: &str, lines: &[(i64, String, String, i64, i64)], a: &mut Analysis) {
    let margin = i64::try_from((LEASE / 6).as_micros()).unwrap();
    let mut known: HashMap<(i64, &str), i64> = HashMap::new();
    for (job, claim, what, at, fence) in lines {
        let key = (*job, claim.as_str());
        match what.as_str() {
            "start" => {
                a.fence_starts += 1;
                let left = fence - at;
                a.worst_start_to_fence = Some(a.worst_start_to_fence.map_or(left, |w| w.min(left)));
                if left <= 0 {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: the handler started at {at}, at or \
                         past its fence point {fence}"
                    ));
                }
                known.insert(key, *fence);
            }
            "seen" => {
                let k = known.entry(key).or_insert(*fence);
                *k = (*k).max(*fence);
            }
            "end" => {
                let Some(&last) = known.get(&key) else {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: an end journaled with no start"
                    ));
                    continue;
                };
                if fence > at {
                    continue; // ended before its fence point
                }
                a.fence_ends += 1;
                let over = at - last;
                a.worst_fence_to_end = Some(a.worst_fence_to_end.map_or(over, |w| w.max(over)));
                if over >= margin {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: the handler ran until {at}, {} past \
                         its fence point {last}: past its lease as its node knew it",
                        secs(over)
                    ));
                }
            }
            other => a
                .violations
                .push(format!("job {job} on {node}: unknown fence line {other:?}")),
        }
    }
}

/// Checks the run and measures each cut; see the module docs for the rules.
fn analyze(
    jobs: &[JobFacts],
    execs: &[Execution],
    nodes: &[NodeRow],
    timelines: &BTreeMap<String, Timeline>,
    cuts: &[Cut],
) -> Analysis {
    let mut a = Analysis {
        jobs: jobs.len(),
        executions: execs.len(),
        cuts: cuts
            .iter()
            .map(|c| CutMetrics {
                node: c.node.clone(),
                down_for: c.down_for,
                ..CutMetrics::default()
            })
            .collect(),
        lagged: timelines.values().map(NodeJournal::lagged).sum(),
        ..Analysis::default()
    };
    let gone: HashMap<&str, i64> = nodes
        .iter()
        .map(|n| (n.node.as_str(), n.gone_at_us))
        .collect();
    let mut claims: HashMap<i64, Vec<Claim>> = HashMap::new();
    let mut successes: HashMap<i64, Vec<(String, i64)>> = HashMap::new();
    for (node, t) in timelines {
        for (at_us, what, job, attempt) in &t.at {
            if what == "claimed" {
                claims.entry(*job).or_default().push(Claim {
                    at_us: *at_us,
                    node: node.clone(),
                    attempt: *attempt,
                });
            } else if what == "finished_succeeded" {
                successes
                    .entry(*job)
                    .or_default()
                    .push((node.clone(), *attempt));
            }
        }
    }
    for list in claims.values_mut() {
        list.sort_by_key(|c| c.at_us);
    }
    let mut by_job: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        by_job.entry(e.job_id).or_default().push(e);
    }
    let known: HashSet<i64> = jobs.iter().map(|j| j.id.0).collect();
    for id in by_job.keys().filter(|id| !known.contains(id)) {
        a.violations.push(format!(
            "executions recorded for job {id}, which does not exist"
        ));
    }
    let no_claims = Vec::new();
    for job in jobs {
        let mut list = by_job.remove(&job.id.0).unwrap_or_default();
        list.sort_by_key(|e| (e.started_at_us, e.node.clone()));
        let claims = claims.get(&job.id.0).unwrap_or(&no_claims);
        check_job(job, &list, claims, &successes, &gone, cuts, &mut a);
    }
    for (node, t) in timelines {
        check_fences(node, &t.fences, &mut a);
    }
    for (k, c) in cuts.iter().enumerate() {
        let Some(t) = timelines.get(&c.node) else {
            continue;
        };
        let m = &mut a.cuts[k];
        let heal = c.heal_at_us;
        let first_claim = t.first_claim_after(heal);
        m.heal_to_claim = first_claim.map(|x| x - heal);
        m.heal_to_finalization = t.first_finalization_after(heal).map(|x| x - heal);
        m.held_lease_at_heal = t.held_lease_at(heal);
        m.renewal_due_us = if m.held_lease_at_heal {
            Some(heal)
        } else {
            first_claim
        };
        m.heal_to_renewal = t.first_renewal_after(heal).map(|x| x - heal);
        m.renewal_lag = m
            .renewal_due_us
            .and_then(|due| t.first_renewal_after(due).map(|x| x - due));
    }
    a
}

fn check_job(
    job: &JobFacts,
    list: &[&Execution],
    claims: &[Claim],
    successes: &HashMap<i64, Vec<(String, i64)>>,
    gone: &HashMap<&str, i64>,
    cuts: &[Cut],
    a: &mut Analysis,
) {
    let id = job.id;
    if job.state != JobState::Succeeded {
        a.violations.push(format!(
            "job {id} is {} after the run (attempts {}, errors {:?})",
            job.state, job.attempts, job.errors
        ));
    }
    // No failure from a handler: see `HANDLER_CODES`.
    for JobFailure {
        attempt,
        code,
        message,
        ..
    } in &job.errors
    {
        *a.error_codes.entry(code.clone()).or_default() += 1;
        if HANDLER_CODES.contains(&code.as_str()) {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: attempt {attempt}'s handler failure {code} ({message}) was accepted: \
                 its handler only fails once it lost its lease"
            ));
        }
    }
    // The result is a completed execution's of the last attempt, and nothing started after
    // it: an execution that did ran for a lease that was gone (a claim whose answer came back after the lease
    // had expired — a "zombie start").
    let writer = job
        .result
        .as_ref()
        .and_then(|_| list.iter().rposition(|e| job.written_by(e)));
    let mut zombie = vec![false; list.len()];
    match (&job.result, writer) {
        (Some(r), None) => {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: result {r:?} names no recorded execution: a late write was accepted"
            ));
        }
        (Some(r), Some(_)) if job.result_attempt() != Some(i64::from(job.attempts)) => {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: result {r:?}, but its last claim was attempt {}: a superseded \
                 attempt's finalization was accepted",
                job.attempts
            ));
        }
        (Some(r), Some(w)) => {
            if list[w].completed != 1 {
                a.late_writes += 1;
                a.violations.push(format!(
                    "job {id}: result {r:?} from {:?}, which did not complete: a late write \
                     was accepted",
                    list[w]
                ));
            }
            for (i, e) in list.iter().enumerate().skip(w + 1) {
                zombie[i] = true;
                a.zombie_starts += 1;
                a.violations.push(format!(
                    "job {id}: {e:?} started {} after {:?}, whose result counts: a handler \
                     ran for a lease that was gone",
                    secs(e.started_at_us - list[w].started_at_us),
                    list[w]
                ));
            }
        }
        (None, _) if job.state == JobState::Succeeded => a
            .violations
            .push(format!("job {id} succeeded without a result")),
        (None, _) => {}
    }
    a.superseded_completions += list
        .iter()
        .enumerate()
        .filter(|(i, e)| e.completed == 1 && writer != Some(*i))
        .count();
    // A success accepted for attempt k is a late write if the job was ever claimed again
    // with a higher attempt: that claim needed attempt k's lease gone (or came after the
    // job was finished). And a job succeeds once.
    if let Some(done) = successes.get(&id.0) {
        if done.len() > 1 {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: {} finalizations to success were accepted: {done:?}",
                done.len()
            ));
        }
        for (node, attempt) in done {
            if let Some(c) = claims.iter().find(|c| c.attempt > *attempt) {
                a.late_writes += 1;
                a.violations.push(format!(
                    "job {id}: {node}'s success for attempt {attempt} was accepted, but {} \
                     claimed attempt {} (seen at {})",
                    c.node, c.attempt, c.at_us
                ));
            }
        }
    }
    if let Some(result) = job.result_node().zip(job.result_attempt()) {
        let result = (result.0.to_string(), result.1);
        if successes.get(&id.0).is_some_and(|d| !d.contains(&result)) {
            a.violations.push(format!(
                "job {id}: result {result:?} but the accepted success was {:?}",
                successes[&id.0]
            ));
        }
    }

    // When each execution surely stopped: its recorded end, or its node's end.
    let mut ends = Vec::with_capacity(list.len());
    for e in list {
        let end = match (e.ended_at_us, gone.get(e.node.as_str())) {
            (Some(t), _) => t,
            (None, Some(t)) => *t,
            (None, None) => {
                a.violations.push(format!(
                    "job {id}: execution {e:?} of a node that never ended"
                ));
                i64::MAX
            }
        };
        ends.push(end);
    }

    // The fence margin: every handler whose job was re-claimed (by the sweeper, whose stamp is
    // the database's, or by any later claim) stopped before that.
    let finished = job.finished_at_us.unwrap_or(i64::MAX);
    for (idx, (e, end)) in list.iter().zip(&ends).enumerate() {
        if zombie[idx] {
            continue;
        }
        if *end > finished + DB_CLOCK_SLACK_US {
            a.violations.push(format!(
                "job {id}: {e:?} ran until {end}, {} after the job finished",
                secs(end - finished)
            ));
        }
        let own = claims.iter().rev().find(|c| {
            c.node == e.node && c.attempt == i64::from(e.attempt) && c.at_us <= e.started_at_us
        });
        let after = own.map_or(e.started_at_us, |c| c.at_us);
        // A later claim: a higher attempt (the database numbers claims in order), or the same
        // attempt on another node after this one's claim (an attempt given back). A claim of a
        // lower attempt whose answer arrived late is older than this execution's.
        let attempt = i64::from(e.attempt);
        let next_claim = claims
            .iter()
            .filter(|c| c.attempt > attempt || (c.attempt == attempt && c.node != e.node))
            .find(|c| c.at_us > after)
            .map(|c| c.at_us);
        let reclaim = job
            .errors
            .iter()
            .find(|x| same_claim(x, e))
            .and_then(|x| x.at)
            .map(|t| t.timestamp_micros());
        let reclaimed = match (next_claim, reclaim) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        if let Some(r) = reclaimed.filter(|_| writer != Some(idx)) {
            if e.started_at_us > r {
                a.zombie_starts += 1;
                a.violations.push(format!(
                    "job {id}: {e:?} started {} after its job was re-claimed (at {r}): a \
                     handler ran for a lease that was gone",
                    secs(e.started_at_us - r)
                ));
                continue;
            }
            let margin = r - end;
            if margin < -DB_CLOCK_SLACK_US {
                a.violations.push(format!(
                    "job {id}: {e:?} still ran {} after the job was re-claimed (at {r})",
                    secs(-margin)
                ));
            }
            if let Some(k) = cuts
                .iter()
                .position(|c| c.node == e.node && *end >= c.cut_at_us && within(*end, c))
            {
                a.cuts[k].margins.push(margin);
            }
        }
    }

    // No two executions overlapped: sorted by start, each starts after every earlier one ended.
    let mut running_until: Option<(i64, &Execution)> = None;
    for (e, end) in list.iter().zip(&ends) {
        if let Some((until, prev)) = running_until {
            if e.started_at_us < until {
                a.overlaps += 1;
                a.violations.push(format!(
                    "job {id}: {e:?} started {} before {prev:?} ended",
                    secs(until - e.started_at_us)
                ));
            }
        }
        if running_until.is_none_or(|(u, _)| *end > u) {
            running_until = Some((*end, e));
        }
    }

    // Re-runs: every execution after the first, put down to the cut its predecessor's node
    // went through (or, for a zombie start, its own node).
    for pair in list.windows(2) {
        let cut = cut_of(cuts, &pair[0].node, pair[0].started_at_us)
            .or_else(|| cut_of(cuts, &pair[1].node, pair[1].started_at_us));
        match cut {
            Some(k) => a.cuts[k].reruns += 1,
            None => a.reruns_other += 1,
        }
    }

    // Attempts burnt on a job that never started: attempt numbers no execution had. Put down
    // to the cut of the node that claimed it, else by the time of its reclaim.
    for k in 1..=job.attempts {
        if list.iter().any(|e| u32::try_from(e.attempt) == Ok(k)) {
            continue;
        }
        let by_claim = claims
            .iter()
            .filter(|c| c.attempt == i64::from(k))
            .find_map(|c| cut_of(cuts, &c.node, c.at_us));
        let by_time = || {
            let at = job
                .errors
                .iter()
                .find(|x| x.attempt == k)?
                .at?
                .timestamp_micros();
            cuts.iter().position(|c| within(at, c))
        };
        match by_claim.or_else(by_time) {
            Some(c) => a.cuts[c].burnt += 1,
            None => a.burnt_other += 1,
        }
    }
}

impl Analysis {
    fn report(&self, backend: Backend) -> String {
        let mut s = String::new();
        for m in &self.cuts {
            let worst = m.margins.iter().min().copied();
            let _ = writeln!(
                s,
                "partition test [{backend:?}]: cut of {} for {:?}: fence margin worst {} ({} \
                 handlers interrupted); heal→first claim {}, →first renewal {} (due from {}: \
                 lag {}), →first finalization {}; re-runs {}; attempts burnt on never-started \
                 jobs {}",
                m.node,
                m.down_for,
                opt_secs(worst),
                m.margins.len(),
                opt_secs(m.heal_to_claim),
                opt_secs(m.heal_to_renewal),
                if m.held_lease_at_heal {
                    "the heal"
                } else {
                    "its first claim after the heal"
                },
                opt_secs(m.renewal_lag),
                opt_secs(m.heal_to_finalization),
                m.reruns,
                m.burnt
            );
        }
        let worst = |f: &dyn Fn(&CutMetrics) -> Option<i64>, max: bool| {
            let v = self.cuts.iter().filter_map(f);
            if max {
                v.max()
            } else {
                v.min()
            }
        };
        let missing =
            |f: &dyn Fn(&CutMetrics) -> Option<i64>| self.cuts.iter().any(|m| f(m).is_none());
        let worst_or_never = |f: &dyn Fn(&CutMetrics) -> Option<i64>| {
            if missing(f) {
                "never (for some cut)".to_string()
            } else {
                opt_secs(worst(f, true))
            }
        };
        let per_cut = |f: &dyn Fn(&CutMetrics) -> usize| {
            self.cuts
                .iter()
                .map(|m| format!("{:?} cut: {}", m.down_for, f(m)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "partition test [{backend:?}] SUMMARY: worst fence margin {}; worst heal→first claim \
             {}; worst heal→first renewal {} (lag from when due {}); worst heal→first \
             finalization {}; re-runs per cut [{}] (+{} not from a cut); attempts burnt on \
             never-started jobs [{}] (+{} not from a cut)",
            opt_secs(worst(&|m| m.margins.iter().min().copied(), false)),
            worst_or_never(&|m| m.heal_to_claim),
            worst_or_never(&|m| m.heal_to_renewal),
            worst_or_never(&|m| m.renewal_lag),
            worst_or_never(&|m| m.heal_to_finalization),
            per_cut(&|m| m.reruns),
            self.reruns_other,
            per_cut(&|m| m.burnt),
            self.burnt_other,
        );
        let _ = writeln!(
            s,
            "partition test [{backend:?}]: fence rule: {} starts, closest to the fence point {}; \
             {} handlers ended past it, the latest {} µs after it (the lease ran {} past it)",
            self.fence_starts,
            opt_secs(self.worst_start_to_fence),
            self.fence_ends,
            self.worst_fence_to_end
                .map_or_else(|| "-".to_string(), |v| v.to_string()),
            secs(i64::try_from((LEASE / 6).as_micros()).unwrap()),
        );
        let _ = write!(
            s,
            "partition test [{backend:?}]: jobs={} executions={} superseded_completions={} \
             overlaps={} late_writes={} zombie_starts={} violations={} events_lagged={} \
             errors={:?}",
            self.jobs,
            self.executions,
            self.superseded_completions,
            self.overlaps,
            self.late_writes,
            self.zombie_starts,
            self.violations.len(),
            self.lagged,
            self.error_codes
        );
        if self.lagged > 0 {
            let _ = write!(
                s,
                "\n  (some journal writers lagged: the timeline misses events, times may read late)"
            );
        }
        s
    }

    /// The issue's goals this run missed (empty when all were met).
    fn goals_missed(&self) -> Vec<String> {
        let target = i64::try_from(HEAL_TARGET.as_micros()).unwrap();
        let slack = i64::try_from(RENEWAL_SLACK.as_micros()).unwrap();
        let mut out = Vec::new();
        for m in &self.cuts {
            let cut = format!("{} cut {:?}", m.node, m.down_for);
            let claim_slack = i64::try_from(CLAIM_SLACK.as_micros()).unwrap();
            match m.heal_to_claim {
                Some(t) if t <= target + claim_slack => {}
                t => out.push(format!(
                    "{cut}: first claim {} after the heal (target {HEAL_TARGET:?} + \
                     {CLAIM_SLACK:?} for the poll tick)",
                    opt_secs(t)
                )),
            }
            match m.renewal_lag {
                Some(t) if t <= target + slack => {}
                t => out.push(format!(
                    "{cut}: first renewal {} after it was due (target {HEAL_TARGET:?} + \
                     {RENEWAL_SLACK:?} for the tick)",
                    opt_secs(t)
                )),
            }
            if m.burnt > 0 {
                out.push(format!(
                    "{cut}: {} attempt(s) burnt on jobs that never started (target 0)",
                    m.burnt
                ));
            }
            if m.down_for < TOLERATED_CUT && m.reruns > 0 {
                out.push(format!(
                    "{cut}: {} re-run(s) after a cut shorter than the documented tolerance \
                     {TOLERATED_CUT:?} (target 0)",
                    m.reruns
                ));
            }
        }
        if self.burnt_other > 0 {
            out.push(format!(
                "{} attempt(s) burnt on jobs that never started, not near a cut (target 0)",
                self.burnt_other
            ));
        }
        if self.cuts.first().is_some_and(|m| m.margins.is_empty()) {
            out.push(
                "the cut longer than the lease interrupted no running handler: fencing was not \
                 exercised"
                    .into(),
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The checks, checked

#[cfg(test)]
mod checker {
    use super::*;

    const T0: i64 = 1_900_000_000_000_000;
    const S: i64 = 1_000_000;

    fn job(attempts: u32, reclaims: &[i64], result: (&str, i64), finished: i64) -> JobFacts {
        JobFacts {
            id: JobId(1),
            kind: "partition".into(),
            state: JobState::Succeeded,
            attempts,
            max_attempts: MAX_ATTEMPTS,
            timeout_us: 0,
            version: 1 + 2 * i64::from(attempts),
            errors: reclaims
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    JobFailure::new(
                        "lease_expired",
                        "the lease expired",
                        u32::try_from(i).unwrap() + 1,
                    )
                    .at(chrono::DateTime::from_timestamp_micros(*t).unwrap())
                })
                .collect(),
            last_error: None,
            result: Some(json!({ "node": result.0, "attempt": result.1 })),
            lease_held: false,
            finished_at_us: Some(finished),
        }
    }

    fn exec(attempt: i32, node: &str, start: i64, end: i64, completed: bool) -> Execution {
        Execution {
            job_id: 1,
            attempt,
            claim: String::new(),
            node: node.into(),
            started_at_us: start,
            runtime_started_at_us: None,
            ended_at_us: Some(end),
            completed: i16::from(completed),
            held: None,
        }
    }

    fn timeline(lines: &[(i64, &str, i64, i64)]) -> Timeline {
        Timeline {
            at: lines
                .iter()
                .map(|(t, w, a, b)| (*t, (*w).to_string(), *a, *b))
                .collect(),
            ..Timeline::default()
        }
    }

    type Scenario = (
        Vec<JobFacts>,
        Vec<Execution>,
        BTreeMap<String, Timeline>,
        Vec<Cut>,
    );

    /// n1 is cut from T0 to T0 + 15 s; it ran attempt 1 from T0 − 1 s and fenced it at
    /// T0 + 4 s; the sweeper reclaimed at T0 + 6 s; n2 ran attempt 2.
    fn scenario() -> Scenario {
        let jobs = vec![job(2, &[T0 + 6 * S], ("n2", 2), T0 + 8 * S)];
        let execs = vec![
            exec(1, "n1", T0 - S, T0 + 4 * S, false),
            exec(2, "n2", T0 + 6 * S + 20_000, T0 + 7 * S, true),
        ];
        let mut t = BTreeMap::new();
        t.insert(
            "n1".to_string(),
            timeline(&[
                (T0 - S - 10, "claimed", 1, 1),
                (T0 + 4 * S, "self_fenced", 1, 0),
                (T0 + 16 * S, "claimed", 9, 1),
                (T0 + 17 * S, "renewed", 1, 0),
            ]),
        );
        t.insert(
            "n2".to_string(),
            timeline(&[
                (T0 + 6 * S + 10_000, "claimed", 1, 2),
                (T0 + 8 * S, "finished_succeeded", 1, 2),
            ]),
        );
        let cuts = vec![Cut {
            index: 0,
            node: "n1".into(),
            down_for: Duration::from_secs(15),
            cut_at_us: T0,
            heal_at_us: T0 + 15 * S,
        }];
        (jobs, execs, t, cuts)
    }

    #[test]
    fn the_short_cut_is_inside_the_documented_tolerance() {
        assert_eq!(TOLERATED_CUT, Duration::from_millis(3500));
        assert!(CUTS[1].down_for < TOLERATED_CUT);
        assert!(CUTS[0].down_for > LEASE);
    }

    #[test]
    fn a_re_run_after_a_short_cut_misses_the_goal() {
        let mut a = Analysis::default();
        a.cuts.push(CutMetrics {
            node: "n2".into(),
            down_for: CUTS[1].down_for,
            margins: vec![1_000],
            heal_to_claim: Some(0),
            renewal_lag: Some(0),
            reruns: 1,
            ..CutMetrics::default()
        });
        assert!(
            a.goals_missed().iter().any(|g| g.contains("re-run")),
            "{:?}",
            a.goals_missed()
        );
        a.cuts[0].reruns = 0;
        assert!(a.goals_missed().is_empty(), "{:?}", a.goals_missed());
    }

    #[test]
    fn a_clean_cut_passes_and_is_measured() {
        let (jobs, execs, t, cuts) = scenario();
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.violations, Vec::<String>::new());
        let m = &a.cuts[0];
        assert_eq!(m.margins, vec![2 * S]);
        assert_eq!(m.heal_to_claim, Some(S));
        assert!(!m.held_lease_at_heal);
        assert_eq!((m.heal_to_renewal, m.renewal_lag), (Some(2 * S), Some(S)));
        assert_eq!((m.reruns, m.burnt, a.reruns_other), (1, 0, 0));
        assert!(a.goals_missed().is_empty(), "{:?}", a.goals_missed());
    }

    #[test]
    fn a_handler_running_past_its_reclaim_is_caught() {
        let (jobs, mut execs, t, cuts) = scenario();
        execs[0].ended_at_us = Some(T0 + 6 * S + 5_000);
        execs[1].started_at_us = T0 + 6 * S + 50_000;
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        assert!(a.cuts[0].margins[0] < 0);
    }

    #[test]
    fn overlapping_executions_are_caught() {
        let (jobs, mut execs, t, cuts) = scenario();
        execs[1].started_at_us = T0 + 3 * S;
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.overlaps, 1, "{:?}", a.violations);
    }

    #[test]
    fn a_handler_started_after_its_job_was_done_is_caught() {
        // n1's claim of attempt 1 is answered 10 s after n2 finished attempt 2.
        let (jobs, mut execs, mut t, cuts) = scenario();
        execs[0].started_at_us = T0 + 18 * S;
        execs[0].ended_at_us = Some(T0 + 18 * S + 80_000);
        t.get_mut("n1").unwrap().at[0].0 = T0 + 18 * S - 10;
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.zombie_starts, 1, "{:?}", a.violations);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        // Started after the reclaim, before the next attempt.
        let (jobs, mut execs, t, cuts) = scenario();
        execs[0].started_at_us = T0 + 6 * S + 5_000;
        execs[0].ended_at_us = Some(T0 + 6 * S + 8_000);
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.zombie_starts, 1, "{:?}", a.violations);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    }

    #[test]
    fn late_writes_are_caught() {
        // n1's success for attempt 1 accepted although n2 claimed attempt 2.
        let (mut jobs, mut execs, mut t, cuts) = scenario();
        t.get_mut("n1")
            .unwrap()
            .at
            .push((T0 + 16 * S, "finished_succeeded".into(), 1, 1));
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert!(a.late_writes >= 2, "{:?}", a.violations);
        // A result that is not the last execution's.
        let (_, _, t, _) = scenario();
        jobs[0].result = Some(json!({ "node": "n1", "attempt": 1 }));
        execs[0].completed = 1;
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert!(a.late_writes >= 1, "{:?}", a.violations);
        assert_eq!(a.zombie_starts, 0, "{:?}", a.violations);
        // A failure written by a handler.
        let (mut jobs, execs, t, cuts) = scenario();
        jobs[0].errors[0].code = "error".into();
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.late_writes, 1, "{:?}", a.violations);
    }

    #[test]
    fn burnt_attempts_and_slow_heals_miss_the_goals() {
        // Attempt 1 claimed by n1 and never started; attempt 2 ran on n2.
        let (jobs, mut execs, mut t, cuts) = scenario();
        execs.remove(0);
        let n1 = t.get_mut("n1").unwrap();
        n1.at.retain(|x| x.1 != "renewed");
        n1.at[2].0 = T0 + 19 * S;
        let a = analyze(&jobs, &execs, &[], &t, &cuts);
        assert_eq!(a.violations, Vec::<String>::new());
        assert_eq!((a.cuts[0].burnt, a.cuts[0].reruns), (1, 0));
        let goals = a.goals_missed();
        // burnt, claim 4 s after the heal, no renewal, no handler interrupted.
        assert_eq!(goals.len(), 4, "{goals:?}");
    }

    #[test]
    fn a_lease_held_at_the_heal_makes_the_renewal_due_at_once() {
        let t = timeline(&[
            (T0, "claimed", 1, 1),
            (T0 + 5 * S, "claimed", 2, 1),
            (T0 + 5 * S, "finished_succeeded", 2, 1),
            (T0 + 12 * S, "renewed", 1, 0),
        ]);
        assert!(t.held_lease_at(T0 + 10 * S));
        assert_eq!(t.first_renewal_after(T0 + 10 * S), Some(T0 + 12 * S));
        let t = timeline(&[(T0, "claimed", 1, 1), (T0 + S, "self_fenced", 1, 0)]);
        assert!(!t.held_lease_at(T0 + 10 * S));
    }
}
