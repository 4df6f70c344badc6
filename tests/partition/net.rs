//! The partition test's network: host commands, the preflight, one run at a time, and the
//! namespaces and links whose cuts are the test.

use super::*;

// ---------------------------------------------------------------------------------------------
// Host commands

/// Runs `ip` with a command line of words (no word here has spaces).
pub(crate) fn try_ip(command: &str) -> Result<String, String> {
    let args: Vec<&str> = command.split_whitespace().collect();
    run_cmd("ip", &args)
}

pub(crate) fn ip(command: &str) -> String {
    try_ip(command).unwrap_or_else(|e| panic!("partition test: {e}"))
}

/// Kills the processes left in one of this test's namespaces (by id).
pub(crate) fn kill_netns_pids(ns: &str) {
    if let Ok(pids) = try_ip(&format!("netns pids {ns}")) {
        for pid in pids.split_whitespace() {
            let _ = run_cmd("kill", &["-KILL", pid]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the machine must have

pub(crate) fn tool_answers(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails loudly, naming what is missing, unless the machine can run the test (the private
/// server checks its own programs: `harness::server::Programs::find`).
pub(crate) fn preflight(backend: Backend) {
    assert!(
        is_root(),
        "the partition test creates network namespaces and veth pairs: run it as root"
    );
    assert!(
        tool_answers("ip", "-V"),
        "the partition test needs the `ip` tool (package iproute2) to build its network"
    );
    assert!(backend != Backend::Sqlite, "SQLite has no network to cut");
}

// ---------------------------------------------------------------------------------------------
// One run at a time, and what an aborted run left behind

/// Held while a run uses the names and addresses above; another run waits for it.
#[derive(Debug)]
pub(crate) struct RunLock;

pub(crate) fn process_is_partition_test(pid: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("partition"))
}

impl RunLock {
    pub(crate) fn acquire() -> RunLock {
        let me = std::process::id().to_string();
        let until = Instant::now() + Duration::from_secs(600);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(LOCK_FILE)
            {
                Ok(mut f) => {
                    f.write_all(me.as_bytes()).unwrap();
                    return RunLock;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(LOCK_FILE).unwrap_or_default();
                    let holder = holder.trim();
                    if !holder.is_empty() && process_is_partition_test(holder) {
                        assert!(
                            Instant::now() < until,
                            "another partition test (pid {holder}) holds {LOCK_FILE}"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    } else {
                        // Its run ended without removing the lock.
                        let _ = std::fs::remove_file(LOCK_FILE);
                    }
                }
                Err(e) => panic!("creating {LOCK_FILE}: {e}"),
            }
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let holder = std::fs::read_to_string(LOCK_FILE).unwrap_or_default();
        if holder.trim() == std::process::id().to_string() {
            let _ = std::fs::remove_file(LOCK_FILE);
        }
    }
}

pub(crate) fn host_if(i: usize) -> String {
    format!("{HOST_IF_PREFIX}{i}")
}

pub(crate) fn subnet() -> String {
    format!("{SUBNET}.0.0/16")
}

/// Removes the namespaces, links, route and servers of a run that did not clean up (killed
/// or aborted). Called with the lock held, so nothing of theirs is in use.
pub(crate) fn clean_leftovers() {
    if let Ok(list) = try_ip("netns list") {
        for ns in list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(NS_PREFIX))
        {
            eprintln!("partition test: removing namespace {ns} left by an earlier run");
            kill_netns_pids(ns);
            let _ = try_ip(&format!("netns del {ns}"));
        }
    }
    for i in 1..=NODES {
        if try_ip(&format!("link del {}", host_if(i))).is_ok() {
            eprintln!(
                "partition test: removed link {} left by an earlier run",
                host_if(i)
            );
        }
    }
    let _ = try_ip(&format!("route del blackhole {}", subnet()));
    for dir in std::fs::read_dir(BASE_DIR)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
    {
        let dir = dir.path();
        eprintln!(
            "partition test: removing {} left by an earlier run",
            dir.display()
        );
        stop_leftover(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let addrs = ip("-4 -o addr show");
    assert!(
        !addrs.contains(&format!(" {SUBNET}.")),
        "{} is in use on this machine; the partition test needs it for its veth pairs:\n{addrs}",
        subnet()
    );
}

// ---------------------------------------------------------------------------------------------
// The network

/// One node's veth pair.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub(crate) ns: String,
    pub(crate) host_if: String,
    pub(crate) ns_if: String,
    /// The host end's address: the node reaches the server here.
    pub(crate) host_ip: String,
    pub(crate) ns_ip: String,
}

/// The namespaces and links of this run; removed when dropped.
#[derive(Debug, Default)]
pub(crate) struct Net {
    pub(crate) links: Vec<Link>,
    pub(crate) blackhole: bool,
}

impl Net {
    pub(crate) fn up() -> Net {
        let mut net = Net::default();
        ip(&format!("route add blackhole {}", subnet()));
        net.blackhole = true;
        for i in 1..=NODES {
            let l = Link {
                ns: format!("{NS_PREFIX}{i}"),
                host_if: host_if(i),
                ns_if: format!("{NS_IF_PREFIX}{i}"),
                host_ip: format!("{SUBNET}.{i}.1"),
                ns_ip: format!("{SUBNET}.{i}.2"),
            };
            ip(&format!("netns add {}", l.ns));
            net.links.push(l.clone());
            let (ns, host_if, ns_if) = (&l.ns, &l.host_if, &l.ns_if);
            ip(&format!(
                "link add {host_if} type veth peer name {ns_if} netns {ns}"
            ));
            ip(&format!("addr add {}/30 dev {host_if}", l.host_ip));
            ip(&format!("link set {host_if} up"));
            ip(&format!("-n {ns} addr add {}/30 dev {ns_if}", l.ns_ip));
            ip(&format!("-n {ns} link set {ns_if} up"));
            ip(&format!("-n {ns} link set lo up"));
            net.pin_neighbours(&l);
        }
        net
    }

    /// Fixed neighbour entries on both ends. Without them the node's ARP for the server fails
    /// a few seconds into a cut, the kernel reports the host unreachable to the node's own
    /// sockets, and TCP then keeps retrying every few hundred ms (RFC 6069) instead of backing
    /// off — not the silent hang of a break beyond the first hop, which is what is tested.
    /// The node's end keeps its entry through a cut (it only loses carrier); the host end's,
    /// flushed when it goes down, is set again at the heal.
    pub(crate) fn pin_neighbours(&self, l: &Link) {
        let mac = |prefix: &str, dev: &str| {
            let out = ip(&format!("{prefix} -o link show dev {dev}"));
            let mut words = out.split_whitespace();
            words
                .find(|w| *w == "link/ether")
                .and_then(|_| words.next())
                .unwrap_or_else(|| panic!("no MAC address for {dev} in {out:?}"))
                .to_string()
        };
        let host_mac = mac("", &l.host_if);
        let ns_mac = mac(&format!("-n {}", l.ns), &l.ns_if);
        ip(&format!(
            "-n {} neigh replace {} lladdr {host_mac} dev {} nud permanent",
            l.ns, l.host_ip, l.ns_if
        ));
        ip(&format!(
            "neigh replace {} lladdr {ns_mac} dev {} nud permanent",
            l.ns_ip, l.host_if
        ));
    }

    pub(crate) fn host_ips(&self) -> Vec<String> {
        self.links.iter().map(|l| l.host_ip.clone()).collect()
    }

    /// Cuts node `i` off silently: packets are dropped, nothing is reset.
    pub(crate) fn cut(&self, i: usize) {
        ip(&format!("link set {} down", self.links[i].host_if));
    }

    pub(crate) fn heal(&self, i: usize) {
        ip(&format!("link set {} up", self.links[i].host_if));
        self.pin_neighbours(&self.links[i]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for l in &self.links {
            kill_netns_pids(&l.ns);
            if let Err(e) = try_ip(&format!("netns del {}", l.ns)) {
                eprintln!("partition test: {e}");
            }
            // Gone with the namespace, unless a process still holds it.
            let _ = try_ip(&format!("link del {}", l.host_if));
        }
        if self.blackhole {
            if let Err(e) = try_ip(&format!("route del blackhole {}", subnet())) {
                eprintln!("partition test: {e}");
            }
        }
    }
}
