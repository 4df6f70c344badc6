//! The conformance suite: every store transition and every invariant of DESIGN §6 that the
//! store alone can break, written once and run unchanged against PostgreSQL, MySQL/MariaDB and
//! SQLite (`conformance_tests!(Backend::…)` in `tests/store_<backend>.rs`).
//!
//! Each case gets a fresh, isolated database — a schema on PostgreSQL, a database on MySQL, a
//! temp file on SQLite — created from the URLs in `JOBVISOR_PG_URL` / `JOBVISOR_MYSQL_URL`
//! (default: the local services) and dropped afterwards. A server that cannot be reached fails
//! the case: a skipped backend is never a pass. All times are bound from a fixed test clock.
//!
//! Not a stable API: it exists for jobvisor's own tests.

#![allow(missing_docs, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, SimpleAsyncConnection,
};
use serde_json::json;

use super::connect::SqliteConn;
use super::*;
use crate::error::Error;
use crate::job::{JobFailure, JobState, NewJob};
use crate::lease::NodeId;

/// Default PostgreSQL URL for tests.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Default MySQL URL for tests.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The base URL for a backend's tests, from the environment or the local default.
pub fn base_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => {
            std::env::var("JOBVISOR_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into())
        }
        Backend::Mysql => {
            std::env::var("JOBVISOR_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.into())
        }
        Backend::Sqlite => String::new(),
    }
}

