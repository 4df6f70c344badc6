//! Who may use the dashboard, and proof that an action came from its own pages.
//!
//! * Authentication, in order: no authentication (loopback clients only), the embedding
//!   application's authorizer, a session cookie from the login page, an `Authorization:
//!   Bearer <token>` header (scripts). Tokens are compared in constant time.
//! * Sessions live in the memory of the one [`Dashboard`](super::Dashboard), shared by every
//!   worker of the server (a restart logs everyone out; a logout on any worker revokes the
//!   session on all): a random id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over
//!   HTTPS), 12 hours, at most 10,000 sessions (the oldest dropped first).
//! * CSRF: a logged-in session has a random token of its own, in a hidden field of every
//!   form (and a cookie); an action whose field is not its session's token is refused.
//!   Without a session (no authentication, an authorizer, the login form) the field must
//!   match a CSRF cookie. Requests authenticated by a bearer header carry no ambient
//!   credential and need none. Every POST from another site (`Sec-Fetch-Site`, `Origin`) is
//!   refused, in every mode.
//! * Without authentication only loopback clients asking for a loopback name (`localhost`,
//!   `127.0.0.1`, `[::1]`, any port) and not forwarded by a proxy are answered: a page on a
//!   name rebound to 127.0.0.1 sends its own `Host`.
//! * Failed logins and bearer tokens go through the throttle (`throttle.rs`) and are logged
//!   at WARN with the client's address, never the token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use maud::html;
use serde::Deserialize;

use super::layout;
use super::Data;

/// Session cookie name.
pub(crate) const SESSION_COOKIE: &str = "jobvisor_session";
/// CSRF cookie name (and the form field `csrf`).
pub(crate) const CSRF_COOKIE: &str = "jobvisor_csrf";
/// How long a login lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept; past it the oldest are dropped.
const MAX_SESSIONS: usize = 10_000;

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// See everything, change nothing: no action is shown, every action is refused.
    ReadOnly,
    /// See everything and act: retry, cancel, delete, bulk actions, queue and schedule
    /// changes.
    Full,
}

/// Who the embedding application's authorizer let in, as the audit log and a paused queue
/// record it: an authorizer that knows its user inserts it into the request's extensions
/// before answering (`req.extensions_mut().insert(Identity("alice".into()))`). Without
/// one, the record says only that the application's login let the request in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(pub String);

/// A token, compared in constant time and never printed.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    pub(crate) fn new(s: &str) -> Self {
        Secret(s.as_bytes().to_vec())
    }

    /// Constant-time in the content (the length is not secret).
    pub(crate) fn matches(&self, given: &str) -> bool {
        ct_eq(&self.0, given.as_bytes())
    }
}

/// Equality whose time does not depend on where the inputs first differ.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// A random 244-bit token, hex.
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The logins of one [`Dashboard`](super::Dashboard), shared by every worker of the server
/// that mounts it: at most [`MAX_SESSIONS`], each for [`SESSION_TTL`].
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Session>>);

/// One login: its access, when it began, and the CSRF token bound to it (its forms carry it;
/// an action with any other token is refused).
#[derive(Debug, Clone)]
struct Session {
    access: Access,
    at: Instant,
    csrf: String,
}

impl Sessions {
    /// A new session: its id and its CSRF token.
    fn create(&self, access: Access) -> (String, String) {
        self.create_at(access, Instant::now())
    }

