//! Bounded waits on the hot path, and connections that are never reused after one.
//!
//! A node whose network to the database is cut silently sees its statements hang: nothing is
//! reset, and TCP retransmits into the void for minutes. So every hot-path operation (claim,
//! renew, finalize, enqueue, reclaim) runs under [`bounded`]: when it has not answered within
//! its bound, it is abandoned and fails with a transient [`Error::Database`] saying which
//! operation timed out, after how long and while waiting for what.
//!
//! An abandoned operation may leave a statement in flight on its connection, whose answer
//! would reach whoever used the connection next (or never arrive). So such a connection is
//! *poisoned*: the store's pools hand out [`PooledConn`]s on [`Tracked`] connections, and a checkout
//! dropped while its operation is being abandoned marks its connection, which the pool's
//! [`Manager`] then reports broken: bb8 closes it instead of taking it back, and opens a
//! fresh one when next needed. A connection whose checkout ping (MySQL) is interrupted is
//! poisoned the same way. This holds for any abandonment — the bound, or a caller that drops
//! the future — since the mark is set by a guard that runs before the operation's future is
//! dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use diesel_async::pooled_connection::{AsyncDieselConnectionManager, PoolError};

use crate::error::{Error, Result, StoreError};

/// A hot-path operation, named in its timeout error (and a leader's election and schedule
/// fire, a settle's transaction, a gauge turn's take and a handler transaction's commit,
/// which only a test's fault plan bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim,
    Renew,
    Finalize,
    Enqueue,
    Reclaim,
    Fire,
    Elect,
    Settle,
    Gauges,
    /// Only a test build's fault plan sees a handler transaction's commit.
    #[cfg(feature = "test-util")]
    Commit,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Claim => "job_claim",
            Op::Renew => "job_renew_leases",
            Op::Finalize => "job_finalize_many",
            Op::Enqueue => "job_enqueue",
            Op::Reclaim => "job_reclaim_expired",
            Op::Fire => "schedule_fire",
            Op::Elect => "leader_keep_or_take",
            Op::Settle => "job_settle_children",
            Op::Gauges => "gauges_take_turn",
            #[cfg(feature = "test-util")]
            Op::Commit => "handler_tx_commit",
        }
    }
}

/// What an operation was waiting for, for its timeout error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Phase {
    Starting = 0,
    Checkout = 1,
    WriterLock = 2,
    Answer = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Checkout,
            2 => Phase::WriterLock,
            3 => Phase::Answer,
            _ => Phase::Starting,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Phase::Starting => "before reaching the database",
            Phase::Checkout => "waiting for a database connection",
            Phase::WriterLock => "waiting for the SQLite writer lock (another write is stuck)",
            Phase::Answer => "waiting for the database's answer",
        }
    }
}

/// The state of the operation running in the current task.
#[derive(Debug, Default)]
struct OpState {
    /// Set just before the operation's future is dropped unfinished.
    abandoned: AtomicBool,
    phase: AtomicU8,
}

tokio::task_local! {
    static CURRENT: Arc<OpState>;
}

/// Records what the current operation waits for (nothing outside [`bounded`]).
pub(crate) fn set_phase(phase: Phase) {
    let _ = CURRENT.try_with(|s| s.phase.store(phase as u8, Ordering::Relaxed));
}

#[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // the SQLite writer lock's wait
/// Whether the current task runs inside [`bounded`] (whose bound then covers every wait).
pub(crate) fn in_bounded_op() -> bool {
    CURRENT.try_with(|_| ()).is_ok()
}

/// Marks the operation abandoned when dropped; held before the operation's future, so it
/// is dropped first and the checkouts inside that future see the mark.
struct AbandonOnDrop(Arc<OpState>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandoned.store(true, Ordering::Release);
    }
}

/// Runs `fut` for at most `limit`. On timeout the future is dropped, every connection it
/// held is poisoned, and a transient error names `op`, `limit` and what it was waiting for.
pub(crate) fn bounded<T, F>(op: Op, limit: Duration, fut: F) -> Bounded<F>
where
    F: Future<Output = Result<T>>,
{
    let state = Arc::new(OpState::default());
    Bounded {
        abandon: AbandonOnDrop(Arc::clone(&state)),
        op,
        limit,
        fut: tokio::time::timeout(limit, CURRENT.scope(state, fut)),
    }
}

pin_project_lite::pin_project! {
    /// [`bounded`]'s future. A struct, not an `async fn`: an `async fn` keeps its argument
    /// `fut` beside the future it awaits, so every operation's future was twice its size and
    /// copied whole at every layer (four copies of 12 KB per enqueue on PostgreSQL).
    pub(crate) struct Bounded<F> {
        // Fields drop in declaration order: the mark is set before `fut` is dropped.
        abandon: AbandonOnDrop,
        op: Op,
        limit: Duration,
        #[pin]
        fut: tokio::time::Timeout<tokio::task::futures::TaskLocalFuture<Arc<OpState>, F>>,
    }
}

