//! Dependencies between jobs, written once for every backend with diesel's query builder:
//! the enqueue of a child (its parents locked and flagged in the same transaction), the
//! settling of a finished parent's children (release, cancel, or keep waiting), a cascading
//! cancel, the sweeper's backstop for a settle a crash interrupted, and the read of a job's
//! parents and children.
//!
//! **Why no child is stranded.** A child's enqueue sets `has_children` on every parent with
//! an `UPDATE` (which locks the parent rows until commit) and only then reads their states.
//! A parent's finalization writes the same rows: it either commits first (the child's
//! enqueue then reads the parent's end and counts it at once) or waits for the child's
//! commit and reads `has_children` in its own statement (the finalize returns it), and its
//! finalizer settles the children. A crash between a parent's end and its settle is caught
//! by the sweeper ([`Store::job_settle_stranded`]).
//!
//! **Why a child is released once.** A settle locks the child's row (`version + 1` where
//! `state = 'waiting'`) before it reads or marks its edges, so settles of one child take
//! turns; the last one to mark an edge sees every other mark (each statement under READ
//! COMMITTED sees what committed before it, and the marks committed before the lock was
//! granted), and the release is `WHERE state = 'waiting'` under that lock.

use std::collections::{BTreeSet, HashMap};

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::deadlines::deadline_write;
use super::driver::{with_conn, with_tx};
use super::expr::{DbNow, ReleaseHold};
use super::mutation::{on, Mutation};
use super::params::SettleParams;
use super::retry::{pause_before_retry, TRANSIENT_TRIES};
use super::rows::to_us;
use super::schema::{
    jobvisor_job_deps as deps, jobvisor_jobs as jobs, jobvisor_jobs_archive as archive,
    jobvisor_jobs_links as links,
};
use super::sequences::sequence_append;
use super::timeout::Op;
use super::wakes::announce_due;
use super::{Enqueued, OutboxConnection, Store};
use crate::dependency::{Batch, Dependencies, Link, ParentPolicy};
use crate::error::{Error, Result, StoreError};
use crate::job::{JobId, JobState, NewJob};
use crate::new_job::payload_size;

/// Ids per `IN (…)` list and rows per multi-row insert (under every backend's bind limit).
const CHUNK: usize = 1000;
/// Children settled per transaction.
const SETTLE_CHUNK: usize = 64;
/// Generations a settle follows down in one call (a cancel cascades to grandchildren); the
/// sweeper's backstop continues a deeper one.
const MAX_GENERATIONS: usize = 1000;

const SUCCEEDED: &str = JobState::Succeeded.as_str();
const WAITING: &str = JobState::Waiting.as_str();
const PENDING: &str = JobState::Pending.as_str();
const RUNNING: &str = JobState::Running.as_str();

/// Whether `state` (as stored) is dead or cancelled.
fn failed(state: &str) -> bool {
    state == JobState::Dead.as_str() || state == JobState::Cancelled.as_str()
}

/// What a settle did.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// The queues of the children released (due now), one entry per child.
    pub(crate) released: Vec<String>,
    /// Children cancelled by a failed parent.
    pub(crate) cancelled: Vec<JobId>,
}

/// Evaluates `$e` (a future of a `Result`) again, after a pause, while it fails transiently
/// (a deadlock between a child's enqueue and a parent's settle, SQLite busy; `retry.rs`).
macro_rules! retrying {
    ($e:expr) => {{
        let mut tries = 0;
        loop {
            tries += 1;
            match $e.await {
                Err(e) if e.is_transient() && tries < TRANSIENT_TRIES => {
                    pause_before_retry(tries).await;
                }
                res => break res,
            }
        }
    }};
}

