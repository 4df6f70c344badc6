//! The partition test's checks: every job and every node's fences against the journals and
//! the tables, and the report of each cut.

use super::*;
use crate::harness::invariants::{self, OutcomeFault};

// ---------------------------------------------------------------------------------------------
// The checks

/// What was measured around one cut.
#[derive(Debug, Clone, Default)]
pub(crate) struct CutMetrics {
    pub(crate) node: String,
    pub(crate) down_for: Duration,
    /// Fence margins (µs) of the cut node's handlers interrupted around the cut.
    pub(crate) margins: Vec<i64>,
    pub(crate) heal_to_claim: Option<i64>,
    pub(crate) heal_to_renewal: Option<i64>,
    pub(crate) heal_to_finalization: Option<i64>,
    /// When a renewal was due: the heal, or the first claim after it if the node held no
    /// lease at the heal.
    pub(crate) renewal_due_us: Option<i64>,
    /// First successful renewal − when one was due.
    pub(crate) renewal_lag: Option<i64>,
    pub(crate) held_lease_at_heal: bool,
    pub(crate) reruns: usize,
    pub(crate) burnt: usize,
}

/// Everything the checks found.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub(crate) violations: Vec<String>,
    pub(crate) cuts: Vec<CutMetrics>,
    /// Re-runs and burnt attempts not put down to a cut.
    pub(crate) reruns_other: usize,
    pub(crate) burnt_other: usize,
    pub(crate) jobs: usize,
    pub(crate) executions: usize,
    /// Executions that did their work but whose result does not count.
    pub(crate) superseded_completions: usize,
    pub(crate) overlaps: usize,
    pub(crate) late_writes: usize,
    /// Handlers started for a lease that was already gone.
    pub(crate) zombie_starts: usize,
    /// Recorded failures by code.
    pub(crate) error_codes: BTreeMap<String, usize>,
    pub(crate) lagged: i64,
    /// The fence rule from the handlers' own `Fence` lines: starts checked and the smallest
    /// fence point − start; ends past a fence point and the largest end − fence point.
    pub(crate) fence_starts: usize,
    pub(crate) worst_start_to_fence: Option<i64>,
    pub(crate) fence_ends: usize,
    pub(crate) worst_fence_to_end: Option<i64>,
}

/// A claim as a node saw it.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) at_us: i64,
    pub(crate) node: String,
    pub(crate) attempt: i64,
}

pub(crate) fn secs(us: i64) -> String {
    format!("{:.2} s", us as f64 / 1e6)
}

pub(crate) fn opt_secs(us: Option<i64>) -> String {
    us.map_or_else(|| "never".to_string(), secs)
}

pub(crate) fn within(t: i64, cut: &Cut) -> bool {
    let before = i64::try_from(ATTRIBUTE_BEFORE.as_micros()).unwrap();
    let after = i64::try_from(ATTRIBUTE_AFTER.as_micros()).unwrap();
    t >= cut.cut_at_us - before && t <= cut.heal_at_us + after
}

/// The cut `node` went through around `t`, if any.
pub(crate) fn cut_of(cuts: &[Cut], node: &str, t: i64) -> Option<usize> {
    cuts.iter().position(|c| c.node == node && within(t, c))
}

/// The fence rule (ARCHITECTURE.md §6, invariant 9), from one node's `Fence` lines, keyed
/// by claim: no handler started at or after its claim's fence point, and none ended more
/// than the fence margin past the last fence point it knew — that is, past its lease as its
/// node knew it (0 µs allowed). The last fence point a handler knew is the latest it
/// journaled; it journals every move within `FENCE_CHECK` (100 ms), while a move is a
/// renewal's, a renewal interval later, so a stale value cannot hide an overrun.
pub(crate) fn check_fences(
    node: &str,
    lines: &[(i64, String, String, i64, i64)],
    a: &mut Analysis,
) {
    let margin = i64::try_from((LEASE / 6).as_micros()).unwrap();
    let mut known: HashMap<(i64, &str), i64> = HashMap::new();
    for (job, claim, what, at, fence) in lines {
        let key = (*job, claim.as_str());
        match what.as_str() {
            "start" => {
                a.fence_starts += 1;
                let left = fence - at;
                a.worst_start_to_fence = Some(a.worst_start_to_fence.map_or(left, |w| w.min(left)));
                if left <= 0 {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: the handler started at {at}, at or \
                         past its fence point {fence}"
                    ));
                }
                known.insert(key, *fence);
            }
            "seen" => {
                let k = known.entry(key).or_insert(*fence);
                *k = (*k).max(*fence);
            }
            "end" => {
                let Some(&last) = known.get(&key) else {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: an end journaled with no start"
                    ));
                    continue;
                };
                if fence > at {
                    continue; // ended before its fence point
                }
                a.fence_ends += 1;
                let over = at - last;
                a.worst_fence_to_end = Some(a.worst_fence_to_end.map_or(over, |w| w.max(over)));
                if over >= margin {
                    a.violations.push(format!(
                        "job {job} claim {claim} on {node}: the handler ran until {at}, {} past \
                         its fence point {last}: past its lease as its node knew it",
                        secs(over)
                    ));
                }
            }
            other => a
                .violations
                .push(format!("job {job} on {node}: unknown fence line {other:?}")),
        }
    }
}

