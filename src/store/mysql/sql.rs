//! MySQL's and MariaDB's statements and SQL fragments, each beside the reason for its shape.
//!
//! No `UPDATE … RETURNING` and no arrays: batched renewals and finalizations are one
//! multi-table `UPDATE … JOIN (SELECT … UNION ALL …)` per chunk ([`RENEW_TAIL`],
//! [`FINALIZE_TAIL`]); MariaDB 10.6+ inserts batches from one JSON bind with `JSON_TABLE`.
//! The database clock is written once, in [`now_us!`].

use diesel::backend::Backend;
use diesel::expression::ValidGrouping;
use diesel::expression::{is_aggregate, AppearsOnTable, Expression, SelectableExpression};
use diesel::mysql::Mysql;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Bool, Json, Nullable, Text};

use crate::store::expr::{
    padded_len, prepared_statement, ClaimableSql, ClockSql, ErrorCode, ForUpdate, JsonAppend,
    PartitionScanSql, ScanSql, SkipLocked,
};
use crate::store::schema::jobvisor_jobs;

/// "Now" in epoch microseconds. `UTC_TIMESTAMP` is independent of the session time zone (no
/// DST ambiguity).
macro_rules! now_us {
    () => {
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    };
}

impl ClaimableSql for Mysql {
    const CLAIMABLE: (&'static str, &'static str) = ("claim_queue = ", "");
}

/// The partition scan reads the index `(queue, state, partition_key, priority, run_at)`
/// over every job (MySQL has no partial indexes), named: with a kind filter MariaDB
/// otherwise planned a read of every waiting job of the queue (`ref` on `(queue, state)`),
/// from the first, whatever the starting key. Each waiting state is read on its own, since
/// the index leads with `state` (an `IN` there would read both ranges whole to merge them);
/// the partitions at their limit are left out in the statement, which the range optimizer
/// turns into ranges around them, so a full partition's jobs are not read at all; and the
/// index holds the keyless jobs too, in claim order.
impl PartitionScanSql for Mysql {
    const SCAN: ScanSql = ScanSql {
        table: "jobvisor_jobs j FORCE INDEX (jobvisor_jobs_partition_idx)",
        states: &["= 'pending'", "= 'retrying'"],
        skip_full: true,
        keyless_indexed: true,
    };
}

impl ClockSql for Mysql {
    const NOW_US: &'static str = now_us!();
    // `UTC_TIMESTAMP` is the statement's start: after every lock taken by earlier statements.
    const CLOCK_US: &'static str = now_us!();
}

impl QueryFragment<Mysql> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        out.push_sql("JSON_ARRAY_APPEND(COALESCE(errors, JSON_ARRAY()), '$', JSON_EXTRACT(");
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql(", '$'))");
        Ok(())
    }
}

/// A statement built at run time, its text and binds in order — what `sql_query(…).bind(…)`
/// builds, but kept in the connection's statement cache: diesel never caches a
/// `sql_query`, so each use cost a round trip to prepare it. Callers build their text in few
/// shapes (a batch padded by repeating its last row, `padded_rows`) so the cached forms stay few.
#[derive(Debug, Default)]
pub(crate) struct BoundSql {
    parts: Vec<Part>,
}

/// One bind of a [`BoundSql`].
#[derive(Debug)]
pub(crate) enum Bind {
    BigInt(i64),
    Int(i32),
    Text(String),
    NullBigInt(Option<i64>),
    NullText(Option<String>),
}

