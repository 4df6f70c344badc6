//! Simulation tests of the runtime: actors on a real store, a manual clock, ticks sent to
//! mailboxes — no timers, no sleeps. Key scenarios also run with two nodes sharing one
//! database on PostgreSQL, MySQL and SQLite (`two_nodes::*`).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobvisor::clock::Clock as _;
use jobvisor::scheduler::Event;
use jobvisor::testing::{Simulation, StoreEngine as _, TestDb, TokenOf};
use jobvisor::{
    handler_fn, Backend, CancelOutcome, JobError, JobId, JobOutcome, JobState, NewJob,
    ParentPolicy, QueueConfig, RetryPolicy,
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

/// A job given back unstarted keeps its attempt number, so two claims can both run
/// "attempt 1": the claim id tells them apart — in the events, the handler's context and the
/// job's error entries (the sweeper's `not_started` entry names the claim that lost it).
#[actix::test]
async fn two_claims_of_one_attempt_have_two_claim_ids() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    // One worker, busy with the first job: the second waits in the prefetch, never started.
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
        b.queue("default", QueueConfig::default().concurrency(1).prefetch(1))
            .handler("work", gated(gate.clone(), "a"))
    })
    .keep(db.clone());
    let seen_claim = Arc::new(std::sync::Mutex::new(None));
    let seen = seen_claim.clone();
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "node-b", move |b| {
        b.handler(
            "work",
            handler_fn(move |_: Value, ctx: jobvisor::JobContext| {
                *seen.lock().unwrap() = Some((ctx.attempt, ctx.claim_id()));
                async { Err::<JobOutcome, _>(JobError::retry("once more")) }
            }),
        )
    });
    let first = enqueue(&a, NewJob::new("work", json!(1))).await;
    let second = enqueue(&a, NewJob::new("work", json!(2))).await;
    // (The first full claim may claim the next chunk by itself.)
    a.fetch("default").await;
    a.fetch("default").await;
    assert_eq!(
        a.handle.stats().claimed,
        2,
        "one running, one waiting in the prefetch"
    );
    let claimed_by_a = match a
        .next_event(|e| matches!(e, Event::Claimed { id, .. } if *id == second))
        .await
    {
        Event::Claimed { attempt, claim, .. } => (attempt, claim),
        _ => unreachable!(),
    };
    assert_eq!(claimed_by_a.0, 1);
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 2, "both leases expired");
    assert_eq!(b.fetch("default").await, 2);
    b.finished(first).await;
    b.finished(second).await;
    let (attempt_b, claim_b) = seen_claim.lock().unwrap().unwrap();
    let job = b.client.get(second).await.unwrap();
    let entries: Vec<_> = job
        .errors
        .iter()
        .map(|e| (e.code.as_str(), e.attempt, e.claim))
        .collect();
    assert_eq!(
        entries,
        [
            ("not_started", 1, Some(claimed_by_a.1)),
            ("error", 1, Some(claim_b)),
        ],
        "both entries are attempt 1, from two claims"
    );
    assert_eq!(attempt_b, 1);
    assert_ne!(claimed_by_a.1, claim_b);
    gate.add_permits(1);
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
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    // One heartbeat records the handler's start, then A goes silent.
    clock.advance(SEC);
    assert_eq!(a.renew().await.renewed, 1);

    // Before expiry nothing is reclaimed; after it, B's sweeper reclaims with the attempt
    // counted (its start was recorded: it ran).
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
    // Its handler must be running before time moves: a start that found the lease already
    // past its fence margin would give the job back unstarted, and there would be no zombie.
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
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
        .job_finalize_many(jobvisor::testing::FinalizeParams {
            items: vec![jobvisor::testing::Finalize::succeeded(
                id,
                stale,
                json!("zombie"),
            )],
            now: clock.bound_now(),
        })
        .await
        .unwrap();
    assert_eq!(out[0].1, jobvisor::testing::Guarded::LeaseLost);
    let job = b.client.get(id).await.unwrap();
    assert_eq!(
        (job.state, job.lease.unwrap().owner.as_str()),
        (JobState::Running, "other")
    );
}

