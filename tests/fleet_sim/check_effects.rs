//! The rule of the handlers' own transactions (§6 invariant 12: a handler's transaction
//! commits only while its attempt holds the lease; an effect key is recorded at most once
//! per job). A quarter of the successes commit in a transaction that records the effect
//! `done/<node>/<attempt>` and completes the job (`journal.rs`), so a commit that stands
//! leaves exactly that effect and that result: a job records at most one such effect, and
//! a job that records one is `succeeded` with a result naming the same node and attempt. A
//! zombie's transaction that committed after its lease moved on would leave an effect
//! beside the next holder's, or a result that is not its own.

use std::collections::BTreeMap;

use jobvisor::{Job, JobState};

use crate::journal::DONE_EFFECT;

/// Every rule broken, one line each; `effects`: each job's effect keys.
pub(crate) fn check(jobs: &[Job], effects: &BTreeMap<i64, Vec<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for j in jobs {
        let done: Vec<&String> = effects
            .get(&j.id.0)
            .into_iter()
            .flatten()
            .filter(|k| k.starts_with(DONE_EFFECT))
            .collect();
        match done.as_slice() {
            [] => {}
            [key] => {
                let result = j.result.as_ref().map(|r| {
                    format!(
                        "{DONE_EFFECT}{}/{}",
                        r["node"].as_str().unwrap_or("?"),
                        r["attempt"]
                    )
                });
                if j.state != JobState::Succeeded || result.as_deref() != Some(key.as_str()) {
                    bad.push(format!(
                        "effects: job {} recorded {key:?}, but it is {} with result {:?}",
                        j.id.0, j.state, j.result
                    ));
                }
            }
            many => bad.push(format!(
                "effects: job {} recorded its end {} times: {many:?}",
                j.id.0,
                many.len()
            )),
        }
    }
    bad
}
