//! The ordered sequences the seed drives (`NewJob::sequence`): the run draws two or three
//! keys, each with one failure policy (`on_sequence_failure`) for all its members — the
//! first key `wait` (the default), the others `wait`, `run` or `cancel` as the seed picks —
//! and a step enqueues one or two members of one key through a node's client, each a
//! `work` job on either queue whose payload names its key and policy (so the checks,
//! `check_sequences.rs`, read them from the final rows, a member whose answer was lost
//! included). A `wait` member has [`WAIT_ATTEMPTS`] attempts, so it fails and retries
//! (its releases fail as any job's) but never ends dead: a dead `wait` member would hold
//! the rest of its sequence for good, as documented, and the run must end with every job
//! terminal. A `run` or `cancel` member has one or two attempts, so some end dead and their
//! policy applies.

use std::collections::BTreeSet;
use std::time::Duration;

use jobvisor::testing::Simulation;
use jobvisor::{NewJob, ParentPolicy};
use serde_json::json;

use crate::controls::QUEUES;
use crate::rng::Rng;

/// Attempts of a member under policy `wait`.
const WAIT_ATTEMPTS: u32 = 20;

/// One sequence key of the run and its members' policy.
#[derive(Debug, Clone)]
pub(crate) struct SequenceKey {
    pub(crate) key: String,
    pub(crate) policy: ParentPolicy,
}

/// A policy's name in a member's payload.
pub(crate) fn policy_name(p: ParentPolicy) -> &'static str {
    match p {
        ParentPolicy::Wait => "wait",
        ParentPolicy::Run => "run",
        _ => "cancel",
    }
}

/// The run's keys: two or three, the first under `wait`.
pub(crate) fn draw(rng: &mut Rng) -> Vec<SequenceKey> {
    let n = 2 + rng.below(2);
    (0..n)
        .map(|i| SequenceKey {
            key: format!("s{i}"),
            policy: if i == 0 {
                ParentPolicy::Wait
            } else {
                *rng.pick(&[ParentPolicy::Wait, ParentPolicy::Run, ParentPolicy::Cancel])
            },
        })
        .collect()
}

/// Enqueues one or two members of one of `keys` through `sim`'s client; answers the log
/// line.
pub(crate) async fn enqueue_members(
    sim: &Simulation,
    rng: &mut Rng,
    keys: &[SequenceKey],
    answered: &mut BTreeSet<i64>,
    made: &mut u64,
) -> String {
    let k = rng.pick(keys).clone();
    let mut ids = Vec::new();
    for _ in 0..1 + rng.below(2) {
        *made += 1;
        let attempts = if k.policy == ParentPolicy::Wait {
            WAIT_ATTEMPTS
        } else {
            1 + u32::try_from(rng.below(2)).unwrap()
        };
        let job = NewJob::new(
            "work",
            json!({ "n": *made, "seq": k.key, "policy": policy_name(k.policy) }),
        )
        .queue(*rng.pick(&QUEUES))
        .max_attempts(attempts)
        .timeout(Duration::from_secs(5 + rng.below(50)))
        .sequence(k.key.clone())
        .on_sequence_failure(k.policy);
        match sim.client.enqueue(job).await {
            Ok(e) => {
                answered.insert(e.id.0);
                ids.push(e.id.0.to_string());
            }
            Err(_) => ids.push("error".into()),
        }
    }
    format!(
        "sequence {} ({}) → {}",
        k.key,
        policy_name(k.policy),
        ids.join(" ")
    )
}
