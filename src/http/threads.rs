//! Threads and messages (working memory): create, list, get with messages, delete, and posting
//! a message, which starts a chat run and streams its events.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
use super::sse::run_event_response;
use crate::agent::chat::{ChatDeps, run_chat_turn};
use crate::auth::AuthUser;
use crate::memory::writer::TurnJob;
use crate::startup::AppState;
use crate::store::{Message, Role, Run, RunKind, Thread, ThreadId};

const MAX_TITLE_CHARS: usize = 200;
const MAX_MESSAGE_CHARS: usize = 100_000;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateThread {
    /// Optional title; defaults to "New thread".
    #[serde(default)]
    pub title: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListThreadsQuery {
    /// Page size, 1–200 (default 50).
    pub limit: Option<i64>,
    /// Cursor: the `next_before` of the previous page.
    #[param(value_type = Option<String>, format = Uuid)]
    pub before: Option<ThreadId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadList {
    pub threads: Vec<Thread>,
    /// Pass as `before` to get the next page; absent on the last page.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub next_before: Option<ThreadId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadWithMessages {
    pub thread: Thread,
    pub messages: Vec<Message>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    /// The user's message.
    pub content: String,
    /// `true` (default): answer with the run's event stream (SSE). `false`: answer 202 with the
    /// run, to be followed at `GET /v1/runs/{id}/events`.
    #[serde(default = "default_true")]
    pub stream: bool,
}

fn default_true() -> bool {
    true
}

#[utoipa::path(post, path = "/v1/threads", tag = "threads",
    request_body = CreateThread,
    responses((status = 201, body = Thread), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiBytes(body): ApiBytes,
) -> ApiResult<(StatusCode, Json<Thread>)> {
    let body: CreateThread = if body.iter().all(u8::is_ascii_whitespace) {
        CreateThread { title: None }
    } else {
        serde_json::from_slice(&body)
            .map_err(|error| ApiError::bad_request(format!("invalid JSON body: {error}")))?
    };
    let title = body
        .title
        .map(|title| title.trim().to_string())
        .filter(|title| !title.is_empty())
        .unwrap_or_else(|| "New thread".to_string());
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(ApiError::bad_request(format!(
            "title is longer than {MAX_TITLE_CHARS} characters"
        )));
    }
    let thread = state.store.create_thread(user.user_id, &title).await?;
    Ok((StatusCode::CREATED, Json(thread)))
}

#[utoipa::path(get, path = "/v1/threads", tag = "threads", params(ListThreadsQuery),
    responses((status = 200, body = ThreadList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_threads(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<ListThreadsQuery>,
) -> ApiResult<Json<ThreadList>> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::bad_request("limit must be between 1 and 200"));
    }
    let threads = state
        .store
        .list_threads(user.user_id, limit, query.before)
        .await?;
    let next_before = (threads.len() as i64 == limit)
        .then(|| threads.last().map(|thread| thread.id))
        .flatten();
    Ok(Json(ThreadList {
        threads,
        next_before,
    }))
}

#[utoipa::path(get, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ThreadWithMessages), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<ThreadId>,
) -> ApiResult<Json<ThreadWithMessages>> {
    let thread = state.store.get_thread(user.user_id, id).await?;
    let messages = state.store.list_messages(user.user_id, id).await?;
    Ok(Json(ThreadWithMessages { thread, messages }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct DeleteThreadQuery {
    /// Also delete the memories made from this thread only (default false).
    #[serde(default)]
    pub forget_memories: bool,
}

#[utoipa::path(delete, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, format = Uuid), DeleteThreadQuery),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<ThreadId>,
    ApiQuery(query): ApiQuery<DeleteThreadQuery>,
) -> ApiResult<StatusCode> {
    state.store.get_thread(user.user_id, id).await?;
    if query.forget_memories {
        state.store.delete_thread_memories(user.user_id, id).await?;
        state.memory.indexer().notify();
    }
    state.store.delete_thread(user.user_id, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/threads/{id}/messages", tag = "threads",
    params(("id" = String, Path, format = Uuid)),
    request_body = PostMessage,
    responses(
        (status = 200, description = "Server-sent events of the run (`id:` is the event's sequence number)", content_type = "text/event-stream"),
        (status = 202, body = Run, description = "With `stream: false`"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_message(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(thread): ApiPath<ThreadId>,
    ApiJson(body): ApiJson<PostMessage>,
) -> ApiResult<Response> {
    let content = body.content.trim().to_string();
    if content.is_empty() {
        return Err(ApiError::bad_request("content must not be empty"));
    }
    if content.chars().count() > MAX_MESSAGE_CHARS {
        return Err(ApiError::bad_request(format!(
            "content is longer than {MAX_MESSAGE_CHARS} characters"
        )));
    }
    state.store.get_thread(user.user_id, thread).await?;
    let user_id = user.user_id;
    let message = state
        .store
        .append_message(user_id, thread, Role::User, &content, None)
        .await?;
    let deps = ChatDeps {
        store: state.store.clone(),
        memory: state.memory.clone(),
        models: state.models.clone(),
        writer: state.writer.clone(),
        settings: state.settings.chat.clone(),
        research: Some(state.research.clone()),
    };
    let message_id = message.id;
    let run = state
        .runs
        .start(user_id, Some(thread), RunKind::Chat, move |context| {
            run_chat_turn(context, deps, message)
        })
        .await?;
    // What the turn teaches is written in the background, once the turn's stream has ended.
    let job = TurnJob {
        thread_id: thread,
        user_message_id: message_id,
        run_id: Some(run.id),
    };
    state.writer.enqueue_turn(user_id, &job).await?;
    if body.stream {
        Ok(run_event_response(&state, user_id, run.id, 0))
    } else {
        Ok((StatusCode::ACCEPTED, Json(run)).into_response())
    }
}
