//! Finalization batches: a supervisor's outcome ([`JobFinished`]) is buffered and written in
//! batches, one flush in flight at a time (what arrives meanwhile forms the next batch). A
//! slot is freed only once its write is confirmed applied or lease-lost; a failed flush is
//! retried with backoff and the leases of its jobs keep being renewed meanwhile.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use super::{Key, LeaseManager, ERROR_LOG_EVERY};
use crate::error::Error;
use crate::job::{JobId, JobState};
use crate::lease::LeaseToken;
use crate::metrics::{Finished, KindMetrics};
use crate::scheduler::{report_store_error, Event};
use crate::store::{Finalization, Finalize, FinalizeParams, Guarded};

/// Most finalizations written in one statement.
const MAX_FLUSH: usize = 1000;
/// Finalization statements in flight at once: while one is written the next batch forms.
/// (Measured: a second statement in flight split the batches and cost throughput; the
/// claims run alongside on their own connection.)
pub(super) const MAX_FLUSHES: u32 = 1;
/// Longest wait between flush retries while the store fails: a finalization is written
/// again within a second of the database coming back.
const MAX_FLUSH_BACKOFF: Duration = Duration::from_secs(1);

/// A buffered finalization (or give-back) and what to tell when it is written.
pub(super) struct Pending {
    pub(super) item: Finalize,
    pub(super) queue: Arc<str>,
    pub(super) kind: Arc<str>,
    pub(super) attempt: u32,
    /// A failure's code and message.
    pub(super) error: Option<(String, String)>,
    /// Given back to run again at once (never started, shutdown), not a handler's outcome.
    pub(super) released: bool,
    /// When this manager received it (the ack latency counts from here).
    pub(super) received: Instant,
    /// When its job was enqueued.
    pub(super) created_at: Option<DateTime<Utc>>,
    /// When the handler started (monotonic µs), if no renewal recorded it: a job shorter
    /// than a heartbeat has its start written with its finalization.
    pub(super) started_us: Option<i64>,
    /// Its (queue, kind)'s instruments, from its lease (none if the lease was forgotten).
    pub(super) metrics: Option<Arc<KindMetrics>>,
}

