//! Actions over HTTP: the stale-page guard, bulk actions with their preview, queue
//! changes, loopback-only without authentication and the authorizer, and the labelled
//! estimates on big tables (the cases `main.rs` runs on every backend).

use super::*;

pub(crate) async fn stale_pages_cannot_resurrect_jobs(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let seen = e.client.get(e.dead).await.unwrap();
    // Someone else retries it, and it succeeds... here: it is retried and cancelled again.
    e.client.retry(e.dead).await.unwrap();
    e.client.cancel(e.dead).await.unwrap();
    let now = e.client.get(e.dead).await.unwrap();
    assert_eq!(now.state, JobState::Cancelled);
    let v = seen.version.to_string();
    for action in ["retry", "delete"] {
        let r = call(
            &app,
            TestRequest::post()
                .uri(&format!("/d/jobs/{}/{action}", e.dead.0))
                .insert_header(("cookie", cookie.clone()))
                .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
        )
        .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{action}: {}", r.body);
        assert!(
            r.body.contains("changed since this page was loaded"),
            "{}",
            r.body
        );
        assert_eq!(
            e.client.get(e.dead).await.unwrap().version,
            now.version,
            "nothing written"
        );
    }
    // Cancel from a stale page of the pending job.
    let p = e.client.get(e.pending).await.unwrap();
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/cancel", e.pending.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("version", (p.version - 1).to_string().as_str()),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        e.client.get(e.pending).await.unwrap().state,
        JobState::Pending
    );
    // A retry of a job already retried elsewhere (pending now): answered like a stale page.
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/retry", e.pending.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("version", p.version.to_string().as_str()),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        r.body.contains("changed since this page was loaded") && !r.body.contains("cannot go"),
        "{}",
        r.body
    );
    // With the current version: asked to confirm, then deleted.
    let v = now.version.to_string();
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/delete", e.dead.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([("version", v.as_str()), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("cannot be undone"), "{}", r.body);
    assert!(e.client.get(e.dead).await.is_ok(), "not yet deleted");
    let r = call(
        &app,
        TestRequest::post()
            .uri(&format!("/d/jobs/{}/delete", e.dead.0))
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("version", v.as_str()),
                ("confirm", "yes"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("deleted"), "{}", r.body);
    assert!(matches!(
        e.client.get(e.dead).await,
        Err(jobvisor::Error::NotFound { .. })
    ));
}

