//! The database listener: wakes a queue's fetcher as soon as a job is enqueued on it, the
//! queue watch as soon as a queue's settings change, and the lease manager as soon as a
//! running job is asked to cancel (PostgreSQL `LISTEN`), reconnecting
//! with backoff; on other backends it ends at once and the queue watch's change signal and
//! the poll interval do the waking.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::event::report_store_error;
use super::fetcher::Wake;
use super::lease_manager::CancelAsked;
use super::queue_watch::RefreshSettings;
use super::shared::Shared;
use crate::store::Notice;

/// First pause before listening again after the connection failed; doubles up to the max.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest pause before listening again.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(10);

/// Wakes fetchers on database notifications (PostgreSQL), reconnecting with backoff; the
/// poll covers whatever is missed while disconnected, and every fetcher is woken once after
/// each (re)connect for the same reason. Ends at once on backends without notifications.
pub(crate) async fn listen_loop(
    shared: Arc<Shared>,
    wakers: HashMap<String, Recipient<Wake>>,
    settings: Recipient<RefreshSettings>,
    cancels: Recipient<CancelAsked>,
) {
    let mut pause = LISTEN_RETRY_MIN;
    let mut last_error = None;
    let every = Duration::from_secs(30);
    loop {
        match shared.store.listen().await {
            Ok(None) => return,
            Ok(Some(mut listener)) => {
                pause = LISTEN_RETRY_MIN;
                for w in wakers.values() {
                    w.do_send(Wake);
                }
                settings.do_send(RefreshSettings);
                while let Some(item) = listener.next().await {
                    match item {
                        Ok(Notice::Due(queue)) => {
                            if let Some(w) = wakers.get(&queue) {
                                w.do_send(Wake);
                            }
                        }
                        Ok(Notice::Settings(queue)) => {
                            if wakers.contains_key(&queue) {
                                settings.do_send(RefreshSettings);
                            }
                        }
                        Ok(Notice::Cancel(id)) => {
                            cancels.do_send(CancelAsked(Some(crate::job::JobId(id))));
                        }
                        // Not among a node's channels.
                        Ok(Notice::Done(_)) => {}
                        Err(e) => {
                            report_store_error(
                                &shared.events,
                                "listener",
                                &mut last_error,
                                every,
                                &e,
                            );
                            break;
                        }
                    }
                }
            }
            Err(e) => report_store_error(&shared.events, "listener", &mut last_error, every, &e),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LISTEN_RETRY_MAX);
    }
}
