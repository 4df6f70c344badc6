//! The few SQL expressions diesel's builder does not have, each rendered once per backend.
//!
//! * [`DbNow`]: "now" as epoch microseconds — the bound test-clock instant if there is one,
//!   else the database's clock — plus an offset. Every stored time and every comparison goes
//!   through it, so production nodes never compare their own clocks.
//! * [`PlusColumnMs`]: `now + <millisecond column> * 1000` (a claim's timeout deadline).
//! * [`JsonAppend`]: append one JSON value to a JSON array column (the `errors` history).
//! * [`LeasePairs`]: `(id, lease_token) IN (…)` — the guard of batched renew / finalize.
//!
//! All render static SQL for a given backend and type, so prepared statements stay cached.

use diesel::backend::Backend;
use diesel::expression::ValidGrouping;
use diesel::expression::{is_aggregate, AppearsOnTable, Expression, SelectableExpression};
use diesel::mysql::Mysql;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Bool, Json, Nullable, Text};
use diesel::sqlite::Sqlite;

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
trait ClockSql: Backend {
    const NOW_US: &'static str;
}

impl ClockSql for Pg {
    // now() is the transaction's start: stable within a statement, so indexes stay usable.
    const NOW_US: &'static str = "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint";
}

impl ClockSql for Mysql {
    // UTC_TIMESTAMP is independent of the session time zone (no DST ambiguity).
    const NOW_US: &'static str =
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
}

impl ClockSql for Sqlite {
    const NOW_US: &'static str = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";
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

/// `now + timeout_ms * 1000`: the deadline of an attempt that starts now.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct PlusColumnMs {
    pub(crate) now: DbNow,
}

impl Expression for PlusColumnMs {
    type SqlType = Nullable<BigInt>;
}
impl AppearsOnTable<jobvisor_jobs::table> for PlusColumnMs {}
impl SelectableExpression<jobvisor_jobs::table> for PlusColumnMs {}
impl<GB> ValidGrouping<GB> for PlusColumnMs {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for PlusColumnMs
where
    DB: Backend,
    DbNow: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
        self.now.walk_ast(out.reborrow())?;
        out.push_sql(" + timeout_ms * 1000)");
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

impl QueryFragment<Pg> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("(COALESCE(errors::jsonb, '[]'::jsonb) || jsonb_build_array(");
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql("::jsonb))::json");
        Ok(())
    }
}

impl QueryFragment<Mysql> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        out.push_sql("JSON_ARRAY_APPEND(COALESCE(errors, JSON_ARRAY()), '$', JSON_EXTRACT(");
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql(", '$'))");
        Ok(())
    }
}

impl QueryFragment<Sqlite> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql("json_insert(COALESCE(errors, '[]'), '$[#]', json(");
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql("))");
        Ok(())
    }
}

/// `(id, lease_token) IN ((?, ?), …)`: a row matches only with its own token.
#[derive(Debug, Clone)]
pub(crate) struct LeasePairs {
    pub(crate) ids: Vec<i64>,
    pub(crate) tokens: Vec<String>,
}

// Not a static query id: on MySQL and SQLite the SQL text depends on the number of pairs, so
// the statement cache must key it by its text, never by its type.
impl QueryId for LeasePairs {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Expression for LeasePairs {
    type SqlType = Bool;
}
impl AppearsOnTable<jobvisor_jobs::table> for LeasePairs {}
impl SelectableExpression<jobvisor_jobs::table> for LeasePairs {}
impl<GB> ValidGrouping<GB> for LeasePairs {
    type IsAggregate = is_aggregate::Never;
}

impl QueryFragment<Pg> for LeasePairs {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // Two array binds: the SQL text does not depend on the batch size.
        out.push_sql("(id, lease_token) IN (SELECT * FROM unnest(");
        out.push_bind_param::<diesel::sql_types::Array<BigInt>, _>(&self.ids)?;
        out.push_sql(", ");
        out.push_bind_param::<diesel::sql_types::Array<Text>, _>(&self.tokens)?;
        out.push_sql("))");
        Ok(())
    }
}

fn pairs_list<'b, DB>(p: &'b LeasePairs, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<BigInt> + diesel::sql_types::HasSqlType<Text>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    if p.ids.is_empty() {
        out.push_sql("1 = 0");
        return Ok(());
    }
    out.push_sql("(id, lease_token) IN (");
    for (i, (id, token)) in p.ids.iter().zip(&p.tokens).enumerate() {
        if i > 0 {
            out.push_sql(", ");
        }
        out.push_sql("(");
        out.push_bind_param::<BigInt, _>(id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(token)?;
        out.push_sql(")");
    }
    out.push_sql(")");
    Ok(())
}

