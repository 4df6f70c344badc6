//! The `steady` modes (only when named): jobs arrive at a fixed rate for a set time while a node
//! runs them, and every interval (default a minute) a row of the run prints — what arrived and
//! finished, the pickup, the jobs table's bloat (`bloat.rs`; dead tuples or the history list
//! also read every second, their mean and peak) and this process's CPU.
//!
//! * Arrivals are an open loop: a pacer stamps job `i` due at `t0 + i / rate` — it sleeps until
//!   that instant, or sends at once when behind — and hands it to 10 producer tasks (raw SQL:
//!   each with a connection of its own; jobvisor: one client, whose pool of 10 serves them) that
//!   enqueue one job per statement and transaction. A slow enqueue delays the producer, never
//!   the next arrival: the pickup runs from the due instant, so a queue of arrivals waiting
//!   for a producer counts in it (and the rows' `unsent` column counts that queue).
//! * Each job sleeps a time drawn from `--job-ms A-B` (default 1–50 ms, uniform), a function of
//!   the seed (`--seed`) and the job's number, so every run of a seed runs the same jobs.
//! * `steady`: one jobvisor node with default settings (the archiver, sweeper, heartbeat and
//!   timings as an application gets them) and one queue of concurrency C (default 50: the
//!   default 10 runs at most 10 / 25.5 ms ≈ 390 jobs/s of the default job times); the producers
//!   enqueue through a client on a store of their own, as another process would. Pickup: the
//!   due instant → the handler's start; completed: finishes the node has written.
//! * `steady-raw` (PostgreSQL): the same arrivals inserted by raw SQL (quiet, announced after
//!   the commit, as the store's own enqueues are), and C raw workers
//!   (`steady_raw.rs`) claiming one job at a time with `FOR UPDATE SKIP LOCKED`; pickup: the
//!   due instant → the claim's return.
//!
//! Neither deletes a finished job within a run (jobvisor archives a success 24 h after it), so
//! the live table grows by what finishes; the figures show what that growth costs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use jobvisor::testing::TestDb;
use jobvisor::{handler_fn, Backend, Client, JobOutcome, NewJob, QueueConfig, Scheduler};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::bloat::{BloatProbe, Swing};
use crate::modes::percentile;
use crate::raw::RawInserter;

/// Producer tasks: as many as connections in a store's default pool.
const PRODUCERS: usize = 10;

/// What a steady run is asked for.
#[derive(Clone, Copy)]
pub(crate) struct Steady {
    /// Arrivals per second.
    pub(crate) rate: f64,
    /// How long jobs arrive.
    pub(crate) duration: Duration,
    /// How often a row prints.
    pub(crate) every: Duration,
    /// The shortest and longest job, in ms.
    pub(crate) job_ms: (u64, u64),
    pub(crate) seed: u64,
    /// The queue's concurrency (raw SQL: its workers).
    pub(crate) concurrency: u32,
}

impl Steady {
    /// Job `i`'s time, in ms: uniform in `job_ms`, a function of the seed and `i`
    /// (SplitMix64).
    pub(crate) fn job_ms(&self, i: u64) -> u64 {
        let mut z = self
            .seed
            .wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let (lo, hi) = self.job_ms;
        lo + z % (hi.saturating_sub(lo) + 1)
    }
}

/// The instant payloads' `t_ms` count from.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds from [`epoch`] to `at`.
pub(crate) fn ms_since_epoch(at: Instant) -> f64 {
    at.duration_since(epoch()).as_secs_f64() * 1000.0
}

/// One job's payload: its due instant (`t_ms`) and how long it runs (`ms`).
fn payload(s: &Steady, i: u64, due: Instant) -> Value {
    json!({"t_ms": ms_since_epoch(due), "ms": s.job_ms(i)})
}

/// Counters of the current interval, taken (and reset) as each row prints.
#[derive(Default)]
pub(crate) struct Tally {
    /// Arrivals due so far (the whole run).
    due: AtomicU64,
    /// Arrivals enqueued so far (the whole run).
    sent: AtomicU64,
    enqueued: AtomicU64,
    /// Raw SQL's finishes (jobvisor's come from the node's statistics).
    pub(crate) completed: AtomicU64,
    /// Pickups of the interval, ms.
    pickups: Mutex<Vec<f64>>,
}

impl Tally {
    /// Records a job whose handler starts now, `t_ms` being its due instant.
    pub(crate) fn picked(&self, t_ms: f64) {
        let ms = ms_since_epoch(Instant::now()) - t_ms;
        if let Ok(mut v) = self.pickups.lock() {
            v.push(ms);
        }
    }