#[actix::test]
async fn progress_goes_out_with_the_heartbeat_reaches_the_next_attempt_and_not_from_a_zombie() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let (gate, reported) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let (g, r) = (gate.clone(), reported.clone());
    // Node A reports, then waits; let go, it reports again and waits once more.
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", move |b| {
        b.handler(
            "import",
            handler_fn(move |_: Value, ctx: jobvisor::JobContext| {
                let (gate, reported) = (g.clone(), r.clone());
                async move {
                    ctx.progress(json!({"done": 10}))?;
                    assert_eq!(ctx.reported_progress(), Some(json!({"done": 10})));
                    reported.add_permits(1);
                    gate.acquire().await.map_err(JobError::fail)?.forget();
                    ctx.progress(json!({"done": 99}))?;
                    reported.add_permits(1);
                    gate.acquire().await.map_err(JobError::fail)?.forget();
                    JobOutcome::success("zombie")
                }
            }),
        )
    })
    .keep(db.clone());
    // Node B resumes from what the earlier attempt reported.
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "node-b", |b| {
        b.handler(
            "import",
            handler_fn(|_: Value, ctx: jobvisor::JobContext| async move {
                JobOutcome::success(json!({ "resumed_from": ctx.last_progress }))
            }),
        )
    });
    let id = enqueue(&a, NewJob::new("import", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    reported.acquire().await.unwrap().forget();
    assert_eq!(
        a.client.get(id).await.unwrap().progress,
        None,
        "not before a heartbeat"
    );
    clock.advance(SEC);
    let r = a.renew().await;
    assert_eq!(
        (r.renewed, r.statements),
        (1, 1),
        "carried by the heartbeat itself"
    );
    assert_eq!(
        a.client.get(id).await.unwrap().progress,
        Some(json!({"done": 10}))
    );

    // A reports again (before its fence point), then goes silent past its lease; B reclaims
    // and runs the job, resuming at 10: the second report never went out.
    gate.add_permits(1);
    reported.acquire().await.unwrap().forget();
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 1);
    clock.advance(SEC);
    assert_eq!(b.fetch("default").await, 1);
    assert_eq!(b.finished(id).await, JobState::Succeeded);
    let job = b.client.get(id).await.unwrap();
    assert_eq!(job.result, Some(json!({"resumed_from": {"done": 10}})));

    // The zombie's heartbeat carries that report; it is refused and writes nothing.
    let r = a.renew().await;
    assert_eq!((r.renewed, r.lost), (0, 1));
    let job = b.client.get(id).await.unwrap();
    assert_eq!(
        job.progress,
        Some(json!({"done": 10})),
        "the zombie's report is refused"
    );
    // Woken past its fence point, the zombie's handler is not polled again: it never
    // returns its result.
    gate.add_permits(1);
    a.next_event(|e| matches!(e, Event::LeaseLost { .. } | Event::SelfFenced { .. }))
        .await;
    assert_eq!(
        b.client.get(id).await.unwrap().result,
        Some(json!({"resumed_from": {"done": 10}}))
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
                        JobOutcome::snooze(Duration::from_secs(60))
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
    let quick_gate = Arc::new(Semaphore::new(0));
    let sim = Simulation::sqlite(|b| {
        b.handler("stuck", gated(gate.clone(), "never"))
            .handler("quick", gated(quick_gate.clone(), "done"))
    })
    .await;
    let stuck = enqueue(&sim, NewJob::new("stuck", json!({}))).await;
    let quick = enqueue(&sim, NewJob::new("quick", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 2);
    // The quick job finishes while shutdown waits (not before it began: its gate opens only
    // once the wait is under way).
    let handle = sim.handle.clone();
    let shutdown =
        actix::spawn(async move { handle.shutdown_within(Duration::from_secs(1)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    quick_gate.add_permits(1);
    let report = shutdown.await.unwrap();
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
                handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
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
    use jobvisor::testing::internal::PREFETCH_MAX_WAIT;
    use jobvisor::testing::GetFetcherStatus;
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
    sim.next_event(|e| matches!(e, Event::Started { .. })).await;
    sim.advance(24 * SEC);
    assert_eq!(sim.check_deadlines().await, 0);
    sim.advance(SEC); // 25 s without a renewal: within 5 s of expiry
    assert_eq!(sim.check_deadlines().await, 1);
    sim.next_event(|e| matches!(e, Event::SelfFenced { .. }))
        .await;
    // Once its handler has stopped, the job is given back at once as a counted `fenced`
    // failure: it runs again without waiting for its lease to expire and the sweeper (the
    // freed slot makes the fetcher claim it again, with the clock standing still).
    assert_eq!(sim.finished(id).await, JobState::Retrying);
    assert_eq!(sim.sweep().await, 0, "nothing left for the sweeper");
    gate.add_permits(1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    let job = sim.client.get(id).await.unwrap();
    let codes: Vec<&str> = job.errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!((job.attempts, codes), (2, vec!["fenced"]));
}

#[actix::test]
async fn panics_are_failures_that_say_why_and_unknown_kinds_wait_unclaimed() {
    let mut sim = Simulation::sqlite(|b| {
        b.handler(
            "boom",
            handler_fn(|_: Value, _ctx| async move {
                if true {
                    panic!("kaboom");
                }
                JobOutcome::done()
            }),
        )
    })
    .await;
    let boom = enqueue(&sim, NewJob::new("boom", json!({}))).await;
    let nobody = enqueue(&sim, NewJob::new("nobody-handles-this", json!({}))).await;
    assert_eq!(
        sim.fetch("default").await,
        1,
        "only the kind this node runs is claimed"
    );
    assert_eq!(sim.finished(boom).await, JobState::Retrying);
    let e = sim.client.get(boom).await.unwrap().last_error.unwrap();
    assert_eq!(e.code, "panic");
    assert!(e.message.contains("kaboom"), "{}", e.message);
    // A kind no handler is registered for waits for a node that has one.
    let job = sim.client.get(nobody).await.unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
    assert!(job.last_error.is_none());
}

#[actix::test]
async fn bad_scheduler_config_names_the_field() {
    let store = TestDb::create(Backend::Sqlite).await;
    let s = store.store().await;
    let err = jobvisor::Scheduler::builder(s.clone())
        .queue("q", QueueConfig::default().concurrency(0))
        .handler(
            "k",
            handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
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
            handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
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
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
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
    let claim = actix_rt::spawn(a.fetcher("default").send(jobvisor::testing::FetchNow));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 29 s pass while the claim waits (a slow commit, a stalled network, a paused VM)...
    clock.advance(29 * SEC);
    locker.batch_execute("COMMIT").unwrap();
    assert_eq!(claim.await.unwrap().unwrap(), 1);
    // A's fetcher would happily claim the job again once it is back; keep A out of the race.
    a.fetcher("default")
        .send(jobvisor::testing::StopClaiming)
        .await
        .unwrap();
    // ...so by A's own, conservative, reckoning (send time + 30 s) less than the fence margin
    // is left: A never starts the handler and gives the job back at once, attempt refunded.
    let dropped = a
        .next_event(|e| matches!(e, Event::Dropped { .. } | Event::Started { .. }))
        .await;
    assert!(
        matches!(dropped, Event::Dropped { .. }),
        "fenced at birth: {dropped:?}"
    );
    let id = a
        .client
        .list(jobvisor::ListParams::default())
        .await
        .unwrap()[0]
        .id;
    assert_eq!(a.finished(id).await, JobState::Pending);
    let job = a.client.get(id).await.unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
    clock.advance(2 * SEC);
    assert_eq!(a.check_deadlines().await, 0, "nothing left to fence");
    assert_eq!(b.sweep().await, 0, "no lease to wait for");
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
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    clock.advance(SEC);
    let r = a.renew().await;
    assert_eq!(r.renewed, 1, "records the start: {r:?}");
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

/// A rolling deploy: the old node lacks the new kind `b`, which is enqueued before any node
/// that runs it is up. The old node never claims it (no attempt burnt), reports it as
/// unserved, and the new node runs it on its first attempt.
async fn two_nodes_rolling_deploy_burns_no_attempt(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let mut old = Simulation::on_store(db.store().await, clock.clone(), "old", |b| {
        b.handler("a", quick("old ran a"))
    })
    .keep(db.clone());
    old.node_heartbeat().await;
    let new_kind: Vec<JobId> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(enqueue(&old, NewJob::new("b", json!({ "i": i })).max_attempts(1)).await);
        }
        v
    };
    let a = enqueue(&old, NewJob::new("a", json!({}))).await;
    assert_eq!(
        old.fetch("default").await,
        1,
        "the old node claims only what it runs"
    );
    assert_eq!(old.finished(a).await, JobState::Succeeded);
    assert_eq!(old.fetch("default").await, 0);
    for id in &new_kind {
        let j = old.client.get(*id).await.unwrap();
        assert_eq!(
            (j.state, j.attempts),
            (JobState::Pending, 0),
            "no attempt burnt"
        );
    }

    // Past `unserved_after` (5 min by default) the old node names them, and why.
    clock.advance(6 * 60 * SEC);
    old.node_heartbeat().await;
    assert_eq!(old.check_unserved().await, 1);
    let e = old.next_event(|e| matches!(e, Event::Unserved(_))).await;
    let Event::Unserved(u) = e else {
        unreachable!()
    };
    assert_eq!(
        (u.queue.as_str(), u.kind.as_str(), u.jobs),
        ("default", "b", 3)
    );
    assert_eq!(u.reason, jobvisor::UnservedReason::NoNodeHasKind);

    // The new node comes up and runs them, each on its first attempt.
    let mut new = Simulation::on_store(db.store().await, clock.clone(), "new", |b| {
        b.handler("a", quick("new ran a"))
            .handler("b", quick("new ran b"))
    });
    new.node_heartbeat().await;
    assert_eq!(new.fetch("default").await, 3);
    for id in &new_kind {
        assert_eq!(new.finished(*id).await, JobState::Succeeded);
        let j = new.client.get(*id).await.unwrap();
        assert_eq!((j.attempts, j.result), (1, Some(json!("new ran b"))));
    }
    assert_eq!(
        old.check_unserved().await,
        0,
        "nothing waits unserved any more"
    );
    let nodes = new.client.nodes().await.unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["new", "old"]);
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
            f.send(jobvisor::testing::GetFetcherStatus)
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

/// Two nodes, one database: one leads and does the leader-only work (it counts the gauges;
/// the other only reads them). Silent past its lease — frozen, cut off —, the leader stops
/// acting as leader on its own estimate, and the other node takes over under a new term at its
/// first attempt after the lease ran out (so within the lease plus one elector tick); the old
/// leader learns it lost at its next attempt. A leader that shuts down resigns: the other
/// takes over at once, not a lease later.
async fn two_nodes_elect_one_leader_take_over_and_hand_over(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let noop = || handler_fn(|_: Value, _ctx| async { JobOutcome::success("ok") });
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "node-a", |b| {
        b.handler("noop", noop())
    });
    let mut b = Simulation::on_store(db.store().await, clock.clone(), "node-b", |b| {
        b.handler("noop", noop())
    });
    assert_eq!(a.client.leader().await.unwrap(), None);

    assert_eq!(a.elect().await, Some(1));
    assert_eq!(b.elect().await, None, "one leader");
    a.next_event(|e| matches!(e, Event::LeaderElected { term: 1 }))
        .await;
    assert_eq!(a.handle.leader_term(), Some(1));
    assert_eq!(b.handle.leader_term(), None);
    assert!(a.refresh_gauges().await.unwrap(), "the leader counts");
    assert!(!b.refresh_gauges().await.unwrap(), "the other reads");
    let leader = b.client.leader().await.unwrap().unwrap();
    assert_eq!((leader.node.as_str(), leader.term), ("node-a", 1));

    // Renewed every third of the lease (10 s): still the leader.
    clock.advance(3 * SEC);
    assert_eq!(a.elect().await, Some(1));
    assert_eq!(b.elect().await, None);

    // Node A goes silent. Before its lease ends in the database, it no longer counts itself
    // leader; at the end, B takes over with a new term.
    clock.advance(9 * SEC);
    assert_eq!(
        a.handle.leader_term(),
        None,
        "its own estimate ran out first"
    );
    assert_eq!(b.elect().await, None, "the lease still runs (to 13 s)");
    clock.advance(SEC);
    assert_eq!(b.elect().await, Some(2), "taken over as the lease ends");
    b.next_event(|e| matches!(e, Event::LeaderElected { term: 2 }))
        .await;
    clock.advance(3 * SEC);
    assert!(
        !a.refresh_gauges().await.unwrap(),
        "the old leader only reads"
    );
    assert!(b.refresh_gauges().await.unwrap(), "the new one counts");
    assert_eq!(
        a.elect().await,
        None,
        "A wakes up: no renewal, no take-over"
    );
    let lost = a
        .next_event(|e| matches!(e, Event::LeaderLost { .. }))
        .await;
    assert!(
        matches!(
            lost,
            Event::LeaderLost {
                term: 1,
                reason: "not_renewed"
            }
        ),
        "{lost:?}"
    );

    // B shuts down: it resigns, and A takes over at its next attempt, at the same instant.
    b.handle.shutdown_within(SEC).await;
    b.next_event(|e| {
        matches!(
            e,
            Event::LeaderLost {
                term: 2,
                reason: "resigned"
            }
        )
    })
    .await;
    assert_eq!(a.elect().await, Some(3));
    let leader = a.client.leader().await.unwrap().unwrap();
    assert_eq!((leader.node.as_str(), leader.term), ("node-a", 3));
}

/// A finalization the database refuses (here a trigger; on MariaDB a deadlock with another
/// node's claim did it) is written again by the lease manager's own timer, with no other
/// message to prompt it: the node's deadline checks are driven by hand here and never run.
/// (Before the fix the refused write waited for the next deadline check, and in this
/// simulation forever — the job stayed `running` with both nodes alive.)
async fn a_refused_finalization_is_written_again_by_itself(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock, "node-a", |b| {
        b.handler("w", gated(gate.clone(), "done"))
    })
    .keep(db.clone());
    let id = enqueue(&a, NewJob::new("w", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    let (refuse, allow) = match backend {
        Backend::Postgres => (
            "CREATE FUNCTION jv_refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
             CREATE TRIGGER jv_refuse BEFORE UPDATE ON jobvisor_jobs FOR EACH ROW \
             WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION jv_refuse()",
            "DROP TRIGGER jv_refuse ON jobvisor_jobs",
        ),
        Backend::Mysql => (
            "CREATE TRIGGER jv_refuse BEFORE UPDATE ON jobvisor_jobs FOR EACH ROW \
             BEGIN IF NEW.state = 'succeeded' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END",
            "DROP TRIGGER jv_refuse",
        ),
        Backend::Sqlite => (
            "CREATE TRIGGER jv_refuse BEFORE UPDATE ON jobvisor_jobs FOR EACH ROW \
             WHEN NEW.state = 'succeeded' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
            "DROP TRIGGER jv_refuse",
        ),
    };
    let store = db.store().await;
    jobvisor::testing::exec_sql(&store, refuse).await.unwrap();
    gate.add_permits(1);
    a.next_event(|e| {
        matches!(
            e,
            Event::StoreUnavailable {
                actor: "lease_manager",
                ..
            }
        )
    })
    .await;
    assert_eq!(a.client.get(id).await.unwrap().state, JobState::Running);
    jobvisor::testing::exec_sql(&store, allow).await.unwrap();
    let job = a.client.wait(id, 10 * SEC).await.unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Succeeded, 1),
        "written again once the database accepts it"
    );
}

/// A job shorter than a heartbeat: no renewal recorded its start, so its finalization does —
/// `started_at` and `first_started_at` are the handler's start, not null.
async fn a_quick_jobs_start_is_written_with_its_finalization(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::on_store(db.store().await, clock.clone(), "quick", |b| {
        b.handler("work", gated(gate.clone(), "done"))
    })
    .keep(db.clone());
    let id = enqueue(&sim, NewJob::new("work", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    sim.next_event(|e| matches!(e, Event::Started { id: i, .. } if *i == id))
        .await;
    let started = clock.now();
    // Two seconds of handler time and no heartbeat: the database has no start yet.
    clock.advance(2 * SEC);
    let running = sim.client.get(id).await.unwrap();
    assert_eq!((running.started_at, running.first_started_at), (None, None));
    gate.add_permits(1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(
        (job.started_at, job.first_started_at),
        (Some(started), Some(started)),
        "the start as the node saw it, written by the finalization"
    );
    assert_eq!(
        job.finished_at,
        Some(started + chrono::Duration::seconds(2))
    );
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
                    #[actix::test]
                    async fn rolling_deploy_burns_no_attempt() {
                        two_nodes_rolling_deploy_burns_no_attempt($backend).await;
                    }
                    #[actix::test]
                    async fn write_a_refused_finalization_again_by_themselves() {
                        a_refused_finalization_is_written_again_by_itself($backend).await;
                    }
                    #[actix::test]
                    async fn write_a_quick_jobs_start_with_its_finalization() {
                        a_quick_jobs_start_is_written_with_its_finalization($backend).await;
                    }
                    #[actix::test]
                    async fn elect_one_leader_take_over_and_hand_over() {
                        two_nodes_elect_one_leader_take_over_and_hand_over($backend).await;
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

// ---- retention: dead letters outlive successes, on every backend --------------------------

async fn dead_jobs_stay_in_the_live_table_for_weeks_successes_for_a_day(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let mut sim = Simulation::on_store(db.store().await, clock, "archiver", |b| {
        b.handler(
            "ok",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("ok") }),
        )
        .handler(
            "broken",
            handler_fn(|_: Value, _ctx| async { Err::<JobOutcome, _>(JobError::fail("broken")) }),
        )
    })
    .keep(db.clone());
    let ok = enqueue(&sim, NewJob::new("ok", json!({}))).await;
    let dead = enqueue(&sim, NewJob::new("broken", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 2);
    assert_eq!(sim.finished(ok).await, JobState::Succeeded);
    assert_eq!(sim.finished(dead).await, JobState::Dead);
    let day = 24 * 3600 * SEC;
    let cfg = jobvisor::SchedulerConfig::default();
    assert_eq!(
        (cfg.archive_after, cfg.archive_dead_after, cfg.prune_after),
        (day, 28 * day, 7 * day),
        "the documented defaults"
    );

    sim.advance(day + SEC);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (1, 0), "only the success: {r:?}");
    assert!(sim.client.get(ok).await.unwrap().archived_at.is_some());
    let d = sim.client.get(dead).await.unwrap();
    assert_eq!((d.state, d.archived_at), (JobState::Dead, None));

    // Day 27: the dead job still waits in the live table; the archived success is pruned.
    sim.advance(26 * day);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (0, 1), "{r:?}");
    assert_eq!(sim.client.get(dead).await.unwrap().archived_at, None);

    // Past 28 days it is archived too.
    sim.advance(day);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (1, 0), "{r:?}");
    let d = sim.client.get(dead).await.unwrap();
    assert_eq!(d.state, JobState::Dead);
    assert!(d.archived_at.is_some());
}

/// A shorter dead-letter retention set by the user is honoured.
async fn dead_job_retention_is_configurable(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let hour = 3600 * SEC;
    let mut sim = Simulation::on_store(db.store().await, clock, "archiver", |b| {
        b.config(
            jobvisor::testing::sim_config()
                .archive_after(hour)
                .archive_dead_after(3 * hour),
        )
        .handler(
            "broken",
            handler_fn(|_: Value, _ctx| async { Err::<JobOutcome, _>(JobError::fail("broken")) }),
        )
    })
    .keep(db.clone());
    let dead = enqueue(&sim, NewJob::new("broken", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(dead).await, JobState::Dead);
    sim.advance(2 * hour);
    assert_eq!(sim.archive().await.moved, 0);
    sim.advance(hour + SEC);
    assert_eq!(sim.archive().await.moved, 1);
}

macro_rules! retention_tests {
    ($($name:ident => $backend:expr),+ $(,)?) => {
        mod retention {
            use super::*;
            $(
                mod $name {
                    use super::*;
                    #[actix::test]
                    async fn dead_jobs_outlive_successes() {
                        dead_jobs_stay_in_the_live_table_for_weeks_successes_for_a_day($backend)
                            .await;
                    }
                    #[actix::test]
                    async fn dead_job_retention_is_configurable() {
                        super::super::dead_job_retention_is_configurable($backend).await;
                    }
                }
            )+
        }
    };
}

retention_tests! {
    postgres => Backend::Postgres,
    mysql => Backend::Mysql,
    sqlite => Backend::Sqlite,
}

// ---- the lease model: timeouts from the start, refunds, the start gate, per-attempt answers

/// A quick handler that succeeds with `result`.
fn quick(result: &'static str) -> impl jobvisor::JobHandler {
    handler_fn(move |_: Value, _ctx| async move { JobOutcome::success(result) })
}

/// Waits until the fetcher has claimed every job in `ids` (a claim is at most half the
/// budget; a full claim makes the fetcher claim the next chunk by itself).
async fn claim_all(sim: &mut Simulation, ids: &[JobId]) {
    sim.fetch("default").await;
    for id in ids {
        sim.next_event(|e| matches!(e, Event::Claimed { id: i, .. } if i == id))
            .await;
    }
}

fn codes(job: &jobvisor::Job) -> Vec<&str> {
    job.errors.iter().map(|e| e.code.as_str()).collect()
}

#[actix::test]
async fn a_prefetched_job_behind_long_ones_is_never_timed_out_before_it_starts() {
    // One worker; a long job first, then a short job with a 1 s timeout and one attempt,
    // waiting in the prefetch far longer than claim + lease + timeout.
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::sqlite(|b| {
        b.queue("default", QueueConfig::default().concurrency(1))
            .handler("long", gated(gate.clone(), "long"))
            .handler("short", quick("short"))
    })
    .await;
    let long = enqueue(&sim, NewJob::new("long", json!({})).priority(0)).await;
    let short = enqueue(
        &sim,
        NewJob::new("short", json!({}))
            .priority(1)
            .timeout(SEC)
            .max_attempts(1),
    )
    .await;
    claim_all(&mut sim, &[long, short]).await;
    sim.next_event(|e| matches!(e, Event::Started { id, .. } if *id == long))
        .await;
    for _ in 0..6 {
        sim.advance(10 * SEC);
        let r = sim.renew().await;
        assert_eq!(r.renewed, 2, "{r:?} {:#?}", sim.seen());
        assert_eq!(
            sim.sweep().await,
            0,
            "a renewed, unstarted job is not over time"
        );
        assert_eq!(sim.check_deadlines().await, 0);
    }
    let waiting = sim.client.get(short).await.unwrap();
    assert_eq!(
        (waiting.state, waiting.started_at, waiting.timeout_at),
        (JobState::Running, None, None),
        "no start recorded, so no timeout deadline"
    );
    gate.add_permits(1);
    assert_eq!(sim.finished(long).await, JobState::Succeeded);
    assert_eq!(sim.finished(short).await, JobState::Succeeded);
    let job = sim.client.get(short).await.unwrap();
    assert_eq!((job.attempts, job.errors.len()), (1, 0));
}

#[actix::test]
async fn a_started_jobs_timeout_is_recorded_and_the_sweeper_backstops_it() {
    // A node that keeps renewing while its handler runs far past its timeout (its deadline
    // checks never run): the sweeper reclaims the job once recorded start + timeout + grace
    // (lease + cancel grace) has passed, never before.
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "stuck", |b| {
        b.handler("work", gated(gate.clone(), "late"))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "sweeper", |b| {
        b.handler("other", quick("x"))
    });
    let id = enqueue(&a, NewJob::new("work", json!({})).timeout(10 * SEC)).await;
    a.fetch("default").await;
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    let started = clock.now();
    clock.advance(2 * SEC);
    assert_eq!(a.renew().await.renewed, 1);
    let job = a.client.get(id).await.unwrap();
    assert_eq!(
        job.started_at,
        Some(started),
        "the start as the node saw it"
    );
    assert_eq!(job.first_started_at, Some(started));
    let deadline = started + chrono::Duration::seconds(10 + 30 + 5);
    assert_eq!(job.timeout_at, Some(deadline));
    while clock.now() < deadline {
        clock.advance(5 * SEC);
        a.renew().await;
        let expect = usize::from(clock.now() > deadline);
        assert_eq!(b.sweep().await, expect, "at {}", clock.now());
    }
    let job = b.client.get(id).await.unwrap();
    assert_eq!(
        (job.state, codes(&job)),
        (JobState::Retrying, vec!["timeout"])
    );
    assert_eq!(job.attempts, 1);
    gate.add_permits(1);
}

#[actix::test]
async fn a_dead_nodes_prefetched_jobs_keep_their_attempts() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "dies", |b| {
        b.queue("default", QueueConfig::default().concurrency(1))
            .handler("long", gated(gate.clone(), "A"))
            .handler("short", gated(gate.clone(), "A"))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "lives", |b| {
        b.handler("long", quick("B")).handler("short", quick("B"))
    });
    let long = enqueue(&a, NewJob::new("long", json!({})).priority(0)).await;
    let s1 = enqueue(
        &a,
        NewJob::new("short", json!(1)).priority(1).max_attempts(1),
    )
    .await;
    b.fetcher("default")
        .send(jobvisor::testing::StopClaiming)
        .await
        .unwrap();
    claim_all(&mut a, &[long, s1]).await;
    a.next_event(|e| matches!(e, Event::Started { id, .. } if *id == long))
        .await;
    clock.advance(SEC);
    assert_eq!(a.renew().await.renewed, 2, "records the long job's start");
    // A dies: no more heartbeats. Its leases expire.
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 2);
    let started = b.client.get(long).await.unwrap();
    assert_eq!(
        (started.state, started.attempts, codes(&started)),
        (JobState::Retrying, 1, vec!["lease_expired"]),
        "it ran: the attempt counts"
    );
    for id in [s1] {
        let j = b.client.get(id).await.unwrap();
        assert_eq!(
            (j.state, j.attempts, j.refunds, codes(&j)),
            (JobState::Pending, 0, 1, vec!["not_started"]),
            "never started: its attempt is given back"
        );
        assert_eq!(
            j.errors[0].detail,
            Some(json!({"owner": "dies"})),
            "the reclaim names the node that held it"
        );
    }
    // Another node runs them: the short one on its first counted attempt.
    let mut b2 = Simulation::on_store(db.store().await, clock.clone(), "lives-2", |b| {
        b.handler("long", quick("B")).handler("short", quick("B"))
    });
    clock.advance(2 * SEC);
    b2.fetch("default").await;
    for id in [long, s1] {
        assert_eq!(b2.finished(id).await, JobState::Succeeded);
    }
    let j = b2.client.get(s1).await.unwrap();
    assert_eq!((j.attempts, j.result), (1, Some(json!("B"))));
    drop((a, b));
    gate.add_permits(10);
}

#[actix::test]
async fn a_frozen_node_starts_no_handler_for_a_job_reclaimed_meanwhile() {
    // A holds a running job and a prefetched one behind it; it freezes (no timers, no
    // heartbeat) past its lease; B reclaims both and runs them. When A resumes, the running
    // handler's result is refused, and the prefetched job must not start on A at all.
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(db.store().await, clock.clone(), "frozen", |b| {
        b.queue("default", QueueConfig::default().concurrency(1))
            .handler("work", gated(gate.clone(), "A"))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "other", |b| {
        b.handler("work", quick("B"))
    });
    b.fetcher("default")
        .send(jobvisor::testing::StopClaiming)
        .await
        .unwrap();
    let first = enqueue(&a, NewJob::new("work", json!(1)).priority(0)).await;
    let second = enqueue(&a, NewJob::new("work", json!(2)).priority(1)).await;
    claim_all(&mut a, &[first, second]).await;
    a.next_event(|e| matches!(e, Event::Started { id, .. } if *id == first))
        .await;
    a.fetcher("default")
        .send(jobvisor::testing::StopClaiming)
        .await
        .unwrap();
    // Frozen for 31 s: B's sweeper reclaims both and B runs them.
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 2);
    let mut b2 = Simulation::on_store(db.store().await, clock.clone(), "other-2", |b| {
        b.handler("work", quick("B"))
    });
    b2.fetch("default").await;
    for id in [first, second] {
        assert_eq!(b2.finished(id).await, JobState::Succeeded);
    }
    // A resumes: its worker frees up, and the prefetched job's lease estimate has expired.
    gate.add_permits(1);
    let e = a
        .next_event(
            |e| matches!(e, Event::Dropped { id, .. } | Event::Started { id, .. } if *id == second),
        )
        .await;
    assert!(
        matches!(e, Event::Dropped { .. }),
        "a frozen node started a handler without a lease: {e:?}"
    );
    a.next_event(|e| matches!(e, Event::LeaseLost { id, .. } if *id == first))
        .await;
    let j = b2.client.get(second).await.unwrap();
    assert_eq!((j.state, j.result), (JobState::Succeeded, Some(json!("B"))));
    drop(b);
}

#[actix::test]
async fn a_detected_pause_holds_starts_until_a_fresh_renewal_answers() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    // A 1.2 s lease (fence margin 0.2 s); the deadline timer is due every 200 ms. A freeze
    // is a real-time event, so this test really waits, 0.7 s.
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::on_store(db.store().await, clock, "paused", |b| {
        b.config(
            jobvisor::testing::sim_config()
                .lease(Duration::from_millis(1200))
                .renew_every(Duration::from_millis(400)),
        )
        .queue("default", QueueConfig::default().concurrency(1))
        .handler("work", gated(gate.clone(), "x"))
    })
    .keep(db.clone());
    let first = enqueue(&sim, NewJob::new("work", json!(1)).priority(0)).await;
    let second = enqueue(&sim, NewJob::new("work", json!(2)).priority(1)).await;
    claim_all(&mut sim, &[first, second]).await;
    sim.next_event(|e| matches!(e, Event::Started { id, .. } if *id == first))
        .await;
    assert_eq!(sim.check_deadlines().await, 0);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Another process holds SQLite's write lock: the revalidating renewal cannot answer yet.
    let path = db.url.strip_prefix("sqlite://").unwrap().to_string();
    let mut locker = diesel::SqliteConnection::establish(&path).unwrap();
    locker.batch_execute("BEGIN IMMEDIATE").unwrap();
    assert_eq!(sim.check_deadlines().await, 0);
    let paused = sim
        .next_event(|e| matches!(e, Event::PauseDetected { .. }))
        .await;
    assert!(
        matches!(paused, Event::PauseDetected { late_by } if late_by >= Duration::from_millis(300))
    );
    // The worker frees up; the prefetched job's estimate holds, but the node revalidates first.
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !sim.seen()
            .iter()
            .chain(std::iter::once(&Event::LeasesRenewed {
                renewed: 0,
                lost: 0
            }))
            .take_while(|e| !matches!(e, Event::LeasesRenewed { .. }))
            .any(|e| matches!(e, Event::Started { id, .. } if *id == second)),
        "started while its lease was being revalidated"
    );
    locker.batch_execute("COMMIT").unwrap();
    let e = sim
        .next_event(|e| {
            matches!(e, Event::LeasesRenewed { .. })
                || matches!(e, Event::Started { id, .. } if *id == second)
        })
        .await;
    assert!(
        matches!(e, Event::LeasesRenewed { .. }),
        "started before revalidating: {e:?}"
    );
    gate.add_permits(1);
    assert_eq!(sim.finished(second).await, JobState::Succeeded);
}

/// Sets its flag when dropped: the handler future was stopped (or returned).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[actix::test]
async fn a_handler_stops_in_time_while_the_actors_arbiter_is_blocked() {
    // The application shares the actors' arbiter and can block it (a synchronous call in one
    // of its own actors, a starved thread). The lease manager's deadline check cannot run
    // then, so the handler's own task must stop it before its lease can expire. A 1.2 s
    // lease (fence margin 0.2 s): the task's watch wakes 1 s after the start, the clock has
    // moved 1.05 s by then, and the arbiter — this test's thread — is blocked throughout.
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let mut sim = Simulation::sqlite(|b| {
        b.config(
            jobvisor::testing::sim_config()
                .lease(Duration::from_millis(1200))
                .renew_every(Duration::from_millis(400)),
        )
        .queue("default", QueueConfig::default().concurrency(1))
        .handler(
            "work",
            handler_fn(move |_: Value, _ctx| {
                let guard = SetOnDrop(flag.clone());
                async move {
                    let _guard = guard;
                    // Ignores cancellation: only dropping its future stops it.
                    std::future::pending::<()>().await;
                    JobOutcome::success("never")
                }
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("work", json!({}))).await;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Started { .. })).await;
    sim.advance(Duration::from_millis(1050));
    let blocked = std::time::Instant::now();
    while !stopped.load(Ordering::SeqCst) && blocked.elapsed() < 3 * SEC {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        stopped.load(Ordering::SeqCst),
        "the handler ran on past its fence margin while the arbiter was blocked"
    );
    // Once the arbiter runs again: given back as a counted `fenced` failure, announced once
    // even though the deadline check finds the lease short too.
    assert_eq!(sim.finished(id).await, JobState::Retrying);
    sim.check_deadlines().await;
    let job = sim.client.get(id).await.unwrap();
    let codes: Vec<&str> = job.errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, vec!["fenced"]);
    let fences = sim
        .seen()
        .iter()
        .filter(|e| matches!(e, Event::SelfFenced { .. }))
        .count();
    assert_eq!(fences, 1, "{:?}", sim.seen());
}

#[actix::test]
async fn an_actor_stopped_with_a_sqlite_call_in_flight_neither_panics_nor_blocks() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    // Another process holds SQLite's write lock, so the node's renewal waits in SQLite's busy
    // handler on a blocking thread when its lease manager is stopped (as at the end of a
    // shutdown), dropping the renewal's future on the arbiter — a current-thread runtime,
    // which refuses to block in place: that drop must let the call run on, not panic (the
    // panic took the actor down, and a node so stopped never finished shutting down).
    let blocking_panics = Arc::new(AtomicU32::new(0));
    let seen = blocking_panics.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("blocking") {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let gate = Arc::new(Semaphore::new(0));
    let mut sim = Simulation::on_store(
        db.store().await,
        jobvisor::clock::ManualClock::at_fixed_start(),
        "stopping",
        |b| b.handler("work", gated(gate.clone(), "x")),
    )
    .keep(db.clone());
    let id = enqueue(&sim, NewJob::new("work", json!({}))).await;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Started { .. })).await;
    let path = db.url.strip_prefix("sqlite://").unwrap().to_string();
    let mut locker = diesel::SqliteConnection::establish(&path).unwrap();
    locker.batch_execute("BEGIN IMMEDIATE").unwrap();
    let lm = sim.lease_manager();
    lm.do_send(jobvisor::testing::RenewLeases);
    tokio::time::sleep(Duration::from_millis(200)).await;
    sim.stop_lease_manager();
    // The arbiter goes on (reads do not wait for the writer under WAL), lock still held.
    let job = tokio::time::timeout(2 * SEC, sim.client.get(id))
        .await
        .expect("the arbiter is not blocked")
        .unwrap();
    assert_eq!(job.state, JobState::Running);
    locker.batch_execute("COMMIT").unwrap();
    assert_eq!(
        blocking_panics.load(Ordering::SeqCst),
        0,
        "dropping an unfinished SQLite call panicked"
    );
    // The renewal ran to its end on its blocking thread; its connection was closed, and the
    // store's next writes get fresh ones.
    let other = enqueue(&sim, NewJob::new("work", json!(2))).await;
    assert_eq!(
        sim.client.get(other).await.unwrap().state,
        JobState::Pending
    );
    gate.add_permits(1);
}

// ---- answers that arrive late: each applies only to the attempt whose token it carried ---

/// PostgreSQL: the next UPDATE of the job table whose text matches `pattern` (a `LIKE`
/// pattern) waits `secs` before it reads any row — a statement-level trigger — so its answer
/// comes back late, as over a stalled network, while other statements go on.
async fn delay_next_update(db: &TestDb, pattern: &str, secs: f64) {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    let mut c = AsyncPgConnection::establish(&db.url).await.unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS sim_delay (pattern TEXT NOT NULL, seconds FLOAT8 NOT NULL);
         CREATE OR REPLACE FUNCTION sim_delay() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE d FLOAT8;
         BEGIN
             DELETE FROM sim_delay WHERE ctid = (
                 SELECT ctid FROM sim_delay WHERE current_query() LIKE pattern
                 LIMIT 1 FOR UPDATE SKIP LOCKED)
             RETURNING seconds INTO d;
             IF d IS NOT NULL THEN PERFORM pg_sleep(d); END IF;
             RETURN NULL;
         END $$;
         DROP TRIGGER IF EXISTS sim_delay ON jobvisor_jobs;
         CREATE TRIGGER sim_delay BEFORE UPDATE ON jobvisor_jobs
             FOR EACH STATEMENT EXECUTE FUNCTION sim_delay();
         INSERT INTO sim_delay VALUES ('{pattern}', {secs});"
    ))
    .await
    .unwrap();
}

