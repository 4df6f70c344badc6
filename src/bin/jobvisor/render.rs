//! How the command line shows things: a job, a page of jobs, queue status and nodes, as
//! aligned text tables for people or as JSON for scripts. The JSON field names are part of
//! the command line's interface: they change only with a major version. A job is printed in
//! `Job`'s own serde form, the API's.

use chrono::{DateTime, Utc};
use jobvisor::{
    Claim, Dependencies, Job, Leader, Link, NodeInfo, QueueInfo, QueueLag, StateCount, Unserved,
    UnservedReason,
};
use serde_json::{json, Value};

/// A timestamp as RFC 3339 (microseconds, `Z`).
fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn ts_opt(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| Value::String(ts(t)))
}

/// A job as JSON: exactly `Job`'s serde form, the shape a service returning a `Job` from
/// the API gives (the lease nested as `lease`, `timeout` as `timeout_ms`), so a script reads
/// the command line's output and a service's alike.
pub(crate) fn job_json(j: &Job) -> Value {
    // `Job` holds JSON values, text, numbers and instants only: serializing it cannot fail.
    serde_json::to_value(j).unwrap_or_else(|e| json!({"id": j.id.0, "error": e.to_string()}))
}

/// A job as JSON ([`job_json`]) with its dependencies, when it has any: `parents` and
/// `children`, each `{id, state, policy, settled}` (a job without any prints exactly `Job`'s
/// serde form).
pub(crate) fn job_with_links_json(j: &Job, d: &Dependencies) -> Value {
    let mut v = job_json(j);
    if let Value::Object(m) = &mut v {
        if !d.parents.is_empty() {
            m.insert("parents".into(), json!(d.parents));
        }
        if !d.children.is_empty() {
            m.insert("children".into(), json!(d.children));
        }
    }
    v
}

/// A job's JSON with its execution ledger, when it has one: `claims`, each [`Claim`]'s serde
/// form (a job never claimed prints as before).
pub(crate) fn with_claims_json(mut v: Value, claims: &[Claim]) -> Value {
    if let (Value::Object(m), false) = (&mut v, claims.is_empty()) {
        m.insert("claims".into(), json!(claims));
    }
    v
}

/// A job's claims, one line each, for people (nothing when it has none): claim id, attempt,
/// node, claimed, how long it ran, outcome and code.
pub(crate) fn claims_text(claims: &[Claim]) -> String {
    if claims.is_empty() {
        return String::new();
    }
    let mut out = format!("{:<14}\n", "claims");
    for c in claims {
        let ran = c
            .duration()
            .map_or_else(|| "-".to_string(), |d| format!("{:.3}s", d.as_secs_f64()));
        out.push_str(&format!(
            "  {} #{} {} {} {} {}{}\n",
            c.claim,
            c.attempt,
            c.node,
            ts(c.claimed_at),
            ran,
            c.outcome,
            c.code
                .as_ref()
                .map_or_else(String::new, |code| format!(" ({code})"))
        ));
    }
    out
}

