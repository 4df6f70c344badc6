//! Scheduler and queue settings. Every default is a named constant and every setting is
//! checked by `validate()`, which names the offending field; the scheduler refuses to start
//! with a bad one.

use std::time::Duration;

use crate::backoff::RetryPolicy;
use crate::error::{Error, Result};
use crate::new_job::check_name;
use crate::queue::QueueLimits;

/// Jobs of one queue run at once on one node: **10**.
pub const DEFAULT_CONCURRENCY: u32 = 10;
/// The most claimed jobs a queue keeps ready beyond its running ones: **1,000**, so a worker
/// that finishes starts the next job without waiting for a round trip. Their leases are held
/// and renewed like any other. The window adapts below this (see
/// 200 ms): deep for quick jobs, shallow
/// for slow ones; 0 turns prefetch off.
pub const DEFAULT_PREFETCH: u32 = 1000;
/// How often an idle fetcher looks for due jobs: **1 s** (PostgreSQL also wakes it at once
/// on enqueue).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Lease length: **30 s**. A job whose node dies runs again elsewhere about this long later.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Heartbeat, how often a node renews all its leases: **10 s** (a third of the lease).
pub const DEFAULT_RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often running jobs' deadlines (timeout, cancel grace, lease) are checked: **200 ms**.
pub const DEFAULT_DEADLINE_CHECK_EVERY: Duration = Duration::from_millis(200);
/// How often the sweeper reclaims expired leases: **15 s**.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(15);
/// Jobs reclaimed per sweep batch: **100**.
pub const DEFAULT_SWEEP_BATCH: u32 = 100;
/// How often the archiver runs: **60 s**.
pub const DEFAULT_ARCHIVE_EVERY: Duration = Duration::from_secs(60);
/// Succeeded and cancelled jobs stay in the live table this long: **24 h**.
pub const DEFAULT_ARCHIVE_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Dead jobs stay in the live table this long: **28 days**. Dead letters wait for a human
/// (to read the error, fix the cause and retry them), so they are kept far longer than
/// successes, and the dead count does not silently drop while nobody has looked.
pub const DEFAULT_ARCHIVE_DEAD_AFTER: Duration = Duration::from_secs(28 * 24 * 3600);
/// Archived jobs are deleted this long after they were archived: **7 days**.
pub const DEFAULT_PRUNE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
/// Rows moved or deleted per archiver batch: **1,000**.
pub const DEFAULT_ARCHIVE_BATCH: u32 = 1000;
/// How long a cancelled handler may take to return before it is stopped: **5 s**.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How long graceful shutdown waits for running jobs: **30 s**.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a node refreshes its row in the node registry (10 s); it counts as alive for
/// three of these.
pub const DEFAULT_NODE_HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// How long a due job may wait with no live node able to run it before it is reported
/// (5 minutes).
pub const DEFAULT_UNSERVED_AFTER: Duration = Duration::from_secs(300);
/// How often a node looks for such jobs (1 minute).
pub const DEFAULT_UNSERVED_CHECK_EVERY: Duration = Duration::from_secs(60);
/// Default [`SchedulerConfig::leader_lease`]: 10 s. Renewed every third of it, so another node
/// takes over at most about 13.3 s after a leader stops.
pub const DEFAULT_LEADER_LEASE: Duration = Duration::from_secs(10);
/// The shortest [`SchedulerConfig::leader_lease`]: 1 s.
pub const MIN_LEADER_LEASE: Duration = Duration::from_secs(1);

/// Settings of one queue on one node.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// Jobs run at once, 1 to 10,000 (default 10).
    pub concurrency: u32,
    /// Claimed jobs kept ready beyond the running ones (default 1,000; see
    /// [`DEFAULT_PREFETCH`]).
    pub prefetch: u32,
    /// How often an idle fetcher polls (default 1 s).
    pub poll_interval: Duration,
    /// Retry policy for this queue (default `None`: the scheduler's).
    pub retry: Option<RetryPolicy>,
    /// Limits shared by every node, declared with the queue (default `None`: whatever is
    /// stored; see [`limits`](Self::limits)).
    pub limits: Option<QueueLimits>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            concurrency: DEFAULT_CONCURRENCY,
            prefetch: DEFAULT_PREFETCH,
            poll_interval: DEFAULT_POLL_INTERVAL,
            retry: None,
            limits: None,
        }
    }
}

