//! Periodic jobs: a [`Schedule`] — a cron expression read in an IANA time zone, or a fixed
//! interval — and the job each fire enqueues. Declared in code on the builder
//! ([`SchedulerBuilder::periodic`](crate::SchedulerBuilder::periodic)) and stored in the
//! database at start (`jobvisor_schedules`), or added at run time
//! ([`Client::add_schedule`](crate::Client::add_schedule)); fired by the database's leader:
//! **exactly one job per fire** whatever the number of nodes (ARCHITECTURE.md §7.10).
//!
//! Cron expressions are parsed by [`croner`] (five fields, or six with seconds first; `L`,
//! `#`, `W`, names of days and months), time zones by [`chrono_tz`]. Daylight saving time
//! follows croner's documented rules: a fixed time that falls in a spring-forward gap (02:30
//! on the day clocks jump from 02:00 to 03:00) fires once, at the first instant after the
//! gap (03:00); a fixed time that occurs twice on a fall-back day fires once, at its first
//! occurrence; wildcard and stepped fields (`*/15 * * * *`) fire at every real instant that
//! matches, so an hourly job runs 23 times on a spring-forward day and 25 on a fall-back day.
//! Fixed intervals ([`Schedule::every`]) ignore time zones: fires are the multiples of the
//! interval since the Unix epoch.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use jobvisor::{NewJob, Scheduler, Store, QueueConfig};
//! use jobvisor::schedule::{MissedFires, Schedule};
//! # fn f(store: Store) -> jobvisor::Result<()> {
//! let node = Scheduler::builder(store)
//!     .queue("default", QueueConfig::default())
//!     # .handler("report", jobvisor::handler_fn(|_: serde_json::Value, _ctx| async { jobvisor::JobOutcome::success(()) }))
//!     .periodic(
//!         Schedule::cron("nightly-report", "0 30 2 * * *", NewJob::new("report", serde_json::json!({})))
//!             .time_zone("Europe/Berlin")
//!             .missed(MissedFires::Latest),
//!     )
//!     .start()?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::job::NewJob;

/// The shortest fixed interval: **1 s**.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// A fire more than this late counts as missed for [`MissedFires::Skip`]: **1 minute**, or
/// the leader takeover time (`leader_lease × 4/3` and a tick) if that is longer, so a fire
/// due while leadership moves is not skipped.
pub const MISSED_GRACE: Duration = Duration::from_secs(60);
/// How often a running node declares its schedules again: **30 s**.
pub const DECLARE_EVERY: Duration = Duration::from_secs(30);
/// A stored schedule no node has declared for this long is retired by the next node that
/// syncs its own: **2 minutes** (four missed declarations). So a node of an older release
/// restarting during a rolling deploy cannot retire a schedule the newer nodes declare.
pub const RETIRE_AFTER: Duration = Duration::from_secs(120);
/// The most missed fires [`MissedFires::All`] may run: **1,000**.
pub const MAX_CATCH_UP: u32 = 1_000;
/// The longest schedule name: **128 bytes**.
pub const MAX_NAME_BYTES: usize = 128;
/// The largest job a schedule may store (its JSON): **60 KiB** (MySQL `TEXT` holds 64 KiB).
pub const MAX_TEMPLATE_BYTES: usize = 60 * 1024;
/// The default time zone of a cron expression: **UTC**.
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// What happens to fires that passed while no node fired them (every node down, the schedule
/// paused): counted from the schedule's next fire as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedFires {
    /// Run the latest missed fire once, skip the others (the default).
    #[default]
    Latest,
    /// Run each missed fire, up to `max` of the most recent ones (at most [`MAX_CATCH_UP`]).
    All {
        /// The most fires run at once.
        max: u32,
    },
    /// Run none of them: only a fire at most [`MISSED_GRACE`] late (or the leader takeover
    /// time, if longer) still runs.
    Skip,
}

impl MissedFires {
    /// As stored: `latest`, `all:<max>`, `skip`.
    pub(crate) fn to_text(self) -> String {
        match self {
            MissedFires::Latest => "latest".into(),
            MissedFires::All { max } => format!("all:{max}"),
            MissedFires::Skip => "skip".into(),
        }
    }

    /// Reads the stored form.
    pub(crate) fn from_text(s: &str) -> Option<MissedFires> {
        match s {
            "latest" => Some(MissedFires::Latest),
            "skip" => Some(MissedFires::Skip),
            _ => s
                .strip_prefix("all:")?
                .parse()
                .ok()
                .map(|max| MissedFires::All { max }),
        }
    }
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    Cron(String),
    Every(Duration),
}

