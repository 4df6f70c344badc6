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
//!
//! The folder, one noun a file: this file holds the actor, its leases and its status;
//! `tracking.rs` the leases handed over by the fetchers; `renewal.rs` the heartbeat, its
//! hedges and cancel asks; `fencing.rs` the deadline check, the fence point and pause
//! detection; `give_back.rs` the give-backs of unstarted jobs and shutdown's release;
//! `finalization.rs` the outcomes' batched writes.

mod fencing;
mod finalization;
mod give_back;
mod renewal;
mod tracking;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

// tokio's clock, not std's: the same in production, and a simulation that pauses tokio's
// time decides when a flush's back-off ends and how late a deadline check is.
use tokio::time::Instant;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use super::attempt::{us, Attempt};
use super::fetcher::SlotFreed;
use super::job_supervisor::{JobSupervisor, StopReason};
use super::{Shared, StopActor};
use crate::job::JobId;
use crate::lease::LeaseToken;
use crate::metrics::{KindMetrics, OutcomeMetrics};

pub use fencing::CheckDeadlines;
use finalization::Pending;
// Named outside this folder by `testing` only.
#[cfg(feature = "test-util")]
pub use finalization::FlushFinalizations;
pub use finalization::JobFinished;
pub use give_back::ReleaseAll;
pub(crate) use give_back::WithdrawQueue;
pub(crate) use renewal::CancelAsked;
pub use renewal::RenewLeases;
#[cfg(feature = "test-util")]
pub use renewal::RenewReport;
pub(crate) use tracking::{RegisterFetchers, TrackLease, TrackLeases};

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

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

/// Owns the node's leases; see the module docs.
pub struct LeaseManager {
    shared: Arc<Shared>,
    leases: Leases,
    pending: Vec<Pending>,
    /// Each queue's fetcher, told when slots free up (a `Recipient`, so the lease manager
    /// can be driven alone in a test).
    fetchers: HashMap<String, Recipient<SlotFreed>>,
    /// Finalization statements in flight (at most [`MAX_FLUSHES`](finalization::MAX_FLUSHES)).
    flushing: u32,
    /// Renewals in flight, oldest first: their numbers and send times (monotonic µs). At
    /// most [`MAX_RENEWALS_IN_FLIGHT`](renewal::MAX_RENEWALS_IN_FLIGHT); a new one goes out
    /// while others are in flight only once the newest is overdue (a hedge).
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
}

impl Actor for LeaseManager {
    type Context = Context<Self>;
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
    use std::collections::HashSet;

    use super::*;

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
}
