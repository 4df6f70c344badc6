//! Counting what this process's database connections send: statements, round trips and
//! commits, by a diesel instrumentation installed as the default of every connection opened
//! while counting is on — the cost model's source (`examples/bench`, `--only cost`) and the
//! drain's statement budget (`tests/drain_budget.rs`). Counts, not times: they do not drift
//! with the machine.
//!
//! What each figure includes:
//!
//! * **statements**: every statement sent — `BEGIN`, `COMMIT`, MySQL's checkout ping and
//!   each statement of a pipeline included; a string sent by `batch_execute` counts once;
//!   a statement's preparation (once per connection) does not count;
//! * **round trips**: groups of statements sent on one connection before the first of them
//!   answered — a pipelined group (PostgreSQL's controlled claim) counts once, anything sent
//!   alone counts once. On SQLite (in-process) a round trip is a call into the library;
//! * **commits**: transactions that write and commit — each `COMMIT`, and each `INSERT`,
//!   `UPDATE`, `DELETE` (or a `WITH` holding one) sent outside a transaction (autocommit),
//!   counted when its round trip has answered. Autocommitted reads (the ping, a `SELECT`)
//!   are not counted;
//! * **by kind**: statements by the first [`KIND_CHARS`] characters of their SQL, whitespace
//!   collapsed — where the statements go.
//!
//! Connections opened while counting is off carry no instrumentation at all, so a drain
//! timed for CPU runs uninstrumented. The counters are the process's: measure one thing at a
//! time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, Once};

use diesel::connection::{set_default_instrumentation, Instrumentation, InstrumentationEvent};

/// How many characters of a statement's SQL name its kind in [`Sent::by_kind`] (72).
pub const KIND_CHARS: usize = 72;

static ON: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);
static COMMITS: AtomicU64 = AtomicU64::new(0);
static KINDS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
static INSTALL: Once = Once::new();

/// What the connections sent, from [`sent`]; subtract two with [`Sent::since`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sent {
    /// Statements sent (see the module docs for what counts).
    pub statements: u64,
    /// Round trips: statements sent together count once.
    pub round_trips: u64,
    /// Write transactions committed (explicit `COMMIT`s and autocommitted writes).
    pub commits: u64,
    /// Statements by kind: the first [`KIND_CHARS`] characters of their SQL.
    pub by_kind: BTreeMap<String, u64>,
}

impl Sent {
    /// What was sent after `earlier` (a snapshot taken before this one).
    pub fn since(&self, earlier: &Sent) -> Sent {
        Sent {
            statements: self.statements.saturating_sub(earlier.statements),
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            commits: self.commits.saturating_sub(earlier.commits),
            by_kind: self
                .by_kind
                .iter()
                .filter_map(|(k, &n)| {
                    let n = n.saturating_sub(earlier.by_kind.get(k).copied().unwrap_or(0));
                    (n > 0).then(|| (k.clone(), n))
                })
                .collect(),
        }
    }
}

/// Installs the counter as every new connection's default instrumentation (once per
/// process; later calls only switch counting on or off) and turns counting `on` or off for
/// connections opened from now on. Connections already open keep what they were opened with.
///
/// # Panics
/// If diesel refuses the default instrumentation (its lock poisoned).
pub fn count_statements(on: bool) {
    INSTALL.call_once(|| {
        set_default_instrumentation(new_counter)
            .unwrap_or_else(|e| panic!("installing the statement counter: {e}"));
    });
    ON.store(on, SeqCst);
}

/// What every counted connection has sent so far.
pub fn sent() -> Sent {
    Sent {
        statements: STATEMENTS.load(SeqCst),
        round_trips: ROUND_TRIPS.load(SeqCst),
        commits: COMMITS.load(SeqCst),
        by_kind: KINDS.lock().map(|k| k.clone()).unwrap_or_default(),
    }
}

fn new_counter() -> Option<Box<dyn Instrumentation>> {
    ON.load(SeqCst)
        .then(|| Box::new(ConnCounter::default()) as Box<dyn Instrumentation>)
}