/// A fresh, isolated database; dropped when this value is.
pub struct TestDb {
    pub backend: Backend,
    /// URL of the isolated database (with the schema / database / file selected).
    pub url: String,
    cleanup: Option<Cleanup>,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

enum Cleanup {
    PgSchema { admin_url: String, schema: String },
    MysqlDb { admin_url: String, db: String },
}

fn unique_name() -> String {
    format!("jv_{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

fn with_query(url: &str, kv: &str) -> String {
    if url.contains('?') {
        format!("{url}&{kv}")
    } else {
        format!("{url}?{kv}")
    }
}

impl TestDb {
    /// Creates the isolated database (nothing in it yet).
    pub async fn create(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => {
                let admin = base_url(backend);
                let schema = unique_name();
                let mut c = AsyncPgConnection::establish(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("PostgreSQL at {admin} is required for these tests: {e}")
                    });
                c.batch_execute(&format!("CREATE SCHEMA {schema}"))
                    .await
                    .unwrap();
                let url = with_query(&admin, &format!("options=-c%20search_path%3D{schema}"));
                TestDb {
                    backend,
                    url,
                    cleanup: Some(Cleanup::PgSchema {
                        admin_url: admin,
                        schema,
                    }),
                    _dir: None,
                }
            }
            Backend::Mysql => {
                let admin = base_url(backend);
                let db = unique_name();
                let mut c = AsyncMysqlConnection::establish(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("MySQL/MariaDB at {admin} is required for these tests: {e}")
                    });
                c.batch_execute(&format!("CREATE DATABASE {db}"))
                    .await
                    .unwrap();
                let mut u = url::Url::parse(&admin).unwrap();
                u.set_path(&format!("/{db}"));
                TestDb {
                    backend,
                    url: u.to_string(),
                    cleanup: Some(Cleanup::MysqlDb {
                        admin_url: admin,
                        db,
                    }),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
                TestDb {
                    backend,
                    url,
                    cleanup: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// Opens a migrated store on it.
    pub async fn store(&self) -> Store {
        self.store_with(StoreOptions::default().pool_size(12)).await
    }

    /// Opens a migrated store with options.
    pub async fn store_with(&self, opts: StoreOptions) -> Store {
        Store::connect_with(&self.url, opts.migrate(true))
            .await
            .unwrap_or_else(|e| panic!("opening a store on {:?}: {e}", self.backend))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        // Drop cannot await: clean up on a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                match cleanup {
                    Cleanup::PgSchema { admin_url, schema } => {
                        if let Ok(mut c) = AsyncPgConnection::establish(&admin_url).await {
                            let _ = c
                                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                                .await;
                        }
                    }
                    Cleanup::MysqlDb { admin_url, db } => {
                        if let Ok(mut c) = AsyncMysqlConnection::establish(&admin_url).await {
                            let _ = c.batch_execute(&format!("DROP DATABASE {db}")).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// Everything a case needs.
#[derive(Debug)]
pub struct Bundle {
    pub db: TestDb,
    pub store: Store,
    pub t0: DateTime<Utc>,
}

impl Bundle {
    pub async fn new(backend: Backend) -> Bundle {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        Bundle {
            db,
            store,
            t0: Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap(),
        }
    }

    /// The test clock at t0 + `secs`.
    pub fn at(&self, secs: i64) -> Option<DateTime<Utc>> {
        Some(self.t0 + chrono::Duration::seconds(secs))
    }

    pub async fn enqueue(&self, job: NewJob, at: i64) -> JobId {
        let e = self.store.job_enqueue(job, self.at(at)).await.unwrap();
        assert!(!e.duplicate);
        e.id
    }

    pub async fn claim(&self, queue: &str, owner: &str, n: u32, at: i64) -> Vec<ClaimedJob> {
        self.store
            .job_claim(ClaimParams {
                queue: queue.into(),
                owner: NodeId::new(owner).unwrap(),
                limit: n,
                lease: Duration::from_secs(30),
                now: self.at(at),
            })
            .await
            .unwrap()
    }

    pub async fn finalize(&self, f: Finalize, at: i64) -> Guarded<JobState> {
        let mut v = self
            .store
            .job_finalize_many(FinalizeParams {
                items: vec![f],
                now: self.at(at),
            })
            .await
            .unwrap();
        v.pop().unwrap().1
    }

    pub async fn renew(&self, id: JobId, token: &LeaseToken, at: i64) -> Guarded<Renewed> {
        let mut v = self
            .store
            .job_renew_leases(RenewParams {
                leases: vec![LeaseRef {
                    id,
                    token: token.clone(),
                }],
                lease: Duration::from_secs(30),
                now: self.at(at),
            })
            .await
            .unwrap();
        v.pop().unwrap().1
    }

    pub async fn reclaim(&self, at: i64) -> Vec<Reclaimed> {
        self.store
            .job_reclaim_expired(ReclaimParams {
                limit: 100,
                backoff: Arc::new(|attempt| Duration::from_secs(u64::from(attempt) * 10)),
                now: self.at(at),
            })
            .await
            .unwrap()
    }

    pub async fn get(&self, id: JobId) -> Job {
        self.store.job_get(id).await.unwrap().unwrap()
    }
}

fn err(code: &str, attempt: u32) -> JobFailure {
    JobFailure::new(code, format!("{code} on attempt {attempt}"), attempt)
}

// ---------------------------------------------------------------------------------------
// Cases. Each takes the backend and builds its own isolated database.
// ---------------------------------------------------------------------------------------

pub async fn enqueue_and_get_round_trip_every_field(b: Backend) {
    let t = Bundle::new(b).await;
    // Includes a float that a fast, inexact parser would read back one digit off.
    let payload = json!({"to": "ü@example.com", "n": [1, 2.5, null], "nested": {"a": true}, "f": 6.746821180143282e299});
    // With and without a unique key (the backends insert them differently).
    for key in [Some("welcome:42"), None] {
        let mut job = NewJob::new("send_email", payload.clone())
            .queue("mail")
            .priority(-3)
            .delay(Duration::from_secs(60))
            .max_attempts(7)
            .timeout(Duration::from_secs(90));
        if let Some(k) = key {
            job = job.unique_key(k);
        }
        let id = t.enqueue(job, 0).await;
        let j = t.get(id).await;
        assert_eq!(j.kind, "send_email");
        assert_eq!(j.queue, "mail");
        assert_eq!(j.priority, -3);
        assert_eq!(j.unique_key.as_deref(), key);
        assert_eq!(j.payload, payload);
        assert_eq!(j.state, JobState::Pending);
        assert_eq!((j.attempts, j.max_attempts), (0, 7));
        assert_eq!(j.timeout, Duration::from_secs(90));
        assert_eq!(j.run_at, t.at(60).unwrap());
        assert_eq!(j.created_at, t.at(0).unwrap());
        assert_eq!(j.version, 1);
        assert!(j.errors.is_empty() && j.last_error.is_none() && j.lease.is_none());
        assert!(t.store.job_get(JobId(id.0 + 1000)).await.unwrap().is_none());
        let at = t.t0 + chrono::Duration::seconds(7);
        let id = t.enqueue(NewJob::new("k", json!(null)).run_at(at), 0).await;
        assert_eq!(t.get(id).await.run_at, at);
    }
}

pub async fn enqueue_many_returns_ids_in_order_and_marks_duplicates(b: Backend) {
    let t = Bundle::new(b).await;
    let first = t
        .enqueue(NewJob::new("k", json!(0)).unique_key("existing"), 0)
        .await;
    let batch = vec![
        NewJob::new("k", json!(1)),
        NewJob::new("k", json!(2)).unique_key("a"),
        NewJob::new("k", json!(3)).unique_key("a"),
        NewJob::new("k", json!(4)).unique_key("existing"),
        NewJob::new("other", json!(5)).unique_key("a"),
        NewJob::new("k", json!(6)),
    ];
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(0)))
        .await
        .unwrap();
    assert_eq!(got.len(), 6);
    let dups: Vec<bool> = got.iter().map(|e| e.duplicate).collect();
    assert_eq!(dups, [false, false, true, true, false, false]);
    assert_eq!(got[2].id, got[1].id);
    assert_eq!(got[3].id, first);
    for (i, e) in got.iter().enumerate().filter(|(_, e)| !e.duplicate) {
        let j = t.get(e.id).await;
        assert_eq!(
            j.payload,
            json!([1, 2, 3, 4, 5, 6][i]),
            "job #{i} got the wrong id"
        );
    }
    let all = t.store.job_list(ListParams::default()).await.unwrap();
    assert_eq!(all.len(), 5, "one existing + four new rows");
}

/// Large batches (PostgreSQL copies those without unique keys): ids in input order, every
/// field as given, both clocks; a large batch with a key takes the conflict-aware path.
pub async fn large_batches_keep_order_and_every_field(b: Backend) {
    let t = Bundle::new(b).await;
    let n = 1500;
    let job = |i: usize| {
        let mut j = NewJob::new(
            if i % 3 == 0 { "a" } else { "b\\\"x é" },
            json!({"i": i, "s": "tab\t\\ \u{e9}"}),
        )
        .queue(if i % 2 == 0 { "default" } else { "q2" })
        .priority(i16::try_from(i % 5).unwrap() - 2)
        .max_attempts(u32::try_from(i % 9).unwrap() + 1)
        .timeout(Duration::from_millis(1000 + u64::try_from(i).unwrap()));
        match i % 4 {
            0 => {}
            1 => j = j.delay(Duration::from_secs(60)),
            2 => j = j.run_at(t.t0 - chrono::Duration::seconds(5)),
            _ => j = j.delay(Duration::ZERO),
        }
        j
    };
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many((0..n).map(job).collect()).at(t.at(0)))
        .await
        .unwrap();
    assert_eq!(got.len(), n);
    assert!(got.iter().all(|e| !e.duplicate));
    assert!(
        got.windows(2).all(|w| w[0].id < w[1].id),
        "ids increase in input order"
    );
    for (i, e) in got.iter().enumerate() {
        if i % 7 != 0 && i != n - 1 {
            continue;
        }
        let j = t.get(e.id).await;
        let want = job(i);
        assert_eq!(j.payload, want.payload, "job #{i}");
        assert_eq!(
            (j.kind.as_str(), j.queue.as_str()),
            (want.kind.as_str(), want.queue.as_str())
        );
        assert_eq!(
            (j.priority, j.max_attempts, j.timeout),
            (want.priority, want.max_attempts, want.timeout)
        );
        let run_at = match i % 4 {
            1 => t.at(60).unwrap(),
            2 => t.t0 - chrono::Duration::seconds(5),
            _ => t.t0,
        };
        assert_eq!(j.run_at, run_at, "job #{i}");
        assert_eq!((j.created_at, j.updated_at), (t.t0, t.t0));
        assert_eq!((j.state, j.attempts, j.version), (JobState::Pending, 0, 1));
        assert!(j.unique_key.is_none() && j.errors.is_empty() && j.lease.is_none());
    }
    // Claimable in (priority, run_at, id) order like any other job.
    let c = t.claim("default", "n", 1000, 0).await;
    let due = (0..n).filter(|i| i % 2 == 0 && i % 4 != 1).count();
    assert_eq!(
        c.len(),
        due,
        "every due job of the queue, none of the delayed"
    );
    let order: Vec<(i16, DateTime<Utc>, JobId)> = c
        .iter()
        .map(|c| (c.job.priority, c.job.run_at, c.job.id))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);

    // The database clock.
    let before = Utc::now() - chrono::Duration::seconds(5);
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(
            (0..n).map(|i| NewJob::new("c", json!(i))).collect(),
        ))
        .await
        .unwrap();
    let after = Utc::now() + chrono::Duration::seconds(5);
    let j = t.get(got[n - 1].id).await;
    assert!(
        j.created_at > before && j.created_at < after,
        "{}",
        j.created_at
    );
    assert_eq!(j.run_at, j.created_at);

    // Keys inside a large batch: a new key and a duplicate split it into runs; each job
    // still gets its own id, in input order, and the duplicate the existing one.
    let first = t
        .enqueue(NewJob::new("d", json!(0)).unique_key("k"), 0)
        .await;
    let batch: Vec<NewJob> = (1..=n)
        .map(|i| match i {
            700 => NewJob::new("d", json!(i)).unique_key("new"),
            701 => NewJob::new("d", json!(i)).unique_key("k"),
            _ => NewJob::new("d", json!(i)),
        })
        .collect();
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(1)))
        .await
        .unwrap();
    assert_eq!((got[700].id, got[700].duplicate), (first, true));
    assert_eq!(got.iter().filter(|e| e.duplicate).count(), 1);
    let fresh: Vec<JobId> = got.iter().filter(|e| !e.duplicate).map(|e| e.id).collect();
    assert!(fresh.windows(2).all(|w| w[0] < w[1]), "ids in input order");
    for i in [0, 697, 698, 699, 701, 702, n - 1] {
        assert_eq!(t.get(got[i].id).await.payload, json!(i + 1), "job #{i}");
    }
    let all = t.store.job_counts().await.unwrap();
    let total: u64 = all.iter().map(|c| c.count).sum();
    assert_eq!(total, u64::try_from(3 * n).unwrap());
}

/// A batch larger than a database packet (20 jobs of ~1 MB): written in several statements,
/// every payload intact, ids in input order.
pub async fn batches_of_large_payloads_are_split_and_kept(b: Backend) {
    let t = Bundle::new(b).await;
    let big = |i: usize| json!({"i": i, "blob": "x".repeat(1_000_000 - 64)});
    let jobs: Vec<NewJob> = (0..20).map(|i| NewJob::new("big", big(i))).collect();
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    assert_eq!(got.len(), 20);
    assert!(
        got.windows(2).all(|w| w[0].id < w[1].id),
        "ids in input order"
    );
    for (i, e) in got.iter().enumerate() {
        assert_eq!(t.get(e.id).await.payload, big(i), "job #{i}");
    }
}

/// PostgreSQL wakes listeners at commit for due jobs, whichever way they were inserted (one
/// row, a batch, a copied batch) and not for delayed ones; other backends have no listener.
pub async fn listeners_hear_due_inserts_of_every_kind(b: Backend) {
    let t = Bundle::new(b).await;
    let Some(mut l) = t.store.listen().await.unwrap() else {
        assert_ne!(b, Backend::Postgres, "PostgreSQL must offer a listener");
        return;
    };
    // The channel is database-wide: other tests' schemas notify it too. This case's queues
    // carry a prefix of its own, and the rest is ignored.
    let prefix = format!("q{}-", uuid::Uuid::new_v4().simple());
    let q = |name: &str| format!("{prefix}{name}");
    let next = async |l: &mut Listener| loop {
        let got = tokio::time::timeout(Duration::from_secs(10), l.next())
            .await
            .expect("a notification within 10 s")
            .expect("listener open")
            .unwrap();
        if let Some(name) = got.strip_prefix(&prefix) {
            return name.to_string();
        }
    };
    let later = || {
        NewJob::new("k", json!(0))
            .queue(q("later"))
            .delay(Duration::from_secs(3600))
    };
    let many = |name: &str, n: usize| {
        EnqueueParams::many(
            (0..n)
                .map(|i| NewJob::new("k", json!(i)).queue(q(name)))
                .collect(),
        )
    };
    t.store.job_enqueue(later(), None).await.unwrap();
    t.store.job_enqueue_many(many("one", 1)).await.unwrap();
    assert_eq!(next(&mut l).await, "one", "the delayed job woke nobody");
    t.store.job_enqueue_many(many("few", 3)).await.unwrap();
    assert_eq!(next(&mut l).await, "few");
    let mut copied = many("copied", 2000);
    copied.jobs.push(later());
    t.store.job_enqueue_many(copied).await.unwrap();
    assert_eq!(next(&mut l).await, "copied", "the delayed job woke nobody");
    t.store.job_enqueue_many(many("last", 1)).await.unwrap();
    assert_eq!(next(&mut l).await, "last", "one notification per due queue");
}

pub async fn duplicate_unique_key_returns_the_existing_id(b: Backend) {
    let t = Bundle::new(b).await;
    let a = t
        .store
        .job_enqueue(NewJob::new("k", json!(1)).unique_key("u"), t.at(0))
        .await
        .unwrap();
    let b2 = t
        .store
        .job_enqueue(NewJob::new("k", json!(2)).unique_key("u"), t.at(1))
        .await
        .unwrap();
    assert!(!a.duplicate && b2.duplicate);
    assert_eq!(a.id, b2.id);
    assert_eq!(
        t.get(a.id).await.payload,
        json!(1),
        "the duplicate changed nothing"
    );
    let other_kind = t
        .store
        .job_enqueue(NewJob::new("k2", json!(3)).unique_key("u"), t.at(1))
        .await
        .unwrap();
    assert!(!other_kind.duplicate, "keys are unique per kind");
}

pub async fn concurrent_enqueues_of_one_unique_key_create_one_row(b: Backend) {
    let t = Bundle::new(b).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = t.store.clone();
        let now = t.at(0);
        tasks.push(tokio::spawn(async move {
            store
                .job_enqueue(NewJob::new("k", json!(i)).unique_key("same"), now)
                .await
                .unwrap()
        }));
    }
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for task in tasks {
        let e = task.await.unwrap();
        ids.insert(e.id);
        fresh += usize::from(!e.duplicate);
    }
    assert_eq!(ids.len(), 1, "all 16 got the same id");
    assert_eq!(fresh, 1, "exactly one was not a duplicate");
    assert_eq!(
        t.store.job_list(ListParams::default()).await.unwrap().len(),
        1
    );
}

pub async fn claim_orders_by_priority_then_run_at_then_id(b: Backend) {
    let t = Bundle::new(b).await;
    let low = t
        .enqueue(NewJob::new("k", json!("low")).priority(20), 0)
        .await;
    let late = t
        .enqueue(NewJob::new("k", json!("late")).run_at(t.at(5).unwrap()), 0)
        .await;
    let early_b = t
        .enqueue(NewJob::new("k", json!("b")).run_at(t.at(1).unwrap()), 0)
        .await;
    let early_a = t
        .enqueue(NewJob::new("k", json!("a")).run_at(t.at(1).unwrap()), 0)
        .await;
    let urgent = t
        .enqueue(
            NewJob::new("k", json!("urgent"))
                .priority(1)
                .run_at(t.at(9).unwrap()),
            0,
        )
        .await;
    let other_queue = t
        .enqueue(NewJob::new("k", json!("q2")).queue("other").priority(0), 0)
        .await;
    let got: Vec<JobId> = t
        .claim("default", "n1", 3, 10)
        .await
        .iter()
        .map(|c| c.job.id)
        .collect();
    assert_eq!(got, vec![urgent, early_b, early_a]);
    let rest: Vec<JobId> = t
        .claim("default", "n1", 10, 10)
        .await
        .iter()
        .map(|c| c.job.id)
        .collect();
    assert_eq!(rest, vec![late, low]);
    assert!(!rest.contains(&other_queue));
}

pub async fn no_claim_before_run_at(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({})).delay(Duration::from_secs(60)),
            0,
        )
        .await;
    assert!(t.claim("default", "n1", 10, 59).await.is_empty());
    let got = t.claim("default", "n1", 10, 60).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.id, id);
}

