//! The seed's store faults: one [`NodeFaults`] per node, installed on that node's store
//! (`StoreEngine::inject_faults`). Each decides its node's operations in the order the node
//! makes them, from a generator seeded by the run's seed and the node's name, so the faults
//! are a function of the seed as long as each node's operations are (the driver steps the
//! fleet one action at a time). A crashed node's store fails everything before it applies.
//! A write held ([`Fault::ApplyLate`]: its sender sees a timeout) lands at a step the node's
//! generator drew, [`HOLD_STEPS`] on — after a crash of its sender too: it was sent in time
//! (the final phase lands those left after [`HEAL_LANDING`] rounds). Until it lands, its
//! node's connection is stalled behind it: the node's other operations fail before they
//! apply (not counted as injected), so it cannot renew, its fence points pass and its leases
//! expire — and the write lands after its sender's lease moved on, as a statement stuck in a
//! socket buffer or a proxy does.
//! A node may also stall as a claim's answer arrives ([`STALLS`]: a pause of its process,
//! a starved thread): the shared clock moves on before the node acts on the answer, so its
//! handlers start late — past the rate-limited claim's start margin, or past the fence
//! point — unless the start gate refuses them. Nothing else runs meanwhile; the driver then
//! fires every node's deadline check, as their timers would have in that time.
//! A node's elections, schedule fires and takes of the gauges' turn, and its settles of
//! ended parents' children, meet faults too, each kind drawn from a generator of its own
//! (so the other operations' faults are what they were without them), a fire at
//! [`FIRE_PER_MILLE`], a take at [`GAUGE_PER_MILLE`] and a settle at [`SETTLE_PER_MILLE`]: a
//! fire or a take held lands after its sender's leader lease may have lapsed — the write
//! the term guard exists for — and an election refused while the node's
//! connection is stalled lets that lease lapse; a settle held lands only in the final phase
//! (from [`HEAL_LANDING`]), after the sweeper's backstop released its children and they ran
//! — the write the release-once guard exists for.
//! All plans of a run share one [`Book`]: the operations in flight (the driver waits for
//! none), the faults injected, the writes held and the stalls.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jobvisor::clock::ManualClock;
use jobvisor::testing::{Answering, Fault, FaultPlan, Late, StoreOp};
use tokio::sync::oneshot;

use crate::rng::{fnv, Rng, FNV_START};

/// How many steps after it was sent a held write lands: long enough that its sender's
/// leases often lapse and their jobs are claimed again before it lands (with 10..60 no CI
/// seed caught a finalization without its token guard once each seed drew its own steps).
const HOLD_STEPS: std::ops::Range<u64> = 30..90;
/// The round of the final phase from which the writes still held land.
pub(crate) const HEAL_LANDING: usize = 12;
/// A renewal meets a fault this many times as often as another operation (the extra ones
/// all held).
const RENEW_HELD: u64 = 3;
/// Stalls per thousand claims answered (drawn from a generator of the node's own, apart
/// from the faults', so a seed's faults are what they were without stalls).
const STALL_PER_MILLE: u64 = 60;
/// How long a stall lasts: half of them past the rate-limited start margin (50 ms) but well
/// inside the lease, half past the fence point (25 s of a 30 s lease) but not past the
/// lease itself, so the job is still the stalled node's in the database when it would start.
pub(crate) const STALLS: [std::ops::Range<u64>; 2] = [60..3_900, 25_100..29_500];
/// Salt of a node's stall generator.
const STALL_SALT: u64 = 0x57a1_1ed0_c1a1_3e75;
/// Salt of a node's generator for its leader operations (elections and schedule fires),
/// apart from the others' so that a seed's other faults are what they were without them.
const LEADER_SALT: u64 = 0x1ead_e500_f17e_5a17;
/// Faults per thousand schedule fires, in a run with faults at all: a node fires a few
/// times a run, and a fire held past its sender's term is the write the fire's term guard
/// exists for (`check_landing.rs`).
const FIRE_PER_MILLE: u64 = 600;
/// Salt of a node's generator for its settles, apart from the others'.
const SETTLE_SALT: u64 = 0x5e77_1e00_c41d_0e5e;
/// Faults per thousand settles (a parent's children released), in a run with faults at
/// all: a held settle that lands after the sweeper's backstop released the child is the
/// write the release-once guard exists for.
const SETTLE_PER_MILLE: u64 = 600;
/// Salt of a node's generator for its takes of the gauges' turn, apart from the others'.
const GAUGE_SALT: u64 = 0x6a06_e500_7a4e_0001;
/// Faults per thousand takes of the gauges' turn, in a run with faults at all: a take held
/// past its sender's term is the write the gauges' term guard exists for.
const GAUGE_PER_MILLE: u64 = 600;

