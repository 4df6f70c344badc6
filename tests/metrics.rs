//! Metrics against what really happened: a scheduler runs a scripted set of jobs — three
//! that succeed, one that fails once then succeeds, one that dies, one claimed by a node that
//! vanished (reclaimed, then run here) — and one job sits due for an hour in a queue no node
//! serves. Then `/metrics` is scraped over HTTP from the actix-web service and every metric is
//! checked against the script, on each backend. The three backends run in one process with
//! one recorder: each uses queue and kind names of its own.

#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;
use std::time::Duration;

use jobvisor::metrics::{self, PrometheusHandle};
use jobvisor::testing::{ClaimParams, StoreEngine, TestDb};
use jobvisor::{
    handler_fn, Backend, JobContext, JobError, JobOutcome, JobState, NewJob, NodeId, QueueConfig,
    Scheduler, SchedulerConfig,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| metrics::install_prometheus().unwrap())
        .clone()
}

/// `GET /metrics` over a plain HTTP/1.0 connection.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    body.to_string()
}

/// The value of the sample `name{labels}` whose labels include all of `want`.
fn value(page: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let (n, labels) = series.split_once('{').unwrap_or((series, ""));
        let all = want
            .iter()
            .all(|(k, val)| labels.contains(&format!("{k}=\"{val}\"")));
        (n == name && all).then(|| v.parse().unwrap())
    })
}

/// Every metric name jobvisor documents (`jobvisor::metrics`).
const DOCUMENTED: &[&str] = &[
    metrics::JOBS_CLAIMED,
    metrics::JOBS_FINISHED,
    metrics::LEASES_LOST,
    metrics::JOBS_FENCED,
    metrics::JOBS_TIMED_OUT,
    metrics::JOBS_RECLAIMED,
    metrics::PICKUP_LATENCY,
    metrics::HANDLER_DURATION,
    metrics::FINALIZE_LATENCY,
    metrics::END_TO_END,
    metrics::JOB_ATTEMPTS,
    metrics::CLAIM_STATEMENT,
    metrics::FINALIZE_STATEMENT,
    metrics::RENEW_STATEMENT,
    metrics::JOBS_IN_FLIGHT,
    metrics::POOL_CONNECTIONS,
    metrics::POOL_MAX_CONNECTIONS,
    metrics::POOL_WAITED,
    metrics::POOL_TIMED_OUT,
    metrics::JOBS,
    metrics::JOBS_DUE,
    metrics::QUEUE_LAG,
    metrics::NODE_HEARTBEAT_AGE,
    metrics::NODES_GONE,
    metrics::JOBS_ENDED,
    metrics::GAUGES_AGE,
    metrics::GAUGES_REFRESH,
];

/// A sample's metric name without a histogram's series suffix.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|b| DOCUMENTED.contains(b))
        .unwrap_or(name)
}

/// Every `jobvisor_…` name in `text`.
fn names_in(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("jobvisor_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_dashboard_and_alerts_use_only_documented_metrics() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/observability/");
    for file in ["grafana-dashboard.json", "alerts.yml"] {
        let text = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
        let names = names_in(&text);
        assert!(names.len() > 5, "{file}");
        for name in names {
            assert!(
                DOCUMENTED.contains(&base_name(name)),
                "{file} uses {name}, which jobvisor does not export"
            );
        }
    }
}

fn must(page: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    value(page, name, want).unwrap_or_else(|| panic!("no {name}{want:?} in:\n{page}"))
}

