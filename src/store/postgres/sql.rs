//! PostgreSQL's statements and SQL fragments, each beside the reason for its shape.
//!
//! Statements are prepared once per connection (`prepared_statement!`, `$n` placeholders) and
//! take whole batches as arrays (`unnest`), so one statement serves any batch size. The
//! database clock is written once, in [`now_us!`].

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Json, Nullable, Text};

use crate::store::expr::{claim_columns, prepared_statement};
use crate::store::expr::{
    ClaimableSql, ClockSql, ErrorCode, ForUpdate, JsonAppend, PartitionScanSql, ScanSql, SkipLocked,
};

/// "Now" in epoch microseconds. `now()` is the transaction's start: stable within a
/// statement, so indexes stay usable.
macro_rules! now_us {
    () => {
        "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint"
    };
}

pub(crate) use now_us;

impl ClaimableSql for Pg {
    const CLAIMABLE: (&'static str, &'static str) =
        ("(queue = ", " AND state IN ('pending', 'retrying'))");
}

/// The partition scan reads the partial index of the waiting jobs that have a key, `(queue,
/// partition_key, priority, run_at, id)`, both waiting states in one condition; leaving out
/// the full partitions there would be a filter over rows still read, so they are skipped as
/// read. Keyless jobs are not in the index.
impl PartitionScanSql for Pg {
    const SCAN: ScanSql = ScanSql {
        table: "jobvisor_jobs j",
        states: &["IN ('pending', 'retrying')"],
        skip_full: false,
        keyless_indexed: false,
    };
}

impl ClockSql for Pg {
    const NOW_US: &'static str = now_us!();
    // `clock_timestamp()` is read as the statement runs, after any lock the transaction
    // waited for.
    const CLOCK_US: &'static str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint";
}

impl QueryFragment<Pg> for JsonAppend {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("(COALESCE(errors::jsonb, '[]'::jsonb) || jsonb_build_array(");
        out.push_bind_param::<Json, _>(&self.value)?;
        out.push_sql("::jsonb))::json");
        Ok(())
    }
}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for ForUpdate<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" FOR UPDATE");
        Ok(())
    }
}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" FOR UPDATE SKIP LOCKED");
        Ok(())
    }
}

/// A claim's first `WITH` entry, `n`: its "now" (`$1`, a test clock, or the database's) and
/// the lease length (`$2`), in µs.
macro_rules! claim_now {
    () => {
        concat!("WITH ", claim_now_entry!())
    };
}

/// `n` alone, for a statement whose `WITH` is `WITH RECURSIVE`.
macro_rules! claim_now_entry {
    () => {
        concat!(
            "n AS (\n    SELECT COALESCE($1::bigint, ",
            now_us!(),
            ") AS now, $2::bigint AS lease_us\n)"
        )
    };
}

