//! The partition test's checks, checked: each rule catches the fault it is there for.

use super::*;

const T0: i64 = 1_900_000_000_000_000;
const S: i64 = 1_000_000;

fn job(attempts: u32, reclaims: &[i64], result: (&str, i64), finished: i64) -> JobFacts {
    JobFacts {
        id: JobId(1),
        kind: "partition".into(),
        state: JobState::Succeeded,
        attempts,
        max_attempts: MAX_ATTEMPTS,
        timeout_us: 0,
        version: 1 + 2 * i64::from(attempts),
        errors: reclaims
            .iter()
            .enumerate()
            .map(|(i, t)| {
                JobFailure::new(
                    "lease_expired",
                    "the lease expired",
                    u32::try_from(i).unwrap() + 1,
                )
                .at(chrono::DateTime::from_timestamp_micros(*t).unwrap())
            })
            .collect(),
        last_error: None,
        result: Some(json!({ "node": result.0, "attempt": result.1 })),
        lease_held: false,
        finished_at_us: Some(finished),
        waited: false,
    }
}

fn exec(attempt: i32, node: &str, start: i64, end: i64, completed: bool) -> Execution {
    Execution {
        job_id: 1,
        attempt,
        claim: String::new(),
        node: node.into(),
        started_at_us: start,
        runtime_started_at_us: None,
        ended_at_us: Some(end),
        completed: i16::from(completed),
        held: None,
    }
}

fn timeline(lines: &[(i64, &str, i64, i64)]) -> Timeline {
    Timeline {
        at: lines
            .iter()
            .map(|(t, w, a, b)| (*t, (*w).to_string(), *a, *b))
            .collect(),
        ..Timeline::default()
    }
}

type Scenario = (
    Vec<JobFacts>,
    Vec<Execution>,
    BTreeMap<String, Timeline>,
    Vec<Cut>,
);

/// n1 is cut from T0 to T0 + 15 s; it ran attempt 1 from T0 − 1 s and fenced it at
/// T0 + 4 s; the sweeper reclaimed at T0 + 6 s; n2 ran attempt 2.
fn scenario() -> Scenario {
    let jobs = vec![job(2, &[T0 + 6 * S], ("n2", 2), T0 + 8 * S)];
    let execs = vec![
        exec(1, "n1", T0 - S, T0 + 4 * S, false),
        exec(2, "n2", T0 + 6 * S + 20_000, T0 + 7 * S, true),
    ];
    let mut t = BTreeMap::new();
    t.insert(
        "n1".to_string(),
        timeline(&[
            (T0 - S - 10, "claimed", 1, 1),
            (T0 + 4 * S, "self_fenced", 1, 0),
            (T0 + 16 * S, "claimed", 9, 1),
            (T0 + 17 * S, "renewed", 1, 0),
        ]),
    );
    t.insert(
        "n2".to_string(),
        timeline(&[
            (T0 + 6 * S + 10_000, "claimed", 1, 2),
            (T0 + 8 * S, "finished_succeeded", 1, 2),
        ]),
    );
    let cuts = vec![Cut {
        index: 0,
        node: "n1".into(),
        down_for: Duration::from_secs(15),
        cut_at_us: T0,
        heal_at_us: T0 + 15 * S,
    }];
    (jobs, execs, t, cuts)
}

#[test]
fn the_short_cut_is_inside_the_documented_tolerance() {
    assert_eq!(TOLERATED_CUT, Duration::from_millis(3500));
    assert!(CUTS[1].down_for < TOLERATED_CUT);
    assert!(CUTS[0].down_for > LEASE);
}

#[test]
fn a_re_run_after_a_short_cut_misses_the_goal() {
    let mut a = Analysis::default();
    a.cuts.push(CutMetrics {
        node: "n2".into(),
        down_for: CUTS[1].down_for,
        margins: vec![1_000],
        heal_to_claim: Some(0),
        renewal_lag: Some(0),
        reruns: 1,
        ..CutMetrics::default()
    });
    assert!(
        a.goals_missed().iter().any(|g| g.contains("re-run")),
        "{:?}",
        a.goals_missed()
    );
    a.cuts[0].reruns = 0;
    assert!(a.goals_missed().is_empty(), "{:?}", a.goals_missed());
}

