//! What the multi-process tests share — the crash family (`tests/crash/`), the outage
//! and soak tests (`tests/outage.rs`, `tests/soak.rs`) and the network-partition test
//! (`tests/partition/`): building the `crash_node` example, one node process and how it
//! ends, host commands, the run's directory, retries of driver-side database calls and the
//! runtime the drivers run on; the side tables and journal lines shared with the node
//! ([`side`]); the journals' reader and fold, keyed by claim id ([`journal`]); the
//! invariants checked of every job's executions ([`invariants`]); private database servers
//! ([`server`]) and a private Galera cluster ([`galera`]). Each test keeps its own fleet and the rules of its own faults around the
//! shared invariants (freezes and kills in one, namespaces and cuts in another).

// Each test uses a part of this module (and the node another part of `side`).
#![allow(dead_code)]

pub(crate) mod galera;
pub(crate) mod invariants;
pub(crate) mod journal;
pub(crate) mod ledger;
pub(crate) mod server;
pub(crate) mod side;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use jobvisor::testing::{EnqueueParams, StoreEngine as _};
use jobvisor::{Job, JobState, ListParams, NewJob, Store};
use serde_json::json;

use self::side::{now_us, NodeRow};

/// The `crash_node` example, built once per test process (see the module docs of
/// `tests/crash/`).
pub(crate) fn node_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("JOBVISOR_CRASH_NODE_BIN") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "JOBVISOR_CRASH_NODE_BIN={} is not a file",
                p.display()
            );
            return p;
        }
        // The test runs as <target-dir>/<profile>/deps/<test>-<hash>; the example goes to
        // <target-dir>/<profile>/examples/crash_node.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("cannot find the target directory of {}", exe.display()));
        let target_dir = profile_dir.parent().unwrap();
        let profile = profile_dir.file_name().and_then(|s| s.to_str());
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
        let mut cmd = Command::new(&cargo);
        // Without the variables cargo sets for a running test: build scripts that track them
        // (ring's reads `CARGO_PKG_NAME` and `CARGO_MANIFEST_DIR`) would see them change
        // between this build and the test's own, and each `cargo test` after it would build
        // ring and everything above it again (1.5 minutes a test in .ci/crash).
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(set_by_cargo_for_tests) {
                cmd.env_remove(&name);
            }
        }
        // `--all-features`: the feature set `cargo test --all-features` (.ci/test, .ci/crash)
        // builds everything with, so the node reuses that build instead of compiling the
        // library once more.
        cmd.args(["build", "--example", "crash_node", "--all-features"])
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir);
        match profile {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            other => panic!(
                "the test runs from profile directory {other:?}; build crash_node yourself and \
                 set JOBVISOR_CRASH_NODE_BIN"
            ),
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running {cargo} build --example crash_node: {e}"));
        assert!(
            status.success(),
            "cargo build --example crash_node: {status}"
        );
        let bin = profile_dir.join("examples").join("crash_node");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
    .clone()
}

/// A running node process (in the partition test, inside its namespace).
#[derive(Debug)]
pub(crate) struct NodeProc {
    pub(crate) name: String,
    pub(crate) child: Child,
    /// Closing it asks the node to shut down gracefully.
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) spawned_at_us: i64,
}

impl NodeProc {
    /// Takes over node `name`, just spawned with a piped standard input.
    pub(crate) fn new(name: String, mut child: Child) -> NodeProc {
        let stdin = child.stdin.take();
        NodeProc {
            name,
            child,
            stdin,
            spawned_at_us: now_us(),
        }
    }

    /// A node must not exit by itself while the run goes on; `dir` holds its log.
    pub(crate) fn assert_running(&mut self, dir: &Path) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "node {} exited by itself ({status}); its log:\n{}",
                self.name,
                tail(&dir.join(format!("{}.log", self.name)), 40)
            );
        }
    }

    /// Ends a graceful stop, given what `try_wait` answered: exited (non-zero is a problem),
    /// or still running `within` after it was asked (a problem; it is killed). Answers how it
    /// went, as `crash_nodes.how` has it: `stopped` or `killed`.
    pub(crate) fn end_stop(
        &mut self,
        status: Option<ExitStatus>,
        log: &Path,
        within: Duration,
        problems: &mut Vec<String>,
    ) -> &'static str {
        match status {
            Some(status) => {
                if !status.success() {
                    problems.push(format!(
                        "node {} exited with {status} on graceful stop; its log:\n{}",
                        self.name,
                        tail(log, 40)
                    ));
                }
                "stopped"
            }
            None => {
                problems.push(format!(
                    "node {} did not stop within {within:?}; killed",
                    self.name
                ));
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                "killed"
            }
        }
    }

    /// Its `crash_nodes` row, taken once the process is reaped (so it is surely gone by
    /// then).
    pub(crate) fn gone(&self, how: &str) -> NodeRow {
        NodeRow {
            node: self.name.clone(),
            pid: i64::from(self.child.id()),
            spawned_at_us: self.spawned_at_us,
            gone_at_us: now_us(),
            how: how.into(),
        }
    }
}

