//! [`Shared`]: what every actor of one node reads (store, clock, settings, handlers, event
//! bus, handler runtime, totals, leadership), built once by the [`SchedulerBuilder`](super::SchedulerBuilder)
//! and read-only after start.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backoff::RetryPolicy;
use crate::client::Client;
use crate::clock::Clock;
use crate::config::{QueueConfig, SchedulerConfig};
use crate::handler::ErasedHandler;
use crate::lease::NodeId;
use crate::schedule::Compiled;
use crate::store::Store;

use super::event::EventBus;
use super::leader_term::LeaderTerm;
use super::queue_gate::QueueGate;
use super::reconciler::Reconciler;
use super::start_hold::StartHold;
use super::stats::Stats;

/// A registered handler with its own retry policy, if any.
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) retry: Option<RetryPolicy>,
}

/// The node's handlers by kind, looked up once per claimed job: foldhash (as the lease
/// map's), since the kinds are the application's own names and SipHash's resistance to chosen
/// keys buys nothing here.
pub(crate) type Handlers = HashMap<String, Registered, foldhash::fast::RandomState>;

/// What every actor of one node shares (read-only after start).
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) node: NodeId,
    pub(crate) config: SchedulerConfig,
    pub(crate) queues: HashMap<String, QueueConfig>,
    pub(crate) handlers: Handlers,
    /// The kinds of `handlers`, sorted: what this node claims.
    pub(crate) kinds: Vec<String>,
    pub(crate) events: EventBus,
    /// Where handlers run: never the actors' arbiter.
    pub(crate) handler_rt: tokio::runtime::Handle,
    /// Running totals, readable from any thread.
    pub(crate) stats: Stats,
    /// Holds handler starts while a detected pause is revalidated.
    pub(crate) start_hold: StartHold,
    /// The node's client (its enqueues wake this node's fetchers), handed to handlers.
    pub(crate) client: Client,
    /// Whether this node leads the database, and under which term.
    pub(crate) leader: LeaderTerm,
    /// The reconcilers this node runs when it leads.
    pub(crate) reconcilers: Vec<Reconciler>,
    /// The schedules this node declares (stored at start).
    pub(crate) schedules: Vec<Compiled>,
    /// Set to true once `schedules` are stored; the node's client waits for it.
    pub(crate) schedules_stored: tokio::sync::watch::Sender<bool>,
    /// The node's view of each served queue's pause, read at every start (kept in step by
    /// the queue watch).
    pub(crate) queue_gates: HashMap<String, Arc<QueueGate>>,
    /// The application's hooks around enqueue and run (`hooks.rs`); `None`: none, and
    /// nothing is added to a run.
    pub(crate) hooks: Option<crate::hooks::Hooks>,
}

impl Shared {
    /// The retry policy for a job: its kind's, else its queue's, else the node's.
    pub(crate) fn retry_policy(&self, kind: &str, queue: &str) -> RetryPolicy {
        self.handlers
            .get(kind)
            .and_then(|h| h.retry)
            .or_else(|| self.queues.get(queue).and_then(|q| q.retry))
            .unwrap_or(self.config.retry)
    }
}
