//! The schedule commands: `schedules` (every stored schedule, next and last fire),
//! `schedule pause|resume|trigger|remove NAME` and `schedule add|change NAME ...` (run-time
//! schedules).

use jobvisor::schedule::Schedule;
use jobvisor::{Client, NewJob, ScheduleInfo};
use serde_json::{json, Value};

use crate::args::{ScheduleAction, ScheduleDef};
use crate::{show, Failure};

/// A schedule as JSON (stable field names).
fn schedule_json(s: &ScheduleInfo) -> Value {
    let ts = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.to_rfc3339());
    json!({
        "name": s.name,
        "spec": s.spec,
        "spec_text": s.spec_text(),
        "time_zone": s.time_zone,
        "kind": s.kind,
        "queue": s.queue,
        "missed": s.missed,
        "next_fire_at": ts(s.next_fire_at),
        "last_fire_at": ts(s.last_fire_at),
        "paused_at": ts(s.paused_at),
        "retired_at": ts(s.retired_at),
        "origin": s.origin,
        "shadowed_at": ts(s.shadowed_at),
    })
}

fn header() -> String {
    format!(
        "{:<24} {:<18} {:<16} {:<20} {:<20} {}\n",
        "schedule", "spec", "zone", "next fire (UTC)", "last fire (UTC)", "state"
    )
}

fn line(s: &ScheduleInfo) -> String {
    let t = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
    };
    let state = if s.retired_at.is_some() {
        "retired"
    } else if s.paused_at.is_some() {
        "paused"
    } else {
        "active"
    };
    // A node declares one of this name in code, which does not run while this one holds it.
    let shadows = if s.shadowed_at.is_some() {
        ", shadows the one in code"
    } else {
        ""
    };
    format!(
        "{:<24} {:<18} {:<16} {:<20} {:<20} {state}{shadows}\n",
        s.name,
        s.spec_text(),
        s.time_zone,
        t(s.next_fire_at),
        t(s.last_fire_at)
    )
}

/// `jobvisor schedules`.
pub(crate) async fn list(client: &Client, json_wanted: bool) -> Result<(), Failure> {
    let all = client.schedules().await?;
    show(
        json_wanted,
        Value::Array(all.iter().map(schedule_json).collect()),
        || {
            if all.is_empty() {
                return "no schedule stored (a scheduler stores the ones it declares)\n".into();
            }
            let mut out = header();
            for s in &all {
                out.push_str(&line(s));
            }
            out
        },
    );
    Ok(())
}

/// The schedule `def` describes.
fn schedule_of(def: ScheduleDef) -> Schedule {
    let mut job = NewJob::new(def.kind, def.payload);
    if let Some(q) = def.queue {
        job = job.queue(q);
    }
    if let Some(p) = def.priority {
        job = job.priority(p);
    }
    if let Some(n) = def.max_attempts {
        job = job.max_attempts(n);
    }
    if let Some(t) = def.timeout {
        job = job.timeout(t);
    }
    let s = match (def.cron, def.every) {
        (Some(expression), _) => Schedule::cron(def.name, expression, job),
        // clap requires one of the two.
        (None, every) => Schedule::every(def.name, every.unwrap_or_default(), job),
    };
    s.time_zone(def.zone).missed(def.missed)
}

/// `jobvisor schedule pause|resume|trigger|remove NAME`, `schedule add|change NAME ...`.
pub(crate) async fn act(
    client: &Client,
    action: ScheduleAction,
    json_wanted: bool,
) -> Result<(), Failure> {
    let s = match action {
        ScheduleAction::Pause { name } => client.pause_schedule(&name).await?,
        ScheduleAction::Resume { name } => client.resume_schedule(&name).await?,
        ScheduleAction::Add(def) => client.add_schedule(schedule_of(def)).await?,
        ScheduleAction::Change(def) => client.change_schedule(schedule_of(def)).await?,
        ScheduleAction::Remove { name } => {
            client.remove_schedule(&name).await?;
            show(json_wanted, json!({ "removed": name }), || {
                format!("schedule {name} removed\n")
            });
            return Ok(());
        }
        ScheduleAction::Trigger { name } => {
            let e = client.trigger_schedule(&name).await?;
            show(
                json_wanted,
                json!({ "schedule": name, "job": e.id }),
                || format!("schedule {name}: job {} enqueued now\n", e.id),
            );
            return Ok(());
        }
    };
    show(json_wanted, schedule_json(&s), || {
        format!("{}{}", header(), line(&s))
    });
    Ok(())
}