    fn create_at(&self, access: Access, now: Instant) -> (String, String) {
        let id = random_token();
        let csrf = random_token();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| now.duration_since(s.at) < SESSION_TTL);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, s)| s.at).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                access,
                at: now,
                csrf: csrf.clone(),
            },
        );
        (id, csrf)
    }

    fn get(&self, id: &str) -> Option<Session> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Session> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id)
            .filter(|s| now.saturating_duration_since(s.at) < SESSION_TTL)
            .cloned()
    }

    fn remove(&self, id: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// A cookie's value from the request's `Cookie` header.
pub(crate) fn cookie(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// A `Set-Cookie` value for the dashboard's path.
fn set_cookie(state: &Data, req: &HttpRequest, name: &str, value: &str, max_age: i64) -> String {
    let path = if state.prefix.is_empty() {
        "/"
    } else {
        &state.prefix
    };
    let secure = state
        .config
        .secure_cookies
        .unwrap_or_else(|| req.connection_info().scheme() == "https");
    format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// An authenticated request: its access and its CSRF token.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) access: Access,
    /// The CSRF token the page's forms carry.
    pub(crate) csrf: String,
    /// The token is new: the response sets its cookie.
    new_csrf: bool,
    /// Authenticated by a bearer header: no CSRF needed.
    bearer: bool,
    /// `csrf` is the session's own: an action must carry exactly it.
    session_csrf: bool,
    /// Who acts, as recorded with an action (a paused queue's `paused_by`): how the request
    /// was let in and from which address, e.g. `dashboard login (token) from 127.0.0.1`.
    pub(crate) who: String,
}

impl Ctx {
    pub(crate) fn can_act(&self) -> bool {
        self.access == Access::Full
    }

    /// Adds the CSRF cookie to `resp` if the token is new.
    pub(crate) fn finish(
        &self,
        state: &Data,
        req: &HttpRequest,
        mut resp: HttpResponse,
    ) -> HttpResponse {
        if self.new_csrf {
            let v = set_cookie(
                state,
                req,
                CSRF_COOKIE,
                &self.csrf,
                SESSION_TTL.as_secs() as i64,
            );
            if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&v) {
                resp.headers_mut()
                    .append(actix_web::http::header::SET_COOKIE, v);
            }
        }
        resp
    }
}

fn csrf_of(req: &HttpRequest) -> (String, bool) {
    match cookie(req, CSRF_COOKIE) {
        Some(t) if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) => (t, false),
        _ => (random_token(), true),
    }
}

