//! Dead letters: the dead jobs grouped by kind and last error code in SQL (`GROUP BY`),
//! most jobs first, with a retry of a whole group. Exact while at most [`DEAD_EXACT`] jobs
//! are dead (one `LIMIT`ed probe tells); above, grouped from the newest
//! [`sort_window`](crate::web::DashboardConfig::sort_window) dead jobs and labelled so. On PostgreSQL and SQLite the partial index on dead and
//! cancelled jobs serves both the probe and the grouping (a walk in group order, no sort).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, csrf_field, Ctx};
use super::super::layout::{age, query, shell};
use super::super::{error_response, Data};
use crate::error::Result;
use crate::store::MAX_DEAD_GROUPS;

/// Dead jobs grouped exactly, at most, by default: **10,000** (the grouping reads each dead
/// job's error from the table: 50,000 took 290 ms on PostgreSQL)
/// ([`DashboardConfig::dead_exact_limit`](crate::web::DashboardConfig::dead_exact_limit)).
pub(crate) const DEAD_EXACT: i64 = 10_000;

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
    let store = state.client.store();
    let bounded = store.dead_more_than(state.config.dead_exact_limit).await?;
    let from = if bounded {
        store.dead_edge(state.config.sort_window).await?
    } else {
        None
    };
    let groups = store.dead_groups(from).await?;
    let newest: Vec<i64> = groups.iter().map(|g| g.newest).collect();
    let mut messages = std::collections::HashMap::new();
    for j in store.jobs_by_ids(&newest).await? {
        messages.insert(j.id.0, j);
    }
    let cut = groups.len() as i64 >= MAX_DEAD_GROUPS;
    let body = html! {
        @if bounded { p.estimate #dead-bounded { "Over " (state.config.dead_exact_limit) " jobs are dead: grouped from the newest " (state.config.sort_window) " only; older ones are not counted." } }
        @else { p.note #dead-exact { "Every dead job, grouped exactly." } }
        @if cut { p.estimate #dead-cut { "The first " (MAX_DEAD_GROUPS) " groups only." } }
        @if groups.is_empty() { p #no-dead { "No dead jobs." } }
        @else {
            table #dead-groups {
                thead { tr { th { "kind" } th { "error code" } th.num { "jobs" } th { "latest message" } th { "newest" } th {} } }
                tbody {
                    @for g in &groups {
                        @let code = g.code.as_deref().unwrap_or("none");
                        @let newest = messages.get(&g.newest);
                        tr {
                            td.kind { a href=(state.url(&format!("/jobs{}", query(&[("kind", g.kind.as_str()), ("state", "dead")])))) { (g.kind) } }
                            td { code { (code) } }
                            td.num { (g.count) }
                            td.error { @if let Some(e) = newest.and_then(|j| j.last_error.as_ref()) { (e.message) } }
                            td { a href=(state.url(&format!("/jobs/{}", g.newest))) { (g.newest) } @if let Some(j) = newest { " " span.muted { (age(now, j.updated_at)) } } }
                            td {
                                @if ctx.can_act() {
                                    form.inline method="post" action=(state.url("/dead/retry")) {
                                        (csrf_field(ctx))
                                        input type="hidden" name="kind" value=(g.kind);
                                        input type="hidden" name="code" value=(code);
                                        input type="hidden" name="expected" value=(g.count);
                                        button.primary type="submit" { "Retry " (g.count) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(shell(
        state,
        req,
        ctx,
        "Dead letters",
        false,
        StatusCode::OK,
        body,
    ))
}
