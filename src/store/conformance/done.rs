//! Conformance cases. Ended jobs announced to their waits: a transition that ends jobs
//! notifies `jobvisor_done` with exactly those of them a wait registered (PostgreSQL), and
//! nothing when none is waited on; a wait's row goes with it, and a stale one with the next
//! registration. The other backends register nothing and have no listener: their waits poll.

use super::*;

/// The rows of `jobvisor_waits` (PostgreSQL), as `(job_id, waiters)` sorted.
async fn wait_rows(store: &Store) -> Vec<(i64, i32)> {
    wait_rows_or_err(store).await.unwrap()
}

async fn wait_rows_or_err(store: &Store) -> crate::error::Result<Vec<(i64, i32)>> {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        job_id: i64,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        waiters: i32,
    }
    let q = "SELECT job_id, waiters FROM jobvisor_waits ORDER BY job_id";
    let rows: Vec<Row> =
        super::super::driver::with_conn!(store, |conn| diesel::sql_query(q).load(conn).await)?;
    Ok(rows.into_iter().map(|r| (r.job_id, r.waiters)).collect())
}

/// The next `jobvisor_done` notification's ids, sorted.
async fn next_done(l: &mut Listener, what: &str) -> Vec<i64> {
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), l.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: a notification within 10 s"))
            .expect("listener open")
            .unwrap();
        if let super::Notice::Done(mut ids) = n {
            ids.sort_unstable();
            return ids;
        }
    }
}

/// A finalize batch that ends waited and unwaited jobs names the waited ones it ended —
/// succeeded, dead (also by a retry past its attempts) — and no other: not an unwaited
/// end, not a waited retry or give-back. A batch that ends only unwaited jobs notifies
/// nothing (the cancel's notification after it is the next one heard), and a cancel of a
/// waited job that was not running names it. A wait's row is counted per waiter and goes
/// with the last; a job that has ended registers nothing; a stale row goes with the next
/// registration.
pub async fn a_jobs_end_is_announced_to_its_waits_alone(b: Backend) {
    let t = Bundle::new(b).await;
    let mut ids = Vec::new();
    for i in 0..9 {
        let job = NewJob::new("k", json!(i)).max_attempts(if i == 5 { 1 } else { 3 });
        ids.push(t.enqueue(job, 0).await);
    }
    let ttl = Duration::from_secs(60);
    let Some(mut l) = t.store.listen_done().await.unwrap() else {
        assert!(
            !t.store.notifies(),
            "[{b:?}] a notifying store offers a listener"
        );
        assert!(
            !t.store.wait_register(ids[0], ttl).await.unwrap(),
            "[{b:?}] no registry: waits poll"
        );
        return;
    };
    // Waited: 0 (succeeds), 1 (retried), 2 (dead), 4 (given back), 5 (dead by its retry), 8
    // (cancelled later, not running); 0 twice. Not waited: 3 (cancelled), 6 and 7.
    for i in [0, 0, 1, 2, 4, 5, 8] {
        assert!(t.store.wait_register(ids[i], ttl).await.unwrap(), "{i}");
    }
    let rows = wait_rows(&t.store).await;
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert!(
        rows.contains(&(ids[0].0, 2)),
        "two waits on one job: {rows:?}"
    );

    let c = t.claim("default", "n", 9, 0).await;
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
    let mut want: Vec<i64> = [0, 2, 5].iter().map(|&i| ids[i].0).collect();
    want.sort_unstable();
    assert_eq!(
        next_done(&mut l, "the finalize").await,
        want,
        "the waited jobs it ended, in one notification, and no other"
    );

    // Nobody waits on 6 and 7: nothing is notified for them.
    t.finalize_many(
        vec![
            Finalize::succeeded(ids[6], token(ids[6]), json!("ok")),
            Finalize::dead(ids[7], token(ids[7]), err("bad", 1)),
        ],
        2,
    )
    .await;
    // 8 is claimed (running): given back first, so the cancel ends it at once.
    t.finalize_many(
        vec![Finalize::requeue(
            ids[8],
            token(ids[8]),
            Duration::from_secs(60),
        )],
        2,
    )
    .await;
    let out = t
        .store
        .job_cancel(CancelParams {
            id: ids[8],
            now: t.at(3),
        })
        .await
        .unwrap();
    assert!(matches!(out, CancelOutcome::Cancelled(_)), "{out:?}");
    assert_eq!(
        next_done(&mut l, "the cancel").await,
        vec![ids[8].0],
        "the cancelled job next: the unwaited batch notified nothing"
    );

    // An ended job registers nothing; a wait's row goes with its last waiter.
    assert!(!t.store.wait_register(ids[0], ttl).await.unwrap());
    t.store.wait_unregister(ids[0]).await.unwrap();
    assert!(wait_rows(&t.store).await.contains(&(ids[0].0, 1)));
    for i in [0, 1, 2, 4, 5, 8] {
        t.store.wait_unregister(ids[i]).await.unwrap();
    }
    assert_eq!(
        wait_rows(&t.store).await,
        vec![],
        "every wait's row removed"
    );

    // A registration outliving its ttl (a waiter that died) goes with the next one.
    assert!(t.store.wait_register(ids[1], Duration::ZERO).await.unwrap());
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(t.store.wait_register(ids[4], ttl).await.unwrap());
    assert_eq!(
        wait_rows(&t.store).await,
        vec![(ids[4].0, 1)],
        "the stale row deleted"
    );
}

/// The drain's statement — a batch of successes alone — names the waited job it ended and
/// no other, and a replacing enqueue that cancels the pending holder of its key names the
/// holder.
pub async fn successes_alone_and_a_cancelled_holder_are_announced(b: Backend) {
    use crate::job::OnDuplicate;
    let t = Bundle::new(b).await;
    let waited = t.enqueue(NewJob::new("k", json!(1)), 0).await;
    let other = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let keyed = |tag: i64| {
        NewJob::new("r", json!(tag))
            .queue("keyed")
            .unique_key("digest")
            .on_duplicate(OnDuplicate::CancelAndInsert)
    };
    let holder = t.enqueue(keyed(3), 0).await;
    let ttl = Duration::from_secs(60);
    let Some(mut l) = t.store.listen_done().await.unwrap() else {
        assert!(
            !t.store.notifies(),
            "[{b:?}] a notifying store offers a listener"
        );
        return;
    };
    assert!(t.store.wait_register(waited, ttl).await.unwrap());
    assert!(t.store.wait_register(holder, ttl).await.unwrap());

    let c = t.claim("default", "n", 2, 0).await;
    assert_eq!(c.len(), 2);
    t.finalize_many(
        c.iter()
            .map(|c| Finalize::succeeded(c.id, c.token.clone(), json!("ok")))
            .collect(),
        1,
    )
    .await;
    assert_eq!(
        next_done(&mut l, "the successes").await,
        vec![waited.0],
        "the waited success, not {other:?}"
    );

    let e = t.store.job_enqueue(keyed(4), t.at(2)).await.unwrap();
    assert!(!e.duplicate && e.id != holder, "{e:?}");
    assert_eq!(
        next_done(&mut l, "the replacing enqueue").await,
        vec![holder.0],
        "the cancelled holder"
    );
}
