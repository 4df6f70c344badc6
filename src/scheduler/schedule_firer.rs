//! The schedule firer: stores this node's declared schedules at start (`store::schedules`
//! sync), then, every [`SCHEDULE_TICK`] while this node leads the database, fires the due
//! schedules — each fire one term-fenced transaction that moves the schedule on and enqueues
//! the fire's job (exactly one job per fire; ARCHITECTURE.md §7.10).
//!
//! The leader fires every stored schedule, declared by its own code or not: a rolling deploy
//! that adds a schedule on one node has it fired whichever node leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event::Event;
use super::report_store_error;
use super::shared::Shared;
use crate::error::Result;
use crate::schedule::{fire_key, MissedFires, Plan, Template};
use crate::store::Fire;

/// How often the leader looks for due schedules: **1 s** (a fire runs at most about this
/// late, plus the claim).
pub const SCHEDULE_TICK: Duration = Duration::from_secs(1);

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Runs until the scheduler cancels it.
pub(crate) async fn schedule_loop(shared: Arc<Shared>) {
    let mut synced = shared.schedules.is_empty();
    let mut last_error: Option<Instant> = None;
    let mut tick = tokio::time::interval(SCHEDULE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let res = async {
            if !synced {
                // A failed sync is retried next tick; firing the stored schedules goes on.
                match sync(&shared).await {
                    Ok(()) => synced = true,
                    Err(e) => tracing::warn!(error = %e, "schedules not stored; will retry"),
                }
            }
            fire_due(&shared).await.map(|_| ())
        }
        .await;
        if let Err(e) = res {
            report_store_error(
                &shared.events,
                "schedules",
                &mut last_error,
                ERROR_LOG_EVERY,
                &e,
            );
        }
    }
}

/// Stores this node's declared schedules (and retires the others, if it declares any).
pub(crate) async fn sync(shared: &Shared) -> Result<()> {
    shared
        .store
        .schedules_sync(&shared.schedules, shared.clock.bound_now())
        .await
}

/// Fires the due schedules if this node leads; answers how many jobs it enqueued (`None`:
/// not the leader).
pub(crate) async fn fire_due(shared: &Shared) -> Result<Option<usize>> {
    let Some(term) = shared.leader.current(shared.clock.monotonic()) else {
        return Ok(None);
    };
    let now = shared.clock.bound_now();
    let (at, due) = shared.store.schedules_due(now).await?;
    let mut created = 0;
    for row in due {
        let parsed = Plan::parse(&row.spec, &row.time_zone).and_then(|plan| {
            let template = Template::from_text(&row.template)?;
            let missed = MissedFires::from_text(&row.missed)
                .ok_or_else(|| format!("unknown missed-fire policy {:?}", row.missed))?;
            Ok((plan, template, missed))
        });
        let (plan, template, missed) = match parsed {
            Ok(p) => p,
            Err(reason) => {
                // Written by another version of the code; it declares it again at its start.
                tracing::warn!(schedule = %row.name, %reason, "schedule not fired: unreadable");
                continue;
            }
        };
        let plan_due = plan.due(row.next_fire_at, at, missed);
        let jobs = plan_due
            .fires
            .iter()
            .map(|f| template.job(fire_key(&row.name, *f), crate::store::from_us(*f)))
            .collect();
        let fire = Fire {
            name: &row.name,
            expected_next: row.next_fire_at,
            next: plan_due.next,
            last_fire: plan_due.fires.last().copied().or(row.last_fire_at),
            jobs,
            leader: Some((shared.node.as_str(), term)),
        };
        // One schedule failing (its job refused, a statement error) must not hold up the
        // others behind it: it is logged and tried again at the next tick.
        let enqueued = match shared.store.schedule_fire(fire, now).await {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(schedule = %row.name, error = %e, "schedule not fired; will retry");
                continue;
            }
        };
        let new = enqueued.iter().filter(|e| !e.duplicate).count();
        created += new;
        if !enqueued.is_empty() {
            shared.client.wake(template.queue());
        }
        shared.events.emit(Event::ScheduleFired {
            name: row.name.clone(),
            fires: plan_due.fires.len(),
            skipped: missed_count(&plan, row.next_fire_at, at, plan_due.fires.len()),
            next: plan_due.next.map(crate::store::from_us),
        });
    }
    Ok(Some(created))
}

/// How many due fires a pass did not enqueue (the missed-fire policy skipped them), counted
/// up to a bound.
fn missed_count(plan: &Plan, next: i64, now: i64, fired: usize) -> usize {
    const BOUND: usize = 100_000;
    let mut due = 0usize;
    let mut t = next - 1;
    while let Some(n) = plan.next_after(t).filter(|n| *n <= now) {
        due += 1;
        if due >= BOUND {
            break;
        }
        t = n;
    }
    due.saturating_sub(fired)
}
