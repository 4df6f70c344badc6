//! Conformance cases. Unique-key scopes: *until archived* (the default), *while active* and
//! *for a period* — each rule, its release on every transition that ends a job, manual
//! retries, the archiver, 16 concurrent enqueues of one key per scope, concurrent take-overs
//! of an expired period, and bad scopes refused.

use super::*;
use crate::job::UniqueScope;

const MINUTE: Duration = Duration::from_secs(60);

fn keyed(key: &str, scope: Option<UniqueScope>, tag: i64) -> NewJob {
    let j = NewJob::new("u", json!(tag)).unique_key(key);
    match scope {
        Some(s) => j.unique_scope(s),
        None => j,
    }
}

impl Bundle {
    /// Enqueues `job` at `at`: its id and whether it was a duplicate.
    async fn try_enqueue(&self, job: NewJob, at: i64) -> (JobId, bool) {
        let e = self.store.job_enqueue(job, self.at(at)).await.unwrap();
        (e.id, e.duplicate)
    }

    /// Claims the one due job of the default queue.
    async fn claim_one(&self, at: i64) -> ClaimedJob {
        let mut c = self.claim("default", "n", 1, at).await;
        assert_eq!(c.len(), 1, "one job due");
        c.pop().unwrap()
    }

    /// The live jobs carrying `key`, and how many of them hold it.
    async fn with_key(&self, key: &str) -> (Vec<Job>, usize) {
        let all = self
            .store
            .job_list(ListParams {
                unique_key: Some(key.into()),
                ..ListParams::default()
            })
            .await
            .unwrap();
        let held = all.iter().filter(|j| j.unique_held).count();
        (all, held)
    }

    async fn cancel(&self, id: JobId, at: i64) {
        let got = self
            .store
            .job_cancel(CancelParams {
                id,
                now: self.at(at),
            })
            .await
            .unwrap();
        assert!(matches!(got, CancelOutcome::Cancelled(_)), "{got:?}");
    }
}

