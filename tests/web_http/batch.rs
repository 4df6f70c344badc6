//! A batch's view over HTTP: its callback and members, counted by how they ended, linked
//! from the callback's page and from each member's.

use super::*;

pub(crate) async fn a_batch_has_a_view_linked_from_its_jobs(b: Backend) {
    let e = env(b).await;
    let app = app!(e.client, cfg());
    let (cookie, _) = login(&app, TOKEN).await;
    let members = (0..3)
        .map(|i| NewJob::new("part", json!({"i": i})).queue("parts"))
        .collect();
    let batch = e
        .client
        .enqueue_batch(members, NewJob::new("all_done", json!({})).queue("parts"))
        .await
        .unwrap();
    let first = batch.members[0].id;
    e.client.cancel(first).await.unwrap();
    let cb = batch.callback.id;
    let get = |uri: String| {
        TestRequest::get()
            .uri(&uri)
            .insert_header(("cookie", cookie.clone()))
    };
    let r = call(&app, get(format!("/d/batches/{}", cb.0))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("<dd id=\"batch-total\">3</dd>"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("<dd id=\"batch-ended\">1 of 3</dd>"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("id=\"batch-cancelled\">1</dd>"),
        "{}",
        r.body
    );
    for m in &batch.members {
        assert!(
            r.body.contains(&format!("href=\"/d/jobs/{}\"", m.id.0)),
            "{}",
            r.body
        );
    }
    assert!(
        r.body.contains("data-events="),
        "live while the callback waits"
    );
    // Linked from the callback's page and from a member's.
    let r = call(&app, get(format!("/d/jobs/{}", cb.0))).await;
    assert!(
        r.body.contains(&format!("href=\"/d/batches/{}\"", cb.0)),
        "{}",
        r.body
    );
    let r = call(&app, get(format!("/d/jobs/{}", first.0))).await;
    assert!(
        r.body.contains(&format!("href=\"/d/batches/{}\"", cb.0)),
        "{}",
        r.body
    );
    // A job without parents: said so.
    let r = call(&app, get(format!("/d/batches/{}", e.pending.0))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("id=\"no-members\""), "{}", r.body);
}
