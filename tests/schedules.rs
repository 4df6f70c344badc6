//! Periodic schedules, simulated (manual clock, ticks sent by hand): three nodes over a day
//! of minute fires with leadership moving every minute (exactly 1,440 jobs, none twice);
//! every missed-fire policy after three hours with no node up, on every backend; an hourly
//! schedule across DST days in Berlin and New York; pause, resume and trigger-now through the
//! client; schedules added by one node fired by whichever leads; a new leader fires what is
//! due at once; a started node's client lists and triggers its schedules as soon as
//! `start()` returns; a schedule added at run time fired once per fire across leader kills,
//! on every backend.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use jobvisor::clock::ManualClock;
use jobvisor::schedule::RETIRE_AFTER;
use jobvisor::testing::{Simulation, TestDb};
use jobvisor::{
    handler_fn, Backend, Event, Job, JobOutcome, ListParams, MissedFires, NewJob, QueueConfig,
    Schedule, ScheduleOrigin, Scheduler,
};
use serde_json::{json, Value};

const MINUTE: Duration = Duration::from_secs(60);

async fn node(
    db: &Arc<TestDb>,
    clock: &ManualClock,
    name: &str,
    schedules: Vec<Schedule>,
) -> Simulation {
    let store = db.store().await;
    let sim = Simulation::on_store(store, clock.clone(), name, move |mut b| {
        b = b.handler(
            "tick",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
        );
        for s in schedules {
            b = b.periodic(s);
        }
        b
    })
    .keep(db.clone());
    sim.sync_schedules().await.unwrap();
    sim
}

fn tick(name: &str, every: Duration) -> Schedule {
    Schedule::every(
        name,
        every,
        NewJob::new("tick", json!({ "schedule": name })),
    )
}

