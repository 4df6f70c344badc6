//! Nodes: each registered node's queues and kinds, its running jobs, its last heartbeat; the
//! leader and its term; and the due jobs no live node can run (as `jobvisor status` flags
//! them). Above the exact-count limit the running jobs per node and the unserved jobs are
//! not read (both scan the live table), and the page says so.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, Ctx};
use super::super::layout::{age, shell, ts};
use super::super::{error_response, Data};
use crate::error::Result;
use crate::job::JobState;
use crate::store::ListParams;

/// Running jobs read, at most, to count them per node: **1,000**.
const RUNNING_SCAN: u32 = 1000;

pub(crate) async fn page(state: Data, req: HttpRequest) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match render(&state, &req, &ctx).await {
        Ok(r) => r,
        Err(e) => ctx.finish(&state, &req, error_response(&req, &e)),
    }
}

async fn render(state: &Data, req: &HttpRequest, ctx: &Ctx) -> Result<HttpResponse> {
    let now = Utc::now();
    let nodes = state.client.nodes().await?;
    let leader = state.client.leader().await?;
    // Above the exact-count limit, the two reads that scan the live table are left out (the
    // gauges say how big it is): `jobvisor status` still computes the unserved jobs.
    let (_, _, estimate) = super::overview::counts(state).await?;
    let big = estimate.is_some();
    let live = 3 * crate::config::DEFAULT_NODE_HEARTBEAT_EVERY;
    let unserved = if big {
        Vec::new()
    } else {
        state
            .client
            .unserved(std::time::Duration::ZERO, live)
            .await?
    };
    let running = if big {
        Vec::new()
    } else {
        state
            .client
            .list(ListParams {
                state: Some(JobState::Running),
                limit: RUNNING_SCAN,
                ..ListParams::default()
            })
            .await?
    };
    let mut per_node: HashMap<String, u64> = HashMap::new();
    for j in &running {
        if let Some(l) = &j.lease {
            *per_node.entry(l.owner.to_string()).or_default() += 1;
        }
    }
    let body = html! {
        p #leader {
            @if let Some(l) = &leader {
                "Leader: " strong { (l.node) } ", term " (l.term) ", elected " (ts(l.elected_at)) ", lease ends " (age(now, l.expires_at))
            } @else { "No leader." }
        }
        table #node-table {
            thead { tr { th { "node" } th { "queues" } th { "kinds" } th.num { "running" } th { "started" } th { "last heartbeat" } } }
            tbody {
                @for n in &nodes {
                    tr {
                        td { (n.node) @if n.is_gone(now) { " " span.state-dead { "(gone)" } } }
                        td { (n.queues.join(", ")) }
                        td { (n.kinds.join(", ")) }
                        td.num { (per_node.get(&n.node).copied().unwrap_or(0)) }
                        td { (ts(n.started_at)) }
                        td { (age(now, n.heartbeat_at)) }
                    }
                }
            }
        }
        @if running.len() == RUNNING_SCAN as usize { p.estimate { "Running counts from the first " (RUNNING_SCAN) " running jobs." } }
        h2 { "Unserved" }
        @if big {
            p.estimate #unserved-skipped { "Running jobs per node and unserved jobs are not read on a table of more than "
                (state.config.exact_count_limit) " live jobs (each would scan it); `jobvisor status` computes them." }
        } @else if unserved.is_empty() { p #unserved-none { "Every due job has a live node that can run it." } }
        @else {
            table #unserved {
                thead { tr { th { "queue" } th { "kind" } th.num { "jobs" } th { "why" } } }
                tbody { @for u in &unserved { tr {
                    td { (u.queue) } td { (u.kind) } td.num { (u.jobs) } td { (super::super::layout::unserved_reason(u.reason)) }
                } } }
            }
        }
    };
    Ok(shell(state, req, ctx, "Nodes", true, StatusCode::OK, body))
}
