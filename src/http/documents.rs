//! The authenticated user's documents for local research: ingest, list, read with chunks,
//! delete.
//!
//! `POST /v1/documents` takes either a JSON body (`Content-Type: application/json`) with the
//! text inline — `{"content", "title"?, "content_type"?, "source"?}`, where `content_type` is
//! `text/markdown` (default), `text/plain` or `text/html` — or the raw document as the body,
//! its type in the `Content-Type` header (`application/pdf`, `text/html`, `text/plain`,
//! `text/markdown`) and optional `?title=` and `?source=` query parameters.
//!
//! The source identifies the document (without one, its content does): sending a source again
//! with the same bytes answers 200 with the stored document and `"status": "unchanged"`,
//! writing nothing; with other bytes, 200 and `"replaced"` (same id, new chunks); a new
//! document is 201 and `"created"`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiBytes, ApiPath, ApiQuery, Page};
use crate::auth::AuthUser;
use crate::documents::{
    self, DocumentChunk, DocumentError, IngestStatus, IngestedDocument, NewUpload,
};
use crate::store::{Document, DocumentId};

impl From<DocumentError> for ApiError {
    fn from(error: DocumentError) -> Self {
        ApiError::from_error(error)
    }
}

/// A document sent inline as JSON.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct IngestBody {
    /// The document's text.
    pub content: String,
    /// Default: the HTML title or the first line of the text.
    pub title: Option<String>,
    /// `text/markdown` (default), `text/plain` or `text/html`.
    pub content_type: Option<String>,
    /// Where the document came from (a path or URL), kept for the list. It identifies the
    /// document: the same source again keeps (same bytes) or replaces (other bytes) it.
    pub source: Option<String>,
}

/// Query parameters of a raw-body upload.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct IngestQuery {
    pub title: Option<String>,
    /// Where the document came from; it identifies the document (see `IngestBody.source`).
    pub source: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct DocumentList {
    pub documents: Vec<Document>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub next_before: Option<DocumentId>,
}

const INLINE_TYPES: &[&str] = &["text/markdown", "text/plain", "text/html"];

#[utoipa::path(post, path = "/v1/documents", tag = "documents", params(IngestQuery),
    request_body(description = "JSON with the text inline, or the raw document with its Content-Type",
        content(
            (IngestBody = "application/json"),
            ("application/pdf"),
            ("text/html"),
            ("text/markdown"),
            ("text/plain"),
        )),
    responses((status = 201, body = IngestedDocument, description = "A new document: `created`"),
        (status = 200, body = IngestedDocument,
            description = "The document was there: `unchanged` (nothing written) or `replaced`"),
        (status = 400, description = "Empty, unreadable or unsupported content", body = ErrorBody),
        (status = 409, description = "Another ingest of this document changed it meanwhile", body = ErrorBody),
        (status = 413, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn ingest(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<IngestQuery>,
    headers: HeaderMap,
    ApiBytes(body): ApiBytes,
) -> ApiResult<(StatusCode, Json<IngestedDocument>)> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(documents::essence)
        .filter(|value| !value.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "set Content-Type: application/json for an inline document, or the document's own type (application/pdf, text/html, text/markdown, text/plain)",
            )
        })?;
    let upload = if content_type == "application/json" {
        super::extract::reject_nul(&body)?;
        let inline: IngestBody = serde_json::from_slice(&body)
            .map_err(|error| ApiError::bad_request(format!("invalid document body: {error}")))?;
        let kind = inline
            .content_type
            .as_deref()
            .map(documents::essence)
            .unwrap_or_else(|| "text/markdown".to_string());
        if !INLINE_TYPES.contains(&kind.as_str()) {
            return Err(ApiError::bad_request(format!(
                "content_type must be one of {} (send other types as the raw body)",
                INLINE_TYPES.join(", ")
            )));
        }
        NewUpload {
            title: inline.title.or(query.title),
            source: inline.source.or(query.source),
            content_type: kind,
            bytes: inline.content.into_bytes(),
        }
    } else {
        NewUpload {
            title: query.title,
            source: query.source,
            content_type,
            bytes: body.to_vec(),
        }
    };
    let ingested = documents::ingest(&state.memory, user.user_id, upload).await?;
    let status = match ingested.status {
        IngestStatus::Created => StatusCode::CREATED,
        IngestStatus::Unchanged | IngestStatus::Replaced => StatusCode::OK,
    };
    Ok((status, Json(ingested)))
}

#[utoipa::path(get, path = "/v1/documents", tag = "documents", params(Page<DocumentId, 500>),
    responses((status = 200, body = DocumentList), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    user: AuthUser,
    page: Page<DocumentId, 500>,
) -> ApiResult<Json<DocumentList>> {
    let documents = documents::list(&state.memory, user.user_id, page.limit, page.before).await?;
    let next_before = page.next(&documents, |document| document.id);
    Ok(Json(DocumentList {
        documents,
        next_before,
    }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct DocumentWithChunks {
    pub document: Document,
    /// The chunks local research searches and cites (`doc:<id>#<n>`), in order.
    pub chunks: Vec<DocumentChunk>,
}

#[utoipa::path(get, path = "/v1/documents/{id}", tag = "documents",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = DocumentWithChunks), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<DocumentId>,
) -> ApiResult<Json<DocumentWithChunks>> {
    let (document, chunks) = documents::get(&state.memory, user.user_id, id).await?;
    Ok(Json(DocumentWithChunks { document, chunks }))
}

#[utoipa::path(delete, path = "/v1/documents/{id}", tag = "documents",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 204, description = "The document and its chunks are deleted"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<DocumentId>,
) -> ApiResult<StatusCode> {
    documents::delete(&state.memory, user.user_id, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
