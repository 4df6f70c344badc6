//! A queue's shared settings, as an application states them and reads them back: a pause,
//! the [`QueueLimits`] (global concurrency, per-partition concurrency, a [`RateLimit`]) and
//! their bounds, and the [`QueueInfo`] a queue's settings are listed as. Stored and obeyed
//! by the store (`store/queues.rs`, the claim in `store/claim/`).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// Longest rate window, **1 day**.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// Shortest rate window, **1 ms**.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// How long after its claim was sent a job of a rate-limited queue may still start:
/// **50 ms**. The claims of such a queue are spaced over the period plus this margin, so a
/// queue that always has due jobs starts `jobs` per `period + 50 ms`; a job whose claim was
/// answered later than this goes back unstarted, without using an attempt (it still counts
/// in the window, so the bound holds). See [`RateLimit`].
pub const RATE_START_MARGIN: Duration = Duration::from_millis(50);
/// Largest limit (concurrency, per partition, jobs per rate window): **1,000,000**.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest `paused_by` text, in characters: **255**.
pub const MAX_PAUSED_BY_LEN: usize = 255;

/// At most `jobs` handler starts across all nodes in any window of `per`.
///
/// Exact at the start, not only at the claim: a rate-limited queue is claimed without
/// prefetch, each claimed job starts within [`RATE_START_MARGIN`] of its claim or goes back
/// unstarted, and the claims are spaced over `per` plus that margin — so a saturated queue
/// starts `jobs` per `per + 50 ms`.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::RateLimit;
///
/// let r = RateLimit::new(100, Duration::from_secs(1)).unwrap(); // 100 jobs a second
/// assert_eq!(r.jobs(), 100);
/// assert!(RateLimit::new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RateLimit {
    pub(crate) jobs: u32,
    #[serde(rename = "per_ms", serialize_with = "ser_ms")]
    pub(crate) per: Duration,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl RateLimit {
    /// `jobs` claims (1 to [`MAX_LIMIT`]) in any window of `per` ([`MIN_RATE_PERIOD`] to
    /// [`MAX_RATE_PERIOD`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `rate` for a value out of range.
    pub fn new(jobs: u32, per: Duration) -> Result<Self> {
        check_limit("rate", jobs)?;
        if per < MIN_RATE_PERIOD || per > MAX_RATE_PERIOD {
            return Err(Error::invalid(
                "rate",
                format!("period is {per:?}; expected {MIN_RATE_PERIOD:?} to {MAX_RATE_PERIOD:?}"),
            ));
        }
        Ok(RateLimit { jobs, per })
    }

    /// Jobs per window.
    pub fn jobs(&self) -> u32 {
        self.jobs
    }

    /// The window.
    pub fn per(&self) -> Duration {
        self.per
    }
}

fn check_limit(field: &'static str, n: u32) -> Result<()> {
    if n == 0 || n > MAX_LIMIT {
        return Err(Error::invalid(
            field,
            format!("is {n}; expected 1 to {MAX_LIMIT} (clear the limit to lift it)"),
        ));
    }
    Ok(())
}

/// The limits of a queue, enforced across every node; `None` = no limit. All default to
/// `None` (unlimited).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::{QueueLimits, RateLimit};
///
/// // At most 20 running at once, 2 per tenant, 50 started per second.
/// let limits = QueueLimits::default()
///     .concurrency(20)
///     .per_partition(2)
///     .rate(RateLimit::new(50, Duration::from_secs(1)).unwrap());
/// assert_eq!(limits.concurrency, Some(20));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueLimits {
    /// Most jobs of the queue running at once, counting claimed jobs that wait in a node's
    /// prefetch (they hold leases).
    pub concurrency: Option<u32>,
    /// Most jobs running at once per partition key (see
    /// [`NewJob::partition`](crate::NewJob::partition)); jobs without one are not limited.
    pub per_partition: Option<u32>,
    /// Most jobs claimed in any window.
    pub rate: Option<RateLimit>,
}

impl QueueLimits {
    /// Sets the global concurrency limit.
    #[must_use]
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Sets the per-partition limit.
    #[must_use]
    pub fn per_partition(mut self, n: u32) -> Self {
        self.per_partition = Some(n);
        self
    }

    /// Sets the rate limit.
    #[must_use]
    pub fn rate(mut self, r: RateLimit) -> Self {
        self.rate = Some(r);
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(n) = self.concurrency {
            check_limit("concurrency", n)?;
        }
        if let Some(n) = self.per_partition {
            check_limit("per_partition", n)?;
        }
        if let Some(r) = self.rate {
            RateLimit::new(r.jobs, r.per)?;
        }
        Ok(())
    }
}

/// A queue's shared settings, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue.
    pub name: String,
    /// When it was paused, if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it (free text given to [`Client::pause_queue`](crate::Client::pause_queue)).
    pub paused_by: Option<String>,
    /// Its limits.
    pub limits: QueueLimits,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl QueueInfo {
    /// Whether claims of this queue are paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }
}
