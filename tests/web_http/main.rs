//! The dashboard's endpoints over HTTP (`actix_web::test`), on every backend: authentication
//! (redirect to the login page, 401 for actions, wrong tokens, the cookie's flags, bearer
//! tokens, loopback-only without authentication), CSRF on every action, read-only refusal,
//! bad filters and unknown ids (clear messages, no stack traces), HTML escaping of
//! attacker-controlled job fields, the stale-page guard, bulk actions with their preview,
//! queue changes, and what is never rendered (database URL, lease tokens); `guards.rs`:
//! loopback `Host` names without authentication, cross-site POSTs, the session's CSRF token,
//! login throttling.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::test::{self, TestRequest};
use actix_web::App;
use jobvisor::testing::{
    ClaimParams, Finalize, FinalizeParams, LeaseToken, StoreEngine as _, TestDb,
};
use jobvisor::web::{Access, Dashboard, DashboardConfig};
use jobvisor::{Backend, Client, JobFailure, JobId, JobState, NewJob, NodeId};
use serde_json::json;

const TOKEN: &str = "correct-horse-battery-staple";
const RO_TOKEN: &str = "read-only-horse-battery-staple";
const XSS_KIND: &str = "<script>alert('kind')</script>";
const XSS_PAYLOAD: &str = "<script>alert('payload')</script>";
const XSS_ERROR: &str = "<img src=x onerror=alert('error')>";
const XSS_SEQUENCE: &str = "acct:<b>42</b>";

/// A database with: a dead job whose kind, payload and error are hostile markup; a pending
/// job; a running job (with its lease token, which must never be shown).
struct Env {
    db: TestDb,
    client: Client,
    dead: JobId,
    pending: JobId,
    running: JobId,
    token: LeaseToken,
}

