//! The crash test's node processes: spawning, killing, freezing (SIGSTOP) and thawing them.

use super::*;

// ---------------------------------------------------------------------------------------------
// Node processes

/// A node process stopped with SIGSTOP.
#[derive(Debug)]
pub(crate) struct FrozenProc {
    pub(crate) proc: NodeProc,
    /// Taken right after SIGSTOP was sent.
    pub(crate) signalled_at_us: i64,
    /// Taken once every thread of the node was seen stopped.
    pub(crate) frozen_at_us: i64,
    /// Continues it (SIGCONT) when its time is up, or at once when sent `true`; dropped, the
    /// timer stands down and leaves the node frozen (for a kill). Answers when it sent the
    /// signal, if it did.
    /// A thread of its own, not the driver's loop: on SQLite a frozen node can hold the
    /// file's lock, and the driver's progress query then waits for it.
    pub(crate) thaw: std::sync::mpsc::Sender<bool>,
    pub(crate) thawed: std::thread::JoinHandle<Option<i64>>,
}

/// The node processes of one run, live and gone.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) bin: PathBuf,
    /// The database URLs nodes are given: one, or on Galera one per member (naming every
    /// member, that one first). A new node takes the URL fewest alive nodes have.
    pub(crate) urls: Vec<String>,
    /// Node → the index of its URL in [`Fleet::urls`] (its member on Galera).
    pub(crate) homes: HashMap<String, usize>,
    /// Extra environment of every node (on Galera, a log filter that counts retries).
    pub(crate) env: Vec<(String, String)>,
    pub(crate) dir: PathBuf,
    pub(crate) next: usize,
    pub(crate) live: Vec<NodeProc>,
    /// Alive but stopped (SIGSTOP): not picked for kills or stops until continued.
    pub(crate) frozen: Vec<FrozenProc>,
    /// Asked to stop gracefully, with when they must be gone by.
    pub(crate) stopping: Vec<(NodeProc, Instant)>,
    pub(crate) gone: Vec<NodeRow>,
    /// Every freeze that ended (continued, or killed while frozen).
    pub(crate) thawed: Vec<FreezeRow>,
    pub(crate) kills: usize,
    pub(crate) stops: usize,
    pub(crate) freezes: usize,
}

/// Sends `signal` (`STOP`, `CONT`) to a process with `kill(1)` (this crate forbids `unsafe`).
pub(crate) fn signal(pid: u32, signal: &str) {
    run_cmd("kill", &[&format!("-{signal}"), &pid.to_string()])
        .unwrap_or_else(|e| panic!("sending SIG{signal} to {pid}: {e}"));
}

