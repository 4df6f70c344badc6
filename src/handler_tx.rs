//! A handler's own transaction on the job's store: [`JobContext::transaction`],
//! [`JobContext::complete_in_transaction`], the [`JobTx`] the body receives (the connection,
//! effect records, follow-up jobs) and the [`TxError`] it can end with.
//!
//! Every such transaction is **fenced by the attempt's lease**: just before `COMMIT` it
//! presents the attempt's lease token in SQL (`… WHERE id = ? AND lease_token = ? AND state
//! = 'running'`, locking the job's row until the commit), and the node refuses the commit
//! locally as well once the attempt's fence point has passed. If the lease was lost —
//! reclaimed after expiring, fenced, cancelled and given back — everything the body wrote
//! rolls back and the handler gets [`TxError::LeaseLost`]. So a zombie's business writes
//! never commit. [`complete_in_transaction`](JobContext::complete_in_transaction) goes one
//! step further: the guard is the job's completion itself, so a committed business write
//! always has its job `succeeded`, and a job `succeeded` this way always has its writes.
//!
//! The store and its statements are `store::handler_tx`'s; how the runtime treats an attempt
//! whose transaction is committing, or completed its job, is `scheduler::attempt`'s.

use std::fmt;
use std::future::Future;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::handler::{JobContext, JobError, JobOutcome};
use crate::job::{JobId, NewJob};
use crate::lease::ClaimId;
use crate::scheduler::Attempt;
use crate::store::{
    Completion, Effect, EnqueueParams, Enqueued, JobConnection, NewEffect, Recorded, Store,
};

/// The transaction a handler's body runs in: [`conn`](JobTx::conn) for its own diesel-async
/// statements, effect records, and follow-up jobs that commit with it. Given by
/// [`JobContext::transaction`] and [`JobContext::complete_in_transaction`].
///
/// `C` is the store's connection type: `diesel_async::AsyncPgConnection`,
/// `diesel_async::AsyncMysqlConnection` or `jobvisor::SqliteJobConnection` (feature `sqlite`).
pub struct JobTx<'c, C> {
    conn: &'c mut C,
    id: JobId,
    claim: ClaimId,
    now: Option<i64>,
    store: &'c Store,
    /// The node's hooks: [`JobTx::enqueue`] runs their `on_enqueue`.
    hooks: Option<&'c crate::hooks::Hooks>,
}

impl<C> fmt::Debug for JobTx<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobTx")
            .field("job", &self.id)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl<C: JobConnection> JobTx<'_, C> {
    /// The connection, inside the transaction: run your diesel-async statements on it. Do
    /// not commit or roll back on it yourself — return `Ok` or `Err` from the body.
    pub fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// The job this transaction belongs to.
    pub fn job_id(&self) -> JobId {
        self.id
    }

    /// The effect recorded under `key` for this job, by this attempt or an earlier one, if
    /// any: a retried attempt asks it to learn what already happened.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad key (empty, longer than
    /// [`MAX_EFFECT_KEY_LEN`](crate::MAX_EFFECT_KEY_LEN) bytes, or with NUL);
    /// [`Error::Database`] (return it from the body to roll back).
    pub async fn effect(&mut self, key: &str) -> Result<Option<Effect>, Error> {
        crate::store::validate_effect_key(key)?;
        Ok(self.conn.read_effect(self.id.0, key).await?)
    }

    /// Records that the effect `key` of this job happened (or is about to, as you decide),
    /// with `detail` (any JSON: a provider's charge id; `()` for none). It commits with the
    /// transaction, or vanishes with it. Exactly one attempt records a key: of concurrent
    /// attempts, the others wait for its transaction and then find the record
    /// ([`Recorded::Already`]); a record whose transaction rolled back was never there.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad key (empty, longer than
    /// [`MAX_EFFECT_KEY_LEN`](crate::MAX_EFFECT_KEY_LEN) bytes, or with NUL) or a `detail`
    /// that is not JSON; [`Error::Database`] (return it from the body to roll back).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(ctx: jobvisor::JobContext) -> jobvisor::JobResult {
    /// use jobvisor::{JobError, Recorded, SqliteJobConnection};
    ///
    /// let first = ctx
    ///     .transaction(async |mut tx: jobvisor::JobTx<'_, SqliteJobConnection>| {
    ///         Ok::<_, JobError>(tx.record_effect("welcome-email", ()).await?.is_new())
    ///     })
    ///     .await?;
    /// if first {
    ///     // ... send the e-mail (with the provider's idempotency key, if it has one) ...
    /// }
    /// jobvisor::JobOutcome::done()
    /// # }
    /// ```
    pub async fn record_effect<T: Serialize>(
        &mut self,
        key: &str,
        detail: T,
    ) -> Result<Recorded, Error> {
        crate::store::validate_effect_key(key)?;
        let detail = serde_json::to_value(detail).map_err(|e| {
            Error::invalid(
                "effect detail",
                format!("the detail of effect {key:?} is not JSON: {e}; expected a value serde_json can represent"),
            )
        })?;
        let e = NewEffect {
            id: self.id.0,
            key: key.to_string(),
            detail: (!detail.is_null()).then_some(detail),
            claim: self.claim.to_string(),
            now: self.now,
        };
        if self.conn.insert_effect(&e).await? {
            return Ok(Recorded::New);
        }
        match self.conn.read_effect(self.id.0, key).await? {
            Some(found) => Ok(Recorded::Already(found)),
            // Not inserted and not found: only a record deleted meanwhile (the job pruned).
            None => Err(Error::Database(crate::StoreError::Transient(format!(
                "effect {key:?} of job {} was neither recorded nor found; try again",
                self.id
            )))),
        }
    }

    /// Enqueues follow-up jobs in this transaction (the transactional outbox): they exist
    /// if and only if it commits. On SQLite, use this rather than the node's client inside
    /// the body: the body holds the store's one writer.
    ///
    /// # Errors
    /// As [`Client::enqueue_in`](crate::Client::enqueue_in).
    pub async fn enqueue(&mut self, mut jobs: Vec<NewJob>) -> Result<Vec<Enqueued>, Error> {
        crate::hooks::on_enqueue(self.hooks, &mut jobs)?;
        let now = self.now.map(crate::store::from_us);
        self.store
            .job_enqueue_in(&mut *self.conn, EnqueueParams { jobs, now })
            .await
    }
}

