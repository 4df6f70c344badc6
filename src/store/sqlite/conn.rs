//! The store's SQLite connection: diesel-async's `SyncConnectionWrapper`, whose blocking calls
//! run to their end when the future awaiting them is dropped.
//!
//! diesel-async's default waits for an unfinished call in that future's `drop`, through
//! `tokio::task::block_in_place` — which panics on a current-thread runtime, and the
//! scheduler's actors await the store on one (their arbiter's). An operation abandoned there
//! (its bound passed, or its actor stopped at shutdown while a statement ran) panicked and
//! took its actor down: a lease manager stopped mid-renewal left its node unable to shut down.
//!
//! Here the call finishes on its blocking thread, holding its own handle on the connection,
//! and the connection counts its calls still running ([`Detached::busy`]): the pool closes
//! a connection returned while one runs instead of handing it out again (and instead of
//! asking its transaction state, which diesel-async refuses with a panic while a call holds
//! the connection). [`immediate`] is `BEGIN IMMEDIATE … COMMIT` for this connection type.
//!
//! With feature `test-util`, a thread may ask for its SQLite calls to run inline instead
//! ([`set_inline`]): the call runs to its end before its future is handed back, on the
//! calling thread, so a simulation on one thread sees every call end in the order it was
//! made, not in the order the blocking threads finish.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use diesel::connection::AnsiTransactionManager;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::{
    SpawnBlocking, SyncConnectionWrapper, SyncTransactionManagerWrapper,
};
use diesel_async::TransactionManager;
use futures_util::future::BoxFuture;
use tokio::runtime::Handle;

/// The store's SQLite connection.
pub(crate) type SqliteConn = SyncConnectionWrapper<SqliteConnection, Detached>;

/// Runs a connection's blocking calls on tokio's blocking threads; a call whose future is
/// dropped runs to its end regardless. Public only as the runner of
/// [`SqliteJobConnection`](crate::SqliteJobConnection); not a stable API.
#[derive(Debug)]
pub struct Detached {
    /// Calls started and not yet finished.
    busy: Arc<AtomicUsize>,
    /// The runtime the connection was opened on, for calls made outside any runtime.
    opened_on: Option<Handle>,
}

impl Detached {
    /// A runner whose running calls are counted in `busy`.
    pub(crate) fn counting(busy: Arc<AtomicUsize>) -> Self {
        Detached {
            busy,
            opened_on: Handle::try_current().ok(),
        }
    }
}

