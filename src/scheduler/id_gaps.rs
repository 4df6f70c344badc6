//! IdGaps: how the change signal of a backend without notifications (MariaDB/MySQL, SQLite)
//! notices a job whose insert commits *after* a newer id was already read.
//!
//! The signal's newest id alone misses it: two transactions draw ids 5 and 6, 6 commits, a
//! node reads 6 as the newest, then 5 commits — the newest is still 6, and job 5 would wait
//! for the poll. So the reader keeps a *floor*: every id at or below it has been seen (or
//! given up on), and each read also counts the jobs with an id in `(floor, floor +
//! GAP_SPAN]`. While that count is short of the ids between the floor and the newest, some
//! id there has not committed yet: the floor stays, and the id's late commit moves the count
//! at the next read, which wakes the fetchers like a newer id does. Once the range is whole
//! the floor moves up to the newest id, so the count reads an empty range and costs nothing.
//!
//! A gap that stays is given up after [`GAP_WATCH`]: a rolled-back insert, a multi-row insert
//! that reserved more ids than it used, a job deleted early, or ids stepping by more than one
//! (`@@auto_increment_increment` on a multi-primary cluster) leave gaps that never fill, and
//! cost the one short range count per read while they are watched. An insert that commits
//! later still is found by the poll, as before.
//!
//! SQLite has one writer at a time, which draws the id and commits under the same lock: a
//! lower id cannot commit after a higher one there, so its floor simply follows the newest id.

use std::time::{Duration, Instant};

use crate::store::GAP_SPAN;

/// How long a gap below the newest id is watched for a late commit: **5 s** (longer than the
/// transactions that usually enqueue; a later commit waits for the poll).
pub(crate) const GAP_WATCH: Duration = Duration::from_secs(5);

/// The change signal's floor and what it last read (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct IdGaps {
    /// Every id at or below it has been seen or given up on: the next read counts above it.
    floor: i64,
    /// The newest id and the count above the floor of the last read; `None` before the first.
    last: Option<(i64, i64)>,
    /// Since when a gap below the newest id has been watched.
    gap_since: Option<Instant>,
}

impl IdGaps {
    /// The floor the next read counts above.
    pub(crate) fn floor(&self) -> i64 {
        self.floor
    }

    /// Takes a read made at [`floor`](Self::floor) (`newest` id, `above`: the count of ids
    /// in `(floor, floor + GAP_SPAN]`) at `now`, and answers whether a job appeared since the
    /// previous read: a newer id, or an older one committed late.
    pub(crate) fn read(&mut self, newest: i64, above: i64, now: Instant) -> bool {
        let appeared = self.last.is_some_and(|last| last != (newest, above));
        let span = newest - self.floor;
        let whole = span <= GAP_SPAN && above >= span;
        let given_up = self
            .gap_since
            .is_some_and(|since| now.duration_since(since) >= GAP_WATCH);
        if whole || span > GAP_SPAN || given_up {
            // Nothing missing (or nothing worth waiting for): count above the newest next,
            // which in this same read was nothing.
            self.floor = newest;
            self.last = Some((newest, 0));
            self.gap_since = None;
        } else {
            self.last = Some((newest, above));
            self.gap_since.get_or_insert(now);
        }
        appeared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_id_committed_after_a_higher_one_is_noticed() {
        let t = Instant::now();
        let mut g = IdGaps::default();
        assert!(!g.read(4, 4, t), "the first read only sets the baseline");
        assert_eq!(g.floor(), 4);
        // 6 committed, 5 not yet: the floor stays below the gap.
        assert!(g.read(6, 1, t));
        assert_eq!(g.floor(), 4);
        assert!(!g.read(6, 1, t), "nothing new");
        // 5 commits: the newest is still 6, the count moves.
        assert!(g.read(6, 2, t));
        assert_eq!(g.floor(), 6, "the range is whole again");
        assert!(!g.read(6, 0, t));
        assert!(g.read(7, 1, t));
    }

    #[test]
    fn a_gap_that_never_fills_is_given_up() {
        let t = Instant::now();
        let mut g = IdGaps::default();
        g.read(10, 10, t);
        assert!(g.read(12, 1, t), "11 rolled back, 12 committed");
        assert!(!g.read(12, 1, t + GAP_WATCH / 2));
        assert_eq!(g.floor(), 10, "still watched");
        assert!(!g.read(12, 1, t + GAP_WATCH));
        assert_eq!(g.floor(), 12, "given up");
    }

    #[test]
    fn a_busy_range_moves_the_floor_to_the_newest() {
        let t = Instant::now();
        let mut g = IdGaps::default();
        g.read(0, 0, t);
        assert!(g.read(GAP_SPAN * 3, GAP_SPAN - 1, t));
        assert_eq!(g.floor(), GAP_SPAN * 3);
    }
}
