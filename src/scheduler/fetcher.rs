//! Fetcher: one per queue. Whenever woken — poll tick, a local enqueue, a freed slot — it
//! claims up to its free slots in one statement and starts a [`JobSupervisor`] per job.
//!
//! Two limits: the queue's *concurrency* bounds handlers running at once (a semaphore the
//! supervisors take a permit from before their handler starts), and the *claim budget*
//! (concurrency + prefetch window) bounds jobs this node holds — running, ready in the
//! prefetch, or finished but not yet confirmed written. A slot of the budget is freed only
//! once its finalization is confirmed applied or lease-lost, so a slow database throttles
//! claiming; a worker, though, moves on to a prefetched job at once, never waiting for a
//! round trip.
//!
//! The prefetch window adapts between 0 and the queue's `prefetch`: it doubles when a full
//! claim (more jobs were due) comes back to idle workers — they ran dry waiting for it — and
//! halves when a job waited longer than [`PREFETCH_MAX_WAIT`] for a worker, so quick jobs get
//! a deep prefetch while slow ones are not hoarded by one node when others could run them.
//!
//! Claims are at most half the budget, so one chunk is claimed while the other runs and is
//! written: claiming and finalizing overlap instead of taking turns. At most one claim is in
//! flight: a wake that arrives meanwhile waits in the mailbox and is served when the claim
//! returns, so no wake is lost and no two claims race for the same slots. Freed slots
//! coalesce into one queued wake.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::Semaphore;

use super::attempt::{expire_point, fence_point, Attempt};
use super::fair_share::{node_cap, SHARE_RETRY_FOR, SHARE_RETRY_MAX, SHARE_RETRY_MIN};
use super::job_supervisor::JobSupervisor;
use super::lease_manager::{JobFinished, TrackLease, TrackLeases};
use super::queue_gate::QueueGate;
use super::{report_store_error, Event, Shared, StopActor};
use crate::config::QueueConfig;
use crate::metrics::{KindMetrics, QueueMetrics};
use crate::store::ClaimParams;

/// Store errors are logged at most this often per fetcher.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);
/// A prefetched job should not wait longer than this, **200 ms**, for a worker: if one did,
/// the window halves (another node might have run it meanwhile).
pub const PREFETCH_MAX_WAIT: Duration = Duration::from_millis(200);

/// Claims jobs of one queue.
pub struct Fetcher {
    shared: Arc<Shared>,
    queue: String,
    config: QueueConfig,
    /// The lease manager, told of every claimed lease (a `Recipient`, so a fetcher can be
    /// driven alone in a test) ...
    track: Recipient<TrackLeases>,
    /// ... and the address its supervisors report outcomes to (shared by them all).
    finished: Arc<Recipient<JobFinished>>,
    /// Budget taken: jobs claimed and not yet confirmed written (running, prefetched, or
    /// finishing).
    busy: u32,
    /// The adaptive prefetch window.
    window: PrefetchWindow,
    /// Permits for running handlers: the queue's concurrency.
    workers: Arc<Semaphore>,
    /// A `FetchNow` is already queued for a freed slot: don't queue another.
    wake_queued: bool,
    /// Shutdown began: claim nothing more.
    stopped: bool,
    /// A wake-up for when the queue's rate window frees is scheduled (one at a time).
    rate_wait: bool,
    /// The queue's declared limits ([`QueueConfig::limits`]) are not written yet: no claim
    /// until they are.
    declaring: bool,
    /// The node's view of the queue's pause, read at every start.
    gate: Arc<QueueGate>,
    /// The last claim was counted in a rate window: claim no more than idle workers can
    /// start at once (each job must start within the rate's start margin).
    rated: bool,
    last_error: Option<Instant>,
    /// Under a fair share: the next retry's delay and the time spent retrying without a job
    /// (`None`: not retrying).
    share_backoff: Option<(Duration, Duration)>,
    /// A fair-share wake-up is scheduled (one at a time).
    share_timer: bool,
    /// A claim was controlled by the queue's settings at least once: the prefetch window
    /// was emptied then (see [`PrefetchWindow::on_first_controlled`]).
    controlled_seen: bool,
    /// The queue's claim instruments.
    metrics: Arc<QueueMetrics>,
    /// Per kind, registered at first use: its name as the leases share it, and its handler
    /// instruments, shared with the supervisors.
    kind_metrics: HashMap<String, (Arc<str>, Arc<KindMetrics>), foldhash::fast::RandomState>,
    /// The queue's name as the leases share it (no copy per job).
    queue_name: Arc<str>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("queue", &self.queue)
            .field("busy", &self.busy)
            .field("wake_queued", &self.wake_queued)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    pub(crate) fn new(
        shared: Arc<Shared>,
        queue: String,
        config: QueueConfig,
        track: Recipient<TrackLeases>,
        finished: Recipient<JobFinished>,
    ) -> Self {
        Fetcher {
            gate: shared.queue_gates.get(&queue).cloned().unwrap_or_default(),
            rated: false,
            shared,
            workers: Arc::new(Semaphore::new(config.concurrency as usize)),
            window: PrefetchWindow::new(config.concurrency, config.prefetch),
            metrics: Arc::new(QueueMetrics::new(&queue)),
            queue_name: queue.as_str().into(),
            queue,
            config,
            track,
            finished: Arc::new(finished),
            busy: 0,
            wake_queued: false,
            stopped: false,
            rate_wait: false,
            declaring: false,
            last_error: None,
            share_backoff: None,
            share_timer: false,
            controlled_seen: false,
            kind_metrics: HashMap::default(),
        }
    }