/// A job's parents and children, for people (nothing when it has none).
pub(crate) fn links_text(d: &Dependencies) -> String {
    let show = |links: &[Link]| {
        links
            .iter()
            .map(|l| {
                let state = l.state.map_or("gone", |s| s.as_str());
                format!("{} ({state}, {})", l.id.0, l.policy.as_str())
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    if !d.parents.is_empty() {
        out.push_str(&format!("{:<14} {}\n", "parents", show(&d.parents)));
    }
    if !d.children.is_empty() {
        out.push_str(&format!("{:<14} {}\n", "children", show(&d.children)));
    }
    out
}

/// One job in full, for people.
pub(crate) fn job_text(j: &Job) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<14} {v}\n"));
    line("id", j.id.0.to_string());
    line("queue", j.queue.clone());
    line("kind", j.kind.clone());
    line("state", j.state.as_str().to_string());
    if let Some(k) = &j.unique_key {
        line("unique key", k.clone());
    }
    if let Some(k) = &j.sequence {
        line("sequence", k.clone());
    }
    if let Some(t) = j.start_by {
        line("start by", ts(t));
    }
    line("priority", j.priority.to_string());
    line("attempts", format!("{} of {}", j.attempts, j.max_attempts));
    line("run at", ts(j.run_at));
    line("timeout", format!("{:?}", j.timeout));
    match &j.lease {
        Some(l) => {
            line("lease owner", l.owner.as_str().to_string());
            line("lease until", ts(l.expires_at));
            line(
                "heartbeat",
                l.heartbeat_at.map_or_else(|| "-".to_string(), ts),
            );
        }
        None => line("lease", "none".to_string()),
    }
    for (k, t) in [
        ("started", j.started_at),
        ("finished", j.finished_at),
        ("archived", j.archived_at),
        ("cancel asked", j.cancel_requested_at),
    ] {
        if let Some(t) = t {
            line(k, ts(t));
        }
    }
    line("created", ts(j.created_at));
    line("updated", ts(j.updated_at));
    line("payload", j.payload.to_string());
    if let Some(r) = &j.result {
        line("result", r.to_string());
    }
    if let Some(p) = &j.progress {
        line("progress", p.to_string());
    }
    if j.errors.is_empty() {
        line("errors", "none".to_string());
    } else {
        line("errors", String::new());
        for e in &j.errors {
            out.push_str(&format!(
                "  #{} {} {}: {}\n",
                e.attempt,
                e.at.map_or_else(|| "-".to_string(), ts),
                e.code,
                e.message
            ));
        }
    }
    out
}

/// A page of jobs, one line each.
pub(crate) fn jobs_table(jobs: &[Job]) -> String {
    let mut out = format!(
        "{:>10}  {:<16} {:<24} {:<10} {:>8}  {:<27} {}\n",
        "id", "queue", "kind", "state", "attempts", "run at", "last error"
    );
    for j in jobs {
        out.push_str(&format!(
            "{:>10}  {:<16} {:<24} {:<10} {:>8}  {:<27} {}\n",
            j.id.0,
            j.queue,
            j.kind,
            j.state.as_str(),
            format!("{}/{}", j.attempts, j.max_attempts),
            ts(j.run_at),
            j.last_error
                .as_ref()
                .map_or_else(String::new, |e| format!("{}: {}", e.code, e.message)),
        ));
    }
    out
}

/// How long ago `t` was, for people (`3m12s`).
fn age(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let s = (now - t).num_seconds().max(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// What `status` shows.
pub(crate) struct Status<'a> {
    pub(crate) counts: &'a [StateCount],
    pub(crate) lags: &'a [QueueLag],
    pub(crate) nodes: &'a [NodeInfo],
    pub(crate) controls: &'a [QueueInfo],
    pub(crate) leader: Option<&'a Leader>,
    /// Due jobs no live node can run.
    pub(crate) unserved: &'a [Unserved],
}

fn unserved_reason(r: UnservedReason) -> &'static str {
    match r {
        UnservedReason::NoNodeServesQueue => "no live node serves the queue",
        UnservedReason::NoNodeHasKind => {
            "no live node serving the queue has a handler for the kind"
        }
        _ => "no live node can run them",
    }
}

fn unserved_json(now: DateTime<Utc>, u: &Unserved) -> Value {
    json!({
        "queue": u.queue,
        "kind": u.kind,
        "jobs": u.jobs,
        "oldest_due_at": ts(u.oldest_due),
        "waiting_seconds": (now - u.oldest_due).num_milliseconds().max(0) as f64 / 1000.0,
        "reason": unserved_reason(u.reason),
    })
}

fn leader_json(l: &Leader) -> Value {
    json!({
        "node": l.node.as_str(),
        "term": l.term,
        "elected_at": ts(l.elected_at),
        "expires_at": ts(l.expires_at),
    })
}

/// Queue status: counts by state, lag, nodes, leader — JSON.
pub(crate) fn status_json(now: DateTime<Utc>, s: &Status<'_>) -> Value {
    let Status {
        counts,
        lags,
        nodes,
        controls,
        leader,
        unserved,
    } = *s;
    let mut queues: Vec<String> = counts.iter().map(|c| c.queue.clone()).collect();
    queues.extend(lags.iter().map(|l| l.queue.clone()));
    queues.extend(controls.iter().map(|c| c.name.clone()));
    queues.sort_unstable();
    queues.dedup();
    let queues: Vec<Value> = queues
        .iter()
        .map(|q| {
            let mut states = serde_json::Map::new();
            for c in counts.iter().filter(|c| &c.queue == q) {
                states.insert(c.state.as_str().to_string(), json!(c.count));
            }
            let lag = lags.iter().find(|l| &l.queue == q);
            let control = controls.iter().find(|c| &c.name == q);
            json!({
                "queue": q,
                "paused": control.is_some_and(QueueInfo::is_paused),
                "settings": control.map(crate::queues::queue_json),
                "states": states,
                "due": lag.map_or(0, |l| l.due),
                "oldest_due_at": ts_opt(lag.map(|l| l.oldest_due)),
                "lag_seconds": lag.map_or(0.0, |l| (now - l.oldest_due).num_milliseconds().max(0) as f64 / 1000.0),
            })
        })
        .collect();
    json!({
        "at": ts(now),
        "queues": queues,
        "nodes": nodes.iter().map(|n| node_json(now, n)).collect::<Vec<_>>(),
        "leader": leader.map(leader_json),
        "unserved": unserved.iter().map(|u| unserved_json(now, u)).collect::<Vec<_>>(),
    })
}

/// Queue status for people.
pub(crate) fn status_text(now: DateTime<Utc>, s: &Status<'_>) -> String {
    let v = status_json(now, s);
    let Status {
        lags,
        nodes,
        controls,
        leader,
        unserved,
        ..
    } = *s;
    let mut out = format!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>10}  {}\n",
        "queue",
        "waiting",
        "pending",
        "running",
        "retrying",
        "succeeded",
        "dead",
        "cancelled",
        "due",
        "lag",
        "control"
    );
    for q in v["queues"].as_array().into_iter().flatten() {
        let n = |s: &str| q["states"][s].as_u64().unwrap_or(0);
        let lag = lags
            .iter()
            .find(|l| q["queue"] == l.queue.as_str())
            .map_or_else(|| "-".to_string(), |l| age(now, l.oldest_due));
        let control = controls
            .iter()
            .find(|c| q["queue"] == c.name.as_str())
            .map_or_else(|| "-".to_string(), crate::queues::control_text);
        out.push_str(&format!(
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>10}  {}\n",
            q["queue"].as_str().unwrap_or(""),
            n("waiting"),
            n("pending"),
            n("running"),
            n("retrying"),
            n("succeeded"),
            n("dead"),
            n("cancelled"),
            q["due"].as_u64().unwrap_or(0),
            lag,
            control
        ));
    }
    out.push('\n');
    out.push_str(&nodes_text(now, nodes));
    out.push_str(&match leader {
        Some(l) => format!(
            "leader: {} (term {}, elected {} ago)\n",
            l.node,
            l.term,
            age(now, l.elected_at)
        ),
        None => "leader: none\n".to_string(),
    });
    for u in unserved {
        out.push_str(&format!(
            "unserved: {} {} job(s) in queue {} wait, the oldest due {} ago: {}\n",
            u.jobs,
            u.kind,
            u.queue,
            age(now, u.oldest_due),
            unserved_reason(u.reason)
        ));
    }
    out
}

