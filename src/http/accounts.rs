//! Accounts over HTTP: the web app's sign-in (`/v1/auth/*`: status, first-admin setup, sign-in
//! and sign-out with the `mnemo_session` cookie) and the administrators' users and keys
//! (`/v1/admin/*`).
//!
//! The cookie is `HttpOnly`, `SameSite=Strict`, `Path=/`, lasts `auth::session::SESSION_DAYS`
//! (renewed by `GET /v1/me`), and is `Secure` when the request reached the proxy over TLS
//! (`X-Forwarded-Proto: https`) — mnemo itself serves plain HTTP. Only the `AuthUser`
//! extractor reads it (and checks CSRF); these handlers only set and clear it.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiJson, ApiPath};
use crate::auth::{self, AuthUser, SignedIn, SignedInVia, keys, session};
use crate::error::ErrorKind;
use crate::store::{User, UserKind, UserUpdate};

/// What the sign-in page needs to know before anyone is signed in.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AuthStatus {
    /// No administrator and no user with a password exist yet: the first visitor creates the
    /// administrator (`POST /v1/auth/setup`).
    setup_required: bool,
    /// The server runs with `--dev`: no sign-in, every request is the local user.
    dev: bool,
}

/// Whether the server needs its first administrator, and whether it runs with `--dev`.
#[utoipa::path(get, path = "/v1/auth/status", tag = "auth",
    responses((status = 200, body = AuthStatus)))]
pub(crate) async fn status(State(state): State<AppState>) -> ApiResult<Json<AuthStatus>> {
    Ok(Json(AuthStatus {
        setup_required: state.store.accounts().setup_open().await?,
        dev: state.settings.server.dev,
    }))
}

/// A name and a password.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignInBody {
    /// 1-64 letters, digits, '.', '_', '-' or '@'.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._@-]{1,64}$")]
    name: String,
    #[schema(value_type = String, format = Password, min_length = 8, max_length = 1024)]
    password: SecretString,
}

/// Who is signed in now.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SignedInUser {
    #[schema(value_type = String, format = Uuid)]
    id: crate::store::UserId,
    name: String,
    is_admin: bool,
}

/// Creates the first administrator and signs them in (sets the session cookie). Only while
/// the server has no administrator and no user with a password; afterwards 409.
#[utoipa::path(post, path = "/v1/auth/setup", tag = "auth", request_body = SignInBody,
    responses(
        (status = 200, body = SignedInUser, description = "Created and signed in; `Set-Cookie: mnemo_session=…`"),
        (status = 400, body = ErrorBody, description = "An invalid name or a password too short or too long"),
        (status = 409, body = ErrorBody, description = "The first administrator exists already")))]
pub(crate) async fn setup(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SignInBody>,
) -> ApiResult<Response> {
    let signed_in = state.auth.set_up(&body.name, &body.password).await?;
    tracing::info!(user = %signed_in.user.user_id, "first administrator created");
    Ok(signed_in_response(&state, &headers, signed_in))
}

/// Signs in with a name and a password; sets the session cookie. After 5 failures for a name
/// sign-in is refused for 15 minutes (429 with `Retry-After`).
#[utoipa::path(post, path = "/v1/auth/login", tag = "auth", request_body = SignInBody,
    responses(
        (status = 200, body = SignedInUser, description = "Signed in; `Set-Cookie: mnemo_session=…`"),
        (status = 401, body = ErrorBody, description = "Wrong name or password, or the account is disabled"),
        (status = 429, body = ErrorBody, description = "Too many failed sign-ins for this name")))]
pub(crate) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SignInBody>,
) -> ApiResult<Response> {
    if auth::validate_user_name(&body.name).is_err() {
        return Err(auth::AuthError::WrongPassword.into());
    }
    let signed_in = state.auth.sign_in(&body.name, &body.password).await?;
    Ok(signed_in_response(&state, &headers, signed_in))
}

/// Signs out: deletes the session and clears the cookie (also when there was none).
#[utoipa::path(post, path = "/v1/auth/logout", tag = "auth",
    responses((status = 204, description = "Signed out; the cookie is cleared")))]
pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    user: Result<AuthUser, ApiError>,
) -> ApiResult<Response> {
    if let Ok(AuthUser {
        session: Some(session),
        ..
    }) = &user
    {
        state.auth.sign_out(&session.hash).await?;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(&headers, "", 0));
    Ok(response)
}

