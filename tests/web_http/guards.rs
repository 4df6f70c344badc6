//! What keeps other sites and guessers out: without authentication only loopback `Host`
//! names are answered (DNS rebinding) and no proxied request; a POST from another site is
//! refused in every mode; the CSRF token is the session's; failed logins and bearer tokens
//! are slowed per client address and in all, while the right token still works; the login
//! returns to the page asked for.

use super::*;

/// One request from `peer` with `host` (the test service sets no `Host` by itself).
async fn from<S, B>(app: &S, peer: &str, host: &str, req: TestRequest) -> Resp
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let resp = test::call_service(
        app,
        req.peer_addr(peer.parse().unwrap())
            .insert_header(("host", host))
            .to_request(),
    )
    .await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    Resp {
        status,
        headers,
        body,
    }
}

pub(crate) async fn without_auth_serves_only_loopback_host_names(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, DashboardConfig::without_auth());
    for host in [
        "localhost",
        "localhost:8080",
        "127.0.0.1:9",
        "[::1]:8080",
        "[::1]",
        "LOCALHOST:1",
    ] {
        let r = from(
            &app,
            "127.0.0.1:5000",
            host,
            TestRequest::get().uri("/d/queues"),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{host}: {}", r.body);
    }
    // A page on a rebound name reaches this machine with its own Host: refused.
    for host in [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.evil.example",
        "localhost.evil.example:80",
        "[::2]:80",
        "localhost:x",
    ] {
        let r = from(
            &app,
            "127.0.0.1:5000",
            host,
            TestRequest::get().uri("/d/queues"),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
        assert!(
            r.body.contains("localhost, 127.0.0.1 or [::1]"),
            "{}",
            r.body
        );
        let r = from(
            &app,
            "127.0.0.1:5000",
            host,
            TestRequest::post()
                .uri("/d/queues/pause")
                .set_form([("queue", "busy"), ("csrf", "x")]),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
    }
    // Through a proxy on this machine every client looks local: refused.
    let r = from(
        &app,
        "127.0.0.1:5000",
        "localhost:8080",
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("x-forwarded-for", "203.0.113.9")),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(e
        .client
        .queue("busy")
        .await
        .unwrap()
        .is_none_or(|q| !q.is_paused()));
}

pub(crate) async fn cross_site_posts_are_refused(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let pause = |h: (&'static str, &'static str)| {
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", cookie.clone()))
            .insert_header(h)
            .set_form([("queue", "busy"), ("csrf", csrf.as_str())])
    };
    for h in [
        ("origin", "http://evil.example"),
        ("origin", "http://localhost:8081"),
        ("origin", "null"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        let r = call(&app, pause(h)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{h:?}: {}", r.body);
        assert!(r.body.contains("another site"), "{}", r.body);
    }
    // Even with the right bearer token (a script on a page that holds it).
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("authorization", format!("Bearer {TOKEN}")))
            .insert_header(("origin", "http://evil.example"))
            .set_form([("queue", "busy")]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(!e
        .client
        .queue("busy")
        .await
        .unwrap()
        .is_some_and(|q| q.is_paused()));
    // And without authentication.
    let noauth = app!(e.client, DashboardConfig::without_auth());
    let r = call(
        &noauth,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("sec-fetch-site", "cross-site"))
            .set_form([("queue", "busy"), ("csrf", "x")]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // From the dashboard's own page: done.
    let r = call(&app, pause(("origin", "http://localhost:8080"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = call(&app, pause(("sec-fetch-site", "same-origin"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(e.client.queue("busy").await.unwrap().unwrap().is_paused());
}

pub(crate) async fn the_csrf_token_is_bound_to_the_session(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie_a, csrf_a) = login(&app, TOKEN).await;
    let (cookie_b, csrf_b) = login(&app, TOKEN).await;
    assert_ne!(csrf_a, csrf_b);
    let session_a = cookie_a.split(';').next().unwrap();
    // Session A with B's token, in the cookie and the field: refused.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", format!("{session_a}; jobvisor_csrf={csrf_b}")))
            .set_form([("queue", "busy"), ("csrf", csrf_b.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    // Pages of session A carry A's token.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("cookie", session_a.to_string())),
    )
    .await;
    assert!(r.body.contains(&csrf_a) && !r.body.contains(&csrf_b));
    // After a logout, A's token is worth nothing.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/logout")
            .insert_header(("cookie", cookie_a.clone()))
            .set_form([("csrf", csrf_a.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", cookie_a))
            .set_form([("queue", "busy"), ("csrf", csrf_a.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", cookie_b))
            .set_form([("queue", "busy"), ("csrf", csrf_b.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

pub(crate) async fn login_returns_to_the_page_asked_for(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let r = call(
        &app,
        TestRequest::get().uri("/d/login?next=%2Fd%2Fdead%3Fx%3D1"),
    )
    .await;
    assert!(r.body.contains("value=\"/d/dead?x=1\""), "{}", r.body);
    let csrf_cookie = cookie_pair(&set_cookies(&r)[0]);
    let csrf = csrf_cookie.split_once('=').unwrap().1.to_string();
    for (next, to) in [
        ("/d/dead?x=1", "/d/dead?x=1"),
        ("https://evil.example/d/", "/d/"),
        ("//evil.example/d/", "/d/"),
        ("/elsewhere", "/d/"),
        ("/d/../x", "/d/../x"),
    ] {
        let r = call(
            &app,
            TestRequest::post()
                .uri("/d/login")
                .insert_header(("cookie", csrf_cookie.clone()))
                .set_form([("token", TOKEN), ("csrf", &csrf), ("next", next)]),
        )
        .await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{next}");
        assert_eq!(r.headers.get("location").unwrap(), to, "{next}");
    }
}

/// A guessing run of wrong bearer tokens from one address, 40 at once and again: few are
/// checked (the rest refused with 429 and Retry-After), each failure is logged at WARN
/// without the token, and the right token from another address still works meanwhile.
#[actix_web::test]
async fn token_guessing_is_throttled_while_the_right_token_works() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Buf::default();
    let w = logs.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    );
    let e = env(Backend::Sqlite).await;
    let app = app!(e.client, cfg());
    let started = std::time::Instant::now();
    let (mut checked, mut refused) = (0, 0);
    let guess = "wrong-token-number-0000000000";
    while started.elapsed() < Duration::from_secs(2) {
        let runs = (0..40).map(|_| {
            from(
                &app,
                "10.9.9.9:4000",
                "dash.example",
                TestRequest::get()
                    .uri("/d/jobs")
                    .insert_header(("authorization", format!("Bearer {guess}"))),
            )
        });
        for r in futures_util::future::join_all(runs).await {
            match r.status {
                StatusCode::TOO_MANY_REQUESTS => {
                    refused += 1;
                    assert!(r.headers.contains_key("retry-after"));
                    assert!(r.body.contains("too many failed logins"), "{}", r.body);
                }
                StatusCode::SEE_OTHER => checked += 1,
                s => panic!("{s}: {}", r.body),
            }
        }
        // The right token, from another address, while the run goes on.
        let r = from(
            &app,
            "10.8.8.8:4000",
            "dash.example",
            TestRequest::get()
                .uri("/d/jobs")
                .insert_header(("authorization", format!("Bearer {TOKEN}"))),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "the right token during a guessing run"
        );
    }
    // Over 2 s one address's guesses are checked a few times a second at most
    // (0.25 s, 0.5 s, 1 s, ... pauses), however many it sends at once.
    assert!(
        checked <= 6,
        "{checked} guesses checked in 2 s ({refused} refused)"
    );
    assert!(refused >= 100, "{refused} refused");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warned = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("wrong login token"))
        .count();
    assert_eq!(warned, checked, "one WARN per failure:\n{text}");
    assert!(text.contains("10.9.9.9"), "{text}");
    assert!(
        !text.contains(guess) && !text.contains(TOKEN),
        "a token in the log:\n{text}"
    );
    // After its pause, the right token from the guessing address works too.
    let deadline = std::time::Instant::now() + Duration::from_secs(12);
    loop {
        let r = from(
            &app,
            "10.9.9.9:4000",
            "dash.example",
            TestRequest::get()
                .uri("/d/jobs")
                .insert_header(("authorization", format!("Bearer {TOKEN}"))),
        )
        .await;
        if r.status == StatusCode::OK {
            break;
        }
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(std::time::Instant::now() < deadline, "never let in");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A queue that only holds jobs (no node serves it, no settings stored) is listed on the
/// Queues page and can be paused from it: an operator can stop it while its workers are
/// down.
pub(crate) async fn a_queue_with_only_jobs_is_listed_and_can_be_paused(b: Backend) {
    let e = env(b).await;
    for i in 0..3 {
        e.client
            .enqueue(NewJob::new("charge", json!({ "i": i })).queue("billing"))
            .await
            .unwrap();
    }
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("data-queue=\"billing\""), "{}", r.body);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", cookie.clone()))
            .set_form([("queue", "billing"), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(e
        .client
        .queue("billing")
        .await
        .unwrap()
        .unwrap()
        .is_paused());
}

/// A job scheduled for later gets a "Run now" button; pressed, it is due now; pressed from
/// a stale page, it answers like a stale cancel.
pub(crate) async fn run_now_makes_a_scheduled_job_due(b: Backend) {
    let e = env(b).await;
    let later = e
        .client
        .enqueue(
            NewJob::new("report", json!({}))
                .queue("later")
                .delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap()
        .id;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", later.0))
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("id=\"run_now-job\""), "{}", r.body);
    let seen = e.client.get(later).await.unwrap();
    let v = seen.version.to_string();
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/run_now", later.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("due now"), "{}", r.body);
    let now = e.client.get(later).await.unwrap();
    assert!(now.run_at <= chrono::Utc::now(), "{:?}", now.run_at);
    // The same page again (its version is old now): refused as stale.
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/run_now", later.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.body.contains("changed since this page was loaded"),
        "{}",
        r.body
    );
    // A due job shows no button.
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", later.0))
            .insert_header(("cookie", cookie)),
    )
    .await;
    assert!(!r.body.contains("id=\"run_now-job\""), "{}", r.body);
}

/// A job's page tells its story: a batch's callback lists its members (its parents), a
/// member lists the callback (its child), each linked with its state and policy; a job
/// without effects says so.
pub(crate) async fn a_job_page_shows_its_parents_children_and_effects(b: Backend) {
    let e = env(b).await;
    let batch = e
        .client
        .enqueue_batch(
            vec![
                NewJob::new("part", json!({"n": 1})).queue("parts"),
                NewJob::new("part", json!({"n": 2})).queue("parts"),
            ],
            NewJob::new("all_done", json!({})).queue("parts"),
        )
        .await
        .unwrap();
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let page = |id: i64| {
        call(
            &app,
            TestRequest::get()
                .uri(&format!("/d/jobs/{id}"))
                .insert_header(("cookie", cookie.clone())),
        )
    };
    let cb = batch.callback.id.0;
    let r = page(cb).await;
    assert!(r.body.contains("<table id=\"parents\">"), "{}", r.body);
    for m in &batch.members {
        assert!(
            r.body
                .contains(&format!("<a href=\"/d/jobs/{0}\">{0}</a>", m.id.0)),
            "member {} linked: {}",
            m.id.0,
            r.body
        );
    }
    assert!(r.body.contains("the child runs anyway"), "{}", r.body);
    assert!(r.body.contains("2 parent(s)"), "{}", r.body);
    let r = page(batch.members[0].id.0).await;
    assert!(r.body.contains("<table id=\"children\">"), "{}", r.body);
    assert!(
        r.body
            .contains(&format!("<a href=\"/d/jobs/{cb}\">{cb}</a>")),
        "{}",
        r.body
    );
    assert!(r.body.contains("id=\"no-effects\""), "{}", r.body);
}

/// The overview's chart has a time axis: every 15 minutes of the last hour (UTC), and now.
pub(crate) async fn the_chart_has_a_time_axis(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/")
            .insert_header(("cookie", cookie)),
    )
    .await;
    let labels: Vec<&str> = r
        .body
        .split("<text class=\"axis\"")
        .skip(1)
        .map(|t| {
            let t = &t[t.find('>').unwrap() + 1..];
            &t[..t.find('<').unwrap()]
        })
        .collect();
    assert_eq!(labels.len(), 5, "{labels:?}");
    assert_eq!(labels[4], "now");
    let first = (chrono::Utc::now() - chrono::Duration::minutes(60))
        .format("%H:%M")
        .to_string();
    let first_late = (chrono::Utc::now() - chrono::Duration::minutes(61))
        .format("%H:%M")
        .to_string();
    assert!(labels[0] == first || labels[0] == first_late, "{labels:?}");
    for l in &labels[..4] {
        assert!(
            l.len() == 5 && l.as_bytes()[2] == b':',
            "{l} is not HH:MM: {labels:?}"
        );
    }
}
