//! Large batches on PostgreSQL through `COPY … FROM STDIN (FORMAT binary)`.
//!
//! `COPY` inserts rows many to a heap page and WAL record (`heap_multi_insert`), where an
//! `INSERT … SELECT` writes one at a time: measured on 20,000 jobs, ~85 ms of server time
//! against ~135 ms. It has no `ON CONFLICT` and no `RETURNING`, so it takes only batches of
//! at least [`COPY_MIN_JOBS`] jobs without unique keys (nothing can conflict), and the ids
//! are drawn from the table's sequence first, in the same transaction, in input order.
//!
//! diesel-async does not expose `COPY`, so the store keeps one extra connection for it,
//! opened at the first such batch (like the pool's: see [`PgConnector`]) and reopened if it
//! is lost. It is taken out of its slot while in use and put back only after a success, so a
//! batch abandoned half-way (its enqueue timed out) closes it.

use futures_util::pin_mut;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{Json, ToSql, Type};

use super::connect::PgConnector;
use super::sql::now_us;
use crate::error::{Error, Result, StoreError};
use crate::job::{JobId, NewJob, RunAt};
use crate::store::rows::{dur_ms, dur_us, to_us};
use crate::store::Enqueued;

/// The smallest batch written by `COPY` (three more round trips than one `INSERT`). At this
/// size `COPY` already matches the `INSERT` even when its connection is opened for the batch
/// (measured: 98,000–99,000 jobs/s for 999 and for 1,000 jobs); at 20,000 it is twice as fast.
pub(crate) const COPY_MIN_JOBS: usize = 1000;

/// Whether a batch goes through `COPY`.
pub(crate) fn eligible(batch: &[&NewJob]) -> bool {
    batch.len() >= COPY_MIN_JOBS && batch.iter().all(|j| j.unique_key.is_none())
}

/// The store's `COPY` connection, opened on first use.
#[derive(Default)]
pub(crate) struct CopyConn {
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
}

const IDS_AND_NOW: &str = concat!(
    "SELECT COALESCE($1::bigint, ",
    now_us!(),
    "),
       ARRAY(SELECT nextval('jobvisor_jobs_id_seq') FROM generate_series(1, $2::int))"
);

const COPY_JOBS: &str = "\
COPY jobvisor_jobs (id, queue, kind, state, priority, payload, max_attempts, run_at, timeout_ms,
                    created_at, updated_at, partition_key)
FROM STDIN (FORMAT binary)";

const COLUMN_TYPES: [Type; 12] = [
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT4,
    Type::JSON,
    Type::INT4,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
];

fn db_err(what: &str, e: &tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    let text = format!("{what}: {e}");
    let transient = e.is_closed()
        || e.code().is_some_and(|c| {
            *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        })
        || e.code().is_none();
    Error::Database(if transient {
        StoreError::Transient(text)
    } else {
        StoreError::Other(text)
    })
}

impl CopyConn {
    /// Inserts `batch` (see [`eligible`]) in one transaction; every job is new.
    pub(crate) async fn enqueue(
        &self,
        connector: &PgConnector,
        batch: &[&NewJob],
        now: Option<i64>,
    ) -> Result<Vec<Option<Enqueued>>> {
        let mut slot = self.client.lock().await;
        let mut client = match slot.take() {
            Some(c) if !c.is_closed() => c,
            _ => connector.client().await.map_err(|e| {
                Error::Database(StoreError::Transient(format!(
                    "opening the COPY connection: {e}"
                )))
            })?,
        };
        let res = copy_batch(&mut client, batch, now).await;
        // After a failure, whatever state it is in (mid-COPY, aborted transaction), it is
        // dropped and the next batch starts afresh.
        if res.is_ok() {
            *slot = Some(client);
        }
        res
    }
}

async fn copy_batch(
    client: &mut tokio_postgres::Client,
    batch: &[&NewJob],
    now: Option<i64>,
) -> Result<Vec<Option<Enqueued>>> {
    let n = i32::try_from(batch.len()).map_err(|_| {
        Error::invalid(
            "jobs",
            format!(
                "{} jobs in one batch; expected at most {}",
                batch.len(),
                i32::MAX
            ),
        )
    })?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| db_err("BEGIN", &e))?;
    // A large batch may take longer than the session's server-side statement bound; the
    // client's bound on the enqueue (which grows with the batch) covers it instead, and the
    // server's keepalives end the session if the client vanishes mid-COPY.
    tx.batch_execute("SET LOCAL statement_timeout = 0")
        .await
        .map_err(|e| db_err("SET LOCAL statement_timeout", &e))?;
    let row = tx
        .query_one(IDS_AND_NOW, &[&now, &n])
        .await
        .map_err(|e| db_err("drawing job ids", &e))?;
    let now: i64 = row.get(0);
    let ids: Vec<i64> = row.get(1);
    if ids.len() != batch.len() {
        return Err(Error::Database(StoreError::Other(format!(
            "drew {} ids for {} jobs",
            ids.len(),
            batch.len()
        ))));
    }
    let sink = tx
        .copy_in(COPY_JOBS)
        .await
        .map_err(|e| db_err("COPY", &e))?;
    let writer = BinaryCopyInWriter::new(sink, &COLUMN_TYPES);
    pin_mut!(writer);
    for (j, id) in batch.iter().zip(&ids) {
        let run_at = match j.run_at {
            RunAt::Now => now,
            RunAt::After(d) => now.saturating_add(dur_us(d)),
            RunAt::At(t) => to_us(t),
        };
        let priority = i32::from(j.priority);
        let max_attempts = i32::try_from(j.max_attempts).unwrap_or(i32::MAX);
        let timeout_ms = dur_ms(j.timeout);
        let row: [&(dyn ToSql + Sync); 12] = [
            id,
            &j.queue,
            &j.kind,
            &"pending",
            &priority,
            &Json(&j.payload),
            &max_attempts,
            &run_at,
            &timeout_ms,
            &now,
            &now,
            &j.partition,
        ];
        writer
            .as_mut()
            .write(&row)
            .await
            .map_err(|e| db_err("COPY", &e))?;
    }
    writer.finish().await.map_err(|e| db_err("COPY", &e))?;
    tx.commit().await.map_err(|e| db_err("COMMIT", &e))?;
    Ok(ids
        .into_iter()
        .map(|id| {
            Some(Enqueued {
                id: JobId(id),
                duplicate: false,
                replaced: false,
            })
        })
        .collect())
}
