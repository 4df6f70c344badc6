//! Quickstart: a scheduler on an SQLite file, a realistic mix of jobs, a periodic job firing
//! every second, progress as they run and a table of what happened to each. No set-up:
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! `main` reads as its five steps, each a function below. It exits non-zero if any job ends
//! differently from what the plan promises, so CI runs it as a test too. Set
//! `RUST_LOG=jobvisor=debug` to see the runtime's own log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobvisor::scheduler::Event;
use jobvisor::{
    handler_fn, Client, JobContext, JobError, JobId, JobOutcome, JobState, NewJob, QueueConfig,
    RetryPolicy, Schedule, Scheduler, SchedulerConfig, SchedulerHandle, Store, StoreOptions,
};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Email {
    user: String,
}

#[derive(Deserialize)]
struct Charge {
    order: u32,
    cents: u64,
}

/// A job of the mix, the outcome it should reach, and what it is meant to show.
struct Planned {
    job: NewJob,
    want: JobState,
    promise: &'static str,
}

/// An enqueued job of the mix.
struct Enqueued {
    id: JobId,
    kind: String,
    want: JobState,
    promise: &'static str,
}

/// Job ids to kinds, for the event printer.
type Names = Arc<Mutex<BTreeMap<JobId, String>>>;

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    quiet_logs_and_panics();
    // Step 1: a store on a fresh SQLite file, migrated.
    let store = open_store().await?;
    // Step 2: a scheduler with two queues, a handler per kind and a periodic job.
    let scheduler = start_scheduler(store)?;
    let client = scheduler.client();
    let started = Instant::now();
    // Step 3: print what happens as it happens.
    let names: Names = Arc::default();
    let printer = actix::spawn(print_events(scheduler.events(), names.clone(), started));
    // Step 4: enqueue the mix (and one duplicate), cancel two of its jobs.
    let (jobs, dup) = enqueue_plan(&client, &names).await?;
    cancel_two(&client, &jobs).await?;
    // Step 5: wait for every job, check each against its promise, print the table.
    let mut failures = check_outcomes(&client, &jobs, dup).await?;
    failures += check_periodic(&client).await?;
    printer.abort();
    let report = scheduler.shutdown().await;
    println!(
        "took {:.1}s; shutdown: {} finished, {} leases given back",
        started.elapsed().as_secs_f64(),
        report.finished,
        report.released
    );
    if failures > 0 {
        eprintln!("{failures} job(s) ended differently than planned");
        std::process::exit(1);
    }
    Ok(())
}

/// No runtime log unless `RUST_LOG` asks; a handler's panic (caught and recorded as a failure
/// with code `panic`) printed as one line instead of the default hook's backtrace.
fn quiet_logs_and_panics() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .init();
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("         (a handler panicked: {msg})");
    }));
}

/// A fresh SQLite file: created, migrated, WAL mode. Nothing to install. One per process, so
/// two runs at once (two terminals, two CI jobs) never share — or delete — each other's jobs.
async fn open_store() -> jobvisor::Result<Store> {
    let path =
        std::env::temp_dir().join(format!("jobvisor-quickstart-{}.sqlite", std::process::id()));
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
    }
    let url = format!("sqlite://{}", path.display());
    let store = Store::connect_with(&url, StoreOptions::default().migrate(true)).await?;
    println!("jobvisor quickstart — jobs stored in {}\n", path.display());
    Ok(store)
}

