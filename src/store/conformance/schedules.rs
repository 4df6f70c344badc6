//! Conformance cases. Periodic schedules: synced from code, fired once per fire under
//! concurrent firers (one guarded transaction records the fire and inserts its job), fenced
//! by the leader's term, paused and resumed, retired when no longer declared; added,
//! changed and removed at run time, apart from code.

use super::*;
use crate::schedule::{fire_key, Compiled, Schedule, ScheduleOrigin};
use crate::store::{Fire, Put, SyncMode};

const MIN: i64 = 60;
/// A schedule nobody declared for this long is retired.
const RETIRE: Duration = Duration::from_secs(2 * 60);

fn compiled(s: Schedule) -> Compiled {
    s.compile().unwrap()
}

fn every_minute() -> Compiled {
    compiled(Schedule::every(
        "tick",
        Duration::from_secs(60),
        NewJob::new("tick", json!({"n": 1})).queue("sched"),
    ))
}

fn hourly() -> Compiled {
    compiled(Schedule::cron(
        "hourly",
        "0 * * * *",
        NewJob::new("report", json!({})),
    ))
}

/// The fire of `tick` at `at` (seconds after `t0`), moving on a minute.
fn tick_fire<'a>(t0: DateTime<Utc>, at: i64, leader: Option<(&'a str, i64)>) -> Fire<'a> {
    let time = |s: i64| t0 + chrono::Duration::seconds(s);
    let us = |s: i64| time(s).timestamp_micros();
    Fire {
        name: "tick",
        expected_next: us(at),
        next: Some(us(at + MIN)),
        last_fire: Some(us(at)),
        jobs: vec![NewJob::new("tick", json!({"n": 1}))
            .queue("sched")
            .unique_key(fire_key("tick", us(at)))
            .run_at(time(at))],
        leader,
    }
}

