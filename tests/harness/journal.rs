//! The nodes' journals, read once for every multi-process test (`tests/crash/`,
//! `tests/partition/`): one reader of a node's journal ([`NodeJournal`]), one fold of what
//! only the journals know into `crash_executions` ([`fold`]), what the checks read of a job
//! row ([`JobFacts`]) and how a job's error entry is matched to an execution
//! ([`same_claim`]).
//!
//! Executions are keyed by `(job, claim id)`: an attempt number does not name a claim (a
//! claim given back unstarted leaves its number to the next claim, which may be the same
//! node's), a claim id does — it is unique per claim and written by the node on every start
//! and end line, in the execution's row, in the result, and by the engine on every error
//! entry of the claim (`JobFailure::claim`, the holder's and the sweeper's alike).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use jobvisor::{Job, JobFailure, JobId, JobState};

use super::retry;
use super::side::{Execution, JournalLine, SideDb};

/// One execution's key: `(job, claim id)`.
pub(crate) type ExecKey = (i64, String);

/// A handler start as its node journaled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// The attempt number its claim carried.
    pub(crate) attempt: i32,
    /// Handler entry.
    pub(crate) started_at_us: i64,
    /// When the runtime started the attempt, if known (see `Execution::runtime_started_at_us`).
    pub(crate) runtime_started_at_us: Option<i64>,
}

/// A handler end as its node journaled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    /// The attempt number its claim carried.
    pub(crate) attempt: i32,
    /// Handler entry (as in its start).
    pub(crate) started_at_us: i64,
    /// When its future returned or was dropped.
    pub(crate) ended_at_us: i64,
    /// It returned (rather than being dropped mid-way).
    pub(crate) returned: bool,
}

/// Everything one node journaled, read in one pass.
#[derive(Debug, Default, Clone)]
pub(crate) struct NodeJournal {
    /// Execution → its start.
    pub(crate) starts: HashMap<ExecKey, Started>,
    /// Execution → its end.
    pub(crate) ends: HashMap<ExecKey, Ended>,
    /// `(job, attempt)` → when the node received each of its claims of that attempt.
    pub(crate) claims: HashMap<(i64, i32), Vec<i64>>,
    /// `event` lines counted by kind (`lagged` summed by how many events it missed).
    pub(crate) events: BTreeMap<String, i64>,
    /// `at` lines: (time, what, a, b), sorted by time.
    pub(crate) at: Vec<(i64, String, i64, i64)>,
    /// `fence` lines: (job, claim, what, at, fence point), in the order written.
    pub(crate) fences: Vec<(i64, String, String, i64, i64)>,
    /// Every line, in the order written (for violation reports).
    pub(crate) lines: Vec<JournalLine>,
    /// It journaled a graceful exit.
    pub(crate) exited: bool,
    /// Lines that do not parse, and a claim started twice.
    pub(crate) problems: Vec<String>,
}

