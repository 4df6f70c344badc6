//! Conformance cases. Finalizing: each outcome, attempts and errors kept, requeue without an attempt, mixed batches guarded row by row.

use super::*;
use crate::job::UniqueScope;

pub async fn finalize_succeeded_clears_last_error_and_keeps_attempts(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    let c1 = t.claim("default", "n", 1, 0).await.pop().unwrap();
    let r = t
        .finalize(
            Finalize::retry(id, c1.token, err("flaky", 1), Duration::from_secs(5)),
            1,
        )
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Retrying));
    let j = t.get(id).await;
    assert_eq!(j.run_at, t.at(6).unwrap());
    assert_eq!(j.last_error.as_ref().unwrap().code, "flaky");
    assert!(j.lease.is_none());
    let c2 = t.claim("default", "n", 1, 6).await.pop().unwrap();
    let v_before = t.get(id).await.version;
    let r = t
        .finalize(Finalize::succeeded(id, c2.token, json!({"sent": true})), 7)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Succeeded));
    let j = t.get(id).await;
    assert_eq!(j.result, Some(json!({"sent": true})));
    assert!(j.last_error.is_none(), "success clears last_error");
    assert_eq!(j.errors.len(), 1, "history stays");
    assert_eq!(j.attempts, 2, "attempts kept");
    assert_eq!(j.version, v_before + 1);
    assert_eq!(j.finished_at, t.at(7));
    assert!(j.lease.is_none() && j.timeout_at.is_none());
}

pub async fn attempts_exhausted_become_dead_with_every_error_kept(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(3), 0)
        .await;
    // Attempt 1 fails by handler error, attempt 2 by lease expiry, attempt 3 by error again.
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    t.finalize(
        Finalize::retry(id, c.token, err("e1", 1), Duration::ZERO),
        1,
    )
    .await;
    let c = t.claim("default", "n", 1, 1).await.pop().unwrap();
    assert!(t.renew_started(id, &c.token, 2, Some(1)).await.is_applied());
    let r = t.reclaim(40).await;
    assert_eq!(r[0].new_state, JobState::Retrying);
    let c = t.claim("default", "n", 1, 70).await.pop().unwrap();
    assert_eq!(c.attempts, 3);
    let r = t
        .finalize(
            Finalize::retry(id, c.token, err("e3", 3), Duration::ZERO),
            71,
        )
        .await;
    assert_eq!(
        r,
        Guarded::Applied(JobState::Dead),
        "no retry after max_attempts"
    );
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Dead);
    let codes: Vec<&str> = j.errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["e1", "lease_expired", "e3"]);
    let attempts: Vec<u32> = j.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(j.last_error.unwrap().code, "e3");
    assert!(t.claim("default", "n", 1, 10_000).await.is_empty());

    // The sweeper enforces max_attempts too: a lost last attempt is dead.
    let id2 = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    assert!(t
        .renew_started(id2, &c.token, 0, Some(0))
        .await
        .is_applied());
    let r = t.reclaim(31).await;
    assert_eq!((r[0].id, r[0].new_state), (id2, JobState::Dead));
    let j2 = t.get(id2).await;
    assert_eq!(j2.state, JobState::Dead);
    assert_eq!(j2.finished_at, t.at(31));
}

pub async fn requeue_does_not_use_an_attempt(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    let r = t
        .finalize(Finalize::requeue(id, c.token, Duration::from_secs(30)), 1)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Pending));
    let j = t.get(id).await;
    assert_eq!((j.state, j.attempts), (JobState::Pending, 0));
    assert!(t.claim("default", "n", 1, 30).await.is_empty());
    let c = t.claim("default", "n", 1, 31).await.pop().unwrap();
    assert_eq!(c.attempts, 1);
}

