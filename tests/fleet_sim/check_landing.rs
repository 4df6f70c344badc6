//! What a held renewal may change when it lands (`faults.rs`), checked around each landing
//! (§6 invariant 1: a renewal, and the progress it carries, applies only under its holder's
//! token; a zombie's writes change nothing): a job whose lease (expiry, heartbeat) or
//! progress the landing changed must have been running under the sender's lease just
//! before it, and a progress it wrote — each handler reports its node and attempt as it
//! starts (`journal.rs`) — must be the sender's for exactly that attempt. A renewal sent in
//! time that lands on the lease of the job's next holder must change nothing.

use std::collections::BTreeMap;

use jobvisor::{Job, JobState};

/// What a landing of `sender`'s held renewal changed wrongly, from the jobs before and
/// after it.
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
                "renewal: {sender}'s held renewal landed on job {}, {} attempt {} held by \
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
