//! Retry backoff: exponential with a cap and jitter. Pure, so its bounds are unit-tested.
//!
//! The default schedule (with [`DEFAULT_MAX_ATTEMPTS`](crate::job::DEFAULT_MAX_ATTEMPTS) = 25
//! attempts) keeps retrying a failing job for about ten to twelve days, in line with
//! Sidekiq (25 retries over ~21 days), River (25 attempts) and Oban (20 attempts): a
//! downstream outage of hours or a weekend does not kill the jobs in flight. See
//! [`RetryPolicy`] for the table.

use std::time::Duration;

use crate::error::{Error, Result};

/// Default first delay: **15 s**.
pub const DEFAULT_BASE: Duration = Duration::from_secs(15);
/// Default growth per attempt: **2** (each delay doubles the one before, up to the cap).
pub const DEFAULT_FACTOR: f64 = 2.0;
/// Default longest delay: **24 h** (reached from the 14th failed attempt on).
pub const DEFAULT_CAP: Duration = Duration::from_secs(24 * 3600);
/// Default jitter: **0.2**, the delay is drawn from `[d × (1 − 0.2), d]`.
pub const DEFAULT_JITTER: f64 = 0.2;

/// Exponential backoff with jitter: attempt `n` (1-based) waits
/// `min(cap, base × factor^(n−1))`, reduced by a random share of up to `jitter`.
///
/// # The default schedule
///
/// `base` 15 s, `factor` 2, `cap` 24 h, `jitter` 0.2; with the default 25 attempts a job
/// is retried 24 times before it is dead. The delay after failed attempt `n` is at most:
///
/// | after attempt | delay | total so far |
/// |---:|---:|---:|
/// | 1 | 15 s | 15 s |
/// | 2 | 30 s | 45 s |
/// | 3 | 1 min | 1 min 45 s |
/// | 4 | 2 min | 3 min 45 s |
/// | 5 | 4 min | 7 min 45 s |
/// | 6 | 8 min | 15 min 45 s |
/// | 7 | 16 min | 31 min 45 s |
/// | 8 | 32 min | 1 h 4 min |
/// | 9 | 1 h 4 min | 2 h 8 min |
/// | 10 | 2 h 8 min | 4 h 16 min |
/// | 11 | 4 h 16 min | 8 h 32 min |
/// | 12 | 8 h 32 min | 17 h 4 min |
/// | 13 | 17 h 4 min | 1 d 10 h |
/// | 14 – 24 | 24 h each | 12.4 d |
///
/// Jitter draws each delay from `[0.8 d, d]`, so a job that fails every time is dead
/// between **9.9 and 12.4 days** after its first failure (plus the attempts' own run time).
/// Jobs that failed together (one outage) come back spread out instead of all at once.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::RetryPolicy;
///
/// let p = RetryPolicy::default();
/// assert_eq!(p.delay_with(1, 0.0), Duration::from_secs(15));
/// assert_eq!(p.delay_with(24, 0.0), Duration::from_secs(24 * 3600));
/// // A queue of quick, cheap retries instead:
/// let quick = RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), ..p };
/// assert_eq!(quick.delay_with(3, 0.0), Duration::from_secs(4));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt (default 15 s).
    pub base: Duration,
    /// Growth per attempt, ≥ 1 (default 2).
    pub factor: f64,
    /// Longest delay (default 24 h).
    pub cap: Duration,
    /// Share of the delay that is randomised, in `[0, 1]` (default 0.2); spreads out retries
    /// of jobs that failed together.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: DEFAULT_BASE,
            factor: DEFAULT_FACTOR,
            cap: DEFAULT_CAP,
            jitter: DEFAULT_JITTER,
        }
    }
}

