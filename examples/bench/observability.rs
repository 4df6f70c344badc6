//! The observability modes: `metrics` (what recording costs a drain), `gauges` (what the
//! database-wide gauges cost on a large table) and `maintenance` (what the Sweeper and the
//! Archiver, which run on every node, cost the database when they find nothing to do).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use jobvisor::clock::ManualClock;
use jobvisor::config::{DEFAULT_ARCHIVE_EVERY, DEFAULT_SWEEP_EVERY};
use jobvisor::metrics::{prometheus_builder, DatabaseGauges, MIN_GAUGE_INTERVAL};
use jobvisor::testing::{exec_sql, Simulation, TestDb};
use jobvisor::Backend;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusRecorder;
use serde_json::{json, Value};

use crate::modes::{drain_on, fill};
use crate::scale::{analyze, fill_archive, fill_sql};

/// A Prometheus recorder that can be switched off: off, every call gets a no-op handle, as
/// with no recorder at all. A recorder is installed once per process, so this is how one run
/// compares a drain without metrics and with them, round after round.
struct Toggle {
    on: AtomicBool,
    inner: PrometheusRecorder,
}

impl Recorder for Toggle {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_counter(k, u, d);
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_gauge(k, u, d);
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_histogram(k, u, d);
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, m)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, m)
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, m)
        } else {
            Histogram::noop()
        }
    }
}

/// The process's toggled recorder (installed at first use) and its upkeep thread.
fn toggle() -> &'static Arc<Toggle> {
    static T: OnceLock<Arc<Toggle>> = OnceLock::new();
    T.get_or_init(|| {
        let inner = prometheus_builder().expect("buckets").build_recorder();
        let handle = inner.handle();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(5));
            handle.run_upkeep();
        });
        let t = Arc::new(Toggle {
            on: AtomicBool::new(false),
            inner,
        });
        metrics::set_global_recorder(ArcRecorder(t.clone())).expect("the only recorder");
        t
    })
}

struct ArcRecorder(Arc<Toggle>);

impl Recorder for ArcRecorder {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d);
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d);
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d);
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}

/// `rounds` × (a drain with metrics off, one with them on — the Prometheus recorder, every
/// metric of a node), alternating so drift hits both alike. Answers (median off, median on,
/// the figures).
pub(crate) async fn drain_with_metrics(
    backend: Backend,
    n: usize,
    c: u32,
    prefetch: Option<u32>,
    rounds: usize,
) -> (f64, f64, Value) {
    let t = toggle();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Which goes first alternates too.
        for enabled in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            t.on.store(enabled, Ordering::Relaxed);
            let db = TestDb::create(backend).await;
            let store = db.store().await;
            fill(&store, n).await;
            let (r, _) = drain_on(store, n, c, prefetch).await;
            eprintln!(
                "  metrics {}: {r:.0} jobs/s",
                if enabled { "on" } else { "off" }
            );
            if enabled { &mut on } else { &mut off }.push(r);
        }
    }
    t.on.store(false, Ordering::Relaxed);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let extra = json!({"off": off.clone(), "on": on.clone()});
    (median(&mut off), median(&mut on), extra)
}

