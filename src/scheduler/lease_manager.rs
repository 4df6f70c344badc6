//! LeaseManager: owns every lease this node holds — the only holder of lease tokens.
//!
//! Leases are keyed by **attempt** — (job, token) — and every answer (renewal,
//! finalization, give-back) is applied only to the attempt whose token it carried: a stale
//! answer for an earlier attempt never touches a newer claim of the same job by this node.
//!
//! * Heartbeat ([`RenewLeases`]): one statement renews all leases and records the starts of
//!   handlers that started since (the database counts a job's timeout from them) and their
//!   latest progress reports (see [`ProgressCell`](super::ProgressCell)). A lease
//!   found lost is reported to its supervisor at once (the handler is stopped, its result
//!   discarded), and a cancel request seen on renewal is passed on.
//! * Hedged renewals: a renewal whose answer is not back within `hedge_after` (half the
//!   interval, at most a second) is *overdue* — its connection may hang in a silent network
//!   cut, or its statement wait on a lock — and another goes out on a connection opened for
//!   it alone, without waiting for the first to fail (up to `MAX_RENEWALS_IN_FLIGHT`).
//!   Whichever answers first moves the fence point; each answer moves it to the fence point
//!   of *its own* send time, and never back (`Attempt::extend`), so a late answer to an
//!   older renewal changes nothing once a newer one has answered.
//! * Deadlines ([`CheckDeadlines`]): stops handlers past their timeout (counted from their
//!   start) or cancel grace, and takes away a lease that could not be renewed before the fence
//!   margin: a job that never started is given back at once, its attempt not counted; a
//!   running handler is stopped and, once it has stopped, the job is given back as a `fenced`
//!   failure to run again at once — instead of waiting a whole lease for the sweeper. A timer
//!   that fires far later than scheduled means the process was frozen: starts are held until
//!   a fresh renewal has answered.
//! * Finalizations ([`JobFinished`]): buffered and written in batches, one flush in flight
//!   at a time (what arrives meanwhile forms the next batch). A slot is freed only once its
//!   write is confirmed applied or lease-lost; a failed flush is retried with backoff and the
//!   leases of its jobs keep being renewed meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock, not std's: the same in production, and a simulation that pauses tokio's
// time decides when a flush's back-off ends and how late a deadline check is.
use tokio::time::Instant;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use super::attempt::{fence_margin, fence_point, us, Attempt, Revoked};
use super::fetcher::SlotFreed;
use super::job_supervisor::{JobSupervisor, StopReason};
use super::{report_store_error, Event, Shared, StopActor};
use crate::job::{JobId, JobState};
use crate::lease::LeaseToken;
use crate::metrics::{Finished, KindMetrics, OutcomeMetrics};
use crate::store::{Finalization, Finalize, FinalizeParams, Guarded, LeaseRef, RenewParams};

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);
/// Most finalizations written in one statement.
const MAX_FLUSH: usize = 1000;
/// Finalization statements in flight at once: while one is written the next batch forms.
/// (Measured: a second statement in flight split the batches and cost throughput; the
/// claims run alongside on their own connection.)
const MAX_FLUSHES: u32 = 1;
/// Longest wait between flush retries while the store fails: a finalization is written
/// again within a second of the database coming back.
const MAX_FLUSH_BACKOFF: Duration = Duration::from_secs(1);
/// First wait before a failed heartbeat is tried again (doubling, at most a second and at
/// most the heartbeat interval): after a network cut heals, leases are renewed within a
/// second or two instead of a whole heartbeat interval later.
const RENEW_RETRY: Duration = Duration::from_millis(250);
/// Most renewals in flight at once: the one sent at its tick and up to two hedges. With the
/// default statement bound (1.5 s) and a hedge every second at most, a cut never leaves a
/// node waiting for room to send one.
pub(crate) const MAX_RENEWALS_IN_FLIGHT: usize = 3;
/// The longest a renewal may go unanswered before it is overdue and hedged.
const MAX_HEDGE_AFTER: Duration = Duration::from_secs(1);

/// How long a renewal may go unanswered before another is sent on a fresh connection: half
/// the renewal interval, at most a second (so with the defaults — 10 s renewals — one second;
/// a healthy renewal answers in milliseconds).
pub(crate) fn hedge_after(renew_every: Duration) -> Duration {
    (renew_every / 2).min(MAX_HEDGE_AFTER)
}

/// One attempt: a job and the token of the claim that holds it.
///
/// Hashed by the job id and the token's 8-byte claim id only, not by the token's 48 digits
/// (equal keys have equal claim ids, so the hash stays consistent with `Eq`, which still
/// compares the whole token); the map is looked up several times per job.
#[derive(Clone, PartialEq, Eq)]
struct Key(JobId, LeaseToken);

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_i64(self.0 .0);
        state.write_u64(self.1.claim().as_u64());
    }
}