pub async fn claim_sets_lease_attempts_and_version(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(
            NewJob::new("k", json!({})).timeout(Duration::from_secs(5)),
            0,
        )
        .await;
    let c = t.claim("default", "node-a", 1, 2).await.pop().unwrap();
    let j = &c.job;
    assert_eq!(j.id, id);
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.attempts, 1);
    assert_eq!(j.version, 2);
    let lease = j.lease.as_ref().unwrap();
    assert_eq!(lease.owner.as_str(), "node-a");
    assert_eq!(lease.expires_at, t.at(32).unwrap());
    assert_eq!(j.first_started_at, t.at(2));
    assert_eq!(
        j.timeout_at,
        t.at(37),
        "claim + lease + timeout: the sweeper's backstop"
    );
    assert!(
        t.claim("default", "node-b", 1, 3).await.is_empty(),
        "a running job is not claimable"
    );
}

pub async fn concurrent_claimers_never_claim_a_job_twice(b: Backend) {
    let t = Bundle::new(b).await;
    let jobs: Vec<NewJob> = (0..1000).map(|i| NewJob::new("k", json!(i))).collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = t.store.clone();
        let now = t.at(1);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store
                    .job_claim(ClaimParams {
                        queue: "default".into(),
                        owner: NodeId::new(format!("claimer-{n}")).unwrap(),
                        limit: 7,
                        lease: Duration::from_secs(30),
                        now,
                    })
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|c| c.job.id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let unique: HashSet<JobId> = all.iter().copied().collect();
    assert_eq!(all.len(), 1000, "every job claimed");
    assert_eq!(unique.len(), 1000, "no job claimed twice");
    let counts = t.store.job_counts().await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (counts[0].state, counts[0].count),
        (JobState::Running, 1000)
    );
}

