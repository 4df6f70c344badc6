//! Reconcilers, simulated on every backend (manual clock, passes sent by hand): the leader
//! re-creates exactly the missing jobs and nothing twice — also with two passes at once and
//! after a job is deleted by hand —, a node that does not lead runs nothing, a failing,
//! panicking or hanging function is reported and retried without harm, and bad registrations
//! are refused at build time naming the reconciler.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobvisor::scheduler::Event;
use jobvisor::testing::{exec_sql, Simulation, TestDb};
use jobvisor::{
    handler_fn, Backend, Error, JobOutcome, ListParams, NewJob, QueueConfig, Scheduler,
};
use serde_json::{json, Value};

const MINUTE: Duration = Duration::from_secs(60);

/// The application's table of users still awaiting their welcome mail.
type Awaiting = Arc<Mutex<BTreeSet<i64>>>;

/// What the reconciler's function does on its next call.
const WORKS: u8 = 0;
const FAILS: u8 = 1;
const PANICS: u8 = 2;
const FORGETS_KEY: u8 = 3;

fn welcome(user: i64) -> NewJob {
    NewJob::new("welcome", json!({ "user": user })).unique_key(format!("user:{user}"))
}

async fn node(
    db: &TestDb,
    clock: &jobvisor::clock::ManualClock,
    name: &str,
    awaiting: &Awaiting,
    mode: &Arc<AtomicU8>,
) -> Simulation {
    let (awaiting, mode) = (awaiting.clone(), mode.clone());
    let store = db.store().await;
    {
        Simulation::on_store(store, clock.clone(), name, move |b| {
            b.handler(
                "welcome",
                handler_fn(|_: Value, _ctx| async { JobOutcome::success("sent") }),
            )
            .reconciler("welcome-mails", MINUTE, move |_client| {
                let (awaiting, mode) = (awaiting.clone(), mode.clone());
                async move {
                    let users: Vec<i64> = awaiting.lock().unwrap().iter().copied().collect();
                    match mode.swap(WORKS, Ordering::SeqCst) {
                        FAILS => Err("users table unavailable".to_string()),
                        PANICS => panic!("reconciler bug"),
                        FORGETS_KEY => Ok(vec![NewJob::new("welcome", json!({}))]),
                        _ => Ok(users.into_iter().map(welcome).collect()),
                    }
                }
            })
        })
    }
}

/// The unique keys of the live jobs, each once (asserted).
async fn live_keys(sim: &Simulation) -> BTreeSet<String> {
    let jobs = sim.client.list(ListParams::default()).await.unwrap();
    let mut keys = BTreeSet::new();
    for j in jobs {
        let key = j.unique_key.unwrap();
        assert!(keys.insert(key.clone()), "{key} twice");
    }
    keys
}

fn keys(users: impl IntoIterator<Item = i64>) -> BTreeSet<String> {
    users.into_iter().map(|u| format!("user:{u}")).collect()
}

fn reconciled(e: Option<Event>) -> (usize, usize) {
    match e {
        Some(Event::Reconciled {
            expected,
            recreated,
            ..
        }) => (expected, recreated),
        other => panic!("expected a successful pass, got {other:?}"),
    }
}

fn failed(e: Option<Event>) -> String {
    match e {
        Some(Event::ReconcileFailed {
            message, retry_in, ..
        }) => {
            assert_eq!(retry_in, Duration::from_secs(1), "first retry after 1 s");
            message
        }
        other => panic!("expected a failed pass, got {other:?}"),
    }
}

