//! Conformance cases. Job progress: written by the renewal under the attempt's token, refused
//! for a zombie, kept across attempts and on the archive.

use super::*;

/// Renews `held` at `at` carrying `progress` (JSON text) and a start (recorded once); the
/// one result.
async fn renew_with(
    t: &Bundle,
    held: &ClaimedJob,
    progress: Option<&str>,
    at: i64,
) -> Guarded<Renewed> {
    t.store
        .job_renew_leases(RenewParams {
            timeout_grace: Duration::ZERO,
            leases: vec![LeaseRef {
                id: held.id,
                token: held.token.clone(),
                started_ago: Some(Duration::from_secs(1)),
                progress: progress.map(str::to_string),
            }],
            lease: Duration::from_secs(30),
            now: t.at(at),
        })
        .await
        .unwrap()
        .pop()
        .unwrap()
        .1
}

pub async fn progress_is_written_with_the_renewal_and_guarded_by_the_token(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!(0)).max_attempts(3), 0)
        .await;
    let first = t.claim("default", "n1", 1, 0).await.pop().unwrap();
    assert_eq!(first.progress, None, "a new job has no progress");

    // Written by the holder's renewal; a renewal without a report keeps it.
    assert!(renew_with(&t, &first, Some(r#"{"done":10,"of":100}"#), 5)
        .await
        .is_applied());
    assert_eq!(
        t.get(id).await.progress,
        Some(json!({"done": 10, "of": 100}))
    );
    assert!(renew_with(&t, &first, None, 10).await.is_applied());
    assert_eq!(
        t.get(id).await.progress,
        Some(json!({"done": 10, "of": 100}))
    );
    // Any JSON value, a string included (stored as JSON, not as bare text).
    assert!(renew_with(&t, &first, Some(r#""half way""#), 12)
        .await
        .is_applied());
    assert_eq!(t.get(id).await.progress, Some(json!("half way")));
    assert!(renew_with(&t, &first, Some(r#"{"done":40}"#), 15)
        .await
        .is_applied());

    // The lease expires; the job is reclaimed and claimed again by another node.
    assert_eq!(t.reclaim(100).await.len(), 1);
    let second = t.claim("default", "n2", 1, 200).await.pop().unwrap();
    assert_eq!(second.attempts, 2);
    assert_eq!(
        second.progress,
        Some(json!({"done": 40})),
        "the next attempt is claimed with the last progress: it can resume"
    );

    // The zombie's report is refused with its renewal, and changes nothing.
    assert_eq!(
        renew_with(&t, &first, Some(r#"{"done":99}"#), 201).await,
        Guarded::LeaseLost
    );
    assert_eq!(t.get(id).await.progress, Some(json!({"done": 40})));
    // Nor does a report carried with a made-up token for the same job.
    let forged = ClaimedJob {
        token: LeaseToken::generate(),
        ..second.clone()
    };
    assert_eq!(
        renew_with(&t, &forged, Some("1"), 202).await,
        Guarded::LeaseLost
    );
    assert_eq!(t.get(id).await.progress, Some(json!({"done": 40})));

    // The holder's report, then success: progress stays beside the result, and on the archive.
    assert!(renew_with(&t, &second, Some(r#"{"done":100}"#), 210)
        .await
        .is_applied());
    assert!(t
        .finalize(
            Finalize::succeeded(id, second.token.clone(), json!("ok")),
            220
        )
        .await
        .is_applied());
    let done = t.get(id).await;
    assert_eq!(
        (done.state, done.progress),
        (JobState::Succeeded, Some(json!({"done": 100})))
    );
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::from_secs(1),
            dead_older_than: Duration::from_secs(1),
            limit: 10,
            now: t.at(300),
        })
        .await
        .unwrap();
    assert_eq!(moved, 1);
    let archived = t.get(id).await;
    assert!(archived.archived_at.is_some());
    assert_eq!(archived.progress, Some(json!({"done": 100})));
}
