//! The statements of the portable controlled claim, one method each of [`ClaimSteps`],
//! written once with diesel's query builder and type-checked once per backend's connection
//! (the same body for each, like `with_tx!`'s). `controlled.rs` puts them in order and does
//! the arithmetic between them.

use std::future::Future;

use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::result::QueryResult;
use diesel_async::RunQueryDsl;

use super::super::expr::{
    in_list, ClaimableIn, DbClock, DbNow, ForUpdate, PartitionScanSql, ScanSql,
};
use super::super::params::ClaimArgs;
use super::super::queues::QueueRow;
use super::super::rows::ClaimRow;
use super::super::schema::{
    jobvisor_jobs as jobs, jobvisor_queue_claims as claims_log, jobvisor_queues as queues,
};
use super::partitions::{HeadJob, PartitionScan, ScanRow};
use crate::job::JobState;

/// The kinds a claim may take: any (`any`), or those of `list` (the node's handlers).
#[derive(Debug)]
pub(crate) struct Kinds {
    pub(crate) any: bool,
    pub(crate) list: Vec<String>,
}

impl Kinds {
    /// The kinds of a claim's arguments.
    pub(crate) fn of(a: &ClaimArgs) -> Self {
        Kinds {
            any: a.kinds.is_none(),
            list: a.kinds.clone().unwrap_or_default(),
        }
    }
}

/// A row of the rate window as read: `(clock, claimed_at, jobs)` (see
/// [`ClaimSteps::read_rate_window`]).
pub(crate) type WindowRow = (i64, Option<i64>, Option<i32>);

/// A job as a keyless candidate: `(id, priority, run_at)`.
pub(crate) type Keyless = (i64, i32, i64);

/// One statement each of the portable controlled claim, on a connection inside its
/// transaction. `now` is the claim's time, as the lock's statement read it (or the test
/// clock's, bound); `bound` the test clock's instant, if any.
pub(crate) trait ClaimSteps: Send {
    /// How this backend's partition scan reads (its `sql.rs`).
    fn scan_sql(&self) -> ScanSql;

    /// Locks `queue`'s settings row until commit and reads it with the database's "now", in
    /// one statement (`SELECT … FOR UPDATE`; on MariaDB after a write of the row, its
    /// `claims` counter, so the lock holds across a Galera cluster's members); `None` if it
    /// has none.
    fn lock_settings(
        &mut self,
        queue: &str,
        bound: Option<i64>,
    ) -> impl Future<Output = QueryResult<Option<(QueueRow, i64)>>> + Send;

    /// The queue's running jobs (those holding a lease).
    fn count_running(&mut self, queue: &str) -> impl Future<Output = QueryResult<i64>> + Send;

    /// The queue's rate window as recorded: one row per recorded claim, `(clock, claimed_at,
    /// jobs)`, or one `(clock, None, None)` without any; `clock` is read as the statement
    /// runs (after the lock).
    fn read_rate_window(
        &mut self,
        queue: &str,
        bound: Option<i64>,
    ) -> impl Future<Output = QueryResult<Vec<WindowRow>>> + Send;

