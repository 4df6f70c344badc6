//! Wake-ups from the database: on PostgreSQL a dedicated connection `LISTEN`s on
//! `jobvisor_jobs`, which an insert trigger notifies with the queue of newly due jobs, and
//! on `jobvisor_queues`, which a trigger on the settings table notifies with the queue whose
//! settings changed, and on `jobvisor_cancel`, which a cancel of a running job notifies with
//! its id.
//! Other backends have no such channel; their nodes rely on polling and in-process wake-ups.
//! Opened by [`PgDriver::listen`](super::PgDriver::listen).

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;

use crate::error::{Error, Result, StoreError};
use crate::store::params::Notice;

/// The channel of newly due jobs.
pub(crate) const CHANNEL: &str = "jobvisor_jobs";
/// The channel of changed queue settings.
pub(crate) const SETTINGS_CHANNEL: &str = "jobvisor_queues";
/// The channel of cancels asked of running jobs (the job's id).
pub(crate) const CANCEL_CHANNEL: &str = "jobvisor_cancel";

/// A listening connection. Notifications that arrive while no one awaits
/// [`PgListener::next`] are buffered by the driver and returned later.
pub(crate) struct PgListener {
    conn: AsyncPgConnection,
}

impl std::fmt::Debug for PgListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgListener")
    }
}

impl PgListener {
    /// The next notice; `None` when the connection is gone (listen again).
    pub(crate) async fn next(&mut self) -> Option<Result<Notice>> {
        let stream = self.conn.notifications_stream();
        futures_util::pin_mut!(stream);
        stream.next().await.map(|n| {
            n.map(|n| match n.channel.as_str() {
                SETTINGS_CHANNEL => Notice::Settings(n.payload),
                // Ours carry an id; anything else is no job this node can hold.
                CANCEL_CHANNEL => Notice::Cancel(n.payload.parse().unwrap_or(0)),
                _ => Notice::Due(n.payload),
            })
            .map_err(|e| Error::Database(StoreError::Transient(e.to_string())))
        })
    }
}

impl PgListener {
    /// `LISTEN`s on `conn`, waiting at most `limit` for the server's answer.
    pub(crate) async fn start(
        mut conn: AsyncPgConnection,
        limit: std::time::Duration,
    ) -> Result<PgListener> {
        let sql = format!("LISTEN {CHANNEL}; LISTEN {SETTINGS_CHANNEL}; LISTEN {CANCEL_CHANNEL}");
        let listen = conn.batch_execute(&sql);
        tokio::time::timeout(limit, listen).await.map_err(|_| {
            Error::Database(StoreError::Transient(format!(
                "LISTEN timed out after {limit:?}"
            )))
        })??;
        Ok(PgListener { conn })
    }
}
