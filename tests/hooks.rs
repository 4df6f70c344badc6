//! The application's hooks ([`JobHooks`]) on every backend: `on_enqueue` sees each job once
//! per enqueue through every entry point (single, many, batch, the caller's transaction, a
//! handler's client and its transaction), may rewrite it, and a refusal — or a panic —
//! writes nothing; `around_run` wraps each attempt that starts exactly once (a retried job:
//! once per attempt; a fenced one: once, its future dropped), sees the handler's outcome (its
//! panic as a `panic` error), and a panic of its own fails the attempt naming the hook, to be
//! retried.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};
use jobvisor::hooks::{JobHooks, Run};
use jobvisor::testing::{ManualClock, Simulation, TestDb};
use jobvisor::Event;
use jobvisor::{
    handler_fn, Backend, Client, Error, JobConnection, JobContext, JobError, JobOutcome, JobResult,
    JobState, JobTx, ListParams, NewJob, SqliteJobConnection,
};
use serde_json::{json, Value};

type SqliteConn = SyncConnectionWrapper<diesel::sqlite::SqliteConnection>;

/// Counts and stamps every job it sees; refuses kind `forbidden`, panics on kind `boom`.
#[derive(Clone, Default)]
struct Stamp {
    seen: Arc<AtomicU32>,
}

impl JobHooks for Stamp {
    fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        match job.kind.as_str() {
            "forbidden" => Err("kind forbidden is not allowed here".into()),
            "boom" => panic!("the stamp hook broke"),
            _ => {
                job.payload["stamp"] = json!(n);
                Ok(())
            }
        }
    }
}

async fn live_jobs(client: &Client) -> usize {
    client.list(ListParams::default()).await.unwrap().len()
}

/// The connection `establish` takes for a test database.
fn diesel_url(db: &TestDb) -> String {
    match db.backend {
        Backend::Sqlite => db.url.trim_start_matches("sqlite://").to_string(),
        _ => db.url.clone(),
    }
}

