//! The batch callback's race at full strength: 1,000 repetitions per backend of 8 members'
//! finalizers ending at once on 8 connections (two dead, six succeeded), each repetition
//! checking that the callback was released exactly once, claimed once, and that the
//! backstop releases nothing more (`batch_callback_race` in the conformance suite, which runs
//! 60 repetitions of it on every `cargo test`), in 4 lanes side by side, each on a database
//! of its own. `#[ignore]`d because it takes up to about a minute per backend; `.ci/crash`
//! runs it:
//!
//! ```sh
//! cargo test --all-features --test fanin -- --ignored --test-threads=1
//! ```
//!
//! `JOBVISOR_FANIN_REPS` sets the repetitions (default 1,000). PostgreSQL and MariaDB come
//! from `JOBVISOR_PG_URL` / `JOBVISOR_MYSQL_URL` (default: the local services); each test
//! works in a fresh database of its own and drops it.

use std::time::Instant;

use jobvisor::store::conformance::batch_callback_race;
use jobvisor::Backend;

/// Repetitions unless `JOBVISOR_FANIN_REPS` says otherwise.
const DEFAULT_REPS: usize = 1_000;
/// Repetitions run side by side, each lane on a database of its own.
const LANES: usize = 4;

async fn race(b: Backend) {
    let reps = match std::env::var("JOBVISOR_FANIN_REPS") {
        Ok(v) => v.parse().unwrap_or_else(|e| {
            panic!("JOBVISOR_FANIN_REPS={v:?}: {e}; expected a number of repetitions")
        }),
        Err(_) => DEFAULT_REPS,
    };
    let t0 = Instant::now();
    // Lanes, each on a database of its own (nothing one lane does is seen by another, not
    // even the backstop's sweep over every parent): the repetitions wait mostly on commits,
    // so lanes side by side finish sooner without changing any one race.
    let lanes: Vec<_> = (0..LANES)
        .map(|i| {
            let n = reps / LANES + usize::from(i < reps % LANES);
            tokio::spawn(batch_callback_race(b, n))
        })
        .collect();
    for lane in lanes {
        if let Err(e) = lane.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    println!(
        "fan-in race [{b:?}]: {reps} repetitions of 8 racing finalizers ({LANES} lanes), \
         callback released once each, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "1,000 repetitions, about a minute; run with .ci/crash"]
async fn fanin_postgres() {
    race(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "1,000 repetitions, about a minute; run with .ci/crash"]
async fn fanin_mysql() {
    race(Backend::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "1,000 repetitions, about a minute; run with .ci/crash"]
async fn fanin_sqlite() {
    race(Backend::Sqlite).await;
}