impl QueryFragment<Mysql> for LeasePairs {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        pairs_list(self, out)
    }
}

impl QueryFragment<Sqlite> for LeasePairs {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        pairs_list(self, out)
    }
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
pub(crate) const RETRYABLE_BY_HAND: StateIn =
    StateIn(&[crate::job::JobState::Dead, crate::job::JobState::Cancelled]);

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

/// `COALESCE(first_started_at, now)`: set once, at the first claim.
#[derive(Debug, Clone, Copy, QueryId)]
pub(crate) struct FirstStartedAt(pub(crate) DbNow);

impl Expression for FirstStartedAt {
    type SqlType = Nullable<BigInt>;
}
impl AppearsOnTable<jobvisor_jobs::table> for FirstStartedAt {}
impl SelectableExpression<jobvisor_jobs::table> for FirstStartedAt {}
impl<GB> ValidGrouping<GB> for FirstStartedAt {
    type IsAggregate = is_aggregate::Never;
}

impl<DB> QueryFragment<DB> for FirstStartedAt
where
    DB: Backend,
    DbNow: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("COALESCE(first_started_at, ");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(")");
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

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" FOR UPDATE SKIP LOCKED");
        Ok(())
    }
}

impl<Q: QueryFragment<Mysql>> QueryFragment<Mysql> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" FOR UPDATE SKIP LOCKED");
        Ok(())
    }
}

impl<Q: QueryFragment<Sqlite>> QueryFragment<Sqlite> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.0.walk_ast(out)
    }
}

/// MySQL only: `claim_queue = ?`, the stored generated column that is the queue while a job
/// is claimable (see the MySQL migration). Matching it scans the claim index in order, so
/// `FOR UPDATE SKIP LOCKED … LIMIT n` locks only the rows it returns.
#[derive(Debug, Clone, QueryId)]
pub(crate) struct ClaimQueueIs(pub(crate) String);

impl Expression for ClaimQueueIs {
    type SqlType = Bool;
}
impl AppearsOnTable<jobvisor_jobs::table> for ClaimQueueIs {}
impl SelectableExpression<jobvisor_jobs::table> for ClaimQueueIs {}
impl<GB> ValidGrouping<GB> for ClaimQueueIs {
    type IsAggregate = is_aggregate::Never;
}

impl QueryFragment<Mysql> for ClaimQueueIs {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        out.push_sql("claim_queue = ");
        out.push_bind_param::<Text, _>(&self.0)?;
        Ok(())
    }
}

