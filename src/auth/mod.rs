//! Authentication: API keys and JWT bearer tokens. `Authenticator` turns an `Authorization`
//! header into an `AuthUser`; the HTTP extractor of that type (in `http::extract`) is the only
//! way a request handler obtains a `UserId`. No body, query or header field other than
//! `Authorization` is ever taken as identity.

pub mod jwt;
pub mod keys;

use std::sync::Arc;

use crate::error::{ErrorKind, HasKind};
use crate::store::{Store, StoreError, User, UserId, UserKind};
use jwt::JwtVerifier;

/// Name of the single local user served by `--dev`.
pub const DEV_USER: &str = "dev";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token: send Authorization: Bearer <api key or jwt>")]
    Missing,
    #[error("invalid or expired credentials")]
    Invalid,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for AuthError {
    fn kind(&self) -> ErrorKind {
        match self {
            AuthError::Missing | AuthError::Invalid => ErrorKind::Unauthenticated,
            AuthError::Store(error) => match error.kind() {
                kind @ (ErrorKind::Unavailable | ErrorKind::Busy) => kind,
                _ => ErrorKind::Internal,
            },
        }
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct AuthUser {
    pub user_id: UserId,
    pub name: String,
}

impl From<User> for AuthUser {
    fn from(user: User) -> Self {
        Self {
            user_id: user.id,
            name: user.name,
        }
    }
}

/// Turns an `Authorization` header into a user.
pub struct Authenticator {
    store: Arc<dyn Store>,
    jwt: Option<JwtVerifier>,
    dev_user: Option<User>,
}

impl Authenticator {
    pub fn new(store: Arc<dyn Store>, jwt: Option<JwtVerifier>, dev_user: Option<User>) -> Self {
        Self {
            store,
            jwt,
            dev_user,
        }
    }

    pub fn jwt_enabled(&self) -> bool {
        self.jwt.is_some()
    }

    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<AuthUser, AuthError> {
        let Some(header) = authorization else {
            return match &self.dev_user {
                Some(user) => Ok(user.clone().into()),
                None => Err(AuthError::Missing),
            };
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(AuthError::Invalid)?;
        if keys::looks_like_key(token) {
            let user = self
                .store
                .accounts()
                .user_by_key_hash(&keys::hash(token))
                .await?
                .ok_or(AuthError::Invalid)?;
            return Ok(user.into());
        }
        let verifier = self.jwt.as_ref().ok_or(AuthError::Invalid)?;
        let claims = verifier.verify(token).map_err(|_| AuthError::Invalid)?;
        let name = format!("jwt|{}|{}", claims.iss, claims.sub);
        let user = self
            .store
            .accounts()
            .ensure_user(&name, UserKind::Jwt)
            .await?;
        Ok(user.into())
    }
}

/// Valid user names for `mnemo user add`: 1–64 of letters, digits, `.`, `_`, `-`, `@`.
pub fn validate_user_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if valid && name != DEV_USER {
        Ok(())
    } else {
        Err(format!(
            "invalid user name {name:?}: use 1-64 letters, digits, '.', '_', '-' or '@' (and not {DEV_USER:?})"
        ))
    }
}