pub async fn renew_extends_leases_and_reports_lost_ones(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..3 {
        t.enqueue(NewJob::new("k", json!(i)), 0).await;
    }
    let claimed = t.claim("default", "n1", 3, 1).await;
    let mut leases: Vec<LeaseRef> = claimed
        .iter()
        .map(|c| LeaseRef {
            id: c.job.id,
            token: c.token.clone(),
        })
        .collect();
    leases.push(LeaseRef {
        id: claimed[0].job.id,
        token: LeaseToken::generate(),
    });
    leases.push(LeaseRef {
        id: JobId(999_999),
        token: LeaseToken::generate(),
    });
    let out = t
        .store
        .job_renew_leases(RenewParams {
            leases,
            lease: Duration::from_secs(30),
            now: t.at(20),
        })
        .await
        .unwrap();
    assert_eq!(out.len(), 5);
    for (_, g) in &out[..3] {
        match g {
            Guarded::Applied(r) => {
                assert_eq!(r.expires_at, t.at(50).unwrap());
                assert!(!r.cancel_requested);
            }
            other => panic!("expected applied, got {other:?}"),
        }
    }
    assert_eq!(out[3].1, Guarded::LeaseLost, "a wrong token renews nothing");
    assert_eq!(
        out[4].1,
        Guarded::LeaseLost,
        "an unknown job renews nothing"
    );
    let j = t.get(claimed[0].job.id).await;
    assert_eq!(j.lease.unwrap().expires_at, t.at(50).unwrap());
}

pub async fn zombie_renew_and_finalize_are_rejected_after_reclaim_and_reclaim_by_another(
    b: Backend,
) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    let zombie = t.claim("default", "zombie", 1, 0).await.pop().unwrap();
    // The zombie pauses; its lease (30 s) expires and the sweeper reclaims the job.
    let r = t.reclaim(31).await;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].id, r[0].reason, r[0].new_state),
        (id, ReclaimReason::LeaseExpired, JobState::Retrying)
    );
    // Another node claims it after the backoff (10 s for attempt 1).
    let fresh = t.claim("default", "alive", 1, 41).await.pop().unwrap();
    assert_eq!(fresh.job.attempts, 2);
    // The zombie wakes up: its renew and its finalize change nothing.
    assert_eq!(t.renew(id, &zombie.token, 42).await, Guarded::LeaseLost);
    let z = t
        .finalize(
            Finalize::succeeded(id, zombie.token.clone(), json!("zombie")),
            42,
        )
        .await;
    assert_eq!(z, Guarded::LeaseLost);
    let zd = t
        .finalize(Finalize::dead(id, zombie.token.clone(), err("boom", 1)), 42)
        .await;
    assert_eq!(zd, Guarded::LeaseLost);
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.lease.as_ref().unwrap().owner.as_str(), "alive");
    // The current holder's result stands.
    let ok = t
        .finalize(
            Finalize::succeeded(id, fresh.token.clone(), json!("alive")),
            43,
        )
        .await;
    assert_eq!(ok, Guarded::Applied(JobState::Succeeded));
    assert_eq!(
        t.finalize(Finalize::succeeded(id, zombie.token, json!("late")), 44)
            .await,
        Guarded::LeaseLost
    );
    let j = t.get(id).await;
    assert_eq!(j.result, Some(json!("alive")));
    assert_eq!(j.errors.len(), 1, "only the reclaim's lease_expired error");
    assert_eq!(j.errors[0].code, "lease_expired");
}

