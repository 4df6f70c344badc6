//! A job to enqueue: [`NewJob`] with its options (queue, priority, unique key, its scope and
//! what a duplicate does, partition, run time, attempts, timeout), their validation before
//! anything is written, and [`Enqueued`], what an enqueue answers.
//!
//! The limits and defaults it checks against are the job's constants (`crate::job`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::job::duration_ms;
use crate::job::{
    JobId, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, DEFAULT_TIMEOUT, MAX_KIND_LEN,
    MAX_MAX_ATTEMPTS, MAX_PARTITION_LEN, MAX_PAYLOAD_DEPTH, MAX_QUEUE_LEN, MAX_TIMEOUT,
    MAX_UNIQUE_KEY_LEN, MAX_UNIQUE_PERIOD, MIN_UNIQUE_PERIOD,
};

/// Default largest payload accepted, in bytes of JSON (1 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// How long a job's [`unique_key`](NewJob::unique_key) keeps other jobs of the same kind
/// and key out. Default: **[`UniqueScope::UntilArchived`]**.
///
/// While a job *holds* its key, enqueueing another job of the same kind and key inserts
/// nothing and returns the holder's id as a duplicate (`Enqueued::duplicate`). Holding is
/// enforced by a unique index, so it holds under any number of concurrent enqueuers on any
/// number of nodes.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::{NewJob, UniqueScope};
///
/// assert_eq!(UniqueScope::default(), UniqueScope::UntilArchived);
///
/// // At most one reindex of an account queued or running at a time; once it has finished,
/// // the next change queues a new one.
/// let reindex = NewJob::new("reindex", serde_json::json!({"account": 42}))
///     .unique_key("account:42")
///     .unique_scope(UniqueScope::WhileActive);
///
/// // At most one digest e-mail per user per hour (a throttle), whatever became of the last.
/// let digest = NewJob::new("digest", serde_json::json!({"user": 7}))
///     .unique_key("user:7")
///     .unique_scope(UniqueScope::For(Duration::from_secs(3600)));
/// # let _ = (reindex, digest);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UniqueScope {
    /// Held from enqueue until the job is archived (moved to the archive table after its
    /// retention): a finished job still holds its key. The default.
    #[default]
    UntilArchived,
    /// Held while the job is pending, running or retrying: released when it succeeds, dies
    /// or is cancelled, so a new job with the same key can then be enqueued. A manual retry
    /// takes the key again if no other job holds it, and otherwise runs without it.
    WhileActive,
    /// Held for this long from enqueue, whatever becomes of the job (at most one job per key
    /// per period: a throttle). Once the period has passed, the next enqueue of the key takes
    /// it over, even from a job still pending or running; a job whose key was taken over
    /// does not get it back (a manual retry runs it without the key). A finished job stays
    /// in the live table until its period ends. From [`MIN_UNIQUE_PERIOD`] (1 ms) to
    /// [`MAX_UNIQUE_PERIOD`] (366 days); written as milliseconds in JSON (`{"for": 60000}`).
    For(#[serde(with = "duration_ms")] Duration),
}

impl UniqueScope {
    /// The name stored in the `unique_scope` column.
    pub(crate) const fn stored(self) -> &'static str {
        match self {
            UniqueScope::UntilArchived => "until_archived",
            UniqueScope::WhileActive => "while_active",
            UniqueScope::For(_) => "for",
        }
    }
}

