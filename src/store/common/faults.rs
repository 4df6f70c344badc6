//! Store faults for simulation (feature `test-util` only): a [`FaultPlan`] installed on a
//! [`Store`](crate::store::Store) is asked before each operation of the hot path and the
//! maintenance path (claim, renew, finalize, enqueue, reclaim — every operation that runs
//! under the store's statement bound — the leader's election, schedule fires and gauge
//! turns, the settles of ended parents' children, and a handler transaction's commit) what
//! happens to it: nothing, a failure before it applies, an answer lost after it applied
//! (commit-unknown), an answer that arrives past the operation's bound (the caller sees the
//! bound's timeout error while the write stood), or a write held and applied later
//! ([`Late`]: sent in time, landing after its sender's lease or term moved on — the write
//! every token and term guard exists for). The plan also sees each operation end, so a
//! test can tell when none is in flight.
//!
//! Without the feature this file is not compiled and the store carries no field for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::params::{
    ClaimParams, ElectParams, FinalizeParams, FireParams, GaugeTurnParams, ReclaimParams,
    RenewParams, SettleParams,
};
use super::timeout::{bounded, timeout_error, Op, Phase};
use crate::error::{Error, Result, StoreError};

/// An operation a [`FaultPlan`] is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// A fetcher's claim.
    Claim,
    /// The lease manager's renewal (the heartbeat of held leases).
    Renew,
    /// The lease manager's finalization batch.
    Finalize,
    /// An enqueue.
    Enqueue,
    /// The sweeper's reclaim of expired leases and passed timeouts.
    Reclaim,
    /// The leader's fire of a due schedule (its jobs enqueued, its next fire moved on).
    Fire,
    /// A node's election or renewal of its leadership.
    Elect,
    /// One transaction of a settle: children of ended parents released or cancelled.
    Settle,
    /// A node's take of the database gauges' turn (on a scheduler's node, the leader's,
    /// fenced by its term).
    Gauges,
    /// The `COMMIT` of a handler's own transaction (`JobContext::transaction`,
    /// `complete_in_transaction`), its lease guard already applied. It fails before the
    /// database, loses its answer (commit-unknown: the case effect records exist for) or
    /// answers late; it is never held ([`Fault::ApplyLate`] loses the answer instead): its
    /// guard holds the job's row (SQLite's writer) until the commit, so nothing can move the
    /// lease on before it lands.
    Commit,
}

impl StoreOp {
    pub(crate) fn of(op: Op) -> StoreOp {
        match op {
            Op::Claim => StoreOp::Claim,
            Op::Renew => StoreOp::Renew,
            Op::Finalize => StoreOp::Finalize,
            Op::Enqueue => StoreOp::Enqueue,
            Op::Reclaim => StoreOp::Reclaim,
            Op::Fire => StoreOp::Fire,
            Op::Elect => StoreOp::Elect,
            Op::Settle => StoreOp::Settle,
            Op::Gauges => StoreOp::Gauges,
            Op::Commit => StoreOp::Commit,
        }
    }

    /// Its short name (`claim`, `renew`, …).
    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Renew => "renew",
            StoreOp::Finalize => "finalize",
            StoreOp::Enqueue => "enqueue",
            StoreOp::Reclaim => "reclaim",
            StoreOp::Fire => "fire",
            StoreOp::Elect => "elect",
            StoreOp::Settle => "settle",
            StoreOp::Gauges => "gauges",
            StoreOp::Commit => "commit",
        }
    }
}

/// What happens to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// It runs as usual.
    None,
    /// It fails with a transient error before reaching the database: nothing is written.
    FailBefore,
    /// It applies, then its answer is lost: the caller sees a transient error although the
    /// write committed (commit-unknown).
    LoseAnswer,
    /// It applies, but its answer comes after the operation's bound: the caller sees the
    /// bound's timeout error although the write committed.
    PastDeadline,
    /// It is held: the caller sees a transient error at once (its answer never comes), and
    /// the write applies only when whoever holds the [`Late`] handed to
    /// [`FaultPlan::hold`] applies it — a statement sent in time that lands after its
    /// sender's lease, term or version moved on. Every operation but an enqueue can be held
    /// (an enqueue meets [`Fault::LoseAnswer`] instead).
    ApplyLate,
}

/// The boxed future of a held write.
type Applying = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// A write held by [`Fault::ApplyLate`]: [`apply`](Late::apply) it later — the operation runs
/// then, as first sent, except that it reads the database's clock as of its application.
/// Dropped without being applied, the write never lands (lost in the network).
pub struct Late {
    op: StoreOp,
    apply: Box<dyn FnOnce(Option<DateTime<Utc>>) -> Applying + Send + Sync>,
}

