//! The dashboard's reads beyond [`Client::list`](crate::Client::list): how a page of jobs is
//! ordered and bounded ([`Browse`]), the far edge of a bounded window of ids, the priorities
//! of a queue's waiting jobs, the dead letters grouped in SQL, and a schedule's recent
//! fires. Every statement has a `LIMIT` and reads an index.
#![cfg_attr(not(feature = "web"), allow(dead_code))]

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::with_conn;
use super::expr::{state_in, ErrorCode};
use super::rows::{ArchiveRow, JobRow};
use super::schema::{jobvisor_jobs as jobs, jobvisor_jobs_archive as archive};
use super::Store;
use crate::error::Result;
use crate::job::{Job, JobState};

/// How [`Store::job_browse`] orders and bounds a page (all off by default: by id).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Browse {
    /// Order by `(run_at, id)` instead of `id`; descending with `newest_first`.
    pub(crate) by_run_at: bool,
    /// Keyset for the `run_at` order: only rows past this `(run_at µs, id)`.
    pub(crate) run_at_after: Option<(i64, i64)>,
    /// Only `id >= floor` (a bounded window's far edge, newest first).
    pub(crate) id_floor: Option<i64>,
    /// Only `id <= ceiling` (a bounded window's far edge, oldest first).
    pub(crate) id_ceiling: Option<i64>,
    /// Only jobs of this priority.
    pub(crate) priority: Option<i32>,
}

/// One dead-letter group: dead jobs of one kind whose last error has one code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadGroup {
    pub(crate) kind: String,
    /// `None`: dead without a recorded error.
    pub(crate) code: Option<String>,
    pub(crate) count: u64,
    /// The newest of them.
    pub(crate) newest: i64,
}

/// Dead-letter groups at most read: **1,000**.
pub(crate) const MAX_DEAD_GROUPS: i64 = 1_000;

