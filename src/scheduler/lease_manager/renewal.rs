//! Renewal: the heartbeat ([`RenewLeases`]) renews every lease in one statement, carrying
//! the starts and progress reports not yet written; its answer moves each attempt's fence
//! point, reports a lost lease to its supervisor and passes a cancel request on. An overdue
//! renewal is hedged on a fresh connection, and a cancel asked of a held job
//! ([`CancelAsked`]) renews at once.

use std::time::Duration;

use tokio::time::Instant;

use actix::prelude::*;

use super::{Key, LeaseManager, ERROR_LOG_EVERY};
use crate::error::Error;
use crate::job::JobId;
use crate::scheduler::attempt::{fence_point, us};
use crate::scheduler::job_supervisor::StopReason;
use crate::scheduler::{report_store_error, Event};
use crate::store::{Guarded, LeaseRef, RenewParams, Renewed};

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

/// What a renewal carried for one lease: whether its start, and which progress report.
type Carried = (bool, Option<u64>);

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
        let Some(hedge) = self.hedge_needed(sent_at, hedge_after) else {
            return Box::pin(fut::ready(RenewReport::default()));
        };
        // Fenced leases are not renewed: they are being given back; nor those of jobs their
        // handler's transaction completed (they are `succeeded` in the database).
        let keys = self.keys_where(|l| !l.fenced && !l.attempt.is_completed());
        if keys.is_empty() {
            self.revalidated(sent_at);
            return Box::pin(fut::ready(RenewReport::default()));
        }
        let seq = self.renewal_sent(sent_at, hedge, hedge_after, ctx);
        self.shared.stats.count_renew();
        let (params, carried) = self.renew_params(&keys, sent_at);
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
            match res {
                Ok(results) => {
                    let outcomes = results.into_iter().map(|(_, o)| o);
                    act.renewed(keys, carried, outcomes, sent_at, ctx)
                }
                Err(e) => {
                    act.renewal_failed(&e, sent_at, hedge_after, ctx);
                    RenewReport::default()
                }
            }
        }))
    }
}

impl LeaseManager {
    /// Whether a renewal sent now is a hedge (`Some(true)`: one is in flight and the newest
    /// is overdue), a plain one (`Some(false)`: none in flight), or is not sent (`None`: the
    /// newest in flight is not overdue yet, or [`MAX_RENEWALS_IN_FLIGHT`] are).
    fn hedge_needed(&self, sent_at: i64, hedge_after: Duration) -> Option<bool> {
        let Some(&(_, newest)) = self.renewals.last() else {
            return Some(false);
        };
        let last = self.last_renew_sent.unwrap_or(newest).max(newest);
        if self.renewals.len() >= MAX_RENEWALS_IN_FLIGHT || sent_at - last < us(hedge_after) {
            return None;
        }
        Some(true)
    }

    /// Books a renewal sent at `sent_at` and answers its number; with timers on, hedges it
    /// if it is unanswered after `hedge_after` and still the newest.
    fn renewal_sent(
        &mut self,
        sent_at: i64,
        hedge: bool,
        hedge_after: Duration,
        ctx: &mut Context<Self>,
    ) -> u64 {
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
        seq
    }

