//! Conformance cases for silent network cuts (PostgreSQL and MySQL/MariaDB, through a
//! [`FreezableProxy`]) and a hung SQLite writer: every hot-path operation gives up within its
//! bound instead of hanging, a connection it gave up on is never reused, a renewal never waits
//! behind a hung claim or finalization, and after the heal every operation works again within
//! 2 s.

use std::future::Future;
use std::time::{Duration, Instant};

use super::proxy::FreezableProxy;
use super::*;
use crate::store::driver::Driver;

/// How late past its bound a timed-out operation may return (a loaded 2-core machine).
const SLACK: Duration = Duration::from_millis(1000);
/// The target: back at work within this long after the heal.
const RECOVERY: Duration = Duration::from_secs(2);

/// A store on a fresh database, connected through a proxy.
struct Cut {
    _db: TestDb,
    proxy: FreezableProxy,
    store: Store,
}

impl Cut {
    async fn new(b: Backend, opts: StoreOptions) -> Cut {
        let db = TestDb::create(b).await;
        // The schema, directly; then a store through the proxy.
        drop(db.store_with(StoreOptions::default().pool_size(1)).await);
        let proxy = FreezableProxy::to_url(&db.url).await;
        let store = Store::connect_with(&proxy.url_for(&db.url), opts)
            .await
            .unwrap();
        Cut {
            _db: db,
            proxy,
            store,
        }
    }
}

/// Longer than any bound here: an operation still running after this is hung, and fails the
/// case instead of hanging it.
const HUNG: Duration = Duration::from_secs(20);

async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    let t0 = Instant::now();
    let v = tokio::time::timeout(HUNG, f)
        .await
        .unwrap_or_else(|_| panic!("no answer within {HUNG:?}: the operation hangs"));
    (v, t0.elapsed())
}

/// Retries `f` while it fails transiently; returns its value and when it first succeeded,
/// counted from `since`.
async fn until_ok<T, F, Fut>(since: Instant, what: &str, mut f: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    loop {
        match timed(f()).await.0 {
            Ok(v) => return (v, since.elapsed()),
            Err(e) if e.is_transient() && since.elapsed() < RECOVERY * 5 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!(
                "{what} still failing {:?} after the heal: {e}",
                since.elapsed()
            ),
        }
    }
}

fn claim_params(limit: u32) -> ClaimParams {
    ClaimParams {
        queue: "default".into(),
        owner: NodeId::new("cut").unwrap(),
        limit,
        kinds: None,
        lease: Duration::from_secs(30),
        now: None,
    }
}

fn renew_params(held: &[ClaimedJob]) -> RenewParams {
    RenewParams {
        timeout_grace: Duration::from_secs(10),
        leases: held
            .iter()
            .map(|c| LeaseRef {
                started_ago: None,
                progress: None,
                id: c.id,
                token: c.token.clone(),
            })
            .collect(),
        lease: Duration::from_secs(30),
        now: None,
    }
}

fn finalize_params(c: &ClaimedJob) -> FinalizeParams {
    FinalizeParams {
        items: vec![Finalize::succeeded(c.id, c.token.clone(), json!("ok"))],
        now: None,
    }
}

fn reclaim_params() -> ReclaimParams {
    ReclaimParams {
        limit: 100,
        backoff: Arc::new(|_| Duration::from_secs(1)),
        now: None,
    }
}

/// Asserts a timeout error for `op` that came within `bound` (plus [`SLACK`]).
fn assert_timed_out<T: std::fmt::Debug>(
    op: &str,
    res: &Result<T, Error>,
    took: Duration,
    bound: Duration,
) {
    let err = match res {
        Err(e) => e,
        Ok(v) => panic!("{op} succeeded during the cut: {v:?}"),
    };
    assert!(err.is_transient(), "{op}: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{op} timed out after {bound:?}")),
        "{op}: {msg}"
    );
    assert!(
        took >= bound && took < bound + SLACK,
        "{op} returned after {took:?}; its bound is {bound:?}"
    );
}

