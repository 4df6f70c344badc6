//! Start-by deadlines: the claim returns the time left (negative once past, as for a node
//! back after every node was down past it), the sweeper ends pending, retrying and waiting
//! jobs past theirs `cancelled` with the code `expired` and leaves the others to run, and a
//! deadline that could never be met is refused with nothing stored.

use super::*;

fn job(n: i64) -> NewJob {
    NewJob::new("d", json!(n)).queue("dl")
}

async fn expire(t: &Bundle, at: i64) -> Vec<JobId> {
    let (mut ids, _) = t.store.job_expire_due(100, t.at(at)).await.unwrap();
    ids.sort_unstable();
    ids.into_iter().map(JobId).collect()
}

fn code(j: &Job) -> Option<&str> {
    j.last_error.as_ref().map(|e| e.code.as_str())
}

/// The claim returns the µs left before the job's deadline, counted from the claim's own
/// "now": positive before it, negative for a job claimed after it (every node was down past
/// it and one came back before any sweep), `None` without one.
pub async fn a_claim_returns_the_time_left_before_the_deadline(b: Backend) {
    let t = Bundle::new(b).await;
    let soon = t.enqueue(job(1).start_by(t.at(60).unwrap()), 0).await;
    let plain = t.enqueue(job(2), 0).await;
    let got = t.claim("dl", "n1", 10, 10).await;
    let left = |id: JobId| got.iter().find(|c| c.id == id).unwrap().start_within_us;
    assert_eq!(left(soon), Some(50_000_000));
    assert_eq!(left(plain), None);

    let late = t.enqueue(job(3).start_by(t.at(30).unwrap()), 20).await;
    let got = t.claim("dl", "n1", 10, 100).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].id, got[0].start_within_us),
        (late, Some(-70_000_000))
    );
}

/// The sweeper ends the pending, retrying and waiting jobs past their deadline (`cancelled`,
/// code `expired`), releasing their children by their policies, and never a running one or
/// one whose deadline is ahead, which then runs normally.
pub async fn the_sweeper_ends_jobs_past_their_deadline_and_leaves_the_rest(b: Backend) {
    let t = Bundle::new(b).await;
    let deadline = t.at(30).unwrap();
    let pending = t.enqueue(job(1).start_by(deadline), 0).await;
    let retrying = t.enqueue(job(2).start_by(deadline), 0).await;
    let running = t.enqueue(job(3).start_by(deadline), 0).await;
    let ahead = t.enqueue(job(4).start_by(t.at(1000).unwrap()), 0).await;
    let blocker = t.enqueue(job(5), 0).await;
    let waiting = t
        .enqueue(job(6).after(&[blocker]).start_by(deadline), 0)
        .await;
    let after_expired = t
        .enqueue(
            job(7)
                .after(&[pending])
                .on_parent_failure(crate::ParentPolicy::Run),
            0,
        )
        .await;
    // Claim all, then give them back but `retrying` (failed once) and `running`.
    for c in t.claim("dl", "n1", 10, 1).await {
        let f = if c.id == retrying {
            Finalize::retry(c.id, c.token, err("flaky", 1), Duration::from_secs(100))
        } else if c.id == running {
            continue;
        } else {
            Finalize::requeue(c.id, c.token, Duration::ZERO)
        };
        assert!(t.finalize(f, 1).await.is_applied());
    }
    assert!(expire(&t, 29).await.is_empty(), "not yet");
    assert_eq!(expire(&t, 30).await, vec![pending, retrying, waiting]);
    for id in [pending, retrying, waiting] {
        let j = t.get(id).await;
        assert_eq!(
            (j.state, code(&j)),
            (JobState::Cancelled, Some("expired")),
            "{id}"
        );
    }
    assert_eq!(t.get(running).await.state, JobState::Running);
    assert_eq!(t.get(after_expired).await.state, JobState::Pending);
    assert!(expire(&t, 40).await.is_empty(), "each once");
    // The job with a deadline ahead (and the others left) run normally.
    let ids: Vec<JobId> = t
        .claim("dl", "n1", 10, 50)
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    for id in [ahead, blocker, after_expired] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    assert!(!ids.contains(&pending) && !ids.contains(&retrying) && !ids.contains(&waiting));
}

/// A deadline already past at enqueue (the database's clock), or not after the job's run
/// time (absolute or relative), is refused naming `start_by`, and nothing is stored.
pub async fn deadlines_that_could_never_be_met_are_refused(b: Backend) {
    let t = Bundle::new(b).await;
    let at = |s: i64| t.at(s).unwrap();
    let bad = [
        job(1).start_by(at(10)),
        job(2).start_by(at(20)),
        job(3).run_at(at(50)).start_by(at(40)),
        job(4).delay(Duration::from_secs(60)).start_by(at(50)),
    ];
    for j in bad {
        match t.store.job_enqueue(j, t.at(20)).await {
            Err(Error::InvalidInput { field, reason }) => {
                assert_eq!(field, "start_by", "{reason}");
            }
            other => panic!("expected a refusal naming start_by, got {other:?}"),
        }
    }
    // In a batch: the whole batch is refused.
    let batch = EnqueueParams::many(vec![job(5), job(6).start_by(at(1))]).at(t.at(20));
    assert!(t.store.job_enqueue_many(batch).await.is_err());
    assert!(
        t.claim("dl", "n1", 10, 100).await.is_empty(),
        "nothing stored"
    );
    let ok = t.enqueue(job(7).start_by(at(21)), 20).await;
    assert_eq!(t.get(ok).await.state, JobState::Pending);
}

/// A job reads back its start-by deadline, live and archived (the job page and `Client::get`
/// show it, and an expired job's page says what it missed); a job without one reads none.
pub async fn a_jobs_deadline_is_read_back_live_and_archived(b: Backend) {
    let t = Bundle::new(b).await;
    let deadline = t.at(30).unwrap();
    let expiring = t.enqueue(job(1).start_by(deadline), 0).await;
    let plain = t.enqueue(job(2), 0).await;
    assert_eq!(t.get(expiring).await.start_by, Some(deadline));
    assert_eq!(t.get(plain).await.start_by, None);
    assert_eq!(expire(&t, 30).await, vec![expiring]);
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::ZERO,
            dead_older_than: Duration::ZERO,
            limit: 100,
            now: t.at(40),
        })
        .await
        .unwrap();
    assert_eq!(moved, 1);
    let j = t.get(expiring).await;
    assert!(j.archived_at.is_some());
    assert_eq!(
        (j.start_by, code(&j)),
        (Some(deadline), Some(crate::deadline::EXPIRED))
    );
    assert_eq!(t.get(plain).await.start_by, None);
}
