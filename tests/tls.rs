//! TLS against real servers: a private PostgreSQL and a private MariaDB of this test's own
//! (own port and data directory under `/tmp`, removed afterwards), with certificates made
//! here by `openssl` — a CA, and a server certificate for the name `localhost` only.
//!
//! What is proven, on both backends:
//! * a server without TLS refuses `require` with an error that says so, and `prefer` falls
//!   back to plain;
//! * with TLS switched on: `require` connects encrypted (the server counts the TLS
//!   connection), `verify-ca` accepts the CA's certificate (on PostgreSQL whatever name
//!   was dialled),
//!   `verify-full` accepts it through `localhost` and refuses it through `127.0.0.1` (a name
//!   the certificate does not carry), and `verify-ca` with another CA's root is refused;
//! * the settings work from the URL (`sslmode`, `sslrootcert`) and from `StoreOptions`;
//! * jobs go in and come out over the encrypted connection; connect errors name their kind
//!   (refused, TLS, authentication, missing database).
//!
//! Needs root (the servers run as the `postgres` / `mysql` users), `openssl`, `initdb` /
//! `pg_ctl` and `mariadbd` / `mariadb-install-db`: all present wherever `.ci/run` runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobvisor::{Client, Error, NewJob, Store, StoreOptions, TlsMode};
use serde_json::json;

/// Runs a program, answering its stdout or an error with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A directory under `/tmp` for one server: certificates and data, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = PathBuf::from(format!("/tmp/jobvisor-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        must("chmod", &["755", &s(&d)]);
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA and a server certificate it signed for `localhost` (and no IP address), plus a
/// second, unrelated CA.
struct Certs {
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_certs(dir: &Path, owner: &str) -> Certs {
    let p = |n: &str| dir.join(n);
    for ca in ["ca", "other-ca"] {
        must(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=jobvisor test {ca}"),
                "-keyout",
                &s(&p(&format!("{ca}.key"))),
                "-out",
                &s(&p(&format!("{ca}.pem"))),
            ],
        );
    }
    must(
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &s(&p("server.key")),
            "-out",
            &s(&p("server.csr")),
        ],
    );
    std::fs::write(p("ext.cnf"), "subjectAltName=DNS:localhost\n").unwrap();
    must(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &s(&p("server.csr")),
            "-days",
            "2",
            "-CA",
            &s(&p("ca.pem")),
            "-CAkey",
            &s(&p("ca.key")),
            "-CAcreateserial",
            "-extfile",
            &s(&p("ext.cnf")),
            "-out",
            &s(&p("server.pem")),
        ],
    );
    must(
        "chown",
        &[
            &format!("{owner}:{owner}"),
            &s(&p("server.key")),
            &s(&p("server.pem")),
        ],
    );
    must("chmod", &["600", &s(&p("server.key"))]);
    Certs {
        ca: p("ca.pem"),
        other_ca: p("other-ca.pem"),
        cert: p("server.pem"),
        key: p("server.key"),
    }
}

/// Opens a store and proves it works: a job in and read back.
async fn use_store(url: &str, opts: StoreOptions) -> Result<(), Error> {
    let store = Store::connect_with(url, opts.migrate(true)).await?;
    let client = Client::new(store);
    let id = client
        .enqueue(NewJob::new("tls_probe", json!({"over": "tls"})))
        .await?
        .id;
    let job = client.get(id).await?;
    assert_eq!(job.payload, json!({"over": "tls"}));
    Ok(())
}

