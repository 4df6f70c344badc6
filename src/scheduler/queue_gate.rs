//! [`QueueGate`]: what one node knows of a queue's pause at the moment a handler would start,
//! so that a pause holds where users look — at the handler's start, not only at the claim
//! (ARCHITECTURE.md §7.5).
//!
//! The claim reads the settings from the database and is exact; but a job claimed before a
//! pause, waiting in the prefetch, would start after it. So every attempt checks its queue's
//! gate at its start ([`Attempt::try_start`](super::attempt::Attempt::try_start)): a paused
//! queue's attempts never start, and go back to the queue without using an attempt. The
//! queue watch (`queue_watch.rs`) sets the gate as soon as the database's settings change.
//!
//! The gate also carries what the node's fair share of a global limit is computed from
//! (`fair_share.rs`): the queue's global concurrency limit, kept by the queue watch, and
//! this node's rank among the live nodes serving the queue, kept by the registrar.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A node's view of one queue's shared settings, read at every start; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct QueueGate {
    paused: AtomicBool,
    /// The queue's global concurrency limit (0: none).
    limit: AtomicU32,
    /// This node's rank (high half) among the live nodes serving the queue (low half; 0:
    /// not known).
    peers: AtomicU64,
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

    /// The queue's global concurrency limit, if it has one.
    pub(crate) fn limit(&self) -> Option<u32> {
        Some(self.limit.load(Ordering::Acquire)).filter(|l| *l > 0)
    }

    /// Records the queue's global concurrency limit (`None`: none).
    pub(crate) fn set_limit(&self, limit: Option<u32>) {
        self.limit.store(limit.unwrap_or(0), Ordering::Release);
    }

    /// This node's rank among the live nodes serving the queue, and how many there are
    /// (`None`: not known yet).
    pub(crate) fn peers(&self) -> Option<(u32, u32)> {
        let v = self.peers.load(Ordering::Acquire);
        let (rank, nodes) = ((v >> 32) as u32, v as u32);
        (nodes > 0).then_some((rank, nodes))
    }

    /// Records this node's rank among `nodes` live nodes serving the queue.
    pub(crate) fn set_peers(&self, rank: u32, nodes: u32) {
        self.peers.store(
            (u64::from(rank) << 32) | u64::from(nodes),
            Ordering::Release,
        );
    }

    /// This node's share of the queue's global limit at wall-clock second `second`
    /// (`None`: no share applies — no limit, or one node). See `fair_share.rs`.
    pub(crate) fn fair_cap(&self, second: u64) -> Option<u32> {
        let limit = self.limit()?;
        let (rank, nodes) = self.peers()?;
        super::fair_share::fair_cap(limit, nodes, rank, second)
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

    #[test]
    fn a_share_needs_a_limit_and_several_nodes() {
        let g = QueueGate::default();
        assert_eq!(g.fair_cap(0), None);
        g.set_peers(1, 3);
        assert_eq!(g.fair_cap(0), None, "no limit");
        g.set_limit(Some(7));
        assert_eq!(g.peers(), Some((1, 3)));
        assert_eq!(
            g.fair_cap(0),
            Some(2),
            "rank 0 has the remainder at second 0"
        );
        assert_eq!(g.fair_cap(1), Some(3), "rank 1 at second 1");
        g.set_peers(0, 1);
        assert_eq!(g.fair_cap(0), None, "alone");
    }
}
