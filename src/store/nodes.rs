//! The node registry (`jobvisor_nodes`): which nodes run a scheduler on this database, when
//! each last reported, and what it serves — its queues and the job kinds it has handlers
//! for. Each node writes its own row (at start, then with every node heartbeat, removed at
//! graceful shutdown); anyone reads them.
//!
//! What it answers: which waiting jobs no live node can run. A job in a queue that no live
//! node serves, or of a kind that no live node serving its queue has a handler for, would
//! wait for ever without a sign — the mark of a rolling deploy gone wrong (a new kind
//! enqueued before any node that runs it is up) or of a queue name mistyped. Since claims
//! take only the kinds their node can run, such jobs are never burnt either: they wait, and
//! [`Store::unserved_jobs`] names them.
//!
//! A row is one small write per node per heartbeat (delete and insert in one transaction,
//! the same statements on every backend, which also brings back a row removed while the
//! node was frozen); rows silent for a day are removed by whoever next reads.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::dsl::{count_star, min};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::driver::{with_conn, with_tx};
use super::expr::DbNow;
use super::rows::{dur_us, from_us};
use super::schema::{jobvisor_jobs as jobs, jobvisor_nodes as nodes};
use super::Store;
use crate::error::{Error, Result};
use crate::job::JobState;
use crate::lease::NodeId;

/// Rows of nodes silent this long are removed.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);
/// A node silent this long — three of the default node heartbeats
/// ([`DEFAULT_NODE_HEARTBEAT_EVERY`](crate::config::DEFAULT_NODE_HEARTBEAT_EVERY)) — is
/// **gone**: killed or cut off rather than slow. Its heartbeat age is no longer exported
/// (the gauge `jobvisor_nodes_gone` counts it instead), the command line marks it, and
/// `jobvisor nodes --forget` removes it; its row is removed a day later anyway.
pub const NODE_GONE_AFTER: Duration = Duration::from_secs(30);
/// At most this many `(queue, kind)` groups of waiting jobs are examined per check.
const MAX_GROUPS: i64 = 1000;

/// A node as it registered itself: what it serves and when it last reported.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct NodeInfo {
    /// The node's id.
    pub node: String,
    /// The queues it fetches from.
    pub queues: Vec<String>,
    /// The job kinds it has handlers for.
    pub kinds: Vec<String>,
    /// When its scheduler started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
}

impl NodeInfo {
    /// Whether the node has been silent for longer than [`NODE_GONE_AFTER`] at `now`.
    pub fn is_gone(&self, now: DateTime<Utc>) -> bool {
        (now - self.heartbeat_at)
            .to_std()
            .is_ok_and(|silent| silent > NODE_GONE_AFTER)
    }
}

/// Why waiting jobs have no node to run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UnservedReason {
    /// No live node fetches from the queue.
    NoNodeServesQueue,
    /// Live nodes fetch from the queue, but none of them has a handler for the kind.
    NoNodeHasKind,
}

/// Jobs of one queue and kind that are due and waiting, with no live node able to run them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Unserved {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// How many such jobs wait (due at least the check's threshold ago).
    pub jobs: u64,
    /// When the longest-waiting of them became due.
    pub oldest_due: DateTime<Utc>,
    /// Why no node runs them.
    pub reason: UnservedReason,
}

/// Waiting jobs of one queue and kind: `(queue, kind, count, earliest run_at)`.
type WaitingGroup = (String, String, i64, Option<i64>);

#[derive(Queryable)]
struct NodeRow {
    node: String,
    queues: String,
    kinds: String,
    started_at: i64,
    heartbeat_at: i64,
}

impl NodeRow {
    fn into_info(self) -> NodeInfo {
        let names = |s: &str| serde_json::from_str::<Vec<String>>(s).unwrap_or_default();
        NodeInfo {
            queues: names(&self.queues),
            kinds: names(&self.kinds),
            node: self.node,
            started_at: from_us(self.started_at),
            heartbeat_at: from_us(self.heartbeat_at),
        }
    }
}

impl Store {
    /// Registers `node` (or refreshes its row): it serves `queues` with handlers for `kinds`,
    /// and is alive now. `started` is when its scheduler started (kept across heartbeats by
    /// the caller). `now`: a test clock, or `None` for the database's.
    pub(crate) async fn node_heartbeat(
        &self,
        node: &NodeId,
        queues: &[String],
        kinds: &[String],
        started: Option<DateTime<Utc>>,
        now: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let node = node.as_str().to_string();
        let queues = json_names(queues);
        let kinds = json_names(kinds);
        let now = DbNow::new(bound(now));
        let started = bound(started);
        let _: usize = with_tx!(self, |conn| {
            // The first registration's start, if the row is there.
            let kept: Option<i64> = nodes::table
                .filter(nodes::node.eq(&node))
                .select(nodes::started_at)
                .first(conn)
                .await
                .optional()?;
            diesel::delete(nodes::table.filter(nodes::node.eq(&node)))
                .execute(conn)
                .await?;
            // The given start, else the row's first one, else now.
            let started_at = started.or(kept).map_or(now, |s| DbNow::new(Some(s)));
            diesel::insert_into(nodes::table)
                .values((
                    nodes::node.eq(&node),
                    nodes::queues.eq(&queues),
                    nodes::kinds.eq(&kinds),
                    nodes::started_at.eq(started_at),
                    nodes::heartbeat_at.eq(now),
                ))
                .execute(conn)
                .await
        })?;
        Ok(())
    }

