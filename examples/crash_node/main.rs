//! One node of the multi-process crash test (`tests/crash/`, run by `.ci/crash`).
//!
//! ```sh
//! cargo build --example crash_node
//! target/debug/examples/crash_node <database-url> <node-name> [--journal PATH] [options]
//! ```
//!
//! It starts a scheduler on the (already migrated) database with its queues (`--queue`, each
//! followed by its own `--concurrency` and `--prefetch`; by default one queue `crash`) and one
//! handler, registered for every `--kind` (by default `crashy`), that records each execution
//! in the side table `crash_executions` (created if missing): its start before doing
//! anything, then works (stopping early when told to), then records its end and returns
//! `{"node": <name>, "attempt": <n>, "claim": <claim id>}` — with `"effect": true` in the
//! payload, it returns that by completing the job in its own transaction
//! (`JobContext::complete_in_transaction`) that also inserts one business row into
//! `crash_effects` (created with the side tables). Both records are written before the handler returns,
//! so an execution whose finalization is later refused (its lease was lost) is still visible.
//! The handler cannot see its lease token; the attempt it was given, together with the node,
//! identifies the claim.
//!
//! The payload steers the handler: `work_ms` is how long it works (else a random 0 to
//! `--max-work-ms`, default 50 ms), `fail_first` makes its first attempt fail (code
//! `planned`, to be retried) once it has worked, without recording a completion, and
//! `timeout_ms` is the job's timeout as enqueued, from
//! which the handler derives when the runtime started the attempt (`JobContext::deadline`
//! minus the timeout) and records it with the start.
//!
//! With `--journal`, the node also appends to that file, one line per write: each handler's
//! start and end (including ends the handler could not record itself: a future dropped when
//! its lease was lost, fenced or given back), its claims, scheduler events (lease lost,
//! self-fenced, reclaimed), a timeline of claims, starts, finalizations, renewals, fences,
//! lost leases, drops, timeouts and detected pauses with the time each was seen (for the
//! partition test's timelines and the crash test's violation reports) and its graceful exit. See `JournalLine` in `tests/harness/side.rs`.
//!
//! With `--schedule-ms N` it declares the periodic schedule `crash-tick` (every N ms, every
//! missed fire run: `MissedFires::All`), and with `--reconcile-ms N` the reconciler
//! `crash-wanted` (every N ms, one job per row of the side table `crash_wanted`, keyed by
//! it); both enqueue into the queue `periodic`, which no node works, so their jobs stay for
//! the driver to count. `--leader-lease-ms` sets the leader lease.
//! `--defaults` keeps the library's default lease, renewal, sweep, deadline check and poll
//! (the node's own are quicker), for measuring what an idle default node sends.
//!
//! It runs until its standard input is closed, then shuts down gracefully (running jobs get
//! `--shutdown-ms`, default 5 s, to finish; the rest are given back) and exits 0. The driver stops it that way, or kills it with
//! SIGKILL. Exit status 2 means bad arguments, 1 a failure to start, 3 a journal write that
//! failed (the run's records are incomplete).

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use jobvisor::scheduler::Event;
use jobvisor::{
    Backend, JobContext, JobError, JobHandler, JobOutcome, JobResult, JobTx, MissedFires, NewJob,
    NodeId, QueueConfig, RetryPolicy, Schedule, Scheduler, SchedulerConfig, SqliteJobConnection,
    Store, StoreOptions, TxError,
};
use serde_json::{json, Value};

#[allow(dead_code)] // the driver uses the parts the node does not
#[path = "../../tests/harness/side.rs"]
mod side;

use side::{now_us, JournalLine, SideDb};

const USAGE: &str = "usage: crash_node <database-url> <node-name> [--journal PATH] \
[--queue NAME [--concurrency N] [--prefetch N]]... [--kind NAME]... [--lease-ms N] \
[--renew-ms N] [--sweep-ms N] [--deadline-ms N] [--poll-ms N] [--shutdown-ms N] \
[--max-work-ms N] [--schedule-ms N] [--reconcile-ms N] [--leader-lease-ms N] [--defaults]";

/// The queue worked when no `--queue` is given.
const DEFAULT_QUEUE: &str = "crash";
/// How often a working handler reads its fence point (see `ExecutionGuard::fence`).
const FENCE_CHECK: Duration = Duration::from_millis(100);
/// The kind handled when no `--kind` is given.
const DEFAULT_KIND: &str = "crashy";

