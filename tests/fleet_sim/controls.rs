//! The controls the seed drives beside plain jobs, and the driver's record of them for the
//! checks (`check_controls.rs`):
//!
//! * **Queues.** Every node serves `default` (concurrency 1, prefetch 1) and [`LIMITED`]
//!   (concurrency 3, prefetch 1), whose shared limits the run sets once through a client
//!   ([`Limits`]: a global concurrency of 1–3, below what two nodes can run, and on half the
//!   seeds a rate of 2–4 starts per [`RATE_PERIOD`]).
//! * **Pauses.** The seed pauses and resumes either queue through a node's client and has
//!   nodes read their queues' settings (what a node's queue watch does every 80 ms). A
//!   pause is *known* to hold from its answer (or, if the answer was lost, from a read-back
//!   that finds the queue paused) until the next resume is sent, whatever that resume's
//!   answer: a pause whose answer and read-back were both lost may or may not have applied,
//!   and opens no window ([`PauseWindow`]).
//! * **Claims.** Each node's `Claimed` events, drained after each step, numbered in the
//!   journal's order.
//! * **Schedule.** Every node declares [`SCHEDULE`], every [`SCHEDULE_EVERY`] with every
//!   missed fire run ([`MissedFires::All`]); the run stores it once at start and records its
//!   first fire, and the final phase records the instant of the last pass that fired. Beside
//!   it the seed adds, changes and removes a schedule at run time through a node's client
//!   (`runtime_schedule.rs`), recorded in [`Controls::runtime`].
//! * **Sequences and deadlines** are jobs, not settings: `sequences.rs` and `deadlines.rs`
//!   enqueue them, their payloads say what the checks need.
//! * **Dependencies.** Children (`child`, policy `cancel` or `run`) and batches (members
//!   `work`, callback `callback`): their parents are read back from the database at the
//!   end (`Client::dependencies`), so a child whose enqueue answer was lost is checked too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jobvisor::schedule::{MissedFires, Schedule};
use jobvisor::scheduler::Event;
use jobvisor::{NewJob, QueueConfig, QueueLimits, RateLimit, SchedulerBuilder};
use serde_json::json;
use tokio::sync::broadcast;

use crate::fleet::{Fleet, Status};
use crate::journal::Journal;
use crate::log::EventLog;
use crate::rng::Rng;
use crate::runtime_schedule::{RuntimeOp, RUNTIME_KIND};

/// The queue with shared limits.
pub(crate) const LIMITED: &str = "limited";
/// The queues every node serves.
pub(crate) const QUEUES: [&str; 2] = ["default", LIMITED];
/// The kinds every node runs, all with the journaling handler.
const KINDS: [&str; 5] = ["work", "tick", "child", "callback", RUNTIME_KIND];
/// The schedule every node declares.
pub(crate) const SCHEDULE: &str = "tick";
/// Its interval.
pub(crate) const SCHEDULE_EVERY: Duration = Duration::from_secs(5);
/// The rate limit's period.
pub(crate) const RATE_PERIOD: Duration = Duration::from_secs(4);
/// Tries of a setting the run needs in place before its steps (faults are on).
const SETUP_TRIES: usize = 100;

/// Declares what every node serves: the queues, the handlers of every kind, the schedule.
pub(crate) fn serve(b: SchedulerBuilder, journal: &Arc<Journal>, node: &str) -> SchedulerBuilder {
    let mut b = b
        .queue("default", QueueConfig::default().concurrency(1).prefetch(1))
        .queue(LIMITED, QueueConfig::default().concurrency(3).prefetch(1))
        .periodic(
            Schedule::every(
                SCHEDULE,
                SCHEDULE_EVERY,
                NewJob::new("tick", json!({})).max_attempts(3),
            )
            .missed(MissedFires::All { max: 1_000 }),
        );
    for kind in KINDS {
        b = b.handler(kind, journal.handler(node));
    }
    b
}

/// The limited queue's shared limits, drawn by the seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most handlers running at once, across the fleet.
    pub(crate) concurrency: u32,
    /// Most starts in any [`RATE_PERIOD`], if limited.
    pub(crate) rate: Option<u32>,
}

impl Limits {
    pub(crate) fn draw(rng: &mut Rng) -> Limits {
        Limits {
            concurrency: 1 + rng.below(3) as u32,
            rate: rng.chance(500).then(|| 2 + rng.below(3) as u32),
        }
    }

    fn queue_limits(self) -> QueueLimits {
        let limits = QueueLimits::default().concurrency(self.concurrency);
        match self.rate {
            Some(n) => limits.rate(RateLimit::new(n, RATE_PERIOD).unwrap()),
            None => limits,
        }
    }
}

/// A stretch of the run's order during which a queue was known to be paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PauseWindow {
    pub(crate) queue: String,
    /// When the pause was known to hold (its answer, or a read-back that found it).
    pub(crate) from: u64,
    /// When the next resume was sent (`None`: never).
    pub(crate) to: Option<u64>,
}