async fn every_enqueue_runs_the_hook_once(backend: Backend) {
    let db = TestDb::create(backend).await;
    let stamp = Stamp::default();
    let client = Client::new(db.store().await).with_hooks(stamp.clone());
    let seen = || stamp.seen.load(Ordering::SeqCst);

    let one = client.enqueue(NewJob::new("k", json!({}))).await.unwrap();
    assert_eq!(seen(), 1);
    let got = client.get(one.id).await.unwrap().payload;
    assert_eq!(got, json!({"stamp": 1}), "the rewrite is what is written");

    let many = client
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!({"i": i}))).collect())
        .await
        .unwrap();
    assert_eq!(seen(), 4, "once per job of the call");
    assert_eq!(
        client.get(many[2].id).await.unwrap().payload,
        json!({"i": 2, "stamp": 4})
    );

    let batch = client
        .enqueue_batch(
            vec![NewJob::new("k", json!({})), NewJob::new("k", json!({}))],
            NewJob::new("cb", json!({})),
        )
        .await
        .unwrap();
    assert_eq!(seen(), 7, "each member and the callback");
    assert_eq!(
        client.get(batch.callback.id).await.unwrap().payload,
        json!({"stamp": 7})
    );

    // In the caller's transaction.
    let url = diesel_url(&db);
    macro_rules! in_tx {
        ($conn:ty) => {{
            let mut conn = <$conn>::establish(&url).await.unwrap();
            conn.transaction(async |tx| {
                client
                    .enqueue_in(tx, vec![NewJob::new("k", json!({"tx": true}))])
                    .await
            })
            .await
            .unwrap()
        }};
    }
    let in_tx = match backend {
        Backend::Postgres => in_tx!(AsyncPgConnection),
        Backend::Mysql => in_tx!(AsyncMysqlConnection),
        Backend::Sqlite => in_tx!(SqliteConn),
    };
    assert_eq!(seen(), 8);
    assert_eq!(
        client.get(in_tx[0].id).await.unwrap().payload,
        json!({"tx": true, "stamp": 8})
    );

    // A refusal, and a panic, anywhere in a call: the call answers `Refused` naming the
    // hook and the job, and nothing of it is written.
    let before = live_jobs(&client).await;
    let e = client
        .enqueue_many(vec![
            NewJob::new("k", json!({})),
            NewJob::new("forbidden", json!({})),
        ])
        .await
        .unwrap_err();
    match &e {
        Error::Refused { hook, kind, reason } => {
            assert!(hook.contains("Stamp"), "{e}");
            assert_eq!(kind, "forbidden");
            assert!(reason.contains("not allowed"), "{e}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    let e = client
        .enqueue_batch(
            vec![NewJob::new("k", json!({}))],
            NewJob::new("boom", json!({})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Refused { reason, .. } if reason.contains("panicked: the stamp hook broke")),
        "{e:?}"
    );
    assert_eq!(live_jobs(&client).await, before, "nothing written");
    assert_eq!(seen(), 12, "each job seen once, up to the refusal");

    // Without hooks, nothing runs.
    let plain = Client::new(db.store().await);
    plain
        .enqueue(NewJob::new("forbidden", json!({})))
        .await
        .unwrap();
    assert_eq!(seen(), 12);
}

#[tokio::test]
async fn every_enqueue_runs_the_hook_once_on_postgres() {
    every_enqueue_runs_the_hook_once(Backend::Postgres).await;
}

#[tokio::test]
async fn every_enqueue_runs_the_hook_once_on_mysql() {
    every_enqueue_runs_the_hook_once(Backend::Mysql).await;
}

#[tokio::test]
async fn every_enqueue_runs_the_hook_once_on_sqlite() {
    every_enqueue_runs_the_hook_once(Backend::Sqlite).await;
}

/// What the run hook saw, in order: `before <attempt>`, `after <attempt> <outcome>`.
#[derive(Clone, Default)]
struct Around {
    log: Arc<Mutex<Vec<String>>>,
    enqueued: Arc<AtomicU32>,
}

impl JobHooks for Around {
    fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String> {
        self.enqueued.fetch_add(1, Ordering::SeqCst);
        job.payload["hooked"] = json!(true);
        Ok(())
    }

    async fn around_run(&self, run: Run) -> JobResult {
        let (kind, attempt) = (run.context().kind.clone(), run.context().attempt);
        self.log
            .lock()
            .unwrap()
            .push(format!("before {kind} {attempt}"));
        if kind == "hook_panics" && attempt == 1 {
            panic!("tenant lookup failed");
        }
        // Cleanup that must run however the attempt ends belongs in a guard: an attempt
        // stopped from outside (fenced) drops this future with the handler's.
        let mut unfinished = Unfinished {
            log: self.log.clone(),
            label: format!("{kind} {attempt}"),
            done: false,
        };
        let result = run.await;
        unfinished.done = true;
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(e) => e.code.clone(),
        };
        self.log
            .lock()
            .unwrap()
            .push(format!("after {kind} {attempt} {outcome}"));
        result
    }
}

/// Logs `dropped <kind> <attempt>` when dropped before its attempt's run answered.
struct Unfinished {
    log: Arc<Mutex<Vec<String>>>,
    label: String,
    done: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.done {
            self.log
                .lock()
                .unwrap()
                .push(format!("dropped {}", self.label));
        }
    }
}

/// A follow-up through the node's client and one in the handler's own transaction, on a
/// queue the node does not serve (so no enqueue wakes its fetcher: the test fetches).
async fn follow_ups<C: JobConnection>(ctx: JobContext) -> JobResult {
    if ctx.attempt == 1 {
        return Err(JobError::retry_after(
            "first attempt fails",
            Duration::from_secs(1),
        ));
    }
    ctx.client()?
        .enqueue(NewJob::new("child", json!({"via": "client"})).queue("elsewhere"))
        .await?;
    ctx.transaction(async |mut tx: JobTx<'_, C>| {
        tx.enqueue(vec![
            NewJob::new("child", json!({"via": "tx"})).queue("elsewhere")
        ])
        .await
    })
    .await
    .map_err(|e| e.into_job_error())?;
    JobOutcome::done()
}

