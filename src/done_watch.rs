//! [`DoneWatch`]: how [`Client::wait`](crate::Client::wait) hears at once that its job ended,
//! where the database says so (PostgreSQL: `jobvisor_done`, notified with the ended jobs
//! somebody registered a wait on; the registry and why no end is missed: `store/waits.rs`).
//!
//! One listening connection serves every wait of a [`Client`](crate::Client) and its
//! clones: opened by the first wait, closed once no wait has used it for [`IDLE_CLOSE`].
//! Each notification is passed to the waiters, which re-read their job when it names it (or
//! names none: re-check, sent each time the `LISTEN` takes hold). A wait registers its job
//! only once the `LISTEN` has taken hold ([`Subscription::listening`]), and polls as well, as
//! it always did, so a listener that is down, late or never opened (MariaDB, SQLite) only
//! makes it no faster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::job::JobId;
use crate::store::{Notice, Store};

/// How long the listener stays open with no waiter before it closes.
const IDLE_CLOSE: Duration = Duration::from_secs(30);
/// Pause before listening again after the listener failed (the poll covers the gap).
const RETRY: Duration = Duration::from_secs(1);
/// Notifications buffered per waiter; one that falls further behind re-checks.
const BUFFER: usize = 256;

/// The jobs a notification said ended; empty: re-check (the `LISTEN` took hold, or a payload
/// that names no ids).
type Ended = Arc<Vec<i64>>;

/// The running listener: its channel to the waiters, and whether its `LISTEN` holds now.
#[derive(Debug, Clone)]
struct Running {
    tx: broadcast::Sender<Ended>,
    listening: Arc<AtomicBool>,
}

/// The shared listener of ended jobs of one client (see the module docs).
#[derive(Debug)]
pub(crate) struct DoneWatch {
    store: Store,
    /// The running listener; `None` while none runs.
    slot: Mutex<Option<Running>>,
}

/// One wait's view of the listener.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: broadcast::Receiver<Ended>,
    listening: Arc<AtomicBool>,
}

impl DoneWatch {
    /// A watch on `store`'s ended jobs; nothing is opened until [`DoneWatch::subscribe`].
    pub(crate) fn new(store: Store) -> Arc<Self> {
        Arc::new(DoneWatch {
            store,
            slot: Mutex::new(None),
        })
    }

    /// A waiter's subscription, starting the listener if none runs; `None` on backends
    /// without notifications or outside a tokio runtime.
    pub(crate) fn subscribe(self: &Arc<Self>) -> Option<Subscription> {
        if !self.store.notifies() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = slot.as_ref() {
            return Some(Subscription {
                rx: r.tx.subscribe(),
                listening: Arc::clone(&r.listening),
            });
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        let running = Running {
            tx,
            listening: Arc::default(),
        };
        let sub = Subscription {
            rx,
            listening: Arc::clone(&running.listening),
        };
        *slot = Some(running.clone());
        runtime.spawn(Arc::clone(self).listen(running));
        Some(sub)
    }

    /// Passes notifications to the waiters, listening again after a failure, until no waiter
    /// has subscribed for [`IDLE_CLOSE`].
    async fn listen(self: Arc<Self>, r: Running) {
        loop {
            if let Ok(Some(mut listener)) = self.store.listen_done().await {
                // Marked first: a waiter woken by the re-check below finds it listening and
                // registers; whatever ended before the `LISTEN` took hold is read by all.
                r.listening.store(true, Ordering::SeqCst);
                let _ = r.tx.send(Arc::default());
                loop {
                    match tokio::time::timeout(IDLE_CLOSE, listener.next()).await {
                        Ok(Some(Ok(Notice::Done(ids)))) => {
                            let _ = r.tx.send(Arc::new(ids));
                        }
                        Ok(Some(Ok(_))) => {}
                        Ok(None | Some(Err(_))) => break,
                        Err(_idle) if self.close_if_idle(&r.tx) => return,
                        Err(_idle) => {}
                    }
                }
                r.listening.store(false, Ordering::SeqCst);
            }
            if self.close_if_idle(&r.tx) {
                return;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Forgets the listener when no waiter holds a subscription (under the lock a new waiter
    /// subscribes with, so none is left with a dead one); whether it did.
    fn close_if_idle(&self, tx: &broadcast::Sender<Ended>) -> bool {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if tx.receiver_count() > 0 {
            return false;
        }
        *slot = None;
        true
    }
}

impl Subscription {
    /// Whether the listener's `LISTEN` holds now: a wait registered from then on is told
    /// of its job's end (`store/waits.rs`).
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Returns when job `id` may have ended: a notification naming it or naming none, or one
    /// missed; never when the listener is gone (the caller's poll bounds the wait).
    pub(crate) async fn woken(&mut self, id: JobId) {
        loop {
            match self.rx.recv().await {
                Ok(ids) if ids.is_empty() || ids.contains(&id.0) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

/// A wait counted in the store's registry, removed when dropped — when the wait returns, or
/// is itself dropped — by a task of its own, so the wait's answer does not wait for it.
#[derive(Debug)]
pub(crate) struct Registration {
    store: Store,
    id: JobId,
}

impl Registration {
    /// Registers a wait on `id` for at most `ttl` (see [`Store::wait_register`]); `None` when
    /// none was counted (the job ended or is gone, or the backend has no registry).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn new(
        store: &Store,
        id: JobId,
        ttl: Duration,
    ) -> crate::error::Result<Option<Self>> {
        Ok(store.wait_register(id, ttl).await?.then(|| Registration {
            store: store.clone(),
            id,
        }))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Outside a runtime the row expires instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, id) = (self.store.clone(), self.id);
            runtime.spawn(async move {
                let _ = store.wait_unregister(id).await;
            });
        }
    }
}
