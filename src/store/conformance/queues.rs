//! Conformance cases. Queue control: pause, global and per-partition concurrency limits,
//! rate limits — each enforced by the claim on every store, whatever a store remembers.

use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

fn params(queue: &str, owner: &str, limit: u32, now: Option<DateTime<Utc>>) -> ClaimParams {
    ClaimParams {
        queue: queue.into(),
        owner: NodeId::new(owner).unwrap(),
        limit,
        kinds: None,
        lease: Duration::from_secs(30),
        now,
    }
}

async fn enqueue_n(t: &Bundle, queue: &str, n: usize) -> Vec<JobId> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("k", json!(i)).queue(queue))
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

async fn running_in(t: &Bundle, queue: &str) -> u64 {
    t.store
        .job_counts()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.queue == queue && c.state == JobState::Running)
        .map(|c| c.count)
        .sum()
}

/// Eight claimers over `queue`, claimer n taking only kind `k{n % 4}` (so they look at
/// disjoint jobs and only the queue's counts keep them under a limit together), `per_claim`
/// at a time, until 50 claims in a row come back empty. Each claim is shown to `hold` with
/// `+1` while its jobs are held, then with `-1` — before they are finalized, so what `hold`
/// counts never exceeds what the database counts. Answers how many jobs were claimed.
async fn claim_in_parallel<F>(t: &Bundle, queue: &str, per_claim: u32, hold: F) -> usize
where
    F: Fn(&[ClaimedJob], i64) + Send + Sync + 'static,
{
    let hold = Arc::new(hold);
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (store, hold, queue) = (t.store.clone(), hold.clone(), queue.to_string());
        let now = t.at(1);
        tasks.push(tokio::spawn(async move {
            let mut mine = 0;
            let mut idle = 0;
            while idle < 50 {
                let got = store
                    .job_claim(ClaimParams {
                        kinds: Some(vec![format!("k{}", n % 4)]),
                        ..params(&queue, &format!("claimer-{n}"), per_claim, now)
                    })
                    .await
                    .unwrap();
                if got.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                hold(&got, 1);
                tokio::task::yield_now().await;
                hold(&got, -1);
                mine += got.len();
                let items = got
                    .into_iter()
                    .map(|c| Finalize::succeeded(c.job.id, c.token, json!(null)))
                    .collect();
                store
                    .job_finalize_many(FinalizeParams { items, now })
                    .await
                    .unwrap();
            }
            mine
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total
}

pub async fn a_paused_queue_is_never_claimed_and_the_pause_is_shared_and_stored(b: Backend) {
    let t = Bundle::new(b).await;
    enqueue_n(&t, "mail", 10).await;
    enqueue_n(&t, "other", 3).await;
    // A running job of the queue, claimed before the pause, finishes normally.
    let before = t.claim("mail", "n1", 1, 1).await;
    assert_eq!(before.len(), 1);
    // A second store on the same database, which has claimed this queue (so it believes it
    // uncontrolled) pauses nothing itself: the pause comes from the first.
    let other = t.db.store().await;
    assert_eq!(
        other
            .job_claim(params("mail", "n2", 1, t.at(1)))
            .await
            .unwrap()
            .len(),
        1
    );
    let info = t
        .store
        .queue_pause("mail", Some("ops: provider outage"), t.at(2))
        .await
        .unwrap()
        .unwrap();
    assert!(info.is_paused());
    assert_eq!(info.paused_at, t.at(2));
    assert_eq!(info.paused_by.as_deref(), Some("ops: provider outage"));
    for store in [&t.store, &other] {
        assert!(store
            .job_claim(params("mail", "n3", 10, t.at(3)))
            .await
            .unwrap()
            .is_empty());
    }
    // Other queues run on.
    assert_eq!(t.claim("other", "n1", 10, 3).await.len(), 3);
    let done = t
        .finalize(
            Finalize::succeeded(before[0].job.id, before[0].token.clone(), json!(1)),
            4,
        )
        .await;
    assert_eq!(done, Guarded::Applied(JobState::Succeeded));
    // Stored: a new store (a restarted node) sees it.
    let restarted = t.db.store().await;
    assert!(restarted
        .job_claim(params("mail", "n4", 10, t.at(5)))
        .await
        .unwrap()
        .is_empty());
    assert!(restarted
        .queue_get("mail")
        .await
        .unwrap()
        .unwrap()
        .is_paused());
    // Pausing again changes who, not when.
    let again = t
        .store
        .queue_pause("mail", Some("alice"), t.at(6))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.paused_at, again.paused_by.as_deref()),
        (t.at(2), Some("alice"))
    );
    // Resumed: every store claims again, the fast way once it has seen the row gone.
    assert!(t
        .store
        .queue_pause("mail", None, t.at(7))
        .await
        .unwrap()
        .is_none());
    assert!(t.store.queues_list().await.unwrap().is_empty());
    let mut got = 0;
    for store in [&restarted, &other, &restarted] {
        got += store
            .job_claim(params("mail", "n5", 3, t.at(8)))
            .await
            .unwrap()
            .len();
    }
    assert_eq!(got, 8, "the 8 jobs left are claimed after the resume");
}

pub async fn a_concurrency_limit_is_never_exceeded_by_concurrent_claimers(b: Backend) {
    const LIMIT: i64 = 5;
    let t = Bundle::new(b).await;
    // Four kinds, each claimer taking one: claimers look at disjoint jobs, so only the
    // queue's count can keep them under the limit together.
    let jobs: Vec<NewJob> = (0..1000)
        .map(|i| NewJob::new(format!("k{}", i % 4), json!(i)).queue("q"))
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    t.store
        .queue_set_limits("q", QueueLimits::default().concurrency(5), t.at(0))
        .await
        .unwrap();
    let held = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let (h, p) = (held.clone(), peak.clone());
    let total = claim_in_parallel(&t, "q", 3, move |got, sign| {
        let k = sign * i64::try_from(got.len()).unwrap();
        let now = h.fetch_add(k, Ordering::SeqCst) + k;
        p.fetch_max(now, Ordering::SeqCst);
        assert!(now <= LIMIT, "{now} jobs held under a limit of {LIMIT}");
    })
    .await;
    assert_eq!(total, 1000, "every job ran");
    assert!(peak.load(Ordering::SeqCst) >= 2, "claimers overlapped");
    // Lowering the limit below what runs stops claims until the count is below it.
    enqueue_n(&t, "q", 10).await;
    let a = t.claim("q", "n1", 10, 2).await;
    assert_eq!(a.len(), 5);
    assert_eq!(running_in(&t, "q").await, 5);
    t.store
        .queue_set_limits("q", QueueLimits::default().concurrency(2), t.at(3))
        .await
        .unwrap();
    for c in &a[..3] {
        t.finalize(
            Finalize::succeeded(c.job.id, c.token.clone(), json!(null)),
            4,
        )
        .await;
        assert!(
            t.claim("q", "n1", 10, 4).await.is_empty(),
            "still ≥ 2 running"
        );
    }
    t.finalize(
        Finalize::succeeded(a[3].job.id, a[3].token.clone(), json!(null)),
        5,
    )
    .await;
    assert_eq!(t.claim("q", "n1", 10, 5).await.len(), 1);
    // Lifting every limit returns the queue to the fast claim.
    assert!(t
        .store
        .queue_set_limits("q", QueueLimits::default(), t.at(6))
        .await
        .unwrap()
        .is_none());
    assert_eq!(t.claim("q", "n1", 10, 6).await.len(), 4);
}

pub async fn a_rate_limit_bounds_claims_in_every_window(b: Backend) {
    let t = Bundle::new(b).await;
    enqueue_n(&t, "api", 200).await;
    let per = Duration::from_secs(10);
    t.store
        .queue_set_limits(
            "api",
            QueueLimits::default().rate(RateLimit::new(10, per).unwrap()),
            t.at(0),
        )
        .await
        .unwrap();
    let first = t
        .store
        .claim(params("api", "n1", 4, t.at(0)))
        .await
        .unwrap();
    assert_eq!((first.jobs.len(), first.wait), (4, None));
    assert!(
        first.controlled(),
        "a rate-limited queue's claim is a controlled one"
    );
    let second = t
        .store
        .claim(params("api", "n1", 50, t.at(3)))
        .await
        .unwrap();
    assert_eq!(second.jobs.len(), 6, "the rest of the window");
    let none = t
        .store
        .claim(params("api", "n1", 50, t.at(4)))
        .await
        .unwrap();
    assert!(none.jobs.is_empty());
    // The window is the period plus the start margin (a job starts up to that long after
    // its claim): the 4 claimed at 0 leave it at +10.05 s.
    assert_eq!(
        none.wait,
        Some(Duration::from_secs(6) + crate::RATE_START_MARGIN),
        "until the first claim leaves"
    );
    let margin = chrono::Duration::from_std(crate::RATE_START_MARGIN).unwrap();
    let early = t
        .store
        .claim(params("api", "n1", 50, t.at(10)))
        .await
        .unwrap();
    assert!(early.jobs.is_empty(), "at +10 s the margin is not over");
    // (t − 10.05 s, t]: at +10.05 s the 4 claimed at 0 have left, the 6 at +3 s have not.
    let third = t
        .store
        .claim(params("api", "n1", 50, t.at(10).map(|t| t + margin)))
        .await
        .unwrap();
    assert_eq!(third.jobs.len(), 4);

    // Concurrent claimers over a minute of test clock: from the claim times the database
    // stored on the jobs, no window of 10 s holds more than 10.
    let mut tasks = Vec::new();
    for n in 0..8_i64 {
        let store = t.store.clone();
        let t0 = t.t0;
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            for step in 0..60_i64 {
                let now = t0 + chrono::Duration::milliseconds(11_000 + step * 1000 + n * 37);
                let got = store
                    .job_claim(params("api", &format!("c{n}"), 3, Some(now)))
                    .await
                    .unwrap();
                times.extend(
                    got.iter()
                        .map(|c| c.job.lease.as_ref().unwrap().heartbeat_at.unwrap()),
                );
            }
            times
        }));
    }
    let mut times: Vec<DateTime<Utc>> = Vec::new();
    for task in tasks {
        times.extend(task.await.unwrap());
    }
    for claimed in [&first, &second, &third] {
        times.extend(
            claimed
                .jobs
                .iter()
                .map(|c| c.job.lease.as_ref().unwrap().heartbeat_at.unwrap()),
        );
    }
    times.sort();
    assert!(times.len() >= 50, "claims went on: {}", times.len());
    for (i, end) in times.iter().enumerate() {
        let inside = times[..=i]
            .iter()
            .filter(|s| **s > *end - chrono::Duration::seconds(10))
            .count();
        assert!(inside <= 10, "{inside} claims in the 10 s ending {end}");
    }
}

