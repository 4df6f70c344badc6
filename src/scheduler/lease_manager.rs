//! LeaseManager: owns every lease this node holds.
//!
//! * Heartbeat ([`RenewLeases`]): one statement renews all leases; a lease found lost is
//!   reported to its supervisor at once (the handler is stopped, its result discarded), and a
//!   cancel request seen on renewal is passed on.
//! * Deadlines ([`CheckDeadlines`]): stops handlers past their timeout or cancel grace, and
//!   self-fences a job whose lease could not be renewed before it would expire — so it cannot
//!   keep running alongside the node that reclaims it.
//! * Finalizations ([`JobFinished`]): buffered and written in batches, one flush in flight
//!   at a time (what arrives meanwhile forms the next batch). A slot is freed only once its
//!   write is confirmed applied or lease-lost; a failed flush is retried with backoff and the
//!   leases of its jobs keep being renewed meanwhile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};

use super::fetcher::{Fetcher, SlotFreed};
use super::job_supervisor::{StopJob, StopReason, NOT_STARTED};
use super::{report_store_error, Event, Shared, StopActor};
use crate::job::{JobId, JobState};
use crate::lease::LeaseToken;
use crate::store::{Finalization, Finalize, FinalizeParams, Guarded, LeaseRef, RenewParams};

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);
/// Most finalizations written in one statement.
const MAX_FLUSH: usize = 1000;
/// Finalization statements in flight at once: while one is written the next batch forms.
/// (Measured: a second statement in flight split the batches and cost throughput; the
/// claims run alongside on their own connection.)
const MAX_FLUSHES: u32 = 1;
/// Longest wait between flush retries while the store fails.
const MAX_FLUSH_BACKOFF: Duration = Duration::from_secs(5);

/// One lease held by this node.
struct Lease {
    token: LeaseToken,
    queue: String,
    kind: String,
    supervisor: Recipient<StopJob>,
    /// When the lease surely still holds until, by this node's clock: the send time of the
    /// last successful renewal (or the claim) plus the lease. The database computed the real
    /// expiry from its own later "now", so this is conservative.
    valid_until: DateTime<Utc>,
    /// When the claim was sent (this node's clock).
    claimed_at: DateTime<Utc>,
    /// The attempt's timeout, counted from `started`.
    timeout: chrono::Duration,
    /// When the handler started (set by its task), or [`NOT_STARTED`].
    started: Arc<AtomicI64>,
    /// Set once the handler was told to cancel: stop it for good after this.
    cancel_deadline: Option<DateTime<Utc>>,
    /// The supervisor reported: a finalization is buffered or being written.
    finishing: bool,
    /// The supervisor was told to stop (timeout, fence, lease lost, release).
    stopped: bool,
    /// A handler told to stop (timeout, release) that has not stopped by then is fenced.
    stop_deadline: Option<DateTime<Utc>>,
}

impl Lease {
    /// How long the job waited for a worker after its claim (zero if it never started).
    fn waited(&self) -> Duration {
        started_at(&self.started)
            .and_then(|t| (t - self.claimed_at).to_std().ok())
            .unwrap_or_default()
    }

    /// Tells the supervisor to stop its handler; if it has not reported by `deadline`, the
    /// handler ignores the signal and the lease is fenced.
    fn stop(&mut self, reason: StopReason, deadline: DateTime<Utc>) {
        self.stopped = true;
        self.stop_deadline = Some(deadline);
        self.supervisor.do_send(StopJob(reason));
    }
}

/// A buffered finalization and what to tell when it is written.
struct Pending {
    item: Finalize,
    queue: String,
    kind: String,
    attempt: u32,
    code: Option<String>,
}

