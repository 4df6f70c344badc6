//! The hot path as the engine sees it — enqueue, renew, finalize — written once for
//! every backend: validation, bounds, retries of transient failures, and matching each
//! backend's raw answer to the caller's items. The statements themselves are the driver's
//! (see `driver.rs` for each one's contract). The claim has its own home: `claim/`.
//!
//! Every write by a lease holder is guarded in SQL by `(id, lease_token)` and `state =
//! 'running'`; rows that do not match are reported [`Guarded::LeaseLost`].

use std::collections::{HashMap, HashSet};

use super::columns::bound;
use super::params::RenewArgs;
use super::retry::{pause_before_retry, retry_rolled_back, TRANSIENT_TRIES};
use super::rows::{dur_us, from_us};
use super::timeout::{enqueue_bound, Op};
use super::{EnqueueParams, Enqueued, FinalizeParams, Guarded, RenewParams, Renewed, Store};
use crate::error::{Error, Result, StoreError};
use crate::job::{JobId, JobState, NewJob};

/// Rounds of a batch whose duplicates' holders kept releasing their keys (see
/// `enqueue_valid`).
const DUPLICATE_ROUNDS: usize = 5;

impl Store {
    /// Enqueues one job.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field (nothing is written), or
    /// [`Error::Database`].
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))] // tests: crate::testing
    pub(crate) async fn job_enqueue(
        &self,
        job: NewJob,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Enqueued> {
        let mut v = self
            .job_enqueue_many(EnqueueParams {
                jobs: vec![job],
                now,
            })
            .await?;
        v.pop()
            .ok_or_else(|| Error::Database(StoreError::Other("enqueue returned no row".into())))
    }

    /// Enqueues many jobs, ids in input order (which is also their claim order
    /// among equals). PostgreSQL: one `INSERT … SELECT FROM unnest(…)`, or for 1,000 jobs or
    /// more without unique keys one `COPY` on the store's bulk connection; SQLite and MySQL:
    /// one transaction of multi-row inserts (MariaDB, SQLite) or one insert per job (MySQL),
    /// keyed jobs one by one. A job whose (kind, unique_key) another job holds (see
    /// [`UniqueScope`](crate::UniqueScope)) comes back with `duplicate: true` and the holder's
    /// id; so does a repeat of a key within the batch.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first bad job and field; nothing is written.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))] // tests: crate::testing
    pub(crate) async fn job_enqueue_many(&self, p: EnqueueParams) -> Result<Vec<Enqueued>> {
        self.enqueue_jobs(&p.jobs, p.now).await
    }

    /// [`Store::job_enqueue_many`] on borrowed jobs (the client keeps them for its wake-up).
    pub(crate) async fn enqueue_jobs(
        &self,
        jobs: &[NewJob],
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Vec<Enqueued>> {
        let bytes = self.validate_jobs(jobs)?;
        let limit = enqueue_bound(self.inner.statement_bound(), jobs.len(), bytes);
        if jobs.iter().any(NewJob::needs_links) {
            // Boxed, so that this path's larger future does not size every enqueue's.
            let enqueue = self.enqueue_dependent(jobs, now);
            return Ok(Box::pin(self.bounded_for(Op::Enqueue, limit, enqueue))
                .await?
                .0);
        }
        self.bounded_for(Op::Enqueue, limit, self.enqueue_valid(jobs, now))
            .await
    }

    async fn enqueue_valid(
        &self,
        jobs: &[NewJob],
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Vec<Enqueued>> {
        let now = bound(now);
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut result: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        // A duplicate whose holder released its key (finished, archived, taken over) between
        // the insert and the look-up is inserted again; this converges in one more round in
        // practice.
        for _ in 0..DUPLICATE_ROUNDS {
            let todo: Vec<usize> = (0..jobs.len()).filter(|i| result[*i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let batch: Vec<&NewJob> = todo.iter().map(|i| &jobs[*i]).collect();
            let got = self.enqueue_attempt(&batch, now).await?;
            for (i, e) in todo.into_iter().zip(got) {
                result[i] = e;
            }
        }
        result
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::Database(StoreError::Transient(
                    "a duplicate job kept disappearing while enqueueing; try again".into(),
                ))
            })
    }

    /// One try at the batch through the driver, again after a pause while it fails
    /// transiently (deadlock between concurrent enqueues, a connection lost; `retry.rs`).
    async fn enqueue_attempt(
        &self,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.inner.driver.enqueue(batch, now).await {
                Err(e) if e.is_transient() && tries < TRANSIENT_TRIES => {
                    pause_before_retry(tries).await;
                }
                res => return res,
            }
        }
    }

    /// Validates every job; returns their payloads' total size.
    pub(crate) fn validate_jobs(&self, batch: &[NewJob]) -> Result<usize> {
        let max = self.inner.opts.max_payload_bytes;
        let mut bytes = 0usize;
        for (i, j) in batch.iter().enumerate() {
            bytes += j.validate(max).map_err(|e| match e {
                Error::InvalidInput { field, reason } if batch.len() > 1 => Error::InvalidInput {
                    field,
                    reason: format!("{reason} (job #{i} of the batch, kind {:?})", j.kind),
                },
                other => other,
            })?;
        }
        Ok(bytes)
    }

    /// Renews many leases in one statement; each comes back applied (with its new expiry and
    /// whether a cancel was requested) or [`Guarded::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_renew_leases(
        &self,
        p: RenewParams,
    ) -> Result<Vec<(JobId, Guarded<Renewed>)>> {
        self.bounded_owned(Op::Renew, p, |s, p| async move {
            s.renew_unbounded(p, false).await
        })
        .await
    }

    /// [`job_renew_leases`](Self::job_renew_leases) as a hedge: the same statement, sent on
    /// a connection opened for it alone rather than one of the renewal lane's, for a
    /// renewal sent while an earlier one is overdue (its connection may hang in a silent
    /// network cut; the lane's others may have sat through the same cut). On SQLite, the
    /// lane's.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_renew_leases_hedged(
        &self,
        p: RenewParams,
    ) -> Result<Vec<(JobId, Guarded<Renewed>)>> {
        self.bounded_owned(Op::Renew, p, |s, p| async move {
            s.renew_unbounded(p, true).await
        })
        .await
    }

    async fn renew_unbounded(
        &self,
        p: RenewParams,
        fresh: bool,
    ) -> Result<Vec<(JobId, Guarded<Renewed>)>> {
        if p.leases.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "test-util")]
        let p = self.mutate_renew(p).await?;
        let args = RenewArgs {
            leases: &p.leases,
            lease_us: dur_us(p.lease),
            grace_us: dur_us(p.timeout_grace),
            now: bound(p.now),
            fresh,
        };
        // A renewal the server rolled back whole renewed nothing: send it again.
        let rows = retry_rolled_back(|| self.inner.driver.renew(&args)).await?;
        let rows = rows.into_iter().map(|r| {
            (
                r.id,
                r.lease_token,
                r.lease_expires_at,
                r.cancel_requested_at,
            )
        });
        // Keyed by (id, token): the same job presented with a stale token is lost even when
        // its current token is renewed in the same batch.
        let renewed: HashMap<(i64, String), Renewed> = rows
            .map(|(id, token, exp, cancel)| {
                (
                    (id, token.unwrap_or_default()),
                    Renewed {
                        expires_at: from_us(exp.unwrap_or_default()),
                        cancel_requested: cancel.is_some(),
                    },
                )
            })
            .collect();
        Ok(p.leases
            .iter()
            .map(|l| {
                let key = (l.id.0, l.token.as_str().to_string());
                (
                    l.id,
                    renewed
                        .get(&key)
                        .map_or(Guarded::LeaseLost, |r| Guarded::Applied(*r)),
                )
            })
            .collect())
    }

    /// Finalizes many jobs in one round trip (PostgreSQL) or one transaction (MySQL,
    /// SQLite). Each comes back applied with the state it reached — a retry of a job whose
    /// attempts are used up becomes `dead` — or [`Guarded::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if a job appears twice; [`Error::Database`].
    pub(crate) async fn job_finalize_many(
        &self,
        p: FinalizeParams,
    ) -> Result<Vec<(JobId, Guarded<JobState>)>> {
        Ok(self.job_finalize_settling(p).await?.0)
    }

    /// [`job_finalize_many`](Self::job_finalize_many), and then the children of the jobs it
    /// ended that have any (`has_children`, read by the finalize statement itself: a batch
    /// without such jobs sends nothing more) are settled; returns the queues of the children
    /// released. A settle that fails is logged and left to the sweeper's backstop: the
    /// finalization itself stands.
    ///
    /// # Errors
    /// As [`job_finalize_many`](Self::job_finalize_many).
    pub(crate) async fn job_finalize_settling(
        &self,
        p: FinalizeParams,
    ) -> Result<(Vec<(JobId, Guarded<JobState>)>, Vec<String>)> {
        let now = p.now;
        let (done, parents) = self
            .bounded_owned(Op::Finalize, p, |s, p| async move {
                s.finalize_unbounded(p).await
            })
            .await?;
        if parents.is_empty() {
            return Ok((done, Vec::new()));
        }
        match self.job_settle_children(&parents, now).await {
            Ok(s) => Ok((done, s.released)),
            Err(e) => {
                tracing::warn!(error = %e, "settling finished jobs' children failed; the sweeper will");
                Ok((done, Vec::new()))
            }
        }
    }

    async fn finalize_unbounded(
        &self,
        p: FinalizeParams,
    ) -> Result<(Vec<(JobId, Guarded<JobState>)>, Vec<i64>)> {
        let mut seen = HashSet::new();
        for f in &p.items {
            if !seen.insert(f.id) {
                return Err(Error::invalid(
                    "items",
                    format!("job {} is finalized twice in one batch", f.id),
                ));
            }
        }
        if p.items.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        #[cfg(feature = "test-util")]
        let p = self.mutate_finalize(p).await?;
        // A batch the server rolled back whole ended nothing: send it again (each row is
        // still guarded by its token).
        let now = bound(p.now);
        let applied = retry_rolled_back(|| self.inner.driver.finalize(&p.items, now)).await?;
        let parents = applied
            .iter()
            .filter(|(_, (state, children))| *children && state.is_terminal())
            .map(|(id, _)| *id)
            .collect();
        let done = p
            .items
            .iter()
            .map(|f| {
                (
                    f.id,
                    applied
                        .get(&f.id.0)
                        .map_or(Guarded::LeaseLost, |s| Guarded::Applied(s.0)),
                )
            })
            .collect();
        Ok((done, parents))
    }
}
