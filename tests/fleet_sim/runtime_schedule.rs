//! The run-time schedule the seed drives (`Client::add_schedule`, `change_schedule`,
//! `remove_schedule`): [`RUNTIME`], a fixed interval (one of [`INTERVALS`], epoch-aligned as
//! every `Schedule::every`) enqueuing [`RUNTIME_KIND`] with every missed fire run. A step
//! adds it, changes its interval or removes it through a node's client (mostly what
//! applies to it as the driver knows it), under the store faults; the driver records each act ([`RuntimeOp`]): when it was sent and answered on the
//! shared clock, and whether it surely applied (its answer, with the next fire stored), surely
//! did not (refused as invalid: the schedule already there, or not there) or may have (no
//! answer: a write lost or held to land later). The checks (`check_controls.rs`) trust what
//! follows an act only while every act before it is sure.

use std::time::Duration;

use jobvisor::schedule::{MissedFires, Schedule};
use jobvisor::testing::Simulation;
use jobvisor::{Error, NewJob};
use serde_json::json;

use crate::rng::Rng;

/// The run-time schedule's name.
pub(crate) const RUNTIME: &str = "rt";
/// The kind it enqueues (only it).
pub(crate) const RUNTIME_KIND: &str = "rtick";
/// The intervals the seed picks from (not multiples of each other, nor of the declared
/// schedule's).
pub(crate) const INTERVALS: [Duration; 2] = [Duration::from_secs(29), Duration::from_secs(41)];

/// What an act asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    Add(Duration),
    Change(Duration),
    Remove,
}

/// How an act ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// It applied; an add or change stored this next fire (µs).
    Applied(Option<i64>),
    /// Refused as invalid: it changed nothing.
    Refused,
    /// No answer: it may have applied, now or later.
    Unknown,
}

/// One act on the run-time schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RuntimeOp {
    pub(crate) ask: Ask,
    pub(crate) answer: Answer,
    /// Shared clock when it was sent and answered (the same: the clock moves only by the
    /// driver's advances), µs.
    pub(crate) at_us: i64,
}

fn schedule(every: Duration) -> Schedule {
    Schedule::every(
        RUNTIME,
        every,
        NewJob::new(RUNTIME_KIND, json!({})).max_attempts(3),
    )
    .missed(MissedFires::All { max: 1_000 })
}

/// Whether the schedule is there after the acts `ops`, as far as the driver knows (`None`:
/// not known).
fn present(ops: &[RuntimeOp]) -> Option<bool> {
    let last = ops.last()?;
    match (last.answer, last.ask) {
        (Answer::Unknown, _) => None,
        (Answer::Applied(_), Ask::Remove) | (Answer::Refused, Ask::Change(_) | Ask::Remove) => {
            Some(false)
        }
        (Answer::Applied(_), _) | (Answer::Refused, Ask::Add(_)) => Some(true),
    }
}

/// One act the seed draws after the acts `ops`, through `sim`'s client at shared clock
/// `now_us` (the driver's steps do not move the clock while they wait): mostly what applies
/// to the schedule as the driver knows it — an add when it is not there, a change of
/// interval or a removal when it is — and now and then one that is refused.
pub(crate) async fn act(
    sim: &Simulation,
    rng: &mut Rng,
    ops: &[RuntimeOp],
    now_us: i64,
) -> RuntimeOp {
    let every = *rng.pick(&INTERVALS);
    let ask = match (present(ops), rng.below(10)) {
        (_, 0) => Ask::Add(every),
        (_, 1) => Ask::Remove,
        (Some(false), _) => Ask::Add(every),
        (Some(true), 2..=5) => Ask::Change(every),
        (Some(true), _) => Ask::Remove,
        (None, 2..=5) => Ask::Add(every),
        (None, _) => Ask::Remove,
    };
    let res = match ask {
        Ask::Add(d) => sim
            .client
            .add_schedule(schedule(d))
            .await
            .map(|i| i.next_fire_at.map(|t| t.timestamp_micros())),
        Ask::Change(d) => sim
            .client
            .change_schedule(schedule(d))
            .await
            .map(|i| i.next_fire_at.map(|t| t.timestamp_micros())),
        Ask::Remove => sim.client.remove_schedule(RUNTIME).await.map(|()| None),
    };
    let answer = match res {
        Ok(next) => Answer::Applied(next),
        Err(Error::InvalidInput { .. }) => Answer::Refused,
        Err(_) => Answer::Unknown,
    };
    RuntimeOp {
        ask,
        answer,
        at_us: now_us,
    }
}
