//! Ordered sequences ([`NewJob::sequence`](crate::NewJob::sequence)), written once for every
//! backend with diesel's query builder: the append of a new job to its key's sequence (in
//! the enqueue's transaction, from `dependencies.rs`'s enqueue), and the pruning of a key
//! whose last job was archived. What a member waits for, and what a failed member does to
//! the next, is the dependency code's: the new job gets an edge to the tail it read.
//!
//! **Why commit order is enqueue order.** The append's first statement is an `UPDATE` of
//! the key's row (`prev_job_id = last_job_id, last_job_id = <new id>`), which locks it until
//! commit: a second enqueuer of the key waits there and then reads the first one's job as
//! its tail (each statement under READ COMMITTED sees what committed before it; SQLite's
//! writer lock serializes whole transactions). The old tail is read back from `prev_job_id`,
//! a column this transaction just wrote, so no isolation level can show it a stale one. The
//! first enqueue of a key inserts its row in a savepoint; a racing first enqueue that loses
//! the insert rolls the savepoint back and updates the winner's row.
//!
//! **Why the tail's end is never missed.** The tail is then locked and flagged
//! (`has_children`) before its state is read, as every parent is (`dependencies.rs`): a tail
//! that ends concurrently either committed its end first (read here: no wait) or reads the
//! flag and settles the new job.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::with_conn;
use super::schema::jobvisor_sequences as seqs;
use super::Store;
use crate::error::Result;

/// Appends job `$id` to the sequence `$key` on `$conn` (in its open transaction): returns
/// the previous tail's id and state if that job is live and has not succeeded (the new job
/// must wait for it), `None` if the sequence was empty or its tail is archived or succeeded.
macro_rules! sequence_append {
    ($conn:ident, $key:expr, $id:expr) => {{
        use $crate::store::schema::{
            jobvisor_jobs as sq_jobs, jobvisor_jobs_links as sq_links, jobvisor_sequences as sq,
        };
        let key: &str = $key;
        let id: i64 = $id;
        // The member keeps its key on its own row, for reads (`Job::sequence`).
        diesel::update(sq_jobs::table.filter(sq_jobs::id.eq(id)))
            .set($crate::store::rows::JobsSequenceKey.eq(Some(key)))
            .execute($conn)
            .await?;
        let moved = diesel::update(sq::table.filter(sq::sequence_key.eq(key)))
            .set((
                sq::prev_job_id.eq(sq::last_job_id.nullable()),
                sq::last_job_id.eq(id),
            ))
            .execute($conn)
            .await?;
        let mut first = false;
        if moved == 0 {
            // The key's first job: insert its row in a savepoint, so that losing a race with
            // another first enqueue (a unique violation aborts a PostgreSQL transaction)
            // leaves this transaction usable for the update of the winner's row.
            $crate::store::sequences::savepoint($conn).await?;
            let inserted = diesel::insert_into(sq::table)
                .values((sq::sequence_key.eq(key), sq::last_job_id.eq(id)))
                .execute($conn)
                .await;
            match inserted {
                Ok(_) => {
                    $crate::store::sequences::release($conn).await?;
                    first = true;
                }
                Err(diesel::result::Error::DatabaseError(
                    diesel::result::DatabaseErrorKind::UniqueViolation,
                    _,
                )) => {
                    $crate::store::sequences::roll_back($conn).await?;
                    diesel::update(sq::table.filter(sq::sequence_key.eq(key)))
                        .set((
                            sq::prev_job_id.eq(sq::last_job_id.nullable()),
                            sq::last_job_id.eq(id),
                        ))
                        .execute($conn)
                        .await?;
                }
                Err(e) => {
                    let _ = $crate::store::sequences::roll_back($conn).await;
                    return Err(e.into());
                }
            }
        }
        let prev: Option<i64> = if first {
            None
        } else {
            sq::table
                .filter(sq::sequence_key.eq(key))
                .select(sq::prev_job_id)
                .first::<Option<i64>>($conn)
                .await?
        };
        let gated = !$crate::store::mutation::on($crate::store::mutation::Mutation::SequenceGate);
        match prev.filter(|_| gated) {
            None => None,
            Some(tail) => {
                // Lock and flag first, read after: a tail that ends later sees the flag.
                diesel::update(sq_links::table.filter(sq_links::id.eq(tail)))
                    .set(sq_links::has_children.eq(true))
                    .execute($conn)
                    .await?;
                let state: Option<String> = sq_jobs::table
                    .filter(sq_jobs::id.eq(tail))
                    .select(sq_jobs::state)
                    .first($conn)
                    .await
                    .optional()?;
                state
                    .filter(|s| s != $crate::job::JobState::Succeeded.as_str())
                    .map(|s| (tail, s))
            }
        }
    }};
}

pub(crate) use sequence_append;

/// Opens a savepoint on `conn` (inside its open transaction).
pub(crate) async fn savepoint<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    <C::TransactionManager as diesel_async::TransactionManager<C>>::begin_transaction(conn).await
}

/// Releases the savepoint [`savepoint`] opened.
pub(crate) async fn release<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    <C::TransactionManager as diesel_async::TransactionManager<C>>::commit_transaction(conn).await
}

/// Rolls back to the savepoint [`savepoint`] opened.
pub(crate) async fn roll_back<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    <C::TransactionManager as diesel_async::TransactionManager<C>>::rollback_transaction(conn).await
}

impl Store {
    /// Deletes the sequence rows whose last job is among `archived` (jobs just moved to the
    /// archive): an empty sequence needs no row, and its next job finds none and runs. An
    /// enqueue that made one of them its tail's predecessor in the meantime has moved
    /// `last_job_id` on, so its row stays.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn sequence_prune(&self, archived: &[i64]) -> Result<usize> {
        let mut n = 0;
        for chunk in archived.chunks(1000) {
            n += with_conn!(self, |conn| diesel::delete(
                seqs::table.filter(seqs::last_job_id.eq_any(chunk))
            )
            .execute(conn)
            .await?);
        }
        Ok(n)
    }

    /// The last job enqueued in sequence `key`, if its row is kept.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))] // the conformance cases
    pub(crate) async fn sequence_last(&self, key: &str) -> Result<Option<i64>> {
        Ok(with_conn!(self, |conn| seqs::table
            .filter(seqs::sequence_key.eq(key))
            .select(seqs::last_job_id)
            .first::<i64>(conn)
            .await
            .optional()?))
    }
}
