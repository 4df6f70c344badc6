//! Helpers shared by several backends' statements, below the backends and the seam (so no
//! backend imports another): the columns of a new row, the look-up of an existing duplicate,
//! a batch of jobs as one JSON bind, the rows batched statements return, and one
//! finalization as the columns every backend's finalize writes.

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::{Queryable, QueryableByName};

use super::params::{Finalization, Finalize};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use super::rows::dur_ms;
use super::rows::{dur_us, to_us};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::job::Enqueued;
use crate::job::JobFailure;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::job::{JobId, NewJob, RunAt};

/// Bound `now` in microseconds, if any.
pub(crate) fn bound(now: Option<chrono::DateTime<chrono::Utc>>) -> Option<i64> {
    now.map(to_us)
}

/// The columns of a new row; `run_at` and the timestamps are SQL expressions of `now`.
/// `attempts` (0) and `version` (1) are the schema's column defaults; `errors` is written
/// because MySQL's `JSON` column can have no default (PostgreSQL's and SQLite's default to
/// `[]`, which their batch inserts rely on).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! new_row {
    ($job:expr, $now:expr) => {{
        use diesel::ExpressionMethods;
        use serde_json::Value;
        use $crate::job::{JobState, NewJob, RunAt};
        use $crate::store::expr::DbNow;
        use $crate::store::rows::{dur_ms, dur_us, to_us};
        use $crate::store::schema::jobvisor_jobs as jobs;
        let j: &NewJob = $job;
        let now: DbNow = $now;
        let (scope, period_us) = $crate::store::columns::unique_parts(j);
        let run_at = match j.run_at {
            RunAt::Now => now,
            RunAt::After(d) => now.plus(dur_us(d)),
            // COALESCE(bound, db-now) + 0 = the given instant.
            RunAt::At(t) => DbNow::new(Some(to_us(t))),
        };
        (
            jobs::queue.eq(j.queue.clone()),
            jobs::kind.eq(j.kind.clone()),
            jobs::unique_key.eq(j.unique_key.clone()),
            jobs::partition_key.eq(j.partition.clone()),
            jobs::unique_hold.eq(j.unique_key.clone()),
            jobs::unique_scope.eq(scope),
            jobs::unique_until.eq($crate::store::expr::DbNowPlus {
                bound: now.bound,
                plus_us: period_us,
            }),
            jobs::state.eq(JobState::Pending.as_str()),
            jobs::priority.eq(i32::from(j.priority)),
            jobs::payload.eq(j.payload.clone()),
            jobs::errors.eq(Value::Array(Vec::new())),
            jobs::max_attempts.eq(i32::try_from(j.max_attempts).unwrap_or(i32::MAX)),
            jobs::run_at.eq(run_at),
            jobs::timeout_ms.eq(dur_ms(j.timeout)),
            jobs::created_at.eq(now),
            jobs::updated_at.eq(now),
        )
    }};
}

/// A keyed job's hold columns: its scope's stored name and, for a period, the period in
/// µs (`unique_until = now + period`); `(None, None)` without a key.
pub(crate) fn unique_parts(j: &crate::job::NewJob) -> (Option<&'static str>, Option<i64>) {
    use crate::job::UniqueScope;
    if j.unique_key.is_none() {
        return (None, None);
    }
    let scope = j.unique_scope.unwrap_or_default();
    let period = match scope {
        UniqueScope::For(d) => Some(dur_us(d)),
        UniqueScope::UntilArchived | UniqueScope::WhileActive => None,
    };
    (Some(scope.stored()), period)
}

