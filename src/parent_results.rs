//! [`ParentResults`]: what a child job's handler reads of the parents it waited for
//! ([`NewJob::after`](crate::NewJob::after)) — each parent's final state and, for one that
//! succeeded, its result — so a pipeline hands data along and a fan-in reads all of its
//! inputs ([`JobContext::parent_results`](crate::JobContext::parent_results)).
//!
//! Read on demand, in one statement when the handler asks (nothing is added to the claim):
//! the parents' rows, live or archived, joined to the child's edges. A parent is kept in the
//! live table while any child of it has not ended, and one the child named after it was
//! archived is read from the archive; a parent pruned from the archive goes with its edge
//! and is no longer listed. The results read at once are at most the store's payload cap
//! ([`StoreOptions::max_payload_bytes`](crate::StoreOptions::max_payload_bytes)) of JSON
//! together.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::handler::JobError;
use crate::job::{JobId, JobState};

/// The parents of a job, by id, each with its final state and result: what
/// [`JobContext::parent_results`](crate::JobContext::parent_results) answers.
///
/// # Examples
/// ```
/// use jobvisor::{handler_fn, JobContext, JobOutcome};
///
/// // The last step of a pipeline: sum what each parent computed.
/// let total = handler_fn(|_: serde_json::Value, ctx: JobContext| async move {
///     let parents = ctx.parent_results().await?;
///     let mut sum = 0u64;
///     for (id, _) in parents.iter() {
///         sum += parents.typed::<u64>(id)?;
///     }
///     JobOutcome::success(sum)
/// });
/// # let _ = total;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParentResults {
    parents: BTreeMap<JobId, (JobState, Option<Value>)>,
}

impl ParentResults {
    /// The parents read (`rows`: id, state, stored result), refused if their results
    /// together are more than `max_bytes` of JSON.
    pub(crate) fn new(
        rows: Vec<(JobId, JobState, Option<Value>)>,
        max_bytes: usize,
    ) -> Result<Self, JobError> {
        let mut total = 0usize;
        let mut parents = BTreeMap::new();
        for (id, state, result) in rows {
            let result = match (state, result) {
                (JobState::Succeeded, r) => Some(r.unwrap_or(Value::Null)),
                (_, r) => r,
            };
            if let Some(r) = &result {
                total = total.saturating_add(crate::new_job::payload_size(r));
                if total > max_bytes {
                    return Err(JobError::fail(format!(
                        "the parents' results are more than {max_bytes} bytes of JSON together \
                         (StoreOptions::max_payload_bytes); expected at most that: keep large \
                         outputs elsewhere and return a reference to them"
                    ))
                    .with_code("parent_results_too_large"));
                }
            }
            parents.insert(id, (state, result));
        }
        Ok(ParentResults { parents })
    }

    /// How many parents are listed.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether no parent is listed (the job named none, or all were pruned).
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// The parents, by id: each with its state (a child released by [`ParentPolicy::Run`]
    /// may see `dead` or `cancelled` ones) and its result (`null` for a success without
    /// one; `None` for a parent that did not succeed).
    ///
    /// [`ParentPolicy::Run`]: crate::ParentPolicy::Run
    pub fn iter(&self) -> impl Iterator<Item = (JobId, (JobState, Option<&Value>))> {
        self.parents
            .iter()
            .map(|(id, (state, result))| (*id, (*state, result.as_ref())))
    }

    /// The result of `parent`, if it is listed and succeeded.
    pub fn get(&self, parent: JobId) -> Option<&Value> {
        self.parents.get(&parent).and_then(|(_, r)| r.as_ref())
    }

    /// The state of `parent`, if it is listed.
    pub fn state(&self, parent: JobId) -> Option<JobState> {
        self.parents.get(&parent).map(|(s, _)| *s)
    }

    /// The result of `parent` as a `T`.
    ///
    /// # Errors
    /// A permanent [`JobError`] naming the parent: code `no_parent_result` if it is not a
    /// parent of this job (or was pruned) or did not succeed; `bad_parent_result` if its
    /// result does not deserialize as a `T`.
    pub fn typed<T: DeserializeOwned>(&self, parent: JobId) -> Result<T, JobError> {
        let (state, result) = self.parents.get(&parent).ok_or_else(|| {
            JobError::fail(format!(
                "job {parent} is not a parent of this job (or it was pruned); expected one of \
                 the ids given to NewJob::after"
            ))
            .with_code("no_parent_result")
        })?;
        let result = result.as_ref().ok_or_else(|| {
            JobError::fail(format!(
                "parent {parent} ended {state}: it has no result; expected a succeeded parent"
            ))
            .with_code("no_parent_result")
        })?;
        T::deserialize(result).map_err(|e| {
            JobError::fail(format!(
                "the result of parent {parent} is not a {}: {e}",
                std::any::type_name::<T>()
            ))
            .with_code("bad_parent_result")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn typed_reads_name_the_parent_and_the_cap_is_enforced() {
        let rows = vec![
            (JobId(1), JobState::Succeeded, Some(json!(7))),
            (JobId(2), JobState::Dead, None),
            (JobId(3), JobState::Succeeded, None),
        ];
        let p = ParentResults::new(rows.clone(), 1024).unwrap();
        assert_eq!(p.typed::<u32>(JobId(1)).unwrap(), 7);
        assert_eq!(p.get(JobId(3)), Some(&Value::Null));
        let e = p.typed::<u32>(JobId(2)).unwrap_err();
        assert!(
            e.code == "no_parent_result" && e.message.contains("dead"),
            "{e}"
        );
        let e = p.typed::<u32>(JobId(9)).unwrap_err();
        assert!(e.message.contains("job 9 is not a parent"), "{e}");
        let e = p.typed::<String>(JobId(1)).unwrap_err();
        assert_eq!(e.code, "bad_parent_result");
        // `7` and `null`: 5 bytes of JSON together.
        assert!(ParentResults::new(rows.clone(), 5).is_ok());
        let e = ParentResults::new(rows, 4).unwrap_err();
        assert_eq!(e.code, "parent_results_too_large");
    }
}