    fn take_pickups(&self) -> Vec<f64> {
        self.pickups
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Where the producers send jobs.
enum Producer {
    Jobvisor(Client),
    /// A raw inserter and its announcer's bell, rung after each commit.
    Raw(RawInserter, Arc<tokio::sync::Notify>),
}

impl Producer {
    async fn send(&mut self, job: Value) {
        match self {
            Producer::Jobvisor(c) => {
                c.enqueue(NewJob::new("work", job)).await.expect("enqueue");
            }
            Producer::Raw(r, announce) => {
                r.insert_payload(&job.to_string()).await;
                announce.notify_one();
            }
        }
    }
}

/// Starts the pacer and the producers: jobs arrive from now for `s.duration`.
fn arrivals(
    s: Steady,
    producers: Vec<Producer>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (tx, rx) = mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut tasks: Vec<_> = producers
        .into_iter()
        .map(|mut p| {
            let (rx, tally) = (rx.clone(), tally.clone());
            tokio::spawn(async move {
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some((i, due)) = next else { return };
                    p.send(payload(&s, i, due)).await;
                    tally.enqueued.fetch_add(1, Relaxed);
                    tally.sent.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    tasks.push(tokio::spawn(async move {
        let t0 = tokio::time::Instant::now();
        let total = (s.rate * s.duration.as_secs_f64()).round() as u64;
        for i in 0..total {
            let due = t0 + Duration::from_secs_f64(i as f64 / s.rate);
            tokio::time::sleep_until(due).await;
            tally.due.fetch_add(1, Relaxed);
            if tx.send((i, due.into_std())).is_err() {
                return;
            }
        }
    }));
    tasks
}

/// This process's CPU time (user + system), seconds, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here; in clock ticks of
    // 1/100 s (Linux's USER_HZ).
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

/// Prints a row every `s.every` until the arrivals end; `completed` reads the finishes so far.
/// The rows, as JSON.
async fn watch(
    backend: Backend,
    label: &str,
    s: &Steady,
    url: &str,
    tally: &Tally,
    completed: impl Fn() -> u64,
) -> Vec<Value> {
    let mut probe = BloatProbe::open(backend, url).await;
    let mut prev = probe.read().await;
    let (mut done_before, mut cpu_before) = (completed(), cpu_seconds());
    let t0 = tokio::time::Instant::now();
    let intervals = (s.duration.as_secs_f64() / s.every.as_secs_f64())
        .ceil()
        .max(1.0) as u32;
    let mut rows = Vec::new();
    for k in 1..=intervals {
        let end = (t0 + s.every * k).min(t0 + s.duration);
        let mut swing = Swing::default();
        loop {
            let now = tokio::time::Instant::now();
            if now >= end {
                break;
            }
            tokio::time::sleep_until((now + Duration::from_secs(1)).min(end)).await;
            if let Some(v) = probe.swing().await {
                swing.add(v);
            }
        }
        let secs = (end - (t0 + s.every * (k - 1))).as_secs_f64();
        let enqueued = tally.enqueued.swap(0, Relaxed);
        let done = completed();
        let cpu = cpu_seconds();
        let mut pickups = tally.take_pickups();
        pickups.sort_by(f64::total_cmp);
        let bloat = probe.read().await;
        let pct = |p: f64| {
            if pickups.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", percentile(&pickups, p))
            }
        };
        let mut cols = vec![
            ("minute", format!("{:.1}", (end - t0).as_secs_f64() / 60.0)),
            ("enqueued", enqueued.to_string()),
            ("completed", (done - done_before).to_string()),
            (
                "unsent",
                (tally.due.load(Relaxed))
                    .saturating_sub(tally.sent.load(Relaxed))
                    .to_string(),
            ),
            (
                "jobs/s",
                format!("{:.0}", (done - done_before) as f64 / secs),
            ),
            ("pickup p50 ms", pct(0.5)),
            ("p99 ms", pct(0.99)),
        ];
        cols.extend(bloat.columns(backend, &prev));
        cols.extend(swing.columns(backend));
        cols.push(("CPU s", format!("{:.1}", cpu - cpu_before)));
        if k == 1 {
            print_header(label, &cols);
        }
        println!(
            "| {} |",
            cols.iter()
                .map(|c| c.1.as_str())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let mut row = json!({"bench": label, "backend": crate::name(backend)});
        for (h, v) in &cols {
            row[*h] = json!(v);
        }
        rows.push(row);
        (prev, done_before, cpu_before) = (bloat, done, cpu);
    }
    rows
}

fn print_header(label: &str, cols: &[(&str, String)]) {
    println!("\n{label}:\n");
    println!(
        "| {} |",
        cols.iter().map(|c| c.0).collect::<Vec<_>>().join(" | ")
    );
    println!("|{}", "---|".repeat(cols.len()));
}

/// `steady`: a jobvisor node under the arrivals. The rows, as JSON lines.
pub(crate) async fn steady(backend: Backend, s: Steady) -> Vec<Value> {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let tally = Arc::new(Tally::default());
    let t = tally.clone();
    let handle = Scheduler::builder(store)
        .queue("default", QueueConfig::default().concurrency(s.concurrency))
        .handler(
            "work",
            handler_fn(move |p: Value, _ctx| {
                t.picked(p["t_ms"].as_f64().unwrap_or(0.0));
                let ms = p["ms"].as_u64().unwrap_or(0);
                async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    JobOutcome::done()
                }
            }),
        )
        .start()
        .expect("scheduler");
    let client = Client::new(db.store().await);
    let producers = (0..PRODUCERS)
        .map(|_| Producer::Jobvisor(client.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await; // the node settles
    let label = format!(
        "steady, jobvisor, {} {}/s for {} s, concurrency {}",
        crate::name(backend),
        s.rate,
        s.duration.as_secs(),
        s.concurrency
    );
    let tasks = arrivals(s, producers, tally.clone());
    let rows = watch(backend, &label, &s, &db.url, &tally, || {
        handle.stats().finished
    })
    .await;
    for t in tasks {
        t.await.ok();
    }
    handle.shutdown().await;
    rows
}

/// `steady-raw` (PostgreSQL): raw SQL under the same arrivals. The rows, as JSON lines.
pub(crate) async fn steady_raw(s: Steady) -> Vec<Value> {
    let db = TestDb::create(Backend::Postgres).await;
    let _store = db.store().await; // the schema
    let tally = Arc::new(Tally::default());
    let workers = crate::steady_raw::start(&db.url, s.concurrency, tally.clone()).await;
    let announcer = crate::steady_raw::Announcer::start(&db.url).await;
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        producers.push(Producer::Raw(
            RawInserter::open_quiet(&db.url).await,
            announcer.handle(),
        ));
    }
    let label = format!(
        "steady, raw SQL, postgres {}/s for {} s, {} workers",
        s.rate,
        s.duration.as_secs(),
        s.concurrency
    );
    let tasks = arrivals(s, producers, tally.clone());
    let rows = watch(Backend::Postgres, &label, &s, &db.url, &tally, || {
        tally.completed.load(Relaxed)
    })
    .await;
    for t in tasks {
        t.await.ok();
    }
    workers.stop().await;
    announcer.stop();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64) -> Steady {
        Steady {
            rate: 800.0,
            duration: Duration::from_secs(60),
            every: Duration::from_secs(60),
            job_ms: (1, 50),
            seed,
            concurrency: 50,
        }
    }

    #[test]
    fn job_times_are_the_seeds_and_cover_the_range_evenly() {
        let (a, b) = (run(56), run(57));
        let times: Vec<u64> = (0..100_000).map(|i| a.job_ms(i)).collect();
        assert!(times.iter().all(|&t| (1..=50).contains(&t)));
        assert_eq!(
            times,
            (0..100_000).map(|i| run(56).job_ms(i)).collect::<Vec<_>>()
        );
        let differ = (0..1_000).filter(|&i| a.job_ms(i) != b.job_ms(i)).count();
        assert!(
            differ > 900,
            "another seed, other jobs: {differ} of 1000 differ"
        );
        // Uniform: each of the 50 values about 2,000 times, the mean about 25.5 ms.
        let mut seen = [0u32; 51];
        for &t in &times {
            seen[t as usize] += 1;
        }
        assert!(
            seen[1..].iter().all(|&n| (1_700..2_300).contains(&n)),
            "{seen:?}"
        );
        let mean = times.iter().sum::<u64>() as f64 / times.len() as f64;
        assert!((mean - 25.5).abs() < 0.3, "mean {mean}");
    }

    #[test]
    fn cpu_seconds_count_this_process() {
        // Spinning uses CPU time however loaded the machine: it shows within 30 s (a field
        // misread, say a constant one, never moves).
        let before = cpu_seconds();
        let t0 = Instant::now();
        let mut x = 0u64;
        while cpu_seconds() - before < 0.2 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no CPU time counted"
            );
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }
}
