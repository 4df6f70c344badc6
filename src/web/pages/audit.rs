//! The audit log: every operator action (the dashboard's and the command's bulk actions),
//! newest first, 50 to a page, each with who, what, the target (a job, a queue, a bulk
//! action's filter), how many jobs it changed, when and what came of it. Also where an
//! action handler records what it did ([`record`]).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;
use serde::Deserialize;

use super::super::auth::{authorize, Ctx};
use super::super::layout::{age, query, shell, ts};
use super::super::{error_response, Data};
use crate::error::Error;
use crate::store::AuditAction;

/// Entries per page.
const PAGE: u32 = 50;

/// Records what an action did: `action` (`job.retry`, `bulk.cancel`, …) on `target`, by the
/// request's [`Ctx::who`], `jobs` changed, `outcome` in words. A failure to record is
/// logged at WARN (the action itself already happened, and its answer is still given).
pub(crate) async fn record(
    state: &Data,
    ctx: &Ctx,
    action: &str,
    target: &str,
    jobs: u64,
    outcome: &str,
    ok: bool,
) {
    let a = AuditAction::new(ctx.who.as_str(), action, target)
        .jobs(jobs)
        .outcome(outcome, ok);
    if let Err(e) = state.client.record_action(&a).await {
        tracing::warn!(error = %e, action, "dashboard: an action was not recorded in the audit log");
    }
}

/// What a failed action is recorded as: the error a user may read, or a general line for a
/// database failure (its details are in the server's log).
pub(crate) fn failure_text(e: &Error) -> String {
    match e {
        Error::NotFound { .. }
        | Error::InvalidInput { .. }
        | Error::Config { .. }
        | Error::InvalidTransition { .. }
        | Error::Refused { .. } => e.to_string(),
        _ => "failed: the database did not answer as expected".to_string(),
    }
}

/// The page's query: the last id of the previous page.
#[derive(Debug, Deserialize)]
pub(crate) struct AuditQuery {
    before: Option<i64>,
}

pub(crate) async fn page(state: Data, req: HttpRequest, q: web::Query<AuditQuery>) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let entries = match state.client.audit(q.before, PAGE).await {
        Ok(e) => e,
        Err(e) => return ctx.finish(&state, &req, error_response(&req, &e)),
    };
    let now = Utc::now();
    let next = entries
        .last()
        .filter(|_| entries.len() == PAGE as usize)
        .map(|e| e.id.to_string());
    let body = html! {
        p.note { "Every action taken from this dashboard or by the command's bulk actions, newest first; kept as long as archived jobs." }
        @if entries.is_empty() {
            p.muted #no-audit { "No actions recorded" @if q.before.is_some() { " before this page" } "." }
        } @else {
            table #audit {
                thead { tr { th { "when" } th { "who" } th { "action" } th { "target" } th { "jobs" } th { "outcome" } } }
                tbody {
                    @for e in &entries {
                        tr.audit-row {
                            td title=(ts(e.at)) { (age(now, e.at)) }
                            td.who { (e.who) }
                            td.action { code { (e.action) } }
                            td.target { (e.target) }
                            td.count { (e.jobs) }
                            td.outcome class=(if e.ok { "state-succeeded" } else { "state-dead" }) { (e.outcome) }
                        }
                    }
                }
            }
        }
        @if let Some(before) = &next {
            p { a #audit-older href=(state.url(&format!("/audit{}", query(&[("before", before)])))) { "Older →" } }
        }
    };
    shell(&state, &req, &ctx, "Audit log", false, StatusCode::OK, body)
}
