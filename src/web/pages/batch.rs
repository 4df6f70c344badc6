//! A batch (or any job waiting for others): its callback — the job that runs once every
//! member has ended — with its state, and its members, counted by how they ended and listed
//! (those still running or failed first, at most 500), each linking to its job. Live while
//! the callback has not ended (re-read every few seconds and on the change signal).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use maud::html;

use super::super::auth::authorize;
use super::super::layout::{shell_with, Watch};
use super::super::{error_response, Data};
use super::job::{links, parse_id};
use super::state_class;
use crate::error::Error;
use crate::job::JobState;

/// Members listed, at most.
const SHOWN: usize = 500;

/// Where a member's state sorts: those still to end and those that failed first.
fn rank(s: Option<JobState>) -> u8 {
    match s {
        Some(JobState::Running) => 0,
        Some(JobState::Dead) => 1,
        Some(JobState::Cancelled) => 2,
        Some(JobState::Retrying) => 3,
        Some(JobState::Pending | JobState::Waiting) => 4,
        Some(JobState::Succeeded) => 6,
        _ => 5,
    }
}

pub(crate) async fn page(state: Data, req: HttpRequest, path: web::Path<String>) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let out = async {
        let id = parse_id(&path)?;
        let callback = state.client.get(id).await?;
        let mut deps = state.client.dependencies(id).await?;
        let o = deps.outcomes();
        let total = deps.parents.len();
        deps.parents.sort_by_key(|l| (rank(l.state), l.id.0));
        let shown = &deps.parents[..total.min(SHOWN)];
        let ended = o.succeeded + o.dead + o.cancelled;
        let body = html! {
            dl.fields #batch-fields {
                dt { "callback" } dd { a #batch-callback href=(state.url(&format!("/jobs/{}", id.0))) { "job " (id.0) } " · " (callback.kind) }
                dt { "callback state" } dd #callback-state class=(state_class(callback.state)) { (callback.state) }
                dt { "members" } dd #batch-total { (total) }
                dt { "ended" } dd #batch-ended { (ended) " of " (total) }
                dt { "succeeded" } dd #batch-succeeded.state-succeeded { (o.succeeded) }
                dt { "dead" } dd #batch-dead.state-dead { (o.dead) }
                dt { "cancelled" } dd #batch-cancelled.state-cancelled { (o.cancelled) }
                dt { "not ended" } dd #batch-unfinished { (o.unfinished) }
            }
            @if total == 0 {
                p.muted #no-members { "Job " (id.0) " waits for no other job: it is not a batch's callback." }
            } @else {
                h2 { "Members" }
                @if total > SHOWN { p.note { "The first " (SHOWN) " of " (total) " (those running or failed first)." } }
                (links(&state, "batch-members", shown))
            }
        };
        // Members' ends move no signal: the page re-reads every few seconds while live.
        let events = (!callback.state.is_terminal()).then(|| Watch::Signal.url(&state));
        Ok::<_, Error>(shell_with(&state, &req, &ctx, &format!("Batch of job {}", id.0), events, StatusCode::OK, body))
    }
    .await;
    out.unwrap_or_else(|e| ctx.finish(&state, &req, error_response(&req, &e)))
}
