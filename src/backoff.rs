//! Retry backoff: exponential with a cap and jitter. Pure, so its bounds are unit-tested.

use std::time::Duration;

use crate::error::{Error, Result};

/// Default first delay.
pub const DEFAULT_BASE: Duration = Duration::from_secs(1);
/// Default growth per attempt.
pub const DEFAULT_FACTOR: f64 = 2.0;
/// Default longest delay.
pub const DEFAULT_CAP: Duration = Duration::from_secs(3600);
/// Default jitter: the delay is drawn from `[d × (1 − j), d]`.
pub const DEFAULT_JITTER: f64 = 0.2;

/// Exponential backoff with jitter: attempt `n` (1-based) waits
/// `min(cap, base × factor^(n−1))`, reduced by a random share of up to `jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// Growth per attempt (≥ 1).
    pub factor: f64,
    /// Longest delay.
    pub cap: Duration,
    /// Share of the delay that is randomised, in `[0, 1]`; spreads out retries of jobs that
    /// failed together.
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