fn with_follow_ups(b: jobvisor::SchedulerBuilder, backend: Backend) -> jobvisor::SchedulerBuilder {
    match backend {
        Backend::Postgres => b.handler(
            "steps",
            handler_fn(|_: Value, ctx| follow_ups::<AsyncPgConnection>(ctx)),
        ),
        Backend::Mysql => b.handler(
            "steps",
            handler_fn(|_: Value, ctx| follow_ups::<AsyncMysqlConnection>(ctx)),
        ),
        Backend::Sqlite => b.handler(
            "steps",
            handler_fn(|_: Value, ctx| follow_ups::<SqliteJobConnection>(ctx)),
        ),
    }
}

/// Runs the job's next attempt (after any retry backoff) and answers the state it ended in.
/// The node refills its prefetch after each job it ends, so it may claim the job itself
/// before this fetch does; a claim given back before its handler started (`pending`: the
/// clock moved past its fence point) runs no hook and is not an attempt, so it is skipped.
async fn run_once_and_finish(sim: &mut Simulation, id: jobvisor::JobId) -> JobState {
    sim.advance(Duration::from_secs(3600));
    loop {
        sim.fetch("default").await;
        match sim.finished(id).await {
            JobState::Pending => continue,
            state => return state,
        }
    }
}

async fn each_attempt_runs_the_hook_once(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let around = Around::default();
    let hooks = around.clone();
    let mut sim = Simulation::on_store(
        db.store().await,
        ManualClock::at_fixed_start(),
        "hooked",
        move |b| {
            with_follow_ups(b, backend)
                .handler(
                    "handler_panics",
                    handler_fn(|_: Value, ctx: JobContext| async move {
                        if ctx.attempt == 1 {
                            panic!("handler bug");
                        }
                        JobOutcome::done()
                    }),
                )
                .handler(
                    "hook_panics",
                    handler_fn(|_: Value, _ctx| async { JobOutcome::done() }),
                )
                .hooks(hooks)
        },
    )
    .keep(db);
    let log = || std::mem::take(&mut *around.log.lock().unwrap());
    let client = sim.client.clone();
    let enqueue = |kind: &str| {
        let client = client.clone();
        let kind = kind.to_string();
        async move {
            client
                .enqueue(NewJob::new(kind, json!({})))
                .await
                .unwrap()
                .id
        }
    };

    // A job that fails once, then enqueues two follow-ups: each attempt is wrapped once, the
    // hook sees the failure's code and the success, and both follow-ups (the node's client,
    // the handler's transaction) pass `on_enqueue` once each.
    let id = enqueue("steps").await;
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Retrying);
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Succeeded);
    assert_eq!(
        log(),
        [
            "before steps 1",
            "after steps 1 error",
            "before steps 2",
            "after steps 2 ok"
        ]
    );
    assert_eq!(around.enqueued.load(Ordering::SeqCst), 2);
    let children = sim.client.list(ListParams::default()).await.unwrap();
    let hooked: Vec<_> = children
        .iter()
        .filter(|j| j.kind == "child")
        .map(|j| (j.payload["via"].clone(), j.payload["hooked"].clone()))
        .collect();
    assert_eq!(hooked.len(), 2, "{hooked:?}");
    assert!(hooked.iter().all(|(_, h)| *h == json!(true)), "{hooked:?}");

    // The handler's panic reaches the hook as the attempt's `panic` error, retried.
    let id = enqueue("handler_panics").await;
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Retrying);
    let job = sim.client.get(id).await.unwrap();
    let err = job.errors.last().unwrap();
    assert_eq!(err.code, "panic");
    assert!(err.message.contains("the handler panicked"), "{err:?}");
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Succeeded);
    assert_eq!(
        log(),
        [
            "before handler_panics 1",
            "after handler_panics 1 panic",
            "before handler_panics 2",
            "after handler_panics 2 ok"
        ]
    );

    // The hook's own panic fails the attempt naming the hook; the next attempt runs.
    let id = enqueue("hook_panics").await;
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Retrying);
    let job = sim.client.get(id).await.unwrap();
    let err = job.errors.last().unwrap();
    assert_eq!(err.code, "panic");
    assert!(
        err.message.contains("JobHooks::around_run") && err.message.contains("Around"),
        "{err:?}"
    );
    assert!(err.message.contains("tenant lookup failed"), "{err:?}");
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Succeeded);
    assert_eq!(
        log(),
        [
            "before hook_panics 1",
            "before hook_panics 2",
            "after hook_panics 2 ok"
        ]
    );
}