impl<T, F: Future<Output = Result<T>>> Future for Bounded<F> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.project();
        match this.fut.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(res)) => Poll::Ready(res),
            Poll::Ready(Err(_)) => {
                let state = &this.abandon.0;
                let phase = Phase::from_u8(state.phase.load(Ordering::Relaxed));
                let limit = *this.limit;
                tracing::warn!(
                    op = this.op.name(),
                    limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                    waiting = phase.describe(),
                    "database operation timed out; its connection is discarded"
                );
                Poll::Ready(Err(timeout_error(*this.op, limit, phase)))
            }
        }
    }
}

pub(crate) fn timeout_error(op: Op, limit: Duration, phase: Phase) -> Error {
    Error::Database(StoreError::Transient(format!(
        "{} timed out after {limit:?} {} (StoreOptions::statement_timeout); any connection \
         it held is closed, not reused",
        op.name(),
        phase.describe()
    )))
}

/// A pooled connection and whether it must never be used again.
#[derive(Debug)]
pub(crate) struct Tracked<C> {
    pub(crate) conn: C,
    poisoned: bool,
    /// Calls still running on the connection, where they can outlive their future (SQLite's,
    /// see `sqlite/conn.rs`): one returned while a call runs is closed, not reused.
    busy: Option<Arc<AtomicUsize>>,
}

/// Opens a connection whose calls can outlive their futures, with the count of those
/// running (SQLite's, see `sqlite/conn.rs`).
pub(crate) type Connector<C> = Box<
    dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(C, Arc<AtomicUsize>), PoolError>>
        + Send
        + Sync,
>;

/// The store's pool manager: diesel-async's, plus the poison mark.
pub(crate) struct Manager<C> {
    inner: AsyncDieselConnectionManager<C>,
    /// Opens connections instead of `inner`, when set.
    connector: Option<Connector<C>>,
}

impl<C> Manager<C> {
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn new(inner: AsyncDieselConnectionManager<C>) -> Self {
        Manager {
            inner,
            connector: None,
        }
    }

    /// A manager that opens its connections with `connector`.
    #[cfg(feature = "sqlite")]
    pub(crate) fn with_connector(
        inner: AsyncDieselConnectionManager<C>,
        connector: Connector<C>,
    ) -> Self {
        Manager {
            inner,
            connector: Some(connector),
        }
    }
}

impl<C> std::fmt::Debug for Manager<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Manager").field(&self.inner).finish()
    }
}

impl<C> bb8::ManageConnection for Manager<C>
where
    C: Send + 'static,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    type Connection = Tracked<C>;
    type Error = PoolError;

    async fn connect(&self) -> Result<Tracked<C>, PoolError> {
        if let Some(open) = &self.connector {
            let (conn, busy) = open().await?;
            return Ok(Tracked {
                conn,
                poisoned: false,
                busy: Some(busy),
            });
        }
        let conn = self.inner.connect().await?;
        Ok(Tracked {
            conn,
            poisoned: false,
            busy: None,
        })
    }

    async fn is_valid(&self, c: &mut Tracked<C>) -> Result<(), PoolError> {
        // Poisoned while the ping is in flight: if it is interrupted (a hung connection, the
        // checkout timed out), the connection is closed rather than handed out again.
        c.poisoned = true;
        let res = self.inner.is_valid(&mut c.conn).await;
        c.poisoned = res.is_err();
        res
    }

    fn has_broken(&self, c: &mut Tracked<C>) -> bool {
        c.poisoned
            || c.busy
                .as_ref()
                .is_some_and(|b| b.load(Ordering::Acquire) > 0)
            || self.inner.has_broken(&mut c.conn)
    }
}

/// The store's connection pools.
pub(crate) type ConnPool<C> = bb8::Pool<Manager<C>>;

/// A connection checked out for one operation; derefs to the connection. Dropped while its
/// operation is abandoned, it poisons the connection.
pub(crate) struct PooledConn<'a, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    conn: bb8::PooledConnection<'a, Manager<C>>,
    op: Option<Arc<OpState>>,
}

impl<C> std::ops::Deref for PooledConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    type Target = C;

    fn deref(&self) -> &C {
        &self.conn.conn
    }
}

impl<C> std::ops::DerefMut for PooledConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    fn deref_mut(&mut self) -> &mut C {
        &mut self.conn.conn
    }
}

impl<C> Drop for PooledConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    fn drop(&mut self) {
        if self
            .op
            .as_ref()
            .is_some_and(|s| s.abandoned.load(Ordering::Acquire))
        {
            self.conn.poisoned = true;
        }
    }
}

impl<C> PooledConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    /// Marks the connection so the pool closes it when this checkout is dropped (for one whose
    /// session settings are about to be changed, or whose transaction state is in doubt).
    #[cfg(feature = "postgres")]
    pub(crate) fn poison(&mut self) {
        self.conn.poisoned = true;
    }

    /// Lifts this checkout's own mark, once what it guarded has answered (an operation abandoned
    /// later still marks the connection when the checkout is dropped).
    #[cfg(feature = "postgres")]
    pub(crate) fn keep(&mut self) {
        self.conn.poisoned = false;
    }
}