/// The thread ids of a process, from `/proc/<pid>/task`.
pub(crate) fn thread_ids(pid: u32) -> Result<Vec<String>, String> {
    let dir = format!("/proc/{pid}/task");
    let mut ids: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Whether thread `tid` of process `pid` can no longer run: stopped (`T`, or `t` under a
/// tracer), or exited (`Z`, `X`, or gone from `/proc`).
pub(crate) fn thread_stopped(pid: u32, tid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
        return true;
    };
    // The state is the first field after the command name, which is in parentheses and may
    // contain anything.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("T" | "t" | "Z" | "X"))
}

/// Waits until every thread of `pid` is stopped after a SIGSTOP; answers when that was
/// seen, which is after the process last ran. SIGSTOP stops a multi-threaded process
/// asynchronously: `kill(2)` wakes one thread, which stops the others once it is scheduled.
/// The set of threads is read again after all were seen stopped: a thread created while the
/// list was being checked would be missed otherwise (a stopped thread creates none).
pub(crate) fn wait_stopped(pid: u32, within: Duration) -> Result<i64, String> {
    let until = Instant::now() + within;
    loop {
        let tids = thread_ids(pid)?;
        if tids.iter().all(|t| thread_stopped(pid, t)) {
            let at = now_us();
            if thread_ids(pid)? == tids {
                return Ok(at);
            }
        }
        if Instant::now() >= until {
            let running: Vec<&String> = tids.iter().filter(|t| !thread_stopped(pid, t)).collect();
            return Err(format!(
                "threads {running:?} of process {pid} still not stopped {within:?} after SIGSTOP"
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Fleet {
    pub(crate) fn new(bin: PathBuf, urls: Vec<String>, dir: &Path) -> Fleet {
        assert!(!urls.is_empty(), "a fleet needs a database URL");
        Fleet {
            bin,
            urls,
            homes: HashMap::new(),
            env: Vec::new(),
            dir: dir.to_path_buf(),
            next: 0,
            live: Vec::new(),
            frozen: Vec::new(),
            stopping: Vec::new(),
            gone: Vec::new(),
            thawed: Vec::new(),
            kills: 0,
            stops: 0,
            freezes: 0,
        }
    }

    pub(crate) fn journal(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.journal"))
    }

    pub(crate) fn log(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.log"))
    }

    pub(crate) fn spawn(&mut self) {
        self.next += 1;
        let name = format!("n{}", self.next);
        let log = std::fs::File::create(self.log(&name)).unwrap();
        let alive = self.alive();
        let home = (0..self.urls.len())
            .min_by_key(|&i| alive.iter().filter(|n| self.homes[*n] == i).count())
            .unwrap();
        self.homes.insert(name.clone(), home);
        let child = Command::new(&self.bin)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg(&self.urls[home])
            .arg(&name)
            .arg("--journal")
            .arg(self.journal(&name))
            // A short shutdown wait: a graceful stop gives back the leases of jobs that
            // are still running after 20 ms rather than letting them all finish.
            .args([
                "--queue",
                QUEUE,
                "--concurrency",
                "8",
                "--shutdown-ms",
                "20",
            ])
            .args(["--queue", MIX_QUEUE])
            .arg("--concurrency")
            .arg(MIX_CONCURRENCY.to_string())
            .arg("--prefetch")
            .arg(MIX_PREFETCH.to_string())
            .args(["--kind", CRASHY])
            .args(MIX.iter().flat_map(|m| ["--kind", m.kind]))
            .args(["--kind", SEQ_KIND, "--kind", DEADLINE_KIND])
            .arg("--schedule-ms")
            .arg(SCHEDULE_EVERY.as_millis().to_string())
            .arg("--reconcile-ms")
            .arg(RECONCILE_EVERY.as_millis().to_string())
            .arg("--leader-lease-ms")
            .arg(LEADER_LEASE.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.live.push(NodeProc::new(name, child));
    }

    pub(crate) fn record_gone(&mut self, n: &NodeProc, how: &str) {
        self.gone.push(n.gone(how));
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill(&mut self, i: usize) {
        let mut n = self.live.swap_remove(i);
        n.child.kill().unwrap();
        n.child.wait().unwrap();
        self.record_gone(&n, "killed");
        self.kills += 1;
    }

    pub(crate) fn kill_random(&mut self, rng: &mut Rng) {
        if !self.live.is_empty() {
            let i = rng.below(self.live.len());
            self.kill(i);
        }
    }

    /// SIGKILLs every node, frozen ones included (a stopped process dies of SIGKILL too;
    /// its freeze ends when it is reaped).
    pub(crate) fn kill_all(&mut self) {
        while !self.live.is_empty() {
            self.kill(self.live.len() - 1);
        }
        while let Some(f) = self.frozen.pop() {
            let FrozenProc {
                proc,
                signalled_at_us,
                frozen_at_us,
                thaw,
                thawed,
            } = f;
            drop(thaw);
            let continued = thawed.join().unwrap();
            self.live.push(proc);
            self.kill(self.live.len() - 1);
            let gone = self.gone.last().unwrap().gone_at_us;
            self.thawed.push(FreezeRow {
                node: self.gone.last().unwrap().node.clone(),
                signalled_at_us,
                frozen_at_us,
                resumed_at_us: continued.unwrap_or(gone),
            });
        }
    }

    /// Freezes a random live node (SIGSTOP) for `for_`, unless one is frozen already or it
    /// would leave no node running.
    pub(crate) fn freeze_random(&mut self, rng: &mut Rng, for_: Duration) -> bool {
        if !self.frozen.is_empty() || self.live.len() < 2 {
            return false;
        }
        let n = self.live.swap_remove(rng.below(self.live.len()));
        let pid = n.child.id();
        signal(pid, "STOP");
        let signalled_at_us = now_us();
        // `kill` returns once the signal is queued, not once the node has stopped: one of
        // its threads must still be scheduled to take the stop to the others, and on a busy
        // machine the node runs on for milliseconds meanwhile (it can start a handler then).
        // The freeze counts from when every thread was seen stopped.
        let frozen_at_us = wait_stopped(pid, STOP_TAKES_EFFECT_WITHIN)
            .unwrap_or_else(|e| panic!("freezing node {}: {e}", n.name));
        let (thaw, asked) = std::sync::mpsc::channel::<bool>();
        let thawed = std::thread::spawn(move || {
            use std::sync::mpsc::RecvTimeoutError;
            match asked.recv_timeout(for_) {
                Ok(true) | Err(RecvTimeoutError::Timeout) => {}
                Ok(false) | Err(RecvTimeoutError::Disconnected) => return None,
            }
            // Taken before the signal: the node cannot run earlier than this.
            let t = now_us();
            signal(pid, "CONT");
            Some(t)
        });
        self.frozen.push(FrozenProc {
            proc: n,
            signalled_at_us,
            frozen_at_us,
            thaw,
            thawed,
        });
        self.freezes += 1;
        true
    }

    /// Takes back the frozen nodes that were continued; with `all`, continues the others
    /// at once first.
    pub(crate) fn thaw(&mut self, all: bool) {
        let mut i = 0;
        while i < self.frozen.len() {
            if all {
                let _ = self.frozen[i].thaw.send(true);
            } else if !self.frozen[i].thawed.is_finished() {
                i += 1;
                continue;
            }
            let f = self.frozen.swap_remove(i);
            let resumed_at_us = f.thawed.join().unwrap().unwrap();
            self.thawed.push(FreezeRow {
                node: f.proc.name.clone(),
                signalled_at_us: f.signalled_at_us,
                frozen_at_us: f.frozen_at_us,
                resumed_at_us,
            });
            self.live.push(f.proc);
        }
    }

    /// The names of the nodes alive now, frozen or not.
    pub(crate) fn alive(&self) -> Vec<String> {
        let frozen = self.frozen.iter().map(|f| &f.proc);
        self.live
            .iter()
            .chain(frozen)
            .map(|n| n.name.clone())
            .collect()
    }

    /// A node must not exit by itself while the run goes on.
    pub(crate) fn assert_all_running(&mut self) {
        let frozen = self.frozen.iter_mut().map(|f| &mut f.proc);
        for n in self.live.iter_mut().chain(frozen) {
            n.assert_running(&self.dir);
        }
    }

    /// Asks node `i` to shut down gracefully (its standard input is closed); it is reaped
    /// by [`Fleet::reap`].
    pub(crate) fn stop(&mut self, i: usize) {
        let mut n = self.live.swap_remove(i);
        n.stdin.take();
        self.stopping.push((n, Instant::now() + STOP_WITHIN));
        self.stops += 1;
    }

    pub(crate) fn stop_random(&mut self, rng: &mut Rng) {
        if !self.live.is_empty() {
            let i = rng.below(self.live.len());
            self.stop(i);
        }
    }

    /// Reaps nodes that were asked to stop. A node that exits non-zero, or that is still
    /// running [`STOP_WITHIN`] after it was asked, is a problem (and is killed).
    pub(crate) fn reap(&mut self, problems: &mut Vec<String>) {
        let mut i = 0;
        while i < self.stopping.len() {
            let (n, until) = &mut self.stopping[i];
            let status = n.child.try_wait().unwrap();
            if status.is_none() && Instant::now() < *until {
                i += 1;
                continue;
            }
            let (mut n, _) = self.stopping.swap_remove(i);
            let how = n.end_stop(status, &self.log(&n.name), STOP_WITHIN, problems);
            self.record_gone(&n, how);
        }
    }

    /// Continues the frozen nodes, then stops every node gracefully and reaps them all.
    pub(crate) fn stop_all(&mut self, problems: &mut Vec<String>) {
        self.thaw(true);
        while !self.live.is_empty() {
            self.stop(self.live.len() - 1);
        }
        while !self.stopping.is_empty() {
            self.reap(problems);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Frozen nodes stay frozen until killed: their timers are told to stand down first.
        let mut frozen = Vec::new();
        for f in self.frozen.drain(..) {
            drop(f.thaw);
            let _ = f.thawed.join();
            frozen.push(f.proc);
        }
        let stopping = self.stopping.iter_mut().map(|(n, _)| n);
        for n in self
            .live
            .iter_mut()
            .chain(stopping)
            .chain(frozen.iter_mut())
        {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}
