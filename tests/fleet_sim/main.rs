//! The seeded fleet simulation: N real nodes, crashes, freezes, zombies and store faults
//! (writes applied late among them, and stalls as a claim's answer arrives) in one process, one seed → one exact run, every
//! invariant checked after each run.
//!
//! * `fleet_sim` (in the test command): [`CI_SEEDS`] seeds (`JOBVISOR_SIM_SEEDS` to change),
//!   the first [`TWICE`] of them run twice: the test fails if a seed's two runs give
//!   different event-log hashes, showing where the logs part. With `JOBVISOR_SIM_SEED=<n>`
//!   it runs that one seed twice, prints its event log and fails if the runs differ (a
//!   failing seed's two hashes are printed with its failure);
//!   `JOBVISOR_SIM_SKIP=3-10,15` skips those steps (a shrunk run's replay). With
//!   `JOBVISOR_SIM_UNTIL_FIRST=1` it stops at the first failing seed, printing
//!   `first failing seed <n> after <s> s` (the guard catalogue, `.ci/guard-catalogue`).
//! * `fleet_sim_for_minutes` (ignored): new seeds for `JOBVISOR_SIM_MINUTES` (default 1),
//!   reporting seeds per minute and every failing seed.
//! * `fleet_sim_hashes` (ignored): seeds 0..`JOBVISOR_SIM_SEEDS` (default 100) twice each,
//!   printing each hash and one hash of them all, to compare between machines; fails if
//!   any seed's two runs differ.
//!
//! A failing seed prints the command that replays it; the first failing seed of a test is
//! then shrunk (`shrink.rs`: delta debugging over its steps, at most
//! `JOBVISOR_SIM_SHRINK_SECS`, default 60 s, 0 for none), printing the steps before and
//! after and the command that replays the shrunk run.
//!
//! Each node reads time through a clock of its own over the shared manual clock (`clock.rs`):
//! its wall clock jumps and its monotonic clock drifts within ±10 %, as the seed chooses, or
//! stands still through a stop hidden from it (outside the bound: only the database's guards
//! stand then); the invariants are measured on the shared clock, the database's.
//!
//! Why a seed replays exactly: one run is one thread. Its runtime is current-thread (the
//! actix system's) with tokio's time paused, so timers fire only when nothing else can run,
//! in virtual time; every node's handlers run on that runtime
//! (`SchedulerBuilder::handlers_on_current_runtime`), and the SQLite calls run inline
//! (`testing::sqlite_calls_inline`) instead of on tokio's blocking threads. What a node does
//! within one step is ordered by the program, not by threads: the lease manager acts on its
//! leases by job and claim time (not in its hash map's random order), the handlers' two-way
//! waits are `biased`, and the event log holds nothing random (claim ids, real time).
//! Tokio's virtual time moves only by the settle's waits (a millisecond each), not with the
//! manual clock: a timer of the engine (a flush's back-off, a hedge) fires after enough
//! settles, the same number on every run; the deadline checks, sweeps and renewals that the
//! manual clock's advances call for are the driver's.
//!
//! Layout: `fleet.rs` (the nodes and settling), `clock.rs` (a node's clock), `run.rs` (one
//! seed's steps), `shrink.rs` (the skip sets and the shrink), `journal.rs` (the handlers'
//! executions and gates), `faults.rs` (the store faults), `controls.rs` (the queues, limits,
//! pauses, schedule and dependencies the seed drives), `sequences.rs` (ordered sequences:
//! two or three keys a run, policies `wait`, `run`, `cancel`), `deadlines.rs` (jobs with
//! start-by deadlines, short ones often missed), `replace.rs` (a debounce key's jobs
//! replacing or cancelling its pending holder), `runtime_schedule.rs` (a schedule added,
//! changed and removed at run time through a node's client), `operator.rs` (an operator's
//! dashboard tabs: presses pinned at the version a tab showed); the invariants: `check.rs`,
//! `check_controls.rs`, `check_sequences.rs` (members in enqueue order, one at a time, the
//! failure policies), `check_deadlines.rs` (never started at or past the deadline; never
//! started → cancelled `expired`), `check_replace.rs` (no replaced payload and no
//! cancelled holder runs after the answer), `check_operator.rs` (a pinned press writes only
//! while its job is still at that version), `check_effects.rs` (a handler's transaction
//! commits its effect and its job's end once, under its own lease) and `check_landing.rs` (a held renewal that lands
//! changes only its sender's own leases, a held settle only waiting children, a held fire
//! only while its sender leads); `log.rs` (the event log and its hash), `rng.rs` (the
//! generator).

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

