//! The fleet: N real nodes (`Scheduler` actors under `testing::Simulation`, timers off) on
//! one private SQLite database in memory (a file on tmpfs, `/dev/shm` where there is one),
//! each on a store of its own (as a process would be) under its own fault plan, all on one
//! manual clock — the database's time — which each node reads through a [`NodeClock`] of its
//! own: a wall clock the seed makes jump, a monotonic clock it makes drift within bounds
//! (its rate is drawn when the node starts, from the seed and the node's name, and logged;
//! [`Fleet::clock_event`] changes one node's clock at a step). Each node serves what
//! `controls.rs` declares. The driver acts on one node at a time and then [`Fleet::settle`]s: waits
//! until no store operation is in flight, every live node's mailboxes are drained and its
//! finalizations written, and every released handler has ended — so what happens next
//! depends on the seed alone. As it settles it checks that a job ends once (§6 invariant 2):
//! no job is claimed after a settle in which a node reported its end (succeeded, dead,
//! cancelled: reported only once written); as nodes are elected, that a term never
//! regresses ([`Fleet::elected`]).
//!
//! The store is SQLite's own engine, not a second one written for the simulation: the
//! conformance suite runs unchanged against exactly this store (tmpfs, calls inline, a fault
//! plan asked before every guarded operation: `store_conformance simulated::`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobvisor::clock::ManualClock;
use jobvisor::scheduler::Event;
use jobvisor::testing::{
    sim_config, FlushFinalizations, GetFetcherStatus, GetLeaseManagerStatus, Simulation,
    StoreEngine as _, StoreOp,
};
use jobvisor::{Job, JobState, ListParams, Store, StoreOptions};
use tokio::sync::broadcast;

use crate::clock::{NodeClock, MAX_JUMP_S, MAX_RATE_PPM};
use crate::faults::{Book, NodeFaults};
use crate::journal::{Journal, Release};
use crate::log::EventLog;
use crate::rng::{fnv, Rng, FNV_START};

/// Real time a settle may take before the run is declared stuck.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// Polls in a row (1 ms apart) that must see a quiet fleet unchanged.
const STABLE_POLLS: usize = 3;

/// How long after a hidden freeze ends its node may still act on a lease it believed in
/// before the freeze: the lease (30 s). The node's clock lost the freeze, so a claim or
/// renewal sent before it reaches its fence point up to 25 s (the fence point's distance
/// from the send) after the resume; whatever the node sends after the resume is measured
/// right again.
pub(crate) const BLIND_FOR: Duration = Duration::from_secs(30);

/// Where a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Driven.
    Live,
    /// Not driven (its process paused) since `since_us` on the manual clock until step
    /// `until`; then a zombie. `hidden`: its monotonic clock stands still meanwhile
    /// ([`NodeClock::stand_still`]).
    Frozen {
        until: usize,
        since_us: i64,
        hidden: bool,
    },
    /// Gone, with no goodbye.
    Crashed,
}

/// One node.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) sim: Simulation,
    clock: Arc<NodeClock>,
    pub(crate) faults: Arc<NodeFaults>,
    events: broadcast::Receiver<Event>,
    pub(crate) status: Status,
}

/// What a frozen node does first as it wakes, before its deadline check (`Deadlines`:
/// nothing else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// One of its waiting handlers returns.
    Handler,
    /// Every one of its waiting handlers returns, one after the other, then its renewal goes
    /// out, checked as it lands (a virtual machine resumed with its handlers mid-way:
    /// `run.rs`'s long stop).
    Handlers,
    /// Its renewal goes out.
    Renewal,
    /// Nothing: the deadline check comes first.
    Deadlines,
}

