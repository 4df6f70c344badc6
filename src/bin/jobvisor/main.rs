//! `jobvisor`: the operator's command line (built with the `cli` feature). It goes through
//! the library's public API only — `Store` to connect and migrate, `Client` for everything
//! else — so it can do nothing to a job that an application could not.
//!
//! ```text
//! jobvisor --database-url postgres://app@db/app status
//! DATABASE_URL=sqlite://jobs.db jobvisor list --state dead --queue mail --json
//! jobvisor retry --state dead --kind send_email --dry-run
//! ```

mod args;
mod bulk;
mod dashboard;
mod exporter;
mod queues;
mod render;
mod schedules;
mod search;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use jobvisor::{Client, Error, JobId, ListParams, Store, StoreOptions};

use args::{Cli, Command, Filter};

/// Exit codes scripts can rely on (also in `--help`).
pub(crate) mod exit {
    /// The operation failed: database unreachable, a write refused.
    pub(crate) const FAILED: u8 = 1;
    /// Bad arguments (clap's own code).
    pub(crate) const USAGE: u8 = 2;
    /// A job named by id does not exist.
    pub(crate) const NOT_FOUND: u8 = 3;
    /// A bulk change was not confirmed.
    pub(crate) const NOT_CONFIRMED: u8 = 4;
}

