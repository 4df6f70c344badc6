//! jobvisor on a private three-member MariaDB Galera cluster (`harness/galera.rs`), started
//! by the test itself: migrations raced through three members at once; a store whose URL
//! names a dead host and the three members carrying on while its member is cut off from the
//! others (non-primary) and while its member is SIGKILLed and restarted (rejoining by IST),
//! with the time back to work after each fault; then, given `JOBVISOR_CONFORMANCE_BIN` (the
//! `store_conformance` test binary, as `.ci/crash` passes it), the MariaDB conformance cases
//! with every store's connections spread over the three members (`members=spread`).
//!
//! `#[ignore]`d: it needs root and about 3–4 minutes (`.ci/crash` runs it as `galera`).
//! `JOBVISOR_GALERA_CASE` runs one conformance case many times instead ([`repeat_case`]).

#![allow(clippy::unwrap_used)]

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use jobvisor::{Client, NewJob, Store, StoreOptions};
use serde_json::json;

use harness::galera::GaleraCluster;

/// Where the cluster's directories go.
const BASE: &str = "/tmp/jobvisor-galera-tests";

/// Why a conformance case is left out on Galera.
const PROXY: &str = "it cuts one server's traffic through a proxy of one address; a host list \
                     has three (a member cut off is the failover test's instead)";
const CONTENDED: &str = "eight claimers of one controlled queue through three members: the queue \
                         row's lock is a replicated write now (no run has held more than the \
                         limit), but claims wait for one another across the cluster and some \
                         outlast the default 1.5 s statement bound; a claim that timed out after \
                         it committed holds its jobs until their leases end, which the case \
                         counts as lost";
const HOT_ROWS: &str = "eight writers of the same rows through three members at once (claimers of \
                        the same due jobs; gauge writers of one row; finalizers settling one \
                        callback's edges): each conflict is rolled back and tried again, but a \
                        writer can lose more than its 8 tries in a row (each failed once in 3 \
                        runs; a settle that fails leaves the release to the sweeper)";
const LOCAL_HOLDER: &str = "the case holds the queue row in a transaction of its own to show a \
                            claim waits for it; on Galera a lock is its member's own, and \
                            certification aborts one of the two at commit instead of making the \
                            other wait";
const APP_CONN: &str = "the case enqueues inside a transaction of its own on an application \
                        connection (one member); such a transaction can be rolled back at commit \
                        by a certification conflict (1213, seen here), and jobvisor cannot run \
                        again a transaction the application owns: on Galera the application \
                        retries it, as it does any of its writes";

/// The conformance cases left out on a host list, and why (measured: with these out, the
/// other MariaDB cases — hedged renewals, concurrent schedule firers and elections among
/// them — pass with connections spread over three members; the partition limits passed
/// 3 runs of 3 at rest and timed out in 2 of 4 runs under load).
const NOT_ON_GALERA: &[(&str, &str)] = &[
    ("concurrent_claimers_never_claim_a_job_twice", HOT_ROWS),
    (
        "gauges_are_computed_once_per_interval_and_match_the_table",
        HOT_ROWS,
    ),
    (
        "the_batch_callback_is_released_once_when_the_last_members_race",
        HOT_ROWS,
    ),
    (
        "a_concurrency_limit_is_never_exceeded_by_concurrent_claimers",
        CONTENDED,
    ),
    ("a_rate_limit_bounds_claims_in_every_window", CONTENDED),
    (
        "a_rate_limited_claim_records_when_it_took_the_queue_lock",
        LOCAL_HOLDER,
    ),
    ("partition_keys_round_trip_on_every_enqueue_path", APP_CONN),
    (
        "a_silent_cut_bounds_every_hot_path_operation_and_the_heal_restores_them",
        PROXY,
    ),
    (
        "a_renewal_never_waits_behind_a_hung_claim_or_finalization",
        PROXY,
    ),
    ("a_connection_that_timed_out_is_closed_not_reused", PROXY),
    ("a_repeat_within_a_batch_replaces_the_first", APP_CONN),
    (
        "partitions_at_their_limit_are_skipped_and_others_run",
        CONTENDED,
    ),
    ("a_global_and_a_partition_limit_hold_together", CONTENDED),
];

