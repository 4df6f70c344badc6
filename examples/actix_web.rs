//! An actix-web service that writes a business row and enqueues its job in the same
//! transaction (the transactional outbox), and serves job status.
//!
//! ```sh
//! cargo run --example actix_web                      # SQLite file, http://127.0.0.1:8080
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example actix_web
//! curl -XPOST localhost:8080/signup -H 'content-type: application/json' -d '{"email":"ada@example.com"}'
//! curl localhost:8080/jobs/1
//! open http://127.0.0.1:8080/ops/                    # the dashboard (DASHBOARD_TOKEN to log in)
//! cargo run --example actix_web -- --check           # in-process self-test (used by CI)
//! ```
//!
//! A signup with a bad address fails *after* the user row and the job were written, inside
//! the transaction: both roll back, so no welcome mail is ever sent for a user that does not
//! exist. The scheduler runs in the same actix system as the web server.
//!
//! And a signup whose welcome job went missing anyway — a user row written by another path
//! that forgot the job, a job deleted by hand — gets it back: a **reconciler** lists the users
//! not yet welcomed, and the database's leader enqueues the jobs missing (each keyed by its
//! user, so one that exists is left alone). The handler marks the user welcomed, so a user
//! is never welcomed twice however long the job history is kept.

use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use jobvisor::web::{Dashboard, DashboardConfig};
use jobvisor::{
    handler_fn, Client, JobError, JobId, JobOutcome, NewJob, QueueConfig, Scheduler, Store,
    StoreOptions,
};
use serde::Deserialize;
use serde_json::json;

/// The service's own table: its business rows.
mod schema {
    #![allow(missing_docs)]
    diesel::table! {
        signups (id) {
            id -> BigInt,
            email -> Text,
            welcomed -> Bool,
        }
    }
}
use schema::signups as users;

type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

/// The application's own database pool (the same database the jobs live in).
#[derive(Clone)]
enum AppDb {
    Pg(Pool<AsyncPgConnection>),
    Sqlite(Pool<SqliteConn>),
}

#[derive(Clone)]
struct AppState {
    db: AppDb,
    jobs: Client,
}

#[derive(Deserialize)]
struct Signup {
    email: String,
}

/// Why a signup failed: a bad request, or something the service should log.
#[derive(Debug)]
enum SignupError {
    BadEmail(String),
    Internal(String),
}

impl From<diesel::result::Error> for SignupError {
    fn from(e: diesel::result::Error) -> Self {
        SignupError::Internal(e.to_string())
    }
}

impl From<jobvisor::Error> for SignupError {
    fn from(e: jobvisor::Error) -> Self {
        SignupError::Internal(e.to_string())
    }
}

/// Insert the user and enqueue the welcome mail on `conn`, inside one transaction.
macro_rules! signup_tx {
    ($conn:expr, $jobs:expr, $email:expr) => {{
        let jobs: &Client = $jobs;
        let email: String = $email;
        // Deref the pooled connection to the driver's own type, which the outbox accepts.
        (*$conn)
            .transaction(async |conn| {
                let user_id: i64 = diesel::insert_into(users::table)
                    .values(users::email.eq(&email))
                    .returning(users::id)
                    .get_result(conn)
                    .await?;
                let job = welcome_job(user_id, &email);
                let enqueued = jobs.enqueue_in(conn, vec![job]).await?;
                // Validation that happens after the writes: failing here rolls back both.
                if !email.contains('@') {
                    return Err(SignupError::BadEmail(email.clone()));
                }
                Ok::<_, SignupError>((user_id, enqueued[0].id))
            })
            .await
    }};
}

/// Runs `$body` on a connection of the application's pool, whichever database it is.
macro_rules! on_app_db {
    ($db:expr, |$conn:ident| $body:expr) => {
        match $db {
            AppDb::Pg(p) => {
                let mut $conn = p.get().await.map_err(|e| e.to_string())?;
                $body
            }
            AppDb::Sqlite(p) => {
                let mut $conn = p.get().await.map_err(|e| e.to_string())?;
                $body
            }
        }
    };
}

/// The welcome mail went out: the business row says so.
async fn mark_welcomed(db: &AppDb, user_id: i64) -> Result<(), String> {
    on_app_db!(db, |c| diesel::update(users::table.find(user_id))
        .set(users::welcomed.eq(true))
        .execute(&mut *c)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string()))
}