impl Store {
    /// The id `size` rows past `from` (exclusive; `None`: from the end) in the listing's
    /// order — descending with `newest_first` — of the live table or the archive: the far
    /// edge of a window of `size` ids. `None` when fewer rows are left. An index-only walk of
    /// `size` primary-key entries.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn job_id_edge(
        &self,
        archived: bool,
        newest_first: bool,
        from: Option<i64>,
        size: i64,
    ) -> Result<Option<i64>> {
        let skip = (size - 1).max(0);
        Ok(if archived {
            with_conn!(self, |conn| {
                let q = archive::table.select(archive::id).into_boxed();
                let q = if newest_first {
                    q.filter(archive::id.lt(from.unwrap_or(i64::MAX)))
                        .order(archive::id.desc())
                } else {
                    q.filter(archive::id.gt(from.unwrap_or(i64::MIN)))
                        .order(archive::id.asc())
                };
                q.offset(skip).limit(1).first(conn).await.optional()?
            })
        } else {
            with_conn!(self, |conn| {
                let q = jobs::table.select(jobs::id).into_boxed();
                let q = if newest_first {
                    q.filter(jobs::id.lt(from.unwrap_or(i64::MAX)))
                        .order(jobs::id.desc())
                } else {
                    q.filter(jobs::id.gt(from.unwrap_or(i64::MIN)))
                        .order(jobs::id.asc())
                };
                q.offset(skip).limit(1).first(conn).await.optional()?
            })
        })
    }

    /// The lowest and highest priority among `queue`'s jobs in `state` (pending or
    /// retrying: the claim index's `(queue, priority, …)` answers each end with one probe);
    /// `None` without such jobs.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn waiting_priorities(
        &self,
        queue: &str,
        state: JobState,
    ) -> Result<Option<(i32, i32)>> {
        let queue = queue.to_string();
        let (lo, hi): (Option<i32>, Option<i32>) = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::queue.eq(queue))
                .filter(state_in(state))
                .select((
                    diesel::dsl::min(jobs::priority),
                    diesel::dsl::max(jobs::priority),
                ))
                .first(conn)
                .await?
        });
        Ok(lo.zip(hi))
    }

    /// Whether more than `n` jobs are dead: one `LIMIT`ed probe, `n` entries into the dead
    /// index at most.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn dead_more_than(&self, n: i64) -> Result<bool> {
        let past: Option<i64> = with_conn!(self, |conn| {
            jobs::table
                .filter(state_in(JobState::Dead))
                .select(jobs::id)
                .offset(n)
                .limit(1)
                .first(conn)
                .await
                .optional()?
        });
        Ok(past.is_some())
    }

    /// The id of the `n`-th newest dead job (`None`: fewer are dead): where a window of the
    /// newest `n` dead jobs starts.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn dead_edge(&self, n: i64) -> Result<Option<i64>> {
        Ok(with_conn!(self, |conn| {
            jobs::table
                .filter(state_in(JobState::Dead))
                .select(jobs::id)
                .order(jobs::id.desc())
                .offset((n - 1).max(0))
                .limit(1)
                .first(conn)
                .await
                .optional()?
        }))
    }

    /// Live jobs by id (those that exist), in no particular order.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt); [`Error::Database`](crate::Error::Database).
    pub(crate) async fn jobs_by_ids(&self, ids: &[i64]) -> Result<Vec<Job>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        let n = i64::try_from(ids.len()).unwrap_or(i64::MAX);
        let rows: Vec<JobRow> = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::id.eq_any(ids.clone()))
                .select(JobRow::as_select())
                .limit(n)
                .load(conn)
                .await?
        });
        rows.into_iter().map(|r| r.into_job(None)).collect()
    }

    /// The dead jobs grouped by kind and error code (`id >= from`: only the newest), at
    /// most [`MAX_DEAD_GROUPS`] groups, most jobs first. On PostgreSQL and SQLite a
    /// walk of the dead index, already in group order (each row read for its code).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn dead_groups(&self, from: Option<i64>) -> Result<Vec<DeadGroup>> {
        let from = from.unwrap_or(i64::MIN);
        let rows: Vec<(String, Option<String>, i64, Option<i64>)> = with_conn!(self, |conn| {
            jobs::table
                .filter(state_in(JobState::Dead))
                .filter(jobs::id.ge(from))
                .group_by((jobs::kind, ErrorCode))
                .select((
                    jobs::kind,
                    ErrorCode,
                    diesel::dsl::count_star(),
                    diesel::dsl::max(jobs::id),
                ))
                .limit(MAX_DEAD_GROUPS)
                .load(conn)
                .await?
        });
        let mut groups: Vec<DeadGroup> = rows
            .into_iter()
            .map(|(kind, code, n, newest)| DeadGroup {
                kind,
                code,
                count: u64::try_from(n).unwrap_or(0),
                newest: newest.unwrap_or(0),
            })
            .collect();
        groups.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.kind.cmp(&b.kind))
                .then_with(|| a.code.cmp(&b.code))
        });
        Ok(groups)
    }

    /// The dead jobs of one group (kind and error code; `None`: no error recorded), newest
    /// first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt); [`Error::Database`](crate::Error::Database).
    pub(crate) async fn dead_of_group(
        &self,
        kind: &str,
        code: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Job>> {
        let kind = kind.to_string();
        let code = code.map(str::to_string);
        let rows: Vec<JobRow> = with_conn!(self, |conn| {
            let q = jobs::table
                .filter(state_in(JobState::Dead))
                .filter(jobs::kind.eq(kind.clone()))
                .select(JobRow::as_select())
                .order(jobs::id.desc())
                .limit(limit)
                .into_boxed();
            let q = match &code {
                Some(c) => q.filter(ErrorCode.eq(c.clone())),
                None => q.filter(ErrorCode.is_null()),
            };
            q.load(conn).await?
        });
        rows.into_iter().map(|r| r.into_job(None)).collect()
    }

    /// The jobs of a schedule's newest `n` fires, live or archived, newest first: its jobs
    /// are keyed `schedule:<name>@<instant>` (so a range of the unique-key index of `kind`).
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt); [`Error::Database`](crate::Error::Database).
    pub(crate) async fn schedule_fires(&self, kind: &str, name: &str, n: i64) -> Result<Vec<Job>> {
        let escaped: String = name
            .chars()
            .flat_map(|c| match c {
                '\\' | '%' | '_' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        let pattern = format!("schedule:{escaped}@%");
        let prefix = format!("schedule:{name}@");
        let kind = kind.to_string();
        let live: Vec<JobRow> = with_conn!(self, |conn| {
            jobs::table
                .filter(jobs::kind.eq(kind.clone()))
                .filter(jobs::unique_key.like(pattern.clone()).escape('\\'))
                // A lower bound the index can start from (keyless rows and keys below it
                // are never read); the pattern checks the rest.
                .filter(jobs::unique_key.ge(prefix.clone()))
                .select(JobRow::as_select())
                .order(jobs::unique_key.desc())
                .limit(n)
                .load(conn)
                .await?
        });
        let archived: Vec<ArchiveRow> = with_conn!(self, |conn| {
            archive::table
                .filter(archive::kind.eq(kind.clone()))
                .filter(archive::unique_key.like(pattern.clone()).escape('\\'))
                // A lower bound the index can start from (keyless rows and keys below it
                // are never read); the pattern checks the rest.
                .filter(archive::unique_key.ge(prefix.clone()))
                .select(ArchiveRow::as_select())
                .order(archive::unique_key.desc())
                .limit(n)
                .load(conn)
                .await?
        });
        let mut out = live
            .into_iter()
            .map(|r| r.into_job(None))
            .chain(
                archived
                    .into_iter()
                    .map(|a| JobRow::from(a.job).into_job(Some(a.archived_at))),
            )
            .collect::<Result<Vec<Job>>>()?;
        // A name that is another's prefix plus '@…' cannot match: the key's rest is an
        // instant. Kept only if the key is exactly this schedule's.
        out.retain(|j| {
            j.unique_key
                .as_deref()
                .and_then(|k| k.strip_prefix(&prefix))
                .is_some_and(|rest| !rest.contains('@'))
        });
        out.sort_by(|a, b| {
            fire_instant(b)
                .cmp(&fire_instant(a))
                .then(b.id.0.cmp(&a.id.0))
        });
        out.truncate(usize::try_from(n).unwrap_or(0));
        Ok(out)
    }
}

/// The instant a schedule's job was fired for: from its key (`schedule:<name>@<RFC 3339>`;
/// a retried job's run time moves on), else its run time.
pub(crate) fn fire_instant(j: &Job) -> chrono::DateTime<chrono::Utc> {
    j.unique_key
        .as_deref()
        .and_then(|k| k.rsplit_once('@'))
        .and_then(|(_, t)| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or(j.run_at, |t| t.with_timezone(&chrono::Utc))
}