/// A periodic job: a name, when it fires, and the job each fire enqueues. See the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    spec: Spec,
    time_zone: String,
    job: NewJob,
    missed: MissedFires,
}

impl Schedule {
    /// Fires at the instants matching a cron expression (five fields, or six with seconds
    /// first), read in UTC unless [`time_zone`](Self::time_zone) says otherwise.
    pub fn cron(name: impl Into<String>, expression: impl Into<String>, job: NewJob) -> Self {
        Schedule::with(name.into(), Spec::Cron(expression.into()), job)
    }

    /// Fires every `interval` (at least [`MIN_INTERVAL`]): at the multiples of it since the
    /// Unix epoch, so every node agrees on the instants.
    pub fn every(name: impl Into<String>, interval: Duration, job: NewJob) -> Self {
        Schedule::with(name.into(), Spec::Every(interval), job)
    }

    fn with(name: String, spec: Spec, job: NewJob) -> Self {
        Schedule {
            name,
            spec,
            time_zone: DEFAULT_TIME_ZONE.into(),
            job,
            missed: MissedFires::default(),
        }
    }

    /// Reads the cron expression in an IANA time zone (`"Europe/Berlin"`, default
    /// [`DEFAULT_TIME_ZONE`]).
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = zone.into();
        self
    }

    /// What to do with fires missed while no node ran (default [`MissedFires::Latest`]).
    pub fn missed(mut self, policy: MissedFires) -> Self {
        self.missed = policy;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind of job each fire enqueues.
    pub(crate) fn job_kind(&self) -> &str {
        &self.job.kind
    }

    /// [`compile`](Self::compile) for a schedule added or changed at run time: what is
    /// wrong is bad input ([`Error::InvalidInput`]), not a node's configuration.
    pub(crate) fn compile_runtime(&self) -> Result<Compiled> {
        self.compile().map_err(|e| match e {
            Error::Config { reason, .. } => Error::invalid("schedule", reason),
            other => other,
        })
    }

    /// Checks everything and renders what is stored; errors name the schedule.
    pub(crate) fn compile(&self) -> Result<Compiled> {
        let bad = |reason: String| Error::Config {
            field: "schedules",
            reason: format!("schedule {:?}: {reason}", self.name),
        };
        crate::new_job::check_name("schedule", &self.name, crate::job::MAX_KIND_LEN)
            .map_err(|e| bad(e.to_string()))?;
        let spec = match &self.spec {
            Spec::Cron(e) => e.trim().to_string(),
            Spec::Every(d) => {
                if *d < MIN_INTERVAL {
                    return Err(bad(format!(
                        "interval {d:?} is under the minimum of {MIN_INTERVAL:?}"
                    )));
                }
                format!("every {}", d.as_micros())
            }
        };
        if self.name.len() > MAX_NAME_BYTES {
            return Err(bad(format!(
                "the name is {} bytes; expected at most {MAX_NAME_BYTES}",
                self.name.len()
            )));
        }
        let plan = Plan::parse(&spec, &self.time_zone).map_err(bad)?;
        if plan.next_after(Utc::now().timestamp_micros()).is_none() {
            return Err(bad(format!("{spec:?} never fires again")));
        }
        if let MissedFires::All { max } = self.missed {
            if max == 0 || max > MAX_CATCH_UP {
                return Err(bad(format!(
                    "MissedFires::All {{ max: {max} }} is out of range; expected 1 to \
                     {MAX_CATCH_UP}"
                )));
            }
        }
        if self.job.unique_key.is_some() {
            return Err(bad(
                "its job has a unique key; a schedule keys each job by its fire itself".into(),
            ));
        }
        if self.job.unique_scope.is_some() {
            return Err(bad(
                "its job has a unique scope; a schedule's keys are one per fire, held until the \
                 job is archived"
                    .into(),
            ));
        }
        if !matches!(self.job.run_at, crate::job::RunAt::Now) {
            return Err(bad(
                "its job has a run_at; each fire's job runs at the fire's instant".into(),
            ));
        }
        let mut probe = self.job.clone();
        probe.unique_key = Some(fire_key(&self.name, 0));
        probe
            .validate(crate::new_job::DEFAULT_MAX_PAYLOAD_BYTES)
            .map_err(|e| bad(e.to_string()))?;
        let template = Template::of(&self.job).to_text();
        if template.len() > MAX_TEMPLATE_BYTES {
            return Err(bad(format!(
                "its job is {} bytes as stored; expected at most {MAX_TEMPLATE_BYTES} (a larger \
                 payload belongs in a table of yours, referenced by id)",
                template.len()
            )));
        }
        Ok(Compiled {
            name: self.name.clone(),
            spec,
            time_zone: self.time_zone.clone(),
            template,
            missed: self.missed.to_text(),
        })
    }
}

