//! A child's handler reads its parents' results ([`JobContext::parent_results`]) on every
//! backend: a fan-in sums what two parents returned, typed, and a pipeline's next step reads
//! the one result before it; a parent that ended dead is listed with no result; results
//! together over the store's payload cap fail the child naming the cap; a child released
//! after the node that ran its parents crashed reads their results on another node.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use jobvisor::testing::{ManualClock, Simulation, TestDb};
use jobvisor::{
    handler_fn, Backend, JobContext, JobError, JobId, JobOutcome, JobState, NewJob, ParentPolicy,
    QueueConfig, StoreOptions,
};
use serde_json::{json, Value};

/// Fetches until `id` has ended an attempt its handler started, and answers its state.
async fn run_to_end(sim: &mut Simulation, id: JobId) -> JobState {
    loop {
        sim.advance(Duration::from_secs(1));
        sim.fetch("default").await;
        match sim.finished(id).await {
            JobState::Pending => continue,
            state => return state,
        }
    }
}

async fn a_child_reads_its_parents_results(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    // A small cap, so that two results of 300 bytes together exceed it.
    let store = db
        .store_with(StoreOptions::default().max_payload_bytes(500))
        .await;
    let mut sim = Simulation::on_store(store, ManualClock::at_fixed_start(), "fan-in", |b| {
        b.handler(
            "produce",
            handler_fn(|n: u64, _ctx| async move {
                if n == 0 {
                    return Err(JobError::fail("nothing to produce"));
                }
                if n > 1000 {
                    return JobOutcome::success("x".repeat(300));
                }
                JobOutcome::success(n * 10)
            }),
        )
        .handler(
            "sum",
            handler_fn(|_: Value, ctx: JobContext| async move {
                let parents = ctx.parent_results().await?;
                let mut sum = 0;
                let mut failed = Vec::new();
                for (id, (state, result)) in parents.iter() {
                    match result {
                        Some(_) => sum += parents.typed::<u64>(id)?,
                        None => failed.push(format!("{id} {state}")),
                    }
                }
                JobOutcome::success(json!({ "sum": sum, "failed": failed }))
            }),
        )
    })
    .keep(db);
    let client = sim.client.clone();
    let enqueue = async |job: NewJob| client.enqueue(job).await.unwrap().id;

    // Fan-in: two parents that succeed and one that ends dead (the child runs anyway).
    let a = enqueue(NewJob::new("produce", json!(1))).await;
    let b = enqueue(NewJob::new("produce", json!(2))).await;
    let dead = enqueue(NewJob::new("produce", json!(0))).await;
    let child = enqueue(
        NewJob::new("sum", json!({}))
            .after(&[a, b, dead])
            .on_parent_failure(ParentPolicy::Run),
    )
    .await;
    for p in [a, b] {
        assert_eq!(run_to_end(&mut sim, p).await, JobState::Succeeded);
    }
    assert_eq!(run_to_end(&mut sim, dead).await, JobState::Dead);
    assert_eq!(run_to_end(&mut sim, child).await, JobState::Succeeded);
    let got = sim.client.get(child).await.unwrap().result;
    assert_eq!(
        got,
        Some(json!({ "sum": 30, "failed": [format!("{dead} dead")] }))
    );

    // Results together over the payload cap: the child fails at once, naming the cap.
    let big1 = enqueue(NewJob::new("produce", json!(1001))).await;
    let big2 = enqueue(NewJob::new("produce", json!(1002))).await;
    let child = enqueue(NewJob::new("sum", json!({})).after(&[big1, big2])).await;
    for p in [big1, big2] {
        assert_eq!(run_to_end(&mut sim, p).await, JobState::Succeeded);
    }
    assert_eq!(run_to_end(&mut sim, child).await, JobState::Dead);
    let err = sim.client.get(child).await.unwrap().last_error.unwrap();
    assert_eq!(err.code, "parent_results_too_large");
    assert!(err.message.contains("500 bytes"), "{err:?}");
}

/// The node that ran the parents crashes before the child starts (its actors stopped, no
/// shutdown): another node claims the released child, and its handler reads every parent's
/// result, stored with the parent's end.
async fn a_child_reads_its_parents_results_after_their_node_crashed(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::at_fixed_start();
    // The child's queue is served by the second node only.
    let node = |name: &str, store, queue: &str| {
        Simulation::on_store(store, clock.clone(), name, |b| {
            b.queue(queue, QueueConfig::default())
                .handler(
                    "produce",
                    handler_fn(|n: u64, _ctx| async move { JobOutcome::success(n * 10) }),
                )
                .handler(
                    "sum",
                    handler_fn(|_: Value, ctx: JobContext| async move {
                        let parents = ctx.parent_results().await?;
                        let mut sum = 0;
                        for (id, _) in parents.iter() {
                            sum += parents.typed::<u64>(id)?;
                        }
                        JobOutcome::success(json!({ "sum": sum }))
                    }),
                )
        })
    };
    let mut a = node("a", db.store().await, "default");
    let enqueue = async |job: NewJob| a.client.enqueue(job).await.unwrap().id;
    let p1 = enqueue(NewJob::new("produce", json!(1))).await;
    let p2 = enqueue(NewJob::new("produce", json!(2))).await;
    let child = enqueue(
        NewJob::new("sum", json!({}))
            .after(&[p1, p2])
            .queue("later"),
    )
    .await;
    for p in [p1, p2] {
        assert_eq!(run_to_end(&mut a, p).await, JobState::Succeeded);
    }
    assert_eq!(a.client.get(child).await.unwrap().state, JobState::Pending);
    a.crash();

    let mut b = node("b", db.store().await, "later");
    b.advance(Duration::from_secs(1));
    assert_eq!(b.fetch("later").await, 1);
    assert_eq!(b.finished(child).await, JobState::Succeeded);
    let got = b.client.get(child).await.unwrap().result;
    assert_eq!(got, Some(json!({ "sum": 30 })));
    let claims = b.client.claims(child).await.unwrap();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].node.as_str(), "b");
}

#[tokio::test]
async fn a_child_reads_its_parents_results_after_their_node_crashed_on_postgres() {
    a_child_reads_its_parents_results_after_their_node_crashed(Backend::Postgres).await;
}

#[tokio::test]
async fn a_child_reads_its_parents_results_after_their_node_crashed_on_mysql() {
    a_child_reads_its_parents_results_after_their_node_crashed(Backend::Mysql).await;
}

#[tokio::test]
async fn a_child_reads_its_parents_results_after_their_node_crashed_on_sqlite() {
    a_child_reads_its_parents_results_after_their_node_crashed(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_child_reads_its_parents_results_on_postgres() {
    a_child_reads_its_parents_results(Backend::Postgres).await;
}

#[tokio::test]
async fn a_child_reads_its_parents_results_on_mysql() {
    a_child_reads_its_parents_results(Backend::Mysql).await;
}

#[tokio::test]
async fn a_child_reads_its_parents_results_on_sqlite() {
    a_child_reads_its_parents_results(Backend::Sqlite).await;
}
