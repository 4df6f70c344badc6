//! The invariants of the controls the seed drives (`controls.rs`), checked after every run
//! on the jobs' final rows, the journal's executions and their places in the run's order
//! (the journal numbers starts, ends and the driver's acts in program order, which on one
//! thread is the real order — finer than the manual clock, which many steps share):
//!
//! 1. **Concurrency limit.** When a handler of the limited queue starts, the handlers of
//!    that queue already running, it included, are at most the limit (§6 invariant 10: the
//!    limit holds at the handler's start; the database also counts claimed jobs, so it can
//!    only be stricter). A frozen node's handler that ended at the instant its node resumed
//!    does not count while its node was frozen: its lease may have lapsed and its job been
//!    claimed again, as the overlap rule of `check.rs` excuses.
//! 2. **Rate limit** (when the seed set one): any `rate + 1` starts of the limited queue span
//!    at least the period (manual clock); and as the limiter counts a job when it is claimed,
//!    none starts later than the start margin after its claim (read from its lease left at
//!    the first poll; checked with a bound of 1 s).
//! 3. **Pauses.** While a queue is known paused (`controls::PauseWindow`): no claim of it
//!    is reported (the claim checks the stored pause), and no handler of it starts on a node
//!    after that node read the settings (the bound of §7.5: no start after the node learnt
//!    of the pause; before that, a job it claimed earlier may still start) — nor while its
//!    node's start gate for the queue is closed (read at the handler's first poll).
//! 4. **Dependencies.** A child (or a batch's callback) starts only after every execution
//!    of each parent ended (except, again, a frozen node's handler ended on waking, when the
//!    child started during that freeze); under policy `cancel`, a child with a parent that
//!    did not succeed never runs and ends `cancelled`; a `run` child (every callback) is
//!    never cancelled; a callback ends succeeded or dead (it was released and ran once every
//!    member ended, liveness) and completes at most once: no execution of it starts after
//!    the completion that counts (its result's writer) ended.
//! 5. **Fence point** (§6 invariant 9): no handler is first polled at or past its attempt's
//!    fence point — its lease left (`JobContext::lease_left`) is above zero.
//! 6. **Schedule.** Every job of the schedule's kind carries a fire's key (only the
//!    schedule enqueues that kind); each fire instant has at most one job, and
//!    with every missed fire run (`MissedFires::All`), the fires are exactly the instants
//!    of the schedule from its first stored fire up to the last pass of the final phase —
//!    none missed, none off the schedule (§7.10: exactly one job per fire). The run-time
//!    schedule (`runtime_schedule.rs`, kind `rtick`) alike: each fire instant has at most
//!    one job and is an instant of one of its intervals; after an add or change known to
//!    have applied (every act before it known too), the fires until the next act are its
//!    interval's — exactly those up to the final pass if it is the last act; after a removal
//!    known to have applied, no fire of an instant past it and no fire's job created past it
//!    until the next act (§7.10: no fire after `remove_schedule` returns; the doc names no
//!    further bound).

use std::collections::BTreeMap;
use std::time::Duration;

use jobvisor::{Job, JobState, ParentPolicy};

use crate::controls::{
    Controls, Parents, PauseWindow, LIMITED, RATE_PERIOD, SCHEDULE, SCHEDULE_EVERY,
};
use crate::harness::invariants::outcome;
use crate::harness::journal::JobFacts;
use crate::harness::side::Execution;
use crate::journal::Order;
use crate::runtime_schedule::{Answer, Ask, INTERVALS, RUNTIME, RUNTIME_KIND};

/// A claim's lease left before its fence point as it is answered: the simulation's 30 s
/// lease less the fence margin (a sixth of it, at most 5 s).
const FRESH_LEASE_LEFT: Duration = Duration::from_secs(25);
/// The longest a rate-limited claim's handler is taken to wait for its start here: the
/// start margin (50 ms) plus the claim's own real time, with room to spare — a stall as a
/// claim's answer arrives (`faults.rs`) lasts 60 ms to 3.9 s.
const LATE_RATED_START: Duration = Duration::from_secs(1);

/// What the checks read.
pub(crate) struct Facts<'a> {
    pub(crate) jobs: &'a [Job],
    pub(crate) execs: &'a [Execution],
    pub(crate) orders: &'a [Order],
    pub(crate) freezes: &'a [(String, i64, i64)],
    /// Each freeze hidden from its node's clock (`Fleet::blind`).
    pub(crate) blind: &'a [(String, i64, i64)],
    pub(crate) controls: &'a Controls,
    pub(crate) parents: &'a Parents,
}

