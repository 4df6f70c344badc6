//! The node-wide hold on handler starts while a detected pause is revalidated (ARCHITECTURE.md §6,
//! invariant 9).
//!
//! When the lease manager sees its timers fire far later than scheduled — the process was
//! frozen or starved of CPU — it holds every start until a renewal sent after the pause has
//! answered. Handler tasks wait here after taking their worker permit, then check their own
//! lease estimate ([`Attempt::try_start`](super::attempt::Attempt::try_start)); the estimate
//! alone already refuses leases that may have expired during the pause, and the hold adds
//! the database's own answer before anything starts.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct StartHold {
    held: AtomicBool,
    released: Notify,
}

impl StartHold {
    /// Holds every start until [`StartHold::release`].
    pub(crate) fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Lets waiting starts go on.
    pub(crate) fn release(&self) {
        self.held.store(false, Ordering::Release);
        self.released.notify_waiters();
    }

    /// Whether starts are held.
    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Returns once starts are not held.
    pub(crate) async fn wait(&self) {
        // Not held (every start but those racing a revalidation): no waiter is registered,
        // which would lock the `Notify`'s list twice per job.
        if !self.is_held() {
            return;
        }
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the check, so a release in between is not missed.
            released.as_mut().enable();
            if !self.is_held() {
                return;
            }
            released.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn waiters_go_on_only_after_the_release() {
        let h = Arc::new(StartHold::default());
        h.wait().await;
        h.hold();
        let waiter = tokio::spawn({
            let h = h.clone();
            async move { h.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        h.release();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("released")
            .expect("no panic");
    }
}
