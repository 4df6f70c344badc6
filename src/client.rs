//! Client: what application code uses to enqueue and inspect jobs — from an actix-web
//! handler (share it as `web::Data<Client>`), an axum one (`State<Client>`), a job's handler
//! ([`JobContext::client`](crate::JobContext::client)), a CLI, another process; it works on
//! any tokio runtime. It needs no running scheduler; one obtained from
//! [`SchedulerHandle::client`](crate::SchedulerHandle::client) also wakes that node's
//! fetchers at once on enqueue.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::done_watch::{DoneWatch, Registration};
use crate::error::{Error, Result};
use crate::hooks::{on_enqueue, Hooks};
use crate::job::{Job, JobId, NewJob, RunAt};
use crate::schedule::{Schedule, ScheduleInfo};
use crate::store::{
    ArchiveParams, CancelOutcome, CancelParams, EnqueueParams, Enqueued, Guarded, Leader,
    ListParams, NodeInfo, OutboxConnection, PruneParams, Put, QueueInfo, QueueLag, QueueLimits,
    RetryOutcome, RetryParams, StateCount, Store, Unserved,
};

/// Rows moved or deleted per statement by [`Client::archive`] and [`Client::prune`].
const MAINTENANCE_BATCH: u32 = 1000;

/// Runs `batch` until one moves fewer than [`MAINTENANCE_BATCH`] rows; answers the total.
async fn in_batches<F, Fut>(mut batch: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < u64::from(MAINTENANCE_BATCH) {
            return Ok(total);
        }
    }
}

/// Wakes a queue's fetcher in this process.
pub(crate) type Wake = Arc<dyn Fn(&str) + Send + Sync>;

/// First pause of [`Client::wait`]'s polling, **5 ms**; it doubles up to [`WAIT_POLL_MAX`].
pub(crate) const WAIT_POLL_MIN: Duration = Duration::from_millis(5);
/// Longest pause of [`Client::wait`]'s polling: **250 ms**.
pub(crate) const WAIT_POLL_MAX: Duration = Duration::from_millis(250);
/// How long a wait's registration outlives its timeout before it counts as stale (a waiter
/// that died leaves its row that long at most).
const WAIT_ROW_MARGIN: Duration = Duration::from_secs(60);

