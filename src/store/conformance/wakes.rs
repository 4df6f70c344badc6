//! Conformance cases. Wakes: each transition that makes a job due now without a new id — a
//! dependency child released, a retry by hand, a reclaimed job given back due now — is
//! announced to the nodes of other processes (MariaDB, SQLite: the wake counter the change
//! signal reads; PostgreSQL: a notification of the job's queue), while an ordinary enqueue,
//! claim and finalization, a settle that releases nothing and a reclaim into a backoff
//! announce nothing.

use super::*;

/// How a backend announces: the wake counter, or its listener (the channel is database-wide,
/// so this case's queues carry a prefix of their own and other notices are ignored).
struct Watch {
    listener: Option<Listener>,
    prefix: String,
    wakes: i64,
}

impl Watch {
    async fn new(t: &Bundle) -> Self {
        Watch {
            listener: t.store.listen().await.unwrap(),
            prefix: format!("q{}-", uuid::Uuid::new_v4().simple()),
            wakes: t.store.change_signal(0).await.unwrap().wakes,
        }
    }

    fn q(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Asserts that `what` was announced (for `queue`), once.
    async fn announced(&mut self, t: &Bundle, queue: &str, what: &str) {
        let now = t.store.change_signal(0).await.unwrap().wakes;
        match &mut self.listener {
            None => assert_eq!(now, self.wakes + 1, "{what} moved the wake counter once"),
            Some(l) => {
                assert_eq!(now, self.wakes, "PostgreSQL notifies: the counter stays");
                let got = loop {
                    let n = tokio::time::timeout(Duration::from_secs(10), l.next())
                        .await
                        .unwrap_or_else(|_| panic!("{what}: a notification within 10 s"))
                        .expect("listener open")
                        .unwrap();
                    if let super::Notice::Due(q) = n {
                        if let Some(name) = q.strip_prefix(&self.prefix) {
                            break name.to_string();
                        }
                    }
                };
                assert_eq!(got, queue, "{what} notified its queue");
            }
        }
        self.wakes = now;
    }

    /// Asserts that nothing moved the counter (on PostgreSQL, left to the notified steps:
    /// each expects its own queue's notice next).
    async fn quiet(&self, t: &Bundle, what: &str) {
        let now = t.store.change_signal(0).await.unwrap().wakes;
        assert_eq!(now, self.wakes, "{what} moved the wake counter");
    }
}

pub async fn jobs_made_due_without_a_new_id_are_announced_and_nothing_else_is(b: Backend) {
    let t = Bundle::new(b).await;
    let mut w = Watch::new(&t).await;
    let claim = async |queue: &str, at: i64| {
        let mut got = t
            .store
            .job_claim(ClaimParams {
                queue: queue.into(),
                owner: NodeId::new("n1").unwrap(),
                limit: 1,
                kinds: None,
                lease: Duration::from_secs(30),
                now: t.at(at),
            })
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "one job of {queue} due at {at}");
        got.pop().unwrap()
    };

    // The hot path: enqueue, claim, succeed.
    let plain = w.q("plain");
    t.enqueue(NewJob::new("k", json!(0)).queue(&plain), 0).await;
    let c = claim(&plain, 1).await;
    t.finalize(Finalize::succeeded(c.id, c.token, json!(1)), 1)
        .await;
    w.quiet(&t, "an ordinary job's enqueue, claim and finalization")
        .await;

    // A child released by its parent's success.
    let (parents, children) = (w.q("parents"), w.q("children"));
    let p = t
        .enqueue(NewJob::new("k", json!(1)).queue(&parents), 2)
        .await;
    let child = t
        .enqueue(NewJob::new("k", json!(2)).queue(&children).after(&[p]), 2)
        .await;
    assert_eq!(t.get(child).await.state, JobState::Waiting);
    w.quiet(&t, "a child's enqueue").await;
    let c = claim(&parents, 3).await;
    // The parent's finalization settles its children.
    t.finalize(Finalize::succeeded(p, c.token, json!(1)), 3)
        .await;
    assert_eq!(t.get(child).await.state, JobState::Pending);
    w.announced(&t, "children", "a child's release").await;
    let again = t.store.job_settle_children(&[p.0], t.at(3)).await.unwrap();
    assert!(again.released.is_empty());
    w.quiet(&t, "a settle that released nothing").await;

    // A dead job retried by hand.
    let retry = w.q("retry");
    let dead = t
        .enqueue(NewJob::new("k", json!(3)).queue(&retry).max_attempts(1), 4)
        .await;
    let c = claim(&retry, 5).await;
    t.finalize(Finalize::dead(dead, c.token, err("boom", 1)), 5)
        .await;
    assert_eq!(t.get(dead).await.state, JobState::Dead);
    w.quiet(&t, "a job's death").await;
    let r = t
        .store
        .job_retry(RetryParams {
            id: dead,
            expected_version: None,
            now: t.at(6),
        })
        .await
        .unwrap();
    assert!(matches!(r, Guarded::Applied(_)));
    w.announced(&t, "retry", "a retry by hand").await;

    // A reclaim into a backoff (the start was recorded) is due later: nothing to announce.
    let later = w.q("later");
    let slow = t.enqueue(NewJob::new("k", json!(4)).queue(&later), 7).await;
    let c = claim(&later, 8).await;
    t.renew_started(slow, &c.token, 9, Some(1)).await;
    let r = t.reclaim(40).await;
    assert_eq!((r.len(), r[0].new_state), (1, JobState::Retrying));
    w.quiet(&t, "a reclaim into a backoff").await;