#[test]
#[ignore = "starts a private three-member Galera cluster (root, 3–4 minutes): .ci/crash"]
fn galera_cluster() {
    let started = Instant::now();
    let mut cluster = GaleraCluster::start("galera", Path::new(BASE));
    println!(
        "cluster of 3 synced in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    // One case again and again (below): the cluster is all it needs.
    if std::env::var("JOBVISOR_GALERA_CASE").is_err() {
        rt.block_on(migrations_race(&cluster));
        failover(&mut cluster, &rt);
    }
    conformance(&cluster);
    println!("galera: {:.1} s in all", started.elapsed().as_secs_f64());
}

/// Three processes' worth of stores migrate one fresh database through three members at
/// once, three times: each must succeed (with `GET_LOCK` alone, member-local, one of two
/// failed on "Table 'jobvisor_jobs' already exists" in 3 runs of 3).
async fn migrations_race(cluster: &GaleraCluster) {
    for round in 0..3 {
        let db = format!("race{round}");
        cluster.sql(0, &format!("CREATE DATABASE {db}"));
        let opens = (0..3).map(|i| {
            let url = cluster.member_url(i, &db);
            async move {
                Store::connect_with(&url, StoreOptions::default().migrate(true))
                    .await
                    .map_err(|e| format!("member {}: {e}", i + 1))
            }
        });
        for res in futures_util::future::join_all(opens).await {
            if let Err(e) = res {
                panic!("round {round}: migrating through three members at once: {e}");
            }
        }
    }
    println!("migrations raced through 3 members, 3 rounds: all succeeded");
}

/// One enqueue and one read through the store.
async fn work(client: &Client) -> jobvisor::Result<()> {
    client
        .enqueue(NewJob::new("k", json!({})).queue("q"))
        .await?;
    client.counts().await?;
    Ok(())
}

/// Repeats [`work`] until it succeeds; how long that took (at most 30 s).
async fn back_to_work(client: &Client) -> Duration {
    let start = Instant::now();
    loop {
        match work(client).await {
            Ok(()) => return start.elapsed(),
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "not back to work within 30 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A store on `dead-host,m1,m2,m3` (`members=first`: its connections go to member 1) is
/// cut off with member 1, then loses it to SIGKILL, and carries on through the others.
fn failover(cluster: &mut GaleraCluster, rt: &tokio::runtime::Runtime) {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = cluster
        .url("jobvisor", "first")
        .replacen("@", &format!("@127.0.0.1:{dead},"), 1);
    let opts = StoreOptions::default()
        .migrate(true)
        .connect_attempt_timeout(Duration::from_secs(2));
    let client = rt.block_on(async {
        let store = Store::connect_with(&url, opts).await.unwrap();
        let client = Client::new(store);
        for _ in 0..20 {
            work(&client).await.unwrap();
        }
        client
    });
    let on_first = |c: &GaleraCluster| {
        c.sql(
            0,
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'jv'",
        )
    };
    assert_ne!(
        on_first(cluster).trim(),
        "0",
        "members=first: connections on member 1"
    );

    cluster.isolate(0, true);
    let cut = rt.block_on(back_to_work(&client));
    rt.block_on(async {
        for _ in 0..20 {
            work(&client).await.unwrap();
        }
    });
    println!(
        "member 1 cut off (non-primary): back to work in {:.2} s",
        cut.as_secs_f64()
    );
    cluster.isolate(0, false);

    cluster.kill(0);
    let killed = rt.block_on(back_to_work(&client));
    println!(
        "member 1 SIGKILLed: back to work in {:.2} s",
        killed.as_secs_f64()
    );
    let t = Instant::now();
    cluster.restart(0);
    println!(
        "member 1 restarted and synced (IST) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let count = |i: usize| cluster.sql(i, "SELECT COUNT(*) FROM jobvisor.jobvisor_jobs");
    let (a, b) = (count(0), count(1));
    assert_eq!(
        a, b,
        "member 1 after its restart holds every job member 2 does"
    );
    rt.block_on(async {
        for _ in 0..20 {
            work(&client).await.unwrap();
        }
    });
    assert!(cut < Duration::from_secs(15) && killed < Duration::from_secs(15));
}

/// The MariaDB conformance cases with every store's connections spread over the three
/// members, when `JOBVISOR_CONFORMANCE_BIN` names the suite's test binary.
fn conformance(cluster: &GaleraCluster) {
    let Ok(bin) = std::env::var("JOBVISOR_CONFORMANCE_BIN") else {
        println!("JOBVISOR_CONFORMANCE_BIN not set: the conformance cases are not run here");
        return;
    };
    if let Ok(case) = std::env::var("JOBVISOR_GALERA_CASE") {
        repeat_case(cluster, &bin, &case);
        return;
    }
    let mut args = vec!["mysql::".to_string(), "--test-threads=3".to_string()];
    for (case, why) in NOT_ON_GALERA {
        println!("left out on Galera: {case}: {why}");
        args.push("--skip".into());
        args.push((*case).to_string());
    }
    let t = Instant::now();
    let out = std::process::Command::new(&bin)
        .args(&args)
        .env("JOBVISOR_MYSQL_URL", cluster.url("jobvisor", "spread"))
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text
        .lines()
        .filter(|l| l.starts_with("test result") || l.contains("FAILED") || l.contains("panicked"))
        .collect::<Vec<_>>()
        .join("\n");
    println!(
        "conformance on 3 members (spread) in {:.0} s:\n{summary}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "conformance cases failed on Galera:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `JOBVISOR_GALERA_CASE=<case>` (a MariaDB conformance case's name) runs that case alone,
/// spread over the three members, `JOBVISOR_GALERA_RUNS` times (default 20), and fails if any
/// run failed: how a rare interleaving is measured (the racing dependent enqueue lost 1 run in
/// 12 before the transaction guard).
fn repeat_case(cluster: &GaleraCluster, bin: &str, case: &str) {
    let runs: usize = std::env::var("JOBVISOR_GALERA_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut failed = Vec::new();
    for run in 0..runs {
        let out = std::process::Command::new(bin)
            .args([format!("mysql::{case}"), "--exact".into()])
            .env("JOBVISOR_MYSQL_URL", cluster.url("jobvisor", "spread"))
            .output()
            .unwrap_or_else(|e| panic!("running {bin}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("1 passed") || !out.status.success(),
            "no case {case:?} ran: {text}"
        );
        if !out.status.success() {
            println!(
                "run {run} failed:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            failed.push(run);
        }
    }
    println!("{case}: {} of {runs} runs failed {failed:?}", failed.len());
    assert!(
        failed.is_empty(),
        "{case}: runs {failed:?} of {runs} failed"
    );
}
