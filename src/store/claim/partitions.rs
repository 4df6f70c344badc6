//! The partition search of the portable controlled claim (MySQL, MariaDB, SQLite, and
//! PostgreSQL for a rate-limited queue): how a claim under a per-partition limit finds the
//! due jobs of partitions with room without stepping over a backlog of full ones.
//!
//! The claim reads a bounded head of the queue in claim order ([`head_len`]) and ranks each
//! job within its partition ([`Ranking`]). Only if the head yields fewer jobs than the claim
//! may take and is a burst ([`Ranking::needs_walk`]) does it look further: it reads the due
//! jobs that have a key in *partition* order ([`PartitionScan`], [`SCAN_ROWS`] a statement,
//! each statement starting after the last partition the previous one reached), taking from
//! each partition with room its first jobs up to that room ([`Walk`]). A partition's jobs are
//! read at most [`SCAN_ROWS`] deep: a burst of 100,000 jobs costs one statement, not 100,000
//! rows. Each backend has the index this reads in order: PostgreSQL and SQLite a partial
//! index of the waiting jobs that have a key, `(queue, partition_key, priority, run_at, id)`
//! (SQLite's also holds `kind`, so a claim of some kinds reads the index alone);
//! MySQL, which has no partial indexes, `(queue, state, partition_key, priority, run_at)`
//! over every job (and the primary key, as every InnoDB index) — so there each waiting
//! state is read on its own, and the partitions at their limit are left out by index ranges.
//! How each backend reads is its own ([`ScanSql`], given by each backend's `sql.rs`).
//!
//! Why not one probe per partition, as PostgreSQL's own claim does: MariaDB does not use a
//! range on an outer reference inside a subquery (a recursive walk of the keys read the
//! whole index at each step) and has no `LATERAL`, and its loose index scan for `GROUP BY`
//! depends on statistics a fresh burst has not updated.

use std::collections::{HashMap, HashSet};

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Integer, Text, Untyped};
use diesel::QueryableByName;

pub(crate) use super::super::expr::ScanSql;

/// Jobs of the head of the queue a claim under a per-partition limit reads: 4 × its budget,
/// at least 128, at most 4,000.
pub(crate) fn head_len(budget: i64) -> i64 {
    budget.saturating_mul(4).clamp(128, 4000)
}

/// Rows one [`PartitionScan`] statement reads.
pub(crate) const SCAN_ROWS: i64 = 500;

/// Keyless due jobs looked for past the head when the claim walks the partitions, where the
/// index read holds only keyed jobs (PostgreSQL, SQLite): behind a longer backlog of full
/// partitions they wait until it shortens (an index that found them anywhere would cost every
/// enqueue of every queue an entry).
pub(crate) const KEYLESS_PAST_HEAD: i64 = 1000;

/// A job of the head of the queue, in claim order.
#[derive(Debug, Clone)]
pub(crate) struct HeadJob {
    pub(crate) id: i64,
    pub(crate) partition: Option<String>,
    pub(crate) priority: i32,
    pub(crate) run_at: i64,
}

/// A job's place in claim order: `(priority, run_at, id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, QueryableByName)]
pub(crate) struct Candidate {
    #[diesel(sql_type = Integer)]
    pub(crate) priority: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) run_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

/// A job the claim may take, with its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pick {
    pub(crate) at: Candidate,
    pub(crate) key: Option<String>,
}

/// A row of a [`PartitionScan`]: a due job with a key, in partition order.
#[derive(Debug, Clone, QueryableByName)]
pub(crate) struct ScanRow {
    #[diesel(sql_type = Text)]
    pub(crate) k: String,
    #[diesel(embed)]
    pub(crate) job: Candidate,
}

/// Each partition's room: its limit less its running jobs.
#[derive(Debug)]
pub(crate) struct Rooms {
    limit: i64,
    room: HashMap<String, i64>,
}