#[test]
fn a_clean_cut_passes_and_is_measured() {
    let (jobs, execs, t, cuts) = scenario();
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.violations, Vec::<String>::new());
    let m = &a.cuts[0];
    assert_eq!(m.margins, vec![2 * S]);
    assert_eq!(m.heal_to_claim, Some(S));
    assert!(!m.held_lease_at_heal);
    assert_eq!((m.heal_to_renewal, m.renewal_lag), (Some(2 * S), Some(S)));
    assert_eq!((m.reruns, m.burnt, a.reruns_other), (1, 0, 0));
    assert!(a.goals_missed().is_empty(), "{:?}", a.goals_missed());
}

#[test]
fn a_handler_running_past_its_reclaim_is_caught() {
    let (jobs, mut execs, t, cuts) = scenario();
    execs[0].ended_at_us = Some(T0 + 6 * S + 5_000);
    execs[1].started_at_us = T0 + 6 * S + 50_000;
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    assert!(a.cuts[0].margins[0] < 0);
}

#[test]
fn overlapping_executions_are_caught() {
    let (jobs, mut execs, t, cuts) = scenario();
    execs[1].started_at_us = T0 + 3 * S;
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.overlaps, 1, "{:?}", a.violations);
}

#[test]
fn a_handler_started_after_its_job_was_done_is_caught() {
    // n1's claim of attempt 1 is answered 10 s after n2 finished attempt 2.
    let (jobs, mut execs, mut t, cuts) = scenario();
    execs[0].started_at_us = T0 + 18 * S;
    execs[0].ended_at_us = Some(T0 + 18 * S + 80_000);
    t.get_mut("n1").unwrap().at[0].0 = T0 + 18 * S - 10;
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.zombie_starts, 1, "{:?}", a.violations);
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    // Started after the reclaim, before the next attempt.
    let (jobs, mut execs, t, cuts) = scenario();
    execs[0].started_at_us = T0 + 6 * S + 5_000;
    execs[0].ended_at_us = Some(T0 + 6 * S + 8_000);
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.zombie_starts, 1, "{:?}", a.violations);
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
}

#[test]
fn late_writes_are_caught() {
    // n1's success for attempt 1 accepted although n2 claimed attempt 2.
    let (mut jobs, mut execs, mut t, cuts) = scenario();
    t.get_mut("n1")
        .unwrap()
        .at
        .push((T0 + 16 * S, "finished_succeeded".into(), 1, 1));
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert!(a.late_writes >= 2, "{:?}", a.violations);
    // A result that is not the last execution's.
    let (_, _, t, _) = scenario();
    jobs[0].result = Some(json!({ "node": "n1", "attempt": 1 }));
    execs[0].completed = 1;
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert!(a.late_writes >= 1, "{:?}", a.violations);
    assert_eq!(a.zombie_starts, 0, "{:?}", a.violations);
    // A failure written by a handler.
    let (mut jobs, execs, t, cuts) = scenario();
    jobs[0].errors[0].code = "error".into();
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.late_writes, 1, "{:?}", a.violations);
}

#[test]
fn burnt_attempts_and_slow_heals_miss_the_goals() {
    // Attempt 1 claimed by n1 and never started; attempt 2 ran on n2.
    let (jobs, mut execs, mut t, cuts) = scenario();
    execs.remove(0);
    let n1 = t.get_mut("n1").unwrap();
    n1.at.retain(|x| x.1 != "renewed");
    n1.at[2].0 = T0 + 19 * S;
    let a = analyze(&jobs, &execs, &[], &t, &cuts);
    assert_eq!(a.violations, Vec::<String>::new());
    assert_eq!((a.cuts[0].burnt, a.cuts[0].reruns), (1, 0));
    let goals = a.goals_missed();
    // burnt, claim 4 s after the heal, no renewal, no handler interrupted.
    assert_eq!(goals.len(), 4, "{goals:?}");
}

#[test]
fn a_lease_held_at_the_heal_makes_the_renewal_due_at_once() {
    let t = timeline(&[
        (T0, "claimed", 1, 1),
        (T0 + 5 * S, "claimed", 2, 1),
        (T0 + 5 * S, "finished_succeeded", 2, 1),
        (T0 + 12 * S, "renewed", 1, 0),
    ]);
    assert!(t.held_lease_at(T0 + 10 * S));
    assert_eq!(t.first_renewal_after(T0 + 10 * S), Some(T0 + 12 * S));
    let t = timeline(&[(T0, "claimed", 1, 1), (T0 + S, "self_fenced", 1, 0)]);
    assert!(!t.held_lease_at(T0 + 10 * S));
}