    fn budget(&self) -> u32 {
        self.config.concurrency.saturating_add(self.window.get())
    }

    /// Most jobs claimed in one statement: half the budget, so that one chunk is claimed
    /// while the other runs and is written.
    fn chunk(&self) -> u32 {
        self.budget().div_ceil(2)
    }

    fn free(&self) -> u32 {
        self.budget().saturating_sub(self.busy)
    }
}

/// The prefetch window's policy (see the module docs): between 0 and `max`, starting at
/// `min(concurrency, max)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PrefetchWindow {
    window: u32,
    max: u32,
}

impl PrefetchWindow {
    fn new(concurrency: u32, max: u32) -> Self {
        PrefetchWindow {
            window: concurrency.min(max),
            max,
        }
    }

    fn get(&self) -> u32 {
        self.window
    }

    /// A claim came back. `full`: it got every job it asked for (more may be due);
    /// `workers_idle`: some worker had nothing to run while it was in flight.
    fn on_claim(&mut self, full: bool, workers_idle: bool) {
        if full && workers_idle {
            self.window = self.window.saturating_mul(2).max(1).min(self.max);
        }
    }

    /// A claim of a queue with shared settings took fewer jobs than asked: a limit may be
    /// holding the queue back, and then every job held here in the prefetch is a slot of
    /// the limit that no worker runs — while another node's idle workers could. The window
    /// halves, so under a limit that keeps binding this node soon holds only what its
    /// workers run; full claims open it again.
    fn on_held_back(&mut self) {
        self.window /= 2;
    }

    /// The first claim the queue's settings controlled came back. A node starts with a
    /// window of `min(concurrency, prefetch)` for a quick ramp; under a global limit that
    /// full window is slots of the limit taken from the nodes that start a moment later, and
    /// each node keeps its slots by reclaiming them as they free (three nodes starting
    /// together once split a drain 29 % off even). So a controlled queue's window starts
    /// again from 0 and opens only as full claims meet idle workers.
    fn on_first_controlled(&mut self) {
        self.window = 0;
    }

    /// Jobs were written; one of them waited `longest_wait` in the prefetch for a worker.
    fn on_freed(&mut self, longest_wait: Duration) {
        if longest_wait > PREFETCH_MAX_WAIT {
            self.window /= 2;
        }
    }
}

impl Actor for Fetcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(limits) = self.config.limits {
            self.declaring = true;
            self.declare(limits, true, ctx);
        }
    }
}

/// How long a fetcher waits before writing its queue's declared limits again after a failure.
const DECLARE_RETRY: Duration = Duration::from_secs(1);