/// The body of a handler's transaction: an async closure taking the [`JobTx`]
/// (`async |mut tx: JobTx<'_, C>| { … }`) whose future is `Send`, as handlers' futures are.
/// Implemented for every such closure; nothing else implements it.
pub trait TxBody<T, R>: AsyncFnOnce(T) -> R + FnOnce(T) -> <Self as TxBody<T, R>>::Fut {
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, T, Fut, R> TxBody<T, R> for F
where
    F: AsyncFnOnce(T) -> R + FnOnce(T) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// Why a handler's transaction did not commit.
#[derive(Debug)]
pub enum TxError<E> {
    /// The attempt no longer holds the job's lease (reclaimed, fenced, given back after a
    /// cancel), or its fence point had passed: everything the body wrote was rolled back.
    /// The handler should stop; whatever it returns is not written.
    LeaseLost,
    /// The body returned this error: the transaction was rolled back; the job is still
    /// running and the handler carries on as it likes.
    RolledBack(E),
    /// The database failed to begin, check the lease or commit (or the context has no
    /// store: a [`JobContext::for_test`] without a client). Nothing was committed —
    /// except after a connection lost during `COMMIT`, when the database alone knows.
    Database(Error),
}

impl<E: fmt::Display> fmt::Display for TxError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxError::LeaseLost => f.write_str(
                "the transaction was rolled back: this attempt no longer holds the job's lease",
            ),
            TxError::RolledBack(e) => write!(f, "the transaction was rolled back: {e}"),
            TxError::Database(e) => write!(f, "the transaction failed: {e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for TxError<E> {}

impl<E: Into<JobError>> TxError<E> {
    /// The handler's error for this: a rolled-back body's own error as it is (so a
    /// [`JobError::fail`] stays permanent), a lost lease as a retry with code `lease_lost`
    /// (it is not written anyway), a database failure as a retry. `?` on a `TxError` makes a
    /// plain retry of everything; use this to keep the body's own error.
    pub fn into_job_error(self) -> JobError {
        match self {
            TxError::RolledBack(e) => e.into(),
            TxError::LeaseLost => {
                JobError::retry("this attempt lost the job's lease").with_code("lease_lost")
            }
            TxError::Database(e) => JobError::retry(e),
        }
    }
}

/// Rolls back, the body's error or the guard's failure being the one reported.
async fn rollback<C: JobConnection, E>(conn: &mut C, guarded: bool, why: TxError<E>) -> TxError<E> {
    if let Err(e) = conn.rollback(guarded).await {
        tracing::debug!(error = %e, "rollback of a handler's transaction failed");
    }
    why
}

/// Ends a commit begun on the attempt if the transaction's future is dropped before it does
/// (the attempt then goes on as an ordinary one; its lease decides).
struct CommitGuard<'a>(&'a Attempt, bool);

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.end_commit(None);
        }
    }
}

