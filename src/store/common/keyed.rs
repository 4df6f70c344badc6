//! The keyed enqueue, written once for every backend: insert the job; if another job holds
//! its (kind, unique key), answer that job as a duplicate — or, when the holder's period has
//! ended, take the hold over and insert in its place. Each backend supplies the three steps
//! ([`KeyedSteps`]) with its own SQL and transaction rules; the loop and its outcomes are here.

use super::columns::KEYED_TRIES;
use crate::job::Enqueued;
use crate::job::{JobId, NewJob};

/// What a job's key is held by, as a backend reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The holding job.
    pub(crate) id: i64,
    /// Its [`For`](crate::job::UniqueScope::For) period has ended: the hold can be taken over.
    pub(crate) expired: bool,
}

/// One backend's steps of a keyed enqueue, on one connection.
pub(crate) trait KeyedSteps {
    /// Inserts `job`; `None` when another job holds its key (nothing inserted).
    async fn insert(&mut self, job: &NewJob, now: Option<i64>) -> diesel::QueryResult<Option<i64>>;

    /// The job holding `job`'s key; `None` if none does (any more).
    async fn holder(
        &mut self,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<Holder>>;

    /// Releases the expired hold of job `holder` (a guarded, row-locking `UPDATE`) and inserts
    /// `job` in its place, as one step; `None` when another enqueuer took the hold over first.
    async fn replace(
        &mut self,
        holder: i64,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<i64>>;
}

/// One keyed job: inserted, or the holder as a duplicate, or inserted in the place of an
/// expired holder. `None` when the key kept changing hands for [`KEYED_TRIES`] rounds (the
/// caller tries again).
pub(crate) async fn enqueue_keyed<S: KeyedSteps>(
    steps: &mut S,
    job: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    for _ in 0..KEYED_TRIES {
        if let Some(id) = steps.insert(job, now).await? {
            return Ok(Some(Enqueued {
                id: JobId(id),
                duplicate: false,
            }));
        }
        // Boxed: a held key is the rare case, and its steps would otherwise size every
        // enqueue's future (copied whole at each layer above it).
        if let Some(e) = Box::pin(resolve(steps, job, now)).await? {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// After an insert of `job` met a holder (a batch's multi-row insert): the holder as a
/// duplicate, or the job inserted in an expired holder's place, or else the whole keyed
/// enqueue again.
#[cfg(feature = "postgres")]
pub(crate) async fn after_conflict<S: KeyedSteps>(
    steps: &mut S,
    job: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    match resolve(steps, job, now).await? {
        Some(e) => Ok(Some(e)),
        None => enqueue_keyed(steps, job, now).await,
    }
}

/// The holder of `job`'s key as a duplicate, or `job` inserted in an expired holder's place;
/// `None` when nobody holds the key any more or another enqueuer took it over first.
async fn resolve<S: KeyedSteps>(
    steps: &mut S,
    job: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    Ok(match steps.holder(job, now).await? {
        None => None,
        Some(Holder { id, expired: false }) => Some(Enqueued {
            id: JobId(id),
            duplicate: true,
        }),
        Some(Holder { id, expired: true }) => {
            steps.replace(id, job, now).await?.map(|id| Enqueued {
                id: JobId(id),
                duplicate: false,
            })
        }
    })
}
