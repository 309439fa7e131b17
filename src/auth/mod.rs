//! Authentication: API keys and JWT bearer tokens, the per-process local credential, and the
//! web app's name-and-password sign-in with its session cookie. `Authenticator` turns an
//! `Authorization` header, or else the session cookie, into an `AuthUser`; the HTTP extractor
//! of that type (in `http::extract`, which also checks a cookie request against CSRF) is the
//! only way a request handler obtains a `UserId`. No body, query or header field other than
//! `Authorization` and the session cookie is ever taken as identity. A disabled user's
//! credentials of every kind are refused.

pub(crate) mod jwt;
pub mod keys;
pub mod password;
pub mod session;

use std::sync::Arc;

use secrecy::SecretString;

use crate::error::{ErrorKind, HasKind};
use crate::store::{NewAccount, Store, StoreError, User, UserId, UserKind};
use jwt::JwtVerifier;

/// Failed sign-ins for a name after which sign-in is refused for `LOCKOUT_MINUTES`.
pub(crate) const MAX_FAILED_SIGN_INS: i64 = 5;
pub(crate) const LOCKOUT_MINUTES: i64 = 15;

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
    #[error("your session has ended; sign in again")]
    SessionEnded,
    #[error("wrong name or password")]
    WrongPassword,
    #[error("this account is disabled; ask an administrator")]
    Disabled,
    #[error("too many failed sign-ins for this name; try again in {minutes} minute(s)")]
    Locked { minutes: i64 },
    #[error("{0}")]
    BadInput(String),
    #[error("the first administrator exists already; sign in instead")]
    SetupClosed,
    #[error(transparent)]
    Password(#[from] password::PasswordError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for AuthError {
    /// Seconds until a locked name may sign in again.
    fn retry_after(&self) -> Option<u64> {
        match self {
            AuthError::Locked { minutes } => Some((*minutes).max(1) as u64 * 60),
            _ => None,
        }
    }

    fn kind(&self) -> ErrorKind {
        match self {
            AuthError::Missing
            | AuthError::Invalid
            | AuthError::UnknownLocalUser(_)
            | AuthError::SessionEnded
            | AuthError::WrongPassword
            | AuthError::Disabled => ErrorKind::Unauthenticated,
            AuthError::Locked { .. } => ErrorKind::RateLimited,
            AuthError::BadInput(_) => ErrorKind::BadRequest,
            AuthError::SetupClosed => ErrorKind::Conflict,
            AuthError::Password(_) => ErrorKind::Internal,
            AuthError::Store(StoreError::Conflict(_)) => ErrorKind::Conflict,
            AuthError::Store(error) => match error.kind() {
                kind @ (ErrorKind::Unavailable | ErrorKind::Busy) => kind,
                _ => ErrorKind::Internal,
            },
        }
    }
}

/// How the caller of a request signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SignedInVia {
    /// The web app's session cookie (name and password).
    Session,
    /// An API key (`Authorization: Bearer mnemo_…`).
    ApiKey,
    /// A JWT from the configured issuer.
    Jwt,
    /// The CLI's per-process local credential.
    Local,
    /// `--dev`: no sign-in, the local user.
    Dev,
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub(crate) struct AuthUser {
    pub user_id: UserId,
    pub name: String,
    /// The user's admin flag (`server.admin_users` and `--dev` are added by the HTTP layer).
    pub is_admin: bool,
    pub via: SignedInVia,
    /// With `via == Session`: the session's token (for renewing the cookie) and its stored
    /// hash (what sign-out deletes).
    pub session: Option<SessionToken>,
}

/// A browser session's token and its stored hash.
#[derive(Debug, Clone)]
pub(crate) struct SessionToken {
    pub token: SecretString,
    pub hash: String,
}

impl AuthUser {
    fn new(user: User, via: SignedInVia) -> Self {
        Self {
            user_id: user.id,
            name: user.name,
            is_admin: user.is_admin,
            via,
            session: None,
        }
    }
}

