//! Slows down token guessing: every failed login and every failed bearer token costs its
//! client address a pause that doubles with each failure in a row (0.25 s up to 10 s), during
//! which that address's attempts are refused unchecked; and all failures together draw on one
//! budget (10 at once, refilled 5 a second), past which every attempt waits its turn before
//! its token is checked (or is refused when the wait would pass 10 s). So a guessing run from
//! one address gets at most a few tries a second, and one from many addresses a few more,
//! while the right token from an address without failures is still checked (after a wait
//! under attack). The client address is the connection's peer: behind a proxy, every client
//! shares the proxy's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The pause after an address's first failure; it doubles with each failure in a row.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause of one address.
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// Failures allowed at once across all addresses.
const BURST: f64 = 10.0;
/// Failures per second across all addresses, in the long run.
const PER_SECOND: f64 = 5.0;
/// The longest wait for the global budget; past it an attempt is refused.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Addresses remembered at most; past it, those without failures in the last `MAX_PAUSE` go.
const MAX_ADDRS: usize = 10_000;

/// One address's failures in a row and when it may try again.
#[derive(Debug, Clone, Copy)]
struct Addr {
    failures: u32,
    until: Instant,
}

#[derive(Debug)]
struct Inner {
    addrs: HashMap<IpAddr, Addr>,
    /// Failures the global budget still allows now (negative: attempts are waiting).
    budget: f64,
    refilled: Instant,
}

/// The login throttle of one dashboard, shared by every worker.
#[derive(Debug)]
pub(crate) struct Throttle(Mutex<Inner>);

impl Default for Throttle {
    fn default() -> Self {
        Throttle(Mutex::new(Inner {
            addrs: HashMap::new(),
            budget: BURST,
            refilled: Instant::now(),
        }))
    }
}

/// An attempt's permission to check a token: give it back with
/// [`succeeded`](Throttle::succeeded) or [`failed`](Throttle::failed).
#[derive(Debug)]
#[must_use]
pub(crate) struct Turn {
    addr: Option<IpAddr>,
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an attempt from `addr` may check a token now, and how long it waits first:
    /// `Err(retry_after)` when `addr` is pausing after failures or the global wait is too
    /// long.
    pub(crate) fn reserve(&self, addr: Option<IpAddr>, now: Instant) -> Result<Duration, Duration> {
        let mut g = self.lock();
        if let Some(a) = addr.and_then(|a| g.addrs.get(&a)) {
            if a.until > now {
                return Err(a.until - now);
            }
        }
        let elapsed = now.saturating_duration_since(g.refilled).as_secs_f64();
        g.budget = (g.budget + elapsed * PER_SECOND).min(BURST);
        g.refilled = now;
        let wait = if g.budget >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - g.budget) / PER_SECOND)
        };
        if wait > MAX_WAIT {
            return Err(wait);
        }
        g.budget -= 1.0;
        Ok(wait)
    }

    /// Waits for a turn to check a token from `addr`: `Err(retry_after)` when refused.
    pub(crate) async fn turn(&self, addr: Option<IpAddr>) -> Result<Turn, Duration> {
        let wait = self.reserve(addr, Instant::now())?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(Turn { addr })
    }

    /// The token was right: its budget comes back and the address's failures are forgotten.
    pub(crate) fn succeeded(&self, turn: Turn) {
        let mut g = self.lock();
        g.budget = (g.budget + 1.0).min(BURST);
        if let Some(a) = turn.addr {
            g.addrs.remove(&a);
        }
    }

    /// The token was wrong: the address pauses (longer with each failure in a row). Returns
    /// the failures in a row.
    pub(crate) fn failed(&self, turn: Turn, now: Instant) -> u32 {
        let Some(addr) = turn.addr else { return 0 };
        let mut g = self.lock();
        if g.addrs.len() >= MAX_ADDRS {
            g.addrs.retain(|_, a| a.until + MAX_PAUSE > now);
        }
        let a = g.addrs.entry(addr).or_insert(Addr {
            failures: 0,
            until: now,
        });
        a.failures = a.failures.saturating_add(1);
        let pause = FIRST_PAUSE
            .saturating_mul(1 << (a.failures - 1).min(10))
            .min(MAX_PAUSE);
        a.until = now + pause;
        a.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, n]))
    }

    #[test]
    fn an_address_pauses_longer_after_each_failure() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let turn = Turn { addr: ip(1) };
        assert_eq!(t.failed(turn, t0), 1);
        let refused = t.reserve(ip(1), t0).unwrap_err();
        assert_eq!(refused, FIRST_PAUSE);
        assert!(t.reserve(ip(1), t0 + FIRST_PAUSE).is_ok());
        assert_eq!(t.failed(Turn { addr: ip(1) }, t0 + FIRST_PAUSE), 2);
        assert_eq!(
            t.reserve(ip(1), t0 + FIRST_PAUSE).unwrap_err(),
            FIRST_PAUSE * 2
        );
        // Another address is not paused.
        assert!(t.reserve(ip(2), t0).is_ok());
    }

    #[test]
    fn the_pause_is_capped() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for _ in 0..40 {
            t.failed(Turn { addr: ip(1) }, t0);
        }
        assert_eq!(t.reserve(ip(1), t0).unwrap_err(), MAX_PAUSE);
    }

    #[test]
    fn a_success_forgets_the_address_failures() {
        let t = Throttle::default();
        let t0 = Instant::now();
        t.failed(Turn { addr: ip(1) }, t0);
        t.succeeded(Turn { addr: ip(1) });
        assert_eq!(t.reserve(ip(1), t0), Ok(Duration::ZERO));
    }

    #[test]
    fn many_addresses_at_once_wait_for_the_global_budget() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for n in 0..BURST as u8 {
            assert_eq!(t.reserve(ip(n), t0), Ok(Duration::ZERO));
        }
        // The next waits for the refill: 1 / PER_SECOND.
        let w = t.reserve(ip(100), t0).unwrap();
        assert!(
            w > Duration::from_millis(150) && w <= Duration::from_millis(200),
            "{w:?}"
        );
        // Past MAX_WAIT of debt, refused.
        let mut refused = false;
        for n in 101..200 {
            if t.reserve(ip(n), t0).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
    }
}
