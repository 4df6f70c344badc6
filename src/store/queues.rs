//! Queue control (`jobvisor_queues`): pause, global concurrency, per-partition concurrency
//! and rate limits, shared by every node and enforced by the claim itself.
//!
//! The settings are read, and obeyed, by the claim: `store/claim/` (how a controlled claim
//! counts under the queue row's lock, the rate window of starts).

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::{with_conn, with_signal_conn, with_tx};
use super::expr::DbNow;
use super::rows::{dur_us, from_us};
use super::schema::{
    jobvisor_jobs as jobs, jobvisor_nodes as nodes, jobvisor_queue_claims as claims_log,
    jobvisor_queues as queues, jobvisor_wakes as wakes,
};
use super::Store;
use crate::error::Result;
use crate::job::MAX_QUEUE_LEN;
use crate::new_job::check_name;
use crate::queue::{QueueInfo, QueueLimits, RateLimit, MAX_PAUSED_BY_LEN};

/// A queue's settings row (`jobvisor_queues`), as the claim and the settings' operations
/// read it.
#[derive(Queryable, Selectable, Debug, Clone)]
#[diesel(table_name = queues)]
pub(crate) struct QueueRow {
    pub(crate) name: String,
    pub(crate) paused_at: Option<i64>,
    pub(crate) paused_by: Option<String>,
    pub(crate) concurrency_limit: Option<i32>,
    pub(crate) partition_limit: Option<i32>,
    pub(crate) rate_limit: Option<i32>,
    pub(crate) rate_period_us: Option<i64>,
    pub(crate) updated_at: i64,
}

fn to_u32(v: Option<i32>) -> Option<u32> {
    v.and_then(|n| u32::try_from(n).ok())
}

impl QueueRow {
    /// The rate limit, if the row has one.
    pub(crate) fn rate(&self) -> Option<RateLimit> {
        match (to_u32(self.rate_limit), self.rate_period_us) {
            (Some(jobs), Some(us)) => Some(RateLimit {
                jobs,
                per: Duration::from_micros(u64::try_from(us).unwrap_or(0)),
            }),
            _ => None,
        }
    }

    fn into_info(self) -> QueueInfo {
        let limits = QueueLimits {
            concurrency: to_u32(self.concurrency_limit),
            per_partition: to_u32(self.partition_limit),
            rate: self.rate(),
        };
        QueueInfo {
            paused_at: self.paused_at.map(from_us),
            paused_by: self.paused_by,
            limits,
            updated_at: from_us(self.updated_at),
            name: self.name,
        }
    }
}

/// What [`Store::change_signal`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChangeSignal {
    /// The newest job's id (0 with none).
    pub(crate) newest_job: i64,
    /// How many jobs have an id in `(floor, floor + GAP_SPAN]` for the `floor` asked: a job
    /// whose insert commits after a newer id was already read (two transactions, the lower
    /// id committing last) moves this count, not the newest id.
    pub(crate) above_floor: i64,
    /// The settings' row count and newest change time: any pause, resume or change of
    /// limits moves one of them.
    pub(crate) settings: (i64, i64),
    /// The wake counter (`store::wakes`): moved by each transition that makes a job due now
    /// without a new id (a child released, a retry by hand, a refunded reclaim).
    pub(crate) wakes: i64,
}

/// The widest range of ids above the floor [`Store::change_signal`] counts: **1,000** (one
/// short primary-key range scan). A reader whose newest id runs further ahead of its floor
/// is behind a busy queue, whose fetchers find work by themselves.
pub(crate) const GAP_SPAN: i64 = 1_000;

impl Store {
    /// Every queue with shared settings, by name.
    pub(crate) async fn queues_list(&self) -> Result<Vec<QueueInfo>> {
        let rows: Vec<QueueRow> = with_conn!(self, |c| {
            queues::table
                .select(QueueRow::as_select())
                .order(queues::name.asc())
                .load(c)
                .await?
        });
        Ok(rows.into_iter().map(QueueRow::into_info).collect())
    }

