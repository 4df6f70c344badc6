//! Queue control through the runtime, in simulation (actors on a real store, a manual clock,
//! fetches driven by the test): a pause stops every node's claims and a resume restarts
//! them, a rate-limited fetcher sleeps until its window frees and then claims by itself, and
//! a global limit hands its slots from node to node without ever being exceeded. The
//! hand-off runs on PostgreSQL, MySQL and SQLite.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobvisor::clock::ManualClock;
use jobvisor::testing::{Simulation, TestDb};
use jobvisor::{
    handler_fn, Backend, JobError, JobId, JobOutcome, JobState, NewJob, QueueConfig, QueueLimits,
    RateLimit,
};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// Handlers running now, and the most ever at once.
#[derive(Debug, Default)]
struct Gauge {
    now: AtomicI64,
    peak: AtomicI64,
}

/// A handler that counts itself in `gauge` while it waits for a permit of `gate`.
fn counted(gate: Arc<Semaphore>, gauge: Arc<Gauge>) -> impl jobvisor::JobHandler {
    handler_fn(move |_: Value, _ctx| {
        let (gate, gauge) = (gate.clone(), gauge.clone());
        async move {
            let n = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
            gauge.peak.fetch_max(n, Ordering::SeqCst);
            let permit = gate.acquire().await.map_err(JobError::fail);
            gauge.now.fetch_sub(1, Ordering::SeqCst);
            // Used up: each permit lets one handler through.
            permit?.forget();
            JobOutcome::success("done")
        }
    })
}

fn node(
    db: &Arc<TestDb>,
    store: jobvisor::Store,
    clock: &ManualClock,
    name: &str,
    kind: &str,
    handler: impl jobvisor::JobHandler,
) -> Simulation {
    Simulation::on_store(store, clock.clone(), name, |b| {
        b.queue("q", QueueConfig::default().concurrency(10).prefetch(0))
            .handler(kind, handler)
    })
    .keep(db.clone())
}

/// Two nodes `a` and `b` on one fresh database and clock, running `kinds[0]` and `kinds[1]`
/// with `counted` handlers behind one gate (closed) and one gauge.
struct Pair {
    a: Simulation,
    b: Simulation,
    gate: Arc<Semaphore>,
    gauge: Arc<Gauge>,
}

impl Pair {
    async fn start(backend: Backend, kinds: [&str; 2]) -> Pair {
        let db = Arc::new(TestDb::create(backend).await);
        let clock = ManualClock::at_fixed_start();
        let gate = Arc::new(Semaphore::new(0));
        let gauge = Arc::new(Gauge::default());
        let mut nodes = Vec::new();
        for (name, kind) in ["a", "b"].into_iter().zip(kinds) {
            let handler = counted(gate.clone(), gauge.clone());
            nodes.push(node(&db, db.store().await, &clock, name, kind, handler));
        }
        let b = nodes.pop().unwrap();
        let a = nodes.pop().unwrap();
        Pair { a, b, gate, gauge }
    }
}

