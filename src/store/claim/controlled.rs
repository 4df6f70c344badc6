//! The controlled claim: a queue's claim under its settings row (a pause, a global or
//! per-partition concurrency limit, a rate limit).
//!
//! A controlled claim is one transaction: it locks the queue's row until commit and reads
//! its settings in one statement (`SELECT … FOR UPDATE`, a locking read of the latest
//! committed row; PostgreSQL's own claim takes the lock with an `UPDATE` of the `claims`
//! counter, see its `sql.rs`, and so does MariaDB's before its read, because a Galera
//! member's row locks are its own and only writes are certified across members; on SQLite
//! `BEGIN IMMEDIATE` already makes it the only writer), then — in statements that start after the lock was taken, so under READ
//! COMMITTED they see every claim committed before — counts what it must: the queue's
//! `running` jobs, per partition those of the candidates' partitions, and the jobs claimed
//! inside the rate window. Claims are the only way a job becomes `running`, and every
//! controlled claim of the queue waits for the lock, so nothing can add to those counts
//! between the count and the commit: the claim takes at most what is free, exactly.
//! Finalizations running concurrently only lower the counts (a claim may then take fewer
//! than it could have; never more).
//!
//! Rate limit: a sliding window, of **starts**. Each controlled claim of a rate-limited
//! queue records `(queue, claimed_at, jobs)` in `jobvisor_queue_claims`; a claim at `now`
//! takes at most `rate_limit − Σ jobs claimed in (now − period − margin, now]`, with
//! `margin` = [`RATE_START_MARGIN`], so any `rate_limit + 1` claimed jobs span at least
//! `period + margin` of the database's clock. The node starts each of them before its
//! claim's send time plus the margin, or gives it back unstarted (`Claimed::rated` tells it
//! to), and never before the claim (it has the answer only after): so any `rate_limit + 1`
//! starts span at least `period`, and no window of `period` holds more than `rate_limit`
//! handler starts (ARCHITECTURE.md §7.5). A claim that finds the window full reports when
//! its oldest entry leaves it, and the fetcher sleeps until then (no polling in between).
//!
//! A backend may answer for a queue's controlled claim in fewer round trips
//! ([`Driver::claim_controlled`](super::super::driver::Driver::claim_controlled): PostgreSQL,
//! for every setting but a rate limit); otherwise [`portable`] runs, as named steps: lock the
//! settings, the concurrency budget, the rate window, pick the jobs (partitioned or not),
//! take them, record them in the window.

use std::time::{Duration, Instant};

use diesel::result::QueryResult;

use super::super::driver::with_tx;
use super::super::params::ClaimArgs;
use super::super::params::{Claimed, Route};
use super::super::queues::QueueRow;
use super::super::rows::{dur_us, ClaimRow};
use super::super::Store;
use super::partitions::{self, Candidate, PartitionScan, Pick, Ranking, Rooms, Walk};
use super::route::Routes;
use super::steps::{ClaimSteps, Keyless, Kinds, WindowRow};
use crate::error::Result;
use crate::job::JobState;
use crate::queue::{RateLimit, RATE_START_MARGIN};

impl Store {
    /// The controlled claim of `a.queue`: the backend's own where it takes the queue's
    /// settings, else [`portable`]. Answers [`Route::Fast`] when the queue has no row.
    pub(super) async fn claim_controlled(&self, a: &ClaimArgs) -> Result<Claimed<ClaimRow>> {
        let routes = &self.inner.routes;
        if !routes.is_portable(&a.queue) {
            if let Some(own) = self.inner.driver.claim_controlled(a).await? {
                return Ok(own);
            }
        }
        let own_partitions = self.inner.driver.claims_partitions();
        let began = Instant::now();
        let out = with_tx!(self, |c| {
            portable(c, a, routes, own_partitions, began).await
        })?;
        Ok(out)
    }
}