/// The live job holding `$job`'s (kind, unique_key) as a [`Holder`](super::keyed::Holder) —
/// whether its [`For`](crate::job::UniqueScope::For) period has ended (the hold can be taken
/// over), its version, and whether it is *open* (pending, never started, no children: an
/// [`OnDuplicate`](crate::job::OnDuplicate) other than `Keep` may change it) — or `None` if no
/// job holds it (any more).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! holder {
    ($conn:expr, $job:expr, $now:expr) => {{
        use diesel::{ExpressionMethods, NullableExpressionMethods, OptionalExtension, QueryDsl};
        use diesel_async::RunQueryDsl;
        use $crate::job::{JobState, NewJob};
        use $crate::store::expr::DbNow;
        use $crate::store::keyed::Holder;
        use $crate::store::schema::jobvisor_jobs as jobs;
        let j: &NewJob = $job;
        jobs::table
            .select((
                jobs::id,
                jobs::unique_until.le(DbNow::new($now).nullable()),
                jobs::version,
                jobs::state,
                jobs::first_started_at.is_null(),
                // Not a column of the `table!` (at diesel's 32-column limit).
                diesel::dsl::sql::<diesel::sql_types::Bool>("has_children"),
            ))
            .filter(jobs::kind.eq(&j.kind))
            .filter(jobs::unique_hold.eq(&j.unique_key))
            .first::<(i64, Option<bool>, i64, String, bool, bool)>(&mut *$conn)
            .await
            .optional()?
            .map(
                |(id, expired, version, state, unstarted, children)| Holder {
                    id,
                    expired: expired == Some(true),
                    version,
                    open: state == JobState::Pending.as_str() && unstarted && !children,
                },
            )
    }};
}

/// Releases the hold of job `$id` if its period has ended: a guarded, row-locking `UPDATE`.
/// Concurrent enqueuers of the key serialize on the row; the first clears the hold (and
/// inserts its job in the same transaction), the others then find it cleared and change
/// nothing (0). Returns the number of rows changed.
macro_rules! take_over {
    ($conn:expr, $id:expr, $now:expr) => {{
        use diesel::{ExpressionMethods, NullableExpressionMethods, QueryDsl};
        use diesel_async::RunQueryDsl;
        use $crate::store::expr::DbNow;
        use $crate::store::schema::jobvisor_jobs as jobs;
        let id: i64 = $id;
        diesel::update(
            jobs::table
                .filter(jobs::id.eq(id))
                .filter(jobs::unique_hold.is_not_null())
                .filter(jobs::unique_until.le(DbNow::new($now).nullable())),
        )
        .set(jobs::unique_hold.eq(None::<String>))
        .execute(&mut *$conn)
        .await?
    }};
}

/// Frees job `$id`'s hold as `$release` (a [`Release`](super::keyed::Release)) says: an ended
/// period's take-over ([`take_over!`]), or the cancel of an open holder still at the version
/// read — `cancelled`, `finished_at`, its hold cleared, guarded in the statement by its
/// version, `pending`, no start ever recorded and no children. Returns the rows changed (0: the
/// holder moved on, another enqueuer got there first).
macro_rules! release {
    ($conn:expr, $id:expr, $release:expr, $now:expr) => {{
        use diesel::{ExpressionMethods, NullableExpressionMethods, QueryDsl};
        use diesel_async::RunQueryDsl;
        use $crate::job::JobState;
        use $crate::store::expr::DbNow;
        use $crate::store::keyed::Release;
        use $crate::store::schema::jobvisor_jobs as jobs;
        let id: i64 = $id;
        match $release {
            Release::Expired => $crate::store::columns::take_over!($conn, id, $now),
            Release::Cancel { version } => {
                let now = DbNow::new($now);
                let n = diesel::update(
                    jobs::table
                        .filter(jobs::id.eq(id))
                        .filter(jobs::version.eq(version))
                        .filter(jobs::state.eq(JobState::Pending.as_str()))
                        .filter(jobs::first_started_at.is_null())
                        .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                            "NOT has_children",
                        )),
                )
                .set((
                    jobs::state.eq(JobState::Cancelled.as_str()),
                    jobs::finished_at.eq(now.nullable()),
                    jobs::updated_at.eq(now),
                    jobs::version.eq(jobs::version + 1),
                    jobs::unique_hold.eq(None::<String>),
                ))
                .execute(&mut *$conn)
                .await?;
                if n == 1 {
                    // The cancelled holder's end, to whoever waits on it.
                    $crate::store::wakes::announce_done(&mut *$conn, &[id]).await?;
                }
                n
            }
        }
    }};
}