/// One connection's state: statements in flight (a pipeline), whether a transaction is
/// open, and the current round trip's autocommitted writes, counted as commits when it ends
/// unless it held a `BEGIN`: diesel-async reports a pipeline's statements in the order their
/// futures were made, not sent (PostgreSQL's controlled claim makes its claim before its
/// `BEGIN`), and a pipeline holding a `BEGIN` is that transaction.
#[derive(Debug, Default)]
struct ConnCounter {
    in_flight: u32,
    in_tx: bool,
    trip_begins: bool,
    trip_writes: u64,
}

impl Instrumentation for ConnCounter {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartQuery { query, .. } => {
                let sql = sql_of(query);
                self.started(&sql);
            }
            InstrumentationEvent::FinishQuery { .. } => {
                self.in_flight = self.in_flight.saturating_sub(1);
                if self.in_flight == 0 {
                    if !self.trip_begins {
                        COMMITS.fetch_add(self.trip_writes, SeqCst);
                    }
                    self.trip_writes = 0;
                }
            }
            _ => {}
        }
    }
}

impl ConnCounter {
    fn started(&mut self, sql: &str) {
        STATEMENTS.fetch_add(1, SeqCst);
        if self.in_flight == 0 {
            ROUND_TRIPS.fetch_add(1, SeqCst);
            self.trip_begins = false;
            self.trip_writes = 0;
        }
        self.in_flight += 1;
        let head = first_word(sql);
        if head.eq_ignore_ascii_case("BEGIN") || head.eq_ignore_ascii_case("START") {
            self.in_tx = true;
            self.trip_begins = true;
        } else if head.eq_ignore_ascii_case("COMMIT") {
            self.in_tx = false;
            COMMITS.fetch_add(1, SeqCst);
        } else if head.eq_ignore_ascii_case("ROLLBACK") && !sql.contains(" TO ") {
            self.in_tx = false;
        } else if !self.in_tx && writes(head, sql) {
            // Counted when the round trip ends (see the type's docs).
            self.trip_writes += 1;
        }
        if let Ok(mut kinds) = KINDS.lock() {
            *kinds.entry(kind_of(sql)).or_insert(0) += 1;
        }
    }
}

/// Whether an autocommitted statement writes (and so commits a transaction that wrote).
fn writes(head: &str, sql: &str) -> bool {
    const WRITES: [&str; 4] = ["INSERT", "UPDATE", "DELETE", "REPLACE"];
    WRITES.iter().any(|w| head.eq_ignore_ascii_case(w))
        || (head.eq_ignore_ascii_case("WITH") && {
            let upper = sql.to_ascii_uppercase();
            WRITES.iter().any(|w| upper.contains(w))
        })
}

fn first_word(sql: &str) -> &str {
    let sql = sql.trim_start_matches(|c: char| c.is_whitespace() || c == '(');
    let end = sql
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(sql.len());
    &sql[..end]
}

fn kind_of(sql: &str) -> String {
    let mut kind = String::with_capacity(KIND_CHARS);
    for word in sql.split_whitespace() {
        if !kind.is_empty() {
            kind.push(' ');
        }
        kind.push_str(word);
        if kind.chars().count() >= KIND_CHARS {
            break;
        }
    }
    kind.chars().take(KIND_CHARS).collect()
}

/// The SQL of a statement without its binds: its `Display` writes the SQL first, in one
/// piece, then ` -- binds: …`, which this stops before formatting.
fn sql_of(query: &dyn diesel::connection::DebugQuery) -> String {
    struct FirstPiece(String);
    impl std::fmt::Write for FirstPiece {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            if self.0.is_empty() {
                self.0.push_str(s);
                Ok(())
            } else {
                Err(std::fmt::Error)
            }
        }
    }
    let mut w = FirstPiece(String::new());
    // An error here is the stop after the SQL, by design.
    let _ = write!(w, "{query}");
    let sql = w.0;
    match sql.find(" -- binds:") {
        Some(i) => sql[..i].to_string(),
        None => sql,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_words_are_read_from_the_sql() {
        assert_eq!(first_word("  (SELECT 1)"), "SELECT");
        assert_eq!(first_word("BEGIN IMMEDIATE"), "BEGIN");
        assert_eq!(kind_of("UPDATE  t\n SET a = 1"), "UPDATE t SET a = 1");
        assert!(writes("WITH", "WITH x AS (UPDATE t SET a = 1) SELECT 1"));
        assert!(!writes("SELECT", "SELECT 1"));
        assert!(!writes("WITH", "WITH x AS (SELECT 1) SELECT 2"));
    }
}