/// The database-wide gauges over `rows` live jobs (half succeeded, half waiting; five queues,
/// three priorities): the time of a refresh that takes the turn and counts (`rounds` times,
/// median and max), of one that only reads the stored row, and the interval the default one
/// stretches to (counting takes at most 2 % of the time).
pub(crate) async fn gauge_cost(backend: Backend, rows: usize, rounds: usize) -> Value {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let t0 = Instant::now();
    fill_sql(backend, &store, rows).await;
    for sql in [
        "UPDATE jobvisor_jobs SET state = 'succeeded' WHERE id % 2 = 0",
        "UPDATE jobvisor_jobs SET queue = 'q1', priority = 1 WHERE id % 5 = 1",
        "UPDATE jobvisor_jobs SET queue = 'q2', priority = 2 WHERE id % 5 = 2",
        "UPDATE jobvisor_jobs SET queue = 'q3' WHERE id % 5 = 3",
        "UPDATE jobvisor_jobs SET queue = 'q4' WHERE id % 5 = 4",
    ] {
        exec_sql(&store, sql).await.expect("shape the table");
    }
    settle(backend, &store, rows, t0).await;
    let mut counter =
        DatabaseGauges::new(store.clone(), "bench-a", MIN_GAUGE_INTERVAL).expect("gauges");
    let mut reader =
        DatabaseGauges::new(store.clone(), "bench-b", MIN_GAUGE_INTERVAL).expect("gauges");
    let (mut counts, mut reads) = (Vec::new(), Vec::new());
    let mut last = Duration::ZERO;
    for _ in 0..rounds {
        // The next turn comes after the interval, or 50 times the last count's duration.
        tokio::time::sleep(MIN_GAUGE_INTERVAL.max(last * 51)).await;
        let t = Instant::now();
        assert!(
            counter.refresh().await.expect("refresh"),
            "the turn was free"
        );
        last = t.elapsed();
        counts.push(last.as_secs_f64() * 1000.0);
        let t = Instant::now();
        assert!(!reader.refresh().await.expect("read"), "the turn was taken");
        reads.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    counts.sort_by(f64::total_cmp);
    reads.sort_by(f64::total_cmp);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    json!({
        "live_rows": rows,
        "rounds": rounds,
        "counting_refresh_ms_median": r1(counts[counts.len() / 2]),
        "counting_refresh_ms_max": r1(counts[counts.len() - 1]),
        "reading_refresh_ms_median": r1(reads[reads.len() / 2]),
        "statements_counting": 6,
        "statements_reading": 2,
        "interval_s_at_default": r1((counts[counts.len() / 2] * 50.0 / 1000.0).max(15.0)),
    })
}

/// The idle passes of the Sweeper and the Archiver on a busy table of `rows` live jobs (10 %
/// running under unexpired leases, 40 % pending, 50 % succeeded too recently to archive) and
/// `rows / 2` archived ones too recent to prune: each pass's time, medians over `rounds`, and
/// the share of one database connection a node spends on them at the default intervals.
pub(crate) async fn maintenance_cost(backend: Backend, rows: usize, rounds: usize) -> Value {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let t0 = Instant::now();
    fill_sql(backend, &store, rows).await;
    fill_archive(backend, &store, rows / 2).await;
    let far = chrono::Utc::now().timestamp_micros() + 3_600_000_000;
    let now = chrono::Utc::now().timestamp_micros();
    // In slices of 100,000 ids: one statement over a million rows outgrows InnoDB's lock
    // table at its default buffer pool.
    for from in (0..rows).step_by(100_000) {
        let slice = format!("id > {from} AND id <= {}", from + 100_000);
        for sql in [
            format!(
                "UPDATE jobvisor_jobs SET state = 'running', lease_owner = 'elsewhere', \
                 lease_token = 'x', lease_expires_at = {far}, started_at = {now}, \
                 attempts = 1 WHERE id % 10 = 0 AND {slice}"
            ),
            format!(
                "UPDATE jobvisor_jobs SET state = 'succeeded', finished_at = {now}, \
                 attempts = 1 WHERE id % 2 = 1 AND {slice}"
            ),
        ] {
            exec_sql(&store, &sql).await.expect("shape the table");
        }
    }
    settle(backend, &store, rows, t0).await;
    let sim = Simulation::on_store(
        store.clone(),
        ManualClock::new(chrono::Utc::now()),
        "bench-maintenance",
        |b| {
            b.handler(
                "noop",
                jobvisor::handler_fn(|_: Value, _ctx| async { jobvisor::JobOutcome::success(()) }),
            )
        },
    );
    let (mut sweeps, mut archives) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        assert_eq!(sim.sweep().await, 0, "nothing to reclaim");
        sweeps.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let report = sim.archive().await;
        archives.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(report.moved, 0, "nothing to archive: {report:?}");
    }
    sweeps.sort_by(f64::total_cmp);
    archives.sort_by(f64::total_cmp);
    let med = |v: &[f64]| v[v.len() / 2];
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    let share = med(&sweeps) / DEFAULT_SWEEP_EVERY.as_secs_f64() / 1000.0
        + med(&archives) / DEFAULT_ARCHIVE_EVERY.as_secs_f64() / 1000.0;
    json!({
        "live_rows": rows,
        "archived_rows": rows / 2,
        "rounds": rounds,
        "sweep_pass_ms_median": r2(med(&sweeps)),
        "sweep_pass_ms_max": r2(sweeps[sweeps.len() - 1]),
        "archive_pass_ms_median": r2(med(&archives)),
        "archive_pass_ms_max": r2(archives[archives.len() - 1]),
        "connection_share_per_node_pct": (share * 100.0 * 1000.0).round() / 1000.0,
    })
}

/// After reshaping a filled table: fresh statistics (and, on PostgreSQL, a vacuum, so the
/// visibility map is as a running system's would be); reports how long the fill took.
async fn settle(backend: Backend, store: &jobvisor::Store, rows: usize, t0: Instant) {
    analyze(backend, store).await;
    if backend == Backend::Postgres {
        exec_sql(store, "VACUUM jobvisor_jobs")
            .await
            .expect("vacuum");
    }
    eprintln!("  {rows} rows ready in {:.0} s", t0.elapsed().as_secs_f64());
}