/// A rate-limited claim that waited for the queue's lock records the time it took it, not
/// the time it asked: recorded earlier than it took effect, the claims right after a window
/// could crowd into that window in real time.
pub async fn a_rate_limited_claim_records_when_it_took_the_queue_lock(b: Backend) {
    use diesel_async::SimpleAsyncConnection;

    let t = Bundle::new(b).await;
    // The database's clock throughout: due now, a window of a minute.
    let jobs: Vec<NewJob> = (0..3)
        .map(|i| NewJob::new("k", json!(i)).queue("api"))
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs))
        .await
        .unwrap();
    t.store
        .queue_set_limits(
            "api",
            QueueLimits::default().rate(RateLimit::new(100, Duration::from_secs(60)).unwrap()),
            None,
        )
        .await
        .unwrap();
    // A claim of a kind nobody enqueued: the store learns how this queue is claimed (on
    // PostgreSQL, with its rate limit, not by the one-statement claim).
    let none = ClaimParams {
        kinds: Some(vec!["none".into()]),
        ..params("api", "n1", 3, None)
    };
    assert!(t.store.job_claim(none).await.unwrap().is_empty());
    macro_rules! held {
        ($conn:expr, $begin:expr) => {{
            let holder = &mut $conn;
            holder.batch_execute($begin).await.unwrap();
            if $begin != "BEGIN IMMEDIATE" {
                holder
                    .batch_execute("UPDATE jobvisor_queues SET claims = claims WHERE name = 'api'")
                    .await
                    .unwrap();
            }
            let claim = tokio::spawn({
                let s = t.store.clone();
                async move { s.job_claim(params("api", "n1", 3, None)).await }
            });
            tokio::time::sleep(Duration::from_millis(600)).await;
            let released = Utc::now();
            holder.batch_execute("COMMIT").await.unwrap();
            (claim.await.unwrap().unwrap(), released)
        }};
    }
    let (claimed, released) = match b {
        Backend::Postgres => held!(
            AsyncPgConnection::establish(&t.db.url).await.unwrap(),
            "BEGIN"
        ),
        Backend::Mysql => held!(
            AsyncMysqlConnection::establish(&t.db.url).await.unwrap(),
            "BEGIN"
        ),
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            held!(
                SqliteConn::establish(&path).await.unwrap(),
                "BEGIN IMMEDIATE"
            )
        }
    };
    assert_eq!(claimed.len(), 3, "the claim went on once the lock freed");
    let recorded = claimed[0].job.lease.as_ref().unwrap().heartbeat_at.unwrap();
    // Both clocks are this machine's; the database's may round down to a millisecond.
    assert!(
        recorded >= released - chrono::Duration::milliseconds(5),
        "the claim recorded {recorded}, before the lock it waited for was released at \
         {released}"
    );
}

