//! The operator dashboard (feature `web`): an actix-web service to mount in an application
//! under any path prefix, or to serve standalone with `jobvisor dashboard --listen ADDR`.
//!
//! ```no_run
//! # async fn demo(client: jobvisor::Client) -> std::io::Result<()> {
//! use actix_web::{App, HttpServer};
//! use jobvisor::web::{Dashboard, DashboardConfig};
//!
//! let config = DashboardConfig::with_token(std::env::var("DASHBOARD_TOKEN").unwrap_or_default())
//!     .expect("a token of at least 16 characters");
//! // Built once, outside the factory: every worker of the server shares its logins.
//! let dashboard = Dashboard::new("/jobs", client, config);
//! HttpServer::new(move || App::new().service(dashboard.service()))
//!     .bind("127.0.0.1:8080")?
//!     .run()
//!     .await
//! # }
//! ```
//!
//! The server above runs actix-web's default number of workers (one per core), each
//! answering any connection: the [`Dashboard`] holds the logins for all of them, so it is
//! built once, before `HttpServer::new`, and cloned into the factory (a clone shares them).
//! Building it inside the factory would give each worker logins of its own; it panics there.
//!
//! Pages are rendered on the server (maud: every value escaped); the stylesheet and one small
//! script (live pages re-read when the server's event stream says so, polling only while it
//! is down; keeping typed input; showing a lost session) are compiled
//! into the binary and served under
//! `<prefix>/assets/`. Every read and every action goes through the same [`Client`] and store
//! operations as the rest of jobvisor: a retry is guarded by the version the page showed, so
//! a stale page cannot bring back a job that moved on.
//!
//! Security by default: a login (a token from the configuration) or the embedding
//! application's own authorizer is required; authentication can be turned off only for
//! requests from a loopback address for a loopback `Host` name. Failed logins are slowed per
//! client address and in all, and logged. Cookies are `HttpOnly`, `SameSite=Strict`, and `Secure`
//! over HTTPS; every action is a POST carrying a CSRF token; the Content-Security-Policy
//! allows no inline script or style; a read-only mode (or a read-only login) shows no
//! actions and refuses them. Database URLs and lease tokens are never rendered.
//!
//! Files: `auth` (logins, sessions, CSRF, the access check), `throttle` (slowing token
//! guesses), `live` (the event stream and its one shared reader), `layout` (the page shell, error pages and formatting), `chart` (the inline SVG
//! chart), `actions` (every POST), `pages/` (one file per view), `assets/` (CSS and JS).

mod actions;
mod auth;
mod chart;
mod layout;
mod live;
mod pages;
mod throttle;

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::error::{Error, Result};
use crate::Client;

use auth::Sessions;
pub use auth::{Access, Identity};

/// Shortest login token accepted: **16** characters.
pub const MIN_TOKEN_LEN: usize = 16;

/// Live jobs above which the overview shows the database gauges' counts (an estimate, as of
/// their last turn) instead of counting the table on every page: **100,000** by default.
pub const DEFAULT_EXACT_COUNT_LIMIT: u64 = 100_000;

/// Jobs looked at, at most, by one payload text search: **10,000** by default (newest first,
/// so the search covers the most recent jobs).
pub const DEFAULT_SEARCH_WINDOW: u32 = 10_000;

/// How often the dashboard takes the database gauges' turn itself when no node has (the
/// scheduler's default interval): **15 s**.
pub const GAUGES_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// Jobs counted, at most, for a bulk action's preview: **1,000** (past that the preview says
/// "at least", and the action applies to the first 1,000; run it again for the rest), so
/// that a preview stays well under a second on a table of millions.
pub const BULK_LIMIT: usize = 1_000;

/// Decides who may use the dashboard, from the request (the embedding application's own
/// session or header): `Some(access)` lets the request in with that access, `None` falls
/// back to the dashboard's login (or refuses, without a token configured).
pub type Authorizer = Arc<dyn Fn(&HttpRequest) -> Option<Access> + Send + Sync>;