#[derive(Debug)]
enum Part {
    Sql(&'static str),
    Bind(Bind),
}

impl BoundSql {
    /// Appends `text`, each `?` in it bound to the next of `binds` in order.
    ///
    /// # Panics
    /// If the number of binds is not the number of `?` in `text`: the texts are the
    /// module's constants, so that is a bug, caught by every test that runs the statement.
    pub(crate) fn push(&mut self, text: &'static str, binds: impl IntoIterator<Item = Bind>) {
        let mut binds = binds.into_iter();
        for (i, seg) in text.split('?').enumerate() {
            if i > 0 {
                let b = binds.next().expect("a bind for every `?`");
                self.parts.push(Part::Bind(b));
            }
            self.parts.push(Part::Sql(seg));
        }
        assert!(binds.next().is_none(), "no more binds than `?`");
    }
}

// Not a static query id: the statement cache keys it by its text.
impl QueryId for BoundSql {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl QueryFragment<Mysql> for BoundSql {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        for p in &self.parts {
            // `push_bind_param` writes the `?` itself.
            match p {
                Part::Sql(s) => out.push_sql(s),
                Part::Bind(Bind::BigInt(v)) => out.push_bind_param::<BigInt, _>(v)?,
                Part::Bind(Bind::Int(v)) => {
                    out.push_bind_param::<diesel::sql_types::Integer, _>(v)?
                }
                Part::Bind(Bind::Text(v)) => out.push_bind_param::<Text, _>(v)?,
                Part::Bind(Bind::NullBigInt(v)) => out.push_bind_param::<Nullable<BigInt>, _>(v)?,
                Part::Bind(Bind::NullText(v)) => out.push_bind_param::<Nullable<Text>, _>(v)?,
            }
        }
        Ok(())
    }
}

/// The rows a batch statement carries: `n` padded by repeating the last row ([`padded_len`];
/// the statements join their rows by id, and a row repeated matches the same job once); none
/// for `n = 0`.
pub(crate) fn padded_rows(n: usize) -> impl Iterator<Item = usize> {
    let len = if n == 0 { 0 } else { padded_len(n) };
    (0..len).map(move |i| i.min(n - 1))
}

/// `(id, lease_token) IN ((?, ?), …)`: a row matches only with its own token.
#[derive(Debug, Clone)]
pub(crate) struct LeasePairs {
    pub(crate) ids: Vec<i64>,
    pub(crate) tokens: Vec<String>,
}

// Not a static query id: the SQL text depends on the number of pairs, so
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

fn pairs_list<'b, DB>(p: &'b LeasePairs, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<BigInt> + diesel::sql_types::HasSqlType<Text>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    let n = p.ids.len().min(p.tokens.len());
    if n == 0 {
        out.push_sql("1 = 0");
        return Ok(());
    }
    // Padded by repeating the last pair (`padded_len`), so the statement's text takes few
    // shapes and stays cached (a set test: a repeat changes nothing).
    out.push_sql("(id, lease_token) IN (");
    for (k, i) in padded_rows(n).enumerate() {
        if k > 0 {
            out.push_sql(", ");
        }
        out.push_sql("(");
        out.push_bind_param::<BigInt, _>(&p.ids[i])?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&p.tokens[i])?;
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

impl<Q: QueryFragment<Mysql>> QueryFragment<Mysql> for ForUpdate<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" FOR UPDATE");
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

/// MariaDB: one job without a unique key, inserted and its id returned in one statement.
pub(crate) const INSERT_ONE_MARIADB: &str = concat!(
    "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, max_attempts, run_at,
                           timeout_ms, partition_key, created_at, updated_at)
SELECT ?, ?, 'pending', ?, ?, '[]', ?, COALESCE(?, n.now) + ?, ?, ?, n.now, n.now
FROM (SELECT COALESCE(?, ",
    now_us!(),
    ")
      AS now) AS n
RETURNING id"
);

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
        partition_key: Option<String> => Nullable<Text>,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// MariaDB 10.6+: inserts jobs without unique keys given as one JSON array of
/// `[queue, kind, priority, payload, max_attempts, run_at or null, delay_us, timeout_ms,
/// partition or null]`, in array order (so their ids ascend in it).
pub(crate) const INSERT_MANY_MARIADB: &str = concat!(
    "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, errors, max_attempts, run_at,
                           timeout_ms, partition_key, created_at, updated_at)
SELECT t.queue, t.kind, 'pending', t.priority, t.payload, '[]', t.max_attempts,
       COALESCE(t.run_base, n.now) + t.run_plus, t.timeout_ms, t.partition_key, n.now, n.now
FROM (SELECT COALESCE(?, ",
    now_us!(),
    ")
      AS now) AS n,
     JSON_TABLE(?, '$[*]' COLUMNS (
         ord FOR ORDINALITY,
         queue LONGTEXT PATH '$[0]', kind LONGTEXT PATH '$[1]', priority INT PATH '$[2]',
         payload LONGTEXT PATH '$[3]', max_attempts INT PATH '$[4]',
         run_base BIGINT PATH '$[5]', run_plus BIGINT PATH '$[6]', timeout_ms BIGINT PATH '$[7]',
         partition_key VARCHAR(255) PATH '$[8]'
     )) AS t
ORDER BY t.ord
RETURNING id"
);

