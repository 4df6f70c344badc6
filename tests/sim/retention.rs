//! Retention: dead letters outlive successes, on every backend.

use super::*;

pub(crate) async fn dead_jobs_stay_in_the_live_table_for_weeks_successes_for_a_day(
    backend: Backend,
) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let mut sim = Simulation::on_store(db.store().await, clock, "archiver", |b| {
        b.handler(
            "ok",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("ok") }),
        )
        .handler(
            "broken",
            handler_fn(|_: Value, _ctx| async { Err::<JobOutcome, _>(JobError::fail("broken")) }),
        )
    })
    .keep(db.clone());
    let ok = enqueue(&sim, NewJob::new("ok", json!({}))).await;
    let dead = enqueue(&sim, NewJob::new("broken", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 2);
    assert_eq!(sim.finished(ok).await, JobState::Succeeded);
    assert_eq!(sim.finished(dead).await, JobState::Dead);
    let day = 24 * 3600 * SEC;
    let cfg = jobvisor::SchedulerConfig::default();
    assert_eq!(
        (cfg.archive_after, cfg.archive_dead_after, cfg.prune_after),
        (day, 28 * day, 7 * day),
        "the documented defaults"
    );

    sim.advance(day + SEC);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (1, 0), "only the success: {r:?}");
    assert!(sim.client.get(ok).await.unwrap().archived_at.is_some());
    let d = sim.client.get(dead).await.unwrap();
    assert_eq!((d.state, d.archived_at), (JobState::Dead, None));

    // Day 27: the dead job still waits in the live table; the archived success is pruned.
    sim.advance(26 * day);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (0, 1), "{r:?}");
    assert_eq!(sim.client.get(dead).await.unwrap().archived_at, None);

    // Past 28 days it is archived too.
    sim.advance(day);
    let r = sim.archive().await;
    assert_eq!((r.moved, r.pruned), (1, 0), "{r:?}");
    let d = sim.client.get(dead).await.unwrap();
    assert_eq!(d.state, JobState::Dead);
    assert!(d.archived_at.is_some());
}

/// A shorter dead-letter retention set by the user is honoured.
pub(crate) async fn dead_job_retention_is_configurable(backend: Backend) {
    let db = Arc::new(TestDb::create(backend).await);
    let clock = jobvisor::clock::ManualClock::at_fixed_start();
    let hour = 3600 * SEC;
    let mut sim = Simulation::on_store(db.store().await, clock, "archiver", |b| {
        b.config(
            jobvisor::testing::sim_config()
                .archive_after(hour)
                .archive_dead_after(3 * hour),
        )
        .handler(
            "broken",
            handler_fn(|_: Value, _ctx| async { Err::<JobOutcome, _>(JobError::fail("broken")) }),
        )
    })
    .keep(db.clone());
    let dead = enqueue(&sim, NewJob::new("broken", json!({}))).await;
    assert_eq!(sim.fetch("default").await, 1);
    assert_eq!(sim.finished(dead).await, JobState::Dead);
    sim.advance(2 * hour);
    assert_eq!(sim.archive().await.moved, 0);
    sim.advance(hour + SEC);
    assert_eq!(sim.archive().await.moved, 1);
}

macro_rules! retention_tests {
    ($($name:ident => $backend:expr),+ $(,)?) => {
        $(
                mod $name {
                    use super::*;
                    #[actix::test]
                    async fn dead_jobs_outlive_successes() {
                        dead_jobs_stay_in_the_live_table_for_weeks_successes_for_a_day($backend)
                            .await;
                    }
                    #[actix::test]
                    async fn dead_job_retention_is_configurable() {
                        super::dead_job_retention_is_configurable($backend).await;
                    }
                }
        )+
    };
}

retention_tests! {
    postgres => Backend::Postgres,
    mysql => Backend::Mysql,
    sqlite => Backend::Sqlite,
}