impl Fetcher {
    /// Queues one claim, unless one is queued already (wakes coalesce) or claiming stopped.
    fn wake(&mut self, ctx: &mut Context<Self>) {
        if !self.wake_queued && !self.stopped {
            self.wake_queued = true;
            ctx.notify(FetchNow);
        }
    }

    /// Reports a failed store operation (at most once per [`ERROR_LOG_EVERY`]).
    fn store_failed(&mut self, e: &crate::Error) {
        report_store_error(
            &self.shared.events,
            "fetcher",
            &mut self.last_error,
            ERROR_LOG_EVERY,
            e,
        );
    }

    /// Writes the queue's declared limits, then claims; tried again until it is written.
    ///
    /// The first write holds the mailbox (`first`): a claim asked for meanwhile — the
    /// scheduler's first one, a simulation's `fetch` — waits for the limits instead of
    /// answering 0, so a simulation claims exactly when it asks. Once they are written, a
    /// node with timers claims at once; a simulation's node claims only when asked.
    fn declare(&mut self, limits: crate::store::QueueLimits, first: bool, ctx: &mut Context<Self>) {
        let (store, queue) = (self.shared.store.clone(), self.queue.clone());
        let now = self.shared.clock.bound_now();
        let write = async move { store.queue_set_limits(&queue, limits, now).await };
        let done = write.into_actor(self).map(move |res, act, ctx| match res {
            Ok(_) => {
                act.declaring = false;
                if act.shared.config.timers {
                    act.wake(ctx);
                }
            }
            Err(e) => {
                act.store_failed(&e);
                ctx.run_later(DECLARE_RETRY, move |act, ctx| {
                    act.declare(limits, false, ctx)
                });
            }
        });
        if first {
            ctx.wait(done);
        } else {
            ctx.spawn(done);
        }
    }
}

/// Wake up: claim up to the free slots now, in one statement. Answers how many jobs were
/// claimed. Wakes that arrive during a claim wait for it (see the handler).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct FetchNow;

impl Handler<FetchNow> for Fetcher {
    // Atomic: one claim at a time per fetcher. Two claims in flight would both be sized to the
    // same free slots and together exceed the queue's concurrency.
    type Result = AtomicResponse<Self, usize>;

    fn handle(&mut self, _: FetchNow, ctx: &mut Context<Self>) -> Self::Result {
        self.wake_queued = false;
        // Paused, as far as this node knows: a claim would take nothing (or, racing a
        // resume, jobs the start gate would give back); the resume wakes this fetcher.
        if self.stopped || self.declaring || self.gate.paused() || self.free() == 0 {
            return AtomicResponse::new(Box::pin(fut::ready(0)));
        }
        let mut limit = self.free().min(self.chunk());
        if self.rated {
            // No prefetch under a rate limit: only what idle workers start at once.
            let idle = u32::try_from(self.workers.available_permits()).unwrap_or(u32::MAX);
            limit = limit.min(idle);
            if limit == 0 {
                return AtomicResponse::new(Box::pin(fut::ready(0)));
            }
        }
        // Several nodes serve the queue under a global limit: hold at most this node's fair
        // share (`fair_share.rs`); a rotation that raises it wakes the fetcher.
        let share = self.share();
        if let Some(cap) = share {
            let room = cap.saturating_sub(self.busy);
            if room == 0 {
                self.wake_next_second(ctx);
                return AtomicResponse::new(Box::pin(fut::ready(0)));
            }
            limit = limit.min(room);
        }
        let shared = self.shared.clone();
        // The database counts the lease from its own "now", at the latest when the claim
        // arrives: count ours from before it was sent (on the monotonic clock), so a slow
        // answer can only shorten it — an answer later than the lease minus the fence margin
        // gives jobs that are handed back at once, never started.
        let sent_at = shared.clock.monotonic();
        shared.stats.count_claim();
        let params = ClaimParams {
            queue: self.queue.clone(),
            owner: shared.node.clone(),
            limit,
            kinds: Some(shared.kinds.clone()),
            lease: shared.config.lease,
            now: shared.clock.bound_now(),
        };
        let metrics = self.metrics.clone();
        let fut = async move {
            let t0 = Instant::now();
            let res = shared.store.claim(params).await;
            let took = t0.elapsed();
            tracing::trace!(limit, took_us = took.as_micros() as u64, "claim");
            if let Ok(claim) = &res {
                metrics.claimed(claim.jobs.len(), took);
            }
            res
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(
            move |res, act, ctx| match res {
                Ok(claimed) => {
                    let controlled = claimed.controlled();
                    let crate::store::Claimed {
                        jobs, wait, rated, ..
                    } = claimed;
                    let n = jobs.len();
                    act.rated = rated.is_some();
                    // The queue's rate limit holds claims back: try again when the window
                    // frees (a wake meanwhile may claim earlier, if it frees sooner).
                    if let Some(wait) = wait.filter(|_| n == 0 && !act.stopped && !act.rate_wait) {
                        act.rate_wait = true;
                        ctx.run_later(wait, |act, ctx| {
                            act.rate_wait = false;
                            act.wake(ctx);
                        });
                    }
                    let full = u32::try_from(n).is_ok_and(|n| n == limit);
                    // Checked before this claim's supervisors start taking permits.
                    act.window
                        .on_claim(full, act.workers.available_permits() > 0);
                    if controlled && !act.controlled_seen {
                        act.controlled_seen = true;
                        act.window.on_first_controlled();
                    }
                    if controlled && !full {
                        act.window.on_held_back();
                    }
                    if act.below_fair_share().is_some() && controlled && !full {
                        act.share_retry(ctx, n);
                    } else {
                        act.share_backoff = None;
                    }
                    act.start_all(jobs, sent_at, rated);
                    // A full claim: more may be due. Claim the next chunk while these run.
                    if full && act.free() >= act.chunk() {
                        act.wake(ctx);
                    }
                    n
                }
                Err(e) => {
                    act.store_failed(&e);
                    0
                }
            },
        )))
    }
}