impl JobContext {
    /// Runs `body` in a transaction on the job's store, fenced by this attempt's lease: it
    /// commits only if the attempt still holds the job's lease at the commit (checked in SQL
    /// with the job's row locked until the commit, and locally against the attempt's fence
    /// point). The job keeps running; use
    /// [`complete_in_transaction`](Self::complete_in_transaction) to finish it in the same
    /// transaction. Use it to record effects ([`JobTx::record_effect`]) and business writes
    /// that must not commit from an attempt that lost the job.
    ///
    /// `C` is the store's connection type (`diesel_async::AsyncPgConnection`,
    /// `diesel_async::AsyncMysqlConnection` or `jobvisor::SqliteJobConnection`, feature `sqlite`).
    /// The body should be short: it holds a pooled connection, and on SQLite the store's one
    /// writer (the node's lease renewals wait for it). Call external services outside it.
    ///
    /// # Errors
    /// [`TxError::RolledBack`] with the body's error (rolled back; the job runs on),
    /// [`TxError::LeaseLost`] (rolled back), [`TxError::Database`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(ctx: jobvisor::JobContext) -> jobvisor::JobResult {
    /// use diesel_async::AsyncPgConnection;
    /// use jobvisor::{JobError, JobTx};
    ///
    /// // Intent first: record the charge and its idempotency key before calling the provider.
    /// let key = format!("order-{}", ctx.id);
    /// ctx.transaction(async |mut tx: JobTx<'_, AsyncPgConnection>| {
    ///     tx.record_effect("charge:intent", serde_json::json!({ "idempotency_key": key }))
    ///         .await?;
    ///     Ok::<_, JobError>(())
    /// })
    /// .await?;
    /// jobvisor::JobOutcome::done()
    /// # }
    /// ```
    pub async fn transaction<C, R, E, F>(&self, body: F) -> Result<R, TxError<E>>
    where
        C: JobConnection,
        F: for<'r> TxBody<JobTx<'r, C>, Result<R, E>, Fut: Send> + Send,
        R: Send,
        E: Send,
    {
        self.run_tx(body, |_| Ok(None)).await
    }

    /// Runs `body` in a transaction on the job's store and completes the job in it: the job
    /// is `succeeded`, with the body's `Ok` value (serialized) as its result, if and only if
    /// the transaction commits — and it commits only if this attempt still holds the job's
    /// lease (the completion is the guard, as for every finalization: `WHERE id = ? AND
    /// lease_token = ? AND state = 'running'`; and locally, the attempt's fence point must
    /// not have passed). Return its answer from the handler: once it committed, nothing
    /// else is written for the attempt (what the handler returns afterwards is ignored, with
    /// a warning if it is not a success).
    ///
    /// If the body returns `Err`, the transaction rolls back and the job keeps running:
    /// [`TxError::RolledBack`] hands the error back, and the handler carries on (retry the
    /// transaction, return a failure…). If the lease was lost, the transaction rolls back
    /// and the answer is [`TxError::LeaseLost`].
    ///
    /// `C` is the store's connection type (see [`transaction`](Self::transaction)); the same
    /// advice holds: short bodies, no external calls inside.
    ///
    /// # Errors
    /// [`TxError::RolledBack`], [`TxError::LeaseLost`], [`TxError::Database`] (also for a
    /// result that is not JSON).
    ///
    /// # Examples
    /// ```no_run
    /// use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
    /// use jobvisor::{handler_fn, JobContext, JobError, JobTx};
    ///
    /// let pay = handler_fn(|order: i64, ctx: JobContext| async move {
    ///     let outcome = ctx
    ///         .complete_in_transaction(async |mut tx: JobTx<'_, AsyncPgConnection>| {
    ///             // Any diesel-async statement on `tx.conn()` (the query builder too).
    ///             let paid = format!("UPDATE orders SET paid = true WHERE id = {order}");
    ///             tx.conn().batch_execute(&paid).await?;
    ///             Ok::<_, JobError>(serde_json::json!({ "order": order, "paid": true }))
    ///         })
    ///         .await
    ///         .map_err(|e| e.into_job_error())?;
    ///     Ok(outcome) // the job is already `succeeded`, with this result
    /// });
    /// # let _ = pay;
    /// ```
    pub async fn complete_in_transaction<C, R, E, F>(
        &self,
        body: F,
    ) -> Result<JobOutcome, TxError<E>>
    where
        C: JobConnection,
        F: for<'r> TxBody<JobTx<'r, C>, Result<R, E>, Fut: Send> + Send,
        R: Serialize + Send,
        E: Send,
    {
        let result = self
            .run_tx(body, |r| {
                serde_json::to_value(r).map(Some).map_err(|e| {
                    Error::invalid(
                        "result",
                        format!("the transaction's result is not JSON: {e}; expected a value serde_json can represent"),
                    )
                })
            })
            .await?;
        // Its children, if any, are settled now (a read that finds none otherwise); a
        // failure is left to the sweeper's backstop: the completion stands.
        if let Some(client) = self.client_opt() {
            let now = self.node_clock().bound_now();
            match client.store().job_settle_children(&[self.id.0], now).await {
                Ok(s) => client.wake_queues(&s.released),
                Err(e) => tracing::warn!(error = %e, "settling the job's children failed"),
            }
        }
        let value = self
            .attempt_gate()
            .completed()
            .unwrap_or_else(|| serde_json::to_value(&result).unwrap_or(Value::Null));
        Ok(JobOutcome::Succeeded(value))
    }

