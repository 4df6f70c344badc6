//! The crash test's journals, read once, and the evidence printed beside each violation.

use super::*;

// ---------------------------------------------------------------------------------------------
// Journals

/// Everything the nodes journaled.
#[derive(Debug, Default)]
pub(crate) struct Journals {
    /// Node → its journal.
    pub(crate) nodes: BTreeMap<String, NodeJournal>,
    /// `(job, attempt, node)` → when the node received each of its claims of that attempt.
    pub(crate) claims: Claims,
    /// Event counts by kind, over every node.
    pub(crate) events: BTreeMap<String, i64>,
}

/// Reads every gone node's journal (see [`NodeJournal`]); the fold reports what a journal
/// says wrong.
pub(crate) fn read_journals(fleet: &Fleet, problems: &mut Vec<String>) -> Journals {
    let mut j = Journals::default();
    for n in &fleet.gone {
        let Ok(nj) = NodeJournal::read(&fleet.journal(&n.node), n.how == "killed") else {
            // A node opens its journal before it builds its scheduler, so one killed (or
            // frozen, then killed) that early never claimed anything. One that exited by
            // itself without a journal is broken.
            if n.how == "killed" {
                *j.events.entry("killed_before_journal".into()).or_default() += 1;
            } else {
                problems.push(format!("node {} left no journal", n.node));
            }
            continue;
        };
        // Timeline and fence lines are read by the partition test only (a frozen node's
        // handler ends when the node thaws, past its fence point, having done nothing
        // meanwhile: the end-time rule holds only where nothing freezes).
        if n.how == "stopped" && !nj.exited {
            problems.push(format!(
                "node {} stopped without journaling its exit",
                n.node
            ));
        }
        for ((job, attempt), at) in &nj.claims {
            j.claims
                .entry((*job, *attempt, n.node.clone()))
                .or_default()
                .extend(at);
        }
        for (what, count) in &nj.events {
            *j.events.entry(what.clone()).or_default() += count;
        }
        j.nodes.insert(n.node.clone(), nj);
    }
    j
}

// ---------------------------------------------------------------------------------------------
// Violation reports

/// What the run knows around a violation, printed under it so that the report explains
/// itself: the server's down windows (or, on SQLite, when every node was killed), and for
/// the job the violation names, its row and, per node whose journal mentions it, the node's
/// life, its freezes and its journal lines about the job (claims, starts, ends, lease
/// losses, fences, drops, timeouts) and its detected pauses around them. Times are given
/// since the run began and in µs since the epoch (as in the tables).
#[derive(Debug)]
pub(crate) struct Evidence<'a> {
    pub(crate) began_us: i64,
    pub(crate) restarts: &'a [Restart],
    pub(crate) all_killed_at: &'a [i64],
    pub(crate) jobs: &'a [JobFacts],
    pub(crate) nodes: &'a [NodeRow],
    pub(crate) freezes: &'a [FreezeRow],
    pub(crate) journals: &'a Journals,
}

