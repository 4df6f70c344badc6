//! QueueWatch: keeps the node's view of its queues' shared settings ([`QueueGate`]) in step
//! with the database, so that a pause stops handler starts within a bound and a resume or a
//! loosened limit wakes the queue's fetcher at once (ARCHITECTURE.md §7.5).
//!
//! How it learns of a change:
//! * PostgreSQL: a trigger notifies `jobvisor_queues` on every change of settings; the
//!   listener forwards it here ([`RefreshSettings`]), and the settings are also re-read
//!   every [`REFRESH_EVERY`] in case a notification was lost while the listener reconnected.
//! * MariaDB/MySQL and SQLite have no notifications: every [`SIGNAL_EVERY`] the watch reads
//!   one small statement ([`ChangeSignal`]: the newest job's id, the count of ids above the
//!   floor [`IdGaps`] keeps below uncommitted ids, a digest of the settings table and the
//!   wake counter). A changed digest makes it re-read the settings; a newer job, an older
//!   one committed late (the count moved), or a moved wake counter (a job another process made due without a new id: a
//!   dependency child released, a retry by hand, a refunded reclaim), wakes the node's
//!   fetchers that have idle workers, so such a job is picked up within the signal interval
//!   rather than at the next poll. The first reading, a baseline, wakes them too: a job
//!   committed between their first claims and it shows in no later change. A moved wake counter also has the lease manager renew its
//!   leases at once ([`CancelAsked`]): a cancel of a running job moves it too.
//!
//! What it does with a change of a queue this node serves:
//! * paused: closes the gate (no handler of the queue starts any more) and has the lease
//!   manager give back the queue's claimed jobs that have not started, without using an
//!   attempt ([`WithdrawQueue`]); handlers already running finish normally;
//! * resumed, or limits changed: opens the gate and wakes the fetcher.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::fetcher::{NewJobsElsewhere, Wake};
use super::id_gaps::IdGaps;
use super::lease_manager::{CancelAsked, WithdrawQueue};
use super::{report_store_error, Shared};
use crate::store::{ChangeSignal, QueueInfo};

/// How often a node without database notifications reads the change signal: **80 ms**
/// (12.5 one-row statements a second per node). A job another process enqueues starts after
/// half of it at the median, and an idle MariaDB node sends about 23 statements a second in
/// all, under 25 (at 50 ms: 31).
pub(crate) const SIGNAL_EVERY: Duration = Duration::from_millis(80);
/// How often a node with notifications (PostgreSQL) re-reads the settings anyway: **1 s**.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// Store errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// Keeps the node's [`QueueGate`](super::queue_gate::QueueGate)s in step; see the module docs.
pub(crate) struct QueueWatch {
    shared: Arc<Shared>,
    fetchers: HashMap<String, Recipient<Wake>>,
    elsewhere: HashMap<String, Recipient<NewJobsElsewhere>>,
    lease_manager: Recipient<WithdrawQueue>,
    /// Told when the wake counter moves: a cancel of a running job may have moved it.
    cancels: Recipient<CancelAsked>,
    /// The settings last read, by queue (served queues only; absent: no settings).
    seen: HashMap<String, QueueInfo>,
    /// The change signal last read.
    signal: Option<ChangeSignal>,
    /// The floor below uncommitted job ids, and the jobs read above it.
    ids: IdGaps,
    /// A read is in flight; `again`: another was asked for meanwhile.
    reading: bool,
    again: bool,
    /// The last read of the settings failed: read them again at the next signal.
    stale: bool,
    last_error: Option<Instant>,
}

