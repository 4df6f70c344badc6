//! The hot path's statement budget: how many statements, transactions and round trips each
//! operation a node repeats per job costs, counted by a diesel instrumentation on every
//! connection — counts, not times, so the guard cannot be noise. A change that adds a
//! statement to the hot path fails here until the budget below (and the cost model in
//! ARCHITECTURE.md §9) is raised in the same commit, with the reason; one that saves a
//! statement fails too, until the budget is lowered to match.
//!
//! Each operation is measured alone on a fresh store of each backend (nothing else runs in
//! this binary), once warmed up so that the figures are those of a node in steady state.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use diesel::connection::{set_default_instrumentation, Instrumentation, InstrumentationEvent};
use jobvisor::testing::LeaseToken;
use jobvisor::testing::{
    ClaimParams, Finalization, Finalize, FinalizeParams, LeaseRef, RenewParams, StoreEngine as _,
    TestDb,
};
use jobvisor::{Backend, Client, JobId, NewJob, NodeId, QueueLimits, Store};
use serde_json::json;

static QUERIES: AtomicU64 = AtomicU64::new(0);
static BEGINS: AtomicU64 = AtomicU64::new(0);
static COMMITS: AtomicU64 = AtomicU64::new(0);

/// Counts what every connection opened from now on sends.
fn counting() -> Option<Box<dyn Instrumentation>> {
    Some(Box::new(|e: InstrumentationEvent<'_>| match e {
        InstrumentationEvent::StartQuery { .. } => {
            QUERIES.fetch_add(1, SeqCst);
        }
        InstrumentationEvent::BeginTransaction { .. } => {
            BEGINS.fetch_add(1, SeqCst);
        }
        InstrumentationEvent::CommitTransaction { .. } => {
            COMMITS.fetch_add(1, SeqCst);
        }
        _ => {}
    }))
}

/// What one operation sent: statements (queries, pings included), transactions begun and
/// committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cost {
    statements: u64,
    begins: u64,
    commits: u64,
}

impl Cost {
    const fn new(statements: u64, begins: u64, commits: u64) -> Self {
        Cost {
            statements,
            begins,
            commits,
        }
    }
}

async fn cost_of<T>(f: impl std::future::Future<Output = T>) -> (T, Cost) {
    let (q, b, c) = (
        QUERIES.load(SeqCst),
        BEGINS.load(SeqCst),
        COMMITS.load(SeqCst),
    );
    let out = f.await;
    let cost = Cost::new(
        QUERIES.load(SeqCst) - q,
        BEGINS.load(SeqCst) - b,
        COMMITS.load(SeqCst) - c,
    );
    (out, cost)
}

/// The budget of one backend: each hot-path operation, for a batch of ten jobs.
struct Budget {
    /// `Client::enqueue` of one job.
    enqueue: Cost,
    /// `Client::enqueue_many` of ten jobs.
    enqueue_many: Cost,
    /// The fetcher's claim of ten jobs from a queue without settings.
    claim: Cost,
    /// The same on a queue with a global concurrency limit (the controlled claim).
    claim_limited: Cost,
    /// One heartbeat renewing ten leases.
    renew: Cost,
    /// One finalization batch of ten successes.
    finalize: Cost,
}

/// Why each figure is what it is: ARCHITECTURE.md §9 (the cost model). "Statements" counts
/// every statement sent, `BEGIN` and `COMMIT` included, so it is the operation's round trips.
/// MySQL checks each connection out with a ping (`SELECT 1`: diesel-async cannot tell
/// otherwise that the server closed it), one round trip more per operation.
fn budget(backend: Backend) -> Budget {
    match backend {
        // One statement each; the controlled claim reads the queue's settings and counts its
        // running jobs in statements of their own (ARCHITECTURE.md §7.5).
        // An enqueue's insert, then the announcement of its queue from a transaction of its
        // own once it committed (`after_commit.rs`: one at a time per store, covering every
        // enqueue committed meanwhile; the caller does not wait for it).
        Backend::Postgres => Budget {
            enqueue: Cost::new(2, 0, 0),
            enqueue_many: Cost::new(2, 0, 0),
            claim: Cost::new(1, 0, 0),
            claim_limited: Cost::new(5, 0, 0),
            renew: Cost::new(1, 0, 0),
            // The execution ledger's rows (ends other than successes) are written by the
            // finalize statement itself.
            finalize: Cost::new(1, 0, 0),
        },
        // No `UPDATE … RETURNING`: a locking read or a read-back beside each update, in a
        // transaction, after the checkout's ping.
        Backend::Mysql => Budget {
            enqueue: Cost::new(2, 0, 0),
            enqueue_many: Cost::new(4, 1, 1),
            claim: Cost::new(6, 1, 1),
            // The queue row is locked by a write of its `claims` counter before it is read:
            // on a Galera cluster only a write is certified across members.
            claim_limited: Cost::new(9, 1, 1),
            renew: Cost::new(5, 1, 1),
            // Ping, `BEGIN`, locking `SELECT` (which also reads the claim the row keeps),
            // `UPDATE … JOIN`, `COMMIT`: successes write no execution-ledger row (their
            // claim stays on the job row), so the ledger's `INSERT` is not sent.
            finalize: Cost::new(5, 1, 1),
        },
        // Writes in `BEGIN IMMEDIATE … COMMIT` (the writer lock is taken up front) — but one
        // job without a key: its insert alone, in autocommit (`sqlite/mod.rs`).
        Backend::Sqlite => Budget {
            enqueue: Cost::new(1, 0, 0),
            enqueue_many: Cost::new(3, 1, 1),
            claim: Cost::new(3, 1, 1),
            claim_limited: Cost::new(7, 1, 1),
            renew: Cost::new(1, 0, 0),
            // `BEGIN IMMEDIATE`, the update, `COMMIT`: successes write no execution-ledger
            // row (their claim stays on the job row), so neither the ledger's read nor its
            // `INSERT` runs. In-process statements, no round trips.
            finalize: Cost::new(3, 1, 1),
        },
    }
}