/// Every job of the schedule `name`, checked to be one per unique key.
async fn jobs_of(sim: &Simulation, name: &str) -> Vec<Job> {
    let mut all = Vec::new();
    loop {
        let page = sim
            .client
            .list(ListParams {
                kind: Some("tick".into()),
                limit: 1_000,
                after: all.last().map(|j: &Job| j.id),
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    let mut keys = BTreeSet::new();
    let mine: Vec<Job> = all
        .into_iter()
        .filter(|j| j.payload["schedule"] == name)
        .collect();
    for j in &mine {
        assert!(keys.insert(j.unique_key.clone().unwrap()), "a fire twice");
    }
    mine
}

/// The fire instant a job was enqueued for, from its unique key (`schedule:<name>@<instant>`;
/// its `run_at` may have moved on since, had a node claimed it and given it back).
fn fire_of(j: &Job) -> DateTime<Utc> {
    let key = j.unique_key.as_deref().unwrap();
    let at = key.rsplit('@').next().unwrap();
    DateTime::parse_from_rfc3339(at)
        .unwrap()
        .with_timezone(&Utc)
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
}

#[actix::test]
async fn three_nodes_fire_a_minute_schedule_exactly_1440_times_in_a_day() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = ManualClock::new(start());
    let mut nodes = Vec::new();
    for n in ["a", "b", "c"] {
        nodes.push(node(&db, &clock, n, vec![tick("minutely", MINUTE)]).await);
    }
    let mut fired = 0;
    for minute in 0..1440usize {
        clock.advance(MINUTE);
        // The last leader's lease lapsed a while ago: a different node asks first each
        // minute and leadership moves with it.
        for i in 0..3 {
            nodes[(minute + i) % 3].elect().await;
        }
        let (x, y, z) = tokio::join!(
            nodes[0].fire_schedules(),
            nodes[1].fire_schedules(),
            nodes[2].fire_schedules()
        );
        let fires: Vec<usize> = [x, y, z].into_iter().filter_map(|r| r.unwrap()).collect();
        assert_eq!(fires.len(), 1, "one leader fires at minute {minute}");
        fired += fires[0];
    }
    assert_eq!(fired, 1440);
    let jobs = jobs_of(&nodes[0], "minutely").await;
    assert_eq!(jobs.len(), 1440, "exactly one job per fire");
    // Each job is keyed by its fire's instant: every minute of the day, once.
    let keys: BTreeSet<String> = jobs.iter().filter_map(|j| j.unique_key.clone()).collect();
    let expected: BTreeSet<String> = (1..=1440)
        .map(|m| {
            let at = start() + chrono::Duration::minutes(m);
            format!("schedule:minutely@{}", at.format("%Y-%m-%dT%H:%M:%SZ"))
        })
        .collect();
    let missing: Vec<_> = expected.difference(&keys).collect();
    let extra: Vec<_> = keys.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
}

/// A schedule added at run time through a client (no node's code declares it) beside one
/// declared in code, over three hours of minute fires with leadership moving every minute
/// and the leader killed every 20 minutes (no fire until a survivor takes over two minutes
/// on, catching up): exactly one job per fire of each, none missed, none twice — and the
/// nodes' declarations, hours past the retire period, never retire it. Removed, it fires no
/// more.
async fn a_runtime_schedule_fires_exactly_once_per_fire_across_leader_kills(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::new(start());
    let mut nodes = Vec::new();
    for n in ["a", "b", "c"] {
        let code = tick("minutely", MINUTE).missed(MissedFires::All { max: 100 });
        nodes.push(node(&db, &clock, n, vec![code]).await);
    }
    let added = nodes[1]
        .client
        .add_schedule(tick("added", MINUTE).missed(MissedFires::All { max: 100 }))
        .await
        .unwrap();
    assert_eq!(added.origin, ScheduleOrigin::Runtime);
    const MINUTES: usize = 180;
    let mut fired = 0;
    for minute in 0..MINUTES {
        clock.advance(MINUTE);
        // Killed: the leader of the minute before is gone and no one has taken over yet.
        if minute % 20 == 5 || minute % 20 == 6 {
            continue;
        }
        // Every node declares its code schedules again now and then, retiring what nobody
        // declared for RETIRE_AFTER — never the run-time one.
        if minute % 7 == 0 {
            for n in &nodes {
                n.declare_schedules().await.unwrap();
            }
        }
        for i in 0..3 {
            nodes[(minute + i) % 3].elect().await;
        }
        let (x, y, z) = tokio::join!(
            nodes[0].fire_schedules(),
            nodes[1].fire_schedules(),
            nodes[2].fire_schedules()
        );
        let fires: Vec<usize> = [x, y, z].into_iter().filter_map(|r| r.unwrap()).collect();
        assert_eq!(fires.len(), 1, "one leader fires at minute {minute}");
        fired += fires[0];
    }
    assert_eq!(fired, 2 * MINUTES, "both schedules, every minute");
    for name in ["added", "minutely"] {
        let keys: BTreeSet<String> = jobs_of(&nodes[0], name)
            .await
            .iter()
            .filter_map(|j| j.unique_key.clone())
            .collect();
        let expected: BTreeSet<String> = (1..=MINUTES as i64)
            .map(|m| {
                let at = start() + chrono::Duration::minutes(m);
                format!("schedule:{name}@{}", at.format("%Y-%m-%dT%H:%M:%SZ"))
            })
            .collect();
        let missing: Vec<_> = expected.difference(&keys).collect();
        let extra: Vec<_> = keys.difference(&expected).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{name}: missing {missing:?}, extra {extra:?}"
        );
    }
    let list = nodes[2].client.schedules().await.unwrap();
    let kept = list.iter().find(|s| s.name == "added").unwrap();
    assert_eq!(kept.retired_at, None, "no declaration retires it");

    // Removed: no fire after, whoever leads.
    nodes[0].client.remove_schedule("added").await.unwrap();
    for _ in 0..3 {
        clock.advance(MINUTE);
        for n in &nodes {
            n.elect().await;
            n.fire_schedules().await.unwrap();
        }
    }
    assert_eq!(jobs_of(&nodes[0], "added").await.len(), MINUTES);
    assert_eq!(jobs_of(&nodes[0], "minutely").await.len(), MINUTES + 3);
}

#[actix::test]
async fn a_runtime_schedule_fires_exactly_once_across_leader_kills_on_postgres() {
    a_runtime_schedule_fires_exactly_once_per_fire_across_leader_kills(Backend::Postgres).await;
}

#[actix::test]
async fn a_runtime_schedule_fires_exactly_once_across_leader_kills_on_mysql() {
    a_runtime_schedule_fires_exactly_once_per_fire_across_leader_kills(Backend::Mysql).await;
}

#[actix::test]
async fn a_runtime_schedule_fires_exactly_once_across_leader_kills_on_sqlite() {
    a_runtime_schedule_fires_exactly_once_per_fire_across_leader_kills(Backend::Sqlite).await;
}

async fn missed_fire_policies_after_three_hours_down(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = ManualClock::new(start());
    let every = |name: &str, missed| tick(name, MINUTE).missed(missed);
    let hourly = Schedule::cron(
        "hourly-skip",
        "0 * * * *",
        NewJob::new("tick", json!({ "schedule": "hourly-skip" })),
    )
    .missed(MissedFires::Skip);
    let a = node(
        &db,
        &clock,
        "a",
        vec![
            every("latest", MissedFires::Latest),
            every("all", MissedFires::All { max: 1_000 }),
            every("ten", MissedFires::All { max: 10 }),
            every("skip", MissedFires::Skip),
            hourly,
        ],
    )
    .await;
    // Every node down for 3 hours and 90 seconds: 181 minute fires and 3 hourly ones passed.
    clock.advance(Duration::from_secs(3 * 3600 + 90));
    assert_eq!(a.elect().await, Some(1));
    a.fire_schedules().await.unwrap();
    let count = |name: &'static str| {
        let a = &a;
        async move { jobs_of(a, name).await.len() }
    };
    assert_eq!(count("latest").await, 1);
    assert_eq!(
        fire_of(&jobs_of(&a, "latest").await[0]),
        start() + chrono::Duration::seconds(3 * 3600 + 60),
        "the latest fire"
    );
    assert_eq!(count("all").await, 181);
    assert_eq!(count("ten").await, 10);
    assert_eq!(
        count("skip").await,
        1,
        "its latest fire is 30 s late: on time"
    );
    assert_eq!(
        count("hourly-skip").await,
        0,
        "its fires are 90 s+ late: missed"
    );
    // Nothing fires twice, and the next fires run on time.
    a.fire_schedules().await.unwrap();
    assert_eq!(count("all").await, 181);
    clock.advance(Duration::from_secs(30));
    a.elect().await;
    a.fire_schedules().await.unwrap();
    for name in ["latest", "all", "ten", "skip"] {
        let jobs = jobs_of(&a, name).await;
        let last = jobs.iter().map(fire_of).max().unwrap();
        assert_eq!(
            last,
            start() + chrono::Duration::seconds(3 * 3600 + 120),
            "{name}"
        );
    }
    let list = a.client.schedules().await.unwrap();
    let skip = list.iter().find(|s| s.name == "hourly-skip").unwrap();
    assert_eq!(
        skip.next_fire_at,
        Some(start() + chrono::Duration::hours(4))
    );
}

