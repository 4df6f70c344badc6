//! [`QueueGate`]: what one node knows of a queue's pause at the moment a handler would start,
//! so that a pause holds where users look — at the handler's start, not only at the claim
//! (ARCHITECTURE.md §7.5).
//!
//! The claim reads the settings from the database and is exact; but a job claimed before a
//! pause, waiting in the prefetch, would start after it. So every attempt checks its queue's
//! gate at its start ([`Attempt::try_start`](super::attempt::Attempt::try_start)): a paused
//! queue's attempts never start, and go back to the queue without using an attempt. The
//! queue watch (`queue_watch.rs`) sets the gate as soon as the database's settings change.

use std::sync::atomic::{AtomicBool, Ordering};

/// A node's view of one queue's shared settings, read at every start; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct QueueGate {
    paused: AtomicBool,
}

impl QueueGate {
    /// Whether the queue is paused, as this node last learnt.
    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Records the queue's pause state; answers whether it changed.
    pub(crate) fn set_paused(&self, paused: bool) -> bool {
        self.paused.swap(paused, Ordering::AcqRel) != paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_reports_only_changes() {
        let g = QueueGate::default();
        assert!(!g.paused());
        assert!(g.set_paused(true));
        assert!(!g.set_paused(true));
        assert!(g.paused());
        assert!(g.set_paused(false));
        assert!(!g.paused());
    }
}