impl LeaseManager {
    /// Sends the next batch of buffered finalizations, unless a flush is in flight, nothing
    /// is buffered or a failed flush's back-off has not ended.
    pub(super) fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing >= MAX_FLUSHES || self.pending.is_empty() {
            return;
        }
        if self.flush_not_before.is_some_and(|t| Instant::now() < t) {
            return;
        }
        self.flushing += 1;
        self.shared.stats.count_finalize();
        let batch = next_batch(&mut self.pending, MAX_FLUSH);
        let params = self.flush_params(&batch);
        let store = self.shared.store.clone();
        let fut = async move {
            let t0 = Instant::now();
            let n = params.items.len();
            let res = store.job_finalize_settling(params).await;
            let took = t0.elapsed();
            tracing::trace!(n, took_us = took.as_micros() as u64, "finalize");
            crate::metrics::finalize_statement(took);
            res
        };
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.flushing -= 1;
            match res {
                Ok((results, released)) => {
                    // Children these jobs' ends released: due now, wake their fetchers.
                    act.shared.client.wake_queues(&released);
                    act.flushed(batch, results.into_iter().map(|(_, o)| o));
                }
                Err(e) => act.flush_failed(batch, &e, ctx),
            }
            if !act.pending.is_empty() && act.flush_not_before.is_none() {
                act.flush(ctx);
            }
        }));
    }

    /// The statement's parameters for `batch`: each item with its handler's start, if no
    /// renewal recorded it, as an age at this send.
    fn flush_params(&self, batch: &[Pending]) -> FinalizeParams {
        let sent_at = self.mono();
        FinalizeParams {
            items: batch
                .iter()
                .map(|p| {
                    p.item.clone().with_started_ago(
                        p.started_us.map(|t| {
                            Duration::from_micros(u64::try_from(sent_at - t).unwrap_or(0))
                        }),
                    )
                })
                .collect(),
            now: self.shared.clock.bound_now(),
        }
    }

    /// A flush was written: each attempt's lease is forgotten and its slot freed, and its
    /// outcome recorded (`outcomes` in the order of `batch`).
    fn flushed(&mut self, batch: Vec<Pending>, outcomes: impl Iterator<Item = Guarded<JobState>>) {
        self.flush_failures = 0;
        self.flush_not_before = None;
        // Per queue: slots freed, and the longest a job waited for a worker.
        // (Ordered: the fetchers are told in the same order on every run.)
        let mut freed: BTreeMap<Arc<str>, (u32, Duration)> = BTreeMap::new();
        let now = self.shared.clock.now();
        let heard = self.shared.events.heard_at_debug();
        for (p, outcome) in batch.into_iter().zip(outcomes) {
            // Only this attempt's lease: a newer claim of the same job stays.
            // A lease already forgotten (lost, abandoned) freed its slot then.
            if let Some(l) = self.leases.remove(&Key(p.item.id, p.item.token.clone())) {
                let slot = freed.entry(p.queue.clone()).or_default();
                slot.0 += 1;
                slot.1 = slot.1.max(l.waited());
            }
            match outcome {
                Guarded::Applied(state) => self.record_finished(p, state, now, heard),
                Guarded::LeaseLost | Guarded::Stale => {
                    self.shared.stats.add_lease_lost(1);
                    self.shared.events.emit(Event::LeaseLost {
                        id: p.item.id,
                        kind: p.kind.to_string(),
                        claim: p.item.token.claim(),
                    });
                }
            }
        }
        for (queue, (n, wait)) in freed {
            self.free_slots(&queue, n, wait);
        }
    }

    /// Records a written finalization: its outcome's instruments, and its `Finished` event
    /// when someone hears it (`heard`: DEBUG is heard; a dead or retrying job is always told).
    fn record_finished(&mut self, p: Pending, state: JobState, now: DateTime<Utc>, heard: bool) {
        self.shared.stats.add_finished(1);
        let metrics = match &p.metrics {
            Some(m) => m.outcome(),
            None => self.outcome_metrics(&p.queue, &p.kind),
        };
        metrics.record(
            &Finished {
                state,
                attempt: p.attempt,
                released: p.released,
                created_at: p.created_at,
                waited: p.received.elapsed(),
            },
            now,
        );
        // Built only when someone hears it (a success is logged at DEBUG): its names are
        // copies.
        let logged = matches!(state, JobState::Dead | JobState::Retrying);
        if !heard && !logged {
            return;
        }
        let failed = state != JobState::Succeeded;
        self.shared.events.emit(Event::Finished {
            id: p.item.id,
            kind: p.kind.to_string(),
            queue: p.queue.to_string(),
            attempt: p.attempt,
            claim: p.item.token.claim(),
            state,
            code: p.error.as_ref().map(|e| e.0.clone()).filter(|_| failed),
            message: p.error.map(|e| e.1).filter(|_| failed),
        });
    }

    /// A flush failed: its batch goes back in front, to be tried again after a back-off
    /// (doubling, at most [`MAX_FLUSH_BACKOFF`]); its leases are still renewed meanwhile.
    fn flush_failed(&mut self, batch: Vec<Pending>, e: &Error, ctx: &mut Context<Self>) {
        report_store_error(
            &self.shared.events,
            "lease_manager",
            &mut self.last_error,
            ERROR_LOG_EVERY,
            e,
        );
        self.flush_failures += 1;
        let exp = self.flush_failures.min(8);
        let wait = (Duration::from_millis(50) * 2u32.pow(exp)).min(MAX_FLUSH_BACKOFF);
        self.flush_not_before = Some(Instant::now() + wait);
        // Put the batch back in front; its leases are still renewed meanwhile.
        let mut rest = std::mem::take(&mut self.pending);
        self.pending = batch;
        self.pending.append(&mut rest);
        // Tried again by its own timer: no other message may come (the last jobs of a drain,
        // a node whose deadline checks are driven by hand), and a finalization that waits for
        // one holds its slots meanwhile.
        ctx.run_later(wait, |act, ctx| act.flush(ctx));
    }
}

