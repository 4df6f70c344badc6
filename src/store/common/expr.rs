//! The few SQL expressions diesel's builder does not have, each rendered once per backend.
//!
//! * [`DbNow`]: "now" as epoch microseconds — the bound test-clock instant if there is one,
//!   else the database's clock — plus an offset. Every stored time and every comparison goes
//!   through it, so production nodes never compare their own clocks.
//! * [`DbClock`]: the database's clock as the statement runs, after the locks it waited
//!   for (PostgreSQL's "now" is the transaction's start): the time a rate-limited claim
//!   records.
//! * [`JsonAppend`]: append one JSON value to a JSON array column (the `errors` history).
//! * [`DbNowPlus`]: "now" plus an optional offset (`NULL` without one): the end of a
//!   unique-key period.
//! * [`ReleaseHold`], [`RetakeHold`]: a `while_active` job releasing its unique key as it
//!   ends, or taking it again on a manual retry.
//! * [`KeepOrNowMinus`]: a start time kept, or now minus how long ago the handler started.
//!
//! * [`InList`]: `column IN (?, …)` whose text takes one of a few shapes, so it stays cached
//!   (diesel's `eq_any` is never cached: on MySQL every use cost a prepare round trip).
//! * [`StateIn`], [`SkipLocked`], [`ForUpdate`], `prepared_statement!`, `claim_columns!`.
//! * [`ScanSql`]: how the partition scan of a controlled claim reads (`claim/partitions.rs`).
//!
//! All render static SQL for a given backend and type, so prepared statements stay cached.
//! Each dialect's rendering (its "now", JSON append, row-value comparison, `SKIP LOCKED`)
//! lives in that backend's `sql.rs`, so a build without a backend compiles none of it.

use diesel::backend::Backend;
use diesel::expression::ValidGrouping;
use diesel::expression::{is_aggregate, AppearsOnTable, Expression, SelectableExpression};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Bool, Json, Nullable};

use super::schema::jobvisor_jobs;

/// The statement's "now" in epoch microseconds plus `plus_us`.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbNow {
    /// The test clock's instant, or `None` for the database clock.
    pub(crate) bound: Option<i64>,
    /// Added to now (a lease, a delay).
    pub(crate) plus_us: i64,
}

impl DbNow {
    pub(crate) fn new(bound: Option<i64>) -> Self {
        DbNow { bound, plus_us: 0 }
    }

    pub(crate) fn plus(self, us: i64) -> Self {
        DbNow {
            bound: self.bound,
            plus_us: self.plus_us.saturating_add(us),
        }
    }
}

impl Expression for DbNow {
    type SqlType = BigInt;
}

impl<QS> AppearsOnTable<QS> for DbNow {}
impl<QS> SelectableExpression<QS> for DbNow {}
impl<GB> ValidGrouping<GB> for DbNow {
    type IsAggregate = is_aggregate::Never;
}

/// The database clock, in epoch microseconds, per backend.
pub(crate) trait ClockSql: Backend {
    /// "Now", stable within a statement (PostgreSQL: within a transaction).
    const NOW_US: &'static str;
    /// The clock when the statement runs: later than every lock the transaction waited for
    /// in earlier statements.
    const CLOCK_US: &'static str;
}

/// How a backend's partition scan reads (`claim/partitions.rs`), per backend like its
/// clock: each backend's `sql.rs` gives its text and the reasons for it.
pub(crate) trait PartitionScanSql: Backend {
    /// This backend's way.
    const SCAN: ScanSql;
}