/// While active: a duplicate while the holder is pending, running or retrying; a new job is
/// accepted once it succeeded, died (by its handler, with its attempts used up, or reclaimed),
/// or was cancelled (pending or running). A manual retry re-takes a free key, and leaves a key
/// another job holds to that job.
pub async fn while_active_keys_are_held_until_the_job_finishes(b: Backend) {
    let t = Bundle::new(b).await;
    let wa = Some(UniqueScope::WhileActive);
    let (a, dup) = t.try_enqueue(keyed("k", wa, 1), 0).await;
    assert!(!dup);
    let j = t.get(a).await;
    assert_eq!(j.unique_scope, Some(UniqueScope::WhileActive));
    assert!(j.unique_held && j.unique_until.is_none());
    assert_eq!(
        t.try_enqueue(keyed("k", wa, 2), 1).await,
        (a, true),
        "pending"
    );
    let c = t.claim_one(2).await;
    assert_eq!(
        t.try_enqueue(keyed("k", wa, 3), 3).await,
        (a, true),
        "running"
    );
    t.finalize(
        Finalize::retry(a, c.token, err("error", 1), Duration::ZERO),
        4,
    )
    .await;
    assert_eq!(t.get(a).await.state, JobState::Retrying);
    assert_eq!(
        t.try_enqueue(keyed("k", wa, 4), 5).await,
        (a, true),
        "retrying"
    );
    // Another scope's enqueue meets the holder too.
    assert_eq!(t.try_enqueue(keyed("k", None, 5), 5).await, (a, true));
    let c = t.claim_one(6).await;
    t.finalize(Finalize::succeeded(a, c.token, json!("ok")), 7)
        .await;
    assert!(!t.get(a).await.unique_held, "released at success");

    // Succeeded: a new job is accepted; it dies by its handler.
    let (b1, dup) = t.try_enqueue(keyed("k", wa, 6), 8).await;
    assert!(!dup && b1 != a);
    let c = t.claim_one(9).await;
    t.finalize(Finalize::dead(b1, c.token, err("fatal", 1)), 10)
        .await;
    // Dead: accepted; cancelled while pending.
    let (c1, dup) = t.try_enqueue(keyed("k", wa, 7), 11).await;
    assert!(!dup);
    t.cancel(c1, 12).await;
    // Cancelled: accepted; cancelled while running (its holder finalizes it cancelled).
    let (d1, dup) = t.try_enqueue(keyed("k", wa, 8), 13).await;
    assert!(!dup);
    let c = t.claim_one(14).await;
    t.finalize(Finalize::cancelled(d1, c.token, err("cancelled", 1)), 15)
        .await;
    // Attempts used up: a retry becomes dead and releases the key.
    let (e1, dup) = t.try_enqueue(keyed("k", wa, 9).max_attempts(1), 16).await;
    assert!(!dup);
    let c = t.claim_one(17).await;
    let got = t
        .finalize(
            Finalize::retry(e1, c.token, err("error", 1), Duration::ZERO),
            18,
        )
        .await;
    assert_eq!(got, Guarded::Applied(JobState::Dead));
    // Reclaimed dead by the sweeper (its node died after its start was recorded).
    let (f1, dup) = t.try_enqueue(keyed("k", wa, 10).max_attempts(1), 19).await;
    assert!(!dup);
    let c = t.claim_one(20).await;
    assert!(matches!(
        t.renew_started(f1, &c.token, 21, Some(0)).await,
        Guarded::Applied(_)
    ));
    let r = t.reclaim(100).await;
    assert_eq!((r.len(), r[0].new_state), (1, JobState::Dead));
    let (g1, dup) = t.try_enqueue(keyed("k", wa, 11), 101).await;
    assert!(!dup, "free after a reclaim that ended the job");
    for id in [a, b1, c1, d1, e1, f1] {
        assert!(!t.get(id).await.unique_held, "job {id} released the key");
    }
    let (_, held) = t.with_key("k").await;
    assert_eq!(held, 1);

    // Manual retry while another job holds the key: the retried job runs without it.
    let retried = t
        .store
        .job_retry(RetryParams {
            id: c1,
            expected_version: None,
            now: t.at(102),
        })
        .await
        .unwrap();
    let Guarded::Applied(r) = retried else {
        panic!("{retried:?}")
    };
    assert_eq!(r.state, JobState::Pending);
    assert!(!r.unique_held, "the key stays with the job holding it");
    assert!(t.get(g1).await.unique_held);
    assert_eq!(t.try_enqueue(keyed("k", wa, 12), 103).await, (g1, true));
    // Once the key is free, a manual retry takes it again.
    t.cancel(g1, 104).await;
    t.cancel(c1, 104).await;
    let retried = t
        .store
        .job_retry(RetryParams {
            id: b1,
            expected_version: None,
            now: t.at(105),
        })
        .await
        .unwrap();
    let Guarded::Applied(r) = retried else {
        panic!("{retried:?}")
    };
    assert!(r.unique_held, "a free key is taken again");
    assert_eq!(t.try_enqueue(keyed("k", wa, 13), 106).await, (b1, true));
}

/// Until archived (the default, and when named): a duplicate while the holder is live,
/// finished or not; a new job once it is archived.
pub async fn until_archived_keys_are_held_until_the_job_is_archived(b: Backend) {
    let t = Bundle::new(b).await;
    for (key, scope) in [("d", None), ("n", Some(UniqueScope::UntilArchived))] {
        let (a, dup) = t.try_enqueue(keyed(key, scope, 1), 0).await;
        assert!(!dup);
        let j = t.get(a).await;
        assert_eq!(j.unique_scope, Some(UniqueScope::UntilArchived));
        assert!(j.unique_held && j.unique_until.is_none());
        let c = t.claim_one(1).await;
        assert_eq!(t.try_enqueue(keyed(key, scope, 2), 2).await, (a, true));
        t.finalize(Finalize::succeeded(a, c.token, json!(1)), 3)
            .await;
        assert_eq!(
            t.try_enqueue(keyed(key, scope, 3), 4).await,
            (a, true),
            "finished but live"
        );
        let moved = t
            .store
            .job_archive(ArchiveParams {
                older_than: Duration::from_secs(1),
                dead_older_than: Duration::from_secs(1),
                limit: 10,
                now: t.at(10),
            })
            .await
            .unwrap();
        assert_eq!(moved, 1);
        let (b1, dup) = t.try_enqueue(keyed(key, scope, 4), 11).await;
        assert!(!dup && b1 != a, "free once archived");
        t.cancel(b1, 12).await;
        assert_eq!(t.try_enqueue(keyed(key, scope, 5), 13).await, (b1, true));
    }
    // Keyless jobs have no scope.
    let id = t.enqueue(NewJob::new("u", json!(0)), 0).await;
    assert_eq!(t.get(id).await.unique_scope, None);
}

