//! What the handlers did, on the manual clock: each execution's start and end (the shared
//! checker's [`Execution`] rows), and the gate each running handler waits on until the
//! driver releases it with the outcome the seed chose. A handler journals its start before
//! it waits and its end when its future returns or is dropped (stopped from outside), so
//! an execution without an end is still running — or its node crashed, which ends it then.
//!
//! Many steps share one instant of the manual clock, so the journal also numbers what
//! happens in program order ([`Order`]): each start and end takes the next number, and the
//! driver takes one ([`Journal::mark`]) for each of its own acts that the checks order
//! handlers against (a pause committed, a node reading its queues' settings, a claim seen).
//! On one thread, this order is the real one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jobvisor::clock::{Clock as _, ManualClock};
use jobvisor::{
    handler_fn, JobContext, JobError, JobHandler, JobOutcome, JobTx, SqliteJobConnection, TxError,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::harness::side::Execution;
use crate::rng::{fnv, FNV_START};

/// Salt of the hash that picks a succeeding handler's way to succeed.
const TX_SALT: u64 = 0x7a5c_0de0_0000_0012;
/// The prefix of the effect a handler succeeding in its own transaction records, followed
/// by its node and attempt (`check_effects.rs`).
pub(crate) const DONE_EFFECT: &str = "done/";

/// What a handler panics with when the seed chooses a panic.
pub(crate) const CHOSEN_PANIC: &str = "the seed chose a panic";

/// How the driver lets a waiting handler go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// It succeeds (its result names its node, claim and attempt): by returning success,
    /// or, for a quarter of the executions (a hash of the seed and the execution — so that
    /// most successes still meet the batched finalization's token guard), in a transaction
    /// of its own that records the effect `done/<node>/<attempt>` and completes the job
    /// (`JobContext::complete_in_transaction`) — its commit guarded by the attempt's lease.
    Success,
    /// It returns a failure to retry.
    Retry,
    /// It panics.
    Panic,
}

/// Where an execution stands in the run's order, and its queue (by execution index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Order {
    /// The queue of the job it ran.
    pub(crate) queue: String,
    /// The number its start took.
    pub(crate) start: u64,
    /// The number its end took (`None`: it never ended).
    pub(crate) end: Option<u64>,
    /// What was left of its lease before the fence point when its handler was first polled
    /// (`JobContext::lease_left`): zero is a start at or past the fence point.
    pub(crate) lease_left: std::time::Duration,
    /// Whether its node knew its queue paused when its handler was first polled (no await
    /// lies between the start gate's check and that poll).
    pub(crate) gate_closed: bool,
    /// The `n` of the payload it ran with (a replacing enqueue changes a job's payload).
    pub(crate) payload_n: Option<i64>,
}

/// The executions of one run and the gates of those still waiting.
pub(crate) struct Journal {
    clock: ManualClock,
    seed: u64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    execs: Vec<Execution>,
    /// Each execution's place in the run's order.
    orders: Vec<Order>,
    /// The last number taken.
    seq: u64,
    /// Waiting handlers: execution index → its gate.
    gates: BTreeMap<usize, oneshot::Sender<Release>>,
    /// Executions released and not yet ended.
    released: usize,
    /// Starts and ends journaled (a cheap fingerprint of progress).
    changes: usize,
    /// Nodes that crashed: a dead process runs nothing more.
    crashed: Vec<String>,
    /// Each node's view of its queues' pauses (`Simulation::pause_view`).
    views: BTreeMap<String, PauseView>,
}

/// A node's view of its queues' pauses.
type PauseView = Box<dyn Fn(&str) -> bool + Send + Sync>;

