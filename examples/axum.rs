//! An axum service (plain `#[tokio::main]`, no actix anywhere in the application) that
//! enqueues jobs from its routes and returns them as JSON; a job's handler enqueues the
//! follow-up step through `ctx.client()`.
//!
//! ```sh
//! cargo run --example axum                      # SQLite file, http://127.0.0.1:3000
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example axum
//! curl -XPOST localhost:3000/reports -H 'content-type: application/json' -d '{"month":"2026-10"}'
//! curl localhost:3000/jobs/1
//! cargo run --example axum -- --check           # self-test over real HTTP (used by CI)
//! ```
//!
//! `Scheduler::start()` sees there is no actix system and starts jobvisor's actors on a
//! thread of their own; the `Client` it hands out works from axum's handlers as it is.
//! SIGTERM or Ctrl-C stops it gracefully: the server first, then the scheduler.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jobvisor::{
    handler_fn, Client, Job, JobContext, JobId, JobOutcome, JobState, NewJob, QueueConfig,
    Scheduler, SchedulerHandle, Store, StoreOptions,
};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Deserialize)]
struct ReportRequest {
    month: String,
}

/// A jobvisor error as an HTTP answer: 404 for an unknown job, 400 for bad input, else 500.
struct ApiError(jobvisor::Error);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            jobvisor::Error::NotFound { .. } => StatusCode::NOT_FOUND,
            jobvisor::Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({ "error": self.0.to_string() }))).into_response()
    }
}

/// `POST /reports`: enqueue the report; answers 202 with the job's id.
async fn request_report(
    State(jobs): State<Client>,
    Json(req): Json<ReportRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let job = NewJob::new("build_report", json!({ "month": req.month }))
        .unique_key(format!("report:{}", req.month));
    let e = jobs.enqueue(job).await.map_err(ApiError)?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "job_id": e.id }))))
}

/// `GET /jobs/{id}`: the job itself as JSON (`Job` is `Serialize`; `JobId` is a path
/// parameter as it is).
async fn job_status(
    State(jobs): State<Client>,
    Path(id): Path<JobId>,
) -> Result<Json<Job>, ApiError> {
    jobs.get(id).await.map(Json).map_err(ApiError)
}

fn routes(jobs: Client) -> Router {
    Router::new()
        .route("/reports", post(request_report))
        .route("/jobs/{id}", get(job_status))
        .with_state(jobs)
}

async fn start_jobs(url: &str) -> jobvisor::Result<SchedulerHandle> {
    let store = Store::connect_with(url, StoreOptions::default().migrate(true)).await?;
    Scheduler::builder(store)
        .queue(
            "default",
            QueueConfig::default().poll_interval(Duration::from_millis(100)),
        )
        .handler(
            "build_report",
            handler_fn(|p: serde_json::Value, ctx: JobContext| async move {
                let month = p["month"].as_str().unwrap_or("?").to_string();
                // ... build it ..., then hand the mailing to its own job. The unique key
                // makes a retried attempt find the follow-up instead of adding another.
                let mail = ctx
                    .client()?
                    .enqueue(
                        NewJob::new("email_report", json!({ "month": month }))
                            .unique_key(format!("email-after:{}", ctx.id)),
                    )
                    .await?;
                JobOutcome::success(json!({ "month": month, "email_job": mail.id }))
            }),
        )
        .handler(
            "email_report",
            handler_fn(|p: serde_json::Value, _ctx| async move {
                JobOutcome::success(format!("report for {} mailed", p["month"]))
            }),
        )
        .start()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join(if check {
            "jobvisor-axum-check.sqlite"
        } else {
            "jobvisor-axum.sqlite"
        });
        if check {
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
            }
        }
        format!("sqlite://{}", path.display())
    });
    let scheduler = start_jobs(&url).await?;
    let app = routes(scheduler.client());
    let port = if check { 0 } else { 3000 };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    if check {
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let res = self_check(addr, &scheduler.client()).await;
        server.abort();
        scheduler.shutdown().await;
        res?;
        println!("axum example: self-check passed");
        return Ok(());
    }
    println!("listening on http://{addr} (jobs in {url})");
    // On SIGTERM or Ctrl-C: axum stops accepting and finishes its requests, then the
    // scheduler stops claiming and waits for its running jobs (`shutdown_timeout`, 30 s),
    // giving back the leases of those still running.
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    let report = scheduler.shutdown().await;
    println!(
        "stopped: {} jobs finished, {} given back",
        report.finished, report.released
    );
    Ok(())
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM — what `docker stop`, Kubernetes and systemd send
/// before they kill the process.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

/// One HTTP/1.1 request over a fresh connection; answers the status and the body (JSON, or
/// the text as a JSON string when it is not JSON, as axum's own rejections are).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error>> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).await?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    let text = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b.trim());
    let json = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
    Ok((status, json))
}

/// Drives the service over real HTTP: a report request runs, its follow-up runs, both are
/// readable as JSON; unknown and malformed ids answer 404 and 400.
async fn self_check(addr: SocketAddr, jobs: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let (status, body) = http(addr, "POST", "/reports", Some(json!({"month": "2026-10"}))).await?;
    if status != 202 {
        return Err(format!("POST /reports answered {status}: {body}").into());
    }
    let id: JobId = serde_json::from_value(body["job_id"].clone())?;
    let report = jobs.wait(id, Duration::from_secs(30)).await?;
    if report.state != JobState::Succeeded {
        return Err(format!("the report job ended {}", report.state).into());
    }
    let (status, body) = http(addr, "GET", &format!("/jobs/{id}"), None).await?;
    let served: Job = serde_json::from_value(body.clone())?;
    if status != 200 || served.id != id || served.state != JobState::Succeeded {
        return Err(format!("GET /jobs/{id} answered {status}: {body}").into());
    }
    let mail: JobId =
        serde_json::from_value(served.result.unwrap_or_default()["email_job"].clone())?;
    let mail = jobs.wait(mail, Duration::from_secs(30)).await?;
    if mail.state != JobState::Succeeded {
        return Err(format!("the follow-up job ended {}", mail.state).into());
    }
    let (status, _) = http(addr, "GET", "/jobs/999999", None).await?;
    if status != 404 {
        return Err(format!("an unknown job answered {status}, expected 404").into());
    }
    let (status, _) = http(addr, "GET", "/jobs/not-a-number", None).await?;
    if status != 400 {
        return Err(format!("a malformed id answered {status}, expected 400").into());
    }
    Ok(())
}
