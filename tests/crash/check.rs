//! The crash test's checks: every job against the executions recorded for it.

use super::*;
use crate::harness::invariants;

// ---------------------------------------------------------------------------------------------
// The checks

/// Counts the checks produce.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Stats {
    pub(crate) succeeded: usize,
    /// Mix jobs that used up their attempts (on timeouts and lost leases).
    pub(crate) dead: usize,
    pub(crate) executions: usize,
    /// Counted failures: reclaims of an expired lease (`lease_expired`).
    pub(crate) reclaims: usize,
    /// Counted failures: started jobs a node fenced and gave back (`fenced`).
    pub(crate) fenced: usize,
    /// Counted failures: timeouts (`timeout`), written by the node or by a sweeper.
    pub(crate) timeouts: usize,
    /// Reclaims of a job whose start was never recorded: its attempt given back
    /// (`not_started`, not counted).
    pub(crate) refunds: usize,
    /// Claims whose attempt was given back: at graceful shutdown, by a refund, or by a node
    /// dropping a prefetched job whose lease it could no longer trust.
    pub(crate) give_backs: usize,
    /// Claims that never reached a handler start (the node died or never heard of the
    /// claim): claims minus recorded executions.
    pub(crate) unrecorded_claims: usize,
    /// Executions that did their work but were not the one whose result counts.
    pub(crate) superseded_completions: usize,
    /// Executions without a recorded end, bounded by their process's death instead.
    pub(crate) ends_bounded_by_death: usize,
    /// Executions that ran on past their lease, the job's end or a later execution's start
    /// only because their node was frozen, and stopped within [`PAUSE_TAIL_US`] of waking.
    pub(crate) paused_tails: usize,
    /// Pairs of executions of one job that overlapped in time.
    pub(crate) overlaps: usize,
    /// Executions still running after their attempt was reclaimed or the job finished.
    pub(crate) late_ends: usize,
    /// Jobs with any overlap.
    pub(crate) duplicates: usize,
    /// Counted failures (`timeout`, `lease_expired`, `fenced`) of an attempt that never
    /// started on the node that held it.
    pub(crate) failed_without_execution: usize,
    /// The same, by error code.
    pub(crate) unexecuted_by_code: BTreeMap<String, usize>,
    /// `lease_expired` of an attempt that never started, after the job's refunds reached its
    /// `max_attempts`: the bound that keeps a job killing its node at start from being
    /// refunded for ever (allowed).
    pub(crate) refunds_exhausted: usize,
    /// `timeout`s recorded before an execution of the attempt had run for the job's timeout.
    pub(crate) early_timeouts: usize,
    /// Executions that started after their attempt's lease had been taken from their node.
    pub(crate) started_without_lease: usize,
}

/// What the checks found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) violations: Vec<String>,
    pub(crate) stats: Stats,
    /// The dependency rules' counts (`deps.rs`).
    pub(crate) deps: DepStats,
    /// The sequence and deadline rules' counts (`sequences.rs`).
    pub(crate) seqs: SeqStats,
    /// The execution ledger's cross-check counts (`harness::ledger`).
    pub(crate) ledger: LedgerStats,
}

/// `(job, attempt, node)` → when the node received each of its claims of that attempt
/// (from the journals).
pub(crate) type Claims = HashMap<(i64, i32, String), Vec<i64>>;

/// What the checks know besides the jobs and their executions.
#[derive(Debug)]
pub(crate) struct World<'a> {
    /// Node → when its process was surely gone.
    pub(crate) gone: HashMap<&'a str, i64>,
    /// Node → its freezes, `(frozen at, continued at)`.
    pub(crate) freezes: HashMap<&'a str, Vec<(i64, i64)>>,
    pub(crate) claims: &'a Claims,
}

