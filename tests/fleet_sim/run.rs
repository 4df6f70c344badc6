//! One run of one seed: the seed picks the fleet's size and fault rate and the limited
//! queue's limits (`controls.rs`), then each step's clock event and action, from a
//! generator of the step's own (seeded by the seed and the step's number, so what a step
//! draws does not depend on what earlier steps drew). Actions: enqueue plain jobs (on either
//! queue, with priorities, delays, unique keys — a debounce key's job replaces or cancels
//! the pending holder, `replace.rs`), fetch a queue, renew, check deadlines,
//! sweep, release a waiting handler, advance the clock, freeze, crash or start a node,
//! pause or resume a queue, have a node read its queues' settings, elect, fire the
//! schedule and refresh the gauges, declare it again, enqueue a child of recent jobs or a batch with its callback,
//! enqueue members of an ordered sequence (`sequences.rs`, keys drawn once per run) or jobs
//! with start-by deadlines (`deadlines.rs`), add, change or remove the run-time schedule
//! (`runtime_schedule.rs`). After a step's action, an operator may look at a plain job's
//! page or press a button on one it looked at before (`operator.rs`), and a busy node's
//! machine may stop for a long stop hidden from its clock ([`vm_stop`]; half the freezes of a
//! busy node are hidden too), waking on leases the database let go.
//! A run may skip steps (a [`Skips`] set, for shrinking a failing run): a skipped step takes
//! no action and has no clock event (a frozen node due to resume still resumes), and the
//! steps after it draw what they would have drawn. Each step first lands the writes held
//! for it (`faults.rs`). After the steps, faults stop, frozen nodes resume, every queue is resumed and every node reads it, one last schedule pass
//! fires on the leader, the writes still held land from round [`HEAL_LANDING`] on, and the
//! fleet is driven until every job is terminal and nothing is held (liveness);
//! then the invariants are checked (`check.rs`, `check_controls.rs`, `check_sequences.rs`,
//! `check_deadlines.rs`, `check_replace.rs`, `check_operator.rs`, `check_effects.rs`;
//! `check_landing.rs` as each held renewal, settle or
//! fire lands). Answers the event log's hash and what broke.

use std::collections::BTreeSet;
use std::time::Duration;

use jobvisor::testing::Simulation;
use jobvisor::{Job, JobId, NewJob, ParentPolicy, UniqueScope};
use serde_json::json;

use crate::check_controls::Facts;
use crate::controls::{parents, Controls, LIMITED, QUEUES};
use crate::faults::HEAL_LANDING;
use crate::fleet::{Fleet, Status, Wake};
use crate::harness::side::Execution;
use crate::journal::Release;
use crate::log::EventLog;
use crate::operator::Operator;
use crate::rng::{fnv, Rng, FNV_START};
use crate::runtime_schedule::{self, RUNTIME};
use crate::shrink::Skips;
use crate::{deadlines, replace, sequences};

/// Steps of the faulty phase.
const STEPS: std::ops::Range<u64> = 60..120;
/// Rounds of the final phase before a run is declared not live.
const HEAL_ROUNDS: usize = 150;
/// Fetches (per thousand) whose claim's answer is held while the queue is paused and the node
/// learns of it (`Controls::pause_in_flight`), when the queue is not known paused already —
/// in odd seeds only: each such pause changes the rest of its run, and the even seeds keep the
/// runs they had (the catalogue's only catch of `renew-token` is seed 86's).
const PAUSED_IN_FLIGHT: u64 = 60;

/// Salt of a freeze's draw of whether it is hidden from its node's clock.
const HIDDEN_SALT: u64 = 0x41dd_e4f2_ee2e_0001;
/// Freezes (per thousand) hidden from their node's monotonic clock (`clock.rs`): a virtual
/// machine stopped by its hypervisor. Drawn apart from the step's generator, so the step
/// draws what it drew before.
const HIDDEN_PER_MILLE: u64 = 500;

