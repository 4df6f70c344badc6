//! One claimed attempt's start gate, shared by its [`JobSupervisor`](super::JobSupervisor)
//! (whose handler task starts the handler) and the [`LeaseManager`](super::LeaseManager)
//! (which renews, fences and gives back the lease) — ARCHITECTURE.md §6, invariants 8 and 9.
//!
//! Two atomics, both on the node's monotonic clock ([`Clock::monotonic`]):
//! * `fence_at`: the one deadline of the attempt, its **fence point** — the send time of the
//!   claim or of the last applied renewal, plus the lease, minus the fence margin
//!   ([`fence_point`]). It is computed once, where the claim or the renewal answers; every
//!   check reads it and none adds or subtracts anything: a handler starts only at an instant
//!   strictly before it, and a running handler is stopped at it. The database counted the
//!   lease from its own later "now", so the estimate is conservative, and a process that was
//!   frozen sees it pass by the time it runs again (the monotonic clock counts through a
//!   freeze).
//! * `started`: not started, dropped, or when the handler started.
//!
//! Two more conditions of a start come from the attempt's queue ([`QueueGate`]): no start
//! while the queue is paused, and — for a job claimed under a rate limit — none later than
//! [`RATE_START_MARGIN`](crate::RATE_START_MARGIN) after its claim was sent.
//!
//! A handler starts only through [`Attempt::try_start`], which checks the fence point and
//! claims the start in one compare-and-swap; the lease manager takes the lease away through
//! [`Attempt::revoke`], which closes the gate first. Whichever swap wins decides: a revoked
//! attempt never starts, and a started one is seen as started — so the lease manager knows
//! whether to give the job back at once (never started: the attempt is refunded) or to stop
//! the handler first.
//!
//! The attempt also carries its handler's progress reports to the lease manager
//! ([`ProgressCell`]), which writes them with its renewals.
//!
//! **Commits.** A handler's transaction on the job's store
//! ([`JobContext::transaction`](crate::JobContext::transaction)) takes its lease guard in SQL
//! and then commits through [`Attempt::begin_commit`], which refuses at or past the fence
//! point and races [`Attempt::revoke`] in one compare-and-swap (`commit`): a revoked attempt
//! never commits, and a committing one is not revoked — its row is locked by its own guard
//! until the commit ends, so no other node can take the job meanwhile, and the lease manager
//! and the handler's fence leave it to finish. A transaction that completed the job leaves
//! the attempt [`completed`](Attempt::completed): its lease is no longer renewed and the
//! lease manager writes nothing more for it.
//!
//! [`Clock::monotonic`]: crate::clock::Clock::monotonic

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::queue_gate::QueueGate;
use super::ProgressCell;
use crate::store::mutation::{on, Mutation};

/// `started` before the handler started.
const NOT_STARTED: i64 = i64::MIN;
/// `started` once the attempt was dropped before its handler started.
const DROPPED: i64 = i64::MIN + 1;

/// `commit`: no transaction of the handler is committing.
const OPEN: u8 = 0;
/// `commit`: a handler's transaction holds its lease guard and is committing.
const COMMITTING: u8 = 1;
/// `commit`: a handler's transaction completed the job (it is `succeeded` in the database).
const COMPLETED: u8 = 2;
/// `commit`: the lease was taken away; no transaction commits any more.
const CLOSED: u8 = 3;

/// The start gate of one claimed attempt; see the module docs.
#[derive(Debug)]
pub(crate) struct Attempt {
    fence_at_us: AtomicI64,
    started_us: AtomicI64,
    /// The running handler was self-fenced (by the lease manager or by its own task).
    fenced: AtomicBool,
    progress: ProgressCell,
    /// The queue's pause, read at the start.
    queue: Arc<QueueGate>,
    /// No start at or after this monotonic instant (µs) — a rate-limited claim's start
    /// margin; `i64::MAX` otherwise.
    start_by_us: i64,
    /// The job's start-by deadline as a monotonic instant (µs): the claim's send time plus
    /// the time the database left it at the claim (which it counted from its own later
    /// "now", so the estimate is early, as the fence point's is); `i64::MAX` without one.
    /// A start refused by it ends the job `expired`.
    expire_at_us: i64,
    /// A handler's transaction and the revoke: `OPEN`, `COMMITTING`, `COMPLETED` or
    /// `CLOSED` (see the module docs).
    commit: AtomicU8,
    /// The result a completing transaction stored (what the lease manager reports).
    completed_with: std::sync::Mutex<Option<serde_json::Value>>,
}