impl Facts<'_> {
    /// Whether execution `e` may be left out at manual time `t`: its node was frozen then
    /// and the execution ended as the node resumed — or it ran on a node's belief that a
    /// hidden freeze made stale (`check::blind_at`).
    pub(crate) fn frozen_then(&self, e: usize, t: i64) -> bool {
        let x = &self.execs[e];
        self.freezes.iter().any(|(node, from, to)| {
            *node == x.node && x.ended_at_us == Some(*to) && (*from..=*to).contains(&t)
        }) || crate::check::blind_at(self.blind, x, t)
    }

    /// Whether execution `e` was started on a node's belief that a hidden freeze made stale
    /// (`check::started_blind`): the rules of executions do not judge its start.
    pub(crate) fn started_blind(&self, e: usize) -> bool {
        crate::check::started_blind(self.blind, &self.execs[e])
    }

    /// Whether execution `e` was running when execution `y` started (in the run's order).
    pub(crate) fn running_at_start_of(&self, e: usize, y: usize) -> bool {
        let (oe, oy) = (&self.orders[e], &self.orders[y]);
        oe.start < oy.start
            && oe.end.is_none_or(|end| end > oy.start)
            && !self.frozen_then(e, self.execs[y].started_at_us)
    }
}

/// Every rule broken, one line each.
pub(crate) fn check(f: &Facts<'_>) -> Vec<String> {
    let mut bad = Vec::new();
    limits(f, &mut bad);
    pauses(f, &mut bad);
    fences(f, &mut bad);
    dependencies(f, &mut bad);
    schedule(f, &mut bad);
    bad
}

fn limits(f: &Facts<'_>, bad: &mut Vec<String>) {
    let limited: Vec<usize> = (0..f.orders.len())
        .filter(|i| f.orders[*i].queue == LIMITED)
        .collect();
    let limit = f.controls.limits.concurrency as usize;
    for &y in limited.iter().filter(|y| !f.started_blind(**y)) {
        let running: Vec<usize> = limited
            .iter()
            .copied()
            .filter(|&e| f.running_at_start_of(e, y))
            .collect();
        if running.len() + 1 > limit {
            bad.push(format!(
                "concurrency limit {limit}: {:?} started while {} others of {LIMITED} ran: {:?}",
                f.execs[y],
                running.len(),
                running.iter().map(|e| &f.execs[*e]).collect::<Vec<_>>()
            ));
        }
    }
    let Some(rate) = f.controls.limits.rate else {
        return;
    };
    // The limiter counts a job as it is claimed, so each claimed job starts within the
    // start margin of its claim or goes back unstarted (`RATE_START_MARGIN`): at its first
    // poll a handler's lease left is the fresh claim's, less what passed since the claim
    // (a renewal in between only makes it look fresher).
    for &e in &limited {
        let waited = FRESH_LEASE_LEFT.saturating_sub(f.orders[e].lease_left);
        if waited > LATE_RATED_START {
            bad.push(format!(
                "rate limit {rate} per {RATE_PERIOD:?}: {:?} started {} ms after its claim, \
                 past the start margin",
                f.execs[e],
                waited.as_millis()
            ));
        }
    }
    let period = i64::try_from(RATE_PERIOD.as_micros()).unwrap();
    let mut starts: Vec<i64> = limited
        .iter()
        .filter(|e| !f.started_blind(**e))
        .map(|e| f.execs[*e].started_at_us)
        .collect();
    starts.sort_unstable();
    for w in starts.windows(rate as usize + 1) {
        if w[rate as usize] - w[0] < period {
            bad.push(format!(
                "rate limit {rate} per {RATE_PERIOD:?}: {} starts of {LIMITED} within {} µs \
                 (from {} µs)",
                rate + 1,
                w[rate as usize] - w[0],
                w[0]
            ));
        }
    }
}

fn pauses(f: &Facts<'_>, bad: &mut Vec<String>) {
    for PauseWindow { queue, from, to } in &f.controls.windows {
        let to = to.unwrap_or(u64::MAX);
        let inside = |seq: u64| *from < seq && seq < to;
        for c in f.controls.claims.iter().filter(|c| c.queue == *queue) {
            if inside(c.seq) {
                bad.push(format!(
                    "pause: {} claimed job {} attempt {} of paused {queue} (paused at {from}, \
                     resumed at {to}, claim seen at {})",
                    c.node, c.job, c.attempt, c.seq
                ));
            }
        }
        let mut learnt: BTreeMap<&str, u64> = BTreeMap::new();
        for (node, seq) in &f.controls.reads {
            if inside(*seq) {
                learnt.entry(node).or_insert(*seq);
            }
        }
        for (e, o) in f.orders.iter().enumerate() {
            let x = &f.execs[e];
            let Some(read) = learnt.get(x.node.as_str()) else {
                continue;
            };
            if o.queue == *queue && *read < o.start && o.start < to {
                bad.push(format!(
                    "pause: {x:?} of {queue} started at {} though its node read the pause at \
                     {read} (paused at {from}, resumed at {to})",
                    o.start
                ));
            }
        }
    }
}

