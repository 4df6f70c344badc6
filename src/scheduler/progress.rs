//! A running attempt's progress reports ([`JobContext::progress`]) on their way to the
//! database: the handler overwrites the latest report, the
//! [`LeaseManager`](super::LeaseManager) carries it with the next lease renewal — the same
//! statement, guarded by the attempt's token — and marks it written once that renewal was
//! applied. Only the latest report is kept: progress is a state, not a log, so a handler that
//! reports a thousand times between two renewals costs one write of the last one. A report
//! whose renewal failed or was refused stays pending (or is dropped with the lease).
//!
//! [`JobContext::progress`]: crate::JobContext::progress

use std::sync::{Mutex, PoisonError};

/// The latest report and whether it was written; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct ProgressCell {
    inner: Mutex<Reports>,
}

#[derive(Debug, Default)]
struct Reports {
    /// The latest report, JSON text.
    latest: Option<String>,
    /// Reports made so far (the latest one's number).
    made: u64,
    /// The number of the latest report a renewal wrote.
    written: u64,
}

impl ProgressCell {
    /// The handler reports `json` (already serialized and size-checked).
    pub(crate) fn report(&self, json: String) {
        let mut r = self.lock();
        r.latest = Some(json);
        r.made += 1;
    }

    /// The latest report, if a renewal has not written it yet, with its number for
    /// [`ProgressCell::written`].
    pub(crate) fn unwritten(&self) -> Option<(u64, String)> {
        let r = self.lock();
        (r.made > r.written)
            .then(|| r.latest.clone().map(|json| (r.made, json)))
            .flatten()
    }

    /// A renewal carrying report `n` was applied.
    pub(crate) fn written(&self, n: u64) {
        let mut r = self.lock();
        r.written = r.written.max(n);
    }

    /// The latest report, written or not.
    pub(crate) fn latest(&self) -> Option<String> {
        self.lock().latest.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reports> {
        // The critical sections cannot panic halfway (plain assignments): a poisoned lock
        // still holds consistent data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_unwritten_report_is_carried() {
        let p = ProgressCell::default();
        assert_eq!(p.unwritten(), None);
        p.report("1".into());
        p.report("2".into());
        let (n, json) = p.unwritten().unwrap();
        assert_eq!(json, "2");
        // A report made while the renewal carrying "2" was in flight stays unwritten.
        p.report("3".into());
        p.written(n);
        assert_eq!(p.unwritten(), Some((3, "3".into())));
        p.written(3);
        assert_eq!(p.unwritten(), None);
        assert_eq!(p.latest().as_deref(), Some("3"));
        // An older renewal's answer arriving late never un-writes a newer one.
        p.written(1);
        assert_eq!(p.unwritten(), None);
    }
}