pub async fn bad_queue_settings_get_clear_errors_and_change_nothing(b: Backend) {
    let t = Bundle::new(b).await;
    enqueue_n(&t, "q", 1).await;
    t.store
        .queue_set_limits("q", QueueLimits::default().concurrency(3), t.at(0))
        .await
        .unwrap();
    let cases: Vec<(QueueLimits, &str)> = vec![
        (QueueLimits::default().concurrency(0), "concurrency"),
        (QueueLimits::default().per_partition(0), "per_partition"),
        (
            QueueLimits::default().concurrency(crate::store::MAX_LIMIT + 1),
            "concurrency",
        ),
    ];
    for (limits, field) in cases {
        let err = t
            .store
            .queue_set_limits("q", limits, t.at(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { field: f, .. } if *f == field),
            "{err}"
        );
    }
    for (jobs, per) in [
        (0, Duration::from_secs(1)),
        (5, Duration::ZERO),
        (5, Duration::from_secs(2 * 24 * 3600)),
    ] {
        let err = RateLimit::new(jobs, per).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { field: "rate", .. }),
            "{err}"
        );
    }
    // A queue no node serves yet takes a pause (for its first node) and is known from then
    // on; resumed, it has no settings left.
    assert!(!t.store.queue_is_known("no-such-queue").await.unwrap());
    let info = t
        .store
        .queue_pause("no-such-queue", Some("me"), t.at(1))
        .await
        .unwrap()
        .unwrap();
    assert!(info.is_paused());
    assert!(t.store.queue_is_known("no-such-queue").await.unwrap());
    assert_eq!(
        t.store
            .queue_pause("no-such-queue", None, t.at(2))
            .await
            .unwrap(),
        None
    );
    for bad in ["", " q", &"x".repeat(200)] {
        let err = t
            .store
            .queue_pause(bad, Some("me"), t.at(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { field: "queue", .. }),
            "{err}"
        );
    }
    let err = t
        .store
        .queue_pause("q", Some(""), t.at(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidInput {
                field: "paused_by",
                ..
            }
        ),
        "{err}"
    );
    let after = t.store.queues_list().await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].limits.concurrency, Some(3));
    assert!(!after[0].is_paused());
}

