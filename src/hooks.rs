//! [`JobHooks`]: the application's one layer around every enqueue and every handler run,
//! registered once ([`SchedulerBuilder::hooks`](crate::SchedulerBuilder::hooks) for a node,
//! [`Client::with_hooks`](crate::Client::with_hooks) for a client of its own) — what River's
//! hooks and middleware, Sidekiq's client and server middleware are to their users.
//!
//! * [`JobHooks::on_enqueue`] sees each job before it is written, once per job and per call,
//!   by every enqueue of [`Client`](crate::Client) (`enqueue`, `enqueue_many`, `enqueue_in`,
//!   `enqueue_batch` — its members and its callback —, `trigger_schedule`) and of a handler's
//!   transaction ([`JobTx::enqueue`](crate::JobTx::enqueue)) — so also a node's reconcilers,
//!   which enqueue through its client; not the jobs a schedule fires, which the leader inserts
//!   itself. It may rewrite the job, or refuse it: then nothing of the call is written and
//!   the call answers [`Error::Refused`]. Hooks run on every job of a
//!   call before any is written.
//! * [`JobHooks::around_run`] wraps each attempt whose handler starts, once: it gets the
//!   attempt as a [`Run`] (read its [`context`](Run::context), await it to run the handler,
//!   at most once since awaiting consumes it) and answers the attempt's result. Code before
//!   and after the await runs around the handler; a hook that answers without awaiting skips
//!   the handler and its answer is the attempt's. The hook runs inside the attempt's fence
//!   and timeout: an attempt stopped (fenced, timed out, cancelled past its grace, shut down)
//!   drops the hook's future with the handler's, so cleanup that must always run belongs in
//!   a guard's `Drop`. An attempt given back before its handler starts runs no hook.
//!
//! Panics are contained like a handler's: a handler's panic reaches the hook as the
//! attempt's `panic` error; a panic of `around_run` itself fails the attempt (code `panic`,
//! retried by the retry policy) with a message naming the hook's type; one of `on_enqueue`
//! answers [`Error::Refused`] naming it, and nothing is written.
//!
//! Without hooks nothing is added to the hot path: the node keeps `None` and calls the
//! handler as before (no box, no allocation).

use std::future::{Future, IntoFuture};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt as _;

use crate::error::{Error, Result};
use crate::handler::{BoxFuture, ErasedHandler, JobContext, JobResult};
use crate::job::NewJob;
use crate::scheduler::panic_error;

/// The application's layer around every enqueue and every handler run; both methods have
/// defaults that change nothing, so implement only the one you need. See the module docs
/// for when each runs.
///
/// # Examples
/// ```
/// use std::future::IntoFuture as _;
/// use std::time::Instant;
/// use jobvisor::hooks::{JobHooks, Run};
/// use jobvisor::{JobResult, NewJob};
///
/// struct Tenancy;
///
/// impl JobHooks for Tenancy {
///     fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String> {
///         // Refuse a job without a tenant; stamp the enqueue time into the payload.
///         if job.payload.get("tenant").is_none() {
///             return Err(format!("a {} job needs a \"tenant\" in its payload", job.kind));
///         }
///         job.payload["enqueued_by"] = serde_json::json!("web");
///         Ok(())
///     }
///
///     async fn around_run(&self, run: Run) -> JobResult {
///         let tenant = run.context().payload["tenant"].as_str().unwrap_or("").to_owned();
///         let span = tracing::info_span!("tenant", %tenant);
///         let t0 = Instant::now();
///         let result = tracing::Instrument::instrument(run.into_future(), span).await;
///         tracing::info!(ok = result.is_ok(), took = ?t0.elapsed(), "attempt ended");
///         result
///     }
/// }
///
/// # fn register(store: jobvisor::Store) {
/// // Once per node: its client, its handlers' enqueues and every attempt it runs.
/// let builder = jobvisor::Scheduler::builder(store.clone()).hooks(Tenancy);
/// // A client of its own (a web process) takes the same hooks.
/// let client = jobvisor::Client::new(store).with_hooks(Tenancy);
/// # let _ = (builder, client);
/// # }
/// ```
pub trait JobHooks: Send + Sync + 'static {
    /// Sees `job` before it is written: rewrite it (its payload, queue, priority, …) or
    /// refuse it with a reason (the caller gets [`Error::Refused`]
    /// and nothing of the call is written). Keep it quick and free of I/O: it runs inline
    /// in every enqueue. Default: accept unchanged.
    ///
    /// # Errors
    /// The reason the job is refused.
    fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String> {
        let _ = job;
        Ok(())
    }

    /// Wraps one attempt: await `run` (at most once) to run the handler, and answer the
    /// attempt's result — the handler's, or one of the hook's own. Default: run the
    /// handler.
    fn around_run(&self, run: Run) -> impl Future<Output = JobResult> + Send {
        run.into_future()
    }
}