pub async fn a_silent_cut_bounds_every_hot_path_operation_and_the_heal_restores_them(b: Backend) {
    if b == Backend::Sqlite {
        return a_hung_sqlite_writer_bounds_the_other_writes(b).await;
    }
    // The defaults, which promise recovery within 2 s of the heal.
    let net = Cut::new(b, StoreOptions::default().pool_size(6)).await;
    let s = &net.store;
    let bound = s.options().statement_timeout;
    for i in 0..8 {
        s.job_enqueue(NewJob::new("k", json!(i)), None)
            .await
            .unwrap();
    }
    let held = s.job_claim(claim_params(3)).await.unwrap();
    assert_eq!(held.len(), 3);
    assert!(s.job_renew_leases(renew_params(&held)).await.is_ok());

    net.proxy.freeze();
    let (claim, renew, fin, enq, reclaim) = tokio::join!(
        timed(s.job_claim(claim_params(2))),
        timed(s.job_renew_leases(renew_params(&held))),
        timed(s.job_finalize_many(finalize_params(&held[0]))),
        timed(s.job_enqueue(NewJob::new("k", json!("cut")), None)),
        timed(s.job_reclaim_expired(reclaim_params())),
    );
    assert_timed_out("job_claim", &claim.0, claim.1, bound);
    assert_timed_out("job_renew_leases", &renew.0, renew.1, bound);
    assert_timed_out("job_finalize_many", &fin.0, fin.1, bound);
    assert_timed_out("job_enqueue", &enq.0, enq.1, bound);
    assert_timed_out("job_reclaim_expired", &reclaim.0, reclaim.1, bound);
    // Still cut: the next call gives up within its bound too (no pooled connection left
    // hanging for it, no wait behind the first ones).
    let again = timed(s.job_renew_leases(renew_params(&held))).await;
    assert_timed_out("job_renew_leases", &again.0, again.1, bound);
    let stalled = net.proxy.stalled();
    assert!(stalled >= 5, "only {stalled} connections saw the cut");

    net.proxy.heal();
    let healed = Instant::now();
    let ((renewed, t_renew), (claimed, t_claim), (finalized, t_fin), (_, t_enq)) = tokio::join!(
        until_ok(healed, "renew", || s
            .job_renew_leases(renew_params(&held[1..]))),
        until_ok(healed, "claim", || s.job_claim(claim_params(2))),
        until_ok(healed, "finalize", || s
            .job_finalize_many(finalize_params(&held[0]))),
        until_ok(healed, "enqueue", || s
            .job_enqueue(NewJob::new("k", json!("healed")), None)),
    );
    eprintln!(
        "{b:?}: after the heal, renew worked in {t_renew:?}, claim {t_claim:?}, finalize \
         {t_fin:?}, enqueue {t_enq:?}; during the cut they gave up after {:?} / {:?} / {:?} / \
         {:?} (reclaim {:?})",
        renew.1, claim.1, fin.1, enq.1, reclaim.1
    );
    for (what, t) in [
        ("renew", t_renew),
        ("claim", t_claim),
        ("finalize", t_fin),
        ("enqueue", t_enq),
    ] {
        assert!(
            t < RECOVERY,
            "{what} worked again only {t:?} after the heal"
        );
    }
    // Nothing sent into the cut reached the server: the leases are intact.
    assert!(renewed.iter().all(|(_, g)| g.is_applied()), "{renewed:?}");
    assert_eq!(claimed.len(), 2);
    assert_eq!(finalized[0].1, Guarded::Applied(JobState::Succeeded));
    // Every connection the cut stalled was given up and closed by the store.
    let closed = net.proxy.closed_by_client();
    assert!(
        closed >= 5,
        "{closed} of {} stalled connections closed by the store",
        net.proxy.stalled()
    );
}

