//! Conformance cases. Claiming: order, due time, what a claim writes, and no job claimed twice.

use super::*;

pub async fn claim_orders_by_priority_then_run_at_then_id(b: Backend) {
    let t = Bundle::new(b).await;
    let low = t
        .enqueue(NewJob::new("k", json!("low")).priority(20), 0)
        .await;
    let late = t
        .enqueue(NewJob::new("k", json!("late")).run_at(t.at(5).unwrap()), 0)
        .await;
    let early_b = t
        .enqueue(NewJob::new("k", json!("b")).run_at(t.at(1).unwrap()), 0)
        .await;
    let early_a = t
        .enqueue(NewJob::new("k", json!("a")).run_at(t.at(1).unwrap()), 0)
        .await;
    let urgent = t
        .enqueue(
            NewJob::new("k", json!("urgent"))
                .priority(1)
                .run_at(t.at(9).unwrap()),
            0,
        )
        .await;
    let other_queue = t
        .enqueue(NewJob::new("k", json!("q2")).queue("other").priority(0), 0)
        .await;
    let got: Vec<JobId> = t
        .claim("default", "n1", 3, 10)
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, vec![urgent, early_b, early_a]);
    let rest: Vec<JobId> = t
        .claim("default", "n1", 10, 10)
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(rest, vec![late, low]);
    assert!(!rest.contains(&other_queue));
}

pub async fn no_claim_before_run_at(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({})).delay(Duration::from_secs(60)),
            0,
        )
        .await;
    assert!(t.claim("default", "n1", 10, 59).await.is_empty());
    let got = t.claim("default", "n1", 10, 60).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
}

pub async fn claim_sets_lease_attempts_and_version(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({})).timeout(Duration::from_secs(5)),
            0,
        )
        .await;
    let c = t.claim("default", "node-a", 1, 2).await.pop().unwrap();
    assert_eq!((c.id, c.attempts), (id, 1));
    assert_eq!(c.timeout, Duration::from_secs(5));
    let j = &t.get(id).await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.attempts, 1);
    assert_eq!(j.version, 2);
    let lease = j.lease.as_ref().unwrap();
    assert_eq!(lease.owner.as_str(), "node-a");
    assert_eq!(lease.expires_at, t.at(32).unwrap());
    assert_eq!(
        (j.started_at, j.first_started_at, j.timeout_at),
        (None, None, None),
        "claimed is not started: no start, no timeout deadline until a renewal records one"
    );
    assert!(
        t.claim("default", "node-b", 1, 3).await.is_empty(),
        "a running job is not claimable"
    );
}

/// A claim returns the fields an attempt runs with, each from its own column: every value
/// differs from the others of its type, so a column read into the wrong field is seen.
pub async fn a_claim_returns_what_the_attempt_runs_with(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("mail", json!({"to": "a@b.c"}))
                .queue("q")
                .priority(3)
                .max_attempts(7)
                .timeout(Duration::from_secs(9))
                .run_at(t.at(1).unwrap()),
            0,
        )
        .await;
    let c = t.claim("q", "n", 1, 2).await.pop().unwrap();
    let j = t.get(id).await;
    assert_eq!(
        (c.id, c.queue.as_str(), c.kind.as_str(), c.priority),
        (id, "q", "mail", 3)
    );
    assert_eq!((&c.payload, &c.progress), (&json!({"to": "a@b.c"}), &None));
    assert_eq!((c.attempts, c.max_attempts), (1, 7));
    assert_eq!(c.timeout, Duration::from_secs(9));
    assert_eq!(
        (c.run_at, c.created_at),
        (t.at(1).unwrap(), t.at(0).unwrap())
    );
    assert_eq!(
        (c.run_at, c.created_at, c.attempts, c.max_attempts),
        (j.run_at, j.created_at, j.attempts, j.max_attempts),
        "the claim agrees with a read"
    );
}

pub async fn concurrent_claimers_never_claim_a_job_twice(b: Backend) {
    let t = Bundle::new(b).await;
    let jobs: Vec<NewJob> = (0..1000).map(|i| NewJob::new("k", json!(i))).collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = t.store.clone();
        let now = t.at(1);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store
                    .job_claim(ClaimParams {
                        queue: "default".into(),
                        owner: NodeId::new(format!("claimer-{n}")).unwrap(),
                        limit: 7,
                        kinds: None,
                        lease: Duration::from_secs(30),
                        now,
                    })
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|c| c.id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let unique: HashSet<JobId> = all.iter().copied().collect();
    assert_eq!(all.len(), 1000, "every job claimed");
    assert_eq!(unique.len(), 1000, "no job claimed twice");
    let counts = t.store.job_counts().await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (counts[0].state, counts[0].count),
        (JobState::Running, 1000)
    );
}
