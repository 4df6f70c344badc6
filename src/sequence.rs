//! Ordered sequences per key: [`NewJob::sequence`] puts a job at the end of the sequence
//! named by a key, so jobs with one key run one at a time in enqueue order (River Pro's
//! sequences, Oban Pro's chains, graphile-worker's named queues). A member waits for the one
//! enqueued before it, through the dependency machinery ([`crate::dependency`]): a member
//! that fails and waits for its retry has not ended, so it holds the sequence;
//! [`NewJob::on_sequence_failure`] says what one that ends dead or cancelled does.
//!
//! The design and its guarantees are in ARCHITECTURE.md (*Sequences*); the store's side is
//! `store/sequences.rs`.

use crate::dependency::ParentPolicy;
use crate::error::{Error, Result};
use crate::job::{NewJob, OnDuplicate, MAX_UNIQUE_KEY_LEN};
use crate::new_job::check_name;

/// Longest sequence key, in characters.
pub const MAX_SEQUENCE_KEY_LEN: usize = MAX_UNIQUE_KEY_LEN;

impl NewJob {
    /// Puts this job at the end of the sequence `key`: it runs only after the job enqueued
    /// before it with the same key has ended, so the members of one sequence run one at a
    /// time, in the order their enqueues committed (jobs of other keys run in parallel). A
    /// member waiting to retry holds the next one; a member that ends dead or cancelled
    /// applies [`on_sequence_failure`](Self::on_sequence_failure) (default: the sequence
    /// holds until that member is retried and succeeds). Keys are global, not per kind or
    /// queue.
    ///
    /// # Examples
    /// ```
    /// use jobvisor::NewJob;
    /// use serde_json::json;
    ///
    /// // Webhooks of one account are applied in the order they arrived.
    /// let job = NewJob::new("apply_webhook", json!({"event": "paid"})).sequence("acct:42");
    /// assert_eq!(job.sequence.as_deref(), Some("acct:42"));
    /// ```
    pub fn sequence(mut self, key: impl Into<String>) -> Self {
        self.sequence = Some(key.into());
        self
    }

    /// What a member before this one in its sequence that ends dead or cancelled does to
    /// it: [`ParentPolicy::Wait`] (the default) holds it, waiting, until that member is
    /// retried and succeeds (or this one is cancelled by hand); [`ParentPolicy::Run`] lets
    /// it run; [`ParentPolicy::Cancel`] cancels it, and so, by their own policies, the rest
    /// of the sequence.
    ///
    /// # Examples
    /// ```
    /// use jobvisor::{NewJob, ParentPolicy};
    /// use serde_json::json;
    ///
    /// let job = NewJob::new("sync", json!({}))
    ///     .sequence("doc:7")
    ///     .on_sequence_failure(ParentPolicy::Run);
    /// assert_eq!(job.on_sequence_failure, ParentPolicy::Run);
    /// ```
    pub fn on_sequence_failure(mut self, policy: ParentPolicy) -> Self {
        self.on_sequence_failure = policy;
        self
    }

    /// Whether the enqueue must take the dependency path (`store/dependencies.rs`): parents,
    /// a sequence, or a start-by deadline (written by a statement after the insert).
    pub(crate) fn needs_links(&self) -> bool {
        self.has_parents() || self.sequence.is_some() || self.start_by.is_some()
    }
}

/// Checks a job's sequence key, and that it is not combined with a replacing duplicate
/// policy.
pub(crate) fn validate_sequence(job: &NewJob) -> Result<()> {
    let Some(key) = &job.sequence else {
        return Ok(());
    };
    check_name("sequence", key, MAX_SEQUENCE_KEY_LEN)?;
    if job.on_duplicate != OnDuplicate::Keep {
        return Err(Error::invalid(
            "on_duplicate",
            format!(
                "{:?} is given with the sequence {key:?}; expected OnDuplicate::Keep (a \
                 duplicate keeps its holder's place in the sequence; a replaced or cancelled \
                 member would hold the members after it)",
                job.on_duplicate
            ),
        ));
    }
    Ok(())
}
