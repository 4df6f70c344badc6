//! [`JobArgs`]: a payload type tied to its kind and its defaults (queue, priority, attempts,
//! timeout), so that enqueueing it and registering its handler name the kind once, in the
//! type. The string forms ([`NewJob::new`], [`SchedulerBuilder::handler`]) stay available.
//!
//! [`SchedulerBuilder::handler`]: crate::SchedulerBuilder::handler

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::job::{NewJob, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, DEFAULT_TIMEOUT};

/// A job's arguments as a type: its kind and its defaults live with it, so a job is enqueued
/// as `client.enqueue(args)` and its handler registered as `builder.handle(handler)` — a
/// kind is never spelled twice, and a type that is not a job does not compile.
///
/// The defaults apply to every job made from the type ([`NewJob::from`]); the builder
/// methods of [`NewJob`] still override them per job.
///
/// # Examples
/// ```no_run
/// # async fn demo(store: jobvisor::Store) -> jobvisor::Result<()> {
/// use std::time::Duration;
/// use jobvisor::{handler_fn, JobArgs, JobContext, JobOutcome, NewJob, QueueConfig, Scheduler};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
///     const QUEUE: &'static str = "mail";
///     const MAX_ATTEMPTS: u32 = 5;
///     const TIMEOUT: Duration = Duration::from_secs(60);
/// }
///
/// let scheduler = Scheduler::builder(store)
///     .queue("mail", QueueConfig::default())
///     .handle(handler_fn(|email: SendEmail, _ctx: JobContext| async move {
///         JobOutcome::success(format!("sent to {}", email.to))
///     }))
///     .start()?;
/// let client = scheduler.client();
/// client.enqueue(SendEmail { to: "a@example.com".into() }).await?;
/// // Per-job options on top of the type's defaults:
/// client.enqueue(NewJob::from(SendEmail { to: "b@example.com".into() }).unique_key("welcome:b")).await?;
/// # Ok(()) }
/// ```
///
/// A payload type that is not a job is refused at compile time, not at run time:
///
/// ```compile_fail
/// # async fn demo(client: jobvisor::Client) -> jobvisor::Result<()> {
/// #[derive(serde::Serialize)]
/// struct NotAJob { to: String }
///
/// client.enqueue(NotAJob { to: "a@example.com".into() }).await?; // no JobArgs: no kind
/// # Ok(()) }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind: selects the handler (see [`NewJob::kind`]).
    const KIND: &'static str;
    /// The queue its jobs go to (default [`DEFAULT_QUEUE`]).
    const QUEUE: &'static str = DEFAULT_QUEUE;
    /// Their priority, smaller first (default [`DEFAULT_PRIORITY`]).
    const PRIORITY: i16 = DEFAULT_PRIORITY;
    /// Attempts before a job is dead (default [`DEFAULT_MAX_ATTEMPTS`]).
    const MAX_ATTEMPTS: u32 = DEFAULT_MAX_ATTEMPTS;
    /// Longest a single attempt may run (default [`DEFAULT_TIMEOUT`]).
    const TIMEOUT: Duration = DEFAULT_TIMEOUT;
}

impl<A: JobArgs> From<A> for NewJob {
    /// A job of `A::KIND` with `args` as its payload and the type's defaults. Arguments that
    /// do not serialize to JSON (a map with non-string keys, a failing `Serialize`) make a
    /// job that enqueue refuses with [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// naming `payload`.
    fn from(args: A) -> NewJob {
        let (payload, error) = match serde_json::to_value(&args) {
            Ok(v) => (v, None),
            Err(e) => (serde_json::Value::Null, Some(e.to_string())),
        };
        let mut job = NewJob::new(A::KIND, payload)
            .queue(A::QUEUE)
            .priority(A::PRIORITY)
            .max_attempts(A::MAX_ATTEMPTS)
            .timeout(A::TIMEOUT);
        job.payload_error = error;
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Plain {
        n: u32,
    }
    impl JobArgs for Plain {
        const KIND: &'static str = "plain";
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Tuned {
        n: u32,
    }
    impl JobArgs for Tuned {
        const KIND: &'static str = "tuned";
        const QUEUE: &'static str = "mail";
        const PRIORITY: i16 = 1;
        const MAX_ATTEMPTS: u32 = 3;
        const TIMEOUT: Duration = Duration::from_secs(7);
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Unserializable {
        m: std::collections::HashMap<(u8, u8), u8>,
    }
    impl JobArgs for Unserializable {
        const KIND: &'static str = "bad";
    }

    #[test]
    fn a_job_from_args_takes_the_types_kind_and_defaults() {
        let j = NewJob::from(Plain { n: 1 });
        assert_eq!(j, NewJob::new("plain", serde_json::json!({"n": 1})));
        let j = NewJob::from(Tuned { n: 2 });
        assert_eq!(
            (
                j.kind.as_str(),
                j.queue.as_str(),
                j.priority,
                j.max_attempts,
                j.timeout
            ),
            ("tuned", "mail", 1, 3, Duration::from_secs(7))
        );
        assert_eq!(j.payload, serde_json::json!({"n": 2}));
        // Per-job options still override the type's.
        assert_eq!(NewJob::from(Tuned { n: 3 }).queue("other").queue, "other");
    }

    #[test]
    fn args_that_do_not_serialize_are_refused_naming_the_payload() {
        let m = [((1, 2), 3)].into_iter().collect();
        let e = NewJob::from(Unserializable { m })
            .validate(1 << 20)
            .unwrap_err();
        match e {
            crate::Error::InvalidInput { field, reason } => {
                assert_eq!(field, "payload");
                assert!(reason.contains("key must be a string"), "{reason}");
            }
            other => panic!("{other}"),
        }
    }
}
