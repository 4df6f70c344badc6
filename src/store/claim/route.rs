//! [`Routes`]: which route ([`Route::Fast`] or [`Route::Controlled`]) each queue's claims
//! take on this store, as last seen, and the look-ups that keep it current.
//!
//! A stale answer costs at most one empty claim or one rolled-back lock: the fast claim
//! refuses a queue that has a settings row (`NOT EXISTS` in its statement), and a controlled
//! claim that finds no row answers [`Route::Fast`].

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::super::params::Route;
use super::super::Store;
use crate::queue::QueueInfo;

/// Which queues this store has seen to have a settings row, and what else their claims
/// need to know. Every field starts empty: an unseen queue is claimed the fast way.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// The route each queue's claims take, as last seen (absent: [`Route::Fast`]).
    route: Mutex<HashMap<String, Route>>,
    /// Controlled queues whose settings the backend's own controlled claim does not take (a
    /// rate limit; a per-partition limit where the backend's claim has none): their claims
    /// go straight to the portable one, so the backend's is not tried first each time. Set
    /// by each portable claim from the row it locked.
    portable: Mutex<HashSet<String>>,
    /// Queues a node's queue watch last read without a row ([`Routes::note_read`]): an empty
    /// fast claim of one of them needs no look-up of the row, since the watch re-reads the
    /// settings after any change (the change signal, or a notification and its 1 s re-read)
    /// and wakes the queue's fetcher when a row appears. An idle node's poll so costs one
    /// claim, not a claim and a look-up.
    read_without_row: Mutex<HashSet<String>>,
}

impl Routes {
    /// The route `queue`'s claims take.
    pub(crate) fn of(&self, queue: &str) -> Route {
        self.route
            .lock()
            .map(|m| m.get(queue).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// `queue`'s claims take `route` from now on.
    pub(crate) fn set(&self, queue: &str, route: Route) {
        if let Ok(mut m) = self.route.lock() {
            m.insert(queue.to_string(), route);
        }
        if route == Route::Controlled {
            if let Ok(mut r) = self.read_without_row.lock() {
                r.remove(queue);
            }
        }
    }

    /// Whether `queue`'s controlled claims go straight to the portable claim.
    pub(crate) fn is_portable(&self, queue: &str) -> bool {
        self.portable
            .lock()
            .map(|s| s.contains(queue))
            .unwrap_or(false)
    }

    /// What a portable claim read in `queue`'s row: whether the backend's own claim takes
    /// its settings.
    pub(crate) fn set_portable(&self, queue: &str, portable: bool) {
        if let Ok(mut s) = self.portable.lock() {
            if portable {
                s.insert(queue.to_string());
            } else {
                s.remove(queue);
            }
        }
    }

    /// A read of every queue's settings showed `queue` with a row (`controlled`) or without.
    fn note_read(&self, queue: &str, controlled: bool) {
        self.set(queue, route_of(controlled));
        if let Ok(mut r) = self.read_without_row.lock() {
            if controlled {
                r.remove(queue);
            } else {
                r.insert(queue.to_string());
            }
        }
    }

    /// Whether the last read of the settings showed `queue` without a row (and no claim has
    /// found one since).
    pub(crate) fn read_without_row(&self, queue: &str) -> bool {
        self.read_without_row
            .lock()
            .map(|r| r.contains(queue))
            .unwrap_or(false)
    }

    /// Forgets what reads showed (the watch could not read: claims look the row up again).
    fn forget_reads(&self) {
        if let Ok(mut r) = self.read_without_row.lock() {
            r.clear();
        }
    }
}

/// The route of a queue with a settings row (`true`) or without.
pub(crate) fn route_of(has_row: bool) -> Route {
    if has_row {
        Route::Controlled
    } else {
        Route::Fast
    }
}

impl Store {
    /// What a node's queue watch read of every queue's settings (`list`), for the queues
    /// it serves: an empty fast claim of a queue listed without a row then skips the
    /// look-up of [`Store::queue_has_row`] (see [`Routes`]).
    pub(crate) fn note_settings<'a>(
        &self,
        served: impl Iterator<Item = &'a String>,
        list: &[QueueInfo],
    ) {
        for q in served {
            let controlled = list.iter().any(|i| &i.name == q);
            self.inner.routes.note_read(q, controlled);
        }
    }

    /// The watch could not read the settings: claims look rows up again until it can.
    pub(crate) fn forget_settings(&self) {
        self.inner.routes.forget_reads();
    }

    /// This store changed `queue`'s settings, leaving it with a row (`has_row`) or without.
    pub(crate) fn settings_changed(&self, queue: &str, has_row: bool) {
        self.inner.routes.set(queue, route_of(has_row));
    }
}