/// Enqueues one job inside a transaction: the job itself through the backend's own enqueue,
/// then, if it names parents, its parents resolved, locked and flagged, its edges inserted and
/// its state set from theirs. `extra` adds parents by id (a batch's members). Pushes the
/// queue of a job that is due now onto `$due`.
macro_rules! enqueue_child {
    ($conn:ident, $job:expr, $extra:expr, $now:expr, $ir:expr, $due:expr) => {{
        let job: &NewJob = $job;
        let extra: &[i64] = $extra;
        let got = $conn
            .enqueue_on(std::slice::from_ref(job), $now, $ir)
            .await?
            .into_iter()
            .next()
            .flatten()
            .ok_or_else(|| {
                Error::Database(StoreError::Transient(
                    "a duplicate job kept disappearing while enqueueing; try again".into(),
                ))
            })?;
        // A start-by deadline, written after the insert (and refused if already past).
        if let (Some(sb), false) = (job.start_by, got.duplicate) {
            deadline_write!($conn, got.id.0, to_us(sb), $now);
        }
        // A new member of a sequence waits for the tail it read, unless that has ended.
        let tail: Option<(i64, String)> = match &job.sequence {
            Some(key) if !got.duplicate => sequence_append!($conn, key, got.id.0),
            _ => None,
        };
        if got.duplicate || (!job.has_parents() && extra.is_empty() && tail.is_none()) {
            if !got.duplicate {
                $due.push(job.queue.clone());
            }
            got
        } else {
            let mut parents: BTreeSet<i64> = job.after.iter().map(|p| p.0).collect();
            parents.extend(extra.iter().copied());
            for (kind, key) in &job.after_keys {
                let holder: Option<i64> = jobs::table
                    .filter(jobs::kind.eq(kind))
                    .filter(jobs::unique_hold.eq(key))
                    .select(jobs::id)
                    .first($conn)
                    .await
                    .optional()?;
                // An archived job holds no key: the newest archived job with it stands in.
                let holder = match holder {
                    Some(id) => Some(id),
                    None => archive::table
                        .filter(archive::kind.eq(kind))
                        .filter(archive::unique_key.eq(key))
                        .order(archive::id.desc())
                        .select(archive::id)
                        .first($conn)
                        .await
                        .optional()?,
                };
                match holder {
                    Some(id) => {
                        parents.insert(id);
                    }
                    None => {
                        return Err(Error::invalid(
                            "after_key",
                            format!(
                                "no job of kind {kind:?} holds the unique key {key:?}, live or \
                                 archived; expected the key of an existing job (a parent must \
                                 exist when its child is enqueued)"
                            ),
                        ));
                    }
                }
            }
            let parents: Vec<i64> = parents.into_iter().collect();
            // Lock and flag first, read after: a parent that ends later sees the flag.
            let mut states: HashMap<i64, String> = HashMap::with_capacity(parents.len());
            for chunk in parents.chunks(CHUNK) {
                diesel::update(links::table.filter(links::id.eq_any(chunk)))
                    .set(links::has_children.eq(true))
                    .execute($conn)
                    .await?;
                let rows: Vec<(i64, String)> = jobs::table
                    .filter(jobs::id.eq_any(chunk))
                    .select((jobs::id, jobs::state))
                    .load($conn)
                    .await?;
                states.extend(rows);
            }
            // Parents not in the live table may be archived: ended, so their final state
            // counts as it would have at their end. An archived job never changes again (it
            // only moves live → archive, in one transaction), so reading it after the live
            // table misses nothing.
            let gone: Vec<i64> = parents
                .iter()
                .filter(|p| !states.contains_key(p))
                .copied()
                .collect();
            let mut archived: Vec<i64> = Vec::new();
            for chunk in gone.chunks(CHUNK) {
                let rows: Vec<(i64, String)> = archive::table
                    .filter(archive::id.eq_any(chunk))
                    .select((archive::id, archive::state))
                    .load($conn)
                    .await?;
                archived.extend(rows.iter().map(|r| r.0));
                states.extend(rows);
            }
            if let Some(missing) = parents.iter().find(|p| !states.contains_key(p)) {
                return Err(Error::invalid(
                    "after",
                    format!(
                        "parent job {missing} does not exist, live or archived; expected the \
                         id of an existing job: a parent must exist when its child is enqueued"
                    ),
                ));
            }
            let policy = job.on_parent_failure;
            let mut cancel = false;
            let mut open = false;
            let mut settled = Vec::with_capacity(parents.len());
            for p in &parents {
                let st = states[p].as_str();
                let done = st == SUCCEEDED || (policy == ParentPolicy::Run && failed(st));
                cancel |= policy == ParentPolicy::Cancel && failed(st);
                open |= !done;
                if done {
                    settled.push(*p);
                }
            }
            // The sequence's tail (live, not succeeded: locked, flagged and read by the
            // append), with the job's policy for a failed member; named as a parent too,
            // the parent's edge stands for both.
            if let Some((t, st)) = tail.as_ref().filter(|(t, _)| !parents.contains(t)) {
                let sp = job.on_sequence_failure;
                let done = sp == ParentPolicy::Run && failed(st);
                cancel |= sp == ParentPolicy::Cancel && failed(st);
                open |= !done;
                diesel::insert_into(deps::table)
                    .values((
                        deps::child_id.eq(got.id.0),
                        deps::parent_id.eq(*t),
                        deps::policy.eq(sp.as_str()),
                        deps::done.eq(done),
                    ))
                    .execute($conn)
                    .await?;
            }
            // The edges: one `INSERT … SELECT` from the locked parents per chunk, then the
            // parents that already ended marked counted.
            for chunk in parents.chunks(CHUNK) {
                diesel::insert_into(deps::table)
                    .values(jobs::table.filter(jobs::id.eq_any(chunk)).select((
                        got.id.0.into_sql::<diesel::sql_types::BigInt>(),
                        jobs::id,
                        policy.as_str().into_sql::<diesel::sql_types::Text>(),
                        false.into_sql::<diesel::sql_types::Bool>(),
                    )))
                    .into_columns((deps::child_id, deps::parent_id, deps::policy, deps::done))
                    .execute($conn)
                    .await?;
            }
            // The archived parents' edges (not in the live table the `SELECT` reads): few, one
            // row each; counted below like any parent that already ended.
            for &p in &archived {
                diesel::insert_into(deps::table)
                    .values((
                        deps::child_id.eq(got.id.0),
                        deps::parent_id.eq(p),
                        deps::policy.eq(policy.as_str()),
                        deps::done.eq(false),
                    ))
                    .execute($conn)
                    .await?;
            }
            for chunk in settled.chunks(CHUNK) {
                diesel::update(
                    deps::table
                        .filter(deps::child_id.eq(got.id.0))
                        .filter(deps::parent_id.eq_any(chunk)),
                )
                .set(deps::done.eq(true))
                .execute($conn)
                .await?;
            }
            let now = DbNow::new($now);
            if cancel {
                diesel::update(jobs::table.filter(jobs::id.eq(got.id.0)))
                    .set((
                        jobs::state.eq(JobState::Cancelled.as_str()),
                        jobs::finished_at.eq(now.nullable()),
                        jobs::unique_hold.eq(ReleaseHold(true)),
                    ))
                    .execute($conn)
                    .await?;
                diesel::update(deps::table.filter(deps::child_id.eq(got.id.0)))
                    .set(deps::done.eq(true))
                    .execute($conn)
                    .await?;
            } else if open {
                diesel::update(jobs::table.filter(jobs::id.eq(got.id.0)))
                    .set(jobs::state.eq(WAITING))
                    .execute($conn)
                    .await?;
            } else {
                $due.push(job.queue.clone());
            }
            got
        }
    }};
}