impl NodeJournal {
    /// Reads the journal at `path`. `cut_ok`: the node was killed or is still writing, so a
    /// last line cut short is skipped rather than reported.
    ///
    /// # Errors
    /// The file cannot be read.
    pub(crate) fn read(path: &Path, cut_ok: bool) -> Result<NodeJournal, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(NodeJournal::parse(&text, cut_ok))
    }

    /// Parses a journal's text (see [`NodeJournal::read`]).
    pub(crate) fn parse(text: &str, cut_ok: bool) -> NodeJournal {
        let mut j = NodeJournal::default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let line = match l.parse::<JournalLine>() {
                Ok(line) => line,
                Err(_) if cut_ok && i + 1 == lines.len() => continue,
                Err(e) => {
                    j.problems.push(e);
                    continue;
                }
            };
            j.lines.push(line.clone());
            match line {
                JournalLine::Start {
                    job_id,
                    attempt,
                    claim,
                    started_at_us,
                    runtime_started_at_us,
                } => {
                    let s = Started {
                        attempt,
                        started_at_us,
                        runtime_started_at_us,
                    };
                    if let Some(was) = j.starts.insert((job_id, claim.clone()), s) {
                        j.problems.push(format!(
                            "job {job_id} claim {claim} started twice: {was:?}, then {s:?}"
                        ));
                    }
                }
                JournalLine::End {
                    job_id,
                    attempt,
                    claim,
                    started_at_us,
                    ended_at_us,
                    returned,
                } => {
                    let e = Ended {
                        attempt,
                        started_at_us,
                        ended_at_us,
                        returned,
                    };
                    if let Some(was) = j.ends.insert((job_id, claim.clone()), e) {
                        j.problems.push(format!(
                            "job {job_id} claim {claim} ended twice: {was:?}, then {e:?}"
                        ));
                    }
                }
                JournalLine::Claim {
                    job_id,
                    attempt,
                    at_us,
                } => j.claims.entry((job_id, attempt)).or_default().push(at_us),
                JournalLine::Event { what, n } => {
                    *j.events.entry(what.clone()).or_default() +=
                        if what == "lagged" { n } else { 1 };
                }
                JournalLine::At { at_us, what, a, b } => j.at.push((at_us, what, a, b)),
                JournalLine::Fence {
                    job_id,
                    claim,
                    what,
                    at_us,
                    fence_at_us,
                } => j.fences.push((job_id, claim, what, at_us, fence_at_us)),
                JournalLine::Exit { .. } => j.exited = true,
            }
        }
        j.at.sort_by_key(|x| x.0);
        j
    }

    /// Events the node's journal writer missed.
    pub(crate) fn lagged(&self) -> i64 {
        self.events.get("lagged").copied().unwrap_or(0)
    }
}

/// Checks the executions table against the journals and writes into it what only the
/// journals know: executions whose start row never reached the database, and ends of
/// executions that were stopped from outside or could not write while the database was
/// down. Reports (into `problems`) a row without a claim id, a row no journal has, a row of a claim on another node
/// than the journal that started it, two rows of one claim, a runtime start that differs
/// between row and journal, an end with no start, and a handler that returned without its
/// completion recorded.
pub(crate) async fn fold(
    side: &SideDb,
    journals: &BTreeMap<String, NodeJournal>,
    problems: &mut Vec<String>,
) {
    let rows = retry("reading executions", || side.executions()).await;
    problems.extend(fold_problems(&rows, journals));
    let rows: HashMap<ExecKey, Execution> = rows
        .into_iter()
        .map(|e| ((e.job_id, e.claim.clone()), e))
        .collect();
    for (node, j) in journals {
        for ((job, claim), s) in &j.starts {
            if !rows.contains_key(&(*job, claim.clone())) {
                retry("folding a start", || {
                    side.record_start(
                        *job,
                        s.attempt,
                        claim,
                        node,
                        s.started_at_us,
                        s.runtime_started_at_us,
                        false,
                    )
                })
                .await;
            }
        }
        for (key, e) in &j.ends {
            let row = rows.get(key);
            if j.starts.contains_key(key) && row.is_none_or(|r| r.ended_at_us.is_none()) {
                retry("folding an end", || {
                    side.fill_end(key.0, e.attempt, node, e.started_at_us, e.ended_at_us)
                })
                .await;
            }
        }
    }
}

/// What [`fold`] reports, from the rows as read before folding.
pub(crate) fn fold_problems(
    rows: &[Execution],
    journals: &BTreeMap<String, NodeJournal>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_key: HashMap<ExecKey, &Execution> = HashMap::new();
    for r in rows {
        if let Some(was) = by_key.insert((r.job_id, r.claim.clone()), r) {
            problems.push(format!(
                "job {} claim {}: two executions under one claim: {was:?} and {r:?}",
                r.job_id, r.claim
            ));
        }
    }
    for r in rows {
        if r.claim.is_empty() {
            problems.push(format!(
                "job {} on {}: execution {r:?} has no claim id",
                r.job_id, r.node
            ));
        }
        let key = (r.job_id, r.claim.clone());
        match journals.iter().find(|(_, j)| j.starts.contains_key(&key)) {
            None => problems.push(format!(
                "job {} claim {} on {}: execution {r:?} is in the table but not in its node's \
                 journal",
                r.job_id, r.claim, r.node
            )),
            Some((node, _)) if *node != r.node => problems.push(format!(
                "job {} claim {}: execution {r:?} is in the table as {}'s but {node} journaled it",
                r.job_id, r.claim, r.node
            )),
            Some((_, j)) => {
                let s = j.starts[&key];
                if (s.attempt, s.started_at_us, s.runtime_started_at_us)
                    != (r.attempt, r.started_at_us, r.runtime_started_at_us)
                {
                    problems.push(format!(
                        "job {} claim {} on {}: the table has {r:?} but the journal {s:?}",
                        r.job_id, r.claim, r.node
                    ));
                }
            }
        }
    }
    for (node, j) in journals {
        problems.extend(j.problems.iter().map(|p| format!("journal of {node}: {p}")));
        for (key, e) in &j.ends {
            if !j.starts.contains_key(key) {
                problems.push(format!(
                    "job {} claim {} on {node}: journaled an end but no start",
                    key.0, key.1
                ));
                continue;
            }
            if e.returned && by_key.get(key).is_none_or(|r| r.completed != 1) {
                problems.push(format!(
                    "job {} claim {} on {node}: the handler returned without its completion \
                     recorded",
                    key.0, key.1
                ));
            }
        }
    }
    problems
}

