//! [`DoneWatch`]: how [`Client::wait`](crate::Client::wait) hears at once that a job ended,
//! where the database says so (PostgreSQL: a finalize notifies `jobvisor_done` with the ids
//! it ended).
//!
//! One listening connection serves every wait of a [`Client`](crate::Client) and its
//! clones: opened by the first wait, closed once no wait has used it for
//! [`IDLE_CLOSE`]. Each notification is passed to the waiters, which re-read their job when
//! it names it (or names none: re-check). A waiter polls as well, as it always did, so a
//! listener that is down, late or never opened (MariaDB, SQLite) only makes it no faster.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::store::{Notice, Store};

/// How long the listener stays open with no waiter before it closes.
const IDLE_CLOSE: Duration = Duration::from_secs(30);
/// Pause before listening again after the listener failed (the poll covers the gap).
const RETRY: Duration = Duration::from_secs(1);
/// Notifications buffered per waiter; one that falls further behind re-checks.
const BUFFER: usize = 256;

/// The jobs a notification said ended; empty: re-check (a reconnect, an unreadable payload).
type Ended = Arc<Vec<i64>>;

/// The shared listener of ended jobs of one client (see the module docs).
#[derive(Debug)]
pub(crate) struct DoneWatch {
    store: Store,
    /// The running listener's channel; `None` while none runs.
    tx: Mutex<Option<broadcast::Sender<Ended>>>,
}

impl DoneWatch {
    /// A watch on `store`'s ended jobs; nothing is opened until [`DoneWatch::subscribe`].
    pub(crate) fn new(store: Store) -> Arc<Self> {
        Arc::new(DoneWatch {
            store,
            tx: Mutex::new(None),
        })
    }

    /// A waiter's receiver of ended jobs, starting the listener if none runs; `None` on
    /// backends without notifications or outside a tokio runtime.
    pub(crate) fn subscribe(self: &Arc<Self>) -> Option<broadcast::Receiver<Ended>> {
        if !self.store.notifies() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut slot = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = slot.as_ref() {
            return Some(tx.subscribe());
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        *slot = Some(tx.clone());
        runtime.spawn(Arc::clone(self).listen(tx));
        Some(rx)
    }

    /// Passes notifications to the waiters, listening again after a failure, until no waiter
    /// has subscribed for [`IDLE_CLOSE`].
    async fn listen(self: Arc<Self>, tx: broadcast::Sender<Ended>) {
        loop {
            if let Ok(Some(mut listener)) = self.store.listen_done().await {
                // Whatever ended before the `LISTEN` took hold: every waiter re-reads.
                let _ = tx.send(Arc::default());
                loop {
                    match tokio::time::timeout(IDLE_CLOSE, listener.next()).await {
                        Ok(Some(Ok(Notice::Done(ids)))) => {
                            let _ = tx.send(Arc::new(ids));
                        }
                        Ok(Some(Ok(_))) => {}
                        Ok(None | Some(Err(_))) => break,
                        Err(_idle) if self.close_if_idle(&tx) => return,
                        Err(_idle) => {}
                    }
                }
            }
            if self.close_if_idle(&tx) {
                return;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Forgets the listener when no waiter holds a receiver (under the lock a new waiter
    /// subscribes with, so none is left without one); whether it did.
    fn close_if_idle(&self, tx: &broadcast::Sender<Ended>) -> bool {
        let mut slot = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        if tx.receiver_count() > 0 {
            return false;
        }
        *slot = None;
        true
    }
}

/// Returns when `rx` says job `id` may have ended: a notification naming it or naming none,
/// or one missed; never when the listener is gone (the caller's poll goes on).
pub(crate) async fn ended(rx: &mut broadcast::Receiver<Ended>, id: i64) {
    loop {
        match rx.recv().await {
            Ok(ids) if ids.is_empty() || ids.contains(&id) => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
