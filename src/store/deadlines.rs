//! Start-by deadlines ([`NewJob::start_by`](crate::NewJob::start_by)), written once for every
//! backend with diesel's query builder: the deadline's write at enqueue (from
//! `dependencies.rs`'s enqueue, which every job with a deadline takes) with its refusal of a
//! deadline already past, and the sweeper's end of jobs not started by theirs. The claim
//! returns the time left (`start_by - updated_at`, `ClaimRow`), which the start gate checks
//! (`scheduler/attempt.rs`).
//!
//! A job past its deadline ends `cancelled` with the error code `expired`: it was not run
//! on purpose, as a cancel, and nothing failed (a dead job is a failure to look at).

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::driver::{with_conn, with_tx, with_write};
use super::expr::{DbNow, ReleaseHold, SkipLocked};
use super::schema::{
    jobvisor_job_deps as deps, jobvisor_jobs as jobs, jobvisor_jobs_deadlines as dl,
};
use super::wakes::announce_done;
use super::Store;
use crate::error::Result;
use crate::job::{JobFailure, JobState};

use crate::deadline::EXPIRED;

/// The states a job past its deadline is ended from: not running, not ended.
const UNSTARTED: [&str; 3] = [
    JobState::Pending.as_str(),
    JobState::Retrying.as_str(),
    JobState::Waiting.as_str(),
];

/// Writes job `$id`'s start-by deadline `$start_by` (µs) on `$conn` in its open transaction,
/// then refuses it — returning [`Error::InvalidInput`](crate::Error::InvalidInput) from the
/// enclosing function, which rolls the enqueue back — if it is not after the statement's
/// "now" (`$now`, `None`: the database's clock) and after the job's `run_at`.
macro_rules! deadline_write {
    ($conn:ident, $id:expr, $start_by:expr, $now:expr) => {{
        use $crate::store::expr::DbNow as DlNow;
        use $crate::store::schema::jobvisor_jobs_deadlines as dl_w;
        let (id, start_by): (i64, i64) = ($id, $start_by);
        diesel::update(dl_w::table.filter(dl_w::id.eq(id)))
            .set(dl_w::start_by.eq(Some(start_by)))
            .execute($conn)
            .await?;
        let (past, before_run): (bool, bool) = dl_w::table
            .filter(dl_w::id.eq(id))
            .select((DlNow::new($now).ge(start_by), dl_w::run_at.ge(start_by)))
            .first($conn)
            .await?;
        if past || before_run {
            return Err($crate::error::Error::invalid(
                "start_by",
                format!(
                    "{} is {}; expected a deadline after both the enqueue and the job's run_at \
                     (a job that could never start is refused, nothing is stored)",
                    $crate::store::rows::from_us(start_by).to_rfc3339(),
                    if past {
                        "already past at enqueue (the database's clock)"
                    } else {
                        "not after the job's run_at"
                    }
                ),
            ));
        }
    }};
}

pub(crate) use deadline_write;

impl Store {
    /// The sweeper's end of jobs past their deadline: up to `limit` pending, retrying or
    /// waiting jobs whose `start_by` is at or before `now` become `cancelled` with the error
    /// code [`EXPIRED`], their own parents no longer counted, their children settled by
    /// their policies. Returns the jobs ended and the queues of children released. With
    /// none past its deadline, one read.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn job_expire_due(
        &self,
        limit: u32,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(Vec<i64>, Vec<String>)> {
        let bound_now = bound(now);
        let now_e = DbNow::new(bound_now);
        let error = serde_json::to_value(JobFailure::new(
            EXPIRED,
            "not started by its start-by deadline",
            0,
        ))
        .unwrap_or(serde_json::Value::Null);
        // A plain read first: a sweep with nothing past a deadline (nearly every one) costs
        // one statement, no transaction and no write lock (SQLite's `BEGIN IMMEDIATE`).
        let any: Vec<i64> = with_conn!(self, |conn| dl::table
            .select(dl::id)
            .filter(dl::start_by.le(now_e.nullable()))
            .filter(dl::state.eq_any(UNSTARTED))
            .limit(1)
            .load(conn)
            .await?);
        if any.is_empty() {
            return Ok((any, Vec::new()));
        }
        let ids: Vec<i64> = with_tx!(self, |conn| {
            let ids: Vec<i64> = SkipLocked(
                dl::table
                    .select(dl::id)
                    .filter(dl::start_by.le(now_e.nullable()))
                    .filter(dl::state.eq_any(UNSTARTED))
                    .order(dl::start_by.asc())
                    .limit(i64::from(limit)),
            )
            .load(conn)
            .await?;
            if ids.is_empty() {
                return Ok(ids);
            }
            diesel::update(
                jobs::table
                    .filter(jobs::id.eq_any(&ids))
                    .filter(jobs::state.eq_any(UNSTARTED)),
            )
            .set((
                jobs::state.eq(JobState::Cancelled.as_str()),
                jobs::finished_at.eq(now_e.nullable()),
                jobs::updated_at.eq(now_e),
                jobs::version.eq(jobs::version + 1),
                jobs::last_error.eq(Some(&error)),
                jobs::unique_hold.eq(ReleaseHold(true)),
            ))
            .execute(conn)
            .await?;
            // Its own parents no longer count for it (a waiting member, a waiting child).
            diesel::update(deps::table.filter(deps::child_id.eq_any(&ids)))
                .set(deps::done.eq(true))
                .execute(conn)
                .await?;
            Ok::<_, diesel::result::Error>(ids)
        })?;
        if ids.is_empty() {
            return Ok((ids, Vec::new()));
        }
        with_write!(self, |conn| announce_done(conn, &ids).await?);
        let settled = self.job_settle_children(&ids, now).await?;
        Ok((ids, settled.released))
    }
}
