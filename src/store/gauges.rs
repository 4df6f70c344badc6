//! The database-wide gauges (`jobvisor_gauges`): live jobs by queue and state, due jobs by
//! queue and priority with the oldest one's due time, the nodes' last heartbeats, and the
//! jobs that ended in the last [`ENDED_WINDOW`] by queue, kind and final state (from the
//! live table and the archive: throughput and failures for whoever sees only the database,
//! such as a standalone exporter).
//!
//! The counts read the whole jobs table, so they are computed **once per database per
//! interval**, not once per node or per scrape: a node takes the turn with one guarded
//! `UPDATE` (it succeeds only when the last turn is at least an interval old, so of the
//! nodes that try in the same instant exactly one wins), runs the grouped reads, and stores
//! the result in the row as JSON (a turn comes no sooner than 50 times the last counts'
//! duration, so however large the table, counting takes at most 2 % of the time). Every
//! node reads that one row and exports it, so any node
//! can be scraped and a scrape costs the database nothing. A node that wins a turn and dies
//! before storing leaves the previous snapshot in place; the next interval's turn goes to
//! whoever asks first.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::dsl::{count_star, exists, min};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use serde::{Deserialize, Serialize};

use super::columns::bound;
use super::driver::{with_conn, with_write};
use super::expr::DbNow;
use super::expr::TERMINAL;
use super::leader_fence;
use super::mutation::{on, Mutation};
use super::params::GaugeTurnParams;
use super::rows::dur_us;
use super::schema::{
    jobvisor_gauges as gauges, jobvisor_jobs as jobs, jobvisor_jobs_archive as archive,
};
use super::timeout::Op;
use super::Store;
use crate::error::{Error, Result, StoreError};
use crate::job::JobState;

/// The counts may take at most 1/50 (2 %) of the time: a turn is taken no sooner than 50
/// times the last counts' duration after the last one. The interval holds while counting is
/// quick (a million live jobs: about a quarter of a second on PostgreSQL, well under the
/// default 15 s / 50) and stretches on a table so large that counting it every interval would
/// be a load of its own: the gauges' age (`jobvisor_gauges_age_seconds`) says so.
pub(crate) const COST_SHARE_INVERSE: i64 = 50;

/// How far back the ended-jobs counts look: **5 minutes**. The reads are bounded by it: on
/// the live table, the terminal jobs' index by `finished_at`; on the archive, its index by
/// `archived_at` (a job is archived after it finished, so one that ended in the window was
/// archived in it too).
pub(crate) const ENDED_WINDOW: Duration = Duration::from_secs(300);

/// What one turn computed. Times are epoch microseconds (UTC) on the database's clock (or the
/// test clock given to the turn).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GaugeSnapshot {
    /// When the turn was taken: "now" for the lag and heartbeat ages below.
    pub(crate) at: i64,
    /// `(queue, state, live jobs)`, states with no jobs absent.
    pub(crate) jobs: Vec<(String, String, u64)>,
    /// `(queue, priority, due jobs, oldest due time)` of the waiting (pending or retrying)
    /// jobs whose `run_at` has passed.
    pub(crate) due: Vec<(String, i32, u64, i64)>,
    /// `(node, last heartbeat)` of every registered node.
    pub(crate) nodes: Vec<(String, i64)>,
    /// `(queue, kind, final state, jobs)` of the jobs that reached `succeeded`, `dead` or
    /// `cancelled` in the last [`ENDED_WINDOW`], live or archived (absent from snapshots
    /// stored by older versions: empty).
    #[serde(default)]
    pub(crate) ended: Vec<(String, String, String, u64)>,
}

/// The stored row: the snapshot, who computed it and how long the reads took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredGauges {
    /// When the last turn was taken (0: never).
    pub(crate) computed_at: i64,
    /// The node that took it.
    pub(crate) computed_by: Option<String>,
    /// How long its reads took.
    pub(crate) took: Duration,
    /// What it computed (`None` while the first turn is being computed).
    pub(crate) snapshot: Option<GaugeSnapshot>,
}

