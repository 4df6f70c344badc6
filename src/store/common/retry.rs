//! Retries of a write that failed transiently (a deadlock between concurrent writers, SQLite
//! busy, a connection lost): how many tries, and the pause before each new one.
//!
//! Writers that deadlock one another must not all come back at once. Sixteen enqueues of
//! one expired unique key on MariaDB each read the holder's row under a shared lock and
//! then upgrade it to take the key over: the upgrades deadlock, InnoDB rolls back one
//! victim at a time, and a victim that retried at once met the same crowd again — on a
//! loaded CI machine one lost five times in a row and its enqueue failed. A pause of a
//! spread-out length, growing with each try, lets the crowd thin out first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Tries of a write while it fails transiently: **8**. With the pauses below, at most
/// about 0.1 s of waiting in all, inside the operation's statement bound.
pub(crate) const TRANSIENT_TRIES: usize = 8;

/// The longest pause before a try, **32 ms** (from the 6th try on).
const MAX_PAUSE: Duration = Duration::from_millis(32);

/// How long to pause after the `tries`-th try failed (1-based): between half and all of
/// 1 ms × 2^(tries − 1), at most [`MAX_PAUSE`]. The spread within that range comes from a
/// process-wide counter, not from the clock or the operating system, so a seeded
/// simulation's runs stay the same.
pub(crate) fn pause_after(tries: usize) -> Duration {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let shift = u32::try_from(tries.saturating_sub(1)).unwrap_or(u32::MAX);
    let cap = 1_000u64
        .checked_shl(shift)
        .unwrap_or(u64::MAX)
        .min(u64::try_from(MAX_PAUSE.as_micros()).unwrap_or(u64::MAX));
    let spread = mix(DRAWS.fetch_add(1, Ordering::Relaxed)) % (cap / 2 + 1);
    Duration::from_micros(cap / 2 + spread)
}

/// Pauses before another try (see [`pause_after`]).
pub(crate) async fn pause_before_retry(tries: usize) {
    tokio::time::sleep(pause_after(tries)).await;
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
    fn every_try_pauses_at_most_a_tenth_of_a_second_in_all() {
        let most: Duration = (1..TRANSIENT_TRIES)
            .map(|t| Duration::from_millis(1u64 << (t - 1)).min(MAX_PAUSE))
            .sum();
        assert!(most <= Duration::from_millis(100), "{most:?}");
    }
}