fn expect_err(what: &str, r: Result<(), Error>, needles: &[&str]) {
    let e = match r {
        Ok(()) => panic!("{what}: connected, but it must be refused"),
        Err(e) => e.to_string(),
    };
    for n in needles {
        assert!(e.contains(n), "{what}: the error should say {n:?}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

struct Postgres {
    dir: Dir,
    bin: PathBuf,
    port: u16,
}

impl Postgres {
    fn start(dir: Dir) -> Postgres {
        let version = must("ls", &["/usr/lib/postgresql"])
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .max()
            .expect("a PostgreSQL installation under /usr/lib/postgresql");
        let bin = PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"));
        let pg = Postgres {
            dir,
            bin,
            port: free_port(),
        };
        let data = s(&pg.data());
        must("chown", &["-R", "postgres:postgres", &s(&pg.dir.0)]);
        pg.as_postgres(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        let conf = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nssl = off\n",
            pg.port,
            s(&pg.dir.0)
        );
        let mut c = std::fs::read_to_string(pg.data().join("postgresql.conf")).unwrap();
        c.push_str(&conf);
        std::fs::write(pg.data().join("postgresql.conf"), c).unwrap();
        let log = s(&pg.dir.0.join("server.log"));
        pg.as_postgres(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", "60", "start"],
        );
        pg.psql("CREATE DATABASE app");
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    fn as_postgres(&self, tool: &str, args: &[&str]) -> String {
        let prog = s(&self.bin.join(tool));
        let mut all = vec!["-u", "postgres", "--", prog.as_str()];
        all.extend_from_slice(args);
        must("runuser", &all)
    }

    fn psql(&self, sql: &str) -> String {
        let port = self.port.to_string();
        must(
            &s(&self.bin.join("psql")),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-qAtc",
                sql,
            ],
        )
    }

    fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/app{query}", self.port)
    }

    /// Switches TLS on with `certs` (a reload suffices).
    fn enable_tls(&self, certs: &Certs) {
        self.psql(&format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}'",
            s(&certs.cert)
        ));
        self.psql(&format!(
            "ALTER SYSTEM SET ssl_key_file = '{}'",
            s(&certs.key)
        ));
        self.psql("ALTER SYSTEM SET ssl = on");
        self.psql("SELECT pg_reload_conf()");
        let until = Instant::now() + Duration::from_secs(10);
        while self.psql("SHOW ssl").trim() != "on" {
            assert!(Instant::now() < until, "PostgreSQL did not switch TLS on");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Connections of the store's database that are encrypted, as the server sees them.
    fn encrypted_connections(&self) -> u32 {
        self.psql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.datname = 'app'",
        )
        .trim()
        .parse()
        .unwrap()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = s(&self.data());
        let prog = s(&self.bin.join("pg_ctl"));
        let _ = run(
            "runuser",
            &[
                "-u",
                "postgres",
                "--",
                &prog,
                "-D",
                &data,
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }
}

#[tokio::test]
async fn postgres_tls_modes() {
    let pg = Postgres::start(Dir::new("pg"));
    let certs_dir = Dir::new("pg-certs");
    let certs = make_certs(&certs_dir.0, "postgres");

    // A server without TLS: `require` is refused and says why; `prefer` connects plainly.
    expect_err(
        "require against a plain server",
        use_store(
            &pg.url("127.0.0.1", "?sslmode=require"),
            StoreOptions::default(),
        )
        .await,
        &["TLS", "does not"],
    );
    use_store(&pg.url("127.0.0.1", ""), StoreOptions::default())
        .await
        .expect("prefer (the default) falls back to plain");

    pg.enable_tls(&certs);
    let ca = s(&certs.ca);
    use_store(
        &pg.url("127.0.0.1", "?sslmode=require"),
        StoreOptions::default(),
    )
    .await
    .expect("require");
    assert!(
        pg.encrypted_connections() > 0,
        "require: no encrypted connection seen"
    );
    use_store(
        &pg.url("127.0.0.1", &format!("?sslmode=verify-ca&sslrootcert={ca}")),
        StoreOptions::default(),
    )
    .await
    .expect("verify-ca through an address the certificate does not name");
    use_store(
        &pg.url("localhost", ""),
        StoreOptions::default()
            .tls_mode(TlsMode::VerifyFull)
            .tls_root_cert(&certs.ca),
    )
    .await
    .expect("verify-full through the certificate's name, set by StoreOptions");
    expect_err(
        "verify-full through another name",
        use_store(
            &pg.url(
                "127.0.0.1",
                &format!("?sslmode=verify-full&sslrootcert={ca}"),
            ),
            StoreOptions::default(),
        )
        .await,
        &["TLS failure"],
    );
    expect_err(
        "verify-ca with another CA",
        use_store(
            &pg.url(
                "localhost",
                &format!("?sslmode=verify-ca&sslrootcert={}", s(&certs.other_ca)),
            ),
            StoreOptions::default(),
        )
        .await,
        &["TLS failure"],
    );
    expect_err(
        "verify-full with the compiled-in roots",
        use_store(
            &pg.url("localhost", "?sslmode=verify-full"),
            StoreOptions::default(),
        )
        .await,
        &["TLS failure"],
    );
    expect_err(
        "a root file that does not exist",
        use_store(
            &pg.url(
                "localhost",
                "?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            ),
            StoreOptions::default(),
        )
        .await,
        &["/nonexistent/ca.pem", "cannot be read"],
    );
    expect_err(
        "a missing database",
        use_store(
            &format!(
                "postgres://postgres@localhost:{}/nope?sslmode=require",
                pg.port
            ),
            StoreOptions::default(),
        )
        .await,
        &["the database does not exist"],
    );
    expect_err(
        "an unknown user",
        use_store(
            &format!(
                "postgres://nobody:pw@localhost:{}/app?sslmode=require",
                pg.port
            ),
            StoreOptions::default(),
        )
        .await,
        &["authentication failed"],
    );
    let closed = free_port();
    expect_err(
        "nothing listening",
        use_store(
            &format!("postgres://postgres@127.0.0.1:{closed}/app"),
            StoreOptions::default().connect_timeout(Duration::from_secs(2)),
        )
        .await,
        &["connection refused"],
    );
}

// ---------------------------------------------------------------------------------------------
// MariaDB

struct Mariadb {
    dir: Dir,
    port: u16,
    child: Option<Child>,
}

impl Mariadb {
    fn create(dir: Dir) -> Mariadb {
        must("chown", &["-R", "mysql:mysql", &s(&dir.0)]);
        must(
            "mariadb-install-db",
            &[
                "--no-defaults",
                "--user=mysql",
                &format!("--datadir={}", s(&dir.0.join("data"))),
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
        );
        Mariadb {
            dir,
            port: free_port(),
            child: None,
        }
    }

    fn socket(&self) -> String {
        s(&self.dir.0.join("mysqld.sock"))
    }

    fn start(&mut self, certs: Option<&Certs>) {
        self.stop();
        let mut args = vec![
            "--no-defaults".to_string(),
            "--user=mysql".into(),
            format!("--datadir={}", s(&self.dir.0.join("data"))),
            format!("--port={}", self.port),
            format!("--socket={}", self.socket()),
            format!("--pid-file={}", s(&self.dir.0.join("mysqld.pid"))),
            "--bind-address=127.0.0.1".into(),
            "--skip-name-resolve".into(),
            format!("--log-error={}", s(&self.dir.0.join("server.log"))),
            "--innodb-buffer-pool-size=64M".into(),
        ];
        if let Some(c) = certs {
            args.push(format!("--ssl-ca={}", s(&c.ca)));
            args.push(format!("--ssl-cert={}", s(&c.cert)));
            args.push(format!("--ssl-key={}", s(&c.key)));
        }
        self.child = Some(
            Command::new("/usr/sbin/mariadbd")
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let until = Instant::now() + Duration::from_secs(60);
        let sock = format!("--socket={}", self.socket());
        while run("mariadb-admin", &["--no-defaults", &sock, "-uroot", "ping"]).is_err() {
            assert!(
                Instant::now() < until,
                "the private MariaDB does not answer"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.sql(
            "CREATE DATABASE IF NOT EXISTS app; CREATE USER IF NOT EXISTS 'jv'@'127.0.0.1'; \
             GRANT ALL PRIVILEGES ON *.* TO 'jv'@'127.0.0.1'",
        );
    }

    fn sql(&self, sql: &str) -> String {
        let sock = format!("--socket={}", self.socket());
        must(
            "mariadb",
            &["--no-defaults", &sock, "-uroot", "-N", "-B", "-e", sql],
        )
    }

    fn url(&self, host: &str, query: &str) -> String {
        format!("mysql://jv@{host}:{}/app{query}", self.port)
    }

    /// TLS handshakes the server has accepted so far.
    fn tls_accepts(&self) -> u64 {
        let out = self.sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'");
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let sock = format!("--socket={}", self.socket());
            let _ = run(
                "mariadb-admin",
                &["--no-defaults", &sock, "-uroot", "shutdown"],
            );
            let until = Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn mysql_tls_modes() {
    let mut db = Mariadb::create(Dir::new("mariadb"));
    let certs_dir = Dir::new("mariadb-certs");
    let certs = make_certs(&certs_dir.0, "mysql");

    db.start(None);
    expect_err(
        "require against a plain server",
        use_store(
            &db.url("127.0.0.1", "?sslmode=require"),
            StoreOptions::default(),
        )
        .await,
        &["TLS", "does not support"],
    );
    use_store(&db.url("127.0.0.1", ""), StoreOptions::default())
        .await
        .expect("prefer (the default) falls back to plain");

    db.start(Some(&certs));
    let ca = s(&certs.ca);
    let before = db.tls_accepts();
    use_store(
        &db.url("127.0.0.1", "?ssl-mode=REQUIRED"),
        StoreOptions::default(),
    )
    .await
    .expect("require, by MySQL's name");
    assert!(db.tls_accepts() > before, "require: no TLS handshake seen");
    // MySQL's driver checks the name under verify-ca too (see `TlsMode::VerifyCa`): dialled
    // by the certificate's name, the CA's certificate is accepted.
    use_store(
        &db.url("localhost", &format!("?sslmode=verify-ca&sslrootcert={ca}")),
        StoreOptions::default(),
    )
    .await
    .expect("verify-ca");
    use_store(
        &db.url("localhost", ""),
        StoreOptions::default()
            .tls_mode(TlsMode::VerifyFull)
            .tls_root_cert(&certs.ca),
    )
    .await
    .expect("verify-full through the certificate's name, set by StoreOptions");
    expect_err(
        "verify-full through another name",
        use_store(
            &db.url(
                "127.0.0.1",
                &format!("?sslmode=verify-full&sslrootcert={ca}"),
            ),
            StoreOptions::default(),
        )
        .await,
        &["TLS failure"],
    );
    expect_err(
        "verify-ca with another CA",
        use_store(
            &db.url(
                "localhost",
                &format!("?sslmode=verify-ca&sslrootcert={}", s(&certs.other_ca)),
            ),
            StoreOptions::default(),
        )
        .await,
        &["TLS failure"],
    );
    expect_err(
        "an unknown user",
        use_store(
            &format!(
                "mysql://nobody:pw@127.0.0.1:{}/app?sslmode=require",
                db.port
            ),
            StoreOptions::default(),
        )
        .await,
        &["authentication failed"],
    );
    expect_err(
        "a missing database",
        use_store(
            &format!("mysql://jv@127.0.0.1:{}/nope?sslmode=require", db.port),
            StoreOptions::default(),
        )
        .await,
        &["the database does not exist"],
    );
    expect_err(
        "mysql_async's own switches",
        use_store(
            &db.url("127.0.0.1", "?require_ssl=true"),
            StoreOptions::default(),
        )
        .await,
        &["require_ssl", "sslmode="],
    );
}
