//! What users implement: a [`JobHandler`] per job kind, the [`JobContext`] it receives, and
//! the [`JobOutcome`] / [`JobError`] it returns, whose constructors say what happens next.
//!
//! Handlers never see the lease: the runtime claims, renews and finalizes for them — or
//! a handler completes its job in its own transaction on the job's store, fenced by the
//! lease (`handler_tx.rs`). They may be plain async functions via [`handler_fn`].
//!
//! Handlers run on the scheduler's handler runtime: a multi-threaded tokio runtime of its
//! own (threads named `jobvisor-handler`), whether the application runs actix or plain tokio.
//! `tokio::spawn` works there; actix APIs (`actix::spawn`, actors) do not. Follow-up jobs are
//! enqueued through [`JobContext::client`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Deserialize as _;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::clock::Clock;
use crate::job::{JobFailure, JobId};
use crate::lease::{ClaimId, LeaseToken};
use crate::scheduler::Attempt;

/// Boxed future returned by erased handlers.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Everything a handler knows about the attempt it runs, and the node's [`Client`] for
/// follow-up work.
///
/// # Examples
/// ```
/// use jobvisor::{handler_fn, JobContext, JobOutcome, NewJob};
///
/// // A handler that enqueues the next step of a pipeline.
/// let fetch = handler_fn(|url: String, ctx: JobContext| async move {
///     let page = format!("<html>{url}</html>"); // ... fetch it ...
///     ctx.client()?
///         .enqueue(NewJob::new("parse", serde_json::json!({ "page": page })))
///         .await?;
///     JobOutcome::done()
/// });
/// # let _ = fetch;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobContext {
    /// The job.
    pub id: JobId,
    /// Its kind.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Its raw JSON arguments.
    pub payload: Value,
    /// This attempt, 1-based.
    pub attempt: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// When this attempt will be stopped for running too long (the runtime's clock).
    pub deadline: DateTime<Utc>,
    /// The progress the job had when this attempt was claimed: what an earlier attempt last
    /// reported with [`JobContext::progress`] (`None` on a first attempt, or if none did). A
    /// retry can resume from it — a checkpoint.
    pub last_progress: Option<Value>,
    /// The attempt's lease token: its transactions present it (`handler_tx.rs`). Redacted in
    /// `Debug`.
    token: LeaseToken,
    cancel: CancellationToken,
    client: Option<Client>,
    progress: Arc<Attempt>,
    /// The node's clock, on which the attempt's fence point is kept.
    clock: Arc<dyn Clock>,
}

impl JobContext {
    /// The context of `job`'s attempt; takes the job's names, payload, progress and token.
    pub(crate) fn new(
        job: crate::store::ClaimedJob,
        deadline: DateTime<Utc>,
        cancel: CancellationToken,
        client: Client,
        attempt: Arc<Attempt>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        JobContext {
            id: job.id,
            kind: job.kind,
            queue: job.queue,
            payload: job.payload,
            attempt: job.attempts,
            max_attempts: job.max_attempts,
            deadline,
            last_progress: job.progress,
            token: job.token,
            cancel,
            client: Some(client),
            progress: attempt,
            clock,
        }
    }

    /// How long this attempt may still run, as its node reckons it now: the time left to its
    /// **fence point**, where the node stops the handler unless a renewal has moved it on
    /// (every `SchedulerConfig::renew_every`; the fence point is the send time of the last
    /// applied renewal, or of the claim, plus the lease, minus a sixth of the lease, at most
    /// 5 s — ARCHITECTURE.md §6, invariant 9). Zero once it has passed. Healthy renewals keep
    /// it near the lease; a handler that sees it fall (the database is unreachable) can
    /// checkpoint with [`progress`](Self::progress) while it still counts.
    pub fn lease_left(&self) -> std::time::Duration {
        let left = self
            .progress
            .fence_at_us()
            .saturating_sub(crate::scheduler::micros(self.clock.monotonic()));
        std::time::Duration::from_micros(u64::try_from(left).unwrap_or(0))
    }

    /// This attempt's claim: unique per claim, the same for everything the attempt does.
    /// [`attempt`](Self::attempt) counts only claims whose handler started, so a job given
    /// back unstarted and claimed again runs "attempt 1" twice — under two claim ids. Put it
    /// in your own logs and records to tell executions apart; jobvisor puts it in the job's
    /// span (`jobvisor.claim`), its events and its error entries ([`JobFailure::claim`]).
    ///
    /// [`JobFailure::claim`]: crate::JobFailure::claim
    pub fn claim_id(&self) -> ClaimId {
        self.token.claim()
    }