/// Why a command stopped: what to print and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::NotFound { .. } => exit::NOT_FOUND,
            Error::InvalidInput { .. } | Error::Config { .. } => exit::USAGE,
            _ => exit::FAILED,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Dashboard { .. }) {
        // actix-web's server runs on actix's system (a runtime of its own).
        return match actix::System::new().block_on(dashboard::serve(cli)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(f) => {
                eprintln!("jobvisor: {}", f.message);
                ExitCode::from(f.code)
            }
        };
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jobvisor: cannot start: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("jobvisor: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Prints `json` or `text` as the user asked.
fn show(json_wanted: bool, json: serde_json::Value, text: impl FnOnce() -> String) {
    if json_wanted {
        println!("{json:#}");
    } else {
        print!("{}", text());
    }
}

pub(crate) fn url(cli: &Cli) -> Result<&str, Failure> {
    cli.database_url.as_deref().ok_or(Failure {
        code: exit::USAGE,
        message: "no database: pass --database-url or set DATABASE_URL \
                  (postgres://user@host/db, mysql://user@host/db or sqlite://path)"
            .to_string(),
    })
}

/// The list filters as the library's parameters.
pub(crate) fn list_params(f: &Filter, now: chrono::DateTime<chrono::Utc>) -> ListParams {
    let ago = |d: std::time::Duration| {
        now - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
    };
    ListParams {
        queue: f.queue.clone(),
        kind: f.kind.clone(),
        state: f.state,
        created_before: f.older_than.map(ago),
        created_after: f.newer_than.map(ago),
        unique_key: f.unique_key.clone(),
        ..ListParams::default()
    }
}

/// The store's options the command line chose (`--no-notifications`, `--no-advisory-locks`).
pub(crate) fn store_options(cli: &Cli) -> StoreOptions {
    StoreOptions::default()
        .notifications(!cli.no_notifications)
        .advisory_locks(!cli.no_advisory_locks)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = &cli.command {
        let mut cmd = Cli::command();
        clap_complete::generate(*shell, &mut cmd, "jobvisor", &mut std::io::stdout());
        return Ok(());
    }
    let url = url(&cli)?;
    let json = cli.json;
    if let Command::Migrate { status } = &cli.command {
        // Connecting checks the schema; a status must work on an unmigrated database.
        let store = Store::connect_with(url, store_options(&cli).migrate(!*status)).await;
        return match (store, *status) {
            (Ok(store), _) => {
                let applied = store.schema_version_applied().await?;
                let expected = store.schema_version_expected();
                let v = serde_json::json!({
                    "backend": format!("{:?}", store.backend()).to_lowercase(),
                    "applied": applied,
                    "expected": expected,
                    "up_to_date": applied.as_deref() >= Some(expected.as_str()),
                });
                show(json, v, || {
                    format!(
                        "schema at {} (expected {expected}): {}\n",
                        applied.as_deref().unwrap_or("nothing"),
                        if *status { "up to date" } else { "migrated" }
                    )
                });
                Ok(())
            }
            (
                Err(Error::SchemaOutOfDate {
                    expected, found, ..
                }),
                true,
            ) => {
                let v = serde_json::json!({
                    "applied": found,
                    "expected": expected,
                    "up_to_date": false,
                });
                show(json, v, || {
                    format!("schema {found}, expected {expected}: run `jobvisor migrate`\n")
                });
                Err(Failure {
                    code: exit::FAILED,
                    message: "the schema is out of date".to_string(),
                })
            }
            (Err(e), _) => Err(e.into()),
        };
    }
    // Only `migrate` creates an SQLite file: any other command on a path with no file is a
    // mistyped path, not a new database.
    if let Some(path) = url.strip_prefix("sqlite://") {
        if !std::path::Path::new(path).exists() {
            return Err(Failure {
                code: exit::FAILED,
                message: format!(
                    "no SQLite database at {path}; expected an existing file (create one with \
                     `jobvisor migrate --database-url {url}`)"
                ),
            });
        }
    }
    let store = Store::connect_with(url, store_options(&cli)).await?;
    if let Command::Metrics {
        listen,
        every,
        once,
    } = cli.command
    {
        return if once {
            exporter::once(store, every).await
        } else {
            exporter::serve(store, listen, every).await
        };
    }
    let client = Client::new(store);
    let now = chrono::Utc::now();
    match cli.command {
        Command::Status => {
            let counts = client.counts().await?;
            let lags = client.queue_lags().await?;
            let nodes = client.nodes().await?;
            let controls = client.queues().await?;
            let leader = client.leader().await?;
            // Due now, with no node that has beaten its heart within three heartbeats.
            let live = 3 * jobvisor::config::DEFAULT_NODE_HEARTBEAT_EVERY;
            let unserved = client.unserved(std::time::Duration::ZERO, live).await?;
            let status = render::Status {
                counts: &counts,
                lags: &lags,
                nodes: &nodes,
                controls: &controls,
                leader: leader.as_ref(),
                unserved: &unserved,
            };
            show(json, render::status_json(now, &status), || {
                render::status_text(now, &status)
            });
        }
        Command::Nodes { forget } => {
            if forget {
                let n = client.forget_gone_nodes().await?;
                eprintln!("jobvisor: forgot {n} gone node(s)");
            }
            let nodes = client.nodes().await?;
            show(json, render::nodes_json(now, &nodes), || {
                render::nodes_text(now, &nodes)
            });
        }
        Command::List {
            filter,
            limit,
            after,
            archived,
            newest_first,
        } => {
            let params = ListParams {
                after: after.map(JobId),
                archived,
                newest_first,
                ..list_params(&filter, now)
            };
            let found = search::find(
                &client,
                &params,
                filter.payload_contains.as_deref(),
                filter.scan as usize,
                limit as usize,
            )
            .await?;
            let jobs = &found.jobs;
            let next_after = match found.window_ended_at {
                Some(id) => Some(id.0),
                None if jobs.len() == limit as usize => jobs.last().map(|j| j.id.0),
                None => None,
            };
            let mut v = serde_json::json!({
                "jobs": jobs.iter().map(render::job_json).collect::<Vec<_>>(),
                "next_after": next_after,
            });
            if filter.payload_contains.is_some() {
                v["scanned"] = serde_json::json!(found.scanned);
                v["scan_window_ended"] = serde_json::json!(found.window_ended_at.is_some());
            }
            show(json, v, || {
                let mut out = render::jobs_table(jobs);
                if let Some(id) = found.window_ended_at {
                    out.push_str(&format!(
                        "searched {} jobs (--scan); more after id {}: --after {}\n",
                        found.scanned, id.0, id.0
                    ));
                }
                out
            });
        }
        Command::Get { id } => {
            let job = client.get(JobId(id)).await?;
            let deps = client.dependencies(JobId(id)).await?;
            let claims = client.claims(JobId(id)).await?;
            show(
                json,
                render::with_claims_json(render::job_with_links_json(&job, &deps), &claims),
                || {
                    render::job_text(&job)
                        + &render::links_text(&deps)
                        + &render::claims_text(&claims)
                },
            );
        }
        Command::Retry(b) => {
            if b.cascade {
                return Err(Failure {
                    code: exit::USAGE,
                    message: "--cascade applies to cancel only; expected `jobvisor cancel \
                              --cascade`"
                        .to_string(),
                });
            }
            bulk::run(&client, bulk::Change::Retry, b, json, now).await?
        }
        Command::Cancel(b) => {
            let change = if b.cascade {
                bulk::Change::CancelCascade
            } else {
                bulk::Change::Cancel
            };
            bulk::run(&client, change, b, json, now).await?
        }
        Command::Archive {
            older_than,
            dead_older_than,
        } => {
            let n = client.archive(older_than, dead_older_than).await?;
            show(json, serde_json::json!({ "archived": n }), || {
                format!("{n} jobs archived\n")
            });
        }
        Command::Prune { older_than } => {
            let n = client.prune(older_than).await?;
            show(json, serde_json::json!({ "pruned": n }), || {
                format!("{n} archived jobs deleted\n")
            });
        }
        Command::Queues => queues::list(&client, json).await?,
        Command::Schedules => schedules::list(&client, json).await?,
        Command::Schedule { action } => schedules::act(&client, action, json).await?,
        Command::Pause { queue, by } => queues::pause(&client, &queue, &by, json).await?,
        Command::Resume { queue } => queues::resume(&client, &queue, json).await?,
        Command::Limit {
            queue,
            concurrency,
            per_partition,
            rate,
        } => {
            let change = queues::LimitChange {
                concurrency: concurrency.map(|l| l.0),
                per_partition: per_partition.map(|l| l.0),
                rate: rate.map(|l| l.0),
            };
            queues::limit(&client, &queue, change, json).await?;
        }
        Command::Migrate { .. }
        | Command::Completions { .. }
        | Command::Metrics { .. }
        | Command::Dashboard { .. } => {}
    }
    Ok(())
}
