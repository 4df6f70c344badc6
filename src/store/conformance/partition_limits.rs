//! Conformance cases. Queue control: per-partition concurrency limits — a backlog of full
//! partitions hides no other partition's due jobs, and partitions at their limit are skipped.

use super::queues::{claim_in_parallel, params, partitioned};
use super::*;

/// A backlog of partitions at their limit longer than any window a claim reads: the due jobs
/// behind it — other partitions', keyless ones — are still found, each partition given at
/// most its room, in claim order, of the kinds asked for.
pub async fn a_long_backlog_of_full_partitions_hides_no_others_due_jobs(b: Backend) {
    let t = Bundle::new(b).await;
    let mut jobs: Vec<NewJob> = (0..600)
        .map(|i| NewJob::new("k", json!(i)).queue("t").partition("A"))
        .collect();
    jobs.extend((0..3).map(|i| NewJob::new("k", json!(i)).queue("t").partition("B")));
    jobs.extend((0..2).map(|i| NewJob::new("other", json!(i)).queue("t").partition("D")));
    jobs.extend((0..2).map(|i| NewJob::new("k", json!(i)).queue("t").partition("C")));
    jobs.extend((0..2).map(|i| NewJob::new("k", json!(i)).queue("t")));
    jobs.push(
        NewJob::new("k", json!("later"))
            .queue("t")
            .partition("E")
            .run_at(t.t0 + chrono::Duration::seconds(60)),
    );
    let ids = t
        .store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let id = |i: usize| ids[i].id;
    t.store
        .queue_set_limits("t", QueueLimits::default().per_partition(2), t.at(0))
        .await
        .unwrap();
    let claim = async |limit: u32, at: i64| -> Vec<ClaimedJob> {
        let mut got = t
            .store
            .job_claim(ClaimParams {
                kinds: Some(vec!["k".into()]),
                ..params("t", "n1", limit, t.at(at))
            })
            .await
            .unwrap();
        got.sort_by_key(|c| c.id);
        got
    };
    let ids_of = |got: &[ClaimedJob]| got.iter().map(|c| c.id).collect::<Vec<_>>();
    // The head of the queue: A's first two, all A may run.
    assert_eq!(ids_of(&claim(2, 1).await), vec![id(0), id(1)]);
    // A is at its limit, its 598 waiting jobs first in claim order: B's first two, C's two,
    // the first keyless one — the first five claimable, in claim order; D's are of a kind
    // this node does not run.
    let second = claim(5, 2).await;
    assert_eq!(
        ids_of(&second),
        vec![id(600), id(601), id(605), id(606), id(607)]
    );
    // A, B and C at their limit: the other keyless job; E's is not due.
    assert_eq!(ids_of(&claim(10, 3).await), vec![id(608)]);
    assert!(claim(10, 4).await.is_empty());
    // One of B's ends: B's third.
    t.finalize(
        Finalize::succeeded(second[0].id, second[0].token.clone(), json!(null)),
        5,
    )
    .await;
    assert_eq!(ids_of(&claim(10, 6).await), vec![id(602)]);
    // E's job once due.
    assert_eq!(ids_of(&claim(10, 61).await), vec![id(609)]);
}