/// Enqueues `n` jobs on `queue`, spread in turn over `kinds` kinds (`k0`, `k1`, …) and
/// `parts` partitions (`p0`, `p1`, …).
async fn enqueue_spread(t: &Bundle, queue: &str, n: usize, kinds: usize, parts: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new(format!("k{}", i % kinds), json!(i))
                .queue(queue)
                .partition(format!("p{}", i % parts))
        })
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
}

/// A queue `t` of 1,000 jobs of four kinds in 10 partitions, under `limits`.
async fn partitioned(b: Backend, limits: QueueLimits) -> Bundle {
    let t = Bundle::new(b).await;
    enqueue_spread(&t, "t", 1000, 4, 10).await;
    t.store
        .queue_set_limits("t", limits, t.at(0))
        .await
        .unwrap();
    t
}

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
        got.sort_by_key(|c| c.job.id);
        got
    };
    let ids_of = |got: &[ClaimedJob]| got.iter().map(|c| c.job.id).collect::<Vec<_>>();
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
        Finalize::succeeded(second[0].job.id, second[0].token.clone(), json!(null)),
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
        first.iter().map(|c| c.job.id).collect::<Vec<_>>(),
        [ids[0].id, ids[1].id]
            .into_iter()
            .chain(claimable[..8].iter().copied())
            .collect::<Vec<_>>(),
        "A's first two, then the first eight others in claim order"
    );
    let mut next = 8;
    for round in 0..50 {
        let got = t.claim("t", "n1", 10, 2 + round).await;
        let mut got: Vec<JobId> = got.iter().map(|c| c.job.id).collect();
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
    assert_eq!(t.claim("t", "n1", 1, 1).await[0].job.id, ids[0].id);
    let got = t.claim("t", "n1", 10, 2).await;
    assert_eq!(got.iter().map(|c| c.job.id).collect::<Vec<_>>(), [r]);
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
        again
            .iter()
            .map(|c| (c.job.id, c.job.attempts))
            .collect::<Vec<_>>(),
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
    assert_eq!(first[0].job.id, ids[0].id);
    let got: Vec<JobId> = t
        .claim("t", "n1", 4, 2)
        .await
        .iter()
        .map(|c| c.job.id)
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
            Finalize::succeeded(running.job.id, running.token.clone(), json!(null)),
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
        .map(|c| c.job.id)
        .collect();
    assert_eq!(got, [keyless]);
}