/// A request's credentials: its `Authorization` header and its session cookie's token.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Credentials<'a> {
    pub authorization: Option<&'a str>,
    pub session: Option<&'a str>,
}

/// A sign-in that succeeded: the user, whose `session` holds the new token for the cookie.
pub(crate) struct SignedIn {
    pub user: AuthUser,
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
    pub(crate) fn new(
        store: Arc<dyn Store>,
        jwt: Option<JwtVerifier>,
        dev_user: Option<User>,
    ) -> Self {
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

    pub(crate) fn jwt_enabled(&self) -> bool {
        self.jwt.is_some()
    }

    /// The user behind an `Authorization` header (the local user in `--dev` without one).
    pub(crate) async fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<AuthUser, AuthError> {
        self.authenticate_request(Credentials {
            authorization,
            session: None,
        })
        .await
    }

    /// The user behind a request's credentials: `Authorization` first, else the session
    /// cookie, else (in `--dev`) the local user. A disabled user is refused.
    pub(crate) async fn authenticate_request(
        &self,
        credentials: Credentials<'_>,
    ) -> Result<AuthUser, AuthError> {
        let user = match (credentials.authorization, credentials.session) {
            (Some(header), _) => self.bearer(header).await?,
            (None, Some(token)) => match self.session(token).await {
                Ok(user) => user,
                Err(AuthError::SessionEnded) if self.dev_user.is_some() => self.dev()?,
                Err(error) => return Err(error),
            },
            (None, None) => self.dev()?,
        };
        Ok(user)
    }

    fn dev(&self) -> Result<AuthUser, AuthError> {
        match &self.dev_user {
            Some(user) => Ok(AuthUser::new(user.clone(), SignedInVia::Dev)),
            None => Err(AuthError::Missing),
        }
    }

    async fn session(&self, token: &str) -> Result<AuthUser, AuthError> {
        if !session::looks_like_token(token) {
            return Err(AuthError::SessionEnded);
        }
        let hash = session::hash(token);
        let now = crate::store::now();
        let found = self
            .store
            .accounts()
            .session_user(&hash, now)
            .await?
            .ok_or(AuthError::SessionEnded)?;
        if session::needs_touch(found.last_seen_at, now) {
            self.store
                .accounts()
                .touch_session(&hash, now, session::expiry(now))
                .await?;
        }
        let mut user = AuthUser::new(found.user, SignedInVia::Session);
        user.session = Some(SessionToken {
            token: SecretString::from(token),
            hash,
        });
        Ok(user)
    }

    async fn bearer(&self, header: &str) -> Result<AuthUser, AuthError> {
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
            return enabled(user, SignedInVia::ApiKey);
        }
        let verifier = self.jwt.as_ref().ok_or(AuthError::Invalid)?;
        let claims = verifier.verify(token).map_err(|_| AuthError::Invalid)?;
        let name = format!("jwt|{}|{}", claims.iss, claims.sub);
        let user = self
            .store
            .accounts()
            .ensure_user(&name, UserKind::Jwt)
            .await?;
        enabled(user, SignedInVia::Jwt)
    }

