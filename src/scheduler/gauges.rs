//! The node's gauge refresh: every [`gauges_every`](crate::SchedulerConfig::gauges_every), a
//! [`DatabaseGauges`] refresh (this node takes the interval's turn and counts, or reads what
//! another counted). Failures are logged at most once a minute and retried at the next tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{report_store_error, Shared};
use crate::metrics::DatabaseGauges;

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Runs until the scheduler cancels it (at shutdown).
pub(crate) async fn gauge_loop(shared: Arc<Shared>, every: Duration) {
    let mut gauges = match DatabaseGauges::new(shared.store.clone(), shared.node.as_str(), every) {
        Ok(g) => g,
        Err(e) => {
            // The configuration was validated at build: only a bug gets here.
            tracing::error!(error = %e, "database gauges not refreshed");
            return;
        }
    };
    let mut last_error: Option<Instant> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = gauges.refresh().await {
            report_store_error(
                &shared.events,
                "gauges",
                &mut last_error,
                ERROR_LOG_EVERY,
                &e,
            );
        }
    }
}