fn fences(f: &Facts<'_>, bad: &mut Vec<String>) {
    for (o, x) in f.orders.iter().zip(f.execs) {
        if o.gate_closed {
            bad.push(format!(
                "pause: {x:?} of {} started while its node knew the queue paused",
                o.queue
            ));
        }
        if o.lease_left.is_zero() {
            bad.push(format!(
                "fence: {x:?} started at or past its fence point (no lease left)"
            ));
        }
    }
}

fn dependencies(f: &Facts<'_>, bad: &mut Vec<String>) {
    let by_id: BTreeMap<i64, &Job> = f.jobs.iter().map(|j| (j.id.0, j)).collect();
    let mut runs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, e) in f.execs.iter().enumerate() {
        runs.entry(e.job_id).or_default().push(i);
    }
    for (child, parents) in f.parents {
        let job = by_id[child];
        let mine = runs.get(child).cloned().unwrap_or_default();
        let first = mine.iter().copied().min_by_key(|i| f.orders[*i].start);
        for (p, policy) in parents {
            let Some(parent) = by_id.get(p) else {
                bad.push(format!(
                    "dependency: job {child}'s parent {p} is not in the database"
                ));
                continue;
            };
            if *policy == ParentPolicy::Cancel && parent.state != JobState::Succeeded {
                if let Some(x) = first {
                    bad.push(format!(
                        "dependency: job {child} (policy cancel) ran ({:?}) though its parent \
                         {p} ended {}",
                        f.execs[x], parent.state
                    ));
                }
                if job.state != JobState::Cancelled {
                    bad.push(format!(
                        "dependency: job {child} (policy cancel) is {} though its parent {p} \
                         ended {}",
                        job.state, parent.state
                    ));
                }
            }
            let Some(x) = first.filter(|x| !f.started_blind(*x)) else {
                continue;
            };
            for &e in runs.get(p).map(Vec::as_slice).unwrap_or_default() {
                let ended_before = f.orders[e].end.is_some_and(|end| end < f.orders[x].start);
                if !ended_before && !f.frozen_then(e, f.execs[x].started_at_us) {
                    bad.push(format!(
                        "dependency: job {child} started ({:?}) before its parent's execution \
                         {:?} ended",
                        f.execs[x], f.execs[e]
                    ));
                }
            }
        }
        let cancel = parents.iter().any(|(p, policy)| {
            *policy == ParentPolicy::Cancel
                && by_id.get(p).is_some_and(|j| j.state != JobState::Succeeded)
        });
        if job.state == JobState::Cancelled && !cancel {
            bad.push(format!(
                "dependency: job {child} is cancelled though no parent under policy cancel \
                 failed"
            ));
        }
        if job.kind == "callback" {
            callback(f, job, &mine, bad);
        }
    }
}

/// A batch's callback: it ran (succeeded or dead) and completed at most once.
fn callback(f: &Facts<'_>, job: &Job, mine: &[usize], bad: &mut Vec<String>) {
    let id = job.id.0;
    if !matches!(job.state, JobState::Succeeded | JobState::Dead) {
        bad.push(format!("batch: callback {id} ended {}", job.state));
    }
    let mut list: Vec<&Execution> = mine.iter().map(|i| &f.execs[*i]).collect();
    list.sort_by_key(|e| (e.started_at_us, e.ended_at_us));
    let Some(w) = outcome(&JobFacts::from(job), &list).writer else {
        return;
    };
    let writer = mine
        .iter()
        .copied()
        .find(|i| std::ptr::eq(&f.execs[*i], list[w]))
        .unwrap();
    for &e in mine.iter().filter(|e| !f.started_blind(**e)) {
        if f.orders[writer]
            .end
            .is_some_and(|end| f.orders[e].start > end)
        {
            bad.push(format!(
                "batch: callback {id} started again ({:?}) after its completion {:?}",
                f.execs[e], f.execs[writer]
            ));
        }
    }
}

fn schedule(f: &Facts<'_>, bad: &mut Vec<String>) {
    let Some(last) = f.controls.last_pass_us else {
        bad.push("schedule: no pass fired in the final phase".into());
        return;
    };
    let fires = fires_of(f, SCHEDULE, "tick", bad);
    let every = i64::try_from(SCHEDULE_EVERY.as_micros()).unwrap();
    exact(SCHEDULE, &fires, f.controls.first_fire_us, every, last, bad);
    runtime_schedule(f, &fires_of(f, RUNTIME, RUNTIME_KIND, bad), last, bad);
}

