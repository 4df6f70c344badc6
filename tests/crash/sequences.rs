//! The crash test's ordered sequences and start-by deadlines: with every wave of the mix,
//! [`SEQUENCES_PER_WAVE`] sequences (`NewJob::sequence`, policy `Wait`) of [`MEMBERS`]
//! members each — the first appended to one key for the whole run ([`LONG_KEY`]), the others
//! a fresh key each — members that work 50–300 ms — one of them failing once, on its first
//! attempt, so that it waits for its retry and holds the sequence — and a handful of jobs
//! with a start-by deadline (`NewJob::start_by`): some due comfortably before theirs, some
//! due now with a deadline 300 ms away, ahead of the quick jobs' backlog or behind it, so
//! that kills, freezes, the restart and the backlog make some miss it. All run while nodes
//! are killed, frozen and the server restarts.
//!
//! The rules ([`check_sequences`]), from the job rows and the executions the handlers
//! recorded through their own connection (`crash_executions`):
//! * **order**: every member's first execution started after the member enqueued before it
//!   had succeeded (its `finished_at`) and after that member's every execution had ended;
//! * **one at a time**: no two executions of one sequence's members overlapped in time;
//! * **liveness**: every member of every sequence ended succeeded (the drain after the chaos
//!   gives them the time);
//! * **deadline**: no execution of a deadline job started at or after its `start_by`, and
//!   every deadline job ended succeeded or `cancelled` with the error code `expired`.
//!
//! When an execution ended is decided as in `check.rs`: its recorded end, else (the node was
//! killed with it running) the time its process was surely gone; and one that ran on only
//! because its node was frozen is excused if it stopped within [`PAUSE_TAIL_US`] of its node
//! being continued ([`World::paused_tail`]) — starting is never excused.

use super::*;
use crate::harness::invariants;
use jobvisor::Client;

/// The kind of a sequence's members (a kind of their own, so that `check.rs` allows their
/// one planned failure).
pub(crate) const SEQ_KIND: &str = "sequenced";
/// The kind of the jobs with a start-by deadline (a kind of their own, so that `check.rs`
/// allows their ending `expired`).
pub(crate) const DEADLINE_KIND: &str = "deadlined";
/// The error code of a sequence member's planned failure.
pub(crate) const PLANNED: &str = "planned";
/// Sequences enqueued with each wave.
const SEQUENCES_PER_WAVE: usize = 2;
/// Members per sequence.
const MEMBERS: usize = 8;
/// The key of the sequence every wave appends to.
const LONG_KEY: &str = "crash-seq-long";
/// A member works this long, uniformly at random in between: long enough that kills and
/// freezes land in the middle of sequences.
const MEMBER_WORK: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(300));
/// Sequence members and the deadline jobs meant to make it go ahead of the quick jobs'
/// backlog (smaller is claimed first).
const AHEAD: i16 = 0;
/// A deadline job works this long.
const DEADLINE_WORK: (Duration, Duration) = (Duration::from_millis(0), Duration::from_millis(200));
/// The deadline of the jobs meant to make it: far beyond any freeze or restart.
const COMFORTABLE: Duration = Duration::from_secs(60);
/// The deadline of the jobs some of which must miss it: shorter than a freeze, a restart or
/// the backlog.
const TIGHT: Duration = Duration::from_millis(300);
/// Per wave: comfortable deadlines, tight ones ahead of the backlog, tight ones behind it.
const DEADLINES: [(Duration, bool, usize); 3] =
    [(COMFORTABLE, true, 2), (TIGHT, true, 2), (TIGHT, false, 2)];

/// One job the driver enqueued as a sequence member or with a deadline.
#[derive(Debug, Clone)]
pub(crate) struct SeqJob {
    pub(crate) id: i64,
    /// The sequence's key and the member's place in it (`None`: a deadline job).
    pub(crate) sequence: Option<(String, usize)>,
    /// The start-by deadline as enqueued, µs.
    pub(crate) start_by_us: Option<i64>,
    /// It fails once, on its first attempt.
    pub(crate) fails_once: bool,
}

/// A job of `kind` that works `work` ms (and with `fail_first`, fails its first attempt).
fn payload(kind: &str, wave: usize, work: u64, fail_first: bool) -> NewJob {
    let timeout_ms = u64::try_from(harness::CRASHY_TIMEOUT.as_millis()).unwrap();
    NewJob::new(
        kind,
        json!({
            "wave": wave, "work_ms": work, "timeout_ms": timeout_ms, "fail_first": fail_first,
        }),
    )
    .queue(QUEUE)
    .max_attempts(harness::MAX_ATTEMPTS)
    .timeout(harness::CRASHY_TIMEOUT)
}