impl std::fmt::Debug for QueueWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWatch")
            .field("seen", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl QueueWatch {
    pub(crate) fn new(
        shared: Arc<Shared>,
        fetchers: HashMap<String, Recipient<Wake>>,
        elsewhere: HashMap<String, Recipient<NewJobsElsewhere>>,
        lease_manager: Recipient<WithdrawQueue>,
        cancels: Recipient<CancelAsked>,
    ) -> Self {
        QueueWatch {
            shared,
            fetchers,
            elsewhere,
            lease_manager,
            cancels,
            seen: HashMap::new(),
            signal: None,
            ids: IdGaps::default(),
            reading: false,
            again: false,
            stale: false,
            last_error: None,
        }
    }

    fn store_failed(&mut self, e: &crate::Error) {
        report_store_error(
            &self.shared.events,
            "queue watch",
            &mut self.last_error,
            ERROR_LOG_EVERY,
            e,
        );
    }

    /// Reads the settings and applies them (one read at a time; a request meanwhile is
    /// served when it returns).
    fn refresh(&mut self, ctx: &mut Context<Self>) {
        if self.reading {
            self.again = true;
            return;
        }
        self.reading = true;
        let store = self.shared.store.clone();
        let read = async move { store.queues_list().await };
        ctx.spawn(read.into_actor(self).map(|res, act, ctx| {
            act.reading = false;
            match res {
                Ok(list) => {
                    act.stale = false;
                    act.apply(list);
                }
                Err(e) => {
                    // Read again at the next signal, and meanwhile claims look up rows
                    // themselves.
                    act.stale = true;
                    act.shared.store.forget_settings();
                    act.store_failed(&e);
                }
            }
            if std::mem::take(&mut act.again) {
                act.refresh(ctx);
            }
        }));
    }

    /// Applies the settings read: every served queue's gate, the give-backs and wakes.
    fn apply(&mut self, list: Vec<QueueInfo>) {
        // First, so a fetcher woken below for a queue that gained a row claims it controlled.
        // Only a watch that keeps reading (timers on) may spare the claims their look-up.
        if self.shared.config.timers {
            self.shared
                .store
                .note_settings(self.shared.queue_gates.keys(), &list);
        }
        let mut now: HashMap<String, QueueInfo> = list
            .into_iter()
            .filter(|q| self.shared.queue_gates.contains_key(&q.name))
            .map(|q| (q.name.clone(), q))
            .collect();
        // In the queues' order, not the map's: what the give-backs and wakes set off is
        // then the same on every run (a seeded simulation replays it).
        let mut gates: Vec<_> = self.shared.queue_gates.iter().collect();
        gates.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (queue, gate) in gates {
            let info = now.remove(queue);
            gate.set_limit(info.as_ref().and_then(|i| i.limits.concurrency));
            let paused = info.as_ref().is_some_and(QueueInfo::is_paused);
            let changed = gate.set_paused(paused);
            if changed && paused {
                tracing::info!(queue = %queue, "queue paused: no handler of it starts any more");
                self.lease_manager.do_send(WithdrawQueue(queue.clone()));
            }
            let limits = |i: Option<&QueueInfo>| i.map(|i| i.limits);
            let limits_changed = limits(info.as_ref()) != limits(self.seen.get(queue));
            if !paused && (changed || limits_changed) {
                if let Some(f) = self.fetchers.get(queue) {
                    f.do_send(Wake);
                }
            }
            match info {
                Some(i) => self.seen.insert(queue.clone(), i),
                None => self.seen.remove(queue),
            };
        }
    }

    /// Reads the change signal (backends without notifications).
    fn check_signal(&mut self, ctx: &mut Context<Self>) {
        if self.reading {
            return;
        }
        self.reading = true;
        let store = self.shared.store.clone();
        let floor = self.ids.floor();
        let read = async move { store.change_signal(floor).await };
        ctx.spawn(read.into_actor(self).map(|res, act, ctx| {
            act.reading = false;
            match res {
                Ok(signal) => {
                    let before = act.signal.replace(signal);
                    // A newer job, an older one committed late, or a job made due without
                    // a new id (a child released, a retry by hand, a refunded reclaim:
                    // `store::wakes`).
                    let appeared =
                        act.ids
                            .read(signal.newest_job, signal.above_floor, Instant::now());
                    // The first reading is only a baseline, and a job another process
                    // committed after the fetchers' first claims but before it would wait a
                    // whole poll: they look once more.
                    let first = before.is_none();
                    if appeared || first || before.is_some_and(|b| b.wakes != signal.wakes) {
                        for f in act.elsewhere.values() {
                            f.do_send(NewJobsElsewhere);
                        }
                    }
                    // Or a cancel of a running job: its holder renews at once to learn it.
                    if before.is_some_and(|b| b.wakes != signal.wakes) {
                        act.cancels.do_send(CancelAsked(None));
                    }
                    if before.is_none_or(|b| b.settings != signal.settings)
                        || act.again
                        || act.stale
                    {
                        act.again = false;
                        act.refresh(ctx);
                    }
                }
                Err(e) => act.store_failed(&e),
            }
        }));
    }
}

impl Actor for QueueWatch {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if !self.shared.config.timers {
            return;
        }
        self.refresh(ctx);
        if self.shared.store.notifies() {
            ctx.run_interval(REFRESH_EVERY, |act, ctx| act.refresh(ctx));
        } else {
            ctx.run_interval(SIGNAL_EVERY, |act, ctx| act.check_signal(ctx));
        }
    }
}

/// Re-read the settings now (a PostgreSQL notification, the periodic re-read, or a test).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub(crate) struct RefreshSettings;

impl Handler<RefreshSettings> for QueueWatch {
    type Result = ();

    fn handle(&mut self, _: RefreshSettings, ctx: &mut Context<Self>) {
        self.refresh(ctx);
    }
}

/// Reads the settings and applies them before answering (tests drive a node without timers
/// this way).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "crate::Result<()>")]
pub(crate) struct ReadSettings;

impl Handler<ReadSettings> for QueueWatch {
    type Result = ResponseActFuture<Self, crate::Result<()>>;

    fn handle(&mut self, _: ReadSettings, _ctx: &mut Context<Self>) -> Self::Result {
        let store = self.shared.store.clone();
        let read = async move { store.queues_list().await };
        Box::pin(
            read.into_actor(self)
                .map(|res, act, _| res.map(|list| act.apply(list))),
        )
    }
}

impl Handler<super::StopActor> for QueueWatch {
    type Result = ();

    fn handle(&mut self, _: super::StopActor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