impl<'a> World<'a> {
    /// What the nodes' rows, the freezes and the journals' claims say.
    pub(crate) fn new(
        nodes: &'a [NodeRow],
        freezes: &'a [FreezeRow],
        claims: &'a Claims,
    ) -> World<'a> {
        let mut world = World {
            gone: nodes
                .iter()
                .map(|n| (n.node.as_str(), n.gone_at_us))
                .collect(),
            freezes: HashMap::new(),
            claims,
        };
        for f in freezes {
            world
                .freezes
                .entry(f.node.as_str())
                .or_default()
                .push((f.frozen_at_us, f.resumed_at_us));
        }
        world
    }

    /// Whether `x`, running until `end`, ran past `t` only because its node was frozen: a
    /// freeze of its node began after `x` started and by `t`, and `x` ended within
    /// [`PAUSE_TAIL_US`] of the node being continued. A freeze begins when the node was seen
    /// stopped, not when SIGSTOP was sent (see [`Fleet::freeze_random`]): a node may start a
    /// handler in between, and that handler was running when the node froze.
    pub(crate) fn paused_tail(&self, x: &Execution, end: i64, t: i64) -> bool {
        self.freezes.get(x.node.as_str()).is_some_and(|fs| {
            fs.iter()
                .any(|&(f, u)| f > x.start() && f <= t && end <= u.saturating_add(PAUSE_TAIL_US))
        })
    }

    /// Whether `x`'s node claimed `x`'s attempt again after `since` and by `x`'s start —
    /// with a refund the attempt number comes back, and the next claim may be the same
    /// node's. Needs two claims journaled (a claim's event may be received late, after a
    /// freeze, and must not vouch for itself).
    pub(crate) fn claimed_again(&self, x: &Execution, since: i64) -> bool {
        self.claims
            .get(&(x.job_id, x.attempt, x.node.clone()))
            .is_some_and(|ts| ts.len() >= 2 && ts.iter().any(|&t| t > since && t <= x.start()))
    }
}

/// Checks every job against the executions recorded for it. Nothing here trusts what a node
/// said about itself except through the tables and journals; each rule names the invariant
/// it proves.
///
/// Accounting, from the job row alone: every claim increments `version` and so does every
/// end of a claim (finalization, reclaim, give-back), and enqueue sets it to 1, so a terminal
/// job was claimed `C = (version − 1) / 2` times. `attempts` counts claims too, except that a
/// claim can give its attempt back — at graceful shutdown, when a sweeper finds its start was
/// never recorded (`not_started`), or when its node drops it from the prefetch because its
/// lease may be gone — and the next claim reuses the number; so `C − attempts` claims were
/// given back.
///
/// Why executions can be fewer than attempts, and how strict the check can be: a claim is
/// one committed statement, and the handler's start is recorded later — after the node got
/// the answer and, with prefetch, after the job waited for a free worker. A node killed,
/// frozen, fenced or shut down in between, or one that never got the claim's answer because
/// the server went down mid-reply, leaves a claim with no execution. Such a claim must end
/// in a give-back (attempt returned: at shutdown, a `not_started` refund or a drop) — never
/// in a counted failure, which is only for attempts that started. So `attempts ==
/// executions` is false for honest runs, and `attempts >= executions` alone is too weak (it
/// would accept an execution under a claim that was never made). The exact rules: the final
/// attempt of a job that succeeded has an execution, and it wrote the result; every other
/// attempt ended in exactly one counted failure, recorded once and in order in `errors`
/// (refunds in between repeat the number that comes next); no execution has an attempt
/// number above `attempts`; there are no more executions than claims; and executions
/// sharing an attempt number are explained by give-backs (at most one extra per give-back).
///
/// The lease rules, from the errors' holders (`detail.owner`; any node where an error names
/// none) and the executions' starts as the runtime stamped them:
/// * every counted failure (`timeout`, `lease_expired`, `fenced`) follows an execution of
///   that attempt that started on the node that held it, after that node's previous claim of
///   the number ended (the refunds' `not_started` are exempt: that is what they are for; so
///   is a `lease_expired` once the job's refunds reached its `max_attempts` — past that bound
///   a loss before any recorded start counts, or a job that kills its node at start would be
///   refunded for ever);
/// * every `timeout` follows such an execution that started at least the job's timeout
///   (less [`TIMEOUT_SLACK_US`]) before the timeout was recorded — a job's timeout counts
///   from its start, never from its claim;
/// * no execution started after a sweeper had taken its attempt from its node, unless the
///   node claimed the (refunded) number again in between: a node must check its lease
///   before it starts a handler, and a node that was frozen must not start what it lost.
///
/// Freezes: a handler that was running when its node froze cannot stop while frozen, so its
/// running past its lease or into a later execution is excused if it stopped within
/// [`PAUSE_TAIL_US`] of its node being continued — and only then. Starting is never excused.
pub(crate) fn check(
    jobs: &[JobFacts],
    execs: &[Execution],
    nodes: &[NodeRow],
    freezes: &[FreezeRow],
    claims: &Claims,
) -> Verdict {
    let mut v = Verdict::default();
    let world = World::new(nodes, freezes, claims);
    let mut by_job: HashMap<i64, Vec<&Execution>> = HashMap::new();
    for e in execs {
        by_job.entry(e.job_id).or_default().push(e);
    }
    v.stats.executions = execs.len();
    let known: std::collections::HashSet<i64> = jobs.iter().map(|j| j.id.0).collect();
    for id in by_job.keys().filter(|id| !known.contains(id)) {
        v.violations.push(format!(
            "executions recorded for job {id}, which does not exist"
        ));
    }
    for job in jobs {
        let mut list = by_job.remove(&job.id.0).unwrap_or_default();
        list.sort_by_key(|e| (e.started_at_us, e.node.clone()));
        check_job(job, &list, &world, &mut v);
    }
    v
}