/// How the dashboard authenticates and what it allows. Build it with
/// [`with_token`](DashboardConfig::with_token), [`with_authorizer`](DashboardConfig::with_authorizer)
/// or [`without_auth`](DashboardConfig::without_auth).
///
/// Defaults: full access for a logged-in user (unless [`read_only`](DashboardConfig::read_only)),
/// the `Secure` cookie flag set when the request came over HTTPS,
/// [`DEFAULT_EXACT_COUNT_LIMIT`], [`DEFAULT_SEARCH_WINDOW`].
#[derive(Clone)]
pub struct DashboardConfig {
    pub(crate) token: Option<auth::Secret>,
    pub(crate) read_only_token: Option<auth::Secret>,
    pub(crate) authorizer: Option<Authorizer>,
    pub(crate) no_auth: bool,
    pub(crate) read_only: bool,
    pub(crate) secure_cookies: Option<bool>,
    pub(crate) exact_count_limit: u64,
    pub(crate) search_window: u32,
    pub(crate) scan_window: i64,
    pub(crate) sort_window: i64,
    pub(crate) dead_exact_limit: i64,
}

impl std::fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "read_only_token",
                &self.read_only_token.as_ref().map(|_| "<redacted>"),
            )
            .field("authorizer", &self.authorizer.is_some())
            .field("no_auth", &self.no_auth)
            .field("read_only", &self.read_only)
            .field("secure_cookies", &self.secure_cookies)
            .field("exact_count_limit", &self.exact_count_limit)
            .field("search_window", &self.search_window)
            .field("scan_window", &self.scan_window)
            .field("sort_window", &self.sort_window)
            .field("dead_exact_limit", &self.dead_exact_limit)
            .finish()
    }
}

fn check_token(field: &'static str, token: &str) -> Result<auth::Secret> {
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "a token of at least {MIN_TOKEN_LEN} characters is expected (got {})",
                token.chars().count()
            ),
        ));
    }
    Ok(auth::Secret::new(token))
}

impl DashboardConfig {
    fn base() -> Self {
        DashboardConfig {
            token: None,
            read_only_token: None,
            authorizer: None,
            no_auth: false,
            read_only: false,
            secure_cookies: None,
            exact_count_limit: DEFAULT_EXACT_COUNT_LIMIT,
            search_window: DEFAULT_SEARCH_WINDOW,
            scan_window: pages::jobs::SCAN_WINDOW,
            sort_window: pages::jobs::SORT_WINDOW,
            dead_exact_limit: pages::dead::DEAD_EXACT,
        }
    }

    /// Logins with `token` (typed into the login page, or sent as `Authorization: Bearer`)
    /// get full access.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `token` when it is shorter than [`MIN_TOKEN_LEN`].
    pub fn with_token(token: impl AsRef<str>) -> Result<Self> {
        Ok(DashboardConfig {
            token: Some(check_token("token", token.as_ref())?),
            ..Self::base()
        })
    }

    /// The embedding application decides: `authorizer` sees each request and answers the
    /// access it has, or `None` (then the dashboard's own login, if a token is also set with
    /// [`token`](DashboardConfig::token), else a refusal).
    pub fn with_authorizer(
        authorizer: impl Fn(&HttpRequest) -> Option<Access> + Send + Sync + 'static,
    ) -> Self {
        DashboardConfig {
            authorizer: Some(Arc::new(authorizer)),
            ..Self::base()
        }
    }

    /// No authentication — answered only to requests from a loopback address (127.0.0.0/8,
    /// `::1`) whose `Host` is `localhost`, `127.0.0.1` or `[::1]` (any port) and that no
    /// proxy forwarded; any other request is refused. The CLI refuses to listen on another address
    /// in this mode.
    pub fn without_auth() -> Self {
        DashboardConfig {
            no_auth: true,
            ..Self::base()
        }
    }

    /// Adds a full-access login token (with an authorizer).
    ///
    /// # Errors
    /// As [`with_token`](DashboardConfig::with_token).
    pub fn token(mut self, token: impl AsRef<str>) -> Result<Self> {
        self.token = Some(check_token("token", token.as_ref())?);
        Ok(self)
    }

    /// A second login token whose sessions are read-only.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `read_only_token` when shorter than [`MIN_TOKEN_LEN`].
    pub fn read_only_token(mut self, token: impl AsRef<str>) -> Result<Self> {
        self.read_only_token = Some(check_token("read_only_token", token.as_ref())?);
        Ok(self)
    }

    /// Read-only for everyone: pages show no actions and every action is refused (default
    /// `false`).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Forces the cookies' `Secure` flag on or off (default: on when the request came over
    /// HTTPS, as actix-web's connection info says — behind a proxy, configure it to pass
    /// `X-Forwarded-Proto`, or force it here).
    pub fn secure_cookies(mut self, secure: bool) -> Self {
        self.secure_cookies = Some(secure);
        self
    }