/// A store that waits 10 s for an answer: long enough for the delays these tests inject
/// (the default bound, 1.5 s, would give up on them, as it should on a real network).
async fn patient_store(db: &TestDb) -> jobvisor::Store {
    db.store_with(jobvisor::StoreOptions::default().statement_timeout(10 * SEC))
        .await
}

/// The renewal statement (it carries the starts as `v.ago`).
const RENEWAL: &str = "%v.ago%";
/// The finalization statement (it gives attempts back as `v.refund`).
const FINALIZATION: &str = "%v.refund%";

/// A handler whose first call returns at once and whose later calls wait for `gate`.
fn first_quick_then_gated(gate: Arc<Semaphore>) -> impl jobvisor::JobHandler {
    let calls = Arc::new(AtomicU32::new(0));
    handler_fn(move |_: Value, _ctx| {
        let (gate, n) = (gate.clone(), calls.fetch_add(1, Ordering::SeqCst));
        async move {
            if n > 0 {
                let _permit = gate.acquire().await.map_err(JobError::fail)?;
            }
            JobOutcome::success(if n == 0 { "first" } else { "later" })
        }
    })
}

#[actix::test]
async fn a_renewal_landing_after_the_give_back_changes_nothing() {
    let db = Arc::new(TestDb::create(Backend::Postgres).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(patient_store(&db).await, clock.clone(), "cut-off", |b| {
        b.handler("work", gated(gate.clone(), "A"))
    })
    .keep(db.clone());
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    a.fetcher("default")
        .send(jobvisor::testing::StopClaiming)
        .await
        .unwrap();
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    // A heartbeat goes out and hangs (a stalled network)...
    delay_next_update(&db, RENEWAL, 2.0).await;
    let late = actix_rt::spawn(a.lease_manager().send(jobvisor::testing::RenewLeases));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...meanwhile A's estimate reaches the fence margin: it stops the handler and gives the
    // job back, which reaches the database first.
    clock.advance(26 * SEC);
    assert_eq!(a.check_deadlines().await, 1);
    assert_eq!(a.finished(id).await, JobState::Retrying);
    // The heartbeat lands afterwards: it matches nothing and extends nothing.
    let r = late.await.unwrap().unwrap();
    assert_eq!((r.renewed, r.lost), (0, 1));
    let job = a.client.get(id).await.unwrap();
    assert_eq!(
        (job.state, job.lease.is_none(), codes(&job)),
        (JobState::Retrying, true, vec!["fenced"])
    );
    assert_eq!(
        job.run_at,
        clock.now(),
        "claimable at once, not a lease later"
    );
    gate.add_permits(1);
}

#[actix::test]
async fn a_stale_renewal_answer_leaves_the_newer_attempt_alone() {
    let db = Arc::new(TestDb::create(Backend::Postgres).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(patient_store(&db).await, clock.clone(), "node-a", |b| {
        b.queue("default", QueueConfig::default().concurrency(1))
            .handler("work", gated(gate.clone(), "A"))
    })
    .keep(db.clone());
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    // Attempt 1's heartbeat hangs; attempt 1 is fenced and given back, and A claims the job
    // again at once (attempt 2) — all before the heartbeat's answer arrives.
    delay_next_update(&db, RENEWAL, 2.0).await;
    let late = actix_rt::spawn(a.lease_manager().send(jobvisor::testing::RenewLeases));
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.advance(26 * SEC);
    assert_eq!(a.check_deadlines().await, 1);
    assert_eq!(a.finished(id).await, JobState::Retrying);
    a.next_event(|e| matches!(e, Event::Claimed { id: i, attempt: 2, .. } if *i == id))
        .await;
    a.next_event(|e| matches!(e, Event::Started { id: i, attempt: 2, .. } if *i == id))
        .await;
    // The stale answer: attempt 1's lease is lost. It must not touch attempt 2's.
    let r = late.await.unwrap().unwrap();
    assert_eq!((r.renewed, r.lost), (0, 1));
    assert!(
        !a.seen()
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id)),
        "attempt 2 was treated as lost"
    );
    let r = a.renew().await;
    assert_eq!((r.renewed, r.lost), (1, 0), "attempt 2 is still renewed");
    gate.add_permits(1);
    assert_eq!(a.finished(id).await, JobState::Succeeded);
    let job = a.client.get(id).await.unwrap();
    assert_eq!((job.attempts, codes(&job)), (2, vec!["fenced"]));
}