#[actix::test]
async fn missed_fire_policies_on_postgres() {
    missed_fire_policies_after_three_hours_down(Backend::Postgres).await;
}

#[actix::test]
async fn missed_fire_policies_on_mysql() {
    missed_fire_policies_after_three_hours_down(Backend::Mysql).await;
}

#[actix::test]
async fn missed_fire_policies_on_sqlite() {
    missed_fire_policies_after_three_hours_down(Backend::Sqlite).await;
}

/// An hourly schedule and a 02:30 daily one, fired hour by hour across the spring-forward and
/// fall-back days: 23 and 25 hourly jobs, and the daily one once each day.
#[actix::test]
async fn dst_days_in_berlin_and_new_york() {
    for (zone, spring, fall) in [
        ("Europe/Berlin", (3, 29), (10, 25)),
        ("America/New_York", (3, 8), (11, 1)),
    ] {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        for (month, day, hours) in [(spring.0, spring.1, 23), (fall.0, fall.1, 25)] {
            let db = Arc::new(TestDb::create(Backend::Sqlite).await);
            let midnight = tz
                .with_ymd_and_hms(2026, month, day, 0, 0, 0)
                .unwrap()
                .with_timezone(&Utc);
            let clock = ManualClock::new(midnight - chrono::Duration::seconds(1));
            let job = |n: &str| NewJob::new("tick", json!({ "schedule": n }));
            let a = node(
                &db,
                &clock,
                "a",
                vec![
                    Schedule::cron("hourly", "0 * * * *", job("hourly")).time_zone(zone),
                    Schedule::cron("daily", "30 2 * * *", job("daily")).time_zone(zone),
                ],
            )
            .await;
            // Every 20 minutes through the day, the leader fires what is due.
            for _ in 0..(26 * 3) {
                clock.advance(Duration::from_secs(20 * 60));
                a.elect().await;
                a.fire_schedules().await.unwrap();
            }
            let next_midnight = tz
                .with_ymd_and_hms(2026, month, day + 1, 0, 0, 0)
                .unwrap()
                .with_timezone(&Utc);
            let within = |jobs: Vec<Job>| {
                jobs.into_iter()
                    .filter(|j| (midnight..next_midnight).contains(&fire_of(j)))
                    .count()
            };
            assert_eq!(
                within(jobs_of(&a, "hourly").await),
                hours,
                "{zone} {month}-{day}"
            );
            assert_eq!(
                within(jobs_of(&a, "daily").await),
                1,
                "{zone} {month}-{day}"
            );
        }
    }
}

