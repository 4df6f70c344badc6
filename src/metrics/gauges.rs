//! [`DatabaseGauges`]: the gauges that need the database — jobs by queue and state, due jobs by
//! queue and priority, queue lag, node heartbeats, jobs ended in the last 5 minutes by final
//! state — refreshed on every node, computed by one.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::Utc;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{
    Backend, GaugeSnapshot, Store, StoredGauges, DEFAULT_POOL_SIZE, DEFAULT_SQLITE_POOL_SIZE,
};

/// How often the database gauges are refreshed by default: **15 s**.
pub const DEFAULT_GAUGE_INTERVAL: Duration = Duration::from_secs(15);
/// The shortest refresh interval accepted: **1 s**.
pub const MIN_GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// Who may take a refresh's turn to compute the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Whoever asks first in the interval (a standalone exporter).
    Anyone,
    /// This node, as the database's leader under this term (refused once it is over).
    Leader(i64),
    /// Nobody here: only read what the leader computed.
    ReadOnly,
}

/// One label set of one gauge, as last exported (to set it to 0 once it is gone).
type Series = (&'static str, Vec<(&'static str, String)>);

/// Refreshes the database-wide gauges (the second table in [`crate::metrics`]).
///
/// Each [`refresh`](DatabaseGauges::refresh) either takes this interval's turn — one guarded
/// `UPDATE` that only one caller per interval wins, whichever node or process it runs in —
/// and then runs the grouped counts and stores them in the database, or reads the stored
/// result (one row). Either way it sets the gauges, so every node exports the same values
/// and the counts cost the database once per interval in all. A series that disappears (a
/// queue emptied, a node gone) is set to 0 rather than left at its last value.
///
/// A [`Scheduler`](crate::Scheduler) runs one itself (see
/// [`SchedulerConfig::gauges_every`](crate::SchedulerConfig::gauges_every)); `jobvisor
/// metrics --listen` runs one for a standalone exporter.
///
/// ```no_run
/// # async fn f(store: jobvisor::Store) -> jobvisor::Result<()> {
/// use jobvisor::metrics::{DatabaseGauges, DEFAULT_GAUGE_INTERVAL};
/// let mut gauges = DatabaseGauges::new(store, "exporter-1", DEFAULT_GAUGE_INTERVAL)?;
/// loop {
///     gauges.refresh().await?;
///     tokio::time::sleep(DEFAULT_GAUGE_INTERVAL).await;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct DatabaseGauges {
    store: Store,
    node: String,
    every: Duration,
    /// The series set by the last refresh.
    exported: HashSet<Series>,
}

impl DatabaseGauges {
    /// Gauges refreshed every `every` (at least [`MIN_GAUGE_INTERVAL`]) from `store`; `node`
    /// names this process in the database (who computed the last turn).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an interval under [`MIN_GAUGE_INTERVAL`] or an empty
    /// node name.
    pub fn new(store: Store, node: impl Into<String>, every: Duration) -> Result<Self> {
        if every < MIN_GAUGE_INTERVAL {
            return Err(Error::invalid(
                "every",
                format!("{every:?} is under the minimum gauge interval of {MIN_GAUGE_INTERVAL:?}"),
            ));
        }
        let node = node.into();
        if node.is_empty() {
            return Err(Error::invalid(
                "node",
                "is empty; expected a name for this process",
            ));
        }
        Ok(DatabaseGauges {
            store,
            node,
            every,
            exported: HashSet::new(),
        })
    }

    /// Samples the store's pool, then takes this interval's turn (and computes the counts)
    /// or reads the last computed ones, and sets the gauges. Answers whether this call
    /// computed them.
    ///
    /// # Errors
    /// [`Error::Database`] when the database cannot be reached (the gauges keep their
    /// values) or the stored snapshot is unreadable.
    pub async fn refresh(&mut self) -> Result<bool> {
        self.refresh_as(Turn::Anyone, &crate::clock::SystemClock)
            .await
    }

