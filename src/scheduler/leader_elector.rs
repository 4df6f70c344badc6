//! LeaderElector: keeps or takes the database's leadership for this node, every third of
//! [`leader_lease`](crate::SchedulerConfig::leader_lease), with one guarded transaction
//! (`store::leader`): a leader renews its term; any node takes the row once its lease has
//! expired, under a new term. Changes are events ([`Event::LeaderElected`],
//! [`Event::LeaderLost`]) and logs.
//!
//! The node's own view ([`LeaderTerm`](super::leader_term::LeaderTerm)) is conservative: a term counts
//! from the *send* time of the statement that confirmed it, minus a margin, on the monotonic
//! clock — so a leader that cannot renew (database unreachable, process frozen) stops acting
//! as leader before its lease can have expired in the database, and before another node can
//! have taken over. Leader-only writes are fenced by the database too, by term.
//!
//! At graceful shutdown the leader resigns, so another node takes over at its next attempt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::attempt::fence_margin;
use super::{report_store_error, Event, Shared, StopActor};

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Keeps or takes leadership; see the module docs.
pub(crate) struct LeaderElector {
    shared: Arc<Shared>,
    /// The term this node believes it holds.
    term: Option<i64>,
    /// An election is in flight; overlapping ticks are skipped.
    electing: bool,
    /// Resigned (shutting down): no election any more.
    resigned: bool,
    last_error: Option<Instant>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("term", &self.term)
            .field("electing", &self.electing)
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LeaderElector {
            shared,
            term: None,
            electing: false,
            resigned: false,
            last_error: None,
        }
    }

    /// The held term is over: forget it and say why.
    fn lose(&mut self, reason: &'static str) {
        if let Some(term) = self.term.take() {
            self.shared.leader.clear();
            self.shared.events.emit(Event::LeaderLost {
                term: u64::try_from(term).unwrap_or(0),
                reason,
            });
        }
    }
}

impl Actor for LeaderElector {
    type Context = Context<Self>;
}

/// Keep or take leadership now. Answers the term this node leads under afterwards, if any.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<u64>")]
pub(crate) struct Elect;

impl Handler<Elect> for LeaderElector {
    type Result = ResponseActFuture<Self, Option<u64>>;

    fn handle(&mut self, _: Elect, _ctx: &mut Context<Self>) -> Self::Result {
        let held = |act: &Self| act.term.and_then(|t| u64::try_from(t).ok());
        if self.electing || self.resigned {
            return Box::pin(fut::ready(held(self)));
        }
        let sent_at = self.shared.clock.monotonic();
        // A term whose estimate ended is over, whatever a late answer may say: another node
        // may already lead.
        if self.term.is_some() && self.shared.leader.current(sent_at).is_none() {
            self.lose("not_renewed");
        }
        self.electing = true;
        let shared = self.shared.clone();
        let held_term = self.term;
        let lease = shared.config.leader_lease;
        let fut = async move {
            shared
                .store
                .leader_keep_or_take(&shared.node, held_term, lease, shared.clock.bound_now())
                .await
        };
        Box::pin(fut.into_actor(self).map(move |res, act, _ctx| {
            act.electing = false;
            match res {
                // Resigned while this election was in flight: give the term straight back.
                Ok(Some(l)) if act.resigned => {
                    let shared = act.shared.clone();
                    actix::spawn(async move {
                        let _ = shared
                            .store
                            .leader_resign(&shared.node, l.term, shared.clock.bound_now())
                            .await;
                    });
                }
                Ok(Some(l)) => {
                    if l.elected {
                        // A term of ours that lapsed in the database ends here, even if
                        // nobody took it in between.
                        act.lose("not_renewed");
                        act.shared.events.emit(Event::LeaderElected {
                            term: u64::try_from(l.term).unwrap_or(0),
                        });
                    }
                    act.term = Some(l.term);
                    let lease = act.shared.config.leader_lease;
                    act.shared
                        .leader
                        .hold(l.term, sent_at + lease.saturating_sub(fence_margin(lease)));
                }
                Ok(None) => act.lose("taken_over"),
                Err(e) => report_store_error(
                    &act.shared.events,
                    "leader_elector",
                    &mut act.last_error,
                    ERROR_LOG_EVERY,
                    &e,
                ),
            }
            held(act)
        }))
    }
}

/// Give leadership up (graceful shutdown). Answers whether a term was held.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "bool")]
pub(crate) struct Resign;

impl Handler<Resign> for LeaderElector {
    type Result = ResponseActFuture<Self, bool>;

    fn handle(&mut self, _: Resign, _ctx: &mut Context<Self>) -> Self::Result {
        self.resigned = true;
        let Some(term) = self.term else {
            return Box::pin(fut::ready(false));
        };
        // From now on this node does no leader work, whatever the store answers.
        self.shared.leader.clear();
        let shared = self.shared.clone();
        let fut = async move {
            shared
                .store
                .leader_resign(&shared.node, term, shared.clock.bound_now())
                .await
        };
        Box::pin(fut.into_actor(self).map(|res, act, _ctx| {
            if let Err(e) = res {
                // The lease simply runs out; another node takes over then.
                report_store_error(
                    &act.shared.events,
                    "leader_elector",
                    &mut act.last_error,
                    ERROR_LOG_EVERY,
                    &e,
                );
            }
            act.lose("resigned");
            true
        }))
    }
}

impl Handler<StopActor> for LeaderElector {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