/// One `--queue` and the options that followed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QueueArg {
    name: String,
    concurrency: u32,
    /// `None`: the library's default.
    prefetch: Option<u32>,
}

impl QueueArg {
    fn new(name: &str) -> QueueArg {
        QueueArg {
            name: name.to_string(),
            concurrency: 8,
            prefetch: None,
        }
    }
}

/// How long the node keeps trying to reach the database when it starts.
const CONNECT_FOR: Duration = Duration::from_secs(90);
/// How long a handler keeps retrying a side-table write before it gives up (and fails the
/// attempt, which the driver then reports as an unexpected error).
const RECORD_FOR: Duration = Duration::from_secs(20);
/// Pause between side-table write attempts.
const RECORD_RETRY: Duration = Duration::from_millis(50);
/// After shutdown, how long to wait for handler futures that were told to stop to be dropped.
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Command-line settings.
#[derive(Debug, Clone)]
struct Args {
    url: String,
    node: String,
    journal: Option<PathBuf>,
    queues: Vec<QueueArg>,
    kinds: Vec<String>,
    lease: Duration,
    renew_every: Duration,
    sweep_every: Duration,
    deadline_check_every: Duration,
    poll: Duration,
    shutdown_wait: Duration,
    max_work_ms: u64,
    schedule: Option<Duration>,
    reconcile: Option<Duration>,
    leader_lease: Option<Duration>,
    /// `--defaults`: the library's default lease, renewal, sweep, deadline check and poll
    /// instead of this node's quick ones (for measuring what a default node costs).
    defaults: bool,
}

/// The queue of the schedule's and the reconciler's jobs: no node works it.
const PERIODIC_QUEUE: &str = "periodic";

impl Args {
    fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            url: String::new(),
            node: String::new(),
            journal: None,
            queues: Vec::new(),
            kinds: Vec::new(),
            lease: Duration::from_secs(2),
            renew_every: Duration::from_millis(500),
            sweep_every: Duration::from_secs(1),
            deadline_check_every: Duration::from_millis(100),
            poll: Duration::from_millis(200),
            shutdown_wait: Duration::from_secs(5),
            max_work_ms: 50,
            schedule: None,
            reconcile: None,
            leader_lease: None,
            defaults: false,
        };
        let mut positional = Vec::new();
        while let Some(arg) = it.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                positional.push(arg);
                continue;
            };
            if flag == "defaults" {
                a.defaults = true;
                continue;
            }
            let value = it.next().ok_or_else(|| format!("--{flag} needs a value"))?;
            let ms = || -> Result<Duration, String> {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|e| format!("--{flag} {value:?}: {e}"))
            };
            let count = || -> Result<u32, String> {
                value
                    .parse::<u32>()
                    .map_err(|e| format!("--{flag} {value:?}: {e}"))
            };
            // --concurrency and --prefetch belong to the last --queue (or the default queue).
            if a.queues.is_empty() && matches!(flag, "concurrency" | "prefetch") {
                a.queues.push(QueueArg::new(DEFAULT_QUEUE));
            }
            match flag {
                "journal" => a.journal = Some(PathBuf::from(&value)),
                "queue" => a.queues.push(QueueArg::new(&value)),
                "kind" => a.kinds.push(value.clone()),
                "concurrency" => {
                    if let Some(q) = a.queues.last_mut() {
                        q.concurrency = count()?;
                    }
                }
                "prefetch" => {
                    if let Some(q) = a.queues.last_mut() {
                        q.prefetch = Some(count()?);
                    }
                }
                "lease-ms" => a.lease = ms()?,
                "renew-ms" => a.renew_every = ms()?,
                "sweep-ms" => a.sweep_every = ms()?,
                "deadline-ms" => a.deadline_check_every = ms()?,
                "poll-ms" => a.poll = ms()?,
                "shutdown-ms" => a.shutdown_wait = ms()?,
                "schedule-ms" => a.schedule = Some(ms()?),
                "reconcile-ms" => a.reconcile = Some(ms()?),
                "leader-lease-ms" => a.leader_lease = Some(ms()?),
                "max-work-ms" => {
                    a.max_work_ms = value
                        .parse()
                        .map_err(|e| format!("--max-work-ms {value:?}: {e}"))?;
                }
                other => return Err(format!("unknown option --{other}")),
            }
        }
        let [url, node]: [String; 2] = positional.try_into().map_err(|p: Vec<String>| {
            format!(
                "expected a database URL and a node name, got {} arguments",
                p.len()
            )
        })?;
        a.url = url;
        a.node = node;
        if a.queues.is_empty() {
            a.queues.push(QueueArg::new(DEFAULT_QUEUE));
        }
        if a.kinds.is_empty() {
            a.kinds.push(DEFAULT_KIND.into());
        }
        Ok(a)
    }
}

