//! Writes by actors and operators that hold no lease, written once for every backend with
//! diesel's query builder: the sweeper's reclaim, the archiver's archive and prune, operator
//! cancel and manual retry. Each is guarded by the row's `version` (or locked with `SKIP
//! LOCKED`), so it never overwrites a change it did not see. A body here is type-checked
//! once per backend through `with_write!` / `with_tx!` (`driver.rs`), so it can only use
//! portable SQL and the expressions of `expr.rs`.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use serde_json::Value;

use super::columns::bound;
use super::driver::{with_tx, with_write};
use super::expr::{
    DbNow, JsonAppend, ReleaseHold, RetakeHold, SkipLocked, RETRYABLE_BY_HAND, RUNNING, TERMINAL,
};
use super::ledger::LedgerRow;
use super::mutation::{on, Mutation};
use super::rows::{
    dur_us, from_us, ArchiveSequenceKey, ArchiveStartBy, JobsSequenceKey, JobsStartBy,
};
use super::schema::{
    jobvisor_claims as ledger_rows, jobvisor_effects as effects, jobvisor_job_deps as deps,
    jobvisor_jobs as jobs, jobvisor_jobs_archive as archive, jobvisor_jobs_last as last,
};
use super::timeout::Op;
use super::wakes::{announce_cancel, announce_done, announce_due};
use super::{
    ArchiveParams, CancelOutcome, CancelParams, Guarded, PruneParams, ReclaimParams, ReclaimReason,
    Reclaimed, RetryParams, Store,
};
use crate::claim::ClaimOutcome;
use crate::error::{Error, Result, StoreError};
use crate::job::{Job, JobFailure, JobId, JobState, UniqueScope};
use crate::lease::ClaimId;

/// The terminal states' stored names.
const TERMINAL_NAMES: [&str; 3] = [
    JobState::Succeeded.as_str(),
    JobState::Dead.as_str(),
    JobState::Cancelled.as_str(),
];

/// Times a version-guarded write is retried after losing a race before giving up.
const RACE_TRIES: usize = 5;

