//! The crash test's dependent jobs: with every wave of the mix, a chain (each link enqueued
//! `after` the one before), a fan-in batch (`Client::enqueue_batch`: members and a callback
//! that waits for all of them with `ParentPolicy::Run`) and a join `after` both the chain's
//! tail and the batch's callback — run while nodes are killed, frozen and the server
//! restarts. Every one of them completes in its own transaction (payload `"effect": true`):
//! its handler writes one business row to `crash_effects` and marks the job succeeded in the
//! same commit, guarded by its lease.
//!
//! The rules ([`check_deps`]), from the job rows, the executions the handlers recorded
//! through their own connection (`crash_executions`) and the business rows:
//! * no child started before each of its parents' successful end had committed: its first
//!   execution's start is after every parent's `finished_at` (for a `Run` parent, after its
//!   end whatever it was); the release commits with the parent's end or after it, so this
//!   holds to the clock's resolution;
//! * every batch callback succeeded (none missing) and ran to success once: one business
//!   row, written by the claim whose result the job holds (that no two of its executions
//!   overlapped is the rule every job is held to, in `check.rs`);
//! * every dependent job's business row was applied once: exactly one row per succeeded
//!   job, written by the claim whose result the job holds, and none for any other job.

use super::*;
use jobvisor::{Client, ParentPolicy};

/// Links per chain.
const CHAIN_LEN: usize = 6;
/// Members per fan-in batch.
const BATCH_MEMBERS: usize = 8;
/// A chain link works this long, uniformly at random in between: long enough that kills and
/// freezes land in the middle of chains.
const LINK_WORK: (Duration, Duration) = (Duration::from_millis(100), Duration::from_millis(400));
/// A batch member works this long.
const MEMBER_WORK: (Duration, Duration) = (Duration::from_millis(0), Duration::from_millis(300));
/// Dependent jobs go ahead of the quick jobs' backlog (smaller is claimed first).
const DEP_PRIORITY: i16 = 0;

/// What a dependent job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A link of a chain (the first has no parent).
    Link,
    /// A member of a batch (no parent).
    Member,
    /// A batch's callback (its parents: every member, `Run`).
    Callback,
    /// After a chain's tail and a batch's callback (`Cancel`).
    Join,
}

/// One job the driver enqueued with (or for) dependencies, as the driver enqueued it.
#[derive(Debug, Clone)]
pub(crate) struct DepJob {
    pub(crate) id: i64,
    pub(crate) role: Role,
    pub(crate) parents: Vec<i64>,
    pub(crate) policy: ParentPolicy,
}

/// A dependent job's payload: the handler completes it in its own transaction.
fn payload(wave: usize, what: &str, work_ms: u64) -> NewJob {
    let timeout_ms = u64::try_from(harness::CRASHY_TIMEOUT.as_millis()).unwrap();
    NewJob::new(
        CRASHY,
        json!({
            "wave": wave, "dep": what, "work_ms": work_ms, "timeout_ms": timeout_ms,
            "effect": true,
        }),
    )
    .queue(QUEUE)
    .priority(DEP_PRIORITY)
    .max_attempts(harness::MAX_ATTEMPTS)
    .timeout(harness::CRASHY_TIMEOUT)
}

fn ms(rng: &mut Rng, range: (Duration, Duration)) -> u64 {
    u64::try_from(rng.between(range).as_millis()).unwrap()
}

/// Enqueues one wave's chain, batch and join (each enqueue retried while the database does
/// not answer); appends them to `deps` and answers how many jobs were enqueued.
pub(crate) async fn enqueue_deps(
    store: &Store,
    rng: &mut Rng,
    wave: usize,
    deps: &mut Vec<DepJob>,
) -> usize {
    let client = Client::new(store.clone());
    let before = deps.len();
    let mut prev: Option<i64> = None;
    for k in 0..CHAIN_LEN {
        let mut job = payload(wave, &format!("link{k}"), ms(rng, LINK_WORK));
        if let Some(p) = prev {
            job = job.after(&[JobId(p)]);
        }
        let id = retry("enqueueing a chain link", || client.enqueue(job.clone()))
            .await
            .id
            .0;
        deps.push(DepJob {
            id,
            role: Role::Link,
            parents: prev.into_iter().collect(),
            policy: ParentPolicy::Cancel,
        });
        prev = Some(id);
    }
    let members: Vec<NewJob> = (0..BATCH_MEMBERS)
        .map(|i| payload(wave, &format!("member{i}"), ms(rng, MEMBER_WORK)))
        .collect();
    let callback = payload(wave, "callback", 20);
    let batch = retry("enqueueing a batch", || {
        client.enqueue_batch(members.clone(), callback.clone())
    })
    .await;
    let member_ids: Vec<i64> = batch.members.iter().map(|e| e.id.0).collect();
    for &id in &member_ids {
        deps.push(DepJob {
            id,
            role: Role::Member,
            parents: Vec::new(),
            policy: ParentPolicy::Cancel,
        });
    }
    deps.push(DepJob {
        id: batch.callback.id.0,
        role: Role::Callback,
        parents: member_ids,
        policy: ParentPolicy::Run,
    });
    let tail = prev.unwrap();
    let join = payload(wave, "join", 20).after(&[JobId(tail), batch.callback.id]);
    let id = retry("enqueueing a join", || client.enqueue(join.clone()))
        .await
        .id
        .0;
    deps.push(DepJob {
        id,
        role: Role::Join,
        parents: vec![tail, batch.callback.id.0],
        policy: ParentPolicy::Cancel,
    });
    deps.len() - before
}

