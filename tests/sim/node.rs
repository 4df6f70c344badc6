//! One node: runs, retries, timeouts, cancels, shutdown, priorities, prefetch, renewals and
//! late claim answers.

use super::*;

/// A handler that waits until the test lets it go, then returns `result` (it ignores
/// cancellation, like a handler stuck in a blocking call).
pub(crate) fn gated(gate: Arc<Semaphore>, result: &'static str) -> impl jobvisor::JobHandler {
    handler_fn(move |_: Value, _ctx| {
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await.map_err(JobError::fail)?;
            JobOutcome::success(result)
        }
    })
}

pub(crate) async fn enqueue(sim: &Simulation, job: NewJob) -> JobId {
    sim.client.enqueue(job).await.unwrap().id
}

#[actix::test]
pub(crate) async fn a_job_runs_and_its_result_is_stored() {
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
pub(crate) async fn two_claims_of_one_attempt_have_two_claim_ids() {
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
pub(crate) async fn a_dead_nodes_job_is_reclaimed_after_its_lease_and_run_by_another_node() {
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
pub(crate) async fn a_resumed_zombie_learns_from_its_heartbeat_that_its_lease_is_lost() {
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
pub(crate) async fn progress_goes_out_with_the_heartbeat_reaches_the_next_attempt_and_not_from_a_zombie(
) {
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
pub(crate) async fn a_handler_past_its_timeout_is_stopped_and_retried() {
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
pub(crate) async fn snooze_does_not_use_an_attempt() {
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
pub(crate) async fn cancelling_a_running_job_signals_its_handler_and_ends_it_cancelled() {
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
pub(crate) async fn graceful_shutdown_gives_back_the_lease_of_a_job_still_running() {
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
pub(crate) async fn max_attempts_end_dead_with_every_error_kept() {
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
pub(crate) async fn priorities_are_respected() {
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
pub(crate) async fn the_prefetch_window_grows_for_idle_workers_and_shrinks_when_jobs_wait() {
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
pub(crate) async fn the_lease_manager_renews_many_leases_in_one_statement() {
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
pub(crate) async fn a_lease_that_cannot_be_renewed_in_time_stops_its_handler() {
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
pub(crate) async fn panics_are_failures_that_say_why_and_unknown_kinds_wait_unclaimed() {
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
pub(crate) async fn bad_scheduler_config_names_the_field() {
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
pub(crate) async fn wait_returns_the_finished_job() {
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

pub(crate) static LATE_A_RUNNING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

pub(crate) fn waits_for_stop(is_a: bool) -> impl jobvisor::JobHandler {
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
pub(crate) async fn a_claim_answered_late_does_not_extend_the_lease() {
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

/// A handler's panic is stored with where it was raised: the failure's message names the
/// file, line and column, and its detail keeps them (`{"panic": {"file", "line", "column"}}`),
/// read back through each backend's JSON column.
pub(crate) async fn a_panic_is_stored_with_its_file_and_line(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let line = Arc::new(AtomicU32::new(0));
    let at = line.clone();
    let mut sim = Simulation::on_store(db.store().await, clock, "sim-node", |b| {
        b.handler(
            "boom",
            handler_fn(move |_: Value, _ctx| {
                let at = at.clone();
                async move {
                    if true {
                        at.store(line!() + 1, Ordering::SeqCst);
                        panic!("kaboom");
                    }
                    JobOutcome::done()
                }
            }),
        )
    })
    .keep(db.clone());
    let boom = enqueue(&sim, NewJob::new("boom", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(boom).await, JobState::Retrying);
    let e = sim.client.get(boom).await.unwrap().last_error.unwrap();
    let line = line.load(Ordering::SeqCst);
    assert_eq!(e.code, "panic");
    let site = format!("{}:{line}:", file!());
    assert!(
        e.message.contains(&site) && e.message.ends_with("kaboom"),
        "{}",
        e.message
    );
    let detail = e.detail.expect("a panic's detail");
    assert_eq!(detail["panic"]["file"], file!(), "{detail}");
    assert_eq!(detail["panic"]["line"], line, "{detail}");
    assert!(detail["panic"]["column"].as_u64() > Some(0), "{detail}");
    // The backtrace is there exactly when the environment asks for one (std's rule).
    let var = |k| std::env::var(k).ok();
    let asked = var("RUST_LIB_BACKTRACE")
        .or_else(|| var("RUST_BACKTRACE"))
        .is_some_and(|v| v != "0");
    let bt = detail["panic"].get("backtrace").and_then(Value::as_str);
    assert_eq!(bt.is_some(), asked, "{detail}");
    if let Some(bt) = bt {
        assert!(
            bt.contains(file!()),
            "the backtrace names the handler's file: {bt}"
        );
    }
}

macro_rules! panic_site_tests {
    ($($name:ident => $backend:expr),+ $(,)?) => {
        $(
            mod $name {
                use super::*;
                #[actix::test]
                async fn a_panic_is_stored_with_its_file_and_line() {
                    super::a_panic_is_stored_with_its_file_and_line($backend).await;
                }
            }
        )+
    };
}

panic_site_tests! {
    panic_site_postgres => Backend::Postgres,
    panic_site_mysql => Backend::Mysql,
    panic_site_sqlite => Backend::Sqlite,
}

#[actix::test]
pub(crate) async fn a_queue_with_declared_limits_claims_exactly_when_the_test_asks() {
    for run in 0..3 {
        let sim = Simulation::sqlite(|b| {
            b.queue(
                "default",
                QueueConfig::default().limits(jobvisor::QueueLimits::default().concurrency(5)),
            )
            .handler("k", gated(Arc::new(Semaphore::new(0)), "never"))
        })
        .await;
        let id = enqueue(&sim, NewJob::new("k", json!({}))).await;
        // The limits' write at start claims nothing by itself.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            sim.client.get(id).await.unwrap().state,
            JobState::Pending,
            "run {run}: claimed before the test asked"
        );
        assert_eq!(sim.fetch("default").await, 1, "run {run}");
    }
    // Asked at once after start: the claim waits for the limits instead of answering 0.
    for run in 0..3 {
        let sim = Simulation::sqlite(|b| {
            b.queue(
                "default",
                QueueConfig::default().limits(jobvisor::QueueLimits::default().concurrency(5)),
            )
            .handler("k", gated(Arc::new(Semaphore::new(0)), "never"))
        })
        .await;
        enqueue(&sim, NewJob::new("k", json!({}))).await;
        assert_eq!(sim.fetch("default").await, 1, "run {run}");
    }
}

/// A typed job: its kind and defaults come with the type.
#[derive(serde::Serialize, serde::Deserialize)]
struct Double {
    n: i64,
}

impl jobvisor::JobArgs for Double {
    const KIND: &'static str = "double";
    const MAX_ATTEMPTS: u32 = 2;
    const PRIORITY: i16 = 3;
}

#[actix::test]
pub(crate) async fn a_typed_job_is_enqueued_and_handled_by_its_type() {
    let mut sim = Simulation::sqlite(|b| {
        b.handle(handler_fn(|d: Double, _ctx| async move {
            JobOutcome::success(d.n * 2)
        }))
    })
    .await;
    let id = sim.client.enqueue(Double { n: 21 }).await.unwrap().id;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(
        (
            job.kind.as_str(),
            job.result,
            job.max_attempts,
            job.priority
        ),
        ("double", Some(json!(42)), 2, 3)
    );
    // The string form reaches the same handler.
    let id = enqueue(&sim, NewJob::new("double", json!({"n": 5}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(id).await, JobState::Succeeded);
}
