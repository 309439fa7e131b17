//! `ApiError`, the only `IntoResponse` error: `{"error": {"code", "message"}}` with a status
//! chosen from the error's kind. 5xx bodies never carry the internal message. The error keeps
//! its source; the response carries the cause chain in an extension, and the `log_errors`
//! middleware logs it once, with the request's method and route.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub(crate) use crate::error::{ErrorKind, HasKind};

type Source = Arc<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub(crate) struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    source: Option<Source>,
    /// Seconds for `Retry-After` on a 429 (5 when unset).
    retry_after: Option<u64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
}

/// One error shape for the whole API, which is also OpenAI's (`message`, `type`, `param`,
/// `code`), so the OpenAI SDKs report mnemo's errors as their own.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// Machine-readable: bad_request, unauthenticated, forbidden, not_found, method_not_allowed, conflict,
    /// payload_too_large, rate_limited, timeout, unavailable, internal.
    pub code: &'static str,
    pub message: String,
    /// The OpenAI error class: invalid_request_error, authentication_error, not_found_error,
    /// rate_limit_error or server_error.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    pub error_type: &'static str,
    /// The request field at fault (OpenAI's shape); null.
    pub param: Option<String>,
}

/// The OpenAI error class of a kind.
fn openai_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Unauthenticated => "authentication_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::RateLimited | ErrorKind::Busy => "rate_limit_error",
        ErrorKind::Timeout
        | ErrorKind::Unavailable
        | ErrorKind::Unsupported
        | ErrorKind::Internal => "server_error",
        ErrorKind::Forbidden => "permission_error",
        ErrorKind::BadRequest
        | ErrorKind::MethodNotAllowed
        | ErrorKind::Conflict
        | ErrorKind::PayloadTooLarge => "invalid_request_error",
    }
}

/// The cause chain of a failed request, carried from the response to `log_errors`.
#[derive(Clone)]
struct FailureReport {
    code: &'static str,
    cause: String,
}

impl ApiError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            retry_after: None,
        }
    }

    /// Tells a rate-limited client when to try again.
    #[must_use]
    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// An error of `error`'s own kind with its message, keeping it as the source.
    pub(crate) fn from_error<E>(error: E) -> Self
    where
        E: HasKind + std::error::Error + Send + Sync + 'static,
    {
        Self {
            kind: error.kind(),
            message: error.to_string(),
            retry_after: error.retry_after(),
            source: Some(Arc::new(error)),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub(crate) fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimited | ErrorKind::Busy => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        }
    }

    pub(crate) fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// The message and every source below it, for the log.
    fn cause_chain(&self) -> String {
        let mut chain = self.message.clone();
        let mut next: Option<&(dyn std::error::Error + 'static)> =
            self.source.as_deref().and_then(|source| source.source());
        while let Some(error) = next {
            chain.push_str(": ");
            chain.push_str(&error.to_string());
            next = error.source();
        }
        chain
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let code = self.code();
        let retry_after = self.retry_after;
        let report = status.is_server_error().then(|| FailureReport {
            code,
            cause: self.cause_chain(),
        });
        // What this server lacks is said as it is: it names no secret, and the operator
        // needs it.
        let message = if status.is_server_error() && self.kind != ErrorKind::Unsupported {
            // Every 5xx kind has a fixed text (the cause is logged by `log_errors`).
            let kind = match self.kind {
                ErrorKind::Unavailable | ErrorKind::Timeout => self.kind,
                _ => ErrorKind::Internal,
            };
            kind.public_message(&self.message)
        } else if self.kind == ErrorKind::Busy {
            self.kind.public_message(&self.message)
        } else {
            self.message
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code,
                message,
                error_type: openai_type(self.kind),
                param: None,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after.unwrap_or(match self.kind {
                    ErrorKind::Busy => 1,
                    _ => 5,
                })),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(report) = report {
            response.extensions_mut().insert(report);
        }
        response
    }
}

/// Middleware: logs the cause chain of every failed (5xx) request once.
pub(crate) async fn log_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_else(|| request.uri().path().to_string());
    let response = next.run(request).await;
    if let Some(report) = response.extensions().get::<FailureReport>() {
        tracing::error!(%method, route, code = report.code, cause = %report.cause, "request failed");
    }
    response
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        Self::from_error(error)
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(error: crate::auth::AuthError) -> Self {
        Self::from_error(error)
    }
}

impl From<crate::memory::MemoryError> for ApiError {
    fn from(error: crate::memory::MemoryError) -> Self {
        Self::from_error(error)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let kind = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorKind::PayloadTooLarge
        } else {
            ErrorKind::BadRequest
        };
        let message = match &rejection {
            JsonRejection::MissingJsonContentType(_) => {
                "expected a JSON body with content-type: application/json".to_string()
            }
            _ if kind == ErrorKind::PayloadTooLarge => "request body too large".to_string(),
            _ => rejection.body_text(),
        };
        Self::new(kind, message)
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(ErrorKind::PayloadTooLarge, "request body too large")
        } else {
            Self::bad_request(rejection.body_text())
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;
