//! The migration lock held in a row (`jobvisor_migrate_lock`): one row, its holder and until
//! when its hold lasts, taken by an `UPDATE` that only matches a free or lapsed row.
//!
//! A session lock (PostgreSQL's advisory lock, MySQL's `GET_LOCK`) serialises migrators only
//! where every session meets on one server's lock table. On a Galera cluster named locks
//! are local to a member, and PostgreSQL-compatible distributed engines may have no advisory
//! locks at all; a row is replicated like any other, so of two migrators' claims on it one
//! commits and the other finds it held (or fails certification, and tries again). The cost:
//! a migrator that dies holding the row keeps the others waiting until its hold lapses
//! ([`HOLD_SECS`]), where a session lock is freed with its connection. Used by MariaDB
//! always (beside `GET_LOCK`), and by PostgreSQL without advisory locks
//! ([`StoreOptions::advisory_locks`](super::options::StoreOptions::advisory_locks)).

use std::time::{Duration, Instant};

use diesel::query_builder::{QueryFragment, SqlQuery};
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::sql_types::BigInt;
use diesel::Connection;

use super::embedded::BoxError;
use super::errors::classify;
use crate::error::StoreError;

/// The lock's table.
pub(crate) const TABLE: &str = "jobvisor_migrate_lock";

/// How long a hold lasts, **300 s**: a process that died migrating keeps others waiting that
/// long (as a session lock's wait did), and a migration must finish within it.
pub(crate) const HOLD_SECS: u32 = 300;

/// A backend's statements for the lock; `{me}` in `take` and `release` stands for the holder.
pub(crate) struct LockSql {
    /// Whether the table exists: one row with a column `n` (`BIGINT`), above 0 if it does.
    pub(crate) exists: &'static str,
    /// Creates the table if it is missing.
    pub(crate) create: String,
    /// Inserts the one row if it is missing.
    pub(crate) seed: String,
    /// Takes the row for `{me}` if it is free or its hold lapsed (1 row changed: taken).
    pub(crate) take: String,
    /// Frees the row if `{me}` holds it.
    pub(crate) release: String,
}

#[derive(diesel::QueryableByName)]
pub(crate) struct Count {
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// A holder name no other process uses at once: process id, time and a counter (digits and
/// dashes only: it is spliced into statements).
pub(crate) fn holder() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{nanos}-{n}", std::process::id())
}

/// Runs `sql` on `conn`: the rows it changed.
fn run<C>(conn: &mut C, sql: &str) -> diesel::QueryResult<usize>
where
    C: Connection,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C>,
{
    diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn)
}

/// Takes the lock for `me`, waiting (polling every 100 ms) while another holds it, for at
/// most [`HOLD_SECS`]. A transient failure (a deadlock, a certification conflict, two
/// processes creating the table at once) is waited out the same way; any other fails.
pub(crate) fn take<C>(conn: &mut C, sql: &LockSql, me: &str) -> Result<(), BoxError>
where
    C: Connection,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C> + for<'a> LoadQuery<'a, C, Count>,
{
    let take = sql.take.replace("{me}", me);
    let start = Instant::now();
    // The table is made once: on Galera `CREATE TABLE IF NOT EXISTS` runs in total order even
    // when the table exists, and aborts other members' transactions on the table (the
    // holder's release among them) each time.
    let mut made = diesel::RunQueryDsl::load::<Count>(diesel::sql_query(sql.exists), conn)
        .map(|rows| rows.iter().any(|c| c.n > 0))
        .unwrap_or(false);
    // Two processes creating the table at once: PostgreSQL fails one with a unique
    // violation of its catalog, which is not transient but is over once the table exists.
    let mut create_failures = 0;
    loop {
        let taken = if made {
            run(conn, &take)
        } else {
            match run(conn, &sql.create) {
                Ok(_) => {
                    made = true;
                    run(conn, &sql.seed).and_then(|_| run(conn, &take))
                }
                Err(e) if create_failures < 5 => {
                    create_failures += 1;
                    tracing::debug!(error = %e, "creating the migration lock's table; trying again");
                    Ok(0)
                }
                Err(e) => Err(e),
            }
        };
        match taken {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            Err(e) => match classify(e) {
                StoreError::Transient(_) => {}
                other => return Err(format!("taking the migration lock ({TABLE}): {other}").into()),
            },
        }
        if start.elapsed() > Duration::from_secs(u64::from(HOLD_SECS)) {
            return Err(
                format!("the migration lock ({TABLE}) stayed held for {HOLD_SECS} s").into(),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Frees the lock `me` holds, even after a failed migration; a transient failure of the
/// release (on Galera, another member's statement on the row) is tried again, up to 50 times
/// 20 ms apart, or the lock would stay held for its whole hold.
pub(crate) fn release<C>(conn: &mut C, sql: &LockSql, me: &str) -> Result<(), BoxError>
where
    C: Connection,
    SqlQuery: QueryFragment<C::Backend> + ExecuteDsl<C>,
{
    let release = sql.release.replace("{me}", me);
    let mut tries = 0;
    loop {
        match run(conn, &release) {
            Ok(_) => return Ok(()),
            Err(e) => match classify(e) {
                StoreError::Transient(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => {
                    return Err(format!("releasing the migration lock ({TABLE}): {other}").into())
                }
            },
        }
    }
}