/// Two schedules stored; eight firers race for the first due fire: exactly one records it
/// and its one job; the others change nothing. A fire fenced by a term that is not the
/// leader's is refused; a paused schedule is neither due nor fired; resumed, it is. A sync
/// that no longer declares a schedule retires it; an unchanged one keeps its next fire.
pub async fn a_fire_is_recorded_with_exactly_one_job_under_concurrent_firers(b: Backend) {
    let t = Bundle::new(b).await;
    t.store
        .schedules_sync(
            &[every_minute(), hourly()],
            SyncMode::Start,
            RETIRE,
            t.at(0),
        )
        .await
        .unwrap();
    let list = t.store.schedules_list().await.unwrap();
    assert_eq!(list.len(), 2);
    let tick = list.iter().find(|s| s.name == "tick").unwrap();
    assert_eq!(tick.next_fire_at, t.at(MIN), "first fire after the sync");
    assert_eq!((tick.kind.as_str(), tick.queue.as_str()), ("tick", "sched"));
    let hour = list.iter().find(|s| s.name == "hourly").unwrap();
    assert_eq!(hour.next_fire_at, t.at(60 * MIN));

    assert!(t.store.schedules_due(t.at(59)).await.unwrap().1.is_empty());
    let (now, due) = t.store.schedules_due(t.at(MIN)).await.unwrap();
    assert_eq!(now, t.at(MIN).unwrap().timestamp_micros());
    assert_eq!(
        due.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["tick"]
    );

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, t0, now) = (t.store.clone(), t.t0, t.at(MIN));
        tasks.push(tokio::spawn(async move {
            store
                .schedule_fire(tick_fire(t0, MIN, None), now)
                .await
                .unwrap()
        }));
    }
    let mut fired = Vec::new();
    for task in tasks {
        if let Some(e) = task.await.unwrap() {
            fired.push(e);
        }
    }
    assert_eq!(fired.len(), 1, "one firer records the fire: {fired:?}");
    assert_eq!(fired[0].len(), 1);
    let jobs = t
        .store
        .job_list(ListParams {
            kind: Some("tick".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "exactly one job for the fire");
    assert_eq!(
        jobs[0].unique_key.as_deref(),
        Some("schedule:tick@2030-01-01T00:01:00Z")
    );
    assert_eq!(jobs[0].run_at, t.at(MIN).unwrap());
    let tick = t.store.schedule_get("tick").await.unwrap().unwrap();
    assert_eq!(
        (tick.next_fire_at, tick.last_fire_at),
        (t.at(2 * MIN), t.at(MIN))
    );

    // Fenced by the leader's term: another node's, or an ended term, is refused.
    let n1 = NodeId::new("n1").unwrap();
    let lead = t
        .store
        .leader_keep_or_take(&n1, None, Duration::from_secs(10), t.at(2 * MIN))
        .await
        .unwrap()
        .unwrap();
    let fire = |leader| tick_fire(t.t0, 2 * MIN, leader);
    assert_eq!(
        t.store
            .schedule_fire(fire(Some(("n2", lead.term))), t.at(2 * MIN))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        t.store
            .schedule_fire(fire(Some(("n1", lead.term))), t.at(2 * MIN + 11))
            .await
            .unwrap(),
        None,
        "the term's lease ended"
    );

    // Paused: not due, not fired; resumed: both.
    let p = t
        .store
        .schedule_set_paused("tick", true, t.at(2 * MIN))
        .await
        .unwrap();
    assert_eq!(p.paused_at, t.at(2 * MIN));
    assert!(t
        .store
        .schedules_due(t.at(2 * MIN))
        .await
        .unwrap()
        .1
        .is_empty());
    assert_eq!(
        t.store
            .schedule_fire(fire(None), t.at(2 * MIN))
            .await
            .unwrap(),
        None
    );
    t.store
        .schedule_set_paused("tick", false, t.at(2 * MIN))
        .await
        .unwrap();
    assert_eq!(
        t.store.schedules_due(t.at(2 * MIN)).await.unwrap().1.len(),
        1
    );
    assert!(t
        .store
        .schedule_fire(fire(Some(("n1", lead.term))), t.at(2 * MIN + 1))
        .await
        .unwrap()
        .is_some());
    let e = t
        .store
        .schedule_set_paused("nope", true, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput { reason, .. } if reason.contains("\"nope\"")),
        "{e}"
    );

    // A sync without `hourly`, declared 5 minutes ago, retires it; `tick` keeps its next
    // fire.
    t.store
        .schedules_sync(&[every_minute()], SyncMode::Start, RETIRE, t.at(5 * MIN))
        .await
        .unwrap();
    let hour = t.store.schedule_get("hourly").await.unwrap().unwrap();
    assert_eq!(hour.retired_at, t.at(5 * MIN));
    assert!(t
        .store
        .schedules_due(t.at(120 * MIN))
        .await
        .unwrap()
        .1
        .iter()
        .all(|d| d.name == "tick"));
    let tick = t.store.schedule_get("tick").await.unwrap().unwrap();
    assert_eq!(
        tick.next_fire_at,
        t.at(3 * MIN),
        "kept: missed fires stay due"
    );
    // Declared again (changed): back, starting afresh.
    t.store
        .schedules_sync(
            &[
                every_minute(),
                compiled(Schedule::cron(
                    "hourly",
                    "30 * * * *",
                    NewJob::new("report", json!({})),
                )),
            ],
            SyncMode::Start,
            RETIRE,
            t.at(6 * MIN),
        )
        .await
        .unwrap();
    let hour = t.store.schedule_get("hourly").await.unwrap().unwrap();
    assert_eq!((hour.retired_at, hour.next_fire_at), (None, t.at(30 * MIN)));
}

