//! The execution ledger cross-checked against what the nodes journaled (`tests/crash/`,
//! `tests/partition/`): every execution a node journaled appears in its job's ledger
//! (`Client::claims`) with the node and attempt that ran it, and the ledger records no
//! execution that did not happen.
//!
//! The journals see handler starts; the ledger sees claims. A claim may end without a start
//! (given back, lost before its handler ran), so the ledger may hold claims no journal has.
//! What the ledger must not hold is a success nobody ran, a claim on a node other than the
//! one that ran it, a claim still open on a finished job, or a failure entry of the job's
//! that names a claim it does not know.

use std::collections::{HashMap, HashSet};

use jobvisor::testing::StoreEngine as _;
use jobvisor::{Claim, ClaimOutcome, JobId, Store};

use super::journal::JobFacts;
use super::retry;
use super::side::Execution;

/// What the cross-check counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LedgerStats {
    /// Claims in the ledgers of the jobs checked.
    pub(crate) claims: usize,
    /// Journaled executions found in the ledger with their node and attempt.
    pub(crate) matched: usize,
    /// Ledger claims that ended without a journaled handler start (given back, lost or
    /// fenced before the handler ran, or a node killed before its journal line).
    pub(crate) unjournaled: usize,
}

/// Every job's ledger, read through the store (`job_claims`, what `Client::claims` returns).
pub(crate) async fn read_ledgers(store: &Store, jobs: &[JobFacts]) -> HashMap<JobId, Vec<Claim>> {
    let mut out = HashMap::with_capacity(jobs.len());
    for j in jobs {
        let claims = retry("reading a job's claims", || store.job_claims(j.id)).await;
        out.insert(j.id, claims);
    }
    out
}

/// The ledgers checked against the executions: the violations found and the counts.
pub(crate) fn cross_check(
    jobs: &[JobFacts],
    ledgers: &HashMap<JobId, Vec<Claim>>,
    execs: &[Execution],
) -> (Vec<String>, LedgerStats) {
    let mut by_job: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for x in execs {
        by_job.entry(x.job_id).or_default().push(x);
    }
    let mut problems = Vec::new();
    let mut stats = LedgerStats::default();
    let none = Vec::new();
    for job in jobs {
        let claims = ledgers.get(&job.id).unwrap_or(&none);
        let ran = by_job.get(&job.id.0).map_or(&[][..], Vec::as_slice);
        stats.claims += claims.len();
        problems.extend(check_job(job, claims, ran, &mut stats));
    }
    (problems, stats)
}