    /// The attempt's lease token (a handler's transaction presents it).
    pub(crate) fn lease_token(&self) -> &LeaseToken {
        &self.token
    }

    /// The attempt's start gate and fence point, shared with the lease manager.
    pub(crate) fn attempt_gate(&self) -> &Attempt {
        &self.progress
    }

    /// The node's clock.
    pub(crate) fn node_clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The node's client, if the context has one.
    pub(crate) fn client_opt(&self) -> Option<&Client> {
        self.client.as_ref()
    }

    /// Reports how far the handler got: any JSON-serializable value (a percentage, a
    /// cursor, a checkpoint to resume from), at most [`MAX_PROGRESS_BYTES`] as JSON. Only the
    /// latest report counts, and it costs no statement of its own: the node writes it with
    /// its next lease renewal (every `SchedulerConfig::renew_every`), guarded by this
    /// attempt's lease like every write of a holder — a handler whose lease is gone cannot
    /// write it. It is then visible in [`Job::progress`](crate::Job::progress) (`Client::get`,
    /// `jobvisor get`), kept when the attempt ends, and given to the next attempt as
    /// [`JobContext::last_progress`]. A report made in the last moments before the handler
    /// returns may not be written (the job's result and state are).
    ///
    /// # Errors
    /// A permanent [`JobError`] (code `bad_progress`) if the value is not JSON or is larger
    /// than [`MAX_PROGRESS_BYTES`]; nothing is reported then.
    ///
    /// # Examples
    /// ```
    /// use jobvisor::{handler_fn, JobContext, JobOutcome};
    ///
    /// let import = handler_fn(|rows: Vec<String>, ctx: JobContext| async move {
    ///     // Resume after the last checkpoint an earlier attempt reported.
    ///     let start = ctx.last_progress.as_ref().and_then(|p| p["done"].as_u64()).unwrap_or(0);
    ///     for (i, _row) in rows.iter().enumerate().skip(start as usize) {
    ///         // ... import the row (idempotently) ...
    ///         ctx.progress(serde_json::json!({ "done": i + 1, "of": rows.len() }))?;
    ///     }
    ///     JobOutcome::done()
    /// });
    /// # let _ = import;
    /// ```
    pub fn progress<T: Serialize>(&self, value: T) -> Result<(), JobError> {
        let json = serde_json::to_string(&value).map_err(|e| {
            JobError::fail(format!("the progress reported is not JSON: {e}"))
                .with_code("bad_progress")
        })?;
        if json.len() > MAX_PROGRESS_BYTES {
            return Err(JobError::fail(format!(
                "the progress reported is {} bytes of JSON; expected at most {MAX_PROGRESS_BYTES}",
                json.len()
            ))
            .with_code("bad_progress"));
        }
        self.progress.progress().report(json);
        Ok(())
    }

    /// The latest value given to [`JobContext::progress`] through this context (or a clone
    /// of it), written or not: for a handler's unit tests.
    pub fn reported_progress(&self) -> Option<Value> {
        self.progress
            .progress()
            .latest()
            .and_then(|json| serde_json::from_str(&json).ok())
    }

    /// The node's client, to enqueue follow-up jobs (or read others) from a handler; its
    /// enqueues wake this node's fetchers at once. Enqueued this way, a follow-up exists even
    /// if this attempt later fails: make the step idempotent (e.g. give the follow-up a
    /// [`unique_key`](crate::NewJob::unique_key) derived from this job's id).
    ///
    /// # Errors
    /// A [`JobError`] to retry with if the context was built by [`JobContext::for_test`]
    /// without [`JobContext::with_client`] (a handler run by a scheduler always has one).
    pub fn client(&self) -> Result<&Client, JobError> {
        self.client.as_ref().ok_or_else(|| {
            JobError::retry(
                "this JobContext has no client: it was built by JobContext::for_test; add one \
                 with .with_client(client)",
            )
            .with_code("no_client")
        })
    }