/// A claim a node reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) node: String,
    pub(crate) job: i64,
    pub(crate) attempt: u32,
    pub(crate) queue: String,
    /// Its place in the run's order: after the claim, before anything of the next step.
    pub(crate) seq: u64,
}

/// The driver's record of the controls.
pub(crate) struct Controls {
    pub(crate) limits: Limits,
    pub(crate) windows: Vec<PauseWindow>,
    /// Successful reads of the settings: (node, place in the run's order).
    pub(crate) reads: Vec<(String, u64)>,
    pub(crate) claims: Vec<Claim>,
    /// The schedule's first fire as stored at the start, µs.
    pub(crate) first_fire_us: i64,
    /// The manual clock at the last pass of the final phase that fired, µs.
    pub(crate) last_pass_us: Option<i64>,
    /// The acts on the run-time schedule, in order.
    pub(crate) runtime: Vec<RuntimeOp>,
    /// The replacing enqueues answered `replaced` (`replace.rs`), in order.
    pub(crate) replaces: Vec<crate::replace::Act>,
    events: Vec<(String, broadcast::Receiver<Event>)>,
}

impl Controls {
    /// Sets the limited queue's limits and stores the schedule, retrying through the store
    /// faults, and starts listening to the nodes' claims. Logs what it took.
    pub(crate) async fn set_up(fleet: &Fleet, rng: &mut Rng, log: &mut EventLog) -> Controls {
        let limits = Limits::draw(rng);
        let sim = &fleet.nodes[0].sim;
        let mut tries = 1;
        while sim
            .client
            .set_queue_limits(LIMITED, limits.queue_limits())
            .await
            .is_err()
        {
            tries += 1;
            assert!(
                tries <= SETUP_TRIES,
                "seed {}: limits never set",
                fleet.seed
            );
        }
        log.line(format!("limits {limits:?} set in {tries} tries"));
        let mut tries = 1;
        let first_fire_us = loop {
            if sim.sync_schedules().await.is_ok() {
                if let Ok(list) = sim.client.schedules().await {
                    let next = list
                        .iter()
                        .find(|s| s.name == SCHEDULE)
                        .and_then(|s| s.next_fire_at)
                        .expect("the schedule is stored with a next fire");
                    break next.timestamp_micros();
                }
            }
            tries += 1;
            assert!(
                tries <= SETUP_TRIES,
                "seed {}: schedule never stored",
                fleet.seed
            );
        };
        log.line(format!(
            "schedule {SCHEDULE} stored in {tries} tries, first fire at {first_fire_us} µs"
        ));
        let mut controls = Controls {
            limits,
            windows: Vec::new(),
            reads: Vec::new(),
            claims: Vec::new(),
            first_fire_us,
            last_pass_us: None,
            runtime: Vec::new(),
            replaces: Vec::new(),
            events: Vec::new(),
        };
        controls.listen(fleet);
        controls
    }

    /// Listens to the claims of the nodes started since the last call.
    pub(crate) fn listen(&mut self, fleet: &Fleet) {
        for n in &fleet.nodes[self.events.len()..] {
            self.events.push((n.name.clone(), n.sim.handle.events()));
        }
    }

    /// Records the claims the nodes reported since the last call (a crashed node's leftover
    /// actors claim nothing: its store refuses everything).
    pub(crate) fn drain_claims(&mut self, fleet: &Fleet) {
        let seq = fleet.journal.mark();
        self.drain_claims_at(fleet, seq);
    }

    /// [`drain_claims`](Self::drain_claims), the claims placed at `seq` in the run's order.
    fn drain_claims_at(&mut self, fleet: &Fleet, seq: u64) {
        for (i, (node, rx)) in self.events.iter_mut().enumerate() {
            let crashed = fleet.nodes[i].status == Status::Crashed;
            while let Ok(e) = rx.try_recv() {
                if let Event::Claimed {
                    id, attempt, queue, ..
                } = e
                {
                    if !crashed {
                        self.claims.push(Claim {
                            node: node.clone(),
                            job: id.0,
                            attempt,
                            queue,
                            seq,
                        });
                    }
                }
            }
        }
    }

    /// Whether the driver knows `queue` is paused.
    pub(crate) fn known_paused(&self, queue: &str) -> bool {
        self.open(queue).is_some()
    }

    /// Whether the driver knows `queue` is paused (a window is open).
    fn open(&self, queue: &str) -> Option<usize> {
        self.windows
            .iter()
            .rposition(|w| w.queue == queue && w.to.is_none())
    }

