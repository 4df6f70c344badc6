//! Every action (all POST, each authenticated, allowed to act and carrying the page's CSRF
//! token): retry, run now (a job scheduled for later or waiting to retry), cancel and
//! delete a job; bulk retry or cancel by the jobs filter (after a
//! preview with a count and a confirmation); retry a dead-letter group; pause, resume and
//! limit a queue; pause, resume and trigger a schedule; add and remove a run-time schedule.
//!
//! A job action carries the version its page showed: a job that changed since (retried by
//! someone else, finished, reclaimed) is left alone and the answer says so (409). A bulk
//! action's preview pins the jobs it counted (each id with its version, in the confirmation
//! form): the confirmation acts on exactly those, each guarded by its pinned version, and
//! says how many changed and how many were skipped as moved on; jobs that came to match the
//! filter after the preview are not touched.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use maud::{html, Markup};
use serde::Deserialize;

use super::auth::{authorize, authorize_action, csrf_field, Ctx};
use super::layout::{flash, query, shell};
use super::pages::audit::{failure_text, record};
use super::pages::job::parse_id;
use super::pages::{find, job_table, FilterForm};
use super::{error_response, Data, BULK_LIMIT};
use crate::error::{Error, Result};
use crate::job::{Job, JobState};
use crate::store::{CancelOutcome, Guarded, QueueLimits, RateLimit, RetryParams};

