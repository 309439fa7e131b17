//! Extractors whose rejections are `ApiError`s, so a malformed body, path or query answers
//! with the JSON error shape and a 4xx, never axum's plain-text rejection.

use axum::extract::{FromRequest, FromRequestParts};
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use axum::extract::FromRef;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::error::ApiError;
use crate::auth::{AuthError, AuthUser, Authenticator, Credentials};

/// `axum::Json` with JSON errors, refusing text that holds a NUL character.
pub(crate) struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(request.headers()) {
            return Err(ApiError::bad_request(
                "expected a JSON body with content-type: application/json",
            ));
        }
        let ApiBytes(bytes) = ApiBytes::from_request(request, state).await?;
        reject_nul(&bytes)?;
        let axum::Json(value) = axum::Json::<T>::from_bytes(&bytes)?;
        Ok(Self(value))
    }
}

/// `application/json` or `application/…+json`.
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"))
}

/// Text anywhere in the API must not hold NUL: PostgreSQL cannot store it, and one rule holds
/// for both backends. Refuses a JSON (or JSON lines) body with a `\u0000` escape or a raw NUL
/// byte.
pub(crate) fn reject_nul(json: &[u8]) -> Result<(), ApiError> {
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'\\' => {
                if json.get(i + 1) == Some(&b'u') && json.get(i + 2..i + 6) == Some(b"0000") {
                    return Err(nul_error());
                }
                // Whatever is escaped is skipped, so `\\u0000` is a backslash and text.
                i += 2;
            }
            0 => return Err(nul_error()),
            _ => i += 1,
        }
    }
    Ok(())
}

