//! The raw-SQL workers of `steady-raw` (PostgreSQL): C workers, each on a connection of its
//! own, claiming one job at a time with `FOR UPDATE SKIP LOCKED` (the statement of the raw
//! pickup in `raw.rs`), sleeping the job's time and marking it done in a statement of its own.
//! A worker that finds nothing waits for a notification on `jobvisor_jobs` or 1 s, whichever is
//! first. A notification (one listening connection) wakes one waiting worker, and a worker that
//! claimed a job wakes the next, so a backlog is claimed in a chain: waking every worker at
//! every notification sent 50 claims per job, most finding nothing, and saturated the server
//! (load 18 on two cores, pickup p99 200–600 ms).
//!
//! The producers insert as the store does (`RawInserter::open_quiet`: the trigger silent) and
//! announce after the commit through an [`Announcer`], one notification in flight covering every
//! insert asked meanwhile: with the trigger notifying in each insert's transaction, the commits
//! queued one at a time for PostgreSQL's notification lock and the raw side reached 210 of 800
//! jobs/s.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;

use crate::raw::{now_us, PG_CLAIM_ONE, PG_DONE};
use crate::steady::Tally;

/// Announces inserted jobs after their commits: one `pg_notify` at a time on a connection of
/// its own, each covering every insert asked before it started (a [`Notify`] permit).
pub(crate) struct Announcer {
    asked: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Announcer {
    pub(crate) async fn start(url: &str) -> Announcer {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let asked = Arc::new(Notify::new());
        let wait = asked.clone();
        let task = tokio::spawn(async move {
            loop {
                wait.notified().await;
                client
                    .batch_execute("SELECT pg_notify('jobvisor_jobs', 'default')")
                    .await
                    .expect("notify");
            }
        });
        Announcer { asked, task }
    }

    /// What a producer calls once its insert committed.
    pub(crate) fn handle(&self) -> Arc<Notify> {
        self.asked.clone()
    }

    pub(crate) fn stop(self) {
        self.task.abort();
    }
}

/// The running workers.
pub(crate) struct RawWorkers {
    /// The listening connection's client (the connection closes with it).
    _listener: tokio_postgres::Client,
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `c` workers on the database at `url`; each job's pickup and finish go to `tally`.
pub(crate) async fn start(url: &str, c: u32, tally: Arc<Tally>) -> RawWorkers {
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    let (listener, mut conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let w = wake.clone();
    tasks.push(tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(_) = m {
                w.notify_one();
            }
        }
    }));
    listener
        .batch_execute("LISTEN jobvisor_jobs")
        .await
        .expect("listen");
    for _ in 0..c {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let (stop, wake, tally) = (stop.clone(), wake.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let claim = client.prepare(PG_CLAIM_ONE).await.expect("prepare");
            let fin = client.prepare(PG_DONE).await.expect("prepare");
            while !stop.load(Relaxed) {
                let row = {
                    // Registered before the claim, so a notification while it runs is not lost.
                    let woken = wake.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    let found = client.query_opt(&claim, &[&now_us()]).await.expect("claim");
                    let Some(row) = found else {
                        let _ = tokio::time::timeout(Duration::from_secs(1), woken).await;
                        continue;
                    };
                    row
                };
                // Another job may be waiting: the next worker looks (this one no longer waits,
                // so the wake-up is not its own).
                wake.notify_one();
                let id: i64 = row.get(0);
                let p: serde_json::Value = serde_json::from_str(row.get(1)).expect("payload");
                tally.picked(p["t_ms"].as_f64().unwrap_or(0.0));
                let ms = p["ms"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                client
                    .execute(&fin, &[&now_us(), &vec![id]])
                    .await
                    .expect("done");
                tally.completed.fetch_add(1, Relaxed);
            }
        }));
    }
    RawWorkers {
        _listener: listener,
        stop,
        wake,
        tasks,
    }
}

impl RawWorkers {
    /// Stops the workers once their jobs in hand are done.
    pub(crate) async fn stop(self) {
        self.stop.store(true, Relaxed);
        self.wake.notify_waiters();
        let mut tasks = self.tasks.into_iter();
        // The first is the listener, which ends with the process.
        if let Some(listener) = tasks.next() {
            listener.abort();
        }
        for t in tasks {
            t.await.ok();
        }
    }
}