/// Salt of a node's generator for its handler transactions' commits, apart from the others'.
const COMMIT_SALT: u64 = 0xc0_3317_0000_0013;
/// Faults per thousand commits of a handler's transaction, in a run with faults at all: a
/// commit whose answer is lost after it applied is the case effect records exist for.
const COMMIT_PER_MILLE: u64 = 600;

/// What every node's plan shares.
#[derive(Debug, Default)]
pub(crate) struct Book {
    /// Operations begun and not ended.
    pub(crate) in_flight: AtomicUsize,
    /// Operations begun.
    pub(crate) begun: AtomicUsize,
    /// Faults injected (a crashed node's refusals not counted).
    pub(crate) injected: AtomicUsize,
    /// Whether faults are injected at all (off for the final phase).
    pub(crate) on: AtomicBool,
    /// The driver's step now (a held write's landing step counts from it).
    pub(crate) step: AtomicUsize,
    /// Writes held, in the order held.
    pub(crate) held: Mutex<Vec<Held>>,
    /// Stalls not yet seen by the driver: the node and how long, in ms.
    pub(crate) stalls: Mutex<Vec<(String, u64)>>,
}

/// A write held by [`Fault::ApplyLate`].
#[derive(Debug)]
pub(crate) struct Held {
    /// The step at (or after) which it lands.
    pub(crate) at: usize,
    /// Its sender.
    pub(crate) node: String,
    /// The write.
    pub(crate) late: Late,
}

impl Book {
    /// The held writes due at `step` (every one: `None`), in the order held.
    pub(crate) fn due(&self, step: Option<usize>) -> Vec<Held> {
        let mut held = self.held.lock().unwrap();
        let (due, rest) = std::mem::take(&mut *held)
            .into_iter()
            .partition(|h| step.is_none_or(|s| h.at <= s));
        *held = rest;
        due
    }
}

/// One node's plan.
pub(crate) struct NodeFaults {
    book: Arc<Book>,
    node: String,
    rng: Mutex<Rng>,
    /// Draws the stalls, apart from `rng`.
    stall_rng: Mutex<Rng>,
    /// Draws the faults of elections and fires, apart from `rng`.
    leader_rng: Mutex<Rng>,
    /// Draws the faults of settles, apart from the others.
    settle_rng: Mutex<Rng>,
    /// Draws the faults of gauge turns' takes, apart from the others.
    gauge_rng: Mutex<Rng>,
    /// Draws the faults of handler transactions' commits, apart from the others.
    commit_rng: Mutex<Rng>,
    /// The run's clock, moved by a stall.
    clock: ManualClock,
    /// Faults per thousand operations.
    per_mille: u64,
    dead: AtomicBool,
    /// The step until which the node's connection is stalled behind a held write.
    stalled_until: AtomicUsize,
    /// The next claim's answer, to hold ([`NodeFaults::hold_next_claim_answer`]).
    answer_hold: Mutex<Option<AnswerHold>>,
}

