//! Give-backs: a claimed job is handed back to `pending` without using an attempt — one
//! whose handler never started (fenced before its start, its queue paused:
//! [`WithdrawQueue`]), or every held job at shutdown ([`ReleaseAll`]).

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::finalization::Pending;
use super::{Key, LeaseManager};
use crate::scheduler::attempt::Revoked;
use crate::scheduler::job_supervisor::StopReason;
use crate::scheduler::Event;
use crate::store::Finalize;

impl LeaseManager {
    /// Queues the give-back of an attempt whose handler never started: back to `pending` at
    /// once, its attempt not counted (token-guarded: a no-op if the job is no longer ours).
    pub(super) fn give_back_unstarted(&mut self, key: &Key, ctx: &mut Context<Self>) {
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
