//! Enqueue inside the caller's own transaction (the transactional outbox): the job commits
//! with the caller's business rows or not at all.
//!
//! [`OutboxConnection`] is implemented for each backend's diesel-async connection type and
//! sealed; [`Store::job_enqueue_in`] takes any of them.

use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};

use super::connect::SqliteConn;
use super::write::{bound, enqueue_mysql, enqueue_pg, enqueue_sqlite};
use super::{EnqueueParams, Enqueued, Store};
use crate::error::{Error, Result, StoreError};
use crate::job::NewJob;

mod sealed {
    pub trait Sealed {}
}

/// A diesel-async connection jobvisor can enqueue on: `AsyncPgConnection`,
/// `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>`. Sealed.
pub trait OutboxConnection: sealed::Sealed + Send {
    #[doc(hidden)]
    fn enqueue_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> impl std::future::Future<Output = Result<Vec<Option<Enqueued>>>> + Send;
}

impl sealed::Sealed for AsyncPgConnection {}
impl sealed::Sealed for AsyncMysqlConnection {}
impl sealed::Sealed for SqliteConn {}

impl OutboxConnection for AsyncPgConnection {
    async fn enqueue_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        _insert_returning: bool,
    ) -> Result<Vec<Option<Enqueued>>> {
        let jobs: Vec<&NewJob> = jobs.iter().collect();
        Ok(enqueue_pg(self, &jobs, now).await?)
    }
}

impl OutboxConnection for AsyncMysqlConnection {
    async fn enqueue_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> Result<Vec<Option<Enqueued>>> {
        let jobs: Vec<&NewJob> = jobs.iter().collect();
        Ok(enqueue_mysql(self, &jobs, now, insert_returning).await?)
    }
}

impl OutboxConnection for SqliteConn {
    async fn enqueue_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        _insert_returning: bool,
    ) -> Result<Vec<Option<Enqueued>>> {
        let jobs: Vec<&NewJob> = jobs.iter().collect();
        Ok(enqueue_sqlite(self, &jobs, now).await?)
    }
}

impl Store {
    /// Enqueues jobs on the caller's connection, inside whatever transaction it has open:
    /// they become visible when the caller commits and vanish if it rolls back.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field (nothing is written); [`Error::Database`]
    /// (the caller's transaction is then usually to be rolled back).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(store: jobvisor::Store, conn: &mut diesel_async::AsyncPgConnection) -> jobvisor::Result<()> {
    /// use diesel_async::AsyncConnection;
    /// use jobvisor::{EnqueueParams, NewJob};
    /// conn.transaction(async |conn| {
    ///     // ... insert the business row on `conn` ...
    ///     store.job_enqueue_in(conn, EnqueueParams::one(NewJob::new("welcome", serde_json::json!({"user": 42})))).await?;
    ///     Ok::<_, jobvisor::Error>(())
    /// }).await
    /// # }
    /// ```
    pub async fn job_enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        p: EnqueueParams,
    ) -> Result<Vec<Enqueued>> {
        self.validate_jobs(&p.jobs)?;
        if p.jobs.is_empty() {
            return Ok(Vec::new());
        }
        let got = conn
            .enqueue_on(&p.jobs, bound(p.now), self.inner.insert_returning)
            .await?;
        got.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
            Error::Database(StoreError::Transient(
                "a duplicate job vanished while enqueueing in a transaction; try again".into(),
            ))
        })
    }
}
