//! Conformance cases. Queue control: a rate limit bounds the claims of every window of its
//! period, recorded at the database's time right after the queue's lock.

use super::queues::{enqueue_n, params};
use super::*;

pub async fn a_rate_limit_bounds_claims_in_every_window(b: Backend) {
    let t = Bundle::new(b).await;
    enqueue_n(&t, "api", 200).await;
    let per = Duration::from_secs(10);
    t.store
        .queue_set_limits(
            "api",
            QueueLimits::default().rate(RateLimit::new(10, per).unwrap()),
            t.at(0),
        )
        .await
        .unwrap();
    let first = t
        .store
        .claim(params("api", "n1", 4, t.at(0)))
        .await
        .unwrap();
    assert_eq!((first.jobs.len(), first.wait), (4, None));
    assert!(
        first.controlled(),
        "a rate-limited queue's claim is a controlled one"
    );
    let second = t
        .store
        .claim(params("api", "n1", 50, t.at(3)))
        .await
        .unwrap();
    assert_eq!(second.jobs.len(), 6, "the rest of the window");
    let none = t
        .store
        .claim(params("api", "n1", 50, t.at(4)))
        .await
        .unwrap();
    assert!(none.jobs.is_empty());
    // The window is the period plus the start margin (a job starts up to that long after
    // its claim): the 4 claimed at 0 leave it at +10.05 s.
    assert_eq!(
        none.wait,
        Some(Duration::from_secs(6) + crate::RATE_START_MARGIN),
        "until the first claim leaves"
    );
    let margin = chrono::Duration::from_std(crate::RATE_START_MARGIN).unwrap();
    let early = t
        .store
        .claim(params("api", "n1", 50, t.at(10)))
        .await
        .unwrap();
    assert!(early.jobs.is_empty(), "at +10 s the margin is not over");
    // (t − 10.05 s, t]: at +10.05 s the 4 claimed at 0 have left, the 6 at +3 s have not.
    let third = t
        .store
        .claim(params("api", "n1", 50, t.at(10).map(|t| t + margin)))
        .await
        .unwrap();
    assert_eq!(third.jobs.len(), 4);

    // Concurrent claimers over a minute of test clock: from the claim times the database
    // stored on the jobs, no window of 10 s holds more than 10.
    let mut tasks = Vec::new();
    for n in 0..8_i64 {
        let store = t.store.clone();
        let t0 = t.t0;
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            for step in 0..60_i64 {
                let now = t0 + chrono::Duration::milliseconds(11_000 + step * 1000 + n * 37);
                let got = store
                    .job_claim(params("api", &format!("c{n}"), 3, Some(now)))
                    .await
                    .unwrap();
                times.extend(got.iter().map(|c| c.id));
            }
            times
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    for claimed in [&first, &second, &third] {
        ids.extend(claimed.jobs.iter().map(|c| c.id));
    }
    let mut times: Vec<DateTime<Utc>> = Vec::new();
    for id in ids {
        times.push(t.get(id).await.lease.unwrap().heartbeat_at.unwrap());
    }
    times.sort();
    assert!(times.len() >= 50, "claims went on: {}", times.len());
    for (i, end) in times.iter().enumerate() {
        let inside = times[..=i]
            .iter()
            .filter(|s| **s > *end - chrono::Duration::seconds(10))
            .count();
        assert!(inside <= 10, "{inside} claims in the 10 s ending {end}");
    }
}

/// A rate-limited claim that waited for the queue's lock records the time it took it, not
/// the time it asked: recorded earlier than it took effect, the claims right after a window
/// could crowd into that window in real time.
pub async fn a_rate_limited_claim_records_when_it_took_the_queue_lock(b: Backend) {
    use diesel_async::SimpleAsyncConnection;

    let t = Bundle::new(b).await;
    // The database's clock throughout: due now, a window of a minute.
    let jobs: Vec<NewJob> = (0..3)
        .map(|i| NewJob::new("k", json!(i)).queue("api"))
        .collect();
    t.store
        .job_enqueue_many(EnqueueParams::many(jobs))
        .await
        .unwrap();
    t.store
        .queue_set_limits(
            "api",
            QueueLimits::default().rate(RateLimit::new(100, Duration::from_secs(60)).unwrap()),
            None,
        )
        .await
        .unwrap();
    // A claim of a kind nobody enqueued: the store learns how this queue is claimed (on
    // PostgreSQL, with its rate limit, not by the one-statement claim).
    let none = ClaimParams {
        kinds: Some(vec!["none".into()]),
        ..params("api", "n1", 3, None)
    };
    assert!(t.store.job_claim(none).await.unwrap().is_empty());
    macro_rules! held {
        ($conn:expr, $begin:expr) => {{
            let holder = &mut $conn;
            holder.batch_execute($begin).await.unwrap();
            if $begin != "BEGIN IMMEDIATE" {
                holder
                    .batch_execute("UPDATE jobvisor_queues SET claims = claims WHERE name = 'api'")
                    .await
                    .unwrap();
            }
            let claim = tokio::spawn({
                let s = t.store.clone();
                async move { s.job_claim(params("api", "n1", 3, None)).await }
            });
            tokio::time::sleep(Duration::from_millis(600)).await;
            let released = Utc::now();
            holder.batch_execute("COMMIT").await.unwrap();
            (claim.await.unwrap().unwrap(), released)
        }};
    }
    let (claimed, released) = match b {
        Backend::Postgres => held!(
            AsyncPgConnection::establish(&t.db.url).await.unwrap(),
            "BEGIN"
        ),
        Backend::Mysql => held!(
            AsyncMysqlConnection::establish(&t.db.app_url())
                .await
                .unwrap(),
            "BEGIN"
        ),
        Backend::Sqlite => {
            // The holder has a thread of its own: a claim waiting for SQLite's lock may block
            // the thread it was made on (the simulated store runs its calls inline).
            use diesel::Connection;
            let path = t.db.url.trim_start_matches("sqlite://").to_string();
            let (locked, is_locked) = std::sync::mpsc::channel();
            let holder = std::thread::spawn(move || {
                let mut c = diesel::SqliteConnection::establish(&path).unwrap();
                diesel::connection::SimpleConnection::batch_execute(&mut c, "BEGIN IMMEDIATE")
                    .unwrap();
                locked.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(600));
                let released = Utc::now();
                diesel::connection::SimpleConnection::batch_execute(&mut c, "COMMIT").unwrap();
                released
            });
            is_locked.recv().unwrap();
            let claimed = t
                .store
                .job_claim(params("api", "n1", 3, None))
                .await
                .unwrap();
            (claimed, holder.join().unwrap())
        }
    };
    assert_eq!(claimed.len(), 3, "the claim went on once the lock freed");
    let recorded = t
        .get(claimed[0].id)
        .await
        .lease
        .unwrap()
        .heartbeat_at
        .unwrap();
    // Both clocks are this machine's; the database's may round down to a millisecond.
    assert!(
        recorded >= released - chrono::Duration::milliseconds(5),
        "the claim recorded {recorded}, before the lock it waited for was released at \
         {released}"
    );
}