/// A rolling deploy: a node of the older release (declaring `tick` only) restarts while the
/// newer nodes declare `tick` and `hourly`. It does not retire `hourly`, declared moments
/// ago; it retires it only once nobody has declared it for the retire period. Declared
/// again, a retired schedule starts afresh — the retired hours are not missed fires — and a
/// running node's refresh never overwrites what a node's start stored.
pub async fn a_schedule_is_retired_only_once_no_node_declares_it(b: Backend) {
    let t = Bundle::new(b).await;
    let sync = |c: Vec<Compiled>, mode, at| {
        let store = t.store.clone();
        let now = t.at(at);
        async move { store.schedules_sync(&c, mode, RETIRE, now).await.unwrap() }
    };
    let info = |name: &'static str| {
        let store = t.store.clone();
        async move { store.schedule_get(name).await.unwrap().unwrap() }
    };
    sync(vec![every_minute(), hourly()], SyncMode::Start, 0).await;
    assert_eq!(info("hourly").await.declared_at, t.at(0).unwrap());
    // The old node restarts a minute later: `hourly` was declared a minute ago, so it stays.
    sync(vec![every_minute()], SyncMode::Start, MIN).await;
    assert_eq!(
        info("hourly").await.retired_at,
        None,
        "a newer node declares it"
    );
    // The newer node's refresh keeps it declared; the old node's later syncs leave it.
    sync(vec![every_minute(), hourly()], SyncMode::Refresh, 2 * MIN).await;
    sync(vec![every_minute()], SyncMode::Refresh, 4 * MIN - 1).await;
    assert_eq!(info("hourly").await.retired_at, None);
    assert_eq!(info("hourly").await.declared_at, t.at(2 * MIN).unwrap());
    // Nobody declared it for more than the retire period: retired.
    sync(vec![every_minute()], SyncMode::Refresh, 4 * MIN + 1).await;
    assert_eq!(info("hourly").await.retired_at, t.at(4 * MIN + 1));
    assert!(t
        .store
        .schedules_due(t.at(3 * 60 * MIN))
        .await
        .unwrap()
        .1
        .iter()
        .all(|d| d.name != "hourly"));
    // Declared again two hours on (a refresh by a node that was frozen): back, from now on —
    // not due at once for the hours it was retired.
    sync(vec![hourly()], SyncMode::Refresh, 125 * MIN).await;
    let back = info("hourly").await;
    assert_eq!(
        (back.retired_at, back.next_fire_at),
        (None, t.at(180 * MIN))
    );
    assert!(t
        .store
        .schedules_due(t.at(125 * MIN))
        .await
        .unwrap()
        .1
        .iter()
        .all(|d| d.name != "hourly"));
    // A start with a changed expression wins; a refresh by a node with the old one does not
    // change it back.
    let half_past = || {
        compiled(Schedule::cron(
            "hourly",
            "30 * * * *",
            NewJob::new("report", json!({})),
        ))
    };
    sync(vec![half_past()], SyncMode::Start, 126 * MIN).await;
    sync(vec![hourly()], SyncMode::Refresh, 127 * MIN).await;
    let now = info("hourly").await;
    assert_eq!(
        (now.spec.as_str(), now.next_fire_at),
        ("30 * * * *", t.at(150 * MIN))
    );
    assert_eq!(now.declared_at, t.at(127 * MIN).unwrap());
    // `tick`, undeclared since minute 4, was retired by the syncs at minute 125. A node that
    // declares nothing retires nothing, however long ago `hourly` was declared.
    assert_eq!(info("tick").await.retired_at, t.at(125 * MIN));
    t.store
        .schedules_sync(&[], SyncMode::Start, RETIRE, t.at(600 * MIN))
        .await
        .unwrap();
    assert_eq!(info("hourly").await.retired_at, None);
}

/// A schedule added at run time: `rt`, every minute, its job of kind `rt` on `sched`.
fn runtime_every_minute(payload: i64) -> Compiled {
    Schedule::every(
        "rt",
        Duration::from_secs(60),
        NewJob::new("rt", json!({ "n": payload })).queue("sched"),
    )
    .compile_runtime()
    .unwrap()
}

/// The fire of `rt` at `at` (seconds after `t0`), moving on a minute.
fn rt_fire(t0: DateTime<Utc>, at: i64) -> Fire<'static> {
    let time = |s: i64| t0 + chrono::Duration::seconds(s);
    let us = |s: i64| time(s).timestamp_micros();
    Fire {
        name: "rt",
        expected_next: us(at),
        next: Some(us(at + MIN)),
        last_fire: Some(us(at)),
        jobs: vec![NewJob::new("rt", json!({"n": 1}))
            .queue("sched")
            .unique_key(fire_key("rt", us(at)))
            .run_at(time(at))],
        leader: None,
    }
}

fn refused(e: &Error, words: &[&str]) -> bool {
    matches!(e, Error::InvalidInput { field: "schedule", reason }
        if words.iter().all(|w| reason.contains(w)))
}

