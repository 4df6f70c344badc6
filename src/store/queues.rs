//! Queue control (`jobvisor_queues`): pause, global concurrency, per-partition concurrency
//! and rate limits, shared by every node and enforced by the claim itself.
//!
//! # How a claim obeys them
//! A queue with no row is *uncontrolled*: its claims are the one-statement claims of each
//! backend, which also refuse any queue that has a row (`NOT EXISTS` in the statement), so a
//! setting committed anywhere stops uncontrolled claims of its queue at once — whatever a
//! node believes. A node remembers which queues have a row ([`QueueModes`]): one whose
//! uncontrolled claim came back empty looks, and one whose controlled claim found no row
//! goes back to the fast path.
//!
//! A *controlled* claim is one transaction: it locks the queue's row until commit and reads
//! its settings in one statement (`SELECT … FOR UPDATE`, a locking read of the latest
//! committed row; PostgreSQL's own claim takes the lock with an `UPDATE` of the `claims`
//! counter, see its `sql.rs`; on SQLite `BEGIN IMMEDIATE` already makes it the only
//! writer), then — in statements that start
//! after the lock was taken, so under READ COMMITTED they see every claim committed before —
//! counts what it must: the queue's `running` jobs, per partition those of the candidates'
//! partitions, and the jobs claimed inside the rate window. Claims are the only way a job
//! becomes `running`, and every controlled claim of the queue waits for the lock, so nothing
//! can add to those counts between the count and the commit: the claim takes at most what
//! is free, exactly. Finalizations running concurrently only lower the counts (a claim may
//! then take fewer than it could have; never more).
//!
//! Rate limit: a sliding window, of **starts**. Each controlled claim of a rate-limited
//! queue records `(queue, claimed_at, jobs)` in `jobvisor_queue_claims`; a claim at `now`
//! takes at most `rate_limit − Σ jobs claimed in (now − period − margin, now]`, with
//! `margin` = [`RATE_START_MARGIN`], so any `rate_limit + 1` claimed jobs span at least
//! `period + margin` of the database's clock. The node starts each of them before its
//! claim's send time plus the margin, or gives it back unstarted (`Claim::rated` tells it
//! to), and never before the claim (it has the answer only after): so any `rate_limit + 1`
//! starts span at least `period`, and no window of `period` holds more than `rate_limit`
//! handler starts (ARCHITECTURE.md §7.5). A claim that finds the window full reports when
//! its oldest entry leaves it, and the fetcher sleeps until then (no polling in between).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::{with_conn, with_signal_conn, with_tx, ClaimArgs, ControlledFast};
use super::expr::{in_list, ClaimableIn, DbClock, DbNow, ForUpdate};
use super::partitions::{
    self, Candidate, HeadJob, PartitionScan, Pick, Ranking, Rooms, ScanRow, Walk,
};
use super::rows::{dur_us, from_us, JobRow};
use super::schema::{
    jobvisor_jobs as jobs, jobvisor_nodes as nodes, jobvisor_queue_claims as claims_log,
    jobvisor_queues as queues,
};
use super::Store;
use crate::error::{Error, Result};
use crate::job::{check_name, JobState, MAX_QUEUE_LEN};

/// Longest rate window, **1 day**.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// Shortest rate window, **1 ms**.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// How long after its claim was sent a job of a rate-limited queue may still start:
/// **50 ms**. The claims of such a queue are spaced over the period plus this margin, so a
/// queue that always has due jobs starts `jobs` per `period + 50 ms`; a job whose claim was
/// answered later than this goes back unstarted, without using an attempt (it still counts
/// in the window, so the bound holds). See [`RateLimit`].
pub const RATE_START_MARGIN: Duration = Duration::from_millis(50);
/// Largest limit (concurrency, per partition, jobs per rate window): **1,000,000**.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest `paused_by` text, in characters: **255**.
pub const MAX_PAUSED_BY_LEN: usize = 255;