/// A connection for one renewal: the renewal lane's, or one opened for a hedge alone.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) enum RenewConn<'a, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    /// Checked out of the lane.
    Lane(PooledConn<'a, C>),
    /// Opened for this renewal and closed when dropped (never pooled, so one abandoned
    /// mid-statement cannot be reused either).
    Fresh(C),
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<C> std::ops::Deref for RenewConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    type Target = C;

    fn deref(&self) -> &C {
        match self {
            RenewConn::Lane(l) => l,
            RenewConn::Fresh(c) => c,
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<C> std::ops::DerefMut for RenewConn<'_, C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>>,
{
    fn deref_mut(&mut self) -> &mut C {
        match self {
            RenewConn::Lane(l) => l,
            RenewConn::Fresh(c) => c,
        }
    }
}

/// A connection for a renewal: from `lane`, or (`fresh`) a new one opened by the lane's
/// manager (the same setup, bounded by the same connection attempts) outside the pool.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn renew_conn<C>(lane: &ConnPool<C>, fresh: bool) -> Result<RenewConn<'_, C>>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>, Error = PoolError>,
{
    if !fresh {
        return Ok(RenewConn::Lane(checkout(lane).await?));
    }
    set_phase(Phase::Checkout);
    let conn = lane
        .dedicated_connection()
        .await
        .map_err(|e| super::errors::pool_err(bb8::RunError::User(e)))?;
    set_phase(Phase::Answer);
    Ok(RenewConn::Fresh(conn.conn))
}

/// Checks a connection out of `pool` for the current operation.
pub(crate) async fn checkout<C>(pool: &ConnPool<C>) -> Result<PooledConn<'_, C>>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>, Error = PoolError>,
{
    set_phase(Phase::Checkout);
    let conn = pool.get().await.map_err(super::errors::pool_err)?;
    set_phase(Phase::Answer);
    Ok(PooledConn {
        conn,
        op: CURRENT.try_with(Arc::clone).ok(),
    })
}

/// The bound of an enqueue of `jobs` jobs carrying `bytes` of payload: `statement_timeout`
/// per started 1,000 jobs or 4 MiB of payload, the size of one batch statement (a large
/// batch is written in several, or one `COPY` of the same volume).
pub(crate) fn enqueue_bound(statement_timeout: Duration, jobs: usize, bytes: usize) -> Duration {
    let units = jobs.div_ceil(1000).max(bytes.div_ceil(4 << 20)).max(1);
    statement_timeout.saturating_mul(u32::try_from(units).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bounded_operation_fails_transiently_naming_itself() {
        let err = bounded(Op::Renew, Duration::from_millis(20), async {
            set_phase(Phase::Answer);
            std::future::pending::<Result<()>>().await
        })
        .await
        .unwrap_err();
        assert!(err.is_transient(), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("job_renew_leases timed out after 20ms"),
            "{msg}"
        );
        assert!(msg.contains("waiting for the database's answer"), "{msg}");
    }

    #[tokio::test]
    async fn a_finished_operation_is_not_abandoned() {
        let v = bounded(Op::Claim, Duration::from_secs(5), async {
            let s = CURRENT.with(Arc::clone);
            assert!(!s.abandoned.load(Ordering::Acquire));
            assert!(in_bounded_op());
            Ok(7)
        })
        .await
        .unwrap();
        assert_eq!(v, 7);
        assert!(!in_bounded_op());
    }

    #[tokio::test]
    async fn the_abandon_mark_is_set_before_the_future_is_dropped() {
        struct Probe(Arc<OpState>, Arc<AtomicBool>);
        impl Drop for Probe {
            fn drop(&mut self) {
                self.1
                    .store(self.0.abandoned.load(Ordering::Acquire), Ordering::Release);
            }
        }
        let saw_mark = Arc::new(AtomicBool::new(false));
        let saw = Arc::clone(&saw_mark);
        let _ = bounded(Op::Finalize, Duration::from_millis(10), async move {
            let _probe = Probe(CURRENT.with(Arc::clone), saw);
            std::future::pending::<Result<()>>().await
        })
        .await;
        assert!(saw_mark.load(Ordering::Acquire));
    }

    #[test]
    fn enqueue_bounds_grow_with_the_batch() {
        let s = Duration::from_millis(1500);
        assert_eq!(enqueue_bound(s, 1, 10), s);
        assert_eq!(enqueue_bound(s, 1000, 10), s);
        assert_eq!(enqueue_bound(s, 1001, 10), s * 2);
        assert_eq!(enqueue_bound(s, 10, 9 << 20), s * 3);
        assert_eq!(enqueue_bound(s, 0, 0), s);
    }
}