    /// [`refresh`](Self::refresh) with a say in who may take the turn: a scheduler's node
    /// takes it only as the database's leader, fenced by its term. `clock`: the node's,
    /// whose bound instant the statements take and whose monotonic time measures the
    /// counts' duration (a simulation's: virtual, so a seeded run replays).
    pub(crate) async fn refresh_as(&mut self, turn: Turn, clock: &dyn Clock) -> Result<bool> {
        let now = clock.bound_now();
        let size = self
            .store
            .options()
            .pool_size
            .unwrap_or(match self.store.backend() {
                Backend::Sqlite => DEFAULT_SQLITE_POOL_SIZE,
                _ => DEFAULT_POOL_SIZE,
            });
        super::pool(&self.store.pool_state(), size);
        // A little under the interval, so that a node whose ticks run a few milliseconds
        // early still takes its turn every interval rather than every other one.
        let every = self.every.mul_f64(0.9);
        let computed = match turn {
            Turn::Anyone => {
                self.store
                    .gauges_take_turn(&self.node, every, None, now)
                    .await?
            }
            Turn::Leader(term) => {
                self.store
                    .gauges_take_turn(&self.node, every, Some(term), now)
                    .await?
            }
            Turn::ReadOnly => false,
        };
        let stored = if computed {
            let t0 = clock.monotonic();
            let snapshot = self.store.gauges_compute(now).await?;
            // The throughput history's rollup rides on the turn (and counts in its cost).
            if let Err(e) = self.store.throughput_roll(snapshot.at).await {
                tracing::warn!(error = %e, "the throughput history was not rolled up");
            }
            let took = clock.monotonic().saturating_sub(t0);
            self.store.gauges_save(&snapshot, took).await?;
            StoredGauges {
                computed_at: snapshot.at,
                computed_by: Some(self.node.clone()),
                took,
                snapshot: Some(snapshot),
            }
        } else {
            self.store.gauges_read().await?
        };
        if let Some(snapshot) = &stored.snapshot {
            self.apply(snapshot, stored.took);
        }
        Ok(computed)
    }

    /// Sets every gauge from `s`, and to 0 each series exported before and absent now.
    fn apply(&mut self, s: &GaugeSnapshot, took: Duration) {
        let secs = |us: i64| (us.max(0) as f64) / 1e6;
        let mut now: HashSet<Series> = HashSet::new();
        let mut set = |name: &'static str, labels: Vec<(&'static str, String)>, v: f64| {
            metrics::gauge!(name, labels_of(&labels)).set(v);
            now.insert((name, labels));
        };
        let mut lag: BTreeMap<&str, i64> = BTreeMap::new();
        for (queue, state, n) in &s.jobs {
            set(
                super::JOBS,
                vec![("queue", queue.clone()), ("state", state.clone())],
                *n as f64,
            );
            lag.entry(queue).or_insert(s.at);
        }
        for (queue, priority, n, oldest) in &s.due {
            set(
                super::JOBS_DUE,
                vec![("queue", queue.clone()), ("priority", priority.to_string())],
                *n as f64,
            );
            let e = lag.entry(queue).or_insert(s.at);
            *e = (*e).min(*oldest);
        }
        for (queue, oldest) in lag {
            set(
                super::QUEUE_LAG,
                vec![("queue", queue.to_string())],
                secs(s.at - oldest),
            );
        }
        // A gone node (killed or cut off for good) is counted, not aged: its age would grow
        // until its row is forgotten a day later, and page all that time.
        let gone_after =
            i64::try_from(crate::store::NODE_GONE_AFTER.as_micros()).unwrap_or(i64::MAX);
        let mut gone = 0u64;
        for (node, heartbeat) in &s.nodes {
            if s.at - heartbeat > gone_after {
                gone += 1;
                continue;
            }
            set(
                super::NODE_HEARTBEAT_AGE,
                vec![("node", node.clone())],
                secs(s.at - heartbeat),
            );
        }
        set(super::NODES_GONE, Vec::new(), gone as f64);
        for (queue, kind, state, n) in &s.ended {
            set(
                super::JOBS_ENDED,
                vec![
                    ("queue", queue.clone()),
                    ("kind", kind.clone()),
                    ("state", state.clone()),
                ],
                *n as f64,
            );
        }
        let age = Utc::now().timestamp_micros() - s.at;
        set(super::GAUGES_AGE, Vec::new(), secs(age));
        set(super::GAUGES_REFRESH, Vec::new(), took.as_secs_f64());
        for (name, labels) in self.exported.difference(&now) {
            metrics::gauge!(*name, labels_of(labels)).set(0.0);
        }
        // The zeroed series stay known (and are zeroed again each refresh: a few writes),
        // so one that comes back is simply set again.
        self.exported.extend(now);
    }
}

fn labels_of(labels: &[(&'static str, String)]) -> Vec<metrics::Label> {
    labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect()
}
