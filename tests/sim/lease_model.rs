//! The lease model: timeouts from the start, refunds, the start gate, per-attempt answers.

use super::*;

/// A quick handler that succeeds with `result`.
pub(crate) fn quick(result: &'static str) -> impl jobvisor::JobHandler {
    handler_fn(move |_: Value, _ctx| async move { JobOutcome::success(result) })
}

/// Waits until the fetcher has claimed every job in `ids` (a claim is at most half the
/// budget; a full claim makes the fetcher claim the next chunk by itself).
pub(crate) async fn claim_all(sim: &mut Simulation, ids: &[JobId]) {
    sim.fetch("default").await;
    for id in ids {
        sim.next_event(|e| matches!(e, Event::Claimed { id: i, .. } if i == id))
            .await;
    }
}

pub(crate) fn codes(job: &jobvisor::Job) -> Vec<&str> {
    job.errors.iter().map(|e| e.code.as_str()).collect()
}

#[actix::test]
pub(crate) async fn a_prefetched_job_behind_long_ones_is_never_timed_out_before_it_starts() {
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
pub(crate) async fn a_started_jobs_timeout_is_recorded_and_the_sweeper_backstops_it() {
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
pub(crate) async fn a_dead_nodes_prefetched_jobs_keep_their_attempts() {
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
pub(crate) async fn a_frozen_node_starts_no_handler_for_a_job_reclaimed_meanwhile() {
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
pub(crate) async fn a_detected_pause_holds_starts_until_a_fresh_renewal_answers() {
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
pub(crate) struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[actix::test]
pub(crate) async fn a_handler_stops_in_time_while_the_actors_arbiter_is_blocked() {
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
pub(crate) async fn an_actor_stopped_with_a_sqlite_call_in_flight_neither_panics_nor_blocks() {
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