    /// The results of the parents this job waited for ([`NewJob::after`]): each parent's
    /// final state and, for one that succeeded, its result; typed with
    /// [`ParentResults::typed`]. One statement, when called (nothing is read otherwise); the
    /// parents' rows are read live or archived. A parent pruned from the archive is no longer
    /// listed. Example on [`ParentResults`].
    ///
    /// # Errors
    /// A permanent [`JobError`] (code `parent_results_too_large`) if the results together
    /// are more than the store's payload cap of JSON
    /// ([`StoreOptions::max_payload_bytes`](crate::StoreOptions::max_payload_bytes)); a
    /// retryable one if the database fails, or for a context without a client.
    ///
    /// [`NewJob::after`]: crate::NewJob::after
    /// [`ParentResults`]: crate::ParentResults
    /// [`ParentResults::typed`]: crate::ParentResults::typed
    pub async fn parent_results(&self) -> Result<crate::ParentResults, JobError> {
        let store = self.client()?.store();
        let max = store.options().max_payload_bytes;
        let rows = store.job_parent_results(self.id, max).await?;
        crate::ParentResults::new(rows, max)
    }

    /// Gives a test context a client (see [`JobContext::client`]).
    pub fn with_client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Completes when the job is cancelled, times out, loses its lease or the node shuts
    /// down: the handler should stop what it is doing and return.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// True once [`JobContext::cancelled`] would complete.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// A context for an attempt a test claimed itself (`job` as claimed, with its lease's
    /// token): its transactions run on `client`'s store, its clock is `clock`, and its fence
    /// point is `valid_for` from now on that clock (zero: already passed). The handler counts
    /// as started. Not a stable API: for jobvisor's own tests.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn for_claim(
        job: &crate::store::ClaimedJob,
        client: Client,
        clock: Arc<dyn Clock>,
        valid_for: Duration,
    ) -> Self {
        let now = clock.monotonic();
        let attempt = Arc::new(Attempt::new(now + valid_for));
        attempt.try_start(now);
        JobContext::new(
            job.clone(),
            Utc::now() + chrono::Duration::minutes(30),
            CancellationToken::new(),
            client,
            attempt,
            clock,
        )
    }

    /// A context for calling a handler directly in a unit test (no database, no feature
    /// needed): queue `default`, [`DEFAULT_MAX_ATTEMPTS`](crate::job::DEFAULT_MAX_ATTEMPTS),
    /// a deadline 30 minutes away, never cancelled, no client (add one with
    /// [`JobContext::with_client`]). A stable part of the testing surface
    /// (the `testing` module, feature `test-util`, has the rest).
    ///
    /// ```
    /// # async fn demo() {
    /// use jobvisor::{handler_fn, JobContext, JobHandler, JobId, JobOutcome};
    /// let h = handler_fn(|n: u32, _ctx: JobContext| async move { JobOutcome::success(n * 2) });
    /// let ctx = JobContext::for_test(JobId(1), "double", serde_json::json!(21), 1);
    /// assert!(h.run(21, ctx).await.is_ok());
    /// # }
    /// ```
    pub fn for_test(id: JobId, kind: &str, payload: Value, attempt: u32) -> Self {
        JobContext {
            id,
            kind: kind.to_string(),
            queue: crate::job::DEFAULT_QUEUE.to_string(),
            payload,
            attempt,
            max_attempts: crate::job::DEFAULT_MAX_ATTEMPTS,
            deadline: Utc::now() + chrono::Duration::minutes(30),
            last_progress: None,
            token: LeaseToken::generate(),
            cancel: CancellationToken::new(),
            client: None,
            progress: Arc::new(Attempt::new(Duration::MAX)),
            clock: Arc::new(crate::clock::SystemClock),
        }
    }
}

/// The largest progress report [`JobContext::progress`] takes, as JSON: 64 KiB. Progress is
/// rewritten with every renewal that carries a new report; keep it small (a counter, a
/// cursor), and put large output in the job's result.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// A handler's success: what [`JobResult`]'s `Ok` holds. Build it with
/// [`JobOutcome::success`], [`JobOutcome::done`] or [`JobOutcome::snooze`], which all return
/// a [`JobResult`], so each is a handler's whole answer as it stands.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::{JobOutcome, JobResult};
///
/// fn answer(ready: bool, count: u32) -> JobResult {
///     if !ready {
///         return JobOutcome::snooze(Duration::from_secs(30)); // no attempt used
///     }
///     if count == 0 {
///         return JobOutcome::done(); // result: null
///     }
///     JobOutcome::success(count) // result: the count
/// }
/// assert!(answer(true, 3).is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    /// Done; the value is stored as the job's result.
    Succeeded(Value),
    /// Not now: run again after this long without using an attempt.
    Snooze(Duration),
}