/// Whether the freeze of `step` in `seed` is hidden from its node's clock.
fn hidden_freeze(seed: u64, step: usize) -> bool {
    fnv(&(step as u64).to_le_bytes(), FNV_START ^ seed ^ HIDDEN_SALT) % 1000 < HIDDEN_PER_MILLE
}

/// Steps (per thousand) after which a node with handlers running is stopped at once for a
/// long stop hidden from its clock ([`long_stop`]), as a virtual machine is by its hypervisor.
/// Drawn apart from the step's generator.
const VM_STOP_PER_MILLE: u64 = 20;

/// Maybe (at [`VM_STOP_PER_MILLE`]) stops a live node with handlers running, when another is
/// live: its clock stands still through a [`long_stop`], then it wakes with its handlers'
/// last steps.
async fn vm_stop(
    fleet: &mut Fleet,
    controls: &mut Controls,
    seed: u64,
    step: usize,
    log: &mut EventLog,
) {
    let h = fnv(
        &(step as u64).to_le_bytes(),
        FNV_START ^ seed ^ HIDDEN_SALT ^ 2,
    );
    let live = fleet.drivable();
    if h % 1000 >= VM_STOP_PER_MILLE || live.len() < 2 {
        return;
    }
    let busy: Vec<usize> = live
        .into_iter()
        .filter(|i| !fleet.journal.waiting(&fleet.nodes[*i].name).is_empty())
        .collect();
    let Some(&i) = busy.get((h / 1000) as usize % busy.len().max(1)) else {
        return;
    };
    log.line(format!(
        "{step}: {}'s machine stops (its clock stands still)",
        fleet.nodes[i].name
    ));
    fleet.freeze(i, step, true);
    long_stop(fleet, seed, step, log).await;
    controls.drain_claims(fleet);
    fleet
        .resume(i, Wake::Handlers, log, &step.to_string())
        .await;
    controls.drain_claims(fleet);
}

/// A hidden freeze ends after a stop of a virtual machine (`clock.rs`), as long as the lease
/// at least, so that the database lets its leases go: the clock moves on by 31–60 s (every
/// live node's deadline check runs, as its timer would), then each live node sweeps and
/// fetches both queues — the frozen node's jobs, reclaimed, may have a new holder when it
/// wakes (always with its handlers' last steps, `Wake::Handlers`) on leases it still believes
/// in.
async fn long_stop(fleet: &mut Fleet, seed: u64, step: usize, log: &mut EventLog) {
    let h = fnv(
        &(step as u64).to_le_bytes(),
        FNV_START ^ seed ^ HIDDEN_SALT ^ 1,
    );
    let at = step.to_string();
    fleet
        .advance(Duration::from_secs(31 + h % 30), log, &at)
        .await;
    for i in fleet.drivable() {
        let sim = &fleet.nodes[i].sim;
        let line = format!(
            "{at}: {} sweep → {} fetch {} {}",
            fleet.nodes[i].name,
            sim.sweep().await,
            sim.fetch("default").await,
            sim.fetch(LIMITED).await
        );
        log.line(line);
        fleet.settle(log).await;
    }
}

/// What one run found.
#[derive(Debug)]
pub(crate) struct RunReport {
    pub(crate) seed: u64,
    pub(crate) hash: u64,
    pub(crate) violations: Vec<String>,
    pub(crate) log: Vec<String>,
    pub(crate) steps: usize,
    pub(crate) faults: usize,
    /// The steps the run skipped.
    pub(crate) skipped: Skips,
}

/// Runs `seed` on an actix system of its own, on this one thread: its runtime is
/// current-thread with tokio's time paused (it moves only when nothing else can run, by
/// the next timer's wait), every node's handlers run on it, and the SQLite calls run inline
/// — so nothing but the seed decides the order of anything.
pub(crate) fn run_seed(seed: u64) -> RunReport {
    run_seed_skipping(seed, &Skips::default())
}

