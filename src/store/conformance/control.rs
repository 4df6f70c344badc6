//! Conformance cases. Operator control: cancel (pending, running, finished) and manual retry guarded by version.

use super::*;

pub async fn cancel_pending_running_and_finished_jobs(b: Backend) {
    let t = Bundle::new(b).await;
    let pending = t
        .enqueue(
            NewJob::new("k", json!(1)).delay(Duration::from_secs(100)),
            0,
        )
        .await;
    let running = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let c = t.claim("default", "n", 1, 1).await.pop().unwrap();
    assert_eq!(c.id, running);

    let out = t
        .store
        .job_cancel(CancelParams {
            id: pending,
            now: t.at(2),
        })
        .await
        .unwrap();
    let CancelOutcome::Cancelled(j) = out else {
        panic!("{out:?}")
    };
    assert_eq!((j.state, j.finished_at), (JobState::Cancelled, t.at(2)));

    let out = t
        .store
        .job_cancel(CancelParams {
            id: running,
            now: t.at(3),
        })
        .await
        .unwrap();
    let CancelOutcome::Requested(j) = out else {
        panic!("{out:?}")
    };
    assert_eq!(j.cancel_requested_at, t.at(3));
    let Guarded::Applied(r) = t.renew(running, &c.token, 4).await else {
        panic!()
    };
    assert!(
        r.cancel_requested,
        "the holder learns of the cancel at renewal"
    );
    let f = t
        .finalize(
            Finalize::cancelled(
                running,
                c.token,
                JobFailure::new("cancelled", "cancel requested", 1),
            ),
            5,
        )
        .await;
    assert_eq!(f, Guarded::Applied(JobState::Cancelled));

    let out = t
        .store
        .job_cancel(CancelParams {
            id: pending,
            now: t.at(6),
        })
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::AlreadyFinished(_)));
    let e = t
        .store
        .job_cancel(CancelParams {
            id: JobId(987_654),
            now: t.at(6),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

pub async fn manual_retry_of_a_dead_job_is_version_guarded(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    t.finalize(Finalize::dead(id, c.token, err("fatal", 1)), 1)
        .await;
    let dead = t.get(id).await;

    let e = t
        .store
        .job_retry(RetryParams {
            id: JobId(424_242),
            expected_version: None,
            now: t.at(2),
        })
        .await;
    assert!(matches!(e, Err(Error::NotFound { .. })));
    let stale = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: Some(dead.version - 1),
            now: t.at(2),
        })
        .await
        .unwrap();
    assert_eq!(stale, Guarded::Stale);
    let Guarded::Applied(j) = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: Some(dead.version),
            now: t.at(2),
        })
        .await
        .unwrap()
    else {
        panic!("retry not applied")
    };
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.max_attempts, 2, "one more attempt allowed");
    assert_eq!(j.errors.len(), 1, "history kept");
    let e = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: None,
            now: t.at(3),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidTransition {
                from: JobState::Pending,
                ..
            }
        ),
        "{e}"
    );
    let c = t.claim("default", "n", 1, 3).await.pop().unwrap();
    assert_eq!(c.attempts, 2);
}

pub async fn delete_of_a_finished_job_is_version_guarded(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let e = t.store.job_delete_finished(id, 1).await.unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { field: "id", .. }),
        "a pending job is not deleted: {e}"
    );
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    t.finalize(Finalize::dead(id, c.token, err("fatal", 1)), 1)
        .await;
    let dead = t.get(id).await;
    let stale = t
        .store
        .job_delete_finished(id, dead.version - 1)
        .await
        .unwrap();
    assert_eq!(stale, Guarded::Stale, "an older version deletes nothing");
    assert_eq!(t.get(id).await.state, JobState::Dead);
    let done = t.store.job_delete_finished(id, dead.version).await.unwrap();
    assert_eq!(done, Guarded::Applied(()));
    assert!(t.store.job_get(id).await.unwrap().is_none(), "gone");
    let e = t
        .store
        .job_delete_finished(id, dead.version)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

