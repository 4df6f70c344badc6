//! Queues (every queue with stored settings, a serving node or a live job): each queue's shared settings (pause, global and per-partition limits, rate limit)
//! and its live occupancy against them, with forms to pause, resume and change the limits —
//! validated by the same [`Client`](crate::Client) calls as everywhere else.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::{html, Markup};

use super::super::auth::{authorize, csrf_field, Ctx};
use super::super::layout::{age, shell};
use super::super::{error_response, Data};
use crate::error::Result;
use crate::job::JobState;
use crate::store::QueueLimits;

/// The limits for people: `concurrency 5, per partition 2, rate 10 per 1s`.
pub(crate) fn limits_text(l: &QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(c) = l.concurrency {
        parts.push(format!("concurrency {c}"));
    }
    if let Some(p) = l.per_partition {
        parts.push(format!("per partition {p}"));
    }
    if let Some(r) = &l.rate {
        parts.push(format!(
            "rate {} per {}",
            r.jobs(),
            super::super::layout::duration_text(r.per())
        ));
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

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

fn queue_form(state: &Data, ctx: &Ctx, name: &str, paused: bool, l: &QueueLimits) -> Markup {
    let num = |v: Option<u32>| v.map(|n| n.to_string()).unwrap_or_default();
    html! {
        form.inline method="post" action=(state.url(if paused { "/queues/resume" } else { "/queues/pause" })) {
            (csrf_field(ctx))
            input type="hidden" name="queue" value=(name);
            button type="submit" class=(if paused { "primary" } else { "danger" }) data-queue=(name) {
                (if paused { "Resume" } else { "Pause" })
            }
        }
        form.inline.limits method="post" action=(state.url("/queues/limits")) {
            (csrf_field(ctx))
            input type="hidden" name="queue" value=(name);
            input name="concurrency" size="4" placeholder="conc." value=(num(l.concurrency));
            input name="per_partition" size="4" placeholder="per part." value=(num(l.per_partition));
            input name="rate_jobs" size="4" placeholder="rate" value=(num(l.rate.as_ref().map(|r| r.jobs())));
            " per "
            input name="rate_per" size="5" placeholder="1s" value=(l.rate.as_ref().map(|r| format!("{}ms", r.per().as_millis())).unwrap_or_default());
            button type="submit" { "Set limits" }
        }
    }
}

async fn render(state: &Data, req: &HttpRequest, ctx: &Ctx) -> Result<HttpResponse> {
    let now = Utc::now();
    let settings = state.client.queues().await?;
    let (counts, _, estimate) = super::overview::counts(state).await?;
    // Every queue with settings or a serving node, and every queue holding a live job (from
    // the counts the overview reads): one whose workers are down can be paused here too.
    let mut known: std::collections::BTreeSet<String> =
        state.client.known_queues().await?.into_iter().collect();
    known.extend(
        counts
            .iter()
            .filter(|(_, c)| c.values().any(|n| *n > 0))
            .map(|(q, _)| q.clone()),
    );
    let running: BTreeMap<String, u64> = counts
        .into_iter()
        .map(|(q, c)| (q, c.get(&JobState::Running).copied().unwrap_or(0)))
        .collect();
    let body = html! {
        @if let Some(label) = &estimate { p.estimate #estimate { (label) } }
        table #queue-table {
            thead { tr { th { "queue" } th { "paused" } th { "limits" } th.num { "running" } th { "settings" } } }
            tbody {
                @for q in &known {
                    @let s = settings.iter().find(|s| &s.name == q);
                    @let limits = s.map(|s| s.limits).unwrap_or_default();
                    @let paused = s.is_some_and(|s| s.is_paused());
                    tr data-queue=(q) {
                        td { (q) }
                        td.paused { @if let Some(s) = s.filter(|s| s.is_paused()) {
                            "paused " (s.paused_at.map(|t| age(now, t)).unwrap_or_default())
                            @if let Some(by) = &s.paused_by { " by " (by) }
                        } @else { "no" } }
                        td { (limits_text(&limits)) }
                        td.num { (running.get(q).copied().unwrap_or(0))
                            @if let Some(c) = limits.concurrency { " / " (c) } }
                        td { @if ctx.can_act() { (queue_form(state, ctx, q, paused, &limits)) } }
                    }
                }
            }
        }
        p.note { "Limits: blank lifts one. Rate: jobs per period (e.g. 10 per 1s, 500ms, 2m)." }
    };
    Ok(shell(
        state,
        req,
        ctx,
        "Queues",
        false,
        StatusCode::OK,
        body,
    ))
}