/// The node's journal file; see the module docs. Lines are written whole, one `write` each.
#[derive(Debug)]
struct Journal {
    file: Mutex<std::fs::File>,
    /// A write failed: the node exits with status 3 so the driver knows its records are
    /// incomplete.
    failed: AtomicBool,
}

impl Journal {
    fn open(path: &std::path::Path) -> std::io::Result<Journal> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Journal {
            file: Mutex::new(file),
            failed: AtomicBool::new(false),
        })
    }

    fn write(&self, line: &JournalLine) {
        let text = format!("{line}\n");
        let res = match self.file.lock() {
            Ok(mut f) => f.write_all(text.as_bytes()),
            Err(_) => Err(std::io::Error::other("journal lock poisoned")),
        };
        if let Err(e) = res {
            if !self.failed.swap(true, Ordering::SeqCst) {
                eprintln!("crash_node: cannot write the journal: {e}");
            }
        }
    }
}

/// What every handler invocation shares.
#[derive(Debug)]
struct Crashy {
    node: String,
    side: SideDb,
    journal: Option<Arc<Journal>>,
    /// Handler futures not yet returned or dropped (graceful exit waits for zero).
    live: Arc<AtomicUsize>,
    max_work_ms: u64,
    /// State of the work-time generator (splitmix64).
    rng: AtomicU64,
    /// The store's backend: the connection type of a job's own transaction.
    backend: Backend,
}

/// Completes the job in a transaction on its store (`$conn` is the backend's connection
/// type) that also inserts the business row `$sql`, answering the outcome.
macro_rules! complete_with_row {
    ($ctx:expr, $conn:ty, $sql:expr, $result:expr) => {
        $ctx.complete_in_transaction(async |mut tx: JobTx<'_, $conn>| {
            // Spelled out: the trait in scope would shadow the atomics' `load`.
            diesel_async::RunQueryDsl::execute(diesel::sql_query($sql.as_str()), tx.conn())
                .await
                .map_err(|e| JobError::retry(format!("writing the business row: {e}")))?;
            Ok::<_, JobError>($result.clone())
        })
        .await
    };
}

impl Crashy {
    /// The payload's `work_ms`, else a random 0 to `max_work_ms`.
    fn work_time(&self, payload: &Value) -> Duration {
        if let Some(ms) = payload["work_ms"].as_u64() {
            return Duration::from_millis(ms);
        }
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Duration::from_millis(z % (self.max_work_ms + 1))
    }
}

/// Journals the end of one execution when the handler's future ends, however it ends:
/// returned, or dropped because the runtime stopped it (lease lost, self-fenced, given back
/// at shutdown). The time taken in `drop` is when the handler surely stopped doing anything.
struct ExecutionGuard {
    journal: Option<Arc<Journal>>,
    live: Arc<AtomicUsize>,
    job_id: i64,
    attempt: i32,
    started_at_us: i64,
    returned: bool,
    /// The attempt's context: its claim id and fence point, journaled at the end.
    ctx: JobContext,
}

impl ExecutionGuard {
    /// Journals the attempt's fence point as the node reckons it now (`what`: start, seen,
    /// end); answers it.
    fn fence(&self, what: &str) -> i64 {
        let at_us = now_us();
        let fence_at_us = at_us
            .saturating_add(i64::try_from(self.ctx.lease_left().as_micros()).unwrap_or(i64::MAX));
        if let Some(j) = &self.journal {
            j.write(&JournalLine::Fence {
                job_id: self.job_id,
                claim: self.ctx.claim_id().to_string(),
                what: what.into(),
                at_us,
                fence_at_us,
            });
        }
        fence_at_us
    }
}

