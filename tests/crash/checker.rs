//! The checks, checked: each rule of `check.rs` and `sequences.rs` catches the fault it is there for.

use super::*;
use crate::harness::{CRASHY_TIMEOUT, MAX_ATTEMPTS};
use chrono::TimeZone;

const T0: i64 = 1_900_000_000_000_000;

fn at(t: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc.timestamp_micros(t).unwrap()
}

/// A job that succeeded on `attempts` attempts, each earlier one reclaimed at
/// `reclaims[i]`, finished at `finished`, written by `node`.
fn job(attempts: u32, reclaims: &[i64], finished: i64, node: &str) -> JobFacts {
    JobFacts {
        id: JobId(1),
        kind: CRASHY.into(),
        state: JobState::Succeeded,
        attempts,
        max_attempts: MAX_ATTEMPTS,
        timeout_us: i64::try_from(CRASHY_TIMEOUT.as_micros()).unwrap(),
        version: 1 + 2 * i64::from(attempts),
        errors: reclaims
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let attempt = u32::try_from(i).unwrap() + 1;
                JobFailure::new("lease_expired", "the lease expired", attempt).at(at(*t))
            })
            .collect(),
        last_error: None,
        result: Some(json!({"node": node, "attempt": attempts})),
        lease_held: false,
        finished_at_us: Some(finished),
        waited: false,
    }
}

fn exec(attempt: i32, node: &str, start: i64, end: Option<i64>, completed: bool) -> Execution {
    Execution {
        job_id: 1,
        attempt,
        claim: String::new(),
        node: node.into(),
        started_at_us: start,
        runtime_started_at_us: None,
        ended_at_us: end,
        completed: i16::from(completed),
        held: None,
    }
}

/// The checks with no freezes and no journaled claims.
fn check(jobs: &[JobFacts], execs: &[Execution], nodes: &[NodeRow]) -> Verdict {
    super::check(jobs, execs, nodes, &[], &Claims::new())
}

fn node(name: &str, gone: i64, how: &str) -> NodeRow {
    NodeRow {
        node: name.into(),
        pid: 1,
        spawned_at_us: T0 - 10_000_000,
        gone_at_us: gone,
        how: how.into(),
    }
}

fn nodes() -> Vec<NodeRow> {
    vec![
        node("a", T0 + 1_000_000, "killed"),
        node("b", T0 + 9_000_000, "stopped"),
    ]
}