/// The update every claim makes (its two placeholders: owner, then token), over the rows
/// of the `ARRAY(…)` that follows it, with `n` the statement's `(now, lease_us)`.
macro_rules! claim_update {
    () => {
        "\
UPDATE jobvisor_jobs AS j SET
    state = 'running',
    lease_owner = $0,
    lease_token = $0,
    lease_expires_at = n.now + n.lease_us,
    heartbeat_at = n.now,
    attempts = j.attempts + 1,
    version = j.version + 1,
    updated_at = n.now,
    started_at = NULL,
    timeout_at = NULL
FROM n
WHERE j.id = ANY(ARRAY("
    };
}

/// The update every finalize makes (see [`FINALIZE`]), over the batch `v` and `n`.
macro_rules! finalize_update {
    () => {
        "\
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
        started_at = COALESCE(j.started_at, n.now - v.ago),
        first_started_at = COALESCE(j.first_started_at, n.now - v.ago),
        last_node = j.lease_owner,
        last_claim = CASE WHEN length(j.lease_token) = 48 THEN left(j.lease_token, 16) END,
        last_claimed_at = j.updated_at,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        timeout_at = NULL,
        unique_hold = CASE WHEN j.unique_scope = 'while_active'
                             AND (v.state IN ('succeeded', 'dead', 'cancelled')
                                  OR (v.state = 'retrying' AND j.attempts >= j.max_attempts))
                           THEN NULL ELSE j.unique_hold END,
        version = j.version + 1,
        updated_at = n.now
    FROM v, n
    WHERE j.id = ANY(ARRAY(SELECT v.id FROM v)) AND j.id = v.id AND j.lease_token = v.token
      AND j.state = v.expect
"
    };
}

/// Finalizes a batch. Its shape keeps the plan linear whatever the statistics say: the rows
/// are found through the primary key (`id = ANY(ARRAY(…))`), and the `running` guard is a
/// join condition against the materialized batch rather than a filter on the table. With
/// `state = 'running'` as a filter, statistics taken when few jobs ran made the planner scan
/// the table for "the one running row" and loop over the batch for each row found: 80 ms
/// instead of 4 ms for 500 jobs (measured, 20,000-row table). A job whose key is held
/// `while_active` releases it (`unique_hold = NULL`) in the same statement that ends it; a
/// start no renewal recorded (a job shorter than a heartbeat) is recorded here (`ago`).
///
/// The claim each applied row ends is kept on the row (`last_node`, `last_claim`,
/// `last_claimed_at`: the `SET` reads the row before this update), and a claim that did not
/// succeed is written to the execution ledger by the same statement (`ledger`, fed by
/// `upd`'s `RETURNING`, no read of the table of its own; the attempt is the returned one plus
/// its refund). A success writes no ledger row here: its job row holds it until the job is
/// archived (`store::ledger`). Only rows `upd` applied, under their token, are written.
///
/// The ids of the rows it ended go to `jobvisor_announce_done` (`done`, one row whatever it
/// sends, joined by the answer so that it runs), which notifies `jobvisor_done` with those
/// somebody waits on (`store/waits.rs`), delivered at commit: nothing is notified, and no
/// commit queues for the notify lock, while nobody waits.
pub(crate) const FINALIZE: &str = concat!(
    "\
WITH v AS MATERIALIZED (
    SELECT *, 'running'::text AS expect
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::int[],
                $8::bigint[], $9::text[], $10::text[], $11::bigint[])
        AS v(id, token, state, result, error, delay_us, refund, ago, outcome, code, margin)
), n AS (
    SELECT COALESCE($12::bigint, ", now_us!(), ") AS now
), upd AS (
", finalize_update!(), "    RETURNING j.id, j.state, j.has_children, j.started_at, j.attempts, j.last_node, j.last_claim,
              j.last_claimed_at
), ledger AS (
    INSERT INTO jobvisor_claims (job_id, claim_id, attempt, node, claimed_at, started_at, ended_at,
                                 outcome, code, fence_margin_ms)
    SELECT u.id, u.last_claim, u.attempts + v.refund, u.last_node, u.last_claimed_at, u.started_at,
           n.now,
           CASE WHEN v.outcome = 'retried' AND u.state = 'dead' THEN 'failed' ELSE v.outcome END,
           v.code, v.margin
    FROM upd AS u JOIN v ON v.id = u.id, n
    WHERE v.outcome <> 'succeeded' AND u.last_claim IS NOT NULL AND u.last_node IS NOT NULL
    ON CONFLICT DO NOTHING
), done AS MATERIALIZED (
    SELECT jobvisor_announce_done(array_agg(id)) AS sent FROM upd
    WHERE state IN ('succeeded', 'dead', 'cancelled')
)
SELECT id, state, has_children FROM upd, done"
);

/// [`FINALIZE`] for a batch of successes only (the drain's): the same update, without the
/// execution ledger's step or its columns (a success writes no ledger row), so a drain sends
/// the statement it sent before the ledger, plus the three `last_*` assignments and the
/// announcement to waits.
pub(crate) const FINALIZE_SUCCESSES: &str = concat!(
    "\
WITH v AS MATERIALIZED (
    SELECT *, 'running'::text AS expect
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::int[],
                $8::bigint[])
        AS v(id, token, state, result, error, delay_us, refund, ago)
), n AS (
    SELECT COALESCE($9::bigint, ", now_us!(), ") AS now
), upd AS (
", finalize_update!(), "    RETURNING j.id, j.state, j.has_children
), done AS MATERIALIZED (
    SELECT jobvisor_announce_done(array_agg(id)) AS sent FROM upd
    WHERE state IN ('succeeded', 'dead', 'cancelled')
)
SELECT id, state, has_children FROM upd, done"
);

prepared_statement!(
    /// Finalizes a batch of successes in one statement (see [`FINALIZE_SUCCESSES`]).
    PgFinalizeSuccesses<'a>, FINALIZE_SUCCESSES, {
        ids: Vec<i64> => diesel::sql_types::Array<BigInt>,
        tokens: Vec<&'a str> => diesel::sql_types::Array<Text>,
        states: Vec<&'static str> => diesel::sql_types::Array<Text>,
        results: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        errors: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        delays: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        refunds: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        agos: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// Registers a wait (`PgDriver::wait_register`; the order that makes it safe is explained in
/// `store/waits.rs`). `j` locks the job's row `FOR SHARE` while it runs: a transaction that
/// ended it and has not committed is waited for, and then the row no longer matches
/// (READ COMMITTED re-checks it), so `k` finds no live state. A row that is not running is
/// not locked: a claim's `SKIP LOCKED` would pass a pending job over while it was, and an
/// idle node would then wait for its poll. The wait is counted only for a job that exists
/// and has not ended; the answer says whether it was.
/// Rows past their `expires_at` (waiters that died) are deleted here, the only place that
/// writes the table while somebody waits; nobody waiting, nothing reads or writes it.
pub(crate) const WAIT_REGISTER: &str = concat!(
    "\
WITH n AS (
    SELECT ",
    now_us!(),
    " AS now
), j AS (
    SELECT state FROM jobvisor_jobs WHERE id = $1 AND state = 'running' FOR SHARE
), k AS (
    SELECT COALESCE((SELECT state FROM j),
                    (SELECT state FROM jobvisor_jobs WHERE id = $1 AND state <> 'running')) AS state
), stale AS (
    DELETE FROM jobvisor_waits AS w USING n WHERE w.expires_at < n.now AND w.job_id <> $1
), reg AS (
    INSERT INTO jobvisor_waits (job_id, waiters, expires_at)
    SELECT $1, 1, n.now + $2 FROM k, n WHERE k.state NOT IN ('succeeded', 'dead', 'cancelled')
    ON CONFLICT (job_id) DO UPDATE SET waiters = jobvisor_waits.waiters + 1,
        expires_at = GREATEST(jobvisor_waits.expires_at, EXCLUDED.expires_at)
    RETURNING job_id
)
SELECT count(*) AS registered FROM reg"
);

