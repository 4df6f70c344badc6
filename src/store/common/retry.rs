//! Retries of a write that failed transiently (a deadlock between concurrent writers, SQLite
//! busy, a connection lost): how many tries, and the pause before each new one.
//!
//! Writers that deadlock one another must not all come back at once. Sixteen enqueues of
//! one expired unique key on MariaDB each read the holder's row under a shared lock and
//! then upgrade it to take the key over: the upgrades deadlock, InnoDB rolls back one
//! victim at a time, and a victim that retried at once met the same crowd again — on a
//! loaded CI machine one lost five times in a row and its enqueue failed. A pause of a
//! spread-out length, growing with each try, lets the crowd thin out first.
//!
//! A transaction the database rolled back whole — a deadlock victim, a serialization
//! failure, or on MariaDB Galera a certification conflict with another member's commit
//! (reported as the same error 1213, at `COMMIT`) — applied nothing, so any write may be
//! tried again ([`RolledBack`], [`retry_rolled_back`]); every transaction `with_tx!` runs
//! is. A lost connection is not among these: the commit may have been applied, and only
//! the callers that know their write is idempotent retry it.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, StoreError};

/// Tries of a write while it fails transiently: **8**. With the pauses below, at most
/// about 0.1 s of waiting in all, inside the operation's statement bound.
pub(crate) const TRANSIENT_TRIES: usize = 8;

/// The longest pause before a try, **32 ms** (from the 6th try on).
const MAX_PAUSE: Duration = Duration::from_millis(32);

/// Threads that have drawn a spread: each starts its draws in a range of its own.
static THREADS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's draws of a spread. Per thread, not per process, so that a seeded
    /// simulation (one run, one thread) draws the same spreads whatever other threads
    /// draw, and each run can start them afresh ([`restart_spread`]); each thread's range
    /// starts apart from the others', so writers on different threads still spread out.
    static DRAWS: Cell<u64> = Cell::new(THREADS.fetch_add(1, Ordering::Relaxed) << 32);
}

/// How long to pause after the `tries`-th try failed (1-based): between half and all of
/// 1 ms × 2^(tries − 1), at most [`MAX_PAUSE`]. The spread within that range comes from a
/// counter of the thread's (`DRAWS`), not from the clock or the operating system, so a
/// seeded simulation's runs stay the same.
pub(crate) fn pause_after(tries: usize) -> Duration {
    let shift = u32::try_from(tries.saturating_sub(1)).unwrap_or(u32::MAX);
    let cap = 1_000u64
        .checked_shl(shift)
        .unwrap_or(u64::MAX)
        .min(u64::try_from(MAX_PAUSE.as_micros()).unwrap_or(u64::MAX));
    let draw = DRAWS.with(|d| {
        let n = d.get();
        d.set(n.wrapping_add(1));
        n
    });
    let spread = mix(draw) % (cap / 2 + 1);
    Duration::from_micros(cap / 2 + spread)
}

/// Starts this thread's draws of a spread afresh, as at its first: a seeded simulation
/// calls it as each run begins, so that a seed's two runs pause alike.
#[cfg(feature = "test-util")]
pub(crate) fn restart_spread() {
    DRAWS.with(|d| d.set(0));
}

/// Pauses before another try (see [`pause_after`]).
pub(crate) async fn pause_before_retry(tries: usize) {
    tokio::time::sleep(pause_after(tries)).await;
}

/// How the databases report a transaction they rolled back whole: PostgreSQL's deadlock
/// victim (40P01) and serialization failure (40001); MySQL's and MariaDB's deadlock victim
/// (1213), which is also how Galera reports a certification conflict; a Galera member
/// that refuses statements while outside the primary component (1047), which applied
/// nothing; and a guarded Galera transaction found lost (`mysql/galera_guard.rs`).
const ROLLED_BACK: &[&str] = &[
    "deadlock detected",
    "could not serialize access",
    "Deadlock found",
    "WSREP detected deadlock",
    "WSREP has not yet prepared node",
    // A guarded transaction on a Galera member that the cluster aborted without telling any
    // statement (`mysql/galera_guard.rs`): a write after the abort refused (1792), or the
    // abort found before the commit.
    "Cannot execute statement in a READ ONLY transaction",
    "rolled the transaction back without reporting it",
];

/// True when an error's message says the database rolled the transaction back whole.
pub(crate) fn rolled_back_text(msg: &str) -> bool {
    ROLLED_BACK.iter().any(|s| msg.contains(s))
}

/// An error that can say whether the database rolled its transaction back whole.
pub(crate) trait RolledBack {
    /// True when nothing of the failed transaction was applied (see [`ROLLED_BACK`]).
    fn rolled_back(&self) -> bool;
}