/// How a partition scan reads (see [`PartitionScanSql`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScanSql {
    /// The table, aliased `j`, with an index hint where the backend needs one.
    pub(crate) table: &'static str,
    /// "Waiting", once per scan: the states in one condition, or each on its own (one scan
    /// per entry).
    pub(crate) states: &'static [&'static str],
    /// Whether to leave out the partitions at their limit in the statement (`partition_key
    /// NOT IN (…)`), or only skip their rows as they are read.
    pub(crate) skip_full: bool,
    /// Whether the index read also holds the keyless jobs (`partition_key IS NULL`, in claim
    /// order); elsewhere keyless jobs past the head are looked for only in the
    /// `KEYLESS_PAST_HEAD` due jobs after it.
    pub(crate) keyless_indexed: bool,
}

/// The database's clock as the statement runs, in epoch microseconds: the bound test-clock
/// instant if there is one. Unlike [`DbNow`] it is never earlier than the locks the
/// transaction took before the statement.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbClock {
    /// The test clock's instant, or `None` for the database clock.
    pub(crate) bound: Option<i64>,
}

impl Expression for DbClock {
    type SqlType = BigInt;
}

impl<QS> AppearsOnTable<QS> for DbClock {}
impl<QS> SelectableExpression<QS> for DbClock {}
impl<GB> ValidGrouping<GB> for DbClock {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for DbClock
where
    DB: Backend + ClockSql + diesel::sql_types::HasSqlType<BigInt>,
    Option<i64>: diesel::serialize::ToSql<Nullable<BigInt>, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.bound)?;
        out.push_sql(", ");
        out.push_sql(DB::CLOCK_US);
        out.push_sql(")");
        Ok(())
    }
}

impl<DB> QueryFragment<DB> for DbNow
where
    DB: Backend + ClockSql + diesel::sql_types::HasSqlType<BigInt>,
    Option<i64>: diesel::serialize::ToSql<Nullable<BigInt>, DB>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.bound)?;
        out.push_sql(", ");
        out.push_sql(DB::NOW_US);
        out.push_sql(") + ");
        out.push_bind_param::<BigInt, _>(&self.plus_us)?;
        out.push_sql(")");
        Ok(())
    }
}

/// "Now" plus an optional offset: `NULL` when the offset is `None` (the end of a
/// [`UniqueScope::For`](crate::job::UniqueScope::For) hold, absent for other jobs).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct DbNowPlus {
    /// The test clock's instant, or `None` for the database clock.
    pub(crate) bound: Option<i64>,
    /// Added to now; `None` makes the whole expression `NULL`.
    pub(crate) plus_us: Option<i64>,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl Expression for DbNowPlus {
    type SqlType = Nullable<BigInt>;
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<QS> AppearsOnTable<QS> for DbNowPlus {}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<QS> SelectableExpression<QS> for DbNowPlus {}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<GB> ValidGrouping<GB> for DbNowPlus {
    type IsAggregate = is_aggregate::Never;
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<DB> QueryFragment<DB> for DbNowPlus
where
    DB: Backend + ClockSql + diesel::sql_types::HasSqlType<BigInt>,
    Option<i64>: diesel::serialize::ToSql<Nullable<BigInt>, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.bound)?;
        out.push_sql(", ");
        out.push_sql(DB::NOW_US);
        out.push_sql(") + ");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.plus_us)?;
        out.push_sql(")");
        Ok(())
    }
}

/// A start time kept if recorded, else "now" minus how long ago the handler started:
/// `COALESCE(<column>, COALESCE(bound, db-now) - ago)` — `started_at` and `first_started_at`
/// of a job completed in its handler's transaction between two heartbeats. Without an `ago`
/// (`NULL`) the column is left as it is.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct KeepOrNowMinus {
    /// The column (a constant: `started_at` or `first_started_at`).
    pub(crate) column: &'static str,
    /// The test clock's instant, or `None` for the database clock.
    pub(crate) bound: Option<i64>,
    /// How long ago the handler started, in µs.
    pub(crate) ago_us: Option<i64>,
}

