//! Schedules: each stored schedule's spec, zone, next fire, its [`RECENT_FIRES`] most recent
//! fires (each linking to its job, live or archived — read from the unique-key indexes, the
//! fires' jobs being keyed by schedule and instant), missed-fire policy, paused or retired;
//! pause, resume, trigger now; a schedule added at run time can be removed, and one added
//! (a form under the table).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, csrf_field, Ctx};
use super::super::layout::{age, shell, ts_opt};
use super::super::{error_response, Data};
use crate::error::Result;
use crate::job::Job;
use crate::schedule::ScheduleOrigin;

/// Fires shown per schedule: the **5** most recent.
pub(crate) const RECENT_FIRES: i64 = 5;

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
    let schedules = state.client.schedules().await?;
    let mut fires: Vec<Vec<Job>> = Vec::with_capacity(schedules.len());
    for s in &schedules {
        fires.push(
            state
                .client
                .store()
                .schedule_fires(&s.kind, &s.name, RECENT_FIRES)
                .await?,
        );
    }
    let button = |name: &str, action: &str, label: &str| {
        html! {
            form.inline method="post" action=(state.url(&format!("/schedules/{action}"))) {
                (csrf_field(ctx))
                input type="hidden" name="name" value=(name);
                button type="submit" { (label) }
            }
        }
    };
    let body = html! {
        @if schedules.is_empty() { p { "No schedules are stored (a node declares them at start)." } }
        table #schedule-table {
            thead { tr { th { "name" } th { "spec" } th { "kind / queue" } th { "next fire" } th { "recent fires" } th { "missed fires" } th { "status" } th {} } }
            tbody {
                @for (s, fs) in schedules.iter().zip(&fires) {
                    tr {
                        td { (s.name) @if s.origin == ScheduleOrigin::Runtime { " " span.muted { "(run time)" } }
                            @if let Some(t) = s.shadowed_at { br; span.shadowed title="a node declares a schedule of this name in code; it is not stored while this one holds the name: remove this one, or rename the one in code" { "shadows the one in code (declared " (age(now, t)) ")" } } }
                        td { code { (s.spec_text()) } " " span.muted { (s.time_zone) } }
                        td { (s.kind) " / " (s.queue) }
                        td { (ts_opt(s.next_fire_at)) @if let Some(t) = s.next_fire_at { " (" (age(now, t)) ")" } }
                        td.fires {
                            @if fs.is_empty() {
                                @if let Some(t) = s.last_fire_at { (ts_opt(Some(t))) " " span.muted { "(its job is gone)" } } @else { "—" }
                            }
                            ol.fires {
                                @for j in fs {
                                    li {
                                        a href=(state.url(&format!("/jobs/{}", j.id.0))) { (ts_opt(Some(crate::store::fire_instant(j)))) }
                                        " " span class=(super::state_class(j.state)) { (j.state) }
                                        @if j.archived_at.is_some() { " " span.muted { "archived" } }
                                    }
                                }
                            }
                        }
                        td { (super::super::layout::missed_text(s.missed)) }
                        td {
                            @if s.retired_at.is_some() { "retired" }
                            @else if s.paused_at.is_some() { "paused" }
                            @else { "active" }
                        }
                        td {
                            @if ctx.can_act() && s.retired_at.is_none() {
                                @if s.paused_at.is_some() { (button(&s.name, "resume", "Resume")) }
                                @else { (button(&s.name, "pause", "Pause")) }
                                (button(&s.name, "trigger", "Trigger now"))
                            }
                            @if ctx.can_act() && s.origin == ScheduleOrigin::Runtime {
                                (button(&s.name, "remove", "Remove"))
                            }
                        }
                    }
                }
            }
        }
        @if ctx.can_act() {
            h2 { "Add a schedule" }
            p.muted { "Stored in the database and fired by the leader, like one declared in code; no deploy changes or retires it." }
            form #schedule-add method="post" action=(state.url("/schedules/add")) {
                (csrf_field(ctx))
                label { "name " input name="name" required; } " "
                label { "cron " input name="cron" placeholder="0 9 * * 1-5"; } " "
                label { "or every " input name="every" placeholder="15m" size="6"; } " "
                label { "zone " input name="zone" placeholder="UTC" size="14"; } " "
                label { "kind " input name="kind" required; } " "
                label { "queue " input name="queue" placeholder="default" size="10"; } " "
                label { "payload " input name="payload" placeholder="{}"; } " "
                label { "missed fires " select name="missed" { option value="latest" { "latest" } option value="skip" { "skip" } } } " "
                button type="submit" { "Add" }
            }
        }
    };
    Ok(shell(
        state,
        req,
        ctx,
        "Schedules",
        false,
        StatusCode::OK,
        body,
    ))
}
