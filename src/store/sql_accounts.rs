//! The account SQL shared by both backends (passwords, admin flags, lockout, sessions),
//! expanded per backend by `sql_account_store!` next to `sql_store!`, whose `USER_COLUMNS` and
//! `unique_violation` it uses; its rows are read into the structs of `rows.rs`.
//!
//! The first administrator made from the browser also inserts the single row of
//! `account_setup` in its transaction: of two setups racing, the second fails on that row's
//! primary key.

macro_rules! sql_account_store {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl crate::store::AccountStore for $store {
            async fn create_account(&self, account: NewAccount<'_>) -> StoreResult<User> {
                let result = sqlx::query(
                    "INSERT INTO users (id, name, kind, created_at, password_hash, is_admin) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(account.name)
                .bind(UserKind::Key.as_str())
                .bind(now())
                .bind(account.password_hash)
                .bind(account.is_admin)
                .execute(&self.pool)
                .await;
                match result {
                    Ok(_) => {}
                    Err(error) if unique_violation(&error) => {
                        return Err(StoreError::Conflict(format!(
                            "user {} already exists",
                            account.name
                        )));
                    }
                    Err(error) => return Err(error.into()),
                }
                StoreCore::user_by_name(self, account.name)
                    .await?
                    .ok_or(StoreError::NotFound("user"))
            }

            async fn create_first_admin(
                &self,
                name: &str,
                password_hash: &str,
            ) -> StoreResult<User> {
                let refused =
                    || StoreError::Conflict("the first administrator exists already".into());
                let id = uuid::Uuid::now_v7();
                let at = now();
                let mut tx = self.pool.begin().await?;
                // A write first: SQLite's write lock is taken at once, so the read below
                // cannot fail to upgrade it.
                sqlx::query("DELETE FROM account_setup WHERE singleton = 0")
                    .execute(&mut *tx)
                    .await?;
                let (taken,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM users WHERE is_admin OR password_hash IS NOT NULL",
                )
                .fetch_one(&mut *tx)
                .await?;
                if taken > 0 {
                    return Err(refused());
                }
                let inserted = sqlx::query(
                    "INSERT INTO users (id, name, kind, created_at, password_hash, is_admin) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(id)
                .bind(name)
                .bind(UserKind::Key.as_str())
                .bind(at)
                .bind(password_hash)
                .bind(true)
                .execute(&mut *tx)
                .await;
                match inserted {
                    Ok(_) => {}
                    Err(error) if unique_violation(&error) => {
                        return Err(StoreError::Conflict(format!("user {name} already exists")));
                    }
                    Err(error) => return Err(error.into()),
                }
                let claimed = sqlx::query(
                    "INSERT INTO account_setup (singleton, user_id, created_at) VALUES (1, $1, $2)",
                )
                .bind(id)
                .bind(at)
                .execute(&mut *tx)
                .await;
                match claimed {
                    Ok(_) => {}
                    Err(error) if unique_violation(&error) => return Err(refused()),
                    Err(error) => return Err(error.into()),
                }
                tx.commit().await?;
                StoreCore::user_by_name(self, name)
                    .await?
                    .ok_or(StoreError::NotFound("user"))
            }

            async fn setup_open(&self) -> StoreResult<bool> {
                let (taken,): (i64,) = sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM users WHERE is_admin OR password_hash IS NOT NULL) \
                     + (SELECT COUNT(*) FROM account_setup)",
                )
                .fetch_one(&self.pool)
                .await?;
                Ok(taken == 0)
            }

            async fn user_by_id(&self, id: uuid::Uuid) -> StoreResult<Option<User>> {
                let sql = format!("SELECT {USER_COLUMNS} FROM users u WHERE u.id = $1");
                let row = sqlx::query_as::<_, rows::UserRow>(&sql)
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(rows::optional(row)?)
            }

            async fn password_login(&self, name: &str) -> StoreResult<Option<PasswordLogin>> {
                let sql = format!(
                    "SELECT {USER_COLUMNS}, u.password_hash, u.locked_until \
                     FROM users u WHERE u.name = $1"
                );
                let Some(row) = sqlx::query_as::<_, rows::PasswordLoginRow>(&sql)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?
                else {
                    return Ok(None);
                };
                Ok(Some(PasswordLogin {
                    user: row.user.try_into()?,
                    password_hash: row.password_hash,
                    locked_until: row.locked_until,
                }))
            }

            async fn count_failed_login(&self, user: UserId) -> StoreResult<i64> {
                let (count,): (i64,) = sqlx::query_as(
                    "UPDATE users SET failed_logins = failed_logins + 1 WHERE id = $1 \
                     RETURNING failed_logins",
                )
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound("user"))?;
                Ok(count)
            }

            async fn lock_login(&self, user: UserId, until: DateTime<Utc>) -> StoreResult<()> {
                sqlx::query("UPDATE users SET failed_logins = 0, locked_until = $1 WHERE id = $2")
                    .bind(until)
                    .bind(user.as_uuid())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn clear_failed_logins(&self, user: UserId) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE users SET failed_logins = 0, locked_until = NULL WHERE id = $1 \
                     AND (failed_logins <> 0 OR locked_until IS NOT NULL)",
                )
                .bind(user.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn update_user(&self, user: UserId, update: UserUpdate) -> StoreResult<User> {
                let mut tx = self.pool.begin().await?;
                let found = sqlx::query("UPDATE users SET name = name WHERE id = $1")
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                if found.rows_affected() == 0 {
                    return Err(StoreError::NotFound("user"));
                }
                match update.disabled {
                    Some(true) => {
                        sqlx::query(
                            "UPDATE users SET disabled_at = $1 WHERE id = $2 AND disabled_at IS NULL",
                        )
                        .bind(now())
                        .bind(user.as_uuid())
                        .execute(&mut *tx)
                        .await?;
                        sqlx::query("DELETE FROM sessions WHERE user_id = $1")
                            .bind(user.as_uuid())
                            .execute(&mut *tx)
                            .await?;
                    }
                    Some(false) => {
                        sqlx::query("UPDATE users SET disabled_at = NULL WHERE id = $1")
                            .bind(user.as_uuid())
                            .execute(&mut *tx)
                            .await?;
                    }
                    None => {}
                }
                if let Some(is_admin) = update.is_admin {
                    sqlx::query("UPDATE users SET is_admin = $1 WHERE id = $2")
                        .bind(is_admin)
                        .bind(user.as_uuid())
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(hash) = &update.password_hash {
                    sqlx::query(
                        "UPDATE users SET password_hash = $1, failed_logins = 0, \
                         locked_until = NULL WHERE id = $2",
                    )
                    .bind(hash)
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                crate::store::AccountStore::user_by_id(self, user.as_uuid())
                    .await?
                    .ok_or(StoreError::NotFound("user"))
            }

            async fn create_session(
                &self,
                user: UserId,
                token_hash: &str,
                expires_at: DateTime<Utc>,
            ) -> StoreResult<()> {
                let at = now();
                sqlx::query(
                    "INSERT INTO sessions (token_hash, user_id, created_at, last_seen_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(token_hash)
                .bind(user.as_uuid())
                .bind(at)
                .bind(at)
                .bind(expires_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn session_user(
                &self,
                token_hash: &str,
                now: DateTime<Utc>,
            ) -> StoreResult<Option<SessionUser>> {
                let sql = format!(
                    "SELECT {USER_COLUMNS}, s.last_seen_at, s.expires_at \
                     FROM sessions s JOIN users u ON u.id = s.user_id \
                     WHERE s.token_hash = $1 AND u.disabled_at IS NULL"
                );
                let Some(row) = sqlx::query_as::<_, rows::SessionUserRow>(&sql)
                    .bind(token_hash)
                    .fetch_optional(&self.pool)
                    .await?
                else {
                    return Ok(None);
                };
                let found = SessionUser {
                    user: row.user.try_into()?,
                    last_seen_at: row.last_seen_at,
                    expires_at: row.expires_at,
                };
                // Compared here, not in SQL: both backends then agree to the microsecond.
                Ok((found.expires_at > now).then_some(found))
            }

            async fn touch_session(
                &self,
                token_hash: &str,
                now: DateTime<Utc>,
                expires_at: DateTime<Utc>,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE sessions SET last_seen_at = $1, expires_at = $2 WHERE token_hash = $3",
                )
                .bind(now)
                .bind(expires_at)
                .bind(token_hash)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn delete_session(&self, token_hash: &str) -> StoreResult<bool> {
                let done = sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
                    .bind(token_hash)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn delete_expired_sessions(&self, now: DateTime<Utc>) -> StoreResult<u64> {
                let done = sqlx::query("DELETE FROM sessions WHERE expires_at < $1")
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

pub(crate) use sql_account_store;
