//! The invariants of the start-by deadlines the seed drives (`deadlines.rs`), checked after
//! every run on the final rows (a job's deadline is in its payload) and the journal's
//! executions, on the shared clock (the database's):
//!
//! 1. **Never started late.** No execution of a job with a deadline is first polled at or
//!    after it (§7.15).
//! 2. **Expired, not failed nor run.** A job that never started ends `cancelled` with the
//!    code `expired` (it is terminal by the end of the run, liveness); it is never
//!    `succeeded` or `dead` unless it started before its deadline; and it is never ended
//!    `expired` before its deadline, less what its node's monotonic clock may have run fast.

use jobvisor::JobState;

use crate::check_controls::Facts;
use crate::clock::MAX_RATE_PPM;

/// Every rule broken, one line each.
pub(crate) fn check(f: &Facts<'_>) -> Vec<String> {
    let mut bad = Vec::new();
    for j in f.jobs {
        let Some(deadline) = j.payload.get("start_by_us").and_then(|d| d.as_i64()) else {
            continue;
        };
        let id = j.id.0;
        let mine: Vec<_> = f.execs.iter().filter(|e| e.job_id == id).collect();
        for e in &mine {
            if e.started_at_us >= deadline && !crate::check::started_blind(f.blind, e) {
                bad.push(format!(
                    "start-by: job {id} started at {} µs, at or past its deadline {deadline} \
                     µs: {e:?}",
                    e.started_at_us
                ));
            }
        }
        let expired = j.state == JobState::Cancelled
            && j.last_error
                .as_ref()
                .is_some_and(|e| e.code == jobvisor::deadline::EXPIRED);
        if mine.is_empty() && j.state.is_terminal() && !expired {
            bad.push(format!(
                "start-by: job {id} never started and ended {} (last error {:?}), not \
                 cancelled expired",
                j.state,
                j.last_error.as_ref().map(|e| &e.code)
            ));
        }
        // The start gate counts nine tenths of a claim's time left on its node's monotonic
        // clock, from the claim's send time (§7.15: early, as the fence point, so that a clock
        // 10 % slow never starts a job late), and the model's clocks run up to MAX_RATE_PPM
        // (10 %) fast: a job may expire up to 1 − 0.9 / 1.1 ≈ 18 % of its time left early,
        // bounded here by a fifth of the time from its enqueue to its deadline.
        let early =
            (deadline - j.created_at.timestamp_micros()).max(0) * 2 * MAX_RATE_PPM / 1_000_000;
        if expired && j.updated_at.timestamp_micros() < deadline - early {
            bad.push(format!(
                "start-by: job {id} ended expired at {} µs, before its deadline {deadline} µs",
                j.updated_at.timestamp_micros()
            ));
        }
    }
    bad
}
