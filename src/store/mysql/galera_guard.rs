//! The guard every transaction of the store's own runs under on a MariaDB Galera member: a
//! transaction the cluster aborts is never committed in part, and never reported committed.
//!
//! **Why.** A Galera member aborts a local transaction when another member's commit that
//! conflicts with it is applied (a "brute-force" abort). The statement after the abort
//! should fail with a deadlock error (1213), and the store then rolls back and retries. But
//! in the prepared-statement protocol the abort can be reported to no statement at all —
//! seen when it lands as diesel-async closes the previous statement (`COM_STMT_CLOSE`, which
//! may not answer with an error): the transaction is gone, the session is back in autocommit
//! mode, and every later statement of the "transaction" commits on its own. `tests/galera.rs`
//! caught it: a child job's insert rolled back while its dependency edge, written after the
//! abort, committed, and the enqueue reported an id no member held (1 run in 12 of the
//! racing case under CPU load, with connections spread over three members).
//!
//! **How.** Three statements in the round trip that begins the transaction, one more before
//! its `COMMIT`:
//! * `SET SESSION TRANSACTION READ ONLY` and `START TRANSACTION READ WRITE`: the transaction
//!   itself may write, but a statement run after a silent abort runs in a new transaction
//!   (autocommitted, or implicit) that takes the session's default — read only — so a write
//!   fails (1792) instead of committing alone;
//! * `SAVEPOINT jobvisor_guard`, released before the `COMMIT`: a transaction lost meanwhile
//!   lost its savepoint too, so the release fails (1305) and the store reports the
//!   transaction rolled back (and retries it) instead of committing whatever followed;
//! * `SET SESSION TRANSACTION READ WRITE` with the release (and after any rollback): the
//!   session's autocommitted statements (one-statement writes) write again.
//!
//! Both failures mean nothing of the transaction was applied, so [`retry.rs`] counts them with
//! the deadlock errors as a transaction rolled back whole. Off Galera the store runs plain
//! transactions: the guard costs a round trip per transaction, paid only where it is needed.
//!
//! [`retry.rs`]: crate::store::retry

use diesel::result::{DatabaseErrorKind, Error as DieselError, QueryResult};
use diesel_async::TransactionManager;
use diesel_async::{AnsiTransactionManager, AsyncMysqlConnection, SimpleAsyncConnection};

/// What a transaction lost to a silent abort reports; [`crate::store::retry`] reads it as a
/// transaction rolled back whole.
pub(crate) const LOST: &str = "the Galera cluster rolled the transaction back without \
                               reporting it to a statement";

/// Opens a guarded transaction (see the module docs).
pub(crate) async fn begin(c: &mut AsyncMysqlConnection) -> QueryResult<()> {
    let begun = AnsiTransactionManager::begin_transaction_sql(
        c,
        "SET SESSION TRANSACTION READ ONLY; START TRANSACTION READ WRITE; \
         SAVEPOINT jobvisor_guard",
    )
    .await;
    if begun.is_err() {
        // Part of the batch may have run: the session's writes must not stay refused.
        let _ = c
            .batch_execute("ROLLBACK; SET SESSION TRANSACTION READ WRITE")
            .await;
    }
    begun
}

/// Commits a guarded transaction, or fails with [`LOST`] if it was lost on the way.
///
/// The release is the last statement of its round trip and the `COMMIT` goes alone: Galera
/// settles a command's abort or certification error at the command's end, so a statement
/// after it in the same round trip can hide it (a `COMMIT` that failed certification
/// followed by a `SET` answered success: 50 runs of 50 lost a write).
pub(crate) async fn commit(c: &mut AsyncMysqlConnection) -> QueryResult<()> {
    if let Err(e) = c
        .batch_execute("SET SESSION TRANSACTION READ WRITE; RELEASE SAVEPOINT jobvisor_guard")
        .await
    {
        let lost = matches!(&e, DieselError::DatabaseError(_, info)
            if info.message().contains("jobvisor_guard"));
        rollback(c).await?;
        return Err(if lost {
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, Box::new(LOST.to_string()))
        } else {
            e
        });
    }
    AnsiTransactionManager::commit_transaction(c).await
}

/// Rolls a guarded transaction back and lets the session write again.
pub(crate) async fn rollback(c: &mut AsyncMysqlConnection) -> QueryResult<()> {
    let rolled = AnsiTransactionManager::rollback_transaction(c).await;
    let reset = c.batch_execute("SET SESSION TRANSACTION READ WRITE").await;
    rolled.and(reset)
}

