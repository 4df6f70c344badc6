//! Enqueue inside the caller's own transaction (the transactional outbox): the job commits
//! with the caller's business rows or not at all.
//!
//! [`OutboxConnection`] is implemented for each backend's diesel-async connection type, and
//! for the same connections checked out of a bb8 pool (diesel-async's `bb8` pools) or a
//! deadpool pool (feature `deadpool`); it is sealed. [`Store::job_enqueue_in`] takes any of
//! them, and refuses a connection to another kind of database than the store's.

#[cfg(feature = "mysql")]
use diesel_async::AsyncMysqlConnection;
#[cfg(feature = "postgres")]
use diesel_async::AsyncPgConnection;

use super::columns::bound;
use super::driver::BackendConnection;
#[cfg(feature = "sqlite")]
use diesel::sqlite::SqliteConnection;
#[cfg(feature = "sqlite")]
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

/// An application's SQLite connection, as diesel-async makes it by default.
#[cfg(feature = "sqlite")]
type UserSqliteConn = SyncConnectionWrapper<SqliteConnection>;
use super::{Backend, EnqueueParams, Enqueued, Store};
use crate::error::{Error, Result, StoreError};
use crate::job::NewJob;

mod sealed {
    pub trait Sealed {}
}

/// A diesel-async connection jobvisor can enqueue on: `AsyncPgConnection`,
/// `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>` — owned, or checked
/// out of a pool: `diesel_async::pooled_connection::bb8::PooledConnection<'_, C>` and, with
/// the feature `deadpool`, `diesel_async::pooled_connection::deadpool::Object<C>`. Sealed.
///
/// # Examples
/// ```no_run
/// # async fn demo(
/// #     client: jobvisor::Client,
/// #     pool: diesel_async::pooled_connection::bb8::Pool<diesel_async::AsyncPgConnection>,
/// # ) -> jobvisor::Result<()> {
/// let mut conn = pool.get().await.expect("a connection");
/// client
///     .enqueue_in(&mut conn, vec![jobvisor::NewJob::new("welcome", serde_json::json!({}))])
///     .await?;
/// # Ok(()) }
/// ```
pub trait OutboxConnection: sealed::Sealed + Send {
    /// The kind of database the connection talks to.
    #[doc(hidden)]
    fn backend(&self) -> Backend;

    #[doc(hidden)]
    fn enqueue_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> impl std::future::Future<Output = Result<Vec<Option<Enqueued>>>> + Send;