    /// Deletes the queue's recorded claims at or before `upto` (out of the window).
    fn forget_claims(
        &mut self,
        queue: &str,
        upto: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// The queue's running jobs per partition key (few: they hold leases).
    fn running_per_partition(
        &mut self,
        queue: &str,
    ) -> impl Future<Output = QueryResult<Vec<(String, i64)>>> + Send;

    /// The first `len` due jobs of the queue, in claim order.
    fn head(
        &mut self,
        queue: &str,
        kinds: &Kinds,
        now: i64,
        len: i64,
    ) -> impl Future<Output = QueryResult<Vec<HeadJob>>> + Send;

    /// One statement of a walk of the partitions.
    fn scan(
        &mut self,
        scan: PartitionScan<'_>,
    ) -> impl Future<Output = QueryResult<Vec<ScanRow>>> + Send;

    /// The first `n` due keyless jobs of the queue in `state`, in claim order (where the
    /// partition index holds them: [`ScanSql::keyless_indexed`]).
    fn keyless_indexed(
        &mut self,
        queue: &str,
        kinds: &Kinds,
        now: i64,
        n: i64,
        state: JobState,
    ) -> impl Future<Output = QueryResult<Vec<Keyless>>> + Send;

    /// The keyless jobs among the `partitions::KEYLESS_PAST_HEAD` due jobs after `last` in
    /// claim order.
    fn keyless_past_head(
        &mut self,
        queue: &str,
        kinds: &Kinds,
        now: i64,
        last: &HeadJob,
    ) -> impl Future<Output = QueryResult<Vec<Keyless>>> + Send;

    /// The first `n` due jobs of the queue, in claim order (no per-partition limit).
    fn due(
        &mut self,
        queue: &str,
        kinds: &Kinds,
        now: i64,
        n: i64,
    ) -> impl Future<Output = QueryResult<Vec<i64>>> + Send;

    /// Takes the jobs `ids` that are still claimable (the claim's columns, see `driver.rs`)
    /// and reads back those it took.
    fn take(
        &mut self,
        ids: Vec<i64>,
        a: &ClaimArgs,
        now: i64,
    ) -> impl Future<Output = QueryResult<Vec<ClaimRow>>> + Send;

    /// Records `n` jobs claimed at `now` in the queue's rate window.
    fn record_claim(
        &mut self,
        queue: &str,
        now: i64,
        n: i32,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
}

/// [`ClaimSteps`] for one backend's connection type: the same bodies, type-checked for it.
macro_rules! claim_steps {
    ($conn:ty, $backend:ty, bump: $bump:expr) => {
        impl ClaimSteps for $conn {
            fn scan_sql(&self) -> ScanSql {
                <$backend as PartitionScanSql>::SCAN
            }

            async fn lock_settings(
                &mut self,
                queue: &str,
                bound: Option<i64>,
            ) -> QueryResult<Option<(QueueRow, i64)>> {
                if $bump {
                    // A write, not only a locking read: on a Galera cluster a row lock is the
                    // member's own, and only a write is certified against the others', so
                    // two members' claims of one queue cannot both commit (the loser is
                    // rolled back whole and claims again: `with_tx!`).
                    diesel::update(queues::table.filter(queues::name.eq(queue)))
                        .set(queues::claims.eq(queues::claims + 1))
                        .execute(self)
                        .await?;
                }
                let found: Vec<(QueueRow, i64)> = ForUpdate(
                    queues::table
                        .filter(queues::name.eq(queue))
                        .select((QueueRow::as_select(), DbNow::new(bound))),
                )
                .load(self)
                .await?;
                Ok(found.into_iter().next())
            }

            async fn count_running(&mut self, queue: &str) -> QueryResult<i64> {
                jobs::table
                    .filter(jobs::queue.eq(queue))
                    .filter(jobs::state.eq(JobState::Running.as_str()))
                    .filter(jobs::lease_expires_at.is_not_null())
                    .count()
                    .get_result(self)
                    .await
            }

            async fn read_rate_window(
                &mut self,
                queue: &str,
                bound: Option<i64>,
            ) -> QueryResult<Vec<WindowRow>> {
                queues::table
                    .filter(queues::name.eq(queue))
                    .left_join(claims_log::table.on(claims_log::queue.eq(queues::name)))
                    .select((
                        DbClock { bound },
                        claims_log::claimed_at.nullable(),
                        claims_log::jobs.nullable(),
                    ))
                    .load(self)
                    .await
            }

            async fn forget_claims(&mut self, queue: &str, upto: i64) -> QueryResult<usize> {
                diesel::delete(
                    claims_log::table
                        .filter(claims_log::queue.eq(queue))
                        .filter(claims_log::claimed_at.le(upto)),
                )
                .execute(self)
                .await
            }

            async fn running_per_partition(
                &mut self,
                queue: &str,
            ) -> QueryResult<Vec<(String, i64)>> {
                let running: Vec<(Option<String>, i64)> = jobs::table
                    .filter(jobs::queue.eq(queue))
                    .filter(jobs::state.eq(JobState::Running.as_str()))
                    .filter(jobs::lease_expires_at.is_not_null())
                    .filter(jobs::partition_key.is_not_null())
                    .group_by(jobs::partition_key)
                    .select((jobs::partition_key, count_star()))
                    .load(self)
                    .await?;
                Ok(running
                    .into_iter()
                    .filter_map(|(p, n)| Some((p?, n)))
                    .collect())
            }

            async fn head(
                &mut self,
                queue: &str,
                kinds: &Kinds,
                now: i64,
                len: i64,
            ) -> QueryResult<Vec<HeadJob>> {
                let kind_ok = kinds
                    .any
                    .into_sql::<diesel::sql_types::Bool>()
                    .or(in_list(jobs::kind, kinds.list.clone()));
                Ok(jobs::table
                    .filter(ClaimableIn(queue.to_string()))
                    .filter(kind_ok)
                    .filter(jobs::run_at.le(now))
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(len)
                    .select((jobs::id, jobs::partition_key, jobs::priority, jobs::run_at))
                    .load::<(i64, Option<String>, i32, i64)>(self)
                    .await?
                    .into_iter()
                    .map(|(id, partition, priority, run_at)| HeadJob {
                        id,
                        partition,
                        priority,
                        run_at,
                    })
                    .collect())
            }

            async fn scan(&mut self, scan: PartitionScan<'_>) -> QueryResult<Vec<ScanRow>> {
                scan.load(self).await
            }

            async fn keyless_indexed(
                &mut self,
                queue: &str,
                kinds: &Kinds,
                now: i64,
                n: i64,
                state: JobState,
            ) -> QueryResult<Vec<Keyless>> {
                let kind_ok = kinds
                    .any
                    .into_sql::<diesel::sql_types::Bool>()
                    .or(in_list(jobs::kind, kinds.list.clone()));
                jobs::table
                    .filter(jobs::queue.eq(queue))
                    .filter(jobs::state.eq(state.as_str()))
                    .filter(jobs::partition_key.is_null())
                    .filter(kind_ok)
                    .filter(jobs::run_at.le(now))
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(n)
                    .select((jobs::id, jobs::priority, jobs::run_at))
                    .load::<Keyless>(self)
                    .await
            }

            async fn keyless_past_head(
                &mut self,
                queue: &str,
                kinds: &Kinds,
                now: i64,
                last: &HeadJob,
            ) -> QueryResult<Vec<Keyless>> {
                let kind_ok = kinds
                    .any
                    .into_sql::<diesel::sql_types::Bool>()
                    .or(in_list(jobs::kind, kinds.list.clone()));
                let after_head: Vec<(i64, Option<String>, i32, i64)> = jobs::table
                    .filter(ClaimableIn(queue.to_string()))
                    .filter(kind_ok)
                    .filter(jobs::run_at.le(now))
                    .filter(
                        jobs::priority
                            .gt(last.priority)
                            .or(jobs::priority.eq(last.priority).and(
                                jobs::run_at
                                    .gt(last.run_at)
                                    .or(jobs::run_at.eq(last.run_at).and(jobs::id.gt(last.id))),
                            )),
                    )
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(super::partitions::KEYLESS_PAST_HEAD)
                    .select((jobs::id, jobs::partition_key, jobs::priority, jobs::run_at))
                    .load(self)
                    .await?;
                Ok(after_head
                    .into_iter()
                    .filter(|j| j.1.is_none())
                    .map(|(id, _, priority, run_at)| (id, priority, run_at))
                    .collect())
            }

            async fn due(
                &mut self,
                queue: &str,
                kinds: &Kinds,
                now: i64,
                n: i64,
            ) -> QueryResult<Vec<i64>> {
                let kind_ok = kinds
                    .any
                    .into_sql::<diesel::sql_types::Bool>()
                    .or(in_list(jobs::kind, kinds.list.clone()));
                jobs::table
                    .filter(ClaimableIn(queue.to_string()))
                    .filter(kind_ok)
                    .filter(jobs::run_at.le(now))
                    .order((jobs::priority.asc(), jobs::run_at.asc(), jobs::id.asc()))
                    .limit(n)
                    .select(jobs::id)
                    .load(self)
                    .await
            }

            async fn take(
                &mut self,
                ids: Vec<i64>,
                a: &ClaimArgs,
                now: i64,
            ) -> QueryResult<Vec<ClaimRow>> {
                // Diesel prepares an `UPDATE` anew each time whatever its list: `eq_any` as
                // it is.
                diesel::update(
                    jobs::table
                        .filter(jobs::id.eq_any(&ids))
                        .filter(ClaimableIn(a.queue.clone())),
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
                .execute(&mut *self)
                .await?;
                jobs::table
                    .filter(in_list(jobs::id, ids))
                    .filter(jobs::lease_token.eq(&a.token))
                    .select(ClaimRow::as_select())
                    .load(self)
                    .await
            }

            async fn record_claim(&mut self, queue: &str, now: i64, n: i32) -> QueryResult<usize> {
                diesel::insert_into(claims_log::table)
                    .values((
                        claims_log::queue.eq(queue),
                        claims_log::claimed_at.eq(now),
                        claims_log::jobs.eq(n),
                    ))
                    .execute(self)
                    .await
            }
        }
    };
}

#[cfg(feature = "postgres")]
// PostgreSQL and SQLite have one writer of a row (one primary; one writer at all): their
// locking read serializes the controlled claims.
claim_steps!(diesel_async::AsyncPgConnection, diesel::pg::Pg, bump: false);
#[cfg(feature = "mysql")]
// MariaDB may be a Galera cluster, whose row locks are member-local: the lock is a write.
claim_steps!(diesel_async::AsyncMysqlConnection, diesel::mysql::Mysql, bump: true);
#[cfg(feature = "sqlite")]
claim_steps!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
        diesel::sqlite::SqliteConnection,
        super::super::SqliteRunner,
    >,
    diesel::sqlite::Sqlite,
    bump: false
);
