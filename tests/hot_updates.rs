//! PostgreSQL: a lease renewal, with or without the job's start and progress, is a heap-only
//! (HOT) update — it changes no indexed column, so it writes no index entry and its old
//! version is pruned from the page without a vacuum. Counted by the server
//! (`pg_stat_user_tables.n_tup_hot_upd`) on a fresh table whose one page has room, so a
//! renewal that is not HOT can only be one that changed an indexed column: an index keyed
//! (or filtered) by `lease_expires_at`, `heartbeat_at`, `started_at`, `first_started_at`,
//! `timeout_at` or `progress` fails this test.
//!
//! And the dead row versions a job's claim and end leave (neither can be HOT: each moves the
//! job between partial indexes) are vacuumed after a fixed count, not a share of a table that
//! grows with the retained jobs; and the running index keeps plain entries, not posting lists.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use jobvisor::testing::{ClaimParams, LeaseRef, RenewParams, StoreEngine as _, TestDb};
use jobvisor::{Backend, NewJob, NodeId};
use serde_json::json;

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct Updates {
    #[diesel(sql_type = BigInt)]
    upd: i64,
    #[diesel(sql_type = BigInt)]
    hot: i64,
}

/// The jobs table's updates and HOT updates as the server counts them, once at least
/// `want` updates are counted (backends report their counts about a second after they go
/// idle).
async fn updates(conn: &mut AsyncPgConnection, want: i64) -> Updates {
    let t0 = Instant::now();
    loop {
        diesel::sql_query("SELECT pg_stat_clear_snapshot()")
            .execute(conn)
            .await
            .unwrap();
        let u: Updates = diesel::sql_query(
            // The test's own table, by the search path: the shared database holds other
            // tests' schemas, each with a `jobvisor_jobs` of its own.
            "SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables
             WHERE relid = 'jobvisor_jobs'::regclass",
        )
        .get_result(conn)
        .await
        .unwrap();
        if u.upd >= want || t0.elapsed() > Duration::from_secs(30) {
            return u;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_starts_and_progress_are_heap_only_updates() {
    let db = TestDb::create(Backend::Postgres).await;
    let store = db.store().await;
    let mut stats = AsyncPgConnection::establish(&db.url).await.unwrap();
    store
        .job_enqueue_many(jobvisor::testing::EnqueueParams::many(vec![NewJob::new(
            "k",
            json!({}),
        )]))
        .await
        .unwrap();
    let claimed = store
        .job_claim(ClaimParams {
            queue: "default".into(),
            owner: NodeId::new("hot").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let job = &claimed[0];
    // The start recorded with the first renewal, progress with the others, then plain
    // renewals.
    const RENEWALS: i64 = 6;
    for i in 0..RENEWALS {
        let lease = LeaseRef {
            id: job.id,
            token: job.token.clone(),
            started_ago: (i == 0).then(|| Duration::from_millis(1)),
            progress: (1..4).contains(&i).then(|| format!("{{\"done\": {i}}}")),
        };
        let renewed = store
            .job_renew_leases(RenewParams {
                leases: vec![lease],
                lease: Duration::from_secs(30),
                timeout_grace: Duration::from_secs(35),
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(renewed.len(), 1, "renewal {i} kept the lease");
    }
    // The claim (into 'running', an indexed change) and the renewals.
    let u = updates(&mut stats, 1 + RENEWALS).await;
    assert_eq!(
        u.upd,
        1 + RENEWALS,
        "the claim and {RENEWALS} renewals counted"
    );
    assert_eq!(
        u.hot, RENEWALS,
        "every renewal is a HOT update (the claim is not): {u:?}"
    );
}

#[derive(diesel::QueryableByName, Debug)]
struct Options {
    #[diesel(sql_type = Nullable<Text>)]
    options: Option<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_table_is_vacuumed_after_a_fixed_count_of_dead_versions() {
    let db = TestDb::create(Backend::Postgres).await;
    let _store = db.store().await; // the schema
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let o: Options = diesel::sql_query(
        "SELECT array_to_string(reloptions, ',') AS options FROM pg_class
         WHERE oid = 'jobvisor_jobs'::regclass",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    let options = o.options.unwrap_or_default();
    let mut set: Vec<&str> = options.split(',').collect();
    set.sort_unstable();
    // 10,000 dead versions whatever the table holds: the server's default, 50 + 20 % of the
    // live rows, lets 14 million pile up under a day of jobs retained at 800 a second.
    assert_eq!(
        set,
        [
            "autovacuum_vacuum_scale_factor=0",
            "autovacuum_vacuum_threshold=10000"
        ],
        "the live table's storage options"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_index_keeps_plain_entries() {
    let db = TestDb::create(Backend::Postgres).await;
    let _store = db.store().await; // the schema
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let o: Options = diesel::sql_query(
        "SELECT array_to_string(reloptions, ',') AS options FROM pg_class
         WHERE oid = 'jobvisor_jobs_running_idx'::regclass",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    // Its key, (queue, partition_key), is one value for every running job of a queue: with
    // B-tree deduplication each claim's insert into a full page rewrote the page's posting
    // lists, and 20,000 no-op jobs drained about 12 % slower (migration 000035).
    assert_eq!(
        o.options.as_deref(),
        Some("deduplicate_items=off"),
        "the running index's storage options"
    );
}