    // A reclaimed job whose start was never recorded: given back, due now.
    let refund = w.q("refund");
    let lost = t
        .enqueue(NewJob::new("k", json!(5)).queue(&refund), 41)
        .await;
    claim(&refund, 42).await;
    let r = t.reclaim(73).await;
    assert_eq!(
        (r.len(), r[0].id, r[0].new_state),
        (1, lost, JobState::Pending)
    );
    w.announced(&t, "refund", "a reclaim that gives an attempt back")
        .await;
}

#[derive(diesel::QueryableByName)]
struct Trigger {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

/// No trigger fires for each row of an update of the jobs: every claim and finalization
/// updates each job's row, and on PostgreSQL an `AFTER UPDATE` row trigger — even one whose
/// `WHEN` is false — fetches the old row again for it: one more buffer access per job in
/// each. (A release trigger did, from migration 000019 to 000023: 12 % more server time per
/// claimed row, 17 % per finalized row.) A transition that needs announcing announces itself
/// in its own transaction (`store/common/wakes.rs`). Read from the catalog, so the guard cannot be
/// noise.
pub async fn no_trigger_fires_per_row_on_an_update_of_the_jobs(b: Backend) {
    let t = Bundle::new(b).await;
    let sql = match b {
        // tgtype bits: 1 = row, 16 = update.
        Backend::Postgres => {
            "SELECT tgname::text AS name FROM pg_trigger \
             WHERE tgrelid = 'jobvisor_jobs'::regclass AND NOT tgisinternal \
               AND tgtype & 1 = 1 AND tgtype & 16 = 16"
        }
        // MariaDB's triggers are all per row.
        Backend::Mysql => {
            "SELECT TRIGGER_NAME AS name FROM information_schema.TRIGGERS \
             WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'jobvisor_jobs' \
               AND EVENT_MANIPULATION = 'UPDATE'"
        }
        // SQLite's triggers are all per row.
        Backend::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'trigger' \
               AND tbl_name = 'jobvisor_jobs' AND upper(sql) LIKE '%UPDATE%'"
        }
    };
    use diesel_async::RunQueryDsl;
    let found: crate::Result<Vec<Trigger>> = async {
        Ok(super::super::driver::with_conn!(t.store, |conn| {
            diesel::sql_query(sql).load::<Trigger>(conn).await?
        }))
    }
    .await;
    let names: Vec<String> = found.unwrap().into_iter().map(|r| r.name).collect();
    assert!(
        names.is_empty(),
        "row triggers on updates of jobvisor_jobs: {names:?}"
    );
}

/// A cancel asked of a running job is announced to its holder with the request (PostgreSQL:
/// a notification naming the job; MariaDB, SQLite: the wake counter, once), so the node
/// signals the handler at once instead of at its next heartbeat; asking again, or cancelling
/// a job that is not running, announces nothing.
pub async fn a_cancel_of_a_running_job_is_announced_to_its_holder(b: Backend) {
    let t = Bundle::new(b).await;
    let mut w = Watch::new(&t).await;
    let q = w.q("cancel");
    let pending = t.enqueue(NewJob::new("k", json!(0)).queue(&q), 0).await;
    let running = t.enqueue(NewJob::new("k", json!(1)).queue(&q), 0).await;
    let c = t.claim(&q, "n1", 1, 1).await.pop().unwrap();
    assert_eq!(c.id, pending, "the older job is claimed first");
    let (running, pending) = (pending, running);
    let cancel = async |id: JobId, at: i64| {
        t.store
            .job_cancel(CancelParams { id, now: t.at(at) })
            .await
            .unwrap()
    };
    let out = cancel(pending, 2).await;
    assert!(matches!(out, CancelOutcome::Cancelled(_)), "{out:?}");
    w.quiet(&t, "a cancel of a job that was not running").await;

    let out = cancel(running, 3).await;
    assert!(matches!(out, CancelOutcome::Requested(_)), "{out:?}");
    match &mut w.listener {
        None => {
            let now = t.store.change_signal(0).await.unwrap().wakes;
            assert_eq!(now, w.wakes + 1, "the cancel moved the wake counter once");
            w.wakes = now;
        }
        Some(l) => loop {
            let n = tokio::time::timeout(Duration::from_secs(10), l.next())
                .await
                .expect("the cancel's notification within 10 s")
                .expect("listener open")
                .unwrap();
            if n == super::Notice::Cancel(running.0) {
                break;
            }
        },
    }
    let out = cancel(running, 4).await;
    assert!(matches!(out, CancelOutcome::Requested(_)), "{out:?}");
    w.quiet(&t, "a cancel asked again").await;
}

/// The change signal counts the jobs with an id in `(floor, floor + GAP_SPAN]` (the reader's
/// floor below uncommitted ids), and reads the newest id as before, on every backend.
pub async fn the_change_signal_counts_the_jobs_above_its_floor(b: Backend) {
    let t = Bundle::new(b).await;
    let empty = t.store.change_signal(0).await.unwrap();
    assert_eq!((empty.newest_job, empty.above_floor), (0, 0));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(t.enqueue(NewJob::new("k", json!(i)), 0).await.0);
    }
    let (first, last) = (ids[0], ids[2]);
    let s = t.store.change_signal(first).await.unwrap();
    assert_eq!(s.newest_job, last);
    assert_eq!(s.above_floor, 2, "the two jobs above the first");
    assert_eq!(t.store.change_signal(last).await.unwrap().above_floor, 0);
    assert_eq!(t.store.change_signal(0).await.unwrap().above_floor, 3);
    // Only the span above the floor is read.
    let far = first - crate::store::GAP_SPAN - 1;
    assert_eq!(t.store.change_signal(far).await.unwrap().above_floor, 0);
    assert_eq!(
        t.store
            .change_signal(first - crate::store::GAP_SPAN)
            .await
            .unwrap()
            .above_floor,
        1,
        "the first job is the span's last id"
    );
}
