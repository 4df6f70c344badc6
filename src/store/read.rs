//! Reads: one job by id (live or archived), its claims (the execution ledger), filtered lists
//! with keyset paging, and counts by queue and state. Reads take no `now`: they change nothing.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::with_conn;
use super::expr::{state_in, DbNow, TERMINAL};
use super::ledger::StoredClaim;
use super::rows::{from_us, to_us, ArchiveRow, JobRow};
use super::schema::{
    jobvisor_claims as ledger_rows, jobvisor_jobs as jobs, jobvisor_jobs_archive as archive,
    jobvisor_jobs_last as last,
};
use super::{Browse, ListParams, QueueLag, StateCount, Store};
use crate::claim::{Claim, ClaimOutcome};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::lease::{ClaimId, NodeId};

/// A live job's row as [`Store::job_claims`] reads it: its state and lease (the claim
/// running now), then its end and the claim a finalize last ended (`last_*`).
type LiveClaims = (
    (
        String,
        Option<String>,
        Option<String>,
        i32,
        i64,
        Option<i64>,
    ),
    (Option<i64>, Option<String>, Option<String>, Option<i64>),
);

/// Page size when a list names none.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// Largest page size.
pub const MAX_LIST_LIMIT: u32 = 1000;

impl Store {
    /// One job by id, from the live table or else the archive (`archived_at` set).
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored row cannot be read; [`Error::Database`].
    pub(crate) async fn job_get(&self, id: JobId) -> Result<Option<Job>> {
        let live: Option<JobRow> = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::id.eq(id.0))
                .select(JobRow::as_select())
                .first(conn)
                .await
                .optional()?
        });
        if let Some(row) = live {
            return row.into_job(None).map(Some);
        }
        let archived: Option<ArchiveRow> = with_conn!(self, |conn| {
            archive::table
                .filter(archive::id.eq(id.0))
                .select(ArchiveRow::as_select())
                .first(conn)
                .await
                .optional()?
        });
        archived
            .map(|a| JobRow::from(a.job).into_job(Some(a.archived_at)))
            .transpose()
    }

    /// A job's claims, oldest first: each ended claim's ledger row (`store::ledger`), then
    /// the claim running now, if any, read from the job's row (its lease), or the success a
    /// finalize ended, kept on the live job's row (`last_*`).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a job that is neither live nor archived; [`Error::Database`].
    pub(crate) async fn job_claims(&self, id: JobId) -> Result<Vec<Claim>> {
        let stored: Vec<StoredClaim> = with_conn!(self, |conn| {
            ledger_rows::table
                .filter(ledger_rows::job_id.eq(id.0))
                .order((ledger_rows::claimed_at.asc(), ledger_rows::claim_id.asc()))
                .select(StoredClaim::as_select())
                .load(conn)
                .await?
        });
        let live: Option<LiveClaims> = with_conn!(self, |conn| {
            last::table
                .filter(last::id.eq(id.0))
                .select((
                    (
                        last::state,
                        last::lease_token,
                        last::lease_owner,
                        last::attempts,
                        last::updated_at,
                        last::started_at,
                    ),
                    (
                        last::finished_at,
                        last::last_node,
                        last::last_claim,
                        last::last_claimed_at,
                    ),
                ))
                .first(conn)
                .await
                .optional()?
        });
        let mut claims: Vec<Claim> = stored.into_iter().map(StoredClaim::into_claim).collect();
        match live {
            Some(((state, Some(token), Some(node), attempt, claimed_at, started_at), _))
                if state == JobState::Running.as_str() =>
            {
                claims.push(Claim {
                    claim: ClaimId::of_token(&token).unwrap_or(ClaimId::NONE),
                    job: id,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    node: NodeId::from_stored(node),
                    claimed_at: from_us(claimed_at),
                    started_at: started_at.map(from_us),
                    ended_at: None,
                    outcome: ClaimOutcome::Running,
                    code: None,
                    fence_margin_ms: None,
                });
            }
            // A success a finalize ended is on its job row until the job is archived
            // (`store::ledger`), unless the ledger has it already.
            Some((
                (state, _, _, attempt, _, started_at),
                (Some(ended_at), Some(node), Some(claim), Some(claimed_at)),
            )) if state == JobState::Succeeded.as_str()
                && !claims.iter().any(|c| c.claim.to_string() == claim) =>
            {
                claims.push(Claim {
                    claim: claim.parse().unwrap_or(ClaimId::NONE),
                    job: id,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    node: NodeId::from_stored(node),
                    claimed_at: from_us(claimed_at),
                    started_at: started_at.map(from_us),
                    ended_at: Some(from_us(ended_at)),
                    outcome: ClaimOutcome::Succeeded,
                    code: None,
                    fence_margin_ms: None,
                });
            }
            Some(_) => {}
            None if claims.is_empty() && self.job_get(id).await?.is_none() => {
                return Err(Error::NotFound { id });
            }
            None => {}
        }
        Ok(claims)
    }

    /// Jobs matching the filters, by ascending id, one page at a time.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a limit over [`MAX_LIST_LIMIT`]; [`Error::Corrupt`];
    /// [`Error::Database`].
    pub(crate) async fn job_list(&self, p: ListParams) -> Result<Vec<Job>> {
        self.job_browse(p, Browse::default()).await
    }

    /// [`job_list`](Self::job_list) with the dashboard's orders and bounds (see [`Browse`]).
    ///
    /// # Errors
    /// As [`job_list`](Self::job_list).
    pub(crate) async fn job_browse(&self, p: ListParams, b: Browse) -> Result<Vec<Job>> {
        if p.limit > MAX_LIST_LIMIT {
            return Err(Error::invalid(
                "limit",
                format!(
                    "{} is over the maximum page size of {MAX_LIST_LIMIT}",
                    p.limit
                ),
            ));
        }
        let limit = i64::from(if p.limit == 0 {
            DEFAULT_LIST_LIMIT
        } else {
            p.limit
        });
        let after = p.after.map(|a| a.0);
        let newest_first = p.newest_first;
        let state = p.state.map(JobState::as_str);
        let created_after = p.created_after.map(to_us);
        let created_before = p.created_before.map(to_us);
        if p.archived {
            let rows: Vec<ArchiveRow> = with_conn!(self, |conn| {
                let mut q = archive::table
                    .select(ArchiveRow::as_select())
                    .limit(limit)
                    .into_boxed();
                q = match (b.by_run_at, newest_first) {
                    (false, true) => q
                        .filter(archive::id.lt(after.unwrap_or(i64::MAX)))
                        .order(archive::id.desc()),
                    (false, false) => q
                        .filter(archive::id.gt(after.unwrap_or(i64::MIN)))
                        .order(archive::id.asc()),
                    (true, true) => q.order((archive::run_at.desc(), archive::id.desc())),
                    (true, false) => q.order((archive::run_at.asc(), archive::id.asc())),
                };
                // Keyset on (run_at, id): the first bound is an index range, the second
                // only sorts out the rows of the same instant.
                if let Some((r, i)) = b.run_at_after {
                    q = if newest_first {
                        q.filter(archive::run_at.le(r))
                            .filter(archive::run_at.lt(r).or(archive::id.lt(i)))
                    } else {
                        q.filter(archive::run_at.ge(r))
                            .filter(archive::run_at.gt(r).or(archive::id.gt(i)))
                    };
                }
                if let Some(e) = b.id_floor {
                    q = q.filter(archive::id.ge(e));
                }
                if let Some(e) = b.id_ceiling {
                    q = q.filter(archive::id.le(e));
                }
                if let Some(pr) = b.priority {
                    q = q.filter(archive::priority.eq(pr));
                }
                if let Some(queue) = &p.queue {
                    q = q.filter(archive::queue.eq(queue.clone()));
                }
                if let Some(kind) = &p.kind {
                    q = q.filter(archive::kind.eq(kind.clone()));
                }
                if let Some(st) = state {
                    q = q.filter(archive::state.eq(st));
                }
                if let Some(t) = created_after {
                    q = q.filter(archive::created_at.gt(t));
                }
                if let Some(t) = created_before {
                    q = q.filter(archive::created_at.lt(t));
                }
                if let Some(k) = &p.unique_key {
                    q = q.filter(archive::unique_key.eq(k.clone()));
                }
                q.load(conn).await?
            });
            rows.into_iter()
                .map(|a| JobRow::from(a.job).into_job(Some(a.archived_at)))
                .collect()
        } else {
            let rows: Vec<JobRow> = with_conn!(self, |conn| {
                let mut q = jobs::table
                    .select(JobRow::as_select())
                    .limit(limit)
                    .into_boxed();
                q = match (b.by_run_at, newest_first) {
                    (false, true) => q
                        .filter(jobs::id.lt(after.unwrap_or(i64::MAX)))
                        .order(jobs::id.desc()),
                    (false, false) => q
                        .filter(jobs::id.gt(after.unwrap_or(i64::MIN)))
                        .order(jobs::id.asc()),
                    (true, true) => q.order((jobs::run_at.desc(), jobs::id.desc())),
                    (true, false) => q.order((jobs::run_at.asc(), jobs::id.asc())),
                };
                // Keyset on (run_at, id): the first bound is an index range, the second
                // only sorts out the rows of the same instant.
                if let Some((r, i)) = b.run_at_after {
                    q = if newest_first {
                        q.filter(jobs::run_at.le(r))
                            .filter(jobs::run_at.lt(r).or(jobs::id.lt(i)))
                    } else {
                        q.filter(jobs::run_at.ge(r))
                            .filter(jobs::run_at.gt(r).or(jobs::id.gt(i)))
                    };
                }
                if let Some(e) = b.id_floor {
                    q = q.filter(jobs::id.ge(e));
                }
                if let Some(e) = b.id_ceiling {
                    q = q.filter(jobs::id.le(e));
                }
                if let Some(pr) = b.priority {
                    q = q.filter(jobs::priority.eq(pr));
                }
                if let Some(queue) = &p.queue {
                    q = q.filter(jobs::queue.eq(queue.clone()));
                }
                if let Some(kind) = &p.kind {
                    q = q.filter(jobs::kind.eq(kind.clone()));
                }
                if let Some(st) = p.state {
                    // A literal, so PostgreSQL matches the partial indexes (claim, running,
                    // dead) under a generic plan too.
                    q = q.filter(state_in(st));
                }
                if let Some(t) = created_after {
                    q = q.filter(jobs::created_at.gt(t));
                }
                if let Some(t) = created_before {
                    q = q.filter(jobs::created_at.lt(t));
                }
                if let Some(k) = &p.unique_key {
                    q = q.filter(jobs::unique_key.eq(k.clone()));
                }
                q.load(conn).await?
            });
            rows.into_iter().map(|r| r.into_job(None)).collect()
        }
    }

    /// Live jobs counted by queue and state (states with no jobs are absent).
    ///
    /// # Errors
    /// [`Error::Database`]; [`Error::InvalidInput`] naming a stored state jobvisor does not
    /// know.
    pub(crate) async fn job_counts(&self) -> Result<Vec<StateCount>> {
        let rows: Vec<(String, String, i64)> = with_conn!(self, |conn| {
            jobs::table
                .group_by((jobs::queue, jobs::state))
                .select((jobs::queue, jobs::state, diesel::dsl::count_star()))
                .order((jobs::queue.asc(), jobs::state.asc()))
                .load(conn)
                .await?
        });
        rows.into_iter()
            .map(|(queue, state, n)| {
                Ok(StateCount {
                    queue,
                    state: state.parse()?,
                    count: u64::try_from(n).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Per queue with due jobs waiting: how many, and since when the oldest has been due —
    /// the queue's lag. One grouped read of the waiting rows that are due.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn queue_lags(&self) -> Result<Vec<QueueLag>> {
        let now = DbNow::new(None);
        let waiting = [JobState::Pending.as_str(), JobState::Retrying.as_str()];
        let rows: Vec<(String, i64, Option<i64>)> = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::state.eq_any(waiting))
                .filter(jobs::run_at.le(now))
                .group_by(jobs::queue)
                .select((
                    jobs::queue,
                    diesel::dsl::count_star(),
                    diesel::dsl::min(jobs::run_at),
                ))
                .order(jobs::queue.asc())
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(|(queue, n, oldest)| QueueLag {
                queue,
                due: u64::try_from(n).unwrap_or(0),
                oldest_due: from_us(oldest.unwrap_or(0)),
            })
            .collect())
    }

    /// Jobs of the live table that finished (succeeded, dead or cancelled) in each of
    /// `buckets` consecutive windows of `bucket` ending now: oldest first. One count per
    /// window, each a range of the terminal jobs' index on `finished_at`.
    ///
    /// # Errors
    /// [`Error::Database`].
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) async fn ended_histogram(
        &self,
        bucket: std::time::Duration,
        buckets: u32,
    ) -> Result<Vec<u64>> {
        let width = i64::try_from(bucket.as_micros()).unwrap_or(i64::MAX);
        let mut out = Vec::with_capacity(buckets as usize);
        for i in (0..i64::from(buckets)).rev() {
            let now = DbNow::new(None);
            let from = now.plus(-(width * (i + 1)));
            let to = now.plus(-(width * i));
            let n: i64 = with_conn!(self, |conn| {
                jobs::table
                    // The terminal states: the partial index on finished_at (PostgreSQL,
                    // SQLite) or the (state, finished_at) index (MySQL) serves the range.
                    .filter(TERMINAL)
                    // (from, to]: a job finished at the very instant read as "now" (the
                    // same millisecond on SQLite) is in the newest window, not in none.
                    .filter(jobs::finished_at.gt(from.nullable()))
                    .filter(jobs::finished_at.le(to.nullable()))
                    .count()
                    .get_result(conn)
                    .await?
            });
            out.push(u64::try_from(n).unwrap_or(0));
        }
        Ok(out)
    }
}
