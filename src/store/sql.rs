//! The SQL shared by both backends. `sql_store!` expands to the `Store` implementation for one
//! backend type; the text of every statement is the same for SQLite and PostgreSQL (numbered
//! `$N` parameters work on both), and the column types each backend uses (UUID vs blob,
//! timestamptz vs RFC 3339 text, jsonb vs text) are chosen by sqlx's encoders. Rows are read
//! with `query_as` into the `sqlx::FromRow` structs of `rows.rs`, shared by both backends.

/// Expands to `impl Store for $store` where `$store` has a `pool: sqlx::Pool<$db>` field.
/// `$notify_event` is run in every transaction that appends a run event, with the run's id
/// as `$1` (PostgreSQL's `pg_notify`, waking followers on other replicas); `None` on SQLite.
macro_rules! sql_store {
    ($store:ty, $db:ty, $backend:literal, $notify_event:expr) => {
        const NOTIFY_EVENT: Option<&str> = $notify_event;

        /// In `tx`, before a run is inserted: waits for the user's other run starts to commit
        /// (the user's row is locked on PostgreSQL, the database's write lock taken on SQLite),
        /// then refuses when `max` of their runs are running — on every replica at once.
        async fn claim_run_slot(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            max: Option<i64>,
        ) -> StoreResult<()> {
            let Some(max) = max else {
                return Ok(());
            };
            sqlx::query("UPDATE users SET name = name WHERE id = $1")
                .bind(user.as_uuid())
                .execute(&mut **tx)
                .await?;
            let (running,): (i64,) =
                sqlx::query_as("SELECT COUNT(*) FROM runs WHERE user_id = $1 AND status = $2")
                    .bind(user.as_uuid())
                    .bind(RunStatus::Running.as_str())
                    .fetch_one(&mut **tx)
                    .await?;
            if running >= max {
                return Err(StoreError::TooManyRuns(max));
            }
            Ok(())
        }

        const USER_COLUMNS: &str = "u.id, u.name, u.kind, u.created_at, u.memory_enabled, \
             u.is_admin, u.disabled_at, (u.password_hash IS NOT NULL) AS has_password, \
             (SELECT COUNT(*) FROM api_keys k WHERE k.user_id = u.id AND k.revoked_at IS NULL) AS active_keys";
        const RUN_COLUMNS: &str =
            "id, thread_id, kind, status, error, last_seq, created_at, updated_at, finished_at";

        fn unique_violation(error: &sqlx::Error) -> bool {
            matches!(error, sqlx::Error::Database(db) if db.is_unique_violation())
        }

        /// Appends a run event; with `finish`, the run's terminal status in the same
        /// transaction, so whoever reads the final event also reads how the run ended.
        #[allow(clippy::too_many_arguments)]
        async fn append_event(
            pool: &sqlx::Pool<$db>,
            user: UserId,
            run: RunId,
            seq: i64,
            event_type: EventType,
            data: &serde_json::Value,
            finish: Option<(RunStatus, Option<&str>)>,
            writer: ReplicaId,
        ) -> StoreResult<()> {
            let at = now();
            let mut tx = pool.begin().await?;
            // The owner checks come first (and are the transaction's first write): the user's
            // run, held by `writer` (a replica whose run was taken over appends nothing more).
            let owned = match finish {
                None => {
                    sqlx::query(
                        "UPDATE runs SET last_seq = $1, updated_at = $2 WHERE id = $3 AND user_id = $4 \
                         AND (owner IS NULL OR owner = $5)",
                    )
                    .bind(seq)
                    .bind(at)
                    .bind(run.as_uuid())
                    .bind(user.as_uuid())
                    .bind(writer.as_uuid())
                    .execute(&mut *tx)
                    .await?
                }
                Some((status, error)) => {
                    sqlx::query(
                        "UPDATE runs SET last_seq = $1, updated_at = $2, \
                         error = CASE WHEN status = 'running' THEN $5 ELSE error END, \
                         finished_at = CASE WHEN status = 'running' THEN $2 ELSE finished_at END, \
                         status = CASE WHEN status = 'running' THEN $6 ELSE status END, \
                         awaiting_input = $8, checkpoint = NULL \
                         WHERE id = $3 AND user_id = $4 AND (owner IS NULL OR owner = $7)",
                    )
                    .bind(seq)
                    .bind(at)
                    .bind(run.as_uuid())
                    .bind(user.as_uuid())
                    .bind(error)
                    .bind(status.as_str())
                    .bind(writer.as_uuid())
                    .bind(false)
                    .execute(&mut *tx)
                    .await?
                }
            };
            if owned.rows_affected() != 1 {
                drop(tx);
                let exists: Option<(i64,)> =
                    sqlx::query_as("SELECT last_seq FROM runs WHERE id = $1 AND user_id = $2")
                        .bind(run.as_uuid())
                        .bind(user.as_uuid())
                        .fetch_optional(pool)
                        .await?;
                return Err(match exists {
                    Some(_) => StoreError::Conflict(format!(
                        "run {run} is owned by another replica"
                    )),
                    None => StoreError::NotFound("run"),
                });
            }
            let inserted = sqlx::query(
                "INSERT INTO run_events (run_id, seq, event_type, data, created_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(run.as_uuid())
            .bind(seq)
            .bind(event_type.as_str())
            .bind(sqlx::types::Json(data))
            .bind(at)
            .execute(&mut *tx)
            .await;
            match inserted {
                Ok(_) => {}
                Err(error) if unique_violation(&error) => {
                    return Err(StoreError::Conflict(format!(
                        "event {seq} of run {run} already exists"
                    )));
                }
                Err(error) => return Err(error.into()),
            }
            if let Some(notify) = NOTIFY_EVENT {
                sqlx::query(notify).bind(run.to_string()).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        }

        #[async_trait::async_trait]
        impl crate::store::StoreCore for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            async fn ping(&self) -> StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn close(&self) {
                self.pool.close().await;
            }

            async fn create_user(&self, name: &str, kind: UserKind) -> StoreResult<User> {
                let id = uuid::Uuid::now_v7();
                let result = sqlx::query(
                    "INSERT INTO users (id, name, kind, created_at) VALUES ($1, $2, $3, $4)",
                )
                .bind(id)
                .bind(name)
                .bind(kind.as_str())
                .bind(now())
                .execute(&self.pool)
                .await;
                match result {
                    Ok(_) => {}
                    Err(error) if unique_violation(&error) => {
                        return Err(StoreError::Conflict(format!("user {name} already exists")));
                    }
                    Err(error) => return Err(error.into()),
                }
                self.user_by_name(name).await?.ok_or(StoreError::NotFound("user"))
            }

            async fn ensure_user(&self, name: &str, kind: UserKind) -> StoreResult<User> {
                if let Some(user) = self.user_by_name(name).await? {
                    return Ok(user);
                }
                sqlx::query(
                    "INSERT INTO users (id, name, kind, created_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (name) DO NOTHING",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(name)
                .bind(kind.as_str())
                .bind(now())
                .execute(&self.pool)
                .await?;
                self.user_by_name(name).await?.ok_or(StoreError::NotFound("user"))
            }

            async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>> {
                let sql = format!("SELECT {USER_COLUMNS} FROM users u WHERE u.name = $1");
                let row = sqlx::query_as::<_, rows::UserRow>(&sql)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(rows::optional(row)?)
            }

            async fn set_memory_enabled(&self, user: UserId, enabled: bool) -> StoreResult<()> {
                let done = sqlx::query("UPDATE users SET memory_enabled = $1 WHERE id = $2")
                    .bind(enabled)
                    .bind(user.as_uuid())
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound("user"));
                }
                Ok(())
            }

            async fn memory_enabled(&self, user: UserId) -> StoreResult<bool> {
                let found: Option<(bool,)> =
                    sqlx::query_as("SELECT memory_enabled FROM users WHERE id = $1")
                        .bind(user.as_uuid())
                        .fetch_optional(&self.pool)
                        .await?;
                found.map(|(enabled,)| enabled).ok_or(StoreError::NotFound("user"))
            }

            async fn list_users(&self) -> StoreResult<Vec<User>> {
                let sql = format!("SELECT {USER_COLUMNS} FROM users u ORDER BY u.name");
                let found = sqlx::query_as::<_, rows::UserRow>(&sql).fetch_all(&self.pool).await?;
                Ok(rows::all(found)?)
            }

            async fn add_api_key(
                &self,
                user: UserId,
                key_hash: &str,
                prefix: &str,
            ) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO api_keys (id, user_id, key_hash, prefix, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(user.as_uuid())
                .bind(key_hash)
                .bind(prefix)
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn user_by_key_hash(&self, key_hash: &str) -> StoreResult<Option<User>> {
                let sql = format!(
                    "SELECT {USER_COLUMNS} FROM users u JOIN api_keys key ON key.user_id = u.id \
                     WHERE key.key_hash = $1 AND key.revoked_at IS NULL AND u.disabled_at IS NULL"
                );
                let row = sqlx::query_as::<_, rows::UserRow>(&sql)
                    .bind(key_hash)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(rows::optional(row)?)
            }

            async fn revoke_keys(&self, name: &str) -> StoreResult<u64> {
                let user = self.user_by_name(name).await?.ok_or(StoreError::NotFound("user"))?;
                let done = sqlx::query(
                    "UPDATE api_keys SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL",
                )
                .bind(now())
                .bind(user.id.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn rotate_key(
                &self,
                name: &str,
                key_hash: &str,
                prefix: &str,
                revoke_others: bool,
            ) -> StoreResult<u64> {
                let user = self.user_by_name(name).await?.ok_or(StoreError::NotFound("user"))?;
                let mut tx = self.pool.begin().await?;
                let revoked = if revoke_others {
                    sqlx::query(
                        "UPDATE api_keys SET revoked_at = $1 \
                         WHERE user_id = $2 AND revoked_at IS NULL",
                    )
                    .bind(now())
                    .bind(user.id.as_uuid())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                } else {
                    0
                };
                sqlx::query(
                    "INSERT INTO api_keys (id, user_id, key_hash, prefix, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(user.id.as_uuid())
                .bind(key_hash)
                .bind(prefix)
                .bind(now())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(revoked)
            }

            async fn api_keys(&self, name: &str) -> StoreResult<Vec<ApiKeyInfo>> {
                let user = self.user_by_name(name).await?.ok_or(StoreError::NotFound("user"))?;
                let found = sqlx::query_as::<_, rows::ApiKeyRow>(
                    "SELECT prefix, created_at, revoked_at FROM api_keys \
                     WHERE user_id = $1 ORDER BY created_at DESC, id DESC",
                )
                .bind(user.id.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                Ok(rows::all(found)?)
            }

            async fn create_thread(
                &self,
                user: UserId,
                title: &str,
                temporary: bool,
            ) -> StoreResult<Thread> {
                let thread = Thread {
                    id: ThreadId::new(),
                    title: title.to_string(),
                    temporary,
                    created_at: now(),
                    updated_at: now(),
                };
                sqlx::query(
                    "INSERT INTO threads (id, user_id, title, temporary, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(thread.id.as_uuid())
                .bind(user.as_uuid())
                .bind(&thread.title)
                .bind(thread.temporary)
                .bind(thread.created_at)
                .bind(thread.updated_at)
                .execute(&self.pool)
                .await?;
                Ok(thread)
            }

            async fn list_threads(
                &self,
                user: UserId,
                limit: i64,
                before: Option<ThreadId>,
            ) -> StoreResult<Vec<Thread>> {
                let found = match before {
                    Some(cursor) => {
                        sqlx::query_as::<_, rows::ThreadRow>(
                            "SELECT id, title, temporary, created_at, updated_at FROM threads \
                             WHERE user_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
                        )
                        .bind(user.as_uuid())
                        .bind(cursor.as_uuid())
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                    }
                    None => {
                        sqlx::query_as::<_, rows::ThreadRow>(
                            "SELECT id, title, temporary, created_at, updated_at FROM threads \
                             WHERE user_id = $1 ORDER BY id DESC LIMIT $2",
                        )
                        .bind(user.as_uuid())
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                    }
                };
                Ok(rows::all(found)?)
            }

            async fn get_thread(&self, user: UserId, id: ThreadId) -> StoreResult<Thread> {
                let row = sqlx::query_as::<_, rows::ThreadRow>(
                    "SELECT id, title, temporary, created_at, updated_at FROM threads \
                     WHERE id = $1 AND user_id = $2",
                )
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                rows::optional(row)?.ok_or(StoreError::NotFound("thread"))
            }

            async fn conversation_thread(
                &self,
                user: UserId,
                conversation_key: &str,
                title: &str,
            ) -> StoreResult<Thread> {
                let select = "SELECT id, title, temporary, created_at, updated_at FROM threads \
                              WHERE user_id = $1 AND conversation_key = $2";
                let found = sqlx::query_as::<_, rows::ThreadRow>(select)
                    .bind(user.as_uuid())
                    .bind(conversation_key)
                    .fetch_optional(&self.pool)
                    .await?;
                if let Some(row) = found {
                    return Ok(Thread::try_from(row)?);
                }
                let at = now();
                // A concurrent request may have made it meanwhile: the unique index keeps one.
                sqlx::query(
                    "INSERT INTO threads (id, user_id, title, created_at, updated_at, conversation_key) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                )
                .bind(ThreadId::new().as_uuid())
                .bind(user.as_uuid())
                .bind(title)
                .bind(at)
                .bind(at)
                .bind(conversation_key)
                .execute(&self.pool)
                .await?;
                let row = sqlx::query_as::<_, rows::ThreadRow>(select)
                    .bind(user.as_uuid())
                    .bind(conversation_key)
                    .fetch_one(&self.pool)
                    .await?;
                Ok(Thread::try_from(row)?)
            }

            async fn rename_thread(
                &self,
                user: UserId,
                id: ThreadId,
                title: &str,
            ) -> StoreResult<Thread> {
                let row = sqlx::query_as::<_, rows::ThreadRow>(
                    "UPDATE threads SET title = $1, updated_at = $2 \
                     WHERE id = $3 AND user_id = $4 \
                     RETURNING id, title, temporary, created_at, updated_at",
                )
                .bind(title)
                .bind(now())
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                rows::optional(row)?.ok_or(StoreError::NotFound("thread"))
            }

            async fn delete_thread(&self, user: UserId, id: ThreadId) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                for statement in [
                    "DELETE FROM run_events WHERE run_id IN \
                     (SELECT id FROM runs WHERE thread_id = $1 AND user_id = $2)",
                    "DELETE FROM runs WHERE thread_id = $1 AND user_id = $2",
                    "DELETE FROM messages WHERE thread_id = $1 AND user_id = $2",
                ] {
                    sqlx::query(statement)
                        .bind(id.as_uuid())
                        .bind(user.as_uuid())
                        .execute(&mut *tx)
                        .await?;
                }
                let done = sqlx::query("DELETE FROM threads WHERE id = $1 AND user_id = $2")
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound("thread"));
                }
                tx.commit().await?;
                Ok(())
            }

            async fn append_message(
                &self,
                user: UserId,
                thread: ThreadId,
                role: Role,
                content: &str,
                run: Option<RunId>,
                trust: Trust,
            ) -> StoreResult<Message> {
                let message = Message {
                    id: MessageId::new(),
                    thread_id: thread,
                    role,
                    content: content.to_string(),
                    author: None,
                    run_id: run,
                    created_at: now(),
                    trust,
                    attachments: Vec::new(),
                };
                let mut tx = self.pool.begin().await?;
                let touched = sqlx::query(
                    "UPDATE threads SET updated_at = $1 WHERE id = $2 AND user_id = $3",
                )
                .bind(message.created_at)
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .execute(&mut *tx)
                .await?;
                if touched.rows_affected() == 0 {
                    return Err(StoreError::NotFound("thread"));
                }
                sqlx::query(
                    "INSERT INTO messages (id, thread_id, user_id, role, content, run_id, created_at, trust) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(message.id.as_uuid())
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .bind(role.as_str())
                .bind(&message.content)
                .bind(run.map(|run| run.as_uuid()))
                .bind(message.created_at)
                .bind(trust.as_str())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(message)
            }

            async fn import_messages(
                &self,
                user: UserId,
                thread: ThreadId,
                messages: Vec<NewMessage>,
            ) -> StoreResult<Vec<Message>> {
                let mut tx = self.pool.begin().await?;
                let touched = sqlx::query(
                    "UPDATE threads SET updated_at = $1 WHERE id = $2 AND user_id = $3",
                )
                .bind(now())
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .execute(&mut *tx)
                .await?;
                if touched.rows_affected() == 0 {
                    return Err(StoreError::NotFound("thread"));
                }
                let mut stored: Vec<Message> = Vec::with_capacity(messages.len());
                // Messages given one time (a day's date for a whole session, or none) keep
                // their order in time: each lands a microsecond after the one before, so what
                // is ordered by time (recall's "later first", the memories' dates) sees the
                // conversation's order. Times that differ are kept as given.
                let mut given_before: Option<Option<chrono::DateTime<chrono::Utc>>> = None;
                for new in messages {
                    let mut created_at = new.created_at.unwrap_or_else(now).trunc_subsecs(6);
                    if let Some(previous) = stored.last()
                        && (given_before == Some(new.created_at) || new.created_at.is_none())
                        && created_at <= previous.created_at
                    {
                        created_at = previous.created_at + chrono::Duration::microseconds(1);
                    }
                    given_before = Some(new.created_at);
                    let message = Message {
                        id: MessageId::new(),
                        thread_id: thread,
                        role: new.role,
                        content: new.content,
                        author: new.author,
                        run_id: None,
                        created_at,
                        trust: Message::trust_of(new.role),
                        attachments: Vec::new(),
                    };
                    sqlx::query(
                        "INSERT INTO messages (id, thread_id, user_id, role, content, author, run_id, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7)",
                    )
                    .bind(message.id.as_uuid())
                    .bind(thread.as_uuid())
                    .bind(user.as_uuid())
                    .bind(message.role.as_str())
                    .bind(&message.content)
                    .bind(&message.author)
                    .bind(message.created_at)
                    .execute(&mut *tx)
                    .await?;
                    stored.push(message);
                }
                tx.commit().await?;
                Ok(stored)
            }

            async fn truncate_messages(
                &self,
                user: UserId,
                thread: ThreadId,
                from: MessageId,
            ) -> StoreResult<Vec<MessageId>> {
                self.get_thread(user, thread).await?;
                let mut tx = self.pool.begin().await?;
                let removed: Vec<MessageId> = sqlx::query_scalar(
                    "DELETE FROM messages WHERE thread_id = $1 AND user_id = $2 AND id >= $3 \
                     RETURNING id",
                )
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .bind(from.as_uuid())
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(MessageId::from_uuid)
                .collect();
                // A rolling summary that covers a removed message quotes it: it goes too (the
                // next turn summarises again).
                sqlx::query(
                    "DELETE FROM thread_summaries WHERE thread_id = $1 AND user_id = $2 \
                     AND covered_until >= $3",
                )
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .bind(from.as_uuid())
                .execute(&mut *tx)
                .await?;
                sqlx::query("UPDATE threads SET updated_at = $1 WHERE id = $2 AND user_id = $3")
                    .bind(now())
                    .bind(thread.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(removed)
            }

            async fn list_messages(
                &self,
                user: UserId,
                thread: ThreadId,
            ) -> StoreResult<Vec<Message>> {
                self.get_thread(user, thread).await?;
                let found = sqlx::query_as::<_, rows::MessageRow>(
                    "SELECT id, thread_id, role, content, author, run_id, created_at, trust, attachments \
                     FROM messages \
                     WHERE thread_id = $1 AND user_id = $2 ORDER BY id",
                )
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                Ok(rows::all(found)?)
            }

            async fn message_authors(&self, user: UserId) -> StoreResult<Vec<String>> {
                Ok(sqlx::query_scalar(
                    "SELECT DISTINCT author FROM messages WHERE user_id = $1 AND author IS NOT NULL \
                     ORDER BY author",
                )
                .bind(user.as_uuid())
                .fetch_all(&self.pool)
                .await?)
            }

            async fn thread_summary(
                &self,
                user: UserId,
                thread: ThreadId,
            ) -> StoreResult<Option<(String, MessageId)>> {
                let row: Option<(String, uuid::Uuid)> = sqlx::query_as(
                    "SELECT summary, covered_until FROM thread_summaries \
                     WHERE thread_id = $1 AND user_id = $2",
                )
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.map(|(summary, covered_until)| (summary, MessageId::from_uuid(covered_until))))
            }

            async fn set_thread_summary(
                &self,
                user: UserId,
                thread: ThreadId,
                summary: &str,
                covered_until: MessageId,
            ) -> StoreResult<()> {
                self.get_thread(user, thread).await?;
                sqlx::query(
                    "INSERT INTO thread_summaries (thread_id, user_id, summary, covered_until, updated_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (thread_id) DO UPDATE \
                     SET summary = $3, covered_until = $4, updated_at = $5",
                )
                .bind(thread.as_uuid())
                .bind(user.as_uuid())
                .bind(summary)
                .bind(covered_until.as_uuid())
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn begin_turn(&self, user: UserId, turn: NewTurn) -> StoreResult<BegunTurn> {
                async fn earlier(
                    pool: &sqlx::Pool<$db>,
                    user: UserId,
                    idempotency: &Idempotency,
                ) -> StoreResult<Option<BegunTurn>> {
                    let sql = format!(
                        "SELECT {RUN_COLUMNS}, request_digest FROM runs \
                         WHERE user_id = $1 AND idempotency_key = $2"
                    );
                    let Some(row) = sqlx::query_as::<_, rows::IdempotentRunRow>(&sql)
                        .bind(user.as_uuid())
                        .bind(&idempotency.key)
                        .fetch_optional(pool)
                        .await?
                    else {
                        return Ok(None);
                    };
                    if row.request_digest.as_deref() != Some(idempotency.digest.as_str()) {
                        return Err(StoreError::Conflict(
                            "this Idempotency-Key was used for a different request".into(),
                        ));
                    }
                    Ok(Some(BegunTurn::Replayed(Run::try_from(row.run)?)))
                }

                if let Some(idempotency) = &turn.idempotency {
                    if let Some(replayed) = earlier(&self.pool, user, idempotency).await? {
                        return Ok(replayed);
                    }
                }
                let at = now();
                let message = Message {
                    id: turn.message_id,
                    thread_id: turn.thread,
                    role: Role::User,
                    content: turn.content,
                    author: None,
                    run_id: None,
                    created_at: at,
                    trust: Trust::User,
                    attachments: turn.attachments,
                };
                let run = Run {
                    id: turn.run_id,
                    thread_id: Some(turn.thread),
                    kind: RunKind::Chat,
                    status: RunStatus::Running,
                    error: None,
                    last_seq: 0,
                    created_at: at,
                    updated_at: at,
                    finished_at: None,
                };
                let mut tx = self.pool.begin().await?;
                claim_run_slot(&mut tx, user, turn.max_running).await?;
                let touched = sqlx::query(
                    "UPDATE threads SET updated_at = $1 WHERE id = $2 AND user_id = $3",
                )
                .bind(at)
                .bind(turn.thread.as_uuid())
                .bind(user.as_uuid())
                .execute(&mut *tx)
                .await?;
                if touched.rows_affected() == 0 {
                    return Err(StoreError::NotFound("thread"));
                }
                sqlx::query(
                    "INSERT INTO messages (id, thread_id, user_id, role, content, run_id, created_at, attachments) \
                     VALUES ($1, $2, $3, $4, $5, NULL, $6, $7)",
                )
                .bind(message.id.as_uuid())
                .bind(turn.thread.as_uuid())
                .bind(user.as_uuid())
                .bind(Role::User.as_str())
                .bind(&message.content)
                .bind(at)
                .bind(
                    (!message.attachments.is_empty())
                        .then(|| sqlx::types::Json(&message.attachments)),
                )
                .execute(&mut *tx)
                .await?;
                let (key, digest) = match &turn.idempotency {
                    Some(idempotency) => (Some(&idempotency.key), Some(&idempotency.digest)),
                    None => (None, None),
                };
                let inserted = sqlx::query(
                    "INSERT INTO runs (id, user_id, thread_id, kind, status, last_seq, created_at, \
                     updated_at, idempotency_key, request_digest) \
                     VALUES ($1, $2, $3, $4, $5, 0, $6, $6, $7, $8)",
                )
                .bind(run.id.as_uuid())
                .bind(user.as_uuid())
                .bind(turn.thread.as_uuid())
                .bind(run.kind.as_str())
                .bind(run.status.as_str())
                .bind(at)
                .bind(key)
                .bind(digest)
                .execute(&mut *tx)
                .await;
                match (inserted, &turn.idempotency) {
                    (Ok(_), _) => {}
                    // The same key arrived twice at once: the other request's run stands.
                    (Err(error), Some(idempotency)) if unique_violation(&error) => {
                        drop(tx);
                        return earlier(&self.pool, user, idempotency)
                            .await?
                            .ok_or(StoreError::Database(error));
                    }
                    (Err(error), _) => return Err(error.into()),
                }
                sqlx::query(
                    "INSERT INTO jobs (id, user_id, kind, run_id, key, payload, status, attempts, run_after, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'queued', 0, $7, $7) ON CONFLICT (key) DO NOTHING",
                )
                .bind(JobId::new().as_uuid())
                .bind(user.as_uuid())
                .bind(turn.job_kind.as_str())
                .bind(run.id.as_uuid())
                .bind(&turn.job_key)
                .bind(sqlx::types::Json(&turn.job_payload))
                .bind(at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(BegunTurn::Started { message, run })
            }

            async fn create_run(
                &self,
                user: UserId,
                thread: Option<ThreadId>,
                kind: RunKind,
                max_running: Option<i64>,
            ) -> StoreResult<Run> {
                if let Some(thread) = thread {
                    self.get_thread(user, thread).await?;
                }
                let at = now();
                let run = Run {
                    id: RunId::new(),
                    thread_id: thread,
                    kind,
                    status: RunStatus::Running,
                    error: None,
                    last_seq: 0,
                    created_at: at,
                    updated_at: at,
                    finished_at: None,
                };
                let mut tx = self.pool.begin().await?;
                claim_run_slot(&mut tx, user, max_running).await?;
                sqlx::query(
                    "INSERT INTO runs (id, user_id, thread_id, kind, status, last_seq, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, 0, $6, $7)",
                )
                .bind(run.id.as_uuid())
                .bind(user.as_uuid())
                .bind(thread.map(|thread| thread.as_uuid()))
                .bind(kind.as_str())
                .bind(run.status.as_str())
                .bind(at)
                .bind(at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(run)
            }

            async fn add_token_usage(
                &self,
                user: UserId,
                day: &str,
                tokens: i64,
            ) -> StoreResult<i64> {
                let (total,): (i64,) = sqlx::query_as(
                    "INSERT INTO token_usage (user_id, day, tokens) VALUES ($1, $2, $3) \
                     ON CONFLICT (user_id, day) DO UPDATE SET tokens = token_usage.tokens + $3 \
                     RETURNING tokens",
                )
                .bind(user.as_uuid())
                .bind(day)
                .bind(tokens)
                .fetch_one(&self.pool)
                .await?;
                Ok(total)
            }

            async fn token_usage(&self, user: UserId, day: &str) -> StoreResult<i64> {
                let row: Option<(i64,)> = sqlx::query_as(
                    "SELECT tokens FROM token_usage WHERE user_id = $1 AND day = $2",
                )
                .bind(user.as_uuid())
                .bind(day)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.map_or(0, |(tokens,)| tokens))
            }

            async fn get_run(&self, user: UserId, id: RunId) -> StoreResult<Run> {
                let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 AND user_id = $2");
                let row = sqlx::query_as::<_, rows::RunRow>(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?;
                rows::optional(row)?.ok_or(StoreError::NotFound("run"))
            }

            async fn list_runs(
                &self,
                user: UserId,
                kind: RunKind,
                limit: i64,
            ) -> StoreResult<Vec<Run>> {
                let sql = format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE user_id = $1 AND kind = $2 \
                     ORDER BY id DESC LIMIT $3"
                );
                let found = sqlx::query_as::<_, rows::RunRow>(&sql)
                    .bind(user.as_uuid())
                    .bind(kind.as_str())
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn finish_run(
                &self,
                user: UserId,
                id: RunId,
                status: RunStatus,
                error: Option<&str>,
            ) -> StoreResult<()> {
                let at = now();
                sqlx::query(
                    "UPDATE runs SET status = $1, error = $2, updated_at = $3, finished_at = $4 \
                     WHERE id = $5 AND user_id = $6 AND status = 'running'",
                )
                .bind(status.as_str())
                .bind(error)
                .bind(at)
                .bind(status.is_terminal().then_some(at))
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn append_run_event(
                &self,
                user: UserId,
                run: RunId,
                seq: i64,
                event_type: EventType,
                data: &serde_json::Value,
                writer: ReplicaId,
            ) -> StoreResult<()> {
                append_event(&self.pool, user, run, seq, event_type, data, None, writer).await
            }

            #[allow(clippy::too_many_arguments)]
            async fn append_final_run_event(
                &self,
                user: UserId,
                run: RunId,
                seq: i64,
                data: &serde_json::Value,
                status: RunStatus,
                error: Option<&str>,
                writer: ReplicaId,
            ) -> StoreResult<()> {
                append_event(
                    &self.pool,
                    user,
                    run,
                    seq,
                    EventType::Done,
                    data,
                    Some((status, error)),
                    writer,
                )
                .await
            }

            async fn run_events_after(
                &self,
                user: UserId,
                run: RunId,
                after: i64,
                limit: i64,
            ) -> StoreResult<Vec<StoredEvent>> {
                let found = sqlx::query_as::<_, rows::EventRow>(
                    "SELECT e.seq, e.event_type, e.data, e.created_at FROM run_events e \
                     JOIN runs r ON r.id = e.run_id \
                     WHERE e.run_id = $1 AND r.user_id = $2 AND e.seq > $3 \
                     ORDER BY e.seq LIMIT $4",
                )
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows::all(found)?)
            }
        }
    };
}

pub(crate) use sql_store;

/// Binds each of `values` into the list the query's text has just opened (`… IN (`), and
/// closes it.
pub(crate) fn push_list<'args, DB, T>(
    query: &mut sqlx::QueryBuilder<'args, DB>,
    values: impl IntoIterator<Item = T>,
) where
    DB: sqlx::Database,
    T: 'args + sqlx::Encode<'args, DB> + sqlx::Type<DB>,
{
    let mut list = query.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    query.push(")");
}