/// For a period: a duplicate within the period, even after the holder finished; after it,
/// the next enqueue takes the key over (one statement batch or one job, any scope); the
/// archiver leaves a job in the live table until its period ends.
pub async fn period_keys_are_held_for_their_period(b: Backend) {
    let t = Bundle::new(b).await;
    let per = Some(UniqueScope::For(MINUTE));
    let (a, dup) = t.try_enqueue(keyed("p", per, 1), 0).await;
    assert!(!dup);
    let j = t.get(a).await;
    assert_eq!(j.unique_scope, per);
    assert_eq!(j.unique_until, t.at(60));
    assert!(j.unique_held);
    assert_eq!(t.try_enqueue(keyed("p", per, 2), 10).await, (a, true));
    let c = t.claim_one(20).await;
    t.finalize(Finalize::succeeded(a, c.token, json!(1)), 21)
        .await;
    assert_eq!(
        t.try_enqueue(keyed("p", per, 3), 30).await,
        (a, true),
        "finished"
    );
    assert_eq!(
        t.try_enqueue(keyed("p", Some(UniqueScope::WhileActive), 4), 59)
            .await,
        (a, true),
        "any scope meets the held period"
    );
    // The period ends at 60: the next enqueue takes the key over.
    let (b1, dup) = t.try_enqueue(keyed("p", per, 5), 60).await;
    assert!(!dup && b1 != a);
    assert!(!t.get(a).await.unique_held, "taken over");
    let j = t.get(b1).await;
    assert!(j.unique_held);
    assert_eq!(j.unique_until, t.at(120));
    assert_eq!(t.try_enqueue(keyed("p", per, 6), 61).await, (b1, true));
    // A pending holder is taken over too once its period ends (at most one per period).
    // Through a batch: a keyless job, the take-over, a repeat of the key.
    let batch = vec![
        NewJob::new("u", json!(0)),
        keyed("p", per, 7),
        keyed("p", per, 8),
    ];
    let got = t
        .store
        .job_enqueue_many(EnqueueParams::many(batch).at(t.at(120)))
        .await
        .unwrap();
    assert!(!got[0].duplicate && !got[1].duplicate && got[2].duplicate);
    assert_eq!(got[2].id, got[1].id);
    assert!(!t.get(b1).await.unique_held);
    let (_, held) = t.with_key("p").await;
    assert_eq!(held, 1);
    // A job whose key was taken over does not get it back on a manual retry.
    t.cancel(b1, 121).await;
    let retried = t
        .store
        .job_retry(RetryParams {
            id: b1,
            expected_version: None,
            now: t.at(122),
        })
        .await
        .unwrap();
    assert!(
        matches!(retried, Guarded::Applied(ref j) if !j.unique_held),
        "{retried:?}"
    );
    assert_eq!(
        t.try_enqueue(keyed("p", per, 9), 123).await,
        (got[1].id, true)
    );

    // The archiver keeps a finished job whose period is running.
    let hour = Some(UniqueScope::For(Duration::from_secs(3600)));
    let (h, _) = t.try_enqueue(keyed("h", hour, 1), 0).await;
    let c = t.claim("default", "n", 10, 1000).await;
    for c in c {
        t.finalize(Finalize::succeeded(c.id, c.token, json!(1)), 1001)
            .await;
    }
    let archive = |at: i64| ArchiveParams {
        older_than: Duration::from_secs(1),
        dead_older_than: Duration::from_secs(1),
        limit: 100,
        now: t.at(at),
    };
    t.store.job_archive(archive(2000)).await.unwrap();
    assert!(t.get(a).await.archived_at.is_some(), "its period is over");
    assert!(t.get(h).await.archived_at.is_none(), "within its period");
    assert_eq!(t.try_enqueue(keyed("h", hour, 2), 2000).await, (h, true));
    t.store.job_archive(archive(3600)).await.unwrap();
    assert!(t.get(h).await.archived_at.is_some());
    let (h2, dup) = t.try_enqueue(keyed("h", hour, 3), 3601).await;
    assert!(!dup && h2 != h);
}