impl Expression for KeepOrNowMinus {
    type SqlType = Nullable<BigInt>;
}
impl AppearsOnTable<jobvisor_jobs::table> for KeepOrNowMinus {}
impl SelectableExpression<jobvisor_jobs::table> for KeepOrNowMinus {}
impl<GB> ValidGrouping<GB> for KeepOrNowMinus {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for KeepOrNowMinus
where
    DB: Backend + ClockSql + diesel::sql_types::HasSqlType<BigInt>,
    Option<i64>: diesel::serialize::ToSql<Nullable<BigInt>, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("COALESCE(");
        out.push_sql(self.column);
        out.push_sql(", COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.bound)?;
        out.push_sql(", ");
        out.push_sql(DB::NOW_US);
        out.push_sql(") - ");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.ago_us)?;
        out.push_sql(")");
        Ok(())
    }
}

/// `unique_hold` released (`NULL`) when the write ends the job (the flag, bound as a
/// parameter, so the statement text stays one) and its scope is `while_active`, else
/// unchanged: the one column expression the terminal transitions written here (cancel,
/// reclaim) add to their `SET`; the batched finalizations spell it in their own SQL.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct ReleaseHold(pub(crate) bool);

impl Expression for ReleaseHold {
    type SqlType = Nullable<diesel::sql_types::Text>;
}
impl AppearsOnTable<jobvisor_jobs::table> for ReleaseHold {}
impl SelectableExpression<jobvisor_jobs::table> for ReleaseHold {}
impl<GB> ValidGrouping<GB> for ReleaseHold {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for ReleaseHold
where
    DB: Backend + diesel::sql_types::HasSqlType<Bool>,
    bool: diesel::serialize::ToSql<Bool, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("CASE WHEN ");
        out.push_bind_param::<Bool, _>(&self.0)?;
        out.push_sql(" AND unique_scope = 'while_active' THEN NULL ELSE unique_hold END");
        Ok(())
    }
}

/// `unique_hold` taken again (set to the key) for a `while_active` row, else unchanged: a
/// manual retry's attempt to hold its key again; the unique index refuses it while another
/// job holds the key.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct RetakeHold;

impl Expression for RetakeHold {
    type SqlType = Nullable<diesel::sql_types::Text>;
}
impl AppearsOnTable<jobvisor_jobs::table> for RetakeHold {}
impl SelectableExpression<jobvisor_jobs::table> for RetakeHold {}
impl<GB> ValidGrouping<GB> for RetakeHold {
    type IsAggregate = is_aggregate::Never;
}

impl<DB: Backend> QueryFragment<DB> for RetakeHold {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql(
            "CASE WHEN unique_scope = 'while_active' THEN unique_key ELSE unique_hold END",
        );
        Ok(())
    }
}

/// `errors` with one JSON value appended.
#[derive(Debug, Clone, QueryId)]
pub(crate) struct JsonAppend {
    /// The value to append (an error record).
    pub(crate) value: serde_json::Value,
}

impl Expression for JsonAppend {
    type SqlType = Json;
}
impl AppearsOnTable<jobvisor_jobs::table> for JsonAppend {}
impl SelectableExpression<jobvisor_jobs::table> for JsonAppend {}
impl<GB> ValidGrouping<GB> for JsonAppend {
    type IsAggregate = is_aggregate::Never;
}

/// `state IN ('pending', 'retrying')` with the states as SQL literals, so PostgreSQL can
/// match the partial indexes even under a generic prepared plan. The states come from
/// [`JobState::as_str`](crate::job::JobState::as_str): constants, never user input.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StateIn(pub(crate) &'static [crate::job::JobState]);