prepared_statement!(Mysql
    /// Inserts a batch of jobs without unique keys (see [`INSERT_MANY_MARIADB`]).
    MariaInsertMany, INSERT_MANY_MARIADB, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

/// The job holding a (kind, key), whether its period has ended (1), its version and whether it
/// is open (`keyed::Holder`), read with a shared
/// lock (see [`enqueue_one`](super::enqueue_one)).
pub(crate) const HOLDER: &str = concat!(
    "SELECT id, CAST(unique_until <= COALESCE(CAST(? AS SIGNED), ",
    now_us!(),
    ") AS SIGNED) AS expired, version, \
     CAST(state = 'pending' AND first_started_at IS NULL AND NOT has_children AS SIGNED) AS open \
     FROM jobvisor_jobs WHERE kind = ? AND unique_hold = ? LOCK IN SHARE MODE"
);

/// The head of the renewal's and the finalization's `UPDATE (SELECT … UNION ALL …) AS v
/// STRAIGHT_JOIN jobvisor_jobs AS j …`; `by_id_join!` continues it after the batch.
pub(crate) const UPDATE_BY_ID_HEAD: &str = "UPDATE (";

/// Joins the batch `v` to the jobs it names: the batch is read first and each job reached
/// through the primary key (`eq_ref`), so the statement locks only its own rows. Left to
/// choose, the optimizer read the jobs first — through the sweep index (`state = 'running'`
/// is its prefix), or, with the index forced, by a scan of the whole primary key on a small
/// table — locking the rows of every running job on its way, other nodes' too: two nodes'
/// finalizations, each holding its own rows, deadlocked on each other's (one was rolled
/// back and its slots stayed held until the write was tried again).
macro_rules! by_id_join {
    () => {
        concat!(
            ") AS v STRAIGHT_JOIN jobvisor_jobs AS j FORCE INDEX (PRIMARY) \
    ON j.id = v.id AND j.lease_token = v.token AND j.state = 'running' \
JOIN (SELECT COALESCE(CAST(? AS SIGNED), ",
            now_us!(),
            ") AS now) AS n "
        )
    };
}

/// The tail of the renew statement after its `UNION ALL` batch (see
/// [`renew`](super::renew)).
pub(crate) const RENEW_TAIL: &str = concat!(
    by_id_join!(),
    "SET j.timeout_at = CASE WHEN j.started_at IS NULL AND v.ago IS NOT NULL \
                        THEN n.now - v.ago + j.timeout_ms * 1000 + ? ELSE j.timeout_at END, \
    j.first_started_at = CASE WHEN j.first_started_at IS NULL AND v.ago IS NOT NULL \
                              THEN n.now - v.ago ELSE j.first_started_at END, \
    j.started_at = CASE WHEN j.started_at IS NULL AND v.ago IS NOT NULL \
                        THEN n.now - v.ago ELSE j.started_at END, \
    j.lease_expires_at = n.now + ?, \
    j.heartbeat_at = n.now, \
    j.progress = COALESCE(v.progress, j.progress)"
);

/// The tail of the finalize statement after its `UNION ALL` batch (see
/// [`finalize`](super::finalize)). A job whose key is held `while_active` releases it in the
/// same statement that ends it; a start no renewal recorded (`ago`: a job shorter than a
/// heartbeat) is recorded. The claim it ends is kept on the row (`last_*`): its node and
/// instant as the finalize's locking read returned them (`v`: MariaDB does not promise to
/// read a column of a multi-table `UPDATE` before assigning it), its id from the token.
pub(crate) const FINALIZE_TAIL: &str = concat!(
    by_id_join!(),
    "SET j.state = v.state, \
    j.result = JSON_EXTRACT(v.result, '$'), \
    j.last_error = CASE WHEN v.state = 'succeeded' THEN NULL \
                        WHEN v.error IS NULL THEN j.last_error \
                        ELSE JSON_EXTRACT(v.error, '$') END, \
    j.errors = CASE WHEN v.error IS NULL THEN j.errors \
                    ELSE JSON_ARRAY_APPEND(COALESCE(j.errors, JSON_ARRAY()), '$', \
                                           JSON_EXTRACT(v.error, '$')) END, \
    j.attempts = j.attempts - v.refund, \
    j.run_at = CASE WHEN v.delay_us IS NULL THEN j.run_at ELSE n.now + v.delay_us END, \
    j.finished_at = CASE WHEN v.finished = 1 THEN n.now ELSE NULL END, \
    j.started_at = COALESCE(j.started_at, n.now - v.ago), \
    j.first_started_at = COALESCE(j.first_started_at, n.now - v.ago), \
    j.last_node = v.node, \
    j.last_claim = CASE WHEN LENGTH(v.token) = 48 THEN LEFT(v.token, 16) END, \
    j.last_claimed_at = v.claimed_at, \
    j.lease_owner = NULL, j.lease_token = NULL, j.lease_expires_at = NULL, \
    j.heartbeat_at = NULL, j.timeout_at = NULL, j.version = j.version + 1, \
    j.unique_hold = CASE WHEN v.finished = 1 AND j.unique_scope = 'while_active' THEN NULL \
                         ELSE j.unique_hold END, \
    j.updated_at = n.now"
);

impl QueryFragment<Mysql> for ErrorCode {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
        out.push_sql("JSON_UNQUOTE(JSON_EXTRACT(last_error, '$.code'))");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn statements_have_their_placeholders() {
        assert_eq!(super::INSERT_ONE_MARIADB.split('?').count(), 11);
        assert_eq!(super::INSERT_MANY_MARIADB.split('?').count(), 3);
    }
}