#[test]
fn a_clean_history_passes() {
    // a runs attempt 1 and dies at +1 s without recording an end; the sweeper reclaims
    // at +3 s; b runs attempt 2 and finishes at +3.1 s.
    let j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
    let e = [
        exec(1, "a", T0, None, false),
        exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!((v.stats.reclaims, v.stats.ends_bounded_by_death), (1, 1));
}

#[test]
fn overlapping_executions_are_caught() {
    let j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
    // a's execution has no end and a died at +1 s, but b started at +0.5 s.
    let e = [
        exec(1, "a", T0, None, false),
        exec(2, "b", T0 + 500_000, Some(T0 + 600_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!((v.stats.overlaps, v.stats.duplicates), (1, 1));
}

#[test]
fn an_execution_running_past_its_reclaim_is_caught() {
    let j = job(2, &[T0 + 3_000_000], T0 + 8_100_000, "b");
    let e = [
        exec(1, "b", T0, Some(T0 + 4_000_000), true),
        exec(2, "b", T0 + 5_000_000, Some(T0 + 5_050_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!(v.stats.late_ends, 1, "{:?}", v.violations);
}

#[test]
fn a_result_from_an_older_lease_is_caught() {
    let mut j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "a");
    j.result = Some(json!({"node": "a", "attempt": 1}));
    let e = [
        exec(1, "a", T0, Some(T0 + 50_000), true),
        exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    assert!(v.violations[0].contains("superseded"), "{:?}", v.violations);
}

#[test]
fn a_stale_failure_write_is_caught() {
    let mut j = job(2, &[T0 + 3_000_000], T0 + 3_100_000, "b");
    j.errors
        .push(JobFailure::new("error", "zombie retry", 1).at(at(T0 + 3_050_000)));
    let e = [
        exec(1, "a", T0, None, false),
        exec(2, "b", T0 + 3_010_000, Some(T0 + 3_050_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert!(v.violations.len() >= 2, "{:?}", v.violations);
}

#[test]
fn lost_stuck_and_unpaired_jobs_are_caught() {
    let mut stuck = job(1, &[], T0 + 100_000, "b");
    stuck.state = JobState::Running;
    let mut unpaired = job(1, &[], T0 + 100_000, "b");
    unpaired.id = JobId(2);
    unpaired.version = 2;
    let e = [exec(1, "b", T0, Some(T0 + 50_000), true)];
    let v = check(&[stuck, unpaired], &e, &nodes());
    assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
    assert_eq!(v.stats.succeeded, 1);
}

#[test]
fn executions_beyond_claims_are_caught() {
    // One claim, two executions of attempt 1 on different nodes.
    let j = job(1, &[], T0 + 3_100_000, "b");
    let e = [
        exec(1, "a", T0, Some(T0 + 10_000), false),
        exec(1, "b", T0 + 20_000, Some(T0 + 50_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
}

#[test]
fn a_give_back_explains_a_repeated_attempt_number() {
    // a was stopped gracefully: its claim was given back (version + 2, attempts kept).
    let mut j = job(1, &[], T0 + 3_100_000, "b");
    j.version += 2;
    let e = [
        exec(1, "a", T0, Some(T0 + 10_000), false),
        exec(1, "b", T0 + 20_000, Some(T0 + 50_000), true),
    ];
    let v = check(&[j], &e, &nodes());
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(v.stats.give_backs, 1);
}

#[test]
fn a_node_that_never_recovers_from_a_restart_is_caught() {
    let restart = Restart {
        down_at_us: T0 - 3_000_000,
        up_at_us: T0,
        survivors: vec!["a".into(), "b".into()],
    };
    let after = |node: &str, i: i64| Execution {
        job_id: i,
        attempt: 1,
        claim: format!("{i:016x}"),
        node: node.into(),
        started_at_us: T0 + 1 + i,
        runtime_started_at_us: None,
        ended_at_us: Some(T0 + 100 + i),
        completed: 1,
        held: None,
    };
    let mut e: Vec<Execution> = (0..40).map(|i| after("b", i)).collect();
    let bad = check_recovery(std::slice::from_ref(&restart), &e);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("node a"), "{bad:?}");
    e.push(after("a", 40));
    assert_eq!(check_recovery(&[restart], &e), Vec::<String>::new());
}

#[test]
fn journal_lines_round_trip() {
    for l in [
        JournalLine::Start {
            job_id: 7,
            attempt: 2,
            claim: "00000000000000c1".into(),
            started_at_us: T0,
            runtime_started_at_us: None,
        },
        JournalLine::Start {
            job_id: 7,
            attempt: 2,
            claim: "00000000000000c1".into(),
            started_at_us: T0,
            runtime_started_at_us: Some(T0 - 40),
        },
        JournalLine::End {
            job_id: 7,
            attempt: 2,
            claim: "00000000000000c1".into(),
            started_at_us: T0,
            ended_at_us: T0 + 5,
            returned: false,
        },
        JournalLine::Claim {
            job_id: 7,
            attempt: 2,
            at_us: T0 - 90,
        },
        JournalLine::Event {
            what: "lease_lost".into(),
            n: 7,
        },
        JournalLine::At {
            at_us: T0,
            what: "claimed".into(),
            a: 7,
            b: 2,
        },
        JournalLine::Exit {
            at_us: T0,
            finished: 3,
            released: 1,
        },
    ] {
        assert_eq!(l.to_string().parse::<JournalLine>(), Ok(l));
    }
    assert!("end\t7\t2".parse::<JournalLine>().is_err());
    assert!("end\t7\t2\t5\tdropped".parse::<JournalLine>().is_err());
}

// The lease rules and the freeze rule.

fn failure(code: &str, attempt: u32, t: i64, holder: Option<&str>) -> JobFailure {
    let e = JobFailure::new(code, format!("{code} (test)"), attempt).at(at(t));
    match holder {
        Some(n) => e.with_detail(json!({ "owner": n })),
        None => e,
    }
}

/// A job of the mix (`kind`, timeout `timeout_ms`, `max_attempts`) that ended `state`
/// on `attempts` attempts after `claims` claims with these errors; if it succeeded, `node`
/// wrote the result.
#[allow(clippy::too_many_arguments)]
fn mix_job(
    kind: &str,
    timeout_ms: i64,
    max_attempts: u32,
    state: JobState,
    attempts: u32,
    claims: i64,
    errors: Vec<JobFailure>,
    finished: i64,
    node: &str,
) -> JobFacts {
    let succeeded = state == JobState::Succeeded;
    JobFacts {
        id: JobId(1),
        kind: kind.into(),
        state,
        attempts,
        max_attempts,
        timeout_us: timeout_ms * 1_000,
        version: 1 + 2 * claims,
        last_error: if succeeded {
            None
        } else {
            errors.last().cloned()
        },
        errors,
        result: succeeded.then(|| json!({"node": node, "attempt": attempts})),
        lease_held: false,
        finished_at_us: Some(finished),
        waited: false,
    }
}

/// An execution whose runtime start (what the lease rules read) is 100 µs before the
/// handler's entry.
fn run_exec(attempt: i32, node: &str, start: i64, end: i64, completed: bool) -> Execution {
    Execution {
        runtime_started_at_us: Some(start - 100),
        ..exec(attempt, node, start, Some(end), completed)
    }
}

fn all_nodes() -> Vec<NodeRow> {
    ["a", "b", "c"]
        .into_iter()
        .map(|n| node(n, T0 + 20_000_000, "stopped"))
        .collect()
}

fn freeze(node: &str, from: i64, to: i64) -> FreezeRow {
    FreezeRow {
        node: node.into(),
        signalled_at_us: from,
        frozen_at_us: from,
        resumed_at_us: to,
    }
}

#[test]
fn a_timeout_of_a_job_that_never_started_is_caught() {
    // Defect 1: a short job waits in a's prefetch behind long ones and is "timed out" at
    // claim + lease + timeout without ever starting; its second attempt runs on b for
    // real and really times out. Dead after its two attempts.
    let j = mix_job(
        "short",
        500,
        2,
        JobState::Dead,
        2,
        2,
        vec![
            failure("timeout", 1, T0 + 2_500_000, Some("a")),
            failure("timeout", 2, T0 + 3_600_000, Some("b")),
        ],
        T0 + 3_600_000,
        "",
    );
    let e = [run_exec(2, "b", T0 + 3_000_000, T0 + 3_550_000, false)];
    let v = super::check(
        std::slice::from_ref(&j),
        &e,
        &all_nodes(),
        &[],
        &Claims::new(),
    );
    assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    assert_eq!((v.stats.dead, v.stats.timeouts), (1, 2));

    // An execution of attempt 1 on another node than its holder does not count.
    let e2 = [
        run_exec(1, "c", T0, T0 + 600_000, false),
        run_exec(2, "b", T0 + 3_000_000, T0 + 3_550_000, false),
    ];
    let v = super::check(
        std::slice::from_ref(&j),
        &e2,
        &all_nodes(),
        &[],
        &Claims::new(),
    );
    assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);

    // Where the error names no holder (older code), any node's execution counts.
    let mut anon = j;
    for e in &mut anon.errors {
        e.detail = None;
    }
    let v = super::check(&[anon], &e2, &all_nodes(), &[], &Claims::new());
    assert_eq!(v.violations, Vec::<String>::new());
}

#[test]
fn lost_leases_and_fences_of_attempts_that_never_started_are_caught() {
    // A quick job: attempt 1's lease expired on a and attempt 2 was fenced, but neither
    // ever started; attempt 3 succeeded on c.
    let mut j = job(3, &[], T0 + 5_100_000, "c");
    j.errors = vec![
        failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
        failure("fenced", 2, T0 + 4_000_000, None),
    ];
    let e = [run_exec(3, "c", T0 + 5_000_000, T0 + 5_050_000, true)];
    let v = check(std::slice::from_ref(&j), &e, &all_nodes());
    assert_eq!(v.stats.failed_without_execution, 2, "{:?}", v.violations);
    assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
    assert_eq!((v.stats.reclaims, v.stats.fenced), (1, 1));

    // With both attempts started, it passes.
    let e = [
        run_exec(1, "a", T0, T0 + 10_000, false),
        run_exec(2, "b", T0 + 3_500_000, T0 + 3_900_000, false),
        run_exec(3, "c", T0 + 5_000_000, T0 + 5_050_000, true),
    ];
    let v = check(&[j], &e, &all_nodes());
    assert_eq!(v.violations, Vec::<String>::new());
}

#[test]
fn a_timeout_before_the_job_ran_its_timeout_is_caught() {
    // A tight job (timeout 1 s) started at +2 s after waiting in the prefetch; the
    // timeout came at +2.5 s: counted from the claim, not from the start.
    let early = mix_job(
        "tight",
        1_000,
        3,
        JobState::Succeeded,
        2,
        2,
        vec![failure("timeout", 1, T0 + 2_500_000, Some("a"))],
        T0 + 3_100_000,
        "b",
    );
    let e = [
        run_exec(1, "a", T0 + 2_000_000, T0 + 2_400_000, false),
        run_exec(2, "b", T0 + 3_000_000, T0 + 3_050_000, true),
    ];
    let v = check(std::slice::from_ref(&early), &e, &all_nodes());
    assert_eq!(v.stats.early_timeouts, 1, "{:?}", v.violations);
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);

    // Recorded a full second after the runtime started it: an honest timeout.
    let mut honest = early;
    honest.errors[0] = failure("timeout", 1, T0 + 2_000_000 - 100 + 1_000_000, Some("a"));
    let v = check(&[honest], &e, &all_nodes());
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(v.stats.timeouts, 1);
}

#[test]
fn a_start_after_the_claim_was_taken_is_caught() {
    // Defect 2: a was frozen holding attempt 1 in its prefetch; a sweeper took it at +3 s
    // (never started: refunded); on waking at +4 s a started it anyway. b then ran the
    // refunded attempt 1 and succeeded.
    let j = mix_job(
        "short",
        500,
        2,
        JobState::Succeeded,
        1,
        2,
        vec![failure("not_started", 1, T0 + 3_000_000, Some("a"))],
        T0 + 5_100_000,
        "b",
    );
    let e = [
        run_exec(1, "a", T0 + 4_000_000, T0 + 4_001_000, false),
        run_exec(1, "b", T0 + 5_000_000, T0 + 5_050_000, true),
    ];
    let freezes = [freeze("a", T0 + 500_000, T0 + 4_000_000)];
    let v = super::check(
        std::slice::from_ref(&j),
        &e,
        &all_nodes(),
        &freezes,
        &Claims::new(),
    );
    assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    assert_eq!(v.stats.refunds, 1);

    // Had a claimed the refunded attempt again after the reclaim, its start is fine.
    let claims: Claims = [((1, 1, "a".to_string()), vec![T0, T0 + 3_900_000])]
        .into_iter()
        .collect();
    let v = super::check(&[j], &e, &all_nodes(), &freezes, &claims);
    assert_eq!(v.violations, Vec::<String>::new());

    // Older code: the reclaim names no holder and counts the attempt; a zombie start of
    // attempt 1 on any node is caught (and the failure has no execution before it).
    let mut old = job(2, &[T0 + 3_000_000], T0 + 5_100_000, "b");
    old.kind = "short".into();
    old.timeout_us = 500_000;
    let e = [
        run_exec(1, "a", T0 + 4_000_000, T0 + 4_001_000, false),
        run_exec(2, "b", T0 + 5_000_000, T0 + 5_050_000, true),
    ];
    let v = super::check(&[old], &e, &all_nodes(), &freezes, &Claims::new());
    assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
    assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
}

const C1: &str = "00000000000000c1";
const C2: &str = "00000000000000c2";

/// `x` run under claim `claim`.
fn under(claim: &str, x: Execution) -> Execution {
    Execution {
        claim: claim.into(),
        ..x
    }
}

/// `e` written for claim `claim`.
fn of_claim(claim: &str, mut e: JobFailure) -> JobFailure {
    e.claim = Some(claim.parse().unwrap());
    e
}

#[test]
fn two_claims_of_one_attempt_are_told_apart_by_their_ids() {
    // a started attempt 1 under claim c1 while the database was down (only its journal
    // knew), was fenced at +1 s, and a sweeper refunded c1 at +3 s (`not_started`); a
    // claimed attempt 1 afresh (c2) and ran it from +4 s to success. Neither the row
    // (`held` unknown: folded from the journal) nor the journal's claim lines vouch for
    // c2: only its claim id says it is not c1.
    let mut j = mix_job(
        "short",
        500,
        2,
        JobState::Succeeded,
        1,
        2,
        vec![of_claim(
            C1,
            failure("not_started", 1, T0 + 3_000_000, Some("a")),
        )],
        T0 + 5_100_000,
        "a",
    );
    j.result = Some(json!({ "node": "a", "attempt": 1, "claim": C2 }));
    let e = [
        under(C1, run_exec(1, "a", T0, T0 + 1_000_000, false)),
        under(C2, run_exec(1, "a", T0 + 4_000_000, T0 + 5_000_000, true)),
    ];
    let v = check(std::slice::from_ref(&j), &e, &all_nodes());
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!((v.stats.refunds, v.stats.give_backs), (1, 1));
    // Keyed by attempt (no claim ids), c2's start is c1's taken lease started anyway.
    let blind: Vec<Execution> = e.iter().map(|x| under("", x.clone())).collect();
    let v = check(std::slice::from_ref(&j), &blind, &all_nodes());
    assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
    // And the result must name the claim that completed, not only its attempt and node.
    j.result = Some(json!({ "node": "a", "attempt": 1, "claim": C1 }));
    // (c1 did not complete, and c2 started after the execution the result names.)
    let v = check(&[j], &e, &all_nodes());
    assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
    assert!(
        v.violations[0].contains("did not complete"),
        "{:?}",
        v.violations
    );
    assert!(
        v.violations[1].contains("whose result counts"),
        "{:?}",
        v.violations
    );
}

#[test]
fn an_error_of_a_claim_that_never_ran_on_its_node_is_caught() {
    // a ran attempt 1 under claim c1; the lease_expired entry of attempt 1, holder a,
    // names claim c2, which never ran there: a counted failure without an execution.
    let j = mix_job(
        "short",
        500,
        2,
        JobState::Succeeded,
        2,
        2,
        vec![of_claim(
            C2,
            failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
        )],
        T0 + 5_100_000,
        "b",
    );
    let e = [
        under(C1, run_exec(1, "a", T0, T0 + 1_000_000, false)),
        run_exec(2, "b", T0 + 4_000_000, T0 + 5_000_000, true),
    ];
    let v = check(std::slice::from_ref(&j), &e, &all_nodes());
    assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    // Keyed by attempt and holder, c1's execution would have vouched for it.
    let mut blind = j;
    blind.errors[0].claim = None;
    let v = check(&[blind], &e, &all_nodes());
    assert_eq!(v.violations, Vec::<String>::new());
}

#[test]
fn a_fresh_claim_after_an_unjournaled_one_is_cleared_by_the_row() {
    // a's first claim of attempt 1 was never journaled (a froze before it heard the
    // answer); a sweeper refunded it at +3 s; a claimed attempt 1 afresh at +3.9 s (its
    // only journaled claim) and ran it. The row showed the lease held at the start.
    let j = mix_job(
        "short",
        500,
        2,
        JobState::Succeeded,
        1,
        2,
        vec![failure("not_started", 1, T0 + 3_000_000, Some("a"))],
        T0 + 4_100_000,
        "a",
    );
    let claims: Claims = [((1, 1, "a".to_string()), vec![T0 + 3_900_000])]
        .into_iter()
        .collect();
    let held = |h: Option<i16>| {
        [Execution {
            held: h,
            ..run_exec(1, "a", T0 + 4_000_000, T0 + 4_050_000, true)
        }]
    };
    let freezes = [freeze("a", T0 + 500_000, T0 + 2_900_000)];
    let v = super::check(
        std::slice::from_ref(&j),
        &held(Some(1)),
        &all_nodes(),
        &freezes,
        &claims,
    );
    assert_eq!(v.violations, Vec::<String>::new());
    // The same start with the row not held (taken, or held by another node), or unknown,
    // is a start without a lease: one journaled claim after the take may be the late
    // answer of the claim that was taken.
    for h in [Some(0), None] {
        let v = super::check(
            std::slice::from_ref(&j),
            &held(h),
            &all_nodes(),
            &freezes,
            &claims,
        );
        assert_eq!(v.stats.started_without_lease, 1, "{:?}", v.violations);
    }
}

#[test]
fn refunds_are_counted_not_flagged() {
    // Attempt 1 was claimed by a and refunded (never started), then claimed by b, started
    // and lost when b died; attempt 2 succeeded on c. Three claims, one given back.
    let mut j = job(2, &[], T0 + 6_700_000, "c");
    j.version = 7;
    j.errors = vec![
        failure("not_started", 1, T0 + 3_000_000, Some("a")),
        failure("lease_expired", 1, T0 + 6_000_000, Some("b")),
    ];
    let nodes = vec![
        node("a", T0 + 9_000_000, "stopped"),
        node("b", T0 + 4_000_000, "killed"),
        node("c", T0 + 9_000_000, "stopped"),
    ];
    let e = [
        exec(1, "b", T0 + 3_500_000, None, false),
        run_exec(2, "c", T0 + 6_500_000, T0 + 6_600_000, true),
    ];
    let v = check(std::slice::from_ref(&j), &e, &nodes);
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(
        (v.stats.refunds, v.stats.reclaims, v.stats.give_backs),
        (1, 1, 1)
    );

    // A refund must carry the number the next claim reuses.
    j.errors[0].attempt = 2;
    let v = check(&[j], &e, &nodes);
    assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
}

#[test]
fn a_loss_before_any_start_counts_once_the_refunds_are_used_up() {
    // A short job (2 attempts) was refunded twice, then lost a third time before any start
    // was recorded: that loss counts (the poison-pill bound), and its second attempt ran
    // and succeeded on c.
    let errors = vec![
        failure("not_started", 1, T0 + 3_000_000, Some("a")),
        failure("not_started", 1, T0 + 6_000_000, Some("b")),
        failure("lease_expired", 1, T0 + 9_000_000, Some("a")),
    ];
    let j = mix_job(
        "short",
        300,
        2,
        JobState::Succeeded,
        2,
        4,
        errors,
        T0 + 9_600_000,
        "c",
    );
    let e = [run_exec(2, "c", T0 + 9_500_000, T0 + 9_510_000, true)];
    let v = check(std::slice::from_ref(&j), &e, &all_nodes());
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!((v.stats.refunds, v.stats.refunds_exhausted), (2, 1));

    // With a refund left, the same loss is a failure without an execution.
    let mut early = j;
    early.max_attempts = 3;
    let v = check(&[early], &e, &all_nodes());
    assert_eq!(v.stats.failed_without_execution, 1, "{:?}", v.violations);
}

#[test]
fn a_frozen_handler_may_only_finish_its_step_on_waking() {
    // a froze at +0.5 s with attempt 1 running; its lease was taken at +2.5 s and b ran
    // attempt 2 at +2.6 s. a woke at +4 s and stopped its handler 0.2 s later: excused.
    let j = job(2, &[T0 + 2_500_000], T0 + 2_800_000, "b");
    let freezes = [freeze("a", T0 + 500_000, T0 + 4_000_000)];
    let e = [
        run_exec(1, "a", T0, T0 + 4_200_000, false),
        run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
    ];
    let v = super::check(
        std::slice::from_ref(&j),
        &e,
        &all_nodes(),
        &freezes,
        &Claims::new(),
    );
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(
        v.stats.paused_tails, 2,
        "late end and overlap, both excused"
    );

    // Running on for 2 s after waking is not excused.
    let e = [
        run_exec(1, "a", T0, T0 + 6_000_000, false),
        run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
    ];
    let v = super::check(
        std::slice::from_ref(&j),
        &e,
        &all_nodes(),
        &freezes,
        &Claims::new(),
    );
    assert_eq!(
        (v.stats.late_ends, v.stats.overlaps),
        (1, 1),
        "{:?}",
        v.violations
    );

    // Nor is it without a freeze.
    let e = [
        run_exec(1, "a", T0, T0 + 4_200_000, false),
        run_exec(2, "b", T0 + 2_600_000, T0 + 2_700_000, true),
    ];
    let v = check(&[j], &e, &all_nodes());
    assert_eq!(
        (v.stats.late_ends, v.stats.overlaps),
        (1, 1),
        "{:?}",
        v.violations
    );
}

#[test]
fn a_handler_started_while_the_stop_was_on_its_way_is_a_paused_tail() {
    // CI seed 1795473317025475, job 1648: SIGSTOP was sent to a at +0.5 s, a started
    // attempt 1 at +0.51 s (kill(2) had returned, the stop had not reached every thread
    // yet) and was seen stopped at +0.52 s. Its claim was taken at +4.9 s while it was
    // frozen; b ran attempt 2. a was continued at +5.4 s and stopped its handler 30 ms
    // later. The freeze counts from when a was seen stopped: excused.
    let j = job(2, &[T0 + 4_900_000], T0 + 5_100_000, "b");
    let e = [
        run_exec(1, "a", T0 + 510_000, T0 + 5_430_000, false),
        run_exec(2, "b", T0 + 5_000_000, T0 + 5_050_000, true),
    ];
    let seen_stopped = FreezeRow {
        signalled_at_us: T0 + 500_000,
        ..freeze("a", T0 + 520_000, T0 + 5_400_000)
    };
    assert_eq!(
        stop_lags(std::slice::from_ref(&seen_stopped), &e),
        (20_000, 1),
        "a stop 20 ms late, one start in it"
    );
    let v = super::check(
        std::slice::from_ref(&j),
        &e,
        &all_nodes(),
        &[seen_stopped],
        &Claims::new(),
    );
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(
        v.stats.paused_tails, 2,
        "late end and overlap, both excused"
    );

    // Counted from the signal instead (as the harness once recorded it), the handler
    // seems to have started during the freeze, and its paused run is reported: the
    // violation CI saw.
    let from_signal = freeze("a", T0 + 500_000, T0 + 5_400_000);
    let v = super::check(&[j], &e, &all_nodes(), &[from_signal], &Claims::new());
    assert_eq!(
        (v.stats.late_ends, v.stats.overlaps),
        (1, 1),
        "{:?}",
        v.violations
    );
}

#[test]
fn a_violation_report_shows_the_freezes_outages_and_journal_of_its_job() {
    assert_eq!(
        job_named("[started without lease] job 12 (short): x"),
        Some(12)
    );
    assert_eq!(job_named("a job queue; job 7: late"), Some(7));
    assert_eq!(job_named("node n3 ran through the server restart"), None);

    let j = job(2, &[T0 + 4_900_000], T0 + 5_100_000, "b");
    let journals = Journals {
        nodes: [(
            "a".to_string(),
            NodeJournal {
                lines: vec![
                    JournalLine::Claim {
                        job_id: 1,
                        attempt: 1,
                        at_us: T0 + 400_000,
                    },
                    JournalLine::Claim {
                        job_id: 2,
                        attempt: 1,
                        at_us: T0 + 450_000,
                    },
                    JournalLine::At {
                        at_us: T0 + 5_401_000,
                        what: "pause_detected".into(),
                        a: 4_800_000,
                        b: 0,
                    },
                    JournalLine::At {
                        at_us: T0 + 5_402_000,
                        what: "self_fenced".into(),
                        a: 1,
                        b: 0,
                    },
                ],
                ..NodeJournal::default()
            },
        )]
        .into_iter()
        .collect(),
        ..Journals::default()
    };
    let restarts = [Restart {
        down_at_us: T0 + 9_000_000,
        up_at_us: T0 + 12_000_000,
        survivors: vec![],
    }];
    let freezes = [FreezeRow {
        signalled_at_us: T0 + 500_000,
        ..freeze("a", T0 + 520_000, T0 + 5_400_000)
    }];
    let nodes = all_nodes();
    let evidence = Evidence {
        began_us: T0,
        restarts: &restarts,
        all_killed_at: &[],
        jobs: &[j],
        nodes: &nodes,
        freezes: &freezes,
        journals: &journals,
    };
    let text = evidence.explain("job 1: execution … ran until …");
    for want in [
        "server down: asked to stop at +9.000000 s",
        "job 1 (crashy): succeeded, attempts 2",
        "node a: spawned at",
        "SIGSTOP sent at +0.500000 s",
        "seen stopped at +0.520000 s",
        "continued at +5.400000 s",
        "journal +0.400000 s",
        "pause_detected 4800000 0",
        "self_fenced 1 0",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    assert!(
        !text.contains("claim 2 1"),
        "another job's line in:\n{text}"
    );
}

#[test]
fn only_a_mix_job_may_die_and_only_of_its_attempts() {
    // A long job that lost its lease on all its attempts, each having started.
    let dead = mix_job(
        "long",
        60_000,
        2,
        JobState::Dead,
        2,
        2,
        vec![
            failure("lease_expired", 1, T0 + 3_000_000, Some("a")),
            failure("lease_expired", 2, T0 + 7_000_000, Some("b")),
        ],
        T0 + 7_000_000,
        "",
    );
    let nodes = vec![
        node("a", T0 + 1_000_000, "killed"),
        node("b", T0 + 5_000_000, "killed"),
    ];
    let e = [
        exec(1, "a", T0, None, false),
        exec(2, "b", T0 + 3_500_000, None, false),
    ];
    let v = check(std::slice::from_ref(&dead), &e, &nodes);
    assert_eq!(v.violations, Vec::<String>::new());
    assert_eq!(v.stats.dead, 1);

    // Dead with attempts left, or a quick job dead at all: flagged.
    let mut early = dead.clone();
    early.max_attempts = 3;
    assert_eq!(check(&[early], &e, &nodes).violations.len(), 1);
    let mut quick = dead;
    quick.kind = CRASHY.into();
    assert_eq!(check(&[quick], &e, &nodes).violations.len(), 1);
}

/// A sequence member or deadline job `id` that ended `state` at `finished`.
fn seq_facts(id: i64, kind: &str, state: JobState, finished: i64) -> JobFacts {
    let mut j = job(1, &[], finished, "b");
    j.id = JobId(id);
    j.kind = kind.into();
    j.state = state;
    if state != JobState::Succeeded {
        j.result = None;
        j.last_error = Some(JobFailure::new(jobvisor::deadline::EXPIRED, "expired", 1));
    }
    j
}

fn seq_exec(id: i64, start: i64, end: i64) -> Execution {
    Execution {
        job_id: id,
        ..exec(1, "b", start, Some(end), true)
    }
}

fn member(id: i64, place: usize) -> SeqJob {
    SeqJob {
        id,
        sequence: Some(("k".into(), place)),
        start_by_us: None,
        fails_once: false,
    }
}

#[test]
fn sequence_and_deadline_rules_catch_their_faults() {
    let (n, claims) = (nodes(), Claims::new());
    let world = World::new(&n, &[], &claims);
    let seqs = [member(1, 0), member(2, 1)];
    let first = seq_facts(1, SEQ_KIND, JobState::Succeeded, T0 + 500_000);
    let second = seq_facts(2, SEQ_KIND, JobState::Succeeded, T0 + 2_000_000);
    let jobs = [first.clone(), second];
    // In order: the second starts after the first succeeded.
    let good = [
        seq_exec(1, T0, T0 + 400_000),
        seq_exec(2, T0 + 600_000, T0 + 900_000),
    ];
    let (bad, stats) = check_sequences(&seqs, &jobs, &good, &world);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!((stats.sequences, stats.orders, stats.executions), (1, 1, 2));
    // The second starts while the first still runs, before it succeeded.
    let early = [
        seq_exec(1, T0, T0 + 400_000),
        seq_exec(2, T0 + 300_000, T0 + 900_000),
    ];
    let (bad, _) = check_sequences(&seqs, &jobs, &early, &world);
    assert_eq!(
        bad.iter()
            .filter(|l| l.starts_with("[sequence order]"))
            .count(),
        2
    );
    assert_eq!(
        bad.iter()
            .filter(|l| l.starts_with("[sequence overlap]"))
            .count(),
        1
    );
    // A member that never succeeded.
    let dead = [
        first,
        seq_facts(2, SEQ_KIND, JobState::Dead, T0 + 2_000_000),
    ];
    let (bad, _) = check_sequences(&seqs, &dead, &good[..1], &world);
    assert!(
        bad.iter().any(|l| l.starts_with("[sequence liveness]")),
        "{bad:?}"
    );
    // Deadlines: one started after its deadline, one expired without starting.
    let deadline = |id| SeqJob {
        id,
        sequence: None,
        start_by_us: Some(T0 + 1_000_000),
        fails_once: false,
    };
    let seqs = [deadline(3), deadline(4)];
    let jobs = [
        seq_facts(3, DEADLINE_KIND, JobState::Succeeded, T0 + 2_000_000),
        seq_facts(4, DEADLINE_KIND, JobState::Cancelled, T0 + 1_000_000),
    ];
    let (bad, stats) = check_sequences(
        &seqs,
        &jobs,
        &[seq_exec(3, T0 + 1_500_000, T0 + 1_600_000)],
        &world,
    );
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("[deadline] job 3"), "{bad:?}");
    assert_eq!(
        (stats.deadline_jobs, stats.in_time, stats.expired),
        (2, 1, 1)
    );
    let (bad, _) = check_sequences(
        &seqs,
        &jobs,
        &[seq_exec(3, T0 + 900_000, T0 + 1_600_000)],
        &world,
    );
    assert!(bad.is_empty(), "{bad:?}");
}