/// A checked schedule, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compiled {
    pub(crate) name: String,
    pub(crate) spec: String,
    pub(crate) time_zone: String,
    pub(crate) template: String,
    pub(crate) missed: String,
}

/// The job a fire enqueues, as stored (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Template {
    kind: String,
    queue: String,
    payload: Value,
    priority: i16,
    max_attempts: u32,
    timeout_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partition: Option<String>,
}

impl Template {
    fn of(job: &NewJob) -> Self {
        Template {
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            payload: job.payload.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            timeout_us: u64::try_from(job.timeout.as_micros()).unwrap_or(u64::MAX),
            partition: job.partition.clone(),
        }
    }

    fn to_text(&self) -> String {
        // A struct of strings, numbers and a JSON value always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the stored form.
    pub(crate) fn from_text(s: &str) -> std::result::Result<Self, String> {
        serde_json::from_str(s).map_err(|e| format!("unreadable job template: {e}"))
    }

    /// The job of the fire at `fire_us` (or of a manual trigger, keyed by `key`).
    pub(crate) fn job(&self, key: String, run_at: DateTime<Utc>) -> NewJob {
        let mut j = NewJob::new(self.kind.clone(), self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts)
            .timeout(Duration::from_micros(self.timeout_us))
            .unique_key(key)
            .run_at(run_at);
        j.partition = self.partition.clone();
        j
    }

    /// The job's kind.
    pub(crate) fn kind(&self) -> &str {
        &self.kind
    }

    /// The job's queue.
    pub(crate) fn queue(&self) -> &str {
        &self.queue
    }
}

/// The unique key of schedule `name`'s fire at `fire_us`: the schedule and the instant.
pub(crate) fn fire_key(name: &str, fire_us: i64) -> String {
    format!("schedule:{name}@{}", rfc3339(fire_us))
}

/// An instant (epoch µs) as RFC 3339 UTC.
pub(crate) fn rfc3339(us: i64) -> String {
    Utc.timestamp_micros(us).single().map_or_else(
        || us.to_string(),
        |t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}

/// A parsed schedule: finds fires.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    Cron(Box<croner::Cron>, Tz),
    Every(i64),
}

impl Plan {
    /// Parses a stored spec (`every <µs>` or a cron expression) in `zone`.
    pub(crate) fn parse(spec: &str, zone: &str) -> std::result::Result<Plan, String> {
        let tz: Tz = zone.parse().map_err(|_| {
            format!("unknown time zone {zone:?}; expected an IANA name such as \"Europe/Berlin\"")
        })?;
        if let Some(us) = spec.strip_prefix("every ") {
            let us: i64 = us
                .parse()
                .map_err(|_| format!("bad interval {spec:?}; expected \"every <µs>\""))?;
            return Ok(Plan::Every(us.max(1)));
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(spec)
            .map_err(|e| {
                format!(
                    "invalid cron expression {spec:?}: {e}; expected five fields (minute hour \
                     day month weekday) or six with seconds first"
                )
            })?;
        Ok(Plan::Cron(Box::new(cron), tz))
    }

    /// The first fire strictly after `us` (epoch µs); `None` if there is none (a cron
    /// expression that never matches again).
    pub(crate) fn next_after(&self, us: i64) -> Option<i64> {
        match self {
            Plan::Every(d) => Some((us.div_euclid(*d) + 1).saturating_mul(*d)),
            Plan::Cron(c, tz) => {
                let t = tz.timestamp_micros(us).single()?;
                c.find_next_occurrence(&t, false)
                    .ok()
                    .map(|n| n.with_timezone(&Utc).timestamp_micros())
            }
        }
    }

    /// The last fire at or before `us`.
    pub(crate) fn last_at_or_before(&self, us: i64) -> Option<i64> {
        match self {
            Plan::Every(d) => Some(us.div_euclid(*d).saturating_mul(*d)),
            Plan::Cron(c, tz) => {
                let t = tz.timestamp_micros(us).single()?;
                c.find_previous_occurrence(&t, true)
                    .ok()
                    .map(|n| n.with_timezone(&Utc).timestamp_micros())
            }
        }
    }

    /// What to fire now, given the stored next fire and the missed-fire policy: the fire
    /// instants (oldest first, each ≥ `next` and ≤ `now`) and the next fire after `now`.
    /// `grace`: how late a fire may be and still run under [`MissedFires::Skip`] (µs).
    pub(crate) fn due(&self, next: i64, now: i64, missed: MissedFires, grace: i64) -> Due {
        let after = self.next_after(now);
        if next > now {
            return Due {
                fires: Vec::new(),
                next: Some(next),
            };
        }
        let latest = self
            .last_at_or_before(now)
            .filter(|l| *l >= next)
            .unwrap_or(next);
        let fires = match missed {
            MissedFires::Latest => vec![latest],
            MissedFires::Skip => {
                if now - latest <= grace {
                    vec![latest]
                } else {
                    Vec::new()
                }
            }
            MissedFires::All { max } => {
                let mut fires = vec![latest];
                while fires.len() < max as usize {
                    let Some(f) = fires
                        .last()
                        .and_then(|l| self.last_at_or_before(l - 1))
                        .filter(|f| *f >= next)
                    else {
                        break;
                    };
                    fires.push(f);
                }
                fires.reverse();
                fires
            }
        };
        Due { fires, next: after }
    }
}

/// What [`Plan::due`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    /// The fires to enqueue now, oldest first.
    pub(crate) fires: Vec<i64>,
    /// The next fire after now (`None`: never again).
    pub(crate) next: Option<i64>,
}

/// Where a stored schedule comes from, and so who may change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleOrigin {
    /// Declared in code ([`SchedulerBuilder::periodic`](crate::SchedulerBuilder::periodic)):
    /// stored by the nodes that declare it, retired once none does; changed by a deploy.
    Code,
    /// Added at run time ([`Client::add_schedule`](crate::Client::add_schedule), the CLI, the
    /// dashboard): changed and removed the same way; never touched by a node's sync.
    Runtime,
}