    /// Every effect recorded for this job ([`JobTx::record_effect`]), by any attempt, read
    /// outside any transaction.
    ///
    /// # Errors
    /// [`Error::Database`]; [`Error::InvalidInput`] for a context without a client
    /// ([`JobContext::for_test`]).
    pub async fn effects(&self) -> Result<Vec<Effect>, Error> {
        self.store()?.job_effects(self.id).await
    }

    fn store(&self) -> Result<&Store, Error> {
        self.client_opt().map(|c| c.store()).ok_or_else(|| {
            Error::invalid(
                "context",
                "this JobContext has no store: it was built by JobContext::for_test; add a \
                 client with .with_client(client)",
            )
        })
    }

    /// The one transaction: begin, the body, the guard (`complete`'s answer `Some`: the
    /// completion with that result; `None`: the lease check), the local fence, commit.
    async fn run_tx<C, R, E, F>(
        &self,
        body: F,
        complete: impl FnOnce(&R) -> Result<Option<Value>, Error>,
    ) -> Result<R, TxError<E>>
    where
        C: JobConnection,
        F: for<'r> TxBody<JobTx<'r, C>, Result<R, E>, Fut: Send> + Send,
    {
        let store = self.store().map_err(TxError::Database)?;
        let gate = self.attempt_gate();
        if gate.lapsed(crate::scheduler::micros(self.node_clock().monotonic())) {
            return Err(TxError::LeaseLost);
        }
        // A test build's guard catalogue may present the job's current token instead of the
        // attempt's (read before the transaction holds SQLite's writer).
        #[cfg(feature = "test-util")]
        let mutated = store
            .mutate_tx_token(self.id, self.lease_token())
            .await
            .map_err(TxError::Database)?;
        #[cfg(feature = "test-util")]
        let token = &mutated;
        #[cfg(not(feature = "test-util"))]
        let token = self.lease_token();
        let mut pooled = C::checkout(store).await.map_err(TxError::Database)?;
        let conn: &mut C = &mut pooled;
        let guarded = C::guarded(store);
        conn.begin(guarded)
            .await
            .map_err(|e| TxError::Database(e.into()))?;
        let now = crate::store::bound_us(self.node_clock().bound_now());
        let tx = JobTx {
            conn: &mut *conn,
            id: self.id,
            claim: self.claim_id(),
            now,
            store,
            hooks: self.client_opt().and_then(|c| c.hooks()),
        };
        let r = match body(tx).await {
            Ok(r) => r,
            Err(e) => return Err(rollback(conn, guarded, TxError::RolledBack(e)).await),
        };
        let result = match complete(&r) {
            Ok(v) => v,
            Err(e) => return Err(rollback(conn, guarded, TxError::Database(e)).await),
        };
        let token = token.as_str();
        let held = match &result {
            Some(value) => {
                let started_ago_us = gate
                    .started_us()
                    .map(|t| (crate::scheduler::micros(self.node_clock().monotonic()) - t).max(0));
                conn.complete_job(&Completion {
                    id: self.id.0,
                    token: token.to_string(),
                    result: value.clone(),
                    started_ago_us,
                    now,
                })
                .await
            }
            None => conn.hold_lease(self.id.0, token).await,
        };
        match held {
            Ok(true) => {}
            Ok(false) => return Err(rollback(conn, guarded, TxError::LeaseLost).await),
            Err(e) => return Err(rollback(conn, guarded, TxError::Database(e.into())).await),
        }
        // The row is locked by the guard until the commit: no other node can take the job
        // meanwhile. Locally, no commit at or past the fence point.
        if !gate.begin_commit(self.node_clock().monotonic()) {
            return Err(rollback(conn, guarded, TxError::LeaseLost).await);
        }
        let mut ending = CommitGuard(gate, true);
        let commit = async { conn.commit(guarded).await.map_err(Error::from) };
        // A test build's fault plan may fail the commit, or lose its answer after it applied.
        #[cfg(feature = "test-util")]
        let committed = store.faulted_commit(commit).await;
        #[cfg(not(feature = "test-util"))]
        let committed = commit.await;
        match committed {
            Ok(()) => {
                ending.1 = false;
                gate.end_commit(result);
                Ok(r)
            }
            Err(e) => {
                ending.1 = false;
                gate.end_commit(None);
                // A commit that failed may leave its transaction open (SQLite's busy writer, a
                // commit that never left): end it. After one that applied, this is a no-op.
                Err(rollback(conn, guarded, TxError::Database(e)).await)
            }
        }
    }
}