impl JobOutcome {
    /// Done with `result` (anything serializable). A value that cannot be represented as JSON
    /// fails the job permanently, naming the problem.
    pub fn success<T: Serialize>(result: T) -> JobResult {
        serde_json::to_value(result)
            .map(JobOutcome::Succeeded)
            .map_err(|e| JobError::fail(format!("the handler's result is not JSON: {e}")))
    }

    /// Done, with no result (`null`).
    pub fn done() -> JobResult {
        Ok(JobOutcome::Succeeded(Value::Null))
    }

    /// Run again after `d`, the attempt not counted.
    pub fn snooze(d: Duration) -> JobResult {
        Ok(JobOutcome::Snooze(d))
    }
}

/// What a failed attempt asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Retry, after the retry policy's backoff unless a delay is given.
    Retry(Option<Duration>),
    /// Do not retry: the job is dead.
    Fail,
}

/// A handler's failure, saying what happens next.
///
/// Anything that converts into `Box<dyn Error + Send + Sync>` converts into a retryable
/// `JobError`, so `?` works in handlers on: any `std::error::Error + Send + Sync` type,
/// `Box<dyn Error + Send + Sync>` itself, `anyhow::Error` (no feature needed: anyhow provides
/// that conversion), `String` and `&str`. The message keeps the error's chain of causes
/// (`outer: inner: root`).
///
/// # Examples
/// ```
/// use jobvisor::{JobError, JobOutcome, JobResult};
///
/// fn parse(text: &str) -> JobResult {
///     let n: u32 = text.parse()?; // ParseIntError -> retry
///     let boxed: Result<(), Box<dyn std::error::Error + Send + Sync>> = Ok(());
///     boxed?; // Box<dyn Error + Send + Sync> -> retry
///     if n == 0 {
///         return Err(JobError::fail("zero is not a valid count")); // dead at once
///     }
///     JobOutcome::success(n)
/// }
/// assert_eq!(parse("x").unwrap_err().code, "error");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct JobError {
    /// Retry or fail.
    pub next: Next,
    /// Machine-readable code (default `error`).
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// Optional structured detail.
    pub detail: Option<Value>,
}

impl JobError {
    /// A failure to retry with the policy's backoff.
    pub fn retry(message: impl fmt::Display) -> Self {
        JobError {
            next: Next::Retry(None),
            code: "error".into(),
            message: message.to_string(),
            detail: None,
        }
    }

    /// A failure to retry after exactly `after`.
    pub fn retry_after(message: impl fmt::Display, after: Duration) -> Self {
        JobError {
            next: Next::Retry(Some(after)),
            ..JobError::retry(message)
        }
    }

    /// A permanent failure: the job is dead, whatever attempts remain.
    pub fn fail(message: impl fmt::Display) -> Self {
        JobError {
            next: Next::Fail,
            ..JobError::retry(message)
        }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = code.into();
        self
    }

    /// Adds structured detail.
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    pub(crate) fn to_failure(&self, attempt: u32, at: DateTime<Utc>) -> JobFailure {
        let f = JobFailure::new(self.code.clone(), self.message.clone(), attempt).at(at);
        match &self.detail {
            Some(d) => f.with_detail(d.clone()),
            None => f,
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Any error becomes a retryable failure (so `?` works in a handler): its message, then each
/// cause its `source()` chain gives, joined by `: `; the causes are also kept one an entry in
/// the failure's `detail`, `{"causes": [..]}`, outermost first (no `detail` without a cause).
impl<E> From<E> for JobError
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn from(e: E) -> Self {
        let e: Box<dyn std::error::Error + Send + Sync + 'static> = e.into();
        let mut message = e.to_string();
        let mut causes = Vec::new();
        let mut source = e.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            // Some errors repeat their cause in their own message: say it once.
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            causes.push(Value::String(text));
            source = cause.source();
        }
        let err = JobError::retry(message);
        if causes.is_empty() {
            err
        } else {
            // The chain one cause an entry, outermost first, as `source()` gave it.
            err.with_detail(serde_json::json!({ "causes": causes }))
        }
    }
}

/// What a handler returns.
pub type JobResult = Result<JobOutcome, JobError>;

/// The code for job kinds: one implementation per kind, registered on the scheduler.
///
/// `Payload` is deserialized from the job's JSON (use `serde_json::Value` for the raw form);
/// a payload that does not deserialize fails the job permanently with code `bad_payload`.
///
/// # Examples
/// ```
/// use jobvisor::{JobContext, JobHandler, JobOutcome, JobResult};
///
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
///
/// struct SendEmail;
///
/// impl JobHandler for SendEmail {
///     type Payload = Email;
///     async fn run(&self, email: Email, _ctx: JobContext) -> JobResult {
///         // ... send it ...
///         JobOutcome::success(format!("sent to {}", email.to))
///     }
/// }
/// ```
pub trait JobHandler: Send + Sync + 'static {
    /// The job's arguments.
    type Payload: DeserializeOwned + Send + 'static;

