//! `retry` and `cancel`: of one job by id, or of every job matching filters — listed first,
//! shown with `--dry-run`, confirmed (a prompt on a terminal, `--yes` otherwise), then
//! applied one job at a time, each through the same guarded operation an application uses.

use std::io::{BufRead, IsTerminal, Write};

use chrono::{DateTime, Utc};
use jobvisor::{
    AuditAction, CancelOutcome, Client, Job, JobId, JobState, ListParams, RetryOutcome,
};
use serde_json::json;

use crate::args::Bulk;
use crate::args::Filter;
use crate::{exit, list_params, render, search, show, Failure};

/// What to do to each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Retry,
    Cancel,
    /// Cancel with every descendant (`cancel --cascade`).
    CancelCascade,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Change::Retry => "retry",
            Change::Cancel | Change::CancelCascade => "cancel",
        }
    }

    /// Whether a job in `state` can take this change.
    fn applies_to(self, state: JobState) -> bool {
        match self {
            Change::Retry => matches!(state, JobState::Dead | JobState::Cancelled),
            Change::Cancel | Change::CancelCascade => !state.is_terminal(),
        }
    }
}

/// Runs a retry or cancel as `b` says.
pub(crate) async fn run(
    client: &Client,
    change: Change,
    b: Bulk,
    json: bool,
    now: DateTime<Utc>,
) -> Result<(), Failure> {
    let targets: Vec<Job> = match b.id {
        Some(id) => {
            if !b.filter.is_empty() {
                return Err(Failure {
                    code: exit::USAGE,
                    message: format!("{} takes a job id or filters, not both", change.verb()),
                });
            }
            vec![client.get(JobId(id)).await?]
        }
        None => {
            if b.filter.is_empty() {
                return Err(Failure {
                    code: exit::USAGE,
                    message: format!(
                        "no job id and no filter: refusing to {} every job; name one \
                         (e.g. --state dead --kind send_email)",
                        change.verb()
                    ),
                });
            }
            matching(client, &b.filter, &list_params(&b.filter, now)).await?
        }
    };
    let (eligible, skipped): (Vec<Job>, Vec<Job>) = targets
        .into_iter()
        .partition(|j| change.applies_to(j.state));
    if b.id.is_some() && eligible.is_empty() {
        let j = &skipped[0];
        return Err(Failure {
            code: exit::FAILED,
            message: format!(
                "job {} is {}: cannot {} it",
                j.id.0,
                j.state.as_str(),
                change.verb()
            ),
        });
    }
    if b.dry_run {
        let v = json!({
            "dry_run": true,
            "would_change": eligible.iter().map(render::job_json).collect::<Vec<_>>(),
            "skipped": skipped.len(),
        });
        show(json, v, || {
            format!(
                "{}would {} {} jobs ({} others match but are not in a state to {}); nothing changed\n",
                render::jobs_table(&eligible),
                change.verb(),
                eligible.len(),
                skipped.len(),
                change.verb()
            )
        });
        return Ok(());
    }
    if b.id.is_none() && !b.yes && !confirm(change, eligible.len())? {
        return Err(Failure {
            code: exit::NOT_CONFIRMED,
            message: format!(
                "not confirmed: nothing changed ({} jobs matched)",
                eligible.len()
            ),
        });
    }
    let mut changed = Vec::new();
    let mut refused = Vec::new();
    for j in &eligible {
        match apply(client, change, j.id).await {
            Ok(Some(note)) => changed.push((j.id.0, note)),
            Ok(None) => refused.push((j.id.0, "it changed meanwhile".to_string())),
            Err(e) => refused.push((j.id.0, e.to_string())),
        }
    }
    record(
        client,
        change,
        &b,
        changed.len(),
        refused.len(),
        skipped.len(),
    )
    .await;
    let v = json!({
        "changed": changed.iter().map(|(id, note)| json!({"id": id, "outcome": note})).collect::<Vec<_>>(),
        "refused": refused.iter().map(|(id, why)| json!({"id": id, "reason": why})).collect::<Vec<_>>(),
        "skipped": skipped.len(),
    });
    show(json, v, || {
        let mut out = String::new();
        for (id, note) in &changed {
            out.push_str(&format!("{id}: {note}\n"));
        }
        for (id, why) in &refused {
            out.push_str(&format!("{id}: not changed: {why}\n"));
        }
        out.push_str(&format!(
            "{} changed, {} refused, {} skipped (not in a state to {})\n",
            changed.len(),
            refused.len(),
            skipped.len(),
            change.verb()
        ));
        out
    });
    if refused.is_empty() {
        Ok(())
    } else {
        Err(Failure {
            code: exit::FAILED,
            message: format!("{} jobs could not be changed", refused.len()),
        })
    }
}

