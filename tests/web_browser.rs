//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! Debian's `chromium` and `chromium-driver`), against a live scheduler on each backend.
//! One browser session per backend walks an operator's path: refused without credentials,
//! a wrong token, log in; the overview; find a dead job in the dead letters, open it, retry
//! it and watch it succeed on the live page; bulk-cancel by a filter after its preview;
//! pause a queue and see claims stop; a read-only dashboard hides and refuses actions; a
//! hostile payload, kind and error render inert. A second walk watches a small, ordinary
//! run (three queues, a schedule firing every second, a few failures): the dead letters
//! grouped by kind and code, the schedule's recent fires linking to their jobs, a queue's
//! pending jobs in run-time order — and takes the screenshots the README shows. A third
//! logs in once to `jobvisor dashboard` as built (two workers) and to an embedded app with
//! four, and works across every worker: navigations, requests on new connections, actions
//! (each in the audit log), then a logout that revokes the session on all of them; then a
//! running job's page on each turns "succeeded" within a second of the job ending (pushed by
//! the event stream).
//!
//! Screenshots of each main view go to the directory in `JOBVISOR_SCREENSHOTS` when set
//! (CI keeps them as artifacts). A missing chromedriver fails the tests; it never skips them.

#![allow(clippy::unwrap_used)]

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use jobvisor::testing::{ClaimParams, Finalize, FinalizeParams, StoreEngine as _, TestDb};
use jobvisor::web::{Dashboard, DashboardConfig};
use jobvisor::{
    handler_fn, Backend, Client, JobContext, JobError, JobId, JobOutcome, JobState, NewJob, NodeId,
    QueueConfig, Schedule, Scheduler, SchedulerConfig, Store,
};
use serde_json::{json, Value};

const TOKEN: &str = "browser-test-token-0123456789";
const XSS_KIND: &str = "<script>window.__xss='kind'</script>";
const XSS_PAYLOAD: &str =
    "<script>window.__xss='payload'</script><img src=x onerror=\"window.__xss='img'\">";
const XSS_ERROR: &str = "<img src=y onerror=\"window.__xss='error'\">";
const WAIT: Duration = Duration::from_secs(20);

/// chromedriver on a free loopback port, stopped on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    /// Stops chromedriver and the browsers it started (its process group), also when a test
    /// panicked before closing its session.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        // A process group of its own, so that dropping the driver stops its browsers too.
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is not installed: apt-get install -y chromium chromium-driver");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Driver { child, port }
}

async fn browser(d: &Driver) -> Browser {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({ "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1280,1000"] }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", d.port))
        .await
        .expect("chromedriver refused a session")
}

/// Saves a screenshot as `<dir>/<backend>-<name>.png` when `JOBVISOR_SCREENSHOTS` is set.
async fn shot(b: &Browser, backend: Backend, name: &str) {
    if let Ok(dir) = std::env::var("JOBVISOR_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        let png = b.screenshot().await.unwrap();
        let file = format!("{dir}/{}-{name}.png", format!("{backend:?}").to_lowercase());
        std::fs::write(file, png).unwrap();
    }
}