/// Enqueues `jobs` (some naming parents) on `conn`, in whatever transaction it has open
/// (the caller's, for `Client::enqueue_in`; in a savepoint of it, or a transaction of its
/// own if none is open): ids in input order, and the queues of the jobs due at once. One
/// function per connection type, all from [`enqueue_child!`].
macro_rules! enqueue_dependent_on {
    ($(#[$attr:meta])* $name:ident, $conn_ty:ty $(, $s:ident)?) => {
        $(#[$attr])*
        pub(crate) async fn $name$(<$s>)?(
            conn: &mut $conn_ty,
            jobs: &[NewJob],
            now: Option<i64>,
            ir: bool,
        ) -> Result<(Vec<Enqueued>, Vec<String>)>
        $(where
            $conn_ty: OutboxConnection
                + diesel_async::AsyncConnection<Backend = diesel::sqlite::Sqlite>
                + Send,
            $s: ,)?
        {
            // A savepoint inside the caller's transaction, or a transaction of its own without
            // one: a child is inserted `pending` and set `waiting` by a later statement, which
            // must never commit apart.
            // (The transaction manager's steps, not `AsyncConnection::transaction`: its
            // closure's future cannot be shown `Send` for every connection lifetime here.)
            <<$conn_ty as diesel_async::AsyncConnection>::TransactionManager as diesel_async::TransactionManager<$conn_ty>>::begin_transaction(conn).await?;
            let res = async {
                let mut due = Vec::new();
                let mut out = Vec::with_capacity(jobs.len());
                for job in jobs {
                    out.push(enqueue_child!(conn, job, &[], now, ir, due));
                }
                Ok::<_, Error>((out, due))
            }
            .await;
            match res {
                Ok(v) => {
                    <<$conn_ty as diesel_async::AsyncConnection>::TransactionManager as diesel_async::TransactionManager<$conn_ty>>::commit_transaction(conn)
                        .await?;
                    Ok(v)
                }
                Err(e) => {
                    // The error says what went wrong; a failed rollback leaves the caller's
                    // transaction to be rolled back by the caller, as the error asks anyway.
                    let _ =
                        <<$conn_ty as diesel_async::AsyncConnection>::TransactionManager as diesel_async::TransactionManager<$conn_ty>>::rollback_transaction(
                            conn,
                        )
                        .await;
                    Err(e)
                }
            }
        }
    };
}

enqueue_dependent_on!(
    #[cfg(feature = "postgres")]
    enqueue_dependent_pg,
    diesel_async::AsyncPgConnection
);
enqueue_dependent_on!(
    #[cfg(feature = "mysql")]
    enqueue_dependent_mysql,
    diesel_async::AsyncMysqlConnection
);
enqueue_dependent_on!(
    #[cfg(feature = "sqlite")]
    enqueue_dependent_sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::sqlite::SqliteConnection, S>,
    S
);

impl Store {
    /// Enqueues jobs of which some name parents, in one transaction, ids in input order.
    /// Returns them and the queues of the jobs that are due at once (to wake fetchers).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming a parent that does not exist (nothing is stored);
    /// [`Error::Database`].
    pub(crate) async fn enqueue_dependent(
        &self,
        batch: &[NewJob],
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(Vec<Enqueued>, Vec<String>)> {
        self.validate_jobs(batch)?;
        let now = bound(now);
        let ir = self.insert_returning();
        retrying!(async {
            with_tx!(self, |conn| {
                let mut due = Vec::new();
                let mut out = Vec::with_capacity(batch.len());
                for job in batch {
                    out.push(enqueue_child!(conn, job, &[], now, ir, due));
                }
                Ok::<_, Error>((out, due))
            })
        })
    }

    /// Enqueues `members` and a `callback` that waits for all of them with
    /// [`ParentPolicy::Run`] (it runs once every member has ended, whatever the outcome), in
    /// one transaction. Returns the batch and the queues due at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad job or an empty batch; [`Error::Database`].
    pub(crate) async fn enqueue_batch(
        &self,
        members: &[NewJob],
        callback: NewJob,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(Batch, Vec<String>)> {
        if members.is_empty() || members.len() > crate::dependency::MAX_PARENTS {
            return Err(Error::invalid(
                "members",
                format!(
                    "a batch of {} jobs; expected 1 to {} members",
                    members.len(),
                    crate::dependency::MAX_PARENTS
                ),
            ));
        }
        self.validate_jobs(members)?;
        let callback = callback.on_parent_failure(ParentPolicy::Run);
        self.validate_jobs(std::slice::from_ref(&callback))?;
        let now = bound(now);
        let ir = self.insert_returning();
        retrying!(async {
            with_tx!(self, |conn| {
                let mut due = Vec::new();
                let mut out = Vec::with_capacity(members.len());
                if members.iter().any(NewJob::needs_links) {
                    for job in members {
                        out.push(enqueue_child!(conn, job, &[], now, ir, due));
                    }
                } else {
                    // Members without parents of their own: one batched enqueue.
                    let got = conn.enqueue_on(members, now, ir).await?;
                    for (job, e) in members.iter().zip(got) {
                        let e = e.ok_or_else(|| {
                            Error::Database(StoreError::Transient(
                                "a duplicate job kept disappearing while enqueueing; try again"
                                    .into(),
                            ))
                        })?;
                        if !e.duplicate {
                            due.push(job.queue.clone());
                        }
                        out.push(e);
                    }
                }
                let ids: Vec<i64> = out.iter().map(|e| e.id.0).collect();
                let cb = enqueue_child!(conn, &callback, &ids, now, ir, due);
                Ok::<_, Error>((
                    Batch {
                        members: out,
                        callback: cb,
                    },
                    due,
                ))
            })
        })
    }

    /// Settles the children of `parents` (jobs that just ended): each open edge from an ended
    /// parent is counted by its child's policy — a success always, a dead or cancelled
    /// parent by `run` — a `cancel` child of a failed parent is cancelled (and its own
    /// children settled in turn), and a child with no open edge left is released
    /// (`waiting` → `pending`, due at once; its `run_at` is kept). Idempotent.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_settle_children(
        &self,
        parents: &[i64],
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Settled> {
        let at = now;
        let mut settled = Settled::default();
        let mut frontier: Vec<i64> = parents.to_vec();
        for _ in 0..MAX_GENERATIONS {
            if frontier.is_empty() {
                break;
            }
            let mut children = BTreeSet::new();
            for chunk in frontier.chunks(CHUNK) {
                let rows: Vec<i64> = with_conn!(self, |conn| deps::table
                    .filter(deps::parent_id.eq_any(chunk))
                    .filter(deps::done.eq(false))
                    .select(deps::child_id)
                    .load(conn)
                    .await?);
                children.extend(rows);
            }
            let children: Vec<i64> = children.into_iter().collect();
            let mut next = Vec::new();
            for chunk in children.chunks(SETTLE_CHUNK) {
                let (released, cancelled) = retrying!(self.faulted_owned(
                    Op::Settle,
                    SettleParams {
                        children: chunk.to_vec(),
                        parents: frontier.clone(),
                        now: at,
                    },
                    |s, p| async move { s.settle_some(p).await }
                ))?;
                settled.released.extend(released);
                next.extend(cancelled.iter().copied());
                settled.cancelled.extend(cancelled.into_iter().map(JobId));
            }
            frontier = next;
        }
        Ok(settled)
    }

    /// One transaction of [`job_settle_children`](Self::job_settle_children): settles
    /// `children` (in id order, so concurrent settles lock them in one order) against the
    /// ended `parents`. Returns the released children's queues and the cancelled children.
    async fn settle_some(&self, p: SettleParams) -> Result<(Vec<String>, Vec<i64>)> {
        let now = DbNow::new(bound(p.now));
        let (children, parents) = (p.children, p.parents);
        // The guard catalogue's switch: with it, a child is locked and released whatever
        // its state (test builds only).
        let waiting: &[&str] = if on(Mutation::ReleaseOnce) {
            &[WAITING, PENDING, RUNNING, SUCCEEDED]
        } else {
            &[WAITING]
        };
        with_tx!(self, |conn| {
            let mut released = Vec::new();
            let mut cancelled = Vec::new();
            for &child in &children {
                // The lock: every settle of this child takes its turn here.
                let locked = diesel::update(
                    jobs::table
                        .filter(jobs::id.eq(child))
                        .filter(jobs::state.eq_any(waiting)),
                )
                .set(jobs::version.eq(jobs::version + 1))
                .execute(conn)
                .await?;
                if locked == 0 {
                    continue;
                }
                let mut edges: Vec<(i64, String, String)> = Vec::new();
                for chunk in parents.chunks(CHUNK) {
                    let rows: Vec<(i64, String, String)> = deps::table
                        .inner_join(jobs::table.on(jobs::id.eq(deps::parent_id)))
                        .filter(deps::child_id.eq(child))
                        .filter(deps::parent_id.eq_any(chunk))
                        .filter(deps::done.eq(false))
                        .select((deps::parent_id, deps::policy, jobs::state))
                        .load(conn)
                        .await?;
                    edges.extend(rows);
                }
                let mut done = Vec::new();
                let mut cancel = false;
                for (parent, policy, state) in &edges {
                    let policy = ParentPolicy::parse(policy);
                    if state == SUCCEEDED || (policy == ParentPolicy::Run && failed(state)) {
                        done.push(*parent);
                    } else if policy == ParentPolicy::Cancel && failed(state) {
                        cancel = true;
                    }
                }
                if cancel {
                    diesel::update(jobs::table.filter(jobs::id.eq(child)))
                        .set((
                            jobs::state.eq(JobState::Cancelled.as_str()),
                            jobs::finished_at.eq(now.nullable()),
                            jobs::updated_at.eq(now),
                            jobs::unique_hold.eq(ReleaseHold(true)),
                        ))
                        .execute(conn)
                        .await?;
                    diesel::update(deps::table.filter(deps::child_id.eq(child)))
                        .set(deps::done.eq(true))
                        .execute(conn)
                        .await?;
                    cancelled.push(child);
                    continue;
                }
                for chunk in done.chunks(CHUNK) {
                    diesel::update(
                        deps::table
                            .filter(deps::child_id.eq(child))
                            .filter(deps::parent_id.eq_any(chunk)),
                    )
                    .set(deps::done.eq(true))
                    .execute(conn)
                    .await?;
                }
                let open: Option<i64> = deps::table
                    .filter(deps::child_id.eq(child))
                    .filter(deps::done.eq(false))
                    .select(deps::parent_id)
                    .first(conn)
                    .await
                    .optional()?;
                if open.is_none() {
                    let n = diesel::update(
                        jobs::table
                            .filter(jobs::id.eq(child))
                            .filter(jobs::state.eq_any(waiting)),
                    )
                    .set((
                        jobs::state.eq(JobState::Pending.as_str()),
                        jobs::updated_at.eq(now),
                    ))
                    .execute(conn)
                    .await?;
                    if n == 1 {
                        let queue: String = jobs::table
                            .filter(jobs::id.eq(child))
                            .select(jobs::queue)
                            .first(conn)
                            .await?;
                        released.push(queue);
                    }
                }
            }
            // Due now without a new id: the nodes of other processes learn it at commit.
            announce_due(conn, &released).await?;
            Ok::<_, Error>((released, cancelled))
        })
    }

    /// The sweeper's backstop: settles up to `limit` parents that ended with an open edge
    /// still counting them (their finalizer crashed between the end and the settle). A
    /// `wait` edge of a failed parent stays open by design and is not picked up.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_settle_stranded(
        &self,
        limit: u32,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Settled> {
        let terminal = [
            JobState::Succeeded.as_str(),
            JobState::Dead.as_str(),
            JobState::Cancelled.as_str(),
        ];
        // `NOT done`, not `done = ?`: the open edges' index (`jobvisor_job_deps_open_parent_idx`,
        // partial `WHERE NOT done` on PostgreSQL and SQLite) can serve only a predicate the
        // planner sees — a bind would hide it from a cached generic plan — and it reads the
        // open edges only, never every edge ever written.
        let parents: Vec<i64> = with_conn!(self, |conn| deps::table
            .inner_join(jobs::table.on(jobs::id.eq(deps::parent_id)))
            .filter(diesel::dsl::not(deps::done))
            .filter(jobs::state.eq_any(terminal))
            .filter(
                jobs::state
                    .eq(SUCCEEDED)
                    .or(deps::policy.ne(ParentPolicy::Wait.as_str())),
            )
            .select(deps::parent_id)
            .distinct()
            .limit(i64::from(limit))
            .load(conn)
            .await?);
        if parents.is_empty() {
            return Ok(Settled::default());
        }
        self.job_settle_children(&parents, now).await
    }

    /// Cancels a job and every descendant not yet ended, whatever its policy: waiting,
    /// pending and retrying ones at once, running ones by a cancel request. Returns the
    /// descendants reached (the job itself not counted).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown id; [`Error::Database`].
    pub(crate) async fn job_cancel_cascade(
        &self,
        id: JobId,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Vec<JobId>> {
        // Children first: a parent cancelled first would cancel `cancel`-policy children by
        // itself, and `run`-policy ones would be released before they could be reached.
        let mut order = Vec::new();
        let mut seen = BTreeSet::from([id.0]);
        let mut frontier = vec![id.0];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for chunk in frontier.chunks(CHUNK) {
                let rows: Vec<i64> = with_conn!(self, |conn| deps::table
                    .filter(deps::parent_id.eq_any(chunk))
                    .select(deps::child_id)
                    .load(conn)
                    .await?);
                next.extend(rows.into_iter().filter(|c| seen.insert(*c)));
            }
            order.extend(next.iter().copied());
            frontier = next;
        }
        let mut reached = Vec::with_capacity(order.len());
        for child in order.into_iter().rev() {
            match self
                .job_cancel(super::CancelParams {
                    id: JobId(child),
                    now,
                })
                .await
            {
                Ok(_) => reached.push(JobId(child)),
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.job_cancel(super::CancelParams { id, now }).await?;
        Ok(reached)
    }

    /// A job's parents and children, each with its state (live or archived).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub(crate) async fn job_dependencies(&self, id: JobId) -> Result<Dependencies> {
        let parents: Vec<(i64, String, bool)> = with_conn!(self, |conn| deps::table
            .filter(deps::child_id.eq(id.0))
            .select((deps::parent_id, deps::policy, deps::done))
            .order(deps::parent_id.asc())
            .load(conn)
            .await?);
        let children: Vec<(i64, String, bool)> = with_conn!(self, |conn| deps::table
            .filter(deps::parent_id.eq(id.0))
            .select((deps::child_id, deps::policy, deps::done))
            .order(deps::child_id.asc())
            .load(conn)
            .await?);
        let ids: Vec<i64> = parents.iter().chain(&children).map(|r| r.0).collect();
        let states = self.states_of(&ids).await?;
        let link = |(other, policy, done): (i64, String, bool)| Link {
            id: JobId(other),
            state: states.get(&other).copied(),
            policy: ParentPolicy::parse(&policy),
            settled: done,
        };
        Ok(Dependencies {
            parents: parents.into_iter().map(link).collect(),
            children: children.into_iter().map(link).collect(),
        })
    }

    /// Child `child`'s parents, each with its state and stored result, by parent id: read
    /// from the live table or else the archive, a page of [`CHUNK`] parents at a time (the
    /// edges by parent id, then those parents' rows). A parent pruned from the archive took
    /// its edge with it, so it is not listed.
    ///
    /// The read stops after the page in which the results read so far pass `max_bytes` of
    /// JSON (the caller refuses them, [`ParentResults`](crate::ParentResults)): a fan-in of
    /// 100,000 parents with large results holds at most one page past the cap in memory,
    /// where a single statement held every row.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a parent whose stored state is unknown; [`Error::Database`].
    pub(crate) async fn job_parent_results(
        &self,
        child: JobId,
        max_bytes: usize,
    ) -> Result<Vec<(JobId, JobState, Option<serde_json::Value>)>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut after = i64::MIN;
        loop {
            let page: Vec<i64> = with_conn!(self, |conn| deps::table
                .filter(deps::child_id.eq(child.0))
                .filter(deps::parent_id.gt(after))
                .order(deps::parent_id)
                .select(deps::parent_id)
                .limit(CHUNK as i64)
                .load(conn)
                .await?);
            let Some(&last) = page.last() else { break };
            let mut rows: Vec<(i64, String, Option<serde_json::Value>)> =
                with_conn!(self, |conn| jobs::table
                    .filter(jobs::id.eq_any(&page))
                    .select((jobs::id, jobs::state, jobs::result))
                    .load(conn)
                    .await?);
            if rows.len() < page.len() {
                let gone: Vec<i64> = page
                    .iter()
                    .copied()
                    .filter(|i| !rows.iter().any(|(l, ..)| l == i))
                    .collect();
                let archived: Vec<(i64, String, Option<serde_json::Value>)> =
                    with_conn!(self, |conn| archive::table
                        .filter(archive::id.eq_any(&gone))
                        .select((archive::id, archive::state, archive::result))
                        .load(conn)
                        .await?);
                rows.extend(archived);
            }
            rows.sort_unstable_by_key(|r| r.0);
            for (id, state, result) in rows {
                let state = state.parse().map_err(|_| Error::Corrupt {
                    id: JobId(id),
                    reason: format!("its state {state:?} is not one jobvisor knows"),
                })?;
                bytes = bytes.saturating_add(result.as_ref().map_or(0, payload_size));
                out.push((JobId(id), state, result));
            }
            if bytes > max_bytes || page.len() < CHUNK {
                break;
            }
            after = last;
        }
        Ok(out)
    }

    /// The states of `ids`, from the live table or else the archive.
    async fn states_of(&self, ids: &[i64]) -> Result<HashMap<i64, JobState>> {
        let mut out = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let live: Vec<(i64, String)> = with_conn!(self, |conn| jobs::table
                .filter(jobs::id.eq_any(chunk))
                .select((jobs::id, jobs::state))
                .load(conn)
                .await?);
            let gone: Vec<i64> = chunk
                .iter()
                .copied()
                .filter(|i| !live.iter().any(|(l, _)| l == i))
                .collect();
            let archived: Vec<(i64, String)> = if gone.is_empty() {
                Vec::new()
            } else {
                with_conn!(self, |conn| archive::table
                    .filter(archive::id.eq_any(&gone))
                    .select((archive::id, archive::state))
                    .load(conn)
                    .await?)
            };
            for (i, s) in live.into_iter().chain(archived) {
                if let Ok(st) = s.parse() {
                    out.insert(i, st);
                }
            }
        }
        Ok(out)
    }
}
