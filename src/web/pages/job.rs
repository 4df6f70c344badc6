//! One job: its fields, payload, result and progress (pretty JSON), its claims (who ran each
//! attempt, when, how it ended), the timeline of its attempts with each error, its lease
//! (owner, expiry, heartbeat — never the token), every timestamp; live while it runs; and the
//! actions its state allows, each carrying the version shown so that a stale page cannot act
//! on a job that moved on.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::{authorize, csrf_field, Ctx};
use super::super::layout::{age, json, shell_with, ts, ts_opt, Watch};
use super::super::{error_response, Data};
use super::state_class;
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};

/// A job id from the path.
///
/// # Errors
/// [`Error::InvalidInput`] naming `id`.
pub(crate) fn parse_id(s: &str) -> Result<JobId> {
    s.parse::<i64>().map(JobId).map_err(|_| {
        Error::invalid(
            "id",
            format!("{s:?} is not a job id; expected a whole number"),
        )
    })
}

pub(crate) async fn page(state: Data, req: HttpRequest, path: web::Path<String>) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let out = async {
        let id = parse_id(&path)?;
        let job = state.client.get(id).await?;
        let story = Story {
            deps: state.client.dependencies(id).await?,
            effects: state.client.effects(id).await?,
            claims: state.client.claims(id).await?,
        };
        Ok::<_, Error>(render(&state, &req, &ctx, &job, &story))
    }
    .await;
    match out {
        Ok(r) => r,
        Err(e) => ctx.finish(&state, &req, error_response(&req, &e)),
    }
}

/// The buttons for what `job`'s state allows.
pub(crate) fn actions(state: &Data, ctx: &Ctx, job: &Job) -> maud::Markup {
    let act = |name: &str, label: &str, class: &str| {
        html! {
            form.inline method="post" action=(state.url(&format!("/jobs/{}/{name}", job.id.0))) {
                (csrf_field(ctx))
                input type="hidden" name="version" value=(job.version);
                button class=(class) id=(format!("{name}-job")) type="submit" { (label) }
            }
        }
    };
    let live = job.archived_at.is_none();
    html! {
        @if ctx.can_act() && live {
            div.actions #job-actions {
                @if matches!(job.state, JobState::Dead | JobState::Cancelled) { (act("retry", "Retry now", "primary")) }
                @if job.state == JobState::Retrying || (job.state == JobState::Pending && job.run_at > chrono::Utc::now()) {
                    (act("run_now", "Run now", "primary"))
                }
                @if !job.state.is_terminal() { (act("cancel", "Cancel", "danger")) }
                @if job.state.is_terminal() { (act("delete", "Delete", "danger")) }
            }
        }
    }
}

/// What happened around a job besides its own row: the jobs it waits for and that wait for
/// it (a batch's members are its callback's parents), and the effects its transactions
/// recorded, and its execution ledger: each claim of it — claim id, node, start, end,
/// outcome.
struct Story {
    deps: crate::Dependencies,
    effects: Vec<crate::Effect>,
    claims: Vec<crate::Claim>,
}

/// The execution ledger: one row per claim, oldest first, with the error its end recorded
/// (the job's error entry of that claim, or of its attempt and code when the entry names no
/// claim).
fn claims(job: &Job, claims: &[crate::Claim]) -> maud::Markup {
    html! {
        h2 { "Claims" }
        @if claims.is_empty() { p.muted #no-claims { "Never claimed." } }
        @else {
            table #claims {
                thead { tr { th { "claim" } th { "attempt" } th { "node" } th { "claimed" } th { "started" }
                    th { "ended" } th { "duration" } th { "outcome" } th { "error" } } }
                tbody {
                    @for c in claims {
                        @let error = job.errors.iter().rev().find(|e| match e.claim {
                            Some(claim) => claim == c.claim,
                            // An entry that names no claim: the one of this attempt and code.
                            None => e.attempt == c.attempt && c.code.as_deref() == Some(e.code.as_str()),
                        });
                        tr {
                            td { code { (c.claim) } }
                            td { (c.attempt) }
                            td.claim-node { (c.node) }
                            td { (ts(c.claimed_at)) }
                            td { (ts_opt(c.started_at)) }
                            td { (ts_opt(c.ended_at)) }
                            td { @if let Some(d) = c.duration() { (super::super::layout::duration_text(d)) } @else { "—" } }
                            td.claim-outcome { (c.outcome) }
                            td { @match (error, &c.code) {
                                (Some(e), _) => { code.error-code { (e.code) } ": " (e.message) },
                                (None, Some(code)) => code.error-code { (code) },
                                (None, None) => "—",
                            } }
                        }
                    }
                }
            }
        }
    }
}

/// A list of linked jobs: id, state, the child's policy for a failed parent, settled.
pub(crate) fn links(state: &Data, id: &str, links: &[crate::dependency::Link]) -> maud::Markup {
    html! {
        table id=(id) {
            thead { tr { th { "job" } th { "state" } th { "if a parent fails" } th { "settled" } } }
            tbody {
                @for l in links {
                    tr {
                        td { a href=(state.url(&format!("/jobs/{}", l.id.0))) { (l.id.0) } }
                        td { @match l.state {
                            Some(s) => span class=(state_class(s)) { (s) },
                            None => span.muted { "gone (pruned)" },
                        } }
                        td { (match l.policy {
                            crate::ParentPolicy::Cancel => "the child is cancelled",
                            crate::ParentPolicy::Run => "the child runs anyway",
                            _ => "the child waits",
                        }) }
                        td { (if l.settled { "yes" } else { "not yet" }) }
                    }
                }
            }
        }
    }
}

