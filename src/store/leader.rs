//! The leader of a database (`jobvisor_leader`, one row): which node does the work that should
//! happen once per database rather than once per node, under a lease with a **term**.
//!
//! * **Keep**: the leader renews with one guarded `UPDATE` — its own name, its term, a lease
//!   not yet expired. A leader whose lease lapsed cannot renew it: it must win an election
//!   like anyone else, under a new term.
//! * **Take**: any node takes the row once its lease has expired (or nobody holds it) with one
//!   guarded `UPDATE` that raises the term. Of nodes trying at once the row lock lets one
//!   through; the others re-evaluate the guard on the committed row and change nothing
//!   (PostgreSQL and InnoDB re-check an `UPDATE`'s condition on the newest version; SQLite has
//!   one writer).
//! * **Fence**: leader-only work names its term; [`LeaderFence`] is the condition a
//!   leader-only statement carries, true only while that term holds an unexpired lease. A
//!   deposed leader that wakes up late — its lease expired, a new term begun — has its writes
//!   refused, however sure it still is of itself.
//! * **Resign**: at graceful shutdown the leader gives the row up (its lease ends now), so
//!   another node takes over at its next attempt instead of a whole lease later.
//!
//! Times are the database's clock (or a bound test clock), so node clocks never matter.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::driver::{with_conn, with_tx, with_write};
use super::expr::DbNow;
use super::params::ElectParams;
use super::rows::{dur_us, from_us};
use super::schema::jobvisor_leader as leader;
use super::timeout::Op;
use super::Store;
use crate::error::Result;
use crate::lease::NodeId;

/// Who leads the database, as stored (see [`Client::leader`](crate::Client::leader)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leading node.
    pub node: NodeId,
    /// Its term: raised by every election, so each leadership has a number of its own.
    pub term: u64,
    /// When this term began.
    pub elected_at: DateTime<Utc>,
    /// When its lease ends unless renewed; past it, any node may take over.
    pub expires_at: DateTime<Utc>,
}

/// What a node holds after [`Store::leader_keep_or_take`]: its term and the lease's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leadership {
    pub(crate) term: i64,
    /// Whether this call began the term (an election) rather than renewing it.
    pub(crate) elected: bool,
    pub(crate) expires_at: i64,
}

/// The condition of a leader-only statement: the row is held by `node` under `term` with an
/// unexpired lease, at the statement's own "now" (see the module docs). A filter on the
/// leader table; other tables use it through `EXISTS`.
macro_rules! leader_fence {
    ($node:expr, $term:expr, $now:expr) => {
        $crate::store::schema::jobvisor_leader::table
            .filter($crate::store::schema::jobvisor_leader::id.eq(1))
            .filter($crate::store::schema::jobvisor_leader::holder.eq($node))
            .filter($crate::store::schema::jobvisor_leader::term.eq($term))
            .filter($crate::store::schema::jobvisor_leader::expires_at.gt($now))
    };
}
pub(crate) use leader_fence;

impl Store {
    /// Renews `node`'s leadership if it holds term `held` with an unexpired lease, else takes
    /// the row if its lease has expired. `Some`: `node` leads after the call (under the
    /// returned term, until `expires_at`); `None`: another node does. `now`: a test clock, or
    /// `None` for the database's.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn leader_keep_or_take(
        &self,
        node: &NodeId,
        held: Option<i64>,
        lease: Duration,
        now: Option<DateTime<Utc>>,
    ) -> Result<Option<Leadership>> {
        let p = ElectParams {
            node: node.as_str().to_string(),
            held,
            lease,
            now,
        };
        self.faulted_owned(
            Op::Elect,
            p,
            |s, p| async move { s.elect_unbounded(p).await },
        )
        .await
    }

    /// [`leader_keep_or_take`](Self::leader_keep_or_take)'s transaction.
    async fn elect_unbounded(&self, p: ElectParams) -> Result<Option<Leadership>> {
        let now = DbNow::new(bound(p.now));
        let until = now.plus(dur_us(p.lease));
        let (node, held) = (p.node, p.held);
        let out: Option<Leadership> = with_tx!(self, |conn| {
            let mut elected = false;
            let mut n = 0;
            if let Some(term) = held {
                n = diesel::update(leader_fence!(&node, term, now))
                    .set(leader::expires_at.eq(until))
                    .execute(conn)
                    .await?;
            }
            if n == 0 {
                n = diesel::update(
                    leader::table
                        .filter(leader::id.eq(1))
                        .filter(leader::expires_at.le(now)),
                )
                .set((
                    leader::holder.eq(&node),
                    leader::term.eq(leader::term + 1),
                    leader::expires_at.eq(until),
                    leader::elected_at.eq(now),
                ))
                .execute(conn)
                .await?;
                elected = n == 1;
            }
            if n == 0 {
                return diesel::QueryResult::Ok(None);
            }
            let (term, expires_at): (i64, i64) = leader::table
                .filter(leader::id.eq(1))
                .select((leader::term, leader::expires_at))
                .first(conn)
                .await?;
            Ok(Some(Leadership {
                term,
                elected,
                expires_at,
            }))
        })?;
        Ok(out)
    }

    /// Gives up `node`'s term `term` now (graceful shutdown): its lease ends, so the next node
    /// to try takes over at once. `false`: the term was already over.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn leader_resign(
        &self,
        node: &NodeId,
        term: i64,
        now: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let now = DbNow::new(bound(now));
        let node = node.as_str().to_string();
        let n: usize = with_write!(self, |conn| {
            diesel::update(leader_fence!(&node, term, now))
                .set(leader::expires_at.eq(now))
                .execute(conn)
                .await?
        });
        Ok(n == 1)
    }

    /// The current leader, if a node holds an unexpired lease (by the database's clock, or
    /// `now`).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn leader_current(
        &self,
        now: Option<DateTime<Utc>>,
    ) -> Result<Option<Leader>> {
        let now = DbNow::new(bound(now));
        let row: Option<(Option<String>, i64, i64, i64)> = with_conn!(self, |conn| {
            leader::table
                .filter(leader::id.eq(1))
                .filter(leader::expires_at.gt(now))
                .select((
                    leader::holder,
                    leader::term,
                    leader::elected_at,
                    leader::expires_at,
                ))
                .first(conn)
                .await
                .optional()?
        });
        let Some((Some(holder), term, elected_at, expires_at)) = row else {
            return Ok(None);
        };
        Ok(Some(Leader {
            node: NodeId::from_stored(holder),
            term: u64::try_from(term).unwrap_or(0),
            elected_at: from_us(elected_at),
            expires_at: from_us(expires_at),
        }))
    }
}
