//! `jobvisor dashboard --listen ADDR`: the web dashboard (`jobvisor::web`) served standalone.
//! It logs in with the token in `JOBVISOR_DASHBOARD_TOKEN`; without one it refuses to start,
//! unless `--no-auth` is given with a loopback address.

use jobvisor::web::{Dashboard, DashboardConfig};
use jobvisor::{Client, Store};

use crate::args::{Cli, Command};
use crate::{exit, url, Failure};

/// The environment variable holding the login token.
pub(crate) const TOKEN_ENV: &str = "JOBVISOR_DASHBOARD_TOKEN";

fn usage(message: String) -> Failure {
    Failure {
        code: exit::USAGE,
        message,
    }
}

/// Serves until the process is stopped.
pub(crate) async fn serve(cli: Cli) -> Result<(), Failure> {
    let Command::Dashboard {
        listen,
        read_only,
        read_only_token,
        no_auth,
        secure_cookies,
    } = &cli.command
    else {
        return Ok(());
    };
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let mut config = match (token, *no_auth) {
        (Some(_), true) => {
            return Err(usage(format!(
                "--no-auth and {TOKEN_ENV} together: choose one"
            )))
        }
        (Some(t), false) => DashboardConfig::with_token(t)?,
        (None, true) => DashboardConfig::without_auth(),
        (None, false) => {
            return Err(usage(format!(
                "no login token: set {TOKEN_ENV} (at least {} characters), or pass --no-auth \
                 with a loopback --listen address",
                jobvisor::web::MIN_TOKEN_LEN
            )))
        }
    };
    if let Some(t) = read_only_token {
        config = config.read_only_token(t)?;
    }
    config = config.read_only(*read_only);
    if *secure_cookies {
        config = config.secure_cookies(true);
    }
    config.check_listen(*listen)?;
    let url = url(&cli)?;
    if let Some(path) = url.strip_prefix("sqlite://") {
        if !std::path::Path::new(path).exists() {
            return Err(Failure {
                code: exit::FAILED,
                message: format!("no SQLite database at {path}; expected an existing file"),
            });
        }
    }
    let client = Client::new(Store::connect_with(url, super::store_options(&cli)).await?);
    // One dashboard for both workers: a login made on one holds on the other.
    let dashboard = Dashboard::new("", client, config);
    let server =
        actix_web::HttpServer::new(move || actix_web::App::new().service(dashboard.service()))
            .workers(2)
            .bind(*listen)
            .map_err(|e| Failure {
                code: exit::FAILED,
                message: format!("cannot listen on {listen}: {e}"),
            })?;
    eprintln!("jobvisor: dashboard on http://{listen}/");
    server.run().await.map_err(|e| Failure {
        code: exit::FAILED,
        message: format!("the dashboard server stopped: {e}"),
    })
}