pub async fn finalize_succeeded_clears_last_error_and_keeps_attempts(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    let c1 = t.claim("default", "n", 1, 0).await.pop().unwrap();
    let r = t
        .finalize(
            Finalize::retry(id, c1.token, err("flaky", 1), Duration::from_secs(5)),
            1,
        )
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Retrying));
    let j = t.get(id).await;
    assert_eq!(j.run_at, t.at(6).unwrap());
    assert_eq!(j.last_error.as_ref().unwrap().code, "flaky");
    assert!(j.lease.is_none());
    let c2 = t.claim("default", "n", 1, 6).await.pop().unwrap();
    let v_before = c2.job.version;
    let r = t
        .finalize(Finalize::succeeded(id, c2.token, json!({"sent": true})), 7)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Succeeded));
    let j = t.get(id).await;
    assert_eq!(j.result, Some(json!({"sent": true})));
    assert!(j.last_error.is_none(), "success clears last_error");
    assert_eq!(j.errors.len(), 1, "history stays");
    assert_eq!(j.attempts, 2, "attempts kept");
    assert_eq!(j.version, v_before + 1);
    assert_eq!(j.finished_at, t.at(7));
    assert!(j.lease.is_none() && j.timeout_at.is_none());
}

pub async fn attempts_exhausted_become_dead_with_every_error_kept(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(3), 0)
        .await;
    // Attempt 1 fails by handler error, attempt 2 by lease expiry, attempt 3 by error again.
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    t.finalize(
        Finalize::retry(id, c.token, err("e1", 1), Duration::ZERO),
        1,
    )
    .await;
    t.claim("default", "n", 1, 1).await.pop().unwrap();
    let r = t.reclaim(40).await;
    assert_eq!(r[0].new_state, JobState::Retrying);
    let c = t.claim("default", "n", 1, 70).await.pop().unwrap();
    assert_eq!(c.job.attempts, 3);
    let r = t
        .finalize(
            Finalize::retry(id, c.token, err("e3", 3), Duration::ZERO),
            71,
        )
        .await;
    assert_eq!(
        r,
        Guarded::Applied(JobState::Dead),
        "no retry after max_attempts"
    );
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Dead);
    let codes: Vec<&str> = j.errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["e1", "lease_expired", "e3"]);
    let attempts: Vec<u32> = j.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(j.last_error.unwrap().code, "e3");
    assert!(t.claim("default", "n", 1, 10_000).await.is_empty());

    // The sweeper enforces max_attempts too: a lost last attempt is dead.
    let id2 = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    t.claim("default", "n", 1, 0).await.pop().unwrap();
    let r = t.reclaim(31).await;
    assert_eq!((r[0].id, r[0].new_state), (id2, JobState::Dead));
    let j2 = t.get(id2).await;
    assert_eq!(j2.state, JobState::Dead);
    assert_eq!(j2.finished_at, t.at(31));
}

pub async fn reclaim_moves_over_time_jobs_and_leaves_live_ones(b: Backend) {
    let t = Bundle::new(b).await;
    let slow = t
        .enqueue(
            NewJob::new("k", json!(1)).timeout(Duration::from_secs(10)),
            0,
        )
        .await;
    let healthy = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let claimed = t.claim("default", "n", 2, 0).await;
    assert_eq!(claimed.len(), 2);
    for at in [9, 35] {
        for c in &claimed {
            assert!(t.renew(c.job.id, &c.token, at).await.is_applied());
        }
    }
    assert!(t.reclaim(40).await.is_empty(), "nothing is over time yet");
    let r = t.reclaim(41).await;
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].id, r[0].reason), (slow, ReclaimReason::Timeout));
    assert_eq!(t.get(healthy).await.state, JobState::Running);
    let j = t.get(slow).await;
    assert_eq!(j.state, JobState::Retrying);
    assert_eq!(j.last_error.unwrap().code, "timeout");
    assert_eq!(
        j.run_at,
        t.at(51).unwrap(),
        "reclaimed at 41, backoff 10 s from the sweeper's policy"
    );
}

pub async fn requeue_does_not_use_an_attempt(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    let r = t
        .finalize(Finalize::requeue(id, c.token, Duration::from_secs(30)), 1)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Pending));
    let j = t.get(id).await;
    assert_eq!((j.state, j.attempts), (JobState::Pending, 0));
    assert!(t.claim("default", "n", 1, 30).await.is_empty());
    let c = t.claim("default", "n", 1, 31).await.pop().unwrap();
    assert_eq!(c.job.attempts, 1);
}

