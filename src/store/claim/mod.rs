//! The claim, the hot path's first step: [`Store::claim`], the one entry the fetcher calls.
//!
//! # The route of a claim
//! Each queue's claims take one of two routes ([`Route`]), remembered per queue in
//! [`Routes`] (`route.rs`):
//!
//! * [`Route::Fast`] — a queue with no settings row: the backend's one-statement claim
//!   ([`Driver::claim`](super::driver::Driver::claim), each backend's `mod.rs` + `sql.rs`),
//!   which also refuses any queue that has a row (`NOT EXISTS` in the statement), so a
//!   setting committed anywhere stops fast claims of its queue at once — whatever a node
//!   believes. A fast claim that comes back empty looks the row up (unless the node's queue
//!   watch read the settings without one since) and, finding one, takes the other route.
//! * [`Route::Controlled`] — a queue with a settings row (a pause, a limit):
//!   `controlled.rs`, the backend's own controlled claim where it takes the queue's settings
//!   ([`Driver::claim_controlled`](super::driver::Driver::claim_controlled)), else the
//!   portable one, as named steps (`steps.rs` for their statements, `partitions.rs` for the
//!   partition search under a per-partition limit). One that finds no row answers
//!   [`Route::Fast`] and the queue is claimed the fast way at once.
//!
//! Either way the answer is one [`Claimed`]: the rows become [`ClaimedJob`]s here (a row
//! that cannot be read is marked dead), in claim order, with the rate limit's wait and
//! start deadline for the fetcher.
//!
//! # Where each part lives
//! | part | file |
//! |---|---|
//! | the entry, the rows to jobs | `mod.rs` |
//! | each queue's route | `route.rs` |
//! | the controlled claim, its steps in order, the rate window | `controlled.rs` |
//! | the portable claim's statements | `steps.rs` |
//! | the partition search | `partitions.rs` (its scan text per backend: `ScanSql`, in each backend's `sql.rs`) |
//! | the arguments and the answer | `common/params.rs` (`ClaimParams`, `ClaimedJob`, `Claimed`, `Route`), `driver.rs` (`ClaimArgs`, the contract) |

mod controlled;
mod partitions;
mod route;
mod steps;

pub(crate) use route::Routes;

use super::columns::bound;
use super::params::ClaimArgs;
use super::params::{Claimed, Route};
use super::retry::retry_rolled_back;
use super::rows::{dur_us, ClaimRow};
use super::timeout::Op;
use super::{ClaimParams, ClaimedJob, FinalizeParams, Store};
use crate::error::Result;
use crate::job::{JobFailure, JobId};
use crate::lease::LeaseToken;

impl Store {
    /// Claims up to `limit` due jobs of a queue, in (priority, run_at, id) order, each with a
    /// new lease (one fresh token for this claim), attempts + 1 and version + 1; with what
    /// the fetcher needs besides the jobs: how long the queue's rate limit holds claims back
    /// when it took nothing for that reason (the fetcher sleeps that long), whether the
    /// queue's settings controlled the claim, and by when a rate-limited job must start.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database); [`Error::Corrupt`](crate::Error::Corrupt)
    /// if a claimed row cannot be read (the claim itself stands, and the sweeper reclaims it
    /// when its lease expires).
    pub(crate) async fn claim(&self, p: ClaimParams) -> Result<Claimed> {
        self.bounded_owned(
            Op::Claim,
            p,
            |s, p| async move { s.claim_unbounded(p).await },
        )
        .await
    }

    /// [`Store::claim`], the jobs only.
    ///
    /// # Errors
    /// As [`Store::claim`].
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))] // tests: crate::testing
    pub(crate) async fn job_claim(&self, p: ClaimParams) -> Result<Vec<ClaimedJob>> {
        Ok(self.claim(p).await?.jobs)
    }

    async fn claim_unbounded(&self, p: ClaimParams) -> Result<Claimed> {
        if p.limit == 0 {
            return Ok(Claimed::none(Route::Fast));
        }
        let token = LeaseToken::generate();
        let args = ClaimArgs {
            queue: p.queue.clone(),
            owner: p.owner.as_str().to_string(),
            token: token.as_str().to_string(),
            lease_us: dur_us(p.lease),
            limit: i64::from(p.limit),
            kinds: p.kinds.clone(),
            now: bound(p.now),
        };
        // A claim the server rolled back (a Galera certification conflict with another
        // member's claim of the same row) claimed nothing: claim again.
        let rows = retry_rolled_back(|| self.claim_rows(&args)).await?;
        self.finish(rows, &token, p.now).await
    }

    /// The claim by the queue's route (see the module doc), as the backend returned it.
    async fn claim_rows(&self, a: &ClaimArgs) -> Result<Claimed<ClaimRow>> {
        let routes = &self.inner.routes;
        let mut route = routes.of(&a.queue);
        if route == Route::Fast {
            let rows = self.inner.driver.claim(a).await?;
            // An empty claim may mean "controlled now" — unless the node's queue watch read
            // the settings without a row since (it wakes the fetcher when one appears).
            if !rows.is_empty()
                || routes.read_without_row(&a.queue)
                || !self.queue_has_row(&a.queue).await?
            {
                return Ok(Claimed::of(Route::Fast, rows));
            }
            routes.set(&a.queue, Route::Controlled);
            route = Route::Controlled;
        }
        debug_assert_eq!(route, Route::Controlled);
        let got = self.claim_controlled(a).await?;
        if got.route == Route::Fast {
            routes.set(&a.queue, Route::Fast);
            return Ok(Claimed::of(Route::Fast, self.inner.driver.claim(a).await?));
        }
        Ok(got)
    }

    /// The claimed rows as jobs, in claim order; a row jobvisor cannot read is marked dead.
    async fn finish(
        &self,
        got: Claimed<ClaimRow>,
        token: &LeaseToken,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Claimed> {
        let mut claimed = Vec::with_capacity(got.jobs.len());
        let mut corrupt = Vec::new();
        for r in got.jobs {
            let (id, attempts) = (r.id, r.attempts);
            match r.into_claimed(token.clone()) {
                Ok(job) => claimed.push(job),
                // A row jobvisor cannot read (written by something else): it can never run, so
                // it is dead at once, with the reason; the rest of the batch goes on.
                Err(e) => corrupt.push(super::Finalize::dead(
                    JobId(id),
                    token.clone(),
                    JobFailure::new(
                        "corrupt",
                        format!("the stored job cannot be read: {e}"),
                        u32::try_from(attempts).unwrap_or(0),
                    ),
                )),
            }
        }
        if !corrupt.is_empty() {
            tracing::error!(
                jobs = corrupt.len(),
                "claimed unreadable jobs; marking them dead"
            );
            self.job_finalize_many(FinalizeParams {
                items: corrupt,
                now,
            })
            .await?;
        }
        // RETURNING order is unspecified: restore the claim order.
        claimed.sort_by_key(|c| (c.priority, c.run_at, c.id));
        Ok(Claimed {
            jobs: claimed,
            route: got.route,
            wait: got.wait,
            rated: got.rated,
        })
    }
}
