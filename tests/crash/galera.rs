//! The crash test on a three-member MariaDB Galera cluster (`crash_galera`), and the same
//! drain without faults through one member or spread over three (`galera_topology`).
//!
//! The cluster is private (`tests/harness/galera.rs`). Each node's URL names every member,
//! its own first, so each of the three nodes works through a member of its own and fails
//! over to the next when that one dies or is cut off. Galera's faults replace the server
//! restart: once 40 % of the jobs are done a member is SIGKILLed and started again (it
//! rejoins by IST), and once 70 % are, a member is cut off from the others
//! (`gmcast.isolate`) until it is out of the primary component, kept out for [`CUT_FOR`]
//! (longer than the 2 s lease) and let back. Either way the whole cluster stops committing
//! until the others have evicted the member (`evs.suspect_timeout`, 3 s here): that window
//! counts as the server being down for the checks that allow for one.
//!
//! The figures: for each fault, the time back to work — the longest pause in claims from
//! the fault until the first claim after the member was out, of all nodes and of the nodes
//! working through that member (from the nodes' journals);
//! the certification conflicts, summed over the members from `SHOW GLOBAL STATUS`
//! (`wsrep_local_cert_failures` + `wsrep_local_bf_aborts`, their deltas over the drain; a
//! killed member's count up to its kill is kept, its counters restart at zero); and
//! jobvisor's own retries of transactions the server rolled back, counted in the node logs
//! (the nodes log them at debug level here).

use super::*;

use harness::galera::GaleraCluster;

/// Where the cluster's directories go (as `tests/galera.rs`: each run its own
/// `galera-<pid>`).
const GALERA_BASE: &str = "/tmp/jobvisor-galera-tests";

/// Jobs of the crash test on Galera unless `JOBVISOR_CRASH_JOBS` says otherwise: 3,000, not
/// 5,000 — every commit goes through the three members' group communication on this
/// machine's two cores, so a drain runs at a fraction of a single server's pace, and the
/// run (cluster start, two faults, IST) must stay within 3 minutes.
pub(crate) const GALERA_DEFAULT_JOBS: usize = 3_000;

/// The faults of a normal run, at these shares of the jobs terminal: a member killed, then
/// one cut off.
pub(crate) const FAULTS_AT: [f64; 2] = [RESTART_AT, 0.7];

/// How long the cut member is kept out of the primary component once it is out: longer than
/// the 2 s lease, so the leases of jobs claimed through it expire meanwhile.
const CUT_FOR: Duration = Duration::from_secs(4);

/// How long the others may take to evict a killed member.
const EVICT_WITHIN: Duration = Duration::from_secs(60);

/// The nodes log jobvisor's retries of rolled-back transactions at debug level...
pub(crate) const RETRY_LOG_FILTER: &str = "warn,jobvisor::store::common::retry=debug";
/// ...with this message (`src/store/common/retry.rs`), one line per retry.
const RETRY_LINE: &str = "transaction rolled back by the database; trying again";

/// The status counters of certification conflicts a member keeps.
const CONFLICT_COUNTERS: [&str; 2] = ["wsrep_local_cert_failures", "wsrep_local_bf_aborts"];

/// One fault, with when it happened.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    /// `killed` or `cut off`.
    pub(crate) what: &'static str,
    /// The member, from 0.
    pub(crate) member: usize,
    /// SIGKILL sent, or the isolation set.
    pub(crate) at_us: i64,
    /// The others evicted it (cluster size 2), or it was seen out of the primary component.
    pub(crate) out_us: i64,
    /// It was synced with the others again (after its restart, or its heal).
    pub(crate) back_us: i64,
}

/// The cluster of a run, its faults, and its conflict counters.
pub(crate) struct Galera {
    pub(crate) cluster: GaleraCluster,
    /// Each member's conflicts when counting began (or when it was restarted).
    counted_from: [i64; 3],
    /// Conflicts of members' earlier lives (before a kill reset their counters).
    banked: i64,
    pub(crate) faults: Vec<Fault>,
}