/// Removes one wait on a job (`PgDriver::wait_unregister`): the row with its last waiter,
/// else one waiter less. Two waits ending at once may both decrement and leave a row of 0
/// waiters: it costs one notification at the job's end, and expires.
pub(crate) const WAIT_UNREGISTER: &str = "\
WITH d AS (
    DELETE FROM jobvisor_waits WHERE job_id = $1 AND waiters <= 1 RETURNING job_id
)
UPDATE jobvisor_waits SET waiters = waiters - 1
WHERE job_id = $1 AND waiters > 1 AND NOT EXISTS (SELECT 1 FROM d)";

prepared_statement!(
    /// Finalizes a batch in one statement, each row guarded by its own token.
    PgFinalize<'a>, FINALIZE, {
        ids: Vec<i64> => diesel::sql_types::Array<BigInt>,
        tokens: Vec<&'a str> => diesel::sql_types::Array<Text>,
        states: Vec<&'static str> => diesel::sql_types::Array<Text>,
        results: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        errors: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        delays: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        refunds: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        agos: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        outcomes: Vec<&'static str> => diesel::sql_types::Array<Text>,
        codes: Vec<Option<String>> => diesel::sql_types::Array<Nullable<Text>>,
        margins: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        now: Option<i64> => Nullable<BigInt>,
    }
);

/// Claims due jobs of a queue, of the kinds the claiming node can run (`$6`: any kind). A
/// kind filter rather than a claim-then-refuse keeps a rolling deploy from burning attempts:
/// jobs of a kind the node lacks stay `pending` for a node that has it. It is checked on
/// the rows the claim index walk meets, so it costs nothing while every kind is served.
/// The candidates are locked by a subquery collected into an
/// array (`= ANY(ARRAY(…))`), so the update finds its rows through the primary key whatever the
/// planner believes: with `id IN (subquery)` a generic plan (statistics taken when the table
/// was full, a `LIMIT` parameter it cannot see) hash-joined a sequential scan of the whole
/// table.
pub(crate) const CLAIM: &str = concat!(
    claim_now!(),
    "
",
    claim_update!(),
    "
    SELECT c.id FROM jobvisor_jobs AS c
    WHERE c.queue = $5 AND c.state IN ('pending', 'retrying')
      AND ($6::boolean OR c.kind = ANY($7::text[]))
      AND c.run_at <= (SELECT now FROM n)
      AND NOT EXISTS (SELECT 1 FROM jobvisor_queues AS q WHERE q.name = $8)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT $9
    FOR UPDATE SKIP LOCKED
))
RETURNING ",
    claim_columns!()
);

prepared_statement!(
    /// Claims up to `limit` due jobs of `queue` with one token.
    PgClaim, CLAIM, {
        now: Option<i64> => Nullable<BigInt>,
        lease_us: i64 => BigInt,
        owner: String => Text,
        token: String => Text,
        queue: String => Text,
        any_kind: bool => diesel::sql_types::Bool,
        kinds: Vec<String> => diesel::sql_types::Array<Text>,
        queue_again: String => Text,
        limit: i64 => BigInt,
    }
);

/// A statement without parameters, prepared once per connection like the others, so that
/// it can be sent in the same round trip as the statements around it (the simple-query
/// `BEGIN` of a diesel transaction is a round trip of its own).
macro_rules! fixed_statement {
    ($(#[$doc:meta])* $name:ident, $sql:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, diesel::query_builder::QueryId)]
        pub(crate) struct $name;

        impl diesel::query_builder::Query for $name {
            type SqlType = diesel::sql_types::Untyped;
        }

        impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for $name {
            fn walk_ast<'b>(
                &'b self,
                mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
            ) -> diesel::result::QueryResult<()> {
                out.push_sql($sql);
                Ok(())
            }
        }
    };
}

fixed_statement!(
    /// Opens a transaction (pipelined; see [`fixed_statement`]).
    PgBegin,
    "BEGIN"
);
fixed_statement!(
    /// Commits it — or, after a failed statement, rolls it back.
    PgCommit,
    "COMMIT"
);

/// Bounds this transaction's waits for locks (`lock_timeout`, transaction-local): a
/// prepared `set_config`, since `SET` takes no parameters.
pub(crate) const SET_LOCK_WAIT: &str = "SELECT set_config('lock_timeout', $1, true)";

prepared_statement!(
    /// Sets `lock_timeout` for the transaction (see [`SET_LOCK_WAIT`]).
    PgSetLockWait, SET_LOCK_WAIT, {
        wait: String => Text,
    }
);