/// Takes the next batch off `pending`, in order: up to `max` finalizations, at most one per
/// job. A job can have two pending here — a claim fenced while the database was down, and
/// this node's later claim of the same job after a sweeper reclaimed the first — and the
/// store refuses a batch that names a job twice (`Store::job_finalize_many`): the whole batch
/// would fail on every retry, and no finalization of this node would ever be written again.
/// The later one waits for the next batch, so the older is written first (and found stale).
fn next_batch(pending: &mut Vec<Pending>, max: usize) -> Vec<Pending> {
    // Sized once: growing it rehashed every id again at each doubling, on every flush.
    let room = pending.len().min(max);
    let mut jobs: HashSet<JobId, foldhash::fast::RandomState> =
        HashSet::with_capacity_and_hasher(room, foldhash::fast::RandomState::default());
    let mut batch = Vec::with_capacity(room);
    let mut rest = Vec::new();
    for p in pending.drain(..) {
        if batch.len() < max && jobs.insert(p.item.id) {
            batch.push(p);
        } else {
            rest.push(p);
        }
    }
    *pending = rest;
    batch
}

/// A supervisor's outcome for its job, to be written.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct JobFinished {
    /// The job.
    pub id: JobId,
    /// The holder's token.
    pub token: LeaseToken,
    /// What to write.
    pub outcome: Finalization,
    /// Its queue.
    pub queue: Arc<str>,
    /// Its kind.
    pub kind: Arc<str>,
    /// The attempt that ended.
    pub attempt: u32,
    /// Whether the handler started (false: the job is given back unstarted).
    pub started: bool,
    /// The outcome is already written: the handler's transaction completed the job
    /// (`outcome` is its success). Nothing is written again; it is reported as finished.
    pub written: bool,
}

/// How long before its fence point `fence_at_us` an attempt ended at `now_us`, in ms
/// (negative: after it); none for a revoked attempt (`i64::MIN`: its lease was lost, and
/// a lost claim has no margin).
fn fence_margin_ms_at(fence_at_us: i64, now_us: i64) -> Option<i64> {
    if fence_at_us == i64::MIN {
        return None;
    }
    Some(fence_at_us.saturating_sub(now_us) / 1_000)
}

impl Handler<JobFinished> for LeaseManager {
    type Result = ();

    fn handle(&mut self, m: JobFinished, ctx: &mut Context<Self>) {
        if m.written {
            self.written_by_handler(m);
            return;
        }
        let key = Key(m.id, m.token);
        // One look-up.
        let (mut created_at, mut started_us, mut metrics) = (None, None, None);
        // How far from its fence point the attempt ended (the execution ledger's margin).
        let mut fence_margin_ms = None;
        let now_us = self.mono();
        if let Some(l) = self.leases.get_mut(&key) {
            created_at = Some(l.created_at);
            fence_margin_ms = fence_margin_ms_at(l.attempt.fence_at_us(), now_us);
            metrics = Some(l.metrics.clone());
            started_us = l
                .attempt
                .started_us()
                .filter(|_| m.started && !l.start_recorded);
            if l.finishing {
                // Already given back by this manager (never started): nothing more to write.
                return;
            }
            l.finishing = true;
            if !m.started {
                self.shared.events.emit(Event::Dropped {
                    id: m.id,
                    kind: m.kind.to_string(),
                    claim: key.1.claim(),
                });
            }
        }
        let Key(id, token) = key;
        // Back to pending at once without a handler's say: unstarted, or given back at
        // shutdown (a handler's zero-delay snooze is counted with them).
        let released =
            !m.started || matches!(&m.outcome, Finalization::Requeue { delay } if delay.is_zero());
        let error = match &m.outcome {
            Finalization::Retry { error, .. }
            | Finalization::Dead { error }
            | Finalization::Cancelled { error } => {
                Some((error.code.clone(), error.message.clone()))
            }
            _ => None,
        };
        self.pending.push(Pending {
            item: Finalize {
                id,
                token,
                outcome: m.outcome,
                started_ago: None,
                fence_margin_ms,
            },
            released,
            queue: m.queue,
            kind: m.kind,
            attempt: m.attempt,
            error,
            received: Instant::now(),
            created_at,
            started_us,
            metrics,
        });
        self.flush(ctx);
    }
}

