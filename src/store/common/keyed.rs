//! The keyed enqueue, written once for every backend: insert the job; if another job holds
//! its (kind, unique key), answer that job as a duplicate — or, when the holder's period has
//! ended, take the hold over and insert in its place; or, as the job's
//! [`OnDuplicate`] asks and while the holder is open (pending, never started, no children),
//! overwrite the holder or cancel it and insert in its place. Each backend supplies the four
//! steps ([`KeyedSteps`]) with its own SQL and transaction rules; the loop and its outcomes are
//! here.

use crate::job::Enqueued;
use crate::job::{JobId, NewJob, OnDuplicate};

/// Tries to insert a keyed job that lost to a holder, up to this many times: the holder
/// may release its key (finish, be archived, be taken over) between the insert and the
/// look-up, and the insert is then tried again.
pub(crate) const KEYED_TRIES: usize = 4;

/// Rounds of a replacing enqueue ([`OnDuplicate::Replace`], [`OnDuplicate::CancelAndInsert`])
/// before the caller is told to try again: each round lost is another enqueuer's write, so
/// this many concurrent replacers of one key all get through.
const REPLACE_TRIES: usize = 64;

/// What a job's key is held by, as a backend reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The holding job.
    pub(crate) id: i64,
    /// Its [`For`](crate::job::UniqueScope::For) period has ended: the hold can be taken over.
    pub(crate) expired: bool,
    /// Its version when read: the guard of a replacing write.
    pub(crate) version: i64,
    /// Pending, never started and no job waits on it: a replacing enqueue may change it.
    pub(crate) open: bool,
}

/// How a holder gives up its key to a job inserted in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Its period has ended: its hold is cleared (`take_over!`).
    Expired,
    /// It is cancelled, while still open at this version ([`OnDuplicate::CancelAndInsert`]).
    Cancel {
        /// The version read with it.
        version: i64,
    },
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

    /// Releases the hold of job `holder` as `release` says (a guarded, row-locking `UPDATE`,
    /// `release!`) and inserts `job` in its place, as one step; `None` when the holder moved
    /// on or another enqueuer took the hold over first.
    async fn replace(
        &mut self,
        holder: i64,
        release: Release,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<Option<i64>>;

    /// Overwrites the open holder `holder`, still at `version`, with `job`'s payload, priority
    /// and run time (`overwrite!`); false when it moved on.
    async fn overwrite(
        &mut self,
        holder: i64,
        version: i64,
        job: &NewJob,
        now: Option<i64>,
    ) -> diesel::QueryResult<bool>;
}

/// One keyed job: inserted, or the holder as a duplicate, or inserted in the place of an
/// expired holder. `None` when the key kept changing hands for [`KEYED_TRIES`] rounds (the
/// caller tries again).
pub(crate) async fn enqueue_keyed<S: KeyedSteps>(
    steps: &mut S,
    job: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    let tries = match job.on_duplicate {
        OnDuplicate::Keep => KEYED_TRIES,
        OnDuplicate::Replace | OnDuplicate::CancelAndInsert => REPLACE_TRIES,
    };
    for _ in 0..tries {
        if let Some(id) = steps.insert(job, now).await? {
            return Ok(Some(Enqueued {
                id: JobId(id),
                duplicate: false,
                replaced: false,
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

/// The holder of `job`'s key as a duplicate, or `job` inserted in an expired holder's place,
/// or the open holder overwritten or cancelled and replaced as `job.on_duplicate` asks; `None`
/// when nobody holds the key any more, or the holder moved on, or another enqueuer took it over
/// first.
async fn resolve<S: KeyedSteps>(
    steps: &mut S,
    job: &NewJob,
    now: Option<i64>,
) -> diesel::QueryResult<Option<Enqueued>> {
    let Some(h) = steps.holder(job, now).await? else {
        return Ok(None);
    };
    let inserted = |id: Option<i64>, replaced: bool| {
        id.map(|id| Enqueued {
            id: JobId(id),
            duplicate: false,
            replaced,
        })
    };
    if h.expired {
        return Ok(inserted(
            steps.replace(h.id, Release::Expired, job, now).await?,
            false,
        ));
    }
    let duplicate = Enqueued {
        id: JobId(h.id),
        duplicate: true,
        replaced: false,
    };
    Ok(match job.on_duplicate {
        _ if !h.open => Some(duplicate),
        OnDuplicate::Keep => Some(duplicate),
        OnDuplicate::Replace => {
            steps
                .overwrite(h.id, h.version, job, now)
                .await?
                .then_some(Enqueued {
                    replaced: true,
                    ..duplicate
                })
        }
        OnDuplicate::CancelAndInsert => {
            let release = Release::Cancel { version: h.version };
            inserted(steps.replace(h.id, release, job, now).await?, true)
        }
    })
}