/// 16 concurrent enqueues of one key, for each scope: exactly one row holds it, and the
/// others report a duplicate with its id.
pub async fn concurrent_enqueues_of_one_key_hold_it_once_per_scope(b: Backend) {
    let t = Bundle::new(b).await;
    let scopes = [
        ("archived", UniqueScope::UntilArchived),
        ("active", UniqueScope::WhileActive),
        ("period", UniqueScope::For(MINUTE)),
    ];
    for (key, scope) in scopes {
        let (ids, fresh) = race(&t, key, scope, 0).await;
        assert_eq!(ids.len(), 1, "{key}: all 16 got the same id");
        assert_eq!(fresh.len(), 1, "{key}: exactly one was not a duplicate");
        let (all, held) = t.with_key(key).await;
        assert_eq!((all.len(), held), (1, 1), "{key}");
    }
}

/// Right after a period ends, 16 concurrent enqueues of its key: exactly one takes it over
/// (three rounds).
pub async fn concurrent_enqueues_after_a_period_take_it_over_once(b: Backend) {
    let t = Bundle::new(b).await;
    let scope = UniqueScope::For(MINUTE);
    let (mut holder, _) = t.try_enqueue(keyed("t", Some(scope), -1), 0).await;
    for round in 1..=3 {
        let at = 60 * round;
        let (ids, fresh) = race(&t, "t", scope, at).await;
        assert_eq!(ids.len(), 1, "round {round}: all 16 got the same id");
        assert_eq!(fresh.len(), 1, "round {round}: exactly one took over");
        let new = *fresh.iter().next().unwrap();
        assert_ne!(new, holder);
        assert!(!t.get(holder).await.unique_held);
        let (all, held) = t.with_key("t").await;
        assert_eq!(all.len(), usize::try_from(round + 1).unwrap());
        assert_eq!(held, 1, "round {round}");
        holder = new;
    }
}

/// 16 tasks enqueue `key` at once: the ids they got and the ids that were new.
async fn race(
    t: &Bundle,
    key: &str,
    scope: UniqueScope,
    at: i64,
) -> (HashSet<JobId>, HashSet<JobId>) {
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = t.store.clone();
        let now = t.at(at);
        let job = keyed(key, Some(scope), i);
        tasks.push(tokio::spawn(async move {
            store.job_enqueue(job, now).await.unwrap()
        }));
    }
    let (mut ids, mut fresh) = (HashSet::new(), HashSet::new());
    for task in tasks {
        let e = task.await.unwrap();
        ids.insert(e.id);
        if !e.duplicate {
            fresh.insert(e.id);
        }
    }
    (ids, fresh)
}

/// A scope without a key, and periods out of range, are refused naming `unique_scope`;
/// nothing is stored.
pub async fn bad_unique_scopes_are_refused(b: Backend) {
    let t = Bundle::new(b).await;
    let bad = [
        NewJob::new("u", json!(1)).unique_scope(UniqueScope::WhileActive),
        NewJob::new("u", json!(1)).unique_scope(UniqueScope::UntilArchived),
        keyed("b", Some(UniqueScope::For(Duration::ZERO)), 1),
        keyed("b", Some(UniqueScope::For(Duration::from_micros(999))), 1),
        keyed(
            "b",
            Some(UniqueScope::For(Duration::from_secs(366 * 86_400 + 1))),
            1,
        ),
    ];
    for job in bad {
        let got = t.store.job_enqueue(job.clone(), t.at(0)).await;
        match got {
            Err(Error::InvalidInput { field, reason }) => {
                assert_eq!(field, "unique_scope", "{reason}");
            }
            other => panic!("{job:?}: expected InvalidInput, got {other:?}"),
        }
        let batch = vec![NewJob::new("u", json!(0)), job];
        assert!(t
            .store
            .job_enqueue_many(EnqueueParams::many(batch).at(t.at(0)))
            .await
            .is_err());
    }
    assert!(t
        .store
        .job_list(ListParams::default())
        .await
        .unwrap()
        .is_empty());
    for d in [Duration::from_millis(1), Duration::from_secs(366 * 86_400)] {
        let (_, dup) = t
            .try_enqueue(keyed(&format!("{d:?}"), Some(UniqueScope::For(d)), 1), 0)
            .await;
        assert!(!dup);
    }
}