    /// Live jobs above which the overview shows estimates (default
    /// [`DEFAULT_EXACT_COUNT_LIMIT`]).
    pub fn exact_count_limit(mut self, limit: u64) -> Self {
        self.exact_count_limit = limit;
        self
    }

    /// Jobs a payload text search looks at, at most (default [`DEFAULT_SEARCH_WINDOW`]).
    pub fn search_window(mut self, jobs: u32) -> Self {
        self.search_window = jobs.max(1);
        self
    }

    /// Jobs (by id) a filtered jobs list looks at, at most, per page, when no index serves
    /// the filter (default **100,000**); the page says when it stopped there and links past.
    pub fn scan_window(mut self, jobs: u32) -> Self {
        self.scan_window = i64::from(jobs.max(1));
        self
    }

    /// Newest jobs a run-time order sorts when no index gives that order (default
    /// **10,000**), labelled so in the page; also how many of the newest dead jobs the dead
    /// letters group past [`dead_exact_limit`](DashboardConfig::dead_exact_limit).
    pub fn sort_window(mut self, jobs: u32) -> Self {
        self.sort_window = i64::from(jobs.max(1));
        self
    }

    /// Dead jobs the dead letters group exactly, at most (default **10,000**); past it
    /// they group the newest [`sort_window`](DashboardConfig::sort_window) and say so.
    pub fn dead_exact_limit(mut self, jobs: u32) -> Self {
        self.dead_exact_limit = i64::from(jobs);
        self
    }

    /// Whether this configuration may serve on `addr`: always with authentication; without
    /// it ([`without_auth`](DashboardConfig::without_auth)) only on a loopback address.
    ///
    /// # Errors
    /// [`Error::Config`] naming `listen` and saying why.
    pub fn check_listen(&self, addr: std::net::SocketAddr) -> Result<()> {
        if self.no_auth && !addr.ip().is_loopback() {
            return Err(Error::Config {
                field: "listen",
                reason: format!(
                    "authentication is off, so the dashboard listens only on a loopback \
                     address (127.0.0.1 or ::1), not {addr}; set a token to listen there"
                ),
            });
        }
        Ok(())
    }
}

/// What every handler shares.
pub(crate) struct State {
    pub(crate) client: Client,
    pub(crate) config: DashboardConfig,
    /// The mount prefix, without a trailing slash ("" at the root).
    pub(crate) prefix: String,
    pub(crate) sessions: Sessions,
    /// Failed logins and bearer tokens, per client address and in all.
    pub(crate) throttle: throttle::Throttle,
    /// Takes the database gauges' turn when their snapshot is stale (at most one refresh
    /// at a time, in the background): the overview's estimates on big tables.
    pub(crate) gauges: Arc<tokio::sync::Mutex<Option<crate::metrics::DatabaseGauges>>>,
    /// The live stream's one reader of the database, shared by every open page.
    pub(crate) live: Arc<live::Hub>,
}

impl State {
    /// The path of `rest` (starting with `/`) under the prefix.
    pub(crate) fn url(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }
}

pub(crate) type Data = web::Data<State>;

/// The dashboard: its configuration and the logins of every worker of the server that
/// mounts it. Build it **once**, before `HttpServer::new`, and mount a clone in each
/// worker's app with [`service`](Dashboard::service); clones share the logins, so a login
/// on one worker holds on every other and a logout revokes it everywhere.
///
/// ```no_run
/// # async fn demo(client: jobvisor::Client) -> std::io::Result<()> {
/// use jobvisor::web::{Dashboard, DashboardConfig};
/// let dashboard = Dashboard::new("/jobs", client, DashboardConfig::without_auth());
/// actix_web::HttpServer::new(move || actix_web::App::new().service(dashboard.service()))
///     .bind("127.0.0.1:8080")?
///     .run()
///     .await
/// # }
/// ```
#[derive(Clone)]
pub struct Dashboard {
    state: Data,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("prefix", &self.state.prefix)
            .field("config", &self.state.config)
            .finish_non_exhaustive()
    }
}

/// The name actix-server gives its worker threads, where a [`Dashboard`] must not be built.
const WORKER_THREAD: &str = "actix-server worker";

