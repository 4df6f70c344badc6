//! The Registrar: keeps this node's row in the node registry (`jobvisor_nodes`: the queues
//! it serves, the kinds it runs, its heartbeat) and looks for due jobs that no live node
//! can run, reporting them ([`Event::Unserved`] and a warning).
//!
//! Claims already take only the kinds their node can run, so a rolling deploy never burns
//! an attempt on a node that lacks a new kind; what the registry adds is visibility — a job
//! waiting for a kind, or in a queue, that nothing serves would otherwise wait in silence.
//! Every node looks (the check is one grouped read of long-waiting jobs and one read of the
//! registry); its failures are logged and retried at the next tick, never fatal.

use std::sync::Arc;

use actix::prelude::*;

use super::event::Event;
use super::{report_store_error, Shared, StopActor};

/// Store errors are logged at most this often (the next tick retries anyway).
const ERROR_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Keeps the node registered and reports unserved jobs.
pub(crate) struct Registrar {
    shared: Arc<Shared>,
    /// When this node's scheduler started (its registry row's `started_at`).
    started: chrono::DateTime<chrono::Utc>,
    queues: Vec<String>,
    kinds: Vec<String>,
    last_error: Option<std::time::Instant>,
}

impl Registrar {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let mut queues: Vec<String> = shared.queues.keys().cloned().collect();
        queues.sort_unstable();
        Registrar {
            started: shared.clock.now(),
            kinds: shared.kinds.clone(),
            queues,
            shared,
            last_error: None,
        }
    }
}

impl Registrar {
    /// Logs a failed store call (at most once a minute; the next tick retries anyway).
    fn store_failed(&mut self, e: &crate::error::Error) {
        report_store_error(
            &self.shared.events,
            "registrar",
            &mut self.last_error,
            ERROR_LOG_EVERY,
            e,
        );
    }
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar")
            .field("node", &self.shared.node)
            .finish_non_exhaustive()
    }
}

impl Actor for Registrar {
    type Context = Context<Self>;
}

impl Handler<StopActor> for Registrar {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Writes this node's registry row now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct NodeHeartbeat;

impl Handler<NodeHeartbeat> for Registrar {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: NodeHeartbeat, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let (queues, kinds, started) = (self.queues.clone(), self.kinds.clone(), self.started);
        let fut = async move {
            shared
                .store
                .node_heartbeat(
                    &shared.node,
                    &queues,
                    &kinds,
                    Some(started),
                    shared.clock.bound_now(),
                )
                .await
        };
        Box::pin(fut.into_actor(self).map(|res, act, _| {
            if let Err(e) = res {
                act.store_failed(&e);
            }
        }))
    }
}

/// Looks for due jobs no live node can run; answers how many groups were reported.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub(crate) struct CheckUnserved;

impl Handler<CheckUnserved> for Registrar {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, _: CheckUnserved, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let after = shared.config.unserved_after;
        let live = shared.config.node_heartbeat_every.saturating_mul(3);
        let fut = async move {
            shared
                .store
                .unserved_jobs(after, live, shared.clock.bound_now())
                .await
        };
        Box::pin(fut.into_actor(self).map(|res, act, _| match res {
            Ok(groups) => {
                let n = groups.len();
                for u in groups {
                    act.shared.events.emit(Event::Unserved(u));
                }
                n
            }
            Err(e) => {
                act.store_failed(&e);
                0
            }
        }))
    }
}

/// Graceful shutdown: removes this node's row, so it stops counting as serving anything.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct Unregister;

impl Handler<Unregister> for Registrar {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Unregister, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let fut = async move { shared.store.node_unregister(&shared.node).await };
        Box::pin(fut.into_actor(self).map(|res, act, _| {
            if let Err(e) = res {
                tracing::warn!(node = %act.shared.node, error = %e, "could not remove this node from the registry; it ages out");
            }
        }))
    }
}