/// The `Host` the client asked for (the header, or HTTP/2's authority), as sent.
fn host_of(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// Whether `host` (with or without a port) names this machine's loopback interface:
/// `localhost`, `127.0.0.1` or `[::1]`.
pub(crate) fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port_ok(port) => return ip == "::1",
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port_ok(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1"
}

fn port_ok(port: &str) -> bool {
    port.strip_prefix(':')
        .unwrap_or(port)
        .parse::<u16>()
        .is_ok()
}

/// A POST from another site (its `Sec-Fetch-Site`, or without one its `Origin`, says so) is
/// refused in every mode: only the dashboard's own pages act. Clients that send neither
/// (scripts) pass.
#[allow(clippy::result_large_err)] // as `authorize`
fn same_origin(req: &HttpRequest) -> Result<(), HttpResponse> {
    let refuse = |why: String| {
        tracing::warn!(client = ?req.peer_addr().map(|a| a.ip()), path = %req.path(), "dashboard: a cross-site POST refused ({why})");
        Err(layout::plain_error(
            req,
            StatusCode::FORBIDDEN,
            &format!(
                "a request from another site is refused ({why}): act from the dashboard's own pages"
            ),
        ))
    };
    if let Some(site) = req
        .headers()
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
    {
        if site != "same-origin" && site != "none" {
            return refuse(format!("Sec-Fetch-Site: {site}"));
        }
        // A browser that says where the request comes from: its Origin may be `null` (the
        // pages' `Referrer-Policy: no-referrer` makes Chromium send that on a form's POST).
        return Ok(());
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.split_once("://").map(|(_, a)| a);
        let host = host_of(req);
        if authority.is_none() || authority.map(str::to_string) != host {
            return refuse(format!(
                "Origin {origin} is not this dashboard's host {}",
                host.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// Authenticates `req`; the refusal is a response (a redirect to the login page for a page,
/// 401 for an action, 403 for a non-loopback client or `Host` without authentication, 429
/// for a client guessing bearer tokens).
// The refusal is the response itself, sent at once by every handler: boxing it would only
// add an allocation.
#[allow(clippy::result_large_err)]
pub(crate) async fn authorize(state: &Data, req: &HttpRequest) -> Result<Ctx, HttpResponse> {
    let (cookie_csrf, new_csrf) = csrf_of(req);
    let cfg = &state.config;
    let peer = req.peer_addr().map(|a| a.ip());
    let from = peer.map(|a| format!(" from {a}")).unwrap_or_default();
    let mut ctx = Ctx {
        access: Access::ReadOnly,
        csrf: cookie_csrf,
        new_csrf,
        bearer: false,
        session_csrf: false,
        who: format!("dashboard{from}"),
    };
    let access = if cfg.no_auth {
        let loopback = peer.is_some_and(|a| a.is_loopback());
        if !loopback {
            return Err(layout::plain_error(
                req,
                StatusCode::FORBIDDEN,
                "authentication is off: the dashboard answers only loopback clients",
            ));
        }
        let host = host_of(req).unwrap_or_default();
        if !loopback_host(&host) {
            return Err(layout::plain_error(
                req,
                StatusCode::FORBIDDEN,
                "authentication is off: the dashboard answers only requests for localhost, \
                 127.0.0.1 or [::1] (another Host name may be a page rebinding its name to \
                 this machine); set a token to serve other names",
            ));
        }
        if req.headers().contains_key("forwarded") || req.headers().contains_key("x-forwarded-for")
        {
            return Err(layout::plain_error(
                req,
                StatusCode::FORBIDDEN,
                "authentication is off: the dashboard does not answer requests forwarded by a \
                 proxy (every client would look local); set a token to serve behind one",
            ));
        }
        ctx.who = format!("dashboard without login{from}");
        Some(Access::Full)
    } else {
        let mut access = cfg.authorizer.as_ref().and_then(|a| a(req));
        if access.is_some() {
            let name = req.extensions().get::<Identity>().map(|i| i.0.clone());
            ctx.who = match name {
                Some(name) => format!("{name} (the application's login){from}"),
                None => format!("dashboard, the application's login{from}"),
            };
        }
        if access.is_none() {
            if let Some(s) = cookie(req, SESSION_COOKIE).and_then(|id| state.sessions.get(&id)) {
                access = Some(s.access);
                ctx.who = format!("dashboard login ({}){from}", label(s.access));
                ctx.csrf = s.csrf;
                ctx.new_csrf = false;
                ctx.session_csrf = true;
            }
        }
        if access.is_none() {
            if let Some(token) = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
            {
                access = checked_token(state, req, token, "bearer token").await?;
                ctx.bearer = access.is_some();
                if let Some(a) = access {
                    ctx.who = format!("dashboard bearer ({}){from}", label(a));
                }
            }
        }
        access
    };
    let Some(mut access) = access else {
        return Err(if req.method() == actix_web::http::Method::GET {
            let here = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            HttpResponse::SeeOther()
                .insert_header((
                    header::LOCATION,
                    format!(
                        "{}{}",
                        state.url("/login"),
                        layout::query(&[("next", here)])
                    ),
                ))
                .finish()
        } else {
            layout::plain_error(req, StatusCode::UNAUTHORIZED, "log in first")
        });
    };
    if cfg.read_only {
        access = Access::ReadOnly;
    }
    ctx.access = access;
    Ok(ctx)
}

/// The id of the live session `req` carries, if any (a live stream checks it still holds).
pub(crate) fn session_of(state: &Data, req: &HttpRequest) -> Option<String> {
    cookie(req, SESSION_COOKIE).filter(|id| state.sessions.get(id).is_some())
}

/// Whether session `id` still holds (not logged out, not expired).
pub(crate) fn session_valid(state: &Data, id: &str) -> bool {
    state.sessions.get(id).is_some()
}

/// Checks a login `token` under the throttle: its access, `None` for a wrong token (logged at
/// WARN with the client's address, never the token), or the refusal (429) while the client
/// or everyone is pausing after failures.
#[allow(clippy::result_large_err)] // as `authorize`
async fn checked_token(
    state: &Data,
    req: &HttpRequest,
    token: &str,
    what: &'static str,
) -> Result<Option<Access>, HttpResponse> {
    let peer = req.peer_addr().map(|a| a.ip());
    let turn = match state.throttle.turn(peer).await {
        Ok(t) => t,
        Err(wait) => {
            let secs = wait.as_secs() + 1;
            tracing::warn!(client = ?peer, kind = what, "dashboard: a login refused unchecked: too many failures");
            let mut resp = layout::plain_error(
                req,
                StatusCode::TOO_MANY_REQUESTS,
                &format!("too many failed logins: try again in {secs} s"),
            );
            if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return Err(resp);
        }
    };
    match token_access(state, token) {
        Some(a) => {
            state.throttle.succeeded(turn);
            Ok(Some(a))
        }
        None => {
            let n = state.throttle.failed(turn, Instant::now());
            tracing::warn!(client = ?peer, kind = what, failures_in_a_row = n, "dashboard: a wrong login token");
            // Answered no sooner than the address may try again (the comparison itself is
            // constant-time).
            tokio::time::sleep(Duration::from_millis(250)).await;
            Ok(None)
        }
    }
}

/// Which token gave `access`, for the record.
fn label(access: Access) -> &'static str {
    match access {
        Access::Full => "token",
        Access::ReadOnly => "read-only token",
    }
}

/// The access a login token gives, if any (every configured token is compared).
fn token_access(state: &Data, token: &str) -> Option<Access> {
    let full = state
        .config
        .token
        .as_ref()
        .is_some_and(|t| t.matches(token));
    let ro = state
        .config
        .read_only_token
        .as_ref()
        .is_some_and(|t| t.matches(token));
    if full {
        Some(Access::Full)
    } else if ro {
        Some(Access::ReadOnly)
    } else {
        None
    }
}

/// For an action: from this site, authenticated, allowed to act, and its form's CSRF token
/// is its session's (or, without a session, its CSRF cookie's).
#[allow(clippy::result_large_err)] // as `authorize`
pub(crate) async fn authorize_action(
    state: &Data,
    req: &HttpRequest,
    form_csrf: Option<&str>,
) -> Result<Ctx, HttpResponse> {
    same_origin(req)?;
    let ctx = authorize(state, req).await?;
    if !ctx.bearer {
        let expected = if ctx.session_csrf {
            Some(ctx.csrf.clone())
        } else {
            cookie(req, CSRF_COOKIE)
        };
        let ok = match (expected, form_csrf) {
            (Some(c), Some(f)) => ct_eq(c.as_bytes(), f.as_bytes()),
            _ => false,
        };
        if !ok {
            return Err(layout::plain_error(
                req,
                StatusCode::FORBIDDEN,
                "the form's CSRF token is missing or does not match: reload the page and try again",
            ));
        }
    }
    if !ctx.can_act() {
        return Err(layout::plain_error(
            req,
            StatusCode::FORBIDDEN,
            "read-only: this dashboard does not allow actions",
        ));
    }
    Ok(ctx)
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: String,
    csrf: Option<String>,
    /// The page asked for before the login (a path under the dashboard).
    #[serde(default)]
    next: String,
}

/// The login page's query: the page to return to.
#[derive(Debug, Deserialize)]
pub(crate) struct NextQuery {
    #[serde(default)]
    next: String,
}

/// `next` if it is a page of this dashboard (a path under its prefix, not another site),
/// else the overview.
fn next_page(state: &Data, next: &str) -> String {
    let under = if state.prefix.is_empty() {
        next.starts_with('/')
    } else {
        next == state.prefix || next.starts_with(&format!("{}/", state.prefix))
    };
    let safe = under
        && !next.starts_with("//")
        && !next.contains('\\')
        && !next.bytes().any(|b| b.is_ascii_control())
        && !next.starts_with(&state.url("/login"))
        && !next.starts_with(&state.url("/logout"));
    if safe {
        next.to_string()
    } else {
        state.url("/")
    }
}

pub(crate) async fn login_page(
    state: Data,
    req: HttpRequest,
    query: web::Query<NextQuery>,
) -> HttpResponse {
    let (csrf, new_csrf) = csrf_of(&req);
    let ctx = Ctx {
        access: Access::ReadOnly,
        csrf,
        new_csrf,
        bearer: false,
        session_csrf: false,
        who: String::new(),
    };
    let next = next_page(&state, &query.next);
    let resp = layout::login(&state, &ctx, &next, None, StatusCode::OK);
    ctx.finish(&state, &req, resp)
}

pub(crate) async fn login(
    state: Data,
    req: HttpRequest,
    form: web::Form<LoginForm>,
) -> HttpResponse {
    if let Err(r) = same_origin(&req) {
        return r;
    }
    let (csrf, new_csrf) = csrf_of(&req);
    let ctx = Ctx {
        access: Access::ReadOnly,
        csrf: csrf.clone(),
        new_csrf,
        bearer: false,
        session_csrf: false,
        who: String::new(),
    };
    let next = next_page(&state, &form.next);
    let csrf_ok = !new_csrf
        && form
            .csrf
            .as_deref()
            .is_some_and(|f| ct_eq(f.as_bytes(), csrf.as_bytes()));
    if !csrf_ok {
        let resp = layout::login(
            &state,
            &ctx,
            &next,
            Some("the login form expired (no matching CSRF cookie): try again"),
            StatusCode::FORBIDDEN,
        );
        return ctx.finish(&state, &req, resp);
    }
    match checked_token(&state, &req, &form.token, "login form").await {
        Ok(Some(access)) => {
            let (id, session_csrf) = state.sessions.create(access);
            let ttl = SESSION_TTL.as_secs() as i64;
            HttpResponse::SeeOther()
                .append_header((
                    header::SET_COOKIE,
                    set_cookie(&state, &req, SESSION_COOKIE, &id, ttl),
                ))
                .append_header((
                    header::SET_COOKIE,
                    set_cookie(&state, &req, CSRF_COOKIE, &session_csrf, ttl),
                ))
                .insert_header((header::LOCATION, next))
                .finish()
        }
        Ok(None) => {
            let resp = layout::login(
                &state,
                &ctx,
                &next,
                Some("wrong token"),
                StatusCode::UNAUTHORIZED,
            );
            ctx.finish(&state, &req, resp)
        }
        Err(refused) => refused,
    }
}

/// The logout form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    csrf: Option<String>,
}

pub(crate) async fn logout(
    state: Data,
    req: HttpRequest,
    form: web::Form<CsrfForm>,
) -> HttpResponse {
    if let Err(r) = same_origin(&req) {
        return r;
    }
    let session =
        cookie(&req, SESSION_COOKIE).and_then(|id| state.sessions.get(&id).map(|s| (id, s)));
    let expected = match &session {
        Some((_, s)) => Some(s.csrf.clone()),
        None => cookie(&req, CSRF_COOKIE),
    };
    let ok = matches!((expected, form.csrf.as_deref()), (Some(c), Some(f)) if ct_eq(c.as_bytes(), f.as_bytes()));
    if !ok {
        return layout::plain_error(
            &req,
            StatusCode::FORBIDDEN,
            "the form's CSRF token does not match",
        );
    }
    if let Some((id, _)) = session {
        state.sessions.remove(&id);
    }
    HttpResponse::SeeOther()
        .insert_header((
            header::SET_COOKIE,
            set_cookie(&state, &req, SESSION_COOKIE, "", 0),
        ))
        .insert_header((header::LOCATION, state.url("/login")))
        .finish()
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf_field(ctx: &Ctx) -> maud::Markup {
    html! { input type="hidden" name="csrf" value=(ctx.csrf); }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_after_its_time() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let (id, _) = s.create_at(Access::Full, t0);
        assert_eq!(
            s.get_at(&id, t0 + SESSION_TTL / 2).map(|s| s.access),
            Some(Access::Full)
        );
        assert!(s.get_at(&id, t0 + SESSION_TTL).is_none());
    }

    #[test]
    fn sessions_are_bounded_in_number_the_oldest_dropped() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let (first, _) = s.create_at(Access::Full, t0);
        let (second, _) = s.create_at(Access::Full, t0 + Duration::from_millis(1));
        for i in 2..=MAX_SESSIONS {
            s.create_at(Access::Full, t0 + Duration::from_millis(i as u64));
        }
        let n = s.0.lock().unwrap().len();
        assert_eq!(n, MAX_SESSIONS);
        let later = t0 + Duration::from_secs(1);
        assert!(s.get_at(&first, later).is_none(), "the oldest was dropped");
        assert!(s.get_at(&second, later).is_some());
    }

    #[test]
    fn a_logout_ends_the_session() {
        let s = Sessions::default();
        let (id, _) = s.create(Access::ReadOnly);
        assert_eq!(s.get(&id).map(|s| s.access), Some(Access::ReadOnly));
        s.remove(&id);
        assert!(s.get(&id).is_none());
    }
}