pub async fn cancel_pending_running_and_finished_jobs(b: Backend) {
    let t = Bundle::new(b).await;
    let pending = t
        .enqueue(
            NewJob::new("k", json!(1)).delay(Duration::from_secs(100)),
            0,
        )
        .await;
    let running = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let c = t.claim("default", "n", 1, 1).await.pop().unwrap();
    assert_eq!(c.job.id, running);

    let out = t
        .store
        .job_cancel(CancelParams {
            id: pending,
            now: t.at(2),
        })
        .await
        .unwrap();
    let CancelOutcome::Cancelled(j) = out else {
        panic!("{out:?}")
    };
    assert_eq!((j.state, j.finished_at), (JobState::Cancelled, t.at(2)));

    let out = t
        .store
        .job_cancel(CancelParams {
            id: running,
            now: t.at(3),
        })
        .await
        .unwrap();
    let CancelOutcome::Requested(j) = out else {
        panic!("{out:?}")
    };
    assert_eq!(j.cancel_requested_at, t.at(3));
    let Guarded::Applied(r) = t.renew(running, &c.token, 4).await else {
        panic!()
    };
    assert!(
        r.cancel_requested,
        "the holder learns of the cancel at renewal"
    );
    let f = t
        .finalize(
            Finalize::cancelled(
                running,
                c.token,
                JobFailure::new("cancelled", "cancel requested", 1),
            ),
            5,
        )
        .await;
    assert_eq!(f, Guarded::Applied(JobState::Cancelled));

    let out = t
        .store
        .job_cancel(CancelParams {
            id: pending,
            now: t.at(6),
        })
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::AlreadyFinished(_)));
    let e = t
        .store
        .job_cancel(CancelParams {
            id: JobId(987_654),
            now: t.at(6),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

pub async fn manual_retry_of_a_dead_job_is_version_guarded(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t
        .enqueue(NewJob::new("k", json!({})).max_attempts(1), 0)
        .await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    t.finalize(Finalize::dead(id, c.token, err("fatal", 1)), 1)
        .await;
    let dead = t.get(id).await;

    let e = t
        .store
        .job_retry(RetryParams {
            id: JobId(424_242),
            expected_version: None,
            now: t.at(2),
        })
        .await;
    assert!(matches!(e, Err(Error::NotFound { .. })));
    let stale = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: Some(dead.version - 1),
            now: t.at(2),
        })
        .await
        .unwrap();
    assert_eq!(stale, Guarded::Stale);
    let Guarded::Applied(j) = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: Some(dead.version),
            now: t.at(2),
        })
        .await
        .unwrap()
    else {
        panic!("retry not applied")
    };
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.max_attempts, 2, "one more attempt allowed");
    assert_eq!(j.errors.len(), 1, "history kept");
    let e = t
        .store
        .job_retry(RetryParams {
            id,
            expected_version: None,
            now: t.at(3),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidTransition {
                from: JobState::Pending,
                ..
            }
        ),
        "{e}"
    );
    let c = t.claim("default", "n", 1, 3).await.pop().unwrap();
    assert_eq!(c.job.attempts, 2);
}

pub async fn archive_moves_terminal_jobs_atomically_and_prune_deletes_them(b: Backend) {
    let t = Bundle::new(b).await;
    let done = t
        .enqueue(NewJob::new("k", json!("done")).unique_key("u1"), 0)
        .await;
    let live = t.enqueue(NewJob::new("k", json!("live")), 0).await;
    let c = t.claim("default", "n", 1, 0).await.pop().unwrap();
    assert_eq!(c.job.id, done);
    t.finalize(Finalize::succeeded(done, c.token, json!(1)), 10)
        .await;
    let archive = |now: i64, older: u64| ArchiveParams {
        older_than: Duration::from_secs(older),
        limit: 100,
        now: t.at(now),
    };
    assert_eq!(
        t.store.job_archive(archive(100, 3600)).await.unwrap(),
        0,
        "too recent"
    );
    assert_eq!(t.store.job_archive(archive(3611, 3600)).await.unwrap(), 1);
    let j = t.get(done).await;
    assert_eq!(j.archived_at, t.at(3611));
    assert_eq!(j.result, Some(json!(1)));
    assert_eq!(j.state, JobState::Succeeded);
    assert!(t
        .store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .iter()
        .all(|j| j.id != done));
    let arch = t
        .store
        .job_list(ListParams {
            archived: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        arch.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![done],
        "in exactly one table"
    );
    assert_eq!(t.get(live).await.state, JobState::Pending, "live jobs stay");
    // Vacuuming the live table (the archiver's, after many moves) keeps every row.
    t.store.job_vacuum_live().await.unwrap();
    assert_eq!(
        t.get(live).await.state,
        JobState::Pending,
        "vacuum keeps live jobs"
    );
    assert_eq!(
        t.get(done).await.state,
        JobState::Succeeded,
        "and archived ones"
    );
    // Once archived its unique key is free again.
    let again = t
        .store
        .job_enqueue(NewJob::new("k", json!(2)).unique_key("u1"), t.at(3612))
        .await
        .unwrap();
    assert!(!again.duplicate);

    let prune = |now: i64| PruneParams {
        older_than: Duration::from_secs(86_400),
        limit: 100,
        now: t.at(now),
    };
    assert_eq!(t.store.job_prune_archive(prune(3612)).await.unwrap(), 0);
    assert_eq!(
        t.store
            .job_prune_archive(prune(3611 + 86_401))
            .await
            .unwrap(),
        1
    );
    assert!(t.store.job_get(done).await.unwrap().is_none());
}

pub async fn archive_is_bounded_by_its_limit(b: Backend) {
    let t = Bundle::new(b).await;
    let jobs: Vec<NewJob> = (0..25).map(|i| NewJob::new("k", json!(i))).collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs).at(t.at(0)))
        .await
        .unwrap();
    let claimed = t.claim("default", "n", 25, 0).await;
    let items = claimed
        .into_iter()
        .map(|c| Finalize::succeeded(c.job.id, c.token, json!(null)))
        .collect();
    let out = t
        .store
        .job_finalize_many(FinalizeParams {
            items,
            now: t.at(1),
        })
        .await
        .unwrap();
    assert!(out
        .iter()
        .all(|(_, g)| *g == Guarded::Applied(JobState::Succeeded)));
    let p = |now| ArchiveParams {
        older_than: Duration::ZERO,
        limit: 10,
        now: t.at(now),
    };
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 10);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 10);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 5);
    assert_eq!(t.store.job_archive(p(2)).await.unwrap(), 0);
}