fn signed_in_response(state: &AppState, headers: &HeaderMap, signed_in: SignedIn) -> Response {
    let user = signed_in.user;
    let body = SignedInUser {
        id: user.user_id,
        is_admin: is_admin(state, &user),
        name: user.name.clone(),
    };
    let mut response = Json(body).into_response();
    if let Some(value) = renewed_cookie(headers, &user) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// The cookie carrying `user`'s session for another `SESSION_DAYS`, when they are signed in
/// by one.
pub(crate) fn renewed_cookie(headers: &HeaderMap, user: &AuthUser) -> Option<HeaderValue> {
    let session = user.session.as_ref()?;
    Some(cookie(
        headers,
        session.token.expose_secret(),
        session::SESSION_DAYS * 24 * 3600,
    ))
}

/// The `Set-Cookie` value for `token` (empty, with `max_age` 0, clears it).
fn cookie(headers: &HeaderMap, token: &str, max_age: i64) -> HeaderValue {
    let secure = if behind_tls(headers) { "; Secure" } else { "" };
    let value = format!(
        "{}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}",
        session::COOKIE_NAME
    );
    // The token is hex and the rest fixed text: always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether the browser reached us over TLS: mnemo serves plain HTTP, so only a proxy in front
/// can say so, with `X-Forwarded-Proto: https`.
fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(',').next())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// Whether the caller administers users: their admin flag, `server.admin_users`, or `--dev`'s
/// local user.
pub(crate) fn is_admin(state: &AppState, user: &AuthUser) -> bool {
    user.is_admin || user.via == SignedInVia::Dev || state.settings.server.is_admin(&user.name)
}

fn require_admin(state: &AppState, user: &AuthUser) -> ApiResult<()> {
    if is_admin(state, user) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorKind::Forbidden,
            "only an administrator may manage users",
        ))
    }
}

/// A user as an administrator sees them.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminUser {
    #[schema(value_type = String, format = Uuid)]
    id: crate::store::UserId,
    name: String,
    /// `key` (a local account), `jwt` (a verified token's subject) or `dev`.
    kind: String,
    is_admin: bool,
    /// Disabled users' sessions, keys and tokens are refused.
    disabled: bool,
    disabled_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Can sign in with a password.
    has_password: bool,
    /// Unrevoked API keys.
    active_keys: i64,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<User> for AdminUser {
    fn from(user: User) -> Self {
        Self {
            id: user.id,
            kind: user.kind.as_str().to_string(),
            is_admin: user.is_admin,
            disabled: user.disabled_at.is_some(),
            disabled_at: user.disabled_at,
            has_password: user.has_password,
            active_keys: user.active_keys,
            created_at: user.created_at,
            name: user.name,
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct AdminUserList {
    users: Vec<AdminUser>,
}

/// Every user, by name.
#[utoipa::path(get, path = "/v1/admin/users", tag = "admin",
    responses((status = 200, body = AdminUserList),
        (status = 403, body = ErrorBody, description = "The caller is not an administrator")),
    security(("bearer" = [])))]
pub(crate) async fn list_users(
    State(state): State<AppState>,
    user: AuthUser,
) -> ApiResult<Json<AdminUserList>> {
    require_admin(&state, &user)?;
    let users = state.store.accounts().list_users().await?;
    Ok(Json(AdminUserList {
        users: users.into_iter().map(AdminUser::from).collect(),
    }))
}

/// A new account.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewUserBody {
    /// 1-64 letters, digits, '.', '_', '-' or '@'.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._@-]{1,64}$")]
    name: String,
    /// Leave out for an account that signs in only with API keys.
    #[schema(value_type = Option<String>, format = Password, min_length = 8, max_length = 1024)]
    password: Option<SecretString>,
    #[serde(default)]
    is_admin: bool,
}

/// Creates a user (409 when the name is taken).
#[utoipa::path(post, path = "/v1/admin/users", tag = "admin", request_body = NewUserBody,
    responses((status = 201, body = AdminUser),
        (status = 403, body = ErrorBody, description = "The caller is not an administrator"),
        (status = 409, body = ErrorBody, description = "A user with this name exists")),
    security(("bearer" = [])))]