impl ScheduleOrigin {
    /// As stored: `code`, `runtime`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            ScheduleOrigin::Code => "code",
            ScheduleOrigin::Runtime => "runtime",
        }
    }

    /// Reads the stored form.
    pub(crate) fn from_text(s: &str) -> Option<Self> {
        match s {
            "code" => Some(ScheduleOrigin::Code),
            "runtime" => Some(ScheduleOrigin::Runtime),
            _ => None,
        }
    }
}

/// A stored schedule, as [`Client::schedules`](crate::Client::schedules) lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// A cron expression, or `every <µs>` for a fixed interval.
    pub spec: String,
    /// The time zone its cron expression is read in.
    pub time_zone: String,
    /// The kind of job each fire enqueues.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// What happens to missed fires.
    pub missed: MissedFires,
    /// Its next fire (`None`: the expression never matches again).
    pub next_fire_at: Option<DateTime<Utc>>,
    /// Its last fire.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// Since when it is paused.
    pub paused_at: Option<DateTime<Utc>>,
    /// Since when it is retired: no node had declared it for
    /// [`RETIRE_AFTER`] (it no longer fires).
    pub retired_at: Option<DateTime<Utc>>,
    /// When a node last declared it (at its start, then every
    /// [`DECLARE_EVERY`] while it runs); for a run-time schedule, when it was last added or
    /// changed.
    pub declared_at: DateTime<Utc>,
    /// Declared in code or added at run time.
    pub origin: ScheduleOrigin,
    /// For a run-time schedule: when a node last declared a schedule of the same name in code,
    /// which was not stored because this one holds the name (the one in code does not run:
    /// remove this one, or rename the one in code). `None` if no node has.
    pub shadowed_at: Option<DateTime<Utc>>,
}

impl ScheduleInfo {
    /// The spec for people: the cron expression, or the interval in its largest whole unit
    /// (`every 10s`, `every 90m`, `every 250ms`) where the stored form counts µs.
    ///
    /// ```
    /// use jobvisor::schedule::interval_text;
    /// assert_eq!(interval_text("every 10000000"), "every 10s");
    /// assert_eq!(interval_text("every 5400000000"), "every 90m");
    /// assert_eq!(interval_text("every 1500000"), "every 1500ms");
    /// assert_eq!(interval_text("*/5 * * * * *"), "*/5 * * * * *");
    /// ```
    pub fn spec_text(&self) -> String {
        interval_text(&self.spec)
    }
}