impl Store {
    /// Moves terminal jobs finished more than `older_than` ago to the archive (dead ones only
    /// once they finished more than `dead_older_than` ago as well; a job holding its key for
    /// a period only once the period has ended), at most `limit` of them, insert and delete
    /// in one transaction. Returns how many moved.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_archive(&self, p: ArchiveParams) -> Result<u64> {
        if p.limit == 0 {
            return Ok(0);
        }
        let now = DbNow::new(bound(p.now));
        let cutoff = now.plus(-dur_us(p.older_than));
        let dead_cutoff = now.plus(-dur_us(p.dead_older_than));
        let limit = i64::from(p.limit);
        let moved: Vec<i64> = with_tx!(self, |conn| {
            let ids: Vec<i64> = SkipLocked(
                jobs::table
                    .select(jobs::id)
                    .filter(TERMINAL)
                    .filter(jobs::finished_at.lt(cutoff.nullable()))
                    .filter(
                        jobs::state
                            .ne(JobState::Dead.as_str())
                            .or(jobs::finished_at.lt(dead_cutoff.nullable())),
                    )
                    // A job holding its key for a period stays until the period ends.
                    .filter(
                        jobs::unique_until
                            .is_null()
                            .or(jobs::unique_until.le(now.nullable())),
                    )
                    .order(jobs::finished_at.asc())
                    .limit(limit),
            )
            .load(conn)
            .await?;
            // A parent stays while any child of it has not ended.
            let blocked: Vec<i64> = if ids.is_empty() {
                Vec::new()
            } else {
                deps::table
                    .inner_join(jobs::table.on(jobs::id.eq(deps::child_id)))
                    .filter(deps::parent_id.eq_any(&ids))
                    .filter(jobs::state.ne_all(TERMINAL_NAMES))
                    .select(deps::parent_id)
                    .load(conn)
                    .await?
            };
            let ids: Vec<i64> = ids.into_iter().filter(|i| !blocked.contains(i)).collect();
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // A success a finalize ended has its claim on its job row only (`last_*`): it
            // joins the ledger as its job leaves the live table (`store::ledger`).
            {
                use diesel::dsl::{exists, not};
                use diesel::sql_types::{BigInt, Nullable, Text};
                let recorded = ledger_rows::table
                    .filter(ledger_rows::job_id.eq(last::id))
                    .filter(ledger_rows::claim_id.nullable().eq(last::last_claim));
                diesel::insert_into(ledger_rows::table)
                    .values(
                        last::table
                            .filter(last::id.eq_any(&ids))
                            .filter(last::state.eq(JobState::Succeeded.as_str()))
                            .filter(last::last_claim.is_not_null())
                            .filter(last::last_node.is_not_null())
                            .filter(last::last_claimed_at.is_not_null())
                            .filter(last::finished_at.is_not_null())
                            .filter(not(exists(recorded)))
                            .select((
                                last::id,
                                last::last_claim.assume_not_null(),
                                last::attempts,
                                last::last_node.assume_not_null(),
                                last::last_claimed_at.assume_not_null(),
                                last::started_at,
                                last::finished_at.assume_not_null(),
                                ClaimOutcome::Succeeded.as_str().into_sql::<Text>(),
                                None::<String>.into_sql::<Nullable<Text>>(),
                                None::<i64>.into_sql::<Nullable<BigInt>>(),
                            )),
                    )
                    .into_columns((
                        ledger_rows::job_id,
                        ledger_rows::claim_id,
                        ledger_rows::attempt,
                        ledger_rows::node,
                        ledger_rows::claimed_at,
                        ledger_rows::started_at,
                        ledger_rows::ended_at,
                        ledger_rows::outcome,
                        ledger_rows::code,
                        ledger_rows::fence_margin_ms,
                    ))
                    .execute(conn)
                    .await?;
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
                                jobs::started_at,
                                jobs::refunds,
                                jobs::partition_key,
                                jobs::unique_until,
                                jobs::unique_scope,
                                jobs::progress,
                            ),
                            (JobsStartBy, JobsSequenceKey),
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
                        archive::started_at,
                        archive::refunds,
                        archive::partition_key,
                        archive::unique_until,
                        archive::unique_scope,
                        archive::progress,
                    ),
                    (ArchiveStartBy, ArchiveSequenceKey),
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
            Ok::<_, diesel::result::Error>(ids)
        })?;
        if !moved.is_empty() {
            // After the commit, in a statement of its own: a sequence's row is locked before
            // its tail's job row by an enqueue, so deleting it under the archived rows' locks
            // could deadlock with one. A crash in between leaves a row whose tail is
            // archived, which an enqueue reads as an empty sequence.
            self.sequence_prune(&moved).await?;
        }
        Ok(moved.len() as u64)
    }

    /// Returns the space of rows that were archived (and of the row versions each transition
    /// left behind) to the live table, so it stays near its empty size however many jobs
    /// pass through. PostgreSQL: `VACUUM (SKIP_LOCKED)` on the live table — skipped if
    /// another node is vacuuming it, a warning (not an error) if this role does not own it.
    /// MySQL (InnoDB purges by itself) and SQLite (freed pages are reused) need nothing.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_vacuum_live(&self) -> Result<()> {
        self.inner.driver.vacuum_live().await
    }

    /// Deletes archived jobs archived more than `older_than` ago, at most `limit`, with their
    /// effect records (`jobvisor_effects`) and execution ledger (`jobvisor_claims`), in one
    /// transaction. Returns how many jobs.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_prune_archive(&self, p: PruneParams) -> Result<u64> {
        if p.limit == 0 {
            return Ok(0);
        }
        let cutoff = DbNow::new(bound(p.now)).plus(-dur_us(p.older_than));
        let limit = i64::from(p.limit);
        // The jobs' effect records go with them, in the same transaction.
        let n: usize = with_tx!(self, |conn| {
            let ids: Vec<i64> = archive::table
                .select(archive::id)
                .filter(archive::archived_at.lt(cutoff))
                .order(archive::archived_at.asc())
                .limit(limit)
                .load(conn)
                .await?;
            if ids.is_empty() {
                Ok(0)
            } else {
                diesel::delete(effects::table.filter(effects::job_id.eq_any(&ids)))
                    .execute(conn)
                    .await?;
                diesel::delete(ledger_rows::table.filter(ledger_rows::job_id.eq_any(&ids)))
                    .execute(conn)
                    .await?;
                // Dependency rows go with their child; a parent's with it once pruned.
                diesel::delete(
                    deps::table
                        .filter(deps::child_id.eq_any(&ids).or(deps::parent_id.eq_any(&ids))),
                )
                .execute(conn)
                .await?;
                diesel::delete(archive::table.filter(archive::id.eq_any(&ids)))
                    .execute(conn)
                    .await
            }
        })?;
        Ok(n as u64)
    }

    /// Cancels a job: pending or retrying → `cancelled` at once; running → a cancel request
    /// its holder acts on (it stops the handler and finalizes `cancelled`); already finished
    /// → unchanged.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown id; [`Error::Database`].
    pub(crate) async fn job_cancel(&self, p: CancelParams) -> Result<CancelOutcome> {
        Ok(self.job_cancel_settling(p).await?.0)
    }

    /// [`job_cancel`](Self::job_cancel), also answering the queues of the waiting children
    /// its settle released (one entry per child), for the caller to wake its fetchers of.
    ///
    /// # Errors
    /// As [`job_cancel`](Self::job_cancel).
    pub(crate) async fn job_cancel_settling(
        &self,
        p: CancelParams,
    ) -> Result<(CancelOutcome, Vec<String>)> {
        // With no version expected, no job can have moved on from it.
        Ok(self
            .job_cancel_guarded(p, None)
            .await?
            .unwrap_or_else(|job| (CancelOutcome::AlreadyFinished(job), Vec::new())))
    }

    /// [`job_cancel_settling`](Self::job_cancel_settling), only while the job is at version
    /// `expected` (`None`: at any version): a job that changed since answers `Err(job)` as it
    /// is now, and nothing is written. The version guards the write itself, so a change
    /// between the read and the write is caught too (the write applies to no row, the job is
    /// read again and found moved on).
    ///
    /// # Errors
    /// As [`job_cancel`](Self::job_cancel).
    pub(crate) async fn job_cancel_guarded(
        &self,
        p: CancelParams,
        expected: Option<i64>,
    ) -> Result<std::result::Result<(CancelOutcome, Vec<String>), Job>> {
        let now = DbNow::new(bound(p.now));
        let expected = expected.filter(|_| !on(Mutation::CancelVersion));
        for _ in 0..RACE_TRIES {
            let Some(job) = self.job_get(p.id).await? else {
                return Err(Error::NotFound { id: p.id });
            };
            if expected.is_some_and(|v| v != job.version) {
                return Ok(Err(job));
            }
            if job.archived_at.is_some() || job.state.is_terminal() {
                return Ok(Ok((CancelOutcome::AlreadyFinished(job), Vec::new())));
            }
            let id = p.id.0;
            let version = job.version;
            let n: usize = if job.state == JobState::Running {
                // Announced with the request, so the holder signals its handler at once.
                with_tx!(self, |conn| {
                    let n = diesel::update(
                        jobs::table
                            .filter(jobs::id.eq(id))
                            .filter(jobs::version.eq(version))
                            .filter(jobs::cancel_requested_at.is_null()),
                    )
                    // `updated_at` is left as the claim wrote it: the claim's instant, which
                    // the execution ledger records when the claim ends (`store::ledger`).
                    .set(jobs::cancel_requested_at.eq(now.nullable()))
                    .execute(conn)
                    .await?;
                    if n == 1 {
                        announce_cancel(conn, id).await?;
                    }
                    Ok::<usize, diesel::result::Error>(n)
                })?
            } else {
                with_write!(self, |conn| {
                    let n = diesel::update(
                        jobs::table
                            .filter(jobs::id.eq(id))
                            .filter(jobs::version.eq(version)),
                    )
                    .set((
                        jobs::state.eq(JobState::Cancelled.as_str()),
                        jobs::finished_at.eq(now.nullable()),
                        jobs::updated_at.eq(now),
                        jobs::version.eq(jobs::version + 1),
                        jobs::unique_hold.eq(ReleaseHold(true)),
                    ))
                    .execute(conn)
                    .await?;
                    if n == 1 {
                        // To whoever waits on it, after the update (`store::waits`); no
                        // statement where waits poll.
                        announce_done(conn, &[id]).await?;
                    }
                    n
                })
            };
            if job.state == JobState::Running && job.cancel_requested_at.is_some() {
                return Ok(Ok((CancelOutcome::Requested(job), Vec::new())));
            }
            if n == 1 {
                let job = self
                    .job_get(p.id)
                    .await?
                    .ok_or(Error::NotFound { id: p.id })?;
                if job.state == JobState::Running {
                    return Ok(Ok((CancelOutcome::Requested(job), Vec::new())));
                }
                // Its own parents no longer count for it; its children follow their policy.
                with_write!(self, |conn| diesel::update(
                    deps::table.filter(deps::child_id.eq(id))
                )
                .set(deps::done.eq(true))
                .execute(conn)
                .await?);
                let settled = self.job_settle_children(&[id], p.now).await?;
                return Ok(Ok((CancelOutcome::Cancelled(job), settled.released)));
            }
            // Lost a race (claimed, finalized or reclaimed meanwhile): look again.
        }
        Err(Error::Database(StoreError::Transient(format!(
            "job {} kept changing while being cancelled; try again",
            p.id
        ))))
    }

    /// Deletes a finished job (succeeded, dead or cancelled) from the live table, with its
    /// effect records and execution ledger, in one transaction — guarded by `expected_version`: a job that changed
    /// since the operator looked (retried, say) is not deleted ([`Guarded::Stale`]).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::InvalidTransition`]-like refusal as
    /// [`Error::InvalidInput`] for a job that has not finished or is archived;
    /// [`Error::Database`].
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) async fn job_delete_finished(
        &self,
        id: JobId,
        expected_version: i64,
    ) -> Result<Guarded<()>> {
        let Some(job) = self.job_get(id).await? else {
            return Err(Error::NotFound { id });
        };
        let expected_version = if on(Mutation::DeleteVersion) {
            job.version
        } else {
            expected_version
        };
        if job.archived_at.is_some() {
            return Err(Error::invalid(
                "id",
                format!("job {id} is archived; only live jobs can be deleted (prune the archive)"),
            ));
        }
        if !job.state.is_terminal() {
            return Err(Error::invalid(
                "id",
                format!(
                    "job {id} is {}; only a finished job (succeeded, dead, cancelled) can be deleted",
                    job.state
                ),
            ));
        }
        if job.version != expected_version {
            return Ok(Guarded::Stale);
        }
        let n: usize = with_tx!(self, |conn| {
            let n = diesel::delete(
                jobs::table
                    .filter(jobs::id.eq(id.0))
                    .filter(jobs::version.eq(expected_version))
                    .filter(TERMINAL),
            )
            .execute(conn)
            .await?;
            if n == 1 {
                diesel::delete(effects::table.filter(effects::job_id.eq(id.0)))
                    .execute(conn)
                    .await?;
                diesel::delete(ledger_rows::table.filter(ledger_rows::job_id.eq(id.0)))
                    .execute(conn)
                    .await?;
            }
            Ok::<usize, diesel::result::Error>(n)
        })?;
        Ok(if n == 1 {
            Guarded::Applied(())
        } else {
            Guarded::Stale
        })
    }

    /// Manually retries a dead or cancelled job: back to `pending`, due now, with one more
    /// attempt allowed if its attempts were used up. A job whose key was held `while_active`
    /// (and so released when it ended) takes it again if no other job holds it; otherwise it
    /// is retried without holding it, and the key stays with the job that holds it. Guarded
    /// by `version`: if the job changed since it was read (or since `expected_version`), the
    /// answer is [`Guarded::Stale`].
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::InvalidTransition`] from any other state,
    /// [`Error::InvalidInput`] for an archived job; [`Error::Database`].
    pub(crate) async fn job_retry(&self, p: RetryParams) -> Result<Guarded<Job>> {
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
        let expected = p.expected_version.filter(|_| !on(Mutation::RetryVersion));
        if expected.is_some_and(|v| v != job.version) {
            return Ok(Guarded::Stale);
        }
        let id = p.id.0;
        let version = job.version;
        let max_attempts =
            i32::try_from(job.max_attempts.max(job.attempts + 1)).unwrap_or(i32::MAX);
        // A `while_active` job takes its key again if no other job holds it; if one does, the
        // unique index refuses, and the job is retried without the key (never taken from the
        // job holding it).
        macro_rules! retry_set {
            ($hold:expr) => {
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
                    jobs::unique_hold.eq($hold),
                ))
            };
        }
        // Due now without a new id: announced in the retry's own transaction, so the nodes
        // of other processes learn it at commit (`store::wakes`).
        let due = [job.queue.clone()];
        macro_rules! retry_tx {
            ($hold:expr) => {
                with_tx!(self, |conn| {
                    let n = retry_set!($hold).execute(conn).await?;
                    if n == 1 {
                        announce_due(conn, &due).await?;
                    }
                    Ok::<usize, diesel::result::Error>(n)
                })
            };
        }
        let retake = job.unique_scope == Some(UniqueScope::WhileActive) && !job.unique_held;
        let mut applied = None;
        if retake {
            let res: diesel::QueryResult<usize> = retry_tx!(RetakeHold);
            match res {
                Ok(n) => applied = Some(n),
                Err(diesel::result::Error::DatabaseError(
                    diesel::result::DatabaseErrorKind::UniqueViolation,
                    _,
                )) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let n: usize = match applied {
            Some(n) => n,
            None => retry_tx!(jobs::unique_hold)?,
        };
        if n == 0 {
            return Ok(Guarded::Stale);
        }
        let job = self
            .job_get(p.id)
            .await?
            .ok_or(Error::NotFound { id: p.id })?;
        Ok(Guarded::Applied(job))
    }

    /// "Run now": a pending job scheduled for later, or a retrying job waiting for its next
    /// attempt, becomes due now (its `run_at` set to now; nothing else changes but
    /// `updated_at` and `version`), announced in the same transaction so every node learns
    /// it at commit. Guarded by `version` as [`job_retry`](Store::job_retry).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::InvalidTransition`] from any other state (to `pending`),
    /// [`Error::InvalidInput`] for an archived job; [`Error::Database`].
    #[cfg(any(feature = "web", feature = "test-util"))]
    pub(crate) async fn job_run_now(&self, p: RetryParams) -> Result<Guarded<Job>> {
        let now = DbNow::new(bound(p.now));
        let Some(job) = self.job_get(p.id).await? else {
            return Err(Error::NotFound { id: p.id });
        };
        if job.archived_at.is_some() {
            return Err(Error::invalid(
                "id",
                format!("job {} is archived; only live jobs can run", p.id),
            ));
        }
        if !matches!(job.state, JobState::Pending | JobState::Retrying) {
            return Err(Error::InvalidTransition {
                id: p.id,
                from: job.state,
                to: JobState::Pending,
            });
        }
        if p.expected_version.is_some_and(|v| v != job.version) {
            return Ok(Guarded::Stale);
        }
        let (id, version) = (p.id.0, job.version);
        let due = [job.queue.clone()];
        let n: usize = with_tx!(self, |conn| {
            let n = diesel::update(
                jobs::table
                    .filter(jobs::id.eq(id))
                    .filter(jobs::version.eq(version))
                    .filter(super::expr::DUE_LATER),
            )
            .set((
                jobs::run_at.eq(now),
                jobs::updated_at.eq(now),
                jobs::version.eq(jobs::version + 1),
            ))
            .execute(conn)
            .await?;
            if n == 1 {
                announce_due(conn, &due).await?;
            }
            Ok::<usize, diesel::result::Error>(n)
        })?;
        if n == 0 {
            return Ok(Guarded::Stale);
        }
        let job = self
            .job_get(p.id)
            .await?
            .ok_or(Error::NotFound { id: p.id })?;
        Ok(Guarded::Applied(job))
    }

    /// Reclaims, in one bounded batch, running jobs whose lease expired or whose timeout
    /// passed; their lease is cleared, version + 1, and the reason recorded in `last_error`
    /// and `errors` with `detail: {"owner": <the node that held it>}`:
    /// * **timeout** (`timeout_at` passed — set only once a renewal recorded the handler's
    ///   start): `retrying` after `backoff(attempts)`, or `dead` with its attempts used up;
    /// * **lease expired** with a recorded start: the same, code `lease_expired`;
    /// * **lease expired before any start was recorded** (the node died or was cut off with
    ///   the job in its prefetch, or within a heartbeat of starting it): the attempt is given
    ///   back — `pending` at once, `attempts` − 1, `refunds` + 1, code `not_started` — while
    ///   `refunds < max_attempts`; past that bound it counts like `lease_expired`, so a job
    ///   that kills its node at start still ends `dead` after at most 2 × `max_attempts`
    ///   claims.
    ///
    /// The former holder's writes are refused from then on.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_reclaim_expired(&self, p: ReclaimParams) -> Result<Vec<Reclaimed>> {
        self.bounded_owned(Op::Reclaim, p, |s, p| async move {
            s.reclaim_unbounded(p).await
        })
        .await
    }

    async fn reclaim_unbounded(&self, p: ReclaimParams) -> Result<Vec<Reclaimed>> {
        if p.limit == 0 {
            return Ok(Vec::new());
        }
        let now = DbNow::new(bound(p.now));
        let limit = i64::from(p.limit);
        let backoff = p.backoff.clone();
        type Cand = (
            (i64, i64, i32, i32, String, String),
            (
                Option<i64>,
                Option<i64>,
                i32,
                Option<String>,
                i64,
                Option<String>,
                i64,
            ),
        );
        let done: Vec<Reclaimed> = with_tx!(self, |conn| {
            // The queues of the jobs given back due now (a refunded attempt): announced at
            // the end, as the transaction's last write (`store::wakes`).
            let mut due: Vec<String> = Vec::new();
            let cands: Vec<Cand> = SkipLocked(
                jobs::table
                    .select((
                        (
                            jobs::id,
                            jobs::version,
                            jobs::attempts,
                            jobs::max_attempts,
                            jobs::kind,
                            jobs::queue,
                        ),
                        (
                            jobs::timeout_at,
                            jobs::started_at,
                            jobs::refunds,
                            jobs::lease_owner,
                            now,
                            jobs::lease_token,
                            // The claim's instant, for the execution ledger.
                            jobs::updated_at,
                        ),
                    ))
                    .filter(RUNNING)
                    // Running jobs are exactly those with a lease: this reads the sweep index.
                    .filter(jobs::lease_expires_at.is_not_null())
                    .filter(
                        jobs::lease_expires_at
                            .lt(now.nullable())
                            .or(jobs::timeout_at.lt(now.nullable())),
                    )
                    // In the sweep index's order, not the primary key's: ordered by id,
                    // MySQL walks the primary key hoping to fill the limit early and, when
                    // nothing has expired (the usual case), reads the whole table (1.1 s a
                    // pass at a million rows instead of one index range).
                    .order((jobs::lease_expires_at.asc(), jobs::id.asc()))
                    .limit(limit),
            )
            .load(conn)
            .await?;
            let mut done = Vec::with_capacity(cands.len());
            for (
                (id, version, attempts, max_attempts, kind, queue),
                (timeout_at, started_at, refunds, owner, db_now, token, claimed_at),
            ) in cands
            {
                let reason = if timeout_at.is_some_and(|t| t < db_now) {
                    ReclaimReason::Timeout
                } else if started_at.is_none() && refunds < max_attempts {
                    ReclaimReason::NotStarted
                } else {
                    ReclaimReason::LeaseExpired
                };
                let attempt = u32::try_from(attempts).unwrap_or(0);
                let refund = reason == ReclaimReason::NotStarted;
                let dead = !refund && attempts >= max_attempts;
                let new_state = if refund {
                    JobState::Pending
                } else if dead {
                    JobState::Dead
                } else {
                    JobState::Retrying
                };
                let message = match reason {
                    ReclaimReason::Timeout => "the attempt ran past its timeout".to_string(),
                    ReclaimReason::LeaseExpired => {
                        "the lease expired: its node stopped renewing (crashed, paused or cut off)"
                            .to_string()
                    }
                    ReclaimReason::NotStarted => format!(
                        "the lease expired before the handler's start was recorded (its node \
                         crashed, paused or was cut off); the attempt is not counted \
                         (refund {} of at most {max_attempts})",
                        refunds + 1
                    ),
                };
                let claim = token.as_deref().and_then(ClaimId::of_token);
                // The lost claim's row in the execution ledger (none for a claim of an older
                // build's token, which has no claim id).
                let ledger = claim.zip(owner.clone()).map(|(c, node)| LedgerRow {
                    job_id: id,
                    claim_id: c.to_string(),
                    attempt: attempts,
                    node,
                    claimed_at,
                    started_at,
                    ended_at: db_now,
                    outcome: if reason == ReclaimReason::Timeout {
                        ClaimOutcome::TimedOut.as_str()
                    } else {
                        ClaimOutcome::Lost.as_str()
                    },
                    code: Some(reason.code().to_string()),
                    fence_margin_ms: None,
                });
                let mut failure = JobFailure::new(reason.code(), message, attempt)
                    .with_detail(serde_json::json!({ "owner": owner }))
                    .at(from_us(db_now));
                // The claim that lost its lease (its id is the token's public part).
                failure.claim = claim;
                let err = serde_json::to_value(failure).unwrap_or(Value::Null);
                let run_at_us = if dead || refund {
                    db_now
                } else {
                    db_now.saturating_add(dur_us(backoff(attempt)))
                };
                let n = diesel::update(
                    jobs::table
                        .filter(jobs::id.eq(id))
                        .filter(jobs::version.eq(version)),
                )
                .set((
                    (
                        jobs::state.eq(new_state.as_str()),
                        jobs::last_error.eq(Some(err.clone())),
                        jobs::errors.eq(JsonAppend { value: err }),
                        jobs::run_at.eq(run_at_us),
                        jobs::finished_at.eq(dead.then_some(db_now)),
                        jobs::updated_at.eq(db_now),
                        jobs::version.eq(jobs::version + 1),
                        jobs::attempts.eq(attempts - i32::from(refund)),
                        jobs::refunds.eq(refunds + i32::from(refund)),
                    ),
                    (
                        jobs::lease_owner.eq(None::<String>),
                        jobs::lease_token.eq(None::<String>),
                        jobs::lease_expires_at.eq(None::<i64>),
                        jobs::heartbeat_at.eq(None::<i64>),
                        jobs::timeout_at.eq(None::<i64>),
                        jobs::unique_hold.eq(ReleaseHold(dead)),
                    ),
                ))
                .execute(conn)
                .await?;
                if n == 1 {
                    if let Some(row) = &ledger {
                        diesel::insert_into(ledger_rows::table)
                            .values(row)
                            .execute(conn)
                            .await?;
                    }
                    if !dead && run_at_us <= db_now {
                        due.push(queue.clone());
                    }
                    done.push(Reclaimed {
                        id: JobId(id),
                        kind,
                        queue,
                        reason,
                        new_state,
                        attempts: attempt - u32::from(refund),
                    });
                }
            }
            announce_due(conn, &due).await?;
            // The jobs it ended (dead), to whoever waits on them (`store::waits`).
            let dead: Vec<i64> = done
                .iter()
                .filter(|r| r.new_state == JobState::Dead)
                .map(|r| r.id.0)
                .collect();
            announce_done(conn, &dead).await?;
            Ok::<_, diesel::result::Error>(done)
        })?;
        Ok(done)
    }
}
