//! The command line's grammar (clap): global options, one subcommand per operator task,
//! and the job filters shared by `list`, `retry` and `cancel`.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use jobvisor::JobState;

/// Operate a jobvisor database: migrate it, see what is waiting and who holds what, find,
/// retry and cancel jobs, archive and prune.
///
/// Exit codes: 0 done; 1 the operation failed (database unreachable, a write refused);
/// 2 bad arguments; 3 a job that was named does not exist; 4 a bulk change was not
/// confirmed.
#[derive(Debug, Parser)]
#[command(name = "jobvisor", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Database URL: postgres://user@host/db, mysql://user@host/db or sqlite://path
    /// (the password, if any, is never printed).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// Print JSON (stable field names) instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// PostgreSQL-compatible engines without LISTEN/NOTIFY: neither listen nor notify
    /// (StoreOptions::notifications(false)).
    #[arg(long, global = true)]
    pub(crate) no_notifications: bool,
    /// PostgreSQL-compatible engines without advisory locks: migrate under a row lock
    /// (StoreOptions::advisory_locks(false)); every process migrating the database must agree.
    #[arg(long, global = true)]
    pub(crate) no_advisory_locks: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply pending migrations (safe while other processes migrate too).
    Migrate {
        /// Only show the applied and the expected schema version; change nothing.
        #[arg(long)]
        status: bool,
    },
    /// Per queue: jobs by state and how late the due ones are; the nodes and their
    /// heartbeats.
    Status,
    /// Jobs matching filters, by ascending id, one page at a time.
    List {
        #[command(flatten)]
        filter: Filter,
        /// Page size (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue after this id (the last id of the previous page).
        #[arg(long)]
        after: Option<i64>,
        /// List the archive instead of the live jobs.
        #[arg(long)]
        archived: bool,
        /// Newest first (then `--after` continues to older ids).
        #[arg(long)]
        newest_first: bool,
    },
    /// One job in full: payload, result, every attempt's error, lease owner, times.
    Get {
        /// The job's id.
        id: i64,
    },
    /// Retry dead or cancelled jobs now: one by id, or every job matching filters.
    Retry(Bulk),
    /// Cancel jobs: one by id, or every job matching filters (a running one's handler is
    /// told at once, its node's next heartbeat as the backstop).
    Cancel(Bulk),
    /// The nodes registered on this database: queues, kinds, last heartbeat.
    Nodes {
        /// Remove the nodes gone (silent for over 30 s: killed or cut off) from the registry.
        #[arg(long)]
        forget: bool,
    },
    /// Move jobs finished more than a while ago to the archive (dead ones are kept longer,
    /// for a person to look at).
    Archive {
        /// Only jobs finished longer ago than this (e.g. 24h, 7d, 90m, 30s).
        #[arg(long, value_parser = parse_age, default_value = "24h")]
        older_than: Duration,
        /// Dead jobs only once they died longer ago than this.
        #[arg(long, value_parser = parse_age, default_value = "28d")]
        dead_older_than: Duration,
    },
    /// Delete archived jobs archived more than a while ago.
    Prune {
        /// Only jobs archived longer ago than this (e.g. 30d).
        #[arg(long, value_parser = parse_age, default_value = "7d")]
        older_than: Duration,
    },
    /// Queues with shared settings: paused (when, by whom) and limits.
    Queues,
    /// Pause a queue on every node: no new claims until `resume` (running jobs finish).
    Pause {
        /// The queue.
        queue: String,
        /// Who is pausing, and why (shown by `queues`).
        #[arg(long, default_value = "jobvisor command line")]
        by: String,
    },
    /// Resume a paused queue.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Set a queue's limits across every node; a limit not given keeps its value, `none`
    /// lifts it.
    Limit {
        /// The queue.
        queue: String,
        /// Most jobs running at once on all nodes (claimed jobs count), or `none`.
        #[arg(long, value_parser = parse_limit)]
        concurrency: Option<Lift<u32>>,
        /// Most jobs running at once per partition key, or `none`.
        #[arg(long, value_parser = parse_limit)]
        per_partition: Option<Lift<u32>>,
        /// Most jobs claimed per window, as JOBS/WINDOW (e.g. 100/1s, 5000/1h), or `none`.
        #[arg(long, value_parser = parse_rate)]
        rate: Option<Lift<(u32, Duration)>>,
    },
    /// Periodic schedules: spec, zone, next and last fire, paused or retired.
    Schedules,
    /// Pause, resume or trigger a schedule; add, change or remove one at run time.
    Schedule {
        #[command(subcommand)]
        action: ScheduleAction,
    },
    /// Serve the database-wide gauges (jobs by queue and state, due jobs, queue lag, node
    /// heartbeats) for Prometheus at http://LISTEN/metrics, or print them once.
    Metrics {
        /// Where to serve `/metrics`.
        #[arg(long, default_value = "127.0.0.1:9464")]
        listen: std::net::SocketAddr,
        /// How often the gauges are refreshed (at least 1s).
        #[arg(long, value_parser = parse_age, default_value = "15s")]
        every: Duration,
        /// Refresh once, print the page to standard output and exit.
        #[arg(long)]
        once: bool,
    },
    /// Serve the web dashboard at http://LISTEN/ (log in with the token in
    /// JOBVISOR_DASHBOARD_TOKEN, at least 16 characters).
    Dashboard {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Show no actions and refuse them.
        #[arg(long)]
        read_only: bool,
        /// A second token whose logins are read-only (or JOBVISOR_DASHBOARD_READ_ONLY_TOKEN).
        #[arg(
            long,
            env = "JOBVISOR_DASHBOARD_READ_ONLY_TOKEN",
            hide_env_values = true
        )]
        read_only_token: Option<String>,
        /// No login at all: allowed only with a loopback --listen address.
        #[arg(long)]
        no_auth: bool,
        /// Set the cookies' Secure flag (behind an HTTPS proxy).
        #[arg(long)]
        secure_cookies: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Which jobs a command applies to.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct Filter {
    /// Only this queue.
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only this kind.
    #[arg(long)]
    pub(crate) kind: Option<String>,
    /// Only this state (pending, running, retrying, succeeded, dead, cancelled).
    #[arg(long)]
    pub(crate) state: Option<JobState>,
    /// Only jobs created longer ago than this (e.g. 2h).
    #[arg(long, value_parser = parse_age)]
    pub(crate) older_than: Option<Duration>,
    /// Only jobs created less long ago than this (e.g. 15m).
    #[arg(long, value_parser = parse_age)]
    pub(crate) newer_than: Option<Duration>,
    /// Only the job with this unique key.
    #[arg(long)]
    pub(crate) unique_key: Option<String>,
    /// Only jobs whose payload, as JSON text, contains this (e.g. '"user_id":42'); searched
    /// within the --scan window.
    #[arg(long)]
    pub(crate) payload_contains: Option<String>,
    /// With --payload-contains: look at this many jobs at most (those matching the other
    /// filters, by ascending id), then stop and say where to go on.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) scan: u32,
}