/// Overwrites the open holder `$id`'s payload, priority and run time with `$job`'s
/// ([`OnDuplicate::Replace`](crate::job::OnDuplicate::Replace)), guarded in the statement as
/// [`release!`]'s cancel is; `version + 1`. Returns the rows changed (0: the holder moved on).
macro_rules! overwrite {
    ($conn:expr, $id:expr, $version:expr, $job:expr, $now:expr) => {{
        use diesel::{ExpressionMethods, QueryDsl};
        use diesel_async::RunQueryDsl;
        use $crate::job::{JobState, NewJob};
        use $crate::store::expr::DbNow;
        use $crate::store::schema::jobvisor_jobs as jobs;
        let j: &NewJob = $job;
        let id: i64 = $id;
        let version: i64 = $version;
        let now = DbNow::new($now);
        diesel::update(
            jobs::table
                .filter(jobs::id.eq(id))
                .filter(jobs::version.eq(version))
                .filter(jobs::state.eq(JobState::Pending.as_str()))
                .filter(jobs::first_started_at.is_null())
                .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "NOT has_children",
                )),
        )
        .set((
            jobs::payload.eq(j.payload.clone()),
            jobs::priority.eq(i32::from(j.priority)),
            jobs::run_at.eq($crate::store::columns::run_at_of(j, now)),
            jobs::updated_at.eq(now),
            jobs::version.eq(jobs::version + 1),
        ))
        .execute(&mut *$conn)
        .await?
    }};
}

/// A new job's `run_at` as an expression of `now`.
pub(crate) fn run_at_of(j: &crate::job::NewJob, now: super::expr::DbNow) -> super::expr::DbNow {
    use crate::job::RunAt;
    match j.run_at {
        RunAt::Now => now,
        RunAt::After(d) => now.plus(dur_us(d)),
        // COALESCE(bound, db-now) + 0 = the given instant.
        RunAt::At(t) => super::expr::DbNow::new(Some(to_us(t))),
    }
}

#[derive(QueryableByName)]
pub(crate) struct LastId {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// Jobs as the JSON array the batch inserts unpack:
/// `[queue, kind, priority, payload text, max_attempts, run_at or null, delay_us, timeout_ms,
/// partition or null]`.
pub(crate) fn batch_json(jobs: &[&NewJob]) -> diesel::QueryResult<String> {
    type Row<'a> = (
        &'a str,
        &'a str,
        i16,
        String,
        u32,
        Option<i64>,
        i64,
        i64,
        Option<&'a str>,
    );
    let rows: Vec<Row<'_>> = jobs
        .iter()
        .map(|j| {
            let (run_base, run_plus) = run_at_parts(j, None);
            (
                j.queue.as_str(),
                j.kind.as_str(),
                j.priority,
                j.payload.to_string(),
                j.max_attempts,
                run_base,
                run_plus,
                dur_ms(j.timeout),
                j.partition.as_deref(),
            )
        })
        .collect();
    serde_json::to_string(&rows).map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// `run_at` as (a fixed instant, or `now` — itself `None` for the database clock) plus a delay.
pub(crate) fn run_at_parts(j: &NewJob, now: Option<i64>) -> (Option<i64>, i64) {
    match j.run_at {
        RunAt::Now => (now, 0),
        RunAt::After(d) => (now, dur_us(d)),
        RunAt::At(t) => (Some(to_us(t)), 0),
    }
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// The ids of a batch insert in ascending (input) order; an error unless all came back.
pub(crate) fn sorted_ids(rows: Vec<LastId>, expected: usize) -> diesel::QueryResult<Vec<i64>> {
    if rows.len() != expected {
        return Err(diesel::result::Error::QueryBuilderError(
            format!("inserted {} jobs of {expected}", rows.len()).into(),
        ));
    }
    let mut ids: Vec<i64> = rows.into_iter().map(|r| r.id).collect();
    ids.sort_unstable();
    Ok(ids)
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// Most rows in one batch insert.
pub(crate) const MULTI_INSERT_CHUNK: usize = 1000;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// Most payload bytes in one batch insert (well under MySQL's default 16 MiB packet and
/// SQLite's 1 GB string limit, whatever the payloads).
pub(crate) const MULTI_INSERT_BYTES: usize = 4 << 20;

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// The length of the run of jobs without unique keys at the start of `batch`: at most
/// [`MULTI_INSERT_CHUNK`] jobs and [`MULTI_INSERT_BYTES`] of payload, at least one job.
pub(crate) fn keyless_run(batch: &[&NewJob]) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for j in batch.iter().take(MULTI_INSERT_CHUNK) {
        if j.unique_key.is_some() {
            break;
        }
        bytes += crate::new_job::payload_size(&j.payload);
        if n > 0 && bytes > MULTI_INSERT_BYTES {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// Ids of newly inserted jobs as enqueue results.
pub(crate) fn new_ids(ids: Vec<i64>) -> impl Iterator<Item = Option<Enqueued>> {
    ids.into_iter().map(|id| {
        Some(Enqueued {
            id: JobId(id),
            duplicate: false,
            replaced: false,
        })
    })
}

/// A renewed lease as a statement returns it.
#[derive(Queryable, QueryableByName)]
pub(crate) struct RenewedRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) lease_token: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) lease_expires_at: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) cancel_requested_at: Option<i64>,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Queryable)]
pub(crate) struct Finalized {
    pub(crate) id: i64,
    pub(crate) state: String,
    /// Whether a child was ever enqueued after it (`has_children`): its end must settle them.
    pub(crate) has_children: bool,
}

