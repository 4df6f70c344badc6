//! The schedule firer: stores this node's declared schedules at start (`store::schedules`
//! sync) and declares them again every [`DECLARE_EVERY`] while it runs (so they are not
//! retired under it); every [`SCHEDULE_TICK`] while this node leads the database — and at
//! once when it begins a term, so a new leader catches up on the fires missed during the
//! takeover without waiting a tick — it fires the due schedules, each fire one term-fenced
//! transaction that moves the schedule on and enqueues the fire's job (exactly one job per
//! fire; ARCHITECTURE.md §7.10).
//!
//! The leader fires every stored schedule, declared by its own code or not: a rolling deploy
//! that adds a schedule on one node has it fired whichever node leads, and a schedule added
//! at run time ([`Client::add_schedule`](crate::Client::add_schedule)) is fired alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event::Event;
use super::report_store_error;
use super::shared::Shared;
use crate::error::Result;
use crate::schedule::{
    fire_key, MissedFires, Plan, Template, DECLARE_EVERY, MISSED_GRACE, RETIRE_AFTER,
};
use crate::store::{Fire, SyncMode};

/// How often the leader looks for due schedules: **1 s** (a fire runs at most about this
/// late, plus the claim). A node that becomes the leader looks at once.
pub(crate) const SCHEDULE_TICK: Duration = Duration::from_secs(1);

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Runs until the scheduler cancels it, ticking every `every` ([`SCHEDULE_TICK`]) and waking
/// as well when this node begins a term.
pub(crate) async fn schedule_loop(shared: Arc<Shared>, every: Duration) {
    let mut synced = shared.schedules.is_empty();
    let mut declared = shared.clock.monotonic();
    let mut last_error: Option<Instant> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Made before each pass, so a term begun while a pass runs still wakes the next wait.
    let mut elected = Box::pin(shared.leader.elected());
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut elected => {
                // The next tick counts from this pass.
                tick.reset();
            }
        }
        elected.set(shared.leader.elected());
        let res = async {
            if !synced {
                // A failed sync is retried next tick; firing the stored schedules goes on.
                match sync(&shared, SyncMode::Start).await {
                    Ok(()) => {
                        synced = true;
                        declared = shared.clock.monotonic();
                        shared.schedules_stored.send_replace(true);
                    }
                    Err(e) => tracing::warn!(error = %e, "schedules not stored; will retry"),
                }
            } else if !shared.schedules.is_empty()
                && shared.clock.monotonic().saturating_sub(declared) >= DECLARE_EVERY
            {
                // Retried at the next tick if it fails (RETIRE_AFTER leaves room for three
                // missed declarations); firing the stored schedules goes on meanwhile.
                match sync(&shared, SyncMode::Refresh).await {
                    Ok(()) => declared = shared.clock.monotonic(),
                    Err(e) => tracing::warn!(error = %e, "schedules not declared; will retry"),
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

/// Stores this node's declared schedules — at start with its own definitions, while running
/// the declaration only — and retires those nobody has declared for [`RETIRE_AFTER`] (if it
/// declares any).
pub(crate) async fn sync(shared: &Shared, mode: SyncMode) -> Result<()> {
    shared
        .store
        .schedules_sync(
            &shared.schedules,
            mode,
            RETIRE_AFTER,
            shared.clock.bound_now(),
        )
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
    let grace = skip_grace(shared);
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
        let plan_due = plan.due(row.next_fire_at, at, missed, grace);
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

/// How late a fire may be and still run under [`MissedFires::Skip`] (µs): [`MISSED_GRACE`],
/// or the takeover time if longer — a fire due while leadership moves was not missed.
fn skip_grace(shared: &Shared) -> i64 {
    let takeover = shared.config.leader_lease * 4 / 3 + 2 * SCHEDULE_TICK;
    i64::try_from(MISSED_GRACE.max(takeover).as_micros()).unwrap_or(i64::MAX)
}

/// How many due fires a pass did not enqueue (the missed-fire policy skipped them): exact for
/// an interval, counted up to [`MISSED_COUNT_BOUND`] for a cron expression (each step is a
/// search, and this runs on the node's actor thread).
fn missed_count(plan: &Plan, next: i64, now: i64, fired: usize) -> usize {
    let due = match plan {
        Plan::Every(d) if now >= next => {
            usize::try_from((now - next) / d + 1).unwrap_or(usize::MAX)
        }
        Plan::Every(_) => 0,
        Plan::Cron(..) => {
            let mut due = 0usize;
            let mut t = next - 1;
            while let Some(n) = plan.next_after(t).filter(|n| *n <= now) {
                due += 1;
                if due >= MISSED_COUNT_BOUND + fired {
                    break;
                }
                t = n;
            }
            due
        }
    };
    due.saturating_sub(fired)
}

/// The most skipped fires of a cron schedule one pass counts: **1,000**.
const MISSED_COUNT_BOUND: usize = 1_000;
