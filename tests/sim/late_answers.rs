//! Answers that arrive late: each applies only to the attempt whose token it carried.

use super::*;

/// PostgreSQL: the next UPDATE of the job table whose text matches `pattern` (a `LIKE`
/// pattern) waits `secs` before it reads any row — a statement-level trigger — so its answer
/// comes back late, as over a stalled network, while other statements go on.
pub(crate) async fn delay_next_update(db: &TestDb, pattern: &str, secs: f64) {
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
pub(crate) async fn patient_store(db: &TestDb) -> jobvisor::Store {
    db.store_with(jobvisor::StoreOptions::default().statement_timeout(10 * SEC))
        .await
}

/// The renewal statement (it carries the starts as `v.ago`).
pub(crate) const RENEWAL: &str = "%v.ago%";
/// The finalization statement (it gives attempts back as `v.refund`).
pub(crate) const FINALIZATION: &str = "%v.refund%";

/// A handler whose first call returns at once and whose later calls wait for `gate`.
pub(crate) fn first_quick_then_gated(gate: Arc<Semaphore>) -> impl jobvisor::JobHandler {
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
pub(crate) async fn a_renewal_landing_after_the_give_back_changes_nothing() {
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
pub(crate) async fn a_stale_renewal_answer_leaves_the_newer_attempt_alone() {
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
pub(crate) async fn a_stale_finalization_answer_leaves_the_newer_attempt_alone() {
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
pub(crate) async fn one_running_job() -> (Arc<TestDb>, Simulation, Arc<Semaphore>, JobId) {
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

pub(crate) const MICRO: Duration = Duration::from_micros(1);

#[actix::test]
pub(crate) async fn an_overdue_renewal_is_hedged_on_a_fresh_connection_and_the_handler_goes_on() {
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
pub(crate) async fn an_answer_is_credited_with_its_own_send_time_not_a_newer_hedges() {
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
pub(crate) async fn a_job_completed_in_its_handlers_transaction_is_not_finalized_again() {
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
pub(crate) async fn a_released_child_is_picked_up_without_waiting_for_the_poll() {
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
pub(crate) async fn a_run_child_released_by_a_plain_cancel_is_picked_up_without_waiting_for_the_poll(
) {
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