fn nul_error() -> ApiError {
    ApiError::bad_request("text must not contain NUL characters (\\u0000)")
}

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Path` with JSON errors.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub(crate) struct ApiPath<T>(pub T);

/// `axum::extract::Query` with JSON errors, refusing an encoded NUL (`%00`).
pub(crate) struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if parts.uri.query().is_some_and(|query| query.contains("%00")) {
            return Err(nul_error());
        }
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// The raw body with JSON errors (a too-large body is a JSON 413).
pub(crate) struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(request, state).await?;
        Ok(Self(bytes))
    }
}

use super::limits::InFlightSlot;

/// The authenticated caller: the only way a handler gets a `UserId`.
impl<S> FromRequestParts<S> for AuthUser
where
    S: Send + Sync,
    Arc<Authenticator>: FromRef<S>,
    Arc<super::limits::UserRateLimit>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let authenticator = Arc::<Authenticator>::from_ref(state);
        let header = match parts.headers.get(AUTHORIZATION) {
            Some(value) => Some(
                value
                    .to_str()
                    .map_err(|_| ApiError::from(AuthError::Invalid))?,
            ),
            None => None,
        };
        let session = session_token(&parts.headers);
        if header.is_none() && session.is_some() {
            csrf_check(&parts.method, &parts.headers)?;
        }
        let user = authenticator
            .authenticate_request(Credentials {
                authorization: header,
                session,
            })
            .await?;
        // The body holds the slot: a request is counted until its body has been read.
        let slot = parts.extensions.get::<InFlightSlot>().cloned();
        if slot.as_ref().is_some_and(InFlightSlot::is_filled) {
            // Counted already (the request was authenticated once on its way in).
            return Ok(user);
        }
        let limits = Arc::<super::limits::UserRateLimit>::from_ref(state);
        if let Err(wait) = limits.check(user.user_id) {
            let seconds = wait.as_secs() + 1;
            return Err(ApiError::new(
                crate::error::ErrorKind::RateLimited,
                format!("too many requests; try again in {seconds} s"),
            )
            .retry_after(seconds));
        }
        let in_flight = limits.enter(user.user_id).ok_or_else(|| {
            ApiError::new(
                crate::error::ErrorKind::RateLimited,
                "too many requests in progress for this user (server.max_requests_per_user)",
            )
            .retry_after(1)
        })?;
        if let Some(slot) = slot {
            slot.fill(in_flight);
        }
        Ok(user)
    }
}

/// The header a request authenticated by the session cookie must carry when it writes.
/// A cross-site form cannot send it, and a cross-site script cannot without a CORS preflight
/// the server never grants.
pub(crate) const CSRF_HEADER: &str = "x-mnemo-csrf";

/// The session cookie's token, if the request carries one.
fn session_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    crate::auth::session::token_from_cookies(
        headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()),
    )
}

/// A cookie-authenticated request that writes (not GET, HEAD, OPTIONS) must carry [`CSRF_HEADER`] and, when
/// the browser sent an `Origin`, come from this server's own origin (its host and port equal
/// to the `Host`, or to the proxy's `X-Forwarded-Host`). Bearer requests are not checked:
/// a browser never adds a bearer token by itself.
fn csrf_check(
    method: &axum::http::Method,
    headers: &axum::http::HeaderMap,
) -> Result<(), ApiError> {
    use axum::http::Method;
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let forbidden = |message: &str| ApiError::new(crate::error::ErrorKind::Forbidden, message);
    if !headers.contains_key(CSRF_HEADER) {
        return Err(forbidden(
            "a request signed in by the session cookie must send the X-Mnemo-CSRF header",
        ));
    }
    let Some(origin) = headers.get(axum::http::header::ORIGIN) else {
        return Ok(());
    };
    let origin_authority = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.parse::<axum::http::Uri>().ok())
        .and_then(|uri| {
            uri.authority()
                .map(|authority| authority.as_str().to_ascii_lowercase())
        });
    let hosts = [axum::http::header::HOST.as_str(), "x-forwarded-host"]
        .into_iter()
        .filter_map(|name| headers.get(name)?.to_str().ok())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>();
    match origin_authority {
        Some(authority) if hosts.contains(&authority) => Ok(()),
        _ => Err(forbidden(
            "the request's Origin is not this server: sign-in cookies work only from its own pages",
        )),
    }
}

/// A page of a list: `?limit=` (1–`MAX`, default 50) and the cursor `?before=` (the
/// `next_before` of the previous page). Out-of-range limits answer 400.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page<Id, const MAX: i64> {
    pub limit: i64,
    pub before: Option<Id>,
}

#[derive(serde::Deserialize)]
struct PageQuery<Id> {
    limit: Option<i64>,
    before: Option<Id>,
}

impl<S, Id, const MAX: i64> FromRequestParts<S> for Page<Id, MAX>
where
    S: Send + Sync,
    Id: serde::de::DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(query) =
            axum::extract::Query::<PageQuery<Id>>::from_request_parts(parts, state).await?;
        Ok(Self {
            limit: page_limit(query.limit, MAX)?,
            before: query.before,
        })
    }
}

/// A list's page size: 1–`max`, default 50.
pub(crate) fn page_limit(limit: Option<i64>, max: i64) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(50);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::bad_request(format!(
            "limit must be between 1 and {max}"
        )))
    }
}

impl<Id, const MAX: i64> Page<Id, MAX> {
    /// The cursor of the next page: the last item's id when this page is full.
    pub(crate) fn next<T>(&self, items: &[T], id: impl Fn(&T) -> Id) -> Option<Id> {
        (items.len() as i64 == self.limit)
            .then(|| items.last().map(id))
            .flatten()
    }
}

impl<Id, const MAX: i64> utoipa::IntoParams for Page<Id, MAX> {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        vec![
            ParameterBuilder::new()
                .name("limit")
                .parameter_in(ParameterIn::Query)
                .description(Some(format!("Page size, 1–{MAX} (default 50).")))
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1))
                        .maximum(Some(MAX)),
                ))
                .build(),
            ParameterBuilder::new()
                .name("before")
                .parameter_in(ParameterIn::Query)
                .description(Some("Cursor: the `next_before` of the previous page."))
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid))),
                ))
                .build(),
        ]
    }
}