/// What the checks read of a job row.
#[derive(Debug, Clone)]
pub(crate) struct JobFacts {
    pub(crate) id: JobId,
    pub(crate) kind: String,
    pub(crate) state: JobState,
    pub(crate) attempts: u32,
    pub(crate) max_attempts: u32,
    /// The job's timeout, µs.
    pub(crate) timeout_us: i64,
    pub(crate) version: i64,
    pub(crate) errors: Vec<JobFailure>,
    pub(crate) last_error: Option<JobFailure>,
    pub(crate) result: Option<serde_json::Value>,
    pub(crate) lease_held: bool,
    pub(crate) finished_at_us: Option<i64>,
    /// It was enqueued waiting for parents: each settle of it locked its row with a version
    /// bump before its first claim (`src/store/dependencies.rs`), so its version is
    /// `1 + settles + 2 × claims` and `(version − 1) / 2` only bounds its claims.
    pub(crate) waited: bool,
}

impl From<&Job> for JobFacts {
    fn from(j: &Job) -> JobFacts {
        JobFacts {
            id: j.id,
            kind: j.kind.clone(),
            state: j.state,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            timeout_us: i64::try_from(j.timeout.as_micros()).unwrap_or(i64::MAX),
            version: j.version,
            errors: j.errors.clone(),
            last_error: j.last_error.clone(),
            result: j.result.clone(),
            lease_held: j.lease.is_some(),
            finished_at_us: j.finished_at.map(|t| t.timestamp_micros()),
            waited: false,
        }
    }
}

impl JobFacts {
    /// The node the result names.
    pub(crate) fn result_node(&self) -> Option<&str> {
        self.result.as_ref()?["node"].as_str()
    }

    /// The attempt the result names.
    pub(crate) fn result_attempt(&self) -> Option<i64> {
        self.result.as_ref()?["attempt"].as_i64()
    }

    /// The claim the result names (absent in a result of an older node).
    pub(crate) fn result_claim(&self) -> Option<&str> {
        self.result.as_ref()?["claim"].as_str()
    }

    /// Whether execution `x` wrote the result: the same node and claim (the same attempt
    /// where the result names no claim).
    pub(crate) fn written_by(&self, x: &Execution) -> bool {
        self.result_node() == Some(x.node.as_str())
            && match self.result_claim() {
                Some(c) if !x.claim.is_empty() => c == x.claim,
                _ => self.result_attempt() == Some(i64::from(x.attempt)),
            }
    }
}

/// The message of a sweeper's `timeout` before errors named the lease's holder.
pub(crate) const SWEEPER_TIMEOUT: &str = "the attempt ran past its timeout";

/// The node a reclaim took the job from, where the error says (`detail.owner`).
pub(crate) fn owner(e: &JobFailure) -> Option<&str> {
    e.detail.as_ref()?.get("owner")?.as_str()
}

