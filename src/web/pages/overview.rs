//! The overview: every queue with its jobs by state, lag, pause and limits; throughput over
//! the last hour (a chart); the nodes and the leader.
//!
//! Counts and lags: exact (grouped reads of the live table) while the database gauges say
//! the table holds at most
//! [`exact_count_limit`](crate::web::DashboardConfig::exact_count_limit) live jobs; above
//! it, the gauges' own counts (computed once per database per interval, by the leader or —
//! when no node has for two intervals — by the dashboard itself, in the background),
//! labelled as an estimate with their age.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use maud::html;

use super::super::auth::authorize;
use super::super::layout::{age, query, shell, ts};
use super::super::{chart, error_response, Data, GAUGES_EVERY};
use crate::error::Result;
use crate::job::JobState;
use crate::store::{from_us, QueueLag};

/// Throughput chart: 12 bars of 5 minutes.
const BUCKET: Duration = Duration::from_secs(300);
const BUCKETS: u32 = 12;

/// Per queue: counts by state.
pub(crate) type Counts = BTreeMap<String, std::collections::HashMap<JobState, u64>>;

/// Starts a refresh of the database gauges in the background when their snapshot is older
/// than twice their interval (no node took the turn): at most one at a time; the turn itself
/// runs once per database per interval whoever asks.
fn refresh_gauges(state: &Data, computed_at: i64) {
    let age = Utc::now().timestamp_micros().saturating_sub(computed_at);
    if age < 2 * i64::try_from(GAUGES_EVERY.as_micros()).unwrap_or(i64::MAX) {
        return;
    }
    let gauges = state.gauges.clone();
    tokio::spawn(async move {
        let Ok(mut g) = gauges.try_lock() else { return };
        if let Some(g) = g.as_mut() {
            if let Err(e) = g.refresh().await {
                tracing::warn!(error = %e, "dashboard: refreshing the database gauges failed");
            }
        }
    });
}

/// The counts, the lags, and how they were obtained (`None`: exact).
pub(crate) async fn counts(state: &Data) -> Result<(Counts, Vec<QueueLag>, Option<String>)> {
    let mut out = Counts::new();
    let gauges = state.client.store().gauges_read().await?;
    refresh_gauges(state, gauges.computed_at);
    if let Some(snap) = &gauges.snapshot {
        let total: u64 = snap.jobs.iter().map(|(_, _, n)| n).sum();
        if total > state.config.exact_count_limit {
            for (q, s, n) in &snap.jobs {
                if let Ok(s) = s.parse::<JobState>() {
                    *out.entry(q.clone()).or_default().entry(s).or_default() += *n;
                }
            }
            let mut lags: BTreeMap<String, (u64, i64)> = BTreeMap::new();
            for (q, _, n, oldest) in &snap.due {
                let e = lags.entry(q.clone()).or_insert((0, *oldest));
                e.0 += n;
                e.1 = e.1.min(*oldest);
            }
            let lags = lags
                .into_iter()
                .map(|(queue, (due, oldest))| QueueLag {
                    queue,
                    due,
                    oldest_due: from_us(oldest),
                })
                .collect();
            let label = format!(
                "estimate: more than {} live jobs, so counts and lags are the database gauges \
                 as of {} ({}), not counted again for this page",
                state.config.exact_count_limit,
                ts(from_us(gauges.computed_at)),
                age(Utc::now(), from_us(gauges.computed_at))
            );
            return Ok((out, lags, Some(label)));
        }
    }
    for c in state.client.counts().await? {
        out.entry(c.queue).or_default().insert(c.state, c.count);
    }
    Ok((out, state.client.queue_lags().await?, None))
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

async fn render(
    state: &Data,
    req: &HttpRequest,
    ctx: &super::super::auth::Ctx,
) -> Result<HttpResponse> {
    let now = Utc::now();
    let (counts, lags, estimate) = counts(state).await?;
    let settings = state.client.queues().await?;
    let nodes = state.client.nodes().await?;
    let leader = state.client.leader().await?;
    let ended = state
        .client
        .store()
        .ended_histogram(BUCKET, BUCKETS)
        .await?;
    let mut names: Vec<String> = counts.keys().cloned().collect();
    names.extend(lags.iter().map(|l| l.queue.clone()));
    names.extend(settings.iter().map(|s| s.name.clone()));
    names.sort();
    names.dedup();
    let titles: Vec<String> = (0..BUCKETS)
        .map(|i| format!("{} min ago", (BUCKETS - i) * 5))
        .collect();
    // The time axis: every third bar (15 minutes) by its start (UTC), and the last as now.
    let n = BUCKETS as usize;
    let start = |i: usize| now - chrono::Duration::minutes(((n - i) * 5) as i64);
    let mut axis: Vec<(usize, String)> = (0..n)
        .step_by(3)
        .map(|i| (i, start(i).format("%H:%M").to_string()))
        .collect();
    axis.push((n - 1, "now".to_string()));
    let body = html! {
        h2 { "Queues" }
        @if let Some(label) = &estimate { p.estimate #estimate { (label) } }
        table #queues {
            thead { tr {
                th { "queue" }
                @for s in JobState::ALL { th.num { (s) } }
                th { "lag" } th { "paused" } th { "limits" }
            } }
            tbody {
                @for q in &names {
                    @let c = counts.get(q);
                    @let lag = lags.iter().find(|l| &l.queue == q);
                    @let set = settings.iter().find(|s| &s.name == q);
                    tr {
                        td { a href=(state.url(&format!("/jobs{}", query(&[("queue", q)])))) { (q) } }
                        @for s in JobState::ALL {
                            td.num {
                                @let n = c.and_then(|c| c.get(&s)).copied().unwrap_or(0);
                                @if n > 0 {
                                    a href=(state.url(&format!("/jobs{}", query(&[("queue", q), ("state", s.as_str())])))) { (n) }
                                } @else { span.muted { "0" } }
                            }
                        }
                        td { @if let Some(l) = lag { (l.due) " due, oldest " (age(now, l.oldest_due)) } @else { "—" } }
                        td { @if let Some(p) = set.and_then(|s| s.paused_at) { "paused " (age(now, p)) } @else { "no" } }
                        td { @if let Some(s) = set { (super::queues::limits_text(&s.limits)) } @else { "none" } }
                    }
                }
            }
        }
        h2 { "Finished jobs, last hour" }
        (chart::bars(&ended, &titles, &axis, "jobs finished per 5 minutes over the last hour (UTC)"))
        p.note { "Counted from the live table's index on finished_at, per 5 minutes (jobs already archived are not counted)." }
        h2 { "Nodes" }
        p #leader {
            @if let Some(l) = &leader { "Leader: " (l.node) ", term " (l.term) ", since " (age(now, l.elected_at)) }
            @else { "No leader: no scheduler is running on this database, or one is taking over." }
        }
        table #nodes {
            thead { tr { th { "node" } th { "queues" } th { "kinds" } th { "last heartbeat" } } }
            tbody {
                @for n in &nodes {
                    tr {
                        td { (n.node) @if n.is_gone(now) { " " span.state-dead { "(gone)" } } }
                        td { (n.queues.join(", ")) }
                        td { (n.kinds.join(", ")) }
                        td { (age(now, n.heartbeat_at)) }
                    }
                }
            }
        }
    };
    Ok(shell(
        state,
        req,
        ctx,
        "Overview",
        true,
        StatusCode::OK,
        body,
    ))
}
