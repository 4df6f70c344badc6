//! SQLite's statements and SQL fragments, each beside the reason for its shape.
//!
//! No row locks (the caller holds the writer lock and `BEGIN IMMEDIATE`); batches travel as
//! one JSON bind unpacked by `jsonb_each`, because a `VALUES` list compiles in time quadratic
//! in its binds — except a finalization's successes, whose list is padded to two widths so
//! that a connection compiles each once ([`FinalizeSucceeded`]). The database clock is
//! written once, in [`now_us!`].

use diesel::query_builder::{AstPass, QueryFragment};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Json, Nullable, Text};
use diesel::sqlite::Sqlite;

use crate::store::expr::{claim_columns, prepared_statement};
use crate::store::expr::{
    ClaimableSql, ClockSql, ErrorCode, ForUpdate, JsonAppend, PartitionScanSql, ScanSql, SkipLocked,
};

/// "Now" in epoch microseconds.
macro_rules! now_us {
    () => {
        "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
    };
}

impl ClaimableSql for Sqlite {
    const CLAIMABLE: (&'static str, &'static str) =
        ("(queue = ", " AND state IN ('pending', 'retrying'))");
}

/// The partition scan reads the partial index of the waiting jobs that have a key, `(queue,
/// partition_key, priority, run_at, id, kind)` (with `kind`, a claim of some kinds reads the
/// index alone), as on PostgreSQL.
impl PartitionScanSql for Sqlite {
    const SCAN: ScanSql = ScanSql {
        table: "jobvisor_jobs j",
        states: &["IN ('pending', 'retrying')"],
        skip_full: false,
        keyless_indexed: false,
    };
}

impl ClockSql for Sqlite {
    const NOW_US: &'static str = now_us!();
    // The write lock is taken by `BEGIN IMMEDIATE`, before any statement.
    const CLOCK_US: &'static str = now_us!();
}

impl QueryFragment<Sqlite> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        // A history an outside writer left unreadable is kept as it is, not appended to: the
        // append would fail the statement (PostgreSQL's and MariaDB's JSON columns refuse such
        // text; SQLite's does not).
        out.push_sql(
            "CASE WHEN json_valid(COALESCE(errors, '[]')) \
             THEN json_insert(COALESCE(errors, '[]'), '$[#]', json(",
        );
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql(")) ELSE errors END");
        Ok(())
    }
}

impl<Q: QueryFragment<Sqlite>> QueryFragment<Sqlite> for ForUpdate<Q> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.0.walk_ast(out)
    }
}

impl<Q: QueryFragment<Sqlite>> QueryFragment<Sqlite> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.0.walk_ast(out)
    }
}

/// SQLite's claim: the same shape (kinds as a JSON array, unpacked by `json_each`) without row locks (the caller holds `BEGIN IMMEDIATE`), the
/// candidates read through the claim index by name — with `ANALYZE` statistics of a long
/// queue SQLite otherwise chose a plan 3–4× slower. The `+` on `run_at` keeps that term out
/// of the index lookup, so the index is walked in claim order and stops at `LIMIT`: with
/// `sqlite_stat4` samples SQLite otherwise skip-scanned every due job by `run_at` and sorted
/// them all (110 ms instead of 4 ms per claim with 1,000,000 jobs waiting).
///
/// The queue and the limit are bound as `+?`, not `?`: SQLite marks a prepared statement
/// expired, and compiles it again at its next step, whenever a new value is bound to a
/// parameter that `LIMIT` reads as a constant or that is compared to an indexed column
/// with `sqlite_stat4` samples (after an `ANALYZE`). A plain `LIMIT ?` recompiled this
/// statement at every claim (`sqlite3Reprepare`: about half a million instructions each
/// time). The unary `+` changes no value and hides the parameter from the planner; the
/// claim index is still searched by queue (`INDEXED BY`).
pub(crate) const CLAIM: &str = concat!(
    "WITH n(now) AS (SELECT COALESCE(?, ",
    now_us!(),
    ")) \
UPDATE jobvisor_jobs SET
    state = 'running',
    lease_owner = ?,
    lease_token = ?,
    lease_expires_at = n.now + ?,
    heartbeat_at = n.now,
    attempts = attempts + 1,
    version = version + 1,
    updated_at = n.now,
    started_at = NULL,
    timeout_at = NULL
FROM n
WHERE jobvisor_jobs.id IN (
    SELECT c.id FROM jobvisor_jobs AS c INDEXED BY jobvisor_jobs_claim_idx
    WHERE c.queue = +? AND c.state IN ('pending', 'retrying')
      AND (? OR c.kind IN (SELECT value FROM json_each(?)))
      AND +c.run_at <= (SELECT now FROM n)
      AND NOT EXISTS (SELECT 1 FROM jobvisor_queues AS q WHERE q.name = c.queue)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT +?
)
RETURNING ",
    claim_columns!()
);

