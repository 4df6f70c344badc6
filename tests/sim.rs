//! Simulation tests of the runtime: actors on a real store, a manual clock, ticks sent to
//! mailboxes — no timers, no sleeps. Key scenarios also run with two nodes sharing one
//! database on PostgreSQL, MySQL and SQLite (`two_nodes::*`).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobvisor::clock::Clock as _;
use jobvisor::scheduler::{Event, TokenOf};
use jobvisor::store::conformance::TestDb;
use jobvisor::testing::Simulation;
use jobvisor::{
    handler_fn, Backend, CancelOutcome, JobError, JobId, JobOutcome, JobState, NewJob, QueueConfig,
    RetryPolicy,
};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

const SEC: Duration = Duration::from_secs(1);

/// A handler that waits until the test lets it go, then returns `result` (it ignores
/// cancellation, like a handler stuck in a blocking call).
fn gated(gate: Arc<Semaphore>, result: &'static str) -> impl jobvisor::JobHandler {
    handler_fn(move |_: Value, _ctx| {
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await.map_err(JobError::fail)?;
            JobOutcome::success(result)
        }
    })
}

async fn enqueue(sim: &Simulation, job: NewJob) -> JobId {
    sim.client.enqueue(job).await.unwrap().id
}

#[actix::test]
async fn a_job_runs_and_its_result_is_stored() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "double",
            handler_fn(|p: Value, _ctx| async move {
                JobOutcome::success(p["n"].as_i64().unwrap_or(0) * 2)
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("double", json!({"n": 21}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(
        (job.state, job.result, job.attempts),
        (JobState::Succeeded, Some(json!(42)), 1)
    );
    assert!(job.lease.is_none());
}

#[actix::test]
async fn a_dead_nodes_job_is_reclaimed_after_its_lease_and_run_by_another_node() {
    // Node A claims the job, then goes silent (no heartbeat, no deadline checks: as if its
    // process were paused or gone). Node B shares the database and the clock.
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate_a = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
        b.handler("work", gated(gate_a.clone(), "from A"))
    })
    .keep(db.clone());
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "node-b", |b| {
        b.handler(
            "work",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("from B") }),
        )
    });
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    a.next_event(|e| matches!(e, Event::Claimed { .. })).await;

    // Before expiry nothing is reclaimed; after it, B's sweeper reclaims with the attempt counted.
    clock.advance(29 * SEC);
    assert_eq!(b.sweep().await, 0);
    clock.advance(2 * SEC);
    assert_eq!(b.sweep().await, 1);
    let job = b.client.get(id).await.unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Retrying, 1));
    assert_eq!(job.last_error.as_ref().unwrap().code, "lease_expired");
    clock.advance(SEC);
    assert_eq!(b.fetch("default").await, 1);
    assert_eq!(b.finished(id).await, JobState::Succeeded);

    // A resumes: its handler finishes, its finalization is refused as lease-lost.
    gate_a.add_permits(1);
    a.next_event(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id))
        .await;
    let job = b.client.get(id).await.unwrap();
    assert_eq!(job.result, Some(json!("from B")), "the newer result stands");
    assert_eq!(job.attempts, 2);
    assert!(!a
        .seen()
        .iter()
        .any(|e| matches!(e, Event::Finished { id: i, .. } if *i == id)));
}

