//! Conformance cases. A handler's own transaction on the job's store
//! (`JobContext::transaction`, `complete_in_transaction`, `JobTx::record_effect`): fenced by
//! the lease in SQL and locally, rolled back with its writes when the lease is lost or the
//! body fails, completing the job in the same commit, and effect keys recorded once.
//!
//! Each case is written once, generic over the backend's connection type (the type a
//! handler names), and dispatched by [`on`].

use std::future::Future;

use diesel::QueryableByName;
use diesel_async::RunQueryDsl;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::handler_tx::{JobTx, TxError};
use crate::store::effects::{Effect, Recorded};
use crate::store::handler_tx::{JobConnection, SqliteJobConnection};
use crate::{ClaimOutcome, Client, JobContext, JobError, JobOutcome};

/// The business table the cases write to, as an application's would be.
const BIZ: &str = "CREATE TABLE jobvisor_test_payments (order_id BIGINT NOT NULL PRIMARY KEY)";

/// A business write on a transaction's connection (each backend's type, as a handler has it).
trait Biz: JobConnection {
    fn pay(&mut self, order: i64) -> impl Future<Output = diesel::QueryResult<usize>> + Send;
}

macro_rules! biz {
    ($t:ty) => {
        impl Biz for $t {
            async fn pay(&mut self, order: i64) -> diesel::QueryResult<usize> {
                diesel::sql_query(format!(
                    "INSERT INTO jobvisor_test_payments (order_id) VALUES ({order})"
                ))
                .execute(self)
                .await
            }
        }
    };
}

biz!(AsyncPgConnection);
biz!(AsyncMysqlConnection);
biz!(SqliteJobConnection);

/// Runs `$case::<C>` with the connection type of `$b`.
macro_rules! on {
    ($b:expr, $case:ident) => {
        match $b {
            Backend::Postgres => $case::<AsyncPgConnection>($b).await,
            Backend::Mysql => $case::<AsyncMysqlConnection>($b).await,
            Backend::Sqlite => $case::<SqliteJobConnection>($b).await,
        }
    };
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

impl Bundle {
    /// The payments written.
    async fn payments(&self) -> i64 {
        let n: crate::Result<i64> = async {
            Ok(super::super::driver::with_conn!(self.store, |conn| {
                diesel::sql_query("SELECT COUNT(*) AS n FROM jobvisor_test_payments")
                    .get_result::<Count>(conn)
                    .await?
                    .n
            }))
        }
        .await;
        n.unwrap()
    }

    /// The handler's context of a claimed attempt, its clock at t0 + `at`, its fence point
    /// `valid_for` ahead.
    fn ctx(&self, c: &ClaimedJob, at: i64, valid_for: Duration) -> JobContext {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(self.at(at).unwrap()));
        let client = Client::with_clock(self.store.clone(), clock.clone());
        JobContext::for_claim(c, client, clock, valid_for)
    }
}

const LEASE: Duration = Duration::from_secs(25);

/// A zombie — an attempt whose lease expired and was reclaimed, its job running again
/// elsewhere — completes in its own transaction after a business write: both roll back, and
/// it learns `LeaseLost`. The holder's completion commits with its write: one payment, the
/// job succeeded with the holder's result, written once.
pub async fn a_zombies_business_write_rolls_back_with_its_completion(b: Backend) {
    on!(b, zombie_case)
}