/// Whether cargo sets `name` for the test it runs (the package's metadata, its paths, the
/// test's binaries): not the variables a user sets to steer a build (`CARGO_HOME`,
/// `CARGO_TARGET_DIR`, `CARGO_INCREMENTAL`, `CARGO_PROFILE_*`, `CARGO_BUILD_*`, `CARGO`).
fn set_by_cargo_for_tests(name: &str) -> bool {
    const EXACT: [&str; 9] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    EXACT.contains(&name) || name.starts_with("CARGO_PKG_") || name.starts_with("CARGO_BIN_EXE_")
}

/// Runs a program to completion; its standard output, or an error with everything it said.
pub(crate) fn run_cmd(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The last `lines` lines of a file, for failure messages.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The run's directory of node logs and journals: removed after a passing run, kept when
/// the test panics (a failed check or anything else) so the evidence survives, or when
/// `JOBVISOR_CRASH_KEEP` is set.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: Option<tempfile::TempDir>,
    /// Which test, for the message naming a kept directory.
    test: &'static str,
}

impl RunDir {
    pub(crate) fn new(test: &'static str, dir: tempfile::TempDir) -> RunDir {
        RunDir {
            dir: Some(dir),
            test,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.as_ref().map(tempfile::TempDir::path).unwrap()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("JOBVISOR_CRASH_KEEP").is_some() {
            if let Some(d) = self.dir.take() {
                eprintln!(
                    "{} test: logs and journals kept in {}",
                    self.test,
                    d.keep().display()
                );
            }
        }
    }
}

/// Runs a driver on a runtime of two worker threads.
pub(crate) fn block_on<F: Future>(driver: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(driver)
}

/// Runs a driver-side database call, retrying a few times: after a server restart the first
/// use of each pooled connection fails (the pools recycle connections only on error).
pub(crate) async fn retry<T, E: std::fmt::Display, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if tries >= 20 => panic!("{what}: {e}"),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Every job of the table (`archived`: of the archive instead), page by page.
pub(crate) async fn all_jobs(store: &Store, archived: bool) -> Vec<Job> {
    let mut out: Vec<Job> = Vec::new();
    loop {
        let after = out.last().map(|j| j.id);
        let page = retry("listing jobs", || {
            store.job_list(ListParams {
                after,
                limit: 1000,
                archived,
                ..ListParams::default()
            })
        })
        .await;
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

// ---------------------------------------------------------------------------------------------
// The quick jobs the crash and soak tests run (`crash_node`'s default kind and queue)

/// The queue of the quick jobs (concurrency 8 per node, the default prefetch).
pub(crate) const QUEUE: &str = "crash";
/// Kind of the quick jobs.
pub(crate) const CRASHY: &str = "crashy";
/// Their timeout: the library's default, set explicitly so that the payload can carry it.
pub(crate) const CRASHY_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Max attempts per job: high enough that no job can die of a test's reclaims.
pub(crate) const MAX_ATTEMPTS: u32 = 100;

/// A number from the environment, if set; a value that does not parse fails the test.
pub(crate) fn env_number<T: std::str::FromStr>(name: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?} is not a valid number: {e}"),
    }
}

/// Progress of the run, from the live table.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    /// Jobs in a terminal state.
    pub(crate) terminal: usize,
    /// Jobs that succeeded.
    pub(crate) succeeded: usize,
}

/// Counts of the live table.
pub(crate) async fn progress(store: &Store) -> Result<Progress, String> {
    let counts = store.job_counts().await.map_err(|e| e.to_string())?;
    let mut p = Progress::default();
    for c in counts {
        let n = usize::try_from(c.count).unwrap();
        if c.state.is_terminal() {
            p.terminal += n;
        }
        if c.state == JobState::Succeeded {
            p.succeeded += n;
        }
    }
    Ok(p)
}

/// Enqueues `n` more jobs; `false` if the database refused (it is restarting): try later.
pub(crate) async fn enqueue(store: &Store, next: &mut usize, n: usize) -> bool {
    let timeout_ms = u64::try_from(CRASHY_TIMEOUT.as_millis()).unwrap();
    let jobs: Vec<NewJob> = (*next..*next + n)
        .map(|i| {
            NewJob::new(CRASHY, json!({ "i": i, "timeout_ms": timeout_ms }))
                .queue(QUEUE)
                .max_attempts(MAX_ATTEMPTS)
                .timeout(CRASHY_TIMEOUT)
        })
        .collect();
    for chunk in jobs.chunks(500) {
        match store
            .job_enqueue_many(EnqueueParams::many(chunk.to_vec()))
            .await
        {
            Ok(e) => *next += e.len(),
            Err(_) => return false,
        }
    }
    true
}
