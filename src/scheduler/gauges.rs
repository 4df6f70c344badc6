//! The node's gauge refresh: every [`gauges_every`](crate::SchedulerConfig::gauges_every), a
//! [`DatabaseGauges`] refresh. Counting is leader-only work: the database's leader takes the
//! interval's turn (fenced by its term) and counts; every other node reads what it counted.
//! Failures are logged at most once a minute and retried at the next tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{report_store_error, Shared};
use crate::metrics::{DatabaseGauges, Turn};

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
        if let Err(e) = refresh(&shared, &mut gauges).await {
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

/// One refresh by this node: counting if it leads the database, reading otherwise. Answers
/// whether it counted.
pub(crate) async fn refresh(shared: &Shared, gauges: &mut DatabaseGauges) -> crate::Result<bool> {
    let turn = match shared.leader.current(shared.clock.monotonic()) {
        Some(term) => Turn::Leader(term),
        None => Turn::ReadOnly,
    };
    gauges.refresh_as(turn, shared.clock.as_ref()).await
}
