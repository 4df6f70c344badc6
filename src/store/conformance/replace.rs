//! Conformance cases. Replace or skip on a duplicate unique key ([`OnDuplicate`]): keep the
//! holder (the default), overwrite it, or cancel it and insert — only while the holder is open
//! (pending, never started, no children); within a batch; 16 concurrent replacing enqueues of
//! one key per mode; bad combinations refused.

use super::*;
use crate::job::OnDuplicate;

/// A job of kind `r` keyed `key`, payload `tag`, replacing as `mode` says.
fn replacing(key: &str, mode: OnDuplicate, tag: i64) -> NewJob {
    NewJob::new("r", json!(tag))
        .unique_key(key)
        .on_duplicate(mode)
}

impl Bundle {
    /// Enqueues `job` at `at`: what the enqueue answered.
    async fn enqueue_answer(&self, job: NewJob, at: i64) -> Enqueued {
        self.store.job_enqueue(job, self.at(at)).await.unwrap()
    }

    /// The live jobs keyed `key`: (pending ones, cancelled ones, the ids holding it).
    async fn keyed_states(&self, key: &str) -> (Vec<Job>, usize, Vec<JobId>) {
        let all = self
            .store
            .job_list(ListParams {
                unique_key: Some(key.into()),
                ..ListParams::default()
            })
            .await
            .unwrap();
        let held = all.iter().filter(|j| j.unique_held).map(|j| j.id).collect();
        let cancelled = all
            .iter()
            .filter(|j| j.state == JobState::Cancelled)
            .count();
        let pending = all
            .into_iter()
            .filter(|j| j.state == JobState::Pending)
            .collect();
        (pending, cancelled, held)
    }
}

/// Each mode on a pending holder: `Keep` leaves it; `Replace` overwrites its payload, priority
/// and run time (a debounce) under the same id; `CancelAndInsert` cancels it and inserts. A
/// holder that is running, retrying, finished or a parent is kept whatever the mode; one whose
/// claim was given back before its handler started is open again.
pub async fn a_duplicate_replaces_or_cancels_only_a_holder_that_has_not_started(b: Backend) {
    let t = Bundle::new(b).await;
    let a = t.enqueue(replacing("d", OnDuplicate::Keep, 1), 0).await;

    let e = t
        .enqueue_answer(replacing("d", OnDuplicate::Keep, 2), 1)
        .await;
    assert_eq!((e.id, e.duplicate, e.replaced), (a, true, false));
    assert_eq!(t.get(a).await.payload, json!(1), "kept");

    let debounce = replacing("d", OnDuplicate::Replace, 3)
        .priority(3)
        .delay(Duration::from_secs(300));
    let e = t.enqueue_answer(debounce, 2).await;
    assert_eq!((e.id, e.duplicate, e.replaced), (a, true, true));
    let got = t.get(a).await;
    assert_eq!(got.payload, json!(3));
    assert_eq!(got.priority, 3);
    assert_eq!(got.run_at, t.at(302).unwrap(), "run time moved: a debounce");
    assert_eq!((got.version, got.state), (2, JobState::Pending));
    assert!(got.unique_held);

    let e = t
        .enqueue_answer(replacing("d", OnDuplicate::CancelAndInsert, 4), 3)
        .await;
    assert!(!e.duplicate && e.replaced && e.id != a, "{e:?}");
    let old = t.get(a).await;
    assert_eq!(old.state, JobState::Cancelled);
    assert!(!old.unique_held && old.finished_at.is_some());
    let c = e.id;
    let got = t.get(c).await;
    assert!(got.unique_held && got.state == JobState::Pending);
    assert_eq!(got.payload, json!(4));

    // Claimed, its handler not started, its lease expired: given back, open again.
    let claimed = t.claim("default", "n", 1, 4).await;
    assert_eq!(claimed[0].id, c);
    for mode in [OnDuplicate::Replace, OnDuplicate::CancelAndInsert] {
        let e = t.enqueue_answer(replacing("d", mode, 5), 5).await;
        assert_eq!((e.id, e.duplicate, e.replaced), (c, true, false), "running");
    }
    t.reclaim(100).await;
    assert_eq!(t.get(c).await.state, JobState::Pending, "given back");
    let e = t
        .enqueue_answer(replacing("d", OnDuplicate::Replace, 6), 101)
        .await;
    assert_eq!((e.id, e.duplicate, e.replaced), (c, true, true));

    // Started, then failed: retrying, never changed again.
    let claimed = t.claim("default", "n", 1, 102).await;
    let token = claimed[0].token.clone();
    t.renew_started(c, &token, 103, Some(1)).await;
    t.finalize(
        Finalize::retry(c, token, err("error", 1), Duration::from_secs(60)),
        104,
    )
    .await;
    for mode in [OnDuplicate::Replace, OnDuplicate::CancelAndInsert] {
        let e = t.enqueue_answer(replacing("d", mode, 7), 105).await;
        assert_eq!(
            (e.id, e.duplicate, e.replaced),
            (c, true, false),
            "retrying"
        );
    }
    let got = t.get(c).await;
    assert_eq!((got.state, got.payload), (JobState::Retrying, json!(6)));

    // A parent with a child waiting on it is kept.
    let p = t.enqueue(replacing("p", OnDuplicate::Keep, 1), 200).await;
    let child = t.enqueue(NewJob::new("r", json!(0)).after(&[p]), 200).await;
    for mode in [OnDuplicate::Replace, OnDuplicate::CancelAndInsert] {
        let e = t.enqueue_answer(replacing("p", mode, 2), 201).await;
        assert_eq!(
            (e.id, e.duplicate, e.replaced),
            (p, true, false),
            "a parent"
        );
    }
    assert_eq!(t.get(p).await.payload, json!(1));
    assert_eq!(t.get(child).await.state, JobState::Waiting);
}

