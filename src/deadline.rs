//! Start-by deadlines: [`NewJob::start_by`] names the instant after which no attempt of the
//! job starts (Sidekiq Enterprise's `expires_in`, Oban Pro's deadlines, Temporal's
//! schedule-to-start timeout): a notification an hour late is never sent. A job not started
//! by then ends `cancelled` with the error code [`EXPIRED`], by whichever comes first: the
//! start gate of a node that claimed it (which checks the time left the claim returned, on
//! the node's monotonic clock, as it checks the lease's fence point), or the sweeper, which
//! ends pending, retrying and waiting jobs past theirs.
//!
//! The design and its guarantees are in ARCHITECTURE.md (*Start-by deadlines*); the store's
//! side is `store/deadlines.rs`.

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::job::{NewJob, RunAt};

/// The error code of a job that ended `cancelled` because its start-by deadline passed
/// before an attempt started (its `last_error.code`).
pub const EXPIRED: &str = "expired";

impl NewJob {
    /// No attempt of this job starts at or after `deadline`: once it passes, the job ends
    /// `cancelled` with the error code [`EXPIRED`] instead of starting, first or again (a
    /// job waiting to retry is not retried after it). An attempt that started before it runs
    /// to its end. The deadline is compared with the database's clock; one already past at
    /// enqueue, or not after the job's `run_at`, is refused and nothing is stored.
    ///
    /// # Examples
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use jobvisor::NewJob;
    /// use serde_json::json;
    ///
    /// // A reminder that is useless after the meeting starts.
    /// let meeting = Utc.with_ymd_and_hms(2030, 5, 1, 9, 0, 0).unwrap();
    /// let job = NewJob::new("remind", json!({"meeting": 7})).start_by(meeting);
    /// assert_eq!(job.start_by, Some(meeting));
    /// ```
    pub fn start_by(mut self, deadline: DateTime<Utc>) -> Self {
        self.start_by = Some(deadline);
        self
    }
}

/// Checks what can be checked without a clock: a deadline not after an absolute `run_at`.
pub(crate) fn validate_start_by(job: &NewJob) -> Result<()> {
    if let (Some(deadline), RunAt::At(at)) = (job.start_by, job.run_at) {
        if deadline <= at {
            return Err(Error::invalid(
                "start_by",
                format!(
                    "{} is not after the job's run_at {}; expected a later deadline (the job \
                     could never start)",
                    deadline.to_rfc3339(),
                    at.to_rfc3339()
                ),
            ));
        }
    }
    Ok(())
}
