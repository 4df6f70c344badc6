//! The crash test's check of the schedule's fires and the reconciler's jobs.

use super::*;

/// The schedule's and the reconciler's jobs after the run: every fire from the first to the
/// last that was due `MISSING_AT_MOST` before the nodes stopped has exactly one job; every
/// business row missing its job since at least that long before the stop has one, created
/// at most `MISSING_AT_MOST` after it went missing. Answers the fires checked, (rows checked,
/// longest wait in µs) and the violations.
pub(crate) fn check_periodic(
    periodic: &[Job],
    wanted: &[(String, i64)],
    restarts: &[Restart],
    started_us: i64,
    stopped_us: i64,
) -> (usize, (usize, i64), Vec<String>) {
    let bound_us = i64::try_from(MISSING_AT_MOST.as_micros()).unwrap();
    let after_restart_us = i64::try_from(AFTER_RESTART.as_micros()).unwrap();
    // A row's bound: MISSING_AT_MOST, plus for each restart that overlaps its wait the part
    // of the downtime after it went missing beyond the 3 s already allowed, and
    // AFTER_RESTART.
    let row_bound = |since: i64| {
        restarts
            .iter()
            .filter(|r| r.down_at_us < since + bound_us && r.up_at_us > since)
            .map(|r| (r.up_at_us - r.down_at_us.max(since) - 3_000_000).max(0) + after_restart_us)
            .sum::<i64>()
            + bound_us
    };
    let every_us = i64::try_from(SCHEDULE_EVERY.as_micros()).unwrap();
    let mut problems = Vec::new();
    let mut fires: BTreeMap<i64, usize> = BTreeMap::new();
    for j in periodic.iter().filter(|j| j.kind == "tick") {
        let key = j.unique_key.as_deref().unwrap_or("");
        let at = key
            .strip_prefix("schedule:crash-tick@")
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros());
        match at {
            Some(at) if at % every_us == 0 => *fires.entry(at).or_default() += 1,
            _ => problems.push(format!("[schedule] job {} has the key {key:?}", j.id)),
        }
    }
    let last = (stopped_us - bound_us).div_euclid(every_us) * every_us;
    let checked = match fires.keys().next() {
        None => {
            problems.push("[schedule] the schedule never fired".into());
            0
        }
        Some(&first) => {
            if first > started_us + bound_us {
                problems.push(format!(
                    "[schedule] first fire {} ms after the nodes started",
                    (first - started_us) / 1000
                ));
            }
            let mut n = 0;
            let mut at = first;
            while at <= last {
                match fires.get(&at).copied().unwrap_or(0) {
                    1 => {}
                    k => problems.push(format!(
                        "[schedule] the fire at {at} µs has {k} jobs (expected exactly 1)"
                    )),
                }
                n += 1;
                at += every_us;
            }
            n
        }
    };
    let by_key: HashMap<&str, &Job> = periodic
        .iter()
        .filter(|j| j.kind == "wanted")
        .filter_map(|j| Some((j.unique_key.as_deref()?, j)))
        .collect();
    let (mut rows, mut longest) = (0usize, 0i64);
    for (key, since) in wanted.iter().filter(|(_, s)| *s <= stopped_us - bound_us) {
        rows += 1;
        let Some(job) = by_key.get(key.as_str()) else {
            problems.push(format!(
                "[reconciler] row {key} missing its job since {since} µs: never re-created"
            ));
            continue;
        };
        let waited = job.created_at.timestamp_micros() - since;
        longest = longest.max(waited);
        let bound = row_bound(*since);
        if waited > bound {
            problems.push(format!(
                "[reconciler] row {key}: job {} created {} ms after it went missing (bound {} \
                 ms)",
                job.id,
                waited / 1000,
                bound / 1000
            ));
        }
    }
    if rows == 0 {
        problems.push("[reconciler] no wanted row was old enough to check".into());
    }
    (checked, (rows, longest), problems)
}

/// How late freezes took effect: the longest time from SIGSTOP sent to the node seen stopped,
/// and how many executions started in such a gap (on the node being frozen) — handlers a
/// node started after the signal was sent, which were running when it stopped.
pub(crate) fn stop_lags(freezes: &[FreezeRow], execs: &[Execution]) -> (i64, usize) {
    let max = freezes
        .iter()
        .map(|f| f.frozen_at_us - f.signalled_at_us)
        .max()
        .unwrap_or(0);
    let starts = execs
        .iter()
        .filter(|x| {
            freezes.iter().any(|f| {
                f.node == x.node && x.start() >= f.signalled_at_us && x.start() <= f.frozen_at_us
            })
        })
        .count();
    (max, starts)
}
