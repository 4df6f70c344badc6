//! The after-commit notifier: how a store's own enqueues wake the listening nodes of other
//! processes without notifying inside their own transactions.
//!
//! PostgreSQL takes one lock for the whole database (the notification queue's) at the commit
//! of every transaction that notified, and holds it through the commit's flush to disk, so
//! transactions that notify commit one at a time: concurrent single enqueues topped out at
//! 200–290 a second, each waiting on that lock, when the insert trigger notified in each. The
//! store's own enqueue statements therefore mark their transaction (`jobvisor.notify` set to
//! `after_commit`, transaction-local, by the statement itself: no statement more), the
//! trigger then leaves it silent, and the store announces the queues here once the insert has
//! committed: one `pg_notify` per queue from a transaction of its own, and one such
//! transaction at a time for the whole store, covering every queue asked for while the
//! previous one ran. Enqueues commit side by side; only these announcements, at most one in
//! flight per store, take the lock.
//!
//! Nothing is lost: a queue asked for after the announcement in flight took its list is
//! announced by the next one, which starts after it was asked for, so after the insert
//! committed, and a node woken by it sees the job. An insert the store does not commit itself
//! (an enqueue inside the caller's transaction, a handler's transaction, `COPY`, another
//! process's SQL) is not marked, and its trigger notifies at its commit as before.
//! If the announcement fails (the database unreachable), the nodes' poll finds the jobs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::sql_types::{Array, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::store::timeout::{bounded, checkout, ConnPool, Op};

/// The queues waiting to be announced and whether an announcement is under way, shared by
/// the enqueues of one store and the task that announces.
#[derive(Debug)]
pub(crate) struct AfterCommit {
    state: Arc<Mutex<Pending>>,
    /// How long one announcement may take (the store's statement bound): one that hangs
    /// (a silent network cut) gives up and its connection is closed, not left holding one
    /// of the pool's.
    limit: Duration,
}

#[derive(Debug, Default)]
struct Pending {
    queues: Vec<String>,
    running: bool,
}

/// Clears `running` when the announcing task ends, however it ends (its runtime shut down
/// included), so that a later enqueue starts another.
struct Running(Arc<Mutex<Pending>>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut p) = self.0.lock() {
            p.running = false;
        }
    }
}

impl AfterCommit {
    /// A notifier whose announcements each take at most `limit`.
    pub(crate) fn new(limit: Duration) -> Self {
        AfterCommit {
            state: Arc::default(),
            limit,
        }
    }

    /// Announces `queues` (jobs of them committed and due) on `pool`'s connections: at once
    /// if no announcement is under way, else by the next one. Returns without waiting.
    pub(crate) fn announce<'a>(
        &self,
        pool: &ConnPool<AsyncPgConnection>,
        queues: impl Iterator<Item = &'a str>,
    ) {
        let Ok(mut p) = self.state.lock() else { return };
        for q in queues {
            if !p.queues.iter().any(|x| x == q) {
                p.queues.push(q.to_owned());
            }
        }
        if p.running || p.queues.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to announce from: the poll finds the jobs.
            p.queues.clear();
            return;
        };
        p.running = true;
        drop(p);
        let guard = Running(Arc::clone(&self.state));
        rt.spawn(run(guard, pool.clone(), self.limit));
    }
}

/// One notification per queue, in a transaction committed without waiting for its flush:
/// a notification lost in a crash costs a poll, and the notification lock is held for no
/// flush at all.
const ANNOUNCE: &str = "SELECT set_config('synchronous_commit', 'off', true), \
    count(pg_notify('jobvisor_jobs', q)) FROM unnest($1::text[]) AS q";

/// Announces what is pending until nothing is.
async fn run(guard: Running, pool: ConnPool<AsyncPgConnection>, limit: Duration) {
    loop {
        let queues = match guard.0.lock() {
            Ok(mut p) if !p.queues.is_empty() => std::mem::take(&mut p.queues),
            _ => return,
        };
        let sent = bounded(Op::Enqueue, limit, async {
            let mut c = checkout(&pool).await?;
            diesel::sql_query(ANNOUNCE)
                .bind::<Array<Text>, _>(&queues)
                .execute(&mut *c)
                .await?;
            Ok(())
        })
        .await;
        if let Err(e) = sent {
            tracing::debug!(error = %e, "announcing enqueued jobs failed; the poll will find them");
        }
    }
}

#[cfg(all(test, feature = "test-util"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    use futures_util::StreamExt;

    use crate::store::params::EnqueueParams;
    use crate::{NewJob, Store, StoreOptions};

    /// A schema of its own on the test server (`JOBVISOR_PG_URL`): its URL, and the admin
    /// URL that drops it. (The test kit's `TestDb` lives above the store, out of its reach.)
    async fn own_schema() -> (String, String) {
        let admin = std::env::var("JOBVISOR_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let schema = format!("jv_{}", uuid::Uuid::new_v4().simple());
        let mut c = AsyncPgConnection::establish(&admin).await.unwrap();
        c.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let join = if admin.contains('?') { '&' } else { '?' };
        let url = format!("{admin}{join}options=-c%20search_path%3D{schema}");
        (url, format!("DROP SCHEMA {schema} CASCADE"))
    }

    /// The channels' payloads `listener` receives until `last` arrives (at most 10 s).
    async fn until(listener: &mut AsyncPgConnection, last: &str) -> Vec<String> {
        let stream = listener.notifications_stream();
        futures_util::pin_mut!(stream);
        let mut got = Vec::new();
        while let Ok(Some(n)) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            let n = n.unwrap();
            got.push(n.payload.clone());
            if n.payload == last {
                return got;
            }
        }
        panic!("no notification {last:?} within 10 s; got {got:?}");
    }

    /// The store's own inserts notify nothing in their transaction (so they do not take the
    /// notification lock at their commits, and commit side by side) yet reach a listener
    /// after their commit; an insert inside a transaction the store does not commit (the
    /// outbox, a handler's) still notifies from its own transaction. Notifications of one
    /// session arrive in commit order, so a quiet insert's would arrive before the loud
    /// insert's that follows it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn own_enqueues_are_quiet_in_their_transaction_and_announced_after_it() {
        let (url, drop_schema) = own_schema().await;
        let store = Store::connect_with(&url, StoreOptions::default().migrate(true))
            .await
            .unwrap();
        let mut listener = AsyncPgConnection::establish(&url).await.unwrap();
        listener
            .batch_execute("LISTEN jobvisor_jobs")
            .await
            .unwrap();
        let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
        let job = |q: &str| NewJob::new("k", serde_json::json!({})).queue(q);
        let (one, many) = (job("quiet-one"), [job("quiet-many"), job("quiet-many")]);
        super::super::enqueue(&mut conn, &[&one], None, true)
            .await
            .unwrap();
        super::super::enqueue(&mut conn, &[&many[0], &many[1]], None, true)
            .await
            .unwrap();
        let loud = job("loud");
        super::super::enqueue(&mut conn, &[&loud], None, false)
            .await
            .unwrap();
        // (Other sessions of the test's store may notify too: only these queues count.)
        let mut got = until(&mut listener, "loud").await;
        got.retain(|q| q.starts_with("quiet") || q == "loud");
        assert_eq!(got, ["loud"], "only the insert not marked quiet notified");
        // Through the store: committed quietly, then announced.
        store
            .job_enqueue_many(EnqueueParams::many(vec![job("announced")]))
            .await
            .unwrap();
        let got = until(&mut listener, "announced").await;
        assert_eq!(got.last().map(String::as_str), Some("announced"));
        drop(store);
        conn.batch_execute(&drop_schema).await.unwrap();
    }
}
