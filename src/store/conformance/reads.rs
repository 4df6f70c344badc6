//! Conformance cases. Reads and the clock: list pages and filters, counts, and the database clock used when no instant is bound.

use super::*;

pub async fn list_pages_and_filters_and_counts(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..5 {
        t.enqueue(NewJob::new("a", json!(i)), 0).await;
    }
    for i in 0..3 {
        t.enqueue(NewJob::new("b", json!(i)).queue("q2"), 0).await;
    }
    let page1 = t
        .store
        .job_list(ListParams {
            limit: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let page2 = t
        .store
        .job_list(ListParams {
            limit: 3,
            after: Some(page1[2].id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page1.len(), 3);
    assert_eq!(page2.len(), 3);
    assert!(page1[2].id < page2[0].id);
    let bs = t
        .store
        .job_list(ListParams {
            kind: Some("b".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(bs.len(), 3);
    let q2 = t
        .store
        .job_list(ListParams {
            queue: Some("q2".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(q2.len(), 3);
    t.claim("q2", "n", 1, 1).await;
    let running = t
        .store
        .job_list(ListParams {
            state: Some(JobState::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    let counts = t.store.job_counts().await.unwrap();
    let find = |q: &str, s| {
        counts
            .iter()
            .find(|c| c.queue == q && c.state == s)
            .map(|c| c.count)
    };
    assert_eq!(find("default", JobState::Pending), Some(5));
    assert_eq!(find("q2", JobState::Pending), Some(2));
    assert_eq!(find("q2", JobState::Running), Some(1));
}

pub async fn database_clock_is_used_when_no_time_is_bound(b: Backend) {
    let t = Bundle::new(b).await;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let e = t
        .store
        .job_enqueue(NewJob::new("k", json!({})), None)
        .await
        .unwrap();
    let after = Utc::now() + chrono::Duration::seconds(5);
    let j = t.get(e.id).await;
    assert!(
        j.created_at > before && j.created_at < after,
        "created_at {} from the database clock",
        j.created_at
    );
    let c = t
        .store
        .job_claim(ClaimParams {
            queue: "default".into(),
            owner: NodeId::new("n").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(c.len(), 1, "due by the database clock");
    let exp = t.get(c[0].id).await.lease.unwrap().expires_at;
    assert!(
        exp > before + chrono::Duration::seconds(30) && exp < after + chrono::Duration::seconds(30)
    );
}