impl Drop for ExecutionGuard {
    fn drop(&mut self) {
        self.fence("end");
        if let Some(j) = &self.journal {
            j.write(&JournalLine::End {
                job_id: self.job_id,
                attempt: self.attempt,
                claim: self.ctx.claim_id().to_string(),
                started_at_us: self.started_at_us,
                ended_at_us: now_us(),
                returned: self.returned,
            });
        }
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Retries a side-table write until it succeeds, the handler is told to stop, or
/// [`RECORD_FOR`] passes (the database is down longer than any lease, so the attempt is
/// lost anyway; failing it makes the give-up visible in the job's errors).
async fn record<T, F, Fut>(ctx: &JobContext, what: &str, mut op: F) -> Result<T, JobError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = side::SideResult<T>>,
{
    let give_up = Instant::now() + RECORD_FOR;
    loop {
        let err = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if Instant::now() >= give_up {
            return Err(
                JobError::retry(format!("could not record the {what}: {err}")).with_code("record"),
            );
        }
        tokio::select! {
            () = ctx.cancelled() => {
                return Err(JobError::retry(format!("stopped while recording the {what}")));
            }
            () = tokio::time::sleep(RECORD_RETRY) => {}
        }
    }
}

impl JobHandler for Crashy {
    type Payload = Value;

    async fn run(&self, payload: Value, ctx: JobContext) -> JobResult {
        let started = now_us();
        // The runtime set the deadline to its start stamp plus the job's timeout.
        let runtime_started = payload["timeout_ms"].as_i64().map(|ms| {
            ctx.deadline
                .timestamp_micros()
                .saturating_sub(ms.saturating_mul(1000))
        });
        let job_id = ctx.id.0;
        let attempt = i32::try_from(ctx.attempt).unwrap_or(i32::MAX);
        let claim = ctx.claim_id().to_string();
        self.live.fetch_add(1, Ordering::SeqCst);
        let mut guard = ExecutionGuard {
            journal: self.journal.clone(),
            live: self.live.clone(),
            job_id,
            attempt,
            started_at_us: started,
            returned: false,
            ctx: ctx.clone(),
        };
        let mut fence_at = guard.fence("start");
        if let Some(j) = &self.journal {
            j.write(&JournalLine::Start {
                job_id,
                attempt,
                claim: claim.clone(),
                started_at_us: started,
                runtime_started_at_us: runtime_started,
            });
        }
        record(&ctx, "start", || {
            self.side.record_start(
                job_id,
                attempt,
                &claim,
                &self.node,
                started,
                runtime_started,
                true,
            )
        })
        .await?;
        // Works in steps of at most FENCE_CHECK, journaling the fence point whenever a
        // renewal moved it, so the journal always knows it within a step.
        let work_until = Instant::now() + self.work_time(&payload);
        loop {
            let left = work_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::select! {
                () = ctx.cancelled() => {
                    return Err(JobError::retry("stopped while working"));
                }
                () = tokio::time::sleep(left.min(FENCE_CHECK)) => {}
            }
            let now_fence = now_us()
                .saturating_add(i64::try_from(ctx.lease_left().as_micros()).unwrap_or(i64::MAX));
            if now_fence > fence_at + 1_000 {
                fence_at = guard.fence("seen");
            }
        }
        if payload["fail_first"].as_bool() == Some(true) && attempt == 1 {
            // A planned failure, to be retried: its end is journaled by the guard (the
            // execution did not complete).
            return Err(
                JobError::retry("a planned failure of the first attempt").with_code("planned")
            );
        }
        let ended = now_us();
        let found = record(&ctx, "completion", || {
            self.side
                .record_completion(job_id, attempt, &self.node, started, ended)
        })
        .await?;
        if !found {
            return Err(JobError::retry(format!(
                "the start row of job {job_id} attempt {attempt} on {} is missing",
                self.node
            ))
            .with_code("record"));
        }
        let result = json!({ "node": self.node, "attempt": attempt, "claim": claim });
        if payload["effect"].as_bool() == Some(true) {
            // The business row and the job's success commit together, or neither does.
            let sql = format!(
                "INSERT INTO crash_effects (job_id, attempt, claim, node) \
                 VALUES ({job_id}, {attempt}, '{claim}', '{}')",
                self.node
            );
            // Tried again while the database does not answer (a restart), as the side-table
            // writes are; a lost lease ends the attempt.
            let give_up = Instant::now() + RECORD_FOR;
            loop {
                let err = match match self.backend {
                    Backend::Postgres => complete_with_row!(ctx, AsyncPgConnection, sql, result),
                    Backend::Mysql => complete_with_row!(ctx, AsyncMysqlConnection, sql, result),
                    Backend::Sqlite => complete_with_row!(ctx, SqliteJobConnection, sql, result),
                } {
                    Ok(outcome) => {
                        guard.returned = true;
                        return Ok(outcome);
                    }
                    Err(e @ TxError::LeaseLost) => return Err(e.into_job_error()),
                    Err(e) => e,
                };
                if Instant::now() >= give_up {
                    return Err(err.into_job_error());
                }
                tokio::select! {
                    () = ctx.cancelled() => {
                        return Err(JobError::retry("stopped while completing in a transaction"));
                    }
                    () = tokio::time::sleep(RECORD_RETRY) => {}
                }
            }
        }
        guard.returned = true;
        JobOutcome::success(result)
    }
}

/// One [`Crashy`] registered for several kinds.
#[derive(Debug)]
struct Shared(Arc<Crashy>);

impl JobHandler for Shared {
    type Payload = Value;

    async fn run(&self, payload: Value, ctx: JobContext) -> JobResult {
        self.0.run(payload, ctx).await
    }
}

#[actix::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("crash_node: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("crash_node: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Opens the store, retrying while the server does not answer (a replacement node may start
/// while the database restarts).
async fn connect(url: &str) -> Result<Store, String> {
    let until = Instant::now() + CONNECT_FOR;
    loop {
        let opts = StoreOptions::default().connect_timeout(Duration::from_secs(2));
        match Store::connect_with(url, opts).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= until => {
                return Err(format!("cannot open the store after {CONNECT_FOR:?}: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The timeline line for an event (see `JournalLine::At`), stamped now.
fn timeline(e: &Event) -> Option<JournalLine> {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let (what, a, b) = match e {
        Event::Claimed { id, attempt, .. } => ("claimed".to_string(), id.0, i64::from(*attempt)),
        Event::Finished {
            id, attempt, state, ..
        } => (format!("finished_{state}"), id.0, i64::from(*attempt)),
        Event::LeasesRenewed { renewed, lost } => ("renewed".into(), count(*renewed), count(*lost)),
        Event::LeaseLost { id, .. } => ("lease_lost".into(), id.0, 0),
        Event::SelfFenced { id, .. } => ("self_fenced".into(), id.0, 0),
        Event::Started { id, attempt, .. } => ("started".into(), id.0, i64::from(*attempt)),
        Event::Dropped { id, .. } => ("dropped".into(), id.0, 0),
        Event::TimedOut { id, .. } => ("timed_out".into(), id.0, 0),
        Event::Reclaimed { id, .. } => ("reclaimed".into(), id.0, 0),
        Event::PauseDetected { late_by } => (
            "pause_detected".into(),
            i64::try_from(late_by.as_micros()).unwrap_or(i64::MAX),
            0,
        ),
        Event::LeaderElected { term } => ("leader_elected".into(), to_i64(*term), 0),
        Event::LeaderLost { term, .. } => ("leader_lost".into(), to_i64(*term), 0),
        Event::Reconciled {
            expected,
            recreated,
            ..
        } => ("reconciled".into(), count(*expected), count(*recreated)),
        Event::ReconcileFailed { failures, .. } => {
            ("reconcile_failed".into(), i64::from(*failures), 0)
        }
        _ => return None,
    };
    Some(JournalLine::At {
        at_us: now_us(),
        what,
        a,
        b,
    })
}

async fn run(a: Args) -> Result<ExitCode, String> {
    let journal = match &a.journal {
        Some(p) => {
            Some(Arc::new(Journal::open(p).map_err(|e| {
                format!("cannot open journal {}: {e}", p.display())
            })?))
        }
        None => None,
    };
    let store = connect(&a.url).await?;
    let backend = store.backend();
    let workers: u32 = a.queues.iter().map(|q| q.concurrency).sum();
    let side = SideDb::open(&a.url, workers + 2)?;
    let until = Instant::now() + CONNECT_FOR;
    while let Err(e) = side.create_tables().await {
        if Instant::now() >= until {
            return Err(format!("cannot create the side tables: {e}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let live = Arc::new(AtomicUsize::new(0));
    let seed = u64::try_from(now_us()).unwrap_or_default() ^ u64::from(std::process::id());
    let handler = Crashy {
        node: a.node.clone(),
        side,
        journal: journal.clone(),
        live: live.clone(),
        max_work_ms: a.max_work_ms,
        rng: AtomicU64::new(seed),
        backend,
    };
    let mut config = SchedulerConfig::default();
    if !a.defaults {
        config = config
            .lease(a.lease)
            .renew_every(a.renew_every)
            .sweep_every(a.sweep_every)
            .deadline_check_every(a.deadline_check_every);
    }
    let mut config = config
        .retry(RetryPolicy::fixed(Duration::from_millis(100)))
        .shutdown_timeout(a.shutdown_wait)
        .handler_threads(2);
    if let Some(l) = a.leader_lease {
        config = config.leader_lease(l);
    }
    let node = NodeId::new(a.node.clone()).map_err(|e| e.to_string())?;
    let mut builder = Scheduler::builder(store).config(config).node_id(node);
    for q in &a.queues {
        let mut qc = QueueConfig::default().concurrency(q.concurrency);
        if !a.defaults {
            qc = qc.poll_interval(a.poll);
        }
        if let Some(p) = q.prefetch {
            qc = qc.prefetch(p);
        }
        builder = builder.queue(q.name.clone(), qc);
    }
    let handler = Arc::new(handler);
    for kind in &a.kinds {
        builder = builder.handler(kind.clone(), Shared(handler.clone()));
    }
    if let Some(every) = a.schedule {
        builder = builder.periodic(
            Schedule::every(
                "crash-tick",
                every,
                NewJob::new("tick", json!({})).queue(PERIODIC_QUEUE),
            )
            .missed(MissedFires::All { max: 1_000 }),
        );
    }
    if let Some(every) = a.reconcile {
        let side = Arc::new(SideDb::open(&a.url, 2)?);
        builder = builder.reconciler("crash-wanted", every, move |_client| {
            let side = side.clone();
            async move {
                let wanted = side.wanted().await?;
                Ok::<_, String>(
                    wanted
                        .into_iter()
                        .map(|(key, _)| {
                            NewJob::new("wanted", json!({}))
                                .queue(PERIODIC_QUEUE)
                                .unique_key(key)
                        })
                        .collect(),
                )
            }
        });
    }
    let sched = builder.start().map_err(|e| e.to_string())?;

    if let Some(j) = journal.clone() {
        let mut events = sched.events();
        actix::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let event = events.recv().await;
                if let Ok(e) = &event {
                    if let Some(line) = timeline(e) {
                        j.write(&line);
                    }
                }
                let (what, n) = match event {
                    Ok(Event::Claimed { id, attempt, .. }) => {
                        j.write(&JournalLine::Claim {
                            job_id: id.0,
                            attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
                            at_us: now_us(),
                        });
                        continue;
                    }
                    Ok(Event::LeaseLost { id, .. }) => ("lease_lost", id.0),
                    Ok(Event::SelfFenced { id, .. }) => ("self_fenced", id.0),
                    Ok(Event::Reclaimed { id, .. }) => ("reclaimed", id.0),
                    Ok(_) => continue,
                    Err(RecvError::Lagged(n)) => ("lagged", i64::try_from(n).unwrap_or(-1)),
                    Err(RecvError::Closed) => break,
                };
                j.write(&JournalLine::Event {
                    what: what.into(),
                    n,
                });
            }
        });
    }

    // Run until standard input is closed (the driver's signal to stop, or the driver died).
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        let _ = tx.send(());
    });
    let _ = rx.await;

    let report = sched.shutdown().await;
    // Handlers told to stop are dropped on the handler threads shortly after; wait for
    // their ends to be journaled before saying "exited".
    let until = Instant::now() + DRAIN_FOR;
    while live.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let still = live.load(Ordering::SeqCst);
    if let Some(j) = &journal {
        j.write(&JournalLine::Exit {
            at_us: now_us(),
            finished: u64::try_from(report.finished).unwrap_or(u64::MAX),
            released: u64::try_from(report.released).unwrap_or(u64::MAX),
        });
        if j.failed.load(Ordering::SeqCst) {
            return Ok(ExitCode::from(3));
        }
    }
    if still > 0 {
        return Err(format!(
            "{still} handler(s) still running {DRAIN_FOR:?} after shutdown"
        ));
    }
    Ok(ExitCode::SUCCESS)
}
