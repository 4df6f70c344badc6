//! Charge once: an order job that charges a card through an external payment provider and
//! records the payment, with exactly one charge however often the job runs — on an SQLite
//! file, nothing to install:
//!
//! ```sh
//! cargo run --example charge_once            # a few orders, and what happened to each
//! cargo run --example charge_once -- --check # stop a node mid-call; exits non-zero unless
//!                                            # exactly one charge and one payment remain
//! ```
//!
//! The pattern, for any external call that must not happen twice:
//! 1. **Record the intent** in a transaction on the job's store, with the provider's
//!    idempotency key: [`JobTx::record_effect`] records it once, and a retried attempt finds
//!    the key an earlier one chose ([`Recorded::Already`]), so every attempt sends the same.
//! 2. **Call the provider** with that key, outside any transaction: it charges once per key
//!    and answers a repeated key with the charge it already made (this example's provider
//!    is an in-process fake that does exactly that).
//! 3. **Record the result and complete the job** in one transaction
//!    ([`JobContext::complete_in_transaction`]): the payment row, the `charge` effect and the
//!    job's success commit together — or, if this attempt lost the job's lease meanwhile,
//!    not at all (`TxError::LeaseLost`), so a stale attempt never writes a second payment.
//!
//! In `--check` mode, node 1's handler is stopped inside the provider call, after the
//! provider charged but before the answer arrived (the node is shut down without waiting);
//! node 2 then runs the job again, sends the same key, gets the same charge back, and writes
//! the one payment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use jobvisor::{
    handler_fn, JobContext, JobError, JobState, JobTx, NewJob, NodeId, QueueConfig, Recorded,
    Scheduler, SchedulerConfig, SchedulerHandle, SqliteJobConnection, Store, StoreOptions,
};
use serde::Deserialize;
use serde_json::json;

/// The application's own table: one payment per order.
const PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (
    order_id  BIGINT NOT NULL PRIMARY KEY,
    charge_id TEXT   NOT NULL,
    cents     BIGINT NOT NULL
)";

#[derive(Deserialize)]
struct Order {
    order: i64,
    cents: i64,
}

/// A payment provider that honours idempotency keys, as real ones do: a key it has seen is
/// answered with the charge it already made.
#[derive(Default)]
struct FakeProvider {
    /// Charges made, by idempotency key.
    charges: Mutex<HashMap<String, String>>,
    made: AtomicU64,
    /// The next call charges, then never answers (a network that drops the response).
    hang_next: AtomicBool,
    /// Told when a call has charged and hangs.
    hanging: tokio::sync::Notify,
}

impl FakeProvider {
    async fn charge(&self, key: &str, cents: i64) -> String {
        let id = {
            let mut charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
            charges
                .entry(key.to_string())
                .or_insert_with(|| {
                    let n = self.made.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("ch_{n}_{cents}")
                })
                .clone()
        };
        if self.hang_next.swap(false, Ordering::SeqCst) {
            self.hanging.notify_one();
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        id
    }
}

/// The order handler: intent, call, result and completion (see the module doc).
fn charge_order(provider: Arc<FakeProvider>) -> impl jobvisor::JobHandler {
    use diesel_async::RunQueryDsl as _;
    handler_fn(move |o: Order, ctx: JobContext| {
        let provider = provider.clone();
        async move {
            // 1. The idempotency key this job uses, chosen once and recorded.
            let fresh = format!("order-{}-{}", o.order, uuid::Uuid::new_v4());
            let key = ctx
                .transaction(async |mut tx: JobTx<'_, SqliteJobConnection>| {
                    let key = match tx
                        .record_effect("charge:intent", json!({ "idempotency_key": fresh }))
                        .await?
                    {
                        Recorded::New => fresh,
                        Recorded::Already(earlier) => earlier
                            .detail
                            .as_ref()
                            .and_then(|d| d["idempotency_key"].as_str())
                            .map(str::to_string)
                            .ok_or_else(|| JobError::fail("the recorded intent has no key"))?,
                    };
                    Ok::<_, JobError>(key)
                })
                .await
                .map_err(|e| e.into_job_error())?;
            // 2. The call, outside any transaction, with that key.
            let charge_id = provider.charge(&key, o.cents).await;
            // 3. The payment row, the effect and the job's success in one transaction.
            let outcome = ctx
                .complete_in_transaction(async |mut tx: JobTx<'_, SqliteJobConnection>| {
                    diesel::sql_query(
                        "INSERT INTO payments (order_id, charge_id, cents) VALUES (?, ?, ?)",
                    )
                    .bind::<BigInt, _>(o.order)
                    .bind::<Text, _>(&charge_id)
                    .bind::<BigInt, _>(o.cents)
                    .execute(tx.conn())
                    .await?;
                    tx.record_effect("charge", json!({ "charge_id": charge_id }))
                        .await?;
                    Ok::<_, JobError>(json!({ "order": o.order, "charge_id": charge_id }))
                })
                .await
                .map_err(|e| e.into_job_error())?;
            Ok(outcome)
        }
    })
}

fn start_node(
    store: Store,
    name: &str,
    provider: Arc<FakeProvider>,
) -> jobvisor::Result<SchedulerHandle> {
    Scheduler::builder(store)
        .node_id(NodeId::new(name)?)
        .config(
            SchedulerConfig::default()
                .lease(Duration::from_secs(3))
                .renew_every(Duration::from_secs(1)),
        )
        .queue(
            "default",
            QueueConfig::default()
                .concurrency(4)
                .poll_interval(Duration::from_millis(100)),
        )
        .handler("charge_order", charge_order(provider))
        .start()
}