#[tokio::test]
async fn each_attempt_runs_the_hook_once_on_postgres() {
    each_attempt_runs_the_hook_once(Backend::Postgres).await;
}

#[tokio::test]
async fn each_attempt_runs_the_hook_once_on_mysql() {
    each_attempt_runs_the_hook_once(Backend::Mysql).await;
}

#[tokio::test]
async fn each_attempt_runs_the_hook_once_on_sqlite() {
    each_attempt_runs_the_hook_once(Backend::Sqlite).await;
}

/// An attempt fenced (its lease went unrenewed past the fence point while its handler hung):
/// wrapped once, the hook's future dropped with the handler's (its guard ran), the attempt
/// given back as a counted `fenced` failure; the next attempt wrapped once more.
async fn a_fenced_attempt_is_wrapped_once(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let around = Around::default();
    let hooks = around.clone();
    let mut sim = Simulation::on_store(
        db.store().await,
        ManualClock::at_fixed_start(),
        "fenced",
        move |b| {
            b.handler(
                "hangs_once",
                handler_fn(|_: Value, ctx: JobContext| async move {
                    if ctx.attempt == 1 {
                        // Ignores its stop: only dropping its future ends it.
                        std::future::pending::<()>().await;
                    }
                    JobOutcome::done()
                }),
            )
            .hooks(hooks)
        },
    )
    .keep(db);
    let id = sim
        .client
        .enqueue(NewJob::new("hangs_once", json!({})))
        .await
        .unwrap()
        .id;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Started { .. })).await;
    // `Started` is emitted just before the handler's first poll, on the handler runtime: wait
    // until the hook is running, or the fence below could stop the attempt before it began.
    let began = tokio::time::Instant::now() + Duration::from_secs(10);
    while !around
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l == "before hangs_once 1")
    {
        assert!(tokio::time::Instant::now() < began, "the hook never began");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // No timers in a simulation: the lease (30 s) is not renewed, and its fence point passes.
    sim.advance(Duration::from_secs(29));
    sim.check_deadlines().await;
    sim.next_event(|e| matches!(e, Event::SelfFenced { .. }))
        .await;
    assert_eq!(sim.finished(id).await, JobState::Retrying);
    let job = sim.client.get(id).await.unwrap();
    assert_eq!(
        job.errors.last().unwrap().code,
        "fenced",
        "{:?}",
        job.errors
    );
    assert_eq!(run_once_and_finish(&mut sim, id).await, JobState::Succeeded);
    assert_eq!(
        std::mem::take(&mut *around.log.lock().unwrap()),
        [
            "before hangs_once 1",
            "dropped hangs_once 1",
            "before hangs_once 2",
            "after hangs_once 2 ok"
        ]
    );
}

#[tokio::test]
async fn a_fenced_attempt_is_wrapped_once_on_postgres() {
    a_fenced_attempt_is_wrapped_once(Backend::Postgres).await;
}

#[tokio::test]
async fn a_fenced_attempt_is_wrapped_once_on_mysql() {
    a_fenced_attempt_is_wrapped_once(Backend::Mysql).await;
}

#[tokio::test]
async fn a_fenced_attempt_is_wrapped_once_on_sqlite() {
    a_fenced_attempt_is_wrapped_once(Backend::Sqlite).await;
}
