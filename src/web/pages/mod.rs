//! One file per view; here what several share: the job filter (parsed and validated from
//! the query string), the bounded search behind the jobs list and the bulk actions, and the
//! job table.

pub(crate) mod audit;
pub(crate) mod batch;
pub(crate) mod dead;
pub(crate) mod history;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod nodes;
pub(crate) mod overview;
pub(crate) mod queues;
pub(crate) mod schedules;

use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{html, Markup};
use serde::Deserialize;

use super::layout::{age, ts};
use super::State;
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::store::{Browse, ListParams};

/// Rows per page of the jobs list.
pub(crate) const PAGE: u32 = 50;

/// The jobs filter as it arrives in a query string or a form (every field text: a bad value
/// is refused with a message naming it, never a framework error).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct FilterForm {
    #[serde(default)]
    pub(crate) queue: String,
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) state: String,
    /// Created at or after (`YYYY-MM-DDTHH:MM[:SS]`, UTC, or RFC 3339).
    #[serde(default)]
    pub(crate) from: String,
    /// Created before.
    #[serde(default)]
    pub(crate) to: String,
    /// A job id.
    #[serde(default)]
    pub(crate) id: String,
    /// A unique key.
    #[serde(default)]
    pub(crate) key: String,
    /// Text in the payload's JSON.
    #[serde(default)]
    pub(crate) text: String,
    /// `oldest` for ascending ids, `run_at_desc` / `run_at_asc` for the run time; newest
    /// (descending ids) otherwise.
    #[serde(default)]
    pub(crate) order: String,
    /// `1`: the archive.
    #[serde(default)]
    pub(crate) archived: String,
    /// Keyset paging: ids past this one (`<run_at µs>.<id>` in a run-time order).
    #[serde(default)]
    pub(crate) after: String,
    /// The far edge (an id) of the window a run-time order sorts, kept from page to page.
    #[serde(default)]
    pub(crate) win: String,
}

/// A validated filter.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    pub(crate) params: ListParams,
    pub(crate) id: Option<JobId>,
    pub(crate) text: Option<String>,
    /// The order and keyset of a run-time order (`params.after` is unused then).
    pub(crate) browse: Browse,
    /// A run-time order's window edge from an earlier page.
    pub(crate) win: Option<i64>,
}

fn time(field: &'static str, v: &str) -> Result<Option<DateTime<Utc>>> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    for f in [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(v, f) {
            return Ok(Some(t.and_utc()));
        }
    }
    Err(Error::invalid(
        field,
        format!("{v:?} is not a time; expected YYYY-MM-DDTHH:MM (UTC) or RFC 3339"),
    ))
}

fn text(v: &str) -> Option<String> {
    let v = v.trim();
    (!v.is_empty()).then(|| v.to_string())
}