/// Splits a statement at its `$n` placeholders (which must appear in order), so a
/// [`QueryFragment`] can push the text around each bind.
fn segments(sql: &'static str) -> Vec<&'static str> {
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
        #[derive(Debug, Clone, QueryId)]
        pub(crate) struct $name {
            $(pub(crate) $field: $rust,)+
        }
        prepared_statement!(@impl $name, Pg, segments($sql), { $($field => $st),+ });
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
        prepared_statement!(@impl $name<'_>, Pg, segments($sql), { $($field => $st),+ });
    };
    // A MySQL or SQLite statement: `?` placeholders.
    ($db:ident $(#[$doc:meta])* $name:ident, $sql:ident, { $($field:ident : $rust:ty => $st:ty),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, QueryId)]
        pub(crate) struct $name {
            $(pub(crate) $field: $rust,)+
        }
        prepared_statement!(@impl $name, $db, $sql.split('?').collect(), { $($field => $st),+ });
    };
    (@impl $ty:ty, $db:ty, $split:expr, { $($field:ident => $st:ty),+ }) => {
        impl diesel::query_builder::Query for $ty {
            type SqlType = diesel::sql_types::Untyped;
        }

        impl QueryFragment<$db> for $ty {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, $db>) -> QueryResult<()> {
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

/// Finalizes a batch. Its shape keeps the plan linear whatever the statistics say: the rows
/// are found through the primary key (`id = ANY(ARRAY(…))`), and the `running` guard is a
/// join condition against the materialized batch rather than a filter on the table. With
/// `state = 'running'` as a filter, statistics taken when few jobs ran made the planner scan
/// the table for "the one running row" and loop over the batch for each row found: 80 ms
/// instead of 4 ms for 500 jobs (measured, 20,000-row table).
pub(crate) const FINALIZE_PG: &str = "\
WITH v AS MATERIALIZED (
    SELECT *, 'running'::text AS expect
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::int[])
        AS v(id, token, state, result, error, delay_us, refund)
), n AS (
    SELECT COALESCE($8::bigint, (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS now
), upd AS (
    UPDATE jobvisor_jobs AS j SET
        state = CASE WHEN v.state = 'retrying' AND j.attempts >= j.max_attempts THEN 'dead' ELSE v.state END,
        result = v.result::json,
        last_error = CASE WHEN v.state = 'succeeded' THEN NULL
                          WHEN v.error IS NULL THEN j.last_error
                          ELSE v.error::json END,
        errors = CASE WHEN v.error IS NULL THEN j.errors
                      ELSE (COALESCE(j.errors::jsonb, '[]'::jsonb) || jsonb_build_array(v.error::jsonb))::json END,
        attempts = j.attempts - v.refund,
        run_at = CASE WHEN v.delay_us IS NULL THEN j.run_at ELSE n.now + v.delay_us END,
        finished_at = CASE WHEN v.state IN ('succeeded', 'dead', 'cancelled')
                             OR (v.state = 'retrying' AND j.attempts >= j.max_attempts) THEN n.now
                           ELSE NULL END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        timeout_at = NULL,
        version = j.version + 1,
        updated_at = n.now
    FROM v, n
    WHERE j.id = ANY(ARRAY(SELECT v.id FROM v)) AND j.id = v.id AND j.lease_token = v.token
      AND j.state = v.expect
    RETURNING j.id, j.state
)
SELECT id, state FROM upd";

prepared_statement!(
    /// Finalizes a batch in one statement, each row guarded by its own token.
    PgFinalize<'a>, FINALIZE_PG, {
        ids: Vec<i64> => diesel::sql_types::Array<BigInt>,
        tokens: Vec<&'a str> => diesel::sql_types::Array<Text>,
        states: Vec<&'static str> => diesel::sql_types::Array<Text>,
        results: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        errors: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        delays: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        refunds: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// Every column of a live row but the token, in `JobRow`'s order.
macro_rules! job_columns {
    () => {
        "id, queue, kind, unique_key, state, priority, payload, result, last_error, errors, \
         attempts, max_attempts, run_at, timeout_ms, timeout_at, lease_owner, lease_expires_at, \
         heartbeat_at, version, cancel_requested_at, created_at, updated_at, first_started_at, \
         finished_at"
    };
}

/// SQLite's claim: the same shape without row locks (the caller holds `BEGIN IMMEDIATE`), the
/// candidates read through the claim index by name — with `ANALYZE` statistics of a long
/// queue SQLite otherwise chose a plan 3–4× slower. The `+` on `run_at` keeps that term out
/// of the index lookup, so the index is walked in claim order and stops at `LIMIT`: with
/// `sqlite_stat4` samples SQLite otherwise skip-scanned every due job by `run_at` and sorted
/// them all (110 ms instead of 4 ms per claim with 1,000,000 jobs waiting).
pub(crate) const CLAIM_SQLITE: &str = concat!(
    "WITH n(now) AS (SELECT COALESCE(?, CAST(unixepoch('subsec') * 1000000 AS INTEGER))) \
UPDATE jobvisor_jobs SET
    state = 'running',
    lease_owner = ?,
    lease_token = ?,
    lease_expires_at = n.now + ?,
    heartbeat_at = n.now,
    attempts = attempts + 1,
    version = version + 1,
    updated_at = n.now,
    first_started_at = COALESCE(first_started_at, n.now),
    timeout_at = n.now + ? + timeout_ms * 1000
FROM n
WHERE jobvisor_jobs.id IN (
    SELECT c.id FROM jobvisor_jobs AS c INDEXED BY jobvisor_jobs_claim_idx
    WHERE c.queue = ? AND c.state IN ('pending', 'retrying')
      AND +c.run_at <= (SELECT now FROM n)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT ?
)
RETURNING ",
    job_columns!()
);

prepared_statement!(Sqlite
    /// Claims up to `limit` due jobs of `queue` with one token (see [`CLAIM_SQLITE`]).
    SqliteClaim, CLAIM_SQLITE, {
        now: Option<i64> => Nullable<BigInt>,
        owner: String => Text,
        token: String => Text,
        lease_us: i64 => BigInt,
        lease_us_again: i64 => BigInt,
        queue: String => Text,
        limit: i64 => BigInt,
    }
);

/// Claims due jobs of a queue. The candidates are locked by a subquery collected into an
/// array (`= ANY(ARRAY(…))`), so the update finds its rows through the primary key whatever the
/// planner believes: with `id IN (subquery)` a generic plan (statistics taken when the table
/// was full, a `LIMIT` parameter it cannot see) hash-joined a sequential scan of the whole
/// table.
pub(crate) const CLAIM_PG: &str = concat!(
    "\
WITH n AS (
    SELECT COALESCE($1::bigint, (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS now,
           $2::bigint AS lease_us
)
UPDATE jobvisor_jobs AS j SET
    state = 'running',
    lease_owner = $3,
    lease_token = $4,
    lease_expires_at = n.now + n.lease_us,
    heartbeat_at = n.now,
    attempts = j.attempts + 1,
    version = j.version + 1,
    updated_at = n.now,
    first_started_at = COALESCE(j.first_started_at, n.now),
    timeout_at = n.now + n.lease_us + j.timeout_ms * 1000
FROM n
WHERE j.id = ANY(ARRAY(
    SELECT c.id FROM jobvisor_jobs AS c
    WHERE c.queue = $5 AND c.state IN ('pending', 'retrying')
      AND c.run_at <= (SELECT now FROM n)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT $6
    FOR UPDATE SKIP LOCKED
))
RETURNING ",
    job_columns!()
);

prepared_statement!(
    /// Claims up to `limit` due jobs of `queue` with one token.
    PgClaim, CLAIM_PG, {
        now: Option<i64> => Nullable<BigInt>,
        lease_us: i64 => BigInt,
        owner: String => Text,
        token: String => Text,
        queue: String => Text,
        limit: i64 => BigInt,
    }
);

pub(crate) const ENQUEUE_BATCH_PG: &str = "\
INSERT INTO jobvisor_jobs (queue, kind, unique_key, state, priority, payload, errors, attempts,
                           max_attempts, run_at, timeout_ms, version, created_at, updated_at)
SELECT v.queue, v.kind, v.unique_key, 'pending', v.priority, v.payload::json, '[]', 0,
       v.max_attempts, COALESCE(v.run_at, n.now + v.delay_us), v.timeout_ms, 1, n.now, n.now
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::int[], $7::bigint[],
            $8::bigint[], $9::bigint[])
         WITH ORDINALITY AS v(queue, kind, unique_key, priority, payload, max_attempts,
                              timeout_ms, run_at, delay_us, ord),
     (SELECT COALESCE($10::bigint, (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS now) AS n
ORDER BY v.ord
ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
RETURNING id, kind, unique_key";

prepared_statement!(
    /// Inserts a batch from arrays, in input order, skipping live duplicates.
    PgEnqueueBatch<'a>, ENQUEUE_BATCH_PG, {
        queue: Vec<&'a str> => diesel::sql_types::Array<Text>,
        kind: Vec<&'a str> => diesel::sql_types::Array<Text>,
        unique_key: Vec<Option<&'a str>> => diesel::sql_types::Array<Nullable<Text>>,
        priority: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        payload: Vec<&'a str> => diesel::sql_types::Array<Text>,
        max_attempts: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        timeout_ms: Vec<i64> => diesel::sql_types::Array<BigInt>,
        run_at: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        delay_us: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// MariaDB: one job without a unique key, inserted and its id returned in one statement.
pub(crate) const INSERT_ONE_MARIADB: &str = "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, attempts, max_attempts,
                           run_at, timeout_ms, version, created_at, updated_at)
SELECT ?, ?, 'pending', ?, ?, '[]', 0, ?, COALESCE(?, n.now) + ?, ?, 1, n.now, n.now
FROM (SELECT COALESCE(?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
      AS now) AS n
RETURNING id";

prepared_statement!(Mysql
    /// Inserts one job (MariaDB 10.6+); a cached prepared statement.
    MariaInsertOne, INSERT_ONE_MARIADB, {
        queue: String => Text,
        kind: String => Text,
        priority: i32 => diesel::sql_types::Integer,
        payload: String => Text,
        max_attempts: i32 => diesel::sql_types::Integer,
        run_base: Option<i64> => Nullable<BigInt>,
        run_plus: i64 => BigInt,
        timeout_ms: i64 => BigInt,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// SQLite: finalizes a batch given as one JSON array of
/// `[id, token, state, result, error, delay_us, refund]`, each row guarded by its token.
pub(crate) const FINALIZE_SQLITE: &str = "\
WITH n(now) AS (SELECT COALESCE(?, CAST(unixepoch('subsec') * 1000000 AS INTEGER))), \
v(id, token, state, result, error, delay_us, refund) AS ( \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, \
           value ->> 6 \
    FROM jsonb_each(?)) \
UPDATE jobvisor_jobs SET \
    state = CASE WHEN v.state = 'retrying' AND jobvisor_jobs.attempts >= jobvisor_jobs.max_attempts \
                 THEN 'dead' ELSE v.state END, \
    result = v.result, \
    last_error = CASE WHEN v.state = 'succeeded' THEN NULL \
                      WHEN v.error IS NULL THEN jobvisor_jobs.last_error ELSE v.error END, \
    errors = CASE WHEN v.error IS NULL THEN jobvisor_jobs.errors \
                  ELSE json_insert(COALESCE(jobvisor_jobs.errors, '[]'), '$[#]', json(v.error)) END, \
    attempts = jobvisor_jobs.attempts - v.refund, \
    run_at = CASE WHEN v.delay_us IS NULL THEN jobvisor_jobs.run_at ELSE n.now + v.delay_us END, \
    finished_at = CASE WHEN v.state IN ('succeeded', 'dead', 'cancelled') \
                         OR (v.state = 'retrying' AND jobvisor_jobs.attempts >= jobvisor_jobs.max_attempts) \
                       THEN n.now ELSE NULL END, \
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
    timeout_at = NULL, version = jobvisor_jobs.version + 1, updated_at = n.now \
FROM v, n \
WHERE jobvisor_jobs.id = v.id AND jobvisor_jobs.lease_token = v.token \
  AND jobvisor_jobs.state = 'running' \
RETURNING jobvisor_jobs.id AS id, jobvisor_jobs.state AS state";

prepared_statement!(Sqlite
    /// Finalizes a batch (see [`FINALIZE_SQLITE`]).
    SqliteFinalize, FINALIZE_SQLITE, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

/// SQLite: inserts jobs without unique keys given as one JSON array of
/// `[queue, kind, priority, payload, max_attempts, run_at or null, delay_us, timeout_ms]`,
/// in array order (so their ids ascend in it).
pub(crate) const INSERT_MANY_SQLITE: &str = "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, attempts, max_attempts,
                           run_at, timeout_ms, version, created_at, updated_at)
SELECT value ->> 0, value ->> 1, 'pending', value ->> 2, value ->> 3, '[]', 0, value ->> 4,
       COALESCE(value ->> 5, n.now) + (value ->> 6), value ->> 7, 1, n.now, n.now
FROM (SELECT COALESCE(?, CAST(unixepoch('subsec') * 1000000 AS INTEGER)) AS now) AS n,
     jsonb_each(?)
ORDER BY jsonb_each.key
RETURNING id";

prepared_statement!(Sqlite
    /// Inserts a batch of jobs without unique keys (see [`INSERT_MANY_SQLITE`]).
    SqliteInsertMany, INSERT_MANY_SQLITE, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

/// MariaDB 10.6+: inserts jobs without unique keys given as one JSON array of
/// `[queue, kind, priority, payload, max_attempts, run_at or null, delay_us, timeout_ms]`, in
/// array order (so their ids ascend in it).
pub(crate) const INSERT_MANY_MARIADB: &str = "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, attempts, max_attempts,
                           run_at, timeout_ms, version, created_at, updated_at)
SELECT t.queue, t.kind, 'pending', t.priority, t.payload, '[]', 0, t.max_attempts,
       COALESCE(t.run_base, n.now) + t.run_plus, t.timeout_ms, 1, n.now, n.now
FROM (SELECT COALESCE(?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
      AS now) AS n,
     JSON_TABLE(?, '$[*]' COLUMNS (
         ord FOR ORDINALITY,
         queue LONGTEXT PATH '$[0]', kind LONGTEXT PATH '$[1]', priority INT PATH '$[2]',
         payload LONGTEXT PATH '$[3]', max_attempts INT PATH '$[4]',
         run_base BIGINT PATH '$[5]', run_plus BIGINT PATH '$[6]', timeout_ms BIGINT PATH '$[7]'
     )) AS t
ORDER BY t.ord
RETURNING id";

prepared_statement!(Mysql
    /// Inserts a batch of jobs without unique keys (see [`INSERT_MANY_MARIADB`]).
    MariaInsertMany, INSERT_MANY_MARIADB, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

#[cfg(test)]
mod tests {
    use super::segments;

    #[test]
    fn statements_split_at_their_placeholders_in_order() {
        assert_eq!(segments("a $1 b $2::int c"), vec!["a ", " b ", "::int c"]);
        assert_eq!(segments(super::FINALIZE_PG).len(), 9);
        assert_eq!(segments(super::CLAIM_PG).len(), 7);
        assert_eq!(segments(super::ENQUEUE_BATCH_PG).len(), 11);
        assert_eq!(super::INSERT_ONE_MARIADB.split('?').count(), 10);
    }
}
