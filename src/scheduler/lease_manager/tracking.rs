//! Tracking: what the fetchers hand the lease manager — each claimed job's lease
//! ([`TrackLeases`]) and, once at start, which fetcher frees which queue's slots
//! ([`RegisterFetchers`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use super::{Key, Lease, LeaseManager};
use crate::job::JobId;
use crate::lease::LeaseToken;
use crate::metrics::KindMetrics;
use crate::scheduler::attempt::{us, Attempt};
use crate::scheduler::fetcher::SlotFreed;
use crate::scheduler::job_supervisor::JobSupervisor;

/// Tells the lease manager which fetcher frees which queue's slots (sent once at start).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RegisterFetchers(pub(crate) HashMap<String, Recipient<SlotFreed>>);

impl Handler<RegisterFetchers> for LeaseManager {
    type Result = ();

    fn handle(&mut self, msg: RegisterFetchers, _ctx: &mut Context<Self>) {
        self.fetchers = msg.0;
    }
}

/// One claimed job's lease, as handed over by its fetcher.
#[derive(Debug)]
pub(crate) struct TrackLease {
    /// The job.
    pub(crate) id: JobId,
    /// The claim's token.
    pub(crate) token: LeaseToken,
    /// Its queue (whose budget to free).
    pub(crate) queue: Arc<str>,
    /// Its kind.
    pub(crate) kind: Arc<str>,
    /// Its supervisor.
    pub(crate) supervisor: Arc<JobSupervisor>,
    /// When the claim was sent (the node's monotonic clock).
    pub(crate) claimed_at: Duration,
    /// When the job was enqueued.
    pub(crate) created_at: DateTime<Utc>,
    /// The job's timeout per attempt.
    pub(crate) timeout: Duration,
    /// The start gate shared with its supervisor.
    pub(crate) attempt: Arc<Attempt>,
    /// Its (queue, kind)'s instruments.
    pub(crate) metrics: Arc<KindMetrics>,
}

/// A fetcher claimed jobs: track their leases (one message per claim).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct TrackLeases(pub(crate) Vec<TrackLease>);

impl Handler<TrackLeases> for LeaseManager {
    type Result = ();

    fn handle(&mut self, TrackLeases(leases): TrackLeases, _ctx: &mut Context<Self>) {
        for m in leases {
            self.leases.insert(
                Key(m.id, m.token),
                Lease {
                    queue: m.queue,
                    kind: m.kind,
                    created_at: m.created_at,
                    supervisor: m.supervisor,
                    metrics: m.metrics,
                    attempt: m.attempt,
                    claimed_at: us(m.claimed_at),
                    timeout: us(m.timeout),
                    start_recorded: false,
                    cancel_deadline: None,
                    finishing: false,
                    stopped: false,
                    fenced: false,
                    stop_deadline: None,
                },
            );
        }
    }
}