pub async fn a_renewal_never_waits_behind_a_hung_claim_or_finalization(b: Backend) {
    if b == Backend::Sqlite {
        return;
    }
    let bound = Duration::from_secs(3);
    let net = Cut::new(
        b,
        StoreOptions::default()
            .pool_size(1)
            .statement_timeout(bound),
    )
    .await;
    let s = &net.store;
    for i in 0..4 {
        s.job_enqueue(NewJob::new("k", json!(i)), None)
            .await
            .unwrap();
    }
    let held = s.job_claim(claim_params(2)).await.unwrap();
    // The pool's only connection hangs from now on; renewals have not opened theirs yet.
    net.proxy.freeze_open();
    let stuck = tokio::spawn({
        let s = s.clone();
        let item = finalize_params(&held[0]);
        async move { timed(s.job_finalize_many(item)).await }
    });
    // Then a claim, which waits for the pool's connection.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let waiting = tokio::spawn({
        let s = s.clone();
        async move { timed(s.job_claim(claim_params(2))).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (renewed, took) = timed(s.job_renew_leases(renew_params(&held))).await;
    let renewed = renewed.unwrap();
    assert!(renewed.iter().all(|(_, g)| g.is_applied()), "{renewed:?}");
    assert!(
        took < Duration::from_secs(1),
        "the renewal took {took:?} beside a hung finalization"
    );
    assert!(!stuck.is_finished() && !waiting.is_finished());
    let (fin, fin_took) = stuck.await.unwrap();
    assert_timed_out("job_finalize_many", &fin, fin_took, bound);
    // The finalization gave its connection up; a fresh one serves the waiting claim.
    let (claim, claim_took) = waiting.await.unwrap();
    let claimed = claim.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(
        claim_took > bound - Duration::from_millis(1200) && claim_took < bound,
        "{claim_took:?}"
    );
}

pub async fn a_connection_that_timed_out_is_closed_not_reused(b: Backend) {
    if b == Backend::Sqlite {
        return;
    }
    let bound = Duration::from_millis(500);
    let net = Cut::new(
        b,
        StoreOptions::default()
            .pool_size(1)
            .statement_timeout(bound),
    )
    .await;
    let s = &net.store;
    s.job_enqueue(NewJob::new("k", json!(1)), None)
        .await
        .unwrap();
    let opened = net.proxy.accepted();
    // The pool's one connection, idle, hangs from now on (on MySQL the checkout's ping
    // meets it; on PostgreSQL the statement).
    net.proxy.freeze_open();
    let (res, took) = timed(s.job_claim(claim_params(1))).await;
    assert_timed_out("job_claim", &res, took, bound);
    // Had it gone back to the pool, this would hang on it and time out again.
    for i in 0..3 {
        let (res, took) = timed(s.job_claim(claim_params(1))).await;
        let got = res.unwrap_or_else(|e| panic!("claim {i} after the timeout: {e}"));
        assert_eq!(got.len(), usize::from(i == 0));
        assert!(took < bound, "claim {i} took {took:?}");
    }
    assert_eq!(
        net.proxy.accepted(),
        opened + 1,
        "one new connection replaces the poisoned one"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        net.proxy.closed_by_client(),
        net.proxy.stalled(),
        "the store closes the connection it gave up on"
    );
}

pub async fn server_side_bounds_are_set_on_every_connection(b: Backend) {
    if b == Backend::Sqlite {
        return;
    }
    let db = TestDb::create(b).await;
    let opts = StoreOptions::default()
        .server_statement_timeout(Some(Duration::from_millis(2500)))
        .tcp_keepalive(Some(crate::store::TcpKeepalive::new(
            Duration::from_secs(7),
            Duration::from_secs(2),
            4,
        )))
        .tcp_user_timeout(Some(Duration::from_millis(9000)));
    let store = db.store_with(opts).await;
    let q = match b {
        Backend::Postgres => {
            "SELECT current_setting('statement_timeout') || ' ' || \
             current_setting('idle_in_transaction_session_timeout') || ' ' || \
             current_setting('tcp_keepalives_idle') || ' ' || \
             current_setting('tcp_keepalives_interval') || ' ' || \
             current_setting('tcp_keepalives_count') || ' ' || \
             current_setting('tcp_user_timeout') AS v"
        }
        _ => {
            "SELECT CONCAT(@@SESSION.max_statement_time, ' ', \
             @@SESSION.idle_transaction_timeout) AS v"
        }
    };
    let expected = match b {
        Backend::Postgres => "2500ms 2500ms 7 2 4 9000",
        _ => "2.500000 3",
    };
    #[derive(diesel::QueryableByName, Debug)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    use diesel_async::RunQueryDsl;
    for (lane, renew) in [("main", false), ("renewal", true)] {
        let got: Vec<V> = match &store.inner.driver {
            Driver::Postgres(d) => {
                let mut c = d.conn(renew).await.unwrap();
                diesel::sql_query(q).load(&mut *c).await.unwrap()
            }
            Driver::Mysql(d) => {
                let mut c = d.conn(renew).await.unwrap();
                diesel::sql_query(q).load(&mut *c).await.unwrap()
            }
            Driver::Sqlite(_) => unreachable!(),
        };
        assert_eq!(got[0].v, expected, "{b:?} {lane} pool");
    }
    // And the server enforces it.
    let slow = match b {
        Backend::Postgres => "SELECT pg_sleep(5)",
        _ => "SELECT SLEEP(5)",
    };
    let (res, took) = timed(exec_sql(&store, slow)).await;
    assert!(took < Duration::from_secs(4), "{took:?}: {res:?}");
    if b == Backend::Postgres {
        let msg = res.unwrap_err().to_string();
        assert!(msg.contains("statement timeout"), "{msg}");
    }
}

/// SQLite: an operation stuck holding this process's writer lock makes the others fail
/// within their bound, naming the lock, instead of queueing forever; once it lets go, they
/// work at once.
async fn a_hung_sqlite_writer_bounds_the_other_writes(b: Backend) {
    let db = TestDb::create(b).await;
    let opts = StoreOptions::default()
        .statement_timeout(Duration::from_millis(300))
        .busy_timeout(Duration::from_millis(200));
    let s = db.store_with(opts).await;
    let bound = Duration::from_millis(500);
    s.job_enqueue(NewJob::new("k", json!(1)), None)
        .await
        .unwrap();
    let held = s.job_claim(claim_params(1)).await.unwrap();
    let Driver::Sqlite(d) = &s.inner.driver else {
        unreachable!()
    };
    let writer = d.writer(false).await.unwrap();
    let (renew, took) = timed(s.job_renew_leases(renew_params(&held))).await;
    assert_timed_out("job_renew_leases", &renew, took, bound);
    let msg = renew.unwrap_err().to_string();
    assert!(msg.contains("SQLite writer lock"), "{msg}");
    let (fin, took) = timed(s.job_finalize_many(finalize_params(&held[0]))).await;
    assert_timed_out("job_finalize_many", &fin, took, bound);
    // Maintenance waits no longer than the bound either.
    let archive = timed(s.job_archive(ArchiveParams {
        older_than: Duration::ZERO,
        dead_older_than: Duration::ZERO,
        limit: 10,
        now: None,
    }))
    .await;
    assert!(archive.1 < bound + SLACK, "{:?}", archive.1);
    let msg = archive.0.unwrap_err().to_string();
    assert!(msg.contains("SQLite writer lock"), "{msg}");
    drop(writer);
    let renewed = s.job_renew_leases(renew_params(&held)).await.unwrap();
    assert!(renewed[0].1.is_applied());
}

/// PostgreSQL sends a controlled claim's `COMMIT` with the rest of it, so a claim its client
/// abandons — the queue's row lock held elsewhere past the client's bound, and the network
/// cut so the server never hears of the abandonment — would still commit once the lock
/// frees, leaving jobs `running` for a node that never received them. The claim bounds its
/// wait for the lock below the client's bound, so the server gives up first: once the lock
/// frees, nothing has been claimed.
pub async fn postgres_an_abandoned_controlled_claim_takes_nothing_when_the_lock_frees() {
    use diesel_async::SimpleAsyncConnection;

    let bound = Duration::from_millis(1000);
    let net = Cut::new(
        Backend::Postgres,
        StoreOptions::default()
            .pool_size(1)
            .statement_timeout(bound),
    )
    .await;
    let s = &net.store;
    for i in 0..3 {
        s.job_enqueue(NewJob::new("k", json!(i)), None)
            .await
            .unwrap();
    }
    s.queue_set_limits("default", QueueLimits::default().concurrency(5), None)
        .await
        .unwrap();
    // A claim of a kind nobody enqueued: the node learns the queue is controlled, and the
    // pool's one connection prepares every statement of the claim.
    let none = ClaimParams {
        kinds: Some(vec!["none".into()]),
        ..claim_params(3)
    };
    assert!(s.job_claim(none).await.unwrap().is_empty());
    let mut holder = AsyncPgConnection::establish(&net._db.url).await.unwrap();
    holder
        .batch_execute("BEGIN; UPDATE jobvisor_queues SET claims = claims WHERE name = 'default'")
        .await
        .unwrap();
    let claim = tokio::spawn({
        let s = s.clone();
        async move { timed(s.job_claim(claim_params(3))).await }
    });
    // The claim is at the server, waiting for the lock; then the network goes silent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    net.proxy.freeze_open();
    let (res, took) = claim.await.unwrap();
    assert!(res.is_err(), "{res:?}");
    assert!(took < bound + SLACK, "abandoned after {took:?}");
    // The lock frees well after the client gave up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.batch_execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let direct = net._db.store().await;
    let counts = direct.job_counts().await.unwrap();
    let running: u64 = counts
        .iter()
        .filter(|c| c.state == JobState::Running)
        .map(|c| c.count)
        .sum();
    assert_eq!(running, 0, "an abandoned claim took jobs: {counts:?}");
}
