//! Where time comes from. Actors never read the wall clock: they ask an injected [`Clock`].
//!
//! In production [`SystemClock`] answers `None` to [`Clock::bound_now`], so every store
//! statement uses the *database's* clock (skew between nodes cannot matter). A
//! [`ManualClock`] binds its own instant into every statement instead, which is how
//! simulation tests drive leases, timeouts and backoff without sleeping.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

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

    /// Time since the first call on a clock that never jumps back, is immune to wall-clock
    /// steps, and keeps counting while the process is stopped (`SIGSTOP`) and — on Linux and
    /// Android, where it is `CLOCK_BOOTTIME` — while the machine is suspended. So a node that
    /// wakes from a suspend sees its fence points passed and stops its handlers before they
    /// act. Elsewhere it is [`Instant`](std::time::Instant), which on some systems does not count a suspend;
    /// there, as for a virtual machine stopped by a hypervisor that hides the stop from its
    /// guest's clocks, the database's token guards are what stand (ARCHITECTURE.md §6).
    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Duration> = OnceLock::new();
        let now = counting_suspend();
        now.saturating_sub(*ORIGIN.get_or_init(|| now))
    }
}

/// `CLOCK_BOOTTIME`: monotonic, counting a suspend.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn counting_suspend() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    // Never negative: seconds since boot, nanoseconds below 10⁹.
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// [`Instant`](std::time::Instant) since the first call, where `CLOCK_BOOTTIME` is not at hand.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn counting_suspend() -> Duration {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
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

    /// The system clock's monotonic reading runs at real time's pace (Instant's, with no
    /// suspend in between) and never goes back.
    #[test]
    fn the_system_monotonic_clock_keeps_real_time_and_never_goes_back() {
        let (m0, i0) = (SystemClock.monotonic(), std::time::Instant::now());
        let mut last = m0;
        while i0.elapsed() < Duration::from_millis(50) {
            let m = SystemClock.monotonic();
            assert!(m >= last, "{m:?} after {last:?}");
            last = m;
        }
        let (m, i) = (SystemClock.monotonic() - m0, i0.elapsed());
        let off = m.abs_diff(i);
        assert!(
            off < Duration::from_millis(5),
            "monotonic {m:?} against Instant {i:?}"
        );
    }
}