pub async fn partitions_at_their_limit_are_skipped_and_others_run(b: Backend) {
    let t = Bundle::new(b).await;
    // A's backlog comes first in claim order; B and C behind it; keyless jobs last.
    let mut jobs: Vec<NewJob> = (0..50)
        .map(|i| NewJob::new("k", json!(i)).queue("t").partition("A"))
        .collect();
    jobs.extend((0..5).map(|i| NewJob::new("k", json!(i)).queue("t").partition("B")));
    jobs.extend((0..5).map(|i| NewJob::new("k", json!(i)).queue("t").partition("C")));
    jobs.extend((0..3).map(|i| NewJob::new("k", json!(i)).queue("t")));
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    t.store
        .queue_set_limits("t", QueueLimits::default().per_partition(2), t.at(0))
        .await
        .unwrap();
    let got = t.claim("t", "n1", 100, 1).await;
    let count = |got: &[ClaimedJob], p: Option<&str>| {
        got.iter()
            .filter(|c| c.job.partition.as_deref() == p)
            .count()
    };
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
    let a = got
        .iter()
        .find(|c| c.job.partition.as_deref() == Some("A"))
        .unwrap();
    t.finalize(
        Finalize::succeeded(a.job.id, a.token.clone(), json!(null)),
        3,
    )
    .await;
    let next = t.claim("t", "n1", 100, 3).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.partition.as_deref(), Some("A"));

    // Concurrent claimers over 1,000 jobs in 10 partitions limited to 2 each: never more
    // than 2 of a partition held at once, counted as in the global-limit case.
    let t = partitioned(b, QueueLimits::default().per_partition(2)).await;
    let held: std::sync::Mutex<std::collections::HashMap<String, i64>> = Default::default();
    let total = claim_in_parallel(&t, "t", 5, move |got, sign| {
        let mut h = held.lock().unwrap();
        for c in got {
            let p = c.job.partition.clone().unwrap();
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
            let p = c.job.partition.clone().unwrap();
            let e = h.parts.entry(p.clone()).or_insert(0);
            *e += sign;
            assert!(*e <= 2, "{e} jobs of {p} held under a limit of 2");
        }
    })
    .await;
    assert_eq!(total, 1000, "every job ran");
    assert!(held.lock().unwrap().peak >= 2, "claimers overlapped");
}

