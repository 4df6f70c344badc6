//! The start-by deadlines the seed drives (`NewJob::start_by`): a step enqueues one or two
//! `work` jobs on either queue through a node's client, each with a deadline on the shared
//! (database) clock that the seed draws either short — 0.3 to 4 s, often missed while the
//! queue is busy, paused or its nodes frozen or crashed — or comfortable (30 to 120 s), and
//! sometimes a delay before it. The payload carries the deadline (`start_by_us`), so the
//! checks (`check_deadlines.rs`) read it from the final rows.

use std::collections::BTreeSet;
use std::time::Duration;

use jobvisor::testing::Simulation;
use jobvisor::NewJob;
use serde_json::json;

use crate::controls::QUEUES;
use crate::rng::Rng;

/// Enqueues one or two jobs with start-by deadlines through `sim`'s client, `now_us` being
/// the shared clock; answers the log line.
pub(crate) async fn enqueue_deadlined(
    sim: &Simulation,
    rng: &mut Rng,
    now_us: i64,
    answered: &mut BTreeSet<i64>,
    made: &mut u64,
) -> String {
    let mut ids = Vec::new();
    for _ in 0..1 + rng.below(2) {
        *made += 1;
        let left_ms = if rng.chance(500) {
            300 + rng.below(3_700)
        } else {
            30_000 + rng.below(90_000)
        };
        let deadline_us = now_us + i64::try_from(left_ms).unwrap() * 1_000;
        let deadline = chrono::DateTime::from_timestamp_micros(deadline_us).unwrap();
        let mut job = NewJob::new("work", json!({ "n": *made, "start_by_us": deadline_us }))
            .queue(*rng.pick(&QUEUES))
            .max_attempts(2 + u32::try_from(rng.below(2)).unwrap())
            .timeout(Duration::from_secs(5 + rng.below(50)))
            .start_by(deadline);
        if rng.chance(200) {
            job = job.delay(Duration::from_millis(rng.below(left_ms / 2)));
        }
        match sim.client.enqueue(job).await {
            Ok(e) => {
                answered.insert(e.id.0);
                ids.push(format!("{}@{left_ms}ms", e.id.0));
            }
            Err(_) => ids.push(format!("error@{left_ms}ms")),
        }
    }
    format!("start-by → {}", ids.join(" "))
}
