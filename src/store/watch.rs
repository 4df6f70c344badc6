//! The dashboard's live stream's one read of jobs: the versions of the jobs its open pages
//! watch, in one statement by primary key, so a page showing a job learns within one poll
//! that it changed (finished, retried, reclaimed) — a change no database signal announces.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::driver::with_conn;
use super::schema::jobvisor_jobs as jobs;
use super::Store;
use crate::error::Result;

/// Most jobs one read looks up: 1,000.
pub(crate) const MAX_WATCHED: usize = 1_000;

impl Store {
    /// The version of each live job of `ids` (at most [`MAX_WATCHED`] are read); an id not
    /// answered is gone from the live table (archived or deleted).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database).
    pub(crate) async fn job_versions(&self, ids: &[i64]) -> Result<Vec<(i64, i64)>> {
        let ids = &ids[..ids.len().min(MAX_WATCHED)];
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, i64)> = with_conn!(self, |c| {
            jobs::table
                .select((jobs::id, jobs::version))
                .filter(jobs::id.eq_any(ids))
                .load(c)
                .await?
        });
        Ok(rows)
    }
}