    /// One queue's settings; `None` if it has none.
    pub(crate) async fn queue_get(&self, name: &str) -> Result<Option<QueueInfo>> {
        check_name("queue", name, MAX_QUEUE_LEN)?;
        let q = name.to_string();
        let row: Option<QueueRow> = with_conn!(self, |c| {
            queues::table
                .filter(queues::name.eq(&q))
                .select(QueueRow::as_select())
                .first(c)
                .await
                .optional()?
        });
        Ok(row.map(QueueRow::into_info))
    }

    /// Pauses (`Some(by)`) or resumes (`None`) a queue; limits are kept.
    pub(crate) async fn queue_pause(
        &self,
        name: &str,
        by: Option<&str>,
        now: Option<DateTime<Utc>>,
    ) -> Result<Option<QueueInfo>> {
        if let Some(by) = by {
            check_name("paused_by", by, MAX_PAUSED_BY_LEN)?;
        }
        let by = by.map(str::to_string);
        self.queue_change(name, now, move |row, now| match &by {
            Some(who) => {
                if row.paused_at.is_none() {
                    row.paused_at = Some(now);
                }
                row.paused_by = Some(who.clone());
            }
            None => {
                row.paused_at = None;
                row.paused_by = None;
            }
        })
        .await
    }

    /// Replaces a queue's limits (every `None` lifts that limit); a pause is kept.
    pub(crate) async fn queue_set_limits(
        &self,
        name: &str,
        limits: QueueLimits,
        now: Option<DateTime<Utc>>,
    ) -> Result<Option<QueueInfo>> {
        limits.validate()?;
        self.queue_change(name, now, move |row, _| {
            let i = |n: Option<u32>| n.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
            row.concurrency_limit = i(limits.concurrency);
            row.partition_limit = i(limits.per_partition);
            row.rate_limit = i(limits.rate.map(|r| r.jobs));
            row.rate_period_us = limits.rate.map(|r| dur_us(r.per));
        })
        .await
    }

