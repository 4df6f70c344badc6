//! Client: what application code uses to enqueue and inspect jobs — from an actix-web
//! handler (share it as `web::Data<Client>`), a CLI, another process. It needs no running
//! scheduler; one obtained from [`SchedulerHandle::client`](crate::SchedulerHandle::client)
//! also wakes that node's fetchers at once on enqueue.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, NewJob, RunAt};
use crate::store::{
    CancelOutcome, CancelParams, EnqueueParams, Enqueued, Guarded, ListParams, OutboxConnection,
    RetryParams, StateCount, Store,
};

/// Wakes a queue's fetcher in this process.
pub(crate) type Wake = Arc<dyn Fn(&str) + Send + Sync>;

/// First pause of [`Client::wait`]'s polling; it doubles up to [`WAIT_POLL_MAX`].
pub const WAIT_POLL_MIN: Duration = Duration::from_millis(5);
/// Longest pause of [`Client::wait`]'s polling.
pub const WAIT_POLL_MAX: Duration = Duration::from_millis(250);

/// Enqueue, inspect, cancel, retry and await jobs.
///
/// # Examples
/// ```no_run
/// # async fn demo() -> jobvisor::Result<()> {
/// use std::time::Duration;
/// use jobvisor::{Client, NewJob, Store};
///
/// let client = Client::new(Store::connect("postgres://app@db/app").await?);
/// let e = client.enqueue(NewJob::new("resize", serde_json::json!({"img": 7}))).await?;
/// let done = client.wait(e.id, Duration::from_secs(30)).await?;
/// println!("{} is {}", done.id, done.state);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    store: Store,
    clock: Arc<dyn Clock>,
    wake: Option<Wake>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.store)
            .field("wakes_local_fetchers", &self.wake.is_some())
            .finish()
    }
}

impl Client {
    /// A client on `store`, using the database's clock.
    pub fn new(store: Store) -> Self {
        Client::with_clock(store, Arc::new(SystemClock))
    }

    /// A client whose statements bind `clock` (a manual clock in simulation).
    pub fn with_clock(store: Store, clock: Arc<dyn Clock>) -> Self {
        Client {
            store,
            clock,
            wake: None,
        }
    }

    pub(crate) fn with_wake(mut self, wake: Wake) -> Self {
        self.wake = Some(wake);
        self
    }

    /// The store it uses.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn wake_for(&self, jobs: &[NewJob], enqueued: &[Enqueued]) {
        let Some(wake) = &self.wake else { return };
        let mut woken: Vec<&str> = Vec::new();
        for (j, e) in jobs.iter().zip(enqueued) {
            if !e.duplicate && j.run_at == RunAt::Now && !woken.contains(&j.queue.as_str()) {
                woken.push(&j.queue);
                wake(&j.queue);
            }
        }
    }

    /// Enqueues one job.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field; [`Error::Database`].
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        let mut v = self.enqueue_many(vec![job]).await?;
        v.pop()
            .ok_or_else(|| Error::invalid("jobs", "enqueue returned nothing"))
    }

    /// Enqueues many jobs in one round trip where the backend allows.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first bad job; nothing is written.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let now = self.clock.bound_now();
        let out = self.store.enqueue_jobs(&jobs, now).await?;
        self.wake_for(&jobs, &out);
        Ok(out)
    }

    /// Enqueues inside the caller's transaction on `conn`: the jobs exist only if it commits.
    ///
    /// # Errors
    /// As [`Client::enqueue_many`].
    pub async fn enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<Enqueued>> {
        let params = EnqueueParams {
            jobs,
            now: self.clock.bound_now(),
        };
        self.store.job_enqueue_in(conn, params).await
    }

    /// One job, live or archived.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Database`].
    pub async fn get(&self, id: JobId) -> Result<Job> {
        self.store.job_get(id).await?.ok_or(Error::NotFound { id })
    }

    /// Jobs matching filters, a page at a time.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad page size; [`Error::Database`].
    pub async fn list(&self, params: ListParams) -> Result<Vec<Job>> {
        self.store.job_list(params).await
    }

    /// Live jobs counted by queue and state.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn counts(&self) -> Result<Vec<StateCount>> {
        self.store.job_counts().await
    }

    /// Cancels a job; a running one is signalled and ends `cancelled` once its node sees the
    /// request (at its next lease renewal).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Database`].
    pub async fn cancel(&self, id: JobId) -> Result<CancelOutcome> {
        self.store
            .job_cancel(CancelParams {
                id,
                now: self.clock.bound_now(),
            })
            .await
    }

    /// Retries a dead or cancelled job now.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] from another state; [`Error::NotFound`].
    pub async fn retry(&self, id: JobId) -> Result<Guarded<Job>> {
        let out = self
            .store
            .job_retry(RetryParams {
                id,
                expected_version: None,
                now: self.clock.bound_now(),
            })
            .await?;
        if let (Guarded::Applied(job), Some(wake)) = (&out, &self.wake) {
            wake(&job.queue);
        }
        Ok(out)
    }

    /// Waits until the job is succeeded, dead or cancelled and returns it — the "future"
    /// pattern. It polls the store, so it works whichever process runs the job.
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] (with the job's state then) after `timeout`;
    /// [`Error::NotFound`].
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job> {
        let start = std::time::Instant::now();
        let mut pause = WAIT_POLL_MIN;
        loop {
            let job = self.get(id).await?;
            if job.state.is_terminal() {
                return Ok(job);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::WaitTimeout {
                    id,
                    waited,
                    state: job.state,
                });
            }
            tokio::time::sleep(pause.min(timeout - waited)).await;
            pause = (pause * 2).min(WAIT_POLL_MAX);
        }
    }
}
