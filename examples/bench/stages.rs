//! A pickup in stages: where the time from an enqueue to its handler's start goes.
//!
//! Each sample of the latency modes is split into four stages, in milliseconds:
//!
//! * `enqueue`: the enqueue call (raw SQL: the insert);
//! * `to_claim`: from its return to the claim statement being sent (the wake-up: in the same
//!   process a message to the fetcher; otherwise the insert's notification);
//! * `claim`: the claim statement's round trip, as the fetcher times it;
//! * `to_start`: from the claim's answer to the handler's start (the job handed to a
//!   supervisor and its task started on the handler threads; raw SQL starts at the answer).
//!
//! jobvisor's claim times come from the fetcher's own `claim` trace event (its `took_us`),
//! recorded by [`ClaimRecorder`], a tracing layer the benchmark installs for that event
//! alone; it records only while a latency mode runs ([`record`]).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// The fetcher's module, whose `claim` event carries each claim's round trip.
pub(crate) const FETCHER: &str = "jobvisor::scheduler::fetcher";

static RECORDING: AtomicBool = AtomicBool::new(false);
/// Claims seen while recording: (answered at, round trip in µs).
static CLAIMS: Mutex<Vec<(Instant, u64)>> = Mutex::new(Vec::new());

/// Starts (dropping what was recorded) or stops recording claims.
pub(crate) fn record(on: bool) {
    if on {
        if let Ok(mut c) = CLAIMS.lock() {
            c.clear();
        }
    }
    RECORDING.store(on, Relaxed);
}

/// The claims recorded: (answered at, round trip in µs), in the order they answered.
pub(crate) fn claims() -> Vec<(Instant, u64)> {
    CLAIMS.lock().map(|c| c.clone()).unwrap_or_default()
}

/// Records the fetcher's `claim` events (see the module docs).
pub(crate) struct ClaimRecorder;

impl<S: tracing::Subscriber> Layer<S> for ClaimRecorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if !RECORDING.load(Relaxed) || event.metadata().target() != FETCHER {
            return;
        }
        let mut took = TookUs(None);
        event.record(&mut took);
        if let (Some(us), Ok(mut c)) = (took.0, CLAIMS.lock()) {
            c.push((Instant::now(), us));
        }
    }
}

/// Reads an event's `took_us` field.
struct TookUs(Option<u64>);

impl Visit for TookUs {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "took_us" {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// One sample's stages, in milliseconds (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stages {
    pub(crate) enqueue: f64,
    pub(crate) to_claim: f64,
    pub(crate) claim: f64,
    pub(crate) to_start: f64,
}

impl Stages {
    /// A sample's stages from its instants: the enqueue sent and returned, the claim sent
    /// and answered, the handler started.
    pub(crate) fn of(
        sent: Instant,
        enqueued: Instant,
        claim: (Instant, Instant),
        started: Instant,
    ) -> Self {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1000.0;
        Stages {
            enqueue: ms(sent, enqueued),
            to_claim: ms(enqueued, claim.0),
            claim: ms(claim.0, claim.1),
            to_start: ms(claim.1, started),
        }
    }

    /// The claim that started the handler at `started`: the last recorded one answered by
    /// then. `None` if none was (the sample is then left out of the stages).
    pub(crate) fn claim_before(
        claims: &[(Instant, u64)],
        started: Instant,
    ) -> Option<(Instant, Instant)> {
        let (answered, us) = claims.iter().rev().find(|(at, _)| *at <= started)?;
        let sent = answered.checked_sub(std::time::Duration::from_micros(*us))?;
        Some((sent, *answered))
    }
}

/// The stages' medians, as a latency row's `stages_p50_ms`.
pub(crate) fn summary(stages: &[Stages]) -> Value {
    let p50 = |f: fn(&Stages) -> f64| {
        let mut v: Vec<f64> = stages.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).map(|x| (x * 1000.0).round() / 1000.0)
    };
    by_stage(stages.len(), |f| json!(p50(f)))
}

/// What the slowest 1 % of the samples (by the sum of their stages) spent in each stage, on
/// average, as a latency row's `stages_tail_ms`: which stage a p99 comes from.
pub(crate) fn tail(stages: &[Stages]) -> Value {
    let total = |s: &Stages| s.enqueue + s.to_claim + s.claim + s.to_start;
    let mut sorted: Vec<&Stages> = stages.iter().collect();
    sorted.sort_by(|a, b| total(b).total_cmp(&total(a)));
    let slowest = &sorted[..stages.len().div_ceil(100).min(sorted.len())];
    let mean = |f: fn(&Stages) -> f64| {
        let n = slowest.len().max(1) as f64;
        (slowest.iter().map(|s| f(s)).sum::<f64>() / n * 1000.0).round() / 1000.0
    };
    by_stage(slowest.len(), |f| json!(mean(f)))
}

/// One figure per stage, `of` each stage's field, and how many samples they are of.
fn by_stage(samples: usize, of: impl Fn(fn(&Stages) -> f64) -> Value) -> Value {
    json!({
        "enqueue": of(|s| s.enqueue),
        "to_claim": of(|s| s.to_claim),
        "claim": of(|s| s.claim),
        "to_start": of(|s| s.to_start),
        "samples": samples,
    })
}