/// The portable controlled claim, in the transaction of `c` (see the module doc).
/// `own_partitions`: whether the backend's own controlled claim takes a per-partition
/// limit; `began`: when the claim was sent.
pub(crate) async fn portable<C: ClaimSteps>(
    c: &mut C,
    a: &ClaimArgs,
    routes: &Routes,
    own_partitions: bool,
    began: Instant,
) -> QueryResult<Claimed<ClaimRow>> {
    let q = a.queue.as_str();
    let Some((row, mut now)) = c.lock_settings(q, a.now).await? else {
        return Ok(Claimed::none(Route::Fast));
    };
    routes.set_portable(
        q,
        row.rate_limit.is_some() || (!own_partitions && row.partition_limit.is_some()),
    );
    if row.paused_at.is_some() {
        return Ok(Claimed::none(Route::Controlled));
    }
    let mut budget = concurrency_budget(c, q, &row, a.limit).await?;
    let mut answer = Claimed::none(Route::Controlled);
    let rate = row.rate();
    if let Some(r) = rate {
        let window = rate_window(c, q, r, now, a.now, began).await?;
        now = window.now;
        answer.rated = Some(window.rated);
        answer.wait = window.wait;
        budget = budget.min(window.left);
    }
    if budget <= 0 {
        return Ok(answer);
    }
    answer.wait = None;
    let kinds = Kinds::of(a);
    let ids = match row.partition_limit {
        Some(per) => pick_partitioned(c, q, &kinds, now, budget, i64::from(per)).await?,
        None => c.due(q, &kinds, now, budget).await?,
    };
    if ids.is_empty() {
        return Ok(answer);
    }
    answer.jobs = c.take(ids, a, now).await?;
    if rate.is_some() && !answer.jobs.is_empty() {
        let n = i32::try_from(answer.jobs.len()).unwrap_or(i32::MAX);
        c.record_claim(q, now, n).await?;
    }
    Ok(answer)
}

/// The claim's budget under the queue's global concurrency limit: `limit`, or fewer if
/// the queue's running jobs leave less room (possibly none, or less than none).
async fn concurrency_budget<C: ClaimSteps>(
    c: &mut C,
    q: &str,
    row: &QueueRow,
    limit: i64,
) -> QueryResult<i64> {
    match row.concurrency_limit {
        Some(max) => Ok(limit.min(i64::from(max) - c.count_running(q).await?)),
        None => Ok(limit),
    }
}

/// What the rate window leaves a claim.
#[derive(Debug, PartialEq, Eq)]
struct RateWindow {
    /// The claim's time: the clock read once the row was locked, never earlier than a
    /// recorded claim.
    now: i64,
    /// Jobs the window still takes (possibly none, or less than none).
    left: i64,
    /// When it takes none: how long until its oldest entry leaves it.
    wait: Option<Duration>,
    /// How long the claim had been running before the clock was read.
    rated: Duration,
}

/// Reads the queue's rate window with the clock read now that the row is locked — the time
/// this claim records — and forgets the entries that left it. The lock statement's "now" may
/// be much earlier (PostgreSQL's is the transaction's start, MySQL's the statement's, before
/// the lock wait), and a claim recorded earlier than it commits would let the claims just
/// after a window's end crowd into it in real time. Sent now: the time it reads is later
/// than `rated` after `began`, whatever the lock waited.
async fn rate_window<C: ClaimSteps>(
    c: &mut C,
    q: &str,
    r: RateLimit,
    locked_at: i64,
    bound: Option<i64>,
    began: Instant,
) -> QueryResult<RateWindow> {
    let rated = began.elapsed();
    let found = c.read_rate_window(q, bound).await?;
    let per = dur_us(r.per()) + dur_us(RATE_START_MARGIN);
    let window = in_window(&found, locked_at, per, r.jobs(), rated);
    if found
        .iter()
        .any(|(_, t, _)| t.is_some_and(|t| t <= window.now - per))
    {
        c.forget_claims(q, window.now - per).await?;
    }
    Ok(window)
}

/// The arithmetic of [`rate_window`] over the rows it read (`(clock, claimed_at, jobs)`),
/// for a window of `per` µs taking `jobs`.
fn in_window(
    found: &[WindowRow],
    locked_at: i64,
    per: i64,
    jobs: u32,
    rated: Duration,
) -> RateWindow {
    let window: Vec<(i64, i32)> = found
        .iter()
        .filter_map(|(_, t, n)| Some(((*t)?, (*n)?)))
        .collect();
    // Claims of the queue are serialized by its row lock; their times must be too, should
    // the clock step back: never earlier than the latest recorded claim.
    let now = found
        .iter()
        .map(|(clock, _, _)| *clock)
        .chain(window.iter().map(|(t, _)| *t))
        .fold(locked_at, i64::max);
    let since = now - per;
    let inside = window.iter().filter(|(t, _)| *t > since);
    let taken: i64 = inside.clone().map(|(_, n)| i64::from(*n)).sum();
    let oldest = inside.map(|(t, _)| *t).min();
    let left = i64::from(jobs) - taken;
    let wait = match oldest {
        Some(oldest) if left <= 0 => {
            let us = (oldest + per - now).max(1);
            Some(Duration::from_micros(u64::try_from(us).unwrap_or(1)))
        }
        _ => None,
    };
    RateWindow {
        now,
        left,
        wait,
        rated,
    }
}

