//! Conformance cases. Maintenance: reclaiming expired and over-time jobs (attempts given back when never started), archiving and pruning.

use super::*;

pub async fn reclaim_moves_over_time_jobs_and_leaves_live_ones(b: Backend) {
    let t = Bundle::new(b).await;
    let slow = t
        .enqueue(
            NewJob::new("k", json!(1)).timeout(Duration::from_secs(10)),
            0,
        )
        .await;
    let healthy = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let claimed = t.claim("default", "n", 2, 0).await;
    assert_eq!(claimed.len(), 2);
    // Both handlers started at 3; the renewal at 9 records it (a later one keeps the first
    // recorded start). The deadline is start + timeout + grace: 3 + 10 + 10.
    for (at, ago) in [(9, 6), (15, 12)] {
        for c in &claimed {
            assert!(t
                .renew_started(c.id, &c.token, at, Some(ago))
                .await
                .is_applied());
        }
    }
    let j = t.get(slow).await;
    assert_eq!(
        (j.started_at, j.first_started_at, j.timeout_at),
        (t.at(3), t.at(3), t.at(23))
    );
    assert!(t.reclaim(23).await.is_empty(), "nothing is over time yet");
    let r = t.reclaim(24).await;
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].id, r[0].reason), (slow, ReclaimReason::Timeout));
    assert_eq!(t.get(healthy).await.state, JobState::Running);
    let j = t.get(slow).await;
    assert_eq!(j.state, JobState::Retrying);
    assert_eq!(j.last_error.unwrap().code, "timeout");
    assert_eq!(
        j.run_at,
        t.at(34).unwrap(),
        "reclaimed at 24, backoff 10 s from the sweeper's policy"
    );
}

pub async fn an_unstarted_claim_is_never_over_time_and_gets_its_attempt_back(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({}))
                .timeout(Duration::from_secs(1))
                .max_attempts(1),
            0,
        )
        .await;
    let c = t.claim("default", "prefetcher", 1, 0).await.pop().unwrap();
    // Waiting in a prefetch: renewed for 90 s, far past claim + lease + timeout.
    for at in [10, 20, 30, 40, 50, 60, 70, 80, 90] {
        assert!(t.renew(id, &c.token, at).await.is_applied());
        assert!(
            t.reclaim(at).await.is_empty(),
            "reclaimed at {at} unstarted"
        );
    }
    // Its node dies before the handler started: the attempt is given back.
    let r = t.reclaim(121).await;
    assert_eq!(
        (r[0].id, r[0].reason, r[0].new_state, r[0].attempts),
        (id, ReclaimReason::NotStarted, JobState::Pending, 0)
    );
    let j = t.get(id).await;
    assert_eq!((j.state, j.attempts, j.refunds), (JobState::Pending, 0, 1));
    assert_eq!(j.run_at, t.at(121).unwrap(), "claimable again at once");
    let e = &j.errors[0];
    assert_eq!((e.code.as_str(), e.attempt), ("not_started", 1));
    assert_eq!(e.detail, Some(json!({"owner": "prefetcher"})));
    assert!(j.lease.is_none());
    // It runs on its one attempt and succeeds.
    let c = t.claim("default", "n", 1, 121).await.pop().unwrap();
    assert_eq!(c.attempts, 1);
    assert!(t
        .renew_started(id, &c.token, 122, Some(0))
        .await
        .is_applied());
    let r = t
        .finalize(Finalize::succeeded(id, c.token, json!("ran")), 122)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Succeeded));
}