/// The confirmation form's pinned jobs in a preview page.
pub(crate) fn pin_in(body: &str) -> String {
    let at = body
        .find("name=\"pin\" value=\"")
        .unwrap_or_else(|| panic!("no pin in the preview:\n{body}"));
    let rest = &body[at + "name=\"pin\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

pub(crate) async fn bulk_actions_preview_then_apply(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    for i in 0..5 {
        e.client
            .enqueue(
                NewJob::new("bulk", json!({"i": i}))
                    .queue("many")
                    .delay(Duration::from_secs(600)),
            )
            .await
            .unwrap();
    }
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs/bulk?action=cancel&queue=many")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("<strong id=\"bulk-n\">5</strong>"),
        "{}",
        r.body
    );
    assert_eq!(
        e.client
            .list(jobvisor::ListParams {
                queue: Some("many".into()),
                state: Some(JobState::Cancelled),
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        0,
        "a preview changes nothing"
    );
    let pin = pin_in(&r.body);
    // Meanwhile: 3 more jobs come to match, and one of the 5 is cancelled elsewhere.
    let mut late = Vec::new();
    for i in 0..3 {
        late.push(
            e.client
                .enqueue(
                    NewJob::new("bulk", json!({"late": i}))
                        .queue("many")
                        .delay(Duration::from_secs(600)),
                )
                .await
                .unwrap()
                .id,
        );
    }
    let first: i64 = pin.split('.').next().unwrap().parse().unwrap();
    e.client.cancel(JobId(first)).await.unwrap();
    // Without the preview's pin: refused, nothing done.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/jobs/bulk")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("action", "cancel"),
                ("queue", "many"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("open the preview again"), "{}", r.body);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/jobs/bulk")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("action", "cancel"),
                ("queue", "many"),
                ("pin", pin.as_str()),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("4 job(s) cancelled") && r.body.contains("1 skipped"),
        "{}",
        r.body
    );
    let cancelled = e
        .client
        .list(jobvisor::ListParams {
            queue: Some("many".into()),
            state: Some(JobState::Cancelled),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 5);
    for id in &late {
        assert_eq!(
            e.client.get(*id).await.unwrap().state,
            JobState::Pending,
            "a job that came to match after the preview is left alone"
        );
    }
    // Retry them by the same filter, after its preview; and the dead-letter group.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs/bulk?action=retry&queue=many&state=cancelled")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    let pin = pin_in(&r.body);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/jobs/bulk")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("action", "retry"),
                ("queue", "many"),
                ("state", "cancelled"),
                ("pin", pin.as_str()),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert!(r.body.contains("5 job(s) retried"), "{}", r.body);
    // The group's retry asks first.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/dead/retry")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("kind", XSS_KIND),
                ("code", "boom"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body
            .contains("id=\"confirm-question\">Retry 1 dead job(s)"),
        "{}",
        r.body
    );
    assert_eq!(
        e.client.get(e.dead).await.unwrap().state,
        JobState::Dead,
        "not yet"
    );
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/dead/retry")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("kind", XSS_KIND),
                ("code", "boom"),
                ("confirm", "yes"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("1 dead job(s)"), "{}", r.body);
    assert_eq!(e.client.get(e.dead).await.unwrap().state, JobState::Pending);
    // Text search in payloads, bounded and labelled.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs?text=%22i%22%3A3")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("Payload search looked at"), "{}", r.body);
    assert_eq!(
        r.body.matches("<td class=\"kind\">bulk</td>").count(),
        1,
        "{}",
        r.body
    );
}

pub(crate) async fn queues_pause_and_limits(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", cookie.clone()))
            .set_form([("queue", "busy"), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let q = e.client.queue("busy").await.unwrap().unwrap();
    assert!(q.is_paused());
    // Who paused it: the login and the address, shown on the Queues page.
    let by = q.paused_by.clone().unwrap_or_default();
    assert_eq!(by, "dashboard login (token) from 127.0.0.1", "{by}");
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(
        r.body
            .contains(" by dashboard login (token) from 127.0.0.1"),
        "{}",
        r.body
    );
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/limits")
            .insert_header(("cookie", cookie.clone()))
            .set_form([
                ("queue", "busy"),
                ("concurrency", "3"),
                ("rate_jobs", "10"),
                ("rate_per", "2s"),
                ("csrf", csrf.as_str()),
            ]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let q = e.client.queue("busy").await.unwrap().unwrap();
    assert_eq!(q.limits.concurrency, Some(3));
    assert_eq!(q.limits.rate.unwrap().per(), Duration::from_secs(2));
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("concurrency 3"), "{}", r.body);
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/resume")
            .insert_header(("cookie", cookie.clone()))
            .set_form([("queue", "busy"), ("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!e.client.queue("busy").await.unwrap().unwrap().is_paused());
}

pub(crate) async fn without_auth_only_loopback(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, DashboardConfig::without_auth());
    let r = call(&app, TestRequest::get().uri("/d/jobs")).await;
    assert_eq!(r.status, StatusCode::OK, "loopback");
    let resp = test::call_service(
        &app,
        TestRequest::get()
            .uri("/d/jobs")
            .peer_addr("10.1.2.3:4000".parse().unwrap())
            .to_request(),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(DashboardConfig::without_auth()
        .check_listen("0.0.0.0:8080".parse().unwrap())
        .is_err());
    assert!(DashboardConfig::without_auth()
        .check_listen("127.0.0.1:8080".parse().unwrap())
        .is_ok());
    assert!(DashboardConfig::with_token("short").is_err());
    // The embedding application's authorizer decides.
    let app = app!(
        e.client,
        DashboardConfig::with_authorizer(|req| {
            (req.headers().get("x-user").and_then(|v| v.to_str().ok()) == Some("ops"))
                .then_some(Access::Full)
        })
    );
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs")
            .insert_header(("x-user", "ops")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs")
            .insert_header(("x-user", "eve")),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
}

pub(crate) async fn big_tables_show_labelled_estimates(b: Backend) {
    let e = env(b).await;
    jobvisor::metrics::DatabaseGauges::new(
        e.client.store().clone(),
        "web-test",
        Duration::from_secs(15),
    )
    .unwrap()
    .refresh()
    .await
    .unwrap();
    // Three live jobs: above a limit of 2 the pages use the gauges and say so.
    let app = app!(e.client, cfg().exact_count_limit(2));
    let (cookie, _) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("id=\"estimate\""), "{}", r.body);
    assert!(
        r.body.contains("estimate: more than 2 live jobs"),
        "{}",
        r.body
    );
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/queues")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("id=\"estimate\""), "{}", r.body);
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/nodes")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(r.body.contains("id=\"unserved-skipped\""), "{}", r.body);
    // At or under the limit: exact counts, no label.
    let app = app!(e.client, cfg().exact_count_limit(3));
    let (cookie, _) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(!r.body.contains("id=\"estimate\""), "{}", r.body);
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/nodes")
            .insert_header(("cookie", cookie)),
    )
    .await;
    assert!(!r.body.contains("unserved-skipped"), "{}", r.body);
}