/// Added at run time, a schedule is stored apart from code: listed with its origin, from its
/// first fire after now; a second add of its name, and an add, change or remove of a name
/// declared in code, are refused naming it; a change keeps its next fire unless the
/// expression changed (then afresh from now). No node's sync — declaring other schedules or
/// one of its name, at start or refreshing, hours on — retires or overwrites it. Removed, it
/// is gone; a retired code schedule's name may be taken over.
pub async fn runtime_schedules_are_added_changed_removed_and_never_retired_by_a_sync(b: Backend) {
    let t = Bundle::new(b).await;
    let sync = |c: Vec<Compiled>, mode, at| {
        let store = t.store.clone();
        let now = t.at(at);
        async move { store.schedules_sync(&c, mode, RETIRE, now).await.unwrap() }
    };
    let info = |name: &'static str| {
        let store = t.store.clone();
        async move { store.schedule_get(name).await.unwrap() }
    };
    sync(vec![hourly()], SyncMode::Start, 0).await;
    let added = t
        .store
        .schedule_put(&runtime_every_minute(1), Put::Add, t.at(0))
        .await
        .unwrap();
    assert_eq!(added.origin, ScheduleOrigin::Runtime);
    assert_eq!(added.next_fire_at, t.at(MIN), "first fire after now");
    assert_eq!((added.kind.as_str(), added.queue.as_str()), ("rt", "sched"));
    assert_eq!(
        info("hourly").await.unwrap().origin,
        ScheduleOrigin::Code,
        "declared in code"
    );

    let e = t
        .store
        .schedule_put(&runtime_every_minute(2), Put::Add, t.at(1))
        .await
        .unwrap_err();
    assert!(refused(&e, &["\"rt\"", "already added"]), "{e}");
    let code_named = compiled(Schedule::cron(
        "hourly",
        "15 * * * *",
        NewJob::new("other", json!({})),
    ));
    for put in [Put::Add, Put::Change] {
        let e = t
            .store
            .schedule_put(&code_named, put, t.at(1))
            .await
            .unwrap_err();
        assert!(refused(&e, &["\"hourly\"", "declared in code"]), "{e}");
    }
    let e = t.store.schedule_remove("hourly").await.unwrap_err();
    assert!(refused(&e, &["\"hourly\"", "declared in code"]), "{e}");
    assert_eq!(info("hourly").await.unwrap().spec, "0 * * * *", "unchanged");
    let nope = Schedule::every("nope", Duration::from_secs(60), NewJob::new("x", json!({})))
        .compile_runtime()
        .unwrap();
    let e = t
        .store
        .schedule_put(&nope, Put::Change, t.at(1))
        .await
        .unwrap_err();
    assert!(refused(&e, &["\"nope\"", "added at run time"]), "{e}");

    // Changed with the same interval: its job changes, its next fire stays.
    let moved = Schedule::every(
        "rt",
        Duration::from_secs(60),
        NewJob::new("rt", json!({"n": 2})).queue("other"),
    )
    .compile_runtime()
    .unwrap();
    let c = t
        .store
        .schedule_put(&moved, Put::Change, t.at(30))
        .await
        .unwrap();
    assert_eq!((c.queue.as_str(), c.next_fire_at), ("other", t.at(MIN)));
    // A new expression starts afresh from now.
    let five = Schedule::cron(
        "rt",
        "*/5 * * * *",
        NewJob::new("rt", json!({"n": 3})).queue("sched"),
    )
    .compile_runtime()
    .unwrap();
    let c = t
        .store
        .schedule_put(&five, Put::Change, t.at(90))
        .await
        .unwrap();
    assert_eq!(
        (c.spec.as_str(), c.next_fire_at),
        ("*/5 * * * *", t.at(5 * MIN))
    );

    // Nodes that do not declare it, hours on, at start and refreshing; then a node whose
    // code declares a schedule of its name: it stays, as added and changed, and says it
    // shadows that one.
    sync(vec![hourly()], SyncMode::Start, 10 * MIN).await;
    sync(vec![hourly()], SyncMode::Refresh, 600 * MIN).await;
    assert_eq!(
        info("rt").await.unwrap().shadowed_at,
        None,
        "nothing shadowed"
    );
    let code_rt = compiled(Schedule::every(
        "rt",
        Duration::from_secs(1),
        NewJob::new("code", json!({})),
    ));
    sync(vec![hourly(), code_rt.clone()], SyncMode::Start, 601 * MIN).await;
    sync(vec![hourly(), code_rt], SyncMode::Refresh, 602 * MIN).await;
    let kept = info("rt").await.unwrap();
    assert_eq!(
        (
            kept.origin,
            kept.retired_at,
            kept.spec.as_str(),
            kept.kind.as_str(),
            kept.next_fire_at
        ),
        (
            ScheduleOrigin::Runtime,
            None,
            "*/5 * * * *",
            "rt",
            t.at(5 * MIN)
        ),
        "neither retired nor overwritten by a sync"
    );
    // The rows say which run-time schedule keeps one of code from being stored, and since
    // when it was last declared (the refresh's stamp).
    assert_eq!(kept.shadowed_at, t.at(602 * MIN), "shadows the code's one");
    assert_eq!(info("hourly").await.unwrap().shadowed_at, None);
    assert!(t
        .store
        .schedules_due(t.at(602 * MIN))
        .await
        .unwrap()
        .1
        .iter()
        .any(|d| d.name == "rt"));

    // Removed: gone, and a second removal names it.
    t.store.schedule_remove("rt").await.unwrap();
    assert_eq!(info("rt").await, None);
    let e = t.store.schedule_remove("rt").await.unwrap_err();
    assert!(refused(&e, &["\"rt\""]), "{e}");

    // `hourly`, no longer declared, retires; its name may then be taken at run time.
    sync(vec![every_minute()], SyncMode::Start, 700 * MIN).await;
    assert!(info("hourly").await.unwrap().retired_at.is_some());
    let taken = Schedule::cron("hourly", "45 * * * *", NewJob::new("report", json!({})))
        .compile_runtime()
        .unwrap();
    let h = t
        .store
        .schedule_put(&taken, Put::Add, t.at(700 * MIN))
        .await
        .unwrap();
    assert_eq!(
        (h.origin, h.retired_at, h.next_fire_at),
        (ScheduleOrigin::Runtime, None, t.at(705 * MIN))
    );
}

