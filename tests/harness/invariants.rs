//! The invariants every multi-process test checks of one job's executions, stated once
//! (ARCHITECTURE.md §6, invariant 1): when each execution surely stopped, that no two
//! executions of a job overlapped, and that the outcome was written by the holder of the
//! job's last lease. `tests/crash/` and `tests/partition/` read the same journals
//! (`journal.rs`) and call these; each adds around them only the rules of its own faults
//! (kills and freezes; network cuts).

use std::collections::HashMap;

use jobvisor::JobState;

use super::journal::JobFacts;
use super::side::Execution;

/// When each execution of `list` (one job's, sorted by start) surely stopped: its recorded
/// end, or else its node's end (`gone`). A handler that finished, or was stopped from
/// outside, journals its end before its future is gone; an execution with no end had its
/// future still alive when its process died, so the node's `gone_at` (taken after the
/// process was reaped) is a sound upper bound — never optimistic, which could hide an
/// overlap. An execution with neither is reported in `bad` and has no end (`None`).
///
/// Answers the ends, in `list`'s order, and how many were bounded by their node's end.
pub(crate) fn execution_ends(
    list: &[&Execution],
    gone: &HashMap<&str, i64>,
    bad: &mut Vec<String>,
) -> (Vec<Option<i64>>, usize) {
    let mut by_death = 0;
    let ends = list
        .iter()
        .map(|e| match (e.ended_at_us, gone.get(e.node.as_str())) {
            (Some(t), _) => Some(t),
            (None, Some(t)) => {
                by_death += 1;
                Some(*t)
            }
            (None, None) => {
                bad.push(format!(
                    "job {}: execution {e:?} of a node that never ended",
                    e.job_id
                ));
                None
            }
        })
        .collect();
    (ends, by_death)
}

/// Two executions of one job that ran at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overlap {
    /// The one that started first (an index into the job's executions).
    pub(crate) earlier: usize,
    /// The one that started while the earlier still ran.
    pub(crate) later: usize,
    /// How long before the earlier one's end the later one started, µs.
    pub(crate) by_us: i64,
}

/// Invariant 1, directly: the pairs of `list` (one job's executions, sorted by start, with
/// their `ends`) where one started before an earlier one ended. An execution with no known
/// end runs for ever. `excused(earlier, its end, the later's start)` lets a test excuse
/// what its fault model allows (a frozen handler's last step on waking); it is asked only
/// about real overlaps.
pub(crate) fn overlaps(
    list: &[&Execution],
    ends: &[Option<i64>],
    mut excused: impl FnMut(&Execution, i64, i64) -> bool,
) -> Vec<Overlap> {
    let mut found = Vec::new();
    for (later, x) in list.iter().enumerate() {
        for (earlier, (p, end)) in list[..later].iter().zip(ends).enumerate() {
            let end = end.unwrap_or(i64::MAX);
            if x.started_at_us >= end || excused(p, end, x.started_at_us) {
                continue;
            }
            found.push(Overlap {
                earlier,
                later,
                by_us: end.saturating_sub(x.started_at_us),
            });
        }
    }
    found
}

/// What is wrong with a job's outcome, by what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OutcomeFault {
    /// A write of an attempt that no longer held the lease was accepted.
    LateWrite(String),
    /// An execution started after the one whose result counts: a handler ran for a lease
    /// that was gone.
    StartedAfter(usize, String),
    /// The row contradicts itself (a success without a result, a dead job with one).
    Row(String),
}

/// The outcome's writer, and what is wrong with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The execution that wrote the result (an index into the job's executions).
    pub(crate) writer: Option<usize>,
    /// Every rule the outcome breaks.
    pub(crate) faults: Vec<OutcomeFault>,
}