/// The fires of schedule `name` (its only kind `kind`): instant (µs) → (job, created µs).
/// Flags a job of the kind without a fire's key and a fire with more than one job.
fn fires_of(f: &Facts<'_>, name: &str, kind: &str, bad: &mut Vec<String>) -> Fires {
    let prefix = format!("schedule:{name}@");
    let mut fires = Fires::new();
    for j in f.jobs.iter().filter(|j| j.kind == kind) {
        let at = j
            .unique_key
            .as_deref()
            .and_then(|k| k.strip_prefix(&prefix))
            .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok());
        let Some(at) = at else {
            bad.push(format!(
                "schedule: job {} of kind {kind} has no fire's key of {name}: {:?}",
                j.id.0, j.unique_key
            ));
            continue;
        };
        fires
            .entry(at.timestamp_micros())
            .or_default()
            .push((j.id.0, j.created_at.timestamp_micros()));
    }
    for (at, jobs) in &fires {
        if jobs.len() > 1 {
            bad.push(format!(
                "schedule {name}: the fire at {at} µs has jobs {jobs:?}"
            ));
        }
    }
    fires
}

/// A schedule's fires: instant (µs) → its jobs (id, created µs).
type Fires = BTreeMap<i64, Vec<(i64, i64)>>;

/// With every missed fire run, the fires from `first` on are exactly the instants `first +
/// k × every` up to `last` (none missed, none off the schedule).
fn exact(name: &str, fires: &Fires, first: i64, every: i64, last: i64, bad: &mut Vec<String>) {
    let expected: Vec<i64> = (0..)
        .map(|k| first + k * every)
        .take_while(|t| *t <= last)
        .collect();
    let missed: Vec<&i64> = expected.iter().filter(|t| !fires.contains_key(t)).collect();
    let extra: Vec<&i64> = fires.keys().filter(|t| !expected.contains(t)).collect();
    if !missed.is_empty() || !extra.is_empty() {
        bad.push(format!(
            "schedule {name}: fires from {first} to {last} µs every {every} µs: missed \
             {missed:?}, not of the schedule {extra:?}"
        ));
    }
}

/// The run-time schedule (item 6 for a schedule added, changed and removed at run time):
/// every fire is an instant of one of its intervals; after each act that surely applied,
/// every act before it sure too (`runtime_schedule.rs`), until the next act is sent: after an
/// add or a change, every fire from then on is an instant of its interval, and if it is the
/// last act, the fires from its stored next fire to the final pass are exactly that
/// interval's; after a removal, no fire of an instant past it and no fire's job created past
/// it (§7.10: no fire after the removal returns).
fn runtime_schedule(f: &Facts<'_>, fires: &Fires, last: i64, bad: &mut Vec<String>) {
    let intervals: Vec<i64> = INTERVALS
        .iter()
        .map(|d| i64::try_from(d.as_micros()).unwrap())
        .collect();
    for t in fires.keys() {
        if !intervals.iter().any(|i| t % i == 0) {
            bad.push(format!(
                "schedule {RUNTIME}: the fire at {t} µs is an instant of none of {INTERVALS:?}"
            ));
        }
    }
    let ops = &f.controls.runtime;
    for (k, op) in ops.iter().enumerate() {
        if ops[..k].iter().any(|o| o.answer == Answer::Unknown) {
            break;
        }
        let Answer::Applied(next) = op.answer else {
            continue;
        };
        let until = ops.get(k + 1).map_or(i64::MAX, |o| o.at_us);
        let during = fires.range(op.at_us + 1..until.max(op.at_us + 1));
        match op.ask {
            Ask::Add(d) | Ask::Change(d) => {
                let every = i64::try_from(d.as_micros()).unwrap();
                for (t, _) in during {
                    if t % every != 0 {
                        bad.push(format!(
                            "schedule {RUNTIME}: the fire at {t} µs is off the interval {d:?} \
                             set at {} µs ({:?})",
                            op.at_us, op.ask
                        ));
                    }
                }
                if let (Some(first), None) = (next, ops.get(k + 1)) {
                    // An unchanged interval keeps a next fire that may be due already.
                    let from = first.min(op.at_us + 1);
                    let after: Fires = fires.range(from..).map(|(t, j)| (*t, j.clone())).collect();
                    exact(RUNTIME, &after, first, every, last, bad);
                }
            }
            Ask::Remove => {
                for (t, jobs) in fires {
                    let late: Vec<&(i64, i64)> = jobs
                        .iter()
                        .filter(|(_, created)| *created > op.at_us && *created < until)
                        .collect();
                    if (*t > op.at_us && *t < until) || !late.is_empty() {
                        bad.push(format!(
                            "schedule {RUNTIME}: the fire at {t} µs (jobs {jobs:?}) came after \
                             its removal at {} µs",
                            op.at_us
                        ));
                    }
                }
            }
        }
    }
}