    /// Pauses `queue` through node `at`'s client; answers the log line.
    pub(crate) async fn pause(&mut self, fleet: &Fleet, at: usize, queue: &str) -> String {
        self.drain_claims(fleet);
        let sim = &fleet.nodes[at].sim;
        let answer = sim.client.pause_queue(queue, "the seed").await;
        let (paused, how) = match answer {
            Ok(_) => (Some(true), "paused".to_string()),
            Err(_) => self.read_back(fleet, at, queue, "pause").await,
        };
        if paused == Some(true) && self.open(queue).is_none() {
            self.windows.push(PauseWindow {
                queue: queue.into(),
                from: fleet.journal.mark(),
                to: None,
            });
        }
        how
    }

    /// Resumes `queue` through node `at`'s client; answers the log line.
    pub(crate) async fn resume(&mut self, fleet: &Fleet, at: usize, queue: &str) -> String {
        // Whatever its answer, the resume may apply from the moment it is sent.
        let sent = fleet.journal.mark();
        if let Some(w) = self.open(queue) {
            self.windows[w].to = Some(sent);
        }
        let sim = &fleet.nodes[at].sim;
        let (paused, how) = match sim.client.resume_queue(queue).await {
            Ok(_) => (Some(false), "resumed".to_string()),
            Err(_) => self.read_back(fleet, at, queue, "resume").await,
        };
        if paused == Some(true) {
            self.windows.push(PauseWindow {
                queue: queue.into(),
                from: fleet.journal.mark(),
                to: None,
            });
        }
        how
    }

    /// After an unanswered pause or resume: reads the queue's state back (up to three
    /// tries); answers whether it is paused (`None`: unknown) and the log line.
    async fn read_back(
        &self,
        fleet: &Fleet,
        at: usize,
        queue: &str,
        what: &str,
    ) -> (Option<bool>, String) {
        for _ in 0..3 {
            if let Ok(info) = fleet.nodes[at].sim.client.queue(queue).await {
                let paused = info.is_some_and(|i| i.is_paused());
                return (
                    Some(paused),
                    format!("{what} unanswered; read back: paused {paused}"),
                );
            }
        }
        (None, format!("{what} unanswered; read back failed"))
    }

    /// Node `at` reads its queues' settings and applies them; answers the log line.
    pub(crate) async fn read_settings(&mut self, fleet: &Fleet, at: usize) -> String {
        let node = &fleet.nodes[at];
        match node.sim.try_read_settings().await {
            Ok(()) => {
                self.reads.push((node.name.clone(), fleet.journal.mark()));
                "read".into()
            }
            Err(_) => "failed".into(),
        }
    }

    /// Node `at` claims from `queue`, and the claim's answer is held in the network while
    /// the node's client pauses the queue and the node reads its settings; then the answer
    /// arrives. The claim applied before the pause, so it took jobs; the pause's give-back
    /// ran before the node tracked them, so only its start gate's pause check keeps their
    /// handlers from starting (§7.5: no start after the node learnt of the pause). Answers
    /// the log line.
    pub(crate) async fn pause_in_flight(
        &mut self,
        fleet: &Fleet,
        at: usize,
        queue: &str,
    ) -> String {
        let node = &fleet.nodes[at];
        let (held, release) = node.faults.hold_next_claim_answer();
        // The claim's place in the run's order: before the pause's window opens.
        let claimed = fleet.journal.mark();
        let fetch = node.sim.fetch(queue);
        tokio::pin!(fetch);
        tokio::select! {
            n = &mut fetch => {
                // Nothing claimed without a fault (no free slot, a fault, the gate closed).
                node.faults.disarm();
                return format!("{n}, no answer held");
            }
            _ = held => {}
        }
        let paused = self.pause(fleet, at, queue).await;
        let read = self.read_settings(fleet, at).await;
        let _ = release.send(());
        let n = fetch.await;
        self.drain_claims_at(fleet, claimed);
        format!("{n}, answer held while pause → {paused}, read settings → {read}")
    }

    /// Resumes every queue the run may have left paused, through node `at` (faults off).
    pub(crate) async fn resume_all(&mut self, fleet: &Fleet, at: usize) -> Vec<String> {
        let mut lines = Vec::new();
        for q in QUEUES {
            lines.push(format!("resume {q} → {}", self.resume(fleet, at, q).await));
        }
        lines
    }
}

/// The policy names of the dependencies read back at the end: child → its parents.
pub(crate) type Parents = BTreeMap<i64, Vec<(i64, jobvisor::ParentPolicy)>>;

/// Reads the parents of every child and callback among `jobs` through `client`.
pub(crate) async fn parents(client: &jobvisor::Client, jobs: &[jobvisor::Job]) -> Parents {
    let mut out = Parents::new();
    for j in jobs
        .iter()
        .filter(|j| j.kind == "child" || j.kind == "callback")
    {
        let deps = client.dependencies(j.id).await.unwrap();
        out.insert(
            j.id.0,
            deps.parents.iter().map(|l| (l.id.0, l.policy)).collect(),
        );
    }
    out
}