/// Counts of the dependency checks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DepStats {
    pub(crate) chains: usize,
    pub(crate) callbacks: usize,
    /// Parent → child edges checked.
    pub(crate) edges: usize,
    /// Business rows found.
    pub(crate) effects: usize,
    /// The least time from a parent's end to its child's first start, µs (how close a
    /// release came to the rule).
    pub(crate) min_release_gap_us: Option<i64>,
}

/// The dependency rules (see the module docs). `effects` is `crash_effects` as
/// `(job_id, claim)`.
pub(crate) fn check_deps(
    deps: &[DepJob],
    jobs: &[JobFacts],
    execs: &[Execution],
    effects: &[(i64, String)],
) -> (Vec<String>, DepStats) {
    let mut bad = Vec::new();
    let mut stats = DepStats::default();
    let by_id: HashMap<i64, &JobFacts> = jobs.iter().map(|j| (j.id.0, j)).collect();
    let mut runs: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        runs.entry(e.job_id).or_default().push(e);
    }
    for list in runs.values_mut() {
        list.sort_by_key(|e| e.start());
    }
    let mut rows: HashMap<i64, Vec<&str>> = HashMap::new();
    for (job, claim) in effects {
        rows.entry(*job).or_default().push(claim.as_str());
    }
    stats.effects = effects.len();
    let dep_ids: std::collections::HashSet<i64> = deps.iter().map(|d| d.id).collect();
    for job in rows.keys().filter(|j| !dep_ids.contains(j)) {
        bad.push(format!(
            "[deps] job {job}: business rows written for a job that does not complete in \
             its transaction"
        ));
    }
    for d in deps {
        let Some(job) = by_id.get(&d.id) else {
            bad.push(format!("[deps] job {} ({:?}) is missing", d.id, d.role));
            continue;
        };
        match d.role {
            Role::Link if d.parents.is_empty() => stats.chains += 1,
            Role::Callback => stats.callbacks += 1,
            _ => {}
        }
        // None missing: every dependent job succeeds (no parent can fail here).
        if job.state != JobState::Succeeded {
            bad.push(format!(
                "[deps] job {} ({:?}) is {}, not succeeded (a {} never ran to success)",
                d.id,
                d.role,
                job.state,
                if d.role == Role::Callback {
                    "batch callback"
                } else {
                    "dependent job"
                }
            ));
        }
        let list = runs.get(&d.id).map_or(&[][..], Vec::as_slice);
        // No child early.
        if let Some(first) = list.first() {
            for p in &d.parents {
                stats.edges += 1;
                let Some(parent) = by_id.get(p) else {
                    bad.push(format!("[deps] job {}: parent {p} is missing", d.id));
                    continue;
                };
                let ok_end = parent.state == JobState::Succeeded
                    || (d.policy == ParentPolicy::Run && parent.state.is_terminal());
                let Some(end) = parent.finished_at_us.filter(|_| ok_end) else {
                    bad.push(format!(
                        "[deps] job {} ({:?}) started at {} but its parent {p} is {} \
                         (policy {:?}): it had no end that releases the child",
                        d.id,
                        d.role,
                        first.start(),
                        parent.state,
                        d.policy
                    ));
                    continue;
                };
                let gap = first.start() - end;
                stats.min_release_gap_us =
                    Some(stats.min_release_gap_us.map_or(gap, |g: i64| g.min(gap)));
                if gap < -DB_CLOCK_SLACK_US {
                    bad.push(format!(
                        "[deps] job {} ({:?}) started at {} (node {}, attempt {}), {} µs before \
                         its parent {p} ended ({} at {end})",
                        d.id,
                        d.role,
                        first.start(),
                        first.node,
                        first.attempt,
                        -gap,
                        parent.state
                    ));
                }
            }
        }
        // The business row: once per succeeded job, by the claim whose result it holds.
        let claims = rows.get(&d.id).map_or(&[][..], Vec::as_slice);
        let holder = job
            .result
            .as_ref()
            .and_then(|r| r["claim"].as_str())
            .map(str::to_string);
        match (job.state == JobState::Succeeded, claims) {
            (true, [one]) if holder.as_deref() == Some(*one) => {}
            (false, []) => {}
            (_, found) => bad.push(format!(
                "[deps] job {} ({:?}, {}): {} business row(s) by claims {found:?}; expected \
                 {} (by the result's claim {holder:?})",
                d.id,
                d.role,
                job.state,
                found.len(),
                usize::from(job.state == JobState::Succeeded)
            )),
        }
    }
    (bad, stats)
}
