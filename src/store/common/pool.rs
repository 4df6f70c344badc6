//! What every backend's connection set-up shares, below the backends: the two-lane pool
//! ([`Lanes`]), bounded connection attempts, the pool builder and URL options. A backend opens its own pools with these
//! (`Driver::open`); `connect.rs`, above the seam, only chooses the backend from the URL.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::{Duration, Instant};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel_async::AsyncConnection;

use diesel_async::pooled_connection::PoolError;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::options::StoreOptions;
use super::timeout::{checkout, ConnPool, Manager, PooledConn, Tracked};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::timeout::{renew_conn, RenewConn};
use crate::error::Result;

/// Runs `attempt` (one try at opening a connection) with at most `each` per try, starting a
/// fresh one after each timeout until `total` has passed; an error ends it at once. A try
/// that hung in a network cut is thus replaced within `each` of the heal.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn attempts<T, F, Fut>(
    each: Duration,
    total: Duration,
    mut attempt: F,
) -> std::result::Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, String>>,
{
    let start = Instant::now();
    let mut tries = 0u32;
    loop {
        let left = total.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(format!(
                "no answer within {total:?} ({tries} attempts of at most {each:?}, \
                 StoreOptions::connect_attempt_timeout)"
            ));
        }
        tries += 1;
        if let Ok(res) = tokio::time::timeout(each.min(left), attempt()).await {
            return res;
        }
    }
}

/// One pool of `size` connections, each opened by `setup`. `verify`: ping each connection at
/// checkout (a `SELECT 1`), for MySQL, where diesel-async cannot tell that the server closed a
/// connection (it can for PostgreSQL, and SQLite has no server): after a server restart every
/// pooled connection would otherwise stay dead forever. Elsewhere a ping would double the cost
/// of every short statement. `reuse`: which idle connection a checkout takes (see
/// [`Reuse`]). PostgreSQL's; MySQL's pools give their own check (`pool_with`): a plain ping, or
/// with several Galera members one that a member outside the primary component fails.
#[cfg(feature = "postgres")]
pub(crate) fn pool<C>(
    opts: &StoreOptions,
    size: u32,
    verify: bool,
    reuse: Reuse,
    setup: diesel_async::pooled_connection::SetupCallback<C>,
) -> ConnPool<C>
where
    C: AsyncConnection + 'static,
    Manager<C>: bb8::ManageConnection,
{
    let ping = if verify {
        RecyclingMethod::Verified
    } else {
        RecyclingMethod::Fast
    };
    pool_with(opts, size, ping, reuse, setup)
}

/// [`pool`] with the checkout check given (`Fast`: none; anything else: at checkout).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn pool_with<C>(
    opts: &StoreOptions,
    size: u32,
    ping: RecyclingMethod<C>,
    reuse: Reuse,
    setup: diesel_async::pooled_connection::SetupCallback<C>,
) -> ConnPool<C>
where
    C: AsyncConnection + 'static,
    Manager<C>: bb8::ManageConnection,
{
    let verify = !matches!(ping, RecyclingMethod::Fast);
    let mut cfg = ManagerConfig::<C>::default();
    cfg.recycling_method = ping;
    cfg.custom_setup = setup;
    // The URL is in `setup`; the manager's copy is unused.
    let mgr = Manager::new(AsyncDieselConnectionManager::new_with_config("", cfg));
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(opts.connect_timeout)
        .test_on_check_out(verify)
        .queue_strategy(reuse.strategy())
        .build_unchecked(mgr)
}

/// Which idle connection a checkout takes.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reuse {
    /// The one returned last: PostgreSQL's main pool. A few connections then carry the work
    /// and their server processes stay warm, where taking each in turn spread it over every
    /// process of the pool: a 20,000-job drain at concurrency 10 went from 22,600 to 24,900
    /// jobs/s (medians of 6 alternated pairs; 20,800 to 23,500 in another 6). Connections
    /// left idle are closed after bb8's idle timeout (10 minutes) and opened again when a
    /// burst needs them.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's alone
    Latest,
    /// The one idle longest, each in turn. MariaDB's pools: its drain measured slower with
    /// [`Reuse::Latest`] (9,000 against 8,000 jobs/s, medians of 6 alternated pairs). The
    /// renewal lanes: both of their connections stay open and warm, so a renewal, which a
    /// lease's deadline waits for, never waits for a connection to be opened.
    Oldest,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Reuse {
    fn strategy(self) -> bb8::QueueStrategy {
        match self {
            Reuse::Latest => bb8::QueueStrategy::Lifo,
            Reuse::Oldest => bb8::QueueStrategy::Fifo,
        }
    }
}

/// `url` with `kv` appended to its query string.
#[cfg(any(feature = "mysql", all(feature = "test-util", feature = "postgres")))]
pub(crate) fn with_query(url: &str, kv: &str) -> String {
    if url.contains('?') {
        format!("{url}&{kv}")
    } else {
        format!("{url}?{kv}")
    }
}

/// A store's two pools on one database, for every backend: the main one, and the renewal lane
/// of [`RENEW_LANE_SIZE`](crate::store::RENEW_LANE_SIZE) (2) connections for lease renewals only, so
/// a renewal never waits behind a hung claim or finalization, nor for a connection one of
/// them holds.
pub(crate) struct Lanes<C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>, Error = PoolError>,
{
    main: ConnPool<C>,
    renew: ConnPool<C>,
}

impl<C> Lanes<C>
where
    Manager<C>: bb8::ManageConnection<Connection = Tracked<C>, Error = PoolError>,
{
    /// The lanes over the two pools.
    pub(crate) fn new(main: ConnPool<C>, renew: ConnPool<C>) -> Self {
        Lanes { main, renew }
    }

    /// The main pool (a handle to it: clones share the connections).
    #[cfg(feature = "postgres")]
    pub(crate) fn main(&self) -> &ConnPool<C> {
        &self.main
    }

    /// The main pool's state.
    pub(crate) fn state(&self) -> bb8::State {
        self.main.state()
    }

    /// A connection from the main pool, or from the renewal lane if `renew`.
    pub(crate) async fn checkout(&self, renew: bool) -> Result<PooledConn<'_, C>> {
        checkout(if renew { &self.renew } else { &self.main }).await
    }

    /// A renewal's connection: from the lane, or one opened for it alone if `fresh` (a hedge,
    /// see `timeout::renew_conn`).
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn renewal(&self, fresh: bool) -> Result<RenewConn<'_, C>> {
        renew_conn(&self.renew, fresh).await
    }
}
