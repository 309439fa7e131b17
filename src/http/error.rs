//! `ApiError`, the only `IntoResponse` error: `{"error": {"code", "message"}}` with a status
//! chosen from the error's kind. 5xx bodies never carry the internal message; it is logged here,
//! once.

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::auth::AuthError;
use crate::store::{ErrorKind, StoreError};

#[derive(Debug)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable: bad_request, unauthenticated, not_found, conflict, payload_too_large,
    /// rate_limited, timeout, unavailable, internal.
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self.kind {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let code = self.code();
        let message = if status.is_server_error() {
            tracing::error!(code, cause = %self.message, "request failed");
            match self.kind {
                ErrorKind::Unavailable => "a backend is unavailable, try again later".to_string(),
                ErrorKind::Timeout => "the request timed out".to_string(),
                _ => "internal error".to_string(),
            }
        } else {
            self.message
        };
        let body = ErrorBody {
            error: ErrorDetail { code, message },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        Self::new(error.kind(), error.to_string())
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        Self::new(error.kind(), error.to_string())
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

pub type ApiResult<T> = Result<T, ApiError>;
