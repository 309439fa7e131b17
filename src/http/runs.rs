//! Runs: their state, their event stream (resumable with `Last-Event-ID` or `?after=`), and
//! cancellation. Another user's run answers 404.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiPath, ApiQuery};
use super::sse::run_event_response;
use crate::auth::AuthUser;
use crate::error::ErrorKind;
use crate::store::{JobResult, JobStatus, Run, RunId};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Replay events after this sequence number (as `Last-Event-ID` does); default 0.
    pub after: Option<i64>,
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = Run), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get_run(
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
pub(crate) async fn run_events(
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
pub(crate) async fn cancel_run(
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunMemoryQuery {
    /// Wait up to this many seconds (at most 30) for the job to finish; default 0 (answer now).
    #[param(maximum = 30)]
    pub wait: Option<u64>,
}

/// The memory work of a chat turn: its writer job's state and, once done, what it stored or
/// changed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RunMemory {
    /// The job's key (also answered by `GET /v1/jobs/{job}`).
    pub job: String,
    pub status: JobStatus,
    /// Set once the job is `done`: the memories it added or changed (empty when it stored
    /// nothing — a question, a temporary chat, memory switched off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<JobResult>,
}

/// Longest `wait` of `GET /v1/runs/{id}/memory`, in seconds.
pub(crate) const MAX_MEMORY_WAIT_SECS: u64 = 30;

#[utoipa::path(get, path = "/v1/runs/{id}/memory", tag = "runs",
    description = "What the memory writer did with a chat turn: the state of the turn's job and, \
        once it is done, the memories it stored or superseded (the conversation's own turn \
        records are not listed). The job runs after the turn's run ended; `wait` holds the \
        answer until the job is done or the seconds have passed.",
    params(("id" = String, Path, format = Uuid), RunMemoryQuery),
    responses((status = 200, body = RunMemory),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No such run, or the run queued no memory job (a research, a client's tool results)")),
    security(("bearer" = [])))]
pub(crate) async fn run_memory(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
    ApiQuery(query): ApiQuery<RunMemoryQuery>,
) -> ApiResult<Json<RunMemory>> {
    let wait = query.wait.unwrap_or(0);
    if wait > MAX_MEMORY_WAIT_SECS {
        return Err(ApiError::bad_request(format!(
            "wait must be at most {MAX_MEMORY_WAIT_SECS} seconds"
        )));
    }
    state.store.user(user.user_id).get_run(id).await?;
    let record = state
        .writer
        .run_memory_job(
            user.user_id,
            id,
            std::time::Duration::from_secs(wait),
            &state.shutdown,
        )
        .await?
        .ok_or_else(|| ApiError::not_found("this run queued no memory job"))?;
    Ok(Json(RunMemory {
        job: record.key,
        status: record.status,
        result: record.result,
    }))
}
