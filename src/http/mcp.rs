//! `/mcp`: the MCP server (`crate::mcp`) over Streamable HTTP, behind mnemo's own guard:
//!
//! - **Authentication** as everywhere else (API key or JWT as a bearer token): without valid
//!   credentials 401 with `WWW-Authenticate: Bearer`, as the MCP authorization spec asks; the
//!   `AuthUser` then travels in the request's parts to the tools.
//! - **One user per session**: an MCP session belongs to the user who opened it; the same
//!   `Mcp-Session-Id` with another user's credentials is 404, as for an unknown session. A
//!   user holds at most 64 sessions (a new one closes their oldest), and a closed or evicted
//!   session is 404 for everybody. `DELETE` answers 204.
//! - **No NUL** in a request body (tool arguments end up in the database): 400.
//! - **Origin**: a browser's `Origin` must be a loopback origin or one listed in
//!   `server.allowed_origins` (403 otherwise), against DNS rebinding as the transport spec asks.
//!   rmcp's own `Host` allow-list is off: mnemo is reached under any name behind proxies, and
//!   every request carries credentials a rebinding page does not have.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::AppState;
use super::error::{ApiError, ErrorKind};
use crate::auth::AuthUser;
use crate::mcp::McpServer;
use crate::store::UserId;

const SESSION_HEADER: &str = "mcp-session-id";
/// Open MCP sessions one user may hold; opening one more closes their oldest.
const MAX_SESSIONS_PER_USER: usize = 64;

/// Which user opened each live MCP session. A session this table does not hold is served to
/// nobody (404), so a session forgotten here can never pass to another user.
#[derive(Default)]
struct Sessions {
    owners: HashMap<String, UserId>,
    by_user: HashMap<UserId, VecDeque<String>>,
}

impl Sessions {
    /// Records a new session of `user`; returns the sessions of theirs past the cap, forgotten
    /// here, to close.
    fn insert(&mut self, id: String, user: UserId) -> Vec<String> {
        if self.owners.insert(id.clone(), user).is_some() {
            return Vec::new();
        }
        let open = self.by_user.entry(user).or_default();
        open.push_back(id);
        let mut evicted = Vec::new();
        while open.len() > MAX_SESSIONS_PER_USER {
            if let Some(old) = open.pop_front() {
                self.owners.remove(&old);
                evicted.push(old);
            }
        }
        evicted
    }

    fn remove(&mut self, id: &str) {
        if let Some(user) = self.owners.remove(id)
            && let Some(open) = self.by_user.get_mut(&user)
        {
            open.retain(|session| session != id);
            if open.is_empty() {
                self.by_user.remove(&user);
            }
        }
    }
}

/// The `/mcp` routes, guarded.
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
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
    let manager = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(move || Ok(server.clone()), manager.clone(), config);
    let sessions = Arc::new(Mutex::new(Sessions::default()));
    let guard_state = state.clone();
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            guard(
                guard_state.clone(),
                sessions.clone(),
                manager.clone(),
                request,
                next,
            )
        }))
}

async fn guard(
    state: AppState,
    sessions: Arc<Mutex<Sessions>>,
    manager: Arc<LocalSessionManager>,
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
        if owner != Some(user.user_id) {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
    }
    let deleting = parts.method == axum::http::Method::DELETE;
    let user_id = user.user_id;
    parts.extensions.insert(user);
    // Tool arguments are text for the database, which cannot hold NUL.
    let body = if deleting {
        body
    } else {
        let Ok(bytes) = axum::body::to_bytes(body, state.settings.server.max_body_bytes).await
        else {
            return ApiError::new(
                ErrorKind::PayloadTooLarge,
                "the request body is larger than server.max_body_bytes",
            )
            .into_response();
        };
        if let Err(error) = super::extract::reject_nul(&bytes) {
            return error.into_response();
        }
        axum::body::Body::from(bytes)
    };
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if let Some(session) = &session
        && deleting
        && response.status().is_success()
    {
        lock(&sessions).remove(session);
        // The session is gone; nothing more to say (the SDKs expect 200 or 204, not 202).
        *response.status_mut() = StatusCode::NO_CONTENT;
        return response;
    }
    if session.is_none()
        && let Some(opened) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|value| value.to_str().ok())
    {
        let evicted = lock(&sessions).insert(opened.to_string(), user_id);
        for old in evicted {
            let _ = manager.close_session(&Arc::from(old.as_str())).await;
        }
    }
    response
}

fn lock(sessions: &Mutex<Sessions>) -> parking_lot::MutexGuard<'_, Sessions> {
    sessions.lock()
}

/// A loopback origin (any port), or one of the comma-separated `allowed` origins.
fn origin_allowed(origin: &HeaderValue, allowed: &str) -> bool {
    let Ok(text) = origin.to_str() else {
        return false;
    };
    let text = text.trim().trim_end_matches('/');
    allowed
        .split(',')
        .map(|entry| entry.trim().trim_end_matches('/'))
        .any(|entry| !entry.is_empty() && entry.eq_ignore_ascii_case(text))
        || super::guard::loopback_origin(origin)
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