/// Pause stops fires on every node until resumed (then the missed-fire policy applies);
/// trigger enqueues one job now without moving the schedule; unknown names are refused.
#[actix::test]
async fn pause_resume_and_trigger_through_the_client() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = ManualClock::new(start());
    let a = node(&db, &clock, "a", vec![tick("t", MINUTE)]).await;
    a.elect().await;
    let paused = a.client.pause_schedule("t").await.unwrap();
    assert_eq!(paused.paused_at, Some(start()));
    clock.advance(5 * MINUTE);
    a.elect().await;
    assert_eq!(a.fire_schedules().await.unwrap(), Some(0));
    assert!(jobs_of(&a, "t").await.is_empty(), "paused: no fire");
    let resumed = a.client.resume_schedule("t").await.unwrap();
    assert_eq!(resumed.paused_at, None);
    assert_eq!(
        a.fire_schedules().await.unwrap(),
        Some(1),
        "the latest missed fire"
    );
    let e = a.client.trigger_schedule("t").await.unwrap();
    assert!(!e.duplicate);
    let jobs = jobs_of(&a, "t").await;
    assert_eq!(jobs.len(), 2);
    let manual = a.client.get(e.id).await.unwrap();
    assert!(
        manual
            .unique_key
            .as_deref()
            .unwrap()
            .starts_with("schedule:t@manual:"),
        "{:?}",
        manual.unique_key
    );
    let s = &a.client.schedules().await.unwrap()[0];
    assert_eq!(s.next_fire_at, Some(start() + chrono::Duration::minutes(6)));
    for e in [
        a.client.pause_schedule("nope").await.unwrap_err(),
        a.client.trigger_schedule("nope").await.unwrap_err(),
    ] {
        assert!(e.to_string().contains("\"nope\""), "{e}");
    }
}

/// A schedule declared only by a newer node (a rolling deploy) is fired by the leader even
/// if the leader's own code does not declare it. A node that declares other schedules
/// retires it only once nobody has declared it for `RETIRE_AFTER`: not while the newer node
/// runs. Declared again, it starts afresh (the retired time is not missed).
#[actix::test]
async fn schedules_from_any_node_are_fired_by_the_leader() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = ManualClock::new(start());
    let old = node(&db, &clock, "old", vec![]).await;
    // `All`: were the retired time counted as missed, coming back would catch it all up.
    let added = tick("added", MINUTE).missed(MissedFires::All { max: 100 });
    let new = node(&db, &clock, "new", vec![added]).await;
    assert_eq!(old.elect().await, Some(1));
    assert_eq!(new.elect().await, None);
    clock.advance(MINUTE);
    old.elect().await;
    assert_eq!(old.fire_schedules().await.unwrap(), Some(1));
    assert_eq!(new.fire_schedules().await.unwrap(), None, "not the leader");
    assert_eq!(jobs_of(&old, "added").await.len(), 1);
    // A node of another release starts, declaring only `other`: `added` was declared a
    // minute ago, so it stays and fires.
    let other = node(&db, &clock, "other", vec![tick("other", MINUTE)]).await;
    let added = |sim: &Simulation| {
        let client = sim.client.clone();
        async move {
            let list = client.schedules().await.unwrap();
            list.into_iter().find(|s| s.name == "added").unwrap()
        }
    };
    assert_eq!(
        added(&other).await.retired_at,
        None,
        "the newer node declares it"
    );
    clock.advance(MINUTE);
    old.elect().await;
    old.fire_schedules().await.unwrap();
    assert_eq!(jobs_of(&old, "added").await.len(), 2);
    // The newer node stops (it no longer declares it); after RETIRE_AFTER, `other`'s refresh
    // retires it and it fires no more.
    clock.advance(RETIRE_AFTER);
    other.declare_schedules().await.unwrap();
    assert!(added(&other).await.retired_at.is_some());
    clock.advance(MINUTE);
    old.elect().await;
    old.fire_schedules().await.unwrap();
    assert_eq!(
        jobs_of(&old, "added").await.len(),
        2,
        "retired: no more fires"
    );
    // The newer node comes back: declared again, it fires from now on, without catching up
    // on the minutes it was retired.
    clock.advance(10 * MINUTE);
    new.declare_schedules().await.unwrap();
    let back = added(&new).await;
    assert_eq!(back.retired_at, None);
    clock.advance(MINUTE);
    old.elect().await;
    old.fire_schedules().await.unwrap();
    assert_eq!(
        jobs_of(&old, "added").await.len(),
        3,
        "one fire, none caught up"
    );
}