async fn zombie_case<C: Biz>(b: Backend) {
    let t = Bundle::new(b).await;
    exec_sql(&t.store, BIZ).await.unwrap();
    let id = t.enqueue(NewJob::new("pay", json!({"order": 7})), 0).await;
    let zombie = t.claim("default", "a", 1, 0).await.pop().unwrap();
    // Its lease expires unrenewed; the sweeper gives the job back; another node runs it.
    assert_eq!(t.reclaim(40).await.len(), 1);
    let holder = t.claim("default", "b", 1, 41).await.pop().unwrap();
    let holder_version = t.get(id).await.version;

    // The zombie still believes in its lease (its own clock says 25 s are left).
    let ctx = t.ctx(&zombie, 1, LEASE);
    let r = ctx
        .complete_in_transaction(async |mut tx: JobTx<'_, C>| {
            tx.conn().pay(7).await?;
            tx.record_effect("charge", json!({"by": "zombie"})).await?;
            tx.enqueue(vec![NewJob::new("receipt", json!({"by": "zombie"}))])
                .await?;
            Ok::<_, JobError>(json!({"by": "zombie"}))
        })
        .await;
    assert!(matches!(r, Err(TxError::LeaseLost)), "{r:?}");
    assert_eq!(
        t.payments().await,
        0,
        "the zombie's business write rolled back"
    );
    assert!(t.store.job_effects(id).await.unwrap().is_empty());
    let j = t.get(id).await;
    assert_eq!((j.state, j.version), (JobState::Running, holder_version));
    assert!(
        t.renew(id, &holder.token, 42).await.is_applied(),
        "holder untouched"
    );

    // The holder's completion commits with its write.
    let ctx = t.ctx(&holder, 43, LEASE);
    let out = ctx
        .complete_in_transaction(async |mut tx: JobTx<'_, C>| {
            tx.conn().pay(7).await?;
            assert!(tx
                .record_effect("charge", json!({"by": "holder"}))
                .await?
                .is_new());
            tx.enqueue(vec![NewJob::new("receipt", json!({"by": "holder"}))])
                .await?;
            Ok::<_, JobError>(json!({"by": "holder"}))
        })
        .await
        .unwrap();
    assert_eq!(out, JobOutcome::Succeeded(json!({"by": "holder"})));
    assert_eq!(t.payments().await, 1);
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.result, Some(json!({"by": "holder"})));
    assert_eq!(j.version, holder_version + 1, "written once");
    assert_eq!(j.finished_at, t.at(43));
    assert!(j.lease.is_none() && j.timeout_at.is_none() && j.last_error.is_none());
    assert!(
        j.started_at.is_some(),
        "the start is recorded with the completion"
    );
    let effects = t.store.job_effects(id).await.unwrap();
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].detail, Some(json!({"by": "holder"})));
    assert_eq!(effects[0].claim, holder.token.claim().to_string());
    // The ledger: the zombie's claim lost, the holder's succeeded on its node; the zombie's
    // late completion wrote no row.
    let claims: Vec<_> = t
        .store
        .job_claims(id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.claim, c.node.to_string(), c.outcome))
        .collect();
    assert_eq!(
        claims,
        [
            (zombie.token.claim(), "a".into(), ClaimOutcome::Lost),
            (holder.token.claim(), "b".into(), ClaimOutcome::Succeeded),
        ]
    );
    // Follow-up jobs enqueued in the transactions: the holder's only.
    let receipts: Vec<_> = t
        .store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.kind == "receipt")
        .map(|j| j.payload)
        .collect();
    assert_eq!(receipts, vec![json!({"by": "holder"})]);
}

/// A body that returns `Err` rolls its writes back and leaves the job running under its
/// lease; the handler carries on and completes it later. Its effect records stay with the
/// archived job and are deleted with it when the archive is pruned.
pub async fn a_completion_the_body_rolls_back_leaves_the_job_running(b: Backend) {
    on!(b, rolled_back_case)
}

async fn rolled_back_case<C: Biz>(b: Backend) {
    let t = Bundle::new(b).await;
    exec_sql(&t.store, BIZ).await.unwrap();
    let id = t.enqueue(NewJob::new("pay", json!({})), 0).await;
    let c = t.claim("default", "a", 1, 0).await.pop().unwrap();
    let before = t.get(id).await;
    let ctx = t.ctx(&c, 1, LEASE);
    let r = ctx
        .complete_in_transaction(async |mut tx: JobTx<'_, C>| {
            tx.conn().pay(1).await?;
            tx.record_effect("charge", ()).await?;
            Err::<serde_json::Value, _>(JobError::fail("card declined"))
        })
        .await;
    let Err(TxError::RolledBack(e)) = r else {
        panic!("expected the body's error, got {r:?}");
    };
    assert_eq!(e.message, "card declined");
    assert_eq!(t.payments().await, 0);
    assert!(t.store.job_effects(id).await.unwrap().is_empty());
    let j = t.get(id).await;
    assert_eq!(
        (j.state, j.version, j.result.clone()),
        (JobState::Running, before.version, None)
    );
    assert!(
        t.renew(id, &c.token, 2).await.is_applied(),
        "the lease holds"
    );

    // The handler goes on: a plain transaction, then the completion.
    let first = ctx
        .transaction(async |mut tx: JobTx<'_, C>| {
            Ok::<_, JobError>(tx.record_effect("charge", json!({"id": "ch_1"})).await?)
        })
        .await
        .unwrap();
    assert_eq!(first, Recorded::New);
    assert_eq!(
        t.get(id).await.state,
        JobState::Running,
        "a plain one completes nothing"
    );
    ctx.complete_in_transaction(async |mut tx: JobTx<'_, C>| {
        tx.conn().pay(1).await?;
        let Some(Effect { detail, .. }) = tx.effect("charge").await? else {
            return Err(JobError::fail("the charge record is gone"));
        };
        Ok(detail)
    })
    .await
    .unwrap();
    assert_eq!(t.payments().await, 1);
    let j = t.get(id).await;
    assert_eq!(
        (j.state, j.result),
        (JobState::Succeeded, Some(json!({"id": "ch_1"})))
    );

    // The records stay while the job is archived, and go with it when the archive is pruned.
    let archived = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::from_secs(10),
            dead_older_than: Duration::from_secs(10),
            limit: 100,
            now: t.at(100),
        })
        .await
        .unwrap();
    assert_eq!(archived, 1);
    assert_eq!(t.store.job_effects(id).await.unwrap().len(), 1);
    let pruned = t
        .store
        .job_prune_archive(PruneParams {
            older_than: Duration::from_secs(10),
            limit: 100,
            now: t.at(200),
        })
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert!(t.store.job_get(id).await.unwrap().is_none());
    assert!(
        t.store.job_effects(id).await.unwrap().is_empty(),
        "pruned with the job"
    );
}