impl QueueConfig {
    /// Sets the concurrency.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets the prefetch.
    pub fn prefetch(mut self, n: u32) -> Self {
        self.prefetch = n;
        self
    }

    /// Sets the poll interval.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// Sets this queue's retry policy.
    pub fn retry(mut self, p: RetryPolicy) -> Self {
        self.retry = Some(p);
        self
    }

    /// Declares the queue's limits with the queue: the node writes them for every node
    /// (as [`Client::set_queue_limits`](crate::Client::set_queue_limits) would, keeping a
    /// pause) when it starts, and its fetcher claims nothing from the queue until they are
    /// written — so they hold from its first claim, even on a database no node has served
    /// yet. Every node that declares them writes them again at its start, so the code is where
    /// they live: an operator's change with `jobvisor limit` lasts until the next start of a
    /// node that declares others. Nodes that declare none leave the stored ones alone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use jobvisor::{QueueConfig, QueueLimits, RateLimit};
    ///
    /// let payments = QueueConfig::default().concurrency(20).limits(
    ///     QueueLimits::default()
    ///         .concurrency(50) // across all nodes
    ///         .rate(RateLimit::new(100, Duration::from_secs(1)).unwrap()),
    /// );
    /// # let _ = payments;
    /// ```
    pub fn limits(mut self, limits: QueueLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    pub(crate) fn validate(&self, name: &str) -> Result<()> {
        check_name("queue", name, crate::job::MAX_QUEUE_LEN).map_err(|e| Error::Config {
            field: "queue",
            reason: e.to_string(),
        })?;
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(Error::Config {
                field: "queue.concurrency",
                reason: format!(
                    "{} for queue {name:?}; expected 1..=10000",
                    self.concurrency
                ),
            });
        }
        if self.prefetch > 100_000 {
            return Err(Error::Config {
                field: "queue.prefetch",
                reason: format!(
                    "{} for queue {name:?}; expected at most 100000",
                    self.prefetch
                ),
            });
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config {
                field: "queue.poll_interval",
                reason: format!("zero for queue {name:?}; expected more than 0"),
            });
        }
        if let Some(r) = &self.retry {
            r.validate()?;
        }
        if let Some(l) = &self.limits {
            l.validate().map_err(|e| Error::Config {
                field: "queue.limits",
                reason: format!("for queue {name:?}: {e}"),
            })?;
        }
        Ok(())
    }
}