/// A claim's answer held by the driver: told when it is held, waits for its release.
struct AnswerHold {
    held: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

impl NodeFaults {
    pub(crate) fn new(
        book: Arc<Book>,
        clock: ManualClock,
        seed: u64,
        node: &str,
        per_mille: u64,
    ) -> NodeFaults {
        NodeFaults {
            book,
            node: node.to_string(),
            rng: Mutex::new(Rng::new(fnv(node.as_bytes(), FNV_START ^ seed))),
            stall_rng: Mutex::new(Rng::new(fnv(
                node.as_bytes(),
                FNV_START ^ seed ^ STALL_SALT,
            ))),
            leader_rng: Mutex::new(Rng::new(fnv(
                node.as_bytes(),
                FNV_START ^ seed ^ LEADER_SALT,
            ))),
            settle_rng: Mutex::new(Rng::new(fnv(
                node.as_bytes(),
                FNV_START ^ seed ^ SETTLE_SALT,
            ))),
            gauge_rng: Mutex::new(Rng::new(fnv(
                node.as_bytes(),
                FNV_START ^ seed ^ GAUGE_SALT,
            ))),
            commit_rng: Mutex::new(Rng::new(fnv(
                node.as_bytes(),
                FNV_START ^ seed ^ COMMIT_SALT,
            ))),
            clock,
            per_mille,
            dead: AtomicBool::new(false),
            stalled_until: AtomicUsize::new(0),
            answer_hold: Mutex::new(None),
        }
    }

    /// Holds the node's next claim that applies without a fault before its answer reaches
    /// the node: the receiver hears when it is held (its rows claimed and committed), the
    /// sender releases the answer. A hold no claim took stays until [`disarm`](Self::disarm).
    pub(crate) fn hold_next_claim_answer(&self) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (held, held_rx) = oneshot::channel();
        let (release_tx, release) = oneshot::channel();
        *self.answer_hold.lock().unwrap() = Some(AnswerHold { held, release });
        (held_rx, release_tx)
    }

    /// Drops a hold no claim took.
    pub(crate) fn disarm(&self) {
        self.answer_hold.lock().unwrap().take();
    }

    /// Whether the node's connection is stalled behind a held write now.
    pub(crate) fn stalled(&self) -> bool {
        self.book.on.load(Ordering::SeqCst)
            && self.book.step.load(Ordering::SeqCst) < self.stalled_until.load(Ordering::SeqCst)
    }

    /// The node crashed: nothing of it reaches the database any more.
    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }
}

impl NodeFaults {
    /// As a claim's answer arrives: maybe stall, moving the run's clock on before the node
    /// acts on the answer (not while faults are off, nor on a dead or stalled node).
    fn stall(&self) {
        let mut rng = self.stall_rng.lock().unwrap();
        // Drawn on every claim, so whether faults are on changes no later draw.
        let (roll, long) = (rng.below(1000), rng.chance(500));
        let range = &STALLS[usize::from(long)];
        let ms = range.start + rng.below(range.end - range.start);
        if roll >= STALL_PER_MILLE
            || !self.book.on.load(Ordering::SeqCst)
            || self.dead.load(Ordering::SeqCst)
            || self.stalled()
        {
            return;
        }
        self.clock.advance(std::time::Duration::from_millis(ms));
        self.book
            .stalls
            .lock()
            .unwrap()
            .push((self.node.clone(), ms));
    }
}

impl NodeFaults {
    /// The generator `op`'s faults are drawn from: elections and fires, settles, and gauge
    /// turns have one each of their own, so that adding them changed no other fault of a
    /// seed.
    fn generator(&self, op: StoreOp) -> &Mutex<Rng> {
        match op {
            StoreOp::Elect | StoreOp::Fire => &self.leader_rng,
            StoreOp::Settle => &self.settle_rng,
            StoreOp::Gauges => &self.gauge_rng,
            StoreOp::Commit => &self.commit_rng,
            _ => &self.rng,
        }
    }

