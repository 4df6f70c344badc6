//! Private database servers: a test that needs a server configured differently, or one it
//! may stop and restart, starts its own — own port, own data directory, own user accounts —
//! rather than disturbing the machine's shared servers, which other test runs may be using.
//!
//! A [`PrivateServer`] is PostgreSQL (`initdb` from the newest `/usr/lib/postgresql/*/bin`,
//! run as `postgres` through `runuser`, trust auth) or MariaDB (`mariadb-install-db`,
//! `mariadbd` as `mysql`), created under a base directory the test names, in a directory
//! `<backend>-<n>-<pid>`, on a free port, listening on 127.0.0.1 and any other addresses the
//! test asks for, with one database [`DB_NAME`]. Tuned for tests: no fsync. It is stopped
//! when dropped, whatever happened to the test; its directory is removed then, except after a
//! panic, when it is kept (for the server's log) until the next run of a test with the same
//! base directory removes it ([`remove_leftovers`]).
//!
//! [`TestDatabase`] is what the crash, outage and soak tests run on: a private server for
//! PostgreSQL and MariaDB, a file in a temporary directory for SQLite.
//!
//! Running the servers as their own users needs root (as `.ci/crash` runs).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::{Backend, Store, StoreOptions};

use super::{run_cmd, tail};

/// The database every private server has.
pub(crate) const DB_NAME: &str = "jobvisor";

/// How long a server may take to start or stop.
const SERVER_WAIT: Duration = Duration::from_secs(60);

/// The server programs of a backend.
#[derive(Debug, Clone)]
pub(crate) enum Programs {
    /// The newest `/usr/lib/postgresql/<version>/bin`.
    Postgres { bin: PathBuf },
    /// `mariadbd` (with `mariadb-install-db`, `mariadb`, `mariadb-admin` on the `PATH`).
    Mysql { mariadbd: PathBuf },
}

fn tool_answers(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn user_exists(user: &str) -> bool {
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(':').next() == Some(user))
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

impl Programs {
    /// The programs a private server of `backend` needs; fails loudly, naming what is
    /// missing. `test` names the test in the messages.
    pub(crate) fn find(backend: Backend, test: &str) -> Programs {
        assert!(
            is_root(),
            "the {test} test starts a private database server as its own user: run it as root"
        );
        assert!(
            tool_answers("runuser", "--version"),
            "the {test} test needs `runuser` (package util-linux) to run its private server as \
             its own user"
        );
        match backend {
            Backend::Postgres => {
                let need = ["initdb", "pg_ctl", "postgres", "psql", "pg_isready"];
                let bin = std::fs::read_dir("/usr/lib/postgresql")
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                        Some((v, e.path().join("bin")))
                    })
                    .filter(|(_, bin)| need.iter().all(|p| bin.join(p).is_file()))
                    .max_by_key(|(v, _)| *v)
                    .map(|(_, bin)| bin)
                    .unwrap_or_else(|| {
                        panic!(
                            "the {test} test starts a private PostgreSQL server, but no \
                             /usr/lib/postgresql/<version>/bin has {need:?}: install the \
                             postgresql package"
                        )
                    });
                assert!(
                    user_exists("postgres"),
                    "the private PostgreSQL server runs as user `postgres`, which does not exist"
                );
                Programs::Postgres { bin }
            }
            Backend::Mysql => {
                let mariadbd = PathBuf::from("/usr/sbin/mariadbd");
                assert!(
                    mariadbd.is_file(),
                    "the {test} test starts a private MariaDB server, but /usr/sbin/mariadbd is \
                     missing: install the mariadb-server package"
                );
                for tool in ["mariadb-install-db", "mariadb", "mariadb-admin"] {
                    assert!(
                        tool_answers(tool, "--version"),
                        "the {test} test needs `{tool}` (packages mariadb-server / \
                         mariadb-client) for its private MariaDB server"
                    );
                }
                assert!(
                    user_exists("mysql"),
                    "the private MariaDB server runs as user `mysql`, which does not exist"
                );
                Programs::Mysql { mariadbd }
            }
            Backend::Sqlite => panic!("SQLite has no server"),
        }
    }
}

/// Runs a program as another user (`initdb` and `pg_ctl` refuse root).
pub(crate) fn as_user(user: &str, program: &Path, args: &[&str]) -> Result<String, String> {
    let program = program.display().to_string();
    let mut all = vec!["-u", user, "--", program.as_str()];
    all.extend_from_slice(args);
    run_cmd("runuser", &all)
}