/// What an enqueue does when another job holds its (kind, [`unique_key`](NewJob::unique_key)).
/// Default: **[`OnDuplicate::Keep`]**.
///
/// [`Replace`](OnDuplicate::Replace) and [`CancelAndInsert`](OnDuplicate::CancelAndInsert) act
/// only while the holder has not started: it is `pending`, no handler ever started on it, and no
/// job waits on it as a parent. Otherwise (running, retrying, finished, a parent) the holder is
/// kept and returned as a duplicate, as with `Keep`. Each write is guarded by the holder's
/// version and state in the statement itself, so a job claimed between the look-up and the write
/// is never changed, and of concurrent replacing enqueues of one key each applies whole, one after
/// the other: one pending job is left, with the last payload written.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::{NewJob, OnDuplicate};
///
/// // A debounce: send the digest 5 minutes after the *last* change. Each change moves the
/// // pending digest's run time (and payload) instead of queueing another.
/// let digest = NewJob::new("digest", serde_json::json!({"user": 7, "changes": 3}))
///     .unique_key("digest:7")
///     .delay(Duration::from_secs(300))
///     .on_duplicate(OnDuplicate::Replace);
/// # let _ = digest;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDuplicate {
    /// Keep the holder unchanged and return it as a duplicate (`duplicate: true`). The default.
    #[default]
    Keep,
    /// Overwrite the pending holder's payload, run time and priority with this job's (its
    /// queue, attempts, timeout and partition stay the holder's); returns the holder's id with
    /// `duplicate: true` and `replaced: true` (graphile-worker's `job_key` replace, Oban's
    /// `replace:`, a debounce).
    Replace,
    /// Cancel the pending holder and insert this job in its place, in one transaction; returns
    /// the new job's id with `duplicate: false` and `replaced: true`.
    CancelAndInsert,
}

/// When a new job becomes claimable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as it is enqueued (the statement's `now`).
    #[default]
    Now,
    /// This long after it is enqueued.
    After(Duration),
    /// At this instant (in the past means now).
    At(DateTime<Utc>),
}

/// A job to enqueue, built with [`NewJob::new`] and its option setters.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use jobvisor::NewJob;
///
/// let job = NewJob::new("send_email", serde_json::json!({"to": "a@example.com"}))
///     .queue("mail")
///     .priority(1)
///     .unique_key("welcome:42")
///     .delay(Duration::from_secs(60))
///     .max_attempts(3);
/// assert_eq!(job.kind, "send_email");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewJob {
    /// Selects the handler; non-empty.
    pub kind: String,
    /// Arguments.
    pub payload: Value,
    /// Queue; default [`DEFAULT_QUEUE`].
    pub queue: String,
    /// Smaller runs first; default [`DEFAULT_PRIORITY`].
    pub priority: i16,
    /// Deduplication key (per kind, among the jobs holding it).
    pub unique_key: Option<String>,
    /// How long the unique key is held; `None`: [`UniqueScope::UntilArchived`]. Needs a
    /// `unique_key`.
    pub unique_scope: Option<UniqueScope>,
    /// What to do when another job holds the unique key; default [`OnDuplicate::Keep`].
    /// Anything else needs a `unique_key` and no parents.
    pub on_duplicate: OnDuplicate,
    /// Partition key (a tenant, an account id such as `"acct:42"`); default none.
    pub partition: Option<String>,
    /// When it becomes claimable.
    pub run_at: RunAt,
    /// Attempts before it is dead; default [`DEFAULT_MAX_ATTEMPTS`].
    pub max_attempts: u32,
    /// Longest a single attempt may run; default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Parents by id: the job waits until they have ended ([`NewJob::after`]); default none.
    pub after: Vec<JobId>,
    /// Parents by (kind, unique key), resolved to their holders at enqueue
    /// ([`NewJob::after_key`]); default none.
    pub after_keys: Vec<(String, String)>,
    /// What a parent that ends dead or cancelled does to this job; default
    /// [`ParentPolicy::Cancel`](crate::ParentPolicy::Cancel).
    pub on_parent_failure: crate::ParentPolicy,
    /// The ordered sequence the job joins ([`NewJob::sequence`]): it runs after the job
    /// enqueued before it with the same key has ended; default none.
    pub sequence: Option<String>,
    /// What a member before it in its sequence that ends dead or cancelled does to this job;
    /// default [`ParentPolicy::Wait`](crate::ParentPolicy::Wait) (the sequence holds).
    pub on_sequence_failure: crate::ParentPolicy,
    /// No attempt starts at or after this instant ([`NewJob::start_by`]); default none.
    pub start_by: Option<DateTime<Utc>>,
    /// Why the arguments of a job made from [`JobArgs`](crate::JobArgs) did not serialize
    /// (its payload is then `null`): [`NewJob::validate`] refuses it, naming `payload`.
    pub(crate) payload_error: Option<String>,
}