pub async fn finalize_many_mixes_outcomes_and_guards_each_row(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..5 {
        t.enqueue(NewJob::new("k", json!(i)), 0).await;
    }
    let c = t.claim("default", "n", 5, 0).await;
    let items = vec![
        Finalize::succeeded(c[0].id, c[0].token.clone(), json!("ok")),
        Finalize::retry(
            c[1].id,
            c[1].token.clone(),
            err("again", 1),
            Duration::from_secs(9),
        ),
        Finalize::dead(c[2].id, c[2].token.clone(), err("fatal", 1)),
        Finalize::cancelled(c[3].id, c[3].token.clone(), err("cancelled", 1)),
        Finalize::succeeded(c[4].id, LeaseToken::generate(), json!("forged")),
    ];
    let out = t
        .store
        .job_finalize_many(FinalizeParams {
            items,
            now: t.at(1),
        })
        .await
        .unwrap();
    let states: Vec<Guarded<JobState>> = out.into_iter().map(|(_, g)| g).collect();
    assert_eq!(
        states,
        vec![
            Guarded::Applied(JobState::Succeeded),
            Guarded::Applied(JobState::Retrying),
            Guarded::Applied(JobState::Dead),
            Guarded::Applied(JobState::Cancelled),
            Guarded::LeaseLost,
        ]
    );
    assert_eq!(
        t.get(c[4].id).await.state,
        JobState::Running,
        "forged token changed nothing"
    );
    assert_eq!(t.get(c[1].id).await.run_at, t.at(10).unwrap());
    let twice = vec![
        Finalize::succeeded(c[4].id, c[4].token.clone(), json!(1)),
        Finalize::succeeded(c[4].id, c[4].token.clone(), json!(2)),
    ];
    let e = t
        .store
        .job_finalize_many(FinalizeParams {
            items: twice,
            now: t.at(2),
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
}

/// A batch larger than any one statement of it (SQLite ends at most 128 successes per
/// statement): each success writes its own result and start, a forged token in its midst
/// changes nothing, a `while_active` key is released, and a failure in the same batch is
/// written beside them; then 20 successes with one result between them.
pub async fn a_batch_of_successes_writes_each_job_its_own_result_and_start(b: Backend) {
    let t = Bundle::new(b).await;
    let n = 150;
    for i in 0..n {
        let job = NewJob::new("k", json!(i));
        let job = if i == 7 {
            job.unique_key("w").unique_scope(UniqueScope::WhileActive)
        } else {
            job
        };
        t.enqueue(job, 0).await;
    }
    let mut c = t.claim("default", "n", 100, 0).await;
    c.extend(t.claim("default", "n", 100, 0).await);
    assert_eq!(c.len(), n);
    let ago = |i: usize| (!i.is_multiple_of(3)).then(|| Duration::from_millis(i as u64 * 10));
    let (forged, failed) = (140, 3);
    let items: Vec<Finalize> =
        c.iter()
            .enumerate()
            .map(|(i, c)| match i {
                _ if i == forged => Finalize::succeeded(c.id, LeaseToken::generate(), json!(i)),
                _ if i == failed => {
                    Finalize::retry(c.id, c.token.clone(), err("again", 1), Duration::ZERO)
                }
                _ => Finalize::succeeded(c.id, c.token.clone(), json!({"i": i}))
                    .with_started_ago(ago(i)),
            })
            .collect();
    let out = t.finalize_many(items, 100).await;
    for (i, (c, (id, g))) in c.iter().zip(out).enumerate() {
        assert_eq!(c.id, id);
        let j = t.get(id).await;
        match i {
            _ if i == forged => {
                assert_eq!(g, Guarded::LeaseLost);
                assert_eq!(j.state, JobState::Running, "a forged token changed nothing");
            }
            _ if i == failed => {
                assert_eq!(g, Guarded::Applied(JobState::Retrying));
                assert_eq!(j.last_error.map(|e| e.code), Some("again".into()));
            }
            _ => {
                assert_eq!(g, Guarded::Applied(JobState::Succeeded), "job #{i}");
                assert_eq!(j.state, JobState::Succeeded);
                assert_eq!(j.result, Some(json!({"i": i})), "job #{i}'s own result");
                assert_eq!(j.finished_at, t.at(100));
                let started = ago(i).map(|d| t.at(100).unwrap() - d);
                assert_eq!(j.started_at, started, "job #{i}'s own start");
                assert_eq!(j.first_started_at, started);
                assert!(j.lease.is_none());
            }
        }
    }
    let again = t
        .store
        .job_enqueue(
            NewJob::new("k", json!("again"))
                .unique_key("w")
                .unique_scope(UniqueScope::WhileActive),
            t.at(101),
        )
        .await
        .unwrap();
    assert!(
        !again.duplicate,
        "the success released its while_active key"
    );

    // More than 16 successes with one result between them (SQLite binds it once).
    for i in 0..20 {
        t.enqueue(NewJob::new("k", json!(i)).queue("same"), 101)
            .await;
    }
    let c = t.claim("same", "n", 20, 101).await;
    let items = c
        .iter()
        .map(|c| Finalize::succeeded(c.id, c.token.clone(), json!("same")))
        .collect();
    let out = t.finalize_many(items, 102).await;
    assert_eq!(out.len(), 20);
    for (id, g) in out {
        assert_eq!(g, Guarded::Applied(JobState::Succeeded));
        assert_eq!(t.get(id).await.result, Some(json!("same")));
    }
}