fn claim_params(queue: &str, limit: u32) -> ClaimParams {
    ClaimParams {
        queue: queue.into(),
        owner: NodeId::new("budget").unwrap(),
        limit,
        kinds: Some(vec!["k".into()]),
        lease: Duration::from_secs(30),
        now: None,
    }
}

fn ten(queue: &str) -> Vec<NewJob> {
    (0..10)
        .map(|i| NewJob::new("k", json!({ "i": i })).queue(queue))
        .collect()
}

/// Measures every operation of `budget` on a fresh store; answers what was measured.
async fn measure(backend: Backend) -> Vec<(&'static str, Cost, Cost)> {
    let db = TestDb::create(backend).await;
    let store: Store = db.store().await;
    let client = Client::new(store.clone());
    client
        .set_queue_limits("limited", QueueLimits::default().concurrency(1000))
        .await
        .unwrap();
    let want = budget(backend);
    let mut out = Vec::new();

    // Warm up: every statement once on the pooled connections (MySQL prepares on first use).
    for _ in 0..2 {
        client.enqueue(NewJob::new("k", json!({}))).await.unwrap();
        client.enqueue_many(ten("default")).await.unwrap();
        client.enqueue_many(ten("limited")).await.unwrap();
        let c = store.job_claim(claim_params("default", 10)).await.unwrap();
        let l = store.job_claim(claim_params("limited", 10)).await.unwrap();
        let mut all = c;
        all.extend(l);
        let leases = all
            .iter()
            .map(|c| lease_ref(c.id, &c.token))
            .collect::<Vec<_>>();
        store.job_renew_leases(renew(leases)).await.unwrap();
        store
            .job_finalize_many(finalize(all.iter().map(|c| (c.id, &c.token))))
            .await
            .unwrap();
    }
    store
        .job_claim(claim_params("default", 1000))
        .await
        .unwrap();
    settle().await;

    // An enqueue's cost includes what it leaves to run after it returns (PostgreSQL's
    // announcement after the commit).
    let (_, c) = cost_of(async {
        client.enqueue(NewJob::new("k", json!({}))).await.unwrap();
        settle().await;
    })
    .await;
    out.push(("enqueue one", c, want.enqueue));
    let (_, c) = cost_of(async {
        client.enqueue_many(ten("default")).await.unwrap();
        settle().await;
    })
    .await;
    out.push(("enqueue ten", c, want.enqueue_many));
    client.enqueue_many(ten("limited")).await.unwrap();
    settle().await;
    let (claimed, c) = cost_of(store.job_claim(claim_params("default", 10))).await;
    let claimed = claimed.unwrap();
    assert_eq!(claimed.len(), 10, "{backend:?}: the claim took ten jobs");
    out.push(("claim ten", c, want.claim));
    let (limited, c) = cost_of(store.job_claim(claim_params("limited", 10))).await;
    let limited = limited.unwrap();
    assert_eq!(
        limited.len(),
        10,
        "{backend:?}: the limited claim took ten jobs"
    );
    out.push(("claim ten, limited queue", c, want.claim_limited));
    let leases = claimed
        .iter()
        .map(|c| lease_ref(c.id, &c.token))
        .collect::<Vec<_>>();
    let (_, c) = cost_of(store.job_renew_leases(renew(leases))).await;
    out.push(("renew ten", c, want.renew));
    let (_, c) =
        cost_of(store.job_finalize_many(finalize(claimed.iter().map(|c| (c.id, &c.token))))).await;
    out.push(("finalize ten", c, want.finalize));
    out
}

/// Lets the work an operation left running after it returned finish (a local server
/// answers in well under this).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn lease_ref(id: JobId, token: &LeaseToken) -> LeaseRef {
    LeaseRef {
        id,
        token: token.clone(),
        started_ago: Some(Duration::from_millis(1)),
        progress: None,
    }
}

fn renew(leases: Vec<LeaseRef>) -> RenewParams {
    RenewParams {
        leases,
        lease: Duration::from_secs(30),
        timeout_grace: Duration::from_secs(35),
        now: None,
    }
}

fn finalize<'a>(jobs: impl Iterator<Item = (JobId, &'a LeaseToken)>) -> FinalizeParams {
    FinalizeParams {
        items: jobs
            .map(|(id, token)| Finalize {
                id,
                token: token.clone(),
                outcome: Finalization::Succeeded {
                    result: json!(null),
                },
                // A job shorter than a heartbeat: its start is written by the same statement.
                started_ago: Some(Duration::from_millis(5)),
                fence_margin_ms: None,
            })
            .collect(),
        now: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hot_path_operation_stays_within_its_statement_budget() {
    set_default_instrumentation(counting).unwrap();
    let mut over = Vec::new();
    for backend in [Backend::Postgres, Backend::Mysql, Backend::Sqlite] {
        for (what, got, want) in measure(backend).await {
            println!(
                "{backend:?}\t{what}\tstatements {}\tbegins {}\tcommits {}",
                got.statements, got.begins, got.commits
            );
            if got != want {
                over.push(format!("{backend:?} {what}: {got:?}, budget {want:?}"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "hot-path statements differ from the budget (raise or lower it in the same commit, \
         with the reason, and the cost model in ARCHITECTURE.md §9):\n{}",
        over.join("\n")
    );
}