/// Checks the run and measures each cut; see the module docs for the rules.
pub(crate) fn analyze(
    jobs: &[JobFacts],
    execs: &[Execution],
    nodes: &[NodeRow],
    timelines: &BTreeMap<String, Timeline>,
    cuts: &[Cut],
) -> Analysis {
    let mut a = Analysis {
        jobs: jobs.len(),
        executions: execs.len(),
        cuts: cuts
            .iter()
            .map(|c| CutMetrics {
                node: c.node.clone(),
                down_for: c.down_for,
                ..CutMetrics::default()
            })
            .collect(),
        lagged: timelines.values().map(NodeJournal::lagged).sum(),
        ..Analysis::default()
    };
    let gone: HashMap<&str, i64> = nodes
        .iter()
        .map(|n| (n.node.as_str(), n.gone_at_us))
        .collect();
    let mut claims: HashMap<i64, Vec<Claim>> = HashMap::new();
    let mut successes: HashMap<i64, Vec<(String, i64)>> = HashMap::new();
    for (node, t) in timelines {
        for (at_us, what, job, attempt) in &t.at {
            if what == "claimed" {
                claims.entry(*job).or_default().push(Claim {
                    at_us: *at_us,
                    node: node.clone(),
                    attempt: *attempt,
                });
            } else if what == "finished_succeeded" {
                successes
                    .entry(*job)
                    .or_default()
                    .push((node.clone(), *attempt));
            }
        }
    }
    for list in claims.values_mut() {
        list.sort_by_key(|c| c.at_us);
    }
    let mut by_job: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        by_job.entry(e.job_id).or_default().push(e);
    }
    let known: HashSet<i64> = jobs.iter().map(|j| j.id.0).collect();
    for id in by_job.keys().filter(|id| !known.contains(id)) {
        a.violations.push(format!(
            "executions recorded for job {id}, which does not exist"
        ));
    }
    let no_claims = Vec::new();
    for job in jobs {
        let mut list = by_job.remove(&job.id.0).unwrap_or_default();
        list.sort_by_key(|e| (e.started_at_us, e.node.clone()));
        let claims = claims.get(&job.id.0).unwrap_or(&no_claims);
        check_job(job, &list, claims, &successes, &gone, cuts, &mut a);
    }
    for (node, t) in timelines {
        check_fences(node, &t.fences, &mut a);
    }
    for (k, c) in cuts.iter().enumerate() {
        let Some(t) = timelines.get(&c.node) else {
            continue;
        };
        let m = &mut a.cuts[k];
        let heal = c.heal_at_us;
        let first_claim = t.first_claim_after(heal);
        m.heal_to_claim = first_claim.map(|x| x - heal);
        m.heal_to_finalization = t.first_finalization_after(heal).map(|x| x - heal);
        m.held_lease_at_heal = t.held_lease_at(heal);
        m.renewal_due_us = if m.held_lease_at_heal {
            Some(heal)
        } else {
            first_claim
        };
        m.heal_to_renewal = t.first_renewal_after(heal).map(|x| x - heal);
        m.renewal_lag = m
            .renewal_due_us
            .and_then(|due| t.first_renewal_after(due).map(|x| x - due));
    }
    a
}