impl Rooms {
    /// Rooms under a limit of `limit` per partition, given `(partition, running)` pairs.
    pub(crate) fn new(limit: i64, running: impl IntoIterator<Item = (String, i64)>) -> Self {
        Rooms {
            limit,
            room: running.into_iter().map(|(k, n)| (k, limit - n)).collect(),
        }
    }

    fn of(&self, key: &str) -> i64 {
        self.room.get(key).copied().unwrap_or(self.limit)
    }

    /// The partitions at their limit.
    pub(crate) fn full(&self) -> Vec<String> {
        let mut full: Vec<String> = self
            .room
            .iter()
            .filter(|(_, r)| **r <= 0)
            .map(|(k, _)| k.clone())
            .collect();
        full.sort_unstable();
        full
    }
}

/// The head of the queue ranked within its partitions: what it yields, and whether the claim
/// must look past it.
#[derive(Debug)]
pub(crate) struct Ranking {
    /// The head's jobs within their partition's room, in claim order.
    pub(crate) picked: Vec<Pick>,
    /// Whether the head holds as many jobs as was asked for (so more may wait past it).
    full: bool,
    /// Distinct partition keys in the head.
    keys: usize,
    head: i64,
}

impl Ranking {
    /// Ranks `head`, read with a limit of `head_len`.
    pub(crate) fn new(head: &[HeadJob], head_len: i64, rooms: &Rooms) -> Self {
        let mut left: HashMap<&str, i64> = HashMap::new();
        let mut picked = Vec::new();
        for j in head {
            if let Some(p) = &j.partition {
                let r = left.entry(p.as_str()).or_insert_with(|| rooms.of(p));
                if *r <= 0 {
                    continue;
                }
                *r -= 1;
            }
            picked.push(Pick {
                at: Candidate {
                    priority: j.priority,
                    run_at: j.run_at,
                    id: j.id,
                },
                key: j.partition.clone(),
            });
        }
        Ranking {
            picked,
            full: i64::try_from(head.len()).unwrap_or(i64::MAX) >= head_len,
            keys: left.len(),
            head: head_len,
        }
    }

    /// Whether the claim must walk the partitions: the head is full, yields fewer than
    /// `budget` jobs, and is a burst — nothing in it claimable, or at most one partition per
    /// four jobs. A head of many partitions stands for the queue; looking further would cost
    /// most claims a read of every partition for nothing.
    pub(crate) fn needs_walk(&self, budget: i64) -> bool {
        let yielded = i64::try_from(self.picked.len()).unwrap_or(i64::MAX);
        let keys = i64::try_from(self.keys).unwrap_or(i64::MAX);
        self.full
            && yielded < budget
            && (self.picked.is_empty() || keys.saturating_mul(4) <= self.head)
    }
}

/// The first `budget` of `candidates` in claim order, each once, each partition's within
/// its room.
pub(crate) fn pick(mut candidates: Vec<Pick>, budget: i64, rooms: &Rooms) -> Vec<i64> {
    candidates.sort_unstable_by_key(|p| p.at);
    let mut seen = HashSet::new();
    let mut left: HashMap<String, i64> = HashMap::new();
    let mut ids = Vec::new();
    for p in candidates {
        if i64::try_from(ids.len()).unwrap_or(i64::MAX) >= budget {
            break;
        }
        if !seen.insert(p.at.id) {
            continue;
        }
        if let Some(k) = p.key {
            let r = left.entry(k).or_insert_with_key(|k| rooms.of(k));
            if *r <= 0 {
                continue;
            }
            *r -= 1;
        }
        ids.push(p.at.id);
    }
    ids
}

/// Where a [`PartitionScan`] starts: at the first partition, after one, or within one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ScanFrom<'a> {
    Start,
    After(&'a str),
    Only(&'a str),
}

/// The due jobs with a partition key of `queue` in state `state` (see [`ScanSql`]), but those
/// of the partitions in `skip`,
/// of one of `kinds` (any kind when `None`), in partition order and claim order within
/// each, from `from`, at most `n`.
#[derive(Debug, Clone)]
pub(crate) struct PartitionScan<'a> {
    pub(crate) queue: &'a str,
    pub(crate) sql: ScanSql,
    pub(crate) state: &'static str,
    pub(crate) skip: &'a [String],
    pub(crate) from: ScanFrom<'a>,
    pub(crate) now: i64,
    pub(crate) kinds: Option<&'a [String]>,
    pub(crate) n: i64,
}