    /// Enqueues jobs of which some name parents (see `enqueue_dependent_on` in
    /// `dependencies.rs`): ids in input order, and the queues due at once.
    #[doc(hidden)]
    fn enqueue_dependent_on(
        &mut self,
        jobs: &[NewJob],
        now: Option<i64>,
        insert_returning: bool,
    ) -> impl std::future::Future<Output = Result<(Vec<Enqueued>, Vec<String>)>> + Send;
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for AsyncPgConnection {}
#[cfg(feature = "mysql")]
impl sealed::Sealed for AsyncMysqlConnection {}
#[cfg(feature = "sqlite")]
impl<S> sealed::Sealed for SyncConnectionWrapper<SqliteConnection, S> {}

/// `OutboxConnection` for a backend's connection type: its enqueue is the seam's
/// ([`BackendConnection`]), its enqueue after parents `dependencies.rs`'s for that type.
macro_rules! outbox_connection {
    ($(#[$attr:meta])* $conn:ty, $dependent:path $(, <$s:ident> where $($w:tt)+)?) => {
        $(#[$attr])*
        impl$(<$s>)? OutboxConnection for $conn
        $(where $($w)+)?
        {
            fn backend(&self) -> Backend {
                <Self as BackendConnection>::BACKEND
            }

            async fn enqueue_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> Result<Vec<Option<Enqueued>>> {
                let jobs: Vec<&NewJob> = jobs.iter().collect();
                Ok(self.enqueue_batch(&jobs, now, insert_returning).await?)
            }

            async fn enqueue_dependent_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> Result<(Vec<Enqueued>, Vec<String>)> {
                $dependent(self, jobs, now, insert_returning).await
            }
        }
    };
}

outbox_connection!(
    #[cfg(feature = "postgres")]
    AsyncPgConnection,
    super::dependencies::enqueue_dependent_pg
);
outbox_connection!(
    #[cfg(feature = "mysql")]
    AsyncMysqlConnection,
    super::dependencies::enqueue_dependent_mysql
);
// An application's SQLite connection (diesel-async's default), and the store's own.
outbox_connection!(
    #[cfg(feature = "sqlite")]
    SyncConnectionWrapper<SqliteConnection, S>,
    super::dependencies::enqueue_dependent_sqlite,
    <S> where Self: BackendConnection + diesel_async::AsyncConnection<Backend = diesel::sqlite::Sqlite>
);

/// `OutboxConnection` for a backend's connection checked out of a pool — bb8's, and
/// deadpool's with the feature `deadpool` — by delegating to the connection it holds.
macro_rules! pooled_outbox {
    ($feature:literal, $conn:ty) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for diesel_async::pooled_connection::bb8::PooledConnection<'_, $conn> {}

        #[cfg(feature = $feature)]
        impl OutboxConnection
            for diesel_async::pooled_connection::bb8::PooledConnection<'_, $conn>
        {
            fn backend(&self) -> Backend {
                (**self).backend()
            }

            fn enqueue_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> impl std::future::Future<Output = Result<Vec<Option<Enqueued>>>> + Send {
                (**self).enqueue_on(jobs, now, insert_returning)
            }

            fn enqueue_dependent_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> impl std::future::Future<Output = Result<(Vec<Enqueued>, Vec<String>)>> + Send
            {
                (**self).enqueue_dependent_on(jobs, now, insert_returning)
            }
        }

        #[cfg(all(feature = $feature, feature = "deadpool"))]
        impl sealed::Sealed for diesel_async::pooled_connection::deadpool::Object<$conn> {}

        #[cfg(all(feature = $feature, feature = "deadpool"))]
        impl OutboxConnection for diesel_async::pooled_connection::deadpool::Object<$conn> {
            fn backend(&self) -> Backend {
                (**self).backend()
            }

            fn enqueue_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> impl std::future::Future<Output = Result<Vec<Option<Enqueued>>>> + Send {
                (**self).enqueue_on(jobs, now, insert_returning)
            }

            fn enqueue_dependent_on(
                &mut self,
                jobs: &[NewJob],
                now: Option<i64>,
                insert_returning: bool,
            ) -> impl std::future::Future<Output = Result<(Vec<Enqueued>, Vec<String>)>> + Send
            {
                (**self).enqueue_dependent_on(jobs, now, insert_returning)
            }
        }
    };
}

pooled_outbox!("postgres", AsyncPgConnection);
pooled_outbox!("mysql", AsyncMysqlConnection);
pooled_outbox!("sqlite", UserSqliteConn);

impl Store {
    /// MariaDB 10.6+: `INSERT … RETURNING` (see the `mysql` module).
    pub(super) fn insert_returning(&self) -> bool {
        self.inner.driver.insert_returning()
    }

    /// Enqueues jobs on the caller's connection, inside whatever transaction it has open:
    /// they become visible when the caller commits and vanish if it rolls back.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field, or `conn` when it talks to another kind
    /// of database than the store (nothing is written); [`Error::Database`] (the caller's
    /// transaction is then usually to be rolled back).
    pub(crate) async fn job_enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        p: EnqueueParams,
    ) -> Result<Vec<Enqueued>> {
        let (got, want) = (conn.backend(), self.backend());
        if got != want {
            return Err(Error::invalid(
                "conn",
                format!(
                    "a {got:?} connection was given to a store on {want:?}; expected a \
                     connection to the store's own database (jobs enqueued elsewhere would \
                     never be seen)"
                ),
            ));
        }
        self.validate_jobs(&p.jobs)?;
        if p.jobs.is_empty() {
            return Ok(Vec::new());
        }
        if p.jobs.iter().any(NewJob::needs_links) {
            // As `Client::enqueue` does it, in the caller's transaction: the parents locked
            // and flagged, the edges written, the child's state set from theirs — committed
            // or rolled back with the caller's rows. The jobs due at once are not woken: they
            // become visible only at the caller's commit, when the insert's notice (or the
            // poll) does it.
            let (out, _due) = conn
                .enqueue_dependent_on(&p.jobs, bound(p.now), self.insert_returning())
                .await?;
            return Ok(out);
        }
        let got = conn
            .enqueue_on(&p.jobs, bound(p.now), self.insert_returning())
            .await?;
        got.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
            Error::Database(StoreError::Transient(
                "a duplicate job vanished while enqueueing in a transaction; try again".into(),
            ))
        })
    }
}
