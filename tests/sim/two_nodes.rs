//! Two nodes sharing one database, on every backend.

use super::*;

pub(crate) async fn two_nodes_reclaim_and_fence_a_zombie(backend: Backend) {
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
pub(crate) async fn two_nodes_rolling_deploy_burns_no_attempt(backend: Backend) {
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

pub(crate) async fn two_nodes_share_a_queue_without_double_claims(backend: Backend) {
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
pub(crate) async fn two_nodes_elect_one_leader_take_over_and_hand_over(backend: Backend) {
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
pub(crate) async fn a_refused_finalization_is_written_again_by_itself(backend: Backend) {
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
pub(crate) async fn a_quick_jobs_start_is_written_with_its_finalization(backend: Backend) {
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
    };
}

two_node_tests! {
    postgres => Backend::Postgres,
    mysql => Backend::Mysql,
    sqlite => Backend::Sqlite,
}