#[actix::test]
async fn a_stale_finalization_answer_leaves_the_newer_attempt_alone() {
    let db = Arc::new(TestDb::create(Backend::Postgres).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(patient_store(&db).await, clock.clone(), "node-a", |b| {
        b.handler("work", first_quick_then_gated(gate.clone()))
    })
    .keep(db.clone());
    let b = Simulation::on_store(db.store().await, clock.clone(), "sweeper", |b| {
        b.handler("other", quick("x"))
    });
    // Attempt 1 succeeds at once, but its finalization hangs before it reaches the row...
    delay_next_update(&db, FINALIZATION, 2.0).await;
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...while the lease expires, the sweeper reclaims the job and A claims it again.
    clock.advance(31 * SEC);
    assert_eq!(b.sweep().await, 1);
    assert_eq!(a.fetch("default").await, 1);
    a.next_event(|e| matches!(e, Event::Started { id: i, .. } if *i == id))
        .await;
    a.next_event(|e| matches!(e, Event::Started { id: i, .. } if *i == id))
        .await;
    // The stale finalization is refused (attempt 1's token is gone). Attempt 2 keeps its
    // lease: it is renewed, and its own result is written.
    a.next_event(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id))
        .await;
    let r = a.renew().await;
    assert_eq!((r.renewed, r.lost), (1, 0), "attempt 2's lease was dropped");
    gate.add_permits(1);
    assert_eq!(a.finished(id).await, JobState::Succeeded);
    let job = a.client.get(id).await.unwrap();
    assert_eq!(job.result, Some(json!("later")));
}

