//! Dead letters: the dead jobs grouped by kind and last error code, newest first, with a
//! retry of a whole group. Grouped from at most [`DEAD_SCAN`] of the newest dead jobs (read
//! a `LIMIT`ed page at a time), and labelled so when there are more.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, csrf_field, Ctx};
use super::super::layout::{age, query, shell};
use super::super::{error_response, Data, State};
use crate::error::Result;
use crate::job::{Job, JobId, JobState};
use crate::store::ListParams;

/// Dead jobs read, at most, to build the groups: **5,000**.
pub(crate) const DEAD_SCAN: usize = 5_000;

/// A group's key: kind and error code (`none` without an error).
pub(crate) fn code_of(j: &Job) -> &str {
    j.last_error
        .as_ref()
        .map(|e| e.code.as_str())
        .unwrap_or("none")
}

/// The newest dead jobs, at most `max`, optionally of one kind; and whether more exist.
pub(crate) async fn dead_jobs(
    state: &State,
    kind: Option<&str>,
    max: usize,
) -> Result<(Vec<Job>, bool)> {
    let mut out = Vec::new();
    let mut after: Option<JobId> = None;
    loop {
        let page = state
            .client
            .list(ListParams {
                state: Some(JobState::Dead),
                kind: kind.map(str::to_string),
                newest_first: true,
                after,
                limit: 1000,
                ..ListParams::default()
            })
            .await?;
        let full = page.len() == 1000;
        after = page.last().map(|j| j.id);
        for j in page {
            if out.len() == max {
                return Ok((out, true));
            }
            out.push(j);
        }
        if !full {
            return Ok((out, false));
        }
    }
}

pub(crate) async fn page(state: Data, req: HttpRequest) -> HttpResponse {
    let ctx = match authorize(&state, &req) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match render(&state, &req, &ctx).await {
        Ok(r) => r,
        Err(e) => ctx.finish(&state, &req, error_response(&e)),
    }
}

async fn render(state: &Data, req: &HttpRequest, ctx: &Ctx) -> Result<HttpResponse> {
    let now = Utc::now();
    let (jobs, more) = dead_jobs(state, None, DEAD_SCAN).await?;
    let mut groups: BTreeMap<(String, String), Vec<&Job>> = BTreeMap::new();
    for j in &jobs {
        groups
            .entry((j.kind.clone(), code_of(j).to_string()))
            .or_default()
            .push(j);
    }
    let body = html! {
        @if more { p.estimate #dead-bounded { "Grouped from the newest " (DEAD_SCAN) " dead jobs; older ones are not counted." } }
        @if groups.is_empty() { p #no-dead { "No dead jobs." } }
        @else {
            table #dead-groups {
                thead { tr { th { "kind" } th { "error code" } th.num { "jobs" } th { "latest message" } th { "newest" } th {} } }
                tbody {
                    @for ((kind, code), js) in &groups {
                        @let newest = js[0];
                        tr {
                            td.kind { a href=(state.url(&format!("/jobs{}", query(&[("kind", kind), ("state", "dead")])))) { (kind) } }
                            td { code { (code) } }
                            td.num { (js.len()) }
                            td.error { @if let Some(e) = &newest.last_error { (e.message) } }
                            td { a href=(state.url(&format!("/jobs/{}", newest.id.0))) { (newest.id.0) } " " span.muted { (age(now, newest.updated_at)) } }
                            td {
                                @if ctx.can_act() {
                                    form.inline method="post" action=(state.url("/dead/retry")) {
                                        (csrf_field(ctx))
                                        input type="hidden" name="kind" value=(kind);
                                        input type="hidden" name="code" value=(code);
                                        input type="hidden" name="expected" value=(js.len());
                                        button.primary type="submit" { "Retry " (js.len()) }
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
