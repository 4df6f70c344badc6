//! Wakes: how a transition that makes a job due now **without a new id** reaches the nodes
//! of other processes at once.
//!
//! A new job needs nothing: on PostgreSQL its insert trigger notifies (the store's own
//! inserts are announced right after their commit instead: `postgres/after_commit.rs`), and on MariaDB and
//! SQLite its id moves the change signal every node reads each 80 ms
//! ([`Store::change_signal`](crate::store::Store::change_signal)). A job that becomes due by an
//! `UPDATE` moves neither, and would wait for another process's poll. The transitions that
//! do so announce it inside their own transaction with [`announce_due`]:
//! * a dependency child released (`waiting` → `pending`) by its last parent's settle
//!   (`Store::job_settle_children`);
//! * a job retried by hand (`Client::retry`, the dashboard);
//! * a reclaimed job given back due now (an attempt refunded: the lease expired before its
//!   start was recorded).
//!
//! How each backend announces, in its own module ([`AnnounceDue`], implemented on its diesel
//! backend type, so the connection's type picks the SQL and no branch is needed here):
//! * PostgreSQL: `pg_notify('jobvisor_jobs', queue)` once per queue, delivered at commit like
//!   the insert trigger's, so every node serving the queue wakes that fetcher. No row trigger
//!   does it: an `AFTER UPDATE` row trigger on the jobs, even one whose `WHEN` is false,
//!   fetches the old row again at every claim and finalize (migration 000023 dropped the one
//!   a release had);
//! * MariaDB/MySQL and SQLite: `jobvisor_wakes.n + 1` (one row), which the change signal reads
//!   in its one statement: a node that sees it move wakes its idle fetchers, as it does for a
//!   newer job id.
//!
//! A cancel of a running job is announced the same way ([`announce_cancel`]), on a channel of
//! its own on PostgreSQL (`jobvisor_cancel`, the job's id): its node renews its leases at once
//! and the renewal's answer signals the handler, where the heartbeat would have taken up to
//! its interval.
//!
//! A job's end is announced to whoever waits on it ([`announce_done`]; PostgreSQL only, on
//! `jobvisor_done`, and only for jobs with a registered wait: `store/waits.rs`).
//!
//! The counter is written last in its transaction (its row lock is held only until the
//! commit), and never by an ordinary enqueue, claim or finalize: the hot path is unchanged.

use diesel::QueryResult;
use diesel_async::AsyncConnection;

/// How one backend announces jobs made due without a new id: implemented by each backend
/// module on its diesel backend type (see the module docs).
pub(crate) trait AnnounceDue: diesel::backend::Backend + Sized {
    /// Announces, inside the transaction open on `conn`, that jobs of `queues` (not empty)
    /// became due now.
    async fn announce_due<C>(conn: &mut C, queues: &[String]) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self> + Send;

    /// Announces, inside the transaction open on `conn`, that running job `job` was asked to
    /// cancel, so its node signals the handler at once rather than at its next heartbeat.
    async fn announce_cancel<C>(conn: &mut C, job: i64) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self> + Send;

    /// Announces, on `conn` (delivered at commit), that `jobs` (not empty) ended, to whoever
    /// waits on them: PostgreSQL only, where waits listen; nothing elsewhere, where they poll.
    async fn announce_done<C>(conn: &mut C, jobs: &[i64]) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self> + Send;
}

/// Announces, on `conn`, after the statement that ended `jobs` (nothing for an empty list),
/// that they ended (see [`AnnounceDue::announce_done`] and `store/waits.rs`): a cancel of a
/// job that was not running, a completion in the handler's transaction, a lease reclaimed
/// past its attempts. A finalize batch announces its own in its statement.
pub(crate) async fn announce_done<C>(conn: &mut C, jobs: &[i64]) -> QueryResult<()>
where
    C: AsyncConnection + Send,
    C::Backend: AnnounceDue,
{
    if jobs.is_empty() {
        return Ok(());
    }
    <C::Backend as AnnounceDue>::announce_done(conn, jobs).await
}

/// Announces, inside the transaction open on `conn`, that running job `job` was asked to
/// cancel (PostgreSQL: a notification on `jobvisor_cancel` with its id; MariaDB and SQLite:
/// the wake counter, on which each node with leases renews them at once and so learns of it).
pub(crate) async fn announce_cancel<C>(conn: &mut C, job: i64) -> QueryResult<()>
where
    C: AsyncConnection + Send,
    C::Backend: AnnounceDue,
{
    <C::Backend as AnnounceDue>::announce_cancel(conn, job).await
}

/// Announces, inside the transaction open on `conn`, that jobs of `queues` became due now
/// (nothing for an empty list): a released dependency child, a retry by hand, a refunded
/// reclaim.
pub(crate) async fn announce_due<C>(conn: &mut C, queues: &[String]) -> QueryResult<()>
where
    C: AsyncConnection + Send,
    C::Backend: AnnounceDue,
{
    if queues.is_empty() {
        return Ok(());
    }
    <C::Backend as AnnounceDue>::announce_due(conn, queues).await
}

/// `AnnounceDue` by bumping the one-row counter the change signal reads (MariaDB, SQLite):
/// for a due job, and for a cancel too — every node's change signal moves, and a node with
/// leases renews them at once.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! announce_by_counter {
    ($backend:ty) => {
        impl $crate::store::wakes::AnnounceDue for $backend {
            async fn announce_due<C>(conn: &mut C, _: &[String]) -> diesel::QueryResult<()>
            where
                C: diesel_async::AsyncConnection<Backend = Self> + Send,
            {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                use $crate::store::schema::jobvisor_wakes as wakes;
                diesel::update(wakes::table)
                    .set(wakes::n.eq(wakes::n + 1))
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn announce_cancel<C>(conn: &mut C, _: i64) -> diesel::QueryResult<()>
            where
                C: diesel_async::AsyncConnection<Backend = Self> + Send,
            {
                Self::announce_due(conn, &[]).await
            }

            /// Nothing: waits poll on this backend.
            async fn announce_done<C>(_: &mut C, _: &[i64]) -> diesel::QueryResult<()>
            where
                C: diesel_async::AsyncConnection<Backend = Self> + Send,
            {
                Ok(())
            }
        }
    };
}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use announce_by_counter;