impl Late {
    pub(crate) fn new(
        op: StoreOp,
        apply: impl FnOnce(Option<DateTime<Utc>>) -> Applying + Send + Sync + 'static,
    ) -> Late {
        Late {
            op,
            apply: Box::new(apply),
        }
    }

    /// The operation held.
    pub fn op(&self) -> StoreOp {
        self.op
    }

    /// Applies the write now, with `now` as the database's clock (`None`: its own), past any
    /// fault plan and bound; answers whether it ran (not what it changed: its guards decide
    /// that).
    ///
    /// # Errors
    /// The operation's own errors.
    pub async fn apply(self, now: Option<DateTime<Utc>>) -> Result<()> {
        (self.apply)(now).await
    }
}

impl std::fmt::Debug for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Late")
            .field("op", &self.op)
            .finish_non_exhaustive()
    }
}

/// Parameters whose database clock a held write re-reads when it lands.
pub(crate) trait AtNow {
    fn at_now(&mut self, now: Option<DateTime<Utc>>);
}

macro_rules! at_now {
    ($($t:ty),*) => {$(
        impl AtNow for $t {
            fn at_now(&mut self, now: Option<DateTime<Utc>>) {
                self.now = now;
            }
        }
    )*};
}
at_now!(
    ClaimParams,
    RenewParams,
    FinalizeParams,
    ReclaimParams,
    FireParams,
    ElectParams,
    SettleParams,
    GaugeTurnParams
);

/// Decides each operation's [`Fault`]; installed with `Store::inject_faults`.
pub trait FaultPlan: Send + Sync {
    /// Called as `op` begins: what happens to it.
    fn begin(&self, op: StoreOp) -> Fault;
    /// Called as `op` ends (whatever its fault), after `begin`.
    fn end(&self, op: StoreOp);
    /// Called with the write of an operation `begin` answered [`Fault::ApplyLate`] for,
    /// before its caller sees its error: keep it and [`Late::apply`] it later. By default
    /// it is dropped (the write never lands).
    fn hold(&self, late: Late) {
        drop(late);
    }
    /// Called as `op` applied without a fault, before its caller sees the answer: a future
    /// the answer waits for — an answer still in the network while other things happen (a
    /// claim answered after its queue was paused and its node learnt of it). By default
    /// none.
    fn answer(&self, op: StoreOp) -> Option<Answering> {
        let _ = op;
        None
    }
}

/// What an answer [`FaultPlan::answer`] delays waits for.
pub type Answering = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The plan a store holds, if any (shared by its clones).
#[derive(Default)]
pub(crate) struct FaultSlot(RwLock<Option<Arc<dyn FaultPlan>>>);

impl FaultSlot {
    pub(crate) fn set(&self, plan: Arc<dyn FaultPlan>) {
        if let Ok(mut slot) = self.0.write() {
            *slot = Some(plan);
        }
    }

    pub(crate) fn get(&self) -> Option<Arc<dyn FaultPlan>> {
        self.0.read().ok().and_then(|s| s.clone())
    }
}

/// Ends the operation in its plan when dropped (also when the operation's future is).
pub(crate) struct Ending(pub(crate) Arc<dyn FaultPlan>, pub(crate) StoreOp);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.end(self.1);
    }
}

/// Runs `fut` (operation `op`, bound `limit`) as `plan` decides; `late` makes the held copy
/// of the write for [`Fault::ApplyLate`] (`None`: the operation cannot be held).
pub(crate) async fn run<T>(
    plan: Arc<dyn FaultPlan>,
    op: Op,
    limit: Duration,
    fut: impl Future<Output = Result<T>>,
    late: Option<impl FnOnce() -> Late>,
) -> Result<T> {
    let which = StoreOp::of(op);
    let fault = plan.begin(which);
    let ending = Ending(plan, which);
    match fault {
        Fault::None => {
            let res = bounded(op, limit, fut).await;
            if res.is_ok() {
                if let Some(answering) = ending.0.answer(which) {
                    answering.await;
                }
            }
            res
        }
        Fault::FailBefore => Err(Error::Database(StoreError::Transient(format!(
            "{}: injected failure before it reached the database",
            which.name()
        )))),
        Fault::ApplyLate if late.is_some() => {
            // Its answer never comes: the caller's bound ends the wait.
            if let Some(make) = late {
                ending.0.hold(make());
            }
            Err(timeout_error(op, limit, Phase::Answer))
        }
        Fault::LoseAnswer | Fault::ApplyLate => {
            let _ = bounded(op, limit, fut).await;
            Err(Error::Database(StoreError::Transient(format!(
                "{}: connection lost before the answer arrived (injected; the write may \
                 have committed)",
                which.name()
            ))))
        }
        Fault::PastDeadline => {
            let _ = bounded(op, limit, fut).await;
            Err(timeout_error(op, limit, Phase::Answer))
        }
    }
}