pub async fn ended_histogram_counts_finished_jobs_per_window(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..3 {
        t.enqueue(NewJob::new("k", json!(i)), 0).await;
    }
    let claimed = t.claim("default", "n", 3, 0).await;
    for c in claimed {
        // Finished now (the database's clock): the newest window.
        let f = t
            .store
            .job_finalize_many(FinalizeParams {
                items: vec![Finalize::succeeded(c.id, c.token, json!(null))],
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(f.len(), 1);
    }
    let h = t
        .store
        .ended_histogram(Duration::from_secs(300), 12)
        .await
        .unwrap();
    assert_eq!(h.len(), 12);
    assert_eq!(h[11], 3, "{h:?}");
    assert_eq!(h.iter().sum::<u64>(), 3, "{h:?}");
}

pub async fn run_now_makes_a_later_job_due_version_guarded(b: Backend) {
    let t = Bundle::new(b).await;
    let later = t
        .enqueue(
            NewJob::new("k", json!({})).delay(std::time::Duration::from_secs(3600)),
            0,
        )
        .await;
    assert!(
        t.claim("default", "n", 1, 1).await.is_empty(),
        "not due yet"
    );
    let seen = t.get(later).await;
    let stale = t
        .store
        .job_run_now(RetryParams {
            id: later,
            expected_version: Some(seen.version - 1),
            now: t.at(1),
        })
        .await
        .unwrap();
    assert_eq!(stale, Guarded::Stale);
    let Guarded::Applied(j) = t
        .store
        .job_run_now(RetryParams {
            id: later,
            expected_version: Some(seen.version),
            now: t.at(1),
        })
        .await
        .unwrap()
    else {
        panic!("run now not applied")
    };
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.version, seen.version + 1);
    assert_eq!(j.run_at, t.at(1).unwrap());
    let c = t.claim("default", "n", 1, 2).await;
    assert_eq!(c.len(), 1, "due now");
    // Running: not a job to run now.
    let e = t
        .store
        .job_run_now(RetryParams {
            id: later,
            expected_version: None,
            now: t.at(3),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTransition { .. }), "{e}");
    let e = t
        .store
        .job_run_now(RetryParams {
            id: JobId(424_242),
            expected_version: None,
            now: t.at(3),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

/// A cancel at a version (the dashboard's pinned jobs) writes nothing to a job that moved on
/// since: a pending job made due again (`run now`, a new version) is left pending, and a
/// claimed one gets no cancel request; at the version read now it cancels as usual.
pub async fn cancel_at_a_version_leaves_a_job_that_moved_on(b: Backend) {
    let t = Bundle::new(b).await;
    let later = t
        .enqueue(
            NewJob::new("k", json!({})).delay(std::time::Duration::from_secs(3600)),
            0,
        )
        .await;
    let seen = t.get(later).await;
    let Guarded::Applied(_) = t
        .store
        .job_run_now(RetryParams {
            id: later,
            expected_version: Some(seen.version),
            now: t.at(1),
        })
        .await
        .unwrap()
    else {
        panic!("run now not applied")
    };
    let cancel = |version| {
        t.store.job_cancel_guarded(
            CancelParams {
                id: later,
                now: t.at(2),
            },
            Some(version),
        )
    };
    let Err(now) = cancel(seen.version).await.unwrap() else {
        panic!("a cancel at the old version was applied")
    };
    assert_eq!(
        (now.state, now.version),
        (JobState::Pending, seen.version + 1)
    );
    assert_eq!(
        t.get(later).await.state,
        JobState::Pending,
        "nothing written"
    );

    // Claimed since the version pinned: no cancel request reaches its holder.
    let pinned = t.get(later).await.version;
    let c = t.claim("default", "n", 1, 3).await.pop().unwrap();
    assert_eq!(c.id, later);
    let Err(running) = cancel(pinned).await.unwrap() else {
        panic!("a cancel at the version before the claim was applied")
    };
    assert_eq!(running.state, JobState::Running);
    assert_eq!(t.get(later).await.cancel_requested_at, None);

    // At the version it has now: requested as usual.
    let current = t.get(later).await.version;
    let Ok((CancelOutcome::Requested(j), _)) = cancel(current).await.unwrap() else {
        panic!("a cancel at the current version was not requested")
    };
    assert_eq!(j.cancel_requested_at, t.at(2));
}