/// Node-wide settings.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Lease length (default 30 s).
    pub lease: Duration,
    /// Heartbeat interval (default 10 s); at most a third of `lease`, so two renewals can
    /// fail before it expires. A renewal unanswered for half of it (at most 1 s) is hedged:
    /// another goes out on a fresh connection. A network cut shorter than
    /// `lease − min(lease/6, 5 s) − renew_every − min(renew_every/2, 1 s)` (14 s with the
    /// defaults) costs no running job.
    pub renew_every: Duration,
    /// How often deadlines are checked (default 200 ms).
    pub deadline_check_every: Duration,
    /// Sweeper interval (default 15 s).
    pub sweep_every: Duration,
    /// Sweeper batch size (default 100).
    pub sweep_batch: u32,
    /// Archiver interval (default 60 s).
    pub archive_every: Duration,
    /// Live-table retention of succeeded and cancelled jobs (default 24 h).
    pub archive_after: Duration,
    /// Live-table retention of dead jobs (default 28 days); at least `archive_after`.
    pub archive_dead_after: Duration,
    /// Archive retention (default 7 days).
    pub prune_after: Duration,
    /// Archiver batch size (default 1,000).
    pub archive_batch: u32,
    /// Default retry policy (default [`RetryPolicy::default`]: 15 s doubling to 24 h).
    pub retry: RetryPolicy,
    /// Threads that run handlers (default: the number of CPUs).
    pub handler_threads: usize,
    /// Grace given to a cancelled handler (default 5 s).
    pub cancel_grace: Duration,
    /// Graceful shutdown's wait for running jobs (default 30 s).
    pub shutdown_timeout: Duration,
    /// Install interval timers (default true; false in simulation: tests send the ticks).
    pub timers: bool,
    /// How often the node refreshes its row in the node registry, which says which queues
    /// it serves and which kinds it runs (default 10 s, [`DEFAULT_NODE_HEARTBEAT_EVERY`]).
    /// A node silent for three of these counts as gone.
    pub node_heartbeat_every: Duration,
    /// Due jobs that have waited this long with no live node serving their queue, or none
    /// with a handler for their kind, are reported: a warning and [`Event::Unserved`]
    /// (default 5 min, [`DEFAULT_UNSERVED_AFTER`]).
    ///
    /// [`Event::Unserved`]: crate::Event::Unserved
    pub unserved_after: Duration,
    /// How often the node looks for such jobs (default 1 min,
    /// [`DEFAULT_UNSERVED_CHECK_EVERY`]); each check repeats the report while they wait.
    pub unserved_check_every: Duration,
    /// How often the node refreshes the database-wide gauges — jobs by queue and state, due
    /// jobs, queue lag, node heartbeats (default 15 s,
    /// [`DEFAULT_GAUGE_INTERVAL`](crate::metrics::DEFAULT_GAUGE_INTERVAL); `None`: not
    /// refreshed). The counts run once per database per interval, by whichever node takes
    /// the turn; see [`DatabaseGauges`](crate::metrics::DatabaseGauges).
    pub gauges_every: Option<Duration>,
    /// How long the database's leader holds leadership without renewing it (default 10 s,
    /// [`DEFAULT_LEADER_LEASE`]; at least [`MIN_LEADER_LEASE`]). Every node tries to keep or
    /// take it every third of this; once the leader stops, another node takes over within
    /// about `leader_lease × 4/3`. The leader computes the database-wide gauges.
    pub leader_lease: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            lease: DEFAULT_LEASE,
            renew_every: DEFAULT_RENEW_EVERY,
            deadline_check_every: DEFAULT_DEADLINE_CHECK_EVERY,
            sweep_every: DEFAULT_SWEEP_EVERY,
            sweep_batch: DEFAULT_SWEEP_BATCH,
            archive_every: DEFAULT_ARCHIVE_EVERY,
            archive_after: DEFAULT_ARCHIVE_AFTER,
            archive_dead_after: DEFAULT_ARCHIVE_DEAD_AFTER,
            prune_after: DEFAULT_PRUNE_AFTER,
            archive_batch: DEFAULT_ARCHIVE_BATCH,
            retry: RetryPolicy::default(),
            handler_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            cancel_grace: DEFAULT_CANCEL_GRACE,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            timers: true,
            node_heartbeat_every: DEFAULT_NODE_HEARTBEAT_EVERY,
            unserved_after: DEFAULT_UNSERVED_AFTER,
            unserved_check_every: DEFAULT_UNSERVED_CHECK_EVERY,
            gauges_every: Some(crate::metrics::DEFAULT_GAUGE_INTERVAL),
            leader_lease: DEFAULT_LEADER_LEASE,
        }
    }
}

/// Generates a chainable setter per field.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),+ $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, v: $ty) -> Self {
                self.$name = v;
                self
            }
        )+
    };
}

