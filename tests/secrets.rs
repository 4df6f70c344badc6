//! Secrets stay secret: a database password never appears in an error, a `Debug` output or a
//! log line, and lease tokens are redacted in `Debug`.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobvisor::testing::{base_url, ClaimParams, StoreEngine as _, TestDb};
use jobvisor::{Backend, Client, NewJob, NodeId, Store, StoreOptions};
use serde_json::json;

const PASSWORD: &str = "Sup3r-s3cret-pw";

/// Collects everything written to the log.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn with_password(url: &str, password: &str) -> String {
    let mut u = url::Url::parse(url).unwrap();
    u.set_password(Some(password)).unwrap();
    u.to_string()
}

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} leaks the password: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_errors_debug_output_or_logs() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // A working store whose URL carries a password (the local servers trust loopback).
    let db = TestDb::create(Backend::Postgres).await;
    let url = with_password(&db.url, PASSWORD);
    let store = Store::connect_with(&url, StoreOptions::default().migrate(true))
        .await
        .unwrap();
    assert_clean("Store's Debug", &format!("{store:?}"));
    let client = Client::new(store.clone());
    assert_clean("Client's Debug", &format!("{client:?}"));
    client.enqueue(NewJob::new("k", json!({}))).await.unwrap();
    let claimed = store
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
    let dbg = format!("{claimed:?}");
    assert!(
        !dbg.contains(claimed[0].token.as_str()),
        "a lease token leaks in Debug: {dbg}"
    );

    // Unreachable servers, a wrong password, a bad scheme: errors name the URL, never the secret.
    let failures = [
        with_password("postgres://postgres@127.0.0.1:1/test", PASSWORD),
        with_password("mysql://root@127.0.0.1:1/test", PASSWORD),
        with_password(&base_url(Backend::Mysql), PASSWORD),
        format!("redis://user:{PASSWORD}@127.0.0.1/0"),
    ];
    for bad in failures {
        let err = Store::connect_with(
            &bad,
            StoreOptions::default().connect_timeout(Duration::from_secs(3)),
        )
        .await
        .unwrap_err();
        assert_clean("an error's Display", &err.to_string());
        assert_clean("an error's Debug", &format!("{err:?}"));
    }
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_clean("the log", &logged);
}