/// Locks a controlled queue's row for a claim (as the portable controlled claim's first step
/// does, `claim/controlled.rs`), answering what the claim statement after it cannot
/// decide: whether the row exists, and whether it has a setting only the portable claim
/// handles (a rate limit).
pub(crate) const LOCK_QUEUE: &str = "\
UPDATE jobvisor_queues SET claims = claims + 1 WHERE name = $1
RETURNING rate_limit IS NOT NULL AS involved, partition_limit IS NOT NULL AS partitioned";

prepared_statement!(
    /// Takes a queue row's write lock (see [`LOCK_QUEUE`]).
    PgLockQueue, LOCK_QUEUE, {
        queue: String => Text,
    }
);

/// The controlled claims' row of settings, read in the claim statement (placeholders: the
/// claim's limit, the queue, the limit again, the queue): `budget`, what the claim may take
/// (`min(limit, concurrency_limit − running)`), and `per`, the per-partition limit — or no
/// row for a paused queue, one with a rate limit, and one this transaction did not lock
/// (see [`CLAIM_CONTROLLED`]).
macro_rules! controlled_budget {
    () => {
        "
    SELECT GREATEST(0, LEAST($3::bigint, COALESCE(q.concurrency_limit - (
        SELECT count(*) FROM jobvisor_jobs AS r
        WHERE r.queue = $4 AND r.state = 'running' AND r.lease_expires_at IS NOT NULL
    ), $5::bigint))) AS budget, q.partition_limit AS per
    FROM jobvisor_queues AS q
    WHERE q.name = $6 AND q.paused_at IS NULL AND q.rate_limit IS NULL
      AND q.xmin::text::bigint = txid_current() % 4294967296
"
    };
}

/// The running jobs per partition of a queue with a per-partition limit, `(key, running)`
/// (placeholder: the queue); none without a limit.
macro_rules! running_per_partition {
    () => {
        "
    SELECT r.partition_key AS key, count(*) AS running
    FROM jobvisor_jobs AS r
    WHERE (SELECT per FROM q) IS NOT NULL
      AND r.queue = $7 AND r.state = 'running' AND r.lease_expires_at IS NOT NULL
      AND r.partition_key IS NOT NULL
    GROUP BY r.partition_key
"
    };
}

/// The claim of a queue under a pause, a global concurrency limit and a per-partition limit
/// (any of them), run after [`LOCK_QUEUE`] in its transaction. Under READ COMMITTED a
/// statement's snapshot is taken when it starts — here, after the lock was granted — so it
/// sees every claim of the queue committed before, and none can commit until this
/// transaction does: the counts of running jobs are exact. The claim takes at most
/// `concurrency_limit − running` jobs and, per partition, at most `partition_limit −
/// running in it`: it counts the running jobs per partition (`p`), leaves the partitions at
/// their limit out of its search, so a backlog of one never hides the others' due jobs,
/// takes a window of candidates in claim order (`cand`: 4 × the budget, at most 4,000, as
/// the portable claim does) and ranks each within its partition. A queue whose lock last
/// reported a per-partition limit is claimed by [`CLAIM_PARTITIONED`] instead, which does
/// not step over a backlog of full partitions; each of the two is exact whatever the row
/// says, so a stale choice costs speed, never a limit. The row is read again here,
/// in the statement that claims: a paused queue, one without a row, and one with a rate
/// limit claim nothing (`LIMIT 0`) — and so does a claim that does not see the row *as this
/// transaction wrote it* (`xmin` is this transaction's top-level id: the lock is an
/// `UPDATE`, never in a savepoint — a `SELECT … FOR UPDATE` would leave `xmin` alone and
/// every claim would take nothing), which is what makes sending the lock and this claim in
/// one round trip safe: a claim executed before its lock, or outside its transaction, finds
/// the row's `xmin` another transaction's and takes nothing.
pub(crate) const CLAIM_CONTROLLED: &str = concat!(
    claim_now!(),
    ", q AS (",
    controlled_budget!(),
    "), p AS MATERIALIZED (",
    running_per_partition!(),
    "), cand AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, c.partition_key
    FROM jobvisor_jobs AS c
    WHERE c.queue = $8 AND c.state IN ('pending', 'retrying')
      AND ($9::boolean OR c.kind = ANY($10::text[]))
      AND c.run_at <= (SELECT now FROM n)
      AND (c.partition_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM p WHERE p.key = c.partition_key AND p.running >= (SELECT per FROM q)))
    ORDER BY c.priority, c.run_at, c.id
    LIMIT COALESCE((SELECT CASE WHEN per IS NULL THEN budget
                                ELSE LEAST(budget * 4, 4000) END FROM q), 0)
    FOR UPDATE SKIP LOCKED
)
",
    claim_update!(),
    "
    SELECT r.id FROM (
        SELECT cand.*, row_number() OVER (
            PARTITION BY cand.partition_key ORDER BY cand.priority, cand.run_at, cand.id) AS k
        FROM cand
    ) AS r
    LEFT JOIN p ON p.key = r.partition_key
    WHERE r.partition_key IS NULL OR (SELECT per FROM q) IS NULL
       OR r.k <= (SELECT per FROM q) - COALESCE(p.running, 0)
    ORDER BY r.priority, r.run_at, r.id
    LIMIT COALESCE((SELECT budget FROM q), 0)
))
RETURNING ",
    claim_columns!()
);