#[actix::test]
async fn a_resumed_zombie_learns_from_its_heartbeat_that_its_lease_is_lost() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "zombie", |b| {
        b.handler("work", gated(gate.clone(), "zombie"))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "other", |b| {
        b.handler("work", gated(gate.clone(), "other"))
    });
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    a.fetch("default").await;
    let stale = a.lease_manager().send(TokenOf(id)).await.unwrap().unwrap();
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 1);
    clock.advance(2 * SEC);
    assert_eq!(b.fetch("default").await, 1);
    // The zombie's heartbeat: refused, reported as lease lost, its handler stopped.
    let r = a.renew().await;
    assert_eq!((r.renewed, r.lost, r.statements), (0, 1, 1));
    a.next_event(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id))
        .await;
    // Its token no longer writes anything.
    let out = b
        .handle
        .store()
        .job_finalize_many(jobvisor::FinalizeParams {
            items: vec![jobvisor::Finalize::succeeded(id, stale, json!("zombie"))],
            now: clock.bound_now(),
        })
        .await
        .unwrap();
    assert_eq!(out[0].1, jobvisor::Guarded::LeaseLost);
    let job = b.client.get(id).await.unwrap();
    assert_eq!(
        (job.state, job.lease.unwrap().owner.as_str()),
        (JobState::Running, "other")
    );
}

#[actix::test]
async fn a_handler_past_its_timeout_is_stopped_and_retried() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "slow",
            handler_fn(|_: Value, ctx: jobvisor::JobContext| async move {
                if ctx.attempt == 1 {
                    ctx.cancelled().await; // hangs until stopped
                    return Err(JobError::retry("stopped"));
                }
                JobOutcome::success("second try")
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("slow", json!({})).timeout(5 * SEC)).await;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Started { .. })).await; // the timeout counts from here
    sim.advance(4 * SEC);
    assert_eq!(sim.check_deadlines().await, 0);
    sim.advance(2 * SEC);
    assert_eq!(sim.check_deadlines().await, 1);
    sim.next_event(|e| matches!(e, Event::TimedOut { .. }))
        .await;
    assert_eq!(sim.finished(id).await, JobState::Retrying);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(job.last_error.as_ref().unwrap().code, "timeout");
    sim.advance(2 * SEC);
    sim.fetch("default").await;
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    assert_eq!(sim.client.get(id).await.unwrap().attempts, 2);
}

#[actix::test]
async fn snooze_does_not_use_an_attempt() {
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let mut sim = Simulation::sqlite(move |b| {
        b.handler(
            "later",
            handler_fn(move |_: Value, _ctx| {
                let runs = r2.clone();
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                        Ok(JobOutcome::snooze(Duration::from_secs(60)))
                    } else {
                        JobOutcome::success("now")
                    }
                }
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("later", json!({})).max_attempts(1)).await;
    for _ in 0..2 {
        sim.fetch("default").await;
        assert_eq!(sim.finished(id).await, JobState::Pending);
        let job = sim.client.get(id).await.unwrap();
        assert_eq!(job.attempts, 0, "a snooze is not an attempt");
        sim.advance(59 * SEC);
        assert_eq!(sim.fetch("default").await, 0, "not before the snooze ends");
        sim.advance(SEC);
    }
    sim.fetch("default").await;
    assert_eq!(
        sim.finished(id).await,
        JobState::Succeeded,
        "max_attempts 1 was never used up"
    );
}

#[actix::test]
async fn cancelling_a_running_job_signals_its_handler_and_ends_it_cancelled() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "long",
            handler_fn(|_: Value, ctx: jobvisor::JobContext| async move {
                ctx.cancelled().await;
                Err(JobError::retry("interrupted"))
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("long", json!({}))).await;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Claimed { .. })).await;
    let out = sim.client.cancel(id).await.unwrap();
    assert!(matches!(out, CancelOutcome::Requested(_)), "{out:?}");
    sim.advance(SEC);
    sim.renew().await; // the heartbeat brings the request to the node
    sim.next_event(|e| matches!(e, Event::CancelSignalled { .. }))
        .await;
    assert_eq!(sim.finished(id).await, JobState::Cancelled);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(job.last_error.unwrap().code, "cancelled");
}

