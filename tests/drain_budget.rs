//! The drain's statement budget: statements, round trips and commits per 1,000 jobs of a
//! real drain (a scheduler with handlers, jobs enqueued before it starts), counted on every
//! connection by `jobvisor::testing::count_statements` — counts, not times, so the guard
//! cannot be noise. Where `tests/hot_path_budget.rs` prices each store operation alone, this
//! prices what the node actually sends per job end to end: a statement added anywhere on the
//! way from claim to finalization — in an actor, per job or per batch — fails here.
//!
//! Two drains per backend:
//!
//! * **one at a time** (concurrency 1, no prefetch): every claim and every finalization
//!   holds exactly one job, so the count is the per-job price of the hot path with no
//!   batching to vary. Its budgets are exact per job plus a small allowance for the periodic
//!   statements of the node that fall inside the drain.
//! * **default** (concurrency 10, default prefetch): the configuration the cost model
//!   reports; batch sizes follow timing, so its budget has headroom measured over runs.
//!
//! Left out of every count: the change signal on MariaDB and SQLite (a read every 80 ms on a
//! connection of its own, whatever the node is doing: `tests/idle_budget.rs` bounds it),
//! because it grows with the drain's duration, not with its jobs.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use jobvisor::testing::{count_statements, sent, Sent, TestDb};
use jobvisor::{handler_fn, Backend, Client, JobOutcome, NewJob, QueueConfig, Scheduler};
use serde_json::{json, Value};

/// Jobs of the one-at-a-time drain.
const JOBS_ONE_AT_A_TIME: u64 = 500;
/// Jobs of the default drain: enough for its claims to reach their full size.
const JOBS_DEFAULT: u64 = 3_000;

/// The change signal's statement: left out (see the module docs).
fn is_change_signal(kind: &str) -> bool {
    kind.starts_with("SELECT (SELECT max(")
}

/// Per 1,000 jobs: statements, round trips, write commits.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerK {
    statements: f64,
    round_trips: f64,
    commits: f64,
}

/// The configuration a drain runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    OneAtATime,
    Default,
}

/// What one job costs when jobs go one at a time: a claim of one job and a finalization of
/// one job. Why each figure is what it is: the per-operation prices of
/// `tests/hot_path_budget.rs` and the cost model (ARCHITECTURE.md §9).
fn price_per_job(backend: Backend) -> PerK {
    let (statements, round_trips, commits) = match backend {
        // The claim (`UPDATE … RETURNING`) and the finalization, one autocommitted statement
        // each.
        Backend::Postgres => (2.0, 2.0, 2.0),
        // No `UPDATE … RETURNING`: the claim is ping, `BEGIN`, locking `SELECT`, `UPDATE`,
        // read-back, `COMMIT` (6); the finalization ping, `BEGIN`, locking `SELECT`,
        // `UPDATE … JOIN`, `COMMIT` (5): a success's claim stays on its job row, so the
        // execution ledger's `INSERT` is sent only for other ends. Nothing is pipelined.
        Backend::Mysql => (11.0, 11.0, 2.0),
        // Each write in `BEGIN IMMEDIATE … COMMIT`: 3 for the claim, 3 for the finalization
        // (a batch of successes reads nothing for the execution ledger and inserts no row).
        Backend::Sqlite => (6.0, 6.0, 2.0),
    };
    PerK {
        statements: statements * 1000.0,
        round_trips: round_trips * 1000.0,
        commits: commits * 1000.0,
    }
}

/// What a one-at-a-time drain may send per 1,000 jobs beyond [`price_per_job`]: the node's
/// start (registration, election, storing schedules, reading queue settings, and each new
/// connection's session set-up — 3 statements on PostgreSQL, 5 on MariaDB, 1 on SQLite) and
/// its periodic statements while the drain runs (poll, leader lease, schedule tick), plus
/// the last claim that finds nothing. Seen over five runs of 500 jobs (4–11 s in a debug
/// build): PostgreSQL 84–104 statements, MariaDB 126–204, SQLite 34–38, commits 4–14. The
/// periodic part grows with the drain's duration, so the allowance leaves room for a
/// machine about three times slower — and stays well under the 1,000 that one statement
/// per job, or per claim or finalization (each holds one job here), adds.
fn allowance(backend: Backend) -> PerK {
    let (statements, round_trips, commits) = match backend {
        Backend::Postgres => (400.0, 400.0, 60.0),
        Backend::Mysql => (600.0, 600.0, 80.0),
        Backend::Sqlite => (300.0, 300.0, 60.0),
    };
    PerK {
        statements,
        round_trips,
        commits,
    }
}

/// The default drain's budget per 1,000 jobs of [`JOBS_DEFAULT`]: claims of up to 505 jobs
/// and finalization batches of what finished meanwhile, 13–21 of each per 3,000 jobs, with
/// the node's start and its connections' set-up. Seen over six runs: PostgreSQL 19–22
/// statements, 17–20 round trips (a new connection sends its two set-up statements
/// together), 10–12 commits; MariaDB 63–74, 63–74, 9–11; SQLite 34–41, 34–41, 10–13. About
/// half more is allowed, for batch sizes that follow timing. One statement more per job
/// (1,000) fails it; one more per batch is left to the one-at-a-time drain, where every
/// batch is one job.
fn default_budget(backend: Backend) -> PerK {
    let (statements, round_trips, commits) = match backend {
        Backend::Postgres => (33.0, 30.0, 18.0),
        Backend::Mysql => (110.0, 110.0, 17.0),
        Backend::Sqlite => (60.0, 60.0, 20.0),
    };
    PerK {
        statements,
        round_trips,
        commits,
    }
}

