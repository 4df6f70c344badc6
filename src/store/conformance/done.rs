//! Conformance cases. Ended jobs: a finalize announces the ids of the jobs it ended
//! (PostgreSQL: one `jobvisor_done` notification for the batch), which
//! [`Client::wait`](crate::Client::wait) listens for; the other backends have no listener.

use super::*;

/// A batch that ends some jobs and not others names exactly the ended ones — succeeded,
/// dead (also by a retry past its attempts), cancelled — in one notification; a retry and a
/// give-back are not named. A cancel of a job that was not running names it.
pub async fn a_finalize_announces_the_jobs_it_ended(b: Backend) {
    let t = Bundle::new(b).await;
    let Some(mut l) = t.store.listen_done().await.unwrap() else {
        assert_ne!(b, Backend::Postgres, "PostgreSQL listens");
        return;
    };
    let mut ids = Vec::new();
    for i in 0..6 {
        let job = NewJob::new("k", json!(i)).max_attempts(if i == 5 { 1 } else { 3 });
        ids.push(t.enqueue(job, 0).await);
    }
    let c = t.claim("default", "n", 6, 0).await;
    let token = |id: JobId| c.iter().find(|c| c.id == id).unwrap().token.clone();
    t.finalize_many(
        vec![
            Finalize::succeeded(ids[0], token(ids[0]), json!("ok")),
            Finalize::retry(ids[1], token(ids[1]), err("flaky", 1), Duration::ZERO),
            Finalize::dead(ids[2], token(ids[2]), err("bad", 1)),
            Finalize::cancelled(ids[3], token(ids[3]), err("cancelled", 1)),
            Finalize::requeue(ids[4], token(ids[4]), Duration::from_secs(60)),
            Finalize::retry(ids[5], token(ids[5]), err("timeout", 1), Duration::ZERO),
        ],
        1,
    )
    .await;
    let mut want: Vec<i64> = [0, 2, 3, 5].iter().map(|&i| ids[i].0).collect();
    want.sort_unstable();
    let ours = |n: &[i64]| n.iter().any(|id| ids.iter().any(|o| o.0 == *id));
    let got = loop {
        let n = tokio::time::timeout(Duration::from_secs(10), l.next())
            .await
            .expect("the finalize's notification within 10 s")
            .expect("listener open")
            .unwrap();
        // The channel is database-wide: other cases' ends are skipped.
        if let super::Notice::Done(mut n) = n {
            if ours(&n) {
                n.sort_unstable();
                break n;
            }
        }
    };
    assert_eq!(
        got, want,
        "the ended jobs, in one notification, and no other"
    );

    let out = t
        .store
        .job_cancel(CancelParams {
            id: ids[4],
            now: t.at(2),
        })
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::Cancelled(_)), "{out:?}");
    let got = loop {
        let n = tokio::time::timeout(Duration::from_secs(10), l.next())
            .await
            .expect("the cancel's notification within 10 s")
            .expect("listener open")
            .unwrap();
        if let super::Notice::Done(n) = n {
            if ours(&n) {
                break n;
            }
        }
    };
    assert_eq!(got, vec![ids[4].0], "the cancelled job");
}
