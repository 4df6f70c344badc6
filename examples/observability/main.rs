//! A scheduler with its metrics served for Prometheus: a stream of jobs (most succeed, some
//! retry, a few die) on http://127.0.0.1:9464/metrics, for the Grafana dashboard and the
//! alert rules next to this file to show real data.
//!
//! ```sh
//! cargo run --features actix-web --example observability              # SQLite file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --features actix-web --example observability
//! curl -s localhost:9464/metrics | grep '^jobvisor_'
//! cargo run --features actix-web --example observability -- --check   # self-test (used by CI)
//! ```
//!
//! It stops gracefully on SIGTERM or Ctrl-C. Point a Prometheus at `127.0.0.1:9464` (scrape
//! interval 15 s), load `alerts.yml` as a rule file, and import `grafana-dashboard.json` into
//! Grafana with that Prometheus as its data source.

use std::time::Duration;

use actix_web::{App, HttpServer};
use jobvisor::{
    handler_fn, JobContext, JobError, JobOutcome, NewJob, QueueConfig, Scheduler, SchedulerConfig,
    Store, StoreOptions,
};
use serde_json::json;

/// Where `/metrics` is served.
const LISTEN: (&str, u16) = ("127.0.0.1", 9464);

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    // The recorder first: the scheduler's instruments register with whatever is installed
    // when it starts.
    let metrics = jobvisor::metrics::install_prometheus()?;

    let dir = tempfile::tempdir()?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("jobs.db").display()));
    let store = Store::connect_with(&url, StoreOptions::default().migrate(true)).await?;
    let scheduler = Scheduler::builder(store)
        .config(
            SchedulerConfig::default().gauges_every(Some(Duration::from_secs(if check {
                1
            } else {
                15
            }))),
        )
        .queue("mail", QueueConfig::default().concurrency(4))
        .queue("reports", QueueConfig::default().concurrency(2))
        .handler(
            "send_email",
            handler_fn(|n: u64, _ctx: JobContext| async move {
                tokio::time::sleep(Duration::from_millis(5 + n % 20)).await;
                JobOutcome::done()
            }),
        )
        .handler(
            "render_report",
            handler_fn(|n: u64, ctx: JobContext| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                match (n % 10, ctx.attempt) {
                    // One in ten needs a second attempt; one in twenty never works.
                    (0, _) if n.is_multiple_of(20) => Err(JobError::fail("template missing")),
                    (0, 1) => Err(JobError::retry_after(
                        "upstream busy",
                        Duration::from_secs(1),
                    )),
                    _ => JobOutcome::success(json!({"pages": n % 7 + 1})),
                }
            }),
        )
        .start()?;

    let server = HttpServer::new(move || {
        App::new().service(jobvisor::metrics::actix_web_service(metrics.clone()))
    })
    .workers(1)
    .disable_signals()
    .bind(LISTEN)?
    .run();
    let server_handle = server.handle();
    actix_web::rt::spawn(server);
    println!("metrics on http://{}:{}/metrics", LISTEN.0, LISTEN.1);

    let client = scheduler.client();
    let mut n: u64 = 0;
    let rounds = if check { 5 } else { u64::MAX };
    // Stops on SIGTERM or Ctrl-C (the server's own signal handling is off: this loop
    // decides).
    let mut stop = std::pin::pin!(shutdown_signal());
    while n < rounds.saturating_mul(20) {
        for _ in 0..20 {
            n += 1;
            client
                .enqueue(NewJob::new("send_email", json!(n)).queue("mail"))
                .await?;
            if n.is_multiple_of(4) {
                client
                    .enqueue(NewJob::new("render_report", json!(n / 4)).queue("reports"))
                    .await?;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(if check { 100 } else { 1000 })) => {}
            () = &mut stop => {
                let report = scheduler.shutdown().await;
                println!(
                    "stopped: {} jobs finished, {} given back",
                    report.finished, report.released
                );
                server_handle.stop(true).await;
                return Ok(());
            }
        }
    }

    if check {
        // Wait for the database gauges, then check the page has what the dashboard uses.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let page = loop {
            let page = scrape().await?;
            if page.contains("jobvisor_jobs{queue=\"mail\"") || std::time::Instant::now() > deadline
            {
                break page;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        for name in [
            "jobvisor_jobs{",
            "jobvisor_queue_lag_seconds{",
            "jobvisor_jobs_finished_total{",
            "jobvisor_pickup_latency_seconds_bucket{",
            "jobvisor_handler_duration_seconds_bucket{",
            "jobvisor_node_heartbeat_age_seconds{",
            "jobvisor_pool_connections{",
        ] {
            if !page.contains(name) {
                return Err(format!("{name} missing from /metrics:\n{page}").into());
            }
        }
        println!("check passed: /metrics serves the dashboard's metrics");
        scheduler.shutdown().await;
        server_handle.stop(true).await;
    }
    Ok(())
}

/// `GET /metrics` on [`LISTEN`].
async fn scrape() -> Result<String, Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(LISTEN).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
    let mut page = String::new();
    s.read_to_string(&mut page).await?;
    Ok(page)
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM — what `docker stop`, Kubernetes and systemd send
/// before they kill the process.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
