//! A private three-member MariaDB Galera cluster on loopback, for the tests that need one
//! (`tests/galera.rs`): own data directories under a base the test names
//! (`galera-<pid>/n1..n3`), own free ports (client, gcomm, IST, SST per member), state
//! transfer by rsync, the first member bootstrapping the cluster. A user `jv`@127.0.0.1
//! with every privilege and a database [`DB_NAME`](super::server::DB_NAME). Members can be
//! SIGKILLed and restarted (they rejoin by IST) or cut off from the others
//! (`gmcast.isolate`). Every member is killed when the value is dropped; the directory is
//! removed then, unless the test panicked. Needs root and the packages `mariadb-server`,
//! `galera-4` and `rsync`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::Backend;

use super::run_cmd;
use super::server::{path_str, Programs, DB_NAME};

/// The Galera library.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// How long a member may take to join and sync.
const JOIN_WAIT: Duration = Duration::from_secs(90);

struct Member {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

/// The cluster; members are numbered from 0.
pub(crate) struct GaleraCluster {
    dir: PathBuf,
    members: Vec<Member>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl GaleraCluster {
    /// Creates and starts three members under `base`, each synced before the next starts.
    pub(crate) fn start(test: &'static str, base: &Path) -> GaleraCluster {
        use std::os::unix::fs::PermissionsExt as _;
        Programs::find(Backend::Mysql, test);
        assert!(
            Path::new(PROVIDER).is_file(),
            "the {test} test needs {PROVIDER}: install the galera-4 package"
        );
        assert!(
            run_cmd("rsync", &["--version"]).is_ok(),
            "the {test} test needs rsync (Galera's state transfer)"
        );
        std::fs::create_dir_all(base).unwrap();
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
        super::server::remove_leftovers(base);
        let dir = base.join(format!("galera-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ports: Vec<[u16; 4]> = (0..3)
            .map(|_| [free_port(), free_port(), free_port(), free_port()])
            .collect();
        let gcomm: Vec<String> = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p[1]))
            .collect();
        let mut members = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            let d = dir.join(format!("n{}", i + 1));
            std::fs::create_dir_all(d.join("data")).unwrap();
            let cnf = format!(
                "[mysqld]\ndatadir={data}\nsocket={d}/sock\nport={port}\nbind-address=127.0.0.1\n\
                 pid-file={d}/pid\nlog-error={d}/err.log\nuser=mysql\nbinlog_format=ROW\n\
                 default_storage_engine=InnoDB\ninnodb_autoinc_lock_mode=2\n\
                 innodb_flush_log_at_trx_commit=0\ninnodb_buffer_pool_size=64M\n\
                 max_connections=300\nwsrep_on=ON\nwsrep_provider={PROVIDER}\n\
                 wsrep_cluster_name=jv{pid}\nwsrep_cluster_address=gcomm://{gcomm}\n\
                 wsrep_node_address=127.0.0.1\nwsrep_node_name=n{n}\n\
                 wsrep_provider_options=\"gmcast.listen_addr=tcp://127.0.0.1:{g};\
                 ist.recv_addr=127.0.0.1:{ist};evs.suspect_timeout=PT3S;\
                 evs.inactive_timeout=PT6S\"\n\
                 wsrep_sst_receive_address=127.0.0.1:{sst}\nwsrep_sst_method=rsync\n",
                data = path_str(&d.join("data")),
                d = path_str(&d),
                port = p[0],
                pid = std::process::id(),
                gcomm = gcomm.join(","),
                n = i + 1,
                g = p[1],
                ist = p[2],
                sst = p[3],
            );
            std::fs::write(d.join("my.cnf"), cnf).unwrap();
            run_cmd("chown", &["-R", "mysql:mysql", &path_str(&dir)]).unwrap();
            run_cmd(
                "mariadb-install-db",
                &[
                    &format!("--defaults-file={}", path_str(&d.join("my.cnf"))),
                    "--user=mysql",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
            )
            .unwrap_or_else(|e| panic!("mariadb-install-db for member {}: {e}", i + 1));
            members.push(Member {
                dir: d,
                port: p[0],
                child: None,
            });
        }
        let mut cluster = GaleraCluster { dir, members };
        for i in 0..3 {
            cluster.launch(i, i == 0);
        }
        cluster.sql(
            0,
            &format!(
                "CREATE DATABASE {DB_NAME}; CREATE USER 'jv'@'127.0.0.1'; \
                 GRANT ALL PRIVILEGES ON *.* TO 'jv'@'127.0.0.1'"
            ),
        );
        cluster
    }

    fn launch(&mut self, i: usize, bootstrap: bool) {
        let m = &mut self.members[i];
        let mut cmd = Command::new("/usr/sbin/mariadbd");
        cmd.arg(format!(
            "--defaults-file={}",
            path_str(&m.dir.join("my.cnf"))
        ));
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        m.child = Some(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting member {}: {e}", i + 1)),
        );
        self.wait_state(i, "4", JOIN_WAIT);
    }

    /// Waits until member `i`'s `wsrep_local_state` is `state` (4: synced; 0: cut off).
    pub(crate) fn wait_state(&self, i: usize, state: &str, limit: Duration) {
        let start = Instant::now();
        loop {
            let got = self.try_sql(i, "SHOW STATUS LIKE 'wsrep_local_state'");
            if got
                .as_deref()
                .is_ok_and(|s| s.split_whitespace().nth(1) == Some(state))
            {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "Galera member {} not in state {state} within {limit:?}: {got:?}\n{}",
                i + 1,
                super::tail(&self.members[i].dir.join("err.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Runs statements on member `i` as root, through its socket; their output.
    pub(crate) fn try_sql(&self, i: usize, sql: &str) -> Result<String, String> {
        let sock = format!("--socket={}", path_str(&self.members[i].dir.join("sock")));
        run_cmd(
            "mariadb",
            &["--no-defaults", &sock, "-uroot", "-N", "-B", "-e", sql],
        )
    }

    /// [`GaleraCluster::try_sql`], which must succeed.
    pub(crate) fn sql(&self, i: usize, sql: &str) -> String {
        self.try_sql(i, sql)
            .unwrap_or_else(|e| panic!("member {}: {e}", i + 1))
    }

    /// Member `i`'s client port.
    pub(crate) fn port(&self, i: usize) -> u16 {
        self.members[i].port
    }

    /// A URL naming every member, in order, on database `db`, with `members=<choice>`.
    pub(crate) fn url(&self, db: &str, choice: &str) -> String {
        let hosts: Vec<String> = (0..3)
            .map(|i| format!("127.0.0.1:{}", self.port(i)))
            .collect();
        format!("mysql://jv@{}/{db}?members={choice}", hosts.join(","))
    }

    /// A URL naming every member on database `db`, member `i` first and the others after
    /// it in turn (`members=first`: a store on it works through member `i` while it can).
    pub(crate) fn url_from(&self, i: usize, db: &str) -> String {
        let hosts: Vec<String> = (0..3)
            .map(|k| format!("127.0.0.1:{}", self.port((i + k) % 3)))
            .collect();
        format!("mysql://jv@{}/{db}", hosts.join(","))
    }

    /// A URL of member `i` alone.
    pub(crate) fn member_url(&self, i: usize, db: &str) -> String {
        format!("mysql://jv@127.0.0.1:{}/{db}", self.port(i))
    }

    /// SIGKILLs member `i`.
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again (it rejoins the running cluster) and waits until it is synced.
    pub(crate) fn restart(&mut self, i: usize) {
        self.launch(i, false);
    }

    /// Cuts member `i` off from the others (`on`) or lets it back, and waits until it is
    /// out of the primary component, or synced again.
    pub(crate) fn isolate(&self, i: usize, on: bool) {
        self.sql(
            i,
            &format!(
                "SET GLOBAL wsrep_provider_options='gmcast.isolate={}'",
                u8::from(on)
            ),
        );
        self.wait_state(i, if on { "0" } else { "4" }, JOIN_WAIT);
    }
}

impl Drop for GaleraCluster {
    fn drop(&mut self) {
        for i in (0..self.members.len()).rev() {
            self.kill(i);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