impl NewJob {
    /// A job of `kind` with `payload` and every other option at its default.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        NewJob {
            kind: kind.into(),
            payload,
            queue: DEFAULT_QUEUE.to_string(),
            priority: DEFAULT_PRIORITY,
            unique_key: None,
            unique_scope: None,
            on_duplicate: OnDuplicate::Keep,
            partition: None,
            run_at: RunAt::Now,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout: DEFAULT_TIMEOUT,
            after: Vec::new(),
            after_keys: Vec::new(),
            on_parent_failure: crate::ParentPolicy::Cancel,
            sequence: None,
            on_sequence_failure: crate::ParentPolicy::Wait,
            start_by: None,
            payload_error: None,
        }
    }

    /// A job whose payload is given as JSON text (from a CLI, a form, another system).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `payload` with the parser's position when the text is not
    /// JSON.
    pub fn from_json_text(kind: impl Into<String>, payload: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(payload).map_err(|e| {
            Error::invalid(
                "payload",
                format!("not valid JSON ({e}); expected a JSON document"),
            )
        })?;
        Ok(NewJob::new(kind, value))
    }

    /// A job whose payload is any serializable value.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `payload` when it cannot be represented as JSON (for
    /// instance a map with non-string keys).
    pub fn typed<T: Serialize>(kind: impl Into<String>, payload: &T) -> Result<Self> {
        let value = serde_json::to_value(payload)
            .map_err(|e| Error::invalid("payload", format!("cannot be serialized to JSON: {e}")))?;
        Ok(NewJob::new(kind, value))
    }

    /// Sets the queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Sets the priority (smaller runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the deduplication key: while a job of the same kind holds it, enqueueing this one
    /// returns that job's id as a duplicate instead. How long a job holds its key:
    /// [`NewJob::unique_scope`] (default [`UniqueScope::UntilArchived`]).
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// Sets how long the unique key is held (default [`UniqueScope::UntilArchived`]); needs a
    /// [`unique_key`](NewJob::unique_key).
    pub fn unique_scope(mut self, scope: UniqueScope) -> Self {
        self.unique_scope = Some(scope);
        self
    }

    /// Sets what an enqueue does when another job holds the unique key (default
    /// [`OnDuplicate::Keep`]); needs a [`unique_key`](NewJob::unique_key).
    pub fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// Sets the partition key: a tenant or account the job belongs to (`"acct:42"`), stored
    /// with the job and returned as [`Job::partition`](crate::Job::partition). Non-empty, at most
    /// [`MAX_PARTITION_LEN`] bytes, printable, no surrounding whitespace.
    pub fn partition(mut self, key: impl Into<String>) -> Self {
        self.partition = Some(key.into());
        self
    }

    /// Makes it claimable only `delay` after it is enqueued.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.run_at = RunAt::After(delay);
        self
    }

    /// Makes it claimable only from `at`.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = RunAt::At(at);
        self
    }

    /// Sets how many attempts it gets.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Sets the longest a single attempt may run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks every field and returns the payload's serialized size in bytes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first offending field and what was expected.
    pub fn validate(&self, max_payload_bytes: usize) -> Result<usize> {
        if let Some(e) = &self.payload_error {
            return Err(Error::invalid(
                "payload",
                format!("the job's arguments did not serialize to JSON: {e}"),
            ));
        }
        check_name("kind", &self.kind, MAX_KIND_LEN)?;
        check_name("queue", &self.queue, MAX_QUEUE_LEN)?;
        if let Some(key) = &self.unique_key {
            check_name("unique_key", key, MAX_UNIQUE_KEY_LEN)?;
        }
        match (self.unique_scope, &self.unique_key) {
            (Some(scope), None) => {
                return Err(Error::invalid(
                    "unique_scope",
                    format!(
                        "{scope:?} is given without a unique_key; expected a unique_key as well \
                         (the scope says how long the key is held)"
                    ),
                ));
            }
            (Some(UniqueScope::For(d)), Some(_))
                if d < MIN_UNIQUE_PERIOD || d > MAX_UNIQUE_PERIOD =>
            {
                return Err(Error::invalid(
                    "unique_scope",
                    format!(
                        "period {d:?} is out of range; expected at least {MIN_UNIQUE_PERIOD:?} \
                         and at most {MAX_UNIQUE_PERIOD:?} (366 days)"
                    ),
                ));
            }
            _ => {}
        }
        if self.on_duplicate != OnDuplicate::Keep {
            if self.unique_key.is_none() {
                return Err(Error::invalid(
                    "on_duplicate",
                    format!(
                        "{:?} is given without a unique_key; expected a unique_key as well \
                         (it says what to do with the job holding that key)",
                        self.on_duplicate
                    ),
                ));
            }
            if self.has_parents() {
                return Err(Error::invalid(
                    "on_duplicate",
                    format!(
                        "{:?} is given with parents (after, after_key); expected no parents \
                         (a replaced job keeps its own) or OnDuplicate::Keep",
                        self.on_duplicate
                    ),
                ));
            }
        }
        if let Some(p) = &self.partition {
            if p.len() > MAX_PARTITION_LEN {
                return Err(Error::invalid(
                    "partition",
                    format!(
                        "is {} bytes long; expected at most {MAX_PARTITION_LEN} bytes",
                        p.len()
                    ),
                ));
            }
            check_name("partition", p, MAX_PARTITION_LEN)?;
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_MAX_ATTEMPTS {
            return Err(Error::invalid(
                "max_attempts",
                format!(
                    "{} is out of range; expected 1..={MAX_MAX_ATTEMPTS}",
                    self.max_attempts
                ),
            ));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Error::invalid(
                "timeout",
                format!(
                    "{:?} is out of range; expected more than 0 and at most {:?}",
                    self.timeout, MAX_TIMEOUT
                ),
            ));
        }
        if let RunAt::After(d) = self.run_at {
            if d > Duration::from_secs(100 * 365 * 24 * 3600) {
                return Err(Error::invalid(
                    "run_at",
                    format!("delay {d:?} is more than 100 years"),
                ));
            }
        }
        let depth = json_depth(&self.payload);
        if depth > MAX_PAYLOAD_DEPTH {
            return Err(Error::invalid(
                "payload",
                format!("is nested {depth} levels deep; expected at most {MAX_PAYLOAD_DEPTH}"),
            ));
        }
        crate::dependency::validate_parents(self)?;
        crate::sequence::validate_sequence(self)?;
        crate::deadline::validate_start_by(self)?;
        let size = payload_size(&self.payload);
        if size > max_payload_bytes {
            return Err(Error::invalid(
                "payload",
                format!(
                    "{size} bytes of JSON is over the limit of {max_payload_bytes} bytes \
                     (StoreOptions::max_payload_bytes)"
                ),
            ));
        }
        Ok(size)
    }
}