pub(crate) fn check_job(job: &JobFacts, list: &[&Execution], w: &World<'_>, v: &mut Verdict) {
    let id = job.id;
    let kind = job.kind.as_str();
    let mix = MIX.iter().any(|m| m.kind == kind);
    let bad = &mut v.violations;
    // A deadline job (`sequences.rs`) that was not started by its deadline ends cancelled
    // `expired`: never started, or not again after an attempt that was lost.
    let expired = kind == DEADLINE_KIND
        && job.state == JobState::Cancelled
        && job
            .last_error
            .as_ref()
            .is_some_and(|e| e.code == jobvisor::deadline::EXPIRED);
    // Invariant 2: exactly one terminal state. For the quick jobs that must be success — a
    // handler that never fails, with 100 attempts allowed, has no other honest outcome. A
    // mix job may also be dead, having used up its few attempts on timeouts and lost leases
    // (the rules below say which of those count); a deadline job may have expired.
    match job.state {
        JobState::Succeeded => v.stats.succeeded += 1,
        JobState::Dead if mix => v.stats.dead += 1,
        JobState::Cancelled if expired => {}
        _ => {
            bad.push(format!(
                "job {id} ({kind}) is {} after the run (attempts {}, last error {:?})",
                job.state, job.attempts, job.last_error
            ));
            return;
        }
    }
    let succeeded = job.state == JobState::Succeeded;
    if job.lease_held || job.finished_at_us.is_none() || job.last_error.is_some() == succeeded {
        bad.push(format!(
            "job {id} is {} but lease held {}, finished_at {:?}, last_error {:?}",
            job.state, job.lease_held, job.finished_at_us, job.last_error
        ));
    }
    let a = i64::from(job.attempts);
    // A child's settles add to its version (see `JobFacts::waited`): no parity for it, and
    // `claims` below is an upper bound.
    let paired = job.waited || (job.version - 1) % 2 == 0;
    if job.version < 1 || !paired || (job.version - 1) / 2 < a || (a < 1 && !expired) {
        bad.push(format!(
            "job {id}: version {} does not pair every claim with one end for {a} attempts",
            job.version
        ));
        return;
    }
    let claims = usize::try_from((job.version - 1) / 2).unwrap();
    let give_backs = claims - usize::try_from(a).unwrap();
    v.stats.give_backs += give_backs;

    // Invariant 3 and invariant 1's "no stale write applied": every attempt but a successful
    // last one ended in exactly one counted failure, recorded once, in order; a refund
    // (`not_started`) repeats the number the next counted failure or the success will carry.
    // A zombie's refused finalization would show up here as a second entry or another code.
    // A sequence member's planned failure (`sequences.rs`) is counted like any other.
    let allowed: &[&str] = if mix {
        &["lease_expired", "fenced", "timeout"]
    } else if kind == SEQ_KIND {
        &["lease_expired", "fenced", PLANNED]
    } else {
        &["lease_expired", "fenced"]
    };
    let mut counted = 0i64;
    for (i, e) in job.errors.iter().enumerate() {
        // An expiry ends the job without an attempt, like a refund gives one back.
        let refund = e.code == "not_started" || (expired && e.code == jobvisor::deadline::EXPIRED);
        let expected = counted + 1;
        if i64::from(e.attempt) != expected
            || e.at.is_none()
            || !(refund || allowed.contains(&e.code.as_str()))
        {
            bad.push(format!(
                "job {id} ({kind}): error #{} is attempt {} code {} ({}); expected attempt \
                 {expected}, code not_started or one of {allowed:?}",
                i + 1,
                e.attempt,
                e.code,
                e.message,
            ));
        }
        match e.code.as_str() {
            "not_started" => v.stats.refunds += 1,
            "lease_expired" => v.stats.reclaims += 1,
            "fenced" => v.stats.fenced += 1,
            "timeout" => v.stats.timeouts += 1,
            _ => {}
        }
        if !refund {
            counted += 1;
        }
    }
    // An expiry at a node's start gate ends the attempt it claimed, uncounted, as a success
    // would; one by the sweeper ends a job between attempts.
    let gate_expired = expired
        && job
            .errors
            .last()
            .is_some_and(|e| e.code == jobvisor::deadline::EXPIRED);
    let want = if succeeded || gate_expired { a - 1 } else { a };
    if counted != want {
        bad.push(format!(
            "job {id} ({kind}, {}): {counted} counted errors for {a} attempts: {:?}",
            job.state, job.errors
        ));
    }
    if !succeeded && !expired && a < i64::from(job.max_attempts) {
        bad.push(format!(
            "job {id} ({kind}) is dead after {a} of its {} attempts",
            job.max_attempts
        ));
    }

    // Invariant 1: the outcome was written by the holder of the last lease (the shared rule,
    // `harness/invariants.rs`).
    let outcome = invariants::outcome(job, list);
    bad.extend(outcome.faults.iter().map(|f| f.message().to_string()));
    v.stats.superseded_completions += list
        .iter()
        .enumerate()
        .filter(|(i, e)| e.completed == 1 && outcome.writer != Some(*i))
        .count();

    // Claims and executions: see `check`. A job that expired after a refund never claims
    // the refunded number again.
    let top = a + i64::from(
        expired
            && job
                .errors
                .last()
                .is_some_and(|e| e.code == "not_started" && i64::from(e.attempt) == a + 1),
    );
    if let Some(e) = list
        .iter()
        .find(|e| e.attempt < 1 || i64::from(e.attempt) > top)
    {
        bad.push(format!(
            "job {id}: execution {e:?} has an attempt outside 1..={top}"
        ));
    }
    if list.len() > claims {
        bad.push(format!(
            "job {id}: {} executions but only {claims} claims",
            list.len()
        ));
    }
    let mut numbers: Vec<i32> = list.iter().map(|e| e.attempt).collect();
    numbers.sort_unstable();
    numbers.dedup();
    if list.len() - numbers.len() > give_backs {
        bad.push(format!(
            "job {id}: {} executions share an attempt number but only {give_backs} claims \
             were given back",
            list.len() - numbers.len()
        ));
    }
    v.stats.unrecorded_claims += claims.saturating_sub(list.len());

    // When each execution surely stopped. A handler that finished records its end in the
    // table before it returns. One stopped from outside (lease lost, self-fenced, given back
    // at shutdown) cannot: its future is dropped at its next await. So the node journals,
    // synchronously in the future's `drop`, the moment the handler surely stopped doing
    // anything, and the fold copied those ends into the table. An execution with no end at
    // all therefore had its future still alive when its process died: it ran until the
    // process was gone, and the node's `gone_at` (taken after `wait` reaped it) is a sound
    // upper bound — neither optimistic (it could hide an overlap) nor needlessly late.
    //
    // This is stricter than "a killed node's execution counts as overlapping only if the next
    // attempt started before its lease could have expired": under that rule a node that kept
    // running past its lease without noticing (a failed fence) would pass. Here, if the next
    // attempt started before the killed node was gone, the old handler was provably still
    // alive then, and that is reported. For a correct runtime it cannot happen: the next
    // claim needs the sweeper to see the lease expired, the lease outlives the last renewal
    // by 2 s, and a live node fences its handler before that — unless it is frozen, which
    // the freeze rule (see `check`) allows for.
    let (ends, by_death) = invariants::execution_ends(list, &w.gone, bad);
    v.stats.ends_bounded_by_death += by_death;

    // Invariant 1, in time: an execution whose claim a sweeper took stopped before it was
    // taken (self-fencing stops it before its lease can expire, and a reclaim needs an
    // expired lease), and none ran past the job's finish. A claim its own node ended (its
    // timeout, a fence) is written only once the handler stopped; the overlap rule covers
    // those. Database stamps are compared with a millisecond of slack (SQLite's resolution).
    let finished = job.finished_at_us.unwrap_or(i64::MAX);
    for (x, end) in list.iter().zip(&ends) {
        let Some(end) = *end else { continue };
        let claim_end = job
            .errors
            .iter()
            .filter(|e| same_claim(e, x) && at_us(e) >= x.start() - DB_CLOCK_SLACK_US)
            .min_by_key(|e| at_us(e));
        let (limit, what) = match claim_end {
            Some(e) if taken_by_sweeper(e) => (at_us(e), "its claim was taken"),
            Some(_) => continue,
            None => (finished, "the job finished"),
        };
        if end > limit + DB_CLOCK_SLACK_US {
            if w.paused_tail(x, end, limit) {
                v.stats.paused_tails += 1;
                continue;
            }
            v.stats.late_ends += 1;
            bad.push(format!(
                "job {id}: execution {x:?} ran until {end}, {} µs after {what} at {limit}",
                end - limit
            ));
        }
    }

    // Invariant 1, directly: no two executions of the job overlapped. Sorted by start, each
    // must start after every earlier one ended (or was paused, see `check`).
    let paused_tails = &mut v.stats.paused_tails;
    let found = invariants::overlaps(list, &ends, |p, pend, start| {
        let excused = w.paused_tail(p, pend, start);
        *paused_tails += usize::from(excused);
        excused
    });
    let overlapped = !found.is_empty();
    for o in &found {
        v.stats.overlaps += 1;
        let (x, p) = (list[o.later], list[o.earlier]);
        bad.push(format!(
            "job {id}: {x:?} started {} µs before {p:?} ended (at {})",
            o.by_us,
            x.started_at_us + o.by_us
        ));
    }
    if overlapped {
        v.stats.duplicates += 1;
    }

    // The lease rules (see `check`). First: a counted failure needs an execution of its
    // attempt on its holder, started in that holder's claim (after its previous claim of the
    // number ended) and before the failure was recorded; a timeout needs one that ran for
    // the job's timeout.
    for (i, e) in job.errors.iter().enumerate() {
        if e.code == "not_started" || (expired && e.code == jobvisor::deadline::EXPIRED) {
            continue;
        }
        let at = at_us(e);
        let since = job.errors[..i]
            .iter()
            .filter(|p| p.attempt == e.attempt && (owner(e).is_none() || owner(p) == owner(e)))
            .map(at_us)
            .max()
            .unwrap_or(i64::MIN);
        let runs: Vec<&&Execution> = list
            .iter()
            .filter(|x| {
                same_claim(e, x) && x.start() > since && x.start() <= at + DB_CLOCK_SLACK_US
            })
            .collect();
        let refunds_before = job.errors[..i]
            .iter()
            .filter(|p| p.code == "not_started")
            .count();
        if runs.is_empty()
            && e.code == "lease_expired"
            && refunds_before >= usize::try_from(job.max_attempts).unwrap()
        {
            v.stats.refunds_exhausted += 1;
        } else if runs.is_empty() {
            v.stats.failed_without_execution += 1;
            *v.stats
                .unexecuted_by_code
                .entry(e.code.clone())
                .or_default() += 1;
            bad.push(format!(
                "[failed without execution] job {id} ({kind}, {}): {} of attempt {} (holder {}) recorded at {at} but no \
                 execution of that attempt started on its holder before: {e:?}",
                job.state,
                e.code,
                e.attempt,
                owner(e).unwrap_or("not named"),
            ));
        } else if e.code == "timeout"
            && !runs
                .iter()
                .any(|x| at >= x.start().saturating_add(job.timeout_us) - TIMEOUT_SLACK_US)
        {
            v.stats.early_timeouts += 1;
            let ran: Vec<i64> = runs.iter().map(|x| at - x.start()).collect();
            bad.push(format!(
                "[early timeout] job {id} ({kind}): timeout of attempt {} recorded at {at}, when its \
                 executions had run {ran:?} µs of the job's {} µs timeout: {e:?}",
                e.attempt, job.timeout_us
            ));
        }
    }
    // Second: no execution started after a sweeper took its claim, unless its node claimed
    // the (refunded) attempt number again in between — seen in its journal (a second claim
    // of the number after the take), or in the job's row when the start was recorded (it was
    // running on that node with that attempt: a fresh claim, for the first one's answer
    // may never have been journaled).
    for x in list {
        for e in job
            .errors
            .iter()
            .filter(|e| taken_by_sweeper(e) && same_claim(e, x))
        {
            let at = at_us(e);
            if x.start() <= at + DB_CLOCK_SLACK_US
                || (e.code == "not_started" && owner(e).is_none())
                || w.claimed_again(x, at)
                || x.held == Some(1)
            {
                continue;
            }
            v.stats.started_without_lease += 1;
            bad.push(format!(
                "[started without lease] job {id} ({kind}): {x:?} started {} µs after its claim \
                 was taken ({} at {at})",
                x.start() - at,
                e.code
            ));
        }
    }
}