/// What [`Attempt::start`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// The handler may start: the start is recorded.
    Started,
    /// Not safe to start (the lease, the queue's pause, a rate margin) or taken away first:
    /// the job is given back.
    NotStarted,
    /// The job's start-by deadline was reached: it ends `expired`, never started.
    Expired,
}

/// What [`Attempt::revoke`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revoked {
    /// The handler had not started and now never will: give the job back.
    NotStarted,
    /// The handler task already found the lease unsafe and dropped the attempt itself (its
    /// supervisor reports the give-back).
    AlreadyDropped,
    /// The handler started at this monotonic instant (µs): stop it before giving anything
    /// back.
    Started(i64),
    /// A transaction of the handler holds its lease guard and is committing, or completed
    /// the job: nothing was taken away; its supervisor reports how it ended.
    Committing,
}

impl Attempt {
    /// A gate whose fence point is `fence_at`, of a queue no pause reaches (a handler's
    /// context made for a test).
    pub(crate) fn new(fence_at: Duration) -> Self {
        Self::of_claim(fence_at, Arc::default(), None, None)
    }

    /// The gate of an attempt of a queue whose settings this node knows as `queue`; a job
    /// claimed under a rate limit must start before `start_by` (monotonic), and a job with a
    /// start-by deadline before `expire_at` (monotonic).
    pub(crate) fn of_claim(
        fence_at: Duration,
        queue: Arc<QueueGate>,
        start_by: Option<Duration>,
        expire_at: Option<Duration>,
    ) -> Self {
        Attempt {
            fence_at_us: AtomicI64::new(us(fence_at)),
            started_us: AtomicI64::new(NOT_STARTED),
            fenced: AtomicBool::new(false),
            progress: ProgressCell::default(),
            queue,
            start_by_us: start_by.map_or(i64::MAX, us),
            expire_at_us: expire_at.map_or(i64::MAX, us),
            commit: AtomicU8::new(OPEN),
            completed_with: std::sync::Mutex::new(None),
        }
    }

