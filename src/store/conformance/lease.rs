//! Conformance cases. Leases: renewal, lost leases, fenced zombies, and the handler start a renewal records.

use super::*;

/// A hedge (a renewal sent while an earlier one is overdue) goes out on a connection opened
/// for it alone (on SQLite, the lane's): same guard, same answer as a renewal from the lane.
pub async fn a_hedged_renewal_on_a_fresh_connection_renews_the_same_way(b: Backend) {
    let t = Bundle::new(b).await;
    t.enqueue(NewJob::new("k", json!(1)), 0).await;
    let claimed = t.claim("default", "n1", 1, 1).await;
    let leases = vec![
        LeaseRef {
            started_ago: None,
            progress: None,
            id: claimed[0].id,
            token: claimed[0].token.clone(),
        },
        LeaseRef {
            started_ago: None,
            progress: None,
            id: claimed[0].id,
            token: LeaseToken::generate(),
        },
    ];
    let params = |leases: Vec<LeaseRef>, at: i64| RenewParams {
        timeout_grace: Duration::ZERO,
        leases,
        lease: Duration::from_secs(30),
        now: t.at(at),
    };
    let out = t
        .store
        .job_renew_leases_hedged(params(leases.clone(), 20))
        .await
        .unwrap();
    assert_eq!(out.len(), 2);
    match &out[0].1 {
        Guarded::Applied(r) => assert_eq!(r.expires_at, t.at(50).unwrap()),
        other => panic!("expected applied, got {other:?}"),
    }
    assert_eq!(out[1].1, Guarded::LeaseLost, "a wrong token renews nothing");
    assert_eq!(
        t.get(claimed[0].id).await.lease.unwrap().expires_at,
        t.at(50).unwrap()
    );
    // More at once than the lane has connections: each opens its own.
    let many = (0..crate::store::RENEW_LANE_SIZE + 2).map(|_| {
        t.store
            .job_renew_leases_hedged(params(leases[..1].to_vec(), 25))
    });
    for out in futures_util::future::join_all(many).await {
        assert!(matches!(out.unwrap()[0].1, Guarded::Applied(_)));
    }
}

pub async fn renew_extends_leases_and_reports_lost_ones(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..3 {
        t.enqueue(NewJob::new("k", json!(i)), 0).await;
    }
    let claimed = t.claim("default", "n1", 3, 1).await;
    let mut leases: Vec<LeaseRef> = claimed
        .iter()
        .map(|c| LeaseRef {
            started_ago: None,
            progress: None,
            id: c.id,
            token: c.token.clone(),
        })
        .collect();
    leases.push(LeaseRef {
        started_ago: None,
        progress: None,
        id: claimed[0].id,
        token: LeaseToken::generate(),
    });
    leases.push(LeaseRef {
        started_ago: None,
        progress: None,
        id: JobId(999_999),
        token: LeaseToken::generate(),
    });
    let out = t
        .store
        .job_renew_leases(RenewParams {
            timeout_grace: Duration::ZERO,
            leases,
            lease: Duration::from_secs(30),
            now: t.at(20),
        })
        .await
        .unwrap();
    assert_eq!(out.len(), 5);
    for (_, g) in &out[..3] {
        match g {
            Guarded::Applied(r) => {
                assert_eq!(r.expires_at, t.at(50).unwrap());
                assert!(!r.cancel_requested);
            }
            other => panic!("expected applied, got {other:?}"),
        }
    }
    assert_eq!(out[3].1, Guarded::LeaseLost, "a wrong token renews nothing");
    assert_eq!(
        out[4].1,
        Guarded::LeaseLost,
        "an unknown job renews nothing"
    );
    let j = t.get(claimed[0].id).await;
    assert_eq!(j.lease.unwrap().expires_at, t.at(50).unwrap());
}

pub async fn zombie_renew_and_finalize_are_rejected_after_reclaim_and_reclaim_by_another(
    b: Backend,
) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    let zombie = t.claim("default", "zombie", 1, 0).await.pop().unwrap();
    // Its handler starts; the renewal at 1 records it. Then the zombie pauses; its lease
    // (30 s from the renewal) expires and the sweeper reclaims the job, the attempt counted.
    assert!(t
        .renew_started(id, &zombie.token, 1, Some(1))
        .await
        .is_applied());
    let r = t.reclaim(32).await;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].id, r[0].reason, r[0].new_state),
        (id, ReclaimReason::LeaseExpired, JobState::Retrying)
    );
    // Another node claims it after the backoff (10 s for attempt 1).
    let fresh = t.claim("default", "alive", 1, 42).await.pop().unwrap();
    assert_eq!(fresh.attempts, 2);
    // The zombie wakes up: its renew and its finalize change nothing.
    assert_eq!(t.renew(id, &zombie.token, 43).await, Guarded::LeaseLost);
    let z = t
        .finalize(
            Finalize::succeeded(id, zombie.token.clone(), json!("zombie")),
            43,
        )
        .await;
    assert_eq!(z, Guarded::LeaseLost);
    let zd = t
        .finalize(Finalize::dead(id, zombie.token.clone(), err("boom", 1)), 43)
        .await;
    assert_eq!(zd, Guarded::LeaseLost);
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.lease.as_ref().unwrap().owner.as_str(), "alive");
    // The current holder's result stands.
    let ok = t
        .finalize(
            Finalize::succeeded(id, fresh.token.clone(), json!("alive")),
            44,
        )
        .await;
    assert_eq!(ok, Guarded::Applied(JobState::Succeeded));
    assert_eq!(
        t.finalize(Finalize::succeeded(id, zombie.token, json!("late")), 45)
            .await,
        Guarded::LeaseLost
    );
    let j = t.get(id).await;
    assert_eq!(j.result, Some(json!("alive")));
    assert_eq!(j.errors.len(), 1, "only the reclaim's lease_expired error");
    assert_eq!(j.errors[0].code, "lease_expired");
}

pub async fn renewals_record_each_start_once_and_stale_tokens_record_nothing(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({})).timeout(Duration::from_secs(60)),
            0,
        )
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    let stale = LeaseToken::generate();
    assert_eq!(
        t.renew_started(id, &stale, 5, Some(1)).await,
        Guarded::LeaseLost
    );
    assert_eq!(
        t.get(id).await.started_at,
        None,
        "a stale token records no start"
    );
    assert!(t.renew_started(id, &c.token, 5, Some(2)).await.is_applied());
    assert!(t.renew_started(id, &c.token, 9, Some(1)).await.is_applied());
    let j = t.get(id).await;
    assert_eq!(
        (j.started_at, j.timeout_at),
        (t.at(3), t.at(3 + 60 + 10)),
        "the first recorded start stands"
    );
    // The next attempt starts afresh; first_started_at keeps the first attempt's start.
    t.finalize(
        Finalize::retry(id, c.token, err("e", 1), Duration::ZERO),
        10,
    )
    .await;
    let c2 = t.claim("default", "n", 1, 10).await.pop().unwrap();
    let j = t.get(id).await;
    assert_eq!((j.started_at, j.timeout_at), (None, None));
    assert!(t
        .renew_started(id, &c2.token, 20, Some(4))
        .await
        .is_applied());
    let j = t.get(id).await;
    assert_eq!((j.started_at, j.first_started_at), (t.at(16), t.at(3)));
}
