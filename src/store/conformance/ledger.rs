//! Conformance cases. The execution ledger: one row per claim with its node and outcome,
//! written only by the claim's own applied end, kept with its job through archive and prune.

use super::*;
use crate::claim::{Claim, ClaimOutcome};

/// A claim as these cases compare it: id, node, attempt, outcome, code, claimed, started,
/// ended (seconds after t0).
type Row = (
    crate::ClaimId,
    String,
    u32,
    ClaimOutcome,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
);

fn rows(t: &Bundle, claims: Vec<Claim>) -> Vec<Row> {
    let secs = |at: chrono::DateTime<Utc>| (at - t.t0).num_seconds();
    claims
        .into_iter()
        .map(|c| {
            (
                c.claim,
                c.node.to_string(),
                c.attempt,
                c.outcome,
                c.code,
                secs(c.claimed_at),
                c.started_at.map(secs),
                c.ended_at.map(secs),
            )
        })
        .collect()
}

async fn ledger(t: &Bundle, id: JobId) -> Vec<Row> {
    rows(t, t.store.job_claims(id).await.unwrap())
}

pub async fn a_job_given_back_reclaimed_elsewhere_and_finished_shows_each_claim(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    // Node a gives it back unstarted.
    let a = t.claim("default", "a", 1, 0).await.pop().unwrap();
    let r = t
        .finalize(Finalize::requeue(id, a.token.clone(), Duration::ZERO), 2)
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Pending));
    // Node b starts it and is lost: the sweeper reclaims it.
    let bb = t.claim("default", "b", 1, 3).await.pop().unwrap();
    assert!(t
        .renew_started(id, &bb.token, 4, Some(1))
        .await
        .is_applied());
    // A cancel request while it runs leaves the claim's instant as it was.
    t.store
        .job_cancel(CancelParams { id, now: t.at(5) })
        .await
        .unwrap();
    assert_eq!(t.reclaim(40).await.len(), 1);
    // Node c runs it to success; while it runs, its claim is read from the job's row.
    let c = t.claim("default", "c", 1, 50).await.pop().unwrap();
    let running = ledger(&t, id).await;
    assert_eq!(
        running.last(),
        Some(&(
            c.token.claim(),
            "c".to_string(),
            2,
            ClaimOutcome::Running,
            None,
            50,
            None,
            None
        ))
    );
    let r = t
        .finalize(
            Finalize::succeeded(id, c.token.clone(), json!("ok"))
                .with_started_ago(Some(Duration::from_secs(2))),
            55,
        )
        .await;
    assert_eq!(r, Guarded::Applied(JobState::Succeeded));
    assert_eq!(
        ledger(&t, id).await,
        [
            (
                a.token.claim(),
                "a".into(),
                1,
                ClaimOutcome::GivenBack,
                None,
                0,
                None,
                Some(2)
            ),
            (
                bb.token.claim(),
                "b".into(),
                1,
                ClaimOutcome::Lost,
                Some("lease_expired".into()),
                3,
                Some(3),
                Some(40)
            ),
            (
                c.token.claim(),
                "c".into(),
                2,
                ClaimOutcome::Succeeded,
                None,
                50,
                Some(53),
                Some(55)
            ),
        ]
    );
    // The lost claim's error entry and its ledger row name the same claim.
    let j = t.get(id).await;
    assert_eq!(j.errors[0].claim, Some(bb.token.claim()));
    assert!(matches!(
        t.store.job_claims(JobId(id.0 + 1_000)).await,
        Err(Error::NotFound { .. })
    ));
}

pub async fn each_ending_is_recorded_with_its_outcome_and_code(b: Backend) {
    let t = Bundle::new(b).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            t.enqueue(
                NewJob::new("k", json!(i)).max_attempts(if i == 4 { 1 } else { 3 }),
                0,
            )
            .await,
        );
    }
    let c = t.claim("default", "n", 5, 0).await;
    let token = |id: JobId| c.iter().find(|c| c.id == id).unwrap().token.clone();
    let items = vec![
        Finalize::retry(ids[0], token(ids[0]), err("flaky", 1), Duration::ZERO),
        Finalize::dead(ids[1], token(ids[1]), err("bad", 1)),
        Finalize::cancelled(ids[2], token(ids[2]), err("cancelled", 1)),
        Finalize::requeue(ids[3], token(ids[3]), Duration::from_secs(60)),
        // Its attempts used up: the retry fails the job.
        Finalize::retry(ids[4], token(ids[4]), err("timeout", 1), Duration::ZERO),
    ];
    let mut items = items;
    items[0].fence_margin_ms = Some(1_234);
    t.finalize_many(items, 7).await;
    let mut got = Vec::new();
    for id in &ids {
        let l = t.store.job_claims(*id).await.unwrap();
        assert_eq!(l.len(), 1, "one claim of job {id}");
        got.push((l[0].outcome, l[0].code.clone(), l[0].fence_margin_ms));
    }
    assert_eq!(
        got,
        [
            (ClaimOutcome::Retried, Some("flaky".into()), Some(1_234)),
            (ClaimOutcome::Failed, Some("bad".into()), None),
            (ClaimOutcome::Cancelled, Some("cancelled".into()), None),
            (ClaimOutcome::Snoozed, None, None),
            (ClaimOutcome::TimedOut, Some("timeout".into()), None),
        ]
    );
    assert_eq!(t.get(ids[4]).await.state, JobState::Dead);
}