/// Behind a backlog of a full partition, more waiting jobs of other partitions than one
/// statement of the walk reads (250 partitions × 3, two of each claimable) are all found, in
/// claim order, a claim at a time — also with a rate limit, which sends PostgreSQL's claim
/// down the same path as the others'.
pub async fn a_walk_past_a_backlog_finds_every_partition_in_claim_order(b: Backend) {
    let t = Bundle::new(b).await;
    let mut jobs: Vec<NewJob> = (0..201)
        .map(|i| NewJob::new("k", json!(i)).queue("t").partition("A"))
        .collect();
    // Keys in the reverse of claim order, so the walk's key order is not the answer.
    jobs.extend((0..750).map(|i| {
        NewJob::new("k", json!(i))
            .queue("t")
            .partition(format!("p{:03}", 249 - i / 3))
    }));
    let ids = t
        .store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    t.store
        .queue_set_limits(
            "t",
            QueueLimits::default()
                .per_partition(2)
                .rate(RateLimit::new(1_000_000, Duration::from_secs(1)).unwrap()),
            t.at(0),
        )
        .await
        .unwrap();
    // Every partition's first two, in claim order.
    let claimable: Vec<JobId> = (0..250)
        .flat_map(|p| [ids[201 + 3 * p].id, ids[202 + 3 * p].id])
        .collect();
    let first = t.claim("t", "n1", 10, 1).await;
    assert_eq!(
        first.iter().map(|c| c.id).collect::<Vec<_>>(),
        [ids[0].id, ids[1].id]
            .into_iter()
            .chain(claimable[..8].iter().copied())
            .collect::<Vec<_>>(),
        "A's first two, then the first eight others in claim order"
    );
    let mut next = 8;
    for round in 0..50 {
        let got = t.claim("t", "n1", 10, 2 + round).await;
        let mut got: Vec<JobId> = got.iter().map(|c| c.id).collect();
        got.sort();
        let want = &claimable[next..(next + 10).min(claimable.len())];
        assert_eq!(got, want, "claim {round} after the first");
        next += want.len();
        if next == claimable.len() {
            break;
        }
    }
    assert_eq!(next, claimable.len());
    assert!(
        t.claim("t", "n1", 10, 60).await.is_empty(),
        "every partition at its limit"
    );
}

/// A job waiting for its retry behind a backlog of a full partition is found by the walk past
/// the head as a pending one is (on MySQL each waiting state is walked on its own).
pub async fn a_retrying_job_behind_a_backlog_is_found(b: Backend) {
    let t = Bundle::new(b).await;
    let mut jobs: Vec<NewJob> = (0..200)
        .map(|i| NewJob::new("k", json!(i)).queue("t").partition("A"))
        .collect();
    jobs.push(NewJob::new("k", json!("r")).queue("t").partition("R"));
    let ids = t
        .store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let r = ids[200].id;
    t.store
        .queue_set_limits("t", QueueLimits::default().per_partition(1), t.at(0))
        .await
        .unwrap();
    assert_eq!(t.claim("t", "n1", 1, 1).await[0].id, ids[0].id);
    let got = t.claim("t", "n1", 10, 2).await;
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), [r]);
    let token = got[0].token.clone();
    t.finalize(
        Finalize::retry(r, token, err("flaky", 1), Duration::ZERO),
        3,
    )
    .await;
    assert_eq!(
        t.store.job_get(r).await.unwrap().unwrap().state,
        JobState::Retrying
    );
    let again = t.claim("t", "n1", 10, 4).await;
    assert_eq!(
        again.iter().map(|c| (c.id, c.attempts)).collect::<Vec<_>>(),
        [(r, 2)],
        "the retrying job of a partition with room, behind A's backlog"
    );
}

/// A keyless job behind a backlog of a full partition longer than the head and the 1,000 due
/// jobs after it: MySQL's partition index holds keyless jobs too, so its claim finds it at
/// once; PostgreSQL's and SQLite's hold keyed jobs only, so there it waits until the backlog
/// ahead shortens (ARCHITECTURE.md §7.5), then runs.
pub async fn a_keyless_job_far_behind_a_backlog_runs(b: Backend) {
    let t = Bundle::new(b).await;
    let mut jobs: Vec<NewJob> = (0..1300)
        .map(|i| NewJob::new("k", json!(i)).queue("t").partition("A"))
        .collect();
    jobs.push(NewJob::new("k", json!("keyless")).queue("t"));
    let ids = t
        .store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let keyless = ids[1300].id;
    t.store
        .queue_set_limits("t", QueueLimits::default().per_partition(1), t.at(0))
        .await
        .unwrap();
    let first = t.claim("t", "n1", 1, 1).await;
    assert_eq!(first[0].id, ids[0].id);
    let got: Vec<JobId> = t
        .claim("t", "n1", 4, 2)
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    if b == Backend::Mysql {
        assert_eq!(got, [keyless]);
        return;
    }
    assert!(got.is_empty(), "{got:?}");
    // A's backlog shortens: 200 of its jobs end, one at a time.
    let mut running = first[0].clone();
    for n in 0..200 {
        t.finalize(
            Finalize::succeeded(running.id, running.token.clone(), json!(null)),
            3 + n,
        )
        .await;
        let next = t.claim("t", "n1", 1, 3 + n).await;
        running = next[0].clone();
    }
    // 1,099 of A's jobs wait ahead of it: within the head and the 1,000 after it.
    let got: Vec<JobId> = t
        .claim("t", "n1", 4, 300)
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, [keyless]);
}