impl Filter {
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_none()
            && self.kind.is_none()
            && self.state.is_none()
            && self.older_than.is_none()
            && self.newer_than.is_none()
            && self.unique_key.is_none()
            && self.payload_contains.is_none()
    }

    /// The filters given, as the audit log records them: `--queue mail --state dead`.
    pub(crate) fn describe(&self) -> String {
        let age = |d: &Duration| format!("{}s", d.as_secs());
        [
            ("--queue", self.queue.clone()),
            ("--kind", self.kind.clone()),
            ("--state", self.state.map(|s| s.as_str().to_string())),
            ("--older-than", self.older_than.as_ref().map(age)),
            ("--newer-than", self.newer_than.as_ref().map(age)),
            ("--unique-key", self.unique_key.clone()),
            ("--payload-contains", self.payload_contains.clone()),
        ]
        .into_iter()
        .filter_map(|(flag, v)| v.map(|v| format!("{flag} {v}")))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// A change to one job by id, or to every job matching filters.
#[derive(Debug, Args)]
pub(crate) struct Bulk {
    /// The job's id; without it, every job matching the filters.
    pub(crate) id: Option<i64>,
    #[command(flatten)]
    pub(crate) filter: Filter,
    /// Print what would change; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Change every matching job without asking.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
    /// `cancel` only: also cancel every descendant of each job (children, their children, …)
    /// not yet ended, whatever its policy for a failed parent.
    #[arg(long)]
    pub(crate) cascade: bool,
}

/// `90s`, `15m`, `2h`, `7d`, or a bare number of seconds.
pub(crate) fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; expected e.g. 90s, 15m, 2h or 7d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?}; expected s, m, h or d"
            ))
        }
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

/// A limit's new value: `Lift(None)` lifts it (written `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lift<T>(pub(crate) Option<T>);

/// A limit: a positive number, or `none`.
fn parse_limit(s: &str) -> Result<Lift<u32>, String> {
    if s == "none" {
        return Ok(Lift(None));
    }
    match s.parse::<u32>() {
        Ok(n) if n > 0 => Ok(Lift(Some(n))),
        _ => Err(format!(
            "{s:?} is not a limit; expected a positive number or none"
        )),
    }
}