/// The scheduler: short lease and heartbeat so that a cancel reaches a running job within a
/// second, a handler for each kind of the mix, and a periodic job.
fn start_scheduler(store: Store) -> jobvisor::Result<SchedulerHandle> {
    Scheduler::builder(store)
        .config(
            // Short lease and heartbeat so a cancel reaches a running job within a second.
            SchedulerConfig::default()
                .lease(Duration::from_secs(3))
                .renew_every(Duration::from_secs(1))
                .retry(RetryPolicy {
                    base: Duration::from_millis(300),
                    factor: 2.0,
                    cap: Duration::from_secs(2),
                    jitter: 0.2,
                }),
        )
        .queue(
            "default",
            QueueConfig::default()
                .concurrency(4)
                .poll_interval(Duration::from_millis(200)),
        )
        .queue(
            "mail",
            QueueConfig::default()
                .concurrency(2)
                .poll_interval(Duration::from_millis(200)),
        )
        .handler(
            "send_welcome_email",
            handler_fn(|email: Email, _ctx| async move {
                tokio::time::sleep(Duration::from_millis(80)).await;
                JobOutcome::success(format!("welcome mail sent to {}", email.user))
            }),
        )
        .handler(
            "charge_card",
            handler_fn(|c: Charge, ctx: JobContext| async move {
                if ctx.attempt == 1 {
                    return Err(JobError::retry("card network timed out").with_code("network"));
                }
                JobOutcome::success(json!({"order": c.order, "charged_cents": c.cents}))
            }),
        )
        .handler(
            "parse_invoice",
            handler_fn(|_: Value, _ctx| async move {
                Err::<JobOutcome, _>(
                    JobError::fail("invoice 17 is not a PDF").with_code("bad_input"),
                )
            }),
        )
        .handler(
            "resize_image",
            handler_fn(|_: Value, _ctx| async move {
                if true {
                    panic!("image decoder crashed on a truncated PNG");
                }
                JobOutcome::done()
            }),
        )
        .handler(
            "build_report",
            handler_fn(|_: Value, ctx: JobContext| async move {
                // Far slower than its 500 ms timeout; it stops when told to.
                ctx.cancelled().await;
                Err::<JobOutcome, _>(JobError::retry("interrupted"))
            }),
        )
        .handler(
            "long_export",
            handler_fn(|_: Value, ctx: JobContext| async move {
                ctx.cancelled().await;
                Err::<JobOutcome, _>(JobError::retry("export interrupted"))
            }),
        )
        .handler(
            "send_reminder",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("reminder sent") }),
        )
        .handler(
            "sync_account",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("account synced") }),
        )
        .handler(
            "nightly_cleanup",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("cleaned") }),
        )
        // A periodic job: fired by the database's leader (this node), one job per fire.
        .periodic(Schedule::every(
            "heartbeat",
            Duration::from_secs(1),
            NewJob::new("heartbeat", json!({})),
        ))
        .handler(
            "heartbeat",
            handler_fn(|_: Value, _ctx| async { JobOutcome::success("beat") }),
        )
        .start()
}

/// Prints each event of the mix as it happens (the periodic job's own runs are left out).
async fn print_events(
    mut events: tokio::sync::broadcast::Receiver<Event>,
    names: Names,
    started: Instant,
) {
    while let Ok(e) = events.recv().await {
        let t = started.elapsed().as_secs_f64();
        let name = |id: &JobId| {
            names
                .lock()
                .map(|m| m.get(id).cloned().unwrap_or_default())
                .unwrap_or_default()
        };
        match e {
            Event::ScheduleFired { name, fires, .. } => {
                println!("{t:6.2}s  schedule {name:?} fired ({fires} job)")
            }
            // The periodic job's own runs are not listed below.
            Event::Claimed { id, .. } | Event::Finished { id, .. } if name(&id).is_empty() => {}
            Event::Claimed { id, attempt, .. } => {
                println!(
                    "{t:6.2}s  #{id:<3} {:<20} started (attempt {attempt})",
                    name(&id)
                )
            }
            Event::Finished {
                id, state, code, ..
            } => {
                let what = match (state, code) {
                    (JobState::Succeeded, _) => "succeeded".to_string(),
                    (JobState::Retrying, Some(c)) => format!("failed ({c}), will retry"),
                    (JobState::Dead, Some(c)) => format!("failed ({c}), dead"),
                    (JobState::Cancelled, _) => "cancelled while running".to_string(),
                    (s, _) => s.to_string(),
                };
                println!("{t:6.2}s  #{id:<3} {:<20} {what}", name(&id))
            }
            Event::TimedOut { id, .. } => {
                println!(
                    "{t:6.2}s  #{id:<3} {:<20} ran past its timeout, stopped",
                    name(&id)
                )
            }
            Event::CancelSignalled { id, .. } => {
                println!(
                    "{t:6.2}s  #{id:<3} {:<20} cancel requested, handler signalled",
                    name(&id)
                )
            }
            _ => {}
        }
    }
}

/// The mix, each job with the outcome it should reach.
fn the_plan() -> Vec<Planned> {
    vec![
        Planned {
            job: NewJob::new("send_welcome_email", json!({"user": "ada@example.com"}))
                .queue("mail"),
            want: JobState::Succeeded,
            promise: "succeeds",
        },
        Planned {
            job: NewJob::new("send_welcome_email", json!({"user": "alan@example.com"}))
                .queue("mail"),
            want: JobState::Succeeded,
            promise: "succeeds",
        },
        Planned {
            job: NewJob::new("charge_card", json!({"order": 1001, "cents": 4200})),
            want: JobState::Succeeded,
            promise: "fails, then succeeds on retry",
        },
        Planned {
            job: NewJob::new("parse_invoice", json!({"invoice": 17})),
            want: JobState::Dead,
            promise: "fails permanently",
        },
        Planned {
            job: NewJob::new("resize_image", json!({"image": "cat.png"})).max_attempts(2),
            want: JobState::Dead,
            promise: "panics on every attempt",
        },
        Planned {
            job: NewJob::new("build_report", json!({"month": "2026-10"}))
                .timeout(Duration::from_millis(500))
                .max_attempts(2),
            want: JobState::Dead,
            promise: "times out twice",
        },
        Planned {
            job: NewJob::new("send_reminder", json!({"user": 7})).delay(Duration::from_secs(2)),
            want: JobState::Succeeded,
            promise: "runs after a 2 s delay",
        },
        Planned {
            job: NewJob::new("nightly_cleanup", json!({})).delay(Duration::from_secs(3600)),
            want: JobState::Cancelled,
            promise: "cancelled before it runs",
        },
        Planned {
            job: NewJob::new("long_export", json!({"rows": 1_000_000})),
            want: JobState::Cancelled,
            promise: "cancelled while running",
        },
        Planned {
            job: NewJob::new("sync_account", json!({"account": 42})).unique_key("account:42"),
            want: JobState::Succeeded,
            promise: "enqueued twice, runs once",
        },
    ]
}