/// A path as text (every path here is UTF-8).
pub(crate) fn path_str(p: &Path) -> String {
    p.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", p.display()))
        .to_string()
}

fn must(program: &str, args: &[&str]) -> String {
    run_cmd(program, args).unwrap_or_else(|e| panic!("private server: {e}"))
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("appending to {}: {e}", path.display()));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Stops a server an earlier run left running in `dir` (a server directory of this module).
pub(crate) fn stop_leftover(dir: &Path) {
    let data = dir.join("data");
    if data.join("postmaster.pid").is_file() {
        let bin = std::fs::read_to_string(dir.join("bin")).unwrap_or_default();
        let _ = as_user(
            "postgres",
            &Path::new(bin.trim()).join("pg_ctl"),
            &["-D", &path_str(&data), "-m", "immediate", "-w", "stop"],
        );
    }
    if let Ok(pid) = std::fs::read_to_string(dir.join("mysqld.pid")) {
        let pid = pid.trim();
        let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&path_str(dir)));
        if ours {
            let _ = run_cmd("kill", &["-KILL", pid]);
        }
    }
}

/// Stops and removes the servers that runs no longer alive left under `base` (a run that
/// panicked keeps its server's directory; one that was killed leaves its server running).
/// A directory is `<backend>-<n>-<pid>` of the run that made it; those of live processes are left
/// alone, so tests may run side by side. Answers what it removed.
pub(crate) fn remove_leftovers(base: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for dir in std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
    {
        let pid = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        stop_leftover(&dir);
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

/// A database server of the test's own; stopped (and its directory removed, unless the test
/// panicked) when dropped.
#[derive(Debug)]
pub(crate) struct PrivateServer {
    backend: Backend,
    dir: PathBuf,
    /// Its TCP port.
    pub(crate) port: u16,
    programs: Programs,
    /// The addresses it listens on (127.0.0.1 first).
    listen: Vec<String>,
    mariadbd: Option<Child>,
    running: bool,
    /// Which test, for messages.
    test: &'static str,
}

impl PrivateServer {
    /// Creates and starts a server of `backend` under `base` (created if missing), listening
    /// on 127.0.0.1 and `hosts`, with database [`DB_NAME`] and trust access from 127.0.0.1
    /// and, given a subnet prefix `clients` such as `10.213`, from `<clients>.0.0/16`; waits
    /// until it answers.
    pub(crate) fn start(
        backend: Backend,
        test: &'static str,
        base: &Path,
        hosts: &[String],
        clients: Option<&str>,
    ) -> PrivateServer {
        use std::os::unix::fs::PermissionsExt as _;
        let programs = Programs::find(backend, test);
        std::fs::create_dir_all(base).unwrap();
        // The server's user must reach its directory inside.
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let name = match backend {
            Backend::Postgres => "postgres",
            _ => "mariadb",
        };
        // Unique within the process too: a test that panicked keeps its directory.
        static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("{name}-{n}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let mut listen = vec!["127.0.0.1".to_string()];
        listen.extend_from_slice(hosts);
        let mut server = PrivateServer {
            backend,
            dir,
            port: free_port(),
            programs: programs.clone(),
            listen,
            mariadbd: None,
            running: false,
            test,
        };
        match programs {
            Programs::Postgres { bin } => server.create_postgres(&bin, clients),
            Programs::Mysql { .. } => server.create_mariadb(clients),
        }
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's log.
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    fn create_postgres(&mut self, bin: &Path, clients: Option<&str>) {
        let (dir, data) = (path_str(&self.dir), path_str(&self.data()));
        std::fs::write(self.dir.join("bin"), path_str(bin)).unwrap();
        must("chown", &["-R", "postgres:postgres", &dir]);
        as_user(
            "postgres",
            &bin.join("initdb"),
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ],
        )
        .unwrap_or_else(|e| panic!("initdb of the private PostgreSQL server: {e}"));
        let conf = format!(
            "\n# the {} test's private server\nport = {}\nlisten_addresses = '{}'\n\
             unix_socket_directories = '{dir}'\nmax_connections = 300\nfsync = off\n\
             synchronous_commit = off\nfull_page_writes = off\n",
            self.test,
            self.port,
            self.listen.join(",")
        );
        append(&self.data().join("postgresql.conf"), &conf);
        if let Some(prefix) = clients {
            append(
                &self.data().join("pg_hba.conf"),
                &format!("host all all {prefix}.0.0/16 trust\n"),
            );
        }
        self.launch().unwrap_or_else(|e| panic!("{e}"));
        let port = self.port.to_string();
        let psql = path_str(&bin.join("psql"));
        must(
            &psql,
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-qc",
                &format!("CREATE DATABASE {DB_NAME}"),
            ],
        );
    }

    fn create_mariadb(&mut self, clients: Option<&str>) {
        let data = path_str(&self.data());
        must("chown", &["-R", "mysql:mysql", &path_str(&self.dir)]);
        must(
            "mariadb-install-db",
            &[
                "--no-defaults",
                "--user=mysql",
                &format!("--datadir={data}"),
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
        );
        self.launch().unwrap_or_else(|e| panic!("{e}"));
        let mut users = format!(
            "CREATE DATABASE {DB_NAME}; CREATE USER 'jv'@'127.0.0.1'; \
             GRANT ALL PRIVILEGES ON *.* TO 'jv'@'127.0.0.1';"
        );
        if let Some(prefix) = clients {
            users.push_str(&format!(
                " CREATE USER 'jv'@'{prefix}.%'; GRANT ALL PRIVILEGES ON *.* TO 'jv'@'{prefix}.%';"
            ));
        }
        let socket = format!("--socket={}", path_str(&self.socket()));
        must(
            "mariadb",
            &["--no-defaults", &socket, "-uroot", "-e", &users],
        );
    }

    /// Starts the (created) server and waits until it answers.
    fn launch(&mut self) -> Result<(), String> {
        match self.programs.clone() {
            Programs::Postgres { bin } => {
                let started = as_user(
                    "postgres",
                    &bin.join("pg_ctl"),
                    &[
                        "-D",
                        &path_str(&self.data()),
                        "-l",
                        &path_str(&self.log()),
                        "-w",
                        "-t",
                        &SERVER_WAIT.as_secs().to_string(),
                        "start",
                    ],
                );
                self.running = true;
                started.map(drop).map_err(|e| {
                    format!(
                        "starting the private PostgreSQL server: {e}\n{}",
                        tail(&self.log(), 30)
                    )
                })
            }
            Programs::Mysql { mariadbd } => {
                let (dir, data) = (path_str(&self.dir), path_str(&self.data()));
                let out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("mariadbd.out"))
                    .map_err(|e| e.to_string())?;
                let child = Command::new(&mariadbd)
                    .args([
                        "--no-defaults".to_string(),
                        "--user=mysql".into(),
                        format!("--datadir={data}"),
                        format!("--port={}", self.port),
                        format!("--socket={}", path_str(&self.socket())),
                        format!("--pid-file={dir}/mysqld.pid"),
                        format!("--bind-address={}", self.listen.join(",")),
                        "--skip-name-resolve".into(),
                        format!("--log-error={}", path_str(&self.log())),
                        "--character-set-server=utf8mb4".into(),
                        "--collation-server=utf8mb4_general_ci".into(),
                        "--innodb-buffer-pool-size=128M".into(),
                        "--innodb-flush-log-at-trx-commit=2".into(),
                        "--max-connections=300".into(),
                    ])
                    .stdin(Stdio::null())
                    .stdout(out.try_clone().map_err(|e| e.to_string())?)
                    .stderr(out)
                    .spawn()
                    .map_err(|e| format!("starting {}: {e}", mariadbd.display()))?;
                self.mariadbd = Some(child);
                self.running = true;
                let until = Instant::now() + SERVER_WAIT;
                loop {
                    if let Some(child) = self.mariadbd.as_mut() {
                        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                            self.running = false;
                            self.mariadbd = None;
                            return Err(format!(
                                "the private MariaDB server exited ({status}) while starting:\n\
                                 {}\n{}",
                                tail(&self.log(), 30),
                                tail(&self.dir.join("mariadbd.out"), 10)
                            ));
                        }
                    }
                    if self.answers() {
                        return Ok(());
                    }
                    if Instant::now() >= until {
                        return Err(format!(
                            "the private MariaDB server does not answer after {SERVER_WAIT:?}:\n{}",
                            tail(&self.log(), 30)
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Whether the server answers.
    pub(crate) fn answers(&self) -> bool {
        match &self.programs {
            Programs::Postgres { bin } => run_cmd(
                &path_str(&bin.join("pg_isready")),
                &["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()],
            )
            .is_ok(),
            Programs::Mysql { .. } => run_cmd(
                "mariadb-admin",
                &[
                    "--no-defaults",
                    &format!("--socket={}", path_str(&self.socket())),
                    "-uroot",
                    "--connect-timeout=2",
                    "ping",
                ],
            )
            .is_ok(),
        }
    }

    /// The URL of database [`DB_NAME`] through `host`.
    pub(crate) fn url(&self, host: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("postgres://postgres@{host}:{}/{DB_NAME}", self.port),
            _ => format!("mysql://jv@{host}:{}/{DB_NAME}", self.port),
        }
    }

    /// Stops the server (PostgreSQL: fast shutdown, as `pg_ctlcluster stop` does; MariaDB: a
    /// `shutdown` command) and waits until its process is gone.
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        if !self.running {
            return Ok(());
        }
        self.running = false;
        match &self.programs {
            Programs::Postgres { bin } => {
                let data = path_str(&self.data());
                let pg_ctl = bin.join("pg_ctl");
                as_user(
                    "postgres",
                    &pg_ctl,
                    &["-D", &data, "-m", "fast", "-w", "-t", "30", "stop"],
                )
                .or_else(|e| {
                    as_user(
                        "postgres",
                        &pg_ctl,
                        &["-D", &data, "-m", "immediate", "-w", "stop"],
                    )
                    .map_err(|e2| format!("{e}\n{e2}"))
                })
                .map(drop)
            }
            Programs::Mysql { .. } => {
                let Some(mut child) = self.mariadbd.take() else {
                    return Ok(());
                };
                let socket = format!("--socket={}", path_str(&self.socket()));
                let asked = run_cmd(
                    "mariadb-admin",
                    &["--no-defaults", &socket, "-uroot", "shutdown"],
                );
                let until = Instant::now() + Duration::from_secs(30);
                while child.try_wait().map_err(|e| e.to_string())?.is_none() {
                    if Instant::now() >= until {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(format!(
                            "the private MariaDB server did not stop within 30 s ({asked:?}); \
                             killed"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(())
            }
        }
    }

    /// Stops the server, keeps it down for `down_for`, starts it again and waits until it
    /// answers; answers how long it was gone.
    pub(crate) fn restart(&mut self, down_for: Duration) -> Result<Duration, String> {
        let t = Instant::now();
        self.stop()?;
        std::thread::sleep(down_for);
        self.launch()?;
        Ok(t.elapsed())
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("{} test: stopping the private server: {e}", self.test);
        }
        if std::thread::panicking() {
            eprintln!(
                "{} test: the private server's directory (log: {}) is kept until the next run",
                self.test,
                self.log().display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("{} test: removing {}: {e}", self.test, self.dir.display());
        }
    }
}

/// Where the crash, outage and soak tests keep their private servers.
pub(crate) const TEST_SERVERS_DIR: &str = "/tmp/jobvisor-test-servers";

/// The database a crash, outage or soak test runs on: a private server of its own for
/// PostgreSQL and MariaDB (which the test may stop and restart), a file in a temporary
/// directory for SQLite. Dropping it stops the server and removes the files.
#[derive(Debug)]
pub(crate) struct TestDatabase {
    /// The URL of the database.
    pub(crate) url: String,
    /// The server, unless SQLite.
    pub(crate) server: Option<PrivateServer>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    /// Starts a private server for `backend` (an SQLite file: a temporary directory). `test`
    /// names the test in messages.
    pub(crate) fn create(backend: Backend, test: &'static str) -> TestDatabase {
        if backend == Backend::Sqlite {
            let dir = tempfile::tempdir().unwrap();
            return TestDatabase {
                url: format!("sqlite://{}", dir.path().join("jobs.db").display()),
                server: None,
                _dir: Some(dir),
            };
        }
        let base = Path::new(TEST_SERVERS_DIR);
        for dir in remove_leftovers(base) {
            eprintln!(
                "{test} test: removed {} left by an earlier run",
                dir.display()
            );
        }
        let server = PrivateServer::start(backend, test, base, &[], None);
        TestDatabase {
            url: server.url("127.0.0.1"),
            server: Some(server),
            _dir: None,
        }
    }

    /// A migrated store on it.
    pub(crate) async fn store(&self) -> Store {
        Store::connect_with(
            &self.url,
            StoreOptions::default().pool_size(12).migrate(true),
        )
        .await
        .unwrap_or_else(|e| panic!("opening a store on {}: {e}", self.url))
    }
}