#[actix::test]
async fn graceful_shutdown_gives_back_the_lease_of_a_job_still_running() {
    let gate = Arc::new(Semaphore::new(0));
    let quick_gate = Arc::new(Semaphore::new(1));
    let sim = Simulation::sqlite(|b| {
        b.handler("stuck", gated(gate.clone(), "never"))
            .handler("quick", gated(quick_gate, "done"))
    })
    .await;
    let stuck = enqueue(&sim, NewJob::new("stuck", json!({}))).await;
    let quick = enqueue(&sim, NewJob::new("quick", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 2);
    let report = sim.handle.shutdown_within(Duration::from_millis(500)).await;
    assert_eq!((report.finished, report.released), (1, 1));
    let job = sim.client.get(stuck).await.unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Pending, 0),
        "given back without using an attempt"
    );
    assert!(job.lease.is_none());
    assert_eq!(
        sim.client.get(quick).await.unwrap().state,
        JobState::Succeeded
    );
}

#[actix::test]
async fn max_attempts_end_dead_with_every_error_kept() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "flaky",
            handler_fn(|_: Value, ctx: jobvisor::JobContext| async move {
                Err::<JobOutcome, _>(
                    JobError::retry(format!("failure {}", ctx.attempt)).with_code("flaky"),
                )
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("flaky", json!({})).max_attempts(3)).await;
    for attempt in 1..=3 {
        assert_eq!(sim.fetch("default").await, 1, "attempt {attempt}");
        let expect = if attempt < 3 {
            JobState::Retrying
        } else {
            JobState::Dead
        };
        assert_eq!(sim.finished(id).await, expect);
        sim.advance(2 * SEC);
    }
    assert_eq!(sim.fetch("default").await, 0);
    let job = sim.client.get(id).await.unwrap();
    let messages: Vec<&str> = job.errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["failure 1", "failure 2", "failure 3"]);
    assert_eq!(job.attempts, 3);
}

#[actix::test]
async fn priorities_are_respected() {
    let mut sim = Simulation::sqlite(|b| {
        b.queue("one", QueueConfig::default().concurrency(1))
            .handler(
                "p",
                handler_fn(|_: Value, _ctx| async { Ok(JobOutcome::done()) }),
            )
    })
    .await;
    let low = enqueue(&sim, NewJob::new("p", json!({})).queue("one").priority(50)).await;
    let high = enqueue(&sim, NewJob::new("p", json!({})).queue("one").priority(1)).await;
    let mid = enqueue(&sim, NewJob::new("p", json!({})).queue("one").priority(10)).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        sim.fetch("one").await;
        if let Event::Claimed { id, .. } =
            sim.next_event(|e| matches!(e, Event::Claimed { .. })).await
        {
            order.push(id);
            sim.finished(id).await;
        }
    }
    assert_eq!(order, vec![high, mid, low]);
}

#[actix::test]
async fn the_prefetch_window_grows_for_idle_workers_and_shrinks_when_jobs_wait() {
    use jobvisor::scheduler::{GetFetcherStatus, PREFETCH_MAX_WAIT};
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::sqlite(|b| {
        b.queue("one", QueueConfig::default().concurrency(1).prefetch(4))
            .handler("work", gated(gate.clone(), "x"))
    })
    .await;
    let window = |sim: &Simulation| {
        let f = sim.fetcher("one");
        async move { f.send(GetFetcherStatus).await.unwrap().prefetch_window }
    };
    assert_eq!(
        window(&sim).await,
        1,
        "starts at min(concurrency, prefetch)"
    );
    let first = enqueue(&sim, NewJob::new("work", json!({})).queue("one")).await;
    let second = enqueue(&sim, NewJob::new("work", json!({})).queue("one")).await;
    // A full claim (1 of a budget of 2, claimed in halves) came back to an idle worker: the
    // window doubles, and the fetcher claims the next chunk by itself.
    assert_eq!(sim.fetch("one").await, 1);
    sim.next_event(|e| matches!(e, Event::Claimed { id, .. } if *id == second))
        .await;
    sim.next_event(|e| matches!(e, Event::Started { id, .. } if *id == first))
        .await;
    assert_eq!(window(&sim).await, 2);
    // The second job waits in the prefetch longer than allowed: the window halves.
    sim.advance(PREFETCH_MAX_WAIT * 5);
    gate.add_permits(2);
    assert_eq!(sim.finished(first).await, JobState::Succeeded);
    assert_eq!(sim.finished(second).await, JobState::Succeeded);
    assert_eq!(window(&sim).await, 1);
}