/// The lease map's hasher: foldhash (hashbrown's own default; already in the dependency tree),
/// seeded per process. Its keys are job ids and claim ids this node drew at random, so
/// SipHash's resistance to chosen keys buys nothing here and costs several times more per
/// look-up.
type Leases = HashMap<Key, Lease, foldhash::fast::RandomState>;

/// One lease held by this node. Times are µs on the node's monotonic clock.
struct Lease {
    /// Shared with the fetcher and the lease's other jobs of its kind: no copy per job.
    queue: Arc<str>,
    kind: Arc<str>,
    /// When the job was enqueued (its end-to-end time is measured from it).
    created_at: DateTime<Utc>,
    supervisor: Arc<JobSupervisor>,
    /// Its (queue, kind)'s instruments, registered by the fetcher.
    metrics: Arc<KindMetrics>,
    /// The start gate shared with the supervisor: the fence point (the send time of the
    /// claim or of the last applied renewal, plus the lease, minus the fence margin) and the
    /// start.
    attempt: Arc<Attempt>,
    /// When the claim was sent.
    claimed_at: i64,
    /// The attempt's timeout, counted from its start.
    timeout: i64,
    /// A renewal applied with this attempt's start: the database knows it.
    start_recorded: bool,
    /// Set once the handler was told to cancel: stop it for good after this.
    cancel_deadline: Option<i64>,
    /// A finalization or give-back is buffered or being written.
    finishing: bool,
    /// The supervisor was told to stop (timeout, fence, release).
    stopped: bool,
    /// The lease was taken away (the fence margin was reached): no longer renewed; the job
    /// is given back once its handler has stopped.
    fenced: bool,
    /// A handler told to stop that has not stopped by then is abandoned (fenced for good).
    stop_deadline: Option<i64>,
}

impl Lease {
    /// How long the job waited for a worker after its claim (zero if it never started).
    fn waited(&self) -> Duration {
        self.attempt
            .started_us()
            .and_then(|t| u64::try_from(t - self.claimed_at).ok())
            .map_or(Duration::ZERO, Duration::from_micros)
    }

    /// Tells the supervisor to stop its handler; if it has not reported by `deadline`, the
    /// handler ignores the signal and the lease is abandoned.
    fn stop(&mut self, reason: StopReason, deadline: i64) {
        self.stopped = true;
        self.stop_deadline = Some(deadline);
        self.supervisor.stop(reason);
    }
}

/// A buffered finalization (or give-back) and what to tell when it is written.
struct Pending {
    item: Finalize,
    queue: Arc<str>,
    kind: Arc<str>,
    attempt: u32,
    /// A failure's code and message.
    error: Option<(String, String)>,
    /// Given back to run again at once (never started, shutdown), not a handler's outcome.
    released: bool,
    /// When this manager received it (the ack latency counts from here).
    received: Instant,
    /// When its job was enqueued.
    created_at: Option<DateTime<Utc>>,
    /// When the handler started (monotonic µs), if no renewal recorded it: a job shorter
    /// than a heartbeat has its start written with its finalization.
    started_us: Option<i64>,
    /// Its (queue, kind)'s instruments, from its lease (none if the lease was forgotten).
    metrics: Option<Arc<KindMetrics>>,
}

/// Owns the node's leases; see the module docs.
pub struct LeaseManager {
    shared: Arc<Shared>,
    leases: Leases,
    pending: Vec<Pending>,
    /// Each queue's fetcher, told when slots free up (a `Recipient`, so the lease manager
    /// can be driven alone in a test).
    fetchers: HashMap<String, Recipient<SlotFreed>>,
    /// Finalization statements in flight (at most [`MAX_FLUSHES`]).
    flushing: u32,
    /// Renewals in flight, oldest first: their numbers and send times (monotonic µs). At
    /// most [`MAX_RENEWALS_IN_FLIGHT`]; a new one goes out while others are in flight only
    /// once the newest is overdue (a hedge).
    renewals: Vec<(u64, i64)>,
    /// Numbers renewals, so that a hedge timer knows whether its renewal is still the newest.
    renewal_seq: u64,
    /// When the last renewal of any kind was sent (monotonic µs): a hedge goes out only
    /// `hedge_after` after it, so hedges that fail at once (a server refusing connections)
    /// cannot follow each other in a loop while an older renewal still hangs.
    last_renew_sent: Option<i64>,
    /// After a failed flush, the next one waits until this (the node's clock).
    flush_not_before: Option<Instant>,
    flush_failures: u32,
    last_error: Option<std::time::Instant>,
    /// When the last deadline check ran, in real time (a freeze is a real-time event, even
    /// under a test clock): a much later next one means the process was frozen.
    last_check: Option<Instant>,
    /// Starts are held until a renewal sent at or after this (monotonic µs) has answered.
    revalidate_since: Option<i64>,
    /// Heartbeats failed in a row (their retries back off).
    renew_failures: u32,
    /// A cancel was announced while a renewal was in flight (whose statement may have read
    /// the job before the cancel committed): renew again once it answers.
    renew_again: bool,
    /// Outcome instruments per (queue, kind), registered at first use: only for an outcome
    /// whose lease was already forgotten (a lease carries its own).
    outcomes: HashMap<String, HashMap<String, OutcomeMetrics>>,
}