/// A rate: `JOBS/WINDOW` (the window as an age: 1s, 15m, 1h), or `none`.
fn parse_rate(s: &str) -> Result<Lift<(u32, Duration)>, String> {
    if s == "none" {
        return Ok(Lift(None));
    }
    let (jobs, per) = s.split_once('/').ok_or_else(|| {
        format!("{s:?} is not a rate; expected JOBS/WINDOW, e.g. 100/1s, or none")
    })?;
    let jobs = parse_limit(jobs)?
        .0
        .ok_or_else(|| format!("{s:?}: expected a number of jobs"))?;
    // "100/s" reads as "100 per second".
    let per = if per.chars().all(|c| c.is_ascii_alphabetic()) {
        parse_age(&format!("1{per}"))?
    } else {
        parse_age(per)?
    };
    Ok(Lift(Some((jobs, per))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_units_and_bad_ones_are_named() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_age("2w").unwrap_err().contains("unknown unit \"w\""));
        assert!(parse_age("soon").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn limits_and_rates_parse_and_bad_ones_are_named() {
        assert_eq!(parse_limit("4"), Ok(Lift(Some(4))));
        assert_eq!(parse_limit("none"), Ok(Lift(None)));
        assert!(parse_limit("0").unwrap_err().contains("positive number"));
        assert_eq!(
            parse_rate("100/1s"),
            Ok(Lift(Some((100, Duration::from_secs(1)))))
        );
        assert_eq!(
            parse_rate("5/m"),
            Ok(Lift(Some((5, Duration::from_secs(60)))))
        );
        assert_eq!(parse_rate("none"), Ok(Lift(None)));
        assert!(parse_rate("100").unwrap_err().contains("JOBS/WINDOW"));
        assert!(parse_rate("x/1s").unwrap_err().contains("positive number"));
    }

    #[test]
    fn the_grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// What `schedule` does.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleAction {
    /// Stop its fires on every node until resumed.
    Pause {
        /// The schedule.
        name: String,
    },
    /// Resume it (fires missed meanwhile follow its missed-fire policy).
    Resume {
        /// The schedule.
        name: String,
    },
    /// Enqueue its job now, outside its fires.
    Trigger {
        /// The schedule.
        name: String,
    },
    /// Add a schedule at run time (stored in the database, fired by the leader; no node's
    /// code changes or retires it). A name declared in code is refused.
    Add(ScheduleDef),
    /// Change a schedule added at run time, given whole again (a new expression or zone
    /// starts afresh from now).
    Change(ScheduleDef),
    /// Remove a schedule added at run time: it fires no more (its jobs stay).
    Remove {
        /// The schedule.
        name: String,
    },
}

/// A schedule added or changed at run time: when it fires (a cron expression or an
/// interval, one of them) and the job each fire enqueues.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["cron", "every"])))]
pub(crate) struct ScheduleDef {
    /// The schedule's name.
    pub(crate) name: String,
    /// A cron expression (five fields, or six with seconds first), read in --zone.
    #[arg(long)]
    pub(crate) cron: Option<String>,
    /// Or a fixed interval (e.g. 30s, 15m, 1h): fires at its multiples since the Unix epoch.
    #[arg(long, value_parser = parse_age)]
    pub(crate) every: Option<Duration>,
    /// The IANA time zone the cron expression is read in.
    #[arg(long, default_value = "UTC")]
    pub(crate) zone: String,
    /// The kind of job each fire enqueues.
    #[arg(long)]
    pub(crate) kind: String,
    /// Its queue (default: `default`).
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Its payload, JSON.
    #[arg(long, default_value = "{}", value_parser = parse_json)]
    pub(crate) payload: serde_json::Value,
    /// Its priority (higher runs first).
    #[arg(long)]
    pub(crate) priority: Option<i16>,
    /// Its most attempts.
    #[arg(long)]
    pub(crate) max_attempts: Option<u32>,
    /// Its timeout per attempt (e.g. 30s, 5m).
    #[arg(long, value_parser = parse_age)]
    pub(crate) timeout: Option<Duration>,
    /// Fires missed while no node fired: latest, skip, or all:N (the N most recent).
    #[arg(long, default_value = "latest", value_parser = parse_missed)]
    pub(crate) missed: jobvisor::MissedFires,
}

/// A JSON value.
fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s)
        .map_err(|e| format!("{s:?} is not JSON ({e}); expected e.g. '{{\"team\": 7}}'"))
}

/// A missed-fire policy: `latest`, `skip` or `all:N`.
fn parse_missed(s: &str) -> Result<jobvisor::MissedFires, String> {
    let bad = || format!("{s:?} is not a missed-fire policy; expected latest, skip or all:N");
    match s {
        "latest" => Ok(jobvisor::MissedFires::Latest),
        "skip" => Ok(jobvisor::MissedFires::Skip),
        _ => {
            let max = s
                .strip_prefix("all:")
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?;
            Ok(jobvisor::MissedFires::All { max })
        }
    }
}