#[actix::test]
async fn the_lease_manager_renews_many_leases_in_one_statement() {
    let gate = Arc::new(Semaphore::new(0));
    let sim = Simulation::sqlite(|b| b.handler("work", gated(gate.clone(), "x"))).await;
    for _ in 0..5 {
        enqueue(&sim, NewJob::new("work", json!({}))).await;
    }
    assert_eq!(sim.fetch("default").await, 5);
    sim.advance(10 * SEC);
    let r = sim.renew().await;
    assert_eq!((r.renewed, r.lost, r.statements), (5, 0, 1));
    let running = sim
        .client
        .list(jobvisor::ListParams {
            state: Some(JobState::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 5);
    let expect = sim.clock.now() + chrono::Duration::seconds(30);
    assert!(running
        .iter()
        .all(|j| j.lease.as_ref().unwrap().expires_at == expect));
    gate.add_permits(5);
}

#[actix::test]
async fn a_lease_that_cannot_be_renewed_in_time_stops_its_handler() {
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::sqlite(|b| b.handler("work", gated(gate.clone(), "late"))).await;
    let id = enqueue(&sim, NewJob::new("work", json!({}))).await;
    sim.fetch("default").await;
    sim.advance(24 * SEC);
    assert_eq!(sim.check_deadlines().await, 0);
    sim.advance(SEC); // 25 s without a renewal: within 5 s of expiry
    assert_eq!(sim.check_deadlines().await, 1);
    sim.next_event(|e| matches!(e, Event::SelfFenced { .. }))
        .await;
    gate.add_permits(1); // the handler would now finish, but its result is discarded
    sim.advance(6 * SEC);
    assert_eq!(
        sim.sweep().await,
        1,
        "the sweeper reclaims it once the lease expired"
    );
    assert_eq!(sim.client.get(id).await.unwrap().state, JobState::Retrying);
}

#[actix::test]
async fn panics_and_unknown_kinds_are_failures_that_say_why() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "boom",
            handler_fn(|_: Value, _ctx| async move {
                if true {
                    panic!("kaboom");
                }
                Ok(JobOutcome::done())
            }),
        )
    })
    .await;
    let boom = enqueue(&sim, NewJob::new("boom", json!({}))).await;
    let nobody = enqueue(&sim, NewJob::new("nobody-handles-this", json!({}))).await;
    sim.fetch("default").await;
    assert_eq!(sim.finished(boom).await, JobState::Retrying);
    let e = sim.client.get(boom).await.unwrap().last_error.unwrap();
    assert_eq!(e.code, "panic");
    assert!(e.message.contains("kaboom"), "{}", e.message);
    let st = sim.finished(nobody).await;
    assert_eq!(st, JobState::Retrying);
    let e = sim.client.get(nobody).await.unwrap().last_error.unwrap();
    assert_eq!(e.code, "unknown_kind");
    assert!(e.message.contains("nobody-handles-this"), "{}", e.message);
}