/// One job's ledger against its executions.
fn check_job(
    job: &JobFacts,
    claims: &[Claim],
    ran: &[&Execution],
    stats: &mut LedgerStats,
) -> Vec<String> {
    let id = job.id.0;
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for c in claims {
        if !seen.insert(c.claim) {
            problems.push(format!("job {id}: claim {} twice in its ledger", c.claim));
        }
        if c.outcome == ClaimOutcome::Running || c.ended_at.is_none() {
            problems.push(format!(
                "job {id} ({:?}): claim {} still open in the ledger",
                job.state, c.claim
            ));
        }
    }
    let by_claim: HashMap<String, &Claim> =
        claims.iter().map(|c| (c.claim.to_string(), c)).collect();
    for x in ran.iter().filter(|x| !x.claim.is_empty()) {
        match by_claim.get(&x.claim) {
            None => problems.push(format!(
                "job {id}: {} ran claim {} (attempt {}) but the ledger has no such claim",
                x.node, x.claim, x.attempt
            )),
            Some(c)
                if c.node.as_str() != x.node || i64::from(c.attempt) != i64::from(x.attempt) =>
            {
                problems.push(format!(
                    "job {id}: claim {} ran on {} attempt {}, the ledger says {} attempt {}",
                    x.claim, x.node, x.attempt, c.node, c.attempt
                ));
            }
            Some(_) => stats.matched += 1,
        }
    }
    let journaled: HashSet<&str> = ran.iter().map(|x| x.claim.as_str()).collect();
    stats.unjournaled += claims
        .iter()
        .filter(|c| !journaled.contains(c.claim.to_string().as_str()))
        .count();
    // A success is an execution that ran to its end: one per succeeded job, the one whose
    // result the job holds, journaled as completed on the node the ledger names.
    let successes: Vec<&Claim> = claims
        .iter()
        .filter(|c| c.outcome == ClaimOutcome::Succeeded)
        .collect();
    let want = usize::from(job.state == jobvisor::JobState::Succeeded);
    if successes.len() != want {
        problems.push(format!(
            "job {id} ({:?}): {} successes in its ledger, expected {want}",
            job.state,
            successes.len()
        ));
    }
    for s in successes {
        let claim = s.claim.to_string();
        if let Some(r) = job.result_claim() {
            if r != claim {
                problems.push(format!(
                    "job {id}: the ledger's success is claim {claim}, the result was written by {r}"
                ));
            }
        }
        let done = ran
            .iter()
            .any(|x| x.claim == claim && x.node == s.node.as_str() && x.completed == 1);
        if !done {
            problems.push(format!(
                "job {id}: the ledger's success (claim {claim} on {}) has no completed execution \
                 in the journals",
                s.node
            ));
        }
    }
    // Every failure the job records names a claim of its ledger, ended with that code.
    for e in &job.errors {
        let Some(claim) = e.claim else { continue };
        match claims.iter().find(|c| c.claim == claim) {
            None => problems.push(format!(
                "job {id}: its error `{}` names claim {claim}, absent from the ledger",
                e.code
            )),
            Some(c) if c.code.as_deref() != Some(e.code.as_str()) => problems.push(format!(
                "job {id}: its error `{}` names claim {claim}, which the ledger ended as {} ({:?})",
                e.code, c.outcome, c.code
            )),
            Some(_) => {}
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use jobvisor::{JobFailure, JobState};

    use super::*;

    fn job(state: JobState, result_claim: Option<&str>) -> JobFacts {
        JobFacts {
            id: JobId(7),
            kind: "k".into(),
            state,
            attempts: 1,
            max_attempts: 3,
            timeout_us: 1,
            version: 3,
            errors: Vec::new(),
            last_error: None,
            result: result_claim.map(|c| serde_json::json!({"claim": c, "node": "a"})),
            lease_held: false,
            finished_at_us: Some(1),
            waited: false,
        }
    }

    fn claim(id: &str, node: &str, outcome: ClaimOutcome, code: Option<&str>) -> Claim {
        let mut c: Claim = serde_json::from_value(serde_json::json!({
            "claim": id, "job": 7, "attempt": 1, "node": node,
            "claimed_at": Utc::now(), "started_at": null, "ended_at": Utc::now(),
            "outcome": outcome, "code": code, "fence_margin_ms": null,
        }))
        .expect("a claim");
        c.attempt = 1;
        c
    }

    fn exec(claim: &str, node: &str, completed: i16) -> Execution {
        Execution {
            job_id: 7,
            attempt: 1,
            claim: claim.into(),
            node: node.into(),
            started_at_us: 1,
            runtime_started_at_us: None,
            ended_at_us: Some(2),
            completed,
            held: Some(1),
        }
    }

    const A: &str = "00000000000000aa";
    const B: &str = "00000000000000bb";

    #[test]
    fn a_ledger_that_matches_the_journals_passes() {
        let j = job(JobState::Succeeded, Some(B));
        let mut lost = claim(A, "a", ClaimOutcome::Lost, Some("lease_expired"));
        lost.started_at = Some(Utc::now());
        let claims = vec![lost, claim(B, "a", ClaimOutcome::Succeeded, None)];
        let (x, y) = (exec(A, "a", 0), exec(B, "a", 1));
        let mut stats = LedgerStats::default();
        let problems = check_job(&j, &claims, &[&x, &y], &mut stats);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(stats.matched, 2);
    }

    #[test]
    fn each_kind_of_disagreement_is_reported() {
        let j = job(JobState::Succeeded, Some(B));
        let x = exec(A, "a", 0);
        let mut stats = LedgerStats::default();
        // An execution the ledger lacks, and a success nobody ran to its end.
        let p = check_job(
            &j,
            &[claim(B, "a", ClaimOutcome::Succeeded, None)],
            &[&x],
            &mut stats,
        );
        assert!(p.iter().any(|p| p.contains("no such claim")), "{p:?}");
        assert!(
            p.iter().any(|p| p.contains("no completed execution")),
            "{p:?}"
        );
        // The wrong node.
        let y = exec(B, "b", 1);
        let p = check_job(
            &j,
            &[claim(B, "a", ClaimOutcome::Succeeded, None)],
            &[&y],
            &mut stats,
        );
        assert!(p.iter().any(|p| p.contains("the ledger says a")), "{p:?}");
        // Two successes, and a claim left open.
        let j2 = job(JobState::Dead, None);
        let open = claim(A, "a", ClaimOutcome::Running, None);
        let p = check_job(
            &j2,
            &[open, claim(B, "a", ClaimOutcome::Succeeded, None)],
            &[],
            &mut stats,
        );
        assert!(p.iter().any(|p| p.contains("still open")), "{p:?}");
        assert!(
            p.iter()
                .any(|p| p.contains("1 successes in its ledger, expected 0")),
            "{p:?}"
        );
        // A failure entry whose claim the ledger does not know, or knows with another code.
        let mut j3 = job(JobState::Dead, None);
        let mut e = JobFailure::new("timeout", "ran too long", 1);
        e.claim = Some(A.parse().expect("a claim id"));
        j3.errors.push(e);
        let p = check_job(&j3, &[], &[], &mut stats);
        assert!(
            p.iter().any(|p| p.contains("absent from the ledger")),
            "{p:?}"
        );
        let p = check_job(
            &j3,
            &[claim(A, "a", ClaimOutcome::Fenced, Some("fenced"))],
            &[],
            &mut stats,
        );
        assert!(
            p.iter().any(|p| p.contains("which the ledger ended as")),
            "{p:?}"
        );
    }
}