    /// Removes `node`'s row (graceful shutdown).
    pub(crate) async fn node_unregister(&self, node: &NodeId) -> Result<()> {
        let node = node.as_str().to_string();
        let _: usize = with_tx!(self, |conn| {
            diesel::delete(nodes::table.filter(nodes::node.eq(&node)))
                .execute(conn)
                .await
        })?;
        Ok(())
    }

    /// Every registered node, by id, with its last heartbeat (stale ones too: the caller
    /// judges liveness against its own window).
    ///
    /// # Errors
    /// [`Error::Database`].
    /// Removes the rows of nodes gone at `now` (silent for longer than [`NODE_GONE_AFTER`]);
    /// answers how many.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn nodes_forget_gone(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        let before = DbNow::new(bound(now)).plus(-dur_us(NODE_GONE_AFTER));
        let n: usize = with_tx!(self, |conn| {
            diesel::delete(nodes::table.filter(nodes::heartbeat_at.lt(before)))
                .execute(conn)
                .await
        })?;
        Ok(u64::try_from(n).unwrap_or(u64::MAX))
    }

    pub(crate) async fn nodes_list(&self) -> Result<Vec<NodeInfo>> {
        let rows: Vec<NodeRow> = with_conn!(self, |conn| {
            nodes::table
                .select((
                    nodes::node,
                    nodes::queues,
                    nodes::kinds,
                    nodes::started_at,
                    nodes::heartbeat_at,
                ))
                .order(nodes::node.asc())
                .load(conn)
                .await?
        });
        Ok(rows.into_iter().map(NodeRow::into_info).collect())
    }

    /// Due jobs waiting (pending or retrying) for at least `after` that no node with a
    /// heartbeat within `live` can run, grouped by queue and kind (at most 1,000 groups,
    /// longest-waiting first). Also forgets nodes silent for a day.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a zero `live` window; [`Error::Database`].
    pub(crate) async fn unserved_jobs(
        &self,
        after: Duration,
        live: Duration,
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<Unserved>> {
        if live.is_zero() {
            return Err(Error::invalid(
                "live",
                "a zero window counts no node as alive; expected a duration of a few heartbeats"
                    .to_string(),
            ));
        }
        let now = DbNow::new(bound(now));
        let due_by = now.plus(-dur_us(after));
        let live_since = now.plus(-dur_us(live));
        let forget_before = now.plus(-dur_us(FORGET_AFTER));
        let waiting = [JobState::Pending.as_str(), JobState::Retrying.as_str()];
        let (groups, alive): (Vec<WaitingGroup>, Vec<NodeRow>) = with_conn!(self, |conn| {
            let groups = jobs::table
                .filter(jobs::state.eq_any(waiting))
                .filter(jobs::run_at.le(due_by))
                .group_by((jobs::queue, jobs::kind))
                .select((jobs::queue, jobs::kind, count_star(), min(jobs::run_at)))
                .order(min(jobs::run_at).asc())
                .limit(MAX_GROUPS)
                .load(conn)
                .await?;
            let alive = nodes::table
                .filter(nodes::heartbeat_at.gt(live_since))
                .select((
                    nodes::node,
                    nodes::queues,
                    nodes::kinds,
                    nodes::started_at,
                    nodes::heartbeat_at,
                ))
                .load(conn)
                .await?;
            (groups, alive)
        });
        let _: usize = with_tx!(self, |conn| {
            diesel::delete(nodes::table.filter(nodes::heartbeat_at.lt(forget_before)))
                .execute(conn)
                .await
        })?;
        let alive: Vec<NodeInfo> = alive.into_iter().map(NodeRow::into_info).collect();
        let mut out = Vec::new();
        for (queue, kind, n, oldest) in groups {
            let serving: Vec<&NodeInfo> =
                alive.iter().filter(|a| a.queues.contains(&queue)).collect();
            let reason = if serving.is_empty() {
                UnservedReason::NoNodeServesQueue
            } else if serving.iter().any(|a| a.kinds.contains(&kind)) {
                continue;
            } else {
                UnservedReason::NoNodeHasKind
            };
            out.push(Unserved {
                queue,
                kind,
                jobs: u64::try_from(n).unwrap_or(0),
                oldest_due: from_us(oldest.unwrap_or(0)),
                reason,
            });
        }
        Ok(out)
    }
}

/// Names as a JSON array, sorted and without repeats (so equal sets store equal text).
fn json_names(names: &[String]) -> String {
    let set: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut v: Vec<&str> = set.into_iter().collect();
    v.sort_unstable();
    serde_json::Value::from(v).to_string()
}
