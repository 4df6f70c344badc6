//! Dependencies between jobs: a child never starts before its parents succeeded, a failed
//! parent applies the child's policy, a missing parent is refused at enqueue, a batch's
//! callback is released exactly once however its last members race, a parent's end racing
//! its child's enqueue never strands the child, cascade cancel, retry of a dead parent, the
//! archiver keeping parents, and a child reading its parents' results.

use super::*;
use crate::dependency::ParentPolicy;

/// Repetitions of the racing cases (each a fresh batch or pair; the whole file stays well
/// under 30 s per backend).
const RACE_REPS: usize = 60;

fn job(n: i64) -> NewJob {
    NewJob::new("d", json!(n))
}

async fn state(t: &Bundle, id: JobId) -> JobState {
    t.get(id).await.state
}

/// Claims every due job of the default queue at `at` and returns their ids.
async fn claim_ids(t: &Bundle, at: i64) -> Vec<JobId> {
    let mut ids: Vec<JobId> = t
        .claim("default", "n1", 100, at)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

/// Claims `id` (it must be due), records its start at `at`, and finalizes it with `outcome`.
async fn run(t: &Bundle, id: JobId, at: i64, outcome: JobState) -> Guarded<JobState> {
    let got = t.claim("default", "n1", 100, at).await;
    let c = got
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("job {id} is not claimable at {at}"));
    t.renew_started(id, &c.token, at, Some(0)).await;
    let f = match outcome {
        JobState::Succeeded => Finalize::succeeded(id, c.token.clone(), json!("ok")),
        JobState::Dead => Finalize::dead(id, c.token.clone(), err("boom", 1)),
        _ => Finalize::cancelled(id, c.token.clone(), err("stop", 1)),
    };
    // Give back whatever else was claimed.
    for other in got.iter().filter(|c| c.id != id) {
        t.finalize(
            Finalize::requeue(other.id, other.token.clone(), Duration::ZERO),
            at,
        )
        .await;
    }
    t.finalize(f, at).await
}