// The text depends on the values (a state, where it starts, how many kinds): never cached by
// type.
impl QueryId for PartitionScan<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for PartitionScan<'_> {
    type SqlType = Untyped;
}

impl<DB> QueryFragment<DB> for PartitionScan<'_>
where
    DB: Backend + diesel::sql_types::HasSqlType<Text> + diesel::sql_types::HasSqlType<BigInt>,
    str: diesel::serialize::ToSql<Text, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql(
            "SELECT j.partition_key AS k, j.priority AS priority, j.run_at AS run_at, \
             j.id AS id FROM ",
        );
        out.push_sql(self.sql.table);
        out.push_sql(" WHERE j.queue = ");
        out.push_bind_param::<Text, _>(self.queue)?;
        out.push_sql(" AND j.state ");
        out.push_sql(self.state);
        match self.from {
            ScanFrom::Start => out.push_sql(" AND j.partition_key IS NOT NULL"),
            ScanFrom::After(key) => {
                out.push_sql(" AND j.partition_key > ");
                out.push_bind_param::<Text, _>(key)?;
            }
            ScanFrom::Only(key) => {
                out.push_sql(" AND j.partition_key = ");
                out.push_bind_param::<Text, _>(key)?;
            }
        }
        if !self.skip.is_empty() {
            push_list(&mut out, " AND j.partition_key NOT IN (", self.skip)?;
        }
        out.push_sql(" AND j.run_at <= ");
        out.push_bind_param::<BigInt, _>(&self.now)?;
        if let Some(kinds) = self.kinds {
            push_list(&mut out, " AND j.kind IN (", kinds)?;
        }
        out.push_sql(" ORDER BY j.partition_key, j.priority, j.run_at, j.id LIMIT ");
        out.push_bind_param::<BigInt, _>(&self.n)?;
        Ok(())
    }
}

/// `head` and the binds of `items` (not empty), comma-separated, then `)`: padded by repeating
/// the last item (`padded_len`), so the statement's text takes few shapes and its
/// prepared forms stay few in each connection's cache (a set test: a repeat changes nothing).
fn push_list<'b, DB>(
    out: &mut AstPass<'_, 'b, DB>,
    head: &str,
    items: &'b [String],
) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<Text>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    let Some(last) = items.last() else {
        return Err(diesel::result::Error::QueryBuilderError(
            "an empty list in a partition scan".into(),
        ));
    };
    out.push_sql(head);
    for n in 0..super::super::expr::padded_len(items.len()) {
        if n > 0 {
            out.push_sql(", ");
        }
        out.push_bind_param::<Text, _>(items.get(n).unwrap_or(last))?;
    }
    out.push_sql(")");
    Ok(())
}

/// Where a walk reads next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    Start,
    /// From the partition after this one.
    After(String),
    /// This partition again, from its first job: the rows stopped before it gave all it
    /// may.
    Within(String),
    Done,
}

/// One walk of the partitions (per waiting state): from each partition, its first jobs up
/// to `min(room, budget)`. [`Walk::read`] says what to read next, [`Walk::take`] takes from
/// what was read.
#[derive(Debug)]
pub(crate) struct Walk<'a> {
    rooms: &'a Rooms,
    budget: i64,
    taken: HashMap<String, i64>,
    cursor: Cursor,
    asked: i64,
    /// The jobs taken, in the order read.
    pub(crate) found: Vec<Pick>,
}

impl<'a> Walk<'a> {
    /// A walk for a claim of at most `budget` jobs.
    pub(crate) fn new(rooms: &'a Rooms, budget: i64) -> Self {
        Walk {
            rooms,
            budget,
            taken: HashMap::new(),
            cursor: Cursor::Start,
            asked: 0,
            found: Vec::new(),
        }
    }