prepared_statement!(
    /// Claims up to `limit` due jobs of a controlled queue within its limits (see
    /// [`CLAIM_CONTROLLED`]).
    PgClaimControlled, CLAIM_CONTROLLED, {
        now: Option<i64> => Nullable<BigInt>,
        lease_us: i64 => BigInt,
        limit: i64 => BigInt,
        queue_running: String => Text,
        limit_again: i64 => BigInt,
        queue_row: String => Text,
        queue_parts: String => Text,
        queue: String => Text,
        any_kind: bool => diesel::sql_types::Bool,
        kinds: Vec<String> => diesel::sql_types::Array<Text>,
        owner: String => Text,
        token: String => Text,
    }
);

/// [`CLAIM_CONTROLLED`] for a queue with a per-partition limit, as exact for any
/// settings: run after [`LOCK_QUEUE`] in its transaction, so its snapshot sees every claim
/// of the queue committed before and none can commit until this transaction does. The claim
/// takes at most `concurrency_limit − running` jobs (`q.budget`) and, per partition, at most
/// `partition_limit − running in it` (`p` counts the running jobs per partition, as one
/// JSON object: looked up by key, not joined — before the table has statistics the planner
/// joined the head to it row by row).
///
/// Without a partition limit the candidates are the first `budget` due jobs in claim order
/// (`cand`). With one, a search in claim order would have to step over every job of the
/// partitions at their limit — a burst of one tenant at the head of the queue, 100,000 jobs
/// long, made every claim read all of them (32 ms, holding the queue's lock). So the claim
/// reads a bounded head of the queue instead (`head`: 4 × the budget, at least 128, at most
/// 4,000 due jobs) and ranks each job within its partition (`ranked`: those within their
/// partition's room). The head is a prefix in claim order, so what it yields are the first
/// claimable jobs of all. The claim looks past the head (`keys`, `deep`) only if the head
/// yields fewer jobs than the claim may take and is either all jobs of partitions at their
/// limit or mostly the jobs of a few partitions (at most one distinct key per four jobs: a
/// burst; a head of many partitions stands for the queue, and looking further would cost
/// most claims a probe per partition for nothing) (`gate`). It walks the partitions that have waiting jobs, one
/// index probe each (`jobvisor_jobs_partition_claim_idx`, which holds only jobs with a key:
/// keyless jobs, most jobs of most queues, pay no extra index entry), and takes from each
/// partition with room its first jobs up to that room — so a backlog of one partition never
/// hides the others' due jobs, and costs a claim no more than a probe per partition. Keyless
/// jobs past the head are looked for in the 1,000 due jobs after it: behind a longer backlog
/// of full partitions they wait until it shortens (an index that found them anywhere would
/// cost every enqueue of every queue an entry: a quarter of the batch enqueue rate). `pick` takes the first `budget` of the candidates in claim order, and `taken`
/// locks them through the primary key (`SKIP LOCKED`; with any other condition there, a plan
/// made before the table had statistics read the queue's whole index instead); the update
/// takes those whose locked version is still claimable.
///
/// The row is read again here, in the statement that claims: a paused queue, one without a
/// row, and one with a rate limit claim nothing (`LIMIT 0`) — and so does a claim that does
/// not see the row *as this transaction wrote it* (`xmin` is this transaction's top-level
/// id: the lock is an `UPDATE`, never in a savepoint — a `SELECT … FOR UPDATE` would leave
/// `xmin` alone and every claim would take nothing), which is what makes sending the lock
/// and this claim in one round trip safe: a claim executed before its lock, or outside its
/// transaction, finds the row's `xmin` another transaction's and takes nothing.
pub(crate) const CLAIM_PARTITIONED: &str = concat!(
    "WITH RECURSIVE ",
    claim_now_entry!(),
    ", q AS (
    SELECT b.budget, b.per, LEAST(GREATEST(b.budget * 4, 128), 4000) AS head FROM (",
    controlled_budget!(),
    ") AS b
), p AS MATERIALIZED (
    SELECT COALESCE(jsonb_object_agg(r.key, r.running), '{}'::jsonb) AS running FROM (",
    running_per_partition!(),
    ") AS r
), a AS (
    SELECT $8::text AS queue, $9::boolean AS any_kind, $10::text[] AS kinds
), cand AS MATERIALIZED (
    SELECT c.id
    FROM jobvisor_jobs AS c
    WHERE (SELECT per FROM q) IS NULL
      AND c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
      AND ((SELECT any_kind FROM a) OR c.kind = ANY((SELECT kinds FROM a)::text[]))
      AND c.run_at <= (SELECT now FROM n)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT COALESCE((SELECT budget FROM q), 0)
    FOR UPDATE SKIP LOCKED
), head AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, c.partition_key
    FROM jobvisor_jobs AS c
    WHERE (SELECT per FROM q) IS NOT NULL AND (SELECT budget FROM q) > 0
      AND c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
      AND ((SELECT any_kind FROM a) OR c.kind = ANY((SELECT kinds FROM a)::text[]))
      AND c.run_at <= (SELECT now FROM n)
    ORDER BY c.priority, c.run_at, c.id
    LIMIT (SELECT head FROM q)
), ranked AS MATERIALIZED (
    SELECT r.id, r.priority, r.run_at FROM (
        SELECT head.*, row_number() OVER (
            PARTITION BY head.partition_key ORDER BY head.priority, head.run_at, head.id) AS k
        FROM head
    ) AS r
    WHERE r.partition_key IS NULL
       OR r.k <= (SELECT per FROM q)
                 - COALESCE(((SELECT running FROM p) ->> r.partition_key)::bigint, 0)
), gate AS MATERIALIZED (
    SELECT (SELECT count(*) FROM head) >= (SELECT head FROM q)
       AND (SELECT count(*) FROM ranked) < (SELECT budget FROM q)
       AND (NOT EXISTS (SELECT 1 FROM ranked)
            OR (SELECT count(DISTINCT partition_key) FROM head) * 4 <= (SELECT head FROM q))
       AS deeper
), keys (key) AS (
    (SELECT c.partition_key FROM jobvisor_jobs AS c
     WHERE (SELECT deeper FROM gate)
       AND c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
       AND c.partition_key IS NOT NULL
     ORDER BY c.partition_key LIMIT 1)
    UNION ALL
    SELECT (SELECT c.partition_key FROM jobvisor_jobs AS c
            WHERE c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
              AND c.partition_key IS NOT NULL AND c.partition_key > k.key
            ORDER BY c.partition_key LIMIT 1)
    FROM keys AS k WHERE k.key IS NOT NULL
), deep AS MATERIALIZED (
    SELECT h.id, h.priority, h.run_at
    FROM keys AS k
    CROSS JOIN LATERAL (
        SELECT c.id, c.priority, c.run_at FROM jobvisor_jobs AS c
        WHERE c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
          AND c.partition_key IS NOT NULL AND c.partition_key = k.key
          AND ((SELECT any_kind FROM a) OR c.kind = ANY((SELECT kinds FROM a)::text[]))
          AND c.run_at <= (SELECT now FROM n)
        ORDER BY c.priority, c.run_at, c.id
        LIMIT (SELECT per FROM q) - COALESCE(((SELECT running FROM p) ->> k.key)::bigint, 0)
    ) AS h
    WHERE k.key IS NOT NULL
      AND COALESCE(((SELECT running FROM p) ->> k.key)::bigint, 0) < (SELECT per FROM q)
    UNION ALL
    SELECT s.id, s.priority, s.run_at FROM (
        SELECT c.id, c.priority, c.run_at, c.partition_key FROM jobvisor_jobs AS c
        WHERE (SELECT deeper FROM gate)
          AND c.queue = (SELECT queue FROM a) AND c.state IN ('pending', 'retrying')
          AND ((SELECT any_kind FROM a) OR c.kind = ANY((SELECT kinds FROM a)::text[]))
          AND c.run_at <= (SELECT now FROM n)
          AND (c.priority, c.run_at, c.id) > (
              SELECT h.priority, h.run_at, h.id FROM head AS h
              ORDER BY h.priority DESC, h.run_at DESC, h.id DESC LIMIT 1)
        ORDER BY c.priority, c.run_at, c.id
        LIMIT 1000
    ) AS s
    WHERE s.partition_key IS NULL
), pick AS MATERIALIZED (
    SELECT u.id FROM (SELECT * FROM ranked UNION SELECT * FROM deep) AS u
    ORDER BY u.priority, u.run_at, u.id
    LIMIT COALESCE((SELECT budget FROM q), 0)
), taken AS MATERIALIZED (
    SELECT c.id, c.queue, c.state, c.kind, c.run_at FROM jobvisor_jobs AS c
    WHERE c.id = ANY(ARRAY(SELECT id FROM pick))
    FOR UPDATE SKIP LOCKED
)
",
    claim_update!(),
    "
    SELECT id FROM cand
    UNION ALL
    SELECT t.id FROM taken AS t
    WHERE t.queue = (SELECT queue FROM a) AND t.state IN ('pending', 'retrying')
      AND ((SELECT any_kind FROM a) OR t.kind = ANY((SELECT kinds FROM a)::text[]))
      AND t.run_at <= (SELECT now FROM n)
))
RETURNING ",
    claim_columns!()
);

