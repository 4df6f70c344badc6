//! Throughput history (`jobvisor_throughput`): per queue and 5-minute bucket, the jobs that
//! succeeded and those that ended dead, so the dashboard shows a day of history without
//! reading the jobs on a page view.
//!
//! Written by the node that takes the database gauges' turn (every `gauges_every`, 15 s,
//! once per database): [`Store::throughput_roll`] recounts the bucket "now" falls in — and,
//! in the first minute of a bucket, the previous one, so a bucket's last seconds and late
//! commits are counted too — from the finish-time indexes of the live table (terminal jobs
//! by `finished_at`) and of the archive (`archived_at`: a job archived after it ended), and
//! replaces those buckets' rows in one transaction; rows older than [`KEPT`] go with it.
//! Cost: two or four reads bounded by one bucket's finished jobs per turn, none per view.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::{with_conn, with_tx};
use super::expr::TERMINAL;
use super::rows::dur_us;
use super::schema::{
    jobvisor_jobs as jobs, jobvisor_jobs_archive as archive, jobvisor_throughput as tp,
};
use super::Store;
use crate::error::Result;
use crate::job::JobState;

/// One bucket: **5 minutes**.
pub(crate) const BUCKET: Duration = Duration::from_secs(300);
/// How long rows are kept: **48 hours**.
pub(crate) const KEPT: Duration = Duration::from_secs(48 * 3600);
/// Into a bucket by less than this, the previous one is recounted too: **1 minute**.
const RECOUNT: Duration = Duration::from_secs(60);

/// One row: `(queue, bucket start in epoch µs, succeeded, failed)`.
pub(crate) type ThroughputRow = (String, i64, u64, u64);

impl Store {
    /// Recounts the current bucket at `at` (epoch µs, the gauges' turn time), and the
    /// previous one within its first minute, replacing their rows; deletes rows past
    /// [`KEPT`]. Returns the rows written.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn throughput_roll(&self, at: i64) -> Result<usize> {
        let b = dur_us(BUCKET);
        let current = at - at.rem_euclid(b);
        let mut buckets = vec![current];
        if at - current < dur_us(RECOUNT) {
            buckets.push(current - b);
        }
        let mut rows: Vec<ThroughputRow> = Vec::new();
        for &start in &buckets {
            rows.extend(self.throughput_count(start, start + b).await?);
        }
        let insert: Vec<_> = rows
            .iter()
            .map(|(q, bucket, ok, failed)| {
                (
                    tp::queue.eq(q.clone()),
                    tp::bucket.eq(*bucket),
                    tp::succeeded.eq(i64::try_from(*ok).unwrap_or(i64::MAX)),
                    tp::failed.eq(i64::try_from(*failed).unwrap_or(i64::MAX)),
                )
            })
            .collect();
        let old = at - dur_us(KEPT);
        with_tx!(self, |c| {
            diesel::delete(tp::table.filter(tp::bucket.eq_any(&buckets).or(tp::bucket.lt(old))))
                .execute(c)
                .await?;
            for row in &insert {
                diesel::insert_into(tp::table)
                    .values(row.clone())
                    .execute(c)
                    .await?;
            }
            Ok::<_, diesel::result::Error>(())
        })?;
        Ok(insert.len())
    }

    /// Jobs that succeeded or ended dead in `[from, to)`, per queue, live and archived.
    async fn throughput_count(&self, from: i64, to: i64) -> Result<Vec<ThroughputRow>> {
        // `TERMINAL` is the finish-time index's own predicate (as in `gauges.rs`).
        let live: Vec<(String, String, i64)> = with_conn!(self, |c| {
            jobs::table
                .filter(TERMINAL)
                .filter(jobs::finished_at.ge(Some(from)))
                .filter(jobs::finished_at.lt(Some(to)))
                .group_by((jobs::queue, jobs::state))
                .select((jobs::queue, jobs::state, count_star()))
                .load(c)
                .await?
        });
        let archived: Vec<(String, String, i64)> = with_conn!(self, |c| {
            archive::table
                .filter(archive::archived_at.ge(from))
                .filter(archive::finished_at.ge(Some(from)))
                .filter(archive::finished_at.lt(Some(to)))
                .group_by((archive::queue, archive::state))
                .select((archive::queue, archive::state, count_star()))
                .load(c)
                .await?
        });
        let mut per: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (queue, state, n) in live.into_iter().chain(archived) {
            let n = u64::try_from(n).unwrap_or(0);
            let e = per.entry(queue).or_default();
            if state == JobState::Succeeded.as_str() {
                e.0 += n;
            } else if state == JobState::Dead.as_str() {
                e.1 += n;
            }
        }
        Ok(per
            .into_iter()
            .filter(|(_, (ok, failed))| ok + failed > 0)
            .map(|(q, (ok, failed))| (q, from, ok, failed))
            .collect())
    }

    /// The rows of buckets starting at or after `since` (epoch µs), oldest first: at most
    /// one per queue and 5 minutes, read by the bucket index.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    #[cfg(any(feature = "web", feature = "test-util"))]
    pub(crate) async fn throughput_since(&self, since: i64) -> Result<Vec<ThroughputRow>> {
        let rows: Vec<(String, i64, i64, i64)> = with_conn!(self, |c| {
            tp::table
                .filter(tp::bucket.ge(since))
                .select((tp::queue, tp::bucket, tp::succeeded, tp::failed))
                .order((tp::bucket.asc(), tp::queue.asc()))
                .load(c)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(|(q, b, ok, failed)| {
                (
                    q,
                    b,
                    u64::try_from(ok).unwrap_or(0),
                    u64::try_from(failed).unwrap_or(0),
                )
            })
            .collect())
    }
}
