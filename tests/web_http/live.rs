//! The live event stream over HTTP: refused without a login (401, never the login page's
//! HTML); a job page names its stream; the stream says `change` within a second of the job
//! it watches ending; a logout ends it with `expired`.

use std::pin::Pin;
use std::time::Instant;

use super::*;

/// The next chunk of an event stream, or `None` when it ended or `within` passed.
async fn chunk<B: MessageBody>(body: &mut Pin<&mut B>, within: Duration) -> Option<String> {
    let next = futures_util::future::poll_fn(|cx| body.as_mut().poll_next(cx));
    match tokio::time::timeout(within, next).await {
        Ok(Some(Ok(b))) => Some(String::from_utf8_lossy(&b).into_owned()),
        _ => None,
    }
}

/// Reads chunks until one contains `what`, at most `within`: how long it took.
async fn until<B: MessageBody>(body: &mut Pin<&mut B>, what: &str, within: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Some(c) = chunk(body, within.saturating_sub(start.elapsed())).await {
            if c.contains(what) {
                return start.elapsed();
            }
        } else {
            break;
        }
    }
    panic!("{what:?} not sent within {within:?}");
}

pub(crate) async fn the_event_stream_pushes_a_finished_job(b: Backend) {
    let e = env(b).await;
    let store = e.db.store().await;
    let app = app!(e.client, cfg());
    // Without a login: 401, for the page's script to see, not a redirect to HTML.
    let r = call(&app, TestRequest::get().uri("/d/events")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/events")
            .insert_header(("cookie", "jobvisor_session=forged")),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
    let (cookie, csrf) = login(&app, TOKEN).await;
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/events?watch=12")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);

    // The running job's page names its stream, with the version it shows.
    let job = e.client.get(e.running).await.unwrap();
    let events = format!("/d/events?watch={}.{}&job=1", job.id.0, job.version);
    let r = call(
        &app,
        TestRequest::get()
            .uri(&format!("/d/jobs/{}", job.id.0))
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert!(
        r.body
            .contains(&format!("data-events=\"{}\"", events.replace('&', "&amp;"))),
        "{}",
        r.body
    );
    let resp = test::call_service(
        &app,
        TestRequest::get()
            .uri(&events)
            .peer_addr("127.0.0.1:5555".parse().unwrap())
            .insert_header(("host", "localhost:8080"))
            .insert_header(("cookie", cookie.clone()))
            .to_request(),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let body = resp.into_body();
    let mut body = std::pin::pin!(body);
    assert!(chunk(&mut body, Duration::from_secs(1))
        .await
        .unwrap()
        .starts_with("retry:"));
    // Nothing changes: nothing is said (a one-job page follows its job only).
    assert!(chunk(&mut body, Duration::from_millis(600)).await.is_none());
    // The job ends: `change` within a second.
    store
        .job_finalize_many(FinalizeParams {
            items: vec![Finalize::succeeded(
                e.running,
                e.token.clone(),
                json!({"ok": true}),
            )],
            now: None,
        })
        .await
        .unwrap();
    let took = until(&mut body, "event: change", Duration::from_secs(1)).await;
    eprintln!("{b:?}: change sent {took:?} after the job ended");
    // A logout on any worker ends the stream: `expired`, then the end.
    let r = call(
        &app,
        TestRequest::post()
            .uri("/d/logout")
            .insert_header(("cookie", cookie.clone()))
            .set_form([("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    // The stream wakes at its next signal or keep-alive; a new job moves the signal.
    let other = e
        .client
        .enqueue(NewJob::new("nudge", json!({})).queue("busy"))
        .await
        .unwrap();
    let _ = other;
    until(&mut body, "event: expired", Duration::from_secs(20)).await;
    assert!(
        chunk(&mut body, Duration::from_secs(1)).await.is_none(),
        "the stream ends"
    );
}
