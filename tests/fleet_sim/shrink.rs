//! The shrink of a failing seed: the fewest steps that still break the same invariant.
//!
//! A run may skip steps ([`Skips`]; `JOBVISOR_SIM_SKIP=3-10,15` replays a run with those
//! skipped). Each step draws from a generator of its own (seeded by the seed and the step's
//! number), so skipping one leaves the draws of every later step as they were: what changes
//! is only what the skipped action would have done to the fleet (and, through the store
//! operations it no longer makes, which later operations the fault plans fail). A run with
//! skips is as deterministic as one without: one seed and one skip set, one event log.
//!
//! [`shrink`] is delta debugging over the steps a failing run took: it splits them into `n`
//! chunks and tries skipping each chunk; when the run still breaks the same invariant (the
//! kind before the `:` of its first violation: `overlap`, `late write`, `liveness`, …) the
//! chunk stays skipped and `n` shrinks by one, else once no chunk can go `n` doubles, until
//! chunks are single steps and none can go (1-minimal), or the time budget is spent
//! (`JOBVISOR_SIM_SHRINK_SECS`, default 60; 0 turns shrinking off). A candidate run that
//! panics (a settle that never ends) counts as not reproducing.

use std::collections::BTreeSet;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::run::{run_seed_skipping, RunReport};

/// Steps a run skips.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Skips(BTreeSet<usize>);

impl Skips {
    /// Whether the run skips `step`.
    pub(crate) fn contains(&self, step: usize) -> bool {
        self.0.contains(&step)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses `3-10,15,20-22` (ranges inclusive).
    pub(crate) fn parse(s: &str) -> Skips {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || panic!("JOBVISOR_SIM_SKIP={s:?}: expected steps like 3-10,15");
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b): (usize, usize) = (
                a.trim().parse().unwrap_or_else(|_| bad()),
                b.trim().parse().unwrap_or_else(|_| bad()),
            );
            set.extend(a..=b);
        }
        Skips(set)
    }

    /// Every step of `0..steps` but those in `kept`.
    fn all_but(steps: usize, kept: &[usize]) -> Skips {
        let kept: BTreeSet<usize> = kept.iter().copied().collect();
        Skips((0..steps).filter(|s| !kept.contains(s)).collect())
    }
}

impl fmt::Display for Skips {
    /// Ranges, inclusive: `3-10,15`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut it = self.0.iter().copied().peekable();
        while let Some(a) = it.next() {
            let mut b = a;
            while it.peek() == Some(&(b + 1)) {
                b += 1;
                it.next();
            }
            parts.push(if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            });
        }
        f.write_str(&parts.join(","))
    }
}

/// The invariant a violation line breaks: its text before the first `:`.
pub(crate) fn kind(violation: &str) -> &str {
    violation.split(':').next().unwrap_or(violation)
}

/// What a shrink found.
#[derive(Debug)]
pub(crate) struct Shrunk {
    /// The invariant that still breaks.
    pub(crate) kind: String,
    /// Steps the failing run took, and the shrunk run takes.
    pub(crate) before: usize,
    pub(crate) after: usize,
    /// The shrunk run (its skip set in `skipped`).
    pub(crate) report: RunReport,
    /// Candidate runs tried.
    pub(crate) runs: usize,
    pub(crate) took: Duration,
    /// Whether no single step more could go (else the budget ran out first).
    pub(crate) minimal: bool,
}

/// The shrink's time budget: `JOBVISOR_SIM_SHRINK_SECS` (default 60 s); `None` when 0.
pub(crate) fn budget() -> Option<Duration> {
    let secs = crate::env_u64("JOBVISOR_SIM_SHRINK_SECS").unwrap_or(60);
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// Runs `seed` skipping `skips`; `None` if the run panicked.
fn try_run(seed: u64, skips: &Skips) -> Option<RunReport> {
    let r = catch_unwind(AssertUnwindSafe(|| run_seed_skipping(seed, skips)));
    // A run that panicked left its thread's SQLite calls inline.
    jobvisor::testing::sqlite_calls_inline(false);
    r.ok()
}

/// Shrinks the failing run `failed` (it has a violation) within `budget`.
pub(crate) fn shrink(failed: RunReport, budget: Duration) -> Shrunk {
    let t0 = Instant::now();
    let target = kind(&failed.violations[0]).to_string();
    let steps = failed.steps;
    let before = (0..steps).filter(|s| !failed.skipped.contains(*s)).count();
    let mut kept: Vec<usize> = (0..steps)
        .filter(|s| !failed.skipped.contains(*s))
        .collect();
    let mut best = failed;
    let mut runs = 0;
    let mut n = 2usize;
    let mut minimal = false;
    'outer: while !kept.is_empty() {
        let chunk = kept.len().div_ceil(n.min(kept.len()));
        let mut reduced = false;
        for start in (0..kept.len()).step_by(chunk) {
            if t0.elapsed() >= budget {
                break 'outer;
            }
            let candidate: Vec<usize> = kept[..start]
                .iter()
                .chain(&kept[(start + chunk).min(kept.len())..])
                .copied()
                .collect();
            runs += 1;
            let Some(r) = try_run(best.seed, &Skips::all_but(steps, &candidate)) else {
                continue;
            };
            if r.violations.iter().any(|v| kind(v) == target) {
                kept = candidate;
                best = r;
                n = (n - 1).max(2);
                reduced = true;
                break;
            }
        }
        if !reduced {
            if chunk == 1 {
                minimal = true;
                break;
            }
            n = (n * 2).min(kept.len());
        }
    }
    if kept.is_empty() {
        minimal = true;
    }
    Shrunk {
        kind: target,
        before,
        after: kept.len(),
        report: best,
        runs,
        took: t0.elapsed(),
        minimal,
    }
}

impl fmt::Display for Shrunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.report;
        write!(
            f,
            "shrunk seed {}: {} steps → {} in {:.1} s ({} runs{}), still breaking {:?}:\n  {}\n\
             skipping {}\nreplay the shrunk run: {}",
            r.seed,
            self.before,
            self.after,
            self.took.as_secs_f64(),
            self.runs,
            if self.minimal {
                "; no single step more can go"
            } else {
                "; stopped by the time budget"
            },
            self.kind,
            r.violations.join("\n  "),
            r.skipped,
            crate::replay(r.seed, &r.skipped)
        )
    }
}