    /// The renewal statement's parameters for `keys`, and what it carries for each.
    fn renew_params(&self, keys: &[Key], sent_at: i64) -> (RenewParams, Vec<Carried>) {
        let mut carried = Vec::with_capacity(keys.len());
        let leases: Vec<LeaseRef> = keys
            .iter()
            .map(|k| {
                let l = &self.leases[k];
                // Carry the start until a renewal with it was applied; likewise the
                // handler's latest progress report.
                let started = l.attempt.started_us().filter(|_| !l.start_recorded);
                let progress = l.attempt.progress().unwritten();
                carried.push((started.is_some(), progress.as_ref().map(|(n, _)| *n)));
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
        (params, carried)
    }

    /// A renewal sent at `sent_at` answered: each lease renewed or found lost (`outcomes`
    /// in the order of `keys`).
    fn renewed(
        &mut self,
        keys: Vec<Key>,
        carried: Vec<Carried>,
        outcomes: impl Iterator<Item = Guarded<Renewed>>,
        sent_at: i64,
        ctx: &mut Context<Self>,
    ) -> RenewReport {
        self.renew_failures = 0;
        let mut report = RenewReport {
            statements: 1,
            ..RenewReport::default()
        };
        // This statement's own send time, whichever renewal it was: an older renewal
        // answering after a newer one moves nothing (`Attempt::extend` never moves
        // the fence point back), and no answer is credited with a later send than its own.
        let fence_at = fence_point(
            Duration::from_micros(u64::try_from(sent_at).unwrap_or(0)),
            self.shared.config.lease,
        );
        let cancel_deadline = self.mono() + self.cancel_grace();
        // The store answers in the order it was asked, one result per lease sent.
        for ((key, carried), outcome) in keys.into_iter().zip(carried).zip(outcomes) {
            match outcome {
                Guarded::Applied(r) => {
                    report.renewed += 1;
                    self.lease_renewed(&key, carried, r, fence_at, cancel_deadline);
                }
                Guarded::LeaseLost | Guarded::Stale => {
                    report.lost += 1;
                    self.lease_lost(&key);
                }
            }
        }
        self.shared.events.emit(Event::LeasesRenewed {
            renewed: report.renewed,
            lost: report.lost,
        });
        // Estimates are fresh: starts held for a pause may go on.
        self.revalidated(sent_at);
        if self.revalidate_since.is_some() {
            // A pause was detected while this renewal was in flight: renew once more.
            ctx.notify(RenewLeases);
        }
        report
    }

    /// One lease was renewed: its fence point moves to `fence_at`, what the renewal carried
    /// is written, and a cancel request is passed on to its handler.
    fn lease_renewed(
        &mut self,
        key: &Key,
        (carried_start, carried_progress): Carried,
        r: Renewed,
        fence_at: Duration,
        cancel_deadline: i64,
    ) {
        let Some(l) = self.leases.get_mut(key) else {
            return;
        };
        if l.fenced {
            // Taken away since: the give-back supersedes this renewal.
            return;
        }
        l.attempt.extend(fence_at);
        l.start_recorded |= carried_start;
        if let Some(n) = carried_progress {
            l.attempt.progress().written(n);
        }
        if r.cancel_requested && l.cancel_deadline.is_none() && !l.finishing {
            l.cancel_deadline = Some(cancel_deadline);
            l.supervisor.stop(StopReason::Cancel);
            self.shared.events.emit(Event::CancelSignalled {
                id: key.0,
                kind: l.kind.to_string(),
            });
        }
    }

    /// One lease was found lost: its handler is stopped and the lease forgotten.
    fn lease_lost(&mut self, key: &Key) {
        // A job whose finalization or give-back is in flight learns its fate from that write
        // itself; only this attempt's lease is dropped. So does one whose handler's
        // transaction is committing or completed the job: that transaction's own guard
        // decides, and its supervisor reports the outcome (no lease-lost report for it).
        if !self
            .leases
            .get(key)
            .is_some_and(|l| !l.finishing && !l.attempt.committing())
        {
            return;
        }
        if let Some(l) = self.forget(key) {
            l.attempt.revoke();
            self.shared.stats.add_lease_lost(1);
            l.supervisor.stop(StopReason::LeaseLost);
            self.shared.events.emit(Event::LeaseLost {
                id: key.0,
                kind: l.kind.to_string(),
                claim: key.1.claim(),
            });
        }
    }

    /// A renewal failed: the estimates decide alone, and another is sent soon (backing off),
    /// with room for a hedge while an older renewal hangs.
    fn renewal_failed(
        &mut self,
        e: &Error,
        sent_at: i64,
        hedge_after: Duration,
        ctx: &mut Context<Self>,
    ) {
        report_store_error(
            &self.shared.events,
            "lease_manager",
            &mut self.last_error,
            ERROR_LOG_EVERY,
            e,
        );
        // The estimates decide alone now: they refuse what may have expired.
        self.revalidated(sent_at);
        // Try again soon rather than a whole heartbeat later.
        self.renew_failures = self.renew_failures.saturating_add(1);
        let wait = (RENEW_RETRY * 2u32.pow(self.renew_failures.min(4) - 1))
            .min(Duration::from_secs(1))
            .min(self.shared.config.renew_every);
        ctx.notify_later(RenewLeases, wait);
        if !self.renewals.is_empty() {
            // Room for another hedge while an older renewal hangs: one `hedge_after` after
            // this one was sent, never at once.
            ctx.notify_later(RenewLeases, hedge_after);
        }
    }

    /// A renewal sent at `sent_at` answered (or there was nothing to renew): if it was sent
    /// after a detected pause, starts may go on.
    pub(super) fn revalidated(&mut self, sent_at: i64) {
        if self.revalidate_since.is_some_and(|since| sent_at >= since) {
            self.revalidate_since = None;
            self.shared.start_hold.release();
        }
    }
}