fn render(state: &Data, req: &HttpRequest, ctx: &Ctx, job: &Job, story: &Story) -> HttpResponse {
    let now = Utc::now();
    let title = format!("Job {}", job.id.0);
    let body = html! {
        (actions(state, ctx, job))
        dl.fields #job-fields {
            dt { "state" } dd #job-state class=(state_class(job.state)) { (job.state)
                @if job.cancel_requested_at.is_some() && !job.state.is_terminal() { " (cancel requested)" } }
            dt { "kind" } dd #job-kind { (job.kind) }
            dt { "queue" } dd { (job.queue) }
            dt { "priority" } dd { (job.priority) }
            dt { "partition" } dd { (job.partition.as_deref().unwrap_or("—")) }
            dt { "unique key" } dd { (job.unique_key.as_deref().unwrap_or("—"))
                @if job.unique_held { " (held)" } }
            dt { "sequence" } dd #job-sequence { (job.sequence.as_deref().unwrap_or("—")) }
            dt { "start by" } dd #job-start-by { @if let Some(t) = job.start_by { (ts(t)) " (" (age(now, t)) ")" } @else { "—" } }
            dt { "attempts" } dd { (job.attempts) " of " (job.max_attempts)
                @if job.refunds > 0 { " (" (job.refunds) " given back)" } }
            dt { "run at" } dd { (ts(job.run_at)) " (" (age(now, job.run_at)) ")" }
            dt { "timeout" } dd { (super::super::layout::duration_text(job.timeout))
                @if let Some(t) = job.timeout_at { ", deadline " (ts(t)) } }
            dt { "lease owner" } dd #lease-owner { @if let Some(l) = &job.lease { (l.owner) } @else { "—" } }
            dt { "lease expires" } dd { @if let Some(l) = &job.lease { (ts(l.expires_at)) " (" (age(now, l.expires_at)) ")" } @else { "—" } }
            dt { "heartbeat" } dd { @if let Some(h) = job.lease.as_ref().and_then(|l| l.heartbeat_at) { (age(now, h)) } @else { "—" } }
            dt { "created" } dd { (ts(job.created_at)) }
            dt { "first started" } dd { (ts_opt(job.first_started_at)) }
            dt { "started" } dd { (ts_opt(job.started_at)) }
            dt { "updated" } dd { (ts(job.updated_at)) }
            dt { "finished" } dd { (ts_opt(job.finished_at)) }
            dt { "archived" } dd { (ts_opt(job.archived_at)) }
            dt { "cancel requested" } dd { (ts_opt(job.cancel_requested_at)) }
            dt { "version" } dd { (job.version) }
        }
        h2 { "Payload" }
        pre #payload { (json(&job.payload)) }
        @if let Some(r) = &job.result { h2 { "Result" } pre #result { (json(r)) } }
        @if let Some(p) = &job.progress { h2 { "Progress" } pre #progress { (json(p)) } }
        @if !story.deps.parents.is_empty() {
            h2 { "Waits for (parents)" }
            p.note { (story.deps.parents.len()) " parent(s)" @if story.deps.parents.len() > 1 { " — a batch, when this job is its callback" }
                " · " a #batch-view href=(state.url(&format!("/batches/{}", job.id.0))) { "Batch view" } }
            (links(state, "parents", &story.deps.parents))
        }
        @if !story.deps.children.is_empty() {
            h2 { "Waited for by (children)" }
            p.note { "Each child's batch view: "
                @for (i, c) in story.deps.children.iter().take(20).enumerate() {
                    @if i > 0 { ", " }
                    a.batch-of href=(state.url(&format!("/batches/{}", c.id.0))) { "batch of " (c.id.0) }
                } }
            (links(state, "children", &story.deps.children))
        }
        h2 { "Effects" }
        @if story.effects.is_empty() { p.muted #no-effects { "No effects recorded in this job's transactions." } }
        @else {
            table #effects {
                thead { tr { th { "key" } th { "detail" } th { "claim" } th { "recorded" } } }
                tbody {
                    @for e in &story.effects {
                        tr {
                            td { code { (e.key) } }
                            td { @if let Some(d) = &e.detail { pre { (json(d)) } } @else { "—" } }
                            td { code { (e.claim) } }
                            td { (ts(e.recorded_at)) }
                        }
                    }
                }
            }
        }
        (claims(job, &story.claims))
        h2 { "Attempts and errors" }
        @if job.errors.is_empty() { p.muted { "No errors recorded." } }
        ol.timeline #errors {
            @for e in &job.errors {
                li {
                    strong { "attempt " (e.attempt) } " · " (ts_opt(e.at)) " · "
                    code.error-code { (e.code) } ": " span.error-message { (e.message) }
                    @if let Some(d) = &e.detail { pre { (json(d)) } }
                }
            }
        }
    };
    let events = (!job.state.is_terminal()).then(|| Watch::Job(job.id.0, job.version).url(state));
    shell_with(state, req, ctx, &title, events, StatusCode::OK, body)
}