impl RolledBack for Error {
    fn rolled_back(&self) -> bool {
        matches!(self, Error::Database(StoreError::Transient(m)) if rolled_back_text(m))
    }
}

impl RolledBack for diesel::result::Error {
    fn rolled_back(&self) -> bool {
        match self {
            diesel::result::Error::DatabaseError(_, info) => rolled_back_text(info.message()),
            _ => false,
        }
    }
}

/// Runs `op` again, after a pause, while the database rolls it back whole (at most
/// [`TRANSIENT_TRIES`] tries): a write that applied nothing is safe to send again.
pub(crate) async fn retry_rolled_back<T, E, F, Fut>(mut op: F) -> std::result::Result<T, E>
where
    E: RolledBack,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match op().await {
            Err(e) if tries < TRANSIENT_TRIES && e.rolled_back() => {
                tracing::debug!(
                    tries,
                    "transaction rolled back by the database; trying again"
                );
                pause_before_retry(tries).await;
            }
            res => return res,
        }
    }
}

/// SplitMix64's finalizer: consecutive counter values map to well-spread numbers.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_with_each_try_and_stay_within_their_range() {
        for tries in 1..=TRANSIENT_TRIES {
            let shift = u32::try_from(tries - 1).unwrap();
            let cap = Duration::from_millis(1u64 << shift).min(MAX_PAUSE);
            for _ in 0..100 {
                let p = pause_after(tries);
                assert!(
                    p >= cap / 2 && p <= cap,
                    "try {tries}: {p:?} outside {cap:?}/2..{cap:?}"
                );
            }
        }
        assert!(pause_after(usize::MAX) <= MAX_PAUSE);
    }

    #[test]
    fn concurrent_writers_do_not_all_pause_alike() {
        let pauses: std::collections::HashSet<Duration> = (0..16).map(|_| pause_after(5)).collect();
        assert!(
            pauses.len() > 8,
            "16 pauses, {} distinct: {pauses:?}",
            pauses.len()
        );
    }

    #[test]
    fn only_a_transaction_rolled_back_whole_is_tried_again() {
        for msg in [
            "deadlock detected",
            "could not serialize access due to concurrent update",
            "Deadlock found when trying to get lock; try restarting transaction",
            "WSREP detected deadlock/conflict and aborted the transaction. Try restarting the transaction",
            "WSREP has not yet prepared node for application use",
            "Cannot execute statement in a READ ONLY transaction.",
            "the Galera cluster rolled the transaction back without reporting it to a statement",
        ] {
            assert!(rolled_back_text(msg), "{msg}");
            let e = Error::Database(StoreError::Transient(msg.into()));
            assert!(e.rolled_back(), "{msg}");
        }
        // The commit of these may have been applied: not tried again here.
        for msg in [
            "Lost connection to MySQL server during query",
            "connection closed",
            "server has gone away",
            "Lock wait timeout exceeded; try restarting transaction",
            "database is locked",
        ] {
            assert!(!rolled_back_text(msg), "{msg}");
        }
        let other = Error::Database(StoreError::Other("Deadlock found".into()));
        assert!(!other.rolled_back(), "only a transient error");
    }

    #[tokio::test]
    async fn a_rolled_back_try_runs_again_and_another_error_does_not() {
        let tries = std::cell::Cell::new(0usize);
        let out: std::result::Result<usize, Error> = retry_rolled_back(|| {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move {
                if n < 3 {
                    Err(Error::Database(StoreError::Transient(
                        "Deadlock found".into(),
                    )))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(out.unwrap(), 3);
        tries.set(0);
        let out: std::result::Result<usize, Error> = retry_rolled_back(|| {
            tries.set(tries.get() + 1);
            async {
                Err(Error::Database(StoreError::Transient(
                    "connection closed".into(),
                )))
            }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(tries.get(), 1, "a lost connection is not tried again");
        tries.set(0);
        let out: std::result::Result<usize, Error> = retry_rolled_back(|| {
            tries.set(tries.get() + 1);
            async {
                Err(Error::Database(StoreError::Transient(
                    "Deadlock found".into(),
                )))
            }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(
            tries.get(),
            TRANSIENT_TRIES,
            "at most TRANSIENT_TRIES tries"
        );
    }

    #[test]
    fn every_try_pauses_at_most_a_tenth_of_a_second_in_all() {
        let most: Duration = (1..TRANSIENT_TRIES)
            .map(|t| Duration::from_millis(1u64 << (t - 1)).min(MAX_PAUSE))
            .sum();
        assert!(most <= Duration::from_millis(100), "{most:?}");
    }
}