#[actix::test]
async fn bad_scheduler_config_names_the_field() {
    let store = TestDb::create(Backend::Sqlite).await;
    let s = store.store().await;
    let err = jobvisor::Scheduler::builder(s.clone())
        .queue("q", QueueConfig::default().concurrency(0))
        .handler(
            "k",
            handler_fn(|_: Value, _ctx| async { Ok(JobOutcome::done()) }),
        )
        .start()
        .unwrap_err();
    assert!(
        matches!(
            err,
            jobvisor::Error::Config {
                field: "queue.concurrency",
                ..
            }
        ),
        "{err}"
    );
    let err = jobvisor::Scheduler::builder(s.clone())
        .queue("q", QueueConfig::default())
        .start()
        .unwrap_err();
    assert!(
        matches!(
            err,
            jobvisor::Error::Config {
                field: "handlers",
                ..
            }
        ),
        "{err}"
    );
    let err = jobvisor::Scheduler::builder(s)
        .queue(
            "q",
            QueueConfig::default().retry(RetryPolicy {
                factor: 0.1,
                ..RetryPolicy::default()
            }),
        )
        .handler(
            "k",
            handler_fn(|_: Value, _ctx| async { Ok(JobOutcome::done()) }),
        )
        .start()
        .unwrap_err();
    assert!(
        matches!(
            err,
            jobvisor::Error::Config {
                field: "retry.factor",
                ..
            }
        ),
        "{err}"
    );
}

#[actix::test]
async fn wait_returns_the_finished_job() {
    let sim = Simulation::sqlite(|b| {
        b.handler(
            "w",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(7) }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("w", json!({}))).await;
    let err = sim
        .client
        .wait(id, Duration::from_millis(30))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            jobvisor::Error::WaitTimeout {
                state: JobState::Pending,
                ..
            }
        ),
        "{err}"
    );
    sim.fetch("default").await;
    let job = sim.client.wait(id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(job.result, Some(json!(7)));
}

static LATE_A_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn waits_for_stop(is_a: bool) -> impl jobvisor::JobHandler {
    /// Clears the flag however the handler ends: returning, or aborted at its await.
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            LATE_A_RUNNING.store(false, Ordering::SeqCst);
        }
    }
    handler_fn(move |_: Value, ctx: jobvisor::JobContext| async move {
        let _running = is_a.then(|| {
            LATE_A_RUNNING.store(true, Ordering::SeqCst);
            Running
        });
        ctx.cancelled().await;
        JobOutcome::success("stopped")
    })
}

#[actix::test]
async fn a_claim_answered_late_does_not_extend_the_lease() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
        b.handler("work", waits_for_stop(true))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "node-b", |b| {
        b.handler("work", waits_for_stop(false))
    });
    a.client
        .enqueue(NewJob::new("work", json!({})))
        .await
        .unwrap();
    // Another process holds SQLite's write lock, so A's claim (its `now` bound when sent)
    // waits. The pause only lets A send it first; if it were too short the test would pass
    // vacuously, never fail spuriously.
    let path = db.url.strip_prefix("sqlite://").unwrap().to_string();
    let mut locker = diesel::SqliteConnection::establish(&path).unwrap();
    locker.batch_execute("BEGIN IMMEDIATE").unwrap();
    let claim = actix_rt::spawn(a.fetcher("default").send(jobvisor::scheduler::FetchNow));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 29 s pass while the claim waits (a slow commit, a stalled network, a paused VM)...
    clock.advance(29 * SEC);
    locker.batch_execute("COMMIT").unwrap();
    assert_eq!(claim.await.unwrap().unwrap(), 1);
    // ...then 2 s more: the lease the database granted (send time + 30 s) has expired, and A
    // must already have fenced itself by its own, conservative, reckoning.
    clock.advance(2 * SEC);
    assert_eq!(
        a.check_deadlines().await,
        1,
        "A fences: its lease is (about to be) over"
    );
    // A's fetcher would happily claim the job again once it is due; keep A out of the race.
    a.fetcher("default")
        .send(jobvisor::scheduler::StopClaiming)
        .await
        .unwrap();
    assert_eq!(b.sweep().await, 1);
    clock.advance(SEC);
    let claimed_by_b = b.fetch("default").await;
    assert_eq!(claimed_by_b, 1);
    for _ in 0..100 {
        if !LATE_A_RUNNING.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !LATE_A_RUNNING.load(Ordering::SeqCst),
        "A's handler still runs while B holds the job"
    );
}