/// A schedule added at run time is fired like one declared in code: of eight firers racing
/// for its due fire exactly one records it, with one job; fires racing its removal enqueue
/// at most one job between them, and once removed it is never due or fired again.
pub async fn a_runtime_schedule_fires_once_per_fire_and_never_after_removal(b: Backend) {
    let t = Bundle::new(b).await;
    t.store
        .schedule_put(&runtime_every_minute(1), Put::Add, t.at(0))
        .await
        .unwrap();
    let (_, due) = t.store.schedules_due(t.at(MIN)).await.unwrap();
    assert_eq!(
        due.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["rt"]
    );
    let race = |at: i64, remove: bool| {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, t0, now) = (t.store.clone(), t.t0, t.at(at));
            tasks.push(tokio::spawn(async move {
                store
                    .schedule_fire(rt_fire(t0, at), now)
                    .await
                    .unwrap()
                    .is_some()
            }));
        }
        let store = t.store.clone();
        async move {
            let removed = if remove {
                store.schedule_remove("rt").await.is_ok()
            } else {
                false
            };
            let mut fired = 0;
            for task in tasks {
                fired += usize::from(task.await.unwrap());
            }
            (fired, removed)
        }
    };
    let jobs = || {
        let store = t.store.clone();
        async move {
            store
                .job_list(ListParams {
                    kind: Some("rt".into()),
                    ..Default::default()
                })
                .await
                .unwrap()
        }
    };
    assert_eq!(race(MIN, false).await, (1, false), "one firer records it");
    let j = jobs().await;
    assert_eq!(j.len(), 1, "exactly one job for the fire");
    assert_eq!(
        j[0].unique_key.as_deref(),
        Some("schedule:rt@2030-01-01T00:01:00Z")
    );

    // Eight firers race the removal for the next fire: it is recorded once or not at all.
    let (fired, removed) = race(2 * MIN, true).await;
    assert!(removed);
    assert!(fired <= 1, "{fired} firers recorded one fire");
    assert_eq!(jobs().await.len(), 1 + fired);
    assert!(t
        .store
        .schedules_due(t.at(60 * MIN))
        .await
        .unwrap()
        .1
        .is_empty());
    for at in [2 * MIN, 3 * MIN] {
        assert_eq!(
            t.store
                .schedule_fire(rt_fire(t.t0, at), t.at(at))
                .await
                .unwrap(),
            None,
            "removed: never fired"
        );
    }
    assert_eq!(jobs().await.len(), 1 + fired);
}
