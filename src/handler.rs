//! What users implement: a [`JobHandler`] per job kind, the [`JobContext`] it receives, and
//! the [`JobOutcome`] / [`JobError`] it returns, whose constructors say what happens next.
//!
//! Handlers never see the store or the lease: the runtime claims, renews and finalizes for
//! them. They may be plain async functions via [`handler_fn`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::job::{JobFailure, JobId};

/// Boxed future returned by erased handlers.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Everything a handler knows about the attempt it runs.
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
    cancel: CancellationToken,
}

impl JobContext {
    pub(crate) fn new(
        job: &crate::job::Job,
        deadline: DateTime<Utc>,
        cancel: CancellationToken,
    ) -> Self {
        JobContext {
            id: job.id,
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            payload: job.payload.clone(),
            attempt: job.attempts,
            max_attempts: job.max_attempts,
            deadline,
            cancel,
        }
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

    /// A context for calling a handler directly in a unit test.
    pub fn for_test(id: JobId, kind: &str, payload: Value, attempt: u32) -> Self {
        JobContext {
            id,
            kind: kind.to_string(),
            queue: crate::job::DEFAULT_QUEUE.to_string(),
            payload,
            attempt,
            max_attempts: crate::job::DEFAULT_MAX_ATTEMPTS,
            deadline: Utc::now() + chrono::Duration::minutes(30),
            cancel: CancellationToken::new(),
        }
    }
}

/// A handler's success.
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
    pub fn success<T: Serialize>(result: T) -> Result<JobOutcome, JobError> {
        serde_json::to_value(result)
            .map(JobOutcome::Succeeded)
            .map_err(|e| JobError::fail(format!("the handler's result is not JSON: {e}")))
    }

    /// Done, with no result (`null`).
    pub fn done() -> JobOutcome {
        JobOutcome::Succeeded(Value::Null)
    }

    /// Run again after `d`, the attempt not counted.
    pub fn snooze(d: Duration) -> JobOutcome {
        JobOutcome::Snooze(d)
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

/// A handler's failure, saying what happens next. Any `std::error::Error` converts into a
/// retryable one, so `?` works in handlers.
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

impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::retry(e)
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
            let payload: H::Payload = serde_json::from_value(ctx.payload.clone()).map_err(|e| {
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