async fn the_leader_recreates_exactly_the_missing_jobs(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let awaiting: Awaiting = Arc::new(Mutex::new((1..=5).collect()));
    let mode = Arc::new(AtomicU8::new(WORKS));
    let a = node(&db, &clock, "node-a", &awaiting, &mode).await;
    let b = node(&db, &clock, "node-b", &awaiting, &mode).await;
    assert_eq!(a.elect().await, Some(1));
    assert_eq!(b.elect().await, None);

    // The application enqueued jobs for users 1–3; those of 4 and 5 were lost.
    for u in 1..=3 {
        a.client.enqueue(welcome(u)).await.unwrap();
    }
    assert!(
        b.reconcile("welcome-mails").await.is_none(),
        "only the leader runs it"
    );
    assert_eq!(reconciled(a.reconcile("welcome-mails").await), (5, 2));
    assert_eq!(live_keys(&a).await, keys(1..=5));
    assert_eq!(
        reconciled(a.reconcile("welcome-mails").await),
        (5, 0),
        "nothing twice"
    );

    // Two passes at once (a deposed leader finishing late, a takeover) re-create each
    // missing job once.
    awaiting.lock().unwrap().extend([6, 7]);
    let (x, y) = tokio::join!(a.reconcile("welcome-mails"), a.reconcile("welcome-mails"));
    assert_eq!(reconciled(x).1 + reconciled(y).1, 2);
    assert_eq!(live_keys(&a).await, keys(1..=7));

    // A job deleted by hand comes back; one whose row no longer awaits work does not.
    exec_sql(
        a.handle.store(),
        "DELETE FROM jobvisor_jobs WHERE unique_key = 'user:2'",
    )
    .await
    .unwrap();
    awaiting.lock().unwrap().remove(&7);
    exec_sql(
        a.handle.store(),
        "DELETE FROM jobvisor_jobs WHERE unique_key = 'user:7'",
    )
    .await
    .unwrap();
    assert_eq!(reconciled(a.reconcile("welcome-mails").await), (6, 1));
    assert_eq!(live_keys(&a).await, keys(1..=6));

    // Failures are reported, change nothing, and the next pass works.
    awaiting.lock().unwrap().insert(8);
    mode.store(FAILS, Ordering::SeqCst);
    let m = failed(a.reconcile("welcome-mails").await);
    assert!(m.contains("users table unavailable"), "{m}");
    mode.store(PANICS, Ordering::SeqCst);
    let m = failed(a.reconcile("welcome-mails").await);
    assert!(
        m.contains("panicked") && m.contains("reconciler bug"),
        "{m}"
    );
    mode.store(FORGETS_KEY, Ordering::SeqCst);
    let m = failed(a.reconcile("welcome-mails").await);
    assert!(m.contains("no unique key") && m.contains("welcome"), "{m}");
    assert_eq!(
        live_keys(&a).await,
        keys(1..=6),
        "failed passes enqueued nothing"
    );
    assert_eq!(reconciled(a.reconcile("welcome-mails").await), (7, 1));
    assert_eq!(live_keys(&a).await, keys((1..=6).chain([8])));

    // Leadership moves: the new leader reconciles, the old one no longer does.
    clock.advance(Duration::from_secs(11));
    assert_eq!(b.elect().await, Some(2));
    assert!(a.reconcile("welcome-mails").await.is_none());
    awaiting.lock().unwrap().insert(9);
    assert_eq!(reconciled(b.reconcile("welcome-mails").await), (8, 1));
    assert_eq!(live_keys(&b).await, keys((1..=6).chain([8, 9])));
    drop(db);
}

#[actix::test]
async fn the_leader_recreates_exactly_the_missing_jobs_on_postgres() {
    the_leader_recreates_exactly_the_missing_jobs(Backend::Postgres).await;
}

#[actix::test]
async fn the_leader_recreates_exactly_the_missing_jobs_on_mysql() {
    the_leader_recreates_exactly_the_missing_jobs(Backend::Mysql).await;
}

#[actix::test]
async fn the_leader_recreates_exactly_the_missing_jobs_on_sqlite() {
    the_leader_recreates_exactly_the_missing_jobs(Backend::Sqlite).await;
}

#[actix::test]
async fn bad_reconcilers_are_refused_at_build_naming_them() {
    let db = TestDb::create(Backend::Sqlite).await;
    let store = db.store().await;
    let base = || {
        Scheduler::builder(store.clone())
            .queue("default", QueueConfig::default())
            .handler(
                "welcome",
                handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
            )
    };
    let none = |_client| async { Ok::<Vec<NewJob>, String>(Vec::new()) };
    let reason = |r: jobvisor::Result<jobvisor::SchedulerHandle>| match r {
        Err(Error::Config { field, reason }) => {
            assert_eq!(field, "reconcilers");
            reason
        }
        other => panic!("expected a configuration error, got {other:?}"),
    };
    let r = reason(base().reconciler("fast", Duration::ZERO, none).start());
    assert!(
        r.contains("\"fast\"") && r.contains("under the minimum"),
        "{r}"
    );
    let r = reason(
        base()
            .reconciler("twice", MINUTE, none)
            .reconciler("twice", MINUTE, none)
            .start(),
    );
    assert!(
        r.contains("\"twice\"") && r.contains("registered twice"),
        "{r}"
    );
    let r = reason(base().reconciler("", MINUTE, none).start());
    assert!(r.contains("empty"), "{r}");
}

/// A function that never answers (a query stuck on a dead connection) is abandoned once it
/// has taken the whole interval and reported; the next pass runs normally.
#[actix::test]
async fn a_function_that_never_answers_is_abandoned_after_its_interval() {
    let hangs = Arc::new(AtomicU8::new(1));
    let h = hangs.clone();
    let sim = Simulation::sqlite(move |b| {
        b.handler(
            "welcome",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("sent") }),
        )
        .reconciler("stuck", Duration::from_secs(1), move |_client| {
            let h = h.clone();
            async move {
                if h.swap(0, Ordering::SeqCst) == 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, String>(vec![welcome(7)])
            }
        })
    })
    .await;
    assert!(sim.elect().await.is_some());
    let started = std::time::Instant::now();
    let m = failed(sim.reconcile("stuck").await);
    assert!(m.contains("longer than its interval"), "{m}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "abandoned after ~1 s"
    );
    assert_eq!(reconciled(sim.reconcile("stuck").await), (1, 1));
    assert_eq!(hangs.load(Ordering::SeqCst), 0);
}