impl LeaseManager {
    /// A job its handler's transaction completed: already `succeeded` in the database, so
    /// nothing is written — the lease is forgotten, its slot freed, and the job reported
    /// finished as a written finalization would be.
    fn written_by_handler(&mut self, m: JobFinished) {
        let key = Key(m.id, m.token);
        let Some(l) = self.leases.remove(&key) else {
            return;
        };
        self.free_slots(&l.queue, 1, l.waited());
        self.shared.stats.add_finished(1);
        let now = self.shared.clock.now();
        l.metrics.outcome().record(
            &Finished {
                state: JobState::Succeeded,
                attempt: m.attempt,
                released: false,
                created_at: Some(l.created_at),
                waited: Duration::ZERO,
            },
            now,
        );
        self.shared.events.emit(Event::Finished {
            id: m.id,
            kind: m.kind.to_string(),
            queue: m.queue.to_string(),
            attempt: m.attempt,
            claim: key.1.claim(),
            state: JobState::Succeeded,
            code: None,
            message: None,
        });
    }
}

/// Writes buffered finalizations now (normally automatic).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct FlushFinalizations;

impl Handler<FlushFinalizations> for LeaseManager {
    type Result = ();

    fn handle(&mut self, _: FlushFinalizations, ctx: &mut Context<Self>) {
        self.flush_not_before = None;
        self.flush(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_margin_is_signed_and_a_revoked_attempt_has_none() {
        assert_eq!(fence_margin_ms_at(5_000_000, 2_000_000), Some(3_000));
        assert_eq!(fence_margin_ms_at(2_000_000, 5_000_000), Some(-3_000));
        // A revoked attempt (its lease lost) ending: the subtraction overflowed here and
        // panicked the lease manager of a node cut off from its database.
        assert_eq!(fence_margin_ms_at(i64::MIN, 5_000_000), None);
        assert_eq!(
            fence_margin_ms_at(i64::MIN + 1, i64::MAX),
            Some(i64::MIN / 1_000)
        );
    }

    fn pending(id: i64, token: &LeaseToken) -> Pending {
        Pending {
            item: Finalize::succeeded(JobId(id), token.clone(), serde_json::Value::Null),
            queue: "default".into(),
            kind: "k".into(),
            attempt: 1,
            error: None,
            released: false,
            received: Instant::now(),
            created_at: None,
            started_us: None,
            metrics: None,
        }
    }

    fn keys(v: &[Pending]) -> Vec<(i64, LeaseToken)> {
        v.iter()
            .map(|p| (p.item.id.0, p.item.token.clone()))
            .collect()
    }

    #[test]
    fn a_batch_names_each_job_once_and_keeps_the_order() {
        // Job 1 fenced under claim a while the database was down, then claimed again (b)
        // once a sweeper had reclaimed it: both finalizations pending.
        let (a, b, c) = (
            LeaseToken::generate(),
            LeaseToken::generate(),
            LeaseToken::generate(),
        );
        let mut q = vec![
            pending(1, &a),
            pending(2, &c),
            pending(1, &b),
            pending(3, &c),
        ];
        let batch = next_batch(&mut q, 10);
        assert_eq!(
            keys(&batch),
            vec![(1, a.clone()), (2, c.clone()), (3, c.clone())]
        );
        assert_eq!(keys(&q), vec![(1, b.clone())]);
        assert_eq!(keys(&next_batch(&mut q, 10)), vec![(1, b.clone())]);
        assert!(q.is_empty());

        // The size bound still holds, and what is left keeps its order.
        let mut q = vec![
            pending(1, &a),
            pending(2, &c),
            pending(1, &b),
            pending(3, &c),
        ];
        assert_eq!(keys(&next_batch(&mut q, 2)), vec![(1, a), (2, c.clone())]);
        assert_eq!(keys(&q), vec![(1, b), (3, c)]);
    }
}