/// The scopes migration on a database with keyed jobs in it: every live keyed job holds its
/// key until archived, as before; reverting it keeps one job per key (the holders).
pub async fn keyed_jobs_from_before_scopes_keep_their_key_after_the_migration(b: Backend) {
    let t = Bundle::new(b).await;
    let old = t
        .enqueue(keyed("old", Some(UniqueScope::WhileActive), 1), 0)
        .await;
    // A released key and its new holder: two rows with one key.
    let first = t
        .enqueue(keyed("twice", Some(UniqueScope::WhileActive), 2), 0)
        .await;
    t.cancel(first, 1).await;
    let second = t
        .enqueue(keyed("twice", Some(UniqueScope::WhileActive), 3), 2)
        .await;
    let keyless = t.enqueue(NewJob::new("u", json!(4)), 0).await;

    // Back to the schema before scopes, then forward again.
    let down = match b {
        Backend::Postgres => {
            include_str!("../../../migrations/postgres/2026-11-24-000007_unique_scopes/down.sql")
        }
        Backend::Mysql => {
            include_str!("../../../migrations/mysql/2026-11-24-000007_unique_scopes/down.sql")
        }
        Backend::Sqlite => {
            include_str!("../../../migrations/sqlite/2026-11-24-000007_unique_scopes/down.sql")
        }
    };
    // Later migrations are reverted first (newest first), then everything runs again.
    let later = match b {
        Backend::Postgres => vec![
            include_str!(
                "../../../migrations/postgres/2026-12-20-000035_running_index_without_deduplication/down.sql"
            ),
            include_str!(
                "../../../migrations/postgres/2026-12-19-000034_vacuum_threshold/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-12-18-000033_shown_fields/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-17-000032_start_by/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-17-000031_sequences/down.sql"),
            include_str!(
                "../../../migrations/postgres/2026-12-16-000030_runtime_schedules/down.sql"
            ),
            include_str!(
                "../../../migrations/postgres/2026-12-15-000029_quiet_enqueue_hot_renewals/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-12-15-000028_waits/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-14-000027_claims/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-13-000026_throughput/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-12-000025_audit/down.sql"),
            include_str!(
                "../../../migrations/postgres/2026-12-10-000023_release_notify_in_settle/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-12-09-000022_wakes/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-08-000021_dead_index/down.sql"),
            include_str!(
                "../../../migrations/postgres/2026-12-07-000020_open_edges_index/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-12-06-000019_dependencies/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-05-000018_effects/down.sql"),
            include_str!("../../../migrations/postgres/2026-12-04-000017_settings_notify/down.sql"),
            include_str!(
                "../../../migrations/postgres/2026-12-03-000016_running_index_serves_sweep/down.sql"
            ),
            include_str!(
                "../../../migrations/postgres/2026-12-02-000015_partition_claim_index/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-12-01-000014_running_index/down.sql"),
            include_str!(
                "../../../migrations/postgres/2026-11-30-000013_schedule_declared/down.sql"
            ),
            include_str!("../../../migrations/postgres/2026-11-29-000012_schedules/down.sql"),
            include_str!("../../../migrations/postgres/2026-11-28-000011_leader/down.sql"),
            include_str!("../../../migrations/postgres/2026-11-27-000010_progress/down.sql"),
            include_str!("../../../migrations/postgres/2026-11-26-000009_gauges/down.sql"),
            include_str!("../../../migrations/postgres/2026-11-25-000008_queues/down.sql"),
        ],
        Backend::Mysql => vec![
            include_str!("../../../migrations/mysql/2026-12-18-000033_shown_fields/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-17-000032_start_by/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-17-000031_sequences/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-16-000030_runtime_schedules/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-14-000027_claims/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-13-000026_throughput/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-12-000025_audit/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-09-000022_wakes/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-07-000020_open_edges_index/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-06-000019_dependencies/down.sql"),
            include_str!("../../../migrations/mysql/2026-12-05-000018_effects/down.sql"),
            include_str!(
                "../../../migrations/mysql/2026-12-02-000015_partition_claim_index/down.sql"
            ),
            include_str!("../../../migrations/mysql/2026-11-30-000013_schedule_declared/down.sql"),
            include_str!("../../../migrations/mysql/2026-11-29-000012_schedules/down.sql"),
            include_str!("../../../migrations/mysql/2026-11-28-000011_leader/down.sql"),
            include_str!("../../../migrations/mysql/2026-11-27-000010_progress/down.sql"),
            include_str!("../../../migrations/mysql/2026-11-26-000009_gauges/down.sql"),
            include_str!("../../../migrations/mysql/2026-11-25-000008_queues/down.sql"),
        ],
        Backend::Sqlite => vec![
            include_str!("../../../migrations/sqlite/2026-12-18-000033_shown_fields/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-17-000032_start_by/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-17-000031_sequences/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-16-000030_runtime_schedules/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-14-000027_claims/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-13-000026_throughput/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-12-000025_audit/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-09-000022_wakes/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-08-000021_dead_index/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-07-000020_open_edges_index/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-06-000019_dependencies/down.sql"),
            include_str!("../../../migrations/sqlite/2026-12-05-000018_effects/down.sql"),
            include_str!(
                "../../../migrations/sqlite/2026-12-02-000015_partition_claim_index/down.sql"
            ),
            include_str!("../../../migrations/sqlite/2026-11-30-000013_schedule_declared/down.sql"),
            include_str!("../../../migrations/sqlite/2026-11-29-000012_schedules/down.sql"),
            include_str!("../../../migrations/sqlite/2026-11-28-000011_leader/down.sql"),
            include_str!("../../../migrations/sqlite/2026-11-27-000010_progress/down.sql"),
            include_str!("../../../migrations/sqlite/2026-11-26-000009_gauges/down.sql"),
            include_str!("../../../migrations/sqlite/2026-11-25-000008_queues/down.sql"),
        ],
    };
    let latest = t.store.schema_version_applied().await.unwrap().unwrap();
    // The latest is the kept sequence keys and deadlines (000033) on MariaDB and SQLite, the
    // running index without deduplication (000035) on PostgreSQL, which alone has B-tree
    // deduplication and the live table's vacuum threshold (000034), as it alone has its quiet
    // enqueues and HOT renewals (000029) and the waits registry (000028) (the others' waits
    // poll) and the drop of the release trigger (000023); MariaDB has no partial
    // indexes, so the dashboard's dead-jobs index (000021) is not among its own.
    let expected = match b {
        Backend::Postgres => "20261220000035",
        _ => "20261218000033",
    };
    assert_eq!(
        latest, expected,
        "a newer migration: revert it here too, newest first"
    );
    for sql in later {
        exec_sql(&t.store, sql).await.unwrap();
    }
    exec_sql(&t.store, down).await.unwrap();
    exec_sql(
        &t.store,
        "DELETE FROM jobvisor_schema_migrations \
         WHERE version IN ('20261124000007', '20261125000008', '20261126000009', \
                           '20261127000010', '20261128000011', '20261129000012', \
                           '20261130000013', '20261201000014', '20261202000015', \
                           '20261203000016', '20261204000017', '20261205000018', \
                           '20261206000019', '20261207000020', '20261208000021', \
                           '20261209000022', '20261210000023', '20261212000025', \
                           '20261213000026', '20261214000027', '20261215000028', \
                           '20261215000029', '20261216000030', '20261217000031', '20261217000032', \
                           '20261218000033', '20261219000034', '20261220000035')",
    )
    .await
    .unwrap();
    let store = t.db.store().await;
    assert_eq!(store.schema_version_applied().await.unwrap(), Some(latest));

    let get = async |id: JobId| store.job_get(id).await.unwrap().unwrap();
    for (id, key) in [(old, "old"), (second, "twice")] {
        let j = get(id).await;
        assert_eq!(j.unique_key.as_deref(), Some(key));
        assert_eq!(j.unique_scope, Some(UniqueScope::UntilArchived));
        assert!(j.unique_held && j.unique_until.is_none());
        let e = store
            .job_enqueue(keyed(key, Some(UniqueScope::WhileActive), 9), t.at(3))
            .await
            .unwrap();
        assert_eq!((e.id, e.duplicate), (id, true), "{key}");
    }
    let j = get(keyless).await;
    assert!(j.unique_scope.is_none() && !j.unique_held);
    let j = get(first).await;
    assert_eq!(
        j.unique_key, None,
        "reverting kept the key with its holder only"
    );
    assert!(j.unique_scope.is_none() && !j.unique_held);
}

