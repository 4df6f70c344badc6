//! Who may use the dashboard, and proof that an action came from its own pages.
//!
//! * Authentication, in order: no authentication (loopback clients only), the embedding
//!   application's authorizer, a session cookie from the login page, an `Authorization:
//!   Bearer <token>` header (scripts). Tokens are compared in constant time.
//! * Sessions live in the memory of the one [`Dashboard`](super::Dashboard), shared by every
//!   worker of the server (a restart logs everyone out; a logout on any worker revokes the
//!   session on all): a random id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over
//!   HTTPS), 12 hours, at most 10,000 sessions (the oldest dropped first).
//! * CSRF: a random token in a cookie of its own, repeated in a hidden field of every form;
//!   a POST whose field does not match the cookie is refused. Requests authenticated by a
//!   bearer header carry no ambient credential and need none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
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
pub(crate) struct Sessions(Mutex<HashMap<String, (Access, Instant)>>);

impl Sessions {
    fn create(&self, access: Access) -> String {
        self.create_at(access, Instant::now())
    }

    fn create_at(&self, access: Access, now: Instant) -> String {
        let id = random_token();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, at)| now.duration_since(*at) < SESSION_TTL);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), (access, now));
        id
    }

    fn get(&self, id: &str) -> Option<Access> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Access> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id)
            .filter(|(_, at)| now.saturating_duration_since(*at) < SESSION_TTL)
            .map(|(a, _)| *a)
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