/// A SQLite statement returning `claim_columns!()`, its rows read by position.
pub(crate) type ClaimRows<Q> = crate::store::expr::ClaimRows<Q, Sqlite>;

prepared_statement!(Sqlite
    /// Claims up to `limit` due jobs of `queue` with one token (see [`CLAIM`]).
    SqliteClaim, CLAIM, {
        now: Option<i64> => Nullable<BigInt>,
        owner: String => Text,
        token: String => Text,
        lease_us: i64 => BigInt,
        queue: String => Text,
        any_kind: bool => diesel::sql_types::Bool,
        kinds: String => Text,
        limit: i64 => BigInt,
    }
);

/// SQLite: PostgreSQL's `RENEW` with the batch as one JSON array of `[id, token, ago or null]`.
pub(crate) const RENEW: &str = concat!(
    "\
WITH n(now) AS (SELECT COALESCE(?, ",
    now_us!(),
    ")), \
v(id, token, ago, progress) AS ( \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM jsonb_each(?)) \
UPDATE jobvisor_jobs SET \
    lease_expires_at = n.now + ?, \
    heartbeat_at = n.now, \
    started_at = CASE WHEN jobvisor_jobs.started_at IS NULL AND v.ago IS NOT NULL \
                      THEN n.now - v.ago ELSE jobvisor_jobs.started_at END, \
    first_started_at = CASE WHEN jobvisor_jobs.first_started_at IS NULL AND v.ago IS NOT NULL \
                            THEN n.now - v.ago ELSE jobvisor_jobs.first_started_at END, \
    timeout_at = CASE WHEN jobvisor_jobs.started_at IS NULL AND v.ago IS NOT NULL \
                      THEN n.now - v.ago + jobvisor_jobs.timeout_ms * 1000 + ? \
                      ELSE jobvisor_jobs.timeout_at END, \
    progress = COALESCE(v.progress, jobvisor_jobs.progress) \
FROM v, n \
WHERE jobvisor_jobs.id = v.id AND jobvisor_jobs.lease_token = v.token \
  AND jobvisor_jobs.state = 'running' \
RETURNING jobvisor_jobs.id AS id, jobvisor_jobs.lease_token AS lease_token, \
          jobvisor_jobs.lease_expires_at AS lease_expires_at, \
          jobvisor_jobs.cancel_requested_at AS cancel_requested_at"
);

prepared_statement!(Sqlite
    /// Renews leases and records starts (see [`RENEW`]).
    SqliteRenew, RENEW, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
        lease_us: i64 => BigInt,
        grace_us: i64 => BigInt,
    }
);

