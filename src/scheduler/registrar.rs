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

/// Reads the node registry and records, for each served queue with a global limit, this
/// node's rank among the live nodes serving it (the fair share's input, `fair_share.rs`).
/// Nothing is read while no served queue has a limit.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct RefreshPeers;

impl Handler<RefreshPeers> for Registrar {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: RefreshPeers, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        if !shared.queue_gates.values().any(|g| g.limit().is_some()) {
            return Box::pin(fut::ready(()));
        }
        let fut = async move { shared.store.nodes_list().await };
        Box::pin(fut.into_actor(self).map(|res, act, _| match res {
            Ok(nodes) => act.record_peers(&nodes),
            Err(e) => act.store_failed(&e),
        }))
    }
}

impl Registrar {
    /// Records this node's rank among the live nodes serving each of its queues. Live: a
    /// heartbeat within three heartbeat intervals of the newest one listed (the database's
    /// clock on both sides, so the nodes' clocks do not matter).
    fn record_peers(&self, nodes: &[crate::store::NodeInfo]) {
        let Some(newest) = nodes.iter().map(|n| n.heartbeat_at).max() else {
            return;
        };
        let live_for = self.shared.config.node_heartbeat_every.saturating_mul(3);
        let live_for = chrono::Duration::from_std(live_for).unwrap_or(chrono::Duration::MAX);
        let me = self.shared.node.as_str();
        for (queue, gate) in &self.shared.queue_gates {
            // Sorted by node id (the registry lists them so).
            let serving: Vec<&str> = nodes
                .iter()
                .filter(|n| n.heartbeat_at + live_for >= newest && n.queues.contains(queue))
                .map(|n| n.node.as_str())
                .collect();
            if let Some(rank) = serving.iter().position(|n| *n == me) {
                let count = u32::try_from(serving.len()).unwrap_or(u32::MAX);
                gate.set_peers(u32::try_from(rank).unwrap_or(u32::MAX), count);
            }
        }
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
