//! [`LeaderTerm`]: whether this node leads the database, and under which term, as the
//! [`LeaderElector`](super::leader_elector::LeaderElector) last established it — readable by any task of the
//! node (the gauge refresh asks before doing leader-only work).
//!
//! Like a job's lease estimate ([`Attempt`](super::attempt::Attempt)), it is conservative: the term is
//! valid until the send time of the renewal that confirmed it plus the leader lease minus a
//! margin, on the monotonic clock, so a process that was frozen past its leadership knows it
//! is no longer leader before any store answer tells it. Leader-only writes carry the term
//! and are fenced by the database as well (`store::leader`); this is the first line.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::attempt::us;

/// No term held.
const NONE: i64 = -1;

/// The node's leadership; see the module docs.
#[derive(Debug)]
pub(crate) struct LeaderTerm {
    term: AtomicI64,
    valid_until_us: AtomicI64,
    /// Woken when this node begins a term (not when it renews one).
    elected: Notify,
}

impl Default for LeaderTerm {
    fn default() -> Self {
        LeaderTerm {
            term: AtomicI64::new(NONE),
            valid_until_us: AtomicI64::new(i64::MIN),
            elected: Notify::new(),
        }
    }
}

impl LeaderTerm {
    /// This node holds `term` until `valid_until` (monotonic) at least.
    pub(crate) fn hold(&self, term: i64, valid_until: Duration) {
        // Validity first: a reader that sees the new term sees a validity at least this new.
        self.valid_until_us
            .store(us(valid_until), Ordering::Release);
        if self.term.swap(term, Ordering::AcqRel) != term {
            self.elected.notify_waiters();
        }
    }

    /// Resolves when this node next begins a term (leader work that runs at an interval
    /// starts at once on a new leader instead of an interval later). It counts from its
    /// creation, not its first poll: a term begun after this call and before the wait still
    /// wakes it.
    pub(crate) fn elected(&self) -> Notified<'_> {
        self.elected.notified()
    }

    /// No term held any more.
    pub(crate) fn clear(&self) {
        self.term.store(NONE, Ordering::Release);
        self.valid_until_us.store(i64::MIN, Ordering::Release);
    }

    /// The term this node leads under at `now` (monotonic), if its estimate still holds.
    pub(crate) fn current(&self, now: Duration) -> Option<i64> {
        let term = self.term.load(Ordering::Acquire);
        (term != NONE && self.valid_until_us.load(Ordering::Acquire) > us(now)).then_some(term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_holds_until_its_estimate_ends() {
        let t = LeaderTerm::default();
        let s = Duration::from_secs(1);
        assert_eq!(t.current(s), None);
        t.hold(3, 10 * s);
        assert_eq!(t.current(9 * s), Some(3));
        assert_eq!(t.current(10 * s), None, "not at or past its end");
        t.clear();
        assert_eq!(t.current(s), None);
    }

    #[tokio::test]
    async fn a_new_term_wakes_the_waiters_and_a_renewal_does_not() {
        let t = std::sync::Arc::new(LeaderTerm::default());
        let s = Duration::from_secs(1);
        let waiter = |t: &std::sync::Arc<LeaderTerm>| {
            let t = t.clone();
            tokio::spawn(async move { t.elected().await })
        };
        let w = waiter(&t);
        tokio::task::yield_now().await;
        t.hold(1, 10 * s);
        tokio::time::timeout(s, w).await.unwrap().unwrap();
        let w = waiter(&t);
        tokio::task::yield_now().await;
        t.hold(1, 20 * s);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!w.is_finished(), "a renewal of term 1 is not an election");
        t.hold(2, 30 * s);
        tokio::time::timeout(s, w).await.unwrap().unwrap();
    }
}
