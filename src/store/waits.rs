//! Waits: the registry that lets [`Client::wait`](crate::Client::wait) be told at once that its
//! job ended (PostgreSQL), without a notification in every finalize.
//!
//! A wait registers its job in `jobvisor_waits` (migration 000028, PostgreSQL only); each
//! transition that ends jobs passes their ids to `jobvisor_announce_done`, which notifies
//! `jobvisor_done` with those that have a row — and nothing when nobody waits, so no commit
//! queues for PostgreSQL's notify lock (`pg_notify` in every finalize cut pgbench's 8 clients
//! from 4,827 to 1,679 tps). The transitions: the finalize statement (a CTE of its own), a
//! cancel of a job that was not running, a completion in the handler's transaction, a lease
//! reclaimed past its attempts (`wakes::announce_done`). The other backends have no
//! notifications: nothing is registered and their waits poll.
//!
//! # Why a registered waiter cannot miss the end
//!
//! The waiter, in this order: (1) its client's `LISTEN jobvisor_done` has taken hold;
//! (2) [`Store::wait_register`]: one statement that locks a running job's row `FOR SHARE`,
//! reads its state and, if it has not ended, counts the wait, committed when it returns; (3)
//! it reads the job. The ending transaction `E`, in this order: updates the row (a row lock), then
//! calls `jobvisor_announce_done`, whose query — a volatile function under READ COMMITTED —
//! takes its snapshot then, after the lock, and commits, the notification delivered at commit.
//! Two cases, by who has the row first:
//! * `E` updated it before (2) reached it: (2) waits for `E`'s commit and reads its version —
//!   ended, so nothing is registered and (3) sees the end.
//! * (2) locked it first: `E`'s update waits for (2)'s commit, so `E`'s announcing snapshot,
//!   taken later, sees the row (2) wrote, and notifies; the `LISTEN` of (1) took hold before,
//!   so the notification reaches the waiter.
//!
//! A job that is not running is not locked: a claim's `SKIP LOCKED` would pass over a pending
//! job while (2) held it, and an idle node would leave it to its poll (seen: `wake_up`'s
//! retried jobs waited 5 s). So the end of a job not running whose transaction commits
//! between (2)'s read and (2)'s commit (a cancel in flight) can go unannounced; the poll
//! catches it.
//!
//! A snapshot taken at `E`'s start instead (a plain join in the finalize) can miss it: `E`
//! begins, the waiter registers, reads "running" and listens, `E` commits — without the lock
//! and the later snapshot nothing orders the two. A listener that reconnects tells every wait
//! to read its job again (what ended while it was down is committed by then; what ends after
//! saw the registration). The poll goes on under all of it, as the backstop: a listener down,
//! an end this list does not announce (a dependency's cascade), a handler's transaction run
//! at REPEATABLE READ (its snapshot is older than the lock) only make the wait no faster.
//!
//! A wait removes its count when it returns ([`Store::wait_unregister`]); a row outlives a
//! waiter that died by its `expires_at` (the wait's timeout and a margin), after which the
//! next registration deletes it.

use std::time::Duration;

use super::Store;
use crate::error::Result;
use crate::job::JobId;

impl Store {
    /// Registers a wait on `id` for at most `ttl` (PostgreSQL; see the module docs), once
    /// the caller's `LISTEN jobvisor_done` has taken hold; whether it counted one (`false`:
    /// the job has ended or is gone — read it — or the backend has no notifications).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn wait_register(&self, id: JobId, ttl: Duration) -> Result<bool> {
        let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX / 2);
        self.inner.driver.wait_register(id.0, ttl_us).await
    }

    /// Removes one wait on `id` that [`Store::wait_register`] counted.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn wait_unregister(&self, id: JobId) -> Result<()> {
        self.inner.driver.wait_unregister(id.0).await
    }
}