#[path = "../harness/mod.rs"]
mod harness;

mod check;
mod check_controls;
mod check_deadlines;
mod check_effects;
mod check_landing;
mod check_operator;
mod check_replace;
mod check_sequences;
mod clock;
mod controls;
mod deadlines;
mod faults;
mod fleet;
mod journal;
mod log;
mod operator;
mod replace;
mod rng;
mod run;
mod runtime_schedule;
mod sequences;
mod shrink;

use std::time::{Duration, Instant};

use run::{run_seed, run_seed_skipping, RunReport};
use shrink::Skips;

/// Seeds the test command runs (with [`TWICE`], about a minute on a busy two-core machine,
/// debug build).
const CI_SEEDS: u64 = 100;
/// Of those, how many run twice (determinism).
const TWICE: u64 = 25;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
    )
}

fn replay(seed: u64, skips: &Skips) -> String {
    let skip = if skips.is_empty() {
        String::new()
    } else {
        format!("JOBVISOR_SIM_SKIP={skips} ")
    };
    format!(
        "JOBVISOR_SIM_SEED={seed} {skip}cargo test --all-features --test fleet_sim -- fleet_sim --exact --nocapture"
    )
}

/// The shrink of the failing run `r` as text, unless shrinking is off.
fn shrunk(r: RunReport) -> String {
    match shrink::budget() {
        Some(budget) => shrink::shrink(r, budget).to_string(),
        None => "not shrunk (JOBVISOR_SIM_SHRINK_SECS=0)".into(),
    }
}

fn failure(r: &RunReport) -> String {
    format!(
        "seed {} broke {} invariant(s):\n  {}\nreplay: {}",
        r.seed,
        r.violations.len(),
        r.violations.join("\n  "),
        replay(r.seed, &r.skipped)
    )
}

/// Where two runs of one seed part, with the lines before.
fn difference(a: &RunReport, b: &RunReport) -> String {
    let at = a
        .log
        .iter()
        .zip(&b.log)
        .position(|(x, y)| x != y)
        .unwrap_or(a.log.len().min(b.log.len()));
    let from = at.saturating_sub(8);
    format!(
        "seed {} is not deterministic: hashes {:016x} and {:016x}; they part at line {at}:\n{}\n  \
         first run: {:?}\n  second run: {:?}\nreplay: {}",
        a.seed,
        a.hash,
        b.hash,
        a.log[from..at].join("\n"),
        a.log.get(at),
        b.log.get(at),
        replay(a.seed, &a.skipped)
    )
}