/// In one batch, a repeat of a key replaces the job inserted for it earlier in the batch, as
/// two enqueues one after the other would; on the caller's connection too.
pub async fn a_repeat_within_a_batch_replaces_the_first(b: Backend) {
    let t = Bundle::new(b).await;
    let batch = vec![
        replacing("b", OnDuplicate::Replace, 1),
        NewJob::new("r", json!(0)),
        replacing("b", OnDuplicate::Replace, 2),
        replacing("c", OnDuplicate::CancelAndInsert, 1),
        replacing("c", OnDuplicate::CancelAndInsert, 2),
    ];
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(0)))
        .await
        .unwrap();
    assert_eq!(got[2].id, got[0].id);
    assert!(got[2].duplicate && got[2].replaced && !got[0].replaced);
    assert_eq!(t.get(got[0].id).await.payload, json!(2));
    assert!(!got[4].duplicate && got[4].replaced && got[4].id != got[3].id);
    assert_eq!(t.get(got[3].id).await.state, JobState::Cancelled);
    assert_eq!(t.get(got[4].id).await.payload, json!(2));

    let p = EnqueueParams::one(replacing("b", OnDuplicate::Replace, 3)).at(t.at(1));
    let store = t.store.clone();
    macro_rules! on {
        ($conn:expr) => {{
            let conn = $conn;
            conn.transaction(async |c| store.job_enqueue_in(c, p).await)
                .await
                .unwrap()
        }};
    }
    let e = match b {
        Backend::Postgres => on!(&mut AsyncPgConnection::establish(&t.db.url).await.unwrap()),
        Backend::Mysql => on!(&mut AsyncMysqlConnection::establish(&t.db.app_url())
            .await
            .unwrap()),
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            on!(&mut SqliteConn::establish(&path).await.unwrap())
        }
    };
    assert_eq!(
        (e[0].id, e[0].duplicate, e[0].replaced),
        (got[0].id, true, true)
    );
    assert_eq!(t.get(got[0].id).await.payload, json!(3));
}

/// 16 concurrent replacing enqueues of one key, for each mode: exactly one pending job holds
/// it; every write applied whole and none was lost (`Replace`: the holder's version rose by
/// 16; `CancelAndInsert`: 16 new jobs, all but the last cancelled); the next enqueue's payload
/// is the one left.
pub async fn concurrent_replacing_enqueues_leave_one_pending_job_with_the_last_payload(b: Backend) {
    let t = Bundle::new(b).await;
    for (key, mode) in [
        ("replace", OnDuplicate::Replace),
        ("cancel", OnDuplicate::CancelAndInsert),
    ] {
        let first = t.enqueue(replacing(key, OnDuplicate::Keep, -1), 0).await;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = t.store.clone();
            let now = t.at(1);
            let job = replacing(key, mode, i);
            tasks.push(tokio::spawn(async move {
                store.job_enqueue(job, now).await.unwrap()
            }));
        }
        let mut ids = HashSet::new();
        for task in tasks {
            let e = task.await.unwrap();
            assert!(e.replaced, "{key}: every racer replaced ({e:?})");
            assert_eq!(e.duplicate, mode == OnDuplicate::Replace, "{key}");
            ids.insert(e.id);
        }
        let (pending, cancelled, held) = t.keyed_states(key).await;
        assert_eq!(pending.len(), 1, "{key}: one pending job");
        assert_eq!(held, vec![pending[0].id], "{key}: and it holds the key");
        let tag = pending[0].payload.as_i64().unwrap();
        assert!((0..16).contains(&tag), "{key}: a racer's payload, {tag}");
        match mode {
            OnDuplicate::Replace => {
                assert_eq!(ids, HashSet::from([first]), "{key}");
                assert_eq!(pending[0].version, 17, "{key}: 16 writes, none lost");
                assert_eq!(cancelled, 0);
            }
            _ => {
                assert_eq!(ids.len(), 16, "{key}: 16 new jobs");
                assert!(!ids.contains(&first));
                assert_eq!(cancelled, 16, "{key}: the first and 15 replaced");
            }
        }
        let e = t.enqueue_answer(replacing(key, mode, 99), 2).await;
        let (pending, _, _) = t.keyed_states(key).await;
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].id, &pending[0].payload), (e.id, &json!(99)));
    }
}

/// A replacing mode without a key, or with parents, is refused naming `on_duplicate`; nothing
/// is stored.
pub async fn bad_replacing_enqueues_are_refused(b: Backend) {
    let t = Bundle::new(b).await;
    let p = t.enqueue(NewJob::new("r", json!(0)), 0).await;
    let bad = [
        NewJob::new("r", json!(1)).on_duplicate(OnDuplicate::Replace),
        NewJob::new("r", json!(1)).on_duplicate(OnDuplicate::CancelAndInsert),
        replacing("x", OnDuplicate::Replace, 1).after(&[p]),
        replacing("x", OnDuplicate::CancelAndInsert, 1).after_key("r", "y"),
    ];
    for job in bad {
        match t.store.job_enqueue(job.clone(), t.at(0)).await {
            Err(Error::InvalidInput { field, reason }) => {
                assert_eq!(field, "on_duplicate", "{reason}");
                assert!(reason.contains("expected"), "{reason}");
            }
            other => panic!("{job:?}: expected InvalidInput, got {other:?}"),
        }
    }
    assert_eq!(
        t.store.job_list(ListParams::default()).await.unwrap().len(),
        1
    );
}
