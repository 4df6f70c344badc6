//! The audit log: one row of `jobvisor_audit` per operator action — every dashboard action and
//! every bulk action of the `jobvisor` command — saying who did what to which jobs, how many
//! it changed, when (the database's clock) and what came of it. This file owns the public
//! [`AuditEntry`] / [`AuditAction`] types, the write, the newest-first read and the prune,
//! which the archiver runs with the archive's retention.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::columns::bound;
use super::driver::{with_conn, with_write};
use super::expr::DbNow;
use super::rows::{dur_us, from_us};
use super::schema::jobvisor_audit as audit;
use super::Store;
use crate::error::Result;

/// Longest `who` kept, in characters (longer is cut): 255.
const MAX_WHO: usize = 255;
/// Longest `action` kept, in characters: 64.
const MAX_ACTION: usize = 64;
/// Longest `target` and `outcome` kept, in characters: 2,000.
const MAX_TEXT: usize = 2_000;

/// One operator action, as recorded in the audit log ([`Client::audit`](crate::Client::audit)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditEntry {
    /// The entry's id: larger is newer; the cursor of the next page.
    pub id: i64,
    /// When it was recorded (the database's clock).
    pub at: DateTime<Utc>,
    /// Who acted: the dashboard login or the application's identity, the command and its
    /// user.
    pub who: String,
    /// What was done: `job.retry`, `bulk.cancel`, `queue.pause`, …
    pub action: String,
    /// What it was done to: a job id, a queue, a schedule, a bulk action's filter.
    pub target: String,
    /// How many jobs it changed.
    pub jobs: u64,
    /// What happened, in words (or why it was refused).
    pub outcome: String,
    /// Whether it was carried out.
    pub ok: bool,
}

/// An action to record in the audit log ([`Client::record_action`](crate::Client::record_action)).
/// Texts longer than the columns hold are cut (who 255 characters, action 64, target and
/// outcome 2,000).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditAction {
    /// Who acted.
    pub who: String,
    /// What was done (`job.retry`, `bulk.cancel`, …).
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// How many jobs it changed (default 0).
    pub jobs: u64,
    /// What happened, in words (default empty).
    pub outcome: String,
    /// Whether it was carried out (default `true`).
    pub ok: bool,
}

impl AuditAction {
    /// `who` did `action` to `target`; carried out, no job changed, until said otherwise.
    pub fn new(
        who: impl Into<String>,
        action: impl Into<String>,
        target: impl Into<String>,
    ) -> Self {
        AuditAction {
            who: who.into(),
            action: action.into(),
            target: target.into(),
            jobs: 0,
            outcome: String::new(),
            ok: true,
        }
    }

    /// How many jobs it changed.
    pub fn jobs(mut self, n: u64) -> Self {
        self.jobs = n;
        self
    }

    /// What happened, and whether it was carried out.
    pub fn outcome(mut self, text: impl Into<String>, ok: bool) -> Self {
        self.outcome = text.into();
        self.ok = ok;
        self
    }
}

/// `s` cut to at most `max` characters.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

type AuditRow = (i64, i64, String, String, String, i64, String, bool);

impl Store {
    /// Records `a` in the audit log, at the database's "now".
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn audit_record(&self, a: &AuditAction) -> Result<()> {
        let row = (
            audit::at.eq(DbNow::new(None)),
            audit::who.eq(cut(&a.who, MAX_WHO)),
            audit::action.eq(cut(&a.action, MAX_ACTION)),
            audit::target.eq(cut(&a.target, MAX_TEXT)),
            audit::jobs.eq(i64::try_from(a.jobs).unwrap_or(i64::MAX)),
            audit::outcome.eq(cut(&a.outcome, MAX_TEXT)),
            audit::ok.eq(a.ok),
        );
        with_write!(self, |c| {
            diesel::insert_into(audit::table)
                .values(row)
                .execute(c)
                .await?
        });
        Ok(())
    }

    /// At most `limit` entries, newest first, older than entry `before` if given (the last
    /// id of the previous page).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn audit_page(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>> {
        let before = before.unwrap_or(i64::MAX);
        let rows: Vec<AuditRow> = with_conn!(self, |c| {
            audit::table
                .select((
                    audit::id,
                    audit::at,
                    audit::who,
                    audit::action,
                    audit::target,
                    audit::jobs,
                    audit::outcome,
                    audit::ok,
                ))
                .filter(audit::id.lt(before))
                .order(audit::id.desc())
                .limit(limit)
                .load(c)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(
                |(id, at, who, action, target, jobs, outcome, ok)| AuditEntry {
                    id,
                    at: from_us(at),
                    who,
                    action,
                    target,
                    jobs: u64::try_from(jobs).unwrap_or(0),
                    outcome,
                    ok,
                },
            )
            .collect())
    }

    /// Deletes entries recorded more than `older_than` ago, at most `limit` (the archive's
    /// retention, run by the archiver with its prune). Returns how many.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn audit_prune(
        &self,
        older_than: std::time::Duration,
        limit: u32,
        now: Option<DateTime<Utc>>,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let cutoff = DbNow::new(bound(now)).plus(-dur_us(older_than));
        let limit = i64::from(limit);
        let n: usize = with_write!(self, |c| {
            let ids: Vec<i64> = audit::table
                .select(audit::id)
                .filter(audit::at.lt(cutoff))
                .order(audit::at.asc())
                .limit(limit)
                .load(c)
                .await?;
            if ids.is_empty() {
                0
            } else {
                diesel::delete(audit::table.filter(audit::id.eq_any(&ids)))
                    .execute(c)
                    .await?
            }
        });
        Ok(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("ééé", 2), "éé");
        assert_eq!(cut(&"x".repeat(300), MAX_WHO).len(), MAX_WHO);
    }
}