impl std::fmt::Debug for LeaseManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManager")
            .field("leases", &self.leases.len())
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl LeaseManager {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LeaseManager {
            shared,
            leases: Leases::default(),
            pending: Vec::new(),
            fetchers: HashMap::new(),
            flushing: 0,
            renewals: Vec::new(),
            renewal_seq: 0,
            last_renew_sent: None,
            flush_not_before: None,
            flush_failures: 0,
            last_error: None,
            last_check: None,
            revalidate_since: None,
            renew_failures: 0,
            renew_again: false,
            outcomes: HashMap::new(),
        }
    }

    /// The outcome instruments of `queue` and `kind`.
    fn outcome_metrics(&mut self, queue: &str, kind: &str) -> &OutcomeMetrics {
        // Looked up by reference: a job's hot path allocates no key (the map is keyed by
        // queue, then kind).
        if !self
            .outcomes
            .get(queue)
            .is_some_and(|k| k.contains_key(kind))
        {
            self.outcomes
                .entry(queue.to_owned())
                .or_default()
                .insert(kind.to_owned(), OutcomeMetrics::new(queue, kind));
        }
        &self.outcomes[queue][kind]
    }

    /// Now on the node's monotonic clock, in µs.
    fn mono(&self) -> i64 {
        us(self.shared.clock.monotonic())
    }

    /// How long a handler told to stop may take before it is stopped for good (µs).
    fn cancel_grace(&self) -> i64 {
        us(self.shared.config.cancel_grace)
    }

    /// Queues the give-back of an attempt whose handler never started: back to `pending` at
    /// once, its attempt not counted (token-guarded: a no-op if the job is no longer ours).
    fn give_back_unstarted(&mut self, key: &Key, ctx: &mut Context<Self>) {
        let Some(l) = self.leases.get_mut(key) else {
            return;
        };
        if l.finishing {
            return;
        }
        l.finishing = true;
        l.supervisor.stop(StopReason::Dropped);
        self.shared.events.emit(Event::Dropped {
            id: key.0,
            kind: l.kind.to_string(),
            claim: key.1.claim(),
        });
        self.pending.push(Pending {
            item: Finalize::requeue(key.0, key.1.clone(), Duration::ZERO),
            queue: l.queue.clone(),
            kind: l.kind.clone(),
            attempt: 0,
            error: None,
            released: true,
            received: Instant::now(),
            created_at: Some(l.created_at),
            started_us: None,
            metrics: Some(l.metrics.clone()),
        });
        self.flush(ctx);
    }

    /// Forgets a lease and frees its slot (lost, or abandoned with a handler that would not
    /// stop).
    fn forget(&mut self, key: &Key) -> Option<Lease> {
        let l = self.leases.remove(key)?;
        self.free_slots(&l.queue, 1, Duration::ZERO);
        Some(l)
    }

    fn free_slots(&self, queue: &str, n: u32, longest_wait: Duration) {
        if n > 0 {
            if let Some(f) = self.fetchers.get(queue) {
                f.do_send(SlotFreed {
                    freed: n,
                    longest_wait,
                });
            }
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing >= MAX_FLUSHES || self.pending.is_empty() {
            return;
        }
        if self.flush_not_before.is_some_and(|t| Instant::now() < t) {
            return;
        }
        self.flushing += 1;
        self.shared.stats.count_finalize();
        let batch = next_batch(&mut self.pending, MAX_FLUSH);
        let sent_at = self.mono();
        let params =
            FinalizeParams {
                items: batch
                    .iter()
                    .map(|p| {
                        p.item.clone().with_started_ago(p.started_us.map(|t| {
                            Duration::from_micros(u64::try_from(sent_at - t).unwrap_or(0))
                        }))
                    })
                    .collect(),
                now: self.shared.clock.bound_now(),
            };
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
                    act.flush_failures = 0;
                    act.flush_not_before = None;
                    // Per queue: slots freed, and the longest a job waited for a worker.
                    // (Ordered: the fetchers are told in the same order on every run.)
                    let mut freed: BTreeMap<Arc<str>, (u32, Duration)> = BTreeMap::new();
                    let now = act.shared.clock.now();
                    let heard = act.shared.events.heard_at_debug();
                    for (p, (_, outcome)) in batch.into_iter().zip(results) {
                        let (id, claim) = (p.item.id, p.item.token.claim());
                        // Only this attempt's lease: a newer claim of the same job stays.
                        // A lease already forgotten (lost, abandoned) freed its slot then.
                        if let Some(l) = act.leases.remove(&Key(id, p.item.token)) {
                            let slot = freed.entry(p.queue.clone()).or_default();
                            slot.0 += 1;
                            slot.1 = slot.1.max(l.waited());
                        }
                        match outcome {
                            Guarded::Applied(state) => {
                                act.shared.stats.add_finished(1);
                                let metrics = match &p.metrics {
                                    Some(m) => m.outcome(),
                                    None => act.outcome_metrics(&p.queue, &p.kind),
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
                                // Built only when someone hears it (a success is logged at
                                // DEBUG): its names are copies.
                                let logged = matches!(state, JobState::Dead | JobState::Retrying);
                                if !heard && !logged {
                                    continue;
                                }
                                act.shared.events.emit(Event::Finished {
                                    id,
                                    kind: p.kind.to_string(),
                                    queue: p.queue.to_string(),
                                    attempt: p.attempt,
                                    claim,
                                    state,
                                    code: p
                                        .error
                                        .as_ref()
                                        .map(|e| e.0.clone())
                                        .filter(|_| state != JobState::Succeeded),
                                    message: p
                                        .error
                                        .map(|e| e.1)
                                        .filter(|_| state != JobState::Succeeded),
                                });
                            }
                            Guarded::LeaseLost | Guarded::Stale => {
                                act.shared.stats.add_lease_lost(1);
                                act.shared.events.emit(Event::LeaseLost {
                                    id,
                                    kind: p.kind.to_string(),
                                    claim,
                                });
                            }
                        }
                    }
                    for (queue, (n, wait)) in freed {
                        act.free_slots(&queue, n, wait);
                    }
                }
                Err(e) => {
                    report_store_error(
                        &act.shared.events,
                        "lease_manager",
                        &mut act.last_error,
                        ERROR_LOG_EVERY,
                        &e,
                    );
                    act.flush_failures += 1;
                    let exp = act.flush_failures.min(8);
                    let wait = (Duration::from_millis(50) * 2u32.pow(exp)).min(MAX_FLUSH_BACKOFF);
                    act.flush_not_before = Some(Instant::now() + wait);
                    // Put the batch back in front; its leases are still renewed meanwhile.
                    let mut rest = std::mem::take(&mut act.pending);
                    act.pending = batch;
                    act.pending.append(&mut rest);
                    // Tried again by its own timer: no other message may come (the last jobs
                    // of a drain, a node whose deadline checks are driven by hand), and a
                    // finalization that waits for one holds its slots meanwhile.
                    ctx.run_later(wait, |act, ctx| act.flush(ctx));
                }
            }
            if !act.pending.is_empty() && act.flush_not_before.is_none() {
                act.flush(ctx);
            }
        }));
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