/// [`PgClaimControlled`]'s binds for [`CLAIM_PARTITIONED`], the claim of a queue with a
/// per-partition limit: the same binds in the same order.
#[derive(Debug, Clone, diesel::query_builder::QueryId)]
pub(crate) struct PgClaimPartitioned(pub(crate) PgClaimControlled);

impl std::ops::Deref for PgClaimPartitioned {
    type Target = PgClaimControlled;

    fn deref(&self) -> &PgClaimControlled {
        &self.0
    }
}

prepared_statement!(@impl PgClaimPartitioned, Pg, crate::store::expr::segments(CLAIM_PARTITIONED), {
    now => Nullable<BigInt>,
    lease_us => BigInt,
    limit => BigInt,
    queue_running => Text,
    limit_again => BigInt,
    queue_row => Text,
    queue_parts => Text,
    queue => Text,
    any_kind => diesel::sql_types::Bool,
    kinds => diesel::sql_types::Array<Text>,
    owner => Text,
    token => Text
});

/// Renews a batch of leases, each guarded by its own token, and records the starts it
/// carries: `started_at = now - ago` for a lease whose handler started (`ago` not NULL) and
/// whose start is not recorded yet, and from it `first_started_at` and the timeout deadline
/// (`timeout_at`, the sweeper's backstop). Found through the primary key, as in
/// [`FINALIZE`].
pub(crate) const RENEW: &str = concat!(
    "\
WITH v AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[])
        AS v(id, token, ago, progress)
), n AS (
    SELECT COALESCE($5::bigint, ",
    now_us!(),
    ") AS now,
           $6::bigint AS lease_us, $7::bigint AS grace_us
)
UPDATE jobvisor_jobs AS j SET
    lease_expires_at = n.now + n.lease_us,
    heartbeat_at = n.now,
    started_at = CASE WHEN j.started_at IS NULL AND v.ago IS NOT NULL THEN n.now - v.ago
                      ELSE j.started_at END,
    first_started_at = CASE WHEN j.first_started_at IS NULL AND v.ago IS NOT NULL
                            THEN n.now - v.ago ELSE j.first_started_at END,
    timeout_at = CASE WHEN j.started_at IS NULL AND v.ago IS NOT NULL
                      THEN n.now - v.ago + j.timeout_ms * 1000 + n.grace_us
                      ELSE j.timeout_at END,
    progress = CASE WHEN v.progress IS NULL THEN j.progress ELSE v.progress::json END
FROM v, n
WHERE j.id = ANY(ARRAY(SELECT v.id FROM v)) AND j.id = v.id AND j.lease_token = v.token
  AND j.state = 'running'
RETURNING j.id, j.lease_token, j.lease_expires_at, j.cancel_requested_at"
);