/// Sixteen concurrent transactions record one effect key: exactly one records it, every
/// other finds that record, one row is stored.
pub async fn sixteen_concurrent_attempts_of_one_effect_key_record_it_once(b: Backend) {
    on!(b, concurrent_effects_case)
}

async fn concurrent_effects_case<C: Biz>(b: Backend) {
    let t = Arc::new(Bundle::new(b).await);
    let id = t.enqueue(NewJob::new("pay", json!({})), 0).await;
    let c = t.claim("default", "a", 1, 0).await.pop().unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let ctx = t.ctx(&c, 1, LEASE);
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            // A deadlock or a busy file is transient: the attempt would be retried.
            for _ in 0..20 {
                let r = ctx
                    .transaction(async |mut tx: JobTx<'_, C>| {
                        tx.record_effect("charge", json!({ "by": i })).await
                    })
                    .await;
                match r {
                    Ok(rec) => return rec,
                    Err(TxError::RolledBack(e) | TxError::Database(e)) if e.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("task {i}: {e}"),
                }
            }
            panic!("task {i}: transient errors 20 times in a row");
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let new = answers.iter().filter(|r| r.is_new()).count();
    assert_eq!(new, 1, "{answers:?}");
    let stored = t.store.job_effects(id).await.unwrap();
    assert_eq!(stored.len(), 1);
    for r in &answers {
        if let Recorded::Already(e) = r {
            assert_eq!(e, &stored[0], "each sees the one record");
        }
    }
}

/// After a completion in the handler's transaction, the lease manager's finalization of
/// that attempt writes nothing (the runtime does not even send it: `tests/sim.rs`); a
/// renewal finds no lease. And a handler past its fence point cannot commit, though the
/// database would still take its token.
pub async fn a_completed_attempt_is_never_written_again_and_a_fenced_one_never_commits(b: Backend) {
    on!(b, written_once_case)
}

async fn written_once_case<C: Biz>(b: Backend) {
    let t = Bundle::new(b).await;
    exec_sql(&t.store, BIZ).await.unwrap();
    let id = t.enqueue(NewJob::new("pay", json!({})), 0).await;
    let c = t.claim("default", "a", 1, 0).await.pop().unwrap();

    // Past its fence point (locally), the attempt's token still valid in the database.
    let fenced = t.ctx(&c, 1, Duration::ZERO);
    let r = fenced
        .complete_in_transaction(async |mut tx: JobTx<'_, C>| {
            tx.conn().pay(3).await?;
            Ok::<_, JobError>(1)
        })
        .await;
    assert!(matches!(r, Err(TxError::LeaseLost)), "{r:?}");
    assert_eq!(t.payments().await, 0);
    assert_eq!(t.get(id).await.state, JobState::Running);

    let ctx = t.ctx(&c, 2, LEASE);
    ctx.complete_in_transaction(async |mut tx: JobTx<'_, C>| {
        tx.conn().pay(3).await?;
        Ok::<_, JobError>("paid")
    })
    .await
    .unwrap();
    let done = t.get(id).await;
    assert_eq!(done.state, JobState::Succeeded);
    let late = t
        .finalize(Finalize::succeeded(id, c.token.clone(), json!("again")), 5)
        .await;
    assert_eq!(late, Guarded::LeaseLost);
    assert!(!t.renew(id, &c.token, 5).await.is_applied());
    let after = t.get(id).await;
    assert_eq!(
        (
            after.version,
            after.result,
            after.finished_at,
            after.updated_at
        ),
        (
            done.version,
            Some(json!("paid")),
            done.finished_at,
            done.updated_at
        ),
        "nothing written again"
    );
    // Nor by a second completion of the same attempt.
    let again = ctx
        .complete_in_transaction(async |mut tx: JobTx<'_, C>| {
            tx.conn().pay(4).await?;
            Ok::<_, JobError>("twice")
        })
        .await;
    assert!(matches!(again, Err(TxError::LeaseLost)), "{again:?}");
    assert_eq!(t.payments().await, 1);
}