pub(crate) fn check_job(
    job: &JobFacts,
    list: &[&Execution],
    claims: &[Claim],
    successes: &HashMap<i64, Vec<(String, i64)>>,
    gone: &HashMap<&str, i64>,
    cuts: &[Cut],
    a: &mut Analysis,
) {
    let id = job.id;
    if job.state != JobState::Succeeded {
        a.violations.push(format!(
            "job {id} is {} after the run (attempts {}, errors {:?})",
            job.state, job.attempts, job.errors
        ));
    }
    // No failure from a handler: see `HANDLER_CODES`.
    for JobFailure {
        attempt,
        code,
        message,
        ..
    } in &job.errors
    {
        *a.error_codes.entry(code.clone()).or_default() += 1;
        if HANDLER_CODES.contains(&code.as_str()) {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: attempt {attempt}'s handler failure {code} ({message}) was accepted: \
                 its handler only fails once it lost its lease"
            ));
        }
    }
    // The result is a completed execution's of the last attempt, and nothing started after
    // it (the shared rule, `harness/invariants.rs`): an execution that did ran for a lease
    // that was gone (a claim whose answer came back after the lease had expired — a
    // "zombie start").
    let outcome = invariants::outcome(job, list);
    let writer = outcome.writer;
    let mut zombie = vec![false; list.len()];
    for fault in outcome.faults {
        match fault {
            OutcomeFault::LateWrite(m) => {
                a.late_writes += 1;
                a.violations.push(m);
            }
            OutcomeFault::StartedAfter(i, m) => {
                zombie[i] = true;
                a.zombie_starts += 1;
                a.violations.push(m);
            }
            OutcomeFault::Row(m) => a.violations.push(m),
        }
    }
    a.superseded_completions += list
        .iter()
        .enumerate()
        .filter(|(i, e)| e.completed == 1 && writer != Some(*i))
        .count();
    // A success accepted for attempt k is a late write if the job was ever claimed again
    // with a higher attempt: that claim needed attempt k's lease gone (or came after the
    // job was finished). And a job succeeds once.
    if let Some(done) = successes.get(&id.0) {
        if done.len() > 1 {
            a.late_writes += 1;
            a.violations.push(format!(
                "job {id}: {} finalizations to success were accepted: {done:?}",
                done.len()
            ));
        }
        for (node, attempt) in done {
            if let Some(c) = claims.iter().find(|c| c.attempt > *attempt) {
                a.late_writes += 1;
                a.violations.push(format!(
                    "job {id}: {node}'s success for attempt {attempt} was accepted, but {} \
                     claimed attempt {} (seen at {})",
                    c.node, c.attempt, c.at_us
                ));
            }
        }
    }
    if let Some(result) = job.result_node().zip(job.result_attempt()) {
        let result = (result.0.to_string(), result.1);
        if successes.get(&id.0).is_some_and(|d| !d.contains(&result)) {
            a.violations.push(format!(
                "job {id}: result {result:?} but the accepted success was {:?}",
                successes[&id.0]
            ));
        }
    }

    // When each execution surely stopped: its recorded end, or its node's end.
    let (ends, _) = invariants::execution_ends(list, gone, &mut a.violations);
    let ends: Vec<i64> = ends.into_iter().map(|e| e.unwrap_or(i64::MAX)).collect();

    // The fence margin: every handler whose job was re-claimed (by the sweeper, whose stamp is
    // the database's, or by any later claim) stopped before that.
    let finished = job.finished_at_us.unwrap_or(i64::MAX);
    for (idx, (e, end)) in list.iter().zip(&ends).enumerate() {
        if zombie[idx] {
            continue;
        }
        if *end > finished + DB_CLOCK_SLACK_US {
            a.violations.push(format!(
                "job {id}: {e:?} ran until {end}, {} after the job finished",
                secs(end - finished)
            ));
        }
        let own = claims.iter().rev().find(|c| {
            c.node == e.node && c.attempt == i64::from(e.attempt) && c.at_us <= e.started_at_us
        });
        let after = own.map_or(e.started_at_us, |c| c.at_us);
        // A later claim: a higher attempt (the database numbers claims in order), or the same
        // attempt on another node after this one's claim (an attempt given back). A claim of a
        // lower attempt whose answer arrived late is older than this execution's.
        let attempt = i64::from(e.attempt);
        let next_claim = claims
            .iter()
            .filter(|c| c.attempt > attempt || (c.attempt == attempt && c.node != e.node))
            .find(|c| c.at_us > after)
            .map(|c| c.at_us);
        let reclaim = job
            .errors
            .iter()
            .find(|x| same_claim(x, e))
            .and_then(|x| x.at)
            .map(|t| t.timestamp_micros());
        let reclaimed = match (next_claim, reclaim) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        if let Some(r) = reclaimed.filter(|_| writer != Some(idx)) {
            if e.started_at_us > r {
                a.zombie_starts += 1;
                a.violations.push(format!(
                    "job {id}: {e:?} started {} after its job was re-claimed (at {r}): a \
                     handler ran for a lease that was gone",
                    secs(e.started_at_us - r)
                ));
                continue;
            }
            let margin = r - end;
            if margin < -DB_CLOCK_SLACK_US {
                a.violations.push(format!(
                    "job {id}: {e:?} still ran {} after the job was re-claimed (at {r})",
                    secs(-margin)
                ));
            }
            if let Some(k) = cuts
                .iter()
                .position(|c| c.node == e.node && *end >= c.cut_at_us && within(*end, c))
            {
                a.cuts[k].margins.push(margin);
            }
        }
    }

    // No two executions overlapped (the shared rule): sorted by start, each starts after
    // every earlier one ended.
    let known: Vec<Option<i64>> = ends.iter().map(|e| Some(*e)).collect();
    for o in invariants::overlaps(list, &known, |_, _, _| false) {
        a.overlaps += 1;
        a.violations.push(format!(
            "job {id}: {:?} started {} before {:?} ended",
            list[o.later],
            secs(o.by_us),
            list[o.earlier]
        ));
    }

    // Re-runs: every execution after the first, put down to the cut its predecessor's node
    // went through (or, for a zombie start, its own node).
    for pair in list.windows(2) {
        let cut = cut_of(cuts, &pair[0].node, pair[0].started_at_us)
            .or_else(|| cut_of(cuts, &pair[1].node, pair[1].started_at_us));
        match cut {
            Some(k) => a.cuts[k].reruns += 1,
            None => a.reruns_other += 1,
        }
    }

    // Attempts burnt on a job that never started: attempt numbers no execution had. Put down
    // to the cut of the node that claimed it, else by the time of its reclaim.
    for k in 1..=job.attempts {
        if list.iter().any(|e| u32::try_from(e.attempt) == Ok(k)) {
            continue;
        }
        let by_claim = claims
            .iter()
            .filter(|c| c.attempt == i64::from(k))
            .find_map(|c| cut_of(cuts, &c.node, c.at_us));
        let by_time = || {
            let at = job
                .errors
                .iter()
                .find(|x| x.attempt == k)?
                .at?
                .timestamp_micros();
            cuts.iter().position(|c| within(at, c))
        };
        match by_claim.or_else(by_time) {
            Some(c) => a.cuts[c].burnt += 1,
            None => a.burnt_other += 1,
        }
    }
}