impl Actor for LeaseManager {
    type Context = Context<Self>;
}

/// Tells the lease manager which fetcher frees which queue's slots (sent once at start).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RegisterFetchers(pub(crate) HashMap<String, Recipient<SlotFreed>>);

impl Handler<RegisterFetchers> for LeaseManager {
    type Result = ();

    fn handle(&mut self, msg: RegisterFetchers, _ctx: &mut Context<Self>) {
        self.fetchers = msg.0;
    }
}

/// One claimed job's lease, as handed over by its fetcher.
#[derive(Debug)]
pub(crate) struct TrackLease {
    /// The job.
    pub(crate) id: JobId,
    /// The claim's token.
    pub(crate) token: LeaseToken,
    /// Its queue (whose budget to free).
    pub(crate) queue: Arc<str>,
    /// Its kind.
    pub(crate) kind: Arc<str>,
    /// Its supervisor.
    pub(crate) supervisor: Arc<JobSupervisor>,
    /// When the claim was sent (the node's monotonic clock).
    pub(crate) claimed_at: Duration,
    /// When the job was enqueued.
    pub(crate) created_at: DateTime<Utc>,
    /// The job's timeout per attempt.
    pub(crate) timeout: Duration,
    /// The start gate shared with its supervisor.
    pub(crate) attempt: Arc<Attempt>,
    /// Its (queue, kind)'s instruments.
    pub(crate) metrics: Arc<KindMetrics>,
}

/// A fetcher claimed jobs: track their leases (one message per claim).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct TrackLeases(pub(crate) Vec<TrackLease>);

impl Handler<TrackLeases> for LeaseManager {
    type Result = ();