    /// Signs `name` in with `password`: a new session, or why not. After
    /// `MAX_FAILED_SIGN_INS` failures the name is locked for `LOCKOUT_MINUTES`; an unknown
    /// name costs the same hash verification as a known one.
    pub(crate) async fn sign_in(
        &self,
        name: &str,
        password: &SecretString,
    ) -> Result<SignedIn, AuthError> {
        let accounts = self.store.accounts();
        let found = accounts.password_login(name).await?;
        let now = crate::store::now();
        if let Some(until) = found.as_ref().and_then(|login| login.locked_until)
            && until > now
        {
            let minutes = ((until - now).num_seconds() + 59) / 60;
            return Err(AuthError::Locked { minutes });
        }
        let hash = found
            .as_ref()
            .and_then(|login| login.password_hash.as_deref());
        let matched = password::verify(password, hash).await;
        let Some(login) = found else {
            return Err(AuthError::WrongPassword);
        };
        if !matched {
            let failures = accounts.count_failed_login(login.user.id).await?;
            if failures >= MAX_FAILED_SIGN_INS {
                let until = now + chrono::Duration::minutes(LOCKOUT_MINUTES);
                accounts.lock_login(login.user.id, until).await?;
                tracing::warn!(user = %login.user.id, "sign-in locked after repeated failures");
                return Err(AuthError::Locked {
                    minutes: LOCKOUT_MINUTES,
                });
            }
            return Err(AuthError::WrongPassword);
        }
        if login.user.disabled_at.is_some() {
            return Err(AuthError::Disabled);
        }
        accounts.clear_failed_logins(login.user.id).await?;
        self.start_session(login.user).await
    }

    /// Makes the first administrator, while the server has neither an administrator nor a
    /// user with a password, and signs them in.
    pub(crate) async fn set_up(
        &self,
        name: &str,
        password: &SecretString,
    ) -> Result<SignedIn, AuthError> {
        validate_user_name(name).map_err(AuthError::BadInput)?;
        validate_new_password(password)?;
        if !self.store.accounts().setup_open().await? {
            return Err(AuthError::SetupClosed);
        }
        let hash = password::hash(password).await?;
        let user = self
            .store
            .accounts()
            .create_first_admin(name, &hash)
            .await
            .map_err(|error| match error {
                StoreError::Conflict(message) if message.contains("already exists") => {
                    AuthError::Store(StoreError::Conflict(message))
                }
                StoreError::Conflict(_) => AuthError::SetupClosed,
                other => other.into(),
            })?;
        self.start_session(user).await
    }

    /// Ends the session with this token hash (sign-out).
    pub(crate) async fn sign_out(&self, session_hash: &str) -> Result<(), AuthError> {
        self.store.accounts().delete_session(session_hash).await?;
        Ok(())
    }

    async fn start_session(&self, user: User) -> Result<SignedIn, AuthError> {
        let now = crate::store::now();
        let new = session::generate(now);
        let accounts = self.store.accounts();
        accounts
            .create_session(user.id, &new.hash, new.expires_at)
            .await?;
        if let Err(error) = accounts.delete_expired_sessions(now).await {
            tracing::debug!(%error, "deleting expired sessions failed");
        }
        let mut signed_in = AuthUser::new(user, SignedInVia::Session);
        signed_in.session = Some(SessionToken {
            token: SecretString::from(new.token),
            hash: new.hash,
        });
        Ok(SignedIn { user: signed_in })
    }
}

/// A user's credential stands only while the user is not disabled.
fn enabled(user: User, via: SignedInVia) -> Result<AuthUser, AuthError> {
    if user.disabled_at.is_some() {
        return Err(AuthError::Disabled);
    }
    Ok(AuthUser::new(user, via))
}

/// A new password's checks, as an `AuthError`.
pub fn validate_new_password(password: &SecretString) -> Result<(), AuthError> {
    password::validate_password(secrecy::ExposeSecret::expose_secret(password))
        .map_err(AuthError::BadInput)
}

/// Creates a local account with a password (an administrator's, or `mnemo user add`'s).
pub async fn create_account(
    store: &dyn Store,
    name: &str,
    password: Option<&SecretString>,
    is_admin: bool,
) -> Result<User, AuthError> {
    validate_user_name(name).map_err(AuthError::BadInput)?;
    let hash = match password {
        Some(password) => {
            validate_new_password(password)?;
            Some(password::hash(password).await?)
        }
        None => None,
    };
    Ok(store
        .accounts()
        .create_account(NewAccount {
            name,
            password_hash: hash.as_deref(),
            is_admin,
        })
        .await?)
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
        enabled(user, SignedInVia::Local)
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