impl Fetcher {
    /// The wall-clock second the fair share rotates on.
    fn second(&self) -> u64 {
        u64::try_from(self.shared.clock.now().timestamp()).unwrap_or(0)
    }

    /// The most jobs this node may hold now under its queue's global limit, if a fair share
    /// binds it (see `fair_share::node_cap`).
    fn share(&self) -> Option<u32> {
        node_cap(self.gate.fair_cap(self.second()), self.config.concurrency)
    }

    /// Whether this node holds fewer jobs than its fair share (counted up to its
    /// concurrency: a node whose workers are all busy has nothing to gain from a retry);
    /// `None` when no fair share applies. Unlike [`Fetcher::share`] this holds for an
    /// uncapped node too: one that started after the others, below its share, must not wait
    /// for the poll to win back the slots they took.
    fn below_fair_share(&self) -> Option<bool> {
        let cap = self.gate.fair_cap(self.second())?;
        Some(self.busy < cap.min(self.config.concurrency))
    }

    /// At its fair share: claim again when the next second may raise it (a freed slot
    /// wakes the fetcher anyway).
    fn wake_next_second(&mut self, ctx: &mut Context<Self>) {
        if self.share_timer {
            return;
        }
        self.share_timer = true;
        let into = self.shared.clock.now().timestamp_subsec_millis().min(999);
        let delay = Duration::from_millis(u64::from(1000 - into));
        ctx.run_later(delay, |act, ctx| {
            act.share_timer = false;
            act.wake(ctx);
        });
    }

    /// A claim under a fair share took fewer jobs than asked, `got` of them: while this node
    /// is below its share, the limit may be held by nodes above theirs (a rotation moved
    /// the share), whose freed slots only this node may take — so it claims again soon,
    /// backing off from [`SHARE_RETRY_MIN`] to [`SHARE_RETRY_MAX`], for at most
    /// [`SHARE_RETRY_FOR`] without a job (the queue may simply be empty; the poll goes on).
    fn share_retry(&mut self, ctx: &mut Context<Self>, got: usize) {
        let below = self.below_fair_share().unwrap_or(false);
        if !below {
            self.share_backoff = None;
            return;
        }
        let (delay, spent) = match self.share_backoff {
            Some((d, spent)) if got == 0 => ((d * 2).min(SHARE_RETRY_MAX), spent + d),
            _ => (SHARE_RETRY_MIN, Duration::ZERO),
        };
        if spent >= SHARE_RETRY_FOR || self.share_timer {
            return;
        }
        self.share_backoff = Some((delay, spent));
        self.share_timer = true;
        ctx.run_later(delay, |act, ctx| {
            act.share_timer = false;
            act.wake(ctx);
        });
    }

