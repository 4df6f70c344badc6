//! Jobs that wait for other jobs: a child enqueued with [`NewJob::after`] (or
//! [`NewJob::after_key`]) is stored `waiting` until its parents have ended, then becomes
//! `pending` and due at once; [`ParentPolicy`] says what a parent that ends dead or cancelled
//! does to it; [`Dependencies`] is the view of a job's parents and children
//! (`Client::dependencies`); [`Batch`] is what `Client::enqueue_batch` returns.
//!
//! Parents must exist (live, or archived: ended) when the child is enqueued, so a cycle
//! cannot be built. The design and its guarantees are in ARCHITECTURE.md (*Dependencies*).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::job::{JobId, JobState, NewJob, MAX_KIND_LEN, MAX_UNIQUE_KEY_LEN};
use crate::new_job::check_name;

/// Most parents one job may name (ids and keys together): a batch's callback names every
/// member, so this is also the largest batch.
pub const MAX_PARENTS: usize = 100_000;

/// What a parent that ends `dead` or `cancelled` does to a waiting child. A parent that
/// succeeds always counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParentPolicy {
    /// The default: the child is cancelled at once, and so (by their own policies) are its
    /// waiting children.
    #[default]
    Cancel,
    /// The parent counts as done: the child runs once every parent has ended, whatever the
    /// outcome (a batch's callback has this policy).
    Run,
    /// The child stays waiting: a manual retry of the parent that then succeeds releases it;
    /// cancelling the child by hand ends it.
    Wait,
}

impl ParentPolicy {
    /// The name stored in `jobvisor_job_deps.policy`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ParentPolicy::Cancel => "cancel",
            ParentPolicy::Run => "run",
            ParentPolicy::Wait => "wait",
        }
    }

    /// The policy stored as `s`; unknown names read as the default.
    pub(crate) fn parse(s: &str) -> ParentPolicy {
        match s {
            "run" => ParentPolicy::Run,
            "wait" => ParentPolicy::Wait,
            _ => ParentPolicy::Cancel,
        }
    }
}

impl NewJob {
    /// Runs this job only after `parents` have ended: it is stored `waiting` and becomes due
    /// when every parent has succeeded (a parent that ends dead or cancelled applies
    /// [`NewJob::on_parent_failure`]). Each parent must exist at enqueue, in the live table
    /// or the archive (an archived parent has ended: its final state counts at once, a
    /// success as done, dead or cancelled by the child's policy); otherwise the enqueue fails
    /// naming it, and nothing is stored. Calls add up.
    pub fn after(mut self, parents: &[JobId]) -> Self {
        self.after.extend_from_slice(parents);
        self
    }

    /// Like [`after`](Self::after), naming the parent by the job that holds `unique_key` for
    /// `kind` at enqueue (or, if none does, the newest archived job of `kind` with that key).
    pub fn after_key(mut self, kind: impl Into<String>, unique_key: impl Into<String>) -> Self {
        self.after_keys.push((kind.into(), unique_key.into()));
        self
    }

    /// What a parent that ends dead or cancelled does to this job; default
    /// [`ParentPolicy::Cancel`].
    pub fn on_parent_failure(mut self, policy: ParentPolicy) -> Self {
        self.on_parent_failure = policy;
        self
    }

    /// Whether the job names any parent.
    pub(crate) fn has_parents(&self) -> bool {
        !self.after.is_empty() || !self.after_keys.is_empty()
    }
}

/// Checks a job's parents: at most [`MAX_PARENTS`], keys well-formed.
pub(crate) fn validate_parents(job: &NewJob) -> Result<()> {
    let n = job.after.len() + job.after_keys.len();
    if n > MAX_PARENTS {
        return Err(Error::invalid(
            "after",
            format!("names {n} parents; expected at most {MAX_PARENTS}"),
        ));
    }
    for (kind, key) in &job.after_keys {
        check_name("after_key", kind, MAX_KIND_LEN)?;
        check_name("after_key", key, MAX_UNIQUE_KEY_LEN)?;
    }
    Ok(())
}

/// One end of a dependency: the other job, its state, the child's policy, and whether the
/// edge is settled (the parent's end was counted for the child).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Link {
    /// The parent (in [`Dependencies::parents`]) or the child (in
    /// [`Dependencies::children`]).
    pub id: JobId,
    /// Its state; `None` if it is no longer in the live table or the archive.
    pub state: Option<JobState>,
    /// The child's policy for a failed parent.
    pub policy: ParentPolicy,
    /// Whether the parent's end was counted for the child.
    pub settled: bool,
}

/// A job's parents and children ([`Client::dependencies`](crate::Client::dependencies)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Dependencies {
    /// The jobs this one waits for, by id.
    pub parents: Vec<Link>,
    /// The jobs that wait for this one, by id.
    pub children: Vec<Link>,
}

/// How a job's parents ended: what a batch's callback reads
/// ([`Dependencies::outcomes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Outcomes {
    /// Parents that succeeded.
    pub succeeded: u64,
    /// Parents that ended dead.
    pub dead: u64,
    /// Parents that were cancelled.
    pub cancelled: u64,
    /// Parents not (or no longer visibly) finished.
    pub unfinished: u64,
}

impl Dependencies {
    /// The parents' outcomes, counted.
    pub fn outcomes(&self) -> Outcomes {
        let mut o = Outcomes::default();
        for p in &self.parents {
            match p.state {
                Some(JobState::Succeeded) => o.succeeded += 1,
                Some(JobState::Dead) => o.dead += 1,
                Some(JobState::Cancelled) => o.cancelled += 1,
                _ => o.unfinished += 1,
            }
        }
        o
    }
}

/// A batch as enqueued (`Client::enqueue_batch`): its members, in input order, and the
/// callback that runs once when every member has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Batch {
    /// The members, in input order (a member whose unique key another job holds is that job,
    /// `duplicate: true`).
    pub members: Vec<Enqueued>,
    /// The callback job.
    pub callback: Enqueued,
}