#[cfg(feature = "test-util")]
thread_local! {
    /// Whether this thread's SQLite calls run inline (see [`set_inline`]).
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the SQLite calls made on this thread run inline, to their end, before their
/// futures are handed back (`on`), or on tokio's blocking threads as usual. For a
/// simulation that runs everything on one thread: the order in which calls end is then the
/// order in which they were made.
#[cfg(feature = "test-util")]
pub(crate) fn set_inline(on: bool) {
    INLINE.with(|i| i.set(on));
}

/// Whether this thread's SQLite calls run inline.
pub(crate) fn inline() -> bool {
    #[cfg(feature = "test-util")]
    {
        INLINE.with(std::cell::Cell::get)
    }
    #[cfg(not(feature = "test-util"))]
    {
        false
    }
}

impl SpawnBlocking for Detached {
    fn spawn_blocking<'a, R>(
        &mut self,
        task: impl FnOnce() -> R + Send + 'static,
    ) -> BoxFuture<'a, Result<R, Box<dyn StdError + Send + Sync + 'static>>>
    where
        R: Send + 'static,
    {
        if inline() {
            return Box::pin(std::future::ready(Ok(task())));
        }
        let Some(handle) = Handle::try_current()
            .ok()
            .or_else(|| self.opened_on.clone())
        else {
            return Box::pin(std::future::ready(Err(
                "no tokio runtime to run the SQLite call on".into(),
            )));
        };
        self.busy.fetch_add(1, Ordering::AcqRel);
        let busy = self.busy.clone();
        // `task` owns a handle on the connection and drops it when it returns, before the
        // count goes down: a count of zero means no call holds the connection.
        let join = handle.spawn_blocking(move || {
            let out = task();
            busy.fetch_sub(1, Ordering::AcqRel);
            out
        });
        Box::pin(async move {
            join.await
                .map_err(|e| Box::new(e) as Box<dyn StdError + Send + Sync + 'static>)
        })
    }

    fn get_runtime() -> Self {
        Detached::counting(Arc::default())
    }
}

/// Runs `body` in a `BEGIN IMMEDIATE` transaction on the connection's own (blocking) thread,
/// all of it in one call there: `BEGIN`, the statements and `COMMIT` (or `ROLLBACK` on
/// `Err`) are one hand-off between threads instead of one each (each a wake-up of the other
/// thread). `body` reads rows straight from SQLite's statement, through the same
/// prepared-statement cache and instrumentation; diesel-async's `load` renders the
/// statement's SQL text at every call and copies every value of every row into an owned row
/// before it is read (for a claim's rows, once most of the claim's cost on the client).
///
/// A caller that gives up while `body` runs (its bound passed, its actor stopped) leaves
/// the call to finish on that thread: it then rolls back instead of committing, so a claim
/// or a finalization nobody awaits any more writes nothing, as when each statement was a
/// call of its own and the abandoned connection was closed. Only one abandoned during the
/// `COMMIT` itself commits (a commit whose answer is lost, which every backend may meet).
pub(crate) async fn immediate_in_place<R, F>(
    conn: &mut SqliteConn,
    body: F,
) -> diesel::QueryResult<R>
where
    F: FnOnce(&mut SqliteConnection) -> diesel::QueryResult<R> + Send + 'static,
    R: Send + 'static,
{
    let mut awaited = Awaited {
        gone: Arc::default(),
        answered: false,
    };
    let gone = awaited.gone.clone();
    let out = conn
        .spawn_blocking(move |c| {
            c.immediate_transaction(|c| {
                let r = body(c)?;
                if gone.load(Ordering::Acquire) {
                    return Err(diesel::result::Error::RollbackTransaction);
                }
                Ok(r)
            })
        })
        .await;
    awaited.answered = true;
    out
}

/// Sets `gone` when dropped unanswered: the future that awaited an [`immediate_in_place`]
/// was dropped before its answer.
struct Awaited {
    gone: Arc<std::sync::atomic::AtomicBool>,
    answered: bool,
}

impl Drop for Awaited {
    fn drop(&mut self) {
        if !self.answered {
            self.gone.store(true, Ordering::Release);
        }
    }
}

/// An async closure over the connection whose future can be named (and so required `Send`):
/// what [`immediate`] runs inside its transaction.
pub(crate) trait TxBody<T, R>: AsyncFnOnce(T) -> R + FnOnce(T) -> Self::Fut {
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

/// `BEGIN IMMEDIATE` on the store's connection (the write lock taken up front).
pub(crate) async fn begin_immediate(conn: &mut SqliteConn) -> diesel::QueryResult<()> {
    conn.spawn_blocking(|c| AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE"))
        .await
}

/// `COMMIT` of a transaction begun by [`begin_immediate`].
pub(crate) async fn commit(conn: &mut SqliteConn) -> diesel::QueryResult<()> {
    SyncTransactionManagerWrapper::<AnsiTransactionManager>::commit_transaction(conn).await
}

/// `ROLLBACK` of a transaction begun by [`begin_immediate`].
pub(crate) async fn rollback(conn: &mut SqliteConn) -> diesel::QueryResult<()> {
    SyncTransactionManagerWrapper::<AnsiTransactionManager>::rollback_transaction(conn).await
}

/// Runs `body` in a `BEGIN IMMEDIATE` transaction (the write lock taken up front, so a
/// read-then-write never fails on a lock upgrade); commits on `Ok`, rolls back on `Err`.
pub(crate) async fn immediate<R, E, F>(conn: &mut SqliteConn, body: F) -> Result<R, E>
where
    F: for<'r> TxBody<&'r mut SqliteConn, Result<R, E>, Fut: Send> + Send,
    E: From<diesel::result::Error> + Send,
    R: Send,
{
    conn.spawn_blocking(|c| AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE"))
        .await?;
    match body(&mut *conn).await {
        Ok(v) => {
            SyncTransactionManagerWrapper::<AnsiTransactionManager>::commit_transaction(conn)
                .await?;
            Ok(v)
        }
        Err(e) => {
            // A failed rollback leaves the transaction manager marked broken, and the pool
            // closes the connection; the body's error is the one to report.
            let _ =
                SyncTransactionManagerWrapper::<AnsiTransactionManager>::rollback_transaction(conn)
                    .await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_call_runs_to_its_end_and_is_counted_until_then() {
        let busy = Arc::new(AtomicUsize::new(0));
        let mut d = Detached::counting(busy.clone());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let call = d.spawn_blocking(move || rx.recv().is_ok());
        assert_eq!(busy.load(Ordering::Acquire), 1);
        // diesel-async's own runner would panic here, on a current-thread runtime.
        drop(call);
        assert_eq!(busy.load(Ordering::Acquire), 1, "still running");
        tx.send(()).unwrap();
        for _ in 0..500 {
            if busy.load(Ordering::Acquire) == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("the dropped call never finished");
    }

    /// A transaction whose caller gave up while it ran rolls back; one still awaited
    /// commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_transaction_in_place_rolls_back() {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        use diesel_async::SimpleAsyncConnection;
        let dir = std::env::temp_dir().join(format!("jobvisor-inplace-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let path = dir.to_string_lossy().to_string();
        let raw = SqliteConnection::establish(&path).unwrap();
        let busy = Arc::new(AtomicUsize::new(0));
        let mut c = SqliteConn::with_runtime(raw, Detached::counting(busy.clone()));
        c.batch_execute("CREATE TABLE t (v INTEGER)").await.unwrap();
        let insert = |v: i64| {
            move |c: &mut SqliteConnection| {
                c.batch_execute(&format!("INSERT INTO t VALUES ({v})"))?;
                std::thread::sleep(std::time::Duration::from_millis(200));
                Ok(())
            }
        };
        let gave_up = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            immediate_in_place(&mut c, insert(1)),
        )
        .await;
        assert!(gave_up.is_err(), "the caller gave up");
        while busy.load(Ordering::Acquire) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        immediate_in_place(&mut c, insert(2)).await.unwrap();
        let mut check = SqliteConnection::establish(&path).unwrap();
        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            v: i64,
        }
        let rows: Vec<V> =
            diesel::RunQueryDsl::load(diesel::sql_query("SELECT v FROM t"), &mut check).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(rows.iter().map(|r| r.v).collect::<Vec<_>>(), vec![2]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_finished_call_answers_and_leaves_no_count() {
        let busy = Arc::new(AtomicUsize::new(0));
        let mut d = Detached::counting(busy.clone());
        assert_eq!(d.spawn_blocking(|| 7).await.unwrap(), 7);
        assert_eq!(busy.load(Ordering::Acquire), 0);
    }
}