/// SQLite: finalizes a batch given as one JSON array of
/// `[id, token, state, result, error, delay_us, refund, ago]`, each row guarded by its token; a
/// job whose key is held `while_active` releases it in the same statement that ends it, and a
/// start no renewal recorded (`ago`: a job shorter than a heartbeat) is recorded. The batch is
/// `MATERIALIZED`: flattened into the update, each of the many uses of `v.state` read the JSON
/// again (7 % of the statement's time, measured).
pub(crate) const FINALIZE: &str = concat!(
    "\
WITH n(now) AS (SELECT COALESCE(?, ", now_us!(), ")), \
v(id, token, state, result, error, delay_us, refund, ago) AS MATERIALIZED ( \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, \
           value ->> 6, value ->> 7 \
    FROM jsonb_each(?)) \
UPDATE jobvisor_jobs SET \
    state = CASE WHEN v.state = 'retrying' AND jobvisor_jobs.attempts >= jobvisor_jobs.max_attempts \
                 THEN 'dead' ELSE v.state END, \
    result = v.result, \
    last_error = CASE WHEN v.state = 'succeeded' THEN NULL \
                      WHEN v.error IS NULL THEN jobvisor_jobs.last_error ELSE v.error END, \
    errors = CASE WHEN v.error IS NULL \
                       OR NOT json_valid(COALESCE(jobvisor_jobs.errors, '[]')) THEN jobvisor_jobs.errors \
                  ELSE json_insert(COALESCE(jobvisor_jobs.errors, '[]'), '$[#]', json(v.error)) END, \
    attempts = jobvisor_jobs.attempts - v.refund, \
    run_at = CASE WHEN v.delay_us IS NULL THEN jobvisor_jobs.run_at ELSE n.now + v.delay_us END, \
    finished_at = CASE WHEN v.state IN ('succeeded', 'dead', 'cancelled') \
                         OR (v.state = 'retrying' AND jobvisor_jobs.attempts >= jobvisor_jobs.max_attempts) \
                       THEN n.now ELSE NULL END, \
    started_at = COALESCE(jobvisor_jobs.started_at, n.now - v.ago), \
    first_started_at = COALESCE(jobvisor_jobs.first_started_at, n.now - v.ago), \
    last_node = jobvisor_jobs.lease_owner, \
    last_claim = CASE WHEN length(jobvisor_jobs.lease_token) = 48 \
                      THEN substr(jobvisor_jobs.lease_token, 1, 16) END, \
    last_claimed_at = jobvisor_jobs.updated_at, \
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
    timeout_at = NULL, version = jobvisor_jobs.version + 1, updated_at = n.now, \
    unique_hold = CASE WHEN jobvisor_jobs.unique_scope = 'while_active' \
                        AND (v.state IN ('succeeded', 'dead', 'cancelled') \
                             OR (v.state = 'retrying' \
                                 AND jobvisor_jobs.attempts >= jobvisor_jobs.max_attempts)) \
                       THEN NULL ELSE jobvisor_jobs.unique_hold END \
FROM v, n \
WHERE jobvisor_jobs.id = v.id AND jobvisor_jobs.lease_token = v.token \
  AND jobvisor_jobs.state = 'running' \
RETURNING jobvisor_jobs.id AS id, jobvisor_jobs.state AS state, \
          jobvisor_jobs.has_children AS has_children"
);

prepared_statement!(Sqlite
    /// Finalizes a batch (see [`FINALIZE`]).
    SqliteFinalize, FINALIZE, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

/// The most jobs one [`FinalizeSucceeded`] statement ends, and the width of its lists for
/// more than [`SUCCEEDED_SMALL`]: its `VALUES` list and `CASE`s compile in time quadratic in
/// their length (the statement 1.6 ms at 128 rows; the lists alone 14 ms at 1,024; measured),
/// so a larger batch is ended by several statements.
pub(crate) const SUCCEEDED_MAX: usize = 128;

/// The width of [`FinalizeSucceeded`]'s lists for a batch of at most this many jobs.
pub(crate) const SUCCEEDED_SMALL: usize = 16;

/// SQLite: ends a batch of successes, each row guarded by its token, as [`FINALIZE`] would.
/// The jobs are an `IN` list of `(id, lease_token)` pairs and each per-job value a
/// `CASE id` over them, not an `UPDATE … FROM` a JSON batch: SQLite runs an `UPDATE … FROM`
/// in two passes through a temporary table, and the list ended a batch of 100 in 6.4 µs
/// per job against 8.3 (measured on SQLite 3.51, the same columns written). A success
/// writes no error, refund or delay, so `errors`, `attempts` and `run_at` are left out of
/// the `SET`. The claim it ends stays on the row (`last_*`, read from the row by the `SET`):
/// a success writes no ledger row (`store::ledger`).
///
/// The lists are padded with `NULL` binds (which match nothing) to one of two widths
/// ([`SUCCEEDED_SMALL`], [`SUCCEEDED_MAX`]), and `result` is one bind when every job's is
/// the same: a connection compiles at most four texts, once each (a text per batch size
/// made a drain spend a tenth of its CPU compiling). The start's `CASE` is evaluated only
/// for a job whose start is not recorded (`COALESCE` stops at a recorded one).
#[derive(Debug)]
pub(crate) struct FinalizeSucceeded<'a> {
    pub(crate) now: Option<i64>,
    /// The jobs, at least one and at most [`SUCCEEDED_MAX`].
    pub(crate) jobs: &'a [Succeeded],
}