async fn env(b: Backend) -> Env {
    let db = TestDb::create(b).await;
    let store = db.store().await;
    let client = Client::new(store.clone());
    let dead = client
        .enqueue(
            NewJob::new(XSS_KIND, json!({ "x": XSS_PAYLOAD }))
                .queue("hostile")
                .max_attempts(1)
                .sequence(XSS_SEQUENCE)
                .start_by(chrono::Utc::now() + chrono::Duration::hours(2)),
        )
        .await
        .unwrap()
        .id;
    let claimed = store
        .job_claim(ClaimParams {
            queue: "hostile".into(),
            owner: NodeId::new("web-test").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    let c = claimed.into_iter().next().unwrap();
    store
        .job_finalize_many(FinalizeParams {
            items: vec![Finalize::dead(
                c.id,
                c.token,
                JobFailure::new("boom", XSS_ERROR, 1),
            )],
            now: None,
        })
        .await
        .unwrap();
    let running = client
        .enqueue(NewJob::new("work", json!({"n": 1})).queue("busy"))
        .await
        .unwrap()
        .id;
    let c = store
        .job_claim(ClaimParams {
            queue: "busy".into(),
            owner: NodeId::new("web-test").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(600),
            now: None,
        })
        .await
        .unwrap()
        .pop()
        .unwrap();
    let pending = client
        .enqueue(
            NewJob::new("later", json!({"n": 2}))
                .queue("busy")
                .delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap()
        .id;
    Env {
        db,
        client,
        dead,
        pending,
        running,
        token: c.token,
    }
}

fn cfg() -> DashboardConfig {
    DashboardConfig::with_token(TOKEN)
        .unwrap()
        .read_only_token(RO_TOKEN)
        .unwrap()
}

struct Resp {
    status: StatusCode,
    headers: actix_web::http::header::HeaderMap,
    body: String,
}

async fn call<S, B>(app: &S, req: TestRequest) -> Resp
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let resp = test::call_service(
        app,
        req.peer_addr("127.0.0.1:5555".parse().unwrap())
            .insert_header(("host", "localhost:8080"))
            .to_request(),
    )
    .await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    assert!(
        !body.contains("panicked") && !body.contains("RUST_BACKTRACE"),
        "{body}"
    );
    Resp {
        status,
        headers,
        body,
    }
}

/// The `name=value` of each Set-Cookie.
fn set_cookies(r: &Resp) -> Vec<String> {
    r.headers
        .get_all(actix_web::http::header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn cookie_pair(set: &str) -> String {
    set.split(';').next().unwrap().to_string()
}

/// Logs in with `token`: the Cookie header to send and the CSRF token.
async fn login<S, B>(app: &S, token: &str) -> (String, String)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let r = call(app, TestRequest::get().uri("/d/login")).await;
    assert_eq!(r.status, StatusCode::OK);
    let csrf_cookie = cookie_pair(&set_cookies(&r)[0]);
    let csrf = csrf_cookie.split_once('=').unwrap().1.to_string();
    let r = call(
        app,
        TestRequest::post()
            .uri("/d/login")
            .insert_header(("cookie", csrf_cookie.clone()))
            .set_form([("token", token), ("csrf", &csrf)]),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let session = set_cookies(&r)
        .into_iter()
        .find(|c| c.starts_with("jobvisor_session="))
        .unwrap();
    // The session's own CSRF token, set with it (not the login form's).
    let csrf_cookie = set_cookies(&r)
        .into_iter()
        .find(|c| c.starts_with("jobvisor_csrf="))
        .map(|c| cookie_pair(&c))
        .unwrap();
    assert_ne!(
        csrf_cookie.split_once('=').unwrap().1,
        csrf,
        "a new token at login"
    );
    let csrf = csrf_cookie.split_once('=').unwrap().1.to_string();
    (format!("{}; {csrf_cookie}", cookie_pair(&session)), csrf)
}

macro_rules! app {
    ($client:expr, $cfg:expr) => {
        test::init_service(
            App::new().service(Dashboard::new("/d", $client.clone(), $cfg).service()),
        )
        .await
    };
}

const PAGES: &[&str] = &[
    "/d/",
    "/d/jobs",
    "/d/jobs/1",
    "/d/dead",
    "/d/queues",
    "/d/schedules",
    "/d/nodes",
    "/d/jobs/bulk?action=retry&state=dead",
    "/d/audit",
    "/d/batches/1",
    "/d/history",
];

async fn authentication_is_required(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    for p in PAGES {
        let r = call(&app, TestRequest::get().uri(p)).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{p}");
        let to = r.headers.get("location").unwrap().to_str().unwrap();
        let back = url::form_urlencoded::byte_serialize(p.as_bytes()).collect::<String>();
        assert_eq!(to, format!("/d/login?next={back}"), "{p}");
    }
    let posts = [
        "/d/jobs/1/retry",
        "/d/jobs/1/cancel",
        "/d/jobs/1/delete",
        "/d/jobs/bulk",
        "/d/dead/retry",
        "/d/queues/pause",
        "/d/queues/limits",
        "/d/schedules/trigger",
        "/d/schedules/add",
        "/d/schedules/remove",
    ];
    for p in posts {
        let r = call(&app, TestRequest::post().uri(p).set_form([("csrf", "x")])).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{p}: {}", r.body);
    }
    // Assets need no login and carry no data.
    let r = call(&app, TestRequest::get().uri("/d/assets/dashboard.js")).await;
    assert_eq!(r.status, StatusCode::OK);
    // A wrong token: refused, no session.
    let r = call(&app, TestRequest::get().uri("/d/login")).await;
    let csrf_cookie = cookie_pair(&set_cookies(&r)[0]);
    let csrf = csrf_cookie.split_once('=').unwrap().1.to_string();
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/login")
            .insert_header(("cookie", csrf_cookie.clone()))
            .set_form([("token", "wrong-token-wrong-token"), ("csrf", &csrf)]),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.body.contains("wrong token"));
    assert!(set_cookies(&r)
        .iter()
        .all(|c| !c.starts_with("jobvisor_session")));
    // The right token without the login form's CSRF token: refused.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/login")
            .set_form([("token", TOKEN)]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Logged in: the cookie's flags, then every page answers.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/login")
            .insert_header(("cookie", csrf_cookie))
            .set_form([("token", TOKEN), ("csrf", &csrf)]),
    )
    .await;
    let session = set_cookies(&r)
        .into_iter()
        .find(|c| c.starts_with("jobvisor_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/d"] {
        assert!(session.contains(flag), "{session}");
    }
    assert!(!session.contains("Secure"), "plain HTTP: {session}");
    let (cookie, _) = login(&app, TOKEN).await;
    for p in PAGES {
        let p = p
            .replace("/jobs/1", &format!("/jobs/{}", e.dead.0))
            .replace("/batches/1", &format!("/batches/{}", e.dead.0));
        let r = call(
            &app,
            TestRequest::get()
                .uri(&p)
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{p}: {}", r.body);
        let csp = r
            .headers
            .get("content-security-policy")
            .unwrap()
            .to_str()
            .unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert!(!r.body.contains(&e.db.url), "{p} shows the database URL");
        assert!(
            !r.body.contains(e.token.as_str()),
            "{p} shows a lease token"
        );
    }
    // A bearer token works for scripts; a wrong one does not.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs")
            .insert_header(("authorization", format!("Bearer {TOKEN}"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs")
            .insert_header(("authorization", "Bearer nope-nope-nope-nope")),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    // Over HTTPS the cookie is Secure.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/login")
            .insert_header(("x-forwarded-proto", "https")),
    )
    .await;
    assert!(
        set_cookies(&r)[0].contains("; Secure"),
        "{:?}",
        set_cookies(&r)
    );
    // The running job's page shows its owner, never its token.
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", e.running.0))
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("web-test"), "lease owner shown");
    assert!(!r.body.contains(e.token.as_str()));
}

async fn actions_need_the_csrf_token(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let dead = e.client.get(e.dead).await.unwrap();
    let uri = format!("/d/jobs/{}/retry", e.dead.0);
    let v = dead.version.to_string();
    for bad in [
        None,
        Some("0000000000000000000000000000000000000000000000000000000000000000"),
    ] {
        let mut form = vec![("version", v.as_str())];
        if let Some(b) = bad {
            form.push(("csrf", b));
        }
        let r = call(
            &app,
            TestRequest::post()
                .uri(&uri)
                .insert_header(("cookie", cookie.clone()))
                .set_form(form),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("CSRF"), "{}", r.body);
    }
    // The session cookie with a CSRF token of its own making (cookie and field alike, as
    // a cross-site form could send): refused, the token is the session's.
    let session_only = cookie.split(';').next().unwrap().to_string();
    let forged = "ab".repeat(32);
    let r = call(
        &app,
        TestRequest::post()
            .uri(&uri)
            .insert_header(("cookie", format!("{session_only}; jobvisor_csrf={forged}")))
            .set_form([("version", v.as_str()), ("csrf", forged.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        e.client.get(e.dead).await.unwrap().state,
        JobState::Dead,
        "nothing done"
    );
    let r = call(
        &app,
        TestRequest::post()
            .uri(&uri)
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(e.client.get(e.dead).await.unwrap().state, JobState::Pending);
}

async fn read_only_hides_and_refuses_actions(b: Backend) {
    let e = env(b).await;
    for (config, token) in [(cfg().read_only(true), TOKEN), (cfg(), RO_TOKEN)] {
        let app = app!(e.client, config);
        let (cookie, csrf) = login(&app, token).await;
        let r = call(
            &app,
            TestRequest::get()
                .uri(&format!("/d/jobs/{}", e.dead.0))
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert!(r.body.contains("read-only"));
        assert!(
            !r.body.contains("retry-job") && !r.body.contains("delete-job"),
            "no action shown"
        );
        let r = call(
            &app,
            TestRequest::get()
                .uri("/d/dead")
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert!(!r.body.contains("/d/dead/retry"));
        let r = call(
            &app,
            TestRequest::get()
                .uri("/d/queues")
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert!(!r.body.contains("/d/queues/pause"));
        let v = e.client.get(e.dead).await.unwrap().version.to_string();
        let posts: Vec<(String, Vec<(&str, &str)>)> = vec![
            (
                format!("/d/jobs/{}/retry", e.dead.0),
                vec![("version", v.as_str())],
            ),
            (
                format!("/d/jobs/{}/delete", e.dead.0),
                vec![("version", v.as_str())],
            ),
            (
                "/d/jobs/bulk".into(),
                vec![("action", "cancel"), ("queue", "busy")],
            ),
            (
                "/d/dead/retry".into(),
                vec![("kind", XSS_KIND), ("code", "boom")],
            ),
            ("/d/queues/pause".into(), vec![("queue", "busy")]),
        ];
        for (uri, mut form) in posts {
            form.push(("csrf", csrf.as_str()));
            let r = call(
                &app,
                TestRequest::post()
                    .uri(&uri)
                    .insert_header(("cookie", cookie.clone()))
                    .set_form(form),
            )
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{uri}");
            assert!(r.body.contains("read-only"), "{}", r.body);
        }
        let r = call(
            &app,
            TestRequest::get()
                .uri("/d/jobs/bulk?action=cancel&queue=busy")
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(e.client.get(e.dead).await.unwrap().state, JobState::Dead);
    assert_eq!(
        e.client.get(e.pending).await.unwrap().state,
        JobState::Pending
    );
    assert!(
        e.client.queue("busy").await.unwrap().is_none(),
        "not paused"
    );
}

/// A POST to make: path, form, expected status, text the answer contains.
type PostCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, StatusCode, &'a str);

async fn bad_input_gets_clear_messages(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let cases = [
        (
            "/d/jobs?state=bogus",
            StatusCode::BAD_REQUEST,
            "invalid state: \"bogus\" is not a state; expected one of pending",
        ),
        (
            "/d/jobs?from=yesterday",
            StatusCode::BAD_REQUEST,
            "invalid from: \"yesterday\" is not a time",
        ),
        (
            "/d/jobs?from=2026-01-02T00:00&to=2026-01-01T00:00",
            StatusCode::BAD_REQUEST,
            "invalid to: the end of the time range is before its start",
        ),
        ("/d/jobs?after=x1", StatusCode::BAD_REQUEST, "invalid after"),
        (
            "/d/jobs?order=sideways",
            StatusCode::BAD_REQUEST,
            "invalid order",
        ),
        ("/d/jobs?id=abc", StatusCode::BAD_REQUEST, "invalid id"),
        (
            "/d/jobs/abc",
            StatusCode::BAD_REQUEST,
            "invalid id: \"abc\" is not a job id",
        ),
        (
            "/d/jobs/987654321",
            StatusCode::NOT_FOUND,
            "job 987654321 not found",
        ),
        (
            "/d/jobs/bulk?action=cancel",
            StatusCode::BAD_REQUEST,
            "no filter: refusing to cancel every job",
        ),
        (
            "/d/jobs/bulk?action=explode&queue=busy",
            StatusCode::BAD_REQUEST,
            "invalid action",
        ),
        ("/d/nowhere", StatusCode::NOT_FOUND, "no such page"),
    ];
    for (uri, status, text) in cases {
        let r = call(
            &app,
            TestRequest::get()
                .uri(uri)
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert_eq!(r.status, status, "{uri}: {}", r.body);
        assert!(
            r.body.contains(&maud::html! { (text) }.into_string()),
            "{uri}: {}",
            r.body
        );
    }
    let posts: Vec<PostCase<'_>> = vec![
        (
            "/d/jobs/987654321/retry",
            vec![("version", "1")],
            StatusCode::NOT_FOUND,
            "not found",
        ),
        (
            "/d/jobs/1/explode",
            vec![("version", "1")],
            StatusCode::BAD_REQUEST,
            "invalid action",
        ),
        (
            "/d/jobs/1/retry",
            vec![("version", "v2")],
            StatusCode::BAD_REQUEST,
            "invalid version",
        ),
        (
            "/d/queues/limits",
            vec![("queue", "busy"), ("concurrency", "-3")],
            StatusCode::BAD_REQUEST,
            "invalid concurrency",
        ),
        (
            "/d/queues/limits",
            vec![("queue", "busy"), ("rate_jobs", "5"), ("rate_per", "soon")],
            StatusCode::BAD_REQUEST,
            "invalid rate_per",
        ),
        (
            "/d/queues/pause",
            vec![("queue", "")],
            StatusCode::BAD_REQUEST,
            "invalid queue",
        ),
        (
            "/d/schedules/trigger",
            vec![("name", "no-such-schedule")],
            StatusCode::BAD_REQUEST,
            "no-such-schedule",
        ),
    ];
    for (uri, mut form, status, text) in posts {
        form.push(("csrf", csrf.as_str()));
        let r = call(
            &app,
            TestRequest::post()
                .uri(uri)
                .insert_header(("cookie", cookie.clone()))
                .set_form(form),
        )
        .await;
        assert_eq!(r.status, status, "{uri}: {}", r.body);
        assert!(r.body.contains(text), "{uri}: {}", r.body);
    }
    // A pending job cannot be retried or deleted; the page says why.
    let v = e.client.get(e.pending).await.unwrap().version.to_string();
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/retry", e.pending.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/delete", e.pending.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("only a finished job"), "{}", r.body);
}

async fn job_fields_are_escaped(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let pages = [
        format!("/d/jobs/{}", e.dead.0),
        "/d/jobs".to_string(),
        "/d/jobs?state=dead".to_string(),
        "/d/dead".to_string(),
        "/d/".to_string(),
        "/d/jobs/bulk?action=retry&state=dead".to_string(),
        format!("/d/jobs?kind={}", url_escape(XSS_KIND)),
    ];
    for p in pages {
        let r = call(
            &app,
            TestRequest::get()
                .uri(&p)
                .insert_header(("cookie", cookie.clone())),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{p}");
        for raw in ["<script>alert", "<img src=x"] {
            assert!(
                !r.body.contains(raw),
                "{p} renders {raw} unescaped:\n{}",
                r.body
            );
        }
        assert_eq!(
            r.body.matches("<script").count(),
            1,
            "{p}: only the dashboard's own script"
        );
    }
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", e.dead.0))
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(
        r.body
            .contains("&lt;script&gt;alert('kind')&lt;/script&gt;"),
        "kind shown, escaped"
    );
    assert!(
        r.body.contains("&lt;img src=x onerror=alert('error')&gt;"),
        "error shown, escaped"
    );
    assert!(
        r.body.contains("&lt;script&gt;alert('payload')"),
        "payload shown, escaped"
    );
    assert!(
        r.body
            .contains("<dd id=\"job-sequence\">acct:&lt;b&gt;42&lt;/b&gt;</dd>"),
        "sequence key shown, escaped"
    );
    let start_by = &r.body[r.body.find("<dd id=\"job-start-by\">").expect("start by")..];
    assert!(
        start_by[..start_by.find("</dd>").unwrap()].contains("in 1h 59m"),
        "deadline shown with the time left: {start_by:.120}"
    );
    // The execution ledger: who ran the claim and how it ended, its error escaped too.
    let claims = &r.body[r
        .body
        .find("<table id=\"claims\">")
        .expect("a Claims table")..];
    let claims = &claims[..claims.find("</table>").unwrap()];
    assert!(
        claims.contains("<td class=\"claim-node\">web-test</td>"),
        "{claims}"
    );
    assert!(
        claims.contains("<td class=\"claim-outcome\">failed</td>"),
        "{claims}"
    );
    assert!(claims.contains("&lt;img src=x"), "{claims}");
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", e.running.0))
            .insert_header(("cookie", cookie)),
    )
    .await;
    assert!(
        r.body.contains("<td class=\"claim-outcome\">running</td>"),
        "{}",
        r.body
    );
}

fn url_escape(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

mod actions;
mod audit;
mod batch;
mod guards;
mod history;
mod lists;
mod live;
use actions::*;
use audit::*;
use batch::*;
use guards::*;
use history::*;
use lists::*;
use live::*;

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres { use super::*; $( #[actix_web::test] async fn $name() { super::$name(Backend::Postgres).await } )* }
        mod mysql { use super::*; $( #[actix_web::test] async fn $name() { super::$name(Backend::Mysql).await } )* }
        mod sqlite { use super::*; $( #[actix_web::test] async fn $name() { super::$name(Backend::Sqlite).await } )* }
    };
}

on_every_backend!(
    authentication_is_required,
    actions_need_the_csrf_token,
    read_only_hides_and_refuses_actions,
    bad_input_gets_clear_messages,
    job_fields_are_escaped,
    stale_pages_cannot_resurrect_jobs,
    bulk_actions_preview_then_apply,
    queues_pause_and_limits,
    without_auth_only_loopback,
    big_tables_show_labelled_estimates,
    run_at_order_exact_or_windowed,
    rare_filters_stop_at_their_window,
    dead_letters_group_in_sql,
    schedules_show_recent_fires,
    runtime_schedules_are_added_and_removed,
    without_auth_serves_only_loopback_host_names,
    cross_site_posts_are_refused,
    the_csrf_token_is_bound_to_the_session,
    login_returns_to_the_page_asked_for,
    a_queue_with_only_jobs_is_listed_and_can_be_paused,
    run_now_makes_a_scheduled_job_due,
    a_job_page_shows_its_parents_children_and_effects,
    the_chart_has_a_time_axis,
    every_action_is_audited,
    the_applications_identity_is_recorded,
    the_event_stream_pushes_a_finished_job,
    a_batch_has_a_view_linked_from_its_jobs,
    history_shows_a_day_from_the_rollup,
);

/// A dashboard built inside `HttpServer::new`'s factory (on a worker thread) would keep logins
/// of its own per worker: it refuses, loudly.
#[actix_web::test]
async fn a_dashboard_built_on_a_server_worker_panics() {
    let db = TestDb::create(Backend::Sqlite).await;
    let client = Client::new(db.store().await);
    let on_worker = std::thread::Builder::new()
        .name("actix-server worker 3".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async move {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Dashboard::new("/d", client, cfg())
                }))
                .is_err()
            })
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(on_worker, "Dashboard::new on a worker thread did not panic");
}
