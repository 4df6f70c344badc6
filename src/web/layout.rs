//! The page shell (navigation, live indicator, logout), the security headers every response
//! carries, the compiled-in assets, the login and error pages, and formatting helpers.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

use super::auth::{csrf_field, Ctx};
use super::Data;

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// Scripts and styles only from the dashboard's own files; no inline code, no frames, forms
/// post only to this origin.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
    base-uri 'none'";

/// Adds the security headers.
fn secure(mut resp: HttpResponse) -> HttpResponse {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// An HTML response with the security headers.
pub(crate) fn html_response(status: StatusCode, body: Markup) -> HttpResponse {
    secure(
        HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .body(body.into_string()),
    )
}

pub(crate) async fn css() -> HttpResponse {
    let mut r = HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .body(CSS);
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

pub(crate) async fn js() -> HttpResponse {
    let mut r = HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .body(JS);
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn head(title: &str, css_url: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · jobvisor" }
            link rel="stylesheet" href=(css_url);
        }
    }
}

/// An error page, styled, with the navigation and a link to log in (it may answer an
/// unauthenticated request: it shows nothing but the message).
pub(crate) fn plain_error(req: &HttpRequest, status: StatusCode, message: &str) -> HttpResponse {
    let prefix = req
        .app_data::<Data>()
        .map(|s| s.prefix.clone())
        .unwrap_or_default();
    let url = |rest: &str| format!("{prefix}{rest}");
    html_response(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                (head("error", &url("/assets/dashboard.css")))
                body.error {
                    header {
                        span.brand { "jobvisor" }
                        nav {
                            @for (path, name) in NAV {
                                a href=(url(path)) { (name) }
                            }
                        }
                    }
                    main #main {
                        h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                        p.flash.bad #error-message { (message) }
                        p {
                            a #error-back href=(url("/")) { "Overview" }
                            " · "
                            a #error-login href=(url("/login")) { "Log in" }
                        }
                    }
                }
            }
        },
    )
}

/// The navigation: each view's path under the prefix and its name.
const NAV: [(&str, &str); 8] = [
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/dead", "Dead letters"),
    ("/queues", "Queues"),
    ("/schedules", "Schedules"),
    ("/nodes", "Nodes"),
    ("/history", "History"),
    ("/audit", "Audit"),
];

/// The login page.
pub(crate) fn login(
    state: &Data,
    ctx: &Ctx,
    next: &str,
    error: Option<&str>,
    status: StatusCode,
) -> HttpResponse {
    html_response(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                (head("log in", &state.url("/assets/dashboard.css")))
                body.login {
                    main {
                        h1 { "jobvisor" }
                        @if let Some(e) = error { p.flash.bad #login-error { (e) } }
                        form method="post" action=(state.url("/login")) {
                            (csrf_field(ctx))
                            input type="hidden" name="next" value=(next);
                            label for="token" { "Token" }
                            input #token type="password" name="token" autocomplete="current-password" required;
                            button #login type="submit" { "Log in" }
                        }
                    }
                }
            }
        },
    )
}

/// A full page: navigation, `body`, the script. `live`: the page re-reads itself when its
/// event stream (`live.rs`) says something changed, while it shows something changing.
pub(crate) fn shell(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    title: &str,
    live: bool,
    status: StatusCode,
    body: Markup,
) -> HttpResponse {
    let events = live.then(|| Watch::Signal.url(state));
    shell_with(state, req, ctx, title, events, status, body)
}

/// What a live page's event stream follows.
pub(crate) enum Watch<'a> {
    /// The change signal (new jobs, settings, wake-ups), and a re-read every few seconds.
    Signal,
    /// The signal and these jobs (`(id, version)` as shown): a list showing changing jobs.
    Jobs(&'a [(i64, i64)]),
    /// One job's page: that job only.
    Job(i64, i64),
}