/// The most a drain may send per 1,000 jobs, and the least (one at a time, so that a saved
/// statement lowers the price written here; the default drain has no floor).
fn budget(backend: Backend, drain: Drain) -> (PerK, PerK) {
    match drain {
        Drain::OneAtATime => {
            let (p, a) = (price_per_job(backend), allowance(backend));
            let most = PerK {
                statements: p.statements + a.statements,
                round_trips: p.round_trips + a.round_trips,
                commits: p.commits + a.commits,
            };
            (most, p)
        }
        Drain::Default => (
            default_budget(backend),
            PerK {
                statements: 0.0,
                round_trips: 0.0,
                commits: 0.0,
            },
        ),
    }
}

struct Drained {
    per_k: PerK,
    sent: Sent,
    claims: u64,
    finalizations: u64,
    secs: f64,
}

async fn drain(backend: Backend, how: Drain) -> Drained {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let n = match how {
        Drain::OneAtATime => JOBS_ONE_AT_A_TIME,
        Drain::Default => JOBS_DEFAULT,
    };
    let jobs: Vec<NewJob> = (0..n).map(|_| NewJob::new("noop", json!({}))).collect();
    Client::new(store.clone()).enqueue_many(jobs).await.unwrap();
    let queue = match how {
        Drain::OneAtATime => QueueConfig::default().concurrency(1).prefetch(0),
        Drain::Default => QueueConfig::default().concurrency(10),
    };
    let before = sent();
    let t0 = Instant::now();
    let handle = Scheduler::builder(store)
        .queue("default", queue)
        .handler(
            "noop",
            handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
        )
        .start()
        .unwrap();
    while handle.stats().finished < n {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{backend:?} {how:?}: the drain did not finish: {} of {n}",
            handle.stats().finished
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut sent = sent().since(&before);
    let secs = t0.elapsed().as_secs_f64();
    let stats = handle.stats();
    handle.shutdown_within(Duration::from_secs(5)).await;
    let signal: Vec<String> = sent
        .by_kind
        .keys()
        .filter(|k| is_change_signal(k))
        .cloned()
        .collect();
    for k in signal {
        let n = sent.by_kind.remove(&k).unwrap_or(0);
        // The signal is a read sent alone on its own connection: one statement, one round
        // trip, no commit.
        sent.statements -= n;
        sent.round_trips -= n;
    }
    let per = |x: u64| x as f64 * 1000.0 / n as f64;
    Drained {
        per_k: PerK {
            statements: per(sent.statements),
            round_trips: per(sent.round_trips),
            commits: per(sent.commits),
        },
        sent,
        claims: stats.claim_statements,
        finalizations: stats.finalize_statements,
        secs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_stays_within_its_statement_budget_per_thousand_jobs() {
    count_statements(true);
    let mut over = Vec::new();
    // One backend at a time: the counters are the process's.
    for backend in [Backend::Postgres, Backend::Mysql, Backend::Sqlite] {
        for how in [Drain::OneAtATime, Drain::Default] {
            let d = drain(backend, how).await;
            let (want, floor) = budget(backend, how);
            let got = d.per_k;
            println!(
                "{backend:?}\t{how:?}\tper 1,000 jobs: statements {:.0}, round trips {:.0}, \
                 commits {:.0} (budget {:.0}/{:.0}/{:.0}); claims {}, finalizations {}, {:.1} s",
                got.statements,
                got.round_trips,
                got.commits,
                want.statements,
                want.round_trips,
                want.commits,
                d.claims,
                d.finalizations,
                d.secs,
            );
            for (kind, n) in &d.sent.by_kind {
                println!("\t{n:>6}  {kind}");
            }
            for (what, got, want, floor) in [
                (
                    "statements",
                    got.statements,
                    want.statements,
                    floor.statements,
                ),
                (
                    "round trips",
                    got.round_trips,
                    want.round_trips,
                    floor.round_trips,
                ),
                ("commits", got.commits, want.commits, floor.commits),
            ] {
                if got > want {
                    over.push(format!(
                        "{backend:?} {how:?}: {got:.0} {what} per 1,000 jobs, budget {want:.0}"
                    ));
                }
                if got < floor {
                    over.push(format!(
                        "{backend:?} {how:?}: {got:.0} {what} per 1,000 jobs, below the price \
                         of {floor:.0}: the hot path got cheaper, lower the price to match"
                    ));
                }
            }
        }
    }
    assert!(
        over.is_empty(),
        "a drain's statements per 1,000 jobs left their budget (change it in the same commit, \
         with the reason, and the cost model in ARCHITECTURE.md §9):\n{}",
        over.join("\n")
    );
}
