//! `/mcp`: the MCP server (`crate::mcp`) over Streamable HTTP, behind mnemo's own guard:
//!
//! - **Authentication** as everywhere else (API key or JWT as a bearer token): without valid
//!   credentials 401 with `WWW-Authenticate: Bearer`, as the MCP authorization spec asks; the
//!   `AuthUser` then travels in the request's parts to the tools.
//! - **One user per session**: an MCP session belongs to the user who opened it; the same
//!   `Mcp-Session-Id` with another user's credentials is 404, as for an unknown session.
//! - **Origin**: a browser's `Origin` must be a loopback origin or one listed in
//!   `server.allowed_origins` (403 otherwise), against DNS rebinding as the transport spec asks.
//!   rmcp's own `Host` allow-list is off: mnemo is reached under any name behind proxies, and
//!   every request carries credentials a rebinding page does not have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::AppState;
use super::error::{ApiError, ErrorKind};
use crate::auth::AuthUser;
use crate::mcp::McpServer;
use crate::store::UserId;

const SESSION_HEADER: &str = "mcp-session-id";
/// Open MCP sessions remembered for their owner at most (the oldest are forgotten first).
const MAX_SESSIONS: usize = 10_000;

/// Which user opened each live MCP session.
#[derive(Default)]
struct Sessions {
    owners: HashMap<String, UserId>,
    order: std::collections::VecDeque<String>,
}

impl Sessions {
    fn insert(&mut self, id: String, user: UserId) {
        if self.owners.insert(id.clone(), user).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_SESSIONS {
            if let Some(old) = self.order.pop_front() {
                self.owners.remove(&old);
            }
        }
    }
}

/// The `/mcp` routes, guarded.
pub fn routes(state: &AppState) -> Router<AppState> {
    let server = McpServer::new(
        state.memory.clone(),
        state.research.clone(),
        state.runs.clone(),
        state.streams_stop.clone(),
    );
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(state.settings.server.max_body_bytes)
        .with_cancellation_token(state.streams_stop.child_token());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let sessions = Arc::new(Mutex::new(Sessions::default()));
    let guard_state = state.clone();
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            guard(guard_state.clone(), sessions.clone(), request, next)
        }))
}

async fn guard(
    state: AppState,
    sessions: Arc<Mutex<Sessions>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN)
        && !origin_allowed(origin, &state.settings.server.allowed_origins)
    {
        return ApiError::new(
            ErrorKind::Forbidden,
            "this Origin may not call /mcp (see server.allowed_origins)",
        )
        .into_response();
    }
    let (mut parts, body) = request.into_parts();
    let user = match AuthUser::from_request_parts(&mut parts, &state).await {
        Ok(user) => user,
        Err(error) => return error.into_response(),
    };
    let session = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    if let Some(session) = &session {
        let owner = lock(&sessions).owners.get(session).copied();
        if owner.is_some_and(|owner| owner != user.user_id) {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
    }
    let user_id = user.user_id;
    parts.extensions.insert(user);
    let response = next.run(Request::from_parts(parts, body)).await;
    if session.is_none()
        && let Some(opened) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|value| value.to_str().ok())
    {
        lock(&sessions).insert(opened.to_string(), user_id);
    }
    response
}

fn lock(sessions: &Mutex<Sessions>) -> std::sync::MutexGuard<'_, Sessions> {
    sessions
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A loopback origin (any port), or one of the comma-separated `allowed` origins.
fn origin_allowed(origin: &HeaderValue, allowed: &str) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim().trim_end_matches('/');
    if allowed
        .split(',')
        .map(|entry| entry.trim().trim_end_matches('/'))
        .any(|entry| !entry.is_empty() && entry.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    match url::Url::parse(origin) {
        Ok(url) => matches!(
            url.host(),
            Some(
                url::Host::Domain("localhost")
                    | url::Host::Ipv4(std::net::Ipv4Addr::LOCALHOST)
                    | url::Host::Ipv6(std::net::Ipv6Addr::LOCALHOST)
            )
        ),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_listed_origins_pass_others_do_not() {
        let check = |origin: &str, allowed: &str| {
            origin_allowed(&HeaderValue::from_str(origin).unwrap(), allowed)
        };
        assert!(check("http://localhost:5173", ""));
        assert!(check("http://127.0.0.1:8080", ""));
        assert!(check("http://[::1]:8080", ""));
        assert!(!check("http://evil.example", ""));
        assert!(!check("http://localhost.evil.example", ""));
        assert!(check(
            "https://app.example.com",
            "https://other.example, https://app.example.com/"
        ));
        assert!(!check(
            "https://app.example.com.evil",
            "https://app.example.com"
        ));
        assert!(!check("null", ""));
    }
}
