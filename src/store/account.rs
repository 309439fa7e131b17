//! Accounts as the SQL store sees them: a user's password hash (an argon2id PHC string made by
//! `auth::password`; the store never sees a password), the admin flag, the disabled mark, the
//! failed sign-ins that lock a name, and browser sessions, kept by the sha256 of their token.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{StoreResult, User, UserId};

/// What a sign-in by name needs to decide: the user, their password hash and lock.
#[derive(Debug, Clone)]
pub struct PasswordLogin {
    pub user: User,
    /// `None` for a user without a password (API keys only).
    pub password_hash: Option<String>,
    /// Until when sign-in is refused after repeated failures.
    pub locked_until: Option<DateTime<Utc>>,
}

/// A browser session found by its token's hash.
#[derive(Debug, Clone)]
pub struct SessionUser {
    pub user: User,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What an administrator changes about a user; `None` leaves it as it is.
#[derive(Debug, Clone, Default)]
pub struct UserUpdate {
    /// Disables (sessions deleted, keys refused) or enables the user.
    pub disabled: Option<bool>,
    pub is_admin: Option<bool>,
    /// A new argon2id PHC string.
    pub password_hash: Option<String>,
}

/// A new account with a password.
#[derive(Debug, Clone)]
pub struct NewAccount<'a> {
    pub name: &'a str,
    pub password_hash: Option<&'a str>,
    pub is_admin: bool,
}

/// Users' passwords, admin flags and sessions (the rest of `Accounts`).
#[async_trait]
pub(in crate::store) trait AccountStore: Send + Sync + 'static {
    /// Creates a local account (`Conflict` when the name is taken).
    async fn create_account(&self, account: NewAccount<'_>) -> StoreResult<User>;
    /// Creates the first administrator, only while no administrator and no user with a
    /// password exist, and only once (`Conflict` otherwise).
    async fn create_first_admin(&self, name: &str, password_hash: &str) -> StoreResult<User>;
    /// Whether the first administrator can still be made from the browser.
    async fn setup_open(&self) -> StoreResult<bool>;
    async fn user_by_id(&self, id: uuid::Uuid) -> StoreResult<Option<User>>;
    async fn password_login(&self, name: &str) -> StoreResult<Option<PasswordLogin>>;
    /// Counts a failed sign-in; the count since the last success or lock.
    async fn count_failed_login(&self, user: UserId) -> StoreResult<i64>;
    /// Refuses sign-in until `until` and starts counting failures again.
    async fn lock_login(&self, user: UserId, until: DateTime<Utc>) -> StoreResult<()>;
    /// A successful sign-in: the failures and any lock are forgotten.
    async fn clear_failed_logins(&self, user: UserId) -> StoreResult<()>;
    /// Changes a user; disabling deletes their sessions in the same transaction.
    async fn update_user(&self, user: UserId, update: UserUpdate) -> StoreResult<User>;
    async fn create_session(
        &self,
        user: UserId,
        token_hash: &str,
        expires_at: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// The session with this token hash, unexpired at `now`, of a user not disabled.
    async fn session_user(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<SessionUser>>;
    /// Records that the session was used at `now` and moves its expiry to `expires_at`.
    async fn touch_session(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// Deletes the session; false when there was none.
    async fn delete_session(&self, token_hash: &str) -> StoreResult<bool>;
    /// Deletes the sessions that expired before `now`; how many.
    async fn delete_expired_sessions(&self, now: DateTime<Utc>) -> StoreResult<u64>;
}