prepared_statement!(
    /// Renews leases and records starts (see [`RENEW`]).
    PgRenew<'a>, RENEW, {
        ids: Vec<i64> => diesel::sql_types::Array<BigInt>,
        tokens: Vec<&'a str> => diesel::sql_types::Array<Text>,
        agos: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        progress: Vec<Option<&'a str>> => diesel::sql_types::Array<Nullable<Text>>,
        now: Option<i64> => Nullable<BigInt>,
        lease_us: i64 => BigInt,
        grace_us: i64 => BigInt,
    }
);

pub(crate) const ENQUEUE_BATCH: &str = concat!(
    "\
INSERT INTO jobvisor_jobs (queue, kind, unique_key, state, priority, payload, max_attempts,
                           run_at, timeout_ms, created_at, updated_at, partition_key,
                           unique_hold, unique_scope, unique_until)
SELECT v.queue, v.kind, v.unique_key, 'pending', v.priority, v.payload::json, v.max_attempts,
       COALESCE(v.run_at, n.now + v.delay_us), v.timeout_ms, n.now, n.now, v.partition_key,
       v.unique_key, v.unique_scope, n.now + v.period_us
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::int[], $7::bigint[],
            $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::bigint[])
         WITH ORDINALITY AS v(queue, kind, unique_key, priority, payload, max_attempts,
                              timeout_ms, run_at, delay_us, partition_key, unique_scope,
                              period_us, ord),
     (SELECT COALESCE($13::bigint, ",
    now_us!(),
    ") AS now, CASE WHEN $14 THEN set_config('jobvisor.notify', 'after_commit', true) END
     AS quiet) AS n
ORDER BY v.ord
ON CONFLICT (kind, unique_hold) WHERE unique_hold IS NOT NULL DO NOTHING
RETURNING id, kind, unique_key"
);

prepared_statement!(
    /// Inserts a batch from arrays, in input order, skipping jobs whose key is held.
    PgEnqueueBatch<'a>, ENQUEUE_BATCH, {
        queue: Vec<&'a str> => diesel::sql_types::Array<Text>,
        kind: Vec<&'a str> => diesel::sql_types::Array<Text>,
        unique_key: Vec<Option<&'a str>> => diesel::sql_types::Array<Nullable<Text>>,
        priority: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        payload: Vec<&'a str> => diesel::sql_types::Array<Text>,
        max_attempts: Vec<i32> => diesel::sql_types::Array<diesel::sql_types::Integer>,
        timeout_ms: Vec<i64> => diesel::sql_types::Array<BigInt>,
        run_at: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        delay_us: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        partition_key: Vec<Option<&'a str>> => diesel::sql_types::Array<Nullable<Text>>,
        unique_scope: Vec<Option<&'static str>> => diesel::sql_types::Array<Nullable<Text>>,
        period_us: Vec<Option<i64>> => diesel::sql_types::Array<Nullable<BigInt>>,
        now: Option<i64> => Nullable<BigInt>,
        quiet: bool => diesel::sql_types::Bool,
    }
);

