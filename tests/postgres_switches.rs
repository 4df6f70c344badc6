//! PostgreSQL without `LISTEN`/`NOTIFY` and advisory locks
//! ([`StoreOptions::notifications`], [`StoreOptions::advisory_locks`]), the switches for
//! PostgreSQL-compatible engines that lack them, proven on plain PostgreSQL: the whole store
//! conformance suite with both off, and what the suite cannot see — nothing notified on any
//! channel while every announcing transition happens, a node woken and a running job's
//! cancel heard through the change signal, and migrations serialised by their row while
//! the advisory lock they would otherwise take is held elsewhere.
//!
//! Every PostgreSQL store this binary's test kit opens has both switches off
//! (`testing::postgres_switches_off`), so its migrators always agree.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt;
use jobvisor::testing::{base_url, postgres_switches_off, unique_name, TestDb};
use jobvisor::{
    handler_fn, Backend, Client, JobError, JobOutcome, JobState, NewJob, QueueConfig, Scheduler,
    SchedulerConfig, Store, StoreOptions,
};
use serde_json::{json, Value};

mod conformance {
    jobvisor::conformance_tests!(postgres_switched_off);
}

/// The key of the advisory lock migrations take by default (`store/postgres/mod.rs`).
const MIGRATION_LOCK_KEY: i64 = 0x6a6f_6276_6973_6f72;

/// A connection of the test's own to the database `db` names (its schema first on the
/// search path).
async fn own(db: &TestDb) -> AsyncPgConnection {
    AsyncPgConnection::establish(&db.url).await.unwrap()
}

/// A PostgreSQL database of the test's own, dropped with this value: notification channels
/// are database-wide, and the other tests' schemas share the test kit's database.
struct OwnDatabase {
    admin: String,
    name: String,
    url: String,
}

impl OwnDatabase {
    async fn create() -> OwnDatabase {
        let admin = base_url(Backend::Postgres);
        let name = unique_name();
        let mut c = AsyncPgConnection::establish(&admin).await.unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let (base, _) = admin.rsplit_once('/').unwrap();
        let url = format!("{base}/{name}");
        OwnDatabase { admin, name, url }
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop cannot await: a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut c) = AsyncPgConnection::establish(&admin).await {
                    let _ = c
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// `jobvisor_wakes.n`.
async fn wakes(url: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut c = AsyncPgConnection::establish(url).await.unwrap();
    diesel::sql_query("SELECT n FROM jobvisor_wakes WHERE id = 1")
        .get_result::<N>(&mut c)
        .await
        .unwrap()
        .n
}

/// Every notification a listener on all of jobvisor's channels hears within `within`.
async fn heard(listener: &mut AsyncPgConnection, within: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let stream = listener.notifications_stream();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(n)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let n = n.unwrap();
        got.push(format!("{}: {}", n.channel, n.payload));
    }
    got
}

/// Enqueues (one, a batch, a batch large enough to be copied), a running job's cancel, a
/// retry by hand and a dependency child's release — every transition that notifies on a
/// notifying store — are heard by no listener of the database (one of the test's own), and the ones made due without a new id move
/// the wake counter the nodes read instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_notified_and_the_wake_counter_moves_instead() {
    postgres_switches_off();
    let db = OwnDatabase::create().await;
    let opts = StoreOptions::default()
        .notifications(false)
        .advisory_locks(false)
        .migrate(true);
    let store = Store::connect_with(&db.url, opts).await.unwrap();
    let client = Client::new(store.clone());
    let mut listener = AsyncPgConnection::establish(&db.url).await.unwrap();
    listener
        .batch_execute("LISTEN jobvisor_jobs; LISTEN jobvisor_cancel; LISTEN jobvisor_done; LISTEN jobvisor_queues")
        .await
        .unwrap();
    let w0 = wakes(&db.url).await;

    // Enqueues of every size.
    client.enqueue(NewJob::new("k", json!({}))).await.unwrap();
    let batch: Vec<NewJob> = (0..10)
        .map(|i| NewJob::new("k", json!({ "i": i })))
        .collect();
    client.enqueue_many(batch).await.unwrap();
    let large: Vec<NewJob> = (0..1_200)
        .map(|i| NewJob::new("k", json!({ "i": i })))
        .collect();
    client.enqueue_many(large).await.unwrap();
    assert_eq!(
        heard(&mut listener, Duration::from_millis(300)).await,
        Vec::<String>::new()
    );
    assert_eq!(
        wakes(&db.url).await,
        w0,
        "a new job moves the change signal by its id"
    );