async fn enqueue(sim: &Simulation, kind: &str, n: usize) -> Vec<JobId> {
    sim.client
        .enqueue_many(
            (0..n)
                .map(|i| NewJob::new(kind, json!(i)).queue("q"))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Waits (real time, at most 20 s) until `done` holds.
async fn until(done: impl Fn() -> bool) {
    for _ in 0..4000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("not reached in 20 s");
}

#[actix::test]
async fn a_pause_stops_claims_on_every_node_and_a_resume_restarts_them() {
    let Pair { a, b, gate, .. } = Pair::start(Backend::Sqlite, ["w", "w"]).await;
    let ids = enqueue(&a, "w", 30).await;
    a.fetch("q").await; // half its budget, then the other half by itself
    until(|| a.handle.stats().claimed == 10).await;
    let info = b.client.pause_queue("q", "test").await.unwrap();
    assert!(info.is_paused());
    for _ in 0..3 {
        assert_eq!(a.fetch("q").await + b.fetch("q").await, 0, "paused");
    }
    // Running jobs finish normally while paused; their freed slots claim nothing.
    gate.add_permits(10);
    for id in &ids[..10] {
        let job = a.client.wait(*id, Duration::from_secs(20)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded);
    }
    assert_eq!(a.fetch("q").await + b.fetch("q").await, 0, "still paused");
    assert_eq!(
        a.client
            .list(jobvisor::ListParams {
                state: Some(JobState::Pending),
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        20,
        "the rest wait, due"
    );
    assert!(a.client.resume_queue("q").await.unwrap().is_none());
    a.fetch("q").await;
    b.fetch("q").await;
    until(|| a.handle.stats().claimed + b.handle.stats().claimed == 30).await;
    assert!(b.handle.stats().claimed > 0, "both claim again");
    gate.add_permits(100);
    for id in &ids {
        let job = a.client.wait(*id, Duration::from_secs(20)).await.unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1));
    }
}

#[actix::test]
async fn a_rate_limited_fetcher_sleeps_until_its_window_frees_then_claims_by_itself() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(1000));
    let a = node(
        &db,
        db.store().await,
        &clock,
        "a",
        "w",
        counted(gate, Arc::new(Gauge::default())),
    );
    enqueue(&a, "w", 20).await;
    let window = Duration::from_millis(300);
    a.client
        .set_queue_limits(
            "q",
            QueueLimits::default().rate(RateLimit::new(3, window).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(a.fetch("q").await, 3);
    assert_eq!(a.fetch("q").await, 0, "the window is full");
    let before = a.handle.stats().claim_statements;
    // The window is on the database's (here the test's) clock; the fetcher's sleep is real
    // time. While the clock stands still, the fetcher wakes once per window, no more.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let idle = a.handle.stats().claim_statements - before;
    assert!(
        (1..=4).contains(&idle),
        "{idle} claims in 700 ms of a full 300 ms window: sleeping, not polling"
    );
    assert_eq!(a.handle.stats().claimed, 3);
    // Once the window — the period and the start margin — has passed, the fetcher's own
    // wake-up claims the next 3.
    clock.advance(window + jobvisor::RATE_START_MARGIN);
    until(|| a.handle.stats().claimed == 6).await;
}

async fn a_global_limit_hands_its_slots_between_nodes(backend: Backend) {
    const LIMIT: i64 = 4;
    // a runs kind x, b kind w, on one queue limited to 4 running jobs: whatever a holds, b
    // cannot have; every slot a frees is b's to take.
    let Pair { a, b, gate, gauge } = Pair::start(backend, ["x", "w"]).await;
    let mut ids = enqueue(&a, "x", 4).await;
    ids.extend(enqueue(&a, "w", 20).await);
    a.client
        .set_queue_limits("q", QueueLimits::default().concurrency(4))
        .await
        .unwrap();
    assert_eq!(a.fetch("q").await, 4);
    assert_eq!(
        b.fetch("q").await,
        0,
        "the limit is full, though b has 10 free workers"
    );
    let held = || {
        let (sa, sb) = (a.handle.stats(), b.handle.stats());
        (sa.claimed + sb.claimed) - (sa.finished + sb.finished)
    };
    for step in 1..=24_u64 {
        gate.add_permits(1);
        until(|| a.handle.stats().finished + b.handle.stats().finished == step).await;
        // b's own fetcher claims when one of its jobs frees a slot; a slot a frees is
        // claimed by b's next fetch (its poll).
        b.fetch("q").await;
        assert!(held() <= 4, "{} jobs held under a limit of 4", held());
    }
    assert_eq!(b.handle.stats().claimed, 20, "b ran every w job");
    gate.add_permits(100);
    for id in &ids {
        let job = a.client.wait(*id, Duration::from_secs(20)).await.unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1));
    }
    let peak = gauge.peak.load(Ordering::SeqCst);
    assert_eq!(
        peak, LIMIT,
        "never more than the limit at once, and the limit was used"
    );
}

mod hand_off {
    use super::*;

    #[actix::test]
    async fn postgres() {
        a_global_limit_hands_its_slots_between_nodes(Backend::Postgres).await;
    }

    #[actix::test]
    async fn mysql() {
        a_global_limit_hands_its_slots_between_nodes(Backend::Mysql).await;
    }

    #[actix::test]
    async fn sqlite() {
        a_global_limit_hands_its_slots_between_nodes(Backend::Sqlite).await;
    }
}

/// Limits declared with the queue (`QueueConfig::limits`) on a database no node has served:
/// three nodes start with jobs already waiting, and from the very first claim on, no more
/// than the limit are held — each fetcher claims nothing until its node has written them.
async fn declared_limits_hold_from_the_first_claim(backend: Backend) {
    const LIMIT: u64 = 3;
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let gauge = Arc::new(Gauge::default());
    let mut nodes = Vec::new();
    for name in ["n1", "n2", "n3"] {
        let handler = counted(gate.clone(), gauge.clone());
        // Jobs are due before any node starts: the first claim must already see the limit.
        if nodes.is_empty() {
            let client = jobvisor::Client::new(db.store().await);
            let jobs = (0..30)
                .map(|i| NewJob::new("w", json!(i)).queue("q"))
                .collect();
            client.enqueue_many(jobs).await.unwrap();
        }
        let limits = QueueLimits::default().concurrency(u32::try_from(LIMIT).unwrap());
        let store = db.store().await;
        let node = Simulation::on_store(store, clock.clone(), name, move |b| {
            b.queue("q", QueueConfig::default().concurrency(10).limits(limits))
                .handler("w", handler)
        })
        .keep(db.clone());
        // A claim at once, racing the node's own write of its limits.
        node.fetch("q").await;
        nodes.push(node);
    }
    let held = || {
        nodes
            .iter()
            .map(|n| n.handle.stats())
            .map(|s| s.claimed - s.finished)
            .sum::<u64>()
    };
    let check = || {
        assert!(
            held() <= LIMIT,
            "{} jobs held under a limit of {LIMIT}",
            held()
        )
    };
    check();
    // Every node claims at once, again and again, as soon as it can.
    for _ in 0..20 {
        for n in &nodes {
            n.fetch("q").await;
            check();
        }
    }
    assert_eq!(held(), LIMIT, "the limit is used");
    let info = nodes[0].client.queue("q").await.unwrap().unwrap();
    assert_eq!(info.limits.concurrency, Some(3), "stored for every node");
    for step in 1..=30_u64 {
        gate.add_permits(1);
        until(|| nodes.iter().map(|n| n.handle.stats().finished).sum::<u64>() == step).await;
        for n in &nodes {
            n.fetch("q").await;
        }
        check();
    }
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 3);
}