    fn wants(&self, key: &str) -> i64 {
        self.rooms.of(key).min(self.budget) - self.taken.get(key).copied().unwrap_or(0)
    }

    /// Where the next statement reads from and how many rows it reads, or `None` when the
    /// walk is over.
    pub(crate) fn read(&mut self) -> Option<(ScanFrom<'_>, i64)> {
        self.asked = match &self.cursor {
            Cursor::Done => return None,
            // Read again from its first job: forget what was taken from it.
            Cursor::Within(k) => {
                self.taken.remove(k);
                self.wants(k).max(0)
            }
            Cursor::Start | Cursor::After(_) => SCAN_ROWS,
        };
        let from = match &self.cursor {
            Cursor::Start => ScanFrom::Start,
            Cursor::After(k) => ScanFrom::After(k),
            Cursor::Within(k) => ScanFrom::Only(k),
            Cursor::Done => return None,
        };
        Some((from, self.asked))
    }

    /// Takes what it may of the rows of the statement [`Walk::read`] described.
    pub(crate) fn take(&mut self, rows: Vec<ScanRow>) {
        let complete = i64::try_from(rows.len()).unwrap_or(i64::MAX) < self.asked;
        let mut last = None;
        for r in rows {
            if self.wants(&r.k) > 0 {
                *self.taken.entry(r.k.clone()).or_insert(0) += 1;
                self.found.push(Pick {
                    at: r.job,
                    key: Some(r.k.clone()),
                });
            }
            last = Some(r.k);
        }
        self.cursor = match (std::mem::replace(&mut self.cursor, Cursor::Done), last) {
            // A partition read again from its first job gave all it has or may: on after it.
            (Cursor::Within(k), _) => Cursor::After(k),
            (_, Some(k)) if !complete => {
                if self.wants(&k) > 0 {
                    Cursor::Within(k)
                } else {
                    Cursor::After(k)
                }
            }
            _ => Cursor::Done,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, partition: Option<&str>) -> HeadJob {
        HeadJob {
            id,
            partition: partition.map(str::to_string),
            priority: 10,
            run_at: id,
        }
    }

    fn at(priority: i32, run_at: i64, id: i64) -> Candidate {
        Candidate {
            priority,
            run_at,
            id,
        }
    }

    fn row(k: &str, id: i64) -> ScanRow {
        ScanRow {
            k: k.to_string(),
            job: at(10, id, id),
        }
    }

    #[test]
    fn the_head_is_ranked_within_each_partitions_room() {
        let head = [
            job(1, Some("a")),
            job(2, Some("a")),
            job(3, None),
            job(4, Some("b")),
            job(5, Some("a")),
            job(6, Some("b")),
        ];
        let rooms = Rooms::new(2, [("b".to_string(), 1)]);
        let r = Ranking::new(&head, 128, &rooms);
        let ids: Vec<i64> = r.picked.iter().map(|c| c.at.id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert!(
            !r.needs_walk(10),
            "a head shorter than asked holds the whole queue"
        );
    }

    #[test]
    fn only_a_full_head_of_few_partitions_that_yields_too_little_is_walked_past() {
        let burst: Vec<HeadJob> = (0..128).map(|i| job(i, Some("a"))).collect();
        let full = Rooms::new(1, [("a".to_string(), 1)]);
        assert!(Ranking::new(&burst, 128, &full).needs_walk(1));
        let open = Rooms::new(1, []);
        let r = Ranking::new(&burst, 128, &open);
        assert!(r.needs_walk(2) && !r.needs_walk(1));
        let three = ["a", "b", "c"];
        let many: Vec<HeadJob> = (0..128)
            .map(|i| job(i, Some(three[usize::try_from(i % 3).unwrap()])))
            .collect();
        assert!(Ranking::new(&many, 128, &open).needs_walk(10));
        let spread: Vec<HeadJob> = (0..128).map(|i| job(i, Some(&format!("p{i}")))).collect();
        let closed = Rooms::new(0, []);
        assert!(
            Ranking::new(&spread, 128, &closed).needs_walk(10),
            "nothing claimable"
        );
        let spread: Vec<HeadJob> = (0..128)
            .map(|i| job(i, Some(&format!("p{}", i % 40))))
            .collect();
        assert!(!Ranking::new(&spread, 128, &open).needs_walk(100));
    }

    #[test]
    fn the_full_partitions_are_those_without_room() {
        let rooms = Rooms::new(2, [("b".into(), 2), ("a".into(), 3), ("c".into(), 1)]);
        assert_eq!(rooms.full(), ["a", "b"]);
        assert_eq!(rooms.of("c"), 1);
        assert_eq!(rooms.of("never-ran"), 2);
    }

    #[test]
    fn picks_are_in_claim_order_once_each_within_each_room() {
        let p = |c: Candidate, key: Option<&str>| Pick {
            at: c,
            key: key.map(str::to_string),
        };
        let rooms = Rooms::new(1, [("full".to_string(), 1)]);
        let cands = vec![
            p(at(10, 5, 7), None),
            p(at(1, 9, 3), Some("a")),
            p(at(10, 5, 2), Some("b")),
            p(at(1, 9, 3), Some("a")),
            p(at(1, 1, 9), Some("full")),
            p(at(2, 1, 4), Some("a")),
        ];
        assert_eq!(pick(cands.clone(), 10, &rooms), [3, 2, 7]);
        assert_eq!(pick(cands.clone(), 2, &rooms), [3, 2]);
        assert_eq!(pick(cands, 0, &rooms), Vec::<i64>::new());
    }

    #[test]
    fn a_walk_takes_each_partitions_first_jobs_and_reads_on_from_the_right_place() {
        let rooms = Rooms::new(2, [("a".to_string(), 2), ("c".to_string(), 1)]);
        let mut w = Walk::new(&rooms, 10);
        let step = |w: &mut Walk<'_>, rows: Vec<ScanRow>| -> String {
            let read = format!("{:?}", w.read());
            w.take(rows);
            read
        };
        // "a" is full, "b" takes two, "c" one; the rows stop inside "d", which gives one.
        let rows = (1..=SCAN_ROWS - 1)
            .map(|i| {
                row(
                    ["a", "a", "b", "b", "b", "c", "c"]
                        .get(usize::try_from(i - 1).unwrap())
                        .copied()
                        .unwrap_or("b"),
                    i,
                )
            })
            .chain([row("d", SCAN_ROWS)])
            .collect();
        assert_eq!(step(&mut w, rows), format!("Some((Start, {SCAN_ROWS}))"));
        assert_eq!(
            step(&mut w, vec![row("d", SCAN_ROWS), row("d", 9000)]),
            "Some((Only(\"d\"), 2))"
        );
        // After "d": rows that end the scan.
        assert_eq!(
            step(&mut w, vec![row("e", 9001)]),
            format!("Some((After(\"d\"), {SCAN_ROWS}))")
        );
        assert_eq!(format!("{:?}", w.read()), "None");
        let ids: Vec<i64> = w.found.iter().map(|p| p.at.id).collect();
        assert_eq!(ids, [3, 4, 6, SCAN_ROWS, SCAN_ROWS, 9000, 9001]);
        assert_eq!(
            Walk::new(&rooms, 1).wants("b"),
            1,
            "never more from a partition than the claim's budget"
        );
    }

    #[test]
    fn a_walk_stops_at_rows_fewer_than_asked_and_never_repeats_a_read() {
        let rooms = Rooms::new(1, []);
        let mut w = Walk::new(&rooms, 5);
        assert!(w.read().is_some());
        w.take(vec![row("a", 1)]);
        assert!(w.read().is_none());
        let mut w = Walk::new(&rooms, 5);
        assert!(w.read().is_some());
        w.take((0..SCAN_ROWS).map(|i| row("z", i)).collect());
        assert_eq!(
            format!("{:?}", w.read()),
            format!("Some((After(\"z\"), {SCAN_ROWS}))")
        );
        w.take(Vec::new());
        assert!(w.read().is_none());
    }
}