/// Owns the node's leases; see the module docs.
pub struct LeaseManager {
    shared: Arc<Shared>,
    leases: HashMap<JobId, Lease>,
    pending: Vec<Pending>,
    fetchers: HashMap<String, Addr<Fetcher>>,
    /// Finalization statements in flight (at most [`MAX_FLUSHES`]).
    flushing: u32,
    renewing: bool,
    /// After a failed flush, the next one waits until this (the node's clock).
    flush_not_before: Option<Instant>,
    flush_failures: u32,
    last_error: Option<Instant>,
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
            leases: HashMap::new(),
            pending: Vec::new(),
            fetchers: HashMap::new(),
            flushing: 0,
            renewing: false,
            flush_not_before: None,
            flush_failures: 0,
            last_error: None,
        }
    }

    fn lease_span(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.shared.config.lease).unwrap_or(chrono::Duration::MAX)
    }

    /// How long a handler told to stop may take before it is stopped for good.
    fn cancel_grace(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.shared.config.cancel_grace).unwrap_or_default()
    }

    /// Self-fence this long before the lease would expire.
    fn fence_margin(&self) -> chrono::Duration {
        let m = (self.shared.config.lease / 6).min(Duration::from_secs(5));
        chrono::Duration::from_std(m).unwrap_or_default()
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
        let take = self.pending.len().min(MAX_FLUSH);
        let batch: Vec<Pending> = self.pending.drain(..take).collect();
        let params = FinalizeParams {
            items: batch.iter().map(|p| p.item.clone()).collect(),
            now: self.shared.clock.bound_now(),
        };
        let store = self.shared.store.clone();
        let fut = async move {
            let t0 = Instant::now();
            let n = params.items.len();
            let res = store.job_finalize_many(params).await;
            tracing::trace!(n, took_us = t0.elapsed().as_micros() as u64, "finalize");
            res
        };
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.flushing -= 1;
            match res {
                Ok(results) => {
                    act.flush_failures = 0;
                    act.flush_not_before = None;
                    // Per queue: slots freed, and the longest a job waited for a worker.
                    let mut freed: HashMap<String, (u32, Duration)> = HashMap::new();
                    for (p, (_, outcome)) in batch.into_iter().zip(results) {
                        let id = p.item.id;
                        let waited = act
                            .leases
                            .remove(&id)
                            .map_or(Duration::ZERO, |l| l.waited());
                        let slot = freed.entry(p.queue.clone()).or_default();
                        slot.0 += 1;
                        slot.1 = slot.1.max(waited);
                        match outcome {
                            Guarded::Applied(state) => {
                                act.shared.stats.add_finished(1);
                                act.shared.events.emit(Event::Finished {
                                    id,
                                    kind: p.kind,
                                    queue: p.queue.clone(),
                                    attempt: p.attempt,
                                    state,
                                    code: if state == JobState::Succeeded {
                                        None
                                    } else {
                                        p.code
                                    },
                                });
                            }
                            Guarded::LeaseLost | Guarded::Stale => {
                                act.shared.stats.add_lease_lost(1);
                                act.shared
                                    .events
                                    .emit(Event::LeaseLost { id, kind: p.kind });
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
                }
            }
            if !act.pending.is_empty() && act.flush_not_before.is_none() {
                act.flush(ctx);
            }
        }));
    }
}

impl Actor for LeaseManager {
    type Context = Context<Self>;
}

/// Tells the lease manager which fetcher frees which queue's slots (sent once at start).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RegisterFetchers(pub(crate) HashMap<String, Addr<Fetcher>>);

impl Handler<RegisterFetchers> for LeaseManager {
    type Result = ();

    fn handle(&mut self, msg: RegisterFetchers, _ctx: &mut Context<Self>) {
        self.fetchers = msg.0;
    }
}

/// One claimed job's lease, as handed over by its fetcher.
#[derive(Debug)]
pub struct TrackLease {
    /// The job.
    pub id: JobId,
    /// The claim's token.
    pub token: LeaseToken,
    /// Its queue (whose budget to free).
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Its supervisor.
    pub supervisor: Recipient<StopJob>,
    /// When the claim was sent (this node's clock).
    pub claimed_at: DateTime<Utc>,
    /// The job's timeout per attempt.
    pub timeout: std::time::Duration,
    /// When its handler started (set by the handler's task).
    pub started: Arc<AtomicI64>,
}

/// A fetcher claimed jobs: track their leases (one message per claim).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct TrackLeases(pub Vec<TrackLease>);

impl Handler<TrackLeases> for LeaseManager {
    type Result = ();