// ---- two nodes sharing one database, on every backend -----------------------------------

async fn two_nodes_reclaim_and_fence_a_zombie(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate_a = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "pg-a", |b| {
        b.handler("work", gated(gate_a.clone(), "from A"))
    })
    .keep(db.clone());
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "pg-b", |b| {
        b.handler(
            "work",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("from B") }),
        )
    });
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    assert_eq!(b.fetch("default").await, 0, "one claim only");
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 1);
    clock.advance(2 * SEC);
    assert_eq!(b.fetch("default").await, 1);
    assert_eq!(b.finished(id).await, JobState::Succeeded);
    gate_a.add_permits(1);
    a.next_event(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id))
        .await;
    let job = b.client.get(id).await.unwrap();
    assert_eq!((job.result, job.attempts), (Some(json!("from B")), 2));
}

async fn two_nodes_share_a_queue_without_double_claims(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    // Handlers hold their worker until the claims are counted, so no slot frees early.
    let gate = Arc::new(Semaphore::new(0));
    let ok = || gated(gate.clone(), "done");
    // No prefetch: each node claims exactly its free workers, so the first two claims split
    // the backlog (with prefetch one node may legitimately take all 40).
    let queue = || QueueConfig::default().prefetch(0);
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
        b.queue("default", queue()).handler("w", ok())
    })
    .keep(db.clone());
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "node-b", |b| {
        b.queue("default", queue()).handler("w", ok())
    });
    let ids: Vec<JobId> = a
        .client
        .enqueue_many((0..40).map(|i| NewJob::new("w", json!(i))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    // Both claim at once, each at most its 10 free workers, in chunks (a fetcher claims the
    // next chunk of a full claim by itself). (A claim that fails transiently — a busy
    // database — is simply repeated, as the fetcher's next wake would.)
    let held = |s: &Simulation| {
        let f = s.fetcher("default");
        async move {
            f.send(jobvisor::scheduler::GetFetcherStatus)
                .await
                .unwrap()
                .busy
        }
    };
    for _ in 0..10 {
        tokio::join!(a.fetch("default"), b.fetch("default"));
        if held(&a).await + held(&b).await == 20 {
            break;
        }
    }
    let (na, nb) = (held(&a).await, held(&b).await);
    assert!(
        na <= 10 && nb <= 10,
        "a claimer took more than its free slots: a {na}, b {nb}"
    );
    assert_eq!(na + nb, 20, "each claims its 10 free slots");
    let running = a
        .client
        .list(jobvisor::ListParams {
            state: Some(JobState::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 20, "the database agrees: 20 jobs claimed");
    gate.add_permits(40);
    // Each finished job frees a slot and its fetcher claims again by itself.
    for id in &ids {
        let job = a.client.wait(*id, Duration::from_secs(20)).await.unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Succeeded, 1),
            "every job ran exactly once"
        );
    }
    let finished_a = a.seen().len();
    let _ = (finished_a, b.seen().len());
    a.next_event(|e| matches!(e, Event::Finished { .. })).await;
    b.next_event(|e| matches!(e, Event::Finished { .. })).await;
}

macro_rules! two_node_tests {
    ($($name:ident => $backend:expr),+ $(,)?) => {
        mod two_nodes {
            use super::*;
            $(
                mod $name {
                    use super::*;
                    #[actix::test]
                    async fn reclaim_and_fence_a_zombie() {
                        two_nodes_reclaim_and_fence_a_zombie($backend).await;
                    }
                    #[actix::test]
                    async fn share_a_queue_without_double_claims() {
                        two_nodes_share_a_queue_without_double_claims($backend).await;
                    }
                }
            )+
        }
    };
}

two_node_tests! {
    postgres => Backend::Postgres,
    mysql => Backend::Mysql,
    sqlite => Backend::Sqlite,
}