pub async fn finalize_many_mixes_outcomes_and_guards_each_row(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..5 {
        t.enqueue(NewJob::new("k", json!(i)), 0).await;
    }
    let c = t.claim("default", "n", 5, 0).await;
    let items = vec![
        Finalize::succeeded(c[0].job.id, c[0].token.clone(), json!("ok")),
        Finalize::retry(
            c[1].job.id,
            c[1].token.clone(),
            err("again", 1),
            Duration::from_secs(9),
        ),
        Finalize::dead(c[2].job.id, c[2].token.clone(), err("fatal", 1)),
        Finalize::cancelled(c[3].job.id, c[3].token.clone(), err("cancelled", 1)),
        Finalize::succeeded(c[4].job.id, LeaseToken::generate(), json!("forged")),
    ];
    let out = t
        .store
        .job_finalize_many(FinalizeParams {
            items,
            now: t.at(1),
        })
        .await
        .unwrap();
    let states: Vec<Guarded<JobState>> = out.into_iter().map(|(_, g)| g).collect();
    assert_eq!(
        states,
        vec![
            Guarded::Applied(JobState::Succeeded),
            Guarded::Applied(JobState::Retrying),
            Guarded::Applied(JobState::Dead),
            Guarded::Applied(JobState::Cancelled),
            Guarded::LeaseLost,
        ]
    );
    assert_eq!(
        t.get(c[4].job.id).await.state,
        JobState::Running,
        "forged token changed nothing"
    );
    assert_eq!(t.get(c[1].job.id).await.run_at, t.at(10).unwrap());
    let twice = vec![
        Finalize::succeeded(c[4].job.id, c[4].token.clone(), json!(1)),
        Finalize::succeeded(c[4].job.id, c[4].token.clone(), json!(2)),
    ];
    let e = t
        .store
        .job_finalize_many(FinalizeParams {
            items: twice,
            now: t.at(2),
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
}

pub async fn outbox_enqueue_follows_the_callers_transaction(b: Backend) {
    let t = Bundle::new(b).await;
    let job = |tag: &str| EnqueueParams::one(NewJob::new("outbox", json!(tag))).at(t.at(0));
    macro_rules! both {
        ($conn:expr) => {{
            let conn = $conn;
            let store = t.store.clone();
            let rolled: Result<(), Error> = conn
                .transaction(async |c| {
                    store.job_enqueue_in(c, job("rolled back")).await?;
                    Err(Error::invalid("test", "roll back"))
                })
                .await;
            assert!(rolled.is_err());
            let committed: Vec<Enqueued> = conn
                .transaction(async |c| store.job_enqueue_in(c, job("committed")).await)
                .await
                .unwrap();
            committed[0].id
        }};
    }
    let id = match b {
        Backend::Postgres => both!(&mut AsyncPgConnection::establish(&t.db.url).await.unwrap()),
        Backend::Mysql => both!(&mut AsyncMysqlConnection::establish(&t.db.url).await.unwrap()),
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            both!(&mut SqliteConn::establish(&path).await.unwrap())
        }
    };
    let all = t.store.job_list(ListParams::default()).await.unwrap();
    assert_eq!(all.len(), 1, "the rolled-back job left no row");
    assert_eq!(
        (all[0].id, all[0].payload.clone()),
        (id, json!("committed"))
    );
}

pub async fn bad_inputs_get_clear_errors_and_change_nothing(b: Backend) {
    let t = Bundle::new(b).await;
    let keep = t.enqueue(NewJob::new("k", json!({"keep": true})), 0).await;
    let small =
        t.db.store_with(StoreOptions::default().max_payload_bytes(64))
            .await;
    let cases: Vec<(NewJob, &str)> = vec![
        (NewJob::new("", json!({})), "kind"),
        (NewJob::new("k", json!({})).queue(""), "queue"),
        (NewJob::new("k", json!({"big": "x".repeat(100)})), "payload"),
        (NewJob::new("k", json!({})).max_attempts(0), "max_attempts"),
        (NewJob::new("k\u{0}", json!({})), "kind"),
    ];
    for (job, field) in cases {
        let e = small.job_enqueue(job, t.at(1)).await.unwrap_err();
        match &e {
            Error::InvalidInput { field: f, .. } => assert_eq!(*f, field, "{e}"),
            other => panic!("expected InvalidInput({field}), got {other}"),
        }
    }
    // A bad job in a batch rejects the whole batch before anything is written.
    let batch = vec![NewJob::new("ok", json!(1)), NewJob::new("", json!(2))];
    let e = small
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(1)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("job #1"), "{e}");
    let e = NewJob::from_json_text("k", "{not json").unwrap_err();
    assert!(e.to_string().contains("payload"), "{e}");
    // SQL metacharacters are data, not SQL.
    let weird = "'; DROP TABLE jobvisor_jobs; --";
    let id = t
        .enqueue(
            NewJob::new(weird, json!(weird))
                .queue(weird)
                .unique_key(weird),
            2,
        )
        .await;
    let j = t.get(id).await;
    assert_eq!((j.kind.as_str(), j.queue.as_str()), (weird, weird));
    let all = t.store.job_list(ListParams::default()).await.unwrap();
    assert_eq!(all.len(), 2, "nothing else written, nothing lost");
    assert_eq!(t.get(keep).await.payload, json!({"keep": true}));
    let e = t
        .store
        .job_list(ListParams {
            limit: 5000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { field: "limit", .. }),
        "{e}"
    );
}

pub async fn bad_urls_and_missing_schema_are_clear_errors(b: Backend) {
    let e = Store::connect("redis://user:s3cret@127.0.0.1/0")
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("redis") && msg.contains("expected") && !msg.contains("s3cret"),
        "{msg}"
    );
    let db = TestDb::create(b).await;
    let e = Store::connect(&db.url).await.unwrap_err();
    assert!(matches!(e, Error::SchemaOutOfDate { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("missing") && msg.contains("jobvisor migrate"),
        "{msg}"
    );
    match b {
        Backend::Postgres => {
            let e = Store::connect_with(
                "postgres://postgres:hunter2@127.0.0.1:1/test",
                StoreOptions::default().connect_timeout(Duration::from_secs(3)),
            )
            .await
            .unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::Connect { .. }), "{msg}");
            assert!(
                msg.contains("127.0.0.1:1") && !msg.contains("hunter2"),
                "{msg}"
            );
        }
        Backend::Mysql => {
            let e = Store::connect_with(
                "mysql://root:hunter2@127.0.0.1:1/test",
                StoreOptions::default().connect_timeout(Duration::from_secs(3)),
            )
            .await
            .unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, Error::Connect { .. }) && !msg.contains("hunter2"),
                "{msg}"
            );
        }
        Backend::Sqlite => {
            let e = Store::connect("sqlite:///no/such/dir/jobs.db")
                .await
                .unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("/no/such/dir") && msg.contains("does not exist"),
                "{msg}"
            );
        }
    }
}

