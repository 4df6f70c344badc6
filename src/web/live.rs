//! Live updates pushed: `GET <prefix>/events`, a Server-Sent Events stream
//! (`text/event-stream`) that tells an open page when to re-read itself.
//!
//! One hub per [`Dashboard`](super::Dashboard), shared by every worker and every open tab,
//! reads the database for all of them — no connection per tab. While at least one stream is
//! open it runs on the worker that opened the first, every 200 ms:
//! * the engine's change signal (`Store::change_signal`: the newest job id, the queue
//!   settings' digest, the wake counter), and on PostgreSQL also its notifications
//!   (`LISTEN`: a job enqueued or made due, a queue's settings changed) on one connection;
//! * the versions of the jobs the open pages show, in one statement by primary key (at most
//!   1,000): a job finishing, retried or reclaimed moves no signal, but always its version.
//!
//! A stream answers `event: change` when one of the jobs its page shows changed (at once), or
//! when the signal moved (at most once a second), and every page but one job's also every
//! 5 s (counts, ages and lists move with finalizations that no signal announces). A session logged
//! out or expired ends the stream with `event: expired`. A comment every 15 s keeps proxies
//! from closing an idle stream. The page's script polls every 2 s only while the stream is
//! down. The stream requires the same authentication as the pages (401 without).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::auth::{authorize, session_of, session_valid};
use super::layout::plain_error;
use super::Data;
use crate::scheduler::IdGaps;
use crate::store::Store;

/// How often the hub reads the signal and the watched jobs' versions.
const POLL: Duration = Duration::from_millis(200);
/// Least time between two `change` events of one stream for a signal that moved.
const QUIET: Duration = Duration::from_secs(1);
/// How often a page that watches no changing job re-reads itself anyway.
const TICK: Duration = Duration::from_secs(5);
/// How often an idle stream sends a comment.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Most jobs one page may watch.
const MAX_WATCH: usize = 200;

/// What the hub tells every stream.
#[derive(Debug, Clone)]
enum Signal {
    /// The change signal moved, or a notification came.
    Changed,
    /// The watched jobs' versions now (a job missing is gone from the live table).
    Versions(Arc<HashMap<i64, i64>>),
}

/// The one reader of the database for every open stream of a dashboard.
pub(crate) struct Hub {
    tx: broadcast::Sender<Signal>,
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    /// Each watched job and how many streams watch it.
    watched: HashMap<i64, usize>,
    /// The poll task runs.
    running: bool,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            tx: broadcast::channel(64).0,
            state: Mutex::new(HubState::default()),
        }
    }
}

/// One stream's subscription: its receiver and the jobs it watches (released when dropped).
struct Subscription {
    hub: Arc<Hub>,
    rx: broadcast::Receiver<Signal>,
    ids: Vec<i64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = self.hub.state.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.ids {
            if let Some(n) = st.watched.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    st.watched.remove(id);
                }
            }
        }
    }
}

impl Hub {
    /// Subscribes to the hub watching `ids`, starting its poll task if none runs.
    fn subscribe(hub: &Arc<Hub>, store: &Store, ids: Vec<i64>) -> Subscription {
        let mut st = hub.state.lock().unwrap_or_else(|p| p.into_inner());
        for id in &ids {
            *st.watched.entry(*id).or_default() += 1;
        }
        let rx = hub.tx.subscribe();
        if !st.running {
            st.running = true;
            actix_web::rt::spawn(poll(hub.clone(), store.clone()));
        }
        Subscription {
            hub: hub.clone(),
            rx,
            ids,
        }
    }

    /// The jobs watched now; `None` once no stream is open (the poll task then ends).
    fn watched(&self) -> Option<Vec<i64>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.tx.receiver_count() == 0 {
            st.running = false;
            return None;
        }
        Some(st.watched.keys().copied().collect())
    }
}

/// The hub's poll task: runs while a stream is open.
async fn poll(hub: Arc<Hub>, store: Store) {
    let listener = store
        .notifies()
        .then(|| actix_web::rt::spawn(listen(hub.clone(), store.clone())));
    let mut last = None;
    // Read as the queue watch reads it: a job committed after a newer id was read moves the
    // count above the floor, not the newest id.
    let mut gaps = IdGaps::default();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(ids) = hub.watched() else { break };
        match store.change_signal(gaps.floor()).await {
            Ok(s) => {
                let appeared = gaps.read(s.newest_job, s.above_floor, std::time::Instant::now());
                let rest = (s.settings, s.wakes);
                if appeared || last.is_some_and(|l| l != rest) {
                    let _ = hub.tx.send(Signal::Changed);
                }
                last = Some(rest);
            }
            Err(e) => {
                tracing::debug!(error = %e, "dashboard: the live stream's signal was not read")
            }
        }
        if !ids.is_empty() {
            match store.job_versions(&ids).await {
                Ok(rows) => {
                    let _ = hub
                        .tx
                        .send(Signal::Versions(Arc::new(rows.into_iter().collect())));
                }
                Err(e) => tracing::debug!(error = %e, "dashboard: the watched jobs were not read"),
            }
        }
    }
    if let Some(l) = listener {
        l.abort();
    }
}

