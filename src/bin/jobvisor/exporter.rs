//! `jobvisor metrics`: a standalone Prometheus exporter of the database-wide gauges (jobs by
//! queue and state, due jobs, queue lag, node heartbeats, jobs ended in the last 5 minutes by
//! final state), for a database whose services do not serve `/metrics` themselves — or
//! `--once` to print the page and exit. The node-side series (claims, finalizations by
//! outcome, latencies) exist only where the jobs run: from here, throughput and failures are
//! `jobvisor_jobs_ended_recently`.
//!
//! It takes part in the gauges' turns like any node: the counts still run once per database
//! per interval, whoever computes them.

use std::net::SocketAddr;
use std::time::Duration;

use jobvisor::metrics::{install_prometheus, prometheus_builder, DatabaseGauges};
use jobvisor::Store;

use super::{exit, Failure};

/// This process's name in the gauges row (who computed the last turn).
fn node_name() -> String {
    format!("jobvisor-metrics-{}", std::process::id())
}

/// Refreshes once and prints the page.
pub(crate) async fn once(store: Store, every: Duration) -> Result<(), Failure> {
    let handle = install_prometheus()?;
    let mut gauges = DatabaseGauges::new(store, node_name(), every)?;
    gauges.refresh().await?;
    print!("{}", handle.render());
    Ok(())
}

/// Serves `/metrics` on `listen`, refreshing every `every`, until the process is stopped.
pub(crate) async fn serve(
    store: Store,
    listen: SocketAddr,
    every: Duration,
) -> Result<(), Failure> {
    let mut gauges = DatabaseGauges::new(store, node_name(), every)?;
    let (recorder, exporter) = prometheus_builder()?
        .with_http_listener(listen)
        .build()
        .map_err(|e| Failure {
            code: exit::FAILED,
            message: format!("cannot serve metrics on {listen}: {e}"),
        })?;
    metrics::set_global_recorder(recorder).map_err(|e| Failure {
        code: exit::FAILED,
        message: format!("cannot install the metrics recorder: {e}"),
    })?;
    jobvisor::metrics::describe();
    tokio::spawn(exporter);
    eprintln!("jobvisor: serving metrics on http://{listen}/metrics, refreshed every {every:?}");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A database that cannot be reached is said, and tried again at the next tick; the
        // page keeps the last values (and `jobvisor_gauges_age_seconds` shows how old).
        if let Err(e) = gauges.refresh().await {
            eprintln!("jobvisor: metrics refresh failed: {e}");
        }
    }
}