    /// Reads the queue's row (or a blank one), applies `change`, and writes it back — or
    /// deletes it when nothing is left to control — in one transaction. A queue nobody
    /// knows yet takes settings as well (the command line warns: `Client::known_queues`).
    async fn queue_change<F>(
        &self,
        name: &str,
        now: Option<DateTime<Utc>>,
        change: F,
    ) -> Result<Option<QueueInfo>>
    where
        F: Fn(&mut QueueRow, i64) + Send + Sync,
    {
        check_name("queue", name, MAX_QUEUE_LEN)?;
        let q = name.to_string();
        let bound = super::columns::bound(now);
        // A queue no node serves yet takes settings too: limits declared, or a pause set,
        // before its first node starts hold from that node's first claim.
        let change = &change;
        let row: Option<QueueRow> = with_tx!(self, |c| {
            let now: i64 = diesel::select(DbNow::new(bound)).get_result(c).await?;
            let current: Option<QueueRow> = queues::table
                .filter(queues::name.eq(&q))
                .select(QueueRow::as_select())
                .first(c)
                .await
                .optional()?;
            let existed = current.is_some();
            let mut row = current.unwrap_or(QueueRow {
                name: q.clone(),
                paused_at: None,
                paused_by: None,
                concurrency_limit: None,
                partition_limit: None,
                rate_limit: None,
                rate_period_us: None,
                updated_at: now,
            });
            change(&mut row, now);
            row.updated_at = now;
            let empty = row.paused_at.is_none()
                && row.concurrency_limit.is_none()
                && row.partition_limit.is_none()
                && row.rate_limit.is_none();
            if empty {
                if existed {
                    diesel::delete(queues::table.filter(queues::name.eq(&q)))
                        .execute(c)
                        .await?;
                    diesel::delete(claims_log::table.filter(claims_log::queue.eq(&q)))
                        .execute(c)
                        .await?;
                }
                return Ok(None);
            }
            let values = (
                queues::paused_at.eq(row.paused_at),
                queues::paused_by.eq(row.paused_by.clone()),
                queues::concurrency_limit.eq(row.concurrency_limit),
                queues::partition_limit.eq(row.partition_limit),
                queues::rate_limit.eq(row.rate_limit),
                queues::rate_period_us.eq(row.rate_period_us),
                queues::updated_at.eq(row.updated_at),
            );
            if existed {
                diesel::update(queues::table.filter(queues::name.eq(&q)))
                    .set(values)
                    .execute(c)
                    .await?;
            } else {
                diesel::insert_into(queues::table)
                    .values((queues::name.eq(&q), values))
                    .execute(c)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(Some(row))
        })?;
        self.settings_changed(name, row.is_some());
        Ok(row.map(QueueRow::into_info))
    }

    /// A cheap signal of change for the backends without notifications, read every few
    /// tens of milliseconds by each node's queue watch: the newest job's id (a new job from
    /// any process moves it), how many jobs have an id in `(floor, floor + GAP_SPAN]` (an
    /// insert that commits after a newer id was read moves it: the reader keeps `floor`
    /// below such gaps), a digest of the queue settings (rows and newest change) and the wake
    /// counter (a job made due without a new id moves it), in one statement that reads two
    /// index ends, a short primary-key range, the small settings table and the one-row
    /// counter.
    pub(crate) async fn change_signal(&self, floor: i64) -> Result<ChangeSignal> {
        use diesel::dsl::max;
        let upto = floor.saturating_add(GAP_SPAN);
        let read = async {
            with_signal_conn!(self, |c| {
                diesel::select((
                    jobs::table.select(max(jobs::id)).single_value(),
                    jobs::table
                        .filter(jobs::id.gt(floor))
                        .filter(jobs::id.le(upto))
                        .count()
                        .single_value()
                        .assume_not_null(),
                    queues::table.count().single_value().assume_not_null(),
                    queues::table.select(max(queues::updated_at)).single_value(),
                    wakes::table.select(max(wakes::n)).single_value(),
                ))
                .get_result::<(Option<i64>, i64, i64, Option<i64>, Option<i64>)>(c)
                .await
            })
        };
        // Bounded like a hot-path statement: an abandoned read closes its connection.
        let bound = self.inner.statement_bound();
        let (newest_job, above_floor, settings, changed, wakes) =
            tokio::time::timeout(bound, read).await.map_err(|_| {
                crate::Error::Database(crate::error::StoreError::Transient(format!(
                    "the change signal was not read within {bound:?} \
                     (StoreOptions::statement_timeout)"
                )))
            })??;
        Ok(ChangeSignal {
            newest_job: newest_job.unwrap_or(0),
            above_floor,
            settings: (settings, changed.unwrap_or(0)),
            wakes: wakes.unwrap_or(0),
        })
    }

    /// Whether the queue has settings, a node serves it or a live job is in it.
    pub(crate) async fn queue_is_known(&self, q: &str) -> Result<bool> {
        if self.queue_get(q).await?.is_some() {
            return Ok(true);
        }
        if self.queues_served().await?.contains(q) {
            return Ok(true);
        }
        let q = q.to_string();
        let found: Option<i64> = with_conn!(self, |c| {
            jobs::table
                .filter(jobs::queue.eq(&q))
                .select(jobs::id)
                .first(c)
                .await
                .optional()?
        });
        Ok(found.is_some())
    }

    /// The queues registered nodes serve.
    async fn queues_served(&self) -> Result<HashSet<String>> {
        let lists: Vec<String> = with_conn!(self, |c| {
            nodes::table.select(nodes::queues).load(c).await?
        });
        Ok(lists
            .iter()
            .flat_map(|s| serde_json::from_str::<Vec<String>>(s).unwrap_or_default())
            .collect())
    }

    /// Queues with settings or served by a node.
    pub(crate) async fn queues_known(&self) -> Result<HashSet<String>> {
        let mut known = self.queues_served().await?;
        known.extend(self.queues_list().await?.into_iter().map(|q| q.name));
        Ok(known)
    }

    /// Whether the queue has a control row now (read by a node whose fast claim came back
    /// empty).
    pub(crate) async fn queue_has_row(&self, queue: &str) -> Result<bool> {
        let q = queue.to_string();
        let n: i64 = with_conn!(self, |c| {
            queues::table
                .filter(queues::name.eq(&q))
                .count()
                .get_result(c)
                .await?
        });
        Ok(n > 0)
    }
}