/// At most `jobs` handler starts across all nodes in any window of `per`.
///
/// Exact at the start, not only at the claim: a rate-limited queue is claimed without
/// prefetch, each claimed job starts within [`RATE_START_MARGIN`] of its claim or goes back
/// unstarted, and the claims are spaced over `per` plus that margin — so a saturated queue
/// starts `jobs` per `per + 50 ms`.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::RateLimit;
///
/// let r = RateLimit::new(100, Duration::from_secs(1)).unwrap(); // 100 jobs a second
/// assert_eq!(r.jobs(), 100);
/// assert!(RateLimit::new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RateLimit {
    jobs: u32,
    #[serde(rename = "per_ms", serialize_with = "ser_ms")]
    per: Duration,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl RateLimit {
    /// `jobs` claims (1 to [`MAX_LIMIT`]) in any window of `per` ([`MIN_RATE_PERIOD`] to
    /// [`MAX_RATE_PERIOD`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `rate` for a value out of range.
    pub fn new(jobs: u32, per: Duration) -> Result<Self> {
        check_limit("rate", jobs)?;
        if per < MIN_RATE_PERIOD || per > MAX_RATE_PERIOD {
            return Err(Error::invalid(
                "rate",
                format!("period is {per:?}; expected {MIN_RATE_PERIOD:?} to {MAX_RATE_PERIOD:?}"),
            ));
        }
        Ok(RateLimit { jobs, per })
    }

    /// Jobs per window.
    pub fn jobs(&self) -> u32 {
        self.jobs
    }

    /// The window.
    pub fn per(&self) -> Duration {
        self.per
    }
}

fn check_limit(field: &'static str, n: u32) -> Result<()> {
    if n == 0 || n > MAX_LIMIT {
        return Err(Error::invalid(
            field,
            format!("is {n}; expected 1 to {MAX_LIMIT} (clear the limit to lift it)"),
        ));
    }
    Ok(())
}

/// The limits of a queue, enforced across every node; `None` = no limit. All default to
/// `None` (unlimited).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::{QueueLimits, RateLimit};
///
/// // At most 20 running at once, 2 per tenant, 50 started per second.
/// let limits = QueueLimits::default()
///     .concurrency(20)
///     .per_partition(2)
///     .rate(RateLimit::new(50, Duration::from_secs(1)).unwrap());
/// assert_eq!(limits.concurrency, Some(20));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueLimits {
    /// Most jobs of the queue running at once, counting claimed jobs that wait in a node's
    /// prefetch (they hold leases).
    pub concurrency: Option<u32>,
    /// Most jobs running at once per partition key (see
    /// [`NewJob::partition`](crate::NewJob::partition)); jobs without one are not limited.
    pub per_partition: Option<u32>,
    /// Most jobs claimed in any window.
    pub rate: Option<RateLimit>,
}

impl QueueLimits {
    /// Sets the global concurrency limit.
    #[must_use]
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Sets the per-partition limit.
    #[must_use]
    pub fn per_partition(mut self, n: u32) -> Self {
        self.per_partition = Some(n);
        self
    }

    /// Sets the rate limit.
    #[must_use]
    pub fn rate(mut self, r: RateLimit) -> Self {
        self.rate = Some(r);
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(n) = self.concurrency {
            check_limit("concurrency", n)?;
        }
        if let Some(n) = self.per_partition {
            check_limit("per_partition", n)?;
        }
        if let Some(r) = self.rate {
            RateLimit::new(r.jobs, r.per)?;
        }
        Ok(())
    }
}

/// A queue's shared settings, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue.
    pub name: String,
    /// When it was paused, if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it (free text given to [`Client::pause_queue`](crate::Client::pause_queue)).
    pub paused_by: Option<String>,
    /// Its limits.
    pub limits: QueueLimits,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl QueueInfo {
    /// Whether claims of this queue are paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }
}

#[derive(Queryable, Selectable, Debug, Clone)]
#[diesel(table_name = queues)]
struct QueueRow {
    name: String,
    paused_at: Option<i64>,
    paused_by: Option<String>,
    concurrency_limit: Option<i32>,
    partition_limit: Option<i32>,
    rate_limit: Option<i32>,
    rate_period_us: Option<i64>,
    updated_at: i64,
}

fn to_u32(v: Option<i32>) -> Option<u32> {
    v.and_then(|n| u32::try_from(n).ok())
}