    /// Takes budget for each job, hands all the leases to the lease manager in one message,
    /// then starts each job's supervisor (whose task waits for a worker permit). `rated`: the jobs were
    /// counted in the queue's rate window at the database's time read this long after
    /// `claimed_at` or later, so each must start within the start margin of that.
    fn start_all(
        &mut self,
        jobs: Vec<crate::store::ClaimedJob>,
        claimed_at: Duration,
        rated: Option<Duration>,
    ) {
        if jobs.is_empty() {
            return;
        }
        let n = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        self.busy = self.busy.saturating_add(n);
        self.metrics.in_flight(self.busy);
        self.shared.stats.add_claimed(u64::from(n));
        let mut leases = Vec::with_capacity(jobs.len());
        let mut starts = Vec::with_capacity(jobs.len());
        let heard = self.shared.events.heard_at_debug();
        for claimed in jobs {
            if heard {
                self.shared.events.emit(Event::Claimed {
                    id: claimed.id,
                    kind: claimed.kind.clone(),
                    queue: claimed.queue.clone(),
                    attempt: claimed.attempts,
                    claim: claimed.token.claim(),
                });
            }
            let attempt = Arc::new(Attempt::of_claim(
                fence_point(claimed_at, self.shared.config.lease),
                self.gate.clone(),
                rated.map(|after| claimed_at + after + crate::RATE_START_MARGIN),
                claimed
                    .start_within_us
                    .map(|left| expire_point(claimed_at, left)),
            ));
            let (id, timeout, created_at) = (claimed.id, claimed.timeout, claimed.created_at);
            let queue = &self.queue;
            let (kind, metrics) = match self.kind_metrics.get(&claimed.kind) {
                Some((kind, m)) => (kind.clone(), m.clone()),
                None => {
                    let kind = &claimed.kind;
                    let (kind, m) = self.kind_metrics.entry(kind.clone()).or_insert_with(|| {
                        (
                            kind.as_str().into(),
                            Arc::new(KindMetrics::new(queue, kind)),
                        )
                    });
                    (kind.clone(), m.clone())
                }
            };
            let supervisor = Arc::new(JobSupervisor::new(
                self.shared.clone(),
                &claimed,
                (self.queue_name.clone(), kind.clone()),
                attempt.clone(),
                self.finished.clone(),
            ));
            leases.push(TrackLease {
                id,
                token: claimed.token.clone(),
                queue: self.queue_name.clone(),
                kind,
                supervisor: supervisor.clone(),
                claimed_at,
                created_at,
                timeout,
                attempt,
                metrics: metrics.clone(),
            });
            starts.push((supervisor, claimed, metrics));
        }
        // Sent before any handler's task starts, so that no report can overtake it (the
        // tasks run on other threads).
        self.track.do_send(TrackLeases(leases));
        for (supervisor, job, metrics) in starts {
            supervisor.start(job, self.workers.clone(), metrics);
        }
    }
}

/// Jobs of this queue finished (their finalizations confirmed) or lost their leases: their
/// budget is free again.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SlotFreed {
    /// How many slots.
    pub freed: u32,
    /// The longest any of these jobs waited in the prefetch for a worker.
    pub longest_wait: Duration,
}

impl Handler<SlotFreed> for Fetcher {
    type Result = ();

    fn handle(&mut self, m: SlotFreed, ctx: &mut Context<Self>) {
        self.busy = self.busy.saturating_sub(m.freed);
        self.metrics.in_flight(self.busy);
        self.window.on_freed(m.longest_wait);
        // Refill in worthwhile batches: once half the prefetch is free, or at once when the
        // workers could otherwise run out of jobs. A claim per freed job would cost a round
        // trip per job.
        let refill = self.free() >= self.chunk() || self.busy <= self.config.concurrency;
        if refill {
            self.wake(ctx);
        }
    }
}