/// A finalize statement's rows (`RETURNING id, state, has_children`), read by position: one
/// per job, so by name they cost the client a dynamic row and a search per column per job.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) type FinalizedRows<Q, DB> =
    super::expr::Positional<Q, (BigInt, Text, diesel::sql_types::Bool), DB>;

/// One finalization as the columns of a batched statement.
pub(crate) struct FinalRow {
    pub(crate) state: &'static str,
    pub(crate) result: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) delay_us: Option<i64>,
    pub(crate) refund: i32,
    /// Microseconds since the handler started, when its start is not recorded yet.
    pub(crate) ago_us: Option<i64>,
}

impl From<&Finalize> for FinalRow {
    fn from(f: &Finalize) -> Self {
        let json = |v: &JobFailure| serde_json::to_string(v).ok();
        let (state, result, error, delay_us, refund) = match &f.outcome {
            Finalization::Succeeded { result } => (
                "succeeded",
                serde_json::to_string(result).ok(),
                None,
                None,
                0,
            ),
            Finalization::Retry { error, delay } => {
                ("retrying", None, json(error), Some(dur_us(*delay)), 0)
            }
            Finalization::Dead { error } => ("dead", None, json(error), None, 0),
            Finalization::Cancelled { error } => ("cancelled", None, json(error), None, 0),
            Finalization::Requeue { delay } => ("pending", None, None, Some(dur_us(*delay)), 1),
        };
        FinalRow {
            state,
            result,
            error,
            delay_us,
            refund,
            ago_us: f.started_ago.map(dur_us),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use holder;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use new_row;
pub(crate) use overwrite;
pub(crate) use release;
pub(crate) use take_over;

/// The values of an effect record's insert, once for every backend.
macro_rules! effect_values {
    ($e:expr) => {{
        use diesel::prelude::*;
        use $crate::store::expr::DbNow;
        use $crate::store::schema::jobvisor_effects as effects;
        let e: &$crate::store::params::NewEffect = $e;
        (
            effects::job_id.eq(e.id),
            effects::effect_key.eq(e.key.clone()),
            effects::detail.eq(e.detail.clone()),
            effects::claim.eq(e.claim.clone()),
            effects::recorded_at.eq(DbNow::new(e.now)),
        )
    }};
}

pub(crate) use effect_values;

/// The effect insert of the backends where a duplicate key changes nothing and fails nothing
/// (`ON CONFLICT DO NOTHING`: PostgreSQL, SQLite): true if inserted.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! insert_effect_unless_recorded {
    ($conn:expr, $e:expr) => {{
        let n = diesel::insert_into($crate::store::schema::jobvisor_effects::table)
            .values($crate::store::columns::effect_values!($e))
            .on_conflict_do_nothing()
            .execute($conn)
            .await?;
        Ok(n == 1)
    }};
}
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use insert_effect_unless_recorded;
