//! The jobs list: filters (queue, kind, state, creation time range, archive), search (by
//! id, unique key, or text in the payload — looked for in at most the search window's
//! newest jobs), keyset paging by id (newest or oldest first) or by (run_at, id); and the
//! bulk actions' entry.
//!
//! Every read is an index walk with a `LIMIT`, bounded as the page says:
//! * **by id**, unfiltered or by unique key: the primary key (or the key's index), exact;
//!   with any other filter, at most [`SCAN_WINDOW`] ids (configurable) from the page's start are looked at
//!   (a rare kind or state would otherwise walk the whole primary key), and a page that
//!   ends short of that window's end says so and links past it. Dead and cancelled jobs have
//!   an index of their own (PostgreSQL, SQLite), which the planner takes for a rare state.
//! * **by run time**: exact for one queue's pending or retrying jobs when they share one
//!   priority (the claim index, `(queue, priority, run_at, id)`, read in order); otherwise
//!   the newest [`SORT_WINDOW`] jobs by id (configurable), sorted, and labelled so.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, Ctx};
use super::super::layout::{query, shell_with, Watch};
use super::super::{error_response, Data};
use super::{find, job_table, Filter, FilterForm, Found, PAGE};
use crate::error::Result;
use crate::job::JobState;
use crate::store::ListParams;

/// Ids a filtered list looks at, at most, per page, by default: **100,000**
/// ([`DashboardConfig::scan_window`](crate::web::DashboardConfig::scan_window)).
pub(crate) const SCAN_WINDOW: i64 = 100_000;
/// Jobs a run-time order sorts when no index gives that order, by default: the newest
/// **10,000** ([`DashboardConfig::sort_window`](crate::web::DashboardConfig::sort_window)).
pub(crate) const SORT_WINDOW: i64 = 10_000;

/// How a page was bounded, for its label.
#[derive(Debug, Default)]
struct Bounds {
    /// The filtered walk stopped at this id (the window's far edge) before the page filled.
    scan_edge: Option<i64>,
    /// The run-time order sorted only the ids from this one on.
    sort_edge: Option<i64>,
    /// The run-time order is exact (the claim index).
    exact_run_at: bool,
}

/// A page of jobs in the filter's order, bounded as the module docs say.
async fn browse(state: &Data, f: &Filter) -> Result<(Found, Bounds)> {
    let mut bounds = Bounds::default();
    let p = ListParams {
        limit: PAGE + 1,
        ..f.params.clone()
    };
    let store = state.client.store();
    let mut b = f.browse;
    if b.by_run_at {
        let mut exact = false;
        if let (Some(q), Some(st @ (JobState::Pending | JobState::Retrying)), false) =
            (&p.queue, p.state, p.archived)
        {
            match store.waiting_priorities(q, st).await? {
                None => {
                    bounds.exact_run_at = true;
                    return Ok((Found::default(), bounds));
                }
                Some((lo, hi)) if lo == hi => {
                    b.priority = Some(lo);
                    exact = true;
                }
                Some(_) => {}
            }
        }
        if !exact {
            b.id_floor = match f.win {
                Some(w) => Some(w),
                None => {
                    store
                        .job_id_edge(p.archived, true, None, state.config.sort_window)
                        .await?
                }
            };
            bounds.sort_edge = b.id_floor;
        }
        bounds.exact_run_at = exact;
    } else if p.unique_key.is_none()
        && (p.queue.is_some()
            || p.kind.is_some()
            || p.state.is_some()
            || p.created_after.is_some()
            || p.created_before.is_some())
    {
        let edge = store
            .job_id_edge(
                p.archived,
                p.newest_first,
                p.after.map(|a| a.0),
                state.config.scan_window,
            )
            .await?;
        if p.newest_first {
            b.id_floor = edge;
        } else {
            b.id_ceiling = edge;
        }
        bounds.scan_edge = edge;
    }
    let mut jobs = store.job_browse(p, b).await?;
    let more = jobs.len() > PAGE as usize;
    jobs.truncate(PAGE as usize);
    if more {
        // The page filled: the window did not cut it short.
        bounds.scan_edge = None;
    }
    Ok((
        Found {
            more,
            jobs,
            ..Found::default()
        },
        bounds,
    ))
}

pub(crate) async fn page(
    state: Data,
    req: HttpRequest,
    form: web::Query<FilterForm>,
) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match render(&state, &req, &ctx, &form).await {
        Ok(r) => r,
        Err(e) => ctx.finish(&state, &req, error_response(&req, &e)),
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
                option value="newest" selected[!["oldest", "run_at_desc", "run_at_asc"].contains(&f.order.as_str())] { "newest first" }
                option value="oldest" selected[f.order == "oldest"] { "oldest first" }
                option value="run_at_asc" selected[f.order == "run_at_asc"] { "run at, earliest first" }
                option value="run_at_desc" selected[f.order == "run_at_desc"] { "run at, latest first" }
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
    let (found, bounds) = if f.id.is_some() || f.text.is_some() {
        let found = find(
            state,
            &f,
            PAGE as usize,
            state.config.search_window as usize,
        )
        .await?;
        (found, Bounds::default())
    } else {
        browse(state, &f).await?
    };
    let next = found.jobs.last().filter(|_| found.more).map(|j| {
        if f.browse.by_run_at {
            format!("{}.{}", j.run_at.timestamp_micros(), j.id.0)
        } else {
            j.id.0.to_string()
        }
    });
    let win = bounds.sort_edge.map(|e| e.to_string()).unwrap_or_default();
    let further = bounds.scan_edge.map(|e| e.to_string());
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
        @if f.browse.by_run_at {
            @if bounds.exact_run_at {
                p.note #run-at-exact { "Exact run-time order: this queue's " (f.params.state.map_or("", JobState::as_str)) " jobs, read in order from the claim index." }
            } @else if let Some(edge) = bounds.sort_edge {
                p.estimate #run-at-window {
                    "Run-time order of the newest " (state.config.sort_window) " jobs only (ids from " (edge) "); "
                    "it is exact for one queue's pending or retrying jobs (filter by queue and state)."
                }
            }
        }
        @if let Some(edge) = &further {
            p.estimate #scan-window {
                "Looked at " (state.config.scan_window) " jobs by id, to id " (edge) ", for this filter; older ones were not. "
                a #look-further href=(state.url(&format!("/jobs{}", query(&[form.pairs(), vec![("after", edge.as_str())]].concat())))) { "Look further →" }
            }
        }
        @if let Some(after) = &next {
            p.pager { a #next-page href=(state.url(&format!("/jobs{}", query(&{ pairs.push(("after", after)); if !win.is_empty() { pairs.push(("win", &win)); } pairs.clone() })))) { "Next page →" } }
        }
        @if ctx.can_act() && !f.params.archived {
            div.actions #bulk {
                a href=(state.url(&format!("/jobs/bulk{}", query(&[form.pairs(), vec![("action", "retry")]].concat())))) { "Retry all matching…" }
                a href=(state.url(&format!("/jobs/bulk{}", query(&[form.pairs(), vec![("action", "cancel")]].concat())))) { "Cancel all matching…" }
            }
        }
    };
    // A live list follows the changing jobs it shows (and the signal, for new ones).
    let changing: Vec<(i64, i64)> = found
        .jobs
        .iter()
        .filter(|j| !j.state.is_terminal())
        .map(|j| (j.id.0, j.version))
        .collect();
    let events = live.then(|| Watch::Jobs(&changing).url(state));
    Ok(shell_with(
        state,
        req,
        ctx,
        "Jobs",
        events,
        StatusCode::OK,
        body,
    ))
}
