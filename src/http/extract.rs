//! Extractors whose rejections are `ApiError`s, so a malformed body, path or query answers
//! with the JSON error shape and a 4xx, never axum's plain-text rejection.

use axum::extract::{FromRequest, FromRequestParts};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// `axum::Json` with JSON errors.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Path` with JSON errors.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `axum::extract::Query` with JSON errors.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// The raw body with JSON errors (a too-large body is a JSON 413).
pub struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(request, state).await?;
        Ok(Self(bytes))
    }
}
