//! The authenticated user's memories: hybrid search, list with filters and paging, add, get
//! with version history, patch, delete, export (JSONL), import (JSONL) and delete-all.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery, Page};
use crate::auth::AuthUser;
use crate::memory::rank::RecallMode;
use crate::memory::{
    ForgetMatch, ImportReport, MemoryEngine, PortableMemory, RecallRequest, RecallResponse,
};
use crate::store::{
    ForgetVia, ForgottenMemory, Memory, MemoryFilter, MemoryId, MemoryKind, MemoryVersion,
    NewMemory, ThreadId, Trust,
};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchBody {
    #[schema(min_length = 1, pattern = r"\S")]
    pub query: String,
    /// How many memories to return (default 10, at most `memory.max_k`).
    #[schema(minimum = 1, maximum = 100)]
    pub k: Option<usize>,
    /// Without kinds, every kind but `document` (chunks of ingested documents).
    pub kinds: Option<Vec<MemoryKind>>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    #[serde(default)]
    pub include_archived: bool,
    /// `hybrid` (default), `vector` or `keyword`.
    #[serde(default)]
    pub mode: RecallMode,
    /// Apply decay (default true).
    pub decay: Option<bool>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct ListQuery {
    /// Comma-separated kinds, e.g. `fact,preference`; without it, every kind but `document`.
    pub kinds: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    #[serde(default)]
    pub include_archived: bool,
    #[serde(default)]
    pub include_invalid: bool,
    /// Comma-separated trust levels, e.g. `user,assistant`.
    pub trust: Option<String>,
    /// Only memories made in this thread.
    #[param(value_type = Option<String>, format = Uuid)]
    pub thread_id: Option<ThreadId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct MemoryList {
    pub memories: Vec<Memory>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub next_before: Option<MemoryId>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddBody {
    #[schema(min_length = 1, max_length = 8000, pattern = r"\S")]
    pub content: String,
    /// Default `fact`.
    pub kind: Option<MemoryKind>,
    /// 1–5, default 3.
    #[schema(minimum = 1, maximum = 5)]
    pub importance: Option<u8>,
    #[serde(default)]
    pub source_refs: Vec<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct MemoryWithHistory {
    pub memory: Memory,
    pub versions: Vec<MemoryVersion>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchBody {
    #[schema(min_length = 1, max_length = 8000, pattern = r"\S")]
    pub content: Option<String>,
    pub kind: Option<MemoryKind>,
    #[schema(minimum = 1, maximum = 5)]
    pub importance: Option<u8>,
    /// `true` archives, `false` restores.
    pub archived: Option<bool>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForgetBody {
    /// A description of what to forget, e.g. "my old address". Without `ids`, the memories
    /// that clearly match it are forgotten; with `ids`, it is only recorded.
    pub query: Option<String>,
    /// Forget exactly these memories (e.g. the ones a `dry_run` showed and the user chose).
    #[schema(value_type = Option<Vec<String>>, max_items = 100)]
    pub ids: Option<Vec<MemoryId>>,
    /// Only say what would be forgotten.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ForgetResponse {
    pub dry_run: bool,
    /// What a `query` matches, most relevant first (a dry run's answer).
    pub matches: Vec<ForgetMatch>,
    /// What was forgotten (empty for a dry run).
    pub forgotten: Vec<Memory>,
    /// Until when `POST /v1/memories/forgotten/{id}/restore` can bring them back.
    pub restorable_until: Option<DateTime<Utc>>,
}

/// At most this many ids in one forget request.
const MAX_FORGET_IDS: usize = 100;

#[utoipa::path(post, path = "/v1/memories/forget", tag = "memories", request_body = ForgetBody,
    responses((status = 200, body = ForgetResponse), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn forget(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<ForgetBody>,
) -> ApiResult<Json<ForgetResponse>> {
    let query = body.query.as_deref().map(str::trim).unwrap_or("");
    let memory = engine(&state);
    let matches = match &body.ids {
        Some(ids) => {
            if ids.is_empty() || ids.len() > MAX_FORGET_IDS {
                return Err(ApiError::bad_request(format!(
                    "ids must name between 1 and {MAX_FORGET_IDS} memories"
                )));
            }
            let found = memory
                .store()
                .user(user.user_id)
                .memories_by_ids(ids)
                .await?;
            found
                .into_iter()
                .map(|memory| ForgetMatch {
                    memory,
                    relevance: 1.0,
                })
                .collect()
        }
        None if query.is_empty() => {
            return Err(ApiError::bad_request("give a query or ids to forget"));
        }
        None => memory.forget_preview(user.user_id, query).await?,
    };
    if body.dry_run {
        return Ok(Json(ForgetResponse {
            dry_run: true,
            matches,
            forgotten: Vec::new(),
            restorable_until: None,
        }));
    }
    let ids: Vec<MemoryId> = matches.iter().map(|m| m.memory.id).collect();
    let forgotten = memory
        .forget_ids(user.user_id, &ids, query, ForgetVia::Api)
        .await?;
    let restorable_until = forgotten.first().map(|_| {
        Utc::now() + chrono::Duration::days(memory.settings().forget_retention_days as i64)
    });
    Ok(Json(ForgetResponse {
        dry_run: false,
        matches,
        forgotten,
        restorable_until,
    }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ForgottenList {
    pub forgotten: Vec<ForgottenMemory>,
}

#[utoipa::path(get, path = "/v1/memories/forgotten", tag = "memories",
    responses((status = 200, body = ForgottenList)),
    security(("bearer" = [])))]
pub(crate) async fn forgotten(
    State(state): State<AppState>,
    user: AuthUser,
) -> ApiResult<Json<ForgottenList>> {
    let forgotten = engine(&state).forgotten(user.user_id, 500).await?;
    Ok(Json(ForgottenList { forgotten }))
}

#[utoipa::path(post, path = "/v1/memories/forgotten/{id}/restore", tag = "memories",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = Memory), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn restore(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<MemoryId>,
) -> ApiResult<Json<Memory>> {
    Ok(Json(
        engine(&state).restore_forgotten(user.user_id, id).await?,
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct ConfirmQuery {
    /// Must be `true`: deleting every memory cannot be undone.
    #[serde(default)]
    pub confirm: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Deleted {
    pub deleted: u64,
}

fn engine(state: &AppState) -> &MemoryEngine {
    &state.memory
}

#[utoipa::path(post, path = "/v1/memories/search", tag = "memories", request_body = SearchBody,
    responses((status = 200, body = RecallResponse), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn search(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<SearchBody>,
) -> ApiResult<Json<RecallResponse>> {
    let request = RecallRequest {
        query: body.query,
        k: body.k,
        kinds: body.kinds,
        since: body.since,
        until: body.until,
        include_archived: body.include_archived,
        mode: body.mode,
        decay: body.decay.unwrap_or(true),
        candidates: None,
        keep_irrelevant: false,
    };
    Ok(Json(engine(&state).recall(user.user_id, request).await?))
}

fn parse_kinds(text: &str) -> ApiResult<Vec<MemoryKind>> {
    parse_list(
        text,
        "memory kind",
        MemoryKind::parse,
        MemoryKind::ALL,
        MemoryKind::as_str,
    )
}

fn parse_trusts(text: &str) -> ApiResult<Vec<Trust>> {
    parse_list(text, "trust", Trust::parse, Trust::ALL, Trust::as_str)
}

/// A comma-separated list of enum texts; an unknown one is a 400 naming the known ones.
fn parse_list<T: Copy>(
    text: &str,
    what: &str,
    parse: fn(&str) -> Option<T>,
    all: &[T],
    name: fn(T) -> &'static str,
) -> ApiResult<Vec<T>> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            parse(item).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown {what} {item:?}; expected one of {}",
                    all.iter()
                        .map(|known| name(*known))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

#[utoipa::path(get, path = "/v1/memories", tag = "memories", params(ListQuery, Page<MemoryId, 500>),
    responses((status = 200, body = MemoryList), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<ListQuery>,
    page: Page<MemoryId, 500>,
) -> ApiResult<Json<MemoryList>> {
    let filter = MemoryFilter {
        kinds: query.kinds.as_deref().map(parse_kinds).transpose()?,
        since: query.since,
        until: query.until,
        include_archived: query.include_archived,
        include_invalid: query.include_invalid,
        trusts: query.trust.as_deref().map(parse_trusts).transpose()?,
        thread: query.thread_id,
    };
    let memories = engine(&state)
        .list(user.user_id, &filter, page.limit, page.before)
        .await?;
    let next_before = page.next(&memories, |memory| memory.id);
    Ok(Json(MemoryList {
        memories,
        next_before,
    }))
}

#[utoipa::path(post, path = "/v1/memories", tag = "memories", request_body = AddBody,
    responses((status = 201, body = Memory), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn add(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<AddBody>,
) -> ApiResult<(StatusCode, Json<Memory>)> {
    let importance = body.importance.unwrap_or(3);
    if !(1..=5).contains(&importance) {
        return Err(ApiError::bad_request("importance must be between 1 and 5"));
    }
    let mut memory = NewMemory::from_user(
        body.kind.unwrap_or(MemoryKind::Fact),
        body.content.trim(),
        importance,
    );
    memory.source_refs = body.source_refs;
    let mut written = engine(&state).add(user.user_id, vec![memory]).await?;
    let memory = written.pop().ok_or_else(|| {
        ApiError::new(crate::error::ErrorKind::Internal, "memory was not written")
    })?;
    Ok((StatusCode::CREATED, Json(memory)))
}

#[utoipa::path(get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = MemoryWithHistory), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<MemoryId>,
) -> ApiResult<Json<MemoryWithHistory>> {
    let (memory, versions) = engine(&state).get(user.user_id, id).await?;
    Ok(Json(MemoryWithHistory { memory, versions }))
}

#[utoipa::path(patch, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, format = Uuid)), request_body = PatchBody,
    responses((status = 200, body = Memory), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn patch(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<MemoryId>,
    ApiJson(body): ApiJson<PatchBody>,
) -> ApiResult<Json<Memory>> {
    if let Some(importance) = body.importance
        && !(1..=5).contains(&importance)
    {
        return Err(ApiError::bad_request("importance must be between 1 and 5"));
    }
    let memory = engine(&state)
        .update(
            user.user_id,
            id,
            body.content.map(|content| content.trim().to_string()),
            body.kind,
            body.importance,
            body.archived,
        )
        .await?;
    Ok(Json(memory))
}

#[utoipa::path(delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<MemoryId>,
) -> ApiResult<StatusCode> {
    engine(&state).delete(user.user_id, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/v1/memories", tag = "memories", params(ConfirmQuery),
    responses((status = 200, body = Deleted), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn delete_all(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<ConfirmQuery>,
) -> ApiResult<Json<Deleted>> {
    if !query.confirm {
        return Err(ApiError::bad_request(
            "deleting every memory needs ?confirm=true",
        ));
    }
    let deleted = engine(&state).delete_all(user.user_id).await?;
    Ok(Json(Deleted { deleted }))
}

#[utoipa::path(get, path = "/v1/memories/export", tag = "memories",
    responses((status = 200, body = PortableMemory, content_type = "application/x-ndjson",
        description = "One `PortableMemory` per line (the import format)")),
    security(("bearer" = [])))]
pub(crate) async fn export(State(state): State<AppState>, user: AuthUser) -> ApiResult<Response> {
    let memories = engine(&state).export(user.user_id).await?;
    let mut body = String::new();
    for memory in &memories {
        let line = serde_json::to_string(&PortableMemory::from(memory))
            .map_err(|error| ApiError::new(crate::error::ErrorKind::Internal, error.to_string()))?;
        body.push_str(&line);
        body.push('\n');
    }
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct ImportQuery {
    /// Queue the lines as background jobs of 500 lines (durable, retried) and answer 202 at
    /// once, instead of importing before answering.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ImportQueued {
    /// Follow each at `GET /v1/memories/import/{id}`.
    pub batches: Vec<crate::memory::writer::ImportBatch>,
}

#[utoipa::path(post, path = "/v1/memories/import", tag = "memories", params(ImportQuery),
    request_body(content = PortableMemory, content_type = "application/x-ndjson",
        description = "JSON lines, as exported: one `PortableMemory` object per line (the schema \
        describes one line), UTF-8, no NUL bytes. Example line: \
        `{\"kind\":\"preference\",\"content\":\"prefers oolong tea\",\"importance\":3}`"),
    responses((status = 200, body = ImportReport), (status = 202, body = ImportQueued),
        (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn import(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<ImportQuery>,
    ApiBytes(body): ApiBytes,
) -> ApiResult<Response> {
    super::extract::reject_nul(&body)?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("the import body must be UTF-8 JSON lines"))?;
    if query.background {
        let batches = state.writer.enqueue_import(user.user_id, text).await?;
        return Ok((StatusCode::ACCEPTED, Json(ImportQueued { batches })).into_response());
    }
    Ok(Json(engine(&state).import(user.user_id, text).await?).into_response())
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ImportStatus {
    pub id: String,
    /// `queued`, `running`, `done` or `failed`.
    pub status: crate::store::JobStatus,
}

#[utoipa::path(get, path = "/v1/memories/import/{id}", tag = "memories",
    params(("id" = String, Path)),
    responses((status = 200, body = ImportStatus), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn import_status(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<ImportStatus>> {
    let status = state
        .writer
        .import_status(user.user_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such import batch"))?;
    Ok(Json(ImportStatus { id, status }))
}