/// Who runs the command, as the audit log records it: `jobvisor command (user alice)`.
pub(crate) fn who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_string());
    format!("jobvisor command (user {user})")
}

/// Records the bulk action in the audit log; a failure to record is said on stderr (the
/// jobs are already changed).
async fn record(
    client: &Client,
    change: Change,
    b: &Bulk,
    changed: usize,
    refused: usize,
    skipped: usize,
) {
    let target = match b.id {
        Some(id) => format!("job {id}"),
        None => format!("jobs matching {}", b.filter.describe()),
    };
    let action = match change {
        Change::Retry => "cli.retry",
        Change::Cancel => "cli.cancel",
        Change::CancelCascade => "cli.cancel_cascade",
    };
    let a = AuditAction::new(who(), action, target)
        .jobs(changed as u64)
        .outcome(
            format!(
                "{changed} changed, {refused} refused, {skipped} skipped (not in a state to {})",
                change.verb()
            ),
            refused == 0,
        );
    if let Err(e) = client.record_action(&a).await {
        eprintln!("jobvisor: the action was not recorded in the audit log: {e}");
    }
}

/// Every job matching `p`, a page at a time.
async fn matching(client: &Client, f: &Filter, p: &ListParams) -> Result<Vec<Job>, Failure> {
    let found = search::find(
        client,
        p,
        f.payload_contains.as_deref(),
        f.scan as usize,
        usize::MAX,
    )
    .await?;
    if let Some(id) = found.window_ended_at {
        eprintln!(
            "jobvisor: the payload search looked at {} jobs (--scan) and stopped; jobs after \
             id {} were not searched",
            found.scanned, id.0
        );
    }
    Ok(found.jobs)
}

/// Applies the change to one job: `Some(outcome)` when it took, `None` when the job changed
/// meanwhile (the guard refused).
async fn apply(
    client: &Client,
    change: Change,
    id: JobId,
) -> Result<Option<String>, jobvisor::Error> {
    match change {
        Change::Retry => Ok(match client.retry(id).await? {
            RetryOutcome::Retried(j) => Some(format!("{}, due now", j.state.as_str())),
            _ => None,
        }),
        Change::CancelCascade => {
            let (out, reached) = client.cancel_cascade(id).await?;
            let first = match out {
                CancelOutcome::Cancelled(_) => "cancelled",
                CancelOutcome::Requested(_) => "cancel requested",
                CancelOutcome::AlreadyFinished(_) => "already finished",
            };
            Ok(Some(format!("{first}, with {} descendants", reached.len())))
        }
        Change::Cancel => Ok(match client.cancel(id).await? {
            CancelOutcome::Cancelled(_) => Some("cancelled".to_string()),
            CancelOutcome::Requested(_) => {
                Some("cancel requested (its handler is told at once)".to_string())
            }
            CancelOutcome::AlreadyFinished(_) => None,
        }),
    }
}

/// Asks on the terminal; without one, there is nobody to ask.
fn confirm(change: Change, n: usize) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure {
            code: exit::NOT_CONFIRMED,
            message: format!(
                "{n} jobs match; pass --yes to {} them without a prompt (or --dry-run to see them)",
                change.verb()
            ),
        });
    }
    eprint!("{} {n} jobs? [y/N] ", change.verb());
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Failure {
            code: exit::FAILED,
            message: format!("reading the answer: {e}"),
        })?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}
