//! Replacing enqueues: a keyed job of the seed's workload meets a live holder of its key as
//! [`OnDuplicate`] says — kept (the default), its payload, run time and priority replaced
//! (a debounce), or cancelled and the new job inserted in its place — and the driver records
//! each enqueue answered `replaced` ([`Act`]) for `check_replace.rs`.
//!
//! A replacing job's key is the one debounce key ([`DEBOUNCE_KEY`], apart from the kept
//! ones' `k0`–`k3`) held while its job is live ([`UniqueScope::WhileActive`](jobvisor::UniqueScope)), and the
//! job waits 1–8 s, so the next one often finds it still pending.
//!
//! The choice is drawn from a generator of its own (the seed and the job's number), not the
//! step's, so each step draws what it drew before replacing enqueues were driven.

use std::time::Duration;

use jobvisor::OnDuplicate;

use crate::rng::{fnv, Rng, FNV_START};

/// Salt of the choice's generator.
const SALT: u64 = 0x7e91_ace0;

/// The key every replacing job names: one, so that they meet.
pub(crate) const DEBOUNCE_KEY: &str = "debounce";

/// A replacing enqueue answered `replaced`.
#[derive(Debug, Clone)]
pub(crate) struct Act {
    /// What it asked.
    pub(crate) how: OnDuplicate,
    /// The job it answered: the holder it overwrote ([`OnDuplicate::Replace`]), or the job
    /// inserted in the cancelled holder's place ([`OnDuplicate::CancelAndInsert`]).
    pub(crate) id: i64,
    /// The key.
    pub(crate) key: String,
    /// Its payload's `n`.
    pub(crate) n: i64,
    /// Its answer's place in the run's order.
    pub(crate) mark: u64,
}

/// How the `made`-th job of seed `seed` meets a holder of its key — kept a quarter of the
/// time, replaced or cancelled-and-inserted three eighths each — and, for the last two, its
/// delay: a debounce's job waits (1–8 s), so a holder is often still pending when the next
/// comes.
pub(crate) fn draw(seed: u64, made: u64) -> (OnDuplicate, Option<Duration>) {
    let mut rng = Rng::new(fnv(&made.to_le_bytes(), FNV_START ^ seed ^ SALT));
    let how = match rng.below(8) {
        0..=2 => OnDuplicate::Replace,
        3..=5 => OnDuplicate::CancelAndInsert,
        _ => return (OnDuplicate::Keep, None),
    };
    (how, Some(Duration::from_secs(1 + rng.below(8))))
}