fn ms(rng: &mut Rng, range: (Duration, Duration)) -> u64 {
    u64::try_from(rng.between(range).as_millis()).unwrap()
}

/// Enqueues one wave's sequences (members one at a time, in order) and deadline jobs, each
/// enqueue retried while the database does not answer; appends them to `seqs` and answers
/// how many jobs were enqueued.
pub(crate) async fn enqueue_sequences(
    store: &Store,
    rng: &mut Rng,
    wave: usize,
    seqs: &mut Vec<SeqJob>,
) -> usize {
    let client = Client::new(store.clone());
    let before = seqs.len();
    for s in 0..SEQUENCES_PER_WAVE {
        // The first sequence is one key for the whole run, each wave appending to it (64
        // members across every kill, freeze and restart); the others are fresh keys.
        let (key, first_place) = if s == 0 {
            (LONG_KEY.to_string(), wave * MEMBERS)
        } else {
            (format!("crash-seq-{wave}-{s}"), 0)
        };
        let failing = rng.below(MEMBERS);
        for i in 0..MEMBERS {
            let place = first_place + i;
            let fails_once = i == failing;
            let job = payload(SEQ_KIND, wave, ms(rng, MEMBER_WORK), fails_once)
                .priority(AHEAD)
                .sequence(key.clone());
            let id = retry("enqueueing a sequence member", || {
                client.enqueue(job.clone())
            })
            .await
            .id
            .0;
            seqs.push(SeqJob {
                id,
                sequence: Some((key.clone(), place)),
                start_by_us: None,
                fails_once,
            });
        }
    }
    for (within, ahead, n) in DEADLINES {
        for _ in 0..n {
            let work = ms(rng, DEADLINE_WORK);
            // The deadline is taken afresh for each try: one already past is refused.
            let mut tries = 0;
            let (id, start_by_us) = loop {
                let start_by = chrono::Utc::now() + within;
                let mut job = payload(DEADLINE_KIND, wave, work, false).start_by(start_by);
                if ahead {
                    job = job.priority(AHEAD);
                }
                match client.enqueue(job).await {
                    Ok(e) => break (e.id.0, start_by.timestamp_micros()),
                    Err(e) if tries >= 20 => panic!("enqueueing a deadline job: {e}"),
                    Err(_) => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            };
            seqs.push(SeqJob {
                id,
                sequence: None,
                start_by_us: Some(start_by_us),
                fails_once: false,
            });
        }
    }
    seqs.len() - before
}

/// Counts of the sequence and deadline checks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeqStats {
    pub(crate) sequences: usize,
    pub(crate) members: usize,
    /// Member → next member pairs checked for order.
    pub(crate) orders: usize,
    /// Executions of sequence members checked for overlaps.
    pub(crate) executions: usize,
    /// Planned failures seen (a member's first attempt failing).
    pub(crate) planned_failures: usize,
    /// Executions of members that ran on into the next's only because their node was frozen.
    pub(crate) paused_tails: usize,
    /// The least time from a member's success to the next one's first start, µs.
    pub(crate) min_handover_us: Option<i64>,
    pub(crate) deadline_jobs: usize,
    /// Deadline jobs that ended `expired` (never started, or not again).
    pub(crate) expired: usize,
    /// Deadline jobs that succeeded.
    pub(crate) in_time: usize,
    /// The least time from an execution's start to its job's deadline, µs.
    pub(crate) min_margin_us: Option<i64>,
}

fn least(slot: &mut Option<i64>, v: i64) {
    *slot = Some(slot.map_or(v, |s| s.min(v)));
}