    /// A handler's transaction, its lease guard taken in SQL, is about to commit at `now`
    /// (monotonic): true unless the fence point has been reached or the lease was taken
    /// away (then it must roll back). Until [`end_commit`](Self::end_commit) the attempt is
    /// neither revoked nor fenced.
    pub(crate) fn begin_commit(&self, now: Duration) -> bool {
        !self.lapsed(us(now))
            && self
                .commit
                .compare_exchange(OPEN, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The commit begun by [`begin_commit`](Self::begin_commit) ended: with the job completed
    /// (`Some(result)`: it is `succeeded` in the database), or not (committed without
    /// completing, or failed: the attempt goes on).
    pub(crate) fn end_commit(&self, completed: Option<serde_json::Value>) {
        let to = if completed.is_some() {
            if let Ok(mut r) = self.completed_with.lock() {
                *r = completed;
            }
            COMPLETED
        } else {
            OPEN
        };
        let _ = self
            .commit
            .compare_exchange(COMMITTING, to, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A transaction of the handler is committing, or completed the job: the lease is not to
    /// be fenced or reported lost (the transaction's own guard decides).
    pub(crate) fn committing(&self) -> bool {
        matches!(self.commit.load(Ordering::Acquire), COMMITTING | COMPLETED)
    }

    /// A handler's transaction completed the job.
    pub(crate) fn is_completed(&self) -> bool {
        self.commit.load(Ordering::Acquire) == COMPLETED
    }

    /// The result stored by the handler's transaction that completed the job, if one did.
    pub(crate) fn completed(&self) -> Option<serde_json::Value> {
        if self.commit.load(Ordering::Acquire) != COMPLETED {
            return None;
        }
        self.completed_with.lock().ok().and_then(|r| r.clone())
    }

    /// The handler's progress reports, on their way to the next renewal.
    pub(crate) fn progress(&self) -> &ProgressCell {
        &self.progress
    }

    /// The fence point (monotonic µs): no start at or after it, and no handler running past
    /// it; `i64::MIN` once revoked.
    pub(crate) fn fence_at_us(&self) -> i64 {
        self.fence_at_us.load(Ordering::Acquire)
    }

    /// Whether the fence point has been reached at `now` (monotonic µs).
    pub(crate) fn lapsed(&self, now_us: i64) -> bool {
        now_us >= self.fence_at_us()
    }

    /// A renewal sent at some instant was applied: its fence point is `fence_at`. Never
    /// moves the fence point back, and never reopens a revoked gate.
    pub(crate) fn extend(&self, fence_at: Duration) {
        let to = us(fence_at);
        let _ = self
            .fence_at_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v != i64::MIN && to > v).then_some(to)
            });
    }

    /// Starts the handler now (`now`, monotonic) if `now` is strictly before the fence
    /// point (and the start margin of a rate-limited claim) and the queue is not paused;
    /// otherwise the attempt is dropped and never starts.
    #[cfg_attr(not(test), allow(dead_code))] // the unit tests; the supervisor asks `start`
    pub(crate) fn try_start(&self, now: Duration) -> bool {
        self.start(now) == Start::Started
    }

    /// [`try_start`](Self::try_start), saying why a start was refused: [`Start::Expired`]
    /// when the job's start-by deadline was reached while the lease is still safe (this
    /// attempt then ends the job `expired`, under its token; the lease manager's revoke finds
    /// it dropped and gives nothing back).
    pub(crate) fn start(&self, now: Duration) -> Start {
        let now_us = us(now);
        let lapsed = self.lapsed(now_us) && !on(Mutation::StartFence);
        let expired = now_us >= self.expire_at_us && !on(Mutation::StartDeadline);
        let safe = !lapsed
            && (now_us < self.start_by_us || on(Mutation::StartRate))
            && (!self.queue.paused() || on(Mutation::StartPause))
            && !expired;
        let to = if safe {
            now_us.max(DROPPED + 1)
        } else {
            DROPPED
        };
        let won = self
            .started_us
            .compare_exchange(NOT_STARTED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        match (won, safe) {
            (true, true) => Start::Started,
            (true, false) if expired && !lapsed => Start::Expired,
            _ => Start::NotStarted,
        }
    }

    /// Records that the running handler is being self-fenced; true only for the first caller
    /// (the lease manager's deadline check and the handler task's own watch may both see the
    /// lease run short), so the fence is announced once.
    pub(crate) fn fence(&self) -> bool {
        !self.fenced.swap(true, Ordering::AcqRel)
    }

    /// When the handler started (monotonic µs), if it did.
    pub(crate) fn started_us(&self) -> Option<i64> {
        match self.started_us.load(Ordering::Acquire) {
            NOT_STARTED | DROPPED => None,
            t => Some(t),
        }
    }

    /// Withdraws an attempt whose handler has not started (its queue was paused): true if it
    /// now never will; false if it started (it runs on) or was dropped already.
    pub(crate) fn withdraw(&self) -> bool {
        let won = self
            .started_us
            .compare_exchange(NOT_STARTED, DROPPED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if won {
            self.fence_at_us.store(i64::MIN, Ordering::Release);
        }
        won
    }

    /// Takes the lease away: closes the gate, then reports whether the handler started —
    /// unless a transaction of the handler is committing or completed the job
    /// ([`Revoked::Committing`]: nothing is taken away).
    pub(crate) fn revoke(&self) -> Revoked {
        if let Err(COMMITTING | COMPLETED) =
            self.commit
                .compare_exchange(OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire)
        {
            return Revoked::Committing;
        }
        self.fence_at_us.store(i64::MIN, Ordering::Release);
        match self.started_us.compare_exchange(
            NOT_STARTED,
            DROPPED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Revoked::NotStarted,
            Err(DROPPED) => Revoked::AlreadyDropped,
            Err(t) => Revoked::Started(t),
        }
    }
}

/// A duration as µs, saturating.
pub(crate) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// How long before its estimated end a lease is treated as lost: no handler starts within
/// it, and a running handler is stopped (self-fenced) when its lease gets this close — a
/// sixth of the lease, at most 5 s (ARCHITECTURE.md §6, invariant 9).
pub(crate) fn fence_margin(lease: Duration) -> Duration {
    (lease / 6).min(Duration::from_secs(5))
}

/// The fence point of a claim or renewal sent at `sent_at` (monotonic) for `lease`: the
/// attempt's one deadline (see the module docs).
pub(crate) fn fence_point(sent_at: Duration, lease: Duration) -> Duration {
    (sent_at + lease).saturating_sub(fence_margin(lease))
}

/// The share of a start-by deadline's time left that the start gate gives up, a tenth: the
/// time left is counted on this node's monotonic clock, and one that runs up to 10 % slow
/// (the drift the fence margin also covers) must still never start a job at or past its
/// deadline (invariant 15). A job claimed more than about 28 s before its deadline starts or
/// is given back by its fence point first, untouched by this.
const DEADLINE_RATE_TOLERANCE: u32 = 10;

/// The instant (monotonic) from which a claim sent at `sent_at` whose job must start within
/// `left_us` of the database's claim is not started but ends expired: the send time (early,
/// as the fence point) plus nine tenths of the time left (see
/// [`DEADLINE_RATE_TOLERANCE`]); the send time itself for a deadline already past.
pub(crate) fn expire_point(sent_at: Duration, left_us: i64) -> Duration {
    let left = Duration::from_micros(u64::try_from(left_us).unwrap_or(0));
    sent_at + left - left / DEADLINE_RATE_TOLERANCE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_met_on_a_monotonic_clock_a_tenth_slow() {
        assert_eq!(expire_point(10 * S, 20_000_000), 28 * S);
        assert_eq!(expire_point(10 * S, -5), 10 * S, "already past: at once");
        // Real time from the send to the expire point, on a clock running 10 % slow
        // (0.9 s of its time a second): exactly the time left, never more.
        let left = 20 * S;
        let node_span = expire_point(Duration::ZERO, 20_000_000);
        assert!(node_span.mul_f64(1.0 / 0.9) <= left + US);
    }

    const S: Duration = Duration::from_secs(1);
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_fence_point_is_the_send_time_plus_the_lease_minus_the_margin() {
        assert_eq!(fence_point(10 * S, 6 * S), 15 * S);
        assert_eq!(fence_point(10 * S, 60 * S), 65 * S);
    }

    #[test]
    fn a_start_at_or_past_the_fence_point_is_refused_to_the_microsecond() {
        let f = 9 * S;
        let before = Attempt::new(f);
        assert!(before.try_start(f - US), "1 µs before: starts");
        assert_eq!(before.started_us(), Some(us(f - US)));
        let at = Attempt::new(f);
        assert!(!at.try_start(f), "exactly at the fence point: no");
        assert_eq!(at.revoke(), Revoked::AlreadyDropped);
        let after = Attempt::new(f);
        assert!(!after.try_start(f + US), "1 µs after: no");
        assert!(!after.lapsed(us(f - US)) && after.lapsed(us(f)));
    }

    #[test]
    fn an_attempt_starts_once_and_a_revoke_sees_the_start() {
        let a = Attempt::new(10 * S);
        assert!(a.try_start(8 * S));
        assert!(!a.try_start(8 * S), "an attempt starts once");
        assert_eq!(a.revoke(), Revoked::Started(us(8 * S)));
    }

    #[test]
    fn a_revoked_attempt_never_starts_and_a_dropped_one_is_reported() {
        let a = Attempt::new(10 * S);
        assert_eq!(a.revoke(), Revoked::NotStarted);
        a.extend(100 * S);
        assert_eq!(a.fence_at_us(), i64::MIN, "a renewal cannot reopen it");
        assert!(!a.try_start(S));
        assert_eq!(a.started_us(), None);

        let b = Attempt::new(2 * S);
        assert!(!b.try_start(3 * S), "fence point passed: dropped");
        assert_eq!(b.revoke(), Revoked::AlreadyDropped);
    }

    #[test]
    fn a_renewal_answering_exactly_at_the_fence_point() {
        // The deadline check ran first: the gate is closed and the renewal cannot reopen it.
        let checked_first = Attempt::new(5 * S);
        assert!(checked_first.lapsed(us(5 * S)));
        assert_eq!(checked_first.revoke(), Revoked::NotStarted);
        checked_first.extend(10 * S);
        assert!(!checked_first.try_start(5 * S));
        // The renewal was applied first: its later fence point holds, and a start at the old
        // one goes ahead (the renewal was sent before it, so the lease is proven).
        let renewed_first = Attempt::new(5 * S);
        renewed_first.extend(10 * S);
        assert!(!renewed_first.lapsed(us(5 * S)));
        assert!(renewed_first.try_start(5 * S));
        assert!(renewed_first.lapsed(us(10 * S)));
    }

    #[test]
    fn a_paused_queue_refuses_starts_and_withdraws_only_unstarted_attempts() {
        let q = Arc::new(QueueGate::default());
        let running = Attempt::of_claim(10 * S, q.clone(), None, None);
        assert!(running.try_start(S));
        q.set_paused(true);
        let waiting = Attempt::of_claim(10 * S, q.clone(), None, None);
        assert!(!waiting.try_start(2 * S), "paused: no start");
        let prefetched = Attempt::of_claim(10 * S, q.clone(), None, None);
        assert!(prefetched.withdraw(), "not started: withdrawn");
        assert!(!prefetched.try_start(2 * S));
        assert_eq!(prefetched.revoke(), Revoked::AlreadyDropped);
        assert!(!running.withdraw(), "a running handler runs on");
        assert_eq!(running.fence_at_us(), us(10 * S), "and keeps its lease");
        q.set_paused(false);
        assert!(Attempt::of_claim(10 * S, q, None, None).try_start(3 * S));
    }

    #[test]
    fn a_rate_limited_claim_starts_only_within_its_margin() {
        let q = Arc::new(QueueGate::default());
        let by = 2 * S;
        assert!(Attempt::of_claim(10 * S, q.clone(), Some(by), None).try_start(by - US));
        assert!(!Attempt::of_claim(10 * S, q.clone(), Some(by), None).try_start(by));
        assert!(!Attempt::of_claim(10 * S, q, Some(by), None).try_start(by + US));
    }

    #[test]
    fn a_start_at_or_past_the_deadline_expires_the_job_unless_the_lease_lapsed() {
        let q = Arc::new(QueueGate::default());
        let at = 2 * S;
        let gate = |q: &Arc<QueueGate>| Attempt::of_claim(10 * S, q.clone(), None, Some(at));
        assert_eq!(gate(&q).start(at - US), Start::Started);
        let expired = gate(&q);
        assert_eq!(expired.start(at), Start::Expired);
        assert_eq!(expired.started_us(), None, "never started");
        assert_eq!(
            expired.revoke(),
            Revoked::AlreadyDropped,
            "nothing to give back"
        );
        assert_eq!(gate(&q).start(at + S), Start::Expired);
        // Past the fence point the lease may be gone: given back, not ended here.
        assert_eq!(gate(&q).start(10 * S), Start::NotStarted);
        // Revoked first: not this attempt's to end.
        let revoked = gate(&q);
        assert_eq!(revoked.revoke(), Revoked::NotStarted);
        assert_eq!(revoked.start(at + S), Start::NotStarted);
    }

    #[test]
    fn a_fence_is_announced_once() {
        let a = Attempt::new(10 * S);
        assert!(a.fence());
        assert!(!a.fence());
    }

    #[test]
    fn renewals_only_move_the_fence_point_forward() {
        let a = Attempt::new(10 * S);
        a.extend(5 * S);
        assert_eq!(a.fence_at_us(), us(10 * S));
        a.extend(20 * S);
        assert_eq!(a.fence_at_us(), us(20 * S));
        assert!(a.try_start(18 * S));
    }

    #[test]
    fn the_margin_is_a_sixth_of_the_lease_at_most_five_seconds() {
        assert_eq!(fence_margin(6 * S), S);
        assert_eq!(fence_margin(60 * S), 5 * S);
    }

    #[test]
    fn a_commit_is_refused_at_or_past_the_fence_point_and_after_a_revoke() {
        let f = 9 * S;
        let at = Attempt::new(f);
        assert!(!at.begin_commit(f), "exactly at the fence point: no");
        assert!(!at.committing());
        let revoked = Attempt::new(f);
        assert!(revoked.try_start(S));
        assert_eq!(revoked.revoke(), Revoked::Started(us(S)));
        assert!(
            !revoked.begin_commit(2 * S),
            "a revoked attempt never commits"
        );
        let before = Attempt::new(f);
        assert!(before.begin_commit(f - US), "1 µs before: commits");
    }

    #[test]
    fn a_committing_attempt_is_not_revoked_and_a_completed_one_stays_so() {
        let a = Attempt::new(10 * S);
        assert!(a.try_start(S));
        assert!(a.begin_commit(2 * S));
        assert_eq!(a.revoke(), Revoked::Committing, "its own guard decides");
        assert!(
            a.committing() && !a.lapsed(us(3 * S)),
            "the gate stays open"
        );
        a.end_commit(Some(serde_json::json!("paid")));
        assert!(a.is_completed());
        assert_eq!(a.completed(), Some(serde_json::json!("paid")));
        assert_eq!(a.revoke(), Revoked::Committing);

        // A plain transaction's commit leaves the attempt as it was: revocable again.
        let b = Attempt::new(10 * S);
        assert!(b.try_start(S));
        assert!(b.begin_commit(2 * S));
        b.end_commit(None);
        assert!(!b.committing() && b.completed().is_none());
        assert_eq!(b.revoke(), Revoked::Started(us(S)));
    }
}
