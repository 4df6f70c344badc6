//! History: each queue's jobs succeeded and failed (ended dead) over the last 24 hours, per
//! 15 minutes with a time axis, and their totals — read from the throughput rollup
//! (`store/throughput.rs`, written with the database gauges), never from the jobs, so a
//! page view costs one read of at most 288 rows per queue. A day without a node running has
//! no rollup, and the page says so.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::{TimeZone, Utc};
use maud::html;

use super::super::auth::authorize;
use super::super::chart;
use super::super::layout::{query, shell};
use super::super::{error_response, Data};

/// One bar: **15 minutes** (three buckets of the rollup).
const BAR_US: i64 = 15 * 60 * 1_000_000;
/// Bars in the day shown (24 hours).
const BARS: usize = 96;

pub(crate) async fn page(state: Data, req: HttpRequest) -> HttpResponse {
    let ctx = match authorize(&state, &req).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let now = Utc::now().timestamp_micros();
    // The last bar ends with the current 15 minutes.
    let end = now - now.rem_euclid(BAR_US) + BAR_US;
    let first = end - BAR_US * BARS as i64;
    let rows = match state.client.store().throughput_since(first).await {
        Ok(r) => r,
        Err(e) => return ctx.finish(&state, &req, error_response(&req, &e)),
    };
    let mut per: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (queue, bucket, ok, failed) in rows {
        if bucket < first {
            continue;
        }
        let i = (((bucket - first) / BAR_US) as usize).min(BARS - 1);
        let bars = per.entry(queue).or_insert_with(|| vec![(0, 0); BARS]);
        bars[i].0 += ok;
        bars[i].1 += failed;
    }
    let at = |i: usize| Utc.timestamp_micros(first + BAR_US * i as i64).single();
    let titles: Vec<String> = (0..BARS)
        .map(|i| {
            at(i)
                .map(|t| t.format("%H:%M").to_string())
                .unwrap_or_default()
        })
        .collect();
    // Every 4 hours by its start (UTC), and the last bar as now.
    let mut axis: Vec<(usize, String)> = (0..BARS)
        .step_by(16)
        .map(|i| (i, titles[i].clone()))
        .collect();
    axis.push((BARS - 1, "now".to_string()));
    let body = html! {
        p.note { "Jobs that succeeded (green) and ended dead (red) per queue, per 15 minutes over the last 24 hours (UTC), from the throughput rollup the node computing the database gauges writes every 15 s." }
        @if per.is_empty() {
            p.muted #no-history { "No jobs finished in the last 24 hours (or no node ran to count them)." }
        }
        @for (queue, bars) in &per {
            @let ok: u64 = bars.iter().map(|b| b.0).sum();
            @let failed: u64 = bars.iter().map(|b| b.1).sum();
            section.history {
                h2 { a href=(state.url(&format!("/jobs{}", query(&[("queue", queue)])))) { (queue) } }
                p.totals {
                    span.state-succeeded.history-ok { (ok) } " succeeded · "
                    span.state-dead.history-failed { (failed) } " failed in 24 h"
                }
                (chart::stacked(&format!("history-{queue}"), bars, &titles, &axis, &format!("queue {queue}: jobs succeeded and failed per 15 minutes over the last 24 hours (UTC)")))
            }
        }
    };
    shell(&state, &req, &ctx, "History", false, StatusCode::OK, body)
}