/// The welcome jobs that should exist: one per user not yet welcomed.
async fn welcome_jobs_expected(db: &AppDb) -> Result<Vec<NewJob>, String> {
    let rows: Vec<(i64, String)> = on_app_db!(db, |c| users::table
        .filter(users::welcomed.eq(false))
        .select((users::id, users::email))
        .load(&mut *c)
        .await
        .map_err(|e| e.to_string()))?;
    Ok(rows
        .into_iter()
        .map(|(user_id, email)| welcome_job(user_id, &email))
        .collect())
}

/// The welcome mail of a user, keyed by the user: one per user, however often enqueued.
fn welcome_job(user_id: i64, email: &str) -> NewJob {
    NewJob::new(
        "send_welcome_email",
        json!({"user_id": user_id, "email": email}),
    )
    .unique_key(format!("welcome:{user_id}"))
}

async fn signup(state: web::Data<AppState>, body: web::Json<Signup>) -> HttpResponse {
    let email = body.into_inner().email;
    let res = match &state.db {
        AppDb::Pg(p) => match p.get().await {
            Ok(mut c) => signup_tx!(c, &state.jobs, email),
            Err(e) => Err(SignupError::Internal(e.to_string())),
        },
        AppDb::Sqlite(p) => match p.get().await {
            Ok(mut c) => signup_tx!(c, &state.jobs, email),
            Err(e) => Err(SignupError::Internal(e.to_string())),
        },
    };
    match res {
        Ok((user_id, job_id)) => {
            HttpResponse::Created().json(json!({"user_id": user_id, "job_id": job_id}))
        }
        Err(SignupError::BadEmail(e)) => HttpResponse::BadRequest()
            .json(json!({"error": format!("{e:?} is not an email address; expected name@domain")})),
        Err(SignupError::Internal(e)) => {
            HttpResponse::InternalServerError().json(json!({"error": e}))
        }
    }
}

async fn job_status(state: web::Data<AppState>, id: web::Path<i64>) -> HttpResponse {
    match state.jobs.get(JobId(id.into_inner())).await {
        Ok(job) => HttpResponse::Ok().json(json!({
            "id": job.id,
            "kind": job.kind,
            "state": job.state,
            "attempts": job.attempts,
            "result": job.result,
            "last_error": job.last_error,
        })),
        Err(jobvisor::Error::NotFound { id }) => {
            HttpResponse::NotFound().json(json!({"error": format!("job {id} not found")}))
        }
        Err(e) => HttpResponse::InternalServerError().json(json!({"error": e.to_string()})),
    }
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/signup", web::post().to(signup))
        .route("/jobs/{id}", web::get().to(job_status));
}

/// How often the leader looks for signups whose welcome job is missing.
const RECONCILE_EVERY: Duration = Duration::from_secs(30);