/// Something may be due (a local enqueue, a database notification): claim soon. Wakes that
/// arrive while one is already queued coalesce into it, so a burst of enqueues costs one
/// claim, not one per job.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Wake;

impl Handler<Wake> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        if self.free() > 0 {
            self.wake(ctx);
        }
    }
}

/// A job was enqueued by another process (the change signal of the backends without
/// notifications): claim soon if some worker is idle. A node whose workers are all busy
/// claims when a slot frees anyway, so it does not add a claim for every signal.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct NewJobsElsewhere;

impl Handler<NewJobsElsewhere> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: NewJobsElsewhere, ctx: &mut Context<Self>) {
        if self.busy < self.config.concurrency {
            self.wake(ctx);
        }
    }
}

/// Shutdown: claim nothing more.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StopClaiming;

impl Handler<StopClaiming> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: StopClaiming, _ctx: &mut Context<Self>) {
        self.stopped = true;
    }
}

/// What a fetcher is doing (for tests and operators).
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct FetcherStatus {
    /// Budget taken: jobs held by this node (running, prefetched, finishing).
    pub busy: u32,
    /// Its concurrency.
    pub concurrency: u32,
    /// Its prefetch (the most the window may grow to).
    pub prefetch: u32,
    /// The current prefetch window (adapts between 0 and `prefetch`).
    pub prefetch_window: u32,
    /// Whether it still claims.
    pub claiming_enabled: bool,
}

/// Asks a fetcher for its [`FetcherStatus`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "FetcherStatus")]
pub struct GetFetcherStatus;

impl Handler<GetFetcherStatus> for Fetcher {
    type Result = FetcherStatus;

    fn handle(&mut self, _: GetFetcherStatus, _ctx: &mut Context<Self>) -> FetcherStatus {
        FetcherStatus {
            busy: self.busy,
            concurrency: self.config.concurrency,
            prefetch: self.config.prefetch,
            prefetch_window: self.window.get(),
            claiming_enabled: !self.stopped,
        }
    }
}

impl Handler<StopActor> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_deepens_only_when_due_jobs_met_idle_workers() {
        let mut w = PrefetchWindow::new(10, 1000);
        assert_eq!(w.get(), 10);
        w.on_claim(false, true); // the queue ran out: nothing to gain
        w.on_claim(true, false); // workers were busy: the prefetch sufficed
        assert_eq!(w.get(), 10);
        for expect in [20, 40, 80, 160, 320, 640, 1000, 1000] {
            w.on_claim(true, true);
            assert_eq!(w.get(), expect);
        }
    }

    #[test]
    fn the_window_halves_when_a_job_waited_too_long_and_can_reach_zero() {
        let mut w = PrefetchWindow::new(10, 1000);
        w.on_freed(PREFETCH_MAX_WAIT);
        assert_eq!(w.get(), 10, "a wait at the limit is fine");
        for expect in [5, 2, 1, 0, 0] {
            w.on_freed(PREFETCH_MAX_WAIT + Duration::from_millis(1));
            assert_eq!(w.get(), expect);
        }
        w.on_claim(true, true);
        assert_eq!(w.get(), 1, "and grows back from zero");
    }

    #[test]
    fn the_window_halves_while_a_limit_holds_claims_back() {
        let mut w = PrefetchWindow::new(33, 1000);
        for expect in [16, 8, 4, 2, 1, 0, 0] {
            w.on_held_back();
            assert_eq!(w.get(), expect);
        }
        w.on_claim(true, true);
        assert_eq!(w.get(), 1, "a full claim to idle workers opens it again");
    }

    #[test]
    fn a_controlled_queue_starts_again_from_an_empty_window() {
        let mut w = PrefetchWindow::new(10, 1000);
        assert_eq!(w.get(), 10);
        w.on_first_controlled();
        assert_eq!(w.get(), 0);
        w.on_claim(true, true);
        assert_eq!(w.get(), 1, "it opens as full claims meet idle workers");
    }

    #[test]
    fn no_prefetch_stays_off() {
        let mut w = PrefetchWindow::new(10, 0);
        assert_eq!(w.get(), 0);
        w.on_claim(true, true);
        assert_eq!(w.get(), 0);
    }
}