pub async fn a_job_that_kills_its_node_at_start_still_ends_dead(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("poison", json!({})).max_attempts(2), 0)
        .await;
    // Each claim's node dies before any renewal could record the start: the first
    // `max_attempts` losses are refunded, the next ones count, so it is dead after at most
    // 2 × max_attempts claims.
    let mut at = 0;
    let mut reasons = Vec::new();
    for claim in 1..=4 {
        let c = t.claim("default", &format!("node-{claim}"), 1, at).await;
        assert_eq!(c.len(), 1, "claim {claim} at {at}");
        at += 31;
        let r = t.reclaim(at).await;
        reasons.push((r[0].reason, r[0].new_state));
        at += 10; // past any backoff
    }
    assert_eq!(
        reasons,
        [
            (ReclaimReason::NotStarted, JobState::Pending),
            (ReclaimReason::NotStarted, JobState::Pending),
            (ReclaimReason::LeaseExpired, JobState::Retrying),
            (ReclaimReason::LeaseExpired, JobState::Dead),
        ]
    );
    let j = t.get(id).await;
    assert_eq!((j.state, j.attempts, j.refunds), (JobState::Dead, 2, 2));
    let codes: Vec<&str> = j.errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(
        codes,
        [
            "not_started",
            "not_started",
            "lease_expired",
            "lease_expired"
        ]
    );
    assert!(t.claim("default", "n", 1, at + 1000).await.is_empty());
}

pub async fn archive_moves_terminal_jobs_atomically_and_prune_deletes_them(b: Backend) {
    let t = Bundle::new(b).await;
    let done = t
        .enqueue(NewJob::new("k", json!("done")).unique_key("u1"), 0)
        .await;
    let live = t.enqueue(NewJob::new("k", json!("live")), 0).await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    assert_eq!(c.id, done);
    t.finalize(Finalize::succeeded(done, c.token, json!(1)), 10)
        .await;
    let archive = |now: i64, older: u64| ArchiveParams {
        older_than: Duration::from_secs(older),
        dead_older_than: Duration::from_secs(older),
        limit: 100,
        now: t.at(now),
    };
    assert_eq!(
        t.store.job_archive(archive(100, 3600)).await.unwrap(),
        0,
        "too recent"
    );
    assert_eq!(t.store.job_archive(archive(3611, 3600)).await.unwrap(), 1);
    let j = t.get(done).await;
    assert_eq!(j.archived_at, t.at(3611));
    assert_eq!(j.result, Some(json!(1)));
    assert_eq!(j.state, JobState::Succeeded);
    assert!(t
        .store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .iter()
        .all(|j| j.id != done));
    let arch = t
        .store
        .job_list(ListParams {
            archived: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        arch.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![done],
        "in exactly one table"
    );
    assert_eq!(t.get(live).await.state, JobState::Pending, "live jobs stay");
    // Vacuuming the live table (the archiver's, after many moves) keeps every row.
    t.store.job_vacuum_live().await.unwrap();
    assert_eq!(
        t.get(live).await.state,
        JobState::Pending,
        "vacuum keeps live jobs"
    );
    assert_eq!(
        t.get(done).await.state,
        JobState::Succeeded,
        "and archived ones"
    );
    // Once archived its unique key is free again.
    let again = t
        .store
        .job_enqueue(NewJob::new("k", json!(2)).unique_key("u1"), t.at(3612))
        .await
        .unwrap();
    assert!(!again.duplicate);

    let prune = |now: i64| PruneParams {
        older_than: Duration::from_secs(86_400),
        limit: 100,
        now: t.at(now),
    };
    assert_eq!(t.store.job_prune_archive(prune(3612)).await.unwrap(), 0);
    assert_eq!(
        t.store
            .job_prune_archive(prune(3611 + 86_401))
            .await
            .unwrap(),
        1
    );
    assert!(t.store.job_get(done).await.unwrap().is_none());
}

pub async fn archive_is_bounded_by_its_limit(b: Backend) {
    let t = Bundle::new(b).await;
    let jobs: Vec<NewJob> = (0..25).map(|i| NewJob::new("k", json!(i))).collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let claimed = t.claim("default", "n", 25, 0).await;
    let items = claimed
        .into_iter()
        .map(|c| Finalize::succeeded(c.id, c.token, json!(null)))
        .collect();
    let out = t
        .store
        .job_finalize_many(FinalizeParams {
            items,
            now: t.at(1),
        })
        .await
        .unwrap();
    assert!(out
        .iter()
        .all(|(_, g)| *g == Guarded::Applied(JobState::Succeeded)));
    let p = |now| ArchiveParams {
        older_than: Duration::ZERO,
        dead_older_than: Duration::ZERO,
        limit: 10,
        now: t.at(now),
    };
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 10);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 10);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 5);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 0);
}