pub(crate) const RUNNING: StateIn = StateIn(&[crate::job::JobState::Running]);
pub(crate) const TERMINAL: StateIn = StateIn(&[
    crate::job::JobState::Succeeded,
    crate::job::JobState::Dead,
    crate::job::JobState::Cancelled,
]);
/// `state IN ('<st>')` for one state, as a literal.
pub(crate) const fn state_in(st: crate::job::JobState) -> StateIn {
    use crate::job::JobState as S;
    StateIn(match st {
        S::Pending => &[S::Pending],
        S::Waiting => &[S::Waiting],
        S::Running => &[S::Running],
        S::Retrying => &[S::Retrying],
        S::Succeeded => &[S::Succeeded],
        S::Dead => &[S::Dead],
        S::Cancelled => &[S::Cancelled],
    })
}
pub(crate) const RETRYABLE_BY_HAND: StateIn =
    StateIn(&[crate::job::JobState::Dead, crate::job::JobState::Cancelled]);

/// Jobs an operator can make due now ("run now"): waiting for their run time or their next
/// attempt.
#[cfg(any(feature = "web", feature = "test-util"))]
pub(crate) const DUE_LATER: StateIn = StateIn(&[
    crate::job::JobState::Pending,
    crate::job::JobState::Retrying,
]);

// The text depends on the value, not the type: key the statement cache by text.
impl QueryId for StateIn {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Expression for StateIn {
    type SqlType = Bool;
}
impl<QS> AppearsOnTable<QS> for StateIn {}
impl<QS> SelectableExpression<QS> for StateIn {}
impl<GB> ValidGrouping<GB> for StateIn {
    type IsAggregate = is_aggregate::Never;
}

impl<DB: Backend> QueryFragment<DB> for StateIn {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("state IN (");
        for (i, st) in self.0.iter().enumerate() {
            if i > 0 {
                out.push_sql(", ");
            }
            out.push_sql("'");
            out.push_sql(st.as_str());
            out.push_sql("'");
        }
        out.push_sql(")");
        Ok(())
    }
}

/// "This job is claimable in `queue`": `queue = ? AND state IN ('pending', 'retrying')`,
/// except on MySQL, where the stored generated column `claim_queue` (the queue while a job is
/// claimable) is matched so the claim index is walked in order (see the MySQL migration).
#[derive(Debug, Clone, QueryId)]
pub(crate) struct ClaimableIn(pub(crate) String);

/// How a backend spells [`ClaimableIn`]: the SQL before and after the queue's bind.
pub(crate) trait ClaimableSql: Backend {
    const CLAIMABLE: (&'static str, &'static str);
}

impl Expression for ClaimableIn {
    type SqlType = Bool;
}
impl AppearsOnTable<jobvisor_jobs::table> for ClaimableIn {}
impl SelectableExpression<jobvisor_jobs::table> for ClaimableIn {}
impl<GB> ValidGrouping<GB> for ClaimableIn {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for ClaimableIn
where
    DB: Backend + ClaimableSql + diesel::sql_types::HasSqlType<diesel::sql_types::Text>,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql(DB::CLAIMABLE.0);
        out.push_bind_param::<diesel::sql_types::Text, _>(&self.0)?;
        out.push_sql(DB::CLAIMABLE.1);
        Ok(())
    }
}

/// A row-locking select: `… FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL, so concurrent
/// sweepers and archivers on other nodes take disjoint batches; plain on SQLite, whose
/// `BEGIN IMMEDIATE` already makes the transaction the only writer.
#[derive(Debug, Clone, QueryId)]
pub(crate) struct SkipLocked<Q>(pub(crate) Q);

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for SkipLocked<Q> {
    type SqlType = Q::SqlType;
}

/// A select that locks the rows it reads until the transaction ends: `… FOR UPDATE` on
/// PostgreSQL and MySQL; plain on SQLite, whose `BEGIN IMMEDIATE` already makes the
/// transaction the only writer.
#[derive(Debug, Clone, QueryId)]
pub(crate) struct ForUpdate<Q>(pub(crate) Q);

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for ForUpdate<Q> {
    type SqlType = Q::SqlType;
}