/// Whether a sweeper wrote `e`, taking the claim from its holder — as opposed to the holder
/// ending its own claim (its own timeout, a fence), which it writes only once the handler
/// has stopped. A sweeper's errors name the holder in `detail.owner`; errors written before
/// they did are told apart by code and message.
pub(crate) fn taken_by_sweeper(e: &JobFailure) -> bool {
    match e.code.as_str() {
        "lease_expired" | "not_started" => true,
        "timeout" => owner(e).is_some() || e.message == SWEEPER_TIMEOUT,
        _ => false,
    }
}

/// Whether execution `x` ran under the claim whose end `e` records: the same claim id where
/// both know theirs; otherwise (an entry or a row without one) the same attempt, on the node
/// `e` names (on any node where it names none).
pub(crate) fn same_claim(e: &JobFailure, x: &Execution) -> bool {
    match e.claim {
        Some(c) if !x.claim.is_empty() => c.to_string() == x.claim,
        _ => i64::from(e.attempt) == i64::from(x.attempt) && owner(e).is_none_or(|o| o == x.node),
    }
}

/// When `e` was recorded, µs (never, if it does not say).
pub(crate) fn at_us(e: &JobFailure) -> i64 {
    e.at.map_or(i64::MAX, |t| t.timestamp_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(job: i64, attempt: i32, claim: &str, node: &str, start: i64) -> Execution {
        Execution {
            job_id: job,
            attempt,
            claim: claim.into(),
            node: node.into(),
            started_at_us: start,
            runtime_started_at_us: None,
            ended_at_us: None,
            completed: 0,
            held: Some(1),
        }
    }

    #[test]
    fn two_claims_of_one_attempt_are_two_executions() {
        // a ran attempt 1 under claim c1, gave it back, claimed attempt 1 again (c2) and ran
        // it again: two starts, two ends, two rows, all of "attempt 1 on a".
        let text = "start\t7\t1\t00000000000000c1\t100\n\
                    end\t7\t1\t00000000000000c1\t150\tdropped\t100\n\
                    start\t7\t1\t00000000000000c2\t200\n\
                    end\t7\t1\t00000000000000c2\t250\treturned\t200\n";
        let j = NodeJournal::parse(text, false);
        assert!(j.problems.is_empty(), "{:?}", j.problems);
        assert_eq!((j.starts.len(), j.ends.len()), (2, 2));
        let journals: BTreeMap<String, NodeJournal> = [("a".to_string(), j)].into();
        let mut rows = vec![
            exec(7, 1, "00000000000000c1", "a", 100),
            exec(7, 1, "00000000000000c2", "a", 200),
        ];
        rows[1].completed = 1;
        assert_eq!(fold_problems(&rows, &journals), Vec::<String>::new());
        // The same claim twice is one claim started twice, in the journal and in the table.
        let twice = NodeJournal::parse(
            "start\t7\t1\t00000000000000c1\t100\nstart\t7\t1\t00000000000000c1\t200\n",
            false,
        );
        assert_eq!(twice.problems.len(), 1, "{:?}", twice.problems);
        rows[0].claim = String::new();
        let p = fold_problems(&rows, &journals);
        assert!(p.iter().any(|p| p.contains("has no claim id")), "{p:?}");
        rows[0].claim = "00000000000000c1".into();
        rows[1].claim = "00000000000000c1".into();
        let p = fold_problems(&rows, &journals);
        assert!(
            p.iter()
                .any(|p| p.contains("two executions under one claim")),
            "{p:?}"
        );
    }

    #[test]
    fn an_error_matches_only_its_own_claim() {
        let c1: jobvisor::ClaimId = "00000000000000c1".parse().unwrap();
        let mut e = JobFailure::new("lease_expired", "lost", 1)
            .with_detail(serde_json::json!({ "owner": "a" }));
        e.claim = Some(c1);
        assert!(same_claim(&e, &exec(7, 1, "00000000000000c1", "a", 100)));
        // Same attempt, same node, another claim: not this entry's execution.
        assert!(!same_claim(&e, &exec(7, 1, "00000000000000c2", "a", 200)));
        // Unknown on one side: the attempt and holder decide.
        assert!(same_claim(&e, &exec(7, 1, "", "a", 200)));
        e.claim = None;
        assert!(same_claim(&e, &exec(7, 1, "00000000000000c2", "a", 200)));
        assert!(!same_claim(&e, &exec(7, 1, "00000000000000c2", "b", 200)));
    }
}
