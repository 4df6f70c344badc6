//! The audit log over HTTP: a row per dashboard action with who, what, the target (a job, a
//! queue, a bulk action's filter) and the exact count changed; a refused (stale) action
//! recorded as not carried out; the application's identity recorded as a paused queue's
//! `paused_by` too; the `/audit` page; the prune with the archive's retention.

use super::*;
use jobvisor::web::Identity;

pub(crate) async fn every_action_is_audited(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, csrf) = login(&app, TOKEN).await;
    let post = |uri: String, form: Vec<(&'static str, String)>| {
        TestRequest::post()
            .uri(&uri)
            .insert_header(("cookie", cookie.clone()))
            .set_form(form)
    };
    // A job's cancel.
    let p = e.client.get(e.pending).await.unwrap();
    let r = call(
        &app,
        post(
            format!("/d/jobs/{}/cancel", e.pending.0),
            vec![("version", p.version.to_string()), ("csrf", csrf.clone())],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // A stale retry (the page's version is old): refused, and recorded as refused.
    let r = call(
        &app,
        post(
            format!("/d/jobs/{}/retry", e.dead.0),
            vec![("version", "0".into()), ("csrf", csrf.clone())],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    // A bulk cancel of the 3 previewed jobs, while a 4th comes to match.
    for i in 0..3 {
        e.client
            .enqueue(
                NewJob::new("aud", json!({"i": i}))
                    .queue("audited")
                    .delay(Duration::from_secs(600)),
            )
            .await
            .unwrap();
    }
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/jobs/bulk?action=cancel&queue=audited")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    let pin = pin_in(&r.body);
    e.client
        .enqueue(
            NewJob::new("aud", json!({"late": 1}))
                .queue("audited")
                .delay(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let r = call(
        &app,
        post(
            "/d/jobs/bulk".into(),
            vec![
                ("action", "cancel".into()),
                ("queue", "audited".into()),
                ("pin", pin),
                ("csrf", csrf.clone()),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // A queue's pause.
    let r = call(
        &app,
        post(
            "/d/queues/pause".into(),
            vec![("queue", "audited".into()), ("csrf", csrf.clone())],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    let log = e.client.audit(None, 100).await.unwrap();
    let seen: Vec<(&str, &str, u64, bool)> = log
        .iter()
        .map(|a| (a.action.as_str(), a.target.as_str(), a.jobs, a.ok))
        .collect();
    let pending = format!("job {}", e.pending.0);
    let dead = format!("job {}", e.dead.0);
    assert_eq!(
        seen,
        vec![
            ("queue.pause", "queue audited", 0, true),
            ("bulk.cancel", "jobs matching queue=audited", 3, true),
            ("job.retry", dead.as_str(), 0, false),
            ("job.cancel", pending.as_str(), 1, true),
        ],
        "newest first, one row per action: {log:#?}"
    );
    for a in &log {
        assert!(
            a.who.starts_with("dashboard login (token) from 127.0.0.1"),
            "{a:?}"
        );
    }
    assert!(
        log[2]
            .outcome
            .contains("changed since this page was loaded"),
        "{:?}",
        log[2]
    );
    // The pause records the same identity as the log.
    let q = e.client.queue("audited").await.unwrap().unwrap();
    assert_eq!(q.paused_by.as_deref(), Some(log[0].who.as_str()));

    // The page, newest first, linked from the navigation.
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/audit")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("href=\"/d/audit\""), "{}", r.body);
    let at = |s: &str| {
        r.body
            .find(s)
            .unwrap_or_else(|| panic!("{s} not in {}", r.body))
    };
    assert!(at("queue.pause") < at("bulk.cancel") && at("bulk.cancel") < at("job.cancel"));
    assert_eq!(r.body.matches("class=\"audit-row\"").count(), 4);

    // Kept with the archive's retention: a prune of a day keeps them, one of zero drops them.
    e.client.prune(Duration::from_secs(86_400)).await.unwrap();
    assert_eq!(e.client.audit(None, 100).await.unwrap().len(), 4);
    tokio::time::sleep(Duration::from_millis(5)).await;
    e.client.prune(Duration::ZERO).await.unwrap();
    assert!(e.client.audit(None, 100).await.unwrap().is_empty());
}

/// An authorizer that names its user: the audit log and the pause record that name.
pub(crate) async fn the_applications_identity_is_recorded(b: Backend) {
    let e = env(b).await;
    let config = DashboardConfig::with_authorizer(|req| {
        use actix_web::HttpMessage;
        req.extensions_mut()
            .insert(Identity("alice@example.com".into()));
        Some(Access::Full)
    });
    let app = app!(e.client, config);
    let r = call(&app, TestRequest::get().uri("/d/queues")).await;
    let csrf = cookie_pair(&set_cookies(&r)[0]);
    let token = csrf.split_once('=').unwrap().1.to_string();
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/queues/pause")
            .insert_header(("cookie", csrf.clone()))
            .set_form([("queue", "busy"), ("csrf", token.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let log = e.client.audit(None, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert!(
        log[0]
            .who
            .starts_with("alice@example.com (the application's login)"),
        "{:?}",
        log[0]
    );
    let q = e.client.queue("busy").await.unwrap().unwrap();
    assert_eq!(q.paused_by.as_deref(), Some(log[0].who.as_str()));
}
