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
    #[error("no user named {0} (create one with `mnemo user add {0}`)")]
    UnknownLocalUser(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for AuthError {
    fn kind(&self) -> ErrorKind {
        match self {
            AuthError::Missing | AuthError::Invalid | AuthError::UnknownLocalUser(_) => {
                ErrorKind::Unauthenticated
            }
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

/// How a local credential starts: `mnemo-local.<secret>.<user name>`.
const LOCAL_PREFIX: &str = "mnemo-local.";

/// Turns an `Authorization` header into a user.
pub struct Authenticator {
    store: Arc<dyn Store>,
    jwt: Option<JwtVerifier>,
    dev_user: Option<User>,
    /// This process's local secret: a bearer `mnemo-local.<secret>.<name>` acts as `name`.
    /// It is made at start, kept in memory and in the data directory's owner-only lock file
    /// (for CLI commands of the same account), and dies with the process.
    local_secret: String,
}

impl Authenticator {
    pub fn new(store: Arc<dyn Store>, jwt: Option<JwtVerifier>, dev_user: Option<User>) -> Self {
        let mut bytes = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        Self {
            store,
            jwt,
            dev_user,
            local_secret: hex::encode(bytes),
        }
    }

    /// The local secret, to publish in the data directory's lock file.
    pub fn local_secret(&self) -> &str {
        &self.local_secret
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
        if let Some(rest) = token.strip_prefix(LOCAL_PREFIX) {
            return self.local_user(rest).await;
        }
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

impl Authenticator {
    /// A local credential `<secret>.<name>`: the secret must be this process's; the local dev
    /// user is made on first use, any other name must exist.
    async fn local_user(&self, rest: &str) -> Result<AuthUser, AuthError> {
        use subtle::ConstantTimeEq as _;
        let (secret, name) = rest.split_once('.').ok_or(AuthError::Invalid)?;
        if !bool::from(secret.as_bytes().ct_eq(self.local_secret.as_bytes())) {
            return Err(AuthError::Invalid);
        }
        if name != DEV_USER && validate_user_name(name).is_err() {
            return Err(AuthError::Invalid);
        }
        let user = local_user(self.store.as_ref(), name)
            .await?
            .ok_or_else(|| AuthError::UnknownLocalUser(name.to_string()))?;
        Ok(user.into())
    }
}

/// The user a local command (the CLI embedded, or through the local credential) acts as: the
/// local dev user is made on first use; any other name must exist (`None` when it does not).
pub async fn local_user(store: &dyn Store, name: &str) -> Result<Option<User>, StoreError> {
    if name == DEV_USER {
        return Ok(Some(
            store
                .accounts()
                .ensure_user(DEV_USER, UserKind::Dev)
                .await?,
        ));
    }
    store.accounts().user_by_name(name).await
}

/// The bearer token a CLI command sends to a server on its own data directory to act as
/// `user`, given the secret the server left in the lock file.
pub fn local_credential(secret: &str, user: &str) -> String {
    format!("{LOCAL_PREFIX}{secret}.{user}")
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
