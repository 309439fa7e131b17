//! Runs: their state, their event stream (resumable with `Last-Event-ID` or `?after=`), and
//! cancellation. Another user's run answers 404.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiPath, ApiQuery};
use super::sse::run_event_response;
use crate::auth::AuthUser;
use crate::error::ErrorKind;
use crate::store::{Run, RunId};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct EventsQuery {
    /// Replay events after this sequence number (as `Last-Event-ID` does); default 0.
    pub after: Option<i64>,
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = Run), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_run(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
) -> ApiResult<Json<Run>> {
    Ok(Json(state.store.user(user.user_id).get_run(id).await?))
}

#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, format = Uuid), EventsQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this sequence number")),
    responses(
        (status = 200, description = "Server-sent events: the log after the cursor, then live events until `done`", content_type = "text/event-stream"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn run_events(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let from_header = match headers.get("last-event-id") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok())
                .filter(|seq| *seq >= 0)
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be a non-negative integer")
                })?,
        ),
        None => None,
    };
    if query.after.is_some_and(|after| after < 0) {
        return Err(ApiError::bad_request(
            "after must be a non-negative integer",
        ));
    }
    let after = from_header.or(query.after).unwrap_or(0);
    state.store.user(user.user_id).get_run(id).await?;
    Ok(run_event_response(&state, user.user_id, id, after))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 202, body = Run, description = "Cancellation requested"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "The run already ended")),
    security(("bearer" = [])))]
pub async fn cancel_run(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
) -> ApiResult<(StatusCode, Json<Run>)> {
    let run = state.store.user(user.user_id).get_run(id).await?;
    if run.status.is_terminal() {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!("run already ended with status {}", run.status.as_str()),
        ));
    }
    // Wherever it executes: another replica's run gets the cancel through its owner.
    if !state.runs.request_cancel(user.user_id, id).await? {
        return Err(ApiError::new(ErrorKind::Conflict, "run already ended"));
    }
    Ok((StatusCode::ACCEPTED, Json(run)))
}