#[derive(QueryableByName, Debug)]
struct Payment {
    #[diesel(sql_type = BigInt)]
    order_id: i64,
    #[diesel(sql_type = Text)]
    charge_id: String,
}

/// The payments the application stored.
async fn payments(
    app: &mut SyncConnectionWrapper<diesel::SqliteConnection>,
) -> Result<Vec<Payment>, diesel::result::Error> {
    use diesel_async::RunQueryDsl as _;
    diesel::sql_query("SELECT order_id, charge_id FROM payments")
        .load(app)
        .await
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    let path = std::env::temp_dir().join(format!(
        "jobvisor-charge-once-{}.sqlite",
        std::process::id()
    ));
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
    }
    let url = format!("sqlite://{}", path.display());
    let store = Store::connect_with(&url, StoreOptions::default().migrate(true)).await?;
    // The application's own connection, for its own table.
    let mut app = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(&format!(
        "{}",
        path.display()
    ))
    .await?;
    app.batch_execute(PAYMENTS).await?;

    let provider = Arc::new(FakeProvider::default());
    let failures = if check {
        check_mode(&store, provider.clone(), &mut app).await?
    } else {
        demo(&store, provider.clone(), &mut app).await?
    };
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
    }
    if failures.is_empty() {
        if check {
            println!("check passed: one charge, one payment, the job succeeded");
        }
        Ok(())
    } else {
        for f in &failures {
            eprintln!("FAILED: {f}");
        }
        std::process::exit(1)
    }
}

/// A few orders on one node; prints what happened to each.
async fn demo(
    store: &Store,
    provider: Arc<FakeProvider>,
    app: &mut SyncConnectionWrapper<diesel::SqliteConnection>,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let node = start_node(store.clone(), "node-1", provider.clone())?;
    let client = node.client();
    let mut ids = Vec::new();
    for (order, cents) in [(1, 1999), (2, 4500), (3, 250)] {
        let job = NewJob::new("charge_order", json!({ "order": order, "cents": cents }));
        ids.push(client.enqueue(job).await?.id);
    }
    println!("job  state       result");
    for id in ids {
        let job = client.wait(id, Duration::from_secs(20)).await?;
        let result = job.result.map(|r| r.to_string()).unwrap_or_default();
        println!("{:<4} {:<11} {result}", id.0, job.state.as_str());
    }
    node.shutdown().await;
    let payments = payments(app).await?;
    println!(
        "\n{} payments, {} charges made by the provider",
        payments.len(),
        provider.made.load(Ordering::SeqCst)
    );
    Ok(Vec::new())
}

/// Node 1 stopped inside the provider call; node 2 finishes the job: one charge.
async fn check_mode(
    store: &Store,
    provider: Arc<FakeProvider>,
    app: &mut SyncConnectionWrapper<diesel::SqliteConnection>,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut failures = Vec::new();
    provider.hang_next.store(true, Ordering::SeqCst);
    let hanging = provider.hanging.notified();
    let node1 = start_node(store.clone(), "node-1", provider.clone())?;
    let client = node1.client();
    let job = NewJob::new("charge_order", json!({ "order": 42, "cents": 1999 }));
    let id = client.enqueue(job).await?.id;
    tokio::time::timeout(Duration::from_secs(20), hanging)
        .await
        .map_err(|_| "node 1 never reached the provider call")?;
    println!("node-1 is inside the provider call (the provider has charged); stopping it now");
    let report = node1.shutdown_within(Duration::ZERO).await;
    println!("node-1 stopped: {report:?}");
    let between = client.get(id).await?;
    println!("the job after node-1: {}", between.state.as_str());
    if between.state.is_terminal() {
        failures.push(format!(
            "the job ended on node 1 ({}); it should be waiting for another node",
            between.state.as_str()
        ));
    }

    let node2 = start_node(store.clone(), "node-2", provider.clone())?;
    let done = node2.client().wait(id, Duration::from_secs(20)).await?;
    node2.shutdown().await;
    println!(
        "node-2 finished it: {} {}",
        done.state.as_str(),
        done.result.clone().unwrap_or_default()
    );

    let charges = provider.made.load(Ordering::SeqCst);
    let payments = payments(app).await?;
    let effects = client.effects(id).await?;
    println!(
        "provider charges: {charges}; payments: {payments:?}; effects: {:?}",
        effects.iter().map(|e| e.key.as_str()).collect::<Vec<_>>()
    );
    if done.state != JobState::Succeeded {
        failures.push(format!("the job is {}, not succeeded", done.state.as_str()));
    }
    if charges != 1 {
        failures.push(format!("the provider charged {charges} times, not once"));
    }
    let charged = provider
        .charges
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .next()
        .cloned();
    match payments.as_slice() {
        [p] if p.order_id == 42 && Some(&p.charge_id) == charged.as_ref() => {}
        other => failures.push(format!(
            "expected one payment of order 42 for charge {charged:?}, found {other:?}"
        )),
    }
    if done.result.as_ref().and_then(|r| r["charge_id"].as_str()) != charged.as_deref() {
        failures.push(format!(
            "the job's result {:?} names another charge",
            done.result
        ));
    }
    let keys: Vec<&str> = effects.iter().map(|e| e.key.as_str()).collect();
    if keys != ["charge", "charge:intent"] {
        failures.push(format!(
            "expected the intent and the charge recorded, found {keys:?}"
        ));
    }
    Ok(failures)
}