    fn handle(&mut self, TrackLeases(leases): TrackLeases, _ctx: &mut Context<Self>) {
        let span = self.lease_span();
        for m in leases {
            self.leases.insert(
                m.id,
                Lease {
                    token: m.token,
                    queue: m.queue,
                    kind: m.kind,
                    supervisor: m.supervisor,
                    valid_until: m.claimed_at + span,
                    claimed_at: m.claimed_at,
                    timeout: chrono::Duration::from_std(m.timeout).unwrap_or(chrono::Duration::MAX),
                    started: m.started,
                    cancel_deadline: None,
                    finishing: false,
                    stopped: false,
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
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// The attempt that ended.
    pub attempt: u32,
}

impl Handler<JobFinished> for LeaseManager {
    type Result = ();

    fn handle(&mut self, m: JobFinished, ctx: &mut Context<Self>) {
        if let Some(l) = self.leases.get_mut(&m.id) {
            l.finishing = true;
        }
        let code = match &m.outcome {
            Finalization::Retry { error, .. }
            | Finalization::Dead { error }
            | Finalization::Cancelled { error } => Some(error.code.clone()),
            _ => None,
        };
        self.pending.push(Pending {
            item: Finalize {
                id: m.id,
                token: m.token,
                outcome: m.outcome,
            },
            queue: m.queue,
            kind: m.kind,
            attempt: m.attempt,
            code,
        });
        self.flush(ctx);
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

/// Heartbeat: renew every lease in one statement.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "RenewReport")]
pub struct RenewLeases;

impl Handler<RenewLeases> for LeaseManager {
    type Result = ResponseActFuture<Self, RenewReport>;

    fn handle(&mut self, _: RenewLeases, _ctx: &mut Context<Self>) -> Self::Result {
        if self.renewing || self.leases.is_empty() {
            return Box::pin(fut::ready(RenewReport::default()));
        }
        self.renewing = true;
        self.shared.stats.count_renew();
        let leases: Vec<LeaseRef> = self
            .leases
            .iter()
            .map(|(id, l)| LeaseRef {
                id: *id,
                token: l.token.clone(),
            })
            .collect();
        let sent_at = self.shared.clock.now();
        let params = RenewParams {
            leases,
            lease: self.shared.config.lease,
            now: self.shared.clock.bound_now(),
        };
        let store = self.shared.store.clone();
        let fut = async move { store.job_renew_leases(params).await };
        Box::pin(fut.into_actor(self).map(move |res, act, _ctx| {
            act.renewing = false;
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
                    return RenewReport::default();
                }
            };
            let mut report = RenewReport {
                statements: 1,
                ..RenewReport::default()
            };
            let valid_until = sent_at + act.lease_span();
            let grace = act.cancel_grace();
            for (id, outcome) in results {
                match outcome {
                    Guarded::Applied(r) => {
                        report.renewed += 1;
                        if let Some(l) = act.leases.get_mut(&id) {
                            l.valid_until = l.valid_until.max(valid_until);
                            if r.cancel_requested && l.cancel_deadline.is_none() && !l.finishing {
                                l.cancel_deadline = Some(act.shared.clock.now() + grace);
                                l.supervisor.do_send(StopJob(StopReason::Cancel));
                                act.shared.events.emit(Event::CancelSignalled {
                                    id,
                                    kind: l.kind.clone(),
                                });
                            }
                        }
                    }
                    Guarded::LeaseLost | Guarded::Stale => {
                        report.lost += 1;
                        // A job whose finalization is in flight learns its fate from the
                        // finalization itself.
                        if act.leases.get(&id).is_some_and(|l| !l.finishing) {
                            if let Some(l) = act.leases.remove(&id) {
                                act.shared.stats.add_lease_lost(1);
                                l.supervisor.do_send(StopJob(StopReason::LeaseLost));
                                act.shared
                                    .events
                                    .emit(Event::LeaseLost { id, kind: l.kind });
                                act.free_slots(&l.queue, 1, Duration::ZERO);
                            }
                        }
                    }
                }
            }
            act.shared.events.emit(Event::LeasesRenewed {
                renewed: report.renewed,
                lost: report.lost,
            });
            report
        }))
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
        let now = self.shared.clock.now();
        let margin = self.fence_margin();
        let mut stopped = 0;
        let mut fenced = Vec::new();
        let grace = self.cancel_grace();
        for (id, l) in &mut self.leases {
            if l.finishing {
                continue;
            }
            if l.stopped {
                // Told to stop and still not reporting: its handler ignores the signal. Stop
                // renewing (fence) so the job can be reclaimed once the lease has expired.
                if l.stop_deadline.is_some_and(|d| now >= d) {
                    l.supervisor.do_send(StopJob(StopReason::SelfFence));
                    fenced.push(*id);
                }
                continue;
            }
            let reason = if now >= l.valid_until - margin {
                Some(StopReason::SelfFence)
            } else if started_at(&l.started).is_some_and(|t| now >= t + l.timeout) {
                Some(StopReason::Timeout)
            } else if l.cancel_deadline.is_some_and(|d| now >= d) {
                Some(StopReason::CancelGraceOver)
            } else {
                None
            };
            if let Some(r) = reason {
                l.stop(r, now + grace);
                stopped += 1;
                match r {
                    StopReason::SelfFence => fenced.push(*id),
                    StopReason::Timeout => self.shared.events.emit(Event::TimedOut {
                        id: *id,
                        kind: l.kind.clone(),
                    }),
                    _ => {}
                }
            }
        }
        // A fenced job reports nothing: forget its lease and free its slot; the sweeper
        // reclaims it once the lease has expired.
        for id in fenced {
            if let Some(l) = self.leases.remove(&id) {
                self.shared
                    .events
                    .emit(Event::SelfFenced { id, kind: l.kind });
                self.free_slots(&l.queue, 1, Duration::ZERO);
            }
        }
        self.flush(ctx);
        stopped
    }
}

/// Shutdown: stop every running handler and give its lease back (the job returns to
/// `pending` without using an attempt). Answers how many.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct ReleaseAll;

impl Handler<ReleaseAll> for LeaseManager {
    type Result = usize;

    fn handle(&mut self, _: ReleaseAll, _ctx: &mut Context<Self>) -> usize {
        let now = self.shared.clock.now();
        let grace = self.cancel_grace();
        let mut n = 0;
        for l in self.leases.values_mut() {
            if !l.finishing && !l.stopped {
                l.stop(StopReason::Release, now + grace);
                n += 1;
            }
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
        self.leases.get(&m.0).map(|l| l.token.clone())
    }
}

/// When a handler started, if it has.
fn started_at(started: &AtomicI64) -> Option<DateTime<Utc>> {
    match started.load(Ordering::Acquire) {
        NOT_STARTED => None,
        us => DateTime::<Utc>::from_timestamp_micros(us),
    }
}