async fn setup(
    url: &str,
    reconcile_every: Duration,
) -> Result<(AppState, jobvisor::SchedulerHandle), Box<dyn std::error::Error>> {
    let store = Store::connect_with(url, StoreOptions::default().migrate(true)).await?;
    let db = if url.starts_with("postgres") {
        let pool = Pool::builder()
            .build(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url))
            .await?;
        pool.get()
            .await?
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS signups (id BIGSERIAL PRIMARY KEY, email TEXT NOT NULL, \
                 welcomed BOOLEAN NOT NULL DEFAULT false)",
            )
            .await?;
        AppDb::Pg(pool)
    } else {
        let path = url.trim_start_matches("sqlite://").to_string();
        let pool = Pool::builder()
            .max_size(4)
            .build(AsyncDieselConnectionManager::<SqliteConn>::new(path))
            .await?;
        pool.get()
            .await?
            .batch_execute(
                "PRAGMA busy_timeout = 5000; \
                 CREATE TABLE IF NOT EXISTS signups (id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 email TEXT NOT NULL, welcomed BOOLEAN NOT NULL DEFAULT 0)",
            )
            .await?;
        AppDb::Sqlite(pool)
    };
    let (for_handler, for_reconciler) = (db.clone(), db.clone());
    let scheduler = Scheduler::builder(store)
        .queue("default", QueueConfig::default())
        .handler(
            "send_welcome_email",
            handler_fn(move |p: serde_json::Value, _ctx| {
                let db = for_handler.clone();
                async move {
                    let user_id = p["user_id"]
                        .as_i64()
                        .ok_or_else(|| JobError::fail("no user_id in the payload"))?;
                    // (The mail itself would be sent here.)
                    mark_welcomed(&db, user_id).await.map_err(JobError::retry)?;
                    JobOutcome::success(format!("welcome mail sent to {}", p["email"]))
                }
            }),
        )
        .reconciler("welcome-mails", reconcile_every, move |_client| {
            let db = for_reconciler.clone();
            async move { welcome_jobs_expected(&db).await }
        })
        .start()?;
    Ok((
        AppState {
            db,
            jobs: scheduler.client(),
        },
        scheduler,
    ))
}

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join(if check {
            "jobvisor-web-check.sqlite"
        } else {
            "jobvisor-web.sqlite"
        });
        if check {
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
            }
        }
        format!("sqlite://{}", path.display())
    });
    // The self-check reconciles every second, so it sees a missing job come back quickly.
    let every = if check {
        Duration::from_secs(1)
    } else {
        RECONCILE_EVERY
    };
    let (state, scheduler) = setup(&url, every).await?;
    if check {
        self_check(state).await?;
        scheduler.shutdown().await;
        println!("actix_web example: self-check passed");
        return Ok(());
    }
    println!("listening on http://127.0.0.1:8080 (jobs in {url})");
    // The operator dashboard under /ops: built once, here, so that every worker of the
    // server (actix-web's default, one per core) shares its logins. With DASHBOARD_TOKEN set
    // it asks for that token; without, it answers only this machine (loopback, no login).
    let config = match std::env::var("DASHBOARD_TOKEN") {
        Ok(token) => DashboardConfig::with_token(token)?,
        Err(_) => DashboardConfig::without_auth(),
    };
    let dashboard = Dashboard::new("/ops", state.jobs.clone(), config);
    let data = web::Data::new(state);
    // actix-web's server handles the signals itself: SIGTERM (what `docker stop`, Kubernetes
    // and systemd send) stops it gracefully, finishing the requests in progress; Ctrl-C
    // (SIGINT) and SIGQUIT stop it at once. Either way `run()` returns, and then the scheduler
    // stops claiming and waits for its running jobs (`shutdown_timeout`, 30 s), giving back
    // the leases of those still running.
    HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .configure(routes)
            .service(dashboard.service())
    })
    .bind(("127.0.0.1", 8080))?
    .run()
    .await?;
    let report = scheduler.shutdown().await;
    println!(
        "stopped: {} jobs finished, {} given back",
        report.finished, report.released
    );
    Ok(())
}

/// Drives the service in-process: a good signup creates a user and a job that runs; a bad
/// one leaves neither; a user written without its job is welcomed anyway (the reconciler).
async fn self_check(state: AppState) -> Result<(), Box<dyn std::error::Error>> {
    use actix_web::test;
    let jobs = state.jobs.clone();
    let db = state.db.clone();
    let app =
        test::init_service(App::new().app_data(web::Data::new(state)).configure(routes)).await;

    let req = test::TestRequest::post()
        .uri("/signup")
        .set_json(json!({"email": "ada@example.com"}))
        .to_request();
    let resp = test::call_service(&app, req).await;
    if resp.status() != 201 {
        return Err(format!("signup answered {}", resp.status()).into());
    }
    let body: serde_json::Value = test::read_body_json(resp).await;
    let job_id = body["job_id"].as_i64().ok_or("no job id")?;
    let job = jobs.wait(JobId(job_id), Duration::from_secs(30)).await?;
    if job.state != jobvisor::JobState::Succeeded {
        return Err(format!("welcome job ended {}", job.state).into());
    }
    let req = test::TestRequest::get()
        .uri(&format!("/jobs/{job_id}"))
        .to_request();
    let status: serde_json::Value = test::call_and_read_body_json(&app, req).await;
    if status["state"] != "succeeded" {
        return Err(format!("status endpoint said {status}").into());
    }

    let before = jobs.list(jobvisor::ListParams::default()).await?.len();
    let req = test::TestRequest::post()
        .uri("/signup")
        .set_json(json!({"email": "not-an-address"}))
        .to_request();
    let resp = test::call_service(&app, req).await;
    if resp.status() != 400 {
        return Err(format!("bad signup answered {}", resp.status()).into());
    }
    let after = jobs.list(jobvisor::ListParams::default()).await?.len();
    if after != before {
        return Err("the rolled-back signup left a job behind".into());
    }
    let req = test::TestRequest::get().uri("/jobs/999999").to_request();
    if test::call_service(&app, req).await.status() != 404 {
        return Err("unknown job was not a 404".into());
    }

    // A user row written with no job (another code path forgot it): the reconciler notices
    // at its next pass and the user is welcomed.
    let user_id: i64 = on_app_db!(&db, |c| diesel::insert_into(users::table)
        .values(users::email.eq("grace@example.com"))
        .returning(users::id)
        .get_result(&mut *c)
        .await
        .map_err(|e| e.to_string()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if welcome_jobs_expected(&db).await?.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("user {user_id} without a job was never welcomed").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
