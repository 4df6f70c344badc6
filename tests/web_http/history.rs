//! History over HTTP: the throughput rollup's counts, succeeded and failed per queue over a
//! day, shown from the rollup alone — the jobs it counted two hours ago are archived and
//! pruned before the page is read, and still counted.

use super::*;

pub(crate) async fn history_shows_a_day_from_the_rollup(b: Backend) {
    let e = env(b).await;
    let store = e.db.store().await;
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let then = chrono::Utc::now() - chrono::Duration::hours(2);
    for ok in [true, true, false] {
        store
            .job_enqueue(
                NewJob::new("old", json!({})).queue("hist").max_attempts(1),
                Some(then),
            )
            .await
            .unwrap();
        let c = store
            .job_claim(ClaimParams {
                queue: "hist".into(),
                owner: NodeId::new("web-test").unwrap(),
                limit: 1,
                kinds: None,
                lease: Duration::from_secs(60),
                now: Some(then),
            })
            .await
            .unwrap()
            .pop()
            .unwrap();
        let end = if ok {
            Finalize::succeeded(c.id, c.token, json!({}))
        } else {
            Finalize::dead(c.id, c.token, JobFailure::new("boom", "failed", 1))
        };
        store
            .job_finalize_many(FinalizeParams {
                items: vec![end],
                now: Some(then),
            })
            .await
            .unwrap();
    }
    // The gauges' turn two hours ago rolled them up.
    assert_eq!(
        store
            .throughput_roll(then + chrono::Duration::seconds(1))
            .await
            .unwrap(),
        1
    );
    // The jobs go: archived, then pruned. The page reads the rollup only.
    e.client
        .archive(Duration::ZERO, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    e.client.prune(Duration::ZERO).await.unwrap();
    for archived in [false, true] {
        let left = e
            .client
            .list(jobvisor::ListParams {
                queue: Some("hist".into()),
                archived,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
    let r = call(
        &app,
        TestRequest::get()
            .uri("/d/history")
            .insert_header(("cookie", cookie.clone())),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("href=\"/d/history\""), "in the navigation");
    let at = r
        .body
        .find("id=\"history-hist\"")
        .unwrap_or_else(|| panic!("{}", r.body));
    let section = &r.body[r.body[..at].rfind("<section").unwrap()..];
    assert!(
        section.contains("<span class=\"state-succeeded history-ok\">2</span>"),
        "{section}"
    );
    assert!(
        section.contains("<span class=\"state-dead history-failed\">1</span>"),
        "{section}"
    );
    assert!(
        section.contains("2 succeeded") && section.contains("1 failed"),
        "{section}"
    );
    assert!(section.contains("class=\"axis\""), "a time axis");
}