/// The sequence and deadline rules (see the module docs).
pub(crate) fn check_sequences(
    seqs: &[SeqJob],
    jobs: &[JobFacts],
    execs: &[Execution],
    w: &World<'_>,
) -> (Vec<String>, SeqStats) {
    let mut bad = Vec::new();
    let mut stats = SeqStats::default();
    let by_id: HashMap<i64, &JobFacts> = jobs.iter().map(|j| (j.id.0, j)).collect();
    let mut runs: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        runs.entry(e.job_id).or_default().push(e);
    }
    for list in runs.values_mut() {
        list.sort_by_key(|e| (e.start(), e.node.clone()));
    }
    let runs_of = |id: i64| runs.get(&id).map_or(&[][..], Vec::as_slice);
    // Ends as `check.rs` takes them; its own faults (a node that never ended) are reported
    // there.
    let ends_of =
        |list: &[&Execution]| invariants::execution_ends(list, &w.gone, &mut Vec::new()).0;

    let mut by_key: BTreeMap<&str, Vec<&SeqJob>> = BTreeMap::new();
    for s in seqs {
        if let Some((key, _)) = &s.sequence {
            by_key.entry(key.as_str()).or_default().push(s);
        }
    }
    for (key, members) in &mut by_key {
        members.sort_by_key(|s| s.sequence.as_ref().map(|(_, p)| *p));
        stats.sequences += 1;
        stats.members += members.len();
        // Liveness: every member succeeded.
        for m in members.iter() {
            match by_id.get(&m.id) {
                None => bad.push(format!(
                    "[sequence liveness] {key}: member {} is missing",
                    m.id
                )),
                Some(j) if j.state != JobState::Succeeded => bad.push(format!(
                    "[sequence liveness] {key}: member {} is {} after the run (attempts {}, \
                     last error {:?})",
                    m.id, j.state, j.attempts, j.last_error
                )),
                Some(j) => {
                    if m.fails_once && j.errors.iter().any(|e| e.code == PLANNED) {
                        stats.planned_failures += 1;
                    }
                }
            }
        }
        // Order: each member's first start after the one before succeeded and stopped.
        for pair in members.windows(2) {
            let (p, n) = (pair[0], pair[1]);
            let Some(first) = runs_of(n.id).first() else {
                continue;
            };
            stats.orders += 1;
            let start = first.start();
            let prev = by_id.get(&p.id);
            match prev.filter(|j| j.state == JobState::Succeeded) {
                Some(j) => {
                    let end = j.finished_at_us.unwrap_or(i64::MAX);
                    least(&mut stats.min_handover_us, start.saturating_sub(end));
                    if start < end.saturating_sub(DB_CLOCK_SLACK_US) {
                        bad.push(format!(
                            "[sequence order] {key}: member {} started at {start} (node {}, \
                             attempt {}), {} µs before member {} before it succeeded (at {end})",
                            n.id,
                            first.node,
                            first.attempt,
                            end - start,
                            p.id
                        ));
                    }
                }
                None => bad.push(format!(
                    "[sequence order] {key}: member {} started at {start} but member {} \
                     before it is {} (policy Wait: it must succeed first)",
                    n.id,
                    p.id,
                    prev.map_or("missing".to_string(), |j| j.state.to_string())
                )),
            }
            let list = runs_of(p.id);
            for (x, end) in list.iter().zip(ends_of(list)) {
                let end = end.unwrap_or(i64::MAX);
                if end <= start {
                    continue;
                }
                if w.paused_tail(x, end, start) {
                    stats.paused_tails += 1;
                    continue;
                }
                bad.push(format!(
                    "[sequence order] {key}: member {} started at {start} (node {}) while \
                     {x:?} of member {} before it still ran (until {end})",
                    n.id, first.node, p.id
                ));
            }
        }
        // One at a time: no two executions of the sequence's members overlapped (those of
        // one job are `check.rs`'s).
        let mut all: Vec<&Execution> = members
            .iter()
            .flat_map(|m| runs_of(m.id).iter().copied())
            .collect();
        all.sort_by_key(|e| (e.started_at_us, e.node.clone()));
        stats.executions += all.len();
        let ends = ends_of(&all);
        let paused = &mut stats.paused_tails;
        for o in invariants::overlaps(&all, &ends, |p, pend, start| {
            let excused = w.paused_tail(p, pend, start);
            *paused += usize::from(excused);
            excused
        }) {
            let (x, p) = (all[o.later], all[o.earlier]);
            if x.job_id == p.job_id {
                continue;
            }
            bad.push(format!(
                "[sequence overlap] {key}: {x:?} started {} µs before {p:?} ended",
                o.by_us
            ));
        }
    }

    // Deadlines.
    for s in seqs {
        let Some(start_by) = s.start_by_us else {
            continue;
        };
        stats.deadline_jobs += 1;
        let Some(job) = by_id.get(&s.id) else {
            bad.push(format!("[deadline] job {} is missing", s.id));
            continue;
        };
        for x in runs_of(s.id) {
            let margin = start_by - x.start();
            least(&mut stats.min_margin_us, margin);
            if margin <= -DB_CLOCK_SLACK_US {
                bad.push(format!(
                    "[deadline] job {}: {x:?} started {} µs after its start-by deadline \
                     ({start_by})",
                    s.id, -margin
                ));
            }
        }
        let expired = job.state == JobState::Cancelled
            && job
                .last_error
                .as_ref()
                .is_some_and(|e| e.code == jobvisor::deadline::EXPIRED);
        if expired {
            stats.expired += 1;
        } else if job.state == JobState::Succeeded {
            stats.in_time += 1;
        } else {
            bad.push(format!(
                "[deadline] job {} is {} (last error {:?}): expected succeeded or cancelled \
                 `expired`",
                s.id, job.state, job.last_error
            ));
        }
    }
    (bad, stats)
}
