//! Where time comes from. Actors never read the wall clock: they ask an injected [`Clock`].
//!
//! In production [`SystemClock`] answers `None` to [`Clock::bound_now`], so every store
//! statement uses the *database's* clock (skew between nodes cannot matter). A
//! [`ManualClock`] binds its own instant into every statement instead, which is how
//! simulation tests drive leases, timeouts and backoff without sleeping.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};

/// A source of "now".
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The local idea of now (used for in-process deadlines and logging).
    fn now(&self) -> DateTime<Utc>;

    /// The instant to bind into store statements: `None` means "the database decides".
    fn bound_now(&self) -> Option<DateTime<Utc>>;

    /// Time since an arbitrary fixed origin that never jumps back and counts on while the
    /// process is frozen: lease estimates and timeouts are measured on it (ARCHITECTURE.md §6,
    /// invariant 9). The default follows [`Clock::now`], which suits a test clock.
    fn monotonic(&self) -> Duration {
        let us = self.now().timestamp_micros();
        Duration::from_micros(u64::try_from(us).unwrap_or(0))
    }
}

/// The real clock; store statements use the database clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn bound_now(&self) -> Option<DateTime<Utc>> {
        None
    }

    /// [`Instant`] (`CLOCK_MONOTONIC` on Linux) since the first call: immune to wall-clock
    /// steps, and it keeps counting while the process is stopped (`SIGSTOP`). It does not
    /// count a system suspend (a suspended VM or laptop): after one, a node's fence points
    /// are late by the time suspended, and only the database's token guards stand.
    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that only moves when told to; cloning shares the same instant.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// A clock standing at 2030-01-01T00:00:00Z, a fixed instant tests can reason about.
    pub fn at_fixed_start() -> Self {
        // A valid calendar date: single() cannot be None for it.
        let start = Utc
            .with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .unwrap_or_else(Utc::now);
        ManualClock::new(start)
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut now = self.lock();
        *now += chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: DateTime<Utc>) {
        *self.lock() = at;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DateTime<Utc>> {
        // A poisoned lock only means a panic elsewhere while holding a plain value: keep going.
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.lock()
    }

    fn bound_now(&self) -> Option<DateTime<Utc>> {
        Some(*self.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_is_shared() {
        let c = ManualClock::at_fixed_start();
        let c2 = c.clone();
        let t0 = c.now();
        assert_eq!(c2.now(), t0);
        c.advance(Duration::from_secs(5));
        assert_eq!(c2.now() - t0, chrono::Duration::seconds(5));
        assert_eq!(c2.bound_now(), Some(t0 + chrono::Duration::seconds(5)));
        assert_eq!(SystemClock.bound_now(), None);
    }
}
