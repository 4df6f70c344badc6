//! `jobvisor`: the operator's command line.
//!
//! ```text
//! jobvisor migrate <database-url>    apply pending migrations (safe to run concurrently)
//! jobvisor counts  <database-url>    live jobs by queue and state
//! jobvisor get     <database-url> <job-id>
//! ```

use std::process::ExitCode;

use jobvisor::{JobId, Store, StoreOptions};

const USAGE: &str = "usage:
  jobvisor migrate <database-url>          apply pending migrations
  jobvisor counts  <database-url>          live jobs by queue and state
  jobvisor get     <database-url> <job-id> one job (live or archived)

database URLs: postgres://user@host/db, mysql://user@host/db, sqlite://path";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("jobvisor: {msg}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let (cmd, url) = match args {
        [cmd, url, ..] => (cmd.as_str(), url.as_str()),
        _ => return Err(format!("missing arguments\n{USAGE}")),
    };
    match cmd {
        "migrate" => {
            let store = Store::connect_with(url, StoreOptions::default().migrate(true))
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "schema is at version {} ({:?})",
                store.schema_version_expected(),
                store.backend()
            );
        }
        "counts" => {
            let store = Store::connect(url).await.map_err(|e| e.to_string())?;
            let counts = store.job_counts().await.map_err(|e| e.to_string())?;
            println!("{:<24} {:<10} {:>10}", "queue", "state", "jobs");
            for c in counts {
                println!("{:<24} {:<10} {:>10}", c.queue, c.state, c.count);
            }
        }
        "get" => {
            let id = args
                .get(2)
                .ok_or_else(|| format!("get needs a job id\n{USAGE}"))?;
            let id: i64 = id
                .parse()
                .map_err(|_| format!("job id {id:?} is not a number"))?;
            let store = Store::connect(url).await.map_err(|e| e.to_string())?;
            match store.job_get(JobId(id)).await.map_err(|e| e.to_string())? {
                Some(job) => println!("{job:#?}"),
                None => return Err(format!("job {id} not found")),
            }
        }
        other => return Err(format!("unknown command {other:?}\n{USAGE}")),
    }
    Ok(())
}