/// A holder that dies keeps its slots only until its leases expire: the sweeper's reclaim
/// frees them for other claimers — under a global and a per-partition limit at once — and
/// the dead holder's late answers free nothing: had the zombie's finalization of a job that
/// another node now runs counted, a second job of that partition would be claimed while the
/// first still ran.
pub async fn a_dead_holders_slots_return_when_its_leases_expire(b: Backend) {
    let t = Bundle::new(b).await;
    for p in ["a", "b"] {
        t.enqueue(NewJob::new("k", json!(p)).queue("q").partition(p), 0)
            .await;
    }
    // One more job per partition, due once the first ones run elsewhere.
    for p in ["a", "b"] {
        let later = NewJob::new("k", json!(p))
            .queue("q")
            .partition(p)
            .run_at(t.at(60).unwrap());
        t.enqueue(later, 0).await;
    }
    t.store
        .queue_set_limits(
            "q",
            QueueLimits::default().concurrency(2).per_partition(1),
            t.at(0),
        )
        .await
        .unwrap();
    let ids = |got: &[ClaimedJob]| {
        let mut v: Vec<JobId> = got.iter().map(|c| c.job.id).collect();
        v.sort();
        v
    };
    let dead = t.claim("q", "n1", 10, 1).await;
    assert_eq!(dead.len(), 2, "one per partition");
    assert!(
        t.claim("q", "n2", 10, 2).await.is_empty(),
        "nothing else is due"
    );
    // n1 dies. Its leases (30 s) run out; before that nothing is reclaimed.
    assert!(t.reclaim(20).await.is_empty());
    assert_eq!(t.reclaim(32).await.len(), 2);
    assert_eq!(running_in(&t, "q").await, 0, "reclaimed jobs hold no slot");
    let live = t.claim("q", "n2", 10, 50).await;
    assert_eq!(ids(&live), ids(&dead), "the same jobs run again, on n2");
    // n1 comes back as a zombie: its answers are refused and free no slot.
    assert!(matches!(
        t.finalize(
            Finalize::succeeded(dead[0].job.id, dead[0].token.clone(), json!(null)),
            55,
        )
        .await,
        Guarded::LeaseLost
    ));
    assert!(matches!(
        t.renew(dead[1].job.id, &dead[1].token, 55).await,
        Guarded::LeaseLost
    ));
    assert_eq!(running_in(&t, "q").await, 2);
    assert!(
        t.claim("q", "n3", 10, 61).await.is_empty(),
        "n2 holds both slots and both partitions; the zombie's answers changed nothing"
    );
    // n2 finishes one: exactly one more, of the same partition.
    assert!(t
        .finalize(
            Finalize::succeeded(live[0].job.id, live[0].token.clone(), json!(null)),
            62,
        )
        .await
        .is_applied());
    let next = t.claim("q", "n3", 10, 63).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.partition, live[0].job.partition);
}

/// A node remembers which queues have settings, and which of those need the portable claim;
/// when the settings change under it, its next claim follows the new ones exactly.
pub async fn claims_follow_a_queue_whose_limits_change(b: Backend) {
    let t = Bundle::new(b).await;
    enqueue_spread(&t, "s", 20, 1, 2).await;
    let set = |limits: QueueLimits, at: i64| {
        let store = t.store.clone();
        let now = t.at(at);
        async move { store.queue_set_limits("s", limits, now).await.unwrap() }
    };
    let per_partition = |got: &[ClaimedJob], p: &str| {
        got.iter()
            .filter(|c| c.job.partition.as_deref() == Some(p))
            .count()
    };
    set(QueueLimits::default().per_partition(1), 0).await;
    let first = t.claim("s", "n1", 10, 1).await;
    assert_eq!(
        (per_partition(&first, "p0"), per_partition(&first, "p1")),
        (1, 1)
    );
    // A global limit instead: 3 − 2 running.
    set(QueueLimits::default().concurrency(3), 2).await;
    let second = t.claim("s", "n1", 10, 3).await;
    assert_eq!(second.len(), 1, "the global limit, not the partition one");
    // Partitions again, at 2: only the partition with one running has room.
    set(QueueLimits::default().per_partition(2), 4).await;
    let p0 = per_partition(&first, "p0") + per_partition(&second, "p0");
    let third = t.claim("s", "n1", 10, 5).await;
    assert_eq!(third.len(), 1);
    let roomy = if p0 == 2 { "p1" } else { "p0" };
    assert_eq!(per_partition(&third, roomy), 1);
    // Both limits: 4 running, a global limit of 4.
    set(QueueLimits::default().per_partition(5).concurrency(4), 6).await;
    assert!(t.claim("s", "n1", 10, 7).await.is_empty());
    set(QueueLimits::default().per_partition(5).concurrency(6), 8).await;
    assert_eq!(t.claim("s", "n1", 10, 9).await.len(), 2);
    // A rate limit on top: the portable claim, within every limit.
    set(
        QueueLimits::default()
            .per_partition(5)
            .concurrency(7)
            .rate(RateLimit::new(1, Duration::from_secs(60)).unwrap()),
        10,
    )
    .await;
    assert_eq!(t.claim("s", "n1", 10, 11).await.len(), 1);
    assert_eq!(running_in(&t, "s").await, 7);
    // No limits: the uncontrolled claim takes the rest.
    set(QueueLimits::default(), 12).await;
    assert_eq!(t.claim("s", "n1", 100, 13).await.len(), 13);
}

