//! Archiver: moves terminal jobs older than the retention to the archive table (succeeded and
//! cancelled after `archive_after`, default 24 h; dead ones after `archive_dead_after`,
//! default 28 days, so dead letters wait for a human) and deletes archived jobs older than
//! theirs (`prune_after`, default 7 days), with the audit log's entries older than that, in
//! bounded batches, so the
//! live table stays small however many jobs pass through: a pass that ends with work left
//! (every batch full) is followed at once by the next, so archiving keeps up with any job
//! rate instead of waiting for the next tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::{report_store_error, Event, Shared, StopActor};
use crate::store::{ArchiveParams, PruneParams};

/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);
/// Batches run back to back in one pass at most (the next tick continues).
const MAX_BATCHES_PER_PASS: usize = 10;
/// The live table is vacuumed after this many jobs, **50,000**, were moved out of it (PostgreSQL,
/// `VACUUM (SKIP_LOCKED)`). Autovacuum wakes once a minute at most: at tens of thousands of
/// jobs per second the table would grow by hundreds of megabytes of dead row versions
/// meanwhile.
pub(crate) const VACUUM_AFTER_MOVED: u64 = 50_000;

/// Archives and prunes.
pub struct Archiver {
    shared: Arc<Shared>,
    /// A pass is in flight; overlapping ticks are skipped.
    running: bool,
    /// Jobs moved since the live table was last vacuumed.
    moved_since_vacuum: u64,
    last_error: Option<Instant>,
}

impl std::fmt::Debug for Archiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archiver")
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

impl Archiver {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Archiver {
            shared,
            running: false,
            moved_since_vacuum: 0,
            last_error: None,
        }
    }
}

impl Actor for Archiver {
    type Context = Context<Self>;
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, MessageResponse)]
pub struct ArchiveReport {
    /// Jobs moved to the archive.
    pub moved: u64,
    /// Archived jobs deleted.
    pub pruned: u64,
}

/// Archive and prune now, in bounded batches.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "ArchiveReport")]
pub struct ArchiveNow;

impl Handler<ArchiveNow> for Archiver {
    type Result = ResponseActFuture<Self, ArchiveReport>;

    fn handle(&mut self, _: ArchiveNow, _ctx: &mut Context<Self>) -> Self::Result {
        if self.running {
            return Box::pin(fut::ready(ArchiveReport::default()));
        }
        self.running = true;
        let shared = self.shared.clone();
        let moved_before = self.moved_since_vacuum;
        let fut = async move {
            let cfg = &shared.config;
            let mut report = ArchiveReport::default();
            let mut more = false;
            for i in 0..MAX_BATCHES_PER_PASS {
                let n = shared
                    .store
                    .job_archive(ArchiveParams {
                        older_than: cfg.archive_after,
                        dead_older_than: cfg.archive_dead_after,
                        limit: cfg.archive_batch,
                        now: shared.clock.bound_now(),
                    })
                    .await?;
                report.moved += n;
                if n < u64::from(cfg.archive_batch) {
                    break;
                }
                more |= i + 1 == MAX_BATCHES_PER_PASS;
            }
            for i in 0..MAX_BATCHES_PER_PASS {
                let n = shared
                    .store
                    .job_prune_archive(PruneParams {
                        older_than: cfg.prune_after,
                        limit: cfg.archive_batch,
                        now: shared.clock.bound_now(),
                    })
                    .await?;
                report.pruned += n;
                if n < u64::from(cfg.archive_batch) {
                    break;
                }
                more |= i + 1 == MAX_BATCHES_PER_PASS;
            }
            // The audit log is kept as long as the archive.
            for i in 0..MAX_BATCHES_PER_PASS {
                let n = shared
                    .store
                    .audit_prune(cfg.prune_after, cfg.archive_batch, shared.clock.bound_now())
                    .await?;
                if n < u64::from(cfg.archive_batch) {
                    break;
                }
                more |= i + 1 == MAX_BATCHES_PER_PASS;
            }
            let vacuumed = moved_before + report.moved >= VACUUM_AFTER_MOVED;
            if vacuumed {
                shared.store.job_vacuum_live().await?;
            }
            Ok::<_, crate::Error>((report, more, vacuumed))
        };
        Box::pin(fut.into_actor(self).map(|res, act, ctx| {
            act.running = false;
            match res {
                Ok((r, more, vacuumed)) => {
                    act.moved_since_vacuum = if vacuumed {
                        0
                    } else {
                        act.moved_since_vacuum + r.moved
                    };
                    // Work left: go on now (between passes other messages get their turn).
                    // Without timers (simulation) only the caller drives passes.
                    if more && act.shared.config.timers {
                        ctx.notify(ArchiveNow);
                    }
                    if r.moved + r.pruned > 0 {
                        act.shared.events.emit(Event::Archived {
                            moved: r.moved,
                            pruned: r.pruned,
                        });
                    }
                    r
                }
                Err(e) => {
                    report_store_error(
                        &act.shared.events,
                        "archiver",
                        &mut act.last_error,
                        ERROR_LOG_EVERY,
                        &e,
                    );
                    ArchiveReport::default()
                }
            }
        }))
    }
}

impl Handler<StopActor> for Archiver {
    type Result = ();

    fn handle(&mut self, _: StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
