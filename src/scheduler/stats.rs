//! [`Stats`]: a node's running totals, counted by the actors and read through
//! [`SchedulerHandle::stats`](super::SchedulerHandle::stats) from any thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Running totals of one node (monotonic counters, cheap to read from any thread).
#[derive(Debug, Default)]
pub struct Stats {
    claimed: AtomicU64,
    finished: AtomicU64,
    lease_lost: AtomicU64,
    claim_statements: AtomicU64,
    finalize_statements: AtomicU64,
    renew_statements: AtomicU64,
}

/// A snapshot of [`Stats`] (serializable, for a status endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    /// Jobs claimed by this node.
    pub claimed: u64,
    /// Finalizations written (succeeded, retrying, dead, cancelled, requeued).
    pub finished: u64,
    /// Jobs whose lease this node found lost (renewal or finalization refused, or fenced).
    pub lease_lost: u64,
    /// Claim statements sent (each claims a batch).
    pub claim_statements: u64,
    /// Finalization statements sent (each writes a batch).
    pub finalize_statements: u64,
    /// Renewal statements sent (one per heartbeat).
    pub renew_statements: u64,
}

impl Stats {
    pub(crate) fn add_claimed(&self, n: u64) {
        self.claimed.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_finished(&self, n: u64) {
        self.finished.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_lease_lost(&self, n: u64) {
        self.lease_lost.fetch_add(n, Relaxed);
    }

    pub(crate) fn count_claim(&self) {
        self.claim_statements.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_finalize(&self) {
        self.finalize_statements.fetch_add(1, Relaxed);
    }

    pub(crate) fn count_renew(&self) {
        self.renew_statements.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Relaxed),
            finished: self.finished.load(Relaxed),
            lease_lost: self.lease_lost.load(Relaxed),
            claim_statements: self.claim_statements.load(Relaxed),
            finalize_statements: self.finalize_statements.load(Relaxed),
            renew_statements: self.renew_statements.load(Relaxed),
        }
    }
}
