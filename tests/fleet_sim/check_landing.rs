//! What a held write may change when it lands (`faults.rs`), checked around each landing.
//!
//! * **A renewal** (§6 invariant 1: a renewal, and the progress it carries, applies only
//!   under its holder's token; a zombie's writes change nothing): a job whose lease (expiry,
//!   heartbeat) or progress the landing changed must have been running under the sender's
//!   lease just before it, and a progress it wrote — each handler reports its node and
//!   attempt as it starts (`journal.rs`) — must be the sender's for exactly that attempt. A
//!   renewal sent in time that lands on the lease of the job's next holder must change
//!   nothing; nor may one a node sends as it wakes from a stop hidden from its clock
//!   (`Fleet::resume`), for leases the database let go meanwhile.
//! * **A settle** (§6 invariant 13: a child is released once): a landing may change only
//!   children still waiting just before it (their version, as the settle's lock, and their
//!   state, released or cancelled). A settle sent in time that lands after the sweeper's
//!   backstop released the child, and it ran, must change nothing.
//! * **A schedule fire** (§6 invariant 11: a leader-only write commits only while its term
//!   holds an unexpired lease): a landing that moved any schedule's fires on must have found
//!   the sender leading, under an unexpired lease, at the instant it landed. A fire sent by
//!   a leader whose lease has since lapsed must change nothing.
//! * **A take of the gauges' turn** (the same invariant: counting is leader-only work): a
//!   landing that took the turn must have found the sender leading at that instant.

use std::collections::BTreeMap;

use jobvisor::{Job, JobState, Leader, ScheduleInfo};

/// What a landing of `sender`'s renewal (held, or sent by a node waking from a stop hidden
/// from its clock) changed wrongly, from the jobs before and after it.
pub(crate) fn check(sender: &str, before: &[Job], after: &[Job]) -> Vec<String> {
    let was: BTreeMap<i64, &Job> = before.iter().map(|j| (j.id.0, j)).collect();
    let mut problems = Vec::new();
    for j in after {
        let Some(old) = was.get(&j.id.0) else {
            continue;
        };
        let lease = |j: &Job| j.lease.as_ref().map(|l| (l.expires_at, l.heartbeat_at));
        let (renewed, progressed) = (lease(j) != lease(old), j.progress != old.progress);
        if !renewed && !progressed {
            continue;
        }
        let holder = old.lease.as_ref().map(|l| l.owner.to_string());
        let sender_held = old.state == JobState::Running && holder.as_deref() == Some(sender);
        let reported = j.progress.as_ref().map(|p| {
            (
                p.get("node")
                    .and_then(|n| n.as_str())
                    .unwrap_or("?")
                    .to_string(),
                p.get("attempt").and_then(serde_json::Value::as_u64),
            )
        });
        let own = |(node, attempt): &(String, Option<u64>)| {
            node == sender && *attempt == Some(u64::from(old.attempts))
        };
        if !sender_held || (progressed && !reported.as_ref().is_some_and(own)) {
            problems.push(format!(
                "renewal: {sender}'s renewal landed on job {}, {} attempt {} held by \
                 {holder:?}, and changed its {} (progress now {reported:?})",
                j.id.0,
                old.state,
                old.attempts,
                match (renewed, progressed) {
                    (true, true) => "lease and progress",
                    (true, false) => "lease",
                    _ => "progress",
                }
            ));
        }
    }
    problems
}

/// What a landing of `sender`'s held settle changed wrongly, from the jobs before and after
/// it: any job not waiting before it.
pub(crate) fn check_settle(sender: &str, before: &[Job], after: &[Job]) -> Vec<String> {
    let was: BTreeMap<i64, &Job> = before.iter().map(|j| (j.id.0, j)).collect();
    after
        .iter()
        .filter_map(|j| {
            let old = was.get(&j.id.0)?;
            let changed = (j.state, j.version) != (old.state, old.version);
            (changed && old.state != JobState::Waiting).then(|| {
                format!(
                    "settle: {sender}'s held settle landed on job {}, {} at version {}, and \
                     made it {} at version {}",
                    j.id.0, old.state, old.version, j.state, j.version
                )
            })
        })
        .collect()
}

/// What a landing of `sender`'s held schedule fire at `at_us` changed wrongly, from the
/// schedules before and after it and the leader at that instant (`None`: nobody's lease
/// unexpired).
pub(crate) fn check_fire(
    sender: &str,
    at_us: i64,
    before: &[ScheduleInfo],
    after: &[ScheduleInfo],
    leader: Option<&Leader>,
) -> Vec<String> {
    let fires = |s: &ScheduleInfo| (s.next_fire_at, s.last_fire_at);
    let was: BTreeMap<&str, &ScheduleInfo> = before.iter().map(|s| (s.name.as_str(), s)).collect();
    let moved: Vec<&str> = after
        .iter()
        .filter(|s| {
            was.get(s.name.as_str())
                .is_none_or(|old| fires(old) != fires(s))
        })
        .map(|s| s.name.as_str())
        .collect();
    if moved.is_empty() {
        return Vec::new();
    }
    led_by(sender, leader)
        .map(|who| {
            format!("fire: {sender}'s held fire landed at {at_us} µs and fired {moved:?} while {who} led")
        })
        .into_iter()
        .collect()
}

/// What a landing of `sender`'s held take of the gauges' turn at `at_us` did wrongly, from
/// the turn (its instant and taker) before and after it and the leader at that instant.
pub(crate) fn check_gauges(
    sender: &str,
    at_us: i64,
    before: &(i64, Option<String>),
    after: &(i64, Option<String>),
    leader: Option<&Leader>,
) -> Vec<String> {
    if before == after {
        return Vec::new();
    }
    led_by(sender, leader)
        .map(|who| {
            format!(
                "gauges: {sender}'s held take landed at {at_us} µs and took the turn while {who} led"
            )
        })
        .into_iter()
        .collect()
}

/// `None` if `sender` leads; else who does ("nobody": no lease unexpired).
fn led_by(sender: &str, leader: Option<&Leader>) -> Option<String> {
    match leader {
        Some(l) if l.node.as_str() == sender => None,
        Some(l) => Some(format!(
            "{} (term {}, until {})",
            l.node,
            l.term,
            l.expires_at.timestamp_micros()
        )),
        None => Some("nobody".to_string()),
    }
}