impl FilterForm {
    /// Validates the filter.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bad field and what was expected.
    pub(crate) fn parse(&self) -> Result<Filter> {
        let state = match self.state.trim() {
            "" => None,
            s => Some(s.parse::<JobState>().map_err(|_| {
                Error::invalid(
                    "state",
                    format!(
                        "{s:?} is not a state; expected one of pending, running, retrying, \
                         succeeded, dead, cancelled"
                    ),
                )
            })?),
        };
        let id_of = |field: &'static str, v: &str| -> Result<Option<JobId>> {
            match v.trim() {
                "" => Ok(None),
                s => s.parse::<i64>().map(|n| Some(JobId(n))).map_err(|_| {
                    Error::invalid(
                        field,
                        format!("{s:?} is not a job id; expected a whole number"),
                    )
                }),
            }
        };
        let (newest_first, by_run_at) = match self.order.trim() {
            "" | "newest" => (true, false),
            "oldest" => (false, false),
            "run_at_desc" => (true, true),
            "run_at_asc" => (false, true),
            o => {
                return Err(Error::invalid(
                    "order",
                    format!(
                        "{o:?} is not an order; expected newest, oldest, run_at_desc or \
                         run_at_asc"
                    ),
                ))
            }
        };
        let (after, run_at_after) = match (by_run_at, self.after.trim()) {
            (_, "") => (None, None),
            (false, a) => (id_of("after", a)?, None),
            (true, a) => {
                let pair = a
                    .split_once('.')
                    .and_then(|(r, i)| Some((r.parse::<i64>().ok()?, i.parse::<i64>().ok()?)));
                match pair {
                    Some(p) => (None, Some(p)),
                    None => {
                        return Err(Error::invalid(
                            "after",
                            format!(
                                "{a:?} is not a position in run-time order; expected \
                                 <run_at µs>.<id>"
                            ),
                        ))
                    }
                }
            }
        };
        let win = id_of("win", &self.win)?.map(|j| j.0);
        let archived = match self.archived.trim() {
            "" | "0" => false,
            "1" => true,
            a => {
                return Err(Error::invalid(
                    "archived",
                    format!("{a:?}: expected 1 or nothing"),
                ))
            }
        };
        let created_after = time("from", &self.from)?;
        let created_before = time("to", &self.to)?;
        if let (Some(a), Some(b)) = (created_after, created_before) {
            if a >= b {
                return Err(Error::invalid(
                    "to",
                    "the end of the time range is before its start",
                ));
            }
        }
        Ok(Filter {
            params: ListParams {
                queue: text(&self.queue),
                kind: text(&self.kind),
                state,
                after,
                newest_first,
                limit: PAGE,
                archived,
                created_after,
                created_before,
                unique_key: text(&self.key),
            },
            id: id_of("id", &self.id)?,
            text: text(&self.text),
            browse: Browse {
                by_run_at,
                run_at_after,
                ..Browse::default()
            },
            win,
        })
    }

    /// The filter's fields as query pairs (without `after`).
    pub(crate) fn pairs(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("queue", self.queue.trim()),
            ("kind", self.kind.trim()),
            ("state", self.state.trim()),
            ("from", self.from.trim()),
            ("to", self.to.trim()),
            ("id", self.id.trim()),
            ("key", self.key.trim()),
            ("text", self.text.trim()),
            ("order", self.order.trim()),
            ("archived", self.archived.trim()),
        ]
    }

    /// Hidden fields repeating the filter in a form.
    pub(crate) fn hidden(&self) -> Markup {
        html! {
            @for (k, v) in self.pairs() {
                @if !v.is_empty() { input type="hidden" name=(k) value=(v); }
            }
        }
    }
}

/// What a bounded search found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) jobs: Vec<Job>,
    /// Jobs whose payload was looked at (a text search).
    pub(crate) scanned: usize,
    /// The search stopped at its window: more jobs were not looked at.
    pub(crate) window_ended: bool,
    /// More matches exist past `want`.
    pub(crate) more: bool,
}

/// Up to `want` jobs matching `f`, a page of the database's filters at a time (each a
/// `LIMIT`ed keyset read); the payload text looked for in at most `window` jobs.
pub(crate) async fn find(state: &State, f: &Filter, want: usize, window: usize) -> Result<Found> {
    let mut found = Found::default();
    if let Some(id) = f.id {
        match state.client.get(id).await {
            Ok(job) => found.jobs.push(job),
            Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        return Ok(found);
    }
    let page = if f.text.is_some() {
        1000
    } else {
        (want as u32 + 1).min(1000)
    };
    let mut after = f.params.after;
    loop {
        let jobs = state
            .client
            .list(ListParams {
                after,
                limit: page,
                ..f.params.clone()
            })
            .await?;
        let full = jobs.len() == page as usize;
        after = jobs.last().map(|j| j.id);
        for job in jobs {
            if let Some(t) = &f.text {
                if found.scanned >= window {
                    found.window_ended = true;
                    return Ok(found);
                }
                found.scanned += 1;
                if !job.payload.to_string().contains(t.as_str()) {
                    continue;
                }
            }
            if found.jobs.len() == want {
                found.more = true;
                return Ok(found);
            }
            found.jobs.push(job);
        }
        if !full {
            return Ok(found);
        }
    }
}

/// The CSS class of a state.
pub(crate) fn state_class(s: JobState) -> String {
    format!("state-{s}")
}

/// A table of jobs linking to their pages.
pub(crate) fn job_table(state: &State, jobs: &[Job], now: DateTime<Utc>) -> Markup {
    html! {
        table #jobs {
            thead { tr {
                th.num { "id" } th { "queue" } th { "kind" } th { "state" } th.num { "attempts" }
                th { "run at" } th { "created" } th { "last error" }
            } }
            tbody {
                @for j in jobs {
                    tr {
                        td.num { a href=(state.url(&format!("/jobs/{}", j.id.0))) { (j.id.0) } }
                        td { (j.queue) }
                        td.kind { (j.kind) }
                        td class=(state_class(j.state)) { (j.state) }
                        td.num { (j.attempts) "/" (j.max_attempts) }
                        td title=(ts(j.run_at)) { (age(now, j.run_at)) }
                        td title=(ts(j.created_at)) { (age(now, j.created_at)) }
                        td.error { @if let Some(e) = &j.last_error { (e.code) ": " (e.message) } }
                    }
                }
            }
        }
    }
}
