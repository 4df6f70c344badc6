//! The invariants checked after every run, on the jobs' final rows and the journal of
//! executions. Overlaps and the outcome's writer are the shared checker's
//! (`tests/harness/invariants.rs`, also the crash and partition tests'); the rest:
//!
//! 1. No job lost: every job an enqueue answered is in the database.
//! 2. Never two executions of one job overlapping in (manual) time — except a frozen
//!    node's handler that ended at the instant its node resumed (its last step on waking,
//!    or stopped by the deadline check that runs then): it did nothing while frozen, and a
//!    paused process cannot be fenced while paused — what the crash tests excuse as "a
//!    frozen handler's last step on waking". A handler the zombie *starts* is never
//!    excused.
//! 3. No write of an attempt accepted after its lease was lost: a result is its final
//!    attempt's, written by an execution that completed, and none started after it.
//! 4. Attempts counted as documented: an attempt counts only when its handler started (no
//!    more attempts than executions, but for the claim a start gate refused past a start-by
//!    deadline, which ends the job `expired` and counts), no execution ran an attempt the job does not count
//!    (`attempts` ≥ every execution's attempt, but for one given back unstarted, §7.2, of a
//!    job that then expired), `attempts` ≤ `max_attempts`, and a dead job
//!    (our handlers only retry) used every attempt and kept an error for each.
//! 5. Liveness (in the run): every job terminal once faults stop.
//!
//! A freeze hidden from its node's clock (`clock.rs`) is outside the model's bound: the node
//! wakes believing in leases the database let go, runs their handlers on and starts their
//! prefetched jobs ([`started_blind`], [`blind_at`]). No rule of *executions* can hold for
//! those (rule 2 and the controls' rules excuse them, as each says), but every rule of what
//! the *database* accepted still does: rules 1, 3 and 4 judge them as any other — the
//! guards (token, state) must refuse each of their writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use jobvisor::{Job, JobState};

use crate::harness::invariants::{execution_ends, outcome, overlaps, OutcomeFault};
use crate::harness::journal::JobFacts;
use crate::harness::side::Execution;

/// Every rule broken, one line each.
pub(crate) fn check(
    jobs: &[Job],
    answered: &BTreeSet<i64>,
    execs: &[Execution],
    freezes: &[(String, i64, i64)],
    blind: &[(String, i64, i64)],
) -> Vec<String> {
    let mut bad = Vec::new();
    let by_id: BTreeMap<i64, &Job> = jobs.iter().map(|j| (j.id.0, j)).collect();
    for id in answered {
        if !by_id.contains_key(id) {
            bad.push(format!(
                "lost: job {id} was enqueued and is not in the database"
            ));
        }
    }
    let mut runs: BTreeMap<i64, Vec<&Execution>> = BTreeMap::new();
    for e in execs {
        runs.entry(e.job_id).or_default().push(e);
    }
    for (id, list) in &mut runs {
        list.sort_by_key(|e| (e.started_at_us, e.ended_at_us));
        let Some(job) = by_id.get(id) else {
            bad.push(format!("job {id} ran but is not in the database"));
            continue;
        };
        let (ends, _) = execution_ends(list, &HashMap::new(), &mut bad);
        let stopped_on_waking = |e: &Execution, end: i64, later_start: i64| {
            freezes.iter().any(|(node, from, to)| {
                *node == e.node && *to == end && (*from..=*to).contains(&later_start)
            })
        };
        // A start the node made blind is not judged as an execution; one running blind on
        // is excused from the later starts it overlaps.
        let (sighted, sighted_ends): (Vec<&Execution>, Vec<Option<i64>>) = list
            .iter()
            .zip(&ends)
            .filter(|(e, _)| !started_blind(blind, e))
            .map(|(e, end)| (*e, *end))
            .unzip();
        let excused = |e: &Execution, end: i64, later_start: i64| {
            stopped_on_waking(e, end, later_start) || blind_at(blind, e, later_start)
        };
        for o in overlaps(&sighted, &sighted_ends, excused) {
            bad.push(format!(
                "overlap: job {id}: {:?} started {} µs before {:?} ended",
                sighted[o.later], o.by_us, sighted[o.earlier]
            ));
        }
        let facts = JobFacts::from(*job);
        for f in outcome(&facts, list).faults {
            if matches!(f, OutcomeFault::StartedAfter(i, _) if started_blind(blind, list[i])) {
                continue;
            }
            bad.push(format!("late write: {}", f.message()));
        }
        // An attempt counts only when its handler started: every counted attempt ran. (A
        // job given back unstarted past its refund bound counts anyway, as documented: not
        // checked for such a job.)
        let refunds = job
            .errors
            .iter()
            .filter(|e| e.code == "not_started")
            .count();
        // A job its start gate ended `expired` counts that last claim, never started (§7.2:
        // a claim counts; the gate ends the job instead of giving it back).
        let gate_expired = usize::from(expired(job));
        if refunds < job.max_attempts as usize && job.attempts as usize > list.len() + gate_expired
        {
            bad.push(format!(
                "attempts: job {id} counts {} attempts but only {} executions started",
                job.attempts,
                list.len()
            ));
        }
        let top = list.iter().map(|e| e.attempt).max().unwrap_or(0);
        // An attempt given back with no start recorded (its node died first, §7.2) is not
        // counted; its number is reused by the next claim — unless the job was cancelled
        // first: expired, or, pending again as far as the database knew, cancelled by hand,
        // by a replacing enqueue or with a parent.
        let given_back = i64::from(refunds > 0 && job.state == JobState::Cancelled);
        if i64::from(top) > i64::from(job.attempts) + given_back {
            bad.push(format!(
                "attempts: job {id} counts {} attempts but attempt {top} ran",
                job.attempts
            ));
        }
    }
    for j in jobs {
        if j.attempts > j.max_attempts {
            bad.push(format!(
                "attempts: job {} used {} of {} attempts",
                j.id.0, j.attempts, j.max_attempts
            ));
        }
        if j.state == JobState::Dead {
            if j.attempts != j.max_attempts {
                bad.push(format!(
                    "attempts: job {} is dead after {} of {} attempts",
                    j.id.0, j.attempts, j.max_attempts
                ));
            }
            if j.errors.len() < j.attempts as usize {
                bad.push(format!(
                    "errors: dead job {} kept {} errors for {} attempts",
                    j.id.0,
                    j.errors.len(),
                    j.attempts
                ));
            }
        }
    }
    bad
}

/// Whether `e` was started by a node acting on what it believed before a freeze hidden from
/// its clock (`blind`: the node, the freeze's start, the end of its blind span).
pub(crate) fn started_blind(blind: &[(String, i64, i64)], e: &Execution) -> bool {
    blind
        .iter()
        .any(|(node, from, to)| *node == e.node && (*from..=*to).contains(&e.started_at_us))
}

/// Whether `e`, at manual time `t`, ran on such a node's belief: it ran on past the
/// freeze's start (or started in its blind span) and `t` came after the freeze began.
pub(crate) fn blind_at(blind: &[(String, i64, i64)], e: &Execution, t: i64) -> bool {
    blind.iter().any(|(node, from, to)| {
        *node == e.node
            && e.started_at_us <= *to
            && e.ended_at_us.is_none_or(|end| end > *from)
            && t >= *from
    })
}

/// Whether `job` ended `cancelled` past its start-by deadline (`expired`).
fn expired(job: &Job) -> bool {
    job.state == JobState::Cancelled
        && job
            .last_error
            .as_ref()
            .is_some_and(|e| e.code == jobvisor::deadline::EXPIRED)
}