/// Enqueues the mix, then a second `sync_account` with the same unique key, which returns
/// the first one's id.
async fn enqueue_plan(
    client: &Client,
    names: &Names,
) -> jobvisor::Result<(Vec<Enqueued>, jobvisor::Enqueued)> {
    let mut jobs = Vec::new();
    for Planned { job, want, promise } in the_plan() {
        let kind = job.kind.clone();
        let e = client.enqueue(job).await?;
        if let Ok(mut m) = names.lock() {
            m.insert(e.id, kind.clone());
        }
        jobs.push(Enqueued {
            id: e.id,
            kind,
            want,
            promise,
        });
    }
    let dup = client
        .enqueue(NewJob::new("sync_account", json!({"account": 42})).unique_key("account:42"))
        .await?;
    println!(
        "  0.00s  enqueued {} jobs; a second sync_account with key account:42 returned job #{} (duplicate: {})\n",
        jobs.len(),
        dup.id,
        dup.duplicate
    );
    Ok((jobs, dup))
}

/// The mix's job of `kind`.
fn job_of(jobs: &[Enqueued], kind: &str) -> JobId {
    jobs.iter()
        .find(|j| j.kind == kind)
        .map(|j| j.id)
        .expect("the plan has a job of each kind it cancels")
}

/// Cancels the nightly cleanup before it runs, and the export once it is running.
async fn cancel_two(client: &Client, jobs: &[Enqueued]) -> jobvisor::Result<()> {
    client.cancel(job_of(jobs, "nightly_cleanup")).await?;
    let export = job_of(jobs, "long_export");
    while client.get(export).await?.state != JobState::Running {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.cancel(export).await?;
    Ok(())
}

/// Waits for every job of the mix, prints the table of what happened and the live jobs by
/// state; answers how many jobs ended differently from their promise.
async fn check_outcomes(
    client: &Client,
    jobs: &[Enqueued],
    dup: jobvisor::Enqueued,
) -> jobvisor::Result<usize> {
    let mut failures = usize::from(dup.id != job_of(jobs, "sync_account"));
    let mut rows = Vec::new();
    for planned in jobs {
        rows.push((
            planned,
            client.wait(planned.id, Duration::from_secs(60)).await?,
        ));
    }
    println!(
        "\n{:<4} {:<19} {:<10} {:>8}  {:<31} result / last error",
        "job", "kind", "state", "attempts", "meant to"
    );
    println!("{}", "-".repeat(118));
    for (planned, job) in rows {
        let detail = match (&job.result, &job.last_error) {
            (Some(r), _) => r.to_string(),
            (None, Some(e)) => format!("{}: {}", e.code, e.message),
            _ => "—".to_string(),
        };
        let ok = job.state == planned.want;
        failures += usize::from(!ok);
        let mark = if ok { "" } else { "   <-- unexpected" };
        let detail: String = detail.chars().take(48).collect();
        println!(
            "#{:<3} {:<19} {:<10} {:>8}  {:<31} {detail}{mark}",
            planned.id,
            planned.kind,
            job.state.to_string(),
            job.attempts,
            planned.promise
        );
    }
    let mut by_state = BTreeMap::<String, u64>::new();
    for c in client.counts().await? {
        *by_state.entry(c.state.to_string()).or_default() += c.count;
    }
    let summary: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!("\nlive jobs by state: {}", summary.join(", "));
    Ok(failures)
}

/// The periodic job fires once a second; on a busy machine, give it a few more. Answers 1 if
/// it never fired.
async fn check_periodic(client: &Client) -> jobvisor::Result<usize> {
    let heartbeats = jobvisor::ListParams {
        kind: Some("heartbeat".into()),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.list(heartbeats.clone()).await?.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let beats = client.list(heartbeats).await?.len();
    println!("periodic job \"heartbeat\": {beats} fire(s), one job each");
    if beats == 0 {
        eprintln!("the periodic job never fired");
        return Ok(1);
    }
    Ok(0)
}