/// Splits a statement at its `$n` placeholders (which must appear in order; their numbers
/// are not read), so a [`QueryFragment`] can push the text around each bind.
#[cfg(feature = "postgres")]
pub(crate) fn segments(sql: &'static str) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        out.push(&rest[..i]);
        let digits = rest[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
        rest = &rest[i + 1 + digits..];
    }
    out.push(rest);
    out
}

/// Defines a statement with a constant text and typed binds, loaded into a `QueryableByName`
/// row: PostgreSQL (`$n` placeholders), or MySQL / SQLite with a leading `Mysql` / `Sqlite`
/// (`?` placeholders; the text must have no other `?`).
/// Unlike `sql_query`, it has a static query id, so diesel-async keeps it as a prepared
/// statement: parsed (and planned) once per connection. With a lifetime, the binds may borrow
/// (arrays of `&str` built without copying the caller's strings).
macro_rules! prepared_statement {
    ($(#[$doc:meta])* $name:ident, $sql:ident, { $($field:ident : $rust:ty => $st:ty),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, diesel::query_builder::QueryId)]
        pub(crate) struct $name {
            $(pub(crate) $field: $rust,)+
        }
        prepared_statement!(@impl $name, Pg, $crate::store::expr::segments($sql), { $($field => $st),+ });
    };
    ($(#[$doc:meta])* $name:ident<$lt:lifetime>, $sql:ident, { $($field:ident : $rust:ty => $st:ty),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub(crate) struct $name<$lt> {
            $(pub(crate) $field: $rust,)+
        }

        impl diesel::query_builder::QueryId for $name<'_> {
            type QueryId = $name<'static>;
            const HAS_STATIC_QUERY_ID: bool = true;
        }
        prepared_statement!(@impl $name<'_>, Pg, $crate::store::expr::segments($sql), { $($field => $st),+ });
    };
    // A MySQL or SQLite statement: `?` placeholders.
    ($db:ident $(#[$doc:meta])* $name:ident, $sql:ident, { $($field:ident : $rust:ty => $st:ty),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, diesel::query_builder::QueryId)]
        pub(crate) struct $name {
            $(pub(crate) $field: $rust,)+
        }
        prepared_statement!(@impl $name, $db, $sql.split('?').collect(), { $($field => $st),+ });
    };
    (@impl $ty:ty, $db:ty, $split:expr, { $($field:ident => $st:ty),+ }) => {
        impl diesel::query_builder::Query for $ty {
            type SqlType = diesel::sql_types::Untyped;
        }

        impl diesel::query_builder::QueryFragment<$db> for $ty {
            fn walk_ast<'b>(
                &'b self,
                mut out: diesel::query_builder::AstPass<'_, 'b, $db>,
            ) -> diesel::result::QueryResult<()> {
                static SEGMENTS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
                let segs = SEGMENTS.get_or_init(|| $split);
                let mut i = 0;
                $(
                    out.push_sql(segs[i]);
                    out.push_bind_param::<$st, _>(&self.$field)?;
                    i += 1;
                )+
                out.push_sql(segs[i]);
                Ok(())
            }
        }
    };
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// The columns a claim returns, in `ClaimRow`'s order (see `rows.rs`).
macro_rules! claim_columns {
    () => {
        "id, queue, kind, priority, payload, progress, attempts, max_attempts, run_at, \
         timeout_ms, created_at, start_by - updated_at AS start_within"
    };
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use claim_columns;

/// A statement whose rows are read by position, as the SQL types `ST` in order, instead of by
/// name, on backend `DB`. By name, diesel finds each of a row's columns by comparing its name
/// with every column before it (a linear search per field) and goes through a dynamic row;
/// for the claim's rows this was once the largest per-job cost on the client.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub(crate) struct Positional<Q, ST, DB>(pub(crate) Q, std::marker::PhantomData<(ST, DB)>);

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<Q, ST, DB> Positional<Q, ST, DB> {
    /// `q`'s rows, read by position.
    pub(crate) fn new(q: Q) -> Self {
        Positional(q, std::marker::PhantomData)
    }
}

/// A claim statement returning `claim_columns!()`, its rows read by position: the columns are
/// listed in `ClaimRow`'s field order, so the row's SQL type is `ClaimRow`'s selection.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) type ClaimRows<Q, DB> = Positional<
    Q,
    <<super::rows::ClaimRow as diesel::Selectable<DB>>::SelectExpression as Expression>::SqlType,
    DB,
>;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<Q: QueryId, ST: 'static, DB: 'static> QueryId for Positional<Q, ST, DB> {
    type QueryId = Positional<Q::QueryId, ST, DB>;
    const HAS_STATIC_QUERY_ID: bool = Q::HAS_STATIC_QUERY_ID;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<Q, ST, DB: Backend> diesel::query_builder::Query for Positional<Q, ST, DB> {
    type SqlType = ST;
}

/// Runs on diesel's own (blocking) connections too: SQLite's claim reads its rows on the
/// connection's thread (`sqlite/mod.rs`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<Q, ST, DB, Conn> diesel::RunQueryDsl<Conn> for Positional<Q, ST, DB> {}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<Q: QueryFragment<DB>, ST, DB: Backend> QueryFragment<DB> for Positional<Q, ST, DB> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(out)
    }
}
pub(crate) use prepared_statement;

/// `column IN (?, …)` over a list padded by repeating its last value ([`padded_len`]; an
/// empty list is `1 = 0`): the statement's text takes one of a few shapes, so its prepared
/// form is kept in the connection's cache and reused. Diesel's `eq_any` over a list is never
/// cached, and on MySQL each use cost a round trip to prepare it before the one that runs it
/// — most of a small claim's or finalization's statements under a queue limit. Repeating a
/// value changes no result: `IN` is a set test.
#[derive(Debug, Clone)]
pub(crate) struct InList<C, T> {
    column: C,
    values: Vec<T>,
}

/// `column IN values` (see [`InList`]).
pub(crate) fn in_list<C, T>(column: C, values: Vec<T>) -> InList<C, T> {
    InList { column, values }
}

impl<C, T> InList<C, T> {
    /// Binds pushed (see [`padded_len`]).
    fn padded_len(&self) -> usize {
        padded_len(self.values.len())
    }
}

/// Most binds a list is padded to: SQLite's default limit of variables per statement, so a
/// list that fits unpadded is never padded past what fits.
const MAX_PADDED: usize = 32_766;

/// How many entries a list of `n` is padded to: the next power of two up to 1,024, then the
/// next multiple of 1,024 — a few shapes of statement text, at most 1,023 repeats — and never
/// past [`MAX_PADDED`] (a longer list is sent as it is).
pub(crate) fn padded_len(n: usize) -> usize {
    let padded = if n <= 1024 {
        n.next_power_of_two()
    } else {
        n.div_ceil(1024) * 1024
    };
    if padded > MAX_PADDED {
        n
    } else {
        padded
    }
}

// Not a static query id: the text depends on the padded length, so the statement cache
// keys it by its text.
impl<C, T> QueryId for InList<C, T> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<C: Expression, T> Expression for InList<C, T> {
    type SqlType = Bool;
}
impl<C: AppearsOnTable<jobvisor_jobs::table>, T> AppearsOnTable<jobvisor_jobs::table>
    for InList<C, T>
{
}
impl<C: SelectableExpression<jobvisor_jobs::table>, T> SelectableExpression<jobvisor_jobs::table>
    for InList<C, T>
{
}
impl<C, T, GB> ValidGrouping<GB> for InList<C, T> {
    type IsAggregate = is_aggregate::Never;
}

impl<C, T, DB> QueryFragment<DB> for InList<C, T>
where
    DB: Backend + diesel::sql_types::HasSqlType<C::SqlType>,
    C: Expression + QueryFragment<DB>,
    T: diesel::serialize::ToSql<C::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let Some(last) = self.values.last() else {
            out.push_sql("1 = 0");
            return Ok(());
        };
        self.column.walk_ast(out.reborrow())?;
        out.push_sql(" IN (");
        for i in 0..self.padded_len() {
            if i > 0 {
                out.push_sql(", ");
            }
            out.push_bind_param::<C::SqlType, _>(self.values.get(i).unwrap_or(last))?;
        }
        out.push_sql(")");
        Ok(())
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use diesel::prelude::*;
    use diesel::sqlite::Sqlite;

    use super::in_list;
    use crate::store::schema::jobvisor_jobs as jobs;

    fn sql(ids: Vec<i64>) -> String {
        let q = jobs::table.filter(in_list(jobs::id, ids)).select(jobs::id);
        diesel::debug_query::<Sqlite, _>(&q).to_string()
    }

    #[test]
    fn a_list_is_padded_to_a_power_of_two_with_its_last_value() {
        let three = sql(vec![7, 8, 9]);
        assert!(three.contains("IN (?, ?, ?, ?)"), "{three}");
        assert!(three.ends_with("binds: [7, 8, 9, 9]"), "{three}");
        // Lists of 3 and 4 share one text, so one prepared statement.
        let four = sql(vec![1, 2, 3, 4]);
        assert_eq!(three.split(" -- ").next(), four.split(" -- ").next());
        assert!(sql(vec![5]).contains("IN (?) "), "{}", sql(vec![5]));
    }

    #[test]
    fn padding_adds_few_shapes_and_stays_within_the_bind_limits() {
        use super::padded_len;
        assert_eq!(padded_len(0), 1);
        assert_eq!(padded_len(3), 4);
        assert_eq!(padded_len(1024), 1024);
        assert_eq!(padded_len(1025), 2048);
        assert_eq!(padded_len(5000), 5120);
        assert_eq!(padded_len(32_000), 32_000, "no padding past SQLite's limit");
        assert_eq!(padded_len(55_000), 55_000);
        for n in 1..40_000 {
            assert!(padded_len(n) >= n && padded_len(n) - n < 1024, "{n}");
        }
    }

    #[test]
    fn an_empty_list_matches_nothing() {
        let empty = sql(Vec::new());
        assert!(empty.contains("1 = 0"), "{empty}");
        assert!(!empty.contains(" IN "), "{empty}");
    }
}

/// The code of a job's last error (`last_error`'s `code` member, `NULL` without one): the
/// dead letters' grouping key. PostgreSQL and SQLite index it on dead jobs (migration
/// `dead_index`), and each backend's text here is the one that index was written with.
#[derive(Debug, Clone, Copy, QueryId)]
#[cfg_attr(not(feature = "web"), allow(dead_code))]
pub(crate) struct ErrorCode;

impl Expression for ErrorCode {
    type SqlType = Nullable<diesel::sql_types::Text>;
}
impl AppearsOnTable<jobvisor_jobs::table> for ErrorCode {}
impl AppearsOnTable<diesel::query_builder::FromClause<jobvisor_jobs::table>> for ErrorCode {}
impl SelectableExpression<jobvisor_jobs::table> for ErrorCode {}
impl SelectableExpression<diesel::query_builder::FromClause<jobvisor_jobs::table>> for ErrorCode {}
// Grouped beside the kind (the dead letters): diesel checks each group-by member against
// the selected columns.
impl diesel::expression::IsContainedInGroupBy<jobvisor_jobs::kind> for ErrorCode {
    type Output = diesel::expression::is_contained_in_group_by::No;
}
impl diesel::expression::IsContainedInGroupBy<jobvisor_jobs::id> for ErrorCode {
    type Output = diesel::expression::is_contained_in_group_by::No;
}
impl<GB> ValidGrouping<GB> for ErrorCode {
    type IsAggregate = is_aggregate::Never;
}