/// [`run_seed`], skipping the steps in `skips`.
pub(crate) fn run_seed_skipping(seed: u64, skips: &Skips) -> RunReport {
    quiet_chosen_panics();
    jobvisor::testing::sqlite_calls_inline(true);
    jobvisor::testing::restart_retry_spread();
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    });
    let report = system.block_on(run(seed, skips));
    jobvisor::testing::sqlite_calls_inline(false);
    report
}

/// The handlers' panics the seed chose run on the test's thread: they are not reported (any
/// other panic is, as usual).
fn quiet_chosen_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let usual = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&crate::journal::CHOSEN_PANIC) {
                usual(info);
            }
        }));
    });
}

async fn run(seed: u64, skips: &Skips) -> RunReport {
    let mut rng = Rng::new(seed);
    let nodes = 2 + rng.below(2) as usize;
    let per_mille = *rng.pick(&[0, 30, 60, 100]);
    let mut fleet = Fleet::new(seed, nodes, per_mille).await;
    let mut log = EventLog::new();
    log.line(format!(
        "seed {seed}: {nodes} nodes, {per_mille}‰ store faults"
    ));
    let mut controls = Controls::set_up(&fleet, &mut rng, &mut log).await;
    let keys = sequences::draw(&mut rng);
    log.line(format!("sequences {keys:?}"));
    let mut answered = BTreeSet::new();
    let mut operator = Operator::new(seed);
    let mut made = 0u64;
    let mut restarts = 0usize;
    let steps = (STEPS.start + rng.below(STEPS.end - STEPS.start)) as usize;
    for step in 0..steps {
        // The seed is hashed before the step: hashing the step's bytes from the seed itself
        // gave `(seed ^ step) · P⁸` (its other bytes are zero), so step s of seed a drew what
        // step s' of seed b drew whenever a ^ s = b ^ s' — every seed replayed the same few
        // hundred step draws in another order.
        let mut rng = Rng::new(fnv(
            &(step as u64).to_le_bytes(),
            fnv(&seed.to_le_bytes(), FNV_START),
        ));
        fleet
            .book
            .step
            .store(step, std::sync::atomic::Ordering::SeqCst);
        fleet.land(Some(step), &mut log, &step.to_string()).await;
        for i in 0..fleet.nodes.len() {
            if let Status::Frozen { until, hidden, .. } = fleet.nodes[i].status {
                if until <= step {
                    let wake = *rng.pick(&[Wake::Handler, Wake::Renewal, Wake::Deadlines]);
                    let wake = if hidden {
                        long_stop(&mut fleet, seed, step, &mut log).await;
                        controls.drain_claims(&fleet);
                        Wake::Handlers
                    } else {
                        wake
                    };
                    fleet.resume(i, wake, &mut log, &step.to_string()).await;
                }
            }
        }
        if skips.contains(step) {
            log.line(format!("{step}: skipped"));
            continue;
        }
        fleet.clock_event(&mut rng, step, &mut log);
        let live = fleet.drivable();
        let roll = rng.below(129);
        let at = *rng.pick(&live);
        let name = fleet.nodes[at].name.clone();
        let sim = &fleet.nodes[at].sim;
        let line = match roll {
            0..=13 => {
                let n = 1 + rng.below(3);
                let mut ids = Vec::new();
                for _ in 0..n {
                    made += 1;
                    let queue = if rng.chance(350) { LIMITED } else { "default" };
                    let mut job = NewJob::new("work", json!({ "n": made }))
                        .queue(queue)
                        .priority(i16::try_from(rng.below(4)).unwrap())
                        .max_attempts(2 + u32::try_from(rng.below(3)).unwrap())
                        .timeout(Duration::from_secs(5 + rng.below(50)));
                    if rng.chance(250) {
                        job = job.delay(Duration::from_secs(1 + rng.below(10)));
                    }
                    let mut keyed = None;
                    let plain = !rng.chance(200);
                    if !plain {
                        let mut key = format!("k{}", rng.below(4));
                        let (how, debounce) = replace::draw(seed, made);
                        if let Some(d) = debounce {
                            // A debounce key, held while its job is live (`replace.rs`).
                            key = replace::DEBOUNCE_KEY.to_string();
                            job = job.delay(d).unique_scope(UniqueScope::WhileActive);
                        }
                        job = job.unique_key(key.clone()).on_duplicate(how);
                        keyed = Some((key, how));
                    }
                    match sim.client.enqueue(job).await {
                        Ok(e) => {
                            if let (true, Some((key, how))) = (e.replaced, keyed) {
                                controls.replaces.push(replace::Act {
                                    how,
                                    id: e.id.0,
                                    key,
                                    n: i64::try_from(made).unwrap(),
                                    mark: fleet.journal.mark(),
                                });
                            }
                            answered.insert(e.id.0);
                            if plain {
                                operator.plain(e.id.0);
                            }
                            // `~`: replaced (`replace.rs`), `=`: the holder kept.
                            let mark = match (e.replaced, e.duplicate) {
                                (true, _) => "~",
                                (false, true) => "=",
                                (false, false) => "",
                            };
                            ids.push(format!("{}{mark}", e.id.0));
                        }
                        Err(_) => ids.push("error".into()),
                    }
                }
                format!("{step}: {name} enqueue → {}", ids.join(" "))
            }
            14..=27 => {
                let queue = *rng.pick(&QUEUES);
                if rng.chance(PAUSED_IN_FLIGHT) && seed % 2 == 1 && !controls.known_paused(queue) {
                    let line = controls.pause_in_flight(&fleet, at, queue).await;
                    format!("{step}: {name} fetch {queue} → {line}")
                } else {
                    format!("{step}: {name} fetch {queue} → {}", sim.fetch(queue).await)
                }
            }
            28..=39 => {
                let r = sim.renew().await;
                format!(
                    "{step}: {name} renew → renewed {} lost {}",
                    r.renewed, r.lost
                )
            }
            40..=47 => format!("{step}: {name} deadlines → {}", sim.check_deadlines().await),
            48..=55 => format!("{step}: {name} sweep → {}", sim.sweep().await),
            56..=75 => {
                let waiting = fleet.journal.waiting(&name);
                if waiting.is_empty() {
                    format!("{step}: {name} release → none waiting")
                } else {
                    let (idx, job, attempt) = *rng.pick(&waiting);
                    let how = match rng.below(10) {
                        0..=6 => Release::Success,
                        7..=8 => Release::Retry,
                        _ => Release::Panic,
                    };
                    fleet.journal.release(idx, how);
                    // Sometimes the node reads its queues' settings as the handler ends: a
                    // pause it learns then closes its start gate while the worker the
                    // handler frees wakes a prefetched job, before the pause's give-back.
                    let read = if rng.chance(300) {
                        format!(
                            ", read settings → {}",
                            controls.read_settings(&fleet, at).await
                        )
                    } else {
                        String::new()
                    };
                    format!("{step}: {name} release job {job} attempt {attempt} → {how:?}{read}")
                }
            }
            76..=89 => {
                let d = if rng.chance(150) {
                    Duration::from_secs(10 + rng.below(26))
                } else {
                    Duration::from_millis(200 + rng.below(5800))
                };
                fleet.advance(d, &mut log, &step.to_string()).await;
                controls.drain_claims(&fleet);
                continue;
            }
            90..=93 if live.len() >= 2 => {
                let until = step + 3 + rng.below(13) as usize;
                // Hidden only where it can matter: a node with a handler running.
                let hidden = hidden_freeze(seed, step) && !fleet.journal.waiting(&name).is_empty();
                fleet.freeze(at, until, hidden);
                let clock = if hidden {
                    " (its clock stands still)"
                } else {
                    ""
                };
                format!("{step}: freeze {name} until step {until}{clock}")
            }
            94..=96 if live.len() >= 2 => {
                fleet.crash(at);
                format!("{step}: crash {name}")
            }
            97..=99 if fleet.nodes.len() < 6 => {
                restarts += 1;
                let new = format!("r{restarts}");
                fleet.add_node(&new).await;
                controls.listen(&fleet);
                format!("{step}: start {new}")
            }
            100..=103 => {
                let queue = *rng.pick(&QUEUES);
                let how = controls.pause(&fleet, at, queue).await;
                format!("{step}: {name} pause {queue} → {how}")
            }
            104..=106 => {
                let queue = *rng.pick(&QUEUES);
                let how = controls.resume(&fleet, at, queue).await;
                format!("{step}: {name} resume {queue} → {how}")
            }
            107..=110 => {
                let how = controls.read_settings(&fleet, at).await;
                format!("{step}: {name} read settings → {how}")
            }
            111..=114 => {
                let term = sim.elect().await;
                let fired = sim.fire_schedules().await;
                // The gauge loop's tick: the leader takes the interval's turn and counts.
                let counted = sim.refresh_gauges().await;
                fleet.elected(&name, term);
                format!(
                    "{step}: {name} elect → {term:?}, fire → {}, gauges → {}",
                    fired.map_or_else(|_| "error".into(), |n| format!("{n:?}")),
                    counted.map_or_else(|_| "error".into(), |c| format!("counted {c}"))
                )
            }
            115 => format!(
                "{step}: {name} declare schedules → {}",
                if sim.declare_schedules().await.is_ok() {
                    "ok"
                } else {
                    "error"
                }
            ),
            116..=119 => {
                let line =
                    enqueue_dependent(sim, &mut rng, &mut answered, &mut operator, &mut made).await;
                format!("{step}: {name} {line}")
            }
            120..=122 => {
                let line =
                    sequences::enqueue_members(sim, &mut rng, &keys, &mut answered, &mut made)
                        .await;
                format!("{step}: {name} {line}")
            }
            123..=125 => {
                let now = fleet.now_us();
                let line =
                    deadlines::enqueue_deadlined(sim, &mut rng, now, &mut answered, &mut made)
                        .await;
                format!("{step}: {name} {line}")
            }
            126..=128 => {
                let op =
                    runtime_schedule::act(sim, &mut rng, &controls.runtime, fleet.now_us()).await;
                controls.runtime.push(op);
                format!(
                    "{step}: {name} schedule {RUNTIME} {:?} → {:?}",
                    op.ask, op.answer
                )
            }
            _ => format!("{step}: {name} idle"),
        };
        log.line(line);
        fleet.settle(&mut log).await;
        controls.drain_claims(&fleet);
        if let Some(line) = operator.step(&mut fleet, step).await {
            log.line(line);
            fleet.settle(&mut log).await;
            controls.drain_claims(&fleet);
        }
        vm_stop(&mut fleet, &mut controls, seed, step, &mut log).await;
    }

    // Faults stop, everyone resumes: the fleet must finish every job.
    fleet
        .book
        .on
        .store(false, std::sync::atomic::Ordering::SeqCst);
    for i in 0..fleet.nodes.len() {
        fleet.resume(i, Wake::Deadlines, &mut log, "heal").await;
    }
    if fleet.drivable().is_empty() {
        fleet.add_node("last").await;
        controls.listen(&fleet);
    }
    log.line("heal: faults off, every node resumed".into());
    // Every queue resumed, and every node knows it.
    let first = fleet.drivable()[0];
    for line in controls.resume_all(&fleet, first).await {
        log.line(format!("heal: {line}"));
    }
    for i in fleet.drivable() {
        let how = controls.read_settings(&fleet, i).await;
        log.line(format!(
            "heal: {} read settings → {how}",
            fleet.nodes[i].name
        ));
    }
    fleet.settle(&mut log).await;
    let mut violations = Vec::new();
    let mut done = false;
    for round in 0..HEAL_ROUNDS {
        if controls.last_pass_us.is_none() {
            final_fire(&mut fleet, &mut controls, &mut log, round).await;
        }
        if round >= HEAL_LANDING {
            fleet.land(None, &mut log, &format!("heal {round}")).await;
        }
        let held = !fleet.book.held.lock().unwrap().is_empty();
        let jobs = all_jobs(&fleet).await;
        if !held && controls.last_pass_us.is_some() && jobs.iter().all(|j| j.state.is_terminal()) {
            done = true;
            break;
        }
        fleet
            .advance(Duration::from_secs(3), &mut log, &format!("heal {round}"))
            .await;
        for i in fleet.drivable() {
            let name = fleet.nodes[i].name.clone();
            for (idx, job, attempt) in fleet.journal.waiting(&name) {
                fleet.journal.release(idx, Release::Success);
                log.line(format!(
                    "heal {round}: {name} release job {job} attempt {attempt}"
                ));
                fleet.settle(&mut log).await;
            }
            let sim = &fleet.nodes[i].sim;
            let line = format!(
                "heal {round}: {name} fetch {} {} renew {} deadlines {} sweep {}",
                sim.fetch("default").await,
                sim.fetch(LIMITED).await,
                sim.renew().await.renewed,
                sim.check_deadlines().await,
                sim.sweep().await
            );
            log.line(line);
            fleet.settle(&mut log).await;
        }
        controls.drain_claims(&fleet);
    }
    let jobs = all_jobs(&fleet).await;
    if !done {
        for j in jobs.iter().filter(|j| !j.state.is_terminal()) {
            violations.push(format!(
                "liveness: job {} is still {} after {HEAL_ROUNDS} rounds without faults",
                j.id.0, j.state
            ));
        }
    }
    violations.append(&mut fleet.violations);
    let execs = fleet.journal.executions();
    // A job the operator deleted is neither lost nor a job that ran without a row.
    answered.retain(|id| !operator.deleted.contains(id));
    let kept: Vec<Execution> = execs
        .iter()
        .filter(|e| !operator.deleted.contains(&e.job_id))
        .cloned()
        .collect();
    violations.extend(crate::check::check(
        &jobs,
        &answered,
        &kept,
        &fleet.freezes,
        &fleet.blind,
    ));
    violations.extend(crate::check_operator::check(&operator.presses));
    let reader = &fleet.nodes[fleet.drivable()[0]].sim.client;
    let mut effects = std::collections::BTreeMap::new();
    for j in &jobs {
        let keys = reader.effects(j.id).await.unwrap_or_default();
        effects.insert(j.id.0, keys.into_iter().map(|e| e.key).collect::<Vec<_>>());
    }
    violations.extend(crate::check_effects::check(&jobs, &effects));
    let parents = parents(&fleet.nodes[fleet.drivable()[0]].sim.client, &jobs).await;
    let orders = fleet.journal.orders();
    let facts = Facts {
        jobs: &jobs,
        execs: &execs,
        orders: &orders,
        freezes: &fleet.freezes,
        blind: &fleet.blind,
        controls: &controls,
        parents: &parents,
    };
    violations.extend(crate::check_controls::check(&facts));
    violations.extend(crate::check_sequences::check(&facts));
    violations.extend(crate::check_deadlines::check(&facts));
    violations.extend(crate::check_replace::check(&facts));
    for j in &jobs {
        log.line(format!(
            "job {}: {} attempts {} result {:?}",
            j.id.0,
            j.state,
            j.attempts,
            j.result
                .as_ref()
                .map(|r| (r["node"].clone(), r["attempt"].clone()))
        ));
    }
    let mut rows: Vec<String> = execs
        .iter()
        .map(|e| {
            format!(
                "exec job {} attempt {} on {} {}..{:?} completed {}",
                e.job_id, e.attempt, e.node, e.started_at_us, e.ended_at_us, e.completed
            )
        })
        .collect();
    rows.sort();
    for r in rows {
        log.line(r);
    }
    let faults = fleet
        .book
        .injected
        .load(std::sync::atomic::Ordering::SeqCst);
    for n in &fleet.nodes {
        if n.status != Status::Crashed {
            n.sim.crash();
        }
    }
    RunReport {
        seed,
        hash: log.hash(),
        violations,
        log: log.lines().to_vec(),
        steps,
        faults,
        skipped: skips.clone(),
    }
}