impl QueueRow {
    fn rate(&self) -> Option<RateLimit> {
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

/// Which queues this store has seen to have a control row (see the module doc), and which
/// of those a partition or rate limit sends to the portable controlled claim (so a backend's
/// shorter claim is not tried first each time). A stale answer costs at most one empty claim
/// or one rolled-back lock: each claim checks the row itself.
///
/// The third set holds the queues a node's queue watch last read without a row
/// ([`QueueModes::note_read`]): an empty fast claim of one of them needs no look-up of the
/// row, since the watch re-reads the settings after any change (the change signal, or a
/// notification and its 1 s re-read) and wakes the queue's fetcher when a row appears. An
/// idle node's poll so costs one claim, not a claim and a look-up.
#[derive(Debug, Default)]
pub(crate) struct QueueModes(
    Mutex<HashMap<String, bool>>,
    Mutex<HashSet<String>>,
    Mutex<HashSet<String>>,
);

impl QueueModes {
    pub(crate) fn is_portable(&self, queue: &str) -> bool {
        self.1.lock().map(|s| s.contains(queue)).unwrap_or(false)
    }

    pub(crate) fn set_portable(&self, queue: &str, portable: bool) {
        if let Ok(mut s) = self.1.lock() {
            if portable {
                s.insert(queue.to_string());
            } else {
                s.remove(queue);
            }
        }
    }

    pub(crate) fn is_controlled(&self, queue: &str) -> bool {
        self.0
            .lock()
            .map(|m| m.get(queue).copied().unwrap_or(false))
            .unwrap_or(false)
    }

    pub(crate) fn set(&self, queue: &str, controlled: bool) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(queue.to_string(), controlled);
        }
        if controlled {
            if let Ok(mut r) = self.2.lock() {
                r.remove(queue);
            }
        }
    }

    /// A read of every queue's settings showed `queue` with a row (`controlled`) or without.
    pub(crate) fn note_read(&self, queue: &str, controlled: bool) {
        self.set(queue, controlled);
        if let Ok(mut r) = self.2.lock() {
            if controlled {
                r.remove(queue);
            } else {
                r.insert(queue.to_string());
            }
        }
    }

    /// Whether the last read of the settings showed `queue` without a row (and no claim has
    /// found one since).
    pub(crate) fn read_uncontrolled(&self, queue: &str) -> bool {
        self.2.lock().map(|r| r.contains(queue)).unwrap_or(false)
    }

    /// Forgets what reads showed (the watch could not read: claims look the row up again).
    pub(crate) fn forget_reads(&self) {
        if let Ok(mut r) = self.2.lock() {
            r.clear();
        }
    }
}

/// What a controlled claim took, and when to try again if a limit held it back.
#[derive(Debug, Default)]
pub(crate) struct ControlledClaim {
    /// The queue has no row (any more): claim the fast way.
    pub(crate) uncontrolled: bool,
    pub(crate) rows: Vec<JobRow>,
    /// The rate window is full until this much later.
    pub(crate) wait: Option<Duration>,
    /// The rows were counted in the queue's rate window, at a time the database read
    /// after the claim had been running this long (so after the node sent it): each must
    /// start within [`RATE_START_MARGIN`] of that.
    pub(crate) rated: Option<Duration>,
}

/// What [`Store::change_signal`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChangeSignal {
    /// The newest job's id (0 with none).
    pub(crate) newest_job: i64,
    /// The settings' row count and newest change time: any pause, resume or change of
    /// limits moves one of them.
    pub(crate) settings: (i64, i64),
}

