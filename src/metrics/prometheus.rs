//! The Prometheus exporter (feature `prometheus`): a recorder with bucket boundaries chosen for
//! job latencies, installed globally.

use std::time::Duration;

pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::error::{Error, Result};

/// Histogram buckets of every `jobvisor_*_seconds` metric: 1 ms to 1 h.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];
/// Buckets of `jobvisor_job_attempts`.
const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 25.0];
/// How often histogram samples are folded in by the exporter's upkeep.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// A [`PrometheusBuilder`] with jobvisor's histogram buckets, to add listeners or labels to.
///
/// # Errors
/// [`Error::Config`] if the buckets are refused (they are constants: never in practice).
pub fn prometheus_builder() -> Result<PrometheusBuilder> {
    let refused = |e: metrics_exporter_prometheus::BuildError| Error::Config {
        field: "metrics",
        reason: e.to_string(),
    };
    PrometheusBuilder::new()
        .upkeep_timeout(UPKEEP_EVERY)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
        .map_err(refused)?
        .set_buckets_for_metric(Matcher::Full(super::JOB_ATTEMPTS.into()), ATTEMPT_BUCKETS)
        .map_err(refused)
}

/// Installs a Prometheus recorder as the process's global `metrics` recorder and returns the
/// handle that renders the scrape page (`handle.render()`; or serve it with
/// [`actix_web_service`](super::actix_web_service)). Its upkeep runs on a small thread of its
/// own, so it needs no particular runtime.
///
/// ```no_run
/// let handle = jobvisor::metrics::install_prometheus()?;
/// println!("{}", handle.render());
/// # Ok::<(), jobvisor::Error>(())
/// ```
///
/// # Errors
/// [`Error::Config`] if a global recorder is already installed.
pub fn install_prometheus() -> Result<PrometheusHandle> {
    let handle = prometheus_builder()?
        .install_recorder()
        .map_err(|e| Error::Config {
            field: "metrics",
            reason: format!("{e}; a metrics recorder can be installed once per process"),
        })?;
    super::describe();
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("jobvisor-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        })
        .map_err(|e| Error::Config {
            field: "metrics",
            reason: format!("cannot start the exporter's upkeep thread: {e}"),
        })?;
    Ok(handle)
}
