//! Wake-ups from the database: on PostgreSQL a dedicated connection `LISTEN`s on
//! `jobvisor_jobs`, which an insert trigger notifies with the queue of newly due jobs.
//! Other backends have no such channel; their nodes rely on polling and in-process wake-ups.

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;

use super::connect::{parse_url, Target};
use super::Store;
use crate::error::{Error, Result, StoreError};

/// The notification channel.
pub(crate) const CHANNEL: &str = "jobvisor_jobs";

/// A listening connection. Notifications that arrive while no one awaits
/// [`Listener::next`] are buffered by the driver and returned later.
pub struct Listener {
    conn: AsyncPgConnection,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

impl Listener {
    /// The next notified queue; `None` when the connection is gone (listen again).
    pub async fn next(&mut self) -> Option<Result<String>> {
        let stream = self.conn.notifications_stream();
        futures_util::pin_mut!(stream);
        stream.next().await.map(|n| {
            n.map(|n| n.payload)
                .map_err(|e| Error::Database(StoreError::Transient(e.to_string())))
        })
    }
}

impl Store {
    /// Opens a listener for wake-ups, on PostgreSQL; `None` on backends without one.
    ///
    /// # Errors
    /// [`Error::Database`] (transient) when the connection or `LISTEN` fails.
    pub async fn listen(&self) -> Result<Option<Listener>> {
        let Target::Pg(url) = parse_url(&self.inner.url)? else {
            return Ok(None);
        };
        let mut conn = AsyncPgConnection::establish(&url).await.map_err(|e| {
            Error::Database(StoreError::Transient(format!("listener connection: {e}")))
        })?;
        conn.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok(Some(Listener { conn }))
    }
}
