//! Fencing: the deadline check ([`CheckDeadlines`]) stops handlers past their timeout
//! (counted from their start) or cancel grace, takes away a lease that could not be renewed
//! before its fence point (self-fencing), abandons a handler that would not stop, and holds
//! starts after a detected pause of the process.

use actix::prelude::*;
use tokio::time::Instant;

use super::renewal::RenewLeases;
use super::{Key, LeaseManager};
use crate::scheduler::attempt::{fence_margin, Revoked};
use crate::scheduler::job_supervisor::StopReason;
use crate::scheduler::Event;

/// Checks timeouts, cancel grace and lease validity of every running job (and retries a
/// pending flush). Answers how many handlers were told to stop.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct CheckDeadlines;

/// What one lease's deadline check found.
enum Deadline {
    /// Nothing due.
    Fine,
    /// Its handler was told to stop (timeout, cancel grace over).
    Stopped,
    /// Its fence point was reached: the lease is taken away.
    AtRisk,
    /// Told to stop and still not reporting past its stop deadline: abandoned
    /// (`newly_fenced`: not fenced before this check).
    Abandoned { newly_fenced: bool },
}

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
            match self.check_deadline(&key, now, grace) {
                Deadline::Fine => {}
                Deadline::Stopped => stopped += 1,
                Deadline::AtRisk => {
                    at_risk.push(key);
                    stopped += 1;
                }
                Deadline::Abandoned { newly_fenced } => abandoned.push((key, newly_fenced)),
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
    /// Checks one lease at `now` (monotonic µs): stops a handler past its timeout or cancel
    /// grace (given `grace` to stop), and says whether the lease is to be fenced or abandoned.
    fn check_deadline(&mut self, key: &Key, now: i64, grace: i64) -> Deadline {
        let Some(l) = self.leases.get_mut(key) else {
            return Deadline::Fine;
        };
        // A handler's transaction holding its lease guard is committing, or completed the
        // job: nothing to fence or time out (its supervisor reports how it ended).
        if l.finishing || l.attempt.committing() {
            return Deadline::Fine;
        }
        if l.stopped {
            // Told to stop and still not reporting: its handler ignores the signal. Stop
            // renewing it for good so the job can be reclaimed once the lease has expired.
            if l.stop_deadline.is_some_and(|d| now >= d) {
                if !l.fenced {
                    l.attempt.revoke();
                    l.supervisor.stop(StopReason::SelfFence);
                }
                return Deadline::Abandoned {
                    newly_fenced: !l.fenced,
                };
            }
            return Deadline::Fine;
        }
        if l.attempt.lapsed(now) {
            return Deadline::AtRisk;
        }
        let reason = if l
            .attempt
            .started_us()
            .is_some_and(|t| now >= t.saturating_add(l.timeout))
        {
            StopReason::Timeout
        } else if l.cancel_deadline.is_some_and(|d| now >= d) {
            StopReason::CancelGraceOver
        } else {
            return Deadline::Fine;
        };
        l.stop(reason, now + grace);
        if reason == StopReason::Timeout {
            self.shared.events.emit(Event::TimedOut {
                id: key.0,
                kind: l.kind.to_string(),
            });
        }
        Deadline::Stopped
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
