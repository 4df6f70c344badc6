//! The engine's own operations, opened to tests: the lease holder's store operations
//! ([`StoreEngine`], on [`Store`]) and the actors' addresses on a running node
//! ([`NodeActors`], on [`SchedulerHandle`]).
//!
//! Both are extension traits so that a test keeps writing `store.job_claim(…)` and
//! `handle.lease_manager()` after one `use jobvisor::testing::*`; without the `test-util`
//! feature neither exists and the operations are crate-private. Calling them by hand skips
//! renewal and fencing — exactly what crash, hostile-input and conformance tests need, and
//! what an application must never do.

use std::future::Future;
use std::sync::Arc;

use actix::Addr;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::job::{Job, JobId, JobState, NewJob};
use crate::scheduler::{Archiver, Fetcher, LeaseManager, Scheduler, SchedulerHandle, Sweeper};
use crate::store::faults::FaultPlan;
use crate::store::{
    ArchiveParams, CancelOutcome, CancelParams, ClaimParams, ClaimedJob, EnqueueParams, Enqueued,
    FinalizeParams, Guarded, ListParams, OutboxConnection, PruneParams, ReclaimParams, Reclaimed,
    RenewParams, Renewed, RetryParams, StateCount, Store,
};

/// The store's engine operations, one method each (see the crate-private methods of the same
/// names for their contracts). Not a stable API.
pub trait StoreEngine {
    /// Enqueues one job at `now` (`None`: the database clock).
    fn job_enqueue(
        &self,
        job: NewJob,
        now: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<Enqueued>> + Send;
    /// Enqueues many jobs, ids in input order.
    fn job_enqueue_many(
        &self,
        p: EnqueueParams,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
    /// Enqueues on the caller's connection (the transactional outbox).
    fn job_enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        p: EnqueueParams,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
    /// Claims up to `limit` due jobs of a queue under a new lease each.
    fn job_claim(&self, p: ClaimParams) -> impl Future<Output = Result<Vec<ClaimedJob>>> + Send;
    /// Renews many leases in one statement.
    fn job_renew_leases(
        &self,
        p: RenewParams,
    ) -> impl Future<Output = Result<Vec<(JobId, Guarded<Renewed>)>>> + Send;
    /// Finalizes many jobs, each guarded by its lease token.
    fn job_finalize_many(
        &self,
        p: FinalizeParams,
    ) -> impl Future<Output = Result<Vec<(JobId, Guarded<JobState>)>>> + Send;
    /// Reclaims running jobs whose lease expired or whose timeout passed.
    fn job_reclaim_expired(
        &self,
        p: ReclaimParams,
    ) -> impl Future<Output = Result<Vec<Reclaimed>>> + Send;
    /// Moves terminal jobs to the archive.
    fn job_archive(&self, p: ArchiveParams) -> impl Future<Output = Result<u64>> + Send;
    /// Deletes old archived jobs.
    fn job_prune_archive(&self, p: PruneParams) -> impl Future<Output = Result<u64>> + Send;
    /// Reclaims the live table's dead space where the backend needs it.
    fn job_vacuum_live(&self) -> impl Future<Output = Result<()>> + Send;
    /// Rolls the throughput history up at `at`, as a gauges turn taken then does: the
    /// rows written.
    fn throughput_roll(&self, at: DateTime<Utc>) -> impl Future<Output = Result<usize>> + Send;
    /// Cancels a job (see [`Client::cancel`](crate::Client::cancel)).
    fn job_cancel(&self, p: CancelParams) -> impl Future<Output = Result<CancelOutcome>> + Send;
    /// Retries a dead or cancelled job (see [`Client::retry`](crate::Client::retry)).
    fn job_retry(&self, p: RetryParams) -> impl Future<Output = Result<Guarded<Job>>> + Send;
    /// One job, live or archived; `None` when there is none.
    fn job_get(&self, id: JobId) -> impl Future<Output = Result<Option<Job>>> + Send;
    /// A page of jobs.
    fn job_list(&self, p: ListParams) -> impl Future<Output = Result<Vec<Job>>> + Send;
    /// A job's execution ledger (what `Client::claims` returns).
    fn job_claims(&self, id: JobId) -> impl Future<Output = Result<Vec<crate::Claim>>> + Send;
    /// Live jobs per queue and state.
    fn job_counts(&self) -> impl Future<Output = Result<Vec<StateCount>>> + Send;
    /// Installs a fault plan asked by each hot-path operation of this store and its clones
    /// (claim, renew, finalize, enqueue, reclaim) and by the leader's elections and fires;
    /// see [`FaultPlan`].
    fn inject_faults(&self, plan: Arc<dyn FaultPlan>);
}

impl StoreEngine for Store {
    fn job_enqueue(
        &self,
        job: NewJob,
        now: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        Store::job_enqueue(self, job, now)
    }
    fn job_enqueue_many(
        &self,
        p: EnqueueParams,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        Store::job_enqueue_many(self, p)
    }
    fn job_enqueue_in<C: OutboxConnection>(
        &self,
        conn: &mut C,
        p: EnqueueParams,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        Store::job_enqueue_in(self, conn, p)
    }
    fn job_claim(&self, p: ClaimParams) -> impl Future<Output = Result<Vec<ClaimedJob>>> + Send {
        Store::job_claim(self, p)
    }
    fn job_renew_leases(
        &self,
        p: RenewParams,
    ) -> impl Future<Output = Result<Vec<(JobId, Guarded<Renewed>)>>> + Send {
        Store::job_renew_leases(self, p)
    }
    fn job_finalize_many(
        &self,
        p: FinalizeParams,
    ) -> impl Future<Output = Result<Vec<(JobId, Guarded<JobState>)>>> + Send {
        Store::job_finalize_many(self, p)
    }
    fn job_reclaim_expired(
        &self,
        p: ReclaimParams,
    ) -> impl Future<Output = Result<Vec<Reclaimed>>> + Send {
        Store::job_reclaim_expired(self, p)
    }
    fn job_archive(&self, p: ArchiveParams) -> impl Future<Output = Result<u64>> + Send {
        Store::job_archive(self, p)
    }
    fn job_prune_archive(&self, p: PruneParams) -> impl Future<Output = Result<u64>> + Send {
        Store::job_prune_archive(self, p)
    }
    fn job_vacuum_live(&self) -> impl Future<Output = Result<()>> + Send {
        Store::job_vacuum_live(self)
    }
    fn throughput_roll(&self, at: DateTime<Utc>) -> impl Future<Output = Result<usize>> + Send {
        Store::throughput_roll(self, at.timestamp_micros())
    }
    fn job_cancel(&self, p: CancelParams) -> impl Future<Output = Result<CancelOutcome>> + Send {
        Store::job_cancel(self, p)
    }
    fn job_retry(&self, p: RetryParams) -> impl Future<Output = Result<Guarded<Job>>> + Send {
        Store::job_retry(self, p)
    }
    fn job_get(&self, id: JobId) -> impl Future<Output = Result<Option<Job>>> + Send {
        Store::job_get(self, id)
    }
    fn job_list(&self, p: ListParams) -> impl Future<Output = Result<Vec<Job>>> + Send {
        Store::job_list(self, p)
    }
    fn job_claims(&self, id: JobId) -> impl Future<Output = Result<Vec<crate::Claim>>> + Send {
        Store::job_claims(self, id)
    }
    fn job_counts(&self) -> impl Future<Output = Result<Vec<StateCount>>> + Send {
        Store::job_counts(self)
    }
    fn inject_faults(&self, plan: Arc<dyn FaultPlan>) {
        Store::inject_faults(self, plan);
    }
}

/// The actors' addresses on a running node, for tests driving them through their mailboxes.
/// Not a stable API.
pub trait NodeActors {
    /// The fetcher of `queue`, if the node has that queue.
    fn fetcher(&self, queue: &str) -> Option<Addr<Fetcher>>;
    /// The lease manager.
    fn lease_manager(&self) -> Addr<LeaseManager>;
    /// The sweeper.
    fn sweeper(&self) -> Addr<Sweeper>;
    /// The archiver.
    fn archiver(&self) -> Addr<Archiver>;
    /// The scheduler actor.
    fn scheduler(&self) -> Addr<Scheduler>;
}

impl NodeActors for SchedulerHandle {
    fn fetcher(&self, queue: &str) -> Option<Addr<Fetcher>> {
        SchedulerHandle::fetcher(self, queue)
    }
    fn lease_manager(&self) -> Addr<LeaseManager> {
        SchedulerHandle::lease_manager(self)
    }
    fn sweeper(&self) -> Addr<Sweeper> {
        SchedulerHandle::sweeper(self)
    }
    fn archiver(&self) -> Addr<Archiver> {
        SchedulerHandle::archiver(self)
    }
    fn scheduler(&self) -> Addr<Scheduler> {
        SchedulerHandle::scheduler(self)
    }
}