mod declared_limits {
    use super::*;

    #[actix::test]
    async fn postgres() {
        declared_limits_hold_from_the_first_claim(Backend::Postgres).await;
    }

    #[actix::test]
    async fn mysql() {
        declared_limits_hold_from_the_first_claim(Backend::Mysql).await;
    }

    #[actix::test]
    async fn sqlite() {
        declared_limits_hold_from_the_first_claim(Backend::Sqlite).await;
    }
}

/// A pause holds at the start: jobs a node claimed before the pause and holds in its
/// prefetch never start once the node has read the pause — they go back to the queue at
/// once without using an attempt — while the handler already running finishes normally.
/// A resume wakes the fetcher, which claims them again by itself.
async fn a_pause_gives_back_the_prefetch_without_an_attempt(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::at_fixed_start();
    let gate = Arc::new(Semaphore::new(0));
    let gauge = Arc::new(Gauge::default());
    let handler = counted(gate.clone(), gauge.clone());
    let a = Simulation::on_store(db.store().await, clock.clone(), "a", move |b| {
        b.queue("q", QueueConfig::default().concurrency(1).prefetch(10))
            .handler("w", handler)
    })
    .keep(db.clone());
    let ids = enqueue(&a, "w", 6).await;
    a.fetch("q").await;
    until(|| gauge.now.load(Ordering::SeqCst) == 1).await;
    // One running, the rest of what it claimed waits for the one worker.
    let held = || a.handle.stats().claimed - a.handle.stats().finished;
    until(|| held() >= 2).await;
    let info = a.client.pause_queue("q", "test").await.unwrap();
    assert!(info.is_paused());
    a.read_settings().await;
    // The prefetched jobs go back unstarted, without an attempt; the running one stays.
    let states = || async {
        let mut v = Vec::new();
        for id in &ids {
            let j = a.client.get(*id).await.unwrap();
            v.push((j.id, j.state, j.attempts));
        }
        v
    };
    for _ in 0..2000 {
        if held() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let now = states().await;
    let running: Vec<_> = now.iter().filter(|j| j.1 == JobState::Running).collect();
    assert_eq!(running.len(), 1, "only the started job is held: {now:?}");
    assert_eq!(running[0].2, 1);
    assert!(
        now.iter()
            .filter(|j| j.1 == JobState::Pending)
            .all(|j| j.2 == 0),
        "no attempt used by a job that never started: {now:?}"
    );
    // The running handler finishes normally; nothing else starts while paused.
    let running = running[0].0;
    gate.add_permits(1);
    let mut a = a;
    assert_eq!(a.finished(running).await, JobState::Succeeded);
    assert_eq!(a.fetch("q").await, 0, "paused");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 1);
    assert_eq!(gauge.now.load(Ordering::SeqCst), 0, "no start while paused");
    // Resumed: the node reads it and claims by itself.
    a.client.resume_queue("q").await.unwrap();
    a.read_settings().await;
    until(|| gauge.now.load(Ordering::SeqCst) == 1).await;
    gate.add_permits(5);
    for id in ids.iter().filter(|id| **id != running) {
        a.next_event(|e| {
            matches!(e, jobvisor::Event::Finished { id: i, state: JobState::Succeeded, .. } if i == id)
        })
        .await;
    }
    for id in &ids {
        assert_eq!(
            a.client.get(*id).await.unwrap().attempts,
            1,
            "one attempt each"
        );
    }
}

mod pause_at_the_start {
    use super::*;

    #[actix::test]
    async fn postgres() {
        a_pause_gives_back_the_prefetch_without_an_attempt(Backend::Postgres).await;
    }

    #[actix::test]
    async fn mysql() {
        a_pause_gives_back_the_prefetch_without_an_attempt(Backend::Mysql).await;
    }

    #[actix::test]
    async fn sqlite() {
        a_pause_gives_back_the_prefetch_without_an_attempt(Backend::Sqlite).await;
    }
}
