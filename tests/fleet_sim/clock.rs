//! One node's view of time: a [`NodeClock`] over the fleet's shared manual clock. Its
//! [`Clock::bound_now`] is the shared clock (the database's time, bound into every
//! statement); its [`Clock::now`] (the node's wall clock) is off by a jump the seed chose —
//! seconds forward or back, changed by clock events — and its [`Clock::monotonic`] (on which
//! the node measures lease estimates, fence points and timeouts) runs at a rate off by a
//! bounded number of parts per million, [`MAX_RATE_PPM`] either way.
//!
//! The bound: the fence point is the lease minus the margin `min(lease / 6, 5 s)` after the
//! send time (ARCHITECTURE.md §7.3), 25 s of the fleet's 30 s lease. A monotonic clock
//! running 10 % slow reaches it after 27.8 s of database time, 2.2 s before the database's
//! lease can expire: more than a deadline check (200 ms) and the handler's stop take. So the
//! simulation holds each node's rate within ±10 %, and the invariants must hold at it; a rate
//! slower than −16.7 % would reach the fence point after the database's expiry.
//!
//! A freeze may also be *hidden* from the node ([`NodeClock::stand_still`]): its monotonic
//! clock stands still from the freeze until it resumes, as a virtual machine's does when its
//! hypervisor stops it and hides the stop from the guest's clocks (or a suspend, on a system
//! whose monotonic clock does not count one). That is outside the bound: the node wakes
//! believing in leases the database let go, and only the database's guards stand.
//!
//! The monotonic clock is piecewise linear in the shared clock: a rate change re-anchors it
//! at its current reading, as does a resume after standing still, and the shared clock never
//! goes back, so it never goes back either. Integer arithmetic throughout: the same seed
//! reads the same microseconds.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobvisor::clock::{Clock, ManualClock};

/// The largest rate error of a node's monotonic clock, either way: 10 % (see the module docs).
pub(crate) const MAX_RATE_PPM: i64 = 100_000;

/// The largest offset of a node's wall clock from the database's, either way: 5 minutes.
pub(crate) const MAX_JUMP_S: i64 = 300;

/// A node's clock over the shared one.
#[derive(Debug)]
pub(crate) struct NodeClock {
    shared: ManualClock,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// The wall clock's offset from the shared clock (µs).
    offset_us: i64,
    /// The rate error of the monotonic clock (parts per million; `+` runs fast).
    rate_ppm: i64,
    /// The shared clock's reading (µs) at the last rate change…
    anchor_shared_us: i64,
    /// …and the monotonic clock's then (µs).
    anchor_mono_us: i64,
    /// The shared clock's reading (µs) since which the monotonic clock stands still.
    still_since_us: Option<i64>,
}

impl NodeClock {
    /// A node whose monotonic clock runs `rate_ppm` off from now on, its wall clock right.
    pub(crate) fn new(shared: ManualClock, rate_ppm: i64) -> NodeClock {
        let at = shared.now().timestamp_micros();
        NodeClock {
            shared,
            state: Mutex::new(State {
                offset_us: 0,
                rate_ppm: rate_ppm.clamp(-MAX_RATE_PPM, MAX_RATE_PPM),
                anchor_shared_us: at,
                anchor_mono_us: at,
                still_since_us: None,
            }),
        }
    }

    fn mono_us(s: &State, shared_us: i64) -> i64 {
        let shared_us = s.still_since_us.unwrap_or(shared_us);
        let elapsed = i128::from(shared_us - s.anchor_shared_us);
        let scaled = elapsed * i128::from(1_000_000 + s.rate_ppm) / 1_000_000;
        s.anchor_mono_us + i64::try_from(scaled).unwrap()
    }

    /// Sets the wall clock `offset_s` seconds off the database's (within [`MAX_JUMP_S`]).
    pub(crate) fn jump_to(&self, offset_s: i64) {
        let offset_s = offset_s.clamp(-MAX_JUMP_S, MAX_JUMP_S);
        self.state.lock().unwrap().offset_us = offset_s * 1_000_000;
    }

    /// From now on the monotonic clock runs `rate_ppm` off (within [`MAX_RATE_PPM`]).
    pub(crate) fn drift(&self, rate_ppm: i64) {
        let shared_us = self.shared.now().timestamp_micros();
        let mut s = self.state.lock().unwrap();
        s.anchor_mono_us = Self::mono_us(&s, shared_us);
        s.anchor_shared_us = s.still_since_us.unwrap_or(shared_us);
        s.rate_ppm = rate_ppm.clamp(-MAX_RATE_PPM, MAX_RATE_PPM);
    }

    /// From now on the monotonic clock stands still, until [`run_on`](Self::run_on): a
    /// freeze hidden from the node.
    pub(crate) fn stand_still(&self) {
        let shared_us = self.shared.now().timestamp_micros();
        let mut s = self.state.lock().unwrap();
        s.still_since_us.get_or_insert(shared_us);
    }

    /// The monotonic clock runs on from where it stood: the time it stood still is lost to it.
    pub(crate) fn run_on(&self) {
        let shared_us = self.shared.now().timestamp_micros();
        let mut s = self.state.lock().unwrap();
        if s.still_since_us.is_some() {
            s.anchor_mono_us = Self::mono_us(&s, shared_us);
            s.anchor_shared_us = shared_us;
            s.still_since_us = None;
        }
    }
}

impl Clock for NodeClock {
    fn now(&self) -> DateTime<Utc> {
        let offset = self.state.lock().unwrap().offset_us;
        self.shared.now() + chrono::Duration::microseconds(offset)
    }

    fn bound_now(&self) -> Option<DateTime<Utc>> {
        self.shared.bound_now()
    }

    fn monotonic(&self) -> Duration {
        let shared_us = self.shared.now().timestamp_micros();
        let s = *self.state.lock().unwrap();
        Duration::from_micros(u64::try_from(Self::mono_us(&s, shared_us)).unwrap())
    }
}