async fn scripted_run(backend: Backend) {
    let handle = recorder();
    let b = format!("{backend:?}").to_lowercase();
    let (queue, lag_queue) = (format!("m_{b}"), format!("lag_{b}"));
    let (ok, flaky, doomed, ghosted) = (
        format!("ok_{b}"),
        format!("flaky_{b}"),
        format!("doomed_{b}"),
        format!("ghosted_{b}"),
    );
    let db = TestDb::create(backend).await;
    let store = db.store().await;

    // A node that claimed a job and vanished without starting it.
    let ghost_job = store
        .job_enqueue(NewJob::new(ghosted.clone(), json!(0)).queue(&queue), None)
        .await
        .unwrap()
        .id;
    let claimed = store
        .job_claim(ClaimParams {
            queue: queue.clone(),
            owner: NodeId::new("ghost").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(1),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // An hour late, in a queue nobody serves: the lag.
    store
        .job_enqueue(
            NewJob::new("nobody", json!(0))
                .queue(&lag_queue)
                .run_at(chrono::Utc::now() - chrono::Duration::hours(1)),
            None,
        )
        .await
        .unwrap();

    let work = || {
        handler_fn(|_: Value, _ctx: JobContext| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            JobOutcome::success(json!("ok"))
        })
    };
    let scheduler = Scheduler::builder(store.clone())
        .config(
            SchedulerConfig::default()
                .lease(Duration::from_secs(3))
                .renew_every(Duration::from_secs(1))
                .sweep_every(Duration::from_millis(300))
                .gauges_every(Some(Duration::from_secs(1))),
        )
        .queue(
            queue.clone(),
            QueueConfig::default().poll_interval(Duration::from_millis(50)),
        )
        .handler(ok.clone(), work())
        .handler(ghosted.clone(), work())
        .handler(
            flaky.clone(),
            handler_fn(|_: Value, ctx: JobContext| async move {
                if ctx.attempt == 1 {
                    return Err(JobError::retry_after("first try fails", Duration::ZERO));
                }
                JobOutcome::success(json!("second"))
            }),
        )
        .handler(
            doomed.clone(),
            handler_fn(|_: Value, _ctx: JobContext| async move {
                Err::<JobOutcome, _>(JobError::fail("never works"))
            }),
        )
        .start()
        .unwrap();
    let server = {
        let h = handle.clone();
        actix_web::HttpServer::new(move || {
            actix_web::App::new().service(metrics::actix_web_service(h.clone()))
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap()
    };
    let addr = server.addrs()[0];
    let server = server.run();
    let server_handle = server.handle();
    actix::spawn(server);

    let client = scheduler.client();
    let mut ids = Vec::new();
    for (kind, n) in [(&ok, 3), (&flaky, 1), (&doomed, 1)] {
        for i in 0..n {
            let job = NewJob::new(kind.clone(), json!(i)).queue(&queue);
            ids.push(client.enqueue(job).await.unwrap().id);
        }
    }
    ids.push(ghost_job);
    for id in &ids {
        let j = client.wait(*id, WAIT).await.unwrap();
        assert!(
            matches!(j.state, JobState::Succeeded | JobState::Dead),
            "{j:?}"
        );
    }

    // The database gauges catch up within a few refreshes.
    let q = queue.as_str();
    let deadline = std::time::Instant::now() + WAIT;
    let page = loop {
        let page = scrape(addr).await;
        let settled = value(
            &page,
            "jobvisor_jobs",
            &[("queue", q), ("state", "succeeded")],
        ) == Some(5.0)
            && value(&page, "jobvisor_jobs_in_flight", &[("queue", q)]) == Some(0.0);
        if settled {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gauges never settled:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    for line in page.lines().filter(|l| l.starts_with("jobvisor_")) {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(
            DOCUMENTED.contains(&base_name(name)),
            "undocumented: {line}"
        );
    }

    let finished = |kind: &str, outcome: &str| {
        value(
            &page,
            "jobvisor_jobs_finished_total",
            &[("queue", q), ("kind", kind), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(finished(&ok, "succeeded"), 3.0);
    assert_eq!(finished(&flaky, "retried"), 1.0);
    assert_eq!(finished(&flaky, "succeeded"), 1.0);
    assert_eq!(finished(&doomed, "dead"), 1.0);
    assert_eq!(finished(&ghosted, "succeeded"), 1.0);
    assert_eq!(finished(&ok, "dead") + finished(&ok, "retried"), 0.0);
    // 3 + 2 attempts of flaky + 1 + the ghost's job once reclaimed (the ghost's own claim
    // was another node's).
    assert_eq!(
        must(&page, "jobvisor_jobs_claimed_total", &[("queue", q)]),
        7.0
    );
    assert_eq!(
        must(
            &page,
            "jobvisor_jobs_reclaimed_total",
            &[("kind", &ghosted), ("reason", "not_started")]
        ),
        1.0
    );
    assert_eq!(
        value(&page, "jobvisor_leases_lost_total", &[("kind", &ok)]),
        None
    );

    let count = |name: &str, labels: &[(&str, &str)]| must(&page, &format!("{name}_count"), labels);
    let sum = |name: &str, labels: &[(&str, &str)]| must(&page, &format!("{name}_sum"), labels);
    let ok_labels = [("queue", q), ("kind", ok.as_str())];
    assert_eq!(count("jobvisor_pickup_latency_seconds", &ok_labels), 3.0);
    assert_eq!(count("jobvisor_handler_duration_seconds", &ok_labels), 3.0);
    assert!(
        sum("jobvisor_handler_duration_seconds", &ok_labels) >= 0.06,
        "three handlers of 20 ms each"
    );
    assert_eq!(count("jobvisor_end_to_end_seconds", &ok_labels), 3.0);
    assert_eq!(
        count(
            "jobvisor_end_to_end_seconds",
            &[("queue", q), ("kind", doomed.as_str())]
        ),
        1.0,
        "a dead job has ended too"
    );
    // Every written outcome of this queue was acknowledged: 7 finalizations.
    assert_eq!(
        count("jobvisor_finalize_latency_seconds", &[("queue", q)]),
        7.0
    );
    let flaky_labels = [("queue", q), ("kind", flaky.as_str())];
    assert_eq!(count("jobvisor_job_attempts", &flaky_labels), 1.0);
    assert_eq!(
        sum("jobvisor_job_attempts", &flaky_labels),
        2.0,
        "it ended on attempt 2"
    );
    assert_eq!(
        sum(
            "jobvisor_job_attempts",
            &[("queue", q), ("kind", ghosted.as_str())]
        ),
        1.0,
        "the ghost's unstarted attempt was given back"
    );
    assert!(count("jobvisor_claim_statement_seconds", &[("queue", q)]) >= 1.0);
    assert!(count("jobvisor_finalize_statement_seconds", &[]) >= 1.0);

    // From the database.
    assert_eq!(
        must(&page, "jobvisor_jobs", &[("queue", q), ("state", "dead")]),
        1.0
    );
    assert_eq!(
        value(
            &page,
            "jobvisor_jobs",
            &[("queue", q), ("state", "running")]
        )
        .unwrap_or(0.0),
        0.0
    );
    let lq = lag_queue.as_str();
    assert_eq!(must(&page, "jobvisor_jobs_due", &[("queue", lq)]), 1.0);
    let lag = must(&page, "jobvisor_queue_lag_seconds", &[("queue", lq)]);
    assert!((3600.0..3700.0).contains(&lag), "lag {lag}");
    assert_eq!(
        must(&page, "jobvisor_queue_lag_seconds", &[("queue", q)]),
        0.0
    );
    let node = scheduler.node_id().as_str().to_string();
    let age = must(
        &page,
        "jobvisor_node_heartbeat_age_seconds",
        &[("node", &node)],
    );
    assert!((0.0..30.0).contains(&age), "heartbeat age {age}");
    assert!(must(&page, "jobvisor_gauges_age_seconds", &[]) < 30.0);
    assert!(value(&page, "jobvisor_pool_connections", &[("state", "idle")]).is_some());
    assert!(must(&page, "jobvisor_pool_max_connections", &[]) >= 1.0);

    // Once the lag queue's job is gone, its lag reads 0 again rather than its last value.
    jobvisor::testing::exec_sql(
        &store,
        &format!("DELETE FROM jobvisor_jobs WHERE queue = '{lq}'"),
    )
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let page = scrape(addr).await;
        if value(&page, "jobvisor_queue_lag_seconds", &[("queue", lq)]) == Some(0.0) {
            assert_eq!(
                value(&page, "jobvisor_jobs_due", &[("queue", lq)]),
                Some(0.0)
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lag never cleared:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    scheduler.shutdown().await;
    server_handle.stop(true).await;
}

#[actix::test]
async fn metrics_match_a_scripted_run_on_postgres() {
    scripted_run(Backend::Postgres).await;
}

#[actix::test]
async fn metrics_match_a_scripted_run_on_mysql() {
    scripted_run(Backend::Mysql).await;
}

#[actix::test]
async fn metrics_match_a_scripted_run_on_sqlite() {
    scripted_run(Backend::Sqlite).await;
}