pub async fn a_late_answer_from_an_old_claim_never_edits_a_newer_claims_row(b: Backend) {
    let t = Bundle::new(b).await;
    let id = t.enqueue(NewJob::new("k", json!({})), 0).await;
    let old = t.claim("default", "old", 1, 0).await.pop().unwrap();
    assert_eq!(t.reclaim(31).await.len(), 1);
    let new = t.claim("default", "new", 1, 41).await.pop().unwrap();
    // The old holder answers late, while the new claim runs and after it ended.
    let late = Finalize::succeeded(id, old.token.clone(), json!("late"));
    assert_eq!(t.finalize(late.clone(), 42).await, Guarded::LeaseLost);
    let running = ledger(&t, id).await;
    assert_eq!(running.len(), 2);
    assert_eq!(
        (running[1].0, running[1].3),
        (new.token.claim(), ClaimOutcome::Running)
    );
    assert_eq!(
        t.finalize(
            Finalize::retry(
                id,
                new.token.clone(),
                err("flaky", 2),
                Duration::from_secs(100)
            ),
            45
        )
        .await,
        Guarded::Applied(JobState::Retrying)
    );
    let before = ledger(&t, id).await;
    assert_eq!(t.finalize(late, 46).await, Guarded::LeaseLost);
    assert_eq!(
        t.finalize(Finalize::requeue(id, old.token.clone(), Duration::ZERO), 47)
            .await,
        Guarded::LeaseLost
    );
    assert_eq!(
        t.reclaim(1_000).await.len(),
        0,
        "nothing running to reclaim"
    );
    let after = ledger(&t, id).await;
    assert_eq!(after, before, "the late answers changed no row");
    assert_eq!(
        after
            .iter()
            .map(|r| (r.0, r.1.as_str(), r.3))
            .collect::<Vec<_>>(),
        [
            (old.token.claim(), "old", ClaimOutcome::Lost),
            (new.token.claim(), "new", ClaimOutcome::Retried),
        ]
    );
}

pub async fn archive_and_prune_keep_a_jobs_ledger_with_it(b: Backend) {
    let t = Bundle::new(b).await;
    let done = t.enqueue(NewJob::new("k", json!(1)), 0).await;
    let other = t.enqueue(NewJob::new("k", json!(2)), 0).await;
    let c = t.claim("default", "n", 2, 0).await;
    for j in &c {
        t.finalize(Finalize::succeeded(j.id, j.token.clone(), json!(null)), 1)
            .await;
    }
    // A success a finalize ended is kept on its job row until the job is archived: the
    // drain's hot path writes no ledger row.
    let before = [ledger(&t, done).await, ledger(&t, other).await];
    assert_eq!(count_ledger(&t, done).await.unwrap(), 0);
    assert_eq!(before[0].len(), 1);
    assert_eq!(
        (before[0][0].1.as_str(), before[0][0].3, before[0][0].7),
        ("n", ClaimOutcome::Succeeded, Some(1))
    );
    let archive = |now: i64| ArchiveParams {
        older_than: Duration::from_secs(10),
        dead_older_than: Duration::from_secs(10),
        limit: 1,
        now: t.at(now),
    };
    assert_eq!(t.store.job_archive(archive(20)).await.unwrap(), 1);
    let archived = if t.get(done).await.archived_at.is_some() {
        done
    } else {
        other
    };
    let live = if archived == done { other } else { done };
    let node_of = |l: Vec<Claim>| {
        l.into_iter()
            .map(|c| c.node.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(node_of(t.store.job_claims(archived).await.unwrap()), ["n"]);
    // The archive wrote its ledger row, the same claim as the job row told.
    assert_eq!(count_ledger(&t, archived).await.unwrap(), 1);
    let i = usize::from(archived != done);
    assert_eq!(ledger(&t, archived).await, before[i]);
    let prune = PruneParams {
        older_than: Duration::from_secs(10),
        limit: 10,
        now: t.at(40),
    };
    assert_eq!(t.store.job_prune_archive(prune).await.unwrap(), 1);
    assert!(matches!(
        t.store.job_claims(archived).await,
        Err(Error::NotFound { .. })
    ));
    let left = count_ledger(&t, archived).await.unwrap();
    assert_eq!(left, 0, "the pruned job's ledger went with it");
    assert_eq!(node_of(t.store.job_claims(live).await.unwrap()), ["n"]);
}

/// Ledger rows of `id` left in the table.
async fn count_ledger(t: &Bundle, id: JobId) -> crate::error::Result<i64> {
    use crate::store::schema::jobvisor_claims as l;
    use diesel::prelude::*;
    use diesel_async::RunQueryDsl;
    Ok(super::super::driver::with_conn!(t.store, |conn| {
        l::table
            .filter(l::job_id.eq(id.0))
            .count()
            .get_result::<i64>(conn)
            .await?
    }))
}