/// A stored spec for people: `every <µs>` in its largest whole unit, a cron expression as
/// it is (see [`ScheduleInfo::spec_text`]).
pub fn interval_text(spec: &str) -> String {
    let Some(us) = spec
        .strip_prefix("every ")
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return spec.to_string();
    };
    const UNITS: [(u64, &str); 6] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
        (1, "µs"),
    ];
    let (n, unit) = UNITS
        .iter()
        .find(|(u, _)| us % u == 0 && us >= *u)
        .map_or((us, "µs"), |(u, name)| (us / u, *name));
    format!("every {n}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn at(tz: Tz, y: i32, m: u32, d: u32, h: u32, min: u32) -> i64 {
        tz.from_local_datetime(
            &NaiveDate::from_ymd_opt(y, m, d)
                .unwrap()
                .and_hms_opt(h, min, 0)
                .unwrap(),
        )
        .earliest()
        .unwrap()
        .with_timezone(&Utc)
        .timestamp_micros()
    }

    /// Every fire in `[from, to)`.
    fn fires(p: &Plan, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut t = from - 1;
        while let Some(n) = p.next_after(t).filter(|n| *n < to) {
            out.push(n);
            t = n;
        }
        out
    }

    const HOUR: i64 = 3_600_000_000;

    #[test]
    fn dst_days_fire_fixed_times_once_and_wildcards_at_every_real_instant() {
        for (zone, spring, fall) in [
            ("Europe/Berlin", (2026, 3, 29), (2026, 10, 25)),
            ("America/New_York", (2026, 3, 8), (2026, 11, 1)),
        ] {
            let tz: Tz = zone.parse().unwrap();
            let day =
                |(y, m, d): (i32, u32, u32)| (at(tz, y, m, d, 0, 0), at(tz, y, m, d + 1, 0, 0));
            let daily = Plan::parse("30 2 * * *", zone).unwrap();
            let hourly = Plan::parse("0 * * * *", zone).unwrap();

            // Spring forward: 02:30 does not exist; it fires once, at 03:00 local.
            let (from, to) = day(spring);
            let f = fires(&daily, from, to);
            assert_eq!(f.len(), 1, "{zone}: {f:?}");
            let local = Utc.timestamp_micros(f[0]).unwrap().with_timezone(&tz);
            assert_eq!(local.format("%H:%M").to_string(), "03:00", "{zone}");
            assert_eq!(fires(&hourly, from, to).len(), 23, "{zone}: a 23-hour day");

            // Fall back: 02:30 (Berlin) / 01:30 (New York) happens twice; it fires once.
            let (from, to) = day(fall);
            let twice = if zone == "Europe/Berlin" {
                "30 2 * * *"
            } else {
                "30 1 * * *"
            };
            let f = fires(&Plan::parse(twice, zone).unwrap(), from, to);
            assert_eq!(f.len(), 1, "{zone}: {f:?}");
            assert_eq!(fires(&hourly, from, to).len(), 25, "{zone}: a 25-hour day");
            // Every fire is a distinct instant, in order.
            let all = fires(&hourly, from, to);
            assert!(
                all.windows(2).all(|w| w[1] - w[0] == HOUR),
                "{zone}: {all:?}"
            );
        }
    }

    #[test]
    fn missed_fire_policies_after_three_hours_down() {
        let minute = Plan::parse("* * * * *", "UTC").unwrap();
        let grace = 60_000_000;
        let next = 60_000_000 * 1_000; // a whole minute
        let now = next + 3 * HOUR + 20_000_000; // 3 h 20 s later: 181 fires passed
        let d = minute.due(next, now, MissedFires::Latest, grace);
        assert_eq!(d.fires, vec![next + 3 * HOUR]);
        assert_eq!(d.next, Some(next + 3 * HOUR + 60_000_000));
        let d = minute.due(next, now, MissedFires::All { max: 1_000 }, grace);
        assert_eq!(d.fires.len(), 181);
        assert_eq!((d.fires[0], d.fires[180]), (next, next + 3 * HOUR));
        let d = minute.due(next, now, MissedFires::All { max: 10 }, grace);
        assert_eq!(d.fires.len(), 10, "the most recent ten");
        assert_eq!(d.fires[9], next + 3 * HOUR);
        // The latest fire is 20 s late: within the grace, so Skip runs it alone.
        let d = minute.due(next, now, MissedFires::Skip, grace);
        assert_eq!(d.fires, vec![next + 3 * HOUR]);
        // Hourly, 90 s after the latest fire: every fire was missed, none runs.
        let hourly = Plan::parse("0 * * * *", "UTC").unwrap();
        let h = 1_000 * HOUR;
        let d = hourly.due(h, h + 3 * HOUR + 90_000_000, MissedFires::Skip, grace);
        assert_eq!(d.fires, Vec::<i64>::new(), "90 s late: missed");
        assert_eq!(d.next, Some(h + 4 * HOUR));
        // With a longer grace (a slow leader takeover) the same fire still runs.
        let d = hourly.due(h, h + 3 * HOUR + 90_000_000, MissedFires::Skip, 100_000_000);
        assert_eq!(d.fires, vec![h + 3 * HOUR]);
        // Not yet due: nothing, next unchanged.
        let d = minute.due(next, next - 1, MissedFires::Latest, grace);
        assert_eq!((d.fires.len(), d.next), (0, Some(next)));
    }

    #[test]
    fn intervals_are_aligned_to_the_epoch() {
        let p = Plan::parse("every 90000000", "UTC").unwrap();
        assert_eq!(p.next_after(0), Some(90_000_000));
        assert_eq!(p.next_after(90_000_000), Some(180_000_000));
        assert_eq!(p.last_at_or_before(179_999_999), Some(90_000_000));
    }

    #[test]
    fn bad_schedules_are_refused_naming_them() {
        let job = || NewJob::new("report", serde_json::json!({}));
        let reason = |s: Schedule| match s.compile() {
            Err(Error::Config { field, reason }) => {
                assert_eq!(field, "schedules");
                reason
            }
            other => panic!("{other:?}"),
        };
        let r = reason(Schedule::cron("a", "61 * * * *", job()));
        assert!(
            r.contains("\"a\"") && r.contains("invalid cron expression"),
            "{r}"
        );
        let r = reason(Schedule::cron("b", "* * * * *", job()).time_zone("Mars/Olympus"));
        assert!(
            r.contains("\"b\"") && r.contains("unknown time zone"),
            "{r}"
        );
        let r = reason(Schedule::every("c", Duration::ZERO, job()));
        assert!(
            r.contains("\"c\"") && r.contains("under the minimum"),
            "{r}"
        );
        let r = reason(Schedule::cron("d", "* * * * *", job().unique_key("k")));
        assert!(r.contains("unique key"), "{r}");
        let scoped = job().unique_scope(crate::UniqueScope::WhileActive);
        let r = reason(Schedule::cron("d2", "* * * * *", scoped));
        assert!(r.contains("unique scope"), "{r}");
        let later = job().run_at(chrono::Utc::now());
        let r = reason(Schedule::cron("d3", "* * * * *", later));
        assert!(r.contains("run_at"), "{r}");
        let r = reason(Schedule::cron("e", "* * * * *", job()).missed(MissedFires::All { max: 0 }));
        assert!(r.contains("out of range"), "{r}");
        let r = reason(Schedule::cron("f", "0 0 31 2 *", job()));
        assert!(r.contains("never fires again"), "{r}");
        let r = reason(Schedule::cron("g".repeat(129), "* * * * *", job()));
        assert!(r.contains("at most 128"), "{r}");
        let big = NewJob::new("report", serde_json::json!("x".repeat(70_000)));
        let r = reason(Schedule::cron("h", "* * * * *", big));
        assert!(r.contains("bytes as stored"), "{r}");
        let r = reason(Schedule::cron("", "* * * * *", job()));
        assert!(r.contains("empty"), "{r}");
        assert!(Schedule::cron("ok", "0 30 2 * * *", job())
            .time_zone("Europe/Berlin")
            .compile()
            .is_ok());
    }

    #[test]
    fn missed_policies_round_trip_as_text() {
        for m in [
            MissedFires::Latest,
            MissedFires::Skip,
            MissedFires::All { max: 7 },
        ] {
            assert_eq!(MissedFires::from_text(&m.to_text()), Some(m));
        }
        assert_eq!(MissedFires::from_text("all:x"), None);
    }
}