impl diesel::query_builder::QueryId for FinalizeSucceeded<'_> {
    type QueryId = ();
    // The text depends on the batch's width: cached by its text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::query_builder::Query for FinalizeSucceeded<'_> {
    type SqlType = diesel::sql_types::Untyped;
}

/// One job of a [`FinalizeSucceeded`]: its id, token, result (JSON) and how long ago its
/// handler started, if its start is not recorded yet.
pub(crate) type Succeeded = (i64, String, Option<String>, Option<i64>);

impl FinalizeSucceeded<'_> {
    /// `CASE id WHEN ? THEN ? … END` over the jobs, padded to `width`; `then` binds each
    /// job's value.
    fn case_id<'b>(
        &'b self,
        out: &mut AstPass<'_, 'b, Sqlite>,
        width: usize,
        then: impl Fn(&mut AstPass<'_, 'b, Sqlite>, &'b Succeeded) -> QueryResult<()>,
    ) -> QueryResult<()> {
        out.push_sql("CASE id");
        for j in self.jobs {
            out.push_sql(" WHEN ");
            out.push_bind_param::<BigInt, _>(&j.0)?;
            out.push_sql(" THEN ");
            then(out, j)?;
        }
        for _ in self.jobs.len()..width {
            out.push_sql(" WHEN ");
            out.push_bind_param::<Nullable<BigInt>, _>(&None::<i64>)?;
            out.push_sql(" THEN ");
            out.push_bind_param::<Nullable<BigInt>, _>(&None::<i64>)?;
        }
        out.push_sql(" END");
        Ok(())
    }
}