    /// The fault of an election, a schedule fire, a settle or a gauge turn's take (the node
    /// not dead), from its own generator: at [`FIRE_PER_MILLE`] for a fire,
    /// [`SETTLE_PER_MILLE`] for a settle, [`GAUGE_PER_MILLE`] for a take and the run's rate
    /// for an election; refused before it applies while the node's
    /// connection is stalled behind a held write.
    fn own_fault(&self, op: StoreOp) -> Fault {
        let mut rng = self.generator(op).lock().unwrap();
        let (roll, kind) = (rng.below(1000), rng.below(5));
        if !self.book.on.load(Ordering::SeqCst) || self.per_mille == 0 {
            return Fault::None;
        }
        if self.stalled() {
            return Fault::FailBefore;
        }
        let rate = match op {
            StoreOp::Fire => FIRE_PER_MILLE,
            StoreOp::Settle => SETTLE_PER_MILLE,
            StoreOp::Gauges => GAUGE_PER_MILLE,
            StoreOp::Commit => COMMIT_PER_MILLE,
            _ => self.per_mille,
        };
        if roll >= rate {
            return Fault::None;
        }
        self.book.injected.fetch_add(1, Ordering::SeqCst);
        match kind {
            0 => Fault::FailBefore,
            1 => Fault::LoseAnswer,
            2 => Fault::PastDeadline,
            _ => Fault::ApplyLate,
        }
    }
}

impl FaultPlan for NodeFaults {
    fn begin(&self, op: StoreOp) -> Fault {
        self.book.in_flight.fetch_add(1, Ordering::SeqCst);
        self.book.begun.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            return Fault::FailBefore;
        }
        if matches!(
            op,
            StoreOp::Elect | StoreOp::Fire | StoreOp::Settle | StoreOp::Gauges | StoreOp::Commit
        ) {
            return self.own_fault(op);
        }
        let mut rng = self.rng.lock().unwrap();
        // Drawn whether or not faults are on, so turning them off changes no later draw.
        let roll = rng.below(1000);
        let kind = rng.below(5);
        if !self.book.on.load(Ordering::SeqCst) {
            return Fault::None;
        }
        if self.stalled() {
            return Fault::FailBefore;
        }
        // A renewal is also held at twice the rate again: a node renews a few times a run,
        // and a renewal landing on the lease of its job's next holder is the write the
        // renewal's token guard exists for (`check_landing.rs`).
        if op == StoreOp::Renew && roll >= self.per_mille && roll < RENEW_HELD * self.per_mille {
            self.book.injected.fetch_add(1, Ordering::SeqCst);
            return Fault::ApplyLate;
        }
        if roll >= self.per_mille {
            return Fault::None;
        }
        self.book.injected.fetch_add(1, Ordering::SeqCst);
        match kind {
            0 => Fault::FailBefore,
            1 => Fault::LoseAnswer,
            2 => Fault::PastDeadline,
            // Twice as likely as each other kind: the write every guard exists for.
            _ => Fault::ApplyLate,
        }
    }

    fn hold(&self, late: Late) {
        let rng = self.generator(late.op());
        let after = HOLD_STEPS.start + rng.lock().unwrap().below(HOLD_STEPS.end - HOLD_STEPS.start);
        let stall = self.book.step.load(Ordering::SeqCst) + after as usize;
        self.stalled_until.fetch_max(stall, Ordering::SeqCst);
        // A settle lands only in the final phase, once the sweeper's backstop has released
        // its children and they have run: the landing the release-once guard exists for.
        let at = if late.op() == StoreOp::Settle {
            usize::MAX
        } else {
            stall
        };
        self.book.held.lock().unwrap().push(Held {
            at,
            node: self.node.clone(),
            late,
        });
    }

    fn answer(&self, op: StoreOp) -> Option<Answering> {
        if op != StoreOp::Claim {
            return None;
        }
        let AnswerHold { held, release } = self.answer_hold.lock().unwrap().take()?;
        let _ = held.send(());
        Some(Box::pin(async move {
            let _ = release.await;
        }))
    }

    fn end(&self, op: StoreOp) {
        if op == StoreOp::Claim {
            self.stall();
        }
        self.book.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
