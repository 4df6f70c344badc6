//! The execution ledger's public record: [`Claim`], one claim of a job by one node — who ran
//! it, when it was claimed, started and ended, and how it ended ([`ClaimOutcome`]) — as
//! [`Client::claims`](crate::Client::claims) returns them.
//!
//! The store writes a claim's row with the transition that ends it (ARCHITECTURE.md §3,
//! `jobvisor_claims`); a claim still running is read from its job's row. The row is guarded
//! by the claim's lease token like the job row, so an answer from an older claim never
//! edits a newer one's.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::job::JobId;
use crate::lease::{ClaimId, NodeId};

/// One claim of a job: the node that held it, its attempt, when it was claimed, when its
/// handler started (`None`: never, or not recorded before the claim ended) and when it
/// ended (`None`: still running), and how it ended.
///
/// Serializable (instants as RFC 3339 text):
///
/// ```no_run
/// # async fn demo(client: jobvisor::Client, id: jobvisor::JobId) -> jobvisor::Result<()> {
/// for c in client.claims(id).await? {
///     println!(
///         "claim {} attempt {} on {}: {} ({:?})",
///         c.claim, c.attempt, c.node, c.outcome, c.duration()
///     );
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Claim {
    /// The claim's id (the public part of its lease token).
    pub claim: ClaimId,
    /// The job.
    pub job: JobId,
    /// The job's attempt number of this claim (a given-back claim's attempt is reused by
    /// the next).
    pub attempt: u32,
    /// The node that held it.
    pub node: NodeId,
    /// When the claim was made (the database's clock).
    pub claimed_at: DateTime<Utc>,
    /// When its handler started, as recorded; `None`: it never started, or its start was
    /// not recorded before the claim was lost.
    pub started_at: Option<DateTime<Utc>>,
    /// When the claim ended; `None` while it runs.
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: ClaimOutcome,
    /// The error code of an ending that has one (`panic`, `timeout`, `lease_expired`, …).
    pub code: Option<String>,
    /// How long before the claim's fence point its holder ended it, in milliseconds, where
    /// known (negative: after it; a claim its node lost has none).
    pub fence_margin_ms: Option<i64>,
}

impl Claim {
    /// How long the claim ran: from the handler's start (or the claim, if it never started)
    /// to its end; `None` while it runs.
    pub fn duration(&self) -> Option<Duration> {
        let from = self.started_at.unwrap_or(self.claimed_at);
        let to = self.ended_at?;
        (to - from).to_std().ok()
    }
}

/// How a claim ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// Still running: its node holds the lease.
    Running,
    /// The handler succeeded.
    Succeeded,
    /// The handler failed; the job will run again.
    Retried,
    /// The handler failed permanently, or with its attempts used up (the job is dead).
    Failed,
    /// The attempt ran past its timeout (stopped by its node, or reclaimed by the sweeper).
    TimedOut,
    /// Its node could not renew the lease in time and stopped the handler.
    Fenced,
    /// Cancelled on request while it ran.
    Cancelled,
    /// Handed back unstarted or at shutdown: the attempt was not counted.
    GivenBack,
    /// The handler snoozed: the job runs again later, the attempt not counted.
    Snoozed,
    /// Its node stopped renewing the lease (crashed, paused or cut off) and the sweeper
    /// reclaimed the job.
    Lost,
}

impl ClaimOutcome {
    /// The stored form (`succeeded`, `timed_out`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimOutcome::Running => "running",
            ClaimOutcome::Succeeded => "succeeded",
            ClaimOutcome::Retried => "retried",
            ClaimOutcome::Failed => "failed",
            ClaimOutcome::TimedOut => "timed_out",
            ClaimOutcome::Fenced => "fenced",
            ClaimOutcome::Cancelled => "cancelled",
            ClaimOutcome::GivenBack => "given_back",
            ClaimOutcome::Snoozed => "snoozed",
            ClaimOutcome::Lost => "lost",
        }
    }

    /// The outcome of a stored form; `None` for one this build does not know.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        [
            ClaimOutcome::Running,
            ClaimOutcome::Succeeded,
            ClaimOutcome::Retried,
            ClaimOutcome::Failed,
            ClaimOutcome::TimedOut,
            ClaimOutcome::Fenced,
            ClaimOutcome::Cancelled,
            ClaimOutcome::GivenBack,
            ClaimOutcome::Snoozed,
            ClaimOutcome::Lost,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

impl fmt::Display for ClaimOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_their_stored_form() {
        for o in [
            ClaimOutcome::Running,
            ClaimOutcome::TimedOut,
            ClaimOutcome::GivenBack,
            ClaimOutcome::Lost,
        ] {
            assert_eq!(ClaimOutcome::parse(o.as_str()), Some(o));
            assert_eq!(
                serde_json::to_value(o).unwrap(),
                serde_json::json!(o.as_str())
            );
        }
        assert_eq!(ClaimOutcome::parse("exploded"), None);
    }
}