impl QueryFragment<Sqlite> for FinalizeSucceeded<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        let width = if self.jobs.len() <= SUCCEEDED_SMALL {
            SUCCEEDED_SMALL
        } else {
            SUCCEEDED_MAX
        };
        let now = "(SELECT now FROM n)";
        out.push_sql("WITH n(now) AS (SELECT COALESCE(");
        out.push_bind_param::<Nullable<BigInt>, _>(&self.now)?;
        out.push_sql(concat!(
            ", ",
            now_us!(),
            ")) UPDATE jobvisor_jobs SET state = 'succeeded', result = "
        ));
        match self.jobs.first() {
            Some(first) if self.jobs.iter().all(|j| j.2 == first.2) => {
                out.push_bind_param::<Nullable<Text>, _>(&first.2)?;
            }
            _ => self.case_id(&mut out, width, |out, j| {
                out.push_bind_param::<Nullable<Text>, _>(&j.2)
            })?,
        }
        out.push_sql(", last_error = NULL, finished_at = ");
        out.push_sql(now);
        for column in ["started_at", "first_started_at"] {
            out.push_sql(", ");
            out.push_sql(column);
            out.push_sql(" = COALESCE(");
            out.push_sql(column);
            out.push_sql(", ");
            out.push_sql(now);
            out.push_sql(" - ");
            self.case_id(&mut out, width, |out, j| {
                out.push_bind_param::<Nullable<BigInt>, _>(&j.3)
            })?;
            out.push_sql(")");
        }
        out.push_sql(
            ", last_node = lease_owner, \
            last_claim = CASE WHEN length(lease_token) = 48 THEN substr(lease_token, 1, 16) END, \
            last_claimed_at = updated_at, \
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, \
            heartbeat_at = NULL, timeout_at = NULL, version = version + 1, updated_at = ",
        );
        out.push_sql(now);
        out.push_sql(
            ", unique_hold = CASE WHEN unique_scope = 'while_active' THEN NULL \
            ELSE unique_hold END WHERE state = 'running' AND (id, lease_token) IN (VALUES ",
        );
        for (i, j) in self.jobs.iter().enumerate() {
            out.push_sql(if i == 0 { "(" } else { ", (" });
            out.push_bind_param::<BigInt, _>(&j.0)?;
            out.push_sql(", ");
            out.push_bind_param::<Text, _>(&j.1)?;
            out.push_sql(")");
        }
        for i in self.jobs.len()..width {
            out.push_sql(if i == 0 { "(" } else { ", (" });
            out.push_bind_param::<Nullable<BigInt>, _>(&None::<i64>)?;
            out.push_sql(", ");
            out.push_bind_param::<Nullable<Text>, _>(&None::<&str>)?;
            out.push_sql(")");
        }
        out.push_sql(") RETURNING id, state, has_children");
        Ok(())
    }
}

/// SQLite: inserts jobs without unique keys given as one JSON array of
/// `[queue, kind, priority, payload, max_attempts, run_at or null, delay_us, timeout_ms,
/// partition or null]`, in array order (so their ids ascend in it).
pub(crate) const INSERT_MANY: &str = concat!(
    "\
INSERT INTO jobvisor_jobs (queue, kind, state, priority, payload, max_attempts, run_at,
                           timeout_ms, partition_key, created_at, updated_at)
SELECT value ->> 0, value ->> 1, 'pending', value ->> 2, value ->> 3, value ->> 4,
       COALESCE(value ->> 5, n.now) + (value ->> 6), value ->> 7, value ->> 8, n.now, n.now
FROM (SELECT COALESCE(?, ",
    now_us!(),
    ") AS now) AS n,
     jsonb_each(?)
ORDER BY jsonb_each.key
RETURNING id"
);

prepared_statement!(Sqlite
    /// Inserts a batch of jobs without unique keys (see [`INSERT_MANY`]).
    SqliteInsertMany, INSERT_MANY, {
        now: Option<i64> => Nullable<BigInt>,
        batch: String => Text,
    }
);

impl QueryFragment<Sqlite> for ErrorCode {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql("json_extract(last_error, '$.code')");
        Ok(())
    }
}

/// Inserts a finalize batch's execution-ledger rows (`store::ledger`) in one statement, the
/// rows as one JSON bind of arrays in the table's column order: diesel's multi-row insert
/// sends one `INSERT` per row on SQLite (its values could be `DEFAULT`), 12 statements for a
/// batch of ten instead of one.
pub(crate) const INSERT_LEDGER: &str = "\
INSERT INTO jobvisor_claims (job_id, claim_id, attempt, node, claimed_at, started_at, ended_at, \
                             outcome, code, fence_margin_ms) \
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, \
       value ->> 6, value ->> 7, value ->> 8, value ->> 9 \
FROM json_each(?)";

#[cfg(test)]
mod tests {
    #[test]
    fn statements_have_their_placeholders() {
        assert_eq!(super::RENEW.split('?').count(), 5);
        assert_eq!(super::CLAIM.split('?').count(), 9);
    }

    #[test]
    fn the_claim_binds_nothing_the_planner_reads_as_a_constant() {
        // A new value bound there would expire the prepared claim at every claim (see CLAIM).
        assert!(!super::CLAIM.contains("LIMIT ?"));
        assert!(!super::CLAIM.contains("c.queue = ?"));
    }
}