async fn text(b: &Browser, css: &str) -> String {
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn click(b: &Browser, css: &str) {
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Waits until the element's text satisfies `ok` (the page may update itself meanwhile).
async fn until_text(b: &Browser, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(e) = b.find(Locator::Css(css)).await {
            if let Ok(t) = e.text().await {
                if ok(&t) {
                    return t;
                }
            }
        }
        assert!(Instant::now() < deadline, "{css} never matched");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn login(b: &Browser, base: &str) {
    b.goto(&format!("{base}/")).await.unwrap();
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(b, "#login").await;
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#queues"))
        .await
        .unwrap();
}

/// Serves `config` on a free loopback port with one worker: the base URL and the server's
/// handle.
fn serve(client: &Client, config: DashboardConfig) -> (String, actix_web::dev::ServerHandle) {
    serve_on(client, config, 1)
}

/// Serves `config` with `workers` workers, the dashboard built once as the docs say.
fn serve_on(
    client: &Client,
    config: DashboardConfig,
    workers: usize,
) -> (String, actix_web::dev::ServerHandle) {
    let dashboard = Dashboard::new("/ops", client.clone(), config);
    let server =
        actix_web::HttpServer::new(move || actix_web::App::new().service(dashboard.service()))
            .workers(workers)
            .bind(("127.0.0.1", 0))
            .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix::spawn(server);
    (format!("http://{addr}/ops"), handle)
}

async fn operator_path(backend: Backend) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let down = Arc::new(AtomicBool::new(true));
    let flaky = {
        let down = down.clone();
        handler_fn(move |_: Value, _ctx: JobContext| {
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    return Err(JobError::fail("the mail server is down").with_code("smtp_down"));
                }
                // Long enough to be watched running: the page must update itself.
                tokio::time::sleep(Duration::from_millis(2500)).await;
                JobOutcome::success(json!({"sent": true}))
            }
        })
    };
    let hostile = handler_fn(|_: Value, _ctx: JobContext| async move {
        Err::<JobOutcome, _>(JobError::fail(XSS_ERROR).with_code("hostile"))
    });
    let ok =
        handler_fn(|_: Value, _ctx: JobContext| async move { JobOutcome::success(json!("ok")) });
    let scheduler = Scheduler::builder(store.clone())
        .config(SchedulerConfig::default().sweep_every(Duration::from_millis(500)))
        .queue(
            "work",
            QueueConfig::default().poll_interval(Duration::from_millis(50)),
        )
        .handler("send_mail", flaky)
        .handler(XSS_KIND, hostile)
        .handler("ok", ok)
        .start()
        .unwrap();
    let client = scheduler.client();
    let dead = client
        .enqueue(
            NewJob::new("send_mail", json!({"to": "a@example.com"}))
                .queue("work")
                .max_attempts(1),
        )
        .await
        .unwrap()
        .id;
    let xss = client
        .enqueue(
            NewJob::new(XSS_KIND, json!({"html": XSS_PAYLOAD}))
                .queue("work")
                .max_attempts(1),
        )
        .await
        .unwrap()
        .id;
    for id in [dead, xss] {
        assert_eq!(client.wait(id, WAIT).await.unwrap().state, JobState::Dead);
    }
    for i in 0..3 {
        client
            .enqueue(
                NewJob::new("report", json!({"i": i}))
                    .queue("later")
                    .delay(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
    }
    let (base, server) = serve(&client, DashboardConfig::with_token(TOKEN).unwrap());
    let driver = start_driver();
    let b = browser(&driver).await;

    // Refused without credentials: every page leads to the login page; a wrong token fails.
    b.goto(&format!("{base}/jobs")).await.unwrap();
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    assert!(b
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/ops/login"));
    shot(&b, backend, "login").await;
    b.find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("not-the-token-at-all")
        .await
        .unwrap();
    click(&b, "#login").await;
    assert_eq!(text(&b, "#login-error").await, "wrong token");

    // Logged in: the overview lists the queues, the chart, the nodes.
    login(&b, &base).await;
    let queues = text(&b, "#queues").await;
    assert!(
        queues.contains("work") && queues.contains("later"),
        "{queues}"
    );
    b.find(Locator::Css("svg#throughput")).await.unwrap();
    until_text(&b, "#nodes", |t| t.contains("send_mail")).await;
    shot(&b, backend, "overview").await;

    // On a live page, text typed into a filter and not submitted survives the refreshes.
    b.goto(&format!("{base}/jobs?state=pending")).await.unwrap();
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#live.on"))
        .await
        .unwrap();
    let kind = b.find(Locator::Css("input[name=kind]")).await.unwrap();
    kind.send_keys("typed-not-sent").await.unwrap();
    // Focus elsewhere, so the page refreshes meanwhile.
    b.execute(
        "document.activeElement.blur(); window.__before = document.getElementById('main');",
        vec![],
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WAIT;
    while b
        .execute(
            "return window.__before === document.getElementById('main');",
            vec![],
        )
        .await
        .unwrap()
        == json!(true)
    {
        assert!(Instant::now() < deadline, "the jobs page never refreshed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = b
        .execute(
            "return document.querySelector('input[name=kind]').value;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(kept, json!("typed-not-sent"), "a refresh wiped typed input");

    // Find the dead job in the dead letters, open it, retry it, watch it succeed live.
    b.goto(&format!("{base}/dead")).await.unwrap();
    let groups = text(&b, "#dead-groups").await;
    assert!(
        groups.contains("send_mail") && groups.contains("smtp_down"),
        "{groups}"
    );
    shot(&b, backend, "dead-letters").await;
    click(&b, &format!("#dead-groups a[href='/ops/jobs/{}']", dead.0)).await;
    assert_eq!(text(&b, "#job-state").await, "dead");
    shot(&b, backend, "job-dead").await;
    down.store(false, Ordering::SeqCst);
    click(&b, "#retry-job").await;
    assert!(text(&b, "#flash").await.contains("retried"));
    b.goto(&format!("{base}/jobs/{}", dead.0)).await.unwrap();
    let first = text(&b, "#job-state").await;
    assert!(first == "pending" || first == "running", "{first}");
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#live.on"))
        .await
        .unwrap();
    // No reload from here: the page's own polling shows the end.
    until_text(&b, "#job-state", |t| t == "succeeded").await;
    assert!(text(&b, "#result").await.contains("\"sent\": true"));
    shot(&b, backend, "job-succeeded").await;

    // Bulk-cancel by a filter: the preview counts, the confirmation applies.
    b.goto(&format!("{base}/jobs?queue=later")).await.unwrap();
    shot(&b, backend, "jobs").await;
    b.find(Locator::LinkText("Cancel all matching…"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&b, "#bulk-n").await, "3");
    shot(&b, backend, "bulk-preview").await;
    click(&b, "#confirm").await;
    assert!(text(&b, "#flash").await.contains("3 job(s) cancelled"));
    let left = client
        .list(jobvisor::ListParams {
            queue: Some("later".into()),
            state: Some(JobState::Pending),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");

    // Pause a queue: claims stop; resume: the job runs.
    b.goto(&format!("{base}/queues")).await.unwrap();
    click(&b, "button[data-queue='work']").await;
    assert!(text(&b, "#flash").await.contains("paused"));
    let held = client
        .enqueue(NewJob::new("ok", json!(1)).queue("work"))
        .await
        .unwrap()
        .id;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        client.get(held).await.unwrap().state,
        JobState::Pending,
        "a paused queue is not claimed"
    );
    b.goto(&format!("{base}/queues")).await.unwrap();
    assert!(text(&b, "#queue-table").await.contains("paused"));
    shot(&b, backend, "queues").await;
    click(&b, "button[data-queue='work']").await;
    assert_eq!(
        client.wait(held, WAIT).await.unwrap().state,
        JobState::Succeeded
    );

    // The hostile job renders inert: its text is shown, nothing of it runs.
    b.goto(&format!("{base}/jobs/{}", xss.0)).await.unwrap();
    assert_eq!(text(&b, "#job-kind").await, XSS_KIND);
    assert!(text(&b, "#payload")
        .await
        .contains("<script>window.__xss='payload'</script>"));
    assert!(text(&b, "#errors").await.contains(XSS_ERROR));
    b.goto(&format!("{base}/dead")).await.unwrap();
    b.goto(&format!("{base}/jobs?state=dead")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ran = b
        .execute(
            "return window.__xss === undefined ? null : String(window.__xss);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(ran, Value::Null, "hostile markup ran");
    b.goto(&format!("{base}/jobs/{}", xss.0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ran = b
        .execute(
            "return window.__xss === undefined ? null : String(window.__xss);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(ran, Value::Null, "hostile markup ran");
    shot(&b, backend, "job-hostile").await;

    // Read-only: no actions shown, and a forged POST (with a valid CSRF token) is refused.
    let (ro_base, ro_server) = serve(
        &client,
        DashboardConfig::with_token(TOKEN).unwrap().read_only(true),
    );
    login(&b, &ro_base).await;
    b.goto(&format!("{ro_base}/jobs/{}", xss.0)).await.unwrap();
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#read-only"))
        .await
        .unwrap();
    assert!(
        b.find(Locator::Css("#retry-job")).await.is_err(),
        "read-only shows no retry"
    );
    assert!(b.find(Locator::Css("#delete-job")).await.is_err());
    let status = b
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const csrf = document.querySelector('input[name=csrf]').value;
             fetch(arguments[0], { method: 'POST', body: new URLSearchParams({ csrf: csrf, version: arguments[1] }) })
               .then(r => done(r.status));",
            vec![json!(format!("{ro_base}/jobs/{}/retry", xss.0)), json!(client.get(xss).await.unwrap().version.to_string())],
        )
        .await
        .unwrap();
    assert_eq!(status, json!(403));
    assert_eq!(client.get(xss).await.unwrap().state, JobState::Dead);
    shot(&b, backend, "read-only").await;

    // Nodes and schedules render.
    b.goto(&format!("{ro_base}/nodes")).await.unwrap();
    until_text(&b, "#node-table", |t| t.contains("send_mail")).await;
    shot(&b, backend, "nodes").await;

    // A live page whose session is lost says so, with a way back in.
    b.delete_cookie("jobvisor_session").await.unwrap();
    let expired = until_text(&b, "#session-expired", |t| t.contains("log in")).await;
    assert!(expired.starts_with("Session expired"), "{expired}");
    let href = b
        .find(Locator::Css("#session-expired a"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap()
        .unwrap();
    assert!(href.starts_with("/ops/login?next="), "{href}");
    shot(&b, backend, "session-expired").await;

    b.close().await.unwrap();
    drop(driver);
    server.stop(true).await;
    ro_server.stop(true).await;
    scheduler.shutdown().await;
    let _: JobId = dead;
}

/// A small, ordinary run: mail, billing and reports, a digest scheduled every second, a few
/// cards declined and mails bounced; then the views an operator opens first.
async fn small_run(backend: Backend) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let mail = handler_fn(|p: Value, _ctx: JobContext| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        if p["to"]
            .as_str()
            .is_some_and(|t| t.ends_with("@invalid.example"))
        {
            return Err(JobError::fail("550 mailbox unavailable").with_code("smtp_550"));
        }
        JobOutcome::success(json!({ "message_id": format!("<{}@mail.example>", p["n"]) }))
    });
    let charge = handler_fn(|p: Value, _ctx: JobContext| async move {
        tokio::time::sleep(Duration::from_millis(40)).await;
        if p["cents"].as_i64().unwrap_or(0) > 50_000 {
            return Err(
                JobError::fail("card declined: insufficient funds").with_code("card_declined")
            );
        }
        JobOutcome::success(json!({ "charged": p["cents"] }))
    });
    let report = handler_fn(|_: Value, _ctx: JobContext| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        JobOutcome::success(json!({ "rows": 1240 }))
    });
    let fast = QueueConfig::default().poll_interval(Duration::from_millis(50));
    let scheduler = Scheduler::builder(store.clone())
        .queue("mail", fast.clone())
        .queue("billing", fast.clone())
        .queue("reports", fast)
        .handler("send_email", mail)
        .handler("charge_card", charge)
        .handler("build_report", report)
        .periodic(Schedule::every(
            "digest",
            Duration::from_secs(1),
            NewJob::new("build_report", json!({ "report": "digest" })).queue("reports"),
        ))
        .start()
        .unwrap();
    let client = scheduler.client();
    let mut ids = Vec::new();
    for n in 0..24 {
        let to = if n % 8 == 5 {
            format!("user{n}@invalid.example")
        } else {
            format!("user{n}@example.com")
        };
        ids.push(
            client
                .enqueue(
                    NewJob::new("send_email", json!({ "n": n, "to": to }))
                        .queue("mail")
                        .max_attempts(1),
                )
                .await
                .unwrap()
                .id,
        );
    }
    let mut declined = None;
    for n in 0..12 {
        let cents = if n % 5 == 3 { 72_000 } else { 1_990 + n * 100 };
        let id = client
            .enqueue(
                NewJob::new("charge_card", json!({ "order": 1000 + n, "cents": cents }))
                    .queue("billing")
                    .max_attempts(1),
            )
            .await
            .unwrap()
            .id;
        if cents > 50_000 && declined.is_none() {
            declined = Some(id);
        }
        ids.push(id);
    }
    // Tomorrow's mail, waiting in run-time order (enqueued latest first).
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    for n in 0..5 {
        client
            .enqueue(
                NewJob::new(
                    "send_email",
                    json!({ "n": 100 + n, "to": "later@example.com" }),
                )
                .queue("mail")
                .run_at(tomorrow - chrono::Duration::minutes(n * 10)),
            )
            .await
            .unwrap();
    }
    for id in &ids {
        assert!(client.wait(*id, WAIT).await.unwrap().state.is_terminal());
    }
    let declined = declined.unwrap();
    // A few of the digest's fires.
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let driver = start_driver();
    let b = browser(&driver).await;
    let (base, server) = serve(&client, DashboardConfig::with_token(TOKEN).unwrap());
    login(&b, &base).await;
    until_text(&b, "#queues", |t| {
        t.contains("billing") && t.contains("reports")
    })
    .await;
    shot(&b, backend, "run-overview").await;

    b.goto(&format!("{base}/dead")).await.unwrap();
    let groups = text(&b, "#dead-groups").await;
    assert!(
        groups.contains("smtp_550") && groups.contains("card_declined"),
        "{groups}"
    );
    assert!(b.find(Locator::Css("#dead-exact")).await.is_ok());
    shot(&b, backend, "run-dead-letters").await;

    b.goto(&format!("{base}/schedules")).await.unwrap();
    let fires = b.find_all(Locator::Css("ol.fires li a")).await.unwrap();
    assert!(fires.len() >= 2, "{} fires listed", fires.len());
    fires[0].click().await.unwrap();
    assert_eq!(text(&b, "#job-kind").await, "build_report");
    shot(&b, backend, "run-schedule-fire").await;

    b.goto(&format!(
        "{base}/jobs?queue=mail&state=pending&order=run_at_asc"
    ))
    .await
    .unwrap();
    assert!(b.find(Locator::Css("#run-at-exact")).await.is_ok());
    let rows = text(&b, "#jobs tbody").await;
    assert_eq!(rows.lines().count(), 5, "{rows}");

    b.goto(&format!("{base}/jobs/{}", declined.0))
        .await
        .unwrap();
    assert!(text(&b, "#errors").await.contains("card declined"));
    shot(&b, backend, "run-job").await;

    // An error page: styled, with the navigation and a way to log in.
    b.goto(&format!("{base}/jobs/999999999")).await.unwrap();
    assert!(text(&b, "#error-message").await.contains("not found"));
    b.find(Locator::Css("header nav a[href='/ops/dead']"))
        .await
        .unwrap();
    b.find(Locator::Css("#error-login")).await.unwrap();
    shot(&b, backend, "error").await;

    // At 420 px (a phone) no page scrolls sideways; an empty list says so.
    b.set_window_size(420, 900).await.unwrap();
    for page in [
        "/".to_string(),
        "/jobs".to_string(),
        format!("/jobs/{}", declined.0),
        "/dead".to_string(),
        "/queues".to_string(),
        "/schedules".to_string(),
        "/nodes".to_string(),
        "/jobs?queue=nothing-here".to_string(),
    ] {
        b.goto(&format!("{base}{page}")).await.unwrap();
        b.wait()
            .at_most(WAIT)
            .for_element(Locator::Css("#main"))
            .await
            .unwrap();
        let wide = b
            .execute(
                "return [document.documentElement.scrollWidth, window.innerWidth];",
                vec![],
            )
            .await
            .unwrap();
        let (scroll, inner) = (wide[0].as_i64().unwrap(), wide[1].as_i64().unwrap());
        assert!(
            scroll <= inner,
            "{page} scrolls sideways at 420 px: {scroll} > {inner}"
        );
        let name = format!("narrow{}", page.replace(['/', '?', '=', '&'], "-"));
        shot(&b, backend, &name).await;
    }
    b.set_window_size(1280, 1000).await.unwrap();

    b.close().await.unwrap();
    drop(driver);
    server.stop(true).await;
    scheduler.shutdown().await;
}

#[actix::test]
async fn small_run_on_postgres() {
    small_run(Backend::Postgres).await;
}

#[actix::test]
async fn small_run_on_mysql() {
    small_run(Backend::Mysql).await;
}

#[actix::test]
async fn small_run_on_sqlite() {
    small_run(Backend::Sqlite).await;
}

#[actix::test]
async fn operator_path_on_postgres() {
    operator_path(Backend::Postgres).await;
}

#[actix::test]
async fn operator_path_on_mysql() {
    operator_path(Backend::Mysql).await;
}

#[actix::test]
async fn operator_path_on_sqlite() {
    operator_path(Backend::Sqlite).await;
}

/// `jobvisor dashboard` as built (its own two workers) on `url`, stopped on drop.
struct CliDashboard {
    child: Child,
    base: String,
}

impl Drop for CliDashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli_dashboard(url: &str) -> CliDashboard {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(assert_cmd::cargo::cargo_bin("jobvisor"))
        .env("DATABASE_URL", url)
        .env("JOBVISOR_DASHBOARD_TOKEN", TOKEN)
        .args(["dashboard", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "jobvisor dashboard did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    CliDashboard {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// One request on a connection of its own (`Connection: close`), so that successive requests
/// reach the server's workers in turn: the status line's code and the whole response.
async fn fresh_request(
    base: &str,
    method: &str,
    path: &str,
    cookie: &str,
    form: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let url = url::Url::parse(base).unwrap();
    let host = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let mut s = tokio::net::TcpStream::connect(&host).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nCookie: {cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{form}",
        form.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8_lossy(&out).to_string();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {out}"));
    (code, out)
}

/// After one login in the browser, on a server of `workers` workers at `base` (its pages
/// under `prefix`): 100 navigations and 100 requests on new connections are all served,
/// 20 actions (pause, resume) on new connections all applied, and a logout revokes the
/// session on every worker.
async fn one_login_serves_every_worker(b: &Browser, base: &str, prefix: &str, workers: usize) {
    let root = format!("{base}{prefix}");
    // Cookies are per host, not per port: the other server's would be sent along.
    b.goto(&format!("{root}/login")).await.unwrap();
    b.delete_all_cookies().await.unwrap();
    login(b, &root).await;
    let pages = ["/", "/jobs", "/dead", "/queues", "/schedules", "/nodes"];
    for i in 0..100 {
        let page = pages[i % pages.len()];
        b.goto(&format!("{root}{page}")).await.unwrap();
        b.wait()
            .at_most(WAIT)
            .for_element(Locator::Css("#main"))
            .await
            .unwrap_or_else(|_| panic!("navigation {i} to {page}: not served"));
        let path = b.current_url().await.unwrap().path().to_string();
        assert!(
            !path.ends_with("/login"),
            "navigation {i} to {page}: sent to log in"
        );
    }
    let cookies = b.get_all_cookies().await.unwrap();
    let cookie = cookies
        .iter()
        .map(|c| format!("{}={}", c.name(), c.value()))
        .collect::<Vec<_>>()
        .join("; ");
    let csrf = cookies
        .iter()
        .find(|c| c.name() == "jobvisor_csrf")
        .unwrap()
        .value()
        .to_string();
    for i in 0..100 {
        let page = pages[i % pages.len()];
        let (code, out) = fresh_request(base, "GET", &format!("{prefix}{page}"), &cookie, "").await;
        assert_eq!(
            code, 200,
            "request {i} to {page} on a new connection: {out}"
        );
    }
    for i in 0..20 {
        let action = if i % 2 == 0 { "pause" } else { "resume" };
        let form = format!("queue=work&csrf={csrf}");
        let (code, out) = fresh_request(
            base,
            "POST",
            &format!("{prefix}/queues/{action}"),
            &cookie,
            &form,
        )
        .await;
        assert_eq!(code, 200, "action {i} ({action}): {out}");
        assert!(
            out.contains(&format!("queue work {action}d")),
            "action {i}: {out}"
        );
    }
    // Log out in the browser: the old session is refused on every worker.
    b.goto(&format!("{root}/queues")).await.unwrap();
    click(b, "form.logout button").await;
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    for i in 0..2 * workers {
        let (code, out) = fresh_request(base, "GET", &format!("{prefix}/jobs"), &cookie, "").await;
        assert_eq!(code, 303, "request {i} after logout: {out}");
    }
}

/// A running job's page, open in the browser, turns "succeeded" within a second of the job
/// ending (the event stream, not the 2 s poll): the time it took.
async fn a_live_page_follows_its_job(b: &Browser, root: &str, store: &Store) -> Duration {
    let client = Client::new(store.clone());
    let id = client
        .enqueue(NewJob::new("live", json!({})).queue("live"))
        .await
        .unwrap()
        .id;
    let c = store
        .job_claim(ClaimParams {
            queue: "live".into(),
            owner: NodeId::new("browser-test").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(600),
            now: None,
        })
        .await
        .unwrap()
        .pop()
        .unwrap();
    b.goto(&format!("{root}/jobs/{}", id.0)).await.unwrap();
    until_text(b, "#job-state", |t| t == "running").await;
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("body[data-stream='open']"))
        .await
        .unwrap();
    let start = Instant::now();
    store
        .job_finalize_many(FinalizeParams {
            items: vec![Finalize::succeeded(c.id, c.token, json!({"ok": true}))],
            now: None,
        })
        .await
        .unwrap();
    let deadline = start + Duration::from_secs(1);
    loop {
        // The page may swap its main between the find and the read: not yet, then.
        let state = match b.find(Locator::Css("#job-state")).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if state == "succeeded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{root}: the page still says {state:?} a second after the job ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Ends `n` jobs of `queue` at `at` (every third dead), as a node would have.
async fn end_jobs_at(store: &Store, queue: &str, n: usize, at: chrono::DateTime<chrono::Utc>) {
    for i in 0..n {
        store
            .job_enqueue(
                NewJob::new("report", json!({ "i": i })).queue(queue),
                Some(at),
            )
            .await
            .unwrap();
        let c = store
            .job_claim(ClaimParams {
                queue: queue.into(),
                owner: NodeId::new("history-node").unwrap(),
                limit: 1,
                kinds: None,
                lease: Duration::from_secs(60),
                now: Some(at),
            })
            .await
            .unwrap()
            .pop()
            .unwrap();
        let end = if i % 3 == 2 {
            Finalize::dead(
                c.id,
                c.token,
                jobvisor::JobFailure::new("smtp_down", "failed", 1),
            )
        } else {
            Finalize::succeeded(c.id, c.token, json!({}))
        };
        store
            .job_finalize_many(FinalizeParams {
                items: vec![end],
                now: Some(at),
            })
            .await
            .unwrap();
    }
}

/// The history page draws a day of the rollup per queue, and a batch's page shows its
/// members by outcome; both are shot for the README's tour.
async fn history_and_a_batch(
    b: &Browser,
    root: &str,
    client: &Client,
    store: &Store,
    backend: Backend,
) {
    let now = chrono::Utc::now();
    for (hours, n) in [(9, 4), (6, 7), (3, 5), (1, 9)] {
        let at = now - chrono::Duration::hours(hours);
        end_jobs_at(store, "reports", n, at).await;
        end_jobs_at(store, "mail", n / 2 + 1, at).await;
        // The gauges' turn of that moment rolled them up.
        store
            .throughput_roll(at + chrono::Duration::seconds(1))
            .await
            .unwrap();
    }
    b.goto(&format!("{root}/history")).await.unwrap();
    b.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#history-reports"))
        .await
        .unwrap();
    // Every third job of each hour's run dead: "reports" 25 jobs (1 + 2 + 1 + 3 dead),
    // "mail" 15 (one dead an hour).
    let page = text(b, "main").await;
    assert!(
        page.contains("18 succeeded · 7 failed in 24 h")
            && page.contains("11 succeeded · 4 failed in 24 h"),
        "{page}"
    );
    shot(b, backend, "history").await;

    let members = (0..4)
        .map(|i| NewJob::new("resize", json!({ "image": i })).queue("images"))
        .collect();
    let batch = client
        .enqueue_batch(
            members,
            NewJob::new("album_ready", json!({})).queue("images"),
        )
        .await
        .unwrap();
    client.cancel(batch.members[0].id).await.unwrap();
    let c = store
        .job_claim(ClaimParams {
            queue: "images".into(),
            owner: NodeId::new("batch-node").unwrap(),
            limit: 1,
            kinds: None,
            lease: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap()
        .pop()
        .unwrap();
    store
        .job_finalize_many(FinalizeParams {
            items: vec![Finalize::succeeded(c.id, c.token, json!({}))],
            now: None,
        })
        .await
        .unwrap();
    b.goto(&format!("{root}/batches/{}", batch.callback.id.0))
        .await
        .unwrap();
    until_text(b, "#batch-ended", |t| t == "2 of 4").await;
    shot(b, backend, "batch").await;
}

/// The CLI as shipped (two workers) and an embedded app with four: one login serves all;
/// a live page follows its job; the actions are in the audit log.
async fn logins_hold_on_every_worker(backend: Backend) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let client = Client::new(store.clone());
    let cli = cli_dashboard(&db.url);
    let (base, server) = serve_on(&client, DashboardConfig::with_token(TOKEN).unwrap(), 4);
    let embedded = base.trim_end_matches("/ops").to_string();
    let driver = start_driver();
    let b = browser(&driver).await;
    one_login_serves_every_worker(&b, &cli.base, "", 2).await;
    // 20 actions on the CLI's dashboard, 20 on the embedded one: all in the audit log.
    let log = client.audit(None, 100).await.unwrap();
    assert_eq!(log.len(), 20, "{log:#?}");
    assert!(log
        .iter()
        .all(|a| a.who.starts_with("dashboard login (token)") && a.ok));
    one_login_serves_every_worker(&b, &embedded, "/ops", 4).await;
    assert_eq!(client.audit(None, 100).await.unwrap().len(), 40);
    // Live, on both: logged in again, a job page follows its job.
    for root in [cli.base.clone(), format!("{embedded}/ops")] {
        b.goto(&format!("{root}/login")).await.unwrap();
        b.delete_all_cookies().await.unwrap();
        login(&b, &root).await;
        let took = a_live_page_follows_its_job(&b, &root, &store).await;
        eprintln!("{backend:?} {root}: the page said succeeded {took:?} after the job ended");
    }
    b.goto(&format!("{embedded}/ops/audit")).await.unwrap();
    until_text(&b, "#audit", |t| t.contains("queue.pause")).await;
    shot(&b, backend, "audit").await;
    history_and_a_batch(&b, &format!("{embedded}/ops"), &client, &store, backend).await;
    b.close().await.unwrap();
    drop(driver);
    drop(cli);
    server.stop(true).await;
}

#[actix::test]
async fn logins_hold_on_every_worker_on_postgres() {
    logins_hold_on_every_worker(Backend::Postgres).await;
}

#[actix::test]
async fn logins_hold_on_every_worker_on_mysql() {
    logins_hold_on_every_worker(Backend::Mysql).await;
}

#[actix::test]
async fn logins_hold_on_every_worker_on_sqlite() {
    logins_hold_on_every_worker(Backend::Sqlite).await;
}
