//! Threads and messages (working memory): create, list, get with messages, delete, and posting
//! a message, which starts a chat run and streams its events.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery, Page};
use super::sse::run_event_response;
use crate::agent::chat::TurnOptions;
use crate::auth::AuthUser;
use crate::memory::writer::ImportedConversation;
use crate::store::{DocumentId, JobStatus, Message, MessageId, NewMessage, Run, Thread, ThreadId};

const MAX_TITLE_CHARS: usize = 200;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateThread {
    /// Optional title; defaults to "New thread".
    #[serde(default)]
    #[schema(max_length = 200)]
    pub title: Option<String>,
    /// A temporary chat: its turns neither recall nor store memories (default false).
    #[serde(default)]
    pub temporary: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ThreadList {
    pub threads: Vec<Thread>,
    /// Pass as `before` to get the next page; absent on the last page.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub next_before: Option<ThreadId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ThreadWithMessages {
    pub thread: Thread,
    pub messages: Vec<Message>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostMessage {
    /// The user's message.
    #[schema(min_length = 1, max_length = 1000000, pattern = r"\S")]
    pub content: String,
    /// `true` (default): answer with the run's event stream (SSE). `false`: answer 202 with the
    /// run, to be followed at `GET /v1/runs/{id}/events`.
    #[serde(default = "default_true")]
    pub stream: bool,
    /// The model to answer with, by name: one of the configured models (`GET /v1/roles`);
    /// absent, the chat role's. Any other name is refused (400, naming the allowed ones).
    #[serde(default)]
    #[schema(max_length = 200)]
    pub model: Option<String>,
    /// Documents of the user's to attach (their ids from `POST /v1/documents`, at most 10):
    /// the turn reads their text, quoted as data, and the message lists them. An id that is
    /// not one of the user's documents is refused (400) before anything is stored.
    #[serde(default)]
    #[schema(value_type = Vec<String>, max_items = 10)]
    pub attachments: Vec<DocumentId>,
}

fn default_true() -> bool {
    true
}

#[utoipa::path(post, path = "/v1/threads", tag = "threads",
    request_body = CreateThread,
    responses((status = 201, body = Thread), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn create_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiBytes(body): ApiBytes,
) -> ApiResult<(StatusCode, Json<Thread>)> {
    super::extract::reject_nul(&body)?;
    let body: CreateThread = if body.iter().all(u8::is_ascii_whitespace) {
        CreateThread {
            title: None,
            temporary: false,
        }
    } else {
        serde_json::from_slice(&body)
            .map_err(|error| ApiError::bad_request(format!("invalid JSON body: {error}")))?
    };
    let title = match body.title.as_deref().map(str::trim) {
        None | Some("") => "New thread".to_string(),
        Some(title) => checked_title(title)?,
    };
    let thread = state
        .store
        .user(user.user_id)
        .create_thread(&title, body.temporary)
        .await?;
    Ok((StatusCode::CREATED, Json(thread)))
}

/// A title trimmed, non-empty and at most `MAX_TITLE_CHARS` characters.
fn checked_title(title: &str) -> ApiResult<String> {
    let title = title.trim();
    if title.is_empty() {
        return Err(ApiError::bad_request("title is empty"));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(ApiError::bad_request(format!(
            "title is longer than {MAX_TITLE_CHARS} characters"
        )));
    }
    Ok(title.to_string())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenameThread {
    /// The new title (trimmed; not empty).
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub title: String,
}

#[utoipa::path(patch, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, format = Uuid)),
    request_body = RenameThread,
    responses((status = 200, body = Thread), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn rename_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<ThreadId>,
    ApiJson(body): ApiJson<RenameThread>,
) -> ApiResult<Json<Thread>> {
    let title = checked_title(&body.title)?;
    let thread = state
        .store
        .user(user.user_id)
        .rename_thread(id, &title)
        .await?;
    Ok(Json(thread))
}

#[utoipa::path(get, path = "/v1/threads", tag = "threads", params(Page<ThreadId, 200>),
    responses((status = 200, body = ThreadList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn list_threads(
    State(state): State<AppState>,
    user: AuthUser,
    page: Page<ThreadId, 200>,
) -> ApiResult<Json<ThreadList>> {
    let threads = state
        .store
        .user(user.user_id)
        .list_threads(page.limit, page.before)
        .await?;
    let next_before = page.next(&threads, |thread| thread.id);
    Ok(Json(ThreadList {
        threads,
        next_before,
    }))
}

#[utoipa::path(get, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ThreadWithMessages), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<ThreadId>,
) -> ApiResult<Json<ThreadWithMessages>> {
    let thread = state.store.user(user.user_id).get_thread(id).await?;
    let messages = state.store.user(user.user_id).list_messages(id).await?;
    Ok(Json(ThreadWithMessages { thread, messages }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct DeleteThreadQuery {
    /// Also delete the memories made from this thread only (default false).
    #[serde(default)]
    pub forget_memories: bool,
}

#[utoipa::path(delete, path = "/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, format = Uuid), DeleteThreadQuery),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn delete_thread(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<ThreadId>,
    ApiQuery(query): ApiQuery<DeleteThreadQuery>,
) -> ApiResult<StatusCode> {
    state.store.user(user.user_id).get_thread(id).await?;
    // A live run of the thread stops first: its stream ends with `done`, and its model call
    // does not run on for a thread that is gone.
    state
        .runs
        .cancel_thread(user.user_id, id, std::time::Duration::from_secs(5))
        .await;
    if query.forget_memories {
        state
            .store
            .user(user.user_id)
            .delete_thread_memories(id)
            .await?;
        state.memory.indexer().notify();
    }
    state.store.user(user.user_id).delete_thread(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/threads/{id}/messages", tag = "threads",
    params(("id" = String, Path, format = Uuid),
        ("Idempotency-Key" = Option<String>, Header, max_length = 255,
            description = "Makes a retry safe: a second request with the same key (same thread, \
            content, model and attachments) stores nothing and answers with the first request's \
            run, its events replayed from the start; the same key with another request is 409")),
    request_body = PostMessage,
    responses(
        (status = 200, description = "Server-sent events of the run (`id:` is the event's sequence number)", content_type = "text/event-stream"),
        (status = 202, body = Run, description = "With `stream: false`"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The Idempotency-Key was used for another request")),
    security(("bearer" = [])))]
pub(crate) async fn post_message(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(thread): ApiPath<ThreadId>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PostMessage>,
) -> ApiResult<Response> {
    let user_id = user.user_id;
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be printable ASCII"))?,
        ),
    };
    let options = TurnOptions {
        idempotency_key: key,
        model: body.model.as_deref(),
        attachments: &body.attachments,
    };
    let run = state
        .chat
        .send_turn(user_id, thread, &body.content, options)
        .await
        .map_err(ApiError::from_error)?;
    Ok(turn_response(&state, user_id, run, body.stream))
}

/// A started turn's answer: its event stream, or (`stream: false`) 202 with the run, which
/// then runs on without a reader.
fn turn_response(state: &AppState, user: crate::store::UserId, run: Run, stream: bool) -> Response {
    if stream {
        run_event_response(state, user, run.id, 0)
    } else {
        state.runs.run_in_background(run.id);
        (StatusCode::ACCEPTED, Json(run)).into_response()
    }
}

/// Edit-and-resend or regenerate; the message keeps the documents it attached.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryMessage {
    /// The message's new text (edit and resend); absent: the same text answered again
    /// (regenerate).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 1000000, pattern = r"\S")]
    pub content: Option<String>,
    /// As for `POST /v1/threads/{id}/messages`.
    #[serde(default = "default_true")]
    pub stream: bool,
    /// As for `POST /v1/threads/{id}/messages`.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub model: Option<String>,
}

#[utoipa::path(post, path = "/v1/threads/{id}/messages/{message_id}/retry", tag = "threads",
    description = "Edit-and-resend (with `content`) or regenerate (without): the user's message \
        and everything after it in the thread are removed, with the memories made from those \
        messages alone (what such a memory had superseded is valid again), and the message \
        starts a new turn in the same thread.",
    params(("id" = String, Path, format = Uuid), ("message_id" = String, Path, format = Uuid)),
    request_body = RetryMessage,
    responses(
        (status = 200, description = "Server-sent events of the new run", content_type = "text/event-stream"),
        (status = 202, body = Run, description = "With `stream: false`"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn retry_message(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath((thread, message)): ApiPath<(ThreadId, MessageId)>,
    ApiJson(body): ApiJson<RetryMessage>,
) -> ApiResult<Response> {
    let user_id = user.user_id;
    let run = state
        .chat
        .retry(
            user_id,
            thread,
            message,
            body.content.as_deref(),
            body.model.as_deref(),
        )
        .await
        .map_err(ApiError::from_error)?;
    Ok(turn_response(&state, user_id, run, body.stream))
}

/// A past conversation to import into a thread.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ImportConversation {
    /// The messages in the order they were said (at most 10,000).
    pub messages: Vec<NewMessage>,
}

#[utoipa::path(post, path = "/v1/threads/{id}/import", tag = "threads",
    params(("id" = String, Path, format = Uuid)),
    request_body = ImportConversation,
    responses(
        (status = 202, body = ImportedConversation, description = "Stored; the memory job runs in the background"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn import_conversation(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(thread): ApiPath<ThreadId>,
    ApiJson(body): ApiJson<ImportConversation>,
) -> ApiResult<(StatusCode, Json<ImportedConversation>)> {
    let imported = state
        .writer
        .import_conversation(user.user_id, thread, body.messages)
        .await
        .map_err(ApiError::from_error)?;
    Ok((StatusCode::ACCEPTED, Json(imported)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct JobState {
    pub job: String,
    pub status: JobStatus,
}

#[utoipa::path(get, path = "/v1/jobs/{job}", tag = "threads",
    params(("job" = String, Path, description = "The `job` of an import")),
    responses((status = 200, body = JobState), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn job_state(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(job): ApiPath<String>,
) -> ApiResult<Json<JobState>> {
    let status = state
        .store
        .user(user.user_id)
        .job_status(&job)
        .await?
        .ok_or_else(|| ApiError::not_found("no such job"))?;
    Ok(Json(JobState { job, status }))
}