/// Every job in the database.
async fn all_jobs(fleet: &Fleet) -> Vec<Job> {
    fleet.all_jobs().await
}

/// Enqueues, through `sim`'s client, a child of one or two recent jobs (policy `cancel` or
/// `run`) or a batch of two to four members with its callback, each on a queue the seed
/// picks; answers the log line.
async fn enqueue_dependent(
    sim: &Simulation,
    rng: &mut Rng,
    answered: &mut BTreeSet<i64>,
    operator: &mut Operator,
    made: &mut u64,
) -> String {
    let mut job = |kind: &str, rng: &mut Rng| {
        *made += 1;
        NewJob::new(kind, json!({ "n": *made }))
            .queue(*rng.pick(&QUEUES))
            .max_attempts(2 + u32::try_from(rng.below(3)).unwrap())
            .timeout(Duration::from_secs(5 + rng.below(50)))
    };
    // Never a job the operator looked at: a parent retried or deleted by hand would change
    // what the dependency checks read.
    let recent: Vec<i64> = answered
        .iter()
        .rev()
        .filter(|id| operator.may_parent(**id))
        .take(6)
        .copied()
        .collect();
    if recent.is_empty() || rng.chance(350) {
        let members = (0..2 + rng.below(3)).map(|_| job("work", rng)).collect();
        let callback = job("callback", rng);
        return match sim.client.enqueue_batch(members, callback).await {
            Ok(b) => {
                let ids: Vec<i64> = b.members.iter().map(|m| m.id.0).collect();
                answered.extend(&ids);
                answered.insert(b.callback.id.0);
                format!("batch {ids:?} → callback {}", b.callback.id.0)
            }
            Err(_) => "batch → error".into(),
        };
    }
    let mut parents = vec![JobId(*rng.pick(&recent))];
    if rng.chance(300) {
        let p = JobId(*rng.pick(&recent));
        if !parents.contains(&p) {
            parents.push(p);
        }
    }
    let policy = if rng.chance(500) {
        ParentPolicy::Cancel
    } else {
        ParentPolicy::Run
    };
    let child = job("child", rng).after(&parents).on_parent_failure(policy);
    let named: Vec<i64> = parents.iter().map(|p| p.0).collect();
    operator.named(&named);
    match sim.client.enqueue(child).await {
        Ok(e) => {
            answered.insert(e.id.0);
            format!("child {} of {named:?} ({policy:?})", e.id.0)
        }
        Err(_) => format!("child of {named:?} ({policy:?}) → error"),
    }
}

/// The final phase's last schedule pass: each live node in turn takes or keeps the
/// leadership and fires, until one leads (a crashed leader's term must expire first: the
/// heal's rounds move the clock). Records the instant of the pass that fired.
async fn final_fire(fleet: &mut Fleet, controls: &mut Controls, log: &mut EventLog, round: usize) {
    for i in fleet.drivable() {
        let sim = &fleet.nodes[i].sim;
        let term = sim.elect().await;
        let fired = sim.fire_schedules().await.unwrap();
        let name = fleet.nodes[i].name.clone();
        fleet.elected(&name, term);
        log.line(format!(
            "heal {round}: {name} elect → {term:?}, fire → {fired:?}"
        ));
        fleet.settle(log).await;
        if fired.is_some() {
            controls.last_pass_us = Some(fleet.now_us());
            return;
        }
    }
}
