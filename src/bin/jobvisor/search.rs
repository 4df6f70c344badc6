//! Finding jobs by filters, page after page: the database's filters (queue, kind, state,
//! age, unique key) in the query, and the payload text search here, bounded by a window of
//! jobs looked at (`--scan`), so a search over millions of rows cannot run for ever.

use jobvisor::{Client, Job, JobId, ListParams};

use crate::Failure;

/// Jobs read per page.
pub(crate) const PAGE: u32 = 1000;

/// What a search found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) jobs: Vec<Job>,
    /// How many jobs the payload search looked at.
    pub(crate) scanned: usize,
    /// The search stopped at its window with jobs left to look at; go on after this id.
    pub(crate) window_ended_at: Option<JobId>,
}

/// Jobs matching `p` (from `p.after`, by ascending id, or descending with `newest_first`) whose payload's JSON text contains
/// `text`, at most `want` of them, looking at most at `window` jobs. Without `text`, the
/// first `want` jobs matching `p`.
pub(crate) async fn find(
    client: &Client,
    p: &ListParams,
    text: Option<&str>,
    window: usize,
    want: usize,
) -> Result<Found, Failure> {
    let mut found = Found::default();
    let mut after = p.after;
    loop {
        let page = client
            .list(ListParams {
                after,
                limit: PAGE,
                ..p.clone()
            })
            .await?;
        let full = page.len() == PAGE as usize;
        after = page.last().map(|j| j.id);
        for job in page {
            if found.jobs.len() == want {
                return Ok(found);
            }
            if let Some(text) = text {
                if found.scanned == window {
                    // The next page starts with this job.
                    let next = if p.newest_first { 1 } else { -1 };
                    found.window_ended_at = Some(JobId(job.id.0 + next));
                    return Ok(found);
                }
                found.scanned += 1;
                if !job.payload.to_string().contains(text) {
                    continue;
                }
            }
            found.jobs.push(job);
        }
        if !full {
            return Ok(found);
        }
    }
}