fn node_json(now: DateTime<Utc>, n: &NodeInfo) -> Value {
    json!({
        "node": n.node,
        "queues": n.queues,
        "kinds": n.kinds,
        "started_at": ts(n.started_at),
        "heartbeat_at": ts(n.heartbeat_at),
        "heartbeat_age_seconds": (now - n.heartbeat_at).num_milliseconds().max(0) as f64 / 1000.0,
        "gone": n.is_gone(now),
    })
}

/// The nodes as JSON.
pub(crate) fn nodes_json(now: DateTime<Utc>, nodes: &[NodeInfo]) -> Value {
    Value::Array(nodes.iter().map(|n| node_json(now, n)).collect())
}

/// The nodes for people.
pub(crate) fn nodes_text(now: DateTime<Utc>, nodes: &[NodeInfo]) -> String {
    if nodes.is_empty() {
        return "no node registered\n".to_string();
    }
    let mut out = format!(
        "{:<28} {:>10} {:<24} {}\n",
        "node", "heartbeat", "queues", "kinds"
    );
    for n in nodes {
        out.push_str(&format!(
            "{:<28} {:>10} {:<24} {}\n",
            n.node,
            format!("{} ago", age(now, n.heartbeat_at)),
            n.queues.join(","),
            n.kinds.join(",")
                + if n.is_gone(now) {
                    "  (gone: silent past 30 s; `jobvisor nodes --forget` removes it)"
                } else {
                    ""
                }
        ));
    }
    out
}
