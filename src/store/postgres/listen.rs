//! Wake-ups from the database: on PostgreSQL a dedicated connection `LISTEN`s on
//! `jobvisor_jobs`, which an insert trigger notifies with the queue of newly due jobs, and
//! on `jobvisor_queues`, which a trigger on the settings table notifies with the queue whose
//! settings changed, and on `jobvisor_cancel`, which a cancel of a running job notifies with
//! its id. A [`Client`](crate::Client) that waits listens on `jobvisor_done` alone, which
//! the transitions that end a job notify with the ids of the ended jobs somebody waits on
//! (`jobvisor_announce_done`, migration 000028; see `store/waits.rs`).
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
/// The channel of waited jobs that reached a terminal state (their ids, comma-separated).
pub(crate) const DONE_CHANNEL: &str = "jobvisor_done";

/// The channels a node listens on: due jobs, settings and cancels.
pub(crate) const NODE_CHANNELS: &[&str] = &[CHANNEL, SETTINGS_CHANNEL, CANCEL_CHANNEL];

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
                DONE_CHANNEL => Notice::Done(done_ids(&n.payload)),
                _ => Notice::Due(n.payload),
            })
            .map_err(|e| Error::Database(StoreError::Transient(e.to_string())))
        })
    }
}

/// The ids a `jobvisor_done` payload names; none (re-check every wait) when any is not an id.
fn done_ids(payload: &str) -> Vec<i64> {
    payload
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()
        .unwrap_or_default()
}

impl PgListener {
    /// `LISTEN`s on `conn` to `channels`, waiting at most `limit` for the server's answer.
    pub(crate) async fn start(
        mut conn: AsyncPgConnection,
        limit: std::time::Duration,
        channels: &[&str],
    ) -> Result<PgListener> {
        let sql: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
        let listen = conn.batch_execute(&sql);
        tokio::time::timeout(limit, listen).await.map_err(|_| {
            Error::Database(StoreError::Transient(format!(
                "LISTEN timed out after {limit:?}"
            )))
        })??;
        Ok(PgListener { conn })
    }
}

#[cfg(test)]
mod tests {
    use super::done_ids;

    #[test]
    fn a_done_payload_names_its_ids_or_none() {
        assert_eq!(done_ids("7"), vec![7]);
        assert_eq!(done_ids("1,22,333"), vec![1, 22, 333]);
        assert!(done_ids("").is_empty());
        assert!(done_ids("1,x").is_empty());
    }
}
