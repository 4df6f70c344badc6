//! Conformance cases. Queue control: pause, global concurrency limits, settings and their
//! changes — each enforced by the claim on every store, whatever a store remembers. The rate
//! limit's cases are in `rate.rs`, the per-partition limit's in `partition_limits.rs`; the
//! helpers here serve all three.

use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

pub(super) fn params(
    queue: &str,
    owner: &str,
    limit: u32,
    now: Option<DateTime<Utc>>,
) -> ClaimParams {
    ClaimParams {
        queue: queue.into(),
        owner: NodeId::new(owner).unwrap(),
        limit,
        kinds: None,
        lease: Duration::from_secs(30),
        now,
    }
}

pub(super) async fn enqueue_n(t: &Bundle, queue: &str, n: usize) -> Vec<JobId> {
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

pub(super) async fn running_in(t: &Bundle, queue: &str) -> u64 {
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
pub(super) async fn claim_in_parallel<F>(t: &Bundle, queue: &str, per_claim: u32, hold: F) -> usize
where
    F: Fn(&[ClaimedJob], i64) + Send + Sync + 'static,
{
    let hold = Arc::new(hold);
    // Claims that took something, by any claimer: a claimer stops after 50 tries in a row
    // that took nothing while nobody else took anything either (under a limit, some may find
    // it full every time while others work, as on one thread with the calls inline).
    let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (store, hold, queue) = (t.store.clone(), hold.clone(), queue.to_string());
        let progress = progress.clone();
        let now = t.at(1);
        tasks.push(tokio::spawn(async move {
            let mut mine = 0;
            let mut idle = 0;
            let mut seen = u64::MAX;
            while idle < 50 {
                let got = store
                    .job_claim(ClaimParams {
                        kinds: Some(vec![format!("k{}", n % 4)]),
                        ..params(&queue, &format!("claimer-{n}"), per_claim, now)
                    })
                    .await
                    .unwrap();
                if got.is_empty() {
                    let now_seen = progress.load(std::sync::atomic::Ordering::SeqCst);
                    idle = if now_seen == seen { idle + 1 } else { 0 };
                    seen = now_seen;
                    tokio::task::yield_now().await;
                    continue;
                }
                progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                idle = 0;
                hold(&got, 1);
                tokio::task::yield_now().await;
                hold(&got, -1);
                mine += got.len();
                let items = got
                    .into_iter()
                    .map(|c| Finalize::succeeded(c.id, c.token, json!(null)))
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
            Finalize::succeeded(before[0].id, before[0].token.clone(), json!(1)),
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
        t.finalize(Finalize::succeeded(c.id, c.token.clone(), json!(null)), 4)
            .await;
        assert!(
            t.claim("q", "n1", 10, 4).await.is_empty(),
            "still ≥ 2 running"
        );
    }
    t.finalize(
        Finalize::succeeded(a[3].id, a[3].token.clone(), json!(null)),
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
pub(super) async fn enqueue_spread(t: &Bundle, queue: &str, n: usize, kinds: usize, parts: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            let part = format!("p{}", i % parts);
            NewJob::new(format!("k{}", i % kinds), json!({ "i": i, "p": part }))
                .queue(queue)
                .partition(part)
        })
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
}

/// A queue `t` of 1,000 jobs of four kinds in 10 partitions, under `limits`.
pub(super) async fn partitioned(b: Backend, limits: QueueLimits) -> Bundle {
    let t = Bundle::new(b).await;
    enqueue_spread(&t, "t", 1000, 4, 10).await;
    t.store
        .queue_set_limits("t", limits, t.at(0))
        .await
        .unwrap();
    t
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
        let mut v: Vec<JobId> = got.iter().map(|c| c.id).collect();
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
            Finalize::succeeded(dead[0].id, dead[0].token.clone(), json!(null)),
            55,
        )
        .await,
        Guarded::LeaseLost
    ));
    assert!(matches!(
        t.renew(dead[1].id, &dead[1].token, 55).await,
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
            Finalize::succeeded(live[0].id, live[0].token.clone(), json!(null)),
            62,
        )
        .await
        .is_applied());
    let next = t.claim("q", "n3", 10, 63).await;
    assert_eq!(next.len(), 1);
    assert_eq!(
        t.get(next[0].id).await.partition,
        t.get(live[0].id).await.partition
    );
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
    let per_partition =
        |got: &[ClaimedJob], p: &str| got.iter().filter(|c| partition_of(c) == Some(p)).count();
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
        assert!(
            !t.store.notifies(),
            "[{b:?}] a notifying store offers a listener"
        );
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
    use super::rows::{to_us, ClaimRow};
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
                    PgClaimPartitioned(claim()).load::<ClaimRow>($c).await
                } else {
                    claim().load::<ClaimRow>($c).await
                }
            };
        }
        let mut c = AsyncPgConnection::establish(&t.db.url).await.unwrap();
        let alone: Vec<ClaimRow> = run!(&mut c).unwrap();
        assert!(alone.is_empty(), "claimed outside the lock's transaction");
        let unlocked: Vec<ClaimRow> = c.transaction(async |c| run!(c)).await.unwrap();
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
        let after_other: Vec<ClaimRow> = run!(&mut c).unwrap();
        assert!(
            after_other.is_empty(),
            "claimed under a lock it did not take"
        );
        let locked: Vec<ClaimRow> = c
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