/// PostgreSQL's notifications as `Changed`, listening again after a lost connection (the
/// poll covers what was missed meanwhile).
async fn listen(hub: Arc<Hub>, store: Store) {
    loop {
        if let Ok(Some(mut l)) = store.listen().await {
            while let Some(Ok(_)) = l.next().await {
                let _ = hub.tx.send(Signal::Changed);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The stream's query: the jobs the page shows, each as `id.version`, comma-separated, and
/// whether the page is one job's (`job=1`: it follows that job only, not the signal).
#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    #[serde(default)]
    watch: String,
    #[serde(default)]
    job: String,
}

/// `id.version` pairs, or `None` if damaged.
fn parse_watch(s: &str) -> Option<HashMap<i64, i64>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .take(MAX_WATCH)
        .map(|p| {
            let (id, v) = p.split_once('.')?;
            Some((id.parse().ok()?, v.parse().ok()?))
        })
        .collect()
}

/// One SSE event.
fn event(name: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {{}}\n\n"))
}

/// What one stream keeps between events.
struct Stream {
    sub: Subscription,
    /// Each watched job's version as the page (or the last event) knows it.
    known: HashMap<i64, i64>,
    /// The signal moved since the last `change`.
    pending: bool,
    /// The page follows the signal and re-reads every few seconds (every page but one job's).
    global: bool,
    last_change: Instant,
    last_sent: Instant,
    /// The session the stream was opened with, checked on every wake-up.
    session: Option<String>,
    state: Data,
    ended: bool,
}

impl Stream {
    /// The next chunk to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        loop {
            let wake = self.last_sent + KEEPALIVE;
            let tick = self.last_change + TICK;
            let quiet = self.last_change + QUIET;
            let mut until = wake;
            if self.global {
                until = until.min(tick);
            }
            if self.pending && self.global {
                until = until.min(quiet);
            }
            let got = tokio::select! {
                r = self.sub.rx.recv() => Some(r),
                _ = tokio::time::sleep_until(until) => None,
            };
            if let Some(id) = &self.session {
                if !session_valid(&self.state, id) {
                    self.ended = true;
                    return Some(event("expired"));
                }
            }
            let now = Instant::now();
            let mut changed = false;
            match got {
                Some(Ok(Signal::Changed)) => self.pending = true,
                Some(Ok(Signal::Versions(v))) => {
                    for (id, known) in self.known.iter_mut() {
                        let now = v.get(id).copied().unwrap_or(-1);
                        if now != *known {
                            *known = now;
                            changed = true;
                        }
                    }
                }
                Some(Err(broadcast::error::RecvError::Lagged(_))) => self.pending = true,
                Some(Err(broadcast::error::RecvError::Closed)) => return None,
                None => {}
            }
            if changed
                || (self.global && self.pending && now >= quiet)
                || (self.global && now >= tick)
            {
                self.pending = false;
                self.last_change = now;
                self.last_sent = now;
                return Some(event("change"));
            }
            if now >= wake {
                self.last_sent = now;
                return Some(Bytes::from_static(b": keep-alive\n\n"));
            }
        }
    }
}

/// `GET <prefix>/events?watch=id.version,…`: the page's event stream.
pub(crate) async fn events(
    state: Data,
    req: HttpRequest,
    q: web::Query<EventsQuery>,
) -> HttpResponse {
    // Authenticated as the pages are; a refusal is an answer, never a login page's HTML.
    if let Err(r) = authorize(&state, &req).await {
        return if r.status().is_redirection() {
            plain_error(&req, StatusCode::UNAUTHORIZED, "log in first")
        } else {
            r
        };
    }
    let Some(known) = parse_watch(&q.watch) else {
        return plain_error(
            &req,
            StatusCode::BAD_REQUEST,
            "watch: expected the page's jobs as id.version pairs, comma-separated",
        );
    };
    let sub = Hub::subscribe(
        &state.live,
        state.client.store(),
        known.keys().copied().collect(),
    );
    let now = Instant::now();
    let stream = Stream {
        sub,
        known,
        pending: false,
        global: q.job != "1",
        last_change: now,
        last_sent: now,
        session: session_of(&state, &req),
        state: state.clone(),
        ended: false,
    };
    let opened = futures_util::stream::once(async { Ok(Bytes::from_static(b"retry: 2000\n\n")) });
    let body = futures_util::stream::unfold(stream, |mut s| async move {
        s.next().await.map(|b| (Ok::<_, actix_web::Error>(b), s))
    });
    use futures_util::StreamExt;
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(opened.chain(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_jobs_parse_and_damage_is_refused() {
        let w = parse_watch("5.3,7.1").unwrap();
        assert_eq!(w.get(&5), Some(&3));
        assert_eq!(w.get(&7), Some(&1));
        assert!(parse_watch("").unwrap().is_empty());
        assert!(parse_watch("5").is_none());
        assert!(parse_watch("x.1").is_none());
    }
}
