//! The guard catalogue's mutations: each a safety guard of ARCHITECTURE.md §6 taken out on
//! purpose, to prove that the seeded fleet simulation (`tests/fleet_sim`) notices
//! (`.ci/guard-catalogue` runs it once per mutation). Only a `test-util` build reads
//! `JOBVISOR_MUTATION=<name>`, once per process; every other build compiles [`on`] to
//! `false` and the guards as written.
//!
//! A token guard is taken out by presenting, in place of the holder's token, the one the
//! row holds when the statement runs: the statement then applies to whatever lease holds
//! the job, as it would without the `lease_token = ?` condition, on every backend alike.

#[cfg(feature = "test-util")]
use diesel::prelude::*;
#[cfg(feature = "test-util")]
use diesel_async::RunQueryDsl;

#[cfg(feature = "test-util")]
use super::driver::with_conn;
#[cfg(feature = "test-util")]
use super::schema::jobvisor_jobs as jobs;
#[cfg(feature = "test-util")]
use super::{FinalizeParams, RenewParams, Store};
#[cfg(feature = "test-util")]
use crate::error::Result;
#[cfg(feature = "test-util")]
use crate::job::JobId;
#[cfg(feature = "test-util")]
use crate::lease::LeaseToken;

/// A guard taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Outside test builds the token guards' mutations are never named (their helpers are not
// compiled) and no name is read.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) enum Mutation {
    /// A finalization applies whatever lease holds the job (invariant 1).
    FinalizeToken,
    /// A renewal (and the progress it carries) applies whatever lease holds the job, and
    /// its holder takes it as renewed (invariant 1).
    RenewToken,
    /// A handler starts at or past its attempt's fence point (invariant 9).
    StartFence,
    /// A handler of a queue its node knows paused starts (invariant 10).
    StartPause,
    /// A handler of a rate-limited claim starts past the claim's start margin (invariant 10).
    StartRate,
    /// A schedule fires with no leader's term checked (invariants 10, 11).
    FireTerm,
    /// A sequence member waits for no member before it (§7.14: one at a time, in order).
    SequenceGate,
    /// A handler starts at or past its job's start-by deadline (§7.15).
    StartDeadline,
    /// A settle locks and releases a child whatever its state, not only while it waits
    /// (invariant 13: a child is released once).
    ReleaseOnce,
    /// A retry by hand pinned at a version (the dashboard's) applies to the job as it is
    /// now, whatever version it reached since (§6 invariant 1: writers without a lease are
    /// guarded by `version`).
    RetryVersion,
    /// A cancel pinned at a version applies to the job as it is now.
    CancelVersion,
    /// A delete pinned at a version applies to the finished job as it is now.
    DeleteVersion,
    /// A leader's take of the gauges' turn checks no term (invariant 11).
    GaugeTerm,
    /// A handler's transaction guards its commit with whatever lease holds the job, not its
    /// attempt's (invariant 12).
    TxToken,
}

#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
impl Mutation {
    /// Every mutation, in the catalogue's order.
    pub(crate) const ALL: [Mutation; 14] = [
        Mutation::FinalizeToken,
        Mutation::RenewToken,
        Mutation::StartFence,
        Mutation::StartPause,
        Mutation::StartRate,
        Mutation::FireTerm,
        Mutation::SequenceGate,
        Mutation::StartDeadline,
        Mutation::ReleaseOnce,
        Mutation::RetryVersion,
        Mutation::CancelVersion,
        Mutation::DeleteVersion,
        Mutation::GaugeTerm,
        Mutation::TxToken,
    ];

    /// Its name in `JOBVISOR_MUTATION`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mutation::FinalizeToken => "finalize-token",
            Mutation::RenewToken => "renew-token",
            Mutation::StartFence => "start-fence",
            Mutation::StartPause => "start-pause",
            Mutation::StartRate => "start-rate",
            Mutation::FireTerm => "fire-term",
            Mutation::SequenceGate => "sequence-gate",
            Mutation::StartDeadline => "start-deadline",
            Mutation::ReleaseOnce => "release-once",
            Mutation::RetryVersion => "retry-version",
            Mutation::CancelVersion => "cancel-version",
            Mutation::DeleteVersion => "delete-version",
            Mutation::GaugeTerm => "gauge-term",
            Mutation::TxToken => "tx-token",
        }
    }
}

/// Whether guard `m` is taken out in this process (`JOBVISOR_MUTATION`).
///
/// # Panics
/// If `JOBVISOR_MUTATION` names no mutation: a catalogue run must not pass by a typo.
#[cfg(feature = "test-util")]
pub(crate) fn on(m: Mutation) -> bool {
    static CHOSEN: std::sync::OnceLock<Option<Mutation>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let name = std::env::var("JOBVISOR_MUTATION").ok()?;
        let found = Mutation::ALL.into_iter().find(|m| m.name() == name);
        assert!(
            found.is_some(),
            "JOBVISOR_MUTATION={name:?}: expected one of {:?}",
            Mutation::ALL.map(Mutation::name)
        );
        found
    }) == Some(m)
}

/// Whether guard `m` is taken out: never, outside `test-util` builds.
#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) fn on(_: Mutation) -> bool {
    false
}

#[cfg(feature = "test-util")]
impl Store {
    /// `p` with each job's token replaced by the one its row holds now, if
    /// [`Mutation::FinalizeToken`] is on; else `p` as it is.
    pub(crate) async fn mutate_finalize(&self, mut p: FinalizeParams) -> Result<FinalizeParams> {
        if on(Mutation::FinalizeToken) {
            let ids: Vec<JobId> = p.items.iter().map(|f| f.id).collect();
            for (f, held) in p.items.iter_mut().zip(self.held_tokens(&ids).await?) {
                f.token = held.unwrap_or_else(|| f.token.clone());
            }
        }
        Ok(p)
    }

    /// `p` with each lease's token replaced by the one its row holds now, if
    /// [`Mutation::RenewToken`] is on; else `p` as it is.
    pub(crate) async fn mutate_renew(&self, mut p: RenewParams) -> Result<RenewParams> {
        if on(Mutation::RenewToken) {
            let ids: Vec<JobId> = p.leases.iter().map(|l| l.id).collect();
            for (l, held) in p.leases.iter_mut().zip(self.held_tokens(&ids).await?) {
                l.token = held.unwrap_or_else(|| l.token.clone());
            }
        }
        Ok(p)
    }

    /// The token a handler's transaction guards its commit with: the one job `id`'s row
    /// holds now if [`Mutation::TxToken`] is on (and it holds one), else `own`.
    pub(crate) async fn mutate_tx_token(&self, id: JobId, own: &LeaseToken) -> Result<LeaseToken> {
        if on(Mutation::TxToken) {
            if let Some(held) = self.held_tokens(&[id]).await?.pop().flatten() {
                return Ok(held);
            }
        }
        Ok(own.clone())
    }

    /// The token each job's row holds now (`None`: none, or no such job).
    async fn held_tokens(&self, ids: &[JobId]) -> Result<Vec<Option<LeaseToken>>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let token: Option<Option<String>> = with_conn!(self, |conn| {
                jobs::table
                    .filter(jobs::id.eq(id.0))
                    .select(jobs::lease_token)
                    .first(conn)
                    .await
                    .optional()?
            });
            out.push(token.flatten().and_then(|t| LeaseToken::parse(&t).ok()));
        }
        Ok(out)
    }
}