/// The jobs to claim under a per-partition limit of `per`: the running jobs per partition
/// (few: they hold leases), then a bounded head of the queue ranked within its partitions,
/// and past it, for a burst, a walk of the partitions (see `partitions`): a backlog of full
/// partitions never hides the others' due jobs, and costs a claim one read of its first rows.
async fn pick_partitioned<C: ClaimSteps>(
    c: &mut C,
    q: &str,
    kinds: &Kinds,
    now: i64,
    budget: i64,
    per: i64,
) -> QueryResult<Vec<i64>> {
    let rooms = Rooms::new(per, c.running_per_partition(q).await?);
    let head_len = partitions::head_len(budget);
    let head = c.head(q, kinds, now, head_len).await?;
    let ranking = Ranking::new(&head, head_len, &rooms);
    let walk = ranking.needs_walk(budget) && (kinds.any || !kinds.list.is_empty());
    let mut candidates = ranking.picked;
    if walk {
        candidates.extend(walk_partitions(c, q, kinds, now, budget, &rooms).await?);
        // Keyless jobs past the head: where the partition index holds them too (MySQL:
        // `partition_key IS NULL`, in claim order), read there; elsewhere looked for in the
        // due jobs right after the head.
        let keyless: Vec<Keyless> = if c.scan_sql().keyless_indexed {
            let mut found = Vec::new();
            for st in [JobState::Pending, JobState::Retrying] {
                found.extend(c.keyless_indexed(q, kinds, now, budget, st).await?);
            }
            found
        } else if let Some(last) = head.last() {
            c.keyless_past_head(q, kinds, now, last).await?
        } else {
            Vec::new()
        };
        candidates.extend(keyless.into_iter().map(|(id, priority, run_at)| Pick {
            at: Candidate {
                priority,
                run_at,
                id,
            },
            key: None,
        }));
    }
    Ok(partitions::pick(candidates, budget, &rooms))
}

/// Walks the partitions of the queue's due keyed jobs (once per waiting state where the
/// backend reads them apart): from each partition with room, its first jobs up to that room.
async fn walk_partitions<C: ClaimSteps>(
    c: &mut C,
    q: &str,
    kinds: &Kinds,
    now: i64,
    budget: i64,
    rooms: &Rooms,
) -> QueryResult<Vec<Pick>> {
    let sql = c.scan_sql();
    let skip = if sql.skip_full {
        rooms.full()
    } else {
        Vec::new()
    };
    let mut found = Vec::new();
    for state in sql.states {
        let mut walk = Walk::new(rooms, budget);
        while let Some((from, n)) = walk.read() {
            let rows = c
                .scan(PartitionScan {
                    queue: q,
                    sql,
                    state,
                    skip: &skip,
                    from,
                    now,
                    kinds: (!kinds.any).then_some(kinds.list.as_slice()),
                    n,
                })
                .await?;
            walk.take(rows);
        }
        found.extend(walk.found);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn the_window_takes_what_its_claims_left_and_says_when_it_frees() {
        let per = 10 * S;
        let rated = Duration::from_millis(1);
        // Claims of 4 at 0 and 6 at 3 s; the clock reads 4 s.
        let found = [(4 * S, Some(0), Some(4)), (4 * S, Some(3 * S), Some(6))];
        let w = in_window(&found, 2 * S, per, 10, rated);
        assert_eq!((w.now, w.left), (4 * S, 0));
        assert_eq!(
            w.wait,
            Some(Duration::from_secs(6)),
            "until the 4 at 0 leave"
        );
        // At 10 s the first claim has left.
        let later = [(10 * S, Some(0), Some(4)), (10 * S, Some(3 * S), Some(6))];
        let w = in_window(&later, 10 * S, per, 10, rated);
        assert_eq!((w.left, w.wait), (4, None));
    }

    #[test]
    fn the_window_never_goes_back_before_a_recorded_claim() {
        let found = [(5, Some(9), Some(1))];
        let w = in_window(&found, 3, 100, 5, Duration::ZERO);
        assert_eq!((w.now, w.left), (9, 4));
        let empty = [(7, None, None)];
        let w = in_window(&empty, 3, 100, 5, Duration::ZERO);
        assert_eq!((w.now, w.left, w.wait), (7, 5, None));
    }
}
