//! The jobs list: filters (queue, kind, state, creation time range, archive), search (by
//! id, unique key, or text in the payload — looked for in at most the search window's
//! newest jobs), keyset paging by id, newest or oldest first; and the bulk actions' entry.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, Ctx};
use super::super::layout::{query, shell};
use super::super::{error_response, Data};
use super::{find, job_table, FilterForm, PAGE};
use crate::error::Result;
use crate::job::JobState;

pub(crate) async fn page(
    state: Data,
    req: HttpRequest,
    form: web::Query<FilterForm>,
) -> HttpResponse {
    let ctx = match authorize(&state, &req) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match render(&state, &req, &ctx, &form).await {
        Ok(r) => r,
        Err(e) => ctx.finish(&state, &req, error_response(&e)),
    }
}

/// The filter form.
pub(crate) fn filter_form(state: &Data, f: &FilterForm) -> maud::Markup {
    html! {
        form.filters #filters method="get" action=(state.url("/jobs")) {
            label { "queue" input name="queue" value=(f.queue); }
            label { "kind" input name="kind" value=(f.kind); }
            label { "state" select name="state" {
                option value="" { "any" }
                @for s in JobState::ALL { option value=(s.as_str()) selected[f.state == s.as_str()] { (s) } }
            } }
            label { "created from (UTC)" input name="from" placeholder="2026-11-27T10:00" value=(f.from); }
            label { "to" input name="to" placeholder="2026-11-27T12:00" value=(f.to); }
            label { "id" input name="id" size="8" value=(f.id); }
            label { "unique key" input name="key" value=(f.key); }
            label { "text in payload" input name="text" value=(f.text); }
            label { "order" select name="order" {
                option value="newest" selected[f.order != "oldest"] { "newest first" }
                option value="oldest" selected[f.order == "oldest"] { "oldest first" }
            } }
            label { "table" select name="archived" {
                option value="" { "live" }
                option value="1" selected[f.archived == "1"] { "archive" }
            } }
            button.primary #apply type="submit" { "Filter" }
        }
    }
}

async fn render(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    form: &FilterForm,
) -> Result<HttpResponse> {
    let now = Utc::now();
    let f = form.parse()?;
    let found = find(
        state,
        &f,
        PAGE as usize,
        state.config.search_window as usize,
    )
    .await?;
    let next = found
        .jobs
        .last()
        .filter(|_| found.more)
        .map(|j| j.id.0.to_string());
    let mut pairs = form.pairs();
    let live = found.jobs.iter().any(|j| !j.state.is_terminal()) && f.params.after.is_none();
    let body = html! {
        (filter_form(state, form))
        @if f.text.is_some() {
            p.note #search-window {
                "Payload search looked at " (found.scanned) " jobs"
                @if found.window_ended { " (its window of " (state.config.search_window) " newest matching jobs ended; narrow the filters to search further)" }
                "."
            }
        }
        @if found.jobs.is_empty() { p #no-jobs { "No jobs match." } }
        @else { (job_table(state, &found.jobs, now)) }
        @if let Some(after) = &next {
            p.pager { a #next-page href=(state.url(&format!("/jobs{}", query(&{ pairs.push(("after", after)); pairs.clone() })))) { "Next page →" } }
        }
        @if ctx.can_act() && !f.params.archived {
            div.actions #bulk {
                a href=(state.url(&format!("/jobs/bulk{}", query(&[form.pairs(), vec![("action", "retry")]].concat())))) { "Retry all matching…" }
                a href=(state.url(&format!("/jobs/bulk{}", query(&[form.pairs(), vec![("action", "cancel")]].concat())))) { "Cancel all matching…" }
            }
        }
    };
    Ok(shell(state, req, ctx, "Jobs", live, StatusCode::OK, body))
}
