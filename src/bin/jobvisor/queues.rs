//! The queue commands: `queues` (their shared settings), `pause`, `resume` and `limit`.

use std::time::Duration;

use jobvisor::{AuditAction, Client, QueueInfo, QueueLimits, RateLimit};
use serde_json::{json, Value};

use crate::{show, Failure};

/// What `limit` changes: `None` keeps a limit as it is, `Some(None)` lifts it.
#[derive(Debug)]
pub(crate) struct LimitChange {
    pub(crate) concurrency: Option<Option<u32>>,
    pub(crate) per_partition: Option<Option<u32>>,
    pub(crate) rate: Option<Option<(u32, Duration)>>,
}

/// A queue's settings as JSON (also in `status`).
pub(crate) fn queue_json(q: &QueueInfo) -> Value {
    json!({
        "name": q.name,
        "paused": q.is_paused(),
        "paused_at": q.paused_at.map(|t| t.to_rfc3339()),
        "paused_by": q.paused_by,
        "concurrency": q.limits.concurrency,
        "per_partition": q.limits.per_partition,
        "rate": q.limits.rate.map(|r| json!({
            "jobs": r.jobs(),
            "per_ms": u64::try_from(r.per().as_millis()).unwrap_or(u64::MAX),
        })),
        "updated_at": q.updated_at.to_rfc3339(),
    })
}

fn limit_text(n: Option<u32>) -> String {
    n.map_or_else(|| "-".to_string(), |n| n.to_string())
}

fn rate_text(r: Option<RateLimit>) -> String {
    r.map_or_else(
        || "-".to_string(),
        |r| format!("{}/{:?}", r.jobs(), r.per()),
    )
}

fn queue_line(q: &QueueInfo) -> String {
    let paused = match (&q.paused_at, &q.paused_by) {
        (Some(at), by) => format!(
            "paused {} by {}",
            at.format("%Y-%m-%d %H:%M:%S"),
            by.as_deref().unwrap_or("?")
        ),
        (None, _) => "running".to_string(),
    };
    format!(
        "{:<24} {:>11} {:>13} {:>12}  {paused}\n",
        q.name,
        limit_text(q.limits.concurrency),
        limit_text(q.limits.per_partition),
        rate_text(q.limits.rate),
    )
}

/// A queue's settings in a few words, for `status`: `paused`, then each limit.
pub(crate) fn control_text(q: &QueueInfo) -> String {
    let mut parts = Vec::new();
    if q.is_paused() {
        parts.push("paused".to_string());
    }
    if let Some(n) = q.limits.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(n) = q.limits.per_partition {
        parts.push(format!("{n} per partition"));
    }
    if let Some(r) = q.limits.rate {
        parts.push(format!("rate {}", rate_text(Some(r))));
    }
    parts.join(", ")
}

fn header() -> String {
    format!(
        "{:<24} {:>11} {:>13} {:>12}  {}\n",
        "queue", "concurrency", "per_partition", "rate", "state"
    )
}

/// `jobvisor queues`.
pub(crate) async fn list(client: &Client, json_wanted: bool) -> Result<(), Failure> {
    let queues = client.queues().await?;
    show(
        json_wanted,
        Value::Array(queues.iter().map(queue_json).collect()),
        || {
            if queues.is_empty() {
                return "no queue has shared settings: every queue runs unpaused and unlimited\n"
                    .to_string();
            }
            let mut out = header();
            for q in &queues {
                out.push_str(&queue_line(q));
            }
            out
        },
    );
    Ok(())
}

/// Prints a queue's settings after a change (`None`: it has none left).
fn print_after(name: &str, q: Option<&QueueInfo>, json_wanted: bool) {
    let v = q.map_or_else(
        || json!({ "name": name, "paused": false, "settings": null }),
        queue_json,
    );
    show(json_wanted, v, || match q {
        Some(q) => format!("{}{}", header(), queue_line(q)),
        None => format!("{name}: running, no limits\n"),
    });
}

/// `jobvisor pause`.
pub(crate) async fn pause(
    client: &Client,
    queue: &str,
    by: &str,
    json_wanted: bool,
) -> Result<(), Failure> {
    warn_if_unknown(client, queue).await?;
    let q = client.pause_queue(queue, by).await?;
    audit(
        client,
        AuditAction::new(by, "cli.pause", format!("queue {queue}")),
    )
    .await;
    print_after(queue, Some(&q), json_wanted);
    Ok(())
}

/// Says on stderr when no node serves `queue`, it has no settings and no job: a setting is
/// kept for its first node, but the name may be misspelt.
async fn warn_if_unknown(client: &Client, queue: &str) -> Result<(), Failure> {
    if !client.is_known_queue(queue).await? {
        let known = client.known_queues().await?;
        eprintln!(
            "jobvisor: note: queue {queue:?} is new here (no settings, no node serves it, no job \
             in it): the setting holds from its first node's first claim; known queues: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    }
    Ok(())
}

/// `jobvisor resume`.
pub(crate) async fn resume(client: &Client, queue: &str, json_wanted: bool) -> Result<(), Failure> {
    let q = client.resume_queue(queue).await?;
    audit(
        client,
        AuditAction::new(crate::bulk::who(), "cli.resume", format!("queue {queue}")),
    )
    .await;
    print_after(queue, q.as_ref(), json_wanted);
    Ok(())
}

/// Records a queue change in the audit log; a failure to record is said on stderr.
async fn audit(client: &Client, a: AuditAction) {
    if let Err(e) = client.record_action(&a).await {
        eprintln!("jobvisor: the action was not recorded in the audit log: {e}");
    }
}

/// `jobvisor limit`: the queue's current limits with the given ones changed.
pub(crate) async fn limit(
    client: &Client,
    queue: &str,
    change: LimitChange,
    json_wanted: bool,
) -> Result<(), Failure> {
    warn_if_unknown(client, queue).await?;
    let current = client
        .queue(queue)
        .await?
        .map(|q| q.limits)
        .unwrap_or_default();
    let rate = match change.rate {
        Some(Some((jobs, per))) => Some(RateLimit::new(jobs, per)?),
        Some(None) => None,
        None => current.rate,
    };
    let mut limits = QueueLimits::default();
    limits.concurrency = change.concurrency.unwrap_or(current.concurrency);
    limits.per_partition = change.per_partition.unwrap_or(current.per_partition);
    limits.rate = rate;
    let q = client.set_queue_limits(queue, limits).await?;
    print_after(queue, q.as_ref(), json_wanted);
    Ok(())
}