/// Nesting depth of a JSON value (a scalar is 0), without recursion.
fn json_depth(value: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    max
}

/// Serialized size of a JSON value, without allocating the text.
pub(crate) fn payload_size(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    // Writing a Value into an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// Checks a name-like field: non-empty, not too long, no control characters, no surrounding
/// whitespace (which would make two names look the same).
pub(crate) fn check_name(field: &'static str, value: &str, max_chars: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "is empty; expected a non-empty name"));
    }
    let chars = value.chars().count();
    if chars > max_chars {
        return Err(Error::invalid(
            field,
            format!("is {chars} characters long; expected at most {max_chars}"),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            field,
            format!("{value:?} contains the control character {c:?}; expected printable text"),
        ));
    }
    if value.trim() != value {
        return Err(Error::invalid(
            field,
            format!("{value:?} has leading or trailing whitespace"),
        ));
    }
    Ok(())
}

/// Result of enqueueing one job ([`Client::enqueue`](crate::Client::enqueue)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job's id, or for a duplicate the id of the job holding the key.
    pub id: JobId,
    /// True when the holder was changed or cancelled ([`OnDuplicate::Replace`],
    /// [`OnDuplicate::CancelAndInsert`]); false for [`OnDuplicate::Keep`] and a new key.
    pub replaced: bool,
    /// True when another job held the same (kind, unique_key) (see [`UniqueScope`]): nothing
    /// new was written.
    pub duplicate: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validate_names_the_bad_field() {
        let ok = NewJob::new("k", json!({}));
        assert!(ok.validate(1024).is_ok());
        let cases: Vec<(NewJob, &str)> = vec![
            (NewJob::new("", json!({})), "kind"),
            (NewJob::new("k", json!({})).queue(""), "queue"),
            (NewJob::new("k", json!({})).queue("a\u{0}b"), "queue"),
            (NewJob::new("k", json!({})).queue(" q"), "queue"),
            (NewJob::new("k".repeat(256), json!({})), "kind"),
            (NewJob::new("k", json!({})).unique_key(""), "unique_key"),
            (NewJob::new("k", json!({})).partition(""), "partition"),
            (
                NewJob::new("k", json!({})).unique_scope(UniqueScope::WhileActive),
                "unique_scope",
            ),
            (
                NewJob::new("k", json!({}))
                    .unique_key("u")
                    .unique_scope(UniqueScope::For(Duration::ZERO)),
                "unique_scope",
            ),
            (
                NewJob::new("k", json!({}))
                    .unique_key("u")
                    .unique_scope(UniqueScope::For(MAX_UNIQUE_PERIOD + Duration::from_secs(1))),
                "unique_scope",
            ),
            (
                NewJob::new("k", json!({})).partition("p".repeat(256)),
                "partition",
            ),
            (
                NewJob::new("k", json!({})).partition("é".repeat(128)),
                "partition",
            ),
            (
                NewJob::new("k", json!({})).on_duplicate(OnDuplicate::Replace),
                "on_duplicate",
            ),
            (
                NewJob::new("k", json!({}))
                    .unique_key("u")
                    .on_duplicate(OnDuplicate::CancelAndInsert)
                    .after(&[JobId(1)]),
                "on_duplicate",
            ),
            (NewJob::new("k", json!({})).max_attempts(0), "max_attempts"),
            (
                NewJob::new("k", json!({})).timeout(Duration::ZERO),
                "timeout",
            ),
            (NewJob::new("k", json!("x".repeat(2000))), "payload"),
        ];
        for (job, field) in cases {
            match job.validate(1024) {
                Err(Error::InvalidInput { field: f, reason }) => {
                    assert_eq!(f, field, "{reason}")
                }
                other => panic!("{field}: expected InvalidInput, got {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_json_text_is_rejected_with_position() {
        let err = NewJob::from_json_text("k", "{\"a\": ")
            .unwrap_err()
            .to_string();
        assert!(err.contains("payload") && err.contains("line 1"), "{err}");
        assert!(NewJob::from_json_text("k", "[1,2]").is_ok());
    }

    #[test]
    fn deeply_nested_payloads_are_refused_before_they_are_stored() {
        let mut v = json!(1);
        for _ in 0..MAX_PAYLOAD_DEPTH {
            v = json!([v]);
        }
        assert!(NewJob::new("k", v.clone()).validate(usize::MAX).is_ok());
        let deeper = json!({ "a": v });
        let err = NewJob::new("k", deeper)
            .validate(usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(err.contains("payload") && err.contains("deep"), "{err}");
    }

    #[test]
    fn payload_size_matches_serialized_length() {
        let v = json!({"a": [1, 2, "ü"], "b": null});
        assert_eq!(payload_size(&v), serde_json::to_string(&v).unwrap().len());
    }
}