/// A node on PostgreSQL whose one job is running: claimed at the clock's start, so its fence
/// point is 25 s (30 s lease, 5 s margin), renewed every 10 s, a renewal overdue after 1 s.
async fn one_running_job() -> (Arc<TestDb>, Simulation, Arc<Semaphore>, JobId) {
    let db = Arc::new(TestDb::create(Backend::Postgres).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let mut a = Simulation::on_store(patient_store(&db).await, clock, "node-a", |b| {
        b.queue("default", QueueConfig::default().concurrency(1))
            .handler("work", gated(gate.clone(), "A"))
    })
    .keep(db.clone());
    let id = enqueue(&a, NewJob::new("work", json!({}))).await;
    assert_eq!(a.fetch("default").await, 1);
    a.next_event(|e| matches!(e, Event::Started { .. })).await;
    (db, a, gate, id)
}

const MICRO: Duration = Duration::from_micros(1);

#[actix::test]
async fn an_overdue_renewal_is_hedged_on_a_fresh_connection_and_the_handler_goes_on() {
    let (db, mut a, gate, id) = one_running_job().await;
    // The heartbeat at 10 s hangs (its statement stalls 3 s on its connection)...
    a.advance(10 * SEC);
    delay_next_update(&db, RENEWAL, 3.0).await;
    let old = actix_rt::spawn(a.lease_manager().send(jobvisor::testing::RenewLeases));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and is overdue a second later: the next renewal goes out on a fresh connection and
    // answers at once. Its fence point: 11 s + 25 s = 36 s.
    a.advance(SEC);
    let r = a.renew().await;
    assert_eq!(
        (r.renewed, r.lost),
        (1, 0),
        "no renewal was sent while the first one hung"
    );
    // At the claim's fence point (25 s) the handler goes on.
    a.advance(14 * SEC);
    assert_eq!(
        a.check_deadlines().await,
        0,
        "fenced although a renewal had answered"
    );
    // The hung renewal answers late, applied: its own fence point (35 s) is earlier than the
    // hedge's, and the fence point does not move back to it.
    let r = old.await.unwrap().unwrap();
    assert_eq!((r.renewed, r.lost), (1, 0));
    a.advance(11 * SEC - MICRO); // 36 s − 1 µs
    assert_eq!(
        a.check_deadlines().await,
        0,
        "the late answer moved the fence point back to its own"
    );
    assert!(
        !a.seen()
            .iter()
            .any(|e| matches!(e, Event::SelfFenced { .. })),
        "{:?}",
        a.seen()
    );
    a.advance(MICRO); // 36 s: the hedge's fence point, exactly
    assert_eq!(a.check_deadlines().await, 1);
    assert_eq!(a.finished(id).await, JobState::Retrying);
    gate.add_permits(1);
    assert_eq!(a.finished(id).await, JobState::Succeeded);
}

#[actix::test]
async fn an_answer_is_credited_with_its_own_send_time_not_a_newer_hedges() {
    let (db, mut a, gate, id) = one_running_job().await;
    // The heartbeat at 10 s stalls 1.5 s; the hedge sent at 12 s stalls 4 s (the trigger
    // takes the delays in the order they were inserted).
    a.advance(10 * SEC);
    delay_next_update(&db, RENEWAL, 1.5).await;
    delay_next_update(&db, RENEWAL, 4.0).await;
    let old = actix_rt::spawn(a.lease_manager().send(jobvisor::testing::RenewLeases));
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.advance(2 * SEC);
    let hedge = actix_rt::spawn(a.lease_manager().send(jobvisor::testing::RenewLeases));
    // The old renewal answers first: the fence point is its own, 10 s + 25 s = 35 s — not
    // the hedge's (37 s), which has not answered.
    let r = old.await.unwrap().unwrap();
    assert_eq!((r.renewed, r.lost), (1, 0));
    a.advance(23 * SEC - MICRO); // 35 s − 1 µs
    assert_eq!(a.check_deadlines().await, 0, "the old answer moved nothing");
    a.advance(MICRO); // 35 s
    assert_eq!(
        a.check_deadlines().await,
        1,
        "the old answer was credited with the hedge's later send time"
    );
    assert_eq!(a.finished(id).await, JobState::Retrying);
    // The hedge answers after the give-back: it extends nothing.
    let r = hedge.await.unwrap().unwrap();
    assert_eq!(r.renewed, 0, "{r:?}");
    gate.add_permits(1);
    assert_eq!(a.finished(id).await, JobState::Succeeded);
}

/// A handler that completes its job in its own transaction, then lingers (until the test
/// lets it go) and returns something else: the job is `succeeded` from the commit on, the
/// lease manager renews nothing for it meanwhile, reports no lost lease, writes nothing
/// more, and reports the job finished once, with the transaction's result.
#[actix::test]
async fn a_job_completed_in_its_handlers_transaction_is_not_finalized_again() {
    use jobvisor::{JobTx, SqliteJobConnection};
    let committed = Arc::new(tokio::sync::Notify::new());
    let linger = Arc::new(Semaphore::new(0));
    let (c2, l2) = (committed.clone(), linger.clone());
    let mut sim = Simulation::sqlite(move |b| {
        b.handler(
            "pay",
            handler_fn(move |_: Value, ctx: jobvisor::JobContext| {
                let (committed, linger) = (c2.clone(), l2.clone());
                async move {
                    let outcome = ctx
                        .complete_in_transaction(async |mut tx: JobTx<'_, SqliteJobConnection>| {
                            tx.record_effect("charge", json!({"id": "ch_1"})).await?;
                            Ok::<_, JobError>(json!({"paid": true}))
                        })
                        .await
                        .map_err(|e| e.into_job_error())?;
                    assert_eq!(outcome, JobOutcome::Succeeded(json!({"paid": true})));
                    committed.notify_one();
                    let _permit = linger.acquire().await.map_err(JobError::fail)?;
                    Err(JobError::retry("returned after the commit: ignored"))
                }
            }),
        )
    })
    .await;
    let id = enqueue(&sim, NewJob::new("pay", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    committed.notified().await;
    let done = sim.client.get(id).await.unwrap();
    assert_eq!(
        (done.state, done.result.clone()),
        (JobState::Succeeded, Some(json!({"paid": true})))
    );
    // Heartbeats and deadline checks while the handler lingers after its commit.
    sim.advance(10 * SEC);
    let r = sim.renew().await;
    assert_eq!(
        (r.renewed, r.lost),
        (0, 0),
        "nothing to renew, nothing lost"
    );
    sim.advance(25 * SEC);
    sim.check_deadlines().await;
    linger.add_permits(1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    let after = sim.client.get(id).await.unwrap();
    assert_eq!(
        (
            after.version,
            after.result,
            after.finished_at,
            after.errors.len()
        ),
        (done.version, done.result, done.finished_at, 0),
        "nothing written after the commit"
    );
    let stats = sim.handle.stats();
    assert_eq!((stats.finished, stats.lease_lost), (1, 0));
    assert!(
        !sim.seen()
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { .. } | Event::SelfFenced { .. })),
        "{:?}",
        sim.seen()
    );
    let status = sim
        .lease_manager()
        .send(jobvisor::testing::GetLeaseManagerStatus)
        .await
        .unwrap();
    assert_eq!((status.tracked, status.pending), (0, 0));
}

/// A child released by its parent's end is claimed at once: the finalizer wakes the child's
/// fetcher in the node (nothing here ever polls queue `b`).
#[actix::test]
async fn a_released_child_is_picked_up_without_waiting_for_the_poll() {
    let mut sim = Simulation::sqlite(|b| {
        b.queue("a", QueueConfig::default())
            .queue("b", QueueConfig::default())
            .handler("step", quick("done"))
    })
    .await;
    let parent = enqueue(&sim, NewJob::new("step", json!(1)).queue("a")).await;
    let child = enqueue(
        &sim,
        NewJob::new("step", json!(2)).queue("b").after(&[parent]),
    )
    .await;
    assert_eq!(
        sim.client.get(child).await.unwrap().state,
        JobState::Waiting
    );
    assert_eq!(sim.fetch("a").await, 1);
    assert_eq!(sim.finished(parent).await, JobState::Succeeded);
    // No fetch of `b`, no clock advance: only the wake can start it.
    assert_eq!(sim.finished(child).await, JobState::Succeeded);
    let deps = sim.client.dependencies(child).await.unwrap();
    assert_eq!(deps.outcomes().succeeded, 1);
}

/// A `Run` child released by a plain cancel of its parent (no cascade) is claimed at once:
/// `Client::cancel` wakes the child's fetcher in the node (nothing here ever polls queue `b`).
#[actix::test]
async fn a_run_child_released_by_a_plain_cancel_is_picked_up_without_waiting_for_the_poll() {
    let mut sim = Simulation::sqlite(|b| {
        b.queue("a", QueueConfig::default())
            .queue("b", QueueConfig::default())
            .handler("step", quick("done"))
    })
    .await;
    let parent = enqueue(&sim, NewJob::new("step", json!(1)).queue("a")).await;
    let child = enqueue(
        &sim,
        NewJob::new("step", json!(2))
            .queue("b")
            .after(&[parent])
            .on_parent_failure(ParentPolicy::Run),
    )
    .await;
    // The parent never runs: a plain cancel (no cascade) through the node's own client
    // ends it, and the `Run` child is released by that cancel's settle.
    assert!(matches!(
        sim.handle.client().cancel(parent).await.unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    // No fetch of `b`, no clock advance: only the wake can start it.
    assert_eq!(sim.finished(child).await, JobState::Succeeded);
    let deps = sim.client.dependencies(child).await.unwrap();
    assert_eq!(deps.outcomes().cancelled, 1);
}