/// PostgreSQL: a resume or a changed limit notifies the queue on the jobs channel, so idle
/// fetchers on every node claim at once; other backends have no listener.
pub async fn a_resume_or_a_changed_limit_wakes_listeners(b: Backend) {
    let t = Bundle::new(b).await;
    let Some(mut l) = t.store.listen().await.unwrap() else {
        assert_ne!(b, Backend::Postgres, "PostgreSQL must offer a listener");
        return;
    };
    // The channel is database-wide: this case's queue has a name of its own.
    let q = format!("q{}", uuid::Uuid::new_v4().simple());
    let next = async |l: &mut Listener| loop {
        let got = tokio::time::timeout(Duration::from_secs(10), l.next())
            .await
            .expect("a notification within 10 s")
            .expect("listener open")
            .unwrap();
        if got == super::Notice::Due(q.clone()) {
            return;
        }
    };
    // A delayed job makes the queue known and wakes nobody.
    t.enqueue(
        NewJob::new("k", json!(0))
            .queue(&q)
            .delay(Duration::from_secs(3600)),
        0,
    )
    .await;
    t.store.queue_pause(&q, Some("me"), None).await.unwrap();
    t.store.queue_pause(&q, None, None).await.unwrap();
    next(&mut l).await;
    t.store
        .queue_set_limits(&q, QueueLimits::default().concurrency(3), None)
        .await
        .unwrap();
    t.store
        .queue_set_limits(&q, QueueLimits::default().concurrency(5), None)
        .await
        .unwrap();
    next(&mut l).await;
}

/// PostgreSQL sends a controlled claim's `BEGIN`, lock, claim statement and `COMMIT` in one
/// round trip, which is safe only because the claim statement takes nothing unless it sees
/// the queue row as its own transaction locked it. Run without that lock — as if it had
/// reached the server first, or outside the transaction — it must take nothing; after the
/// lock, in the same transaction, it takes up to the limit. (The other backends wait for
/// the lock before they send the claim.)
pub async fn postgres_claim_statement_takes_nothing_without_its_own_lock() {
    use super::postgres::sql::{PgClaimControlled, PgClaimPartitioned, PgLockQueue};
    use super::rows::{to_us, JobRow};
    use diesel_async::RunQueryDsl as _;

    // Both claim statements, each under the settings it is chosen for.
    for partitioned in [false, true] {
        let t = Bundle::new(Backend::Postgres).await;
        enqueue_n(&t, "q", 5).await;
        let limits = QueueLimits::default().concurrency(3);
        let limits = if partitioned {
            limits.per_partition(2)
        } else {
            limits
        };
        t.store
            .queue_set_limits("q", limits, t.at(0))
            .await
            .unwrap();
        let now = to_us(t.at(1).unwrap());
        let claim = || PgClaimControlled {
            now: Some(now),
            lease_us: 30_000_000,
            limit: 10,
            queue_running: "q".into(),
            limit_again: 10,
            queue_row: "q".into(),
            queue_parts: "q".into(),
            queue: "q".into(),
            any_kind: true,
            kinds: Vec::new(),
            owner: "n1".into(),
            token: "t1".into(),
        };
        macro_rules! run {
            ($c:expr) => {
                if partitioned {
                    PgClaimPartitioned(claim()).load::<JobRow>($c).await
                } else {
                    claim().load::<JobRow>($c).await
                }
            };
        }
        let mut c = AsyncPgConnection::establish(&t.db.url).await.unwrap();
        let alone: Vec<JobRow> = run!(&mut c).unwrap();
        assert!(alone.is_empty(), "claimed outside the lock's transaction");
        let unlocked: Vec<JobRow> = c.transaction(async |c| run!(c)).await.unwrap();
        assert!(
            unlocked.is_empty(),
            "claimed in a transaction that took no lock"
        );
        // A lock taken by another transaction, committed, does not count either.
        let bumped = PgLockQueue { queue: "q".into() }
            .execute(&mut c)
            .await
            .unwrap();
        assert_eq!(bumped, 1);
        let after_other: Vec<JobRow> = run!(&mut c).unwrap();
        assert!(
            after_other.is_empty(),
            "claimed under a lock it did not take"
        );
        let locked: Vec<JobRow> = c
            .transaction(async |c| {
                PgLockQueue { queue: "q".into() }.execute(c).await?;
                run!(c)
            })
            .await
            .unwrap();
        assert_eq!(
            locked.len(),
            3,
            "under its own lock the claim takes the free slots"
        );
        assert_eq!(running_in(&t, "q").await, 3);
    }
}