#[test]
fn fleet_sim() {
    if let Some(seed) = env_u64("JOBVISOR_SIM_SEED") {
        let skips = std::env::var("JOBVISOR_SIM_SKIP")
            .map(|s| Skips::parse(&s))
            .unwrap_or_default();
        let r = run_seed_skipping(seed, &skips);
        for l in &r.log {
            println!("{l}");
        }
        println!(
            "seed {seed}: hash {:016x}, {} faults injected",
            r.hash, r.faults
        );
        if !r.violations.is_empty() {
            // A failing seed is replayed too: its failure must be exactly reproducible.
            let again = run_seed_skipping(seed, &skips);
            let replayed = if again.hash == r.hash {
                format!("replayed exactly: hash {:016x} twice", r.hash)
            } else {
                difference(&r, &again)
            };
            let f = failure(&r);
            eprintln!("{f}\n{replayed}");
            panic!("{f}\n{replayed}\n{}", shrunk(r));
        }
        let again = run_seed_skipping(seed, &skips);
        assert_eq!(again.hash, r.hash, "{}", difference(&r, &again));
        return;
    }
    let seeds = env_u64("JOBVISOR_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut first_failed = None;
    let mut steps = 0;
    let mut faults = 0;
    let mut replayed = 0;
    let mut differ = Vec::new();
    for seed in 0..seeds {
        let r = run_seed(seed);
        steps += r.steps;
        faults += r.faults;
        if !r.violations.is_empty() {
            failures.push(failure(&r));
            first_failed.get_or_insert(r);
            if env_u64("JOBVISOR_SIM_UNTIL_FIRST") == Some(1) {
                println!(
                    "first failing seed {seed} after {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
                break;
            }
            continue;
        }
        if seed < TWICE {
            let again = run_seed(seed);
            if again.hash == r.hash {
                replayed += 1;
            } else {
                differ.push(difference(&r, &again));
            }
        }
    }
    let took = t0.elapsed();
    println!(
        "fleet_sim: {seeds} seeds, {steps} steps, {faults} store faults in {:.1} s: {:.0} seeds/minute; \
         {replayed} of {} seeds run twice gave the same hash",
        took.as_secs_f64(),
        (seeds + TWICE.min(seeds)) as f64 * 60.0 / took.as_secs_f64(),
        TWICE.min(seeds)
    );
    if let Some(r) = first_failed {
        eprintln!("{}", failures.join("\n\n"));
        panic!("{}\n\n{}", failures.join("\n\n"), shrunk(r));
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
}

#[test]
#[ignore = "runs for JOBVISOR_SIM_MINUTES minutes"]
fn fleet_sim_for_minutes() {
    let minutes = env_u64("JOBVISOR_SIM_MINUTES").unwrap_or(1);
    let first = env_u64("JOBVISOR_SIM_FIRST_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() << 20)
            .unwrap_or(0)
    });
    let until = Instant::now() + Duration::from_secs(minutes * 60);
    let t0 = Instant::now();
    let mut seed = first;
    let mut failures = Vec::new();
    let mut first_failed = None;
    while Instant::now() < until {
        let r = run_seed(seed);
        if !r.violations.is_empty() {
            let f = failure(&r);
            eprintln!("{f}");
            failures.push(f);
            first_failed.get_or_insert(r);
        }
        seed += 1;
    }
    let n = seed - first;
    println!(
        "fleet_sim_for_minutes: seeds {first}..{seed} ({n}) in {:.1} s: {:.0} seeds/minute, {} failing",
        t0.elapsed().as_secs_f64(),
        n as f64 * 60.0 / t0.elapsed().as_secs_f64(),
        failures.len()
    );
    if let Some(r) = first_failed {
        panic!("{}\n\n{}", failures.join("\n\n"), shrunk(r));
    }
}

#[test]
#[ignore = "prints the hashes of many seeds, each run twice"]
fn fleet_sim_hashes() {
    let seeds = env_u64("JOBVISOR_SIM_SEEDS").unwrap_or(100);
    let mut all = rng::FNV_START;
    let mut differ = Vec::new();
    for seed in 0..seeds {
        let (a, b) = (run_seed(seed), run_seed(seed));
        if let Ok(dir) = std::env::var("JOBVISOR_SIM_DUMP") {
            for (r, n) in [(&a, 1), (&b, 2)] {
                std::fs::write(format!("{dir}/seed{seed}-{n}.log"), r.log.join("\n")).unwrap();
            }
        }
        println!("seed {seed}: {:016x} {:016x}", a.hash, b.hash);
        if a.hash != b.hash {
            eprintln!("{}", difference(&a, &b));
            differ.push(seed);
        }
        all = rng::fnv(&a.hash.to_le_bytes(), all);
    }
    println!("fleet_sim_hashes: {seeds} seeds, all hashes → {all:016x}; differing: {differ:?}");
    assert!(differ.is_empty(), "seeds whose two runs differ: {differ:?}");
}
