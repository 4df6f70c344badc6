//! The invariants of the ordered sequences the seed drives (`sequences.rs`), checked after
//! every run on the final rows (a member's key and policy are in its payload; its place in
//! its sequence is its id's, as SQLite commits one enqueue at a time and numbers the jobs in
//! commit order) and the journal's executions in the run's order:
//!
//! 1. **Order.** Members start in enqueue order: no execution of a member starts before
//!    every execution of each member enqueued before it has ended (a frozen node's handler
//!    that ended as its node resumed is left out while its node was frozen, as the overlap
//!    rule of `check.rs` excuses). Under policy `wait` a member runs only if the one before
//!    it succeeded; under `run`, whatever it ended (the rule above: it had ended); under
//!    `cancel`, a member after one that ended dead or cancelled never runs and ends
//!    cancelled.
//! 2. **One at a time.** No two executions of members of one key overlap (with the same
//!    frozen-node exception).

use std::collections::BTreeMap;

use jobvisor::{Job, JobState};

use crate::check_controls::Facts;

/// Every rule broken, one line each.
pub(crate) fn check(f: &Facts<'_>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut keys: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
    for j in f.jobs {
        if let Some(k) = j.payload.get("seq").and_then(|k| k.as_str()) {
            keys.entry(k).or_default().push(j);
        }
    }
    let mut runs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, e) in f.execs.iter().enumerate() {
        runs.entry(e.job_id).or_default().push(i);
    }
    for (key, mut members) in keys {
        members.sort_by_key(|j| j.id.0);
        let of = |j: &Job| runs.get(&j.id.0).cloned().unwrap_or_default();
        for (n, m) in members.iter().enumerate() {
            let mine = of(m);
            let first = mine.iter().copied().min_by_key(|i| f.orders[*i].start);
            if let Some(x) = first.filter(|x| !f.started_blind(*x)) {
                for before in &members[..n] {
                    for e in of(before) {
                        let ended = f.orders[e].end.is_some_and(|end| end < f.orders[x].start);
                        if !ended && !f.frozen_then(e, f.execs[x].started_at_us) {
                            bad.push(format!(
                                "sequence {key}: member {} started ({:?}) before the execution \
                                 {:?} of member {} enqueued before it ended",
                                m.id.0, f.execs[x], f.execs[e], before.id.0
                            ));
                        }
                    }
                }
            }
            let Some(prev) = n.checked_sub(1).map(|p| members[p]) else {
                continue;
            };
            let policy = m.payload["policy"].as_str().unwrap_or("?");
            let failed = matches!(prev.state, JobState::Dead | JobState::Cancelled);
            if policy == "wait" && first.is_some() && prev.state != JobState::Succeeded {
                bad.push(format!(
                    "sequence {key} (wait): member {} ran though the member before it, {}, \
                     ended {}",
                    m.id.0, prev.id.0, prev.state
                ));
            }
            if policy == "cancel" && failed && (first.is_some() || m.state != JobState::Cancelled) {
                bad.push(format!(
                    "sequence {key} (cancel): member {} ran {} time(s) and ended {} though the \
                     member before it, {}, ended {}",
                    m.id.0,
                    mine.len(),
                    m.state,
                    prev.id.0,
                    prev.state
                ));
            }
        }
        let all: Vec<usize> = members.iter().flat_map(|m| of(m)).collect();
        for &y in all.iter().filter(|y| !f.started_blind(**y)) {
            for &e in &all {
                if f.execs[e].job_id != f.execs[y].job_id && f.running_at_start_of(e, y) {
                    bad.push(format!(
                        "sequence {key}: {:?} started while {:?} of the same key ran",
                        f.execs[y], f.execs[e]
                    ));
                }
            }
        }
    }
    bad
}