pub async fn a_child_starts_only_after_every_parent_succeeded(b: Backend) {
    let t = Bundle::new(b).await;
    let p1 = t.enqueue(job(1), 0).await;
    let p2 = t.enqueue(job(2), 0).await;
    let child = t.enqueue(job(3).after(&[p1, p2]), 0).await;
    // A chain below it.
    let grandchild = t.enqueue(job(4).after(&[child]), 0).await;
    assert_eq!(state(&t, child).await, JobState::Waiting);
    assert_eq!(state(&t, grandchild).await, JobState::Waiting);

    // Only the parents are claimable.
    let claimed = t.claim("default", "n1", 100, 1).await;
    let ids: Vec<JobId> = claimed.iter().map(|c| c.id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&p1) && ids.contains(&p2));
    let token = |id: JobId| claimed.iter().find(|c| c.id == id).unwrap().token.clone();
    t.renew_started(p1, &token(p1), 1, Some(0)).await;
    t.renew_started(p2, &token(p2), 1, Some(0)).await;
    t.finalize(Finalize::succeeded(p1, token(p1), json!(1)), 2)
        .await;
    // One parent of two: still waiting, never claimed.
    assert_eq!(state(&t, child).await, JobState::Waiting);
    assert!(claim_ids(&t, 3).await.is_empty());
    t.finalize(Finalize::succeeded(p2, token(p2), json!(2)), 4)
        .await;
    assert_eq!(state(&t, child).await, JobState::Pending);
    assert_eq!(state(&t, grandchild).await, JobState::Waiting);
    assert_eq!(
        run(&t, child, 5, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(
        run(&t, grandchild, 6, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );

    // From the stored times: every start after every parent's finish.
    for (kid, parents) in [(child, vec![p1, p2]), (grandchild, vec![child])] {
        let started = t.get(kid).await.first_started_at.unwrap();
        for p in parents {
            let finished = t.get(p).await.finished_at.unwrap();
            assert!(
                started >= finished,
                "{kid} started {started} before {p} finished {finished}"
            );
        }
    }
    // Visible from both ends.
    let d = t.store.job_dependencies(child).await.unwrap();
    let parents: Vec<JobId> = d.parents.iter().map(|l| l.id).collect();
    assert_eq!(parents, vec![p1, p2]);
    assert!(d
        .parents
        .iter()
        .all(|l| l.settled && l.state == Some(JobState::Succeeded)));
    assert_eq!(
        d.children.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![grandchild]
    );
    // A parent that had already succeeded counts at once.
    let late = t.enqueue(job(5).after(&[p1]), 7).await;
    assert_eq!(state(&t, late).await, JobState::Pending);
}

pub async fn a_failed_parent_applies_each_childs_policy(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let cancel = t.enqueue(job(2).after(&[p]), 0).await;
    let below = t.enqueue(job(3).after(&[cancel]), 0).await;
    let run_anyway = t
        .enqueue(job(4).after(&[p]).on_parent_failure(ParentPolicy::Run), 0)
        .await;
    let wait = t
        .enqueue(job(5).after(&[p]).on_parent_failure(ParentPolicy::Wait), 0)
        .await;
    assert_eq!(
        run(&t, p, 1, JobState::Dead).await,
        Guarded::Applied(JobState::Dead)
    );
    assert_eq!(state(&t, cancel).await, JobState::Cancelled);
    assert_eq!(
        state(&t, below).await,
        JobState::Cancelled,
        "the cancel cascades"
    );
    assert_eq!(state(&t, run_anyway).await, JobState::Pending);
    assert_eq!(state(&t, wait).await, JobState::Waiting);
    // The sweeper's backstop leaves a `wait` child waiting too.
    t.store.job_settle_stranded(100, t.at(2)).await.unwrap();
    assert_eq!(state(&t, wait).await, JobState::Waiting);

    // A parent cancelled by hand (never ran) does the same.
    let q = t.enqueue(job(6), 3).await;
    let c2 = t.enqueue(job(7).after(&[q]), 3).await;
    let r2 = t
        .enqueue(job(8).after(&[q]).on_parent_failure(ParentPolicy::Run), 3)
        .await;
    t.store
        .job_cancel(CancelParams {
            id: q,
            now: t.at(4),
        })
        .await
        .unwrap();
    assert_eq!(state(&t, c2).await, JobState::Cancelled);
    assert_eq!(state(&t, r2).await, JobState::Pending);
    // A child enqueued after its parent already failed gets the policy at once.
    let late = t.enqueue(job(9).after(&[q]), 5).await;
    assert_eq!(state(&t, late).await, JobState::Cancelled);
}

pub async fn a_missing_parent_is_a_clear_error_and_nothing_is_stored(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let before = t.store.job_counts().await.unwrap();
    let missing = JobId(p.0 + 1_000_000);
    let e = t
        .store
        .job_enqueue(job(2).after(&[p, missing]), t.at(1))
        .await
        .unwrap_err();
    match &e {
        Error::InvalidInput { field, reason } => {
            assert_eq!(*field, "after");
            assert!(reason.contains(&missing.to_string()), "{reason}");
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    let e = t
        .store
        .job_enqueue(job(3).after_key("d", "nobody"), t.at(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput { field: "after_key", reason } if reason.contains("nobody")),
        "{e:?}"
    );
    // Nothing stored: no job, no flag on the parent that exists.
    assert_eq!(t.store.job_counts().await.unwrap(), before);
    assert!(t
        .store
        .job_dependencies(p)
        .await
        .unwrap()
        .children
        .is_empty());
    // By key, the holder is the parent.
    let keyed = t.enqueue(job(4).unique_key("k1"), 2).await;
    let child = t.enqueue(job(5).after_key("d", "k1"), 2).await;
    let d = t.store.job_dependencies(child).await.unwrap();
    assert_eq!(
        d.parents.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![keyed]
    );
}

pub async fn the_batch_callback_is_released_once_when_the_last_members_race(b: Backend) {
    batch_callback_race(b, RACE_REPS).await;
}

/// The race of [`the_batch_callback_is_released_once_when_the_last_members_race`], `reps`
/// times on one database: each repetition a fresh batch of 8 members whose 8 finalizers run
/// at once on their own connections (`tests/fanin.rs` runs it 1,000 times per backend).
pub async fn batch_callback_race(b: Backend, reps: usize) {
    let t = Bundle::new(b).await;
    for rep in 0..reps {
        let members: Vec<NewJob> = (0..8).map(|i| job(i).queue("batch")).collect();
        let (batch, _) = t
            .store
            .enqueue_batch(&members, job(99).queue("callback"), t.at(0))
            .await
            .unwrap();
        let cb = batch.callback.id;
        assert_eq!(state(&t, cb).await, JobState::Waiting);
        let claimed = t.claim("batch", "n1", 8, 1).await;
        assert_eq!(claimed.len(), 8);
        // 8 finalizers at once, on their own connections; members 0 and 1 end dead.
        let gate = Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for (i, c) in claimed.into_iter().enumerate() {
            let (store, gate, now) = (t.store.clone(), gate.clone(), t.at(2));
            tasks.push(tokio::spawn(async move {
                let f = if i < 2 {
                    Finalize::dead(c.id, c.token, err("boom", 1))
                } else {
                    Finalize::succeeded(c.id, c.token, json!(i))
                };
                gate.wait().await;
                store
                    .job_finalize_settling(FinalizeParams {
                        items: vec![f],
                        now,
                    })
                    .await
                    .unwrap()
                    .1
            }));
        }
        let mut released = Vec::new();
        for task in tasks {
            released.extend(task.await.unwrap());
        }
        assert_eq!(released, vec!["callback".to_string()], "rep {rep}");
        assert_eq!(state(&t, cb).await, JobState::Pending, "rep {rep}");
        let got = t.claim("callback", "n1", 8, 3).await;
        assert_eq!(got.len(), 1, "rep {rep}");
        t.finalize(
            Finalize::succeeded(cb, got[0].token.clone(), json!("done")),
            3,
        )
        .await;
        let o = t.store.job_dependencies(cb).await.unwrap().outcomes();
        assert_eq!(
            (o.succeeded, o.dead, o.cancelled, o.unfinished),
            (6, 2, 0, 0)
        );
        // Settling again (the backstop) releases nothing more.
        let again = t.store.job_settle_stranded(100, t.at(4)).await.unwrap();
        assert!(again.released.is_empty(), "rep {rep}");
    }
}

pub async fn a_parents_end_racing_its_childs_enqueue_never_strands_the_child(b: Backend) {
    let t = Bundle::new(b).await;
    for rep in 0..RACE_REPS {
        let p = t.enqueue(job(1).queue("race"), 0).await;
        let c = t.claim("race", "n1", 1, 1).await.pop().unwrap();
        let gate = Arc::new(tokio::sync::Barrier::new(2));
        let fin = {
            let (store, gate, now) = (t.store.clone(), gate.clone(), t.at(2));
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .job_finalize_many(FinalizeParams {
                        items: vec![Finalize::succeeded(p, c.token, json!(1))],
                        now,
                    })
                    .await
                    .unwrap()
            })
        };
        let enq = {
            let (store, gate, now) = (t.store.clone(), gate.clone(), t.at(2));
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .job_enqueue(job(2).queue("race_child").after(&[p]), now)
                    .await
                    .unwrap()
            })
        };
        fin.await.unwrap();
        let child = enq.await.unwrap().id;
        assert_eq!(state(&t, child).await, JobState::Pending, "rep {rep}");
    }
}