    /// Runs one attempt.
    fn run(
        &self,
        payload: Self::Payload,
        ctx: JobContext,
    ) -> impl Future<Output = JobResult> + Send;
}

/// A handler made from an async function `Fn(Payload, JobContext) -> Future<JobResult>`.
pub fn handler_fn<P, F, Fut>(f: F) -> FnHandler<P, F>
where
    P: DeserializeOwned + Send + 'static,
    F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    FnHandler {
        f,
        _p: std::marker::PhantomData,
    }
}

/// See [`handler_fn`].
pub struct FnHandler<P, F> {
    f: F,
    _p: std::marker::PhantomData<fn() -> P>,
}

impl<P, F> fmt::Debug for FnHandler<P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnHandler")
    }
}

impl<P, F, Fut> JobHandler for FnHandler<P, F>
where
    P: DeserializeOwned + Send + 'static,
    F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    type Payload = P;

    fn run(&self, payload: P, ctx: JobContext) -> impl Future<Output = JobResult> + Send {
        (self.f)(payload, ctx)
    }
}

/// A handler with its payload type erased, as the runtime stores it.
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    fn call(self: Arc<Self>, ctx: JobContext) -> BoxFuture<JobResult>;
}

pub(crate) struct Erased<H>(pub(crate) H);

impl<H: JobHandler> ErasedHandler for Erased<H> {
    fn call(self: Arc<Self>, ctx: JobContext) -> BoxFuture<JobResult> {
        Box::pin(async move {
            // Read in place: the context keeps the payload (handlers may read it too), and a
            // clone of it would copy the whole tree once per job.
            let payload = H::Payload::deserialize(&ctx.payload).map_err(|e| {
                JobError::fail(format!(
                    "payload does not match what the {} handler expects: {e}",
                    ctx.kind
                ))
                .with_code("bad_payload")
            })?;
            self.0.run(payload, ctx).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An error with two causes, the inner one repeated in the middle one's message.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn an_errors_cause_chain_is_kept_in_its_detail() {
        let inner = Layer("connection refused", None);
        let middle = Layer(
            "cannot reach the mail server: connection refused",
            Some(Box::new(inner)),
        );
        let e = JobError::from(Layer("sending the receipt", Some(Box::new(middle))));
        assert_eq!(
            e.message,
            "sending the receipt: cannot reach the mail server: connection refused"
        );
        assert_eq!(
            e.detail,
            Some(json!({"causes": [
                "cannot reach the mail server: connection refused",
                "connection refused",
            ]}))
        );
        let f = e.to_failure(1, Utc::now());
        assert_eq!(f.detail.unwrap()["causes"][1], "connection refused");
        // Without a cause there is no detail.
        assert_eq!(JobError::from(Layer("alone", None)).detail, None);
    }

    #[test]
    fn bad_progress_is_refused_naming_the_problem_and_reports_nothing() {
        let ctx = JobContext::for_test(JobId(1), "k", json!({}), 1);
        ctx.progress(json!({"done": 1})).unwrap();
        let big = "x".repeat(MAX_PROGRESS_BYTES);
        let e = ctx.progress(&big).unwrap_err();
        assert_eq!(e.code, "bad_progress");
        assert!(
            e.message.contains(&format!("at most {MAX_PROGRESS_BYTES}")),
            "{}",
            e.message
        );
        // Not JSON: a map with non-string keys.
        let odd: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = ctx.progress(odd).unwrap_err();
        assert_eq!(e.code, "bad_progress");
        assert!(e.message.contains("not JSON"), "{}", e.message);
        assert_eq!(
            ctx.reported_progress(),
            Some(json!({"done": 1})),
            "unchanged"
        );
        // Clones of the context report to the same attempt.
        let copy = ctx.clone();
        copy.progress(2).unwrap();
        drop(copy);
        assert_eq!(ctx.reported_progress(), Some(json!(2)));
    }

    #[tokio::test]
    async fn typed_payloads_are_checked_before_the_handler_runs() {
        #[derive(serde::Deserialize)]
        struct P {
            n: u32,
        }
        let h: Arc<dyn ErasedHandler> = Arc::new(Erased(handler_fn(|p: P, _ctx| async move {
            JobOutcome::success(p.n * 2)
        })));
        let ok = h
            .clone()
            .call(JobContext::for_test(
                JobId(1),
                "double",
                json!({"n": 21}),
                1,
            ))
            .await;
        assert_eq!(ok, Ok(JobOutcome::Succeeded(json!(42))));
        let bad = h
            .call(JobContext::for_test(
                JobId(1),
                "double",
                json!({"n": "x"}),
                1,
            ))
            .await
            .unwrap_err();
        assert_eq!((bad.next, bad.code.as_str()), (Next::Fail, "bad_payload"));
        assert!(bad.message.contains("double"), "{bad}");
    }

    /// `?` compiles in a handler on each error type users meet, and keeps the causes.
    #[test]
    fn question_mark_converts_every_common_error() {
        fn std_error() -> Result<i32, JobError> {
            Ok("x".parse::<i32>()?)
        }
        fn io_error() -> Result<(), JobError> {
            Err(std::io::Error::other("disk full"))?
        }
        fn boxed() -> Result<(), JobError> {
            let e: Box<dyn std::error::Error + Send + Sync> = "boxed failure".into();
            Err(e)?
        }
        fn boxed_from_a_function() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            Err(std::io::Error::other("inner").into())
        }
        fn boxed_question_mark() -> Result<(), JobError> {
            boxed_from_a_function()?;
            Ok(())
        }
        fn anyhow_error() -> Result<(), JobError> {
            use anyhow::Context as _;
            let r: Result<(), std::io::Error> = Err(std::io::Error::other("connection reset"));
            r.context("calling the mail API")?;
            Ok(())
        }
        fn anyhow_bail() -> Result<(), JobError> {
            let r: anyhow::Result<()> = Err(anyhow::anyhow!("plain anyhow"));
            r?;
            Ok(())
        }
        fn text() -> Result<(), JobError> {
            Err(String::from("a string"))?
        }
        fn handler_result() -> JobResult {
            std_error()?;
            JobOutcome::done()
        }
        let msg = |r: Result<(), JobError>| {
            let e = r.unwrap_err();
            assert_eq!((e.next, e.code.as_str()), (Next::Retry(None), "error"));
            e.message
        };
        assert!(std_error().unwrap_err().message.contains("invalid digit"));
        assert_eq!(msg(io_error()), "disk full");
        assert_eq!(msg(boxed()), "boxed failure");
        assert_eq!(msg(boxed_question_mark()), "inner");
        assert_eq!(
            msg(anyhow_error()),
            "calling the mail API: connection reset",
            "the cause is kept"
        );
        assert_eq!(msg(anyhow_bail()), "plain anyhow");
        assert_eq!(msg(text()), "a string");
        assert_eq!(handler_result().unwrap_err().next, Next::Retry(None));
    }

    #[test]
    fn success_done_and_snooze_are_one_type() {
        let answers: [JobResult; 3] = [
            JobOutcome::success(1),
            JobOutcome::done(),
            JobOutcome::snooze(Duration::from_secs(5)),
        ];
        assert_eq!(
            answers,
            [
                Ok(JobOutcome::Succeeded(json!(1))),
                Ok(JobOutcome::Succeeded(Value::Null)),
                Ok(JobOutcome::Snooze(Duration::from_secs(5))),
            ]
        );
        let tuple_keys = std::collections::BTreeMap::from([((1, 2), 3)]);
        let not_json = JobOutcome::success(tuple_keys).unwrap_err();
        assert_eq!(not_json.next, Next::Fail);
        assert!(not_json.message.contains("not JSON"), "{not_json}");
    }

    #[test]
    fn any_error_converts_to_a_retry() {
        fn parse(s: &str) -> Result<i32, JobError> {
            Ok(s.parse::<i32>()?)
        }
        let e = parse("x").unwrap_err();
        assert_eq!(e.next, Next::Retry(None));
        assert_eq!(JobError::fail("no").next, Next::Fail);
        assert_eq!(
            JobError::retry_after("later", Duration::from_secs(3)).next,
            Next::Retry(Some(Duration::from_secs(3)))
        );
    }
}