/// The `(partition, running)` pairs of a queue.
type PartitionCount = (Option<String>, i64);

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
        let bound = super::batch::bound(now);
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
        self.inner.queue_modes.set(name, row.is_some());
        Ok(row.map(QueueRow::into_info))
    }

    /// A cheap signal of change for the backends without notifications, read every few
    /// tens of milliseconds by each node's queue watch: the newest job's id (a new job from
    /// any process moves it) and a digest of the queue settings (rows and newest change),
    /// in one statement that reads two index ends and the small settings table.
    pub(crate) async fn change_signal(&self) -> Result<ChangeSignal> {
        use diesel::dsl::max;
        let read = async {
            with_signal_conn!(self, |c| {
                diesel::select((
                    jobs::table.select(max(jobs::id)).single_value(),
                    queues::table.count().single_value().assume_not_null(),
                    queues::table.select(max(queues::updated_at)).single_value(),
                ))
                .get_result::<(Option<i64>, i64, Option<i64>)>(c)
                .await
            })
        };
        // Bounded like a hot-path statement: an abandoned read closes its connection.
        let bound = self.inner.statement_bound();
        let (newest_job, settings, changed) =
            tokio::time::timeout(bound, read).await.map_err(|_| {
                crate::Error::Database(crate::error::StoreError::Transient(format!(
                    "the change signal was not read within {bound:?} \
                     (StoreOptions::statement_timeout)"
                )))
            })??;
        Ok(ChangeSignal {
            newest_job: newest_job.unwrap_or(0),
            settings: (settings, changed.unwrap_or(0)),
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

    /// What a node's queue watch read of every queue's settings (`list`), for the queues
    /// it serves: an empty fast claim of a queue listed without a row then skips the
    /// look-up of [`Store::queue_has_row`] (see [`QueueModes`]).
    pub(crate) fn note_settings<'a>(
        &self,
        served: impl Iterator<Item = &'a String>,
        list: &[QueueInfo],
    ) {
        for q in served {
            let controlled = list.iter().any(|i| &i.name == q);
            self.inner.queue_modes.note_read(q, controlled);
        }
    }

    /// The watch could not read the settings: claims look rows up again until it can.
    pub(crate) fn forget_settings(&self) {
        self.inner.queue_modes.forget_reads();
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

    /// The controlled claim (see the module doc).
    pub(crate) async fn claim_controlled(&self, a: &ClaimArgs) -> Result<ControlledClaim> {
        let modes = &self.inner.queue_modes;
        let fast = if modes.is_portable(&a.queue) {
            ControlledFast::Portable
        } else {
            self.inner.driver.claim_controlled(a).await?
        };
        match fast {
            ControlledFast::Uncontrolled => {
                return Ok(ControlledClaim {
                    uncontrolled: true,
                    ..ControlledClaim::default()
                })
            }
            ControlledFast::Claimed(rows) => {
                return Ok(ControlledClaim {
                    rows,
                    ..ControlledClaim::default()
                })
            }
            ControlledFast::Portable => {}
        }
        let any_kind = a.kinds.is_none();
        let kinds = a.kinds.clone().unwrap_or_default();
        let q = a.queue.clone();
        let began = std::time::Instant::now();
        let out: ControlledClaim = with_tx!(self, |c| {
            // The row's lock, its settings and the database's "now", in one statement.
            let found: Vec<(QueueRow, i64)> = ForUpdate(
                queues::table
                    .filter(queues::name.eq(&q))
                    .select((QueueRow::as_select(), DbNow::new(a.now))),
            )
            .load(c)
            .await?;
            let Some((row, mut now)) = found.into_iter().next() else {
                return Ok(ControlledClaim {
                    uncontrolled: true,
                    ..ControlledClaim::default()
                });
            };
            // PostgreSQL's own controlled claim takes every setting but a rate limit; the
            // other backends have none.
            let own = self.inner.driver.backend() == crate::Backend::Postgres;
            modes.set_portable(
                &q,
                row.rate_limit.is_some() || (!own && row.partition_limit.is_some()),
            );
            if row.paused_at.is_some() {
                return Ok(ControlledClaim::default());
            }
            let mut budget = a.limit;
            if let Some(limit) = row.concurrency_limit {
                let running: i64 = jobs::table
                    .filter(jobs::queue.eq(&q))
                    .filter(jobs::state.eq(JobState::Running.as_str()))
                    .filter(jobs::lease_expires_at.is_not_null())
                    .count()
                    .get_result(c)
                    .await?;
                budget = budget.min(i64::from(limit) - running);
            }
            let mut wait = None;
            let mut rated = None;
            let rate = row.rate();
            if let Some(r) = rate {
                let per = dur_us(r.per) + dur_us(RATE_START_MARGIN);
                // The window's records with the clock read now that the row is locked: the
                // time this claim records. The first statement's "now" may be much earlier —
                // PostgreSQL's is the transaction's start, MySQL's the statement's, before the
                // lock wait — and a claim recorded earlier than it commits would let the
                // claims just after a window's end crowd into it in real time. Sent now:
                // the time it reads is later than this instant, whatever the lock waited.
                rated = Some(began.elapsed());
                let found: Vec<(i64, Option<i64>, Option<i32>)> = queues::table
                    .filter(queues::name.eq(&q))
                    .left_join(claims_log::table.on(claims_log::queue.eq(queues::name)))
                    .select((
                        DbClock { bound: a.now },
                        claims_log::claimed_at.nullable(),
                        claims_log::jobs.nullable(),
                    ))
                    .load(c)
                    .await?;
                let window: Vec<(i64, i32)> = found
                    .iter()
                    .filter_map(|(_, t, n)| Some(((*t)?, (*n)?)))
                    .collect();
                // Claims of the queue are serialized by its row lock; their times must be
                // too, should the clock step back: never earlier than the latest recorded
                // claim.
                now = found
                    .iter()
                    .map(|(clock, _, _)| *clock)
                    .chain(window.iter().map(|(t, _)| *t))
                    .fold(now, i64::max);
                if window.iter().any(|(t, _)| *t <= now - per) {
                    diesel::delete(
                        claims_log::table
                            .filter(claims_log::queue.eq(&q))
                            .filter(claims_log::claimed_at.le(now - per)),
                    )
                    .execute(c)
                    .await?;
                }
                let since = now - per;
                let inside = window.iter().filter(|(t, _)| *t > since);
                let taken: i64 = inside.clone().map(|(_, n)| i64::from(*n)).sum();
                let oldest = inside.map(|(t, _)| *t).min();
                let left = i64::from(r.jobs) - taken;
                if left <= 0 {
                    if let Some(oldest) = oldest {
                        let us = (oldest + per - now).max(1);
                        wait = Some(Duration::from_micros(u64::try_from(us).unwrap_or(1)));
                    }
                }
                budget = budget.min(left);
            }
            if budget <= 0 {
                return Ok(ControlledClaim {
                    wait,
                    rated,
                    ..ControlledClaim::default()
                });
            }
            let kind_ok = any_kind
                .into_sql::<diesel::sql_types::Bool>()
                .or(in_list(jobs::kind, kinds.clone()));
            let ids: Vec<i64> = if let Some(per) = row.partition_limit {
                let per = i64::from(per);
                // The running jobs per partition (few: they hold leases), then a bounded head
                // of the queue ranked within its partitions, and past it, for a burst, a walk
                // of the partitions (see `partitions`): a backlog of full partitions never
                // hides the others' due jobs, and costs a claim one read of its first rows.
                let running: Vec<PartitionCount> = jobs::table
                    .filter(jobs::queue.eq(&q))
                    .filter(jobs::state.eq(JobState::Running.as_str()))
                    .filter(jobs::lease_expires_at.is_not_null())
                    .filter(jobs::partition_key.is_not_null())
                    .group_by(jobs::partition_key)
                    .select((jobs::partition_key, count_star()))
                    .load(c)
                    .await?;
                let rooms = Rooms::new(per, running.into_iter().filter_map(|(p, n)| Some((p?, n))));
                let head_len = partitions::head_len(budget);
                let head: Vec<HeadJob> = jobs::table
                    .filter(ClaimableIn(q.clone()))
                    .filter(kind_ok.clone())
                    .filter(jobs::run_at.le(now))
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(head_len)
                    .select((jobs::id, jobs::partition_key, jobs::priority, jobs::run_at))
                    .load::<(i64, Option<String>, i32, i64)>(c)
                    .await?
                    .into_iter()
                    .map(|(id, partition, priority, run_at)| HeadJob {
                        id,
                        partition,
                        priority,
                        run_at,
                    })
                    .collect();
                let ranking = Ranking::new(&head, head_len, &rooms);
                let mut candidates = ranking.picked.clone();
                if ranking.needs_walk(budget) && (any_kind || !kinds.is_empty()) {
                    let sql = partitions::scan_sql(self.inner.driver.backend());
                    let skip = if sql.skip_full {
                        rooms.full()
                    } else {
                        Vec::new()
                    };
                    for state in sql.states {
                        let mut walk = Walk::new(&rooms, budget);
                        while let Some((from, n)) = walk.read() {
                            let rows: Vec<ScanRow> = PartitionScan {
                                queue: &q,
                                sql,
                                state,
                                skip: &skip,
                                from,
                                now,
                                kinds: (!any_kind).then_some(kinds.as_slice()),
                                n,
                            }
                            .load(c)
                            .await?;
                            walk.take(rows);
                        }
                        candidates.extend(walk.found);
                    }
                    // Keyless jobs past the head: on MySQL the partition index holds them too
                    // (`partition_key IS NULL`, in claim order); elsewhere it does not, and
                    // they are looked for in the due jobs right after the head.
                    let keyless: Vec<(i64, i32, i64)> = if sql.keyless_indexed {
                        let mut found = Vec::new();
                        for st in [JobState::Pending, JobState::Retrying] {
                            found.extend(
                                jobs::table
                                    .filter(jobs::queue.eq(&q))
                                    .filter(jobs::state.eq(st.as_str()))
                                    .filter(jobs::partition_key.is_null())
                                    .filter(kind_ok.clone())
                                    .filter(jobs::run_at.le(now))
                                    .order((
                                        jobs::priority.asc(),
                                        jobs::run_at.asc(),
                                        jobs::id.asc(),
                                    ))
                                    .limit(budget)
                                    .select((jobs::id, jobs::priority, jobs::run_at))
                                    .load::<(i64, i32, i64)>(c)
                                    .await?,
                            );
                        }
                        found
                    } else if let Some(last) = head.last() {
                        let after_head: Vec<(i64, Option<String>, i32, i64)> = jobs::table
                            .filter(ClaimableIn(q.clone()))
                            .filter(kind_ok)
                            .filter(jobs::run_at.le(now))
                            .filter(
                                jobs::priority.gt(last.priority).or(jobs::priority
                                    .eq(last.priority)
                                    .and(jobs::run_at.gt(last.run_at).or(
                                        jobs::run_at.eq(last.run_at).and(jobs::id.gt(last.id)),
                                    ))),
                            )
                            .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                            .limit(partitions::KEYLESS_PAST_HEAD)
                            .select((jobs::id, jobs::partition_key, jobs::priority, jobs::run_at))
                            .load(c)
                            .await?;
                        after_head
                            .into_iter()
                            .filter(|j| j.1.is_none())
                            .map(|(id, _, priority, run_at)| (id, priority, run_at))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    candidates.extend(keyless.into_iter().map(|(id, priority, run_at)| Pick {
                        at: Candidate {
                            priority,
                            run_at,
                            id,
                        },
                        key: None,
                    }));
                }
                partitions::pick(candidates, budget, &rooms)
            } else {
                jobs::table
                    .filter(ClaimableIn(q.clone()))
                    .filter(kind_ok)
                    .filter(jobs::run_at.le(now))
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(budget)
                    .select(jobs::id)
                    .load(c)
                    .await?
            };
            if ids.is_empty() {
                return Ok(ControlledClaim {
                    rated,
                    ..ControlledClaim::default()
                });
            }
            // Diesel prepares an `UPDATE` anew each time whatever its list: `eq_any` as it is.
            diesel::update(
                jobs::table
                    .filter(jobs::id.eq_any(&ids))
                    .filter(ClaimableIn(q.clone())),
            )
            .set((
                jobs::state.eq(JobState::Running.as_str()),
                jobs::lease_owner.eq(Some(a.owner.clone())),
                jobs::lease_token.eq(Some(a.token.clone())),
                jobs::lease_expires_at.eq(Some(now + a.lease_us)),
                jobs::heartbeat_at.eq(Some(now)),
                jobs::attempts.eq(jobs::attempts + 1),
                jobs::version.eq(jobs::version + 1),
                jobs::updated_at.eq(now),
                jobs::started_at.eq(None::<i64>),
                jobs::timeout_at.eq(None::<i64>),
            ))
            .execute(c)
            .await?;
            let rows: Vec<JobRow> = jobs::table
                .filter(in_list(jobs::id, ids.clone()))
                .filter(jobs::lease_token.eq(&a.token))
                .select(JobRow::as_select())
                .load(c)
                .await?;
            if rate.is_some() && !rows.is_empty() {
                diesel::insert_into(claims_log::table)
                    .values((
                        claims_log::queue.eq(&q),
                        claims_log::claimed_at.eq(now),
                        claims_log::jobs.eq(i32::try_from(rows.len()).unwrap_or(i32::MAX)),
                    ))
                    .execute(c)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(ControlledClaim {
                rows,
                rated,
                ..ControlledClaim::default()
            })
        })?;
        Ok(out)
    }
}