    fn handle(&mut self, TrackLeases(leases): TrackLeases, _ctx: &mut Context<Self>) {
        for m in leases {
            self.leases.insert(
                Key(m.id, m.token),
                Lease {
                    queue: m.queue,
                    kind: m.kind,
                    created_at: m.created_at,
                    supervisor: m.supervisor,
                    metrics: m.metrics,
                    attempt: m.attempt,
                    claimed_at: us(m.claimed_at),
                    timeout: us(m.timeout),
                    start_recorded: false,
                    cancel_deadline: None,
                    finishing: false,
                    stopped: false,
                    fenced: false,
                    stop_deadline: None,
                },
            );
        }
    }
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
        if let Some(l) = self.leases.get_mut(&key) {
            created_at = Some(l.created_at);
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

/// What one heartbeat did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, MessageResponse)]
pub struct RenewReport {
    /// Leases renewed.
    pub renewed: usize,
    /// Leases found lost (their handlers were stopped).
    pub lost: usize,
    /// Statements used (one per heartbeat, zero when there was nothing to renew).
    pub statements: usize,
}

/// A cancel was asked of a running job — `Some(id)`: PostgreSQL's notification names it;
/// `None`: the change signal moved, which a cancel may have done — so renew now if this node
/// holds it (any lease, for `None`): the renewal's answer signals the handler
/// (`cancel_requested`) at once, where the heartbeat would take up to its interval, and the
/// heartbeat stays the backstop. Asked while a renewal is in flight, another follows its
/// answer (that one may have read the job before the cancel committed).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct CancelAsked(pub(crate) Option<JobId>);

impl Handler<CancelAsked> for LeaseManager {
    type Result = ();

    fn handle(&mut self, msg: CancelAsked, ctx: &mut Context<Self>) {
        let held = match msg.0 {
            Some(id) => self.leases.keys().any(|k| k.0 == id),
            None => !self.leases.is_empty(),
        };
        if !held {
            return;
        }
        if self.renewals.is_empty() {
            ctx.notify(RenewLeases);
        } else {
            self.renew_again = true;
        }
    }
}

/// Heartbeat: renew every lease in one statement. While a renewal is in flight, another is
/// sent only if the newest in flight is overdue — unanswered for half the renewal interval,
/// at most a second — and then on a fresh connection (a hedge).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RenewReport")]
pub struct RenewLeases;

impl Handler<RenewLeases> for LeaseManager {
    type Result = ResponseActFuture<Self, RenewReport>;

    fn handle(&mut self, _: RenewLeases, ctx: &mut Context<Self>) -> Self::Result {
        let sent_at = self.mono();
        let hedge_after = hedge_after(self.shared.config.renew_every);
        // A renewal in flight: another only if the newest is overdue, as a hedge.
        let hedge = match self.renewals.last() {
            None => false,
            Some(&(_, newest)) => {
                let last = self.last_renew_sent.unwrap_or(newest).max(newest);
                if self.renewals.len() >= MAX_RENEWALS_IN_FLIGHT || sent_at - last < us(hedge_after)
                {
                    return Box::pin(fut::ready(RenewReport::default()));
                }
                true
            }
        };
        // Fenced leases are not renewed: they are being given back; nor those of jobs their
        // handler's transaction completed (they are `succeeded` in the database).
        let keys = self.keys_where(|l| !l.fenced && !l.attempt.is_completed());
        if keys.is_empty() {
            self.revalidated(sent_at);
            return Box::pin(fut::ready(RenewReport::default()));
        }
        self.renewal_seq += 1;
        let seq = self.renewal_seq;
        self.renewals.push((seq, sent_at));
        self.last_renew_sent = Some(sent_at);
        if hedge {
            tracing::debug!(
                in_flight = self.renewals.len() - 1,
                "a lease renewal is overdue; sending another on a fresh connection"
            );
        }
        if self.shared.config.timers {
            // Unanswered by then and still the newest: hedge it. (Under a test's manual
            // drive the test sends the next renewal itself.)
            ctx.run_later(hedge_after, move |act, ctx| {
                if act.renewals.last().is_some_and(|r| r.0 == seq) {
                    ctx.notify(RenewLeases);
                }
            });
        }
        self.shared.stats.count_renew();
        let mut starts = Vec::with_capacity(keys.len());
        let leases: Vec<LeaseRef> = keys
            .iter()
            .map(|k| {
                let l = &self.leases[k];
                // Carry the start until a renewal with it was applied; likewise the
                // handler's latest progress report.
                let started = l.attempt.started_us().filter(|_| !l.start_recorded);
                let progress = l.attempt.progress().unwritten();
                starts.push((started.is_some(), progress.as_ref().map(|(n, _)| *n)));
                LeaseRef {
                    id: k.0,
                    token: k.1.clone(),
                    started_ago: started
                        .map(|t| Duration::from_micros(u64::try_from(sent_at - t).unwrap_or(0))),
                    progress: progress.map(|(_, json)| json),
                }
            })
            .collect();
        let params = RenewParams {
            leases,
            lease: self.shared.config.lease,
            timeout_grace: self.shared.config.lease + self.shared.config.cancel_grace,
            now: self.shared.clock.bound_now(),
        };
        let store = self.shared.store.clone();
        let fut = async move {
            let t0 = Instant::now();
            let res = if hedge {
                store.job_renew_leases_hedged(params).await
            } else {
                store.job_renew_leases(params).await
            };
            crate::metrics::renew_statement(t0.elapsed());
            res
        };
        Box::pin(fut.into_actor(self).map(move |res, act, ctx| {
            act.renewals.retain(|r| r.0 != seq);
            if act.renewals.is_empty() && std::mem::take(&mut act.renew_again) {
                ctx.notify(RenewLeases);
            }
            let results = match res {
                Ok(r) => r,
                Err(e) => {
                    report_store_error(
                        &act.shared.events,
                        "lease_manager",
                        &mut act.last_error,
                        ERROR_LOG_EVERY,
                        &e,
                    );
                    // The estimates decide alone now: they refuse what may have expired.
                    act.revalidated(sent_at);
                    // Try again soon rather than a whole heartbeat later.
                    act.renew_failures = act.renew_failures.saturating_add(1);
                    let wait = (RENEW_RETRY * 2u32.pow(act.renew_failures.min(4) - 1))
                        .min(Duration::from_secs(1))
                        .min(act.shared.config.renew_every);
                    ctx.notify_later(RenewLeases, wait);
                    if !act.renewals.is_empty() {
                        // Room for another hedge while an older renewal hangs: one
                        // `hedge_after` after this one was sent, never at once.
                        ctx.notify_later(RenewLeases, hedge_after);
                    }
                    return RenewReport::default();
                }
            };
            act.renew_failures = 0;
            let mut report = RenewReport {
                statements: 1,
                ..RenewReport::default()
            };
            // This statement's own send time, whichever renewal it was: an older renewal
            // answering after a newer one moves nothing (`Attempt::extend` never moves
            // the fence point back), and no answer is credited with a later send than its own.
            let fence_at = fence_point(
                Duration::from_micros(u64::try_from(sent_at).unwrap_or(0)),
                act.shared.config.lease,
            );
            let grace = act.cancel_grace();
            let now = act.mono();
            // The store answers in the order it was asked, one result per lease sent.
            for ((key, (carried_start, carried_progress)), (_, outcome)) in
                keys.into_iter().zip(starts).zip(results)
            {
                match outcome {
                    Guarded::Applied(r) => {
                        report.renewed += 1;
                        let Some(l) = act.leases.get_mut(&key) else {
                            continue;
                        };
                        if l.fenced {
                            // Taken away since: the give-back supersedes this renewal.
                            continue;
                        }
                        l.attempt.extend(fence_at);
                        l.start_recorded |= carried_start;
                        if let Some(n) = carried_progress {
                            l.attempt.progress().written(n);
                        }
                        if r.cancel_requested && l.cancel_deadline.is_none() && !l.finishing {
                            l.cancel_deadline = Some(now + grace);
                            l.supervisor.stop(StopReason::Cancel);
                            act.shared.events.emit(Event::CancelSignalled {
                                id: key.0,
                                kind: l.kind.to_string(),
                            });
                        }
                    }
                    Guarded::LeaseLost | Guarded::Stale => {
                        report.lost += 1;
                        // A job whose finalization or give-back is in flight learns its fate
                        // from that write itself; only this attempt's lease is dropped.
                        // So does one whose handler's transaction is committing or
                        // completed the job: that transaction's own guard decides, and its
                        // supervisor reports the outcome (no lease-lost report for it).
                        if act
                            .leases
                            .get(&key)
                            .is_some_and(|l| !l.finishing && !l.attempt.committing())
                        {
                            if let Some(l) = act.forget(&key) {
                                l.attempt.revoke();
                                act.shared.stats.add_lease_lost(1);
                                l.supervisor.stop(StopReason::LeaseLost);
                                act.shared.events.emit(Event::LeaseLost {
                                    id: key.0,
                                    kind: l.kind.to_string(),
                                    claim: key.1.claim(),
                                });
                            }
                        }
                    }
                }
            }
            act.shared.events.emit(Event::LeasesRenewed {
                renewed: report.renewed,
                lost: report.lost,
            });
            // Estimates are fresh: starts held for a pause may go on.
            act.revalidated(sent_at);
            if act.revalidate_since.is_some() {
                // A pause was detected while this renewal was in flight: renew once more.
                ctx.notify(RenewLeases);
            }
            report
        }))
    }
}

impl LeaseManager {
    /// A renewal sent at `sent_at` answered (or there was nothing to renew): if it was sent
    /// after a detected pause, starts may go on.
    fn revalidated(&mut self, sent_at: i64) {
        if self.revalidate_since.is_some_and(|since| sent_at >= since) {
            self.revalidate_since = None;
            self.shared.start_hold.release();
        }
    }

    /// Takes away a lease that reached the fence margin: an unstarted job is given back at
    /// once; a running handler is told to stop and the job is given back once it has.
    fn fence(&mut self, key: &Key, now: i64, ctx: &mut Context<Self>) {
        let grace = self.cancel_grace();
        let Some(l) = self.leases.get_mut(key) else {
            return;
        };
        match l.attempt.revoke() {
            Revoked::NotStarted => self.give_back_unstarted(key, ctx),
            // Its supervisor is reporting the give-back already; or a transaction of the
            // handler holds its lease guard and is committing (its guard decides).
            Revoked::AlreadyDropped | Revoked::Committing => {}
            Revoked::Started(_) => {
                l.fenced = true;
                l.stop(StopReason::SelfFence, now + grace);
                // Its task's own watch may have stopped it first (and said so).
                if l.attempt.fence() {
                    self.shared.events.emit(Event::SelfFenced {
                        id: key.0,
                        kind: l.kind.to_string(),
                        claim: key.1.claim(),
                    });
                }
            }
        }
    }
}

/// Checks timeouts, cancel grace and lease validity of every running job (and retries a
/// pending flush). Answers how many handlers were told to stop.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct CheckDeadlines;

impl Handler<CheckDeadlines> for LeaseManager {
    type Result = usize;

    fn handle(&mut self, _: CheckDeadlines, ctx: &mut Context<Self>) -> usize {
        let now = self.mono();
        self.detect_pause(now, ctx);
        let grace = self.cancel_grace();
        let mut stopped = 0;
        let mut at_risk = Vec::new();
        let mut abandoned = Vec::new();
        for key in self.keys_where(|_| true) {
            let Some(l) = self.leases.get_mut(&key) else {
                continue;
            };
            // A handler's transaction holding its lease guard is committing, or completed the
            // job: nothing to fence or time out (its supervisor reports how it ended).
            if l.finishing || l.attempt.committing() {
                continue;
            }
            if l.stopped {
                // Told to stop and still not reporting: its handler ignores the signal. Stop
                // renewing it for good so the job can be reclaimed once the lease has expired.
                if l.stop_deadline.is_some_and(|d| now >= d) {
                    if !l.fenced {
                        l.attempt.revoke();
                        l.supervisor.stop(StopReason::SelfFence);
                    }
                    abandoned.push((key.clone(), !l.fenced));
                }
                continue;
            }
            if l.attempt.lapsed(now) {
                at_risk.push(key.clone());
                stopped += 1;
                continue;
            }
            let reason = if l
                .attempt
                .started_us()
                .is_some_and(|t| now >= t.saturating_add(l.timeout))
            {
                Some(StopReason::Timeout)
            } else if l.cancel_deadline.is_some_and(|d| now >= d) {
                Some(StopReason::CancelGraceOver)
            } else {
                None
            };
            if let Some(r) = reason {
                l.stop(r, now + grace);
                stopped += 1;
                if r == StopReason::Timeout {
                    self.shared.events.emit(Event::TimedOut {
                        id: key.0,
                        kind: l.kind.to_string(),
                    });
                }
            }
        }
        for key in at_risk {
            self.fence(&key, now, ctx);
        }
        // A handler that would not stop: forget its lease and free its slot; the sweeper
        // reclaims the job once the lease has expired. If it stops later, its report is still
        // written, guarded by its token.
        for (key, newly_fenced) in abandoned {
            if let Some(l) = self.forget(&key) {
                if newly_fenced {
                    self.shared.events.emit(Event::SelfFenced {
                        id: key.0,
                        kind: l.kind.to_string(),
                        claim: key.1.claim(),
                    });
                }
            }
        }
        self.flush(ctx);
        stopped
    }
}

impl LeaseManager {
    /// The keys of the leases `keep` accepts, by job and then claim time: the leases are
    /// acted on in the same order whatever the map's, so what a node does in one step is
    /// the same on every run (the map's order changes with its random hash keys).
    fn keys_where(&self, keep: impl Fn(&Lease) -> bool) -> Vec<Key> {
        let mut keys: Vec<(JobId, i64, &Key)> = self
            .leases
            .iter()
            .filter(|(_, l)| keep(l))
            .map(|(k, l)| (k.0, l.claimed_at, k))
            .collect();
        keys.sort_unstable_by_key(|(id, at, _)| (id.0, *at));
        keys.into_iter().map(|(_, _, k)| k.clone()).collect()
    }

    /// A deadline check far later than scheduled means the process was frozen (or starved):
    /// hold every start until a renewal sent from now on has answered.
    fn detect_pause(&mut self, now: i64, ctx: &mut Context<Self>) {
        let every = self.shared.config.deadline_check_every;
        let margin = fence_margin(self.shared.config.lease);
        if let Some(last) = self.last_check.replace(Instant::now()) {
            let late = last.elapsed().saturating_sub(every);
            if late > margin {
                self.shared
                    .events
                    .emit(Event::PauseDetected { late_by: late });
                self.shared.start_hold.hold();
                self.revalidate_since = Some(now);
                ctx.notify(RenewLeases);
            }
        }
    }
}

/// A queue was paused: give back every claimed job of it whose handler has not started —
/// back to `pending` at once, without using an attempt. Running handlers finish normally.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct WithdrawQueue(pub String);

impl Handler<WithdrawQueue> for LeaseManager {
    type Result = usize;

    fn handle(&mut self, WithdrawQueue(queue): WithdrawQueue, ctx: &mut Context<Self>) -> usize {
        let mut unstarted = self.keys_where(|l| *l.queue == *queue && !l.finishing && !l.stopped);
        unstarted.retain(|k| self.leases[k].attempt.withdraw());
        for key in &unstarted {
            self.give_back_unstarted(key, ctx);
        }
        unstarted.len()
    }
}

/// Shutdown: stop every running handler and give its lease back (the job returns to
/// `pending` without using an attempt). Answers how many.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct ReleaseAll;

impl Handler<ReleaseAll> for LeaseManager {
    type Result = usize;

    fn handle(&mut self, _: ReleaseAll, ctx: &mut Context<Self>) -> usize {
        let now = self.mono();
        let grace = self.cancel_grace();
        let mut unstarted = Vec::new();
        let mut n = 0;
        for key in self.keys_where(|l| !l.finishing && !l.stopped) {
            let Some(l) = self.leases.get_mut(&key) else {
                continue;
            };
            n += 1;
            match l.attempt.revoke() {
                Revoked::NotStarted => unstarted.push(key),
                // Committing or completed in the handler's transaction: it reports itself.
                Revoked::AlreadyDropped | Revoked::Committing => {}
                Revoked::Started(_) => l.stop(StopReason::Release, now + grace),
            }
        }
        for key in unstarted {
            self.give_back_unstarted(&key, ctx);
        }
        n
    }
}

/// What the lease manager holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, MessageResponse)]
pub struct LeaseManagerStatus {
    /// Leases held (running jobs and jobs whose finalization is not yet written).
    pub tracked: usize,
    /// Finalizations waiting to be written.
    pub pending: usize,
}

/// Asks for the [`LeaseManagerStatus`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "LeaseManagerStatus")]
pub struct GetLeaseManagerStatus;

impl Handler<GetLeaseManagerStatus> for LeaseManager {
    type Result = LeaseManagerStatus;

    fn handle(&mut self, _: GetLeaseManagerStatus, _ctx: &mut Context<Self>) -> LeaseManagerStatus {
        LeaseManagerStatus {
            tracked: self.leases.len(),
            pending: self.pending.len() + self.flushing as usize,
        }
    }
}

impl Handler<StopActor> for LeaseManager {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// The token of a tracked job (for tests that play a zombie).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<LeaseToken>")]
pub struct TokenOf(pub JobId);

impl Handler<TokenOf> for LeaseManager {
    type Result = Option<LeaseToken>;

    fn handle(&mut self, m: TokenOf, _ctx: &mut Context<Self>) -> Option<LeaseToken> {
        self.leases.keys().find(|k| k.0 == m.0).map(|k| k.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_lease_is_keyed_by_its_job_and_whole_token() {
        // Hashed by the claim id alone, but told apart by the whole token: another secret
        // under the same claim id, or another job under the same token, is another attempt.
        let a = LeaseToken::generate();
        let forged = LeaseToken::parse(&format!("{}{}", &a.as_str()[..16], "0".repeat(32)))
            .expect("a well-formed token");
        assert_eq!(forged.claim_id(), a.claim_id());
        let mut keys: HashSet<Key, foldhash::fast::RandomState> = HashSet::default();
        assert!(keys.insert(Key(JobId(1), a.clone())));
        assert!(keys.insert(Key(JobId(1), forged.clone())), "another secret");
        assert!(keys.insert(Key(JobId(2), a.clone())), "another job");
        assert!(!keys.insert(Key(JobId(1), a.clone())), "the same attempt");
        assert!(keys.remove(&Key(JobId(1), forged)));
        assert!(keys.contains(&Key(JobId(1), a)));
        assert_eq!(keys.len(), 2);
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
