//! Property tests: whatever a caller passes as enqueue options and payloads — odd Unicode,
//! huge or deeply nested JSON, empty or very long names, SQL metacharacters — either comes back
//! from the store exactly as given, or is refused with `InvalidInput` naming the field; it is
//! never executed as SQL and never changes anything else that is stored.

#![allow(clippy::unwrap_used)]

use jobvisor::testing::{StoreEngine as _, TestDb};
use jobvisor::{Backend, Error, ListParams, NewJob, Store, StoreOptions};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Strings that have broken SQL and text handling elsewhere.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("'; DROP TABLE jobvisor_jobs; --".to_string()),
        Just("\" OR 1=1 --".to_string()),
        Just("%_\\\\".to_string()),
        Just("a\u{0}b".to_string()),
        Just(" padded ".to_string()),
        Just("ü∂ß中文🦀\u{202e}rtl".to_string()),
        Just("x".repeat(300)),
        "\\PC{0,40}",
        "[a-z_:.-]{1,20}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::hash_map(nasty_string(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn new_job() -> impl Strategy<Value = NewJob> {
    (
        nasty_string(),
        nasty_string(),
        prop::option::of(nasty_string()),
        json_value(),
        any::<i16>(),
        0u32..20,
    )
        .prop_map(|(kind, queue, key, payload, priority, max_attempts)| {
            let mut j = NewJob::new(kind, payload)
                .queue(queue)
                .priority(priority)
                .max_attempts(max_attempts);
            if let Some(k) = key {
                j = j.unique_key(k);
            }
            j
        })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Enqueues every generated job on one backend and checks each comes back intact or is
/// refused by name, and that a sentinel job stored first is never touched.
fn check_backend(backend: Backend, cases: u32) {
    let rt = runtime();
    let (db, store, sentinel) = rt.block_on(async {
        let db = TestDb::create(backend).await;
        let store: Store = Store::connect_with(
            &db.url,
            StoreOptions::default()
                .migrate(true)
                .max_payload_bytes(64 * 1024),
        )
        .await
        .unwrap();
        let sentinel = store
            .job_enqueue(NewJob::new("sentinel", json!({"keep": "me"})), None)
            .await
            .unwrap()
            .id;
        (db, store, sentinel)
    });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    runner
        .run(&new_job(), |job| {
            rt.block_on(async {
                let before = store
                    .job_list(ListParams {
                        limit: 1000,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .len();
                match store.job_enqueue(job.clone(), None).await {
                    Ok(e) => {
                        let got = store.job_get(e.id).await.unwrap().unwrap();
                        prop_assert_eq!(&got.kind, &job.kind);
                        if !e.duplicate {
                            prop_assert_eq!(&got.queue, &job.queue);
                            prop_assert_eq!(&got.unique_key, &job.unique_key);
                            prop_assert_eq!(got.priority, job.priority);
                            prop_assert_eq!(&got.payload, &job.payload, "payload round trip");
                        }
                    }
                    Err(Error::InvalidInput { field, reason }) => {
                        prop_assert!(
                            ["kind", "queue", "unique_key", "payload", "max_attempts"]
                                .contains(&field),
                            "unexpected field {field}: {reason}"
                        );
                        let after = store
                            .job_list(ListParams {
                                limit: 1000,
                                ..Default::default()
                            })
                            .await
                            .unwrap()
                            .len();
                        prop_assert_eq!(before, after, "a refused job wrote something");
                    }
                    Err(other) => prop_assert!(false, "unexpected error: {other}"),
                }
                let s = store.job_get(sentinel).await.unwrap().unwrap();
                prop_assert_eq!(s.payload, json!({"keep": "me"}));
                Ok(())
            })
        })
        .unwrap();
    drop(store);
    drop(db);
}

#[test]
fn hostile_enqueues_are_inert_on_sqlite() {
    check_backend(Backend::Sqlite, 200);
}

#[test]
fn hostile_enqueues_are_inert_on_postgres() {
    check_backend(Backend::Postgres, 100);
}

#[test]
fn hostile_enqueues_are_inert_on_mysql() {
    check_backend(Backend::Mysql, 100);
}

#[test]
fn a_huge_payload_is_stored_whole_or_refused_by_size() {
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::create(Backend::Sqlite).await;
        let store = db.store().await;
        let big = json!({"blob": "x".repeat(900 * 1024)});
        let id = store
            .job_enqueue(NewJob::new("big", big.clone()), None)
            .await
            .unwrap()
            .id;
        assert_eq!(store.job_get(id).await.unwrap().unwrap().payload, big);
        let too_big = json!({"blob": "x".repeat(2 * 1024 * 1024)});
        let err = store
            .job_enqueue(NewJob::new("big", too_big), None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidInput {
                    field: "payload",
                    ..
                }
            ),
            "{err}"
        );
    });
}