/// A node that takes over from a dead leader fires the fires missed meanwhile as soon as it
/// begins its term — its firer wakes on the new term — not at its next tick: here that tick
/// is an hour of real time away, and the clock does not move after the election.
#[actix::test]
async fn a_new_leader_fires_the_catch_up_at_once() {
    let db = Arc::new(TestDb::create(Backend::Sqlite).await);
    let clock = ManualClock::new(start());
    let old = node(&db, &clock, "old", vec![tick("t", MINUTE)]).await;
    let mut new = node(&db, &clock, "new", vec![tick("t", MINUTE)]).await;
    assert_eq!(old.elect().await, Some(1));
    let firer = new.spawn_schedule_firer(Duration::from_secs(3600));
    // Its first tick comes at once: not the leader, it fires nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The leader dies; three minutes pass with no fire.
    clock.advance(3 * MINUTE);
    assert!(jobs_of(&new, "t").await.is_empty());
    assert_eq!(new.elect().await, Some(2), "a takeover, under a new term");
    let fired = tokio::time::timeout(
        Duration::from_secs(10),
        new.next_event(|e| matches!(e, Event::ScheduleFired { name, .. } if name == "t")),
    )
    .await
    .expect("the new leader fires at once, not at its next tick");
    assert!(
        matches!(fired, Event::ScheduleFired { fires: 1, .. }),
        "{fired:?}"
    );
    let jobs = jobs_of(&new, "t").await;
    assert_eq!(jobs.len(), 1, "the latest missed fire");
    assert_eq!(fire_of(&jobs[0]), start() + chrono::Duration::minutes(3));
    firer.abort();
}

/// A real node (timers on): the schedules it declares are listed, and can be triggered, by
/// its client as soon as `start()` returns — storing them is the schedule loop's first pass,
/// which the node's client waits for.
async fn declared_schedules_are_listed_when_start_returns(backend: Backend) {
    let db = TestDb::create(backend).await;
    for round in 0..3 {
        let name = format!("listed-{round}");
        let scheduler = Scheduler::builder(db.store().await)
            .queue("default", QueueConfig::default())
            .handler(
                "tick",
                handler_fn(|_: Value, _ctx| async { JobOutcome::success(()) }),
            )
            .periodic(tick(&name, Duration::from_secs(3600)))
            .start()
            .unwrap();
        let client = scheduler.client();
        let listed = client.schedules().await.unwrap();
        assert!(
            listed.iter().any(|s| s.name == name),
            "round {round}: {name} not listed right after start(): {listed:?}"
        );
        client.trigger_schedule(&name).await.unwrap();
        scheduler.shutdown().await;
    }
}

#[actix::test]
async fn declared_schedules_are_listed_when_start_returns_on_postgres() {
    declared_schedules_are_listed_when_start_returns(Backend::Postgres).await;
}

#[actix::test]
async fn declared_schedules_are_listed_when_start_returns_on_mysql() {
    declared_schedules_are_listed_when_start_returns(Backend::Mysql).await;
}

#[actix::test]
async fn declared_schedules_are_listed_when_start_returns_on_sqlite() {
    declared_schedules_are_listed_when_start_returns(Backend::Sqlite).await;
}
