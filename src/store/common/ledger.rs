//! The execution ledger's rows (`jobvisor_claims`) as the store writes and reads them: one
//! row per ended claim, written by the statement or transaction that ends it, below the
//! backends so each backend's finalize can build its rows.
//!
//! Every row is written only where the claim's own end was applied — the guarded update of
//! the job row matched the claim's lease token — so a late answer from an older claim writes
//! no row, and a claim's row, keyed `(job_id, claim_id)`, is written once. What the row
//! records of the claim comes from the job row as the claim left it: `lease_owner` (the
//! node), `attempts`, `updated_at` (the claim's instant: nothing else writes a running job's
//! `updated_at`, a renewal and a cancel request included), `started_at`.
//!
//! The drain's hot path writes no ledger row: every finalize keeps the claim it ends on the
//! job row (`last_node`, `last_claim`, `last_claimed_at`, from the row's own columns), and a
//! success needs nothing more — its attempt, start and end are the row's, and the job's
//! archiving writes its ledger row as the job leaves the live table. Only the ends that are
//! not successes get a row at once: PostgreSQL's finalize statement writes them itself (a
//! data-modifying `WITH` fed by the update's `RETURNING`, `postgres/sql.rs`); MySQL and
//! SQLite read the held rows of those ends in the finalize's transaction and insert their
//! rows in one statement after its update (SQLite: as one JSON bind). A success's fence
//! margin is not kept (it ended before its fence point, or it would have been fenced).

use diesel::prelude::*;
use diesel::Insertable;

use super::params::{Finalization, Finalize};
use super::schema::jobvisor_claims;
use crate::claim::{Claim, ClaimOutcome};
use crate::job::JobId;
use crate::lease::{ClaimId, NodeId};

/// One ledger row to insert.
#[derive(Debug, Clone, Insertable)]
#[diesel(table_name = jobvisor_claims)]
pub(crate) struct LedgerRow {
    pub(crate) job_id: i64,
    pub(crate) claim_id: String,
    pub(crate) attempt: i32,
    pub(crate) node: String,
    pub(crate) claimed_at: i64,
    pub(crate) started_at: Option<i64>,
    pub(crate) ended_at: i64,
    pub(crate) outcome: &'static str,
    pub(crate) code: Option<String>,
    pub(crate) fence_margin_ms: Option<i64>,
}

/// What the job row held for a claim when its end was written (read in the ending
/// transaction, under the row's lock).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// `lease_owner`.
    pub(crate) node: String,
    /// `attempts`, before a requeue gives the attempt back.
    pub(crate) attempt: i32,
    /// `updated_at`: the claim's instant.
    pub(crate) claimed_at: i64,
    /// `started_at` as stored (the finalization may record it: see [`LedgerRow::ended`]).
    pub(crate) started_at: Option<i64>,
    /// The statement's "now".
    pub(crate) now: i64,
}

/// A finalization as the ledger needs it, owned (SQLite builds the rows on the
/// connection's thread).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    pub(crate) id: i64,
    pub(crate) claim: String,
    pub(crate) outcome: &'static str,
    pub(crate) code: Option<String>,
    pub(crate) fence_margin_ms: Option<i64>,
    /// Microseconds since the handler started, for a start not recorded yet.
    pub(crate) ago_us: Option<i64>,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl Ending {
    /// The ending of `f`.
    pub(crate) fn of(f: &Finalize) -> Self {
        let (outcome, code) = ending(f);
        Ending {
            id: f.id.0,
            claim: f.token.claim().to_string(),
            outcome,
            code,
            fence_margin_ms: f.fence_margin_ms,
            ago_us: f.started_ago.map(super::rows::dur_us),
        }
    }
}

impl LedgerRow {
    /// The row of an ending applied to a job that was `held`, reaching `state`.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    pub(crate) fn ended(e: Ending, held: Held, state: &str) -> Self {
        LedgerRow {
            job_id: e.id,
            claim_id: e.claim,
            attempt: held.attempt,
            node: held.node,
            claimed_at: held.claimed_at,
            started_at: held
                .started_at
                .or_else(|| e.ago_us.map(|ago| held.now.saturating_sub(ago))),
            ended_at: held.now,
            outcome: settled(e.outcome, state),
            code: e.code,
            fence_margin_ms: e.fence_margin_ms,
        }
    }
}

/// A finalization's outcome as the ledger names it, before the store knows whether a retry
/// used up the job's attempts ([`settled`]), and its error code.
pub(crate) fn ending(f: &Finalize) -> (&'static str, Option<String>) {
    let by_code = |code: &str, otherwise: ClaimOutcome| match code {
        "timeout" => ClaimOutcome::TimedOut,
        "fenced" => ClaimOutcome::Fenced,
        _ => otherwise,
    };
    let (outcome, code) = match &f.outcome {
        Finalization::Succeeded { .. } => (ClaimOutcome::Succeeded, None),
        Finalization::Retry { error, .. } => (
            by_code(&error.code, ClaimOutcome::Retried),
            Some(error.code.clone()),
        ),
        Finalization::Dead { error } => (
            by_code(&error.code, ClaimOutcome::Failed),
            Some(error.code.clone()),
        ),
        Finalization::Cancelled { error } => (ClaimOutcome::Cancelled, Some(error.code.clone())),
        Finalization::Requeue { delay } if delay.is_zero() => (ClaimOutcome::GivenBack, None),
        Finalization::Requeue { .. } => (ClaimOutcome::Snoozed, None),
    };
    (outcome.as_str(), code)
}

/// The outcome of an ending that reached `state`: a retry that used up the job's attempts
/// (the job is `dead`) failed.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn settled(outcome: &'static str, state: &str) -> &'static str {
    if outcome == ClaimOutcome::Retried.as_str() && state == "dead" {
        ClaimOutcome::Failed.as_str()
    } else {
        outcome
    }
}

/// One stored ledger row, as read.
#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = jobvisor_claims)]
pub(crate) struct StoredClaim {
    pub(crate) job_id: i64,
    pub(crate) claim_id: String,
    pub(crate) attempt: i32,
    pub(crate) node: String,
    pub(crate) claimed_at: i64,
    pub(crate) started_at: Option<i64>,
    pub(crate) ended_at: i64,
    pub(crate) outcome: String,
    pub(crate) code: Option<String>,
    pub(crate) fence_margin_ms: Option<i64>,
}

impl StoredClaim {
    /// The public record; an unreadable claim id reads as all zeros, an outcome this build
    /// does not know as `lost`.
    pub(crate) fn into_claim(self) -> Claim {
        let from_us = super::rows::from_us;
        Claim {
            claim: self.claim_id.parse().unwrap_or(ClaimId::NONE),
            job: JobId(self.job_id),
            attempt: u32::try_from(self.attempt).unwrap_or(0),
            node: NodeId::from_stored(self.node),
            claimed_at: from_us(self.claimed_at),
            started_at: self.started_at.map(from_us),
            ended_at: Some(from_us(self.ended_at)),
            outcome: ClaimOutcome::parse(&self.outcome).unwrap_or(ClaimOutcome::Lost),
            code: self.code,
            fence_margin_ms: self.fence_margin_ms,
        }
    }
}
