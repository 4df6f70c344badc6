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
//! All plans of a run share one [`Book`]: the operations in flight (the driver waits for
//! none), the faults injected and the writes held.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jobvisor::testing::{Fault, FaultPlan, Late, StoreOp};

use crate::rng::{fnv, Rng, FNV_START};

/// How many steps after it was sent a held write lands: long enough that its sender's
/// leases often lapse and their jobs are claimed again before it lands (with 10..60 no CI
/// seed caught a finalization without its token guard once each seed drew its own steps).
const HOLD_STEPS: std::ops::Range<u64> = 30..90;
/// The round of the final phase from which the writes still held land.
pub(crate) const HEAL_LANDING: usize = 12;

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
    /// Faults per thousand operations.
    per_mille: u64,
    dead: AtomicBool,
    /// The step until which the node's connection is stalled behind a held write.
    stalled_until: AtomicUsize,
}

impl NodeFaults {
    pub(crate) fn new(book: Arc<Book>, seed: u64, node: &str, per_mille: u64) -> NodeFaults {
        NodeFaults {
            book,
            node: node.to_string(),
            rng: Mutex::new(Rng::new(fnv(node.as_bytes(), FNV_START ^ seed))),
            per_mille,
            dead: AtomicBool::new(false),
            stalled_until: AtomicUsize::new(0),
        }
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

impl FaultPlan for NodeFaults {
    fn begin(&self, _op: StoreOp) -> Fault {
        self.book.in_flight.fetch_add(1, Ordering::SeqCst);
        self.book.begun.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            return Fault::FailBefore;
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
        let after = HOLD_STEPS.start
            + self
                .rng
                .lock()
                .unwrap()
                .below(HOLD_STEPS.end - HOLD_STEPS.start);
        let at = self.book.step.load(Ordering::SeqCst) + after as usize;
        self.stalled_until.fetch_max(at, Ordering::SeqCst);
        self.book.held.lock().unwrap().push(Held {
            at,
            node: self.node.clone(),
            late,
        });
    }

    fn end(&self, _op: StoreOp) {
        self.book.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