/// `$body` (a `Result` whose error takes a diesel error) in a transaction on `$c` (an
/// `&mut AsyncMysqlConnection`), guarded when `$guarded` (the server is a Galera member),
/// else diesel-async's plain transaction.
macro_rules! transaction {
    ($c:expr, $guarded:expr, |$conn:ident| $body:expr) => {{
        let c: &mut diesel_async::AsyncMysqlConnection = $c;
        if $guarded {
            match $crate::store::mysql::galera_guard::begin(&mut *c).await {
                Err(e) => Err(e.into()),
                Ok(()) => {
                    let res = {
                        let $conn = &mut *c;
                        async { $body }.await
                    };
                    match res {
                        Ok(v) => match $crate::store::mysql::galera_guard::commit(&mut *c).await {
                            Ok(()) => Ok(v),
                            Err(e) => Err(e.into()),
                        },
                        Err(e) => {
                            // The body's error is the one reported.
                            let _ = $crate::store::mysql::galera_guard::rollback(&mut *c).await;
                            Err(e)
                        }
                    }
                }
            }
        } else {
            diesel_async::AsyncConnection::transaction(c, async |$conn| $body).await
        }
    }};
}

pub(crate) use transaction;

#[cfg(all(test, feature = "mysql"))]
mod tests {
    //! The guard on a plain server: a `ROLLBACK` sent behind the transaction manager's back
    //! stands in for the cluster's silent abort (the session is left exactly as the abort
    //! leaves it: no transaction, autocommit).

    #![allow(clippy::unwrap_used)]

    use diesel::QueryableByName;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

    use crate::store::retry::RolledBack;

    #[derive(QueryableByName)]
    struct Ids {
        #[diesel(sql_type = diesel::sql_types::Text)]
        ids: String,
    }

    async fn ids(c: &mut AsyncMysqlConnection) -> String {
        diesel::sql_query("SELECT COALESCE(GROUP_CONCAT(id ORDER BY id), '') AS ids FROM t")
            .get_result::<Ids>(c)
            .await
            .unwrap()
            .ids
    }

    async fn insert(c: &mut AsyncMysqlConnection, id: i32) -> diesel::QueryResult<usize> {
        diesel::sql_query("INSERT INTO t (id) VALUES (?)")
            .bind::<diesel::sql_types::Integer, _>(id)
            .execute(c)
            .await
    }

    /// A transaction lost after a write: without the guard its later write commits alone;
    /// with it that write is refused, nothing stays, and the error reads as rolled back.
    async fn lost_then_write(
        c: &mut AsyncMysqlConnection,
        guarded: bool,
    ) -> diesel::QueryResult<()> {
        super::transaction!(c, guarded, |c| {
            insert(c, 1).await?;
            c.batch_execute("ROLLBACK").await?;
            insert(c, 2).await?;
            Ok::<_, diesel::result::Error>(())
        })
    }

    /// A transaction lost after its last write: without the guard its commit succeeds; with
    /// it the commit reports the transaction lost.
    async fn lost_then_read(
        c: &mut AsyncMysqlConnection,
        guarded: bool,
    ) -> diesel::QueryResult<()> {
        super::transaction!(c, guarded, |c| {
            insert(c, 3).await?;
            c.batch_execute("ROLLBACK").await?;
            ids(c).await;
            Ok::<_, diesel::result::Error>(())
        })
    }

    #[tokio::test]
    async fn a_transaction_lost_silently_is_never_committed_in_part_or_reported_committed() {
        // A database of this test's own on the test server, dropped at the end.
        let url = std::env::var("JOBVISOR_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let db = format!("jv_guard_{}", std::process::id());
        let mut c = AsyncMysqlConnection::establish(&url).await.unwrap();
        c.batch_execute(&format!(
            "CREATE DATABASE {db}; USE {db}; CREATE TABLE t (id INT PRIMARY KEY)"
        ))
        .await
        .unwrap();

        // The defect the guard is for, unguarded: the write after the loss committed alone.
        lost_then_write(&mut c, false).await.unwrap();
        assert_eq!(ids(&mut c).await, "2");
        lost_then_read(&mut c, false).await.unwrap();
        assert_eq!(
            ids(&mut c).await,
            "2",
            "reported committed, nothing written"
        );
        c.batch_execute("DELETE FROM t").await.unwrap();

        let e = lost_then_write(&mut c, true).await.unwrap_err();
        assert!(e.rolled_back(), "{e}");
        assert_eq!(
            ids(&mut c).await,
            "",
            "nothing of the lost transaction stays"
        );
        let e = lost_then_read(&mut c, true).await.unwrap_err();
        assert!(e.rolled_back(), "{e}");
        assert!(e.to_string().contains(super::LOST), "{e}");
        assert_eq!(ids(&mut c).await, "");

        // A transaction not lost commits, and the session's own writes are not refused after.
        super::transaction!(&mut c, true, |c| insert(c, 4).await).unwrap();
        insert(&mut c, 5).await.unwrap();
        assert_eq!(ids(&mut c).await, "4,5");
        // Nor after a guarded transaction that failed.
        let e = super::transaction!(&mut c, true, |c| insert(c, 4).await).unwrap_err();
        assert!(
            !e.rolled_back(),
            "a duplicate key is not a lost transaction: {e}"
        );
        insert(&mut c, 6).await.unwrap();
        assert_eq!(ids(&mut c).await, "4,5,6");
        c.batch_execute(&format!("DROP DATABASE {db}"))
            .await
            .unwrap();
    }
}