impl Watch<'_> {
    /// The stream's URL.
    pub(crate) fn url(&self, state: &Data) -> String {
        let pairs = |jobs: &[(i64, i64)]| {
            jobs.iter()
                .map(|(id, v)| format!("{id}.{v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let q = match self {
            Watch::Signal => String::new(),
            Watch::Jobs(jobs) => query(&[("watch", &pairs(jobs))]),
            Watch::Job(id, v) => query(&[("watch", &pairs(&[(*id, *v)])), ("job", "1")]),
        };
        state.url(&format!("/events{q}"))
    }
}

/// [`shell`] with the page's event stream chosen: `Some(url)` for a live page.
pub(crate) fn shell_with(
    state: &Data,
    req: &HttpRequest,
    ctx: &Ctx,
    title: &str,
    events: Option<String>,
    status: StatusCode,
    body: Markup,
) -> HttpResponse {
    let live = events.is_some();
    let nav = NAV;
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, &state.url("/assets/dashboard.css")))
            body data-live=(if live { "1" } else { "0" }) data-login=(state.url("/login")) data-events=[events] {
                header {
                    span.brand { "jobvisor" }
                    nav {
                        @for (path, name) in nav {
                            a href=(state.url(path)) { (name) }
                        }
                    }
                    span #live.live title="this page refreshes itself" { "● live" }
                    @if !ctx.can_act() { span.badge #read-only { "read-only" } }
                    @if !state.config.no_auth && state.config.authorizer.is_none() {
                        form.logout method="post" action=(state.url("/logout")) {
                            (csrf_field(ctx))
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main #main {
                    h1 { (title) }
                    (body)
                }
                script src=(state.url("/assets/dashboard.js")) {}
            }
        }
    };
    ctx.finish(state, req, html_response(status, markup))
}

/// `2026-11-27 10:28:40Z`.
pub(crate) fn ts(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// An optional time, or a dash.
pub(crate) fn ts_opt(t: Option<DateTime<Utc>>) -> String {
    t.map(ts).unwrap_or_else(|| "—".to_string())
}

/// `3m 12s ago` / `in 4s`.
pub(crate) fn age(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let d = now.signed_duration_since(t);
    let (s, future) = if d.num_seconds() < 0 {
        (-d.num_seconds(), true)
    } else {
        (d.num_seconds(), false)
    };
    let text = if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m {}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h {}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d {}h", s / 86_400, (s % 86_400) / 3600)
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// Pretty JSON (escaped by the caller's template).
pub(crate) fn json(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// A query string from pairs, empty values left out.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if !v.is_empty() {
            s.append_pair(k, v);
        }
    }
    let q = s.finish();
    if q.is_empty() {
        q
    } else {
        format!("?{q}")
    }
}

/// A flash message line.
pub(crate) fn flash(good: bool, text: &str) -> Markup {
    html! { p.flash.(if good { "good" } else { "bad" }) #flash { (text) } }
}

/// Why due jobs wait, in words.
pub(crate) fn unserved_reason(r: crate::UnservedReason) -> &'static str {
    match r {
        crate::UnservedReason::NoNodeServesQueue => "no live node serves the queue",
        crate::UnservedReason::NoNodeHasKind => {
            "no live node serving the queue has a handler for the kind"
        }
    }
}

/// A schedule's missed-fire policy, in words.
pub(crate) fn missed_text(m: crate::MissedFires) -> String {
    match m {
        crate::MissedFires::Latest => "run the latest missed fire once".to_string(),
        crate::MissedFires::All { max } => format!("run every missed fire (at most {max})"),
        crate::MissedFires::Skip => "skip missed fires".to_string(),
    }
}

/// A duration for people: `500 ms`, `30 s`, `2 min 5 s`, `1 h 30 min`.
pub(crate) fn duration_text(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        if ms.is_multiple_of(1000) {
            format!("{s} s")
        } else {
            format!("{:.1} s", d.as_secs_f64())
        }
    } else if s < 3600 {
        match s % 60 {
            0 => format!("{} min", s / 60),
            r => format!("{} min {r} s", s / 60),
        }
    } else {
        match (s % 3600) / 60 {
            0 => format!("{} h", s / 3600),
            m => format!("{} h {m} min", s / 3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words() {
        use std::time::Duration;
        assert_eq!(duration_text(Duration::from_millis(500)), "500 ms");
        assert_eq!(duration_text(Duration::from_secs(30)), "30 s");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(duration_text(Duration::from_secs(125)), "2 min 5 s");
        assert_eq!(duration_text(Duration::from_secs(1800)), "30 min");
        assert_eq!(duration_text(Duration::from_secs(5400)), "1 h 30 min");
    }

    #[test]
    fn no_debug_names_in_words() {
        let all = [
            unserved_reason(crate::UnservedReason::NoNodeServesQueue).to_string(),
            unserved_reason(crate::UnservedReason::NoNodeHasKind).to_string(),
            missed_text(crate::MissedFires::All { max: 1000 }),
            missed_text(crate::MissedFires::Latest),
            missed_text(crate::MissedFires::Skip),
        ];
        for w in all {
            assert!(
                !w.contains('{') && !w.chars().any(|c| c.is_ascii_uppercase()),
                "{w}"
            );
        }
    }
}