    // A running job's cancel, a dead job's retry and a child's release, by a node.
    let started = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&started);
    let scheduler = Scheduler::builder(store.clone())
        .queue("other", QueueConfig::default().concurrency(2))
        .handler(
            "hold",
            handler_fn(move |_: Value, ctx| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.store(true, Ordering::SeqCst);
                    ctx.cancelled().await;
                    Err(JobError::retry("stopped"))
                }
            }),
        )
        .handler(
            "fail",
            handler_fn(|_: Value, _ctx| async {
                Err::<JobOutcome, _>(JobError::fail("never works"))
            }),
        )
        .handler(
            "child",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        )
        .start()
        .unwrap();
    let held = client
        .enqueue(NewJob::new("hold", json!({})).queue("other"))
        .await
        .unwrap()
        .id;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !AtomicBool::load(&started, Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the held job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w1 = wakes(&db.url).await;
    client.cancel(held).await.unwrap();
    assert!(
        wakes(&db.url).await > w1,
        "a running job's cancel moves the wake counter"
    );
    let job = client.wait(held, Duration::from_secs(10)).await.unwrap();
    assert_eq!(job.state, JobState::Cancelled);

    let dead = client
        .enqueue(NewJob::new("fail", json!({})).queue("other"))
        .await
        .unwrap()
        .id;
    let job = client.wait(dead, Duration::from_secs(10)).await.unwrap();
    assert_eq!(job.state, JobState::Dead);
    let w2 = wakes(&db.url).await;
    client.retry(dead).await.unwrap();
    assert!(
        wakes(&db.url).await > w2,
        "a retry by hand moves the wake counter"
    );

    let parent = client
        .enqueue(NewJob::new("child", json!({})).queue("other"))
        .await
        .unwrap()
        .id;
    let child = client
        .enqueue(
            NewJob::new("child", json!({}))
                .queue("other")
                .after(&[parent]),
        )
        .await
        .unwrap()
        .id;
    let job = client.wait(child, Duration::from_secs(10)).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    scheduler.shutdown_within(Duration::from_secs(5)).await;
    assert_eq!(
        heard(&mut listener, Duration::from_millis(300)).await,
        Vec::<String>::new()
    );
}

/// A node whose store neither listens nor is notified starts a job another process
/// enqueued within the change signal's poll (80 ms) and a little, and its running handler
/// hears a cancel asked elsewhere as quickly: 20 of each, all within 3 s, where the queue's
/// poll (30 s) and the node's heartbeat (30 s), the ways left without the signal, take longer.
/// (A bound of 1 s against the default 1 s poll failed once with the binary's 125 tests
/// running at once on two cores.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_woken_and_a_cancel_heard_by_the_change_signal() {
    postgres_switches_off();
    let db = TestDb::create(Backend::Postgres).await;
    let scheduler = Scheduler::builder(db.store().await)
        .config(SchedulerConfig::default().node_heartbeat_every(Duration::from_secs(30)))
        .queue(
            "default",
            QueueConfig::default()
                .concurrency(4)
                .poll_interval(Duration::from_secs(30)),
        )
        .handler(
            "hold",
            handler_fn(|_: Value, ctx| async move {
                ctx.cancelled().await;
                Err(JobError::retry("stopped"))
            }),
        )
        .start()
        .unwrap();
    let other = Client::new(db.store().await);
    let mut worst_start = Duration::ZERO;
    let mut worst_cancel = Duration::ZERO;
    for _ in 0..20 {
        let t0 = Instant::now();
        let id = other
            .enqueue(NewJob::new("hold", json!({})))
            .await
            .unwrap()
            .id;
        loop {
            let job = other.get(id).await.unwrap();
            if job.state == JobState::Running {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "job {id:?} never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        worst_start = worst_start.max(t0.elapsed());
        let t1 = Instant::now();
        other.cancel(id).await.unwrap();
        let job = other.wait(id, Duration::from_secs(5)).await.unwrap();
        assert_eq!(job.state, JobState::Cancelled);
        worst_cancel = worst_cancel.max(t1.elapsed());
    }
    scheduler.shutdown_within(Duration::from_secs(5)).await;
    eprintln!(
        "without notifications: slowest start {worst_start:?}, slowest cancel {worst_cancel:?}"
    );
    assert!(
        worst_start < Duration::from_secs(3) && worst_cancel < Duration::from_secs(3),
        "slowest start {worst_start:?}, slowest cancel {worst_cancel:?}; expected both under 3 s"
    );
}

/// Migrations without advisory locks: three stores migrating one fresh schema at once all
/// succeed, while another session holds the advisory lock a default migration would wait
/// for (so none took it), and the row lock is free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_serialise_on_their_row_not_an_advisory_lock() {
    postgres_switches_off();
    let db = TestDb::create(Backend::Postgres).await;
    let mut holder = own(&db).await;
    holder
        .batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
        .await
        .unwrap();
    let opts = StoreOptions::default()
        .advisory_locks(false)
        .notifications(false)
        .migrate(true);
    let t0 = Instant::now();
    let racers: Vec<_> = (0..3)
        .map(|_| {
            let (url, opts) = (db.url.clone(), opts.clone());
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(30), Store::connect_with(&url, opts)).await
            })
        })
        .collect();
    for r in racers {
        let store = r
            .await
            .unwrap()
            .expect("a migration waited for the advisory lock")
            .unwrap();
        assert_eq!(
            store.schema_version_applied().await.unwrap(),
            Some(store.schema_version_expected())
        );
    }
    eprintln!("three racing migrations took {:?}", t0.elapsed());
    holder
        .batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))
        .await
        .unwrap();
    #[derive(diesel::QueryableByName)]
    struct Free {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        free: bool,
    }
    let mut c = own(&db).await;
    let row: Free = diesel::sql_query(
        "SELECT holder IS NULL AND until IS NULL AS free FROM jobvisor_migrate_lock \
         WHERE name = 'migrate'",
    )
    .get_result(&mut c)
    .await
    .unwrap();
    assert!(row.free, "the migration lock's row is still held");
}
