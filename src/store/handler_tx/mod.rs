//! [`JobConnection`]: the connection a handler's transaction runs on
//! ([`JobContext::transaction`](crate::JobContext::transaction)), one of the store's own,
//! checked out of its pool — and the statements that transaction adds to the user's: the
//! lease guard, the completion, and the effect records.
//!
//! It is sealed and implemented for each backend's connection type: `AsyncPgConnection`,
//! `AsyncMysqlConnection`, and the store's SQLite connection (`SqliteJobConnection`). The
//! statements that are the same on every backend are written once here with diesel's query
//! builder (each type-checked once per backend by the macros below); those that differ — how
//! a transaction begins on SQLite, how an effect insert meets a duplicate key — are the
//! backend modules' (`postgres`, `mysql`, `sqlite`), reached through the seam's accessors.
//!
//! What each statement guarantees:
//! * **hold** — `SELECT id … WHERE id = ? AND lease_token = ? AND state = 'running' FOR
//!   UPDATE` (plain on SQLite, whose `BEGIN IMMEDIATE` is already the only writer): the
//!   attempt still holds its lease, and nobody can take it (reclaim, give-back, finalize)
//!   before this transaction ends.
//! * **complete** — the same guard on an `UPDATE` writing what a batched finalization writes
//!   for a success (see `driver.rs`): `succeeded`, the result, `last_error` cleared,
//!   `finished_at`, the lease columns and `timeout_at` cleared, `version + 1`, `started_at` /
//!   `first_started_at` where unset, and the `while_active` key released.
//! * **effect insert** — `(job_id, effect_key)` is the primary key: of concurrent inserts of
//!   one key exactly one inserts, the others wait for its transaction and then find it (or,
//!   if it rolled back, one of them inserts).

use std::future::Future;
use std::ops::DerefMut;

use diesel::result::QueryResult;
use serde_json::Value;

use super::driver::{BackendConnection, HandlerConnection};
use super::params::NewEffect;
use super::{Backend, OutboxConnection, Store};
use crate::error::{Error, Result};
pub(crate) mod effects;

use effects::Effect;

mod sealed {
    pub trait Sealed {}
}

/// The store's SQLite connection type, for [`JobContext::transaction`]'s type parameter on
/// SQLite (on PostgreSQL and MySQL it is diesel-async's `AsyncPgConnection` and
/// `AsyncMysqlConnection`). It is diesel-async's `SyncConnectionWrapper<SqliteConnection>`
/// with the store's own runner for blocking calls: diesel-async queries run on it as on any
/// SQLite connection.
///
/// [`JobContext::transaction`]: crate::JobContext::transaction
#[cfg(feature = "sqlite")]
pub type SqliteJobConnection = super::driver::SqliteConn;