impl Analysis {
    pub(crate) fn report(&self, backend: Backend) -> String {
        let mut s = String::new();
        for m in &self.cuts {
            let worst = m.margins.iter().min().copied();
            let _ = writeln!(
                s,
                "partition test [{backend:?}]: cut of {} for {:?}: fence margin worst {} ({} \
                 handlers interrupted); heal→first claim {}, →first renewal {} (due from {}: \
                 lag {}), →first finalization {}; re-runs {}; attempts burnt on never-started \
                 jobs {}",
                m.node,
                m.down_for,
                opt_secs(worst),
                m.margins.len(),
                opt_secs(m.heal_to_claim),
                opt_secs(m.heal_to_renewal),
                if m.held_lease_at_heal {
                    "the heal"
                } else {
                    "its first claim after the heal"
                },
                opt_secs(m.renewal_lag),
                opt_secs(m.heal_to_finalization),
                m.reruns,
                m.burnt
            );
        }
        let worst = |f: &dyn Fn(&CutMetrics) -> Option<i64>, max: bool| {
            let v = self.cuts.iter().filter_map(f);
            if max {
                v.max()
            } else {
                v.min()
            }
        };
        let missing =
            |f: &dyn Fn(&CutMetrics) -> Option<i64>| self.cuts.iter().any(|m| f(m).is_none());
        let worst_or_never = |f: &dyn Fn(&CutMetrics) -> Option<i64>| {
            if missing(f) {
                "never (for some cut)".to_string()
            } else {
                opt_secs(worst(f, true))
            }
        };
        let per_cut = |f: &dyn Fn(&CutMetrics) -> usize| {
            self.cuts
                .iter()
                .map(|m| format!("{:?} cut: {}", m.down_for, f(m)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "partition test [{backend:?}] SUMMARY: worst fence margin {}; worst heal→first claim \
             {}; worst heal→first renewal {} (lag from when due {}); worst heal→first \
             finalization {}; re-runs per cut [{}] (+{} not from a cut); attempts burnt on \
             never-started jobs [{}] (+{} not from a cut)",
            opt_secs(worst(&|m| m.margins.iter().min().copied(), false)),
            worst_or_never(&|m| m.heal_to_claim),
            worst_or_never(&|m| m.heal_to_renewal),
            worst_or_never(&|m| m.renewal_lag),
            worst_or_never(&|m| m.heal_to_finalization),
            per_cut(&|m| m.reruns),
            self.reruns_other,
            per_cut(&|m| m.burnt),
            self.burnt_other,
        );
        let _ = writeln!(
            s,
            "partition test [{backend:?}]: fence rule: {} starts, closest to the fence point {}; \
             {} handlers ended past it, the latest {} µs after it (the lease ran {} past it)",
            self.fence_starts,
            opt_secs(self.worst_start_to_fence),
            self.fence_ends,
            self.worst_fence_to_end
                .map_or_else(|| "-".to_string(), |v| v.to_string()),
            secs(i64::try_from((LEASE / 6).as_micros()).unwrap()),
        );
        let _ = write!(
            s,
            "partition test [{backend:?}]: jobs={} executions={} superseded_completions={} \
             overlaps={} late_writes={} zombie_starts={} violations={} events_lagged={} \
             errors={:?}",
            self.jobs,
            self.executions,
            self.superseded_completions,
            self.overlaps,
            self.late_writes,
            self.zombie_starts,
            self.violations.len(),
            self.lagged,
            self.error_codes
        );
        if self.lagged > 0 {
            let _ = write!(
                s,
                "\n  (some journal writers lagged: the timeline misses events, times may read late)"
            );
        }
        s
    }

    /// The goals this run missed (empty when all were met).
    pub(crate) fn goals_missed(&self) -> Vec<String> {
        let target = i64::try_from(HEAL_TARGET.as_micros()).unwrap();
        let slack = i64::try_from(RENEWAL_SLACK.as_micros()).unwrap();
        let mut out = Vec::new();
        for m in &self.cuts {
            let cut = format!("{} cut {:?}", m.node, m.down_for);
            let claim_slack = i64::try_from(CLAIM_SLACK.as_micros()).unwrap();
            match m.heal_to_claim {
                Some(t) if t <= target + claim_slack => {}
                t => out.push(format!(
                    "{cut}: first claim {} after the heal (target {HEAL_TARGET:?} + \
                     {CLAIM_SLACK:?} for the poll tick)",
                    opt_secs(t)
                )),
            }
            match m.renewal_lag {
                Some(t) if t <= target + slack => {}
                t => out.push(format!(
                    "{cut}: first renewal {} after it was due (target {HEAL_TARGET:?} + \
                     {RENEWAL_SLACK:?} for the tick)",
                    opt_secs(t)
                )),
            }
            if m.burnt > 0 {
                out.push(format!(
                    "{cut}: {} attempt(s) burnt on jobs that never started (target 0)",
                    m.burnt
                ));
            }
            if m.down_for < TOLERATED_CUT && m.reruns > 0 {
                out.push(format!(
                    "{cut}: {} re-run(s) after a cut shorter than the documented tolerance \
                     {TOLERATED_CUT:?} (target 0)",
                    m.reruns
                ));
            }
        }
        if self.burnt_other > 0 {
            out.push(format!(
                "{} attempt(s) burnt on jobs that never started, not near a cut (target 0)",
                self.burnt_other
            ));
        }
        if self.cuts.first().is_some_and(|m| m.margins.is_empty()) {
            out.push(
                "the cut longer than the lease interrupted no running handler: fencing was not \
                 exercised"
                    .into(),
            );
        }
        out
    }
}
