//! Conformance cases. Bad input: clear errors that change nothing, bad URLs and a missing schema, corrupt rows that go dead without stopping the batch, concurrent migrations.

use super::*;

pub async fn bad_inputs_get_clear_errors_and_change_nothing(b: Backend) {
    let t = Bundle::new(b).await;
    let keep = t.enqueue(NewJob::new("k", json!({"keep": true})), 0).await;
    let small =
        t.db.store_with(StoreOptions::default().max_payload_bytes(64))
            .await;
    let cases: Vec<(NewJob, &str)> = vec![
        (NewJob::new("", json!({})), "kind"),
        (NewJob::new("k", json!({})).queue(""), "queue"),
        (NewJob::new("k", json!({"big": "x".repeat(100)})), "payload"),
        (NewJob::new("k", json!({})).max_attempts(0), "max_attempts"),
        (NewJob::new("k\u{0}", json!({})), "kind"),
    ];
    for (job, field) in cases {
        let e = small.job_enqueue(job, t.at(1)).await.unwrap_err();
        match &e {
            Error::InvalidInput { field: f, .. } => assert_eq!(*f, field, "{e}"),
            other => panic!("expected InvalidInput({field}), got {other}"),
        }
    }
    // A bad job in a batch rejects the whole batch before anything is written.
    let batch = vec![NewJob::new("ok", json!(1)), NewJob::new("", json!(2))];
    let e = small
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(1)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("job #1"), "{e}");
    let e = NewJob::from_json_text("k", "{not json").unwrap_err();
    assert!(e.to_string().contains("payload"), "{e}");
    // SQL metacharacters are data, not SQL.
    let weird = "'; DROP TABLE jobvisor_jobs; --";
    let id = t
        .enqueue(
            NewJob::new(weird, json!(weird))
                .queue(weird)
                .unique_key(weird),
            2,
        )
        .await;
    let j = t.get(id).await;
    assert_eq!((j.kind.as_str(), j.queue.as_str()), (weird, weird));
    let all = t.store.job_list(ListParams::default()).await.unwrap();
    assert_eq!(all.len(), 2, "nothing else written, nothing lost");
    assert_eq!(t.get(keep).await.payload, json!({"keep": true}));
    let e = t
        .store
        .job_list(ListParams {
            limit: 5000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { field: "limit", .. }),
        "{e}"
    );
}

pub async fn bad_urls_and_missing_schema_are_clear_errors(b: Backend) {
    let e = Store::connect("redis://user:s3cret@127.0.0.1/0")
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("redis") && msg.contains("expected") && !msg.contains("s3cret"),
        "{msg}"
    );
    let db = TestDb::create(b).await;
    let e = Store::connect(&db.url).await.unwrap_err();
    assert!(matches!(e, Error::SchemaOutOfDate { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("missing") && msg.contains("jobvisor migrate"),
        "{msg}"
    );
    match b {
        Backend::Postgres => {
            let e = Store::connect_with(
                "postgres://postgres:hunter2@127.0.0.1:1/test",
                StoreOptions::default().connect_timeout(Duration::from_secs(3)),
            )
            .await
            .unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::Connect { .. }), "{msg}");
            assert!(
                msg.contains("127.0.0.1:1") && !msg.contains("hunter2"),
                "{msg}"
            );
        }
        Backend::Mysql => {
            let e = Store::connect_with(
                "mysql://root:hunter2@127.0.0.1:1/test",
                StoreOptions::default().connect_timeout(Duration::from_secs(3)),
            )
            .await
            .unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, Error::Connect { .. }) && !msg.contains("hunter2"),
                "{msg}"
            );
        }
        Backend::Sqlite => {
            let e = Store::connect("sqlite:///no/such/dir/jobs.db")
                .await
                .unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("/no/such/dir") && msg.contains("does not exist"),
                "{msg}"
            );
        }
    }
}

pub async fn corrupt_rows_go_dead_and_the_batch_goes_on(b: Backend) {
    let t = Bundle::new(b).await;
    let bad = t.enqueue(NewJob::new("k", json!(1)), 0).await;
    let good = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let scarred = t.enqueue(NewJob::new("k", json!(3)), 0).await;
    // A number jobvisor never writes, in a column the attempt runs with: it cannot run.
    exec_sql(
        &t.store,
        &format!(
            "UPDATE jobvisor_jobs SET max_attempts = -1 WHERE id = {}",
            bad.0
        ),
    )
    .await
    .unwrap();
    // Valid JSON, but not an error record, in a column the attempt does not run with: a
    // read names it; the claim, which does not read it, runs the job.
    exec_sql(
        &t.store,
        &format!(
            "UPDATE jobvisor_jobs SET last_error = '{{\"nope\": true}}' WHERE id = {}",
            scarred.0
        ),
    )
    .await
    .unwrap();
    assert!(matches!(
        t.store.job_get(scarred).await,
        Err(Error::Corrupt { .. })
    ));
    let claims = t.claim("default", "n", 10, 1).await;
    let claimed: Vec<JobId> = claims.iter().map(|c| c.id).collect();
    assert_eq!(
        claimed,
        vec![good, scarred],
        "the runnable jobs are claimed, the corrupt one is not"
    );
    let j = t.get(bad).await;
    assert_eq!(j.state, JobState::Dead);
    let e = j.last_error.unwrap();
    assert_eq!(e.code, "corrupt");
    assert!(e.message.contains("max_attempts -1"), "{}", e.message);
    // SQLite's `errors` column takes any text: a history an outside writer made unreadable
    // is kept, and the batch that ends the job (with an error to append) still applies.
    if b == Backend::Sqlite {
        exec_sql(
            &t.store,
            &format!(
                "UPDATE jobvisor_jobs SET errors = 'not json' WHERE id = {}",
                scarred.0
            ),
        )
        .await
        .unwrap();
    }
    let ended = t
        .store
        .job_finalize_many(FinalizeParams {
            items: vec![
                Finalize::succeeded(good, claims[0].token.clone(), json!(null)),
                Finalize::dead(scarred, claims[1].token.clone(), err("boom", 1)),
            ],
            now: t.at(2),
        })
        .await
        .unwrap();
    assert_eq!(
        ended,
        vec![
            (good, Guarded::Applied(JobState::Succeeded)),
            (scarred, Guarded::Applied(JobState::Dead))
        ]
    );
    // Every backend refuses a payload that is not JSON; nothing stored changes.
    let refused = exec_sql(
        &t.store,
        &format!(
            "UPDATE jobvisor_jobs SET payload = 'not json' WHERE id = {}",
            good.0
        ),
    )
    .await;
    assert!(refused.is_err(), "a non-JSON payload was stored");
    assert_eq!(t.get(good).await.payload, json!(2));
}

pub async fn concurrent_migrations_are_safe(b: Backend) {
    let db = TestDb::create(b).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            Store::connect_with(&url, StoreOptions::default().migrate(true))
                .await
                .map(|_| ())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let store = Store::connect(&db.url).await.unwrap();
    assert!(store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .is_empty());
}