/// Inserts one job, writing what `new_row!` (`common/columns.rs`) writes; the key's holder is
/// resolved by the keyed enqueue (`keyed.rs`) when the insert skips (`ON CONFLICT`). A
/// constant text with typed binds: built by the query builder, the insert's text was
/// rebuilt and looked up in the statement cache on every enqueue, two thirds of the
/// client's instructions per enqueue. `run_at`: the instant given, else now plus the delay.
/// `$15` (`quiet`): the store commits the insert itself and announces it after the commit,
/// so the trigger stays silent (`after_commit.rs`).
pub(crate) const ENQUEUE_ONE: &str = concat!(
    "\
INSERT INTO jobvisor_jobs (queue, kind, unique_key, partition_key, unique_hold, unique_scope,
                           unique_until, state, priority, payload, errors, max_attempts,
                           run_at, timeout_ms, created_at, updated_at)
SELECT $1, $2, $3, $4, $5, $6, n.now + $7, 'pending', $8, $9::json, '[]', $10,
       COALESCE($11, n.now + $12), $13, n.now, n.now
FROM (SELECT COALESCE($14::bigint, ",
    now_us!(),
    ") AS now, CASE WHEN $15 THEN set_config('jobvisor.notify', 'after_commit', true) END
      AS quiet) AS n
ON CONFLICT (kind, unique_hold) WHERE unique_hold IS NOT NULL DO NOTHING
RETURNING id"
);

prepared_statement!(
    /// Inserts one job unless its key is held (see [`ENQUEUE_ONE`]).
    PgEnqueueOne<'a>, ENQUEUE_ONE, {
        queue: &'a str => Text,
        kind: &'a str => Text,
        unique_key: Option<&'a str> => Nullable<Text>,
        partition_key: Option<&'a str> => Nullable<Text>,
        unique_hold: Option<&'a str> => Nullable<Text>,
        unique_scope: Option<&'static str> => Nullable<Text>,
        period_us: Option<i64> => Nullable<BigInt>,
        priority: i32 => diesel::sql_types::Integer,
        payload: String => Text,
        max_attempts: i32 => diesel::sql_types::Integer,
        run_at: Option<i64> => Nullable<BigInt>,
        delay_us: i64 => BigInt,
        timeout_ms: i64 => BigInt,
        now: Option<i64> => Nullable<BigInt>,
        quiet: bool => diesel::sql_types::Bool,
    }
);

/// A PostgreSQL statement returning `claim_columns!()`, its rows read by position.
pub(crate) type ClaimRows<Q> = crate::store::expr::ClaimRows<Q, Pg>;

impl QueryFragment<Pg> for ErrorCode {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("(last_error->>'code')");
        Ok(())
    }
}

/// `announce_due` (`store/common/wakes.rs`): a notification on `jobvisor_jobs` per distinct
/// queue of `$1`, delivered at commit; on a session without notifications
/// (`jobvisor.listen = 'off'`) the wake counter moves instead and nothing is notified. A
/// data-modifying `WITH` runs whether or not the query reads it; its `WHERE` keeps the
/// counter's row unlocked (and unwritten) on a notifying session.
pub(crate) const ANNOUNCE_DUE: &str = "\
WITH counted AS (
    UPDATE jobvisor_wakes SET n = n + 1
    WHERE id = 1 AND current_setting('jobvisor.listen', true) = 'off'
    RETURNING n
)
SELECT pg_notify('jobvisor_jobs', q.queue)
FROM (SELECT DISTINCT unnest($1::text[]) AS queue) AS q
WHERE current_setting('jobvisor.listen', true) IS DISTINCT FROM 'off'";

/// `announce_cancel`: a notification on `jobvisor_cancel` with the job's id (`$1`), or, on
/// a session without notifications, the wake counter (as [`ANNOUNCE_DUE`]), on which each
/// node with leases renews them at once and so learns of the cancel.
pub(crate) const ANNOUNCE_CANCEL: &str = "\
WITH counted AS (
    UPDATE jobvisor_wakes SET n = n + 1
    WHERE id = 1 AND current_setting('jobvisor.listen', true) = 'off'
    RETURNING n
)
SELECT pg_notify('jobvisor_cancel', $1)
WHERE current_setting('jobvisor.listen', true) IS DISTINCT FROM 'off'";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::expr::segments;

    #[test]
    fn statements_split_at_their_placeholders_in_order() {
        assert_eq!(segments("a $1 b $2::int c"), vec!["a ", " b ", "::int c"]);
        assert_eq!(segments(FINALIZE).len(), 13);
        assert_eq!(segments(FINALIZE_SUCCESSES).len(), 10);
        assert_eq!(segments(CLAIM).len(), 10);
        assert_eq!(segments(LOCK_QUEUE).len(), 2);
        assert_eq!(segments(CLAIM_CONTROLLED).len(), 13);
        assert_eq!(segments(CLAIM_PARTITIONED).len(), 13);
        assert_eq!(segments(RENEW).len(), 8);
        assert_eq!(segments(ENQUEUE_BATCH).len(), 15);
        assert_eq!(segments(ENQUEUE_ONE).len(), 16);
    }
}
