//! Conformance cases. The database-wide gauges: one turn per interval whoever asks (an
//! interval stretched when counting is slow), and what a turn computes matches the table.

use super::*;

/// Eight nodes ask for the turn at once: exactly one gets it; nobody gets it again within
/// the interval; someone does once it has passed. What the winner computes and saves is what
/// everyone reads: jobs by queue and state, due jobs by queue and priority with the oldest
/// due time (a delayed job is not due), and the nodes' heartbeats.
pub async fn gauges_are_computed_once_per_interval_and_match_the_table(b: Backend) {
    let t = Bundle::new(b).await;
    let every = Duration::from_secs(15);
    let fresh = t.store.gauges_read().await.unwrap();
    assert_eq!(
        (fresh.computed_at, fresh.snapshot),
        (0, None),
        "no turn yet"
    );

    // Queue a: 2 due at priority 1 (the oldest due at t0+1), 1 due at priority 5, 1 not yet
    // due; one of them claimed. Queue b: 1 succeeded.
    t.enqueue(NewJob::new("k", json!(1)).queue("ga").priority(1), 1)
        .await;
    t.enqueue(NewJob::new("k", json!(2)).queue("ga").priority(1), 3)
        .await;
    t.enqueue(NewJob::new("k", json!(3)).queue("ga").priority(5), 4)
        .await;
    t.enqueue(
        NewJob::new("k", json!(4))
            .queue("ga")
            .delay(Duration::from_secs(3600)),
        4,
    )
    .await;
    let b1 = t.enqueue(NewJob::new("k", json!(5)).queue("gb"), 2).await;
    let c = t.claim("gb", "n1", 1, 5).await;
    assert_eq!(c[0].id, b1);
    t.finalize(Finalize::succeeded(b1, c[0].token.clone(), json!(null)), 6)
        .await;
    let running = t.claim("ga", "n1", 1, 7).await;
    assert_eq!(running.len(), 1);
    let node = NodeId::new("gauge-node").unwrap();
    t.store
        .node_heartbeat(&node, &["ga".into()], &["k".into()], None, t.at(8))
        .await
        .unwrap();

    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = t.store.clone();
        let now = t.at(10);
        tasks.push(tokio::spawn(async move {
            store
                .gauges_take_turn(&format!("n{n}"), every, None, now)
                .await
                .unwrap()
        }));
    }
    let mut won = 0;
    for task in tasks {
        won += usize::from(task.await.unwrap());
    }
    assert_eq!(
        won, 1,
        "exactly one of eight concurrent askers takes the turn"
    );
    for at in [10, 15, 24] {
        assert!(
            !t.store
                .gauges_take_turn("late", every, None, t.at(at))
                .await
                .unwrap(),
            "nobody takes a turn within the interval (t0+{at})"
        );
    }

    let snap = t.store.gauges_compute(t.at(10)).await.unwrap();
    let at10 = t.at(10).unwrap().timestamp_micros();
    let us = |s: i64| t.at(s).unwrap().timestamp_micros();
    assert_eq!(snap.at, at10);
    assert_eq!(
        snap.jobs,
        vec![
            ("ga".to_string(), "pending".to_string(), 3),
            ("ga".to_string(), "running".to_string(), 1),
            ("gb".to_string(), "succeeded".to_string(), 1),
        ]
    );
    // The claim took the oldest at priority 1 (t0+1): left due are t0+3 at 1 and t0+4 at 5.
    assert_eq!(
        snap.due,
        vec![
            ("ga".to_string(), 1, 1, us(3)),
            ("ga".to_string(), 5, 1, us(4))
        ]
    );
    assert_eq!(snap.nodes, vec![("gauge-node".to_string(), us(8))]);
    t.store
        .gauges_save(&snap, Duration::from_millis(7))
        .await
        .unwrap();
    let read = t.store.gauges_read().await.unwrap();
    assert_eq!(read.computed_at, at10);
    assert!(read.computed_by.as_deref().unwrap().starts_with('n'));
    assert_eq!(read.took, Duration::from_millis(7));
    assert_eq!(read.snapshot.as_ref(), Some(&snap));

    // The interval passed: the next turn goes to one asker, and a save by the earlier turn's
    // owner, late, does not overwrite what the newer one saved.
    assert!(t
        .store
        .gauges_take_turn("n9", every, None, t.at(25))
        .await
        .unwrap());
    let newer = t.store.gauges_compute(t.at(25)).await.unwrap();
    t.store
        .gauges_save(&newer, Duration::from_millis(1))
        .await
        .unwrap();
    t.store
        .gauges_save(&snap, Duration::from_millis(9))
        .await
        .unwrap();
    let read = t.store.gauges_read().await.unwrap();
    assert_eq!(read.computed_by.as_deref(), Some("n9"));
    assert_eq!(read.snapshot.unwrap().at, us(25));

    // Counts that took 1 s stretch the interval to 50 s: counting takes at most 2 % of the
    // time, however large the table.
    t.store
        .gauges_save(&newer, Duration::from_secs(1))
        .await
        .unwrap();
    for at in [40, 74] {
        assert!(
            !t.store
                .gauges_take_turn("slow", every, None, t.at(at))
                .await
                .unwrap(),
            "t0+{at}: within 50 times the last count's duration"
        );
    }
    assert!(t
        .store
        .gauges_take_turn("slow", every, None, t.at(75))
        .await
        .unwrap());

    // Jobs ended in the last five minutes, by queue, kind and final state: the success at
    // t0+6 while it is live, once archived (counted once), and no more five minutes on.
    let ended = vec![(
        "gb".to_string(),
        "k".to_string(),
        "succeeded".to_string(),
        1,
    )];
    assert_eq!(snap.ended, ended);
    assert_eq!(newer.ended, ended);
    let archived = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::from_secs(1),
            dead_older_than: Duration::from_secs(1),
            limit: 100,
            now: t.at(20),
        })
        .await
        .unwrap();
    assert_eq!(archived, 1);
    let later = t.store.gauges_compute(t.at(100)).await.unwrap();
    assert_eq!(later.ended, ended, "archived, still counted once");
    assert!(!later.jobs.iter().any(|(q, _, _)| q == "gb"));
    let gone = t.store.gauges_compute(t.at(6 + 301)).await.unwrap();
    assert_eq!(gone.ended, vec![], "out of the window");
}