/// One attempt as [`JobHooks::around_run`] gets it: its [`context`](Run::context), and the
/// handler, run by awaiting the `Run` (which consumes it: a handler runs at most once per
/// attempt). A handler's panic comes out as the attempt's `panic` error.
pub struct Run {
    handler: Arc<dyn ErasedHandler>,
    ctx: JobContext,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("ctx", &self.ctx).finish()
    }
}

impl Run {
    /// The attempt's context, as its handler will get it.
    pub fn context(&self) -> &JobContext {
        &self.ctx
    }
}

impl IntoFuture for Run {
    type Output = JobResult;
    type IntoFuture = Pin<Box<dyn Future<Output = JobResult> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        let handler = self.handler.call(self.ctx);
        Box::pin(async move {
            AssertUnwindSafe(handler)
                .catch_unwind()
                .await
                .unwrap_or_else(|payload| Err(panic_error(&*payload, "the handler")))
        })
    }
}

/// [`JobHooks`] with its future's type erased, as a node and a client keep it.
pub(crate) trait ErasedHooks: Send + Sync + 'static {
    /// The hooks' type name, for errors.
    fn name(&self) -> &'static str;
    fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String>;
    fn around_run(self: Arc<Self>, run: Run) -> BoxFuture<JobResult>;
}

struct Erased<H>(H);

impl<H: JobHooks> ErasedHooks for Erased<H> {
    fn name(&self) -> &'static str {
        std::any::type_name::<H>()
    }

    fn on_enqueue(&self, job: &mut NewJob) -> Result<(), String> {
        self.0.on_enqueue(job)
    }

    fn around_run(self: Arc<Self>, run: Run) -> BoxFuture<JobResult> {
        Box::pin(async move {
            let name = self.name();
            AssertUnwindSafe(self.0.around_run(run))
                .catch_unwind()
                .await
                .unwrap_or_else(|payload| {
                    Err(panic_error(
                        &*payload,
                        &format!("the hook {name} (JobHooks::around_run)"),
                    ))
                })
        })
    }
}

/// Registered hooks, shared by a node and its client.
pub(crate) type Hooks = Arc<dyn ErasedHooks>;

/// `hooks`, erased.
pub(crate) fn erase<H: JobHooks>(hooks: H) -> Hooks {
    Arc::new(Erased(hooks))
}

/// The attempt's handler future: the handler's own without hooks (nothing added), else
/// wrapped by the hooks' `around_run`.
pub(crate) fn handler_future(
    hooks: Option<&Hooks>,
    handler: Arc<dyn ErasedHandler>,
    ctx: JobContext,
) -> BoxFuture<JobResult> {
    match hooks {
        None => handler.call(ctx),
        Some(h) => h.clone().around_run(Run { handler, ctx }),
    }
}

/// Runs the enqueue hook on each of `jobs`, before any is written: the first refusal (or
/// panic) is the call's error.
pub(crate) fn on_enqueue<'j>(
    hooks: Option<&Hooks>,
    jobs: impl IntoIterator<Item = &'j mut NewJob>,
) -> Result<()> {
    let Some(h) = hooks else { return Ok(()) };
    for job in jobs {
        let answer = std::panic::catch_unwind(AssertUnwindSafe(|| h.on_enqueue(job)));
        let reason = match answer {
            Ok(Ok(())) => continue,
            Ok(Err(reason)) => reason,
            Err(payload) => format!(
                "it panicked: {}",
                crate::scheduler::panic_message(&*payload)
            ),
        };
        return Err(Error::Refused {
            hook: h.name(),
            kind: job.kind.clone(),
            reason,
        });
    }
    Ok(())
}
