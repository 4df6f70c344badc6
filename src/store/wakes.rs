//! Wakes: how a transition that makes a job due now **without a new id** reaches the nodes
//! of other processes at once.
//!
//! A new job needs nothing: on PostgreSQL its insert trigger notifies, and on MariaDB and
//! SQLite its id moves the change signal every node reads each 50 ms
//! ([`Store::change_signal`](super::Store::change_signal)). A job that becomes due by an
//! `UPDATE` moves neither, and would wait for another process's poll. The transitions that
//! do so announce it inside their own transaction with [`announce_due!`]:
//! * a dependency child released (`waiting` → `pending`) by its last parent's settle;
//! * a job retried by hand (`Client::retry`, the dashboard);
//! * a reclaimed job given back due now (an attempt refunded: the lease expired before its
//!   start was recorded).
//!
//! How each backend announces:
//! * PostgreSQL: `pg_notify('jobvisor_jobs', queue)` once per queue, delivered at commit like
//!   the insert trigger's, so every node serving the queue wakes that fetcher. A released
//!   child needs no call: the trigger on `waiting` → `pending` (`jobvisor_jobs_notify_release`)
//!   notifies already; a retry and a refunded reclaim have no trigger and call it;
//! * MariaDB/MySQL and SQLite: `jobvisor_wakes.n + 1` (one row), which the change signal reads
//!   in its one statement: a node that sees it move wakes its idle fetchers, as it does for a
//!   newer job id.
//!
//! The counter is written last in its transaction (its row lock is held only until the
//! commit), and never by an ordinary enqueue, claim or finalize: the hot path is unchanged.

/// Announces, inside the transaction open on `$conn`, that jobs of `$queues` became due now
/// (nothing for an empty list). `$notifies`: the store's backend has notifications
/// (PostgreSQL). Evaluates to `()`; a database error returns from the enclosing body.
macro_rules! announce_due {
    ($conn:ident, $notifies:expr, $queues:expr) => {{
        let queues: &[String] = $queues;
        if !queues.is_empty() {
            if $notifies {
                let mut told: Vec<&str> = Vec::with_capacity(1);
                for q in queues {
                    if told.contains(&q.as_str()) {
                        continue;
                    }
                    told.push(q.as_str());
                    // The channel the insert trigger notifies and every listener follows.
                    diesel::sql_query("SELECT pg_notify('jobvisor_jobs', $1)")
                        .bind::<diesel::sql_types::Text, _>(q.as_str())
                        .execute($conn)
                        .await?;
                }
            } else {
                use $crate::store::schema::jobvisor_wakes as wakes;
                diesel::update(wakes::table)
                    .set(wakes::n.eq(wakes::n + 1))
                    .execute($conn)
                    .await?;
            }
        }
    }};
}

pub(crate) use announce_due;