impl Store {
    /// Takes the gauges' turn for `node` if the last one is at least `every` old, and at
    /// least [`COST_SHARE_INVERSE`] times as old as its counts took — with `leader_term`,
    /// only while `node` leads the database under that term. `true`: this caller
    /// computes the snapshot now (then [`Store::gauges_compute`] and [`Store::gauges_save`]).
    /// `now`: a test clock, or `None` for the database's.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn gauges_take_turn(
        &self,
        node: &str,
        every: Duration,
        leader_term: Option<i64>,
        now: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let p = GaugeTurnParams {
            node: node.to_string(),
            every,
            leader_term,
            now,
        };
        self.faulted_owned(Op::Gauges, p, |s, p| async move {
            s.take_turn_unbounded(p).await
        })
        .await
    }

    async fn take_turn_unbounded(&self, p: GaugeTurnParams) -> Result<bool> {
        let GaugeTurnParams {
            node,
            every,
            leader_term,
            now,
        } = p;
        let leader_term = leader_term.filter(|_| !on(Mutation::GaugeTerm));
        let now = DbNow::new(bound(now));
        let before = now.plus(-dur_us(every));
        let due = gauges::table
            .filter(gauges::id.eq(1))
            .filter(gauges::computed_at.le(before))
            .filter((gauges::computed_at + gauges::took_us * COST_SHARE_INVERSE).le(now));
        let set = (gauges::computed_at.eq(now), gauges::computed_by.eq(&node));
        let n: usize = match leader_term {
            // Leader-only: refused once the term is over (see `store::leader`).
            Some(term) => with_write!(self, |conn| {
                diesel::update(due.filter(exists(leader_fence!(&node, term, now))))
                    .set(set)
                    .execute(conn)
                    .await?
            }),
            None => with_write!(self, |conn| {
                diesel::update(due).set(set).execute(conn).await?
            }),
        };
        Ok(n == 1)
    }

    /// Runs the grouped reads of a turn taken by `node` (see the module docs).
    ///
    /// # Errors
    /// [`Error::Database`]; [`Error::Database`] if the row is gone.
    pub(crate) async fn gauges_compute(&self, now: Option<DateTime<Utc>>) -> Result<GaugeSnapshot> {
        let at: i64 = with_conn!(self, |conn| {
            gauges::table
                .filter(gauges::id.eq(1))
                .select(gauges::computed_at)
                .first(conn)
                .await?
        });
        let counts = self.job_counts().await?;
        let due_at = DbNow::new(bound(now));
        let waiting = [JobState::Pending.as_str(), JobState::Retrying.as_str()];
        let due: Vec<(String, i32, i64, Option<i64>)> = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::state.eq_any(waiting))
                .filter(jobs::run_at.le(due_at))
                .group_by((jobs::queue, jobs::priority))
                .select((jobs::queue, jobs::priority, count_star(), min(jobs::run_at)))
                .order((jobs::queue.asc(), jobs::priority.asc()))
                .load(conn)
                .await?
        });
        let nodes = self.nodes_list().await?;
        let ended = self.ended_recently(now).await?;
        Ok(GaugeSnapshot {
            at,
            jobs: counts
                .into_iter()
                .map(|c| (c.queue, c.state.as_str().to_string(), c.count))
                .collect(),
            due: due
                .into_iter()
                .map(|(q, p, n, oldest)| {
                    (q, p, u64::try_from(n).unwrap_or(0), oldest.unwrap_or(at))
                })
                .collect(),
            nodes: nodes
                .into_iter()
                .map(|n| (n.node, super::rows::to_us(n.heartbeat_at)))
                .collect(),
            ended,
        })
    }

    /// Jobs that ended in the last [`ENDED_WINDOW`] by queue, kind and final state, live and
    /// archived; two grouped reads, each bounded by the window through an index.
    async fn ended_recently(
        &self,
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<(String, String, String, u64)>> {
        let since = DbNow::new(bound(now)).plus(-dur_us(ENDED_WINDOW));
        // `TERMINAL` is the partial index's own predicate (PostgreSQL, SQLite) and the
        // leading column of MySQL's (state, finished_at) index.
        let live: Vec<(String, String, String, i64)> = with_conn!(self, |conn| {
            jobs::table
                .filter(TERMINAL)
                .filter(jobs::finished_at.ge(since.nullable()))
                .group_by((jobs::queue, jobs::kind, jobs::state))
                .select((jobs::queue, jobs::kind, jobs::state, count_star()))
                .load(conn)
                .await?
        });
        let archived: Vec<(String, String, String, i64)> = with_conn!(self, |conn| {
            archive::table
                .filter(archive::archived_at.ge(since))
                .filter(archive::finished_at.ge(since.nullable()))
                .group_by((archive::queue, archive::kind, archive::state))
                .select((archive::queue, archive::kind, archive::state, count_star()))
                .load(conn)
                .await?
        });
        let mut all: std::collections::BTreeMap<(String, String, String), u64> =
            std::collections::BTreeMap::new();
        for (queue, kind, state, n) in live.into_iter().chain(archived) {
            *all.entry((queue, kind, state)).or_default() += u64::try_from(n).unwrap_or(0);
        }
        Ok(all
            .into_iter()
            .map(|((queue, kind, state), n)| (queue, kind, state, n))
            .collect())
    }

    /// Stores a turn's snapshot, unless a later turn was taken meanwhile (by a node that
    /// found this one's turn an interval old: its snapshot is the newer one).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn gauges_save(&self, snapshot: &GaugeSnapshot, took: Duration) -> Result<()> {
        let json = serde_json::to_string(snapshot).map_err(|e| {
            Error::Database(StoreError::Other(format!(
                "gauge snapshot not encoded: {e}"
            )))
        })?;
        let took = dur_us(took);
        let at = snapshot.at;
        let _: usize = with_write!(self, |conn| {
            diesel::update(
                gauges::table
                    .filter(gauges::id.eq(1))
                    .filter(gauges::computed_at.eq(at)),
            )
            .set((gauges::snapshot.eq(&json), gauges::took_us.eq(took)))
            .execute(conn)
            .await?
        });
        Ok(())
    }

    /// The stored gauges.
    ///
    /// # Errors
    /// [`Error::Database`], also for a row that is missing or unreadable.
    pub(crate) async fn gauges_read(&self) -> Result<StoredGauges> {
        let row: Option<(i64, Option<String>, i64, String)> = with_conn!(self, |conn| {
            gauges::table
                .filter(gauges::id.eq(1))
                .select((
                    gauges::computed_at,
                    gauges::computed_by,
                    gauges::took_us,
                    gauges::snapshot,
                ))
                .first(conn)
                .await
                .optional()?
        });
        let (computed_at, computed_by, took_us, json) = row.ok_or_else(|| {
            Error::Database(StoreError::Other(
                "jobvisor_gauges has no row 1; expected the one its migration inserts".to_string(),
            ))
        })?;
        let snapshot = if json.as_str() == "{}" {
            None
        } else {
            Some(serde_json::from_str(&json).map_err(|e| {
                Error::Database(StoreError::Other(format!(
                    "jobvisor_gauges snapshot is unreadable: {e}"
                )))
            })?)
        };
        Ok(StoredGauges {
            computed_at,
            computed_by,
            took: Duration::from_micros(u64::try_from(took_us).unwrap_or(0)),
            snapshot,
        })
    }
}
