//! The seed's store faults: one [`NodeFaults`] per node, installed on that node's store
//! (`StoreEngine::inject_faults`). Each decides its node's operations in the order the node
//! makes them, from a generator seeded by the run's seed and the node's name, so the faults
//! are a function of the seed as long as each node's operations are (the driver steps the
//! fleet one action at a time). A crashed node's store fails everything before it applies.
//! All plans of a run share one [`Book`]: the operations in flight (the driver waits for
//! none) and the faults injected.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jobvisor::testing::{Fault, FaultPlan, StoreOp};

use crate::rng::{fnv, Rng, FNV_START};

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
}

/// One node's plan.
pub(crate) struct NodeFaults {
    book: Arc<Book>,
    rng: Mutex<Rng>,
    /// Faults per thousand operations.
    per_mille: u64,
    dead: AtomicBool,
}

impl NodeFaults {
    pub(crate) fn new(book: Arc<Book>, seed: u64, node: &str, per_mille: u64) -> NodeFaults {
        NodeFaults {
            book,
            rng: Mutex::new(Rng::new(fnv(node.as_bytes(), FNV_START ^ seed))),
            per_mille,
            dead: AtomicBool::new(false),
        }
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
        let kind = rng.below(3);
        if !self.book.on.load(Ordering::SeqCst) || roll >= self.per_mille {
            return Fault::None;
        }
        self.book.injected.fetch_add(1, Ordering::SeqCst);
        match kind {
            0 => Fault::FailBefore,
            1 => Fault::LoseAnswer,
            _ => Fault::PastDeadline,
        }
    }

    fn end(&self, _op: StoreOp) {
        self.book.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
