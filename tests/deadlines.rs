//! Start-by deadlines at a node, on every backend ([`NewJob::start_by`]): a job whose
//! deadline passes between its claim and its start (it waits for a worker) never starts and
//! ends `cancelled` with the code `expired`; so does one claimed by a node that comes back
//! after every node was down past its deadline; the sweeper ends one no node claims; a job
//! whose deadline is ahead runs normally. Driven by a simulation's manual clock.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobvisor::clock::Clock;
use jobvisor::testing::{ManualClock, Simulation, TestDb};
use jobvisor::{handler_fn, Backend, Event, JobContext, JobOutcome, JobState, NewJob, QueueConfig};
use serde_json::json;

async fn expired_jobs_never_start(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::at_fixed_start();
    let ran: Arc<Mutex<Vec<i64>>> = Arc::default();
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let (log, gate) = (ran.clone(), hold.clone());
    let mut sim = Simulation::on_store(db.store().await, clock.clone(), "n1", move |b| {
        b.queue("default", QueueConfig::default().concurrency(1).prefetch(1))
            .handler(
                "work",
                handler_fn(move |n: i64, _ctx: JobContext| {
                    let (log, gate) = (log.clone(), gate.clone());
                    async move {
                        log.lock().unwrap().push(n);
                        if n == 0 {
                            // The blocker holds the queue's one worker until released.
                            let _ = gate.acquire().await.unwrap();
                        }
                        JobOutcome::done()
                    }
                }),
            )
    })
    .keep(db);
    let client = sim.client.clone();
    let secs = |s: u64| chrono::Duration::seconds(i64::try_from(s).unwrap());
    let work = |n: i64| NewJob::new("work", json!(n));

    // The deadline passes while the claimed job waits for the worker the blocker holds.
    let blocker = client.enqueue(work(0)).await.unwrap().id;
    let late = client
        .enqueue(work(1).start_by(clock.now() + secs(5)))
        .await
        .unwrap()
        .id;
    sim.fetch("default").await;
    sim.next_event(|e| matches!(e, Event::Started { id, .. } if *id == blocker))
        .await;
    // The prefetch takes it while the blocker runs (at once, or at this fetch).
    for _ in 0..5 {
        if client.get(late).await.unwrap().state == JobState::Running {
            break;
        }
        sim.fetch("default").await;
    }
    assert_eq!(
        client.get(late).await.unwrap().state,
        JobState::Running,
        "claimed (prefetched) before its deadline"
    );
    sim.advance(Duration::from_secs(10));
    hold.add_permits(1);
    assert_eq!(sim.finished(blocker).await, JobState::Succeeded);
    assert_eq!(sim.finished(late).await, JobState::Cancelled);
    let j = client.get(late).await.unwrap();
    assert_eq!(j.last_error.unwrap().code, "expired");
    assert!(
        !ran.lock().unwrap().contains(&1),
        "the expired job never ran"
    );

    // Every node down past the deadline: the first claim after it ends the job unstarted.
    let down = client
        .enqueue(
            work(2)
                .delay(Duration::from_secs(1))
                .start_by(clock.now() + secs(5)),
        )
        .await
        .unwrap()
        .id;
    sim.advance(Duration::from_secs(60));
    sim.fetch("default").await;
    assert_eq!(sim.finished(down).await, JobState::Cancelled);
    assert_eq!(
        client.get(down).await.unwrap().last_error.unwrap().code,
        "expired"
    );

    // No node serves its queue: the sweeper ends it.
    let unserved = client
        .enqueue(work(3).queue("unserved").start_by(clock.now() + secs(5)))
        .await
        .unwrap()
        .id;
    sim.advance(Duration::from_secs(10));
    sim.sweep().await;
    sim.next_event(|e| matches!(e, Event::Expired { id } if *id == unserved))
        .await;
    assert_eq!(
        client.get(unserved).await.unwrap().state,
        JobState::Cancelled
    );

    // A deadline ahead: runs normally.
    let ahead = client
        .enqueue(work(4).start_by(clock.now() + secs(3600)))
        .await
        .unwrap()
        .id;
    sim.fetch("default").await;
    assert_eq!(sim.finished(ahead).await, JobState::Succeeded);
    assert_eq!(*ran.lock().unwrap(), vec![0, 4]);
}

#[tokio::test]
async fn expired_jobs_never_start_on_postgres() {
    expired_jobs_never_start(Backend::Postgres).await;
}

#[tokio::test]
async fn expired_jobs_never_start_on_mysql() {
    expired_jobs_never_start(Backend::Mysql).await;
}

#[tokio::test]
async fn expired_jobs_never_start_on_sqlite() {
    expired_jobs_never_start(Backend::Sqlite).await;
}