pub async fn a_cascading_cancel_reaches_every_descendant(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let other = t.enqueue(job(2), 0).await;
    let run_anyway = t
        .enqueue(job(3).after(&[p]).on_parent_failure(ParentPolicy::Run), 0)
        .await;
    let grand = t
        .enqueue(
            job(4)
                .after(&[run_anyway, other])
                .on_parent_failure(ParentPolicy::Wait),
            0,
        )
        .await;
    let reached = t.store.job_cancel_cascade(p, t.at(1)).await.unwrap();
    assert_eq!(reached.len(), 2, "{reached:?}");
    for id in [p, run_anyway, grand] {
        assert_eq!(state(&t, id).await, JobState::Cancelled, "{id}");
    }
    assert_eq!(
        state(&t, other).await,
        JobState::Pending,
        "not a descendant"
    );
    // Without the cascade a `run` child of a cancelled parent is released instead.
    let q = t.enqueue(job(5), 2).await;
    let r = t
        .enqueue(job(6).after(&[q]).on_parent_failure(ParentPolicy::Run), 2)
        .await;
    t.store
        .job_cancel(CancelParams {
            id: q,
            now: t.at(3),
        })
        .await
        .unwrap();
    assert_eq!(state(&t, r).await, JobState::Pending);
}

pub async fn retrying_a_dead_parent_releases_its_waiting_children(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let child = t
        .enqueue(job(2).after(&[p]).on_parent_failure(ParentPolicy::Wait), 0)
        .await;
    assert_eq!(
        run(&t, p, 1, JobState::Dead).await,
        Guarded::Applied(JobState::Dead)
    );
    assert_eq!(state(&t, child).await, JobState::Waiting);
    let retried = t
        .store
        .job_retry(RetryParams {
            id: p,
            expected_version: None,
            now: t.at(2),
        })
        .await
        .unwrap();
    assert!(matches!(retried, Guarded::Applied(_)));
    assert_eq!(state(&t, child).await, JobState::Waiting);
    assert_eq!(
        run(&t, p, 3, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(state(&t, child).await, JobState::Pending);
}

pub async fn the_archiver_keeps_a_parent_until_its_children_end(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let q = t.enqueue(job(2), 0).await;
    let child = t.enqueue(job(3).after(&[p, q]), 0).await;
    assert_eq!(
        run(&t, p, 1, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    let archive = async |at: i64| {
        t.store
            .job_archive(ArchiveParams {
                older_than: Duration::ZERO,
                dead_older_than: Duration::ZERO,
                limit: 100,
                now: t.at(at),
            })
            .await
            .unwrap()
    };
    archive(10).await;
    assert!(
        t.get(p).await.archived_at.is_none(),
        "a parent of a waiting child stays"
    );
    assert_eq!(state(&t, child).await, JobState::Waiting);
    t.store
        .job_cancel(CancelParams {
            id: child,
            now: t.at(11),
        })
        .await
        .unwrap();
    archive(12).await;
    assert!(
        t.get(p).await.archived_at.is_some(),
        "archived once its child ended"
    );
    // Still visible from the child, with its state.
    let d = t.store.job_dependencies(child).await.unwrap();
    assert!(d
        .parents
        .iter()
        .any(|l| l.id == p && l.state == Some(JobState::Succeeded)));
}

pub async fn an_archived_parent_counts_with_its_final_state(b: Backend) {
    let t = Bundle::new(b).await;
    let ok = t.enqueue(job(1).unique_key("ok"), 0).await;
    let bad = t.enqueue(job(2).unique_key("bad"), 0).await;
    let live = t.enqueue(job(3), 0).await;
    assert_eq!(
        run(&t, ok, 1, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(
        run(&t, bad, 2, JobState::Dead).await,
        Guarded::Applied(JobState::Dead)
    );
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::ZERO,
            dead_older_than: Duration::ZERO,
            limit: 100,
            now: t.at(5),
        })
        .await
        .unwrap();
    assert_eq!(moved, 2);
    for p in [ok, bad] {
        assert!(t.get(p).await.archived_at.is_some(), "job {p} archived");
    }
    // A succeeded archived parent is done: by id and by key.
    let c1 = t.enqueue(job(10).after(&[ok]), 6).await;
    let c2 = t.enqueue(job(11).after_key("d", "ok"), 6).await;
    assert_eq!(state(&t, c1).await, JobState::Pending);
    assert_eq!(state(&t, c2).await, JobState::Pending);
    let d = t.store.job_dependencies(c1).await.unwrap();
    assert_eq!(d.parents.len(), 1);
    assert_eq!(
        (d.parents[0].id, d.parents[0].state, d.parents[0].settled),
        (ok, Some(JobState::Succeeded), true)
    );
    // A dead archived parent applies the child's policy.
    let cancel = t.enqueue(job(12).after_key("d", "bad"), 6).await;
    let run_anyway = t
        .enqueue(
            job(13).after(&[bad]).on_parent_failure(ParentPolicy::Run),
            6,
        )
        .await;
    let wait = t
        .enqueue(
            job(14).after(&[bad]).on_parent_failure(ParentPolicy::Wait),
            6,
        )
        .await;
    assert_eq!(state(&t, cancel).await, JobState::Cancelled);
    assert_eq!(state(&t, run_anyway).await, JobState::Pending);
    assert_eq!(state(&t, wait).await, JobState::Waiting);
    // An archived parent beside a live one: the child waits for the live one only.
    let both = t.enqueue(job(15).after(&[ok, live]), 6).await;
    assert_eq!(state(&t, both).await, JobState::Waiting);
    assert_eq!(
        run(&t, live, 7, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(state(&t, both).await, JobState::Pending);
    // Neither live nor archived: still refused, naming it.
    let missing = JobId(ok.0 + 1_000_000);
    let e = t
        .store
        .job_enqueue(job(16).after(&[ok, missing]), t.at(8))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput { field: "after", reason }
            if reason.contains(&missing.to_string()) && reason.contains("archived")),
        "{e:?}"
    );
}

pub async fn an_enqueue_in_the_callers_transaction_names_parents(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(job(1), 0).await;
    let one = |j: NewJob| EnqueueParams::one(j).at(t.at(1));
    macro_rules! on {
        ($conn:expr) => {{
            let conn = $conn;
            let store = t.store.clone();
            // Rolled back with the caller's rows: no child, no edge.
            let rolled: Result<(), Error> = conn
                .transaction(async |c| {
                    store.job_enqueue_in(c, one(job(2).after(&[p]))).await?;
                    Err(Error::invalid("test", "roll back"))
                })
                .await;
            assert!(rolled.is_err());
            // Committed: a parent enqueued earlier in the same transaction counts, and a
            // refused child (a missing parent) leaves the caller's transaction usable.
            let (q, child, other): (JobId, JobId, JobId) = conn
                .transaction(async |c| {
                    let q = store.job_enqueue_in(c, one(job(3))).await?[0].id;
                    let missing = JobId(p.0 + 1_000_000);
                    let e = store
                        .job_enqueue_in(c, one(job(4).after(&[missing])))
                        .await
                        .unwrap_err();
                    assert!(
                        matches!(&e, Error::InvalidInput { field: "after", .. }),
                        "{e:?}"
                    );
                    let child = store.job_enqueue_in(c, one(job(5).after(&[p, q]))).await?[0].id;
                    let other = store.job_enqueue_in(c, one(job(6))).await?[0].id;
                    Ok::<_, Error>((q, child, other))
                })
                .await
                .unwrap();
            // Outside any transaction: a transaction of its own.
            let lone = store
                .job_enqueue_in(conn, one(job(7).after(&[child])))
                .await
                .unwrap()[0]
                .id;
            (q, child, other, lone)
        }};
    }
    let (q, child, other, lone) = match b {
        Backend::Postgres => on!(&mut AsyncPgConnection::establish(&t.db.url).await.unwrap()),
        Backend::Mysql => on!(&mut AsyncMysqlConnection::establish(&t.db.app_url())
            .await
            .unwrap()),
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            on!(&mut SqliteConn::establish(&path).await.unwrap())
        }
    };
    let all: Vec<JobId> = t
        .store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        all.len(),
        5,
        "p, q, the child, the other job and the lone child: {all:?}"
    );
    assert_eq!(state(&t, child).await, JobState::Waiting);
    assert_eq!(state(&t, lone).await, JobState::Waiting);
    assert_eq!(state(&t, other).await, JobState::Pending);
    let d = t.store.job_dependencies(child).await.unwrap();
    let mut parents: Vec<JobId> = d.parents.iter().map(|l| l.id).collect();
    parents.sort();
    assert_eq!(parents, vec![p, q]);
    // The edges work as the Client's do: the child is released by its parents' ends.
    assert_eq!(
        run(&t, p, 2, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(state(&t, child).await, JobState::Waiting);
    assert_eq!(
        run(&t, q, 3, JobState::Succeeded).await,
        Guarded::Applied(JobState::Succeeded)
    );
    assert_eq!(state(&t, child).await, JobState::Pending);
    assert_eq!(
        run(&t, child, 4, JobState::Dead).await,
        Guarded::Applied(JobState::Dead)
    );
    assert_eq!(
        state(&t, lone).await,
        JobState::Cancelled,
        "its policy: cancel"
    );
}

/// Claims `id`, records its start and finalizes it succeeded with `result`, at `at`.
async fn succeed_with(t: &Bundle, id: JobId, at: i64, result: serde_json::Value) {
    let c = t
        .claim("default", "n1", 1, at)
        .await
        .pop()
        .unwrap_or_else(|| panic!("job {id} is not claimable at {at}"));
    assert_eq!(c.id, id);
    t.renew_started(id, &c.token, at, Some(0)).await;
    let f = Finalize::succeeded(id, c.token.clone(), result);
    assert_eq!(
        t.finalize(f, at).await,
        Guarded::Applied(JobState::Succeeded)
    );
}

pub async fn a_child_reads_its_parents_results_live_or_archived(b: Backend) {
    let t = Bundle::new(b).await;
    let results = async |child: JobId| t.store.job_parent_results(child, usize::MAX).await.unwrap();
    let archive = async |at: i64| {
        t.store
            .job_archive(ArchiveParams {
                older_than: Duration::ZERO,
                dead_older_than: Duration::ZERO,
                limit: 100,
                now: t.at(at),
            })
            .await
            .unwrap()
    };
    // A parent that succeeded and was archived before the child named it.
    let old = t.enqueue(job(1), 0).await;
    succeed_with(&t, old, 1, json!({"rows": 3})).await;
    assert_eq!(archive(2).await, 1);
    let p = t.enqueue(job(2), 3).await;
    let bad = t.enqueue(job(3), 3).await;
    let child = t
        .enqueue(
            job(4)
                .after(&[old, p, bad])
                .on_parent_failure(ParentPolicy::Run),
            3,
        )
        .await;
    // Before the live parents end: listed with their states, no result.
    assert_eq!(
        results(child).await,
        vec![
            (old, JobState::Succeeded, Some(json!({"rows": 3}))),
            (p, JobState::Pending, None),
            (bad, JobState::Pending, None),
        ]
    );
    succeed_with(&t, p, 4, json!("p-out")).await;
    assert_eq!(
        run(&t, bad, 5, JobState::Dead).await,
        Guarded::Applied(JobState::Dead)
    );
    // A crash between the last parent's end and its settle: the backstop releases the
    // child, and what it reads is in the parents' rows, written by their finalizations.
    t.store.job_settle_stranded(100, t.at(6)).await.unwrap();
    assert_eq!(state(&t, child).await, JobState::Pending);
    let ended = vec![
        (old, JobState::Succeeded, Some(json!({"rows": 3}))),
        (p, JobState::Succeeded, Some(json!("p-out"))),
        (bad, JobState::Dead, None),
    ];
    assert_eq!(results(child).await, ended);
    // The live parents stay while the child has not ended; the archived one is read from
    // the archive until it is pruned, which takes its edge with it.
    assert_eq!(archive(7).await, 0, "parents of a live child stay");
    assert_eq!(results(child).await, ended);
    let pruned = t
        .store
        .job_prune_archive(PruneParams {
            older_than: Duration::from_secs(60),
            limit: 100,
            now: t.at(2 + 61),
        })
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert_eq!(results(child).await, ended[1..].to_vec());
    // A job with no parents has none to read.
    assert_eq!(results(p).await, vec![]);
}

/// A wide fan-in's parents are read a page of 1,000 at a time, in id order across the pages,
/// and the read stops after the page in which the results pass the cap: 1,100 parents with
/// 1 KB results each, read whole without a cap, and only the first page's with one of 100 KB
/// (the caller then refuses them), so a 100,000-parent fan-in never holds every row.
pub async fn a_wide_fan_in_is_read_by_pages_that_stop_past_the_cap(b: Backend) {
    let t = Bundle::new(b).await;
    let parents: Vec<JobId> = t
        .store
        .job_enqueue_many(EnqueueParams {
            jobs: (0..1_100)
                .map(|i| NewJob::new("d", json!(i)).queue("fan"))
                .collect(),
            now: t.at(0),
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let child = t.enqueue(job(0).after(&parents), 0).await;
    let claimed = t.claim("fan", "n1", 1_100, 1).await;
    assert_eq!(claimed.len(), 1_100);
    let blob = "x".repeat(1_000);
    let items = claimed
        .iter()
        .map(|c| Finalize::succeeded(c.id, c.token.clone(), json!({ "blob": blob })))
        .collect();
    assert!(t
        .finalize_many(items, 2)
        .await
        .iter()
        .all(|(_, g)| *g == Guarded::Applied(JobState::Succeeded)));
    let mut ids = parents.clone();
    ids.sort_unstable();
    let in_order = |rows: &[(JobId, JobState, Option<serde_json::Value>)]| {
        rows.iter().zip(&ids).all(|(r, id)| r.0 == *id)
    };
    let all = t.store.job_parent_results(child, usize::MAX).await.unwrap();
    assert_eq!(all.len(), 1_100);
    assert!(in_order(&all), "the parents are not read in id order");
    assert!(all
        .iter()
        .all(|r| r.1 == JobState::Succeeded && r.2 == Some(json!({ "blob": blob }))));
    let capped = t.store.job_parent_results(child, 100_000).await.unwrap();
    assert_eq!(
        capped.len(),
        1_000,
        "the read went on past the page that passed the cap"
    );
    assert!(in_order(&capped), "the first page is not the lowest ids");
}