pub async fn partitions_at_their_limit_are_skipped_and_others_run(b: Backend) {
    let t = Bundle::new(b).await;
    // A's backlog comes first in claim order; B and C behind it; keyless jobs last.
    let mut jobs: Vec<NewJob> = (0..50)
        .map(|i| {
            NewJob::new("k", json!({ "i": i, "p": "A" }))
                .queue("t")
                .partition("A")
        })
        .collect();
    for p in ["B", "C"] {
        jobs.extend((0..5).map(|i| {
            NewJob::new("k", json!({ "i": i, "p": p }))
                .queue("t")
                .partition(p)
        }));
    }
    jobs.extend((0..3).map(|i| NewJob::new("k", json!({ "i": i })).queue("t")));
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    t.store
        .queue_set_limits("t", QueueLimits::default().per_partition(2), t.at(0))
        .await
        .unwrap();
    let got = t.claim("t", "n1", 100, 1).await;
    let count =
        |got: &[ClaimedJob], p: Option<&str>| got.iter().filter(|c| partition_of(c) == p).count();
    assert_eq!(
        (
            count(&got, Some("A")),
            count(&got, Some("B")),
            count(&got, Some("C")),
            count(&got, None)
        ),
        (2, 2, 2, 3),
        "two per partition, keyless jobs unlimited"
    );
    // Every partition at its limit: A's backlog hides nothing, and nothing more is claimed.
    assert!(t.claim("t", "n1", 100, 2).await.is_empty());
    // One of A's finishes: exactly one more of A.
    let a = got.iter().find(|c| partition_of(c) == Some("A")).unwrap();
    t.finalize(Finalize::succeeded(a.id, a.token.clone(), json!(null)), 3)
        .await;
    let next = t.claim("t", "n1", 100, 3).await;
    assert_eq!(next.len(), 1);
    assert_eq!(partition_of(&next[0]), Some("A"));

    // Concurrent claimers over 1,000 jobs in 10 partitions limited to 2 each: never more
    // than 2 of a partition held at once, counted as in the global-limit case.
    let t = partitioned(b, QueueLimits::default().per_partition(2)).await;
    let held: std::sync::Mutex<std::collections::HashMap<String, i64>> = Default::default();
    let total = claim_in_parallel(&t, "t", 5, move |got, sign| {
        let mut h = held.lock().unwrap();
        for c in got {
            let p = partition_of(c).unwrap().to_string();
            let e = h.entry(p.clone()).or_insert(0);
            *e += sign;
            assert!(*e <= 2, "{e} jobs of {p} held under a limit of 2");
        }
    })
    .await;
    assert_eq!(total, 1000, "every job ran");
}

/// Both limits at once, under 8 concurrent claimers over 1,000 jobs in 10 partitions: never
/// more than 5 of the queue held, never more than 2 of one partition — the global count and
/// the per-partition counts taken by one claim must agree.
pub async fn a_global_and_a_partition_limit_hold_together(b: Backend) {
    let t = partitioned(b, QueueLimits::default().concurrency(5).per_partition(2)).await;
    #[derive(Default)]
    struct Held {
        all: i64,
        peak: i64,
        parts: std::collections::HashMap<String, i64>,
    }
    let held: Arc<std::sync::Mutex<Held>> = Default::default();
    let h = held.clone();
    let total = claim_in_parallel(&t, "t", 4, move |got, sign| {
        let mut h = h.lock().unwrap();
        h.all += sign * i64::try_from(got.len()).unwrap();
        h.peak = h.peak.max(h.all);
        assert!(h.all <= 5, "{} jobs held under a global limit of 5", h.all);
        for c in got {
            let p = partition_of(c).unwrap().to_string();
            let e = h.parts.entry(p.clone()).or_insert(0);
            *e += sign;
            assert!(*e <= 2, "{e} jobs of {p} held under a limit of 2");
        }
    })
    .await;
    assert_eq!(total, 1000, "every job ran");
    assert!(held.lock().unwrap().peak >= 2, "claimers overlapped");
}