/// Bad input: empty, too long or NUL effect keys, a detail or result that is not JSON, a
/// connection type of another backend, a context without a store — each a clear error
/// naming what was wrong, nothing written, the job still running.
pub async fn bad_effect_keys_and_transactions_get_clear_errors(b: Backend) {
    on!(b, bad_input_case)
}

async fn bad_input_case<C: Biz>(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("pay", json!({})), 0).await;
    let c = t.claim("default", "a", 1, 0).await.pop().unwrap();
    let ctx = t.ctx(&c, 1, LEASE);
    for (key, says) in [
        (String::new(), "is empty"),
        ("k".repeat(256), "is 256 bytes long"),
        ("a\0b".to_string(), "NUL"),
    ] {
        let r = ctx
            .transaction(async |mut tx: JobTx<'_, C>| {
                tx.record_effect(&key, ()).await?;
                Ok::<_, Error>(())
            })
            .await;
        let Err(TxError::RolledBack(Error::InvalidInput { field, reason })) = r else {
            panic!("{key:?}: {r:?}");
        };
        assert_eq!(field, "effect key");
        assert!(
            reason.contains(says) && reason.contains("expected 1 to 255"),
            "{reason}"
        );
        let r = ctx
            .transaction(async |mut tx: JobTx<'_, C>| tx.effect(&key).await)
            .await;
        assert!(
            matches!(
                r,
                Err(TxError::RolledBack(Error::InvalidInput {
                    field: "effect key",
                    ..
                }))
            ),
            "{r:?}"
        );
    }
    let odd: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let r = ctx
        .transaction(async |mut tx: JobTx<'_, C>| tx.record_effect("odd", &odd).await)
        .await;
    assert!(
        matches!(&r, Err(TxError::RolledBack(Error::InvalidInput { field: "effect detail", reason })) if reason.contains("not JSON")),
        "{r:?}"
    );
    let r = ctx
        .complete_in_transaction(async |_tx: JobTx<'_, C>| Ok::<_, Error>(odd.clone()))
        .await;
    assert!(
        matches!(
            &r,
            Err(TxError::Database(Error::InvalidInput {
                field: "result",
                ..
            }))
        ),
        "{r:?}"
    );
    // Another backend's connection type.
    let r = if b == Backend::Sqlite {
        ctx.transaction(async |_tx: JobTx<'_, AsyncPgConnection>| Ok::<_, Error>(()))
            .await
    } else {
        ctx.transaction(async |_tx: JobTx<'_, SqliteJobConnection>| Ok::<_, Error>(()))
            .await
    };
    let Err(TxError::Database(Error::InvalidInput { field, reason })) = r else {
        panic!("{r:?}");
    };
    assert_eq!(field, "connection type");
    assert!(reason.contains(&format!("store on {b:?}")), "{reason}");
    // A unit test's context has no store.
    let bare = JobContext::for_test(id, "pay", json!({}), 1);
    let r = bare
        .transaction(async |_tx: JobTx<'_, C>| Ok::<_, Error>(()))
        .await;
    assert!(
        matches!(
            &r,
            Err(TxError::Database(Error::InvalidInput {
                field: "context",
                ..
            }))
        ),
        "{r:?}"
    );
    assert!(t.store.job_effects(id).await.unwrap().is_empty());
    let j = t.get(id).await;
    assert_eq!(j.state, JobState::Running);
    assert!(t.renew(id, &c.token, 2).await.is_applied());
}