/// Invariant 1, the outcome: a job's result was written by the holder of its last lease —
/// the last execution that the result names (node and claim), of the job's final attempt,
/// which completed, and after whose start no other execution of the job started (unless the
/// result is a superseded attempt's: then that write is the fault). A job that succeeded has
/// a result; a dead one has none.
pub(crate) fn outcome(job: &JobFacts, list: &[&Execution]) -> Outcome {
    let id = job.id;
    let mut out = Outcome::default();
    let Some(result) = &job.result else {
        if job.state == JobState::Succeeded {
            out.faults.push(OutcomeFault::Row(format!(
                "job {id} succeeded without a result"
            )));
        }
        return out;
    };
    if job.state != JobState::Succeeded {
        out.faults.push(OutcomeFault::Row(format!(
            "job {id} is {} with a result {result:?}",
            job.state
        )));
    }
    let attempts = i64::from(job.attempts);
    // A result of a superseded attempt: the later executions are the rightful ones, the
    // write is what is wrong.
    let superseded = job.result_attempt() != Some(attempts);
    if superseded {
        out.faults.push(OutcomeFault::LateWrite(format!(
            "job {id}: result {result:?} is not from its final attempt {attempts}: a \
             superseded attempt's finalization was accepted"
        )));
    }
    let Some(w) = list.iter().rposition(|e| job.written_by(e)) else {
        out.faults.push(OutcomeFault::LateWrite(format!(
            "job {id}: result {result:?} names no recorded execution: a late write was accepted"
        )));
        return out;
    };
    out.writer = Some(w);
    if list[w].completed != 1 {
        out.faults.push(OutcomeFault::LateWrite(format!(
            "job {id}: result {result:?} from {:?}, which did not complete: a late write was \
             accepted",
            list[w]
        )));
    }
    for (i, e) in list.iter().enumerate().skip(w + 1) {
        if !superseded && e.started_at_us > list[w].started_at_us {
            out.faults.push(OutcomeFault::StartedAfter(
                i,
                format!(
                    "job {id}: {e:?} started {} µs after {:?}, whose result counts: a handler \
                     ran for a lease that was gone",
                    e.started_at_us - list[w].started_at_us,
                    list[w]
                ),
            ));
        }
    }
    out
}

impl OutcomeFault {
    /// The fault's report.
    pub(crate) fn message(&self) -> &str {
        match self {
            OutcomeFault::LateWrite(m)
            | OutcomeFault::StartedAfter(_, m)
            | OutcomeFault::Row(m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(node: &str, start: i64, end: Option<i64>) -> Execution {
        Execution {
            job_id: 1,
            attempt: 1,
            claim: format!("{node}-claim"),
            node: node.into(),
            started_at_us: start,
            runtime_started_at_us: None,
            ended_at_us: end,
            completed: 0,
            held: None,
        }
    }

    #[test]
    fn an_execution_without_an_end_ends_with_its_node_or_is_reported() {
        let (a, b) = (exec("a", 0, None), exec("b", 5, None));
        let gone = HashMap::from([("a", 9)]);
        let mut bad = Vec::new();
        let (ends, by_death) = execution_ends(&[&a, &b], &gone, &mut bad);
        assert_eq!(ends, vec![Some(9), None]);
        assert_eq!(by_death, 1);
        assert_eq!(bad.len(), 1, "{bad:?}");
    }

    #[test]
    fn overlaps_are_found_and_excuses_asked_only_about_them() {
        let (a, b, c) = (
            exec("a", 0, Some(10)),
            exec("b", 10, Some(20)),
            exec("c", 15, Some(30)),
        );
        let list = [&a, &b, &c];
        let ends: Vec<_> = list.iter().map(|e| e.ended_at_us).collect();
        let mut asked = 0;
        let found = overlaps(&list, &ends, |_, _, _| {
            asked += 1;
            false
        });
        assert_eq!(
            found,
            vec![Overlap {
                earlier: 1,
                later: 2,
                by_us: 5
            }]
        );
        assert_eq!(asked, 1, "a start at another's end is not an overlap");
        assert!(overlaps(&list, &ends, |_, _, _| true).is_empty());
    }
}