impl Dashboard {
    /// The dashboard with its pages under `prefix` (`"/jobs"`, or `""` for the root).
    ///
    /// # Panics
    /// On an actix-server worker thread (inside `HttpServer::new`'s factory): each worker
    /// would have logins of its own, and a login would hold on one worker only.
    pub fn new(prefix: &str, client: Client, config: DashboardConfig) -> Dashboard {
        if let Some(name) = std::thread::current().name() {
            assert!(
                !name.starts_with(WORKER_THREAD),
                "jobvisor::web::Dashboard::new called on {name:?}, inside HttpServer::new's \
                 factory: each worker would keep logins of its own. Build the Dashboard once \
                 before HttpServer::new and clone it into the factory"
            );
        }
        let prefix = prefix.trim_end_matches('/').to_string();
        let state = web::Data::new(State {
            client: client.clone(),
            config,
            prefix,
            sessions: Sessions::default(),
            throttle: throttle::Throttle::default(),
            live: Arc::default(),
            gauges: Arc::new(tokio::sync::Mutex::new(
                crate::metrics::DatabaseGauges::new(
                    client.store().clone(),
                    format!("jobvisor-dashboard-{}", std::process::id()),
                    GAUGES_EVERY,
                )
                .ok(),
            )),
        });
        Dashboard { state }
    }

    /// The dashboard as an actix-web service for one worker's app:
    /// `App::new().service(dashboard.service())`. Every service of one `Dashboard` (and of
    /// its clones) shares the same logins.
    pub fn service(&self) -> actix_web::Scope {
        let state = self.state.clone();
        let prefix = state.prefix.clone();
        routes(web::scope(&prefix).app_data(state))
    }
}

/// Every route of the dashboard, on `scope`.
fn routes(scope: actix_web::Scope) -> actix_web::Scope {
    scope
        .app_data(
            web::FormConfig::default()
                .limit(64 * 1024)
                .error_handler(|e, req| {
                    actix_web::error::InternalError::from_response(
                        "",
                        layout::plain_error(
                            req,
                            StatusCode::BAD_REQUEST,
                            &format!("bad form: {e}"),
                        ),
                    )
                    .into()
                }),
        )
        .app_data(web::QueryConfig::default().error_handler(|e, req| {
            actix_web::error::InternalError::from_response(
                "",
                layout::plain_error(req, StatusCode::BAD_REQUEST, &format!("bad filter: {e}")),
            )
            .into()
        }))
        .route("/assets/dashboard.css", web::get().to(layout::css))
        .route("/assets/dashboard.js", web::get().to(layout::js))
        .route("/login", web::get().to(auth::login_page))
        .route("/login", web::post().to(auth::login))
        .route("/logout", web::post().to(auth::logout))
        .route("", web::get().to(pages::overview::page))
        .route("/", web::get().to(pages::overview::page))
        .route("/jobs", web::get().to(pages::jobs::page))
        .route("/jobs/bulk", web::get().to(actions::bulk_preview))
        .route("/jobs/bulk", web::post().to(actions::bulk))
        .route("/jobs/{id}", web::get().to(pages::job::page))
        .route("/jobs/{id}/{action}", web::post().to(actions::job))
        .route("/dead", web::get().to(pages::dead::page))
        .route("/dead/retry", web::post().to(actions::dead_retry))
        .route("/queues", web::get().to(pages::queues::page))
        .route("/queues/{action}", web::post().to(actions::queue))
        .route("/schedules", web::get().to(pages::schedules::page))
        .route("/schedules/{action}", web::post().to(actions::schedule))
        .route("/nodes", web::get().to(pages::nodes::page))
        .route("/audit", web::get().to(pages::audit::page))
        .route("/history", web::get().to(pages::history::page))
        .route("/batches/{id}", web::get().to(pages::batch::page))
        .route("/events", web::get().to(live::events))
        .default_service(web::to(not_found))
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    layout::plain_error(&req, StatusCode::NOT_FOUND, "no such page")
}

/// An error as a page: a clear message, never a stack trace, never a database URL.
pub(crate) fn error_response(req: &HttpRequest, e: &Error) -> HttpResponse {
    let (status, message) = match e {
        Error::NotFound { .. } => (StatusCode::NOT_FOUND, e.to_string()),
        Error::InvalidInput { .. } | Error::Config { .. } | Error::Refused { .. } => {
            (StatusCode::BAD_REQUEST, e.to_string())
        }
        Error::InvalidTransition { .. } => (StatusCode::CONFLICT, e.to_string()),
        _ => {
            tracing::warn!(error = %e, "dashboard: a request failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database did not answer as expected; the server's log has the details"
                    .to_string(),
            )
        }
    };
    layout::plain_error(req, status, &message)
}