impl std::fmt::Debug for Galera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Galera")
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl Galera {
    /// Starts a private cluster of three.
    pub(crate) fn start() -> Galera {
        let t = Instant::now();
        let cluster = GaleraCluster::start("crash_galera", Path::new(GALERA_BASE));
        eprintln!(
            "crash test [Galera]: cluster of 3 synced in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Galera {
            cluster,
            counted_from: [0; 3],
            banked: 0,
            faults: Vec::new(),
        }
    }

    /// The nodes' URLs on database `db`: one per member, naming every member, that one
    /// first.
    pub(crate) fn node_urls(&self, db: &str) -> Vec<String> {
        (0..3).map(|i| self.cluster.url_from(i, db)).collect()
    }

    /// Member `i`'s certification conflicts since it started.
    fn member_conflicts(&self, i: usize) -> i64 {
        let list = CONFLICT_COUNTERS.map(|c| format!("'{c}'")).join(",");
        let out = self.cluster.sql(
            i,
            &format!("SHOW GLOBAL STATUS WHERE Variable_name IN ({list})"),
        );
        let values: Vec<i64> = out
            .lines()
            .map(|l| {
                let v = l.split_whitespace().nth(1).unwrap_or_default();
                v.parse()
                    .unwrap_or_else(|e| panic!("member {}: status line {l:?}: {e}", i + 1))
            })
            .collect();
        assert_eq!(
            values.len(),
            CONFLICT_COUNTERS.len(),
            "member {}: expected the counters {CONFLICT_COUNTERS:?}, got {out:?}",
            i + 1
        );
        values.iter().sum()
    }

    /// Counts conflicts from now on.
    pub(crate) fn count_conflicts_from_now(&mut self) {
        self.counted_from = [0, 1, 2].map(|i| self.member_conflicts(i));
        self.banked = 0;
    }

    /// Conflicts since [`Galera::count_conflicts_from_now`], over every member.
    pub(crate) fn conflicts(&self) -> i64 {
        self.banked
            + (0..3)
                .map(|i| self.member_conflicts(i) - self.counted_from[i])
                .sum::<i64>()
    }

    /// SIGKILLs member `i`, waits until the others have evicted it, starts it again and
    /// waits until it is synced (IST).
    pub(crate) fn kill_and_restart(&mut self, i: usize) -> Fault {
        self.banked += self.member_conflicts(i) - self.counted_from[i];
        let at_us = now_us();
        self.cluster.kill(i);
        let other = (i + 1) % 3;
        let t = Instant::now();
        loop {
            let size = self
                .cluster
                .try_sql(other, "SHOW STATUS LIKE 'wsrep_cluster_size'");
            if size
                .as_deref()
                .is_ok_and(|s| s.split_whitespace().nth(1) == Some("2"))
            {
                break;
            }
            assert!(
                t.elapsed() < EVICT_WITHIN,
                "member {} was not evicted within {EVICT_WITHIN:?} of its kill: {size:?}",
                i + 1
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let out_us = now_us();
        self.cluster.restart(i);
        self.counted_from[i] = self.member_conflicts(i);
        let fault = Fault {
            what: "killed",
            member: i,
            at_us,
            out_us,
            back_us: now_us(),
        };
        self.faults.push(fault.clone());
        fault
    }

    /// Cuts member `i` off from the others, waits until it is out of the primary component,
    /// keeps it out for [`CUT_FOR`], lets it back and waits until it is synced.
    pub(crate) fn cut_off(&mut self, i: usize) -> Fault {
        let at_us = now_us();
        self.cluster.isolate(i, true);
        let out_us = now_us();
        std::thread::sleep(CUT_FOR);
        self.cluster.isolate(i, false);
        let fault = Fault {
            what: "cut off",
            member: i,
            at_us,
            out_us,
            back_us: now_us(),
        };
        self.faults.push(fault.clone());
        fault
    }
}

/// jobvisor's retries of rolled-back transactions, counted in the node logs of `fleet`.
pub(crate) fn retries_logged(fleet: &Fleet) -> usize {
    fleet
        .gone
        .iter()
        .map(|n| {
            std::fs::read_to_string(fleet.log(&n.node))
                .unwrap_or_default()
                .matches(RETRY_LINE)
                .count()
        })
        .sum()
}

/// The longest pause in claims around `fault`: from the fault, through the claims made
/// meanwhile, to the first claim once the member was out (evicted, or out of the primary
/// component), by the nodes of `nodes`; `None` when none of them claimed after that.
fn pause(fault: &Fault, nodes: &[&NodeRow], journals: &Journals) -> Option<i64> {
    let mut times: Vec<i64> = nodes
        .iter()
        .filter_map(|n| journals.nodes.get(&n.node))
        .flat_map(|j| j.claims.values().flatten().copied())
        .filter(|&at| at > fault.at_us)
        .collect();
    times.sort_unstable();
    let after = times.iter().position(|&at| at > fault.out_us)?;
    let mut longest = 0;
    let mut prev = fault.at_us;
    for &at in &times[..=after] {
        longest = longest.max(at - prev);
        prev = at;
    }
    Some(longest)
}

/// Time back to work after `fault`: the longest pause in claims (see [`pause`]) of the
/// whole fleet, and of the nodes that worked through the faulted member (alive from before
/// the fault until after it was synced again; no node is killed or frozen meanwhile).
pub(crate) fn back_to_work(
    fault: &Fault,
    fleet: &Fleet,
    journals: &Journals,
) -> (Option<i64>, Option<i64>) {
    let all: Vec<&NodeRow> = fleet.gone.iter().collect();
    let homed: Vec<&NodeRow> = fleet
        .gone
        .iter()
        .filter(|n| {
            fleet.homes.get(&n.node) == Some(&fault.member)
                && n.spawned_at_us < fault.at_us
                && n.gone_at_us > fault.back_us
        })
        .collect();
    (pause(fault, &all, journals), pause(fault, &homed, journals))
}

/// Seconds, from µs, for the figures.
pub(crate) fn secs(us: Option<i64>) -> String {
    us.map_or("-".into(), |us| format!("{:.2}", us as f64 / 1e6))
}

/// The Galera lines of the crash test's report.
pub(crate) fn report_galera(
    g: &Galera,
    fleet: &Fleet,
    journals: &Journals,
    jobs: usize,
    drain: Duration,
) {
    for f in &g.faults {
        let (anywhere, every) = back_to_work(f, fleet, journals);
        println!(
            "crash test [Galera] fault: member {} {}: out (evicted/non-primary) after {} s; \
             back to work (longest pause in claims): all nodes {} s, the nodes on that \
             member {} s; member synced again after {} s",
            f.member + 1,
            f.what,
            secs(Some(f.out_us - f.at_us)),
            secs(anywhere),
            secs(every),
            secs(Some(f.back_us - f.at_us)),
        );
    }
    let conflicts = g.conflicts();
    let retries = retries_logged(fleet);
    let per_k = |n: usize| n as f64 * 1000.0 / jobs as f64;
    println!(
        "crash test [Galera] figures: jobs={jobs} drain={:.1}s jobs_per_s={:.1} \
         certification_conflicts={conflicts} per_1000_jobs={:.1} jobvisor_retries={retries} \
         per_1000_jobs={:.1}",
        drain.as_secs_f64(),
        jobs as f64 / drain.as_secs_f64(),
        per_k(usize::try_from(conflicts).unwrap_or(0)),
        per_k(retries),
    );
}

/// Drains of the topology comparison per topology (`JOBVISOR_TOPOLOGY_RUNS`, default 3).
const TOPOLOGY_RUNS: usize = 3;
/// Jobs per drain of the topology comparison unless `JOBVISOR_CRASH_JOBS` says otherwise.
const TOPOLOGY_JOBS: usize = 5_000;
/// A drain of the comparison must end within this.
const TOPOLOGY_DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// One drain of the comparison.
#[derive(Debug, Clone, Copy)]
struct Drain {
    jobs_per_s: f64,
    conflicts_per_k: f64,
    retries_per_k: f64,
}

/// The same drain, without faults, with the three nodes all on member 1 (`one`: each
/// node's URL names member 1 first, as `members=first` advises) and with each node on a
/// member of its own (`spread`), [`TOPOLOGY_RUNS`] times each, alternating; prints each
/// drain, then per topology the median and range of jobs/s, certification conflicts per
/// 1,000 jobs and jobvisor's retries per 1,000 jobs.
pub(crate) async fn topology() {
    let jobs = env_number("JOBVISOR_CRASH_JOBS").unwrap_or(TOPOLOGY_JOBS);
    let runs = env_number("JOBVISOR_TOPOLOGY_RUNS").unwrap_or(TOPOLOGY_RUNS);
    assert!(
        jobs >= 100 && runs >= 1,
        "JOBVISOR_CRASH_JOBS={jobs}, JOBVISOR_TOPOLOGY_RUNS={runs}: expected at least 100 \
         jobs and 1 run"
    );
    let mut g = tokio::task::block_in_place(Galera::start);
    let mut results: BTreeMap<&str, Vec<Drain>> = BTreeMap::new();
    for round in 0..runs {
        for name in ["one", "spread"] {
            let d = drain(
                &mut g,
                &format!("topo{round}_{name}"),
                name == "spread",
                jobs,
            )
            .await;
            println!(
                "galera topology [{name}] run {}: {jobs} jobs, {:.1} jobs/s, {:.1} \
                 certification conflicts and {:.1} jobvisor retries per 1,000 jobs",
                round + 1,
                d.jobs_per_s,
                d.conflicts_per_k,
                d.retries_per_k
            );
            results.entry(name).or_default().push(d);
        }
    }
    for (name, ds) in &results {
        let stat = |f: fn(&Drain) -> f64| {
            let mut v: Vec<f64> = ds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            format!("{:.1} ({:.1}–{:.1})", v[v.len() / 2], v[0], v[v.len() - 1])
        };
        println!(
            "galera topology [{name}] over {} runs of {jobs} jobs, 3 nodes: jobs/s {}; \
             certification conflicts per 1,000 jobs {}; jobvisor retries per 1,000 jobs {}",
            ds.len(),
            stat(|d| d.jobs_per_s),
            stat(|d| d.conflicts_per_k),
            stat(|d| d.retries_per_k),
        );
    }
}

/// One drain of `jobs` quick jobs by three nodes on a fresh database `db`: all through
/// member 1, or (`spread`) one node per member.
async fn drain(g: &mut Galera, db: &str, spread: bool, jobs: usize) -> Drain {
    g.cluster.sql(0, &format!("CREATE DATABASE {db}"));
    let urls = g.node_urls(db);
    let store = Store::connect_with(&urls[0], StoreOptions::default().migrate(true))
        .await
        .unwrap_or_else(|e| panic!("opening a store on {}: {e}", urls[0]));
    let side = SideDb::open(&urls[0], 2).unwrap();
    side.create_tables().await.unwrap();
    let mut enqueued = 0;
    while enqueued < jobs {
        let more = jobs - enqueued;
        assert!(
            enqueue(&store, &mut enqueued, more).await,
            "enqueueing failed"
        );
    }
    tokio::task::block_in_place(|| g.count_conflicts_from_now());
    let dir = tempfile::Builder::new()
        .prefix("jobvisor-topology-")
        .tempdir()
        .unwrap();
    let nodes_urls = if spread { urls } else { vec![urls[0].clone()] };
    let mut fleet = Fleet::new(node_binary(), nodes_urls, dir.path());
    fleet.env.push(("RUST_LOG".into(), RETRY_LOG_FILTER.into()));
    let t = Instant::now();
    for _ in 0..NODES {
        fleet.spawn();
    }
    loop {
        tokio::time::sleep(TICK).await;
        fleet.assert_all_running();
        if let Ok(p) = progress(&store).await {
            if p.terminal == enqueued {
                assert_eq!(p.succeeded, enqueued, "every job of {db} succeeds");
                break;
            }
        }
        assert!(
            t.elapsed() < TOPOLOGY_DRAIN_LIMIT,
            "{db}: the drain took longer than {TOPOLOGY_DRAIN_LIMIT:?}"
        );
    }
    let took = t.elapsed();
    let conflicts = tokio::task::block_in_place(|| g.conflicts());
    let mut problems = Vec::new();
    fleet.stop_all(&mut problems);
    assert!(problems.is_empty(), "{db}: {problems:?}");
    let per_k = |n: f64| n * 1000.0 / jobs as f64;
    Drain {
        jobs_per_s: jobs as f64 / took.as_secs_f64(),
        conflicts_per_k: per_k(conflicts as f64),
        retries_per_k: per_k(retries_logged(&fleet) as f64),
    }
}
