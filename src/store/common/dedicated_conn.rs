//! [`OwnConn`]: one connection kept outside the pools for a statement read many times a
//! second (the change signal, `queues.rs`), so that it pays no pool checkout — on MySQL a
//! checkout runs a verification statement, which doubled the signal's cost.
//!
//! Without the checkout ping, a dead connection is noticed by the read itself: a
//! [`Held`] connection goes back to the slot only when its user says the read succeeded
//! ([`Held::keep`]); after any failure, or a read abandoned mid-way (its bound, a dropped
//! future), the connection is closed and the next read opens a fresh one.

use std::future::Future;

use tokio::sync::{Mutex, MutexGuard};

/// A connection of its own, opened on first use and after any failure; see the module docs.
pub(crate) struct OwnConn<C> {
    slot: Mutex<Option<C>>,
}

impl<C> OwnConn<C> {
    /// An empty slot: the first [`OwnConn::take`] opens the connection.
    pub(crate) fn new() -> Self {
        OwnConn {
            slot: Mutex::new(None),
        }
    }

    /// The connection (one user at a time), opened with `open` if there is none.
    ///
    /// # Errors
    /// `open`'s error.
    pub(crate) async fn take<E, F, Fut>(&self, open: F) -> Result<Held<'_, C>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let mut slot = self.slot.lock().await;
        let conn = match slot.take() {
            Some(c) => c,
            None => open().await?,
        };
        Ok(Held { slot, conn })
    }
}

/// The connection, lent by [`OwnConn::take`]; closed when dropped unless [`Held::keep`] put
/// it back.
pub(crate) struct Held<'a, C> {
    slot: MutexGuard<'a, Option<C>>,
    conn: C,
}

impl<C> Held<'_, C> {
    /// The read succeeded: the connection is kept for the next one.
    pub(crate) fn keep(self) {
        let Held { mut slot, conn } = self;
        *slot = Some(conn);
    }
}

impl<C> std::ops::Deref for Held<'_, C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.conn
    }
}

impl<C> std::ops::DerefMut for Held<'_, C> {
    fn deref_mut(&mut self) -> &mut C {
        &mut self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_is_reopened_only_after_it_was_not_kept() {
        let own = OwnConn::new();
        let opened = std::sync::atomic::AtomicU32::new(0);
        let open =
            || async { Ok::<_, ()>(opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) };
        let c = own.take(open).await.unwrap();
        assert_eq!(*c, 0);
        c.keep();
        let c = own.take(open).await.unwrap();
        assert_eq!(*c, 0, "kept: the same connection");
        drop(c); // a failed (or abandoned) read
        let c = own.take(open).await.unwrap();
        assert_eq!(*c, 1, "dropped: a fresh one");
    }
}