pub async fn concurrent_migrations_are_safe(b: Backend) {
    let db = TestDb::create(b).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            Store::connect_with(&url, StoreOptions::default().migrate(true))
                .await
                .map(|_| ())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let store = Store::connect(&db.url).await.unwrap();
    assert!(store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .is_empty());
}

pub async fn list_pages_and_filters_and_counts(b: Backend) {
    let t = Bundle::new(b).await;
    for i in 0..5 {
        t.enqueue(NewJob::new("a", json!(i)), 0).await;
    }
    for i in 0..3 {
        t.enqueue(NewJob::new("b", json!(i)).queue("q2"), 0).await;
    }
    let page1 = t
        .store
        .job_list(ListParams {
            limit: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let page2 = t
        .store
        .job_list(ListParams {
            limit: 3,
            after: Some(page1[2].id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page1.len(), 3);
    assert_eq!(page2.len(), 3);
    assert!(page1[2].id < page2[0].id);
    let bs = t
        .store
        .job_list(ListParams {
            kind: Some("b".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(bs.len(), 3);
    let q2 = t
        .store
        .job_list(ListParams {
            queue: Some("q2".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(q2.len(), 3);
    t.claim("q2", "n", 1, 1).await;
    let running = t
        .store
        .job_list(ListParams {
            state: Some(JobState::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    let counts = t.store.job_counts().await.unwrap();
    let find = |q: &str, s| {
        counts
            .iter()
            .find(|c| c.queue == q && c.state == s)
            .map(|c| c.count)
    };
    assert_eq!(find("default", JobState::Pending), Some(5));
    assert_eq!(find("q2", JobState::Pending), Some(2));
    assert_eq!(find("q2", JobState::Running), Some(1));
}

pub async fn database_clock_is_used_when_no_time_is_bound(b: Backend) {
    let t = Bundle::new(b).await;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let e = t
        .store
        .job_enqueue(NewJob::new("k", json!({})), None)
        .await
        .unwrap();
    let after = Utc::now() + chrono::Duration::seconds(5);
    let j = t.get(e.id).await;
    assert!(
        j.created_at > before && j.created_at < after,
        "created_at {} from the database clock",
        j.created_at
    );
    let c = t
        .store
        .job_claim(ClaimParams {
            queue: "default".into(),
            owner: NodeId::new("n").unwrap(),
            limit: 1,
            lease: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(c.len(), 1, "due by the database clock");
    let exp = c[0].job.lease.as_ref().unwrap().expires_at;
    assert!(
        exp > before + chrono::Duration::seconds(30) && exp < after + chrono::Duration::seconds(30)
    );
}

/// Runs raw SQL on the store's database (to corrupt rows as something other than jobvisor
/// might).
pub async fn exec_sql(store: &Store, sql: &str) -> Result<(), Error> {
    super::connect::with_conn!(store, |conn| {
        conn.batch_execute(sql).await?;
    });
    Ok(())
}

pub async fn corrupt_rows_go_dead_and_the_batch_goes_on(b: Backend) {
    let t = Bundle::new(b).await;
    let bad = t.enqueue(NewJob::new("k", json!(1)), 0).await;
    let good = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    // Valid JSON, but not an error record: jobvisor cannot read this row.
    exec_sql(
        &t.store,
        &format!(
            "UPDATE jobvisor_jobs SET last_error = '{{\"nope\": true}}' WHERE id = {}",
            bad.0
        ),
    )
    .await
    .unwrap();
    assert!(matches!(
        t.store.job_get(bad).await,
        Err(Error::Corrupt { .. })
    ));
    let claimed: Vec<JobId> = t
        .claim("default", "n", 10, 1)
        .await
        .iter()
        .map(|c| c.job.id)
        .collect();
    assert_eq!(
        claimed,
        vec![good],
        "the readable job is claimed, the corrupt one is not"
    );
    let j = t.get(bad).await;
    assert_eq!(j.state, JobState::Dead);
    let e = j.last_error.unwrap();
    assert_eq!(e.code, "corrupt");
    assert!(e.message.contains("last_error"), "{}", e.message);
    // Every backend refuses a payload that is not JSON; nothing stored changes.
    let refused = exec_sql(
        &t.store,
        &format!(
            "UPDATE jobvisor_jobs SET payload = 'not json' WHERE id = {}",
            good.0
        ),
    )
    .await;
    assert!(refused.is_err(), "a non-JSON payload was stored");
    assert_eq!(t.get(good).await.payload, json!(2));
}

/// Expands to one `#[tokio::test]` per conformance case for `$backend`.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_tests!(@cases $backend;
            enqueue_and_get_round_trip_every_field,
            enqueue_many_returns_ids_in_order_and_marks_duplicates,
            large_batches_keep_order_and_every_field,
            listeners_hear_due_inserts_of_every_kind,
            batches_of_large_payloads_are_split_and_kept,
            duplicate_unique_key_returns_the_existing_id,
            concurrent_enqueues_of_one_unique_key_create_one_row,
            claim_orders_by_priority_then_run_at_then_id,
            no_claim_before_run_at,
            claim_sets_lease_attempts_and_version,
            concurrent_claimers_never_claim_a_job_twice,
            renew_extends_leases_and_reports_lost_ones,
            zombie_renew_and_finalize_are_rejected_after_reclaim_and_reclaim_by_another,
            finalize_succeeded_clears_last_error_and_keeps_attempts,
            attempts_exhausted_become_dead_with_every_error_kept,
            reclaim_moves_over_time_jobs_and_leaves_live_ones,
            requeue_does_not_use_an_attempt,
            cancel_pending_running_and_finished_jobs,
            manual_retry_of_a_dead_job_is_version_guarded,
            archive_moves_terminal_jobs_atomically_and_prune_deletes_them,
            archive_is_bounded_by_its_limit,
            finalize_many_mixes_outcomes_and_guards_each_row,
            outbox_enqueue_follows_the_callers_transaction,
            bad_inputs_get_clear_errors_and_change_nothing,
            bad_urls_and_missing_schema_are_clear_errors,
            concurrent_migrations_are_safe,
            list_pages_and_filters_and_counts,
            database_clock_is_used_when_no_time_is_bound,
            corrupt_rows_go_dead_and_the_batch_goes_on,
        );
    };
    (@cases $backend:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::store::conformance::$case($backend).await;
            }
        )+
    };
}