/// The nodes, their database, clock, journal and fault book.
pub(crate) struct Fleet {
    url: String,
    pub(crate) seed: u64,
    pub(crate) clock: ManualClock,
    pub(crate) journal: Arc<Journal>,
    pub(crate) book: Arc<Book>,
    pub(crate) nodes: Vec<Node>,
    /// Each freeze: the node, from and to on the manual clock.
    pub(crate) freezes: Vec<(String, i64, i64)>,
    /// Each freeze hidden from its node's clock: the node, from, and the end of the span in
    /// which it may act on what it believed before the freeze ([`BLIND_FOR`] past the resume).
    pub(crate) blind: Vec<(String, i64, i64)>,
    /// What the checks made as writes landed found (`check_landing.rs`), and claims of a
    /// job after a node reported its end.
    pub(crate) violations: Vec<String>,
    /// Jobs a node reported ended (succeeded, dead, cancelled: the end was written), with
    /// the settle that reported it and how.
    ended: BTreeMap<i64, (usize, String)>,
    /// Settles so far.
    settles: usize,
    /// The highest term an election answered, and to which node.
    top_term: Option<(u64, String)>,
    per_mille: u64,
    /// Lines for the event log at the next settle (the clocks of nodes started).
    notes: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Fleet {
    /// A migrated database and `n` nodes.
    pub(crate) async fn new(seed: u64, n: usize, per_mille: u64) -> Fleet {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::Builder::new().prefix("jv-sim").tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
        Store::connect_with(&url, StoreOptions::default().migrate(true))
            .await
            .unwrap();
        let clock = ManualClock::at_fixed_start();
        let mut fleet = Fleet {
            url,
            seed,
            journal: Journal::new(clock.clone(), seed),
            clock,
            book: Arc::default(),
            nodes: Vec::new(),
            freezes: Vec::new(),
            blind: Vec::new(),
            violations: Vec::new(),
            ended: BTreeMap::new(),
            settles: 0,
            top_term: None,
            per_mille,
            notes: Vec::new(),
            _dir: dir,
        };
        fleet.book.on.store(true, Ordering::SeqCst);
        for i in 0..n {
            fleet.add_node(&format!("n{i}")).await;
        }
        fleet
    }

    /// Starts node `name` (a fresh process: its own store, its own fault plan).
    pub(crate) async fn add_node(&mut self, name: &str) {
        let store = Store::connect_with(&self.url, StoreOptions::default().pool_size(1))
            .await
            .unwrap();
        let faults = Arc::new(NodeFaults::new(
            self.book.clone(),
            self.clock.clone(),
            self.seed,
            name,
            self.per_mille,
        ));
        store.inject_faults(faults.clone());
        let mut rng = Rng::new(fnv(name.as_bytes(), FNV_START ^ self.seed ^ CLOCK_SALT));
        let rate = rate_ppm(&mut rng);
        let clock = Arc::new(NodeClock::new(self.clock.clone(), rate));
        self.notes
            .push(format!("  {name}: monotonic clock rate {rate:+} ppm"));
        // The handlers run on the run's one thread, like the actors and the SQLite calls.
        let view: Arc<dyn jobvisor::clock::Clock> = clock.clone();
        let sim = Simulation::on_store_with_clock(store, self.clock.clone(), view, name, |b| {
            crate::controls::serve(
                b.config(sim_config()).handlers_on_current_runtime(),
                &self.journal,
                name,
            )
        });
        self.journal.watch_pauses(name, sim.pause_view());
        let events = sim.handle.events();
        self.nodes.push(Node {
            name: name.to_string(),
            sim,
            clock,
            faults,
            events,
            status: Status::Live,
        });
    }

    /// The nodes the driver may act on, in order.
    pub(crate) fn drivable(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].status == Status::Live)
            .collect()
    }

    /// The step's clock event, drawn from the step's generator `rng` (always the same draws,
    /// whatever happens): with a chance of 10 %, a node not crashed — a frozen one half the
    /// time if there is one (a suspended machine's clock is the one stepped on waking) — has
    /// its wall clock jump (to a new offset within ±[`MAX_JUMP_S`]) or its monotonic clock's
    /// rate change (within ±[`MAX_RATE_PPM`]). Logs it.
    pub(crate) fn clock_event(&mut self, rng: &mut Rng, step: usize, log: &mut EventLog) {
        let (roll, pick, frozen, jump, offset_s) = (
            rng.below(1000),
            rng.below(64) as usize,
            rng.chance(500),
            rng.chance(500),
            rng.below(2 * MAX_JUMP_S as u64 + 1) as i64 - MAX_JUMP_S,
        );
        let rate = rate_ppm(rng);
        let is_frozen = |s: Status| matches!(s, Status::Frozen { .. });
        let mut up: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].status != Status::Crashed)
            .collect();
        if frozen && up.iter().any(|i| is_frozen(self.nodes[*i].status)) {
            up.retain(|i| is_frozen(self.nodes[*i].status));
        }
        if roll >= 100 || up.is_empty() {
            return;
        }
        let node = &self.nodes[up[pick % up.len()]];
        if jump {
            node.clock.jump_to(offset_s);
            log.line(format!(
                "{step}: clock {}: wall clock jumps to {offset_s:+} s off",
                node.name
            ));
        } else {
            node.clock.drift(rate);
            log.line(format!(
                "{step}: clock {}: monotonic clock rate {rate:+} ppm",
                node.name
            ));
        }
    }

    /// Freezes node `i` until step `until`; `hidden`: its monotonic clock stands still
    /// until then.
    pub(crate) fn freeze(&mut self, i: usize, until: usize, hidden: bool) {
        let since_us = self.now_us();
        if hidden {
            self.nodes[i].clock.stand_still();
        }
        self.nodes[i].status = Status::Frozen {
            until,
            since_us,
            hidden,
        };
    }

    /// Resumes node `i` (frozen) as a zombie: first, as `wake` says, one of its waiting
    /// handlers takes its last step (it returns success), or its overdue renewal fires, or
    /// nothing; then its overdue deadline check, which stops the handlers whose fence point
    /// passed while it slept. Logs it and settles.
    pub(crate) async fn resume(&mut self, i: usize, wake: Wake, log: &mut EventLog, at: &str) {
        let Status::Frozen {
            since_us, hidden, ..
        } = self.nodes[i].status
        else {
            return;
        };
        let now = self.now_us();
        self.freezes
            .push((self.nodes[i].name.clone(), since_us, now));
        if hidden {
            self.nodes[i].clock.run_on();
            let blind_to = now + i64::try_from(BLIND_FOR.as_micros()).unwrap();
            self.blind
                .push((self.nodes[i].name.clone(), since_us, blind_to));
        }
        self.nodes[i].status = Status::Live;
        let name = self.nodes[i].name.clone();
        match wake {
            Wake::Handler => {
                if let Some((idx, job, attempt)) = self.journal.waiting(&name).first().copied() {
                    self.journal.release(idx, Release::Success);
                    log.line(format!(
                        "{at}: {name} wakes; its handler of job {job} attempt {attempt} returns"
                    ));
                    self.settle(log).await;
                }
            }
            Wake::Handlers => {
                for (idx, job, attempt) in self.journal.waiting(&name) {
                    self.journal.release(idx, Release::Success);
                    log.line(format!(
                        "{at}: {name} wakes; its handler of job {job} attempt {attempt} returns"
                    ));
                    self.settle(log).await;
                }
                // Then its overdue renewal, of leases it still believes in: what it changes
                // is checked as a held renewal's landing is (`check_landing.rs`).
                let before = self.all_jobs().await;
                let r = self.nodes[i].sim.renew().await;
                let after = self.all_jobs().await;
                // Only jobs running under one same holder throughout: the node's own actors
                // claim and finish jobs meanwhile (its handlers' ends freed their workers).
                let owner = |j: &Job| j.lease.as_ref().map(|l| l.owner.to_string());
                let same: BTreeMap<i64, Option<String>> =
                    before.iter().map(|j| (j.id.0, owner(j))).collect();
                let after: Vec<Job> = after
                    .into_iter()
                    .filter(|j| {
                        j.state == JobState::Running
                            && same.get(&j.id.0).is_some_and(|o| *o == owner(j))
                    })
                    .collect();
                self.violations
                    .extend(crate::check_landing::check(&name, &before, &after));
                log.line(format!(
                    "{at}: {name}'s renewal → renewed {} lost {}",
                    r.renewed, r.lost
                ));
                self.settle(log).await;
            }
            Wake::Renewal => {
                // Timers overdue together fire in any order: a renewal of leases whose
                // fence point passed in the sleep may go out before the deadline check.
                let r = self.nodes[i].sim.renew().await;
                log.line(format!(
                    "{at}: {name} wakes; its renewal → renewed {} lost {}",
                    r.renewed, r.lost
                ));
                self.settle(log).await;
            }
            Wake::Deadlines => {}
        }
        let stopped = self.nodes[i].sim.check_deadlines().await;
        log.line(format!(
            "{at}: resume {} (a zombie now): deadlines → {stopped}",
            self.nodes[i].name
        ));
        self.settle(log).await;
    }

    /// Moves the clock by `d`; every live node's deadline check fires, as its timer would in
    /// that time (a node frozen meanwhile misses it: that is its freeze), one node at a
    /// time, each settled before the next. Logs it.
    pub(crate) async fn advance(&mut self, d: Duration, log: &mut EventLog, at: &str) {
        self.clock.advance(d);
        log.line(format!("{at}: advance {} ms", d.as_millis()));
        // One node at a time, each settled before the next.
        for i in self.drivable() {
            let stopped = self.nodes[i].sim.check_deadlines().await;
            log.line(format!("  {}: deadlines → {stopped}", self.nodes[i].name));
            self.settle(log).await;
        }
    }

    /// Forgets that job `id` ended: an operator retried it by hand (`operator.rs`), so it
    /// may be claimed again.
    pub(crate) fn forget_end(&mut self, id: i64) {
        self.ended.remove(&id);
    }

    /// Records what `node`'s election answered (`Some`: it leads under that term) and checks
    /// that a term never regresses (§6 invariant 11: each election raises the term, a renewal
    /// keeps it): no election answers a term below one answered before. A node in the blind
    /// span of a freeze hidden from its clock is not judged: an election whose statement failed
    /// answers the term the node still believes in, which the database may have let go.
    pub(crate) fn elected(&mut self, node: &str, term: Option<u64>) {
        let Some(term) = term else { return };
        let now = self.now_us();
        if self
            .blind
            .iter()
            .any(|(n, from, to)| n == node && (*from..=*to).contains(&now))
        {
            return;
        }
        if let Some((top, by)) = &self.top_term {
            if term < *top {
                self.violations.push(format!(
                    "term: {node} was elected under term {term}, after {by} led under term {top}"
                ));
                return;
            }
        }
        self.top_term = Some((term, node.to_string()));
    }

    /// Lands the held writes due at `step` (every one: `None`), in the order held, each at
    /// the database's clock now and then settled: a statement sent in time, applied late.
    /// Logs each.
    pub(crate) async fn land(&mut self, step: Option<usize>, log: &mut EventLog, at: &str) {
        use jobvisor::clock::Clock as _;
        for h in self.book.due(step) {
            let op = h.late.op();
            // What a renewal or a settle changes is checked around its landing
            // (`check_landing.rs`).
            let before = if matches!(op, StoreOp::Renew | StoreOp::Settle) {
                Some(self.all_jobs().await)
            } else {
                None
            };
            // And what a fire changes (the schedules, the leader as it lands).
            let schedules = if op == StoreOp::Fire {
                Some(self.reader().schedules().await.unwrap())
            } else {
                None
            };
            // And what a take of the gauges' turn changes (the turn, the leader as it lands).
            let turn = if op == StoreOp::Gauges {
                Some(self.reader_sim().gauge_turn().await.unwrap())
            } else {
                None
            };
            let how = match h.late.apply(self.clock.bound_now()).await {
                Ok(()) => "applied",
                Err(_) => "error",
            };
            if let Some(before) = before {
                let after = self.all_jobs().await;
                self.violations.extend(if op == StoreOp::Renew {
                    crate::check_landing::check(&h.node, &before, &after)
                } else {
                    crate::check_landing::check_settle(&h.node, &before, &after)
                });
            }
            if let Some(before) = schedules {
                let after = self.reader().schedules().await.unwrap();
                let leader = self.reader().leader().await.unwrap();
                self.violations.extend(crate::check_landing::check_fire(
                    &h.node,
                    self.now_us(),
                    &before,
                    &after,
                    leader.as_ref(),
                ));
            }
            if let Some(before) = turn {
                let after = self.reader_sim().gauge_turn().await.unwrap();
                let leader = self.reader().leader().await.unwrap();
                self.violations.extend(crate::check_landing::check_gauges(
                    &h.node,
                    self.now_us(),
                    &before,
                    &after,
                    leader.as_ref(),
                ));
            }
            log.line(format!(
                "{at}: {}'s held {} lands → {how}",
                h.node,
                op.name()
            ));
            self.settle(log).await;
        }
    }

    /// Every job in the database, read through the first node not crashed (a read is
    /// never a store fault's operation).
    pub(crate) async fn all_jobs(&self) -> Vec<Job> {
        let client = self.reader();
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = client
                .list(ListParams {
                    after,
                    limit: 1000,
                    ..ListParams::default()
                })
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            out.extend(page);
        }
        out
    }

    /// The client of the first node not crashed: reads go through it (a read is never a
    /// store fault's operation).
    fn reader(&self) -> &jobvisor::Client {
        &self.reader_sim().client
    }

    /// The first node not crashed.
    fn reader_sim(&self) -> &Simulation {
        let node = self
            .nodes
            .iter()
            .find(|n| n.status != Status::Crashed)
            .unwrap_or(&self.nodes[0]);
        &node.sim
    }

    pub(crate) fn now_us(&self) -> i64 {
        use jobvisor::clock::Clock as _;
        self.clock.now().timestamp_micros()
    }

    /// Crashes node `i`: its store refuses everything from now on, its actors stop without
    /// a goodbye, its handlers' executions end now.
    pub(crate) fn crash(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.faults.kill();
        node.sim.crash();
        node.status = Status::Crashed;
        self.journal.crashed(&node.name);
    }

    /// Waits until the fleet is quiescent, then logs what the live nodes reported. After a
    /// stall (`faults.rs`: the clock moved on as a claim's answer arrived), every live
    /// node's deadline check fires, as its timer would have in that time, one node at a
    /// time, each settled before the next.
    pub(crate) async fn settle(&mut self, log: &mut EventLog) {
        loop {
            self.settle_once(log).await;
            let stalls = std::mem::take(&mut *self.book.stalls.lock().unwrap());
            if stalls.is_empty() {
                return;
            }
            for (node, ms) in stalls {
                log.line(format!(
                    "  {node}: stalls {ms} ms as a claim's answer arrives"
                ));
            }
            for i in self.drivable() {
                let stopped = self.nodes[i].sim.check_deadlines().await;
                log.line(format!("  {}: deadlines → {stopped}", self.nodes[i].name));
                self.settle_once(log).await;
            }
        }
    }

    /// [`settle`](Self::settle), stalls aside.
    async fn settle_once(&mut self, log: &mut EventLog) {
        let started = Instant::now();
        let mut last = None;
        let mut stable = 0;
        loop {
            let mut fp = Vec::new();
            let mut pending = 0;
            for i in self.drivable() {
                let sim = &self.nodes[i].sim;
                let lm = sim.lease_manager();
                let s = lm.send(GetLeaseManagerStatus).await.unwrap_or_default();
                // A node stalled behind a held write cannot write its finalizations: they
                // wait for the stall to end.
                if s.pending > 0 && !self.nodes[i].faults.stalled() {
                    pending += s.pending;
                    let _ = lm.send(FlushFinalizations).await;
                }
                let mut busy = Vec::new();
                for q in crate::controls::QUEUES {
                    let f = sim.fetcher(q).send(GetFetcherStatus).await;
                    busy.push(f.map(|f| f.busy).unwrap_or(0));
                }
                fp.push((s.tracked, s.pending, busy));
            }
            let (released, changes) = self.journal.progress();
            let queued: usize = self.nodes.iter().map(|n| n.events.len()).sum();
            let in_flight = self.book.in_flight.load(Ordering::SeqCst);
            let begun = self.book.begun.load(Ordering::SeqCst);
            let now = (fp, released, changes, queued, in_flight, begun);
            let quiet = in_flight == 0 && released == 0 && pending == 0;
            // Quiet, and nothing moved over the last polls (a handler thread of a loaded
            // machine may take a moment to start the next handler when one ends).
            if quiet && last.as_ref() == Some(&now) {
                stable += 1;
                if stable >= STABLE_POLLS {
                    break;
                }
            } else {
                stable = 0;
            }
            last = Some(now);
            assert!(
                started.elapsed() < SETTLE_LIMIT,
                "seed {}: the fleet did not settle within {SETTLE_LIMIT:?} (in flight {in_flight}, \
                 released handlers running {released}, finalizations pending {pending})",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for note in self.notes.drain(..) {
            log.line(note);
        }
        // Within one settle, a node's events are logged in a stable order: supervisors
        // started together may report in either order, and what they did is what counts.
        self.settles += 1;
        let mut ends = Vec::new();
        for node in &mut self.nodes {
            let mut lines = Vec::new();
            while let Ok(e) = node.events.try_recv() {
                // What a crashed node's leftover actors report is no process's doing.
                if node.status == Status::Crashed {
                    continue;
                }
                if let Some(line) = describe(&e) {
                    lines.push(format!("  {}: {line}", node.name));
                }
                match &e {
                    // A job ends once (§6 invariant 2): none is claimed after a settle in
                    // which a node reported its end written.
                    Event::Claimed { id, attempt, .. } => {
                        if let Some((at, how)) = self.ended.get(&id.0) {
                            if *at < self.settles {
                                self.violations.push(format!(
                                    "ends once: {} claimed job {} attempt {attempt} after {how}",
                                    node.name, id.0
                                ));
                            }
                        }
                    }
                    Event::Finished { id, state, .. } if state.is_terminal() => {
                        ends.push((id.0, format!("{} reported it {state}", node.name)));
                    }
                    _ => {}
                }
            }
            lines.sort();
            for l in lines {
                log.line(l);
            }
        }
        for (id, how) in ends {
            self.ended.entry(id).or_insert((self.settles, how));
        }
    }
}

/// Mixed into a node's clock generator: its draws differ from its fault plan's.
const CLOCK_SALT: u64 = 0xc10c_c10c_c10c_c10c;

/// A monotonic clock's rate error: the bound either way a third of the time each (the bound
/// is what the design must tolerate), else anywhere within it.
fn rate_ppm(rng: &mut Rng) -> i64 {
    let (kind, any) = (rng.below(3), rng.below(2 * MAX_RATE_PPM as u64 + 1) as i64);
    match kind {
        0 => -MAX_RATE_PPM,
        1 => MAX_RATE_PPM,
        _ => any - MAX_RATE_PPM,
    }
}

/// An event as a log line, without what a run draws at random (claim ids, durations).
fn describe(e: &Event) -> Option<String> {
    Some(match e {
        Event::Claimed { id, attempt, .. } => format!("claimed job {} attempt {attempt}", id.0),
        Event::Started { id, attempt, .. } => format!("started job {} attempt {attempt}", id.0),
        Event::Finished {
            id,
            attempt,
            state,
            code,
            ..
        } => format!("finished job {} attempt {attempt}: {state} {code:?}", id.0),
        Event::LeaseLost { id, .. } => format!("lease lost job {}", id.0),
        Event::SelfFenced { id, .. } => format!("self-fenced job {}", id.0),
        Event::Dropped { id, .. } => format!("dropped job {}", id.0),
        _ => return None,
    })
}