/// On the caller's connection (the transactional outbox), the take-over of an expired
/// period commits or rolls back with the caller's transaction: rolled back, the old job
/// still holds the key.
pub async fn period_take_overs_follow_the_callers_transaction(b: Backend) {
    let t = Bundle::new(b).await;
    let per = Some(UniqueScope::For(MINUTE));
    let (a, _) = t.try_enqueue(keyed("o", per, 1), 0).await;
    let p = |tag: i64| EnqueueParams::one(keyed("o", per, tag)).at(t.at(60));
    macro_rules! both {
        ($conn:expr) => {{
            let conn = $conn;
            let store = t.store.clone();
            let rolled: Result<(), Error> = conn
                .transaction(async |c| {
                    let got = store.job_enqueue_in(c, p(2)).await?;
                    assert!(!got[0].duplicate, "the period is over: taken over");
                    Err(Error::invalid("test", "roll back"))
                })
                .await;
            assert!(rolled.is_err());
            assert!(
                t.get(a).await.unique_held,
                "rolled back: the old job holds it"
            );
            let got: Vec<Enqueued> = conn
                .transaction(async |c| store.job_enqueue_in(c, p(3)).await)
                .await
                .unwrap();
            got[0]
        }};
    }
    let e = match b {
        Backend::Postgres => both!(&mut AsyncPgConnection::establish(&t.db.url).await.unwrap()),
        Backend::Mysql => both!(&mut AsyncMysqlConnection::establish(&t.db.app_url())
            .await
            .unwrap()),
        Backend::Sqlite => {
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            both!(&mut SqliteConn::establish(&path).await.unwrap())
        }
    };
    assert!(!e.duplicate && e.id != a);
    assert!(!t.get(a).await.unique_held);
    assert!(t.get(e.id).await.unique_held);
    assert_eq!(t.get(e.id).await.payload, json!(3));
    assert_eq!(t.try_enqueue(keyed("o", per, 4), 61).await, (e.id, true));
    let (all, held) = t.with_key("o").await;
    assert_eq!((all.len(), held), (2, 1), "the rolled-back job left no row");
}