/// How long a node's client ([`SchedulerHandle::client`](crate::SchedulerHandle::client))
/// waits, in its schedule calls, for the node to store the schedules it declares: they are
/// listed as soon as `start()` returns. 5 s; past it the call goes on (the database is
/// unreachable, and the call reads what is there or fails as it would).
pub(crate) const SCHEDULES_STORED_WAIT: Duration = Duration::from_secs(5);

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
    /// A node's client: turns true once the node has stored the schedules it declares, so
    /// the schedule calls made right after `start()` see them.
    declared: Option<tokio::sync::watch::Receiver<bool>>,
    /// Hears that waited jobs ended, for [`Client::wait`] (PostgreSQL); shared by the clones.
    done: Arc<DoneWatch>,
    /// The application's hooks: each enqueue runs their `on_enqueue` (`hooks.rs`).
    hooks: Option<Hooks>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.store)
            .field("wakes_local_fetchers", &self.wake.is_some())
            .field("hooks", &self.hooks.as_ref().map(|h| h.name()))
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
            done: DoneWatch::new(store.clone()),
            store,
            clock,
            wake: None,
            declared: None,
            hooks: None,
        }
    }

    /// Registers the application's [`JobHooks`](crate::hooks::JobHooks) on this client
    /// (replacing any): its `on_enqueue` sees every job this client enqueues, before it is
    /// written. A node's client has its node's hooks already
    /// ([`SchedulerBuilder::hooks`](crate::SchedulerBuilder::hooks)). Example on
    /// [`JobHooks`](crate::hooks::JobHooks).
    pub fn with_hooks<H: crate::hooks::JobHooks>(mut self, hooks: H) -> Self {
        self.hooks = Some(crate::hooks::erase(hooks));
        self
    }

    pub(crate) fn set_hooks(&mut self, hooks: Option<Hooks>) {
        self.hooks = hooks;
    }

    /// The hooks this client runs, if any.
    pub(crate) fn hooks(&self) -> Option<&Hooks> {
        self.hooks.as_ref()
    }

    pub(crate) fn with_wake(mut self, wake: Wake) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Makes the schedule calls wait (at most [`SCHEDULES_STORED_WAIT`]) until `declared`
    /// turns true: the node's schedules are stored.
    pub(crate) fn with_declared(mut self, declared: tokio::sync::watch::Receiver<bool>) -> Self {
        self.declared = Some(declared);
        self
    }

    /// On a node's client, waits until the node has stored the schedules it declares, or
    /// [`SCHEDULES_STORED_WAIT`] has passed (the database unreachable: the call then reads
    /// what is there, or fails as it would).
    async fn schedules_stored(&self) {
        if let Some(rx) = &self.declared {
            let mut rx = rx.clone();
            // A closed channel (the node stopped) waits no longer.
            let _ =
                tokio::time::timeout(SCHEDULES_STORED_WAIT, rx.wait_for(|stored| *stored)).await;
        }
    }

    /// The store it uses.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Wakes this node's fetcher of `queue`, if the client belongs to a node.
    pub(crate) fn wake(&self, queue: &str) {
        if let Some(wake) = &self.wake {
            wake(queue);
        }
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

    /// Enqueues one job: a [`NewJob`], or the arguments of a [`JobArgs`](crate::JobArgs)
    /// type (its kind and defaults come with it).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field; [`Error::Refused`] by a hook;
    /// [`Error::Database`].
    pub async fn enqueue(&self, job: impl Into<NewJob>) -> Result<Enqueued> {
        let mut v = self.enqueue_many(vec![job.into()]).await?;
        v.pop()
            .ok_or_else(|| Error::invalid("jobs", "enqueue returned nothing"))
    }

    /// Enqueues many jobs in one round trip where the backend allows.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first bad job, [`Error::Refused`] for the first job
    /// a hook refused; nothing is written.
    pub async fn enqueue_many(&self, mut jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        on_enqueue(self.hooks.as_ref(), &mut jobs)?;
        let now = self.clock.bound_now();
        let out = self.store.enqueue_jobs(&jobs, now).await?;
        self.wake_for(&jobs, &out);
        Ok(out)
    }

    /// Enqueues inside the caller's transaction on `conn`: the jobs exist only if it commits.
    ///
    /// # Errors
    /// As [`Client::enqueue_many`]; the caller's transaction is then usually to be rolled
    /// back.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: jobvisor::Client, conn: &mut diesel_async::AsyncPgConnection) -> jobvisor::Result<()> {
    /// use diesel_async::AsyncConnection;
    /// use jobvisor::NewJob;
    /// conn.transaction(async |conn| {
    ///     // ... insert the business row on `conn` ...
    ///     client.enqueue_in(conn, vec![NewJob::new("welcome", serde_json::json!({"user": 42}))]).await?;
    ///     Ok::<_, jobvisor::Error>(())
    /// }).await
    /// # }
    /// ```
    pub async fn enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        mut jobs: Vec<NewJob>,
    ) -> Result<Vec<Enqueued>> {
        on_enqueue(self.hooks.as_ref(), &mut jobs)?;
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

    /// Job `id`'s execution ledger: every claim of it, oldest first — the node that held
    /// it, its attempt, when it was claimed, started and ended, how it ended
    /// ([`ClaimOutcome`](crate::ClaimOutcome)) — with the claim running now, if any, last.
    /// Kept while the job is live or archived, deleted with it when the archive is pruned.
    ///
    /// ```no_run
    /// # async fn demo(client: jobvisor::Client, id: jobvisor::JobId) -> jobvisor::Result<()> {
    /// if let Some(last) = client.claims(id).await?.last() {
    ///     println!("attempt {} ran on {}: {}", last.attempt, last.node, last.outcome);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Database`].
    pub async fn claims(&self, id: JobId) -> Result<Vec<crate::Claim>> {
        self.store.job_claims(id).await
    }

    /// The effects job `id`'s handlers recorded
    /// ([`JobTx::record_effect`](crate::JobTx::record_effect)), by key: kept while the job is
    /// live or archived, deleted with it when the archive is pruned.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn effects(&self, id: JobId) -> Result<Vec<crate::Effect>> {
        self.store.job_effects(id).await
    }

    /// The audit log of operator actions (every dashboard action, every bulk action of the
    /// `jobvisor` command, and what [`record_action`](Client::record_action) records), newest
    /// first: at most `limit` entries (1 to 1,000), older than entry `before` if given (the
    /// last id of the previous page). Entries are kept as long as archived jobs
    /// ([`prune`](Client::prune) and the archiver delete older ones).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn audit(&self, before: Option<i64>, limit: u32) -> Result<Vec<crate::AuditEntry>> {
        self.store
            .audit_page(before, i64::from(limit.clamp(1, 1_000)))
            .await
    }

    /// Records an operator action in the audit log (an application's own admin tools; the
    /// dashboard and the command record theirs).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn record_action(&self, action: &crate::AuditAction) -> Result<()> {
        self.store.audit_record(action).await
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

    /// Per queue with due jobs waiting: how many and since when the oldest has been due
    /// (the queue's lag), by queue name.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn queue_lags(&self) -> Result<Vec<QueueLag>> {
        self.store.queue_lags().await
    }

    /// Moves jobs that finished (succeeded or cancelled) more than `older_than` ago to the
    /// archive — dead ones only once they finished more than `dead_older_than` ago too — in
    /// batches of 1,000, as the archiver does; answers how many moved.
    ///
    /// # Errors
    /// [`Error::Database`] (batches already moved stay moved).
    pub async fn archive(&self, older_than: Duration, dead_older_than: Duration) -> Result<u64> {
        in_batches(|| {
            self.store.job_archive(ArchiveParams {
                older_than,
                dead_older_than,
                limit: MAINTENANCE_BATCH,
                now: self.clock.bound_now(),
            })
        })
        .await
    }

    /// Deletes archived jobs archived more than `older_than` ago, in batches of 1,000, and
    /// the audit log's entries older than that; answers how many jobs were deleted.
    ///
    /// # Errors
    /// [`Error::Database`] (batches already deleted stay deleted).
    pub async fn prune(&self, older_than: Duration) -> Result<u64> {
        let jobs = in_batches(|| {
            self.store.job_prune_archive(PruneParams {
                older_than,
                limit: MAINTENANCE_BATCH,
                now: self.clock.bound_now(),
            })
        })
        .await?;
        // The audit log is kept as long as the archive.
        in_batches(|| {
            self.store
                .audit_prune(older_than, MAINTENANCE_BATCH, self.clock.bound_now())
        })
        .await?;
        Ok(jobs)
    }

    /// The nodes registered on this database: the queues each serves, the kinds it runs, and
    /// its last heartbeat (a node is gone once silent for three of its
    /// [`node_heartbeat_every`](crate::SchedulerConfig::node_heartbeat_every); rows silent
    /// for a day are removed).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        self.store.nodes_list().await
    }

    /// Every stored schedule (declared by some node's code, see
    /// [`SchedulerBuilder::periodic`](crate::SchedulerBuilder::periodic), or added at run
    /// time, see [`add_schedule`](Self::add_schedule)), by name: when it
    /// fires next and last, paused or retired.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.schedules_stored().await;
        self.store.schedules_list().await
    }

    /// Pauses a schedule on every node: it does not fire until resumed (the fires in between
    /// are handled by its missed-fire policy on resume). Answers it as stored.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule; [`Error::Database`].
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        self.schedules_stored().await;
        self.store
            .schedule_set_paused(name, true, self.clock.bound_now())
            .await
    }

    /// Resumes a paused schedule.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule; [`Error::Database`].
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        self.schedules_stored().await;
        self.store
            .schedule_set_paused(name, false, self.clock.bound_now())
            .await
    }

    /// Enqueues a schedule's job now, outside its fires (which it does not change): keyed
    /// `schedule:<name>@manual:<now>`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule; [`Error::Database`].
    pub async fn trigger_schedule(&self, name: &str) -> Result<Enqueued> {
        self.schedules_stored().await;
        let template = self.store.schedule_template(name).await?;
        let now = self.clock.now();
        let key = format!(
            "schedule:{name}@manual:{}",
            crate::schedule::rfc3339(now.timestamp_micros())
        );
        let mut job = template.job(key, now);
        job.run_at = RunAt::Now;
        self.enqueue(job).await
    }

    /// Adds a periodic schedule at run time, without a deploy: stored in the database, fired
    /// by whichever node leads — exactly one job per fire, as a schedule declared in code —
    /// from its first fire after now. It is described as in code ([`Schedule`]: a cron
    /// expression in a time zone or a fixed interval, the job, the missed-fire policy) and
    /// kept apart from code: no node's sync changes or retires it, and a name a live
    /// code schedule has is refused. Answers it as stored.
    ///
    /// ```no_run
    /// # async fn demo(client: jobvisor::Client) -> jobvisor::Result<()> {
    /// use jobvisor::schedule::{MissedFires, Schedule};
    /// use jobvisor::NewJob;
    ///
    /// let digest = NewJob::new("digest", serde_json::json!({"team": 7})).queue("mail");
    /// let s = Schedule::cron("digest-team-7", "0 9 * * 1-5", digest)
    ///     .time_zone("Europe/Paris")
    ///     .missed(MissedFires::Skip);
    /// let stored = client.add_schedule(s).await?;
    /// println!("next fire {:?}", stored.next_fire_at);
    /// // Later: weekly instead (starts afresh from now), then gone.
    /// let weekly = NewJob::new("digest", serde_json::json!({"team": 7})).queue("mail");
    /// client
    ///     .change_schedule(Schedule::cron("digest-team-7", "0 9 * * 1", weekly))
    ///     .await?;
    /// client.remove_schedule("digest-team-7").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming what is wrong and what was expected: a bad schedule (its
    /// expression, zone, interval, job), a name declared in code or already added;
    /// [`Error::Database`].
    pub async fn add_schedule(&self, schedule: Schedule) -> Result<ScheduleInfo> {
        self.put_schedule(schedule, Put::Add).await
    }

    /// Changes a schedule added at run time ([`add_schedule`](Self::add_schedule)) to
    /// `schedule` (of the same name): its job and missed-fire policy at once; a changed
    /// expression or zone starts afresh from now (its next fire is the first after now), as
    /// a deploy that changes one in code does. Paused, it stays paused. Answers it as stored.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]: a bad schedule, no run-time schedule of that name, or one
    /// declared in code; [`Error::Database`].
    pub async fn change_schedule(&self, schedule: Schedule) -> Result<ScheduleInfo> {
        self.put_schedule(schedule, Put::Change).await
    }

    async fn put_schedule(&self, schedule: Schedule, put: Put) -> Result<ScheduleInfo> {
        let compiled = schedule.compile_runtime()?;
        self.schedules_stored().await;
        self.store
            .schedule_put(&compiled, put, self.clock.bound_now())
            .await
    }

    /// Removes a schedule added at run time: no fire of it after this returns (a fire
    /// racing the removal either committed before it or enqueues nothing). Its fires' jobs
    /// stay.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming an unknown schedule or one declared in code (remove
    /// that one from the code: it retires); [`Error::Database`].
    pub async fn remove_schedule(&self, name: &str) -> Result<()> {
        self.schedules_stored().await;
        self.store.schedule_remove(name).await
    }

    /// The node leading this database (it computes the database-wide gauges), with its term
    /// and lease; `None` while nobody does — no scheduler running, or a leader just stopped
    /// and nobody has taken over yet (at most about
    /// [`leader_lease`](crate::SchedulerConfig::leader_lease) × 4/3).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.store.leader_current(self.clock.bound_now()).await
    }

    /// Removes the registry rows of nodes gone now (silent for longer than
    /// [`NODE_GONE_AFTER`](crate::store::NODE_GONE_AFTER): killed or cut off); answers how
    /// many. A node that comes back registers itself again at its next heartbeat.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn forget_gone_nodes(&self) -> Result<u64> {
        self.store.nodes_forget_gone(self.clock.bound_now()).await
    }

    /// Due jobs that have waited at least `after` with no node able to run them — no node
    /// with a heartbeat within `live` serves their queue, or none serving it has a handler
    /// for their kind — by queue and kind, longest-waiting first. Schedulers report these
    /// themselves ([`Event::Unserved`](crate::Event::Unserved)); this asks on demand.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a zero `live`; [`Error::Database`].
    pub async fn unserved(&self, after: Duration, live: Duration) -> Result<Vec<Unserved>> {
        self.store
            .unserved_jobs(after, live, self.clock.bound_now())
            .await
    }

    /// Every queue with shared settings (a pause or limits), by name. A queue not listed runs
    /// unpaused and unlimited on every node that serves it.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn queues(&self) -> Result<Vec<QueueInfo>> {
        self.store.queues_list().await
    }

    /// One queue's shared settings; `None` if it has none.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed name; [`Error::Database`].
    pub async fn queue(&self, name: &str) -> Result<Option<QueueInfo>> {
        self.store.queue_get(name).await
    }

    /// Pauses a queue on every node: from the moment this returns, no claim of it that
    /// starts anywhere takes a job (the claim statement checks), until
    /// [`resume_queue`](Client::resume_queue). Running jobs finish normally; jobs stay
    /// due. The pause is stored, so it survives restarts. `by` says who paused it (shown by
    /// [`queues`](Client::queues) and the command line). Pausing a paused queue changes
    /// only `by`.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f(client: jobvisor::Client) -> jobvisor::Result<()> {
    /// client.pause_queue("emails", "ops: provider outage").await?;
    /// // ...
    /// client.resume_queue("emails").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// A queue no node serves yet can be paused (and given limits) before its first node
    /// starts: the setting holds from that node's first claim. A misspelt name is accepted
    /// too, so check it against [`known_queues`](Client::known_queues) (the command line
    /// warns).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `queue` for a malformed name, or `paused_by`; nothing is
    /// changed. [`Error::Database`].
    pub async fn pause_queue(&self, name: &str, by: &str) -> Result<QueueInfo> {
        self.store
            .queue_pause(name, Some(by), self.clock.bound_now())
            .await?
            .ok_or_else(|| Error::Database(crate::StoreError::Other("pause wrote no row".into())))
    }

    /// The queues this database knows, sorted: those with settings, served by a registered
    /// node, or holding a live job — to check a name before [`pause_queue`](Client::pause_queue)
    /// or [`set_queue_limits`](Client::set_queue_limits), which accept any.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn known_queues(&self) -> Result<Vec<String>> {
        let mut known: Vec<String> = self.store.queues_known().await?.into_iter().collect();
        known.sort();
        Ok(known)
    }

    /// Whether this database knows `name` (see [`known_queues`](Client::known_queues); a
    /// queue known only by its jobs counts too).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn is_known_queue(&self, name: &str) -> Result<bool> {
        self.store.queue_is_known(name).await
    }

    /// Resumes a paused queue: its fetchers on every node are woken at once on PostgreSQL
    /// (a notification), at their next poll elsewhere. Resuming a queue that is not paused
    /// changes nothing. Answers the queue's remaining settings (`None`: none left).
    ///
    /// # Errors
    /// As [`pause_queue`](Client::pause_queue).
    pub async fn resume_queue(&self, name: &str) -> Result<Option<QueueInfo>> {
        let out = self
            .store
            .queue_pause(name, None, self.clock.bound_now())
            .await?;
        if let Some(wake) = &self.wake {
            wake(name);
        }
        Ok(out)
    }

    /// Sets a queue's limits across every node, replacing the previous ones (a `None` lifts
    /// that limit; [`QueueLimits::default()`] lifts them all). Limits bind claims from the
    /// moment this returns: jobs already running above a lowered limit finish normally, and
    /// new ones are claimed once the count is below it. Answers the queue's settings
    /// (`None`: none left).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f(client: jobvisor::Client) -> jobvisor::Result<()> {
    /// use std::time::Duration;
    /// use jobvisor::{QueueLimits, RateLimit};
    ///
    /// // The payment provider allows 10 calls a second and 4 at once per merchant.
    /// let limits = QueueLimits::default()
    ///     .per_partition(4)
    ///     .rate(RateLimit::new(10, Duration::from_secs(1))?);
    /// client.set_queue_limits("payments", limits).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the limit out of range (`concurrency`,
    /// `per_partition`, `rate`) or `queue` (malformed); nothing is changed.
    /// [`Error::Database`].
    pub async fn set_queue_limits(
        &self,
        name: &str,
        limits: QueueLimits,
    ) -> Result<Option<QueueInfo>> {
        let out = self
            .store
            .queue_set_limits(name, limits, self.clock.bound_now())
            .await?;
        if let Some(wake) = &self.wake {
            wake(name);
        }
        Ok(out)
    }

    /// Cancels a job; a running one is signalled and ends `cancelled` once its node sees the
    /// request (at its next lease renewal).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Database`].
    pub async fn cancel(&self, id: JobId) -> Result<CancelOutcome> {
        let (out, released) = self
            .store
            .job_cancel_settling(CancelParams {
                id,
                now: self.clock.bound_now(),
            })
            .await?;
        // A `Run` child the cancel released is due now: this node's fetchers need not wait
        // for a NOTIFY or their poll.
        self.wake_queues(&released);
        Ok(out)
    }

    /// [`cancel`](Client::cancel), only while the job is at `version` (the dashboard's pinned
    /// jobs): `Err(job)`, as it is now, when it changed since; nothing is written then.
    #[cfg(feature = "web")]
    pub(crate) async fn cancel_at_version(
        &self,
        id: JobId,
        version: i64,
    ) -> Result<std::result::Result<CancelOutcome, Job>> {
        let p = CancelParams {
            id,
            now: self.clock.bound_now(),
        };
        match self.store.job_cancel_guarded(p, Some(version)).await? {
            Ok((out, released)) => {
                self.wake_queues(&released);
                Ok(Ok(out))
            }
            Err(job) => Ok(Err(job)),
        }
    }

    /// Cancels a job and every descendant not yet ended (children, their children, …),
    /// whatever their [`ParentPolicy`](crate::ParentPolicy): waiting, pending and retrying
    /// ones at once, running ones by a cancel request. Returns the job's outcome and the
    /// descendants reached. Without the cascade ([`Client::cancel`]), each waiting child
    /// follows its own policy.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Database`].
    pub async fn cancel_cascade(&self, id: JobId) -> Result<(CancelOutcome, Vec<JobId>)> {
        let now = self.clock.bound_now();
        let reached = self.store.job_cancel_cascade(id, now).await?;
        let job = self.get(id).await?;
        let out = if job.state == crate::JobState::Running {
            CancelOutcome::Requested(job)
        } else {
            CancelOutcome::Cancelled(job)
        };
        Ok((out, reached))
    }

    /// Enqueues `members` as a batch with a `callback` job that runs exactly once, when
    /// every member has ended (succeeded, dead or cancelled): the callback waits for all of
    /// them with [`ParentPolicy::Run`](crate::ParentPolicy::Run), and its handler reads the
    /// members' outcomes with [`Client::dependencies`] (`.outcomes()`). One transaction: the
    /// members and the callback are stored together or not at all.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming a bad job, or for no members (or more than
    /// [`MAX_PARENTS`](crate::dependency::MAX_PARENTS)); [`Error::Database`].
    pub async fn enqueue_batch(
        &self,
        mut members: Vec<NewJob>,
        mut callback: NewJob,
    ) -> Result<crate::Batch> {
        on_enqueue(
            self.hooks.as_ref(),
            members.iter_mut().chain(std::iter::once(&mut callback)),
        )?;
        let (batch, due) = self
            .store
            .enqueue_batch(&members, callback, self.clock.bound_now())
            .await?;
        self.wake_queues(&due);
        Ok(batch)
    }

    /// Job `id`'s parents and children, each with its state and the child's policy.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn dependencies(&self, id: JobId) -> Result<crate::Dependencies> {
        self.store.job_dependencies(id).await
    }

    /// Wakes this node's fetchers of `queues` (each once).
    pub(crate) fn wake_queues(&self, queues: &[String]) {
        let mut woken: Vec<&str> = Vec::new();
        for q in queues {
            if !woken.contains(&q.as_str()) {
                woken.push(q);
                self.wake(q);
            }
        }
    }

    /// Retries a dead or cancelled job now.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] from another state; [`Error::NotFound`].
    pub async fn retry(&self, id: JobId) -> Result<RetryOutcome> {
        let out = self
            .store
            .job_retry(RetryParams {
                id,
                expected_version: None,
                now: self.clock.bound_now(),
            })
            .await?;
        Ok(match out {
            Guarded::Applied(job) => {
                self.wake(&job.queue);
                RetryOutcome::Retried(job)
            }
            // Without a lease, the only guard a retry has is the version it read.
            Guarded::Stale | Guarded::LeaseLost => RetryOutcome::Changed,
        })
    }

    /// Waits until the job is succeeded, dead or cancelled and returns it — the "future"
    /// pattern. It polls the store, so it works whichever process runs the job. On
    /// PostgreSQL it is also told at once: its client listens (one connection shared by its
    /// waits, closed after 30 s unused) and the wait registers its job, whose end is then
    /// notified to it; the poll stays as the backstop.
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] (with the job's state then) after `timeout`;
    /// [`Error::NotFound`].
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job> {
        let start = std::time::Instant::now();
        let mut pause = WAIT_POLL_MIN;
        let mut sub = self.done.subscribe();
        // Removed (by a task of its own) when the wait returns or is dropped.
        let mut registered: Option<Registration> = None;
        loop {
            // The order `store/waits.rs` proves safe: the `LISTEN` holds, then the
            // registration (which reads the job's row `FOR SHARE`), then the read below.
            if registered.is_none() && sub.as_ref().is_some_and(|s| s.listening()) {
                let left = timeout.saturating_sub(start.elapsed());
                let ttl = timeout.saturating_add(WAIT_ROW_MARGIN);
                match tokio::time::timeout(left, Registration::new(&self.store, id, ttl)).await {
                    Ok(Ok(r)) => registered = r,
                    // The poll alone, as on the other backends.
                    Ok(Err(_)) | Err(_) => sub = None,
                }
            }
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
            let nap = pause.min(timeout - waited);
            match sub.as_mut() {
                Some(s) => {
                    let _ = tokio::time::timeout(nap, s.woken(id)).await;
                }
                None => tokio::time::sleep(nap).await,
            }
            pause = (pause * 2).min(WAIT_POLL_MAX);
        }
    }
}