/// A connection of the job's store that a handler's transaction runs on:
/// `diesel_async::AsyncPgConnection`, `diesel_async::AsyncMysqlConnection` or
/// `jobvisor::SqliteJobConnection` (feature `sqlite`) — the one of the store's backend. Sealed; the methods are
/// jobvisor's own.
pub trait JobConnection:
    OutboxConnection + diesel_async::AsyncConnection + sealed::Sealed + Send + 'static
{
    /// Checks a connection out of the store's pool (on SQLite with the writer lock).
    #[doc(hidden)]
    fn checkout(
        store: &Store,
    ) -> impl Future<Output = Result<Box<dyn DerefMut<Target = Self> + Send + '_>>> + Send;

    /// Whether the store's transactions on this connection type run guarded (a Galera
    /// member: `mysql/galera_guard.rs`), to pass to `begin`, `commit` and `rollback`.
    #[doc(hidden)]
    fn guarded(store: &Store) -> bool;

    /// `BEGIN` (SQLite: `BEGIN IMMEDIATE`; guarded on a Galera member).
    #[doc(hidden)]
    fn begin(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// `COMMIT`.
    #[doc(hidden)]
    fn commit(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// `ROLLBACK`.
    #[doc(hidden)]
    fn rollback(&mut self, guarded: bool) -> impl Future<Output = QueryResult<()>> + Send;

    /// The lease guard (see the module doc): true while the attempt holds the lease.
    #[doc(hidden)]
    fn hold_lease(
        &mut self,
        id: i64,
        token: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// The guarded completion (see the module doc): true if it was applied.
    #[doc(hidden)]
    fn complete_job(&mut self, c: &Completion) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Inserts an effect record unless its key is recorded: true if inserted.
    #[doc(hidden)]
    fn insert_effect(&mut self, e: &NewEffect) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Reads one effect record.
    #[doc(hidden)]
    fn read_effect(
        &mut self,
        id: i64,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<Effect>>> + Send;
}

/// What a guarded completion writes (see the module doc).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Completion {
    /// The job.
    pub(crate) id: i64,
    /// The attempt's lease token (the guard).
    pub(crate) token: String,
    /// The job's result.
    pub(crate) result: Value,
    /// How long ago the handler started (µs), for a start no renewal recorded yet.
    pub(crate) started_ago_us: Option<i64>,
    /// The bound test-clock instant (µs), or `None` for the database's clock.
    pub(crate) now: Option<i64>,
}

/// The lease guard, once for every backend (see the module doc).
macro_rules! hold_lease {
    ($conn:expr, $id:expr, $token:expr) => {{
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use $crate::store::expr::{ForUpdate, RUNNING};
        use $crate::store::schema::jobvisor_jobs as jobs;
        let found: Option<i64> = ForUpdate(
            jobs::table
                .select(jobs::id)
                .filter(jobs::id.eq($id))
                .filter(jobs::lease_token.eq($token))
                .filter(RUNNING),
        )
        .get_result($conn)
        .await
        .optional()?;
        Ok(found.is_some())
    }};
}

/// The guarded completion, once for every backend (see the module doc).
macro_rules! complete_job {
    ($conn:expr, $c:expr) => {{
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use $crate::store::expr::{DbNow, KeepOrNowMinus, ReleaseHold, RUNNING};
        use $crate::store::schema::jobvisor_jobs as jobs;
        let c: &$crate::store::handler_tx::Completion = $c;
        let now = DbNow::new(c.now);
        let started = KeepOrNowMinus {
            column: "started_at",
            bound: c.now,
            ago_us: c.started_ago_us,
        };
        let first = KeepOrNowMinus {
            column: "first_started_at",
            ..started
        };
        // The claim as the row holds it (locked by the lease guard), for the execution
        // ledger's row of this end (`store::ledger`).
        let held: Option<(i32, Option<String>, i64, Option<i64>, i64)> = jobs::table
            .select((
                jobs::attempts,
                jobs::lease_owner,
                jobs::updated_at,
                jobs::started_at,
                now,
            ))
            .filter(jobs::id.eq(c.id))
            .filter(jobs::lease_token.eq(&c.token))
            .filter(RUNNING)
            .get_result($conn)
            .await
            .optional()?;
        let n = diesel::update(
            jobs::table
                .filter(jobs::id.eq(c.id))
                .filter(jobs::lease_token.eq(&c.token))
                .filter(RUNNING),
        )
        .set((
            jobs::state.eq($crate::job::JobState::Succeeded.as_str()),
            jobs::result.eq(Some(&c.result)),
            jobs::last_error.eq(None::<serde_json::Value>),
            jobs::finished_at.eq(now.nullable()),
            jobs::started_at.eq(started),
            jobs::first_started_at.eq(first),
            jobs::lease_owner.eq(None::<String>),
            jobs::lease_token.eq(None::<String>),
            jobs::lease_expires_at.eq(None::<i64>),
            jobs::heartbeat_at.eq(None::<i64>),
            jobs::timeout_at.eq(None::<i64>),
            jobs::version.eq(jobs::version + 1),
            jobs::updated_at.eq(now),
            jobs::unique_hold.eq(ReleaseHold(true)),
        ))
        .execute($conn)
        .await?;
        let claim = $crate::lease::ClaimId::of_token(&c.token);
        if let (1, Some((attempt, Some(node), claimed_at, started_at, at)), Some(claim)) =
            (n, held, claim)
        {
            let row = $crate::store::ledger::LedgerRow {
                job_id: c.id,
                claim_id: claim.to_string(),
                attempt,
                node,
                claimed_at,
                started_at: started_at
                    .or_else(|| c.started_ago_us.map(|ago| at.saturating_sub(ago))),
                ended_at: at,
                outcome: $crate::claim::ClaimOutcome::Succeeded.as_str(),
                code: None,
                fence_margin_ms: None,
            };
            diesel::insert_into($crate::store::schema::jobvisor_claims::table)
                .values(&row)
                .execute($conn)
                .await?;
        }
        if n == 1 {
            // To whoever waits on it, at the transaction's commit (`store::waits`); no
            // statement on the backends whose waits poll.
            $crate::store::wakes::announce_done($conn, &[c.id]).await?;
        }
        Ok(n == 1)
    }};
}

/// One effect record, once for every backend.
macro_rules! read_effect {
    ($conn:expr, $id:expr, $key:expr) => {{
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use $crate::store::schema::jobvisor_effects as effects;
        let row: Option<(String, Option<serde_json::Value>, String, i64)> = effects::table
            .select((
                effects::effect_key,
                effects::detail,
                effects::claim,
                effects::recorded_at,
            ))
            .filter(effects::job_id.eq($id))
            .filter(effects::effect_key.eq($key))
            .get_result($conn)
            .await
            .optional()?;
        Ok(row.map($crate::store::effects::Effect::from_row))
    }};
}

/// `JobConnection` for a backend's connection type: what differs per backend through the
/// seam ([`HandlerConnection`]: checkout, `BEGIN`, the effect insert), the rest written once
/// above.
macro_rules! job_connection {
    ($feature:literal, $conn:ty) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $conn {}

        #[cfg(feature = $feature)]
        impl JobConnection for $conn {
            async fn checkout(
                store: &Store,
            ) -> Result<Box<dyn DerefMut<Target = Self> + Send + '_>> {
                match <$conn as HandlerConnection>::checkout(&store.inner.driver).await {
                    Some(conn) => conn,
                    None => Err(wrong_connection(
                        store,
                        <$conn as BackendConnection>::BACKEND,
                    )),
                }
            }

            fn guarded(store: &Store) -> bool {
                <$conn as HandlerConnection>::guarded(&store.inner.driver)
            }

            async fn begin(&mut self, guarded: bool) -> QueryResult<()> {
                HandlerConnection::begin(self, guarded).await
            }

            async fn commit(&mut self, guarded: bool) -> QueryResult<()> {
                HandlerConnection::commit(self, guarded).await
            }

            async fn rollback(&mut self, guarded: bool) -> QueryResult<()> {
                HandlerConnection::rollback(self, guarded).await
            }

            async fn hold_lease(&mut self, id: i64, token: &str) -> QueryResult<bool> {
                hold_lease!(self, id, token)
            }

            async fn complete_job(&mut self, c: &Completion) -> QueryResult<bool> {
                complete_job!(self, c)
            }

            async fn insert_effect(&mut self, e: &NewEffect) -> QueryResult<bool> {
                HandlerConnection::insert_effect(self, e).await
            }

            async fn read_effect(&mut self, id: i64, key: &str) -> QueryResult<Option<Effect>> {
                read_effect!(self, id, key)
            }
        }
    };
}

job_connection!("postgres", diesel_async::AsyncPgConnection);
job_connection!("mysql", diesel_async::AsyncMysqlConnection);
job_connection!("sqlite", SqliteJobConnection);

/// A transaction asked for on a connection type of another backend than the store's.
fn wrong_connection(store: &Store, asked: Backend) -> Error {
    Error::invalid(
        "connection type",
        format!(
            "a transaction on a {asked:?} connection was asked of a store on {:?}; expected \
             the connection type of the store's backend (AsyncPgConnection, \
             AsyncMysqlConnection or jobvisor::SqliteJobConnection)",
            store.backend()
        ),
    )
}