impl SchedulerConfig {
    setters! {
        /// Sets the lease length.
        lease: Duration,
        /// Sets the heartbeat interval.
        renew_every: Duration,
        /// Sets how often deadlines are checked.
        deadline_check_every: Duration,
        /// Sets the sweeper interval.
        sweep_every: Duration,
        /// Sets the sweeper batch size.
        sweep_batch: u32,
        /// Sets the archiver interval.
        archive_every: Duration,
        /// Sets how long succeeded and cancelled jobs stay in the live table.
        archive_after: Duration,
        /// Sets how long dead jobs stay in the live table (at least `archive_after`).
        archive_dead_after: Duration,
        /// Sets how long archived jobs are kept.
        prune_after: Duration,
        /// Sets the archiver batch size.
        archive_batch: u32,
        /// Sets the default retry policy.
        retry: RetryPolicy,
        /// Sets the number of handler threads.
        handler_threads: usize,
        /// Sets the grace a cancelled handler gets.
        cancel_grace: Duration,
        /// Sets graceful shutdown's wait.
        shutdown_timeout: Duration,
        /// Installs interval timers or not (simulation sends ticks itself).
        timers: bool,
        /// Sets how often the node refreshes its registry row.
        node_heartbeat_every: Duration,
        /// Sets how long due jobs may wait unserved before they are reported.
        unserved_after: Duration,
        /// Sets how often unserved jobs are looked for.
        unserved_check_every: Duration,
        /// Sets how often the database-wide gauges are refreshed (`None`: never).
        gauges_every: Option<Duration>,
        /// Sets how long leadership lasts without renewal.
        leader_lease: Duration,
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::Config`] naming the first bad field and what was expected.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("lease", self.lease),
            ("renew_every", self.renew_every),
            ("deadline_check_every", self.deadline_check_every),
            ("sweep_every", self.sweep_every),
            ("archive_every", self.archive_every),
            ("node_heartbeat_every", self.node_heartbeat_every),
            ("unserved_check_every", self.unserved_check_every),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(Error::Config {
                    field,
                    reason: "must be more than 0".into(),
                });
            }
        }
        if let Some(d) = self
            .gauges_every
            .filter(|d| *d < crate::metrics::MIN_GAUGE_INTERVAL)
        {
            return Err(Error::Config {
                field: "gauges_every",
                reason: format!(
                    "{d:?} is under the minimum of {:?}; expected seconds or more (the counts \
                     read the whole jobs table)",
                    crate::metrics::MIN_GAUGE_INTERVAL
                ),
            });
        }
        if self.leader_lease < MIN_LEADER_LEASE {
            return Err(Error::Config {
                field: "leader_lease",
                reason: format!(
                    "{:?} is under the minimum of {MIN_LEADER_LEASE:?}; expected seconds (it \
                     is renewed every third of it)",
                    self.leader_lease
                ),
            });
        }
        if self.renew_every * 3 > self.lease {
            return Err(Error::Config {
                field: "renew_every",
                reason: format!(
                    "{:?} is more than a third of the lease {:?}; a lease must survive two \
                     missed renewals",
                    self.renew_every, self.lease
                ),
            });
        }
        if self.sweep_batch == 0 || self.archive_batch == 0 {
            return Err(Error::Config {
                field: if self.sweep_batch == 0 {
                    "sweep_batch"
                } else {
                    "archive_batch"
                },
                reason: "must be at least 1".into(),
            });
        }
        if self.handler_threads == 0 {
            return Err(Error::Config {
                field: "handler_threads",
                reason: "must be at least 1".into(),
            });
        }
        if self.archive_dead_after < self.archive_after {
            return Err(Error::Config {
                field: "archive_dead_after",
                reason: format!(
                    "{:?} is shorter than archive_after {:?}; dead jobs are kept at least as \
                     long as successes",
                    self.archive_dead_after, self.archive_after
                ),
            });
        }
        if self.prune_after.is_zero() {
            return Err(Error::Config {
                field: "prune_after",
                reason: "must be more than 0".into(),
            });
        }
        self.retry.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<()>) -> &'static str {
        match r {
            Err(Error::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        SchedulerConfig::default().validate().unwrap();
        let d = SchedulerConfig::default();
        assert!(
            d.archive_dead_after >= 14 * d.archive_after,
            "dead letters are kept weeks, successes a day"
        );
        QueueConfig::default().validate("default").unwrap();
    }

    #[test]
    fn bad_settings_name_their_field() {
        let d = SchedulerConfig::default();
        assert_eq!(
            field(
                SchedulerConfig {
                    lease: Duration::ZERO,
                    ..d
                }
                .validate()
            ),
            "lease"
        );
        assert_eq!(
            field(
                SchedulerConfig {
                    renew_every: Duration::from_secs(20),
                    ..d
                }
                .validate()
            ),
            "renew_every"
        );
        assert_eq!(
            field(
                SchedulerConfig {
                    sweep_batch: 0,
                    ..d
                }
                .validate()
            ),
            "sweep_batch"
        );
        assert_eq!(
            field(
                SchedulerConfig {
                    handler_threads: 0,
                    ..d
                }
                .validate()
            ),
            "handler_threads"
        );
        assert_eq!(
            field(
                SchedulerConfig::default()
                    .archive_after(Duration::from_secs(3600))
                    .archive_dead_after(Duration::from_secs(60))
                    .validate()
            ),
            "archive_dead_after"
        );
        assert_eq!(
            field(QueueConfig::default().concurrency(0).validate("q")),
            "queue.concurrency"
        );
        assert_eq!(field(QueueConfig::default().validate("")), "queue");
    }
}
