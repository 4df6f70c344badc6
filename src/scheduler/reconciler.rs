//! Reconcilers: user functions that say which jobs *should* exist — typically one per row of
//! a business table awaiting work ("every signup without a welcome mail") — run by the
//! database's leader at an interval; the jobs missing are enqueued again.
//!
//! A job is recognised by its unique key (kind + key), so a reconciler's jobs must have one:
//! enqueueing a job whose key a live job holds changes nothing and counts as present. That
//! makes a pass idempotent — two passes at once (a deposed leader finishing late, two nodes
//! around a takeover) re-create each missing job once — which is why this leader work needs
//! no term fence. What it promises: a job missing (lost with a transaction that enqueued
//! outside it, deleted by hand, archived while its row still waits) is back within one
//! interval of a leader's pass, and a new leader passes at once. What it does not: it never
//! deletes jobs that should not exist, and a job whose key is still held (running, retrying,
//! or kept until archived by its scope) is not re-created, however it ended.
//!
//! The function runs on the handler runtime (it may query the application's database);
//! one that has not answered within the interval is abandoned; that, an error or a panic is
//! reported (`Event::ReconcileFailed`) and retried after a backoff
//! (1 s doubling, at most the interval); it never stops the scheduler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event::Event;
use super::panic_site::panic_message;
use super::shared::Shared;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::job::NewJob;

/// The shortest reconciler interval: **1 s**.
pub const MIN_RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// The first retry after a failed pass: **1 s**, doubling after each further failure up to
/// the reconciler's interval.
pub(crate) const RECONCILE_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Jobs enqueued per statement batch by a pass: **500**.
pub(crate) const RECONCILE_BATCH: usize = 500;

/// What a reconciler function returns.
type Expected = Pin<Box<dyn Future<Output = std::result::Result<Vec<NewJob>, String>> + Send>>;

/// A registered reconciler.
#[derive(Clone)]
pub(crate) struct Reconciler {
    pub(crate) name: String,
    pub(crate) every: Duration,
    expected: Arc<dyn Fn(Client) -> Expected + Send + Sync>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("name", &self.name)
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

/// What one pass found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ReconcileReport {
    /// Jobs the function said should exist.
    expected: usize,
    /// Of those, jobs that were missing and were enqueued.
    recreated: usize,
}

impl Reconciler {
    pub(crate) fn new<F, Fut, E>(name: String, every: Duration, f: F) -> Self
    where
        F: Fn(Client) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Vec<NewJob>, E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        let f = Arc::new(f);
        Reconciler {
            name,
            every,
            expected: Arc::new(move |client| {
                let fut = f(client);
                Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
            }),
        }
    }

    /// Checks the name and interval.
    pub(crate) fn validate(&self) -> Result<()> {
        crate::new_job::check_name("reconciler", &self.name, crate::job::MAX_KIND_LEN).map_err(
            |e| Error::Config {
                field: "reconcilers",
                reason: e.to_string(),
            },
        )?;
        if self.every < MIN_RECONCILE_INTERVAL {
            return Err(Error::Config {
                field: "reconcilers",
                reason: format!(
                    "reconciler {:?}: interval {:?} is under the minimum of \
                     {MIN_RECONCILE_INTERVAL:?}",
                    self.name, self.every
                ),
            });
        }
        Ok(())
    }

    /// One pass: asks the function (on the handler runtime) and enqueues the jobs missing, in
    /// batches. Runs whether or not this node leads (the loop checks).
    pub(crate) async fn pass(
        &self,
        shared: &Shared,
    ) -> std::result::Result<ReconcileReport, String> {
        // Called inside the task: a panic even in the function's synchronous part stays there.
        let (expected, client) = (self.expected.clone(), shared.client.clone());
        let mut task = shared
            .handler_rt
            .spawn(async move { expected(client).await });
        // A function that never answers (a query stuck on a dead connection) must not stop
        // every later pass: it is abandoned once it has taken the whole interval.
        let jobs = match tokio::time::timeout(self.every, &mut task).await {
            Ok(Ok(r)) => r?,
            Ok(Err(e)) => return Err(format!("the reconciler panicked: {}", panic_message(e))),
            Err(_) => {
                task.abort();
                return Err(format!(
                    "the reconciler's function took longer than its interval ({:?}); abandoned",
                    self.every
                ));
            }
        };
        if let Some((i, job)) = jobs
            .iter()
            .enumerate()
            .find(|(_, j)| j.unique_key.is_none())
        {
            return Err(format!(
                "job {i} (kind {:?}) has no unique key; expected one on every job a \
                 reconciler returns (it is how an existing job is recognised)",
                job.kind
            ));
        }
        let mut report = ReconcileReport {
            expected: jobs.len(),
            recreated: 0,
        };
        for chunk in jobs.chunks(RECONCILE_BATCH) {
            let done = shared
                .client
                .enqueue_many(chunk.to_vec())
                .await
                .map_err(|e| e.to_string())?;
            report.recreated += done.iter().filter(|e| !e.duplicate).count();
        }
        Ok(report)
    }
}

/// The delay before the next pass after `failures` failures in a row.
fn retry_in(failures: u32, every: Duration) -> Duration {
    let doubling = RECONCILE_RETRY_FIRST.saturating_mul(1 << failures.saturating_sub(1).min(20));
    doubling.min(every)
}

/// Runs one reconciler until the scheduler cancels it: every interval, a pass if this node
/// leads the database; after a failure, sooner (the backoff); and at once when this node
/// becomes the leader (a takeover after the leader died does not wait a further interval).
pub(crate) async fn reconcile_loop(shared: Arc<Shared>, r: Reconciler) {
    let mut failures = 0u32;
    let mut delay = r.every;
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shared.leader.elected() => {}
        }
        delay = r.every;
        if shared.leader.current(shared.clock.monotonic()).is_none() {
            failures = 0;
            continue;
        }
        if let Event::ReconcileFailed { retry_in, .. } = run(&shared, &r, &mut failures).await {
            delay = retry_in;
        }
    }
}

/// One pass, reported as an event (also answered); `failures` counts failed passes in a row.
pub(crate) async fn run(shared: &Shared, r: &Reconciler, failures: &mut u32) -> Event {
    let started = Instant::now();
    let event = match r.pass(shared).await {
        Ok(report) => {
            *failures = 0;
            Event::Reconciled {
                name: r.name.clone(),
                expected: report.expected,
                recreated: report.recreated,
                took: started.elapsed(),
            }
        }
        Err(message) => {
            *failures += 1;
            Event::ReconcileFailed {
                name: r.name.clone(),
                message,
                failures: *failures,
                retry_in: retry_in(*failures, r.every),
            }
        }
    };
    shared.events.emit(event.clone());
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_up_to_the_interval() {
        let every = Duration::from_secs(60);
        let s = |n| retry_in(n, every).as_secs();
        assert_eq!([s(1), s(2), s(3), s(6), s(7), s(40)], [1, 2, 4, 32, 60, 60]);
    }
}