impl Journal {
    pub(crate) fn new(clock: ManualClock, seed: u64) -> Arc<Journal> {
        Arc::new(Journal {
            clock,
            seed,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn now_us(&self) -> i64 {
        self.clock.now().timestamp_micros()
    }

    /// The journaling handler of node `node`. A handler either honours cancellation (it
    /// returns a failure when stopped) or ignores it (a hang: only its gate or its
    /// abandonment ends it), as a hash of the seed and the execution decides — not a draw
    /// of the driver's generator, since handlers start on their own threads.
    pub(crate) fn handler(self: &Arc<Self>, node: &str) -> impl JobHandler {
        let journal = self.clone();
        let node = node.to_string();
        handler_fn(move |payload: Value, ctx: JobContext| {
            let journal = journal.clone();
            let node = node.clone();
            async move {
                let claim = ctx.claim_id().to_string();
                // A crashed node's actors that outlived it (a supervisor that got its worker
                // as the crash ended another handler) run nothing: its process is gone.
                let n = payload.get("n").and_then(Value::as_i64);
                let Some((idx, gate)) = journal.start(&node, &ctx, &claim, n) else {
                    return std::future::pending().await;
                };
                let _end = EndOnDrop(journal.clone(), idx);
                // Rides on the next renewal: a landing that changes it is checked
                // (`check_landing.rs`).
                let _ = ctx.progress(json!({ "node": node, "attempt": ctx.attempt }));
                let key = format!("{node}/{}/{}", ctx.id, ctx.attempt);
                let hangs = fnv(key.as_bytes(), FNV_START ^ journal.seed).is_multiple_of(4);
                let release = if hangs {
                    gate.await.ok()
                } else {
                    tokio::select! {
                        // Both ready in one poll: the gate first, on every run.
                        biased;
                        r = gate => r.ok(),
                        () = ctx.cancelled() => None,
                    }
                };
                let in_tx =
                    fnv(key.as_bytes(), FNV_START ^ journal.seed ^ TX_SALT).is_multiple_of(4);
                match release {
                    Some(Release::Success) if in_tx => {
                        let result = json!({
                            "node": node, "claim": claim, "attempt": ctx.attempt,
                        });
                        let effect = format!("{DONE_EFFECT}{node}/{}", ctx.attempt);
                        let kept = result.clone();
                        let done = ctx
                            .complete_in_transaction(
                                async |mut tx: JobTx<'_, SqliteJobConnection>| {
                                    tx.record_effect(&effect, ()).await?;
                                    Ok::<_, JobError>(result)
                                },
                            )
                            .await;
                        match done {
                            Ok(outcome) => {
                                journal.complete(idx);
                                Ok(outcome)
                            }
                            // The commit's answer lost (a store fault): whether it committed,
                            // the effect record tells — as a careful handler asks it.
                            Err(TxError::Database(e)) => {
                                let effects = ctx.effects().await.unwrap_or_default();
                                if effects.iter().any(|x| x.key == effect) {
                                    journal.complete(idx);
                                    JobOutcome::success(kept)
                                } else {
                                    Err(JobError::retry(format!("not committed: {e}")))
                                }
                            }
                            Err(e) => Err(JobError::retry(format!("not committed: {e}"))),
                        }
                    }
                    Some(Release::Success) => {
                        journal.complete(idx);
                        JobOutcome::success(json!({
                            "node": node, "claim": claim, "attempt": ctx.attempt,
                        }))
                    }
                    Some(Release::Retry) => Err(JobError::retry("the seed chose a retry")),
                    Some(Release::Panic) => std::panic::panic_any(CHOSEN_PANIC),
                    None => Err(JobError::retry("stopped")),
                }
            }
        })
    }

    fn start(
        &self,
        node: &str,
        ctx: &JobContext,
        claim: &str,
        payload_n: Option<i64>,
    ) -> Option<(usize, oneshot::Receiver<Release>)> {
        let now = self.now_us();
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock().unwrap();
        if inner.crashed.iter().any(|c| c == node) {
            return None;
        }
        let idx = inner.execs.len();
        inner.seq += 1;
        let start = inner.seq;
        let gate_closed = inner.views.get(node).is_some_and(|v| v(&ctx.queue));
        inner.orders.push(Order {
            queue: ctx.queue.clone(),
            start,
            end: None,
            lease_left: ctx.lease_left(),
            gate_closed,
            payload_n,
        });
        inner.execs.push(Execution {
            job_id: ctx.id.0,
            attempt: i32::try_from(ctx.attempt).unwrap_or(i32::MAX),
            claim: claim.to_string(),
            node: node.to_string(),
            started_at_us: now,
            runtime_started_at_us: None,
            ended_at_us: None,
            completed: 0,
            held: None,
        });
        inner.gates.insert(idx, tx);
        inner.changes += 1;
        Some((idx, rx))
    }

    fn complete(&self, idx: usize) {
        self.inner.lock().unwrap().execs[idx].completed = 1;
    }

    fn end(&self, idx: usize) {
        let now = self.now_us();
        let mut inner = self.inner.lock().unwrap();
        inner.changes += 1;
        if inner.gates.remove(&idx).is_none() && inner.execs[idx].ended_at_us.is_none() {
            inner.released = inner.released.saturating_sub(1);
        }
        // A crashed node's executions ended with it.
        if inner.execs[idx].ended_at_us.is_none() {
            inner.execs[idx].ended_at_us = Some(now);
            inner.seq += 1;
            inner.orders[idx].end = Some(inner.seq);
        }
    }

    /// Node `node`'s view of its queues' pauses, read at each of its handlers' starts.
    pub(crate) fn watch_pauses(
        &self,
        node: &str,
        view: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) {
        self.inner
            .lock()
            .unwrap()
            .views
            .insert(node.to_string(), Box::new(view));
    }

    /// Takes the next number of the run's order, for an act of the driver.
    pub(crate) fn mark(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap();
        inner.seq += 1;
        inner.seq
    }

    /// The waiting handlers of `node`, oldest first: (execution index, job, attempt).
    pub(crate) fn waiting(&self, node: &str) -> Vec<(usize, i64, i32)> {
        let inner = self.inner.lock().unwrap();
        inner
            .gates
            .keys()
            .map(|i| (*i, &inner.execs[*i]))
            .filter(|(_, e)| e.node == node)
            .map(|(i, e)| (i, e.job_id, e.attempt))
            .collect()
    }

    /// Lets execution `idx` go with `how`; false if it no longer waits.
    pub(crate) fn release(&self, idx: usize, how: Release) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let Some(tx) = inner.gates.remove(&idx) else {
            return false;
        };
        inner.released += 1;
        if tx.send(how).is_err() {
            inner.released -= 1;
        }
        true
    }

    /// Node `node` crashed: its executions still running end now, and their gates close.
    pub(crate) fn crashed(&self, node: &str) {
        let now = self.now_us();
        let mut inner = self.inner.lock().unwrap();
        inner.crashed.push(node.to_string());
        let idxs: Vec<usize> = (0..inner.execs.len())
            .filter(|i| inner.execs[*i].node == node && inner.execs[*i].ended_at_us.is_none())
            .collect();
        for i in idxs {
            if inner.gates.remove(&i).is_none() {
                inner.released = inner.released.saturating_sub(1);
            }
            inner.execs[i].ended_at_us = Some(now);
            inner.seq += 1;
            inner.orders[i].end = Some(inner.seq);
        }
    }

    /// (released executions not yet ended, starts and ends journaled).
    pub(crate) fn progress(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap();
        (inner.released, inner.changes)
    }

    /// Every execution so far.
    pub(crate) fn executions(&self) -> Vec<Execution> {
        self.inner.lock().unwrap().execs.clone()
    }

    /// Every execution's place in the run's order, by execution index.
    pub(crate) fn orders(&self) -> Vec<Order> {
        self.inner.lock().unwrap().orders.clone()
    }
}

/// Journals an execution's end when its handler's future is gone.
struct EndOnDrop(Arc<Journal>, usize);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end(self.1);
    }
}