/// Authenticates `req`; the refusal is a response (a redirect to the login page for a page,
/// 401 for an action, 403 for a non-loopback client without authentication).
// The refusal is the response itself, sent at once by every handler: boxing it would only
// add an allocation.
#[allow(clippy::result_large_err)]
pub(crate) fn authorize(state: &Data, req: &HttpRequest) -> Result<Ctx, HttpResponse> {
    let (csrf, new_csrf) = csrf_of(req);
    let cfg = &state.config;
    let mut bearer = false;
    let access = if cfg.no_auth {
        let loopback = req.peer_addr().is_some_and(|a| a.ip().is_loopback());
        if !loopback {
            return Err(layout::plain_error(
                StatusCode::FORBIDDEN,
                "authentication is off: the dashboard answers only loopback clients",
            ));
        }
        Some(Access::Full)
    } else {
        let mut access = cfg.authorizer.as_ref().and_then(|a| a(req));
        if access.is_none() {
            access = cookie(req, SESSION_COOKIE).and_then(|id| state.sessions.get(&id));
        }
        if access.is_none() {
            if let Some(token) = req
                .headers()
                .get(actix_web::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
            {
                access = token_access(state, token);
                bearer = access.is_some();
            }
        }
        access
    };
    let Some(mut access) = access else {
        return Err(if req.method() == actix_web::http::Method::GET {
            HttpResponse::SeeOther()
                .insert_header((actix_web::http::header::LOCATION, state.url("/login")))
                .finish()
        } else {
            layout::plain_error(StatusCode::UNAUTHORIZED, "log in first")
        });
    };
    if cfg.read_only {
        access = Access::ReadOnly;
    }
    Ok(Ctx {
        access,
        csrf,
        new_csrf,
        bearer,
    })
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

/// For an action: authenticated, allowed to act, and its form's CSRF token matches.
#[allow(clippy::result_large_err)] // as `authorize`
pub(crate) fn authorize_action(
    state: &Data,
    req: &HttpRequest,
    form_csrf: Option<&str>,
) -> Result<Ctx, HttpResponse> {
    let ctx = authorize(state, req)?;
    if !ctx.bearer {
        let cookie_token = cookie(req, CSRF_COOKIE);
        let ok = match (cookie_token, form_csrf) {
            (Some(c), Some(f)) => ct_eq(c.as_bytes(), f.as_bytes()),
            _ => false,
        };
        if !ok {
            return Err(layout::plain_error(
                StatusCode::FORBIDDEN,
                "the form's CSRF token is missing or does not match: reload the page and try again",
            ));
        }
    }
    if !ctx.can_act() {
        return Err(layout::plain_error(
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
}

pub(crate) async fn login_page(state: Data, req: HttpRequest) -> HttpResponse {
    let (csrf, new_csrf) = csrf_of(&req);
    let ctx = Ctx {
        access: Access::ReadOnly,
        csrf,
        new_csrf,
        bearer: false,
    };
    let resp = layout::login(&state, &ctx, None, StatusCode::OK);
    ctx.finish(&state, &req, resp)
}

pub(crate) async fn login(
    state: Data,
    req: HttpRequest,
    form: web::Form<LoginForm>,
) -> HttpResponse {
    let (csrf, new_csrf) = csrf_of(&req);
    let ctx = Ctx {
        access: Access::ReadOnly,
        csrf: csrf.clone(),
        new_csrf,
        bearer: false,
    };
    let csrf_ok = !new_csrf
        && form
            .csrf
            .as_deref()
            .is_some_and(|f| ct_eq(f.as_bytes(), csrf.as_bytes()));
    if !csrf_ok {
        let resp = layout::login(
            &state,
            &ctx,
            Some("the login form expired (no matching CSRF cookie): try again"),
            StatusCode::FORBIDDEN,
        );
        return ctx.finish(&state, &req, resp);
    }
    match token_access(&state, &form.token) {
        Some(access) => {
            let id = state.sessions.create(access);
            let cookie = set_cookie(
                &state,
                &req,
                SESSION_COOKIE,
                &id,
                SESSION_TTL.as_secs() as i64,
            );
            HttpResponse::SeeOther()
                .insert_header((actix_web::http::header::SET_COOKIE, cookie))
                .insert_header((actix_web::http::header::LOCATION, state.url("/")))
                .finish()
        }
        None => {
            // Slows guessing down; the comparison itself is constant-time.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let resp = layout::login(&state, &ctx, Some("wrong token"), StatusCode::UNAUTHORIZED);
            ctx.finish(&state, &req, resp)
        }
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
    let ok = matches!((cookie(&req, CSRF_COOKIE), form.csrf.as_deref()), (Some(c), Some(f)) if ct_eq(c.as_bytes(), f.as_bytes()));
    if !ok {
        return layout::plain_error(
            StatusCode::FORBIDDEN,
            "the form's CSRF token does not match",
        );
    }
    if let Some(id) = cookie(&req, SESSION_COOKIE) {
        state.sessions.remove(&id);
    }
    HttpResponse::SeeOther()
        .insert_header((
            actix_web::http::header::SET_COOKIE,
            set_cookie(&state, &req, SESSION_COOKIE, "", 0),
        ))
        .insert_header((actix_web::http::header::LOCATION, state.url("/login")))
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
        let id = s.create_at(Access::Full, t0);
        assert_eq!(s.get_at(&id, t0 + SESSION_TTL / 2), Some(Access::Full));
        assert_eq!(s.get_at(&id, t0 + SESSION_TTL), None);
    }

    #[test]
    fn sessions_are_bounded_in_number_the_oldest_dropped() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let first = s.create_at(Access::Full, t0);
        let second = s.create_at(Access::Full, t0 + Duration::from_millis(1));
        for i in 2..=MAX_SESSIONS {
            s.create_at(Access::Full, t0 + Duration::from_millis(i as u64));
        }
        let n = s.0.lock().unwrap().len();
        assert_eq!(n, MAX_SESSIONS);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(s.get_at(&first, later), None, "the oldest was dropped");
        assert_eq!(s.get_at(&second, later), Some(Access::Full));
    }

    #[test]
    fn a_logout_ends_the_session() {
        let s = Sessions::default();
        let id = s.create(Access::ReadOnly);
        assert_eq!(s.get(&id), Some(Access::ReadOnly));
        s.remove(&id);
        assert_eq!(s.get(&id), None);
    }
}