pub(crate) async fn create_user(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<NewUserBody>,
) -> ApiResult<(StatusCode, Json<AdminUser>)> {
    require_admin(&state, &user)?;
    let created = auth::create_account(
        state.store.as_ref(),
        &body.name,
        body.password.as_ref(),
        body.is_admin,
    )
    .await?;
    tracing::info!(admin = %user.user_id, user = %created.id, "user created");
    Ok((StatusCode::CREATED, Json(created.into())))
}

/// What an administrator changes about a user; absent fields stay as they are.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserPatch {
    /// Disabling ends the user's sessions and refuses their keys and tokens at once.
    disabled: Option<bool>,
    is_admin: Option<bool>,
    /// A new password (ends the lock after failed sign-ins).
    #[schema(value_type = Option<String>, format = Password, min_length = 8, max_length = 1024)]
    password: Option<SecretString>,
}

/// Disables or enables a user, makes them an administrator or not, or sets their password.
/// An administrator cannot disable themselves or take their own admin flag.
#[utoipa::path(patch, path = "/v1/admin/users/{id}", tag = "admin",
    params(("id" = String, Path, format = Uuid)), request_body = UserPatch,
    responses((status = 200, body = AdminUser),
        (status = 403, body = ErrorBody, description = "The caller is not an administrator"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn update_user(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<uuid::Uuid>,
    ApiJson(body): ApiJson<UserPatch>,
) -> ApiResult<Json<AdminUser>> {
    require_admin(&state, &user)?;
    let target = find_user(&state, id).await?;
    if target.id == user.user_id && (body.disabled == Some(true) || body.is_admin == Some(false)) {
        return Err(ApiError::bad_request(
            "you cannot disable yourself or take your own admin rights; ask another administrator",
        ));
    }
    let password_hash = match &body.password {
        Some(password) => {
            auth::validate_new_password(password)?;
            Some(
                auth::password::hash(password)
                    .await
                    .map_err(auth::AuthError::from)?,
            )
        }
        None => None,
    };
    let updated = state
        .store
        .accounts()
        .update_user(
            target.id,
            UserUpdate {
                disabled: body.disabled,
                is_admin: body.is_admin,
                password_hash,
            },
        )
        .await?;
    tracing::info!(admin = %user.user_id, user = %updated.id, "user changed");
    Ok(Json(updated.into()))
}

/// A new API key, shown this once.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct IssuedKey {
    /// The key: send it as `Authorization: Bearer <key>`. It cannot be shown again.
    key: String,
    /// Its first characters, as key lists show them.
    prefix: String,
}

/// Issues an API key for the user (their other keys keep working).
#[utoipa::path(post, path = "/v1/admin/users/{id}/keys", tag = "admin",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 201, body = IssuedKey),
        (status = 403, body = ErrorBody, description = "The caller is not an administrator"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn issue_key(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<uuid::Uuid>,
) -> ApiResult<(StatusCode, Json<IssuedKey>)> {
    require_admin(&state, &user)?;
    let target = find_user(&state, id).await?;
    if target.kind != UserKind::Key {
        return Err(ApiError::bad_request(
            "keys are issued only to local accounts, not to JWT or dev users",
        ));
    }
    let key = keys::generate();
    state
        .store
        .accounts()
        .add_api_key(target.id, &key.hash, &key.prefix)
        .await?;
    tracing::info!(admin = %user.user_id, user = %target.id, "API key issued");
    Ok((
        StatusCode::CREATED,
        Json(IssuedKey {
            key: key.plaintext,
            prefix: key.prefix,
        }),
    ))
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RevokedKeys {
    /// How many keys were revoked.
    revoked: u64,
}

/// Revokes every API key of the user (they stop working at once).
#[utoipa::path(delete, path = "/v1/admin/users/{id}/keys", tag = "admin",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = RevokedKeys),
        (status = 403, body = ErrorBody, description = "The caller is not an administrator"),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn revoke_keys(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<uuid::Uuid>,
) -> ApiResult<Json<RevokedKeys>> {
    require_admin(&state, &user)?;
    let target = find_user(&state, id).await?;
    let revoked = state.store.accounts().revoke_keys(&target.name).await?;
    tracing::info!(admin = %user.user_id, user = %target.id, revoked, "API keys revoked");
    Ok(Json(RevokedKeys { revoked }))
}

async fn find_user(state: &AppState, id: uuid::Uuid) -> ApiResult<User> {
    state
        .store
        .accounts()
        .user_by_id(id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such user"))
}
