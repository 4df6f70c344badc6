//! Conformance cases. Partition keys: stored and returned by every enqueue path (one job, a
//! batch, a batch large enough for PostgreSQL's `COPY`, the transactional outbox), kept on
//! claim and archive, and bad keys refused with nothing stored.

use super::*;

/// Every path's jobs come back with the partition key they were given (or none).
pub async fn partition_keys_round_trip_on_every_enqueue_path(b: Backend) {
    let t = Bundle::new(b).await;
    let part = |i: usize| (!i.is_multiple_of(3)).then(|| format!("acct:{}", i % 7));
    let check = async |ids: &[JobId], what: &str| {
        for (i, id) in ids.iter().enumerate() {
            let j = t.get(*id).await;
            assert_eq!(j.partition, part(i), "{what}: job #{i}");
            assert_eq!(j.payload, json!(i), "{what}: job #{i}");
        }
    };
    let job = |i: usize, keyed: bool| {
        let mut j = NewJob::new("p", json!(i));
        if let Some(p) = part(i) {
            j = j.partition(p);
        }
        if keyed {
            j = j.unique_key(format!("k{i}-{}", uuid::Uuid::new_v4().simple()));
        }
        j
    };

    // One job at a time, with and without a unique key (inserted differently).
    let mut single = Vec::new();
    for i in 0..6 {
        single.push(t.enqueue(job(i, i % 2 == 0), 0).await);
    }
    check(&single, "single").await;

    // A small batch mixing keyed and keyless runs (MariaDB: JSON_TABLE for the keyless runs;
    // SQLite: jsonb_each).
    let many = |n: usize, keyed: fn(usize) -> bool| {
        EnqueueParams::many((0..n).map(|i| job(i, keyed(i))).collect()).at(t.at(0))
    };
    let got = t
        .store
        .job_enqueue_many(many(40, |i| i % 10 == 5))
        .await
        .unwrap();
    assert!(got.iter().all(|e| !e.duplicate));
    check(&got.iter().map(|e| e.id).collect::<Vec<_>>(), "batch").await;
    let keyless = t.store.job_enqueue_many(many(12, |_| false)).await.unwrap();
    check(
        &keyless.iter().map(|e| e.id).collect::<Vec<_>>(),
        "keyless batch",
    )
    .await;

    // 1,500 keyless jobs: PostgreSQL's COPY path.
    let got = t
        .store
        .job_enqueue_many(many(1500, |_| false))
        .await
        .unwrap();
    let ids: Vec<JobId> = got.iter().map(|e| e.id).collect();
    for i in [0, 1, 2, 3, 700, 1498, 1499] {
        let j = t.get(ids[i]).await;
        assert_eq!(
            (j.partition, j.payload),
            (part(i), json!(i)),
            "copy: job #{i}"
        );
    }

    // The outbox, on the caller's own connection.
    let outbox = (0..4).map(|i| job(i, i == 1)).collect::<Vec<_>>();
    macro_rules! enqueue_in {
        ($conn:expr) => {{
            let conn = $conn;
            let store = t.store.clone();
            let p = EnqueueParams::many(outbox.clone()).at(t.at(0));
            let got: Vec<Enqueued> = conn
                .transaction(async |c| store.job_enqueue_in(c, p).await)
                .await
                .unwrap();
            got.into_iter().map(|e| e.id).collect::<Vec<_>>()
        }};
    }
    let ids = match b {
        Backend::Postgres => {
            enqueue_in!(&mut AsyncPgConnection::establish(&t.db.url).await.unwrap())
        }
        Backend::Mysql => {
            enqueue_in!(&mut AsyncMysqlConnection::establish(&t.db.app_url())
                .await
                .unwrap())
        }
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            enqueue_in!(&mut SqliteConn::establish(&path).await.unwrap())
        }
    };
    check(&ids, "outbox").await;

    // Claimed, finished and archived: the key stays with the job.
    let c = t.claim("default", "n", 1, 1).await.pop().unwrap();
    assert_eq!(c.id, single[0]);
    assert_eq!(t.get(c.id).await.partition, part(0));
    let second = t.claim("default", "n", 1, 1).await.pop().unwrap();
    assert_eq!(t.get(second.id).await.partition.as_deref(), Some("acct:1"));
    t.finalize(Finalize::succeeded(c.id, c.token, json!("ok")), 2)
        .await;
    t.finalize(Finalize::succeeded(second.id, second.token, json!("ok")), 2)
        .await;
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::from_secs(1),
            dead_older_than: Duration::from_secs(1),
            limit: 10,
            now: t.at(100),
        })
        .await
        .unwrap();
    assert_eq!(moved, 2);
    let archived = t.get(second.id).await;
    assert!(archived.archived_at.is_some());
    assert_eq!(archived.partition.as_deref(), Some("acct:1"));
    let listed = t
        .store
        .job_list(ListParams {
            archived: true,
            ..ListParams::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .any(|j| j.partition.as_deref() == Some("acct:1")));
}

/// An empty or over-long partition key is refused, naming `partition`; nothing of the job
/// (or of the batch it came in) is stored.
pub async fn bad_partition_keys_are_refused_and_nothing_stored(b: Backend) {
    let t = Bundle::new(b).await;
    let bad = [
        String::new(),
        "p".repeat(256),
        "é".repeat(128),
        " acct".into(),
    ];
    for p in &bad {
        let one = t
            .store
            .job_enqueue(NewJob::new("k", json!(1)).partition(p.clone()), t.at(0))
            .await;
        match one {
            Err(Error::InvalidInput { field, reason }) => {
                assert_eq!(field, "partition", "{reason}");
            }
            other => panic!("{p:?}: expected InvalidInput, got {other:?}"),
        }
        let batch = vec![
            NewJob::new("k", json!(1)).partition("acct:1"),
            NewJob::new("k", json!(2)).partition(p.clone()),
        ];
        let many = t
            .store
            .job_enqueue_many(EnqueueParams::many(batch).at(t.at(0)))
            .await;
        assert!(
            matches!(
                many,
                Err(Error::InvalidInput {
                    field: "partition",
                    ..
                })
            ),
            "{many:?}"
        );
    }
    let ok = "p".repeat(MAX_PARTITION_LEN);
    let id = t
        .enqueue(NewJob::new("k", json!(0)).partition(ok.clone()), 0)
        .await;
    assert_eq!(t.get(id).await.partition, Some(ok));
    let all = t.store.job_list(ListParams::default()).await.unwrap();
    assert_eq!(all.len(), 1, "only the valid job was stored");
}