/// Like [`concurrent_enqueues_after_a_period_take_it_over_once`], through batches (one
/// transaction each on MySQL and SQLite, with a keyless job before the keyed one).
pub async fn concurrent_batches_after_a_period_take_it_over_once(b: Backend) {
    let t = Bundle::new(b).await;
    let scope = Some(UniqueScope::For(MINUTE));
    let (mut holder, _) = t.try_enqueue(keyed("bt", scope, -1), 0).await;
    for round in 1..=3 {
        let at = 60 * round;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = t.store.clone();
            let batch = vec![NewJob::new("u", json!(i)), keyed("bt", scope, i)];
            let p = EnqueueParams::many(batch).at(t.at(at));
            tasks.push(tokio::spawn(async move {
                store.job_enqueue_many(p).await.unwrap()
            }));
        }
        let (mut ids, mut fresh) = (HashSet::new(), HashSet::new());
        for task in tasks {
            let got = task.await.unwrap();
            assert!(!got[0].duplicate);
            ids.insert(got[1].id);
            if !got[1].duplicate {
                fresh.insert(got[1].id);
            }
        }
        assert_eq!(ids.len(), 1, "round {round}: all 16 got the same id");
        assert_eq!(fresh.len(), 1, "round {round}: exactly one took over");
        let new = *fresh.iter().next().unwrap();
        assert_ne!(new, holder);
        let (_, held) = t.with_key("bt").await;
        assert_eq!(held, 1, "round {round}");
        holder = new;
    }
}