/// The job a violation names (`job <id>`), if any.
pub(crate) fn job_named(line: &str) -> Option<i64> {
    let mut rest = line;
    while let Some(i) = rest.find("job ") {
        rest = &rest[i + 4..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(id) = digits.parse() {
            return Some(id);
        }
    }
    None
}

/// When a journal line happened, and whether it is about `job`.
pub(crate) fn journal_time_and_job(line: &JournalLine) -> (Option<i64>, Option<i64>) {
    match line {
        JournalLine::Start {
            job_id,
            started_at_us,
            ..
        } => (Some(*started_at_us), Some(*job_id)),
        JournalLine::End {
            job_id,
            ended_at_us,
            ..
        } => (Some(*ended_at_us), Some(*job_id)),
        JournalLine::Claim { job_id, at_us, .. } => (Some(*at_us), Some(*job_id)),
        JournalLine::Fence { job_id, at_us, .. } => (Some(*at_us), Some(*job_id)),
        // The same events as `At` lines, which carry their time.
        JournalLine::Event { .. } => (None, None),
        JournalLine::At { at_us, what, a, .. } => {
            let about_a_job = !matches!(
                what.as_str(),
                "renewed"
                    | "pause_detected"
                    | "leader_elected"
                    | "leader_lost"
                    | "reconciled"
                    | "reconcile_failed"
            );
            (Some(*at_us), about_a_job.then_some(*a))
        }
        JournalLine::Exit { at_us, .. } => (Some(*at_us), None),
    }
}

impl Evidence<'_> {
    /// `t` as "+seconds since the run began (µs since the epoch)".
    pub(crate) fn at(&self, t: i64) -> String {
        format!("+{:.6} s ({t})", (t - self.began_us) as f64 / 1e6)
    }

    /// The lines printed under violation `line`.
    pub(crate) fn explain(&self, line: &str) -> String {
        let mut out = String::new();
        for r in self.restarts {
            let _ = writeln!(
                out,
                "      server down: asked to stop at {}, answering again at {}",
                self.at(r.down_at_us),
                self.at(r.up_at_us)
            );
        }
        for t in self.all_killed_at {
            let _ = writeln!(out, "      every node killed at {}", self.at(*t));
        }
        let Some(id) = job_named(line) else {
            return out;
        };
        if let Some(j) = self.jobs.iter().find(|j| j.id.0 == id) {
            let errors: Vec<String> = j
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "attempt {} {} by {} at {}",
                        e.attempt,
                        e.code,
                        owner(e).unwrap_or("?"),
                        self.at(at_us(e))
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "      job {id} ({}): {}, attempts {}, finished at {}, errors {errors:?}",
                j.kind,
                j.state,
                j.attempts,
                j.finished_at_us.map_or("-".into(), |t| self.at(t)),
            );
        }
        let mut names: Vec<&String> = self.journals.nodes.keys().collect();
        names.sort_by_key(|n| (n.len(), n.as_str()));
        for node in names {
            let lines = &self.journals.nodes[node].lines;
            let about: Vec<(Option<i64>, &JournalLine)> = lines
                .iter()
                .filter_map(|l| {
                    let (t, job) = journal_time_and_job(l);
                    (job == Some(id)).then_some((t, l))
                })
                .collect();
            if about.is_empty() {
                continue;
            }
            let times: Vec<i64> = about.iter().filter_map(|(t, _)| *t).collect();
            let (from, to) = (
                times.iter().min().copied().unwrap_or(i64::MIN),
                times.iter().max().copied().unwrap_or(i64::MAX),
            );
            let life = self.nodes.iter().find(|n| &n.node == node).map_or_else(
                || "never recorded".to_string(),
                |n| {
                    format!(
                        "spawned at {}, {} at {}",
                        self.at(n.spawned_at_us),
                        n.how,
                        self.at(n.gone_at_us)
                    )
                },
            );
            let _ = writeln!(out, "      node {node}: {life}");
            for f in self.freezes.iter().filter(|f| &f.node == node) {
                let _ = writeln!(
                    out,
                    "        freeze: SIGSTOP sent at {}, seen stopped at {}, continued at {}",
                    self.at(f.signalled_at_us),
                    self.at(f.frozen_at_us),
                    self.at(f.resumed_at_us)
                );
            }
            // Its lines about the job, and its detected pauses from a second before the
            // first to ten seconds after the last.
            for l in lines {
                let (t, job) = journal_time_and_job(l);
                let pause = matches!(l, JournalLine::At { what, .. } if what == "pause_detected")
                    && t.is_some_and(|t| t >= from - 1_000_000 && t <= to + 10_000_000);
                if job == Some(id) || pause {
                    let when = t.map_or("-".into(), |t| self.at(t));
                    let _ = writeln!(
                        out,
                        "        journal {when}: {}",
                        l.to_string().replace('\t', " ")
                    );
                }
            }
        }
        out
    }
}
