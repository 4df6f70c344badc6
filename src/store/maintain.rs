//! Writes by actors and operators that hold no lease: archive, prune, cancel and manual
//! retry. Each is guarded by the row's `version` (or locked with `SKIP LOCKED`), so it never
//! overwrites a change it did not see.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::connect::{with_conn, with_tx};
use super::rows::dur_us;
use super::schema::{jobvisor_jobs as jobs, jobvisor_jobs_archive as archive};
use super::sql::{DbNow, SkipLocked, RETRYABLE_BY_HAND, TERMINAL};
use super::write::bound;
use super::{ArchiveParams, CancelOutcome, CancelParams, Guarded, PruneParams, RetryParams, Store};
use crate::error::{Error, Result, StoreError};
use crate::job::{Job, JobState};

/// Times a version-guarded write is retried after losing a race before giving up.
const RACE_TRIES: usize = 5;

impl Store {
    /// Moves terminal jobs finished more than `older_than` ago to the archive, at most
    /// `limit` of them, insert and delete in one transaction. Returns how many moved.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn job_archive(&self, p: ArchiveParams) -> Result<u64> {
        if p.limit == 0 {
            return Ok(0);
        }
        let now = DbNow::new(bound(p.now));
        let cutoff = now.plus(-dur_us(p.older_than));
        let limit = i64::from(p.limit);
        let moved: usize = with_tx!(self, |conn| {
            let ids: Vec<i64> = SkipLocked(
                jobs::table
                    .select(jobs::id)
                    .filter(TERMINAL)
                    .filter(jobs::finished_at.lt(cutoff.nullable()))
                    .order(jobs::finished_at.asc())
                    .limit(limit),
            )
            .load(conn)
            .await?;
            if ids.is_empty() {
                return Ok(0);
            }
            let copied = diesel::insert_into(archive::table)
                .values(
                    jobs::table
                        .filter(jobs::id.eq_any(&ids))
                        .filter(TERMINAL)
                        .select((
                            (
                                jobs::id,
                                jobs::queue,
                                jobs::kind,
                                jobs::unique_key,
                                jobs::state,
                                jobs::priority,
                                jobs::payload,
                                jobs::result,
                                jobs::last_error,
                                jobs::errors,
                                jobs::attempts,
                                jobs::max_attempts,
                                jobs::run_at,
                            ),
                            (
                                jobs::timeout_ms,
                                jobs::timeout_at,
                                jobs::lease_owner,
                                jobs::lease_token,
                                jobs::lease_expires_at,
                                jobs::heartbeat_at,
                                jobs::version,
                                jobs::cancel_requested_at,
                                jobs::created_at,
                                jobs::updated_at,
                                jobs::first_started_at,
                                jobs::finished_at,
                                now,
                            ),
                        )),
                )
                .into_columns((
                    (
                        archive::id,
                        archive::queue,
                        archive::kind,
                        archive::unique_key,
                        archive::state,
                        archive::priority,
                        archive::payload,
                        archive::result,
                        archive::last_error,
                        archive::errors,
                        archive::attempts,
                        archive::max_attempts,
                        archive::run_at,
                    ),
                    (
                        archive::timeout_ms,
                        archive::timeout_at,
                        archive::lease_owner,
                        archive::lease_token,
                        archive::lease_expires_at,
                        archive::heartbeat_at,
                        archive::version,
                        archive::cancel_requested_at,
                        archive::created_at,
                        archive::updated_at,
                        archive::first_started_at,
                        archive::finished_at,
                        archive::archived_at,
                    ),
                ))
                .execute(conn)
                .await?;
            let deleted =
                diesel::delete(jobs::table.filter(jobs::id.eq_any(&ids)).filter(TERMINAL))
                    .execute(conn)
                    .await?;
            if copied != deleted {
                // Both statements see the same locked rows; a mismatch means something is
                // badly wrong, and rolling back keeps every job in exactly one table.
                return Err(diesel::result::Error::RollbackTransaction);
            }
            Ok::<_, diesel::result::Error>(deleted)
        })?;
        Ok(moved as u64)
    }

    /// Returns the space of rows that were archived (and of the row versions each transition
    /// left behind) to the live table, so it stays near its empty size however many jobs
    /// pass through. PostgreSQL: `VACUUM (SKIP_LOCKED)` on the live table — skipped if
    /// another node is vacuuming it, a warning (not an error) if this role does not own it.
    /// MySQL (InnoDB purges by itself) and SQLite (freed pages are reused) need nothing.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn job_vacuum_live(&self) -> Result<()> {
        if let super::connect::Pool::Pg(pool) = &self.inner.pool {
            use diesel_async::SimpleAsyncConnection;
            let mut c = pool.get().await.map_err(super::connect::pool_err)?;
            c.batch_execute("VACUUM (SKIP_LOCKED) jobvisor_jobs")
                .await?;
        }
        Ok(())
    }

    /// Deletes archived jobs archived more than `older_than` ago, at most `limit`. Returns
    /// how many.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn job_prune_archive(&self, p: PruneParams) -> Result<u64> {
        if p.limit == 0 {
            return Ok(0);
        }
        let cutoff = DbNow::new(bound(p.now)).plus(-dur_us(p.older_than));
        let limit = i64::from(p.limit);
        let n: usize = with_conn!(self, |conn| {
            let ids: Vec<i64> = archive::table
                .select(archive::id)
                .filter(archive::archived_at.lt(cutoff))
                .order(archive::archived_at.asc())
                .limit(limit)
                .load(conn)
                .await?;
            if ids.is_empty() {
                0
            } else {
                diesel::delete(archive::table.filter(archive::id.eq_any(&ids)))
                    .execute(conn)
                    .await?
            }
        });
        Ok(n as u64)
    }

    /// Cancels a job: pending or retrying → `cancelled` at once; running → a cancel request
    /// its holder acts on (it stops the handler and finalizes `cancelled`); already finished
    /// → unchanged.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown id; [`Error::Database`].
    pub async fn job_cancel(&self, p: CancelParams) -> Result<CancelOutcome> {
        let now = DbNow::new(bound(p.now));
        for _ in 0..RACE_TRIES {
            let Some(job) = self.job_get(p.id).await? else {
                return Err(Error::NotFound { id: p.id });
            };
            if job.archived_at.is_some() || job.state.is_terminal() {
                return Ok(CancelOutcome::AlreadyFinished(job));
            }
            let id = p.id.0;
            let version = job.version;
            let n: usize = if job.state == JobState::Running {
                with_conn!(self, |conn| {
                    diesel::update(
                        jobs::table
                            .filter(jobs::id.eq(id))
                            .filter(jobs::version.eq(version))
                            .filter(jobs::cancel_requested_at.is_null()),
                    )
                    .set((
                        jobs::cancel_requested_at.eq(now.nullable()),
                        jobs::updated_at.eq(now),
                    ))
                    .execute(conn)
                    .await?
                })
            } else {
                with_conn!(self, |conn| {
                    diesel::update(
                        jobs::table
                            .filter(jobs::id.eq(id))
                            .filter(jobs::version.eq(version)),
                    )
                    .set((
                        jobs::state.eq(JobState::Cancelled.as_str()),
                        jobs::finished_at.eq(now.nullable()),
                        jobs::updated_at.eq(now),
                        jobs::version.eq(jobs::version + 1),
                    ))
                    .execute(conn)
                    .await?
                })
            };
            if job.state == JobState::Running && job.cancel_requested_at.is_some() {
                return Ok(CancelOutcome::Requested(job));
            }
            if n == 1 {
                let job = self
                    .job_get(p.id)
                    .await?
                    .ok_or(Error::NotFound { id: p.id })?;
                return Ok(if job.state == JobState::Running {
                    CancelOutcome::Requested(job)
                } else {
                    CancelOutcome::Cancelled(job)
                });
            }
            // Lost a race (claimed, finalized or reclaimed meanwhile): look again.
        }
        Err(Error::Database(StoreError::Transient(format!(
            "job {} kept changing while being cancelled; try again",
            p.id
        ))))
    }

    /// Manually retries a dead or cancelled job: back to `pending`, due now, with one more
    /// attempt allowed if its attempts were used up. Guarded by `version`: if the job changed
    /// since it was read (or since `expected_version`), the answer is [`Guarded::Stale`].
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::InvalidTransition`] from any other state,
    /// [`Error::InvalidInput`] for an archived job; [`Error::Database`].
    pub async fn job_retry(&self, p: RetryParams) -> Result<Guarded<Job>> {
        let now = DbNow::new(bound(p.now));
        let Some(job) = self.job_get(p.id).await? else {
            return Err(Error::NotFound { id: p.id });
        };
        if job.archived_at.is_some() {
            return Err(Error::invalid(
                "id",
                format!("job {} is archived; only live jobs can be retried", p.id),
            ));
        }
        if !job.state.can_become(JobState::Pending) || job.state == JobState::Running {
            return Err(Error::InvalidTransition {
                id: p.id,
                from: job.state,
                to: JobState::Pending,
            });
        }
        if p.expected_version.is_some_and(|v| v != job.version) {
            return Ok(Guarded::Stale);
        }
        let id = p.id.0;
        let version = job.version;
        let max_attempts =
            i32::try_from(job.max_attempts.max(job.attempts + 1)).unwrap_or(i32::MAX);
        let n: usize = with_conn!(self, |conn| {
            diesel::update(
                jobs::table
                    .filter(jobs::id.eq(id))
                    .filter(jobs::version.eq(version))
                    .filter(RETRYABLE_BY_HAND),
            )
            .set((
                jobs::state.eq(JobState::Pending.as_str()),
                jobs::run_at.eq(now),
                jobs::max_attempts.eq(max_attempts),
                jobs::result.eq(None::<serde_json::Value>),
                jobs::finished_at.eq(None::<i64>),
                jobs::cancel_requested_at.eq(None::<i64>),
                jobs::updated_at.eq(now),
                jobs::version.eq(jobs::version + 1),
            ))
            .execute(conn)
            .await?
        });
        if n == 0 {
            return Ok(Guarded::Stale);
        }
        let job = self
            .job_get(p.id)
            .await?
            .ok_or(Error::NotFound { id: p.id })?;
        Ok(Guarded::Applied(job))
    }
}