impl RetryPolicy {
    /// A policy that always waits `d` (no growth, no jitter).
    pub fn fixed(d: Duration) -> Self {
        RetryPolicy {
            base: d,
            factor: 1.0,
            cap: d,
            jitter: 0.0,
        }
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad field.
    pub fn validate(&self) -> Result<()> {
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return Err(Error::Config {
                field: "retry.factor",
                reason: format!("{} must be a finite number ≥ 1", self.factor),
            });
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::Config {
                field: "retry.jitter",
                reason: format!("{} must be between 0 and 1", self.jitter),
            });
        }
        if self.cap < self.base {
            return Err(Error::Config {
                field: "retry.cap",
                reason: format!("{:?} is below retry.base {:?}", self.cap, self.base),
            });
        }
        Ok(())
    }

    /// The delay before retrying after failed attempt `attempt` (1-based), with `unit` in
    /// `[0, 1)` supplying the jitter (pass a random number; tests pass fixed ones).
    pub fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = self.base.as_secs_f64() * self.factor.powi(exp);
        let capped = raw.min(self.cap.as_secs_f64());
        let jittered = capped * (1.0 - self.jitter * unit.clamp(0.0, 1.0));
        Duration::try_from_secs_f64(jittered.max(0.0)).unwrap_or(self.cap)
    }

    /// The delay before retrying after failed attempt `attempt`, with random jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, random_unit())
    }
}

/// A random number in `[0, 1)` (from a fresh UUID's random bits; no extra dependency).
fn random_unit() -> f64 {
    let bits = uuid::Uuid::new_v4().as_u128() >> 75; // 53 random bits
    bits as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(10),
            jitter: 0.0,
        };
        let d: Vec<u64> = (1..=6).map(|a| p.delay_with(a, 0.5).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 10, 10]);
        assert_eq!(p.delay_with(u32::MAX, 0.0), Duration::from_secs(10));
    }

    /// The default schedule: never shorter from one attempt to the next, capped at a day,
    /// and 24 retries spread over the 9.9 to 12.4 days the docs promise.
    #[test]
    fn the_default_schedule_grows_is_capped_and_spans_the_documented_days() {
        let p = RetryPolicy::default();
        let retries = crate::job::DEFAULT_MAX_ATTEMPTS - 1;
        assert_eq!(retries, 24);
        let longest: Vec<Duration> = (1..=retries).map(|a| p.delay_with(a, 0.0)).collect();
        assert!(
            longest.windows(2).all(|w| w[0] <= w[1]),
            "not monotone: {longest:?}"
        );
        assert_eq!(longest[0], Duration::from_secs(15));
        assert_eq!(longest[12], Duration::from_secs(61_440), "after attempt 13");
        assert!(longest.iter().all(|d| *d <= DEFAULT_CAP));
        assert_eq!(longest[13], DEFAULT_CAP, "capped from attempt 14 on");
        let day = 86_400.0;
        let total = |unit: f64| -> f64 {
            (1..=retries)
                .map(|a| p.delay_with(a, unit).as_secs_f64())
                .sum::<f64>()
                / day
        };
        let (most, least) = (total(0.0), total(1.0));
        assert!((12.4..12.5).contains(&most), "{most} days");
        assert!((9.9..10.0).contains(&least), "{least} days");
        for _ in 0..20 {
            let drawn: f64 = (1..=retries).map(|a| p.delay(a).as_secs_f64()).sum::<f64>() / day;
            assert!((least..=most).contains(&drawn), "{drawn} days");
        }
    }

    #[test]
    fn jitter_stays_within_its_share() {
        let p = RetryPolicy::default();
        for attempt in 1..20 {
            let full = p.delay_with(attempt, 0.0);
            for _ in 0..50 {
                let d = p.delay(attempt);
                assert!(d <= full, "{d:?} > {full:?}");
                assert!(d.as_secs_f64() >= full.as_secs_f64() * (1.0 - p.jitter) - 1e-9);
            }
        }
        let u = random_unit();
        assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn bad_policies_name_their_field() {
        let bad = |p: RetryPolicy| match p.validate() {
            Err(Error::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let d = RetryPolicy::default();
        assert_eq!(bad(RetryPolicy { factor: 0.5, ..d }), "retry.factor");
        assert_eq!(bad(RetryPolicy { jitter: 1.5, ..d }), "retry.jitter");
        assert_eq!(
            bad(RetryPolicy {
                cap: Duration::ZERO,
                ..d
            }),
            "retry.cap"
        );
        assert!(RetryPolicy::fixed(Duration::from_secs(3))
            .validate()
            .is_ok());
    }
}