/// An action's answer: a page with what happened and a link back.
fn done(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    status: StatusCode,
    text: &str,
    back: &str,
) -> HttpResponse {
    let body = html! {
        (flash(status.is_success(), text))
        p { a #back href=(back) { "Back" } }
    };
    let title = if status.is_success() {
        "Done"
    } else {
        "Refused"
    };
    shell(state, req, ctx, title, false, status, body)
}

/// How an action's work ended, before it is recorded and answered.
enum Answer {
    /// It acted (or was refused by the engine): recorded in the audit log with `jobs` changed,
    /// then answered with [`done`].
    Done {
        status: StatusCode,
        text: String,
        jobs: u64,
        back: String,
    },
    /// It asks first (a confirmation page): nothing happened yet, so nothing is recorded.
    Ask(HttpResponse),
}

impl Answer {
    /// Acted with `status`; `jobs` changed.
    fn done(status: StatusCode, text: String, jobs: u64, back: String) -> Result<Answer> {
        Ok(Answer::Done {
            status,
            text,
            jobs,
            back,
        })
    }
}

/// Every action ends here, so none can answer without its audit entry: the outcome (or the
/// error, with nothing changed) is recorded as `what` on `target`, then answered.
async fn conclude(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    what: &str,
    target: &str,
    out: Result<Answer>,
) -> HttpResponse {
    match out {
        Ok(Answer::Done {
            status,
            text,
            jobs,
            back,
        }) => {
            let ok = status.is_success();
            record(state, ctx, what, target, jobs, &text, ok).await;
            done(state, req, ctx, status, &text, &back)
        }
        Ok(Answer::Ask(page)) => page,
        Err(e) => {
            record(state, ctx, what, target, 0, &failure_text(&e), false).await;
            ctx.finish(state, req, error_response(req, &e))
        }
    }
}

/// A job action's form.
#[derive(Debug, Deserialize)]
pub(crate) struct JobForm {
    csrf: Option<String>,
    version: Option<String>,
    /// `yes` once the confirmation page was answered (delete asks first).
    #[serde(default)]
    confirm: String,
}

/// A page asking to confirm `question`: the same form again with `confirm=yes`, or back.
#[allow(clippy::too_many_arguments)] // each is one part of the page; a struct would only name them again
fn confirm_page(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    question: &str,
    action: &str,
    fields: &[(&str, &str)],
    button: &str,
    back: &str,
) -> HttpResponse {
    let body = html! {
        p #confirm-question { (question) }
        form method="post" action=(action) {
            (csrf_field(ctx))
            @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
            input type="hidden" name="confirm" value="yes";
            button.danger #confirm type="submit" { (button) }
            " " a href=(back) { "No, go back" }
        }
    };
    shell(state, req, ctx, "Confirm", false, StatusCode::OK, body)
}

fn stale(job: &Job) -> String {
    format!(
        "job {} changed since this page was loaded (it is now {}, version {}); nothing was done — \
         look at it again and decide",
        job.id.0, job.state, job.version
    )
}

pub(crate) async fn job(
    state: Data,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<JobForm>,
) -> HttpResponse {
    let ctx = match authorize_action(&state, &req, form.csrf.as_deref()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (id, action) = path.into_inner();
    let what = format!("job.{action}");
    let target = format!("job {id}");
    let out = async {
        let id = parse_id(&id)?;
        let version: i64 = form
            .version
            .as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|_| Error::invalid("version", "the job's version, a whole number, is expected (from the job's page)"))?;
        let back = state.url(&format!("/jobs/{}", id.0));
        let (status, text) = match action.as_str() {
            "retry" => {
                let r = state
                    .client
                    .store()
                    .job_retry(RetryParams { id, expected_version: Some(version), now: None })
                    .await;
                match r {
                    Ok(Guarded::Applied(j)) => {
                        state.client.wake(&j.queue);
                        (StatusCode::OK, format!("job {} retried: pending, due now", id.0))
                    }
                    // Moved on: retried elsewhere (no longer retryable) or changed.
                    Ok(Guarded::Stale | Guarded::LeaseLost) | Err(Error::InvalidTransition { .. }) => {
                        (StatusCode::CONFLICT, stale(&state.client.get(id).await?))
                    }
                    Err(e) => return Err(e),
                }
            }
            "run_now" => {
                let r = state
                    .client
                    .store()
                    .job_run_now(RetryParams { id, expected_version: Some(version), now: None })
                    .await;
                match r {
                    Ok(Guarded::Applied(j)) => {
                        state.client.wake(&j.queue);
                        (StatusCode::OK, format!("job {} is due now", id.0))
                    }
                    Ok(Guarded::Stale | Guarded::LeaseLost) | Err(Error::InvalidTransition { .. }) => {
                        (StatusCode::CONFLICT, stale(&state.client.get(id).await?))
                    }
                    Err(e) => return Err(e),
                }
            }
            // Guarded by the version the page showed, in the write itself.
            "cancel" => match state.client.cancel_at_version(id, version).await? {
                Ok(CancelOutcome::Cancelled(_)) => (StatusCode::OK, format!("job {} cancelled", id.0)),
                Ok(CancelOutcome::Requested(_)) => (
                    StatusCode::OK,
                    format!("job {} is running: cancel requested, its node is told at once and stops its handler", id.0),
                ),
                Ok(CancelOutcome::AlreadyFinished(j)) | Err(j) => (StatusCode::CONFLICT, stale(&j)),
            },
            "delete" => {
                let j = state.client.get(id).await?;
                if j.version != version {
                    (StatusCode::CONFLICT, stale(&j))
                } else if form.confirm != "yes" && j.state.is_terminal() {
                    let v = version.to_string();
                    return Ok(Answer::Ask(confirm_page(
                        &state,
                        &req,
                        &ctx,
                        &format!("Delete job {} ({}, {})? Its row and history go; this cannot be undone.", id.0, j.kind, j.state),
                        &state.url(&format!("/jobs/{}/delete", id.0)),
                        &[("version", &v)],
                        "Yes, delete it",
                        &back,
                    )));
                } else {
                    match state.client.store().job_delete_finished(id, version).await {
                        Ok(Guarded::Applied(())) => (StatusCode::OK, format!("job {} deleted", id.0)),
                        Ok(Guarded::Stale | Guarded::LeaseLost)
                        | Err(Error::InvalidTransition { .. }) => {
                            (StatusCode::CONFLICT, stale(&state.client.get(id).await?))
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            other => {
                return Err(Error::invalid(
                    "action",
                    format!("{other:?} is not a job action; expected retry, run_now, cancel or delete"),
                ))
            }
        };
        Answer::done(status, text, u64::from(status.is_success()), back)
    }
    .await;
    conclude(&state, &req, &ctx, &what, &target, out).await
}

/// What a bulk action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bulk {
    Retry,
    Cancel,
}

impl Bulk {
    fn parse(s: &str) -> Result<Self> {
        match s {
            "retry" => Ok(Bulk::Retry),
            "cancel" => Ok(Bulk::Cancel),
            o => Err(Error::invalid(
                "action",
                format!("{o:?}: expected retry or cancel"),
            )),
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Bulk::Retry => "retry",
            Bulk::Cancel => "cancel",
        }
    }

    fn applies_to(self, s: JobState) -> bool {
        match self {
            Bulk::Retry => matches!(s, JobState::Dead | JobState::Cancelled),
            Bulk::Cancel => !s.is_terminal(),
        }
    }
}

/// The bulk form: the filter, the action, and (to apply) the confirmation.
#[derive(Debug, Deserialize)]
pub(crate) struct BulkForm {
    #[serde(flatten)]
    filter: FilterForm,
    #[serde(default)]
    action: String,
    csrf: Option<String>,
    /// The jobs the preview counted: `id.version` pairs, comma-separated.
    #[serde(default)]
    pin: String,
}

/// The preview's jobs as the confirmation form carries them: `id.version,…`.
fn pin_of(jobs: &[Job]) -> String {
    jobs.iter()
        .map(|j| format!("{}.{}", j.id.0, j.version))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pinned `(id, version)` pairs of a confirmation.
fn parse_pin(pin: &str) -> Result<Vec<(crate::JobId, i64)>> {
    let bad = || {
        Error::invalid(
            "pin",
            "the preview's list of jobs (id.version, comma-separated) is missing or damaged: \
             open the preview again",
        )
    };
    let pairs = pin
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (id, v) = p.split_once('.').ok_or_else(bad)?;
            Ok((
                crate::JobId(id.parse().map_err(|_| bad())?),
                v.parse().map_err(|_| bad())?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    if pairs.is_empty() || pairs.len() > BULK_LIMIT {
        return Err(bad());
    }
    Ok(pairs)
}

/// The jobs a bulk action would change, at most [`BULK_LIMIT`]; and whether there are more.
async fn targets(state: &Data, f: &FilterForm, b: Bulk) -> Result<(Vec<Job>, bool)> {
    let parsed = f.parse()?;
    let pairs = f.pairs();
    if pairs
        .iter()
        .filter(|(k, _)| *k != "order")
        .all(|(_, v)| v.is_empty())
    {
        return Err(Error::invalid(
            "filter",
            format!("no filter: refusing to {} every job; filter by queue, kind, state, time, key or text first", b.verb()),
        ));
    }
    if parsed.params.archived {
        return Err(Error::invalid(
            "archived",
            "archived jobs cannot be changed",
        ));
    }
    let mut parsed = parsed;
    parsed.params.after = None;
    let found = find(
        state,
        &parsed,
        BULK_LIMIT,
        state.config.search_window as usize,
    )
    .await?;
    let more = found.more || found.window_ended;
    Ok((
        found
            .jobs
            .into_iter()
            .filter(|j| b.applies_to(j.state))
            .collect(),
        more,
    ))
}

pub(crate) async fn bulk_preview(
    state: Data,
    req: HttpRequest,
    form: web::Query<BulkForm>,
) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    if !ctx.can_act() {
        return ctx.finish(
            &state,
            &req,
            super::layout::plain_error(
                &req,
                StatusCode::FORBIDDEN,
                "read-only: this dashboard does not allow actions",
            ),
        );
    }
    let out = async {
        let b = Bulk::parse(&form.action)?;
        let (jobs, more) = targets(&state, &form.filter, b).await?;
        let shown = &jobs[..jobs.len().min(20)];
        let back = state.url(&format!("/jobs{}", query(&form.filter.pairs())));
        let body: Markup = html! {
            p #bulk-count {
                @if more { "At least " }
                strong #bulk-n { (jobs.len()) } " job(s) match and can be " (if b == Bulk::Retry { "retried" } else { "cancelled" }) "."
                @if more { " Only the first " (BULK_LIMIT) " will be changed; run it again for the rest." }
            }
            @if !jobs.is_empty() {
                form method="post" action=(state.url("/jobs/bulk")) {
                    (csrf_field(&ctx))
                    (form.filter.hidden())
                    input type="hidden" name="action" value=(b.verb());
                    input type="hidden" name="pin" value=(pin_of(&jobs));
                    button.primary #confirm type="submit" { "Yes, " (b.verb()) " " (jobs.len()) " job(s)" }
                    " " a href=(back) { "No, go back" }
                }
                h2 { "First of them" }
                (job_table(&state, shown, Utc::now()))
            }
        };
        Ok::<_, Error>(shell(&state, &req, &ctx, &format!("Bulk {}: preview", b.verb()), false, StatusCode::OK, body))
    }
    .await;
    out.unwrap_or_else(|e| ctx.finish(&state, &req, error_response(&req, &e)))
}

pub(crate) async fn bulk(state: Data, req: HttpRequest, form: web::Form<BulkForm>) -> HttpResponse {
    let ctx = match authorize_action(&state, &req, form.csrf.as_deref()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let what = format!("bulk.{}", form.action);
    let out = async {
        let b = Bulk::parse(&form.action)?;
        let pinned = parse_pin(&form.pin)?;
        let (mut applied, mut changed) = (0u64, 0u64);
        let mut queues = std::collections::BTreeSet::new();
        for (id, version) in pinned {
            let ok = match b {
                Bulk::Retry => match state
                    .client
                    .store()
                    .job_retry(RetryParams {
                        id,
                        expected_version: Some(version),
                        now: None,
                    })
                    .await
                {
                    Ok(Guarded::Applied(j)) => {
                        queues.insert(j.queue);
                        true
                    }
                    Ok(_) | Err(Error::InvalidTransition { .. } | Error::NotFound { .. }) => false,
                    Err(e) => return Err(e),
                },
                // The job as pinned (its version guards the write), or skipped.
                Bulk::Cancel => match state.client.cancel_at_version(id, version).await {
                    Ok(Ok(CancelOutcome::Cancelled(_) | CancelOutcome::Requested(_))) => true,
                    Ok(Ok(CancelOutcome::AlreadyFinished(_)) | Err(_))
                    | Err(Error::NotFound { .. }) => false,
                    Err(e) => return Err(e),
                },
            };
            if ok {
                applied += 1
            } else {
                changed += 1
            }
        }
        for q in &queues {
            state.client.wake(q);
        }
        let text = format!(
            "{applied} job(s) {}; {changed} skipped: they had moved on since the preview",
            if b == Bulk::Retry {
                "retried"
            } else {
                "cancelled (running ones: cancel requested)"
            }
        );
        let back = state.url(&format!("/jobs{}", query(&form.filter.pairs())));
        Answer::done(StatusCode::OK, text, applied, back)
    }
    .await;
    conclude(&state, &req, &ctx, &what, &filter_text(&form.filter), out).await
}

/// A bulk action's filter as the audit log records it: `queue=mail state=dead …`.
fn filter_text(f: &FilterForm) -> String {
    let text = f
        .pairs()
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!("jobs matching {text}")
}

/// A dead-letter group's retry.
#[derive(Debug, Deserialize)]
pub(crate) struct DeadForm {
    csrf: Option<String>,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    code: String,
    /// `yes` once the confirmation page was answered.
    #[serde(default)]
    confirm: String,
}

pub(crate) async fn dead_retry(
    state: Data,
    req: HttpRequest,
    form: web::Form<DeadForm>,
) -> HttpResponse {
    let ctx = match authorize_action(&state, &req, form.csrf.as_deref()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let target = format!("dead jobs of kind {} with error {}", form.kind, form.code);
    let out = async {
        // "none": the group of dead jobs without a recorded error.
        let code = Some(form.code.as_str()).filter(|c| *c != "none");
        let limit = i64::try_from(BULK_LIMIT).unwrap_or(i64::MAX);
        let jobs = state.client.store().dead_of_group(&form.kind, code, limit).await?;
        if form.confirm != "yes" {
            let more = if jobs.len() >= BULK_LIMIT { " (the first of them; run it again for the rest)" } else { "" };
            return Ok(Answer::Ask(confirm_page(
                &state,
                &req,
                &ctx,
                &format!("Retry {} dead job(s) of kind {} with error {}{more}? They run again at once.", jobs.len(), form.kind, form.code),
                &state.url("/dead/retry"),
                &[("kind", &form.kind), ("code", &form.code)],
                &format!("Yes, retry {}", jobs.len()),
                &state.url("/dead"),
            )));
        }
        let mut applied = 0u64;
        let mut changed = 0u64;
        for j in &jobs {
            let g = state
                .client
                .store()
                .job_retry(RetryParams { id: j.id, expected_version: Some(j.version), now: None })
                .await;
            match g {
                Ok(g) if g.is_applied() => applied += 1,
                Ok(_) | Err(Error::InvalidTransition { .. }) | Err(Error::NotFound { .. }) => changed += 1,
                Err(e) => return Err(e),
            }
        }
        if applied > 0 {
            for q in jobs.iter().map(|j| j.queue.as_str()).collect::<std::collections::BTreeSet<_>>() {
                state.client.wake(q);
            }
        }
        let text = format!("{applied} dead job(s) of kind {} with error {} retried; {changed} had changed meanwhile", form.kind, form.code);
        Answer::done(StatusCode::OK, text, applied, state.url("/dead"))
    }
    .await;
    conclude(&state, &req, &ctx, "dead.retry", &target, out).await
}

/// A queue action's form.
#[derive(Debug, Deserialize)]
pub(crate) struct QueueForm {
    csrf: Option<String>,
    #[serde(default)]
    queue: String,
    #[serde(default)]
    concurrency: String,
    #[serde(default)]
    per_partition: String,
    #[serde(default)]
    rate_jobs: String,
    #[serde(default)]
    rate_per: String,
}

fn opt_u32(field: &'static str, v: &str) -> Result<Option<u32>> {
    match v.trim() {
        "" => Ok(None),
        s => s.parse().map(Some).map_err(|_| {
            Error::invalid(
                field,
                format!("{s:?}: expected a whole number, or blank for none"),
            )
        }),
    }
}

/// `500ms`, `1s`, `2m`, `1h`, or plain seconds.
fn period(v: &str) -> Result<std::time::Duration> {
    period_named("rate_per", v)
}

/// [`period`] of the form field `field`.
fn period_named(field: &'static str, v: &str) -> Result<std::time::Duration> {
    let s = v.trim();
    let bad = || {
        Error::invalid(
            field,
            format!("{s:?}: expected a period such as 500ms, 1s, 2m or 1h"),
        )
    };
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| bad())?;
    Ok(match unit {
        "ms" => std::time::Duration::from_millis(n),
        "s" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_secs(n * 60),
        "h" => std::time::Duration::from_secs(n * 3600),
        _ => return Err(bad()),
    })
}

pub(crate) async fn queue(
    state: Data,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<QueueForm>,
) -> HttpResponse {
    let ctx = match authorize_action(&state, &req, form.csrf.as_deref()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let what = format!("queue.{path}");
    let target = format!("queue {}", form.queue);
    let out = async {
        let q = form.queue.as_str();
        let text = match path.as_str() {
            "pause" => {
                state.client.pause_queue(q, &ctx.who).await?;
                format!("queue {q} paused: no new claims on any node")
            }
            "resume" => {
                state.client.resume_queue(q).await?;
                format!("queue {q} resumed")
            }
            "limits" => {
                let mut l = QueueLimits {
                    concurrency: opt_u32("concurrency", &form.concurrency)?,
                    per_partition: opt_u32("per_partition", &form.per_partition)?,
                    ..QueueLimits::default()
                };
                if let Some(n) = opt_u32("rate_jobs", &form.rate_jobs)? {
                    let per = if form.rate_per.trim().is_empty() {
                        std::time::Duration::from_secs(1)
                    } else {
                        period(&form.rate_per)?
                    };
                    l.rate = Some(RateLimit::new(n, per)?);
                }
                state.client.set_queue_limits(q, l).await?;
                format!(
                    "queue {q} limits: {}",
                    super::pages::queues::limits_text(&l)
                )
            }
            other => {
                return Err(Error::invalid(
                    "action",
                    format!("{other:?}: expected pause, resume or limits"),
                ))
            }
        };
        Answer::done(StatusCode::OK, text, 0, state.url("/queues"))
    }
    .await;
    conclude(&state, &req, &ctx, &what, &target, out).await
}

/// A schedule action's form; `add` fills the rest.
#[derive(Debug, Deserialize)]
pub(crate) struct ScheduleForm {
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    /// A cron expression, or blank for `every`.
    #[serde(default)]
    cron: String,
    /// A fixed interval (`30s`, `15m`, `1h`), when `cron` is blank.
    #[serde(default)]
    every: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    queue: String,
    /// JSON; blank for `{}`.
    #[serde(default)]
    payload: String,
    /// `latest` (blank too) or `skip`.
    #[serde(default)]
    missed: String,
}

/// The run-time schedule an add form describes.
fn schedule_of(f: &ScheduleForm) -> Result<crate::schedule::Schedule> {
    use crate::schedule::{MissedFires, Schedule};
    let payload = match f.payload.trim() {
        "" => serde_json::json!({}),
        p => serde_json::from_str(p).map_err(|e| {
            Error::invalid(
                "payload",
                format!("not JSON ({e}); expected e.g. {{\"team\": 7}}"),
            )
        })?,
    };
    let mut job = crate::job::NewJob::new(f.kind.trim(), payload);
    if !f.queue.trim().is_empty() {
        job = job.queue(f.queue.trim());
    }
    let missed = match f.missed.trim() {
        "" | "latest" => MissedFires::Latest,
        "skip" => MissedFires::Skip,
        other => {
            return Err(Error::invalid(
                "missed",
                format!("{other:?}: expected latest or skip"),
            ))
        }
    };
    let s = match (f.cron.trim(), f.every.trim()) {
        ("", "") => {
            return Err(Error::invalid(
                "cron",
                "neither a cron expression nor an interval; expected one of them",
            ))
        }
        ("", every) => Schedule::every(f.name.trim(), period_named("every", every)?, job),
        (cron, "") => Schedule::cron(f.name.trim(), cron, job),
        _ => {
            return Err(Error::invalid(
                "cron",
                "both a cron expression and an interval; expected one of them",
            ))
        }
    };
    let zone = f.zone.trim();
    Ok(s.time_zone(if zone.is_empty() {
        crate::schedule::DEFAULT_TIME_ZONE
    } else {
        zone
    })
    .missed(missed))
}

pub(crate) async fn schedule(
    state: Data,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<ScheduleForm>,
) -> HttpResponse {
    let ctx = match authorize_action(&state, &req, form.csrf.as_deref()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let what = format!("schedule.{path}");
    let target = format!("schedule {}", form.name);
    let out = async {
        let n = form.name.as_str();
        let text = match path.as_str() {
            "pause" => {
                state.client.pause_schedule(n).await?;
                format!("schedule {n} paused")
            }
            "resume" => {
                state.client.resume_schedule(n).await?;
                format!("schedule {n} resumed")
            }
            "trigger" => {
                let e = state.client.trigger_schedule(n).await?;
                format!("schedule {n} triggered: job {}", e.id.0)
            }
            "add" => {
                let s = state.client.add_schedule(schedule_of(&form)?).await?;
                format!(
                    "schedule {} added: {} ({})",
                    s.name,
                    s.spec_text(),
                    s.time_zone
                )
            }
            "remove" => {
                state.client.remove_schedule(n).await?;
                format!("schedule {n} removed: it fires no more")
            }
            other => {
                return Err(Error::invalid(
                    "action",
                    format!("{other:?}: expected pause, resume, trigger, add or remove"),
                ))
            }
        };
        let jobs = u64::from(path.as_str() == "trigger");
        Answer::done(StatusCode::OK, text, jobs, state.url("/schedules"))
    }
    .await;
    conclude(&state, &req, &ctx, &what, &target, out).await
}