/// The throughput rollup counts each queue's succeeded and dead jobs per 5-minute bucket,
/// live and archived alike, and nothing else (a running, a pending or a retried job); a
/// second turn replaces its bucket's rows rather than adding to them; in a bucket's first
/// minute the previous one is recounted (a late commit still lands); rows past 48 hours go.
pub async fn the_throughput_rollup_counts_each_ended_job_once_per_bucket(b: Backend) {
    let t = Bundle::new(b).await;
    let us = |secs: i64| t.at(secs).unwrap().timestamp_micros();
    let rows = || async { t.store.throughput_since(0).await.unwrap() };

    // Bucket [t0, t0+300): in "ra" one success and one dead job, one retried (not ended),
    // one running and one pending; in "rb" a success. The success in "ra" is archived before
    // the turn.
    for n in 0..5 {
        t.enqueue(NewJob::new("k", json!(n)).queue("ra"), 0).await;
    }
    let rb = t.enqueue(NewJob::new("k", json!("b")).queue("rb"), 0).await;
    let c = t.claim("ra", "n1", 4, 1).await;
    t.finalize(
        Finalize::succeeded(c[0].id, c[0].token.clone(), json!(1)),
        10,
    )
    .await;
    t.finalize(Finalize::dead(c[1].id, c[1].token.clone(), err("E", 1)), 20)
        .await;
    t.finalize(
        Finalize::retry(
            c[2].id,
            c[2].token.clone(),
            err("E", 1),
            Duration::from_secs(600),
        ),
        25,
    )
    .await;
    let cb = t.claim("rb", "n1", 1, 2).await.pop().unwrap();
    assert_eq!(cb.id, rb);
    t.finalize(Finalize::succeeded(rb, cb.token, json!(2)), 30)
        .await;
    let archived = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::from_secs(20),
            dead_older_than: Duration::from_secs(3600),
            limit: 100,
            now: t.at(40),
        })
        .await
        .unwrap();
    assert_eq!(archived, 1, "the success in ra only");

    let first = vec![
        ("ra".to_string(), us(0), 1, 1),
        ("rb".to_string(), us(0), 1, 0),
    ];
    assert_eq!(t.store.throughput_roll(us(100)).await.unwrap(), 2);
    assert_eq!(rows().await, first);
    assert_eq!(t.store.throughput_roll(us(200)).await.unwrap(), 2);
    assert_eq!(rows().await, first, "a second turn replaces, never adds");

    // A success committed late into the first bucket (finished at t0+290), then one in the
    // second bucket; a turn 30 s into the second bucket counts both.
    t.finalize(
        Finalize::succeeded(c[3].id, c[3].token.clone(), json!(3)),
        290,
    )
    .await;
    let d = t.claim("ra", "n1", 1, 301).await.pop().unwrap();
    t.finalize(Finalize::succeeded(d.id, d.token, json!(4)), 310)
        .await;
    assert_eq!(t.store.throughput_roll(us(330)).await.unwrap(), 3);
    assert_eq!(
        rows().await,
        vec![
            ("ra".to_string(), us(0), 2, 1),
            ("rb".to_string(), us(0), 1, 0),
            ("ra".to_string(), us(300), 1, 0),
        ]
    );
    // Past its first minute the previous bucket is left as it is.
    assert_eq!(t.store.throughput_roll(us(400)).await.unwrap(), 1);
    assert_eq!(rows().await.len(), 3);

    // 48 hours on, every row above is older than the rollup keeps.
    let later = 48 * 3600 + 600;
    assert_eq!(t.store.throughput_roll(us(later)).await.unwrap(), 0);
    assert_eq!(rows().await, vec![]);
}
