//! The memory SQL shared by both backends, expanded per backend by `sql_memory_store!` like
//! `sql.rs`. `$log_lock` is the backend's statement that serialises memory-log appends
//! (PostgreSQL: a transaction-level advisory lock; SQLite has a single writer already).
//!
//! Rows are read into the `sqlx::FromRow` structs of `rows.rs`; statements with a variable
//! number of parameters (`IN (…)` lists, optional filters) are built with `sqlx::QueryBuilder`,
//! which numbers the parameters itself.

macro_rules! sql_memory_store {
    ($store:ty, $db:ty, $log_lock:literal, $access_row_by_row:literal) => {
        mod memory_rows {
            /// The columns of `rows::MemoryRow` and `rows::OwnedMemoryRow`.
            pub(super) const COLUMNS: &str = "id, user_id, kind, content, source, trust, importance, \
                thread_id, source_refs, valid_from, invalid_at, supersedes, created_at, updated_at, \
                last_accessed_at, access_count, archived_at, version, embedding, embedding_model";
        }

        /// Appends a log row and a version row for `memory` inside `tx`.
        async fn log_change(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            memory: &Memory,
            change: &str,
            op: LogOp,
        ) -> Result<(), sqlx::Error> {
            let at = now();
            let snapshot = serde_json::to_value(memory).unwrap_or(serde_json::Value::Null);
            sqlx::query(
                "INSERT INTO memory_versions (memory_id, version, user_id, change, snapshot, changed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(memory.id.as_uuid())
            .bind(memory.version)
            .bind(user.as_uuid())
            .bind(change)
            .bind(sqlx::types::Json(snapshot))
            .bind(at)
            .execute(&mut **tx)
            .await?;
            append_log(tx, user, Some(memory.id), op).await
        }

        async fn append_log(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            memory: Option<MemoryId>,
            op: LogOp,
        ) -> Result<(), sqlx::Error> {
            sqlx::query($log_lock).execute(&mut **tx).await?;
            sqlx::query(
                "INSERT INTO memory_log (user_id, memory_id, op, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(user.as_uuid())
            .bind(memory.map(|id| id.as_uuid()))
            .bind(op.as_str())
            .bind(now())
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Logs an upsert for the turn memories just before and/or just after a point of a
        /// thread, so the indexer rebuilds their context views (which include their
        /// neighbours) without the rows changing.
        async fn touch_turn_neighbours(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            thread: ThreadId,
            created_at: DateTime<Utc>,
            id: MemoryId,
            before: bool,
            after: bool,
        ) -> Result<(), sqlx::Error> {
            let sides = [
                (before, "(created_at < $3 OR (created_at = $3 AND id < $4)) ORDER BY created_at DESC, id DESC"),
                (after, "(created_at > $3 OR (created_at = $3 AND id > $4)) ORDER BY created_at, id"),
            ];
            for (wanted, condition) in sides {
                if !wanted {
                    continue;
                }
                let sql = format!(
                    "SELECT id FROM memories WHERE user_id = $1 AND thread_id = $2 AND kind = 'turn' \
                     AND {condition} LIMIT 1"
                );
                let neighbour: Option<uuid::Uuid> = sqlx::query_scalar(&sql)
                    .bind(user.as_uuid())
                    .bind(thread.as_uuid())
                    .bind(created_at)
                    .bind(id.as_uuid())
                    .fetch_optional(&mut **tx)
                    .await?;
                if let Some(neighbour) = neighbour {
                    let neighbour = MemoryId::from_uuid(neighbour);
                    append_log(tx, user, Some(neighbour), LogOp::Upsert).await?;
                }
            }
            Ok(())
        }

        async fn write_memory_row(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            memory: &Memory,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(
                "INSERT INTO memories (id, user_id, kind, content, source, trust, importance, thread_id, \
                 source_refs, valid_from, invalid_at, supersedes, created_at, updated_at, last_accessed_at, \
                 access_count, archived_at, version, embedding, embedding_model, embedding_dim) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21) \
                 ON CONFLICT (id) DO UPDATE SET kind = $3, content = $4, importance = $7, \
                 invalid_at = $11, updated_at = $14, archived_at = $17, version = $18, \
                 embedding = $19, embedding_model = $20, embedding_dim = $21",
            )
            .bind(memory.id.as_uuid())
            .bind(user.as_uuid())
            .bind(memory.kind.as_str())
            .bind(&memory.content)
            .bind(memory.source.as_str())
            .bind(memory.trust.as_str())
            .bind(i64::from(memory.importance))
            .bind(memory.thread_id.map(|id| id.as_uuid()))
            .bind(sqlx::types::Json(&memory.source_refs))
            .bind(memory.valid_from)
            .bind(memory.invalid_at)
            .bind(memory.supersedes.map(|id| id.as_uuid()))
            .bind(memory.created_at)
            .bind(memory.updated_at)
            .bind(memory.last_accessed_at)
            .bind(memory.access_count)
            .bind(memory.archived_at)
            .bind(memory.version)
            .bind(vector_to_bytes(&memory.embedding))
            .bind(&memory.embedding_model)
            .bind(memory.embedding.len() as i64)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        async fn memory_in_tx(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            id: MemoryId,
        ) -> StoreResult<Memory> {
            let sql = format!(
                "SELECT {} FROM memories WHERE id = $1 AND user_id = $2",
                memory_rows::COLUMNS
            );
            let row = sqlx::query_as::<_, rows::MemoryRow>(&sql)
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&mut **tx)
                .await?;
            rows::optional(row)?.ok_or(StoreError::NotFound("memory"))
        }

        /// The memory's version history, oldest first.
        async fn versions_in_tx(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            id: MemoryId,
        ) -> StoreResult<Vec<MemoryVersion>> {
            let found = sqlx::query_as::<_, rows::MemoryVersionRow>(
                "SELECT version, change, snapshot, changed_at FROM memory_versions \
                 WHERE memory_id = $1 AND user_id = $2 ORDER BY version",
            )
            .bind(id.as_uuid())
            .bind(user.as_uuid())
            .fetch_all(&mut **tx)
            .await?;
            Ok(rows::all(found)?)
        }

        /// Deletes the memory and its history, and logs it (a turn's neighbours' context views
        /// are rebuilt); false when the user has no such memory.
        async fn delete_in_tx(
            tx: &mut sqlx::Transaction<'_, $db>,
            user: UserId,
            id: MemoryId,
        ) -> StoreResult<bool> {
            let deleted: Option<(String, Option<uuid::Uuid>, DateTime<Utc>)> = sqlx::query_as(
                "DELETE FROM memories WHERE id = $1 AND user_id = $2 \
                 RETURNING kind, thread_id, created_at",
            )
            .bind(id.as_uuid())
            .bind(user.as_uuid())
            .fetch_optional(&mut **tx)
            .await?;
            let Some((kind, thread, created_at)) = deleted else {
                return Ok(false);
            };
            if let (true, Some(thread)) = (kind == MemoryKind::Turn.as_str(), thread) {
                touch_turn_neighbours(tx, user, ThreadId::from_uuid(thread), created_at, id, true, true)
                    .await?;
            }
            sqlx::query("DELETE FROM memory_versions WHERE memory_id = $1 AND user_id = $2")
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .execute(&mut **tx)
                .await?;
            append_log(tx, user, Some(id), LogOp::Delete).await?;
            Ok(true)
        }

        fn validate_importance(importance: u8) -> StoreResult<()> {
            if (1..=5).contains(&importance) {
                Ok(())
            } else {
                Err(StoreError::BadRequest("importance must be between 1 and 5".into()))
            }
        }

        #[async_trait::async_trait]
        impl crate::store::MemoryStore for $store {
            async fn insert_memories(
                &self,
                user: UserId,
                memories: Vec<(NewMemory, Embedded)>,
            ) -> StoreResult<Vec<Memory>> {
                let mut tx = self.pool.begin().await?;
                let mut written = Vec::with_capacity(memories.len());
                for (new, embedded) in memories {
                    validate_importance(new.importance)?;
                    if new.content.trim().is_empty() {
                        return Err(StoreError::BadRequest("memory content must not be empty".into()));
                    }
                    let at = now();
                    let created = new.created_at.map(|time| time.trunc_subsecs(6)).unwrap_or(at);
                    let memory = Memory {
                        id: MemoryId::new(),
                        kind: new.kind,
                        content: new.content,
                        source: new.source,
                        trust: new.trust,
                        importance: new.importance,
                        thread_id: new.thread_id,
                        source_refs: new.source_refs,
                        valid_from: created,
                        invalid_at: None,
                        supersedes: new.supersedes,
                        created_at: created,
                        updated_at: at,
                        last_accessed_at: None,
                        access_count: 0,
                        archived_at: None,
                        version: 1,
                        embedding_model: embedded.model,
                        superseded_by: None,
                        embedding: embedded.vector,
                    };
                    write_memory_row(&mut tx, user, &memory).await?;
                    log_change(&mut tx, user, &memory, "created", LogOp::Upsert).await?;
                    written.push(memory);
                }
                // New turns change their neighbours' context views: per thread, the turns
                // just before the earliest and just after the latest new one.
                let mut spans: std::collections::HashMap<ThreadId, (&Memory, &Memory)> =
                    std::collections::HashMap::new();
                for memory in written.iter().filter(|m| m.kind == MemoryKind::Turn) {
                    let Some(thread) = memory.thread_id else { continue };
                    let key = |m: &Memory| (m.created_at, m.id);
                    let span = spans.entry(thread).or_insert((memory, memory));
                    if key(memory) < key(span.0) {
                        span.0 = memory;
                    }
                    if key(memory) > key(span.1) {
                        span.1 = memory;
                    }
                }
                for (thread, (first, last)) in spans {
                    touch_turn_neighbours(&mut tx, user, thread, first.created_at, first.id, true, false)
                        .await?;
                    touch_turn_neighbours(&mut tx, user, thread, last.created_at, last.id, false, true)
                        .await?;
                }
                tx.commit().await?;
                Ok(written)
            }

            async fn get_memory(&self, user: UserId, id: MemoryId) -> StoreResult<Memory> {
                let sql = format!(
                    "SELECT {} FROM memories WHERE id = $1 AND user_id = $2",
                    memory_rows::COLUMNS
                );
                let row = sqlx::query_as::<_, rows::MemoryRow>(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?;
                rows::optional(row)?.ok_or(StoreError::NotFound("memory"))
            }

            async fn memory_history(
                &self,
                user: UserId,
                id: MemoryId,
            ) -> StoreResult<Vec<MemoryVersion>> {
                let mut tx = self.pool.begin().await?;
                let versions = versions_in_tx(&mut tx, user, id).await?;
                tx.commit().await?;
                Ok(versions)
            }

            async fn update_memory(
                &self,
                user: UserId,
                id: MemoryId,
                patch: MemoryPatch,
            ) -> StoreResult<Memory> {
                let mut tx = self.pool.begin().await?;
                // Take the write lock first (SQLite) so the read below cannot go stale.
                sqlx::query("UPDATE memories SET version = version WHERE id = $1 AND user_id = $2")
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                let mut memory = memory_in_tx(&mut tx, user, id).await?;
                let mut changes = Vec::new();
                if let Some((content, embedded)) = patch.content {
                    if content.trim().is_empty() {
                        return Err(StoreError::BadRequest("memory content must not be empty".into()));
                    }
                    if content != memory.content {
                        memory.content = content;
                        memory.embedding = embedded.vector;
                        memory.embedding_model = embedded.model;
                        changes.push("updated");
                    }
                }
                if let Some(kind) = patch.kind.filter(|kind| *kind != memory.kind) {
                    memory.kind = kind;
                    changes.push("updated");
                }
                if let Some(importance) = patch.importance.filter(|i| *i != memory.importance) {
                    validate_importance(importance)?;
                    memory.importance = importance;
                    changes.push("updated");
                }
                match patch.archived {
                    Some(true) if memory.archived_at.is_none() => {
                        memory.archived_at = Some(now());
                        changes.push("archived");
                    }
                    Some(false) if memory.archived_at.is_some() => {
                        memory.archived_at = None;
                        changes.push("restored");
                    }
                    _ => {}
                }
                if let Some(invalid_at) = patch.invalid_at
                    && invalid_at != memory.invalid_at
                {
                    memory.invalid_at = invalid_at;
                    changes.push(if invalid_at.is_some() { "invalidated" } else { "revalidated" });
                }
                if changes.is_empty() {
                    return Ok(memory);
                }
                changes.dedup();
                memory.version += 1;
                memory.updated_at = now();
                write_memory_row(&mut tx, user, &memory).await?;
                log_change(&mut tx, user, &memory, &changes.join(","), LogOp::Upsert).await?;
                tx.commit().await?;
                Ok(memory)
            }

            async fn delete_memory(&self, user: UserId, id: MemoryId) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                if !delete_in_tx(&mut tx, user, id).await? {
                    return Err(StoreError::NotFound("memory"));
                }
                tx.commit().await?;
                Ok(())
            }

            async fn forget_memories(
                &self,
                user: UserId,
                ids: &[MemoryId],
                request: &str,
                via: ForgetVia,
                purge_after: DateTime<Utc>,
            ) -> StoreResult<Vec<Memory>> {
                let mut tx = self.pool.begin().await?;
                // Take the write lock first (SQLite) so the reads below cannot go stale.
                sqlx::query("UPDATE memories SET version = version WHERE user_id = $1 AND id = $2")
                    .bind(user.as_uuid())
                    .bind(ids.first().map(|id| id.as_uuid()))
                    .execute(&mut *tx)
                    .await?;
                let mut forgotten = Vec::with_capacity(ids.len());
                for id in ids {
                    let memory = match memory_in_tx(&mut tx, user, *id).await {
                        Ok(memory) => memory,
                        Err(StoreError::NotFound(_)) => continue,
                        Err(error) => return Err(error),
                    };
                    let versions = versions_in_tx(&mut tx, user, *id).await?;
                    sqlx::query(
                        "INSERT INTO forgotten_memories (memory_id, user_id, kind, snapshot, versions, \
                         embedding, request, via, forgotten_at, purge_after) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    )
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .bind(memory.kind.as_str())
                    .bind(sqlx::types::Json(&memory))
                    .bind(sqlx::types::Json(&versions))
                    .bind(vector_to_bytes(&memory.embedding))
                    .bind(request)
                    .bind(via.as_str())
                    .bind(now())
                    .bind(purge_after)
                    .execute(&mut *tx)
                    .await?;
                    delete_in_tx(&mut tx, user, *id).await?;
                    forgotten.push(memory);
                }
                tx.commit().await?;
                Ok(forgotten)
            }

            async fn forgotten_memories(
                &self,
                user: UserId,
                limit: i64,
            ) -> StoreResult<Vec<ForgottenMemory>> {
                let found = sqlx::query_as::<_, rows::ForgottenRow>(
                    "SELECT snapshot, embedding, request, via, forgotten_at, purge_after \
                     FROM forgotten_memories WHERE user_id = $1 AND snapshot IS NOT NULL \
                     ORDER BY forgotten_at DESC, id DESC LIMIT $2",
                )
                .bind(user.as_uuid())
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows::all(found)?)
            }

            async fn restore_forgotten(&self, user: UserId, id: MemoryId) -> StoreResult<Memory> {
                let mut tx = self.pool.begin().await?;
                // Take the write lock first (SQLite) so the reads below cannot go stale.
                sqlx::query(
                    "UPDATE forgotten_memories SET id = id WHERE user_id = $1 AND memory_id = $2",
                )
                .bind(user.as_uuid())
                .bind(id.as_uuid())
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query_as::<_, rows::RestorableRow>(
                    "SELECT id, snapshot, versions, embedding FROM forgotten_memories \
                     WHERE user_id = $1 AND memory_id = $2 AND snapshot IS NOT NULL \
                     ORDER BY id DESC LIMIT 1",
                )
                .bind(user.as_uuid())
                .bind(id.as_uuid())
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound("forgotten memory"))?;
                let entry = row.id;
                let mut memory = row.snapshot.0;
                let versions: Vec<MemoryVersion> =
                    row.versions.map(|json| json.0).unwrap_or_default();
                memory.embedding = row
                    .embedding
                    .map(|bytes| vector_from_bytes(&bytes))
                    .unwrap_or_default();
                memory.superseded_by = None;
                let exists: Option<uuid::Uuid> =
                    sqlx::query_scalar("SELECT id FROM memories WHERE id = $1")
                        .bind(id.as_uuid())
                        .fetch_optional(&mut *tx)
                        .await?;
                if exists.is_some() {
                    return Err(StoreError::Conflict("the memory exists already".into()));
                }
                write_memory_row(&mut tx, user, &memory).await?;
                for version in &versions {
                    sqlx::query(
                        "INSERT INTO memory_versions (memory_id, version, user_id, change, snapshot, changed_at) \
                         VALUES ($1, $2, $3, $4, $5, $6)",
                    )
                    .bind(id.as_uuid())
                    .bind(version.version)
                    .bind(user.as_uuid())
                    .bind(&version.change)
                    .bind(sqlx::types::Json(&version.snapshot))
                    .bind(version.changed_at)
                    .execute(&mut *tx)
                    .await?;
                }
                memory.version = versions.iter().map(|v| v.version).max().unwrap_or(memory.version).max(memory.version) + 1;
                memory.updated_at = now();
                write_memory_row(&mut tx, user, &memory).await?;
                log_change(&mut tx, user, &memory, "restored", LogOp::Upsert).await?;
                if let (MemoryKind::Turn, Some(thread)) = (memory.kind, memory.thread_id) {
                    touch_turn_neighbours(&mut tx, user, thread, memory.created_at, id, true, true).await?;
                }
                sqlx::query(
                    "UPDATE forgotten_memories SET snapshot = NULL, versions = NULL, embedding = NULL, \
                     restored_at = $2 WHERE id = $1",
                )
                .bind(entry)
                .bind(now())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(memory)
            }

            async fn delete_all_memories(&self, user: UserId) -> StoreResult<u64> {
                let mut tx = self.pool.begin().await?;
                let done = sqlx::query("DELETE FROM memories WHERE user_id = $1")
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM memory_versions WHERE user_id = $1")
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE forgotten_memories SET snapshot = NULL, versions = NULL, embedding = NULL, \
                     request = NULL, purged_at = $2 WHERE user_id = $1 AND purged_at IS NULL",
                )
                .bind(user.as_uuid())
                .bind(now())
                .execute(&mut *tx)
                .await?;
                append_log(&mut tx, user, None, LogOp::DeleteUser).await?;
                tx.commit().await?;
                Ok(done.rows_affected())
            }

            async fn list_memories(
                &self,
                user: UserId,
                filter: &MemoryFilter,
                limit: i64,
                before: Option<MemoryId>,
            ) -> StoreResult<Vec<Memory>> {
                let kinds: Vec<&str> = filter
                    .kinds
                    .iter()
                    .flatten()
                    .map(|kind| kind.as_str())
                    .collect();
                let trusts: Vec<&str> = filter
                    .trusts
                    .iter()
                    .flatten()
                    .map(|trust| trust.as_str())
                    .collect();
                if (filter.kinds.is_some() && kinds.is_empty())
                    || (filter.trusts.is_some() && trusts.is_empty())
                {
                    return Ok(Vec::new());
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM memories WHERE user_id = ",
                    memory_rows::COLUMNS
                ));
                query.push_bind(user.as_uuid());
                if let Some(cursor) = before {
                    query.push(" AND id < ").push_bind(cursor.as_uuid());
                }
                if let Some(since) = filter.since {
                    query.push(" AND created_at >= ").push_bind(since);
                }
                if let Some(until) = filter.until {
                    query.push(" AND created_at <= ").push_bind(until);
                }
                if filter.kinds.is_some() {
                    query.push(" AND kind IN (");
                    crate::store::sql::push_list(&mut query, kinds);
                }
                if filter.trusts.is_some() {
                    query.push(" AND trust IN (");
                    crate::store::sql::push_list(&mut query, trusts);
                }
                if let Some(thread) = filter.thread {
                    query.push(" AND thread_id = ").push_bind(thread.as_uuid());
                }
                if !filter.include_archived {
                    query.push(" AND archived_at IS NULL");
                }
                if !filter.include_invalid {
                    query.push(" AND invalid_at IS NULL");
                }
                query.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
                let found = query
                    .build_query_as::<rows::MemoryRow>()
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn thread_turns(
                &self,
                user: UserId,
                thread: ThreadId,
            ) -> StoreResult<Vec<Memory>> {
                let sql = format!(
                    "SELECT {} FROM memories WHERE user_id = $1 AND thread_id = $2 \
                     AND kind = 'turn' ORDER BY created_at, id",
                    memory_rows::COLUMNS
                );
                let found = sqlx::query_as::<_, rows::MemoryRow>(&sql)
                    .bind(user.as_uuid())
                    .bind(thread.as_uuid())
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn has_turns(&self, user: UserId) -> StoreResult<bool> {
                let found: Option<i32> = sqlx::query_scalar(
                    "SELECT 1 FROM memories WHERE user_id = $1 AND kind = 'turn' LIMIT 1",
                )
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                Ok(found.is_some())
            }

            async fn memories_by_ids(
                &self,
                user: UserId,
                ids: &[MemoryId],
            ) -> StoreResult<Vec<Memory>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                if let Some(found) = self.read_rows_directly(user, ids) {
                    return Ok(found);
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM memories WHERE user_id = ",
                    memory_rows::COLUMNS
                ));
                query.push_bind(user.as_uuid()).push(" AND id IN (");
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                let found = query
                    .build_query_as::<rows::MemoryRow>()
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn fill_successors(
                &self,
                user: UserId,
                memories: &mut [Memory],
            ) -> StoreResult<()> {
                let ids: Vec<MemoryId> = memories
                    .iter()
                    .filter(|memory| memory.invalid_at.is_some())
                    .map(|memory| memory.id)
                    .collect();
                if ids.is_empty() {
                    return Ok(());
                }
                let mut query =
                    sqlx::QueryBuilder::<$db>::new("SELECT supersedes, id FROM memories WHERE user_id = ");
                query.push_bind(user.as_uuid()).push(" AND supersedes IN (");
                crate::store::sql::push_list(&mut query, ids.iter().map(|id| id.as_uuid()));
                query.push(" ORDER BY id");
                let found = query
                    .build_query_as::<(uuid::Uuid, uuid::Uuid)>()
                    .fetch_all(&self.pool)
                    .await?;
                for (old, new) in found {
                    let (old, new) = (MemoryId::from_uuid(old), MemoryId::from_uuid(new));
                    // Ordered by id: the newest successor is written last and wins.
                    for memory in memories.iter_mut().filter(|memory| memory.id == old) {
                        memory.superseded_by = Some(new);
                    }
                }
                Ok(())
            }

            async fn record_access(
                &self,
                user: UserId,
                ids: &[MemoryId],
                times: u32,
                at: DateTime<Utc>,
            ) -> StoreResult<()> {
                if ids.is_empty() || times == 0 {
                    return Ok(());
                }
                let times = i64::from(times);
                if $access_row_by_row {
                    // Several replicas record accesses to the same rows at once: one row a
                    // statement holds no lock while it waits for another, so these updates
                    // never take part in a deadlock (one statement for many rows did, when two
                    // of them locked the rows in different orders).
                    for id in ids {
                        sqlx::query(
                            "UPDATE memories SET access_count = access_count + $4, \
                             last_accessed_at = $1 WHERE user_id = $2 AND id = $3",
                        )
                        .bind(at)
                        .bind(user.as_uuid())
                        .bind(id.as_uuid())
                        .bind(times)
                        .execute(&self.pool)
                        .await?;
                    }
                    return Ok(());
                }
                let mut query =
                    sqlx::QueryBuilder::<$db>::new("UPDATE memories SET access_count = access_count + ");
                query
                    .push_bind(times)
                    .push(", last_accessed_at = ")
                    .push_bind(at)
                    .push(" WHERE user_id = ")
                    .push_bind(user.as_uuid())
                    .push(" AND id IN (");
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                query.build().execute(&self.pool).await?;
                Ok(())
            }

            async fn memory_log_after(&self, after: i64, limit: i64) -> StoreResult<Vec<LogEntry>> {
                let found = sqlx::query_as::<_, rows::LogEntryRow>(
                    "SELECT seq, user_id, memory_id, op FROM memory_log WHERE seq > $1 ORDER BY seq LIMIT $2",
                )
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows::all(found)?)
            }

            async fn memory_log_head(&self) -> StoreResult<i64> {
                let head: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM memory_log")
                    .fetch_one(&self.pool)
                    .await?;
                Ok(head.unwrap_or(0))
            }

            async fn owned_memories(&self, ids: &[MemoryId]) -> StoreResult<Vec<OwnedMemory>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM memories WHERE id IN (",
                    memory_rows::COLUMNS
                ));
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                let found = query
                    .build_query_as::<rows::OwnedMemoryRow>()
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn turn_neighbours(
                &self,
                user: Option<UserId>,
                ids: &[MemoryId],
            ) -> StoreResult<Vec<(MemoryId, Option<MemoryId>, Option<MemoryId>)>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(
                    "SELECT id, previous, following FROM (\
                       SELECT id, LAG(id) OVER turns AS previous, LEAD(id) OVER turns AS following \
                       FROM memories WHERE kind = 'turn' AND thread_id IN \
                         (SELECT thread_id FROM memories WHERE kind = 'turn' AND id IN (",
                );
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                if let Some(user) = user {
                    query.push(" AND user_id = ").push_bind(user.as_uuid());
                }
                query.push(
                    ") WINDOW turns AS (PARTITION BY thread_id ORDER BY created_at, id)\
                     ) AS ordered WHERE id IN (",
                );
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                let found = query
                    .build_query_as::<rows::TurnNeighboursRow>()
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn set_context_embeddings(
                &self,
                user: UserId,
                embeddings: Vec<(MemoryId, Embedded)>,
            ) -> StoreResult<()> {
                if embeddings.is_empty() {
                    return Ok(());
                }
                let mut tx = self.pool.begin().await?;
                let at = now();
                for (id, embedded) in embeddings {
                    let written = sqlx::query(
                        "INSERT INTO memory_contexts (memory_id, user_id, embedding, embedding_model, updated_at) \
                         SELECT id, user_id, $1, $2, $3 FROM memories WHERE id = $4 AND user_id = $5 \
                         ON CONFLICT (memory_id) DO UPDATE SET embedding = $1, embedding_model = $2, updated_at = $3",
                    )
                    .bind(vector_to_bytes(&embedded.vector))
                    .bind(&embedded.model)
                    .bind(at)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                    if written.rows_affected() > 0 {
                        append_log(&mut tx, user, Some(id), LogOp::Upsert).await?;
                    }
                }
                tx.commit().await?;
                Ok(())
            }

            async fn context_embeddings(
                &self,
                ids: &[MemoryId],
            ) -> StoreResult<Vec<(MemoryId, Embedded)>> {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut query = sqlx::QueryBuilder::<$db>::new(
                    "SELECT memory_id, embedding, embedding_model FROM memory_contexts WHERE memory_id IN (",
                );
                crate::store::sql::push_list(&mut query, ids.into_iter().map(|id| id.as_uuid()));
                let found = query
                    .build_query_as::<rows::ContextEmbeddingRow>()
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn turns_without_context(
                &self,
                model: &str,
                limit: i64,
            ) -> StoreResult<Vec<OwnedMemory>> {
                let columns = memory_rows::COLUMNS
                    .split(", ")
                    .map(|column| format!("m.{}", column.trim()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let sql = format!(
                    "SELECT {columns} FROM memories m LEFT JOIN memory_contexts c ON c.memory_id = m.id \
                     WHERE m.kind = 'turn' AND (c.memory_id IS NULL OR c.embedding_model <> $1) \
                     ORDER BY m.id LIMIT $2"
                );
                let found = sqlx::query_as::<_, rows::OwnedMemoryRow>(&sql)
                    .bind(model)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn scan_memories(
                &self,
                after: Option<MemoryId>,
                limit: i64,
            ) -> StoreResult<Vec<OwnedMemory>> {
                let found = match after {
                    Some(cursor) => {
                        let sql = format!(
                            "SELECT {} FROM memories WHERE id > $1 ORDER BY id LIMIT $2",
                            memory_rows::COLUMNS
                        );
                        sqlx::query_as::<_, rows::OwnedMemoryRow>(&sql)
                            .bind(cursor.as_uuid())
                            .bind(limit)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    None => {
                        let sql = format!(
                            "SELECT {} FROM memories ORDER BY id LIMIT $1",
                            memory_rows::COLUMNS
                        );
                        sqlx::query_as::<_, rows::OwnedMemoryRow>(&sql)
                            .bind(limit)
                            .fetch_all(&self.pool)
                            .await?
                    }
                };
                Ok(rows::all(found)?)
            }

            async fn count_memories(&self) -> StoreResult<i64> {
                Ok(sqlx::query_scalar("SELECT COUNT(*) FROM memories")
                    .fetch_one(&self.pool)
                    .await?)
            }

            async fn watermark(&self, name: &str) -> StoreResult<i64> {
                let seq: Option<i64> =
                    sqlx::query_scalar("SELECT seq FROM index_watermarks WHERE name = $1")
                        .bind(name)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(seq.unwrap_or(0))
            }

            async fn set_watermark(&self, name: &str, seq: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO index_watermarks (name, seq, updated_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO UPDATE SET seq = $2, updated_at = $3",
                )
                .bind(name)
                .bind(seq)
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn archive_unused(
                &self,
                now_at: DateTime<Utc>,
                unused_for: chrono::Duration,
                max_importance: u8,
            ) -> StoreResult<Vec<MemoryId>> {
                let cutoff = now_at - unused_for;
                let sql = format!(
                    "SELECT {} FROM memories WHERE archived_at IS NULL AND importance <= $1 \
                     AND COALESCE(last_accessed_at, created_at) < $2 ORDER BY id LIMIT 1000",
                    memory_rows::COLUMNS
                );
                let mut archived = Vec::new();
                loop {
                    let mut tx = self.pool.begin().await?;
                    sqlx::query($log_lock).execute(&mut *tx).await?;
                    let found = sqlx::query_as::<_, rows::OwnedMemoryRow>(&sql)
                        .bind(i64::from(max_importance))
                        .bind(cutoff)
                        .fetch_all(&mut *tx)
                        .await?;
                    if found.is_empty() {
                        break;
                    }
                    let batch = found.len();
                    for row in found {
                        let OwnedMemory { user, mut memory } = row.try_into()?;
                        memory.archived_at = Some(memory.last_activity() + unused_for);
                        memory.version += 1;
                        memory.updated_at = now();
                        write_memory_row(&mut tx, user, &memory).await?;
                        log_change(&mut tx, user, &memory, "decayed", LogOp::Upsert).await?;
                        archived.push(memory.id);
                    }
                    tx.commit().await?;
                    if batch < 1000 {
                        break;
                    }
                }
                Ok(archived)
            }

            async fn purge_forgotten(&self, now_at: DateTime<Utc>) -> StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE forgotten_memories SET snapshot = NULL, versions = NULL, embedding = NULL, \
                     request = NULL, purged_at = $1 WHERE purged_at IS NULL AND restored_at IS NULL \
                     AND purge_after <= $1",
                )
                .bind(now_at)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn memories_not_embedded_by(
                &self,
                model: &str,
                limit: i64,
            ) -> StoreResult<Vec<OwnedMemory>> {
                let sql = format!(
                    "SELECT {} FROM memories WHERE embedding_model <> $1 ORDER BY id LIMIT $2",
                    memory_rows::COLUMNS
                );
                let found = sqlx::query_as::<_, rows::OwnedMemoryRow>(&sql)
                    .bind(model)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn count_memories_not_embedded_by(&self, model: &str) -> StoreResult<i64> {
                Ok(sqlx::query_scalar("SELECT COUNT(*) FROM memories WHERE embedding_model <> $1")
                    .bind(model)
                    .fetch_one(&self.pool)
                    .await?)
            }

            async fn relabel_embeddings(&self, from: &str, to: &str) -> StoreResult<u64> {
                let mut tx = self.pool.begin().await?;
                let mut relabelled = 0;
                for sql in [
                    "UPDATE memories SET embedding_model = $2 WHERE embedding_model = $1",
                    "UPDATE memory_contexts SET embedding_model = $2 WHERE embedding_model = $1",
                ] {
                    relabelled += sqlx::query(sql)
                        .bind(from)
                        .bind(to)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                }
                tx.commit().await?;
                Ok(relabelled)
            }

            async fn supersede_memory(
                &self,
                user: UserId,
                old: MemoryId,
                new: NewMemory,
                embedded: Embedded,
            ) -> StoreResult<Memory> {
                validate_importance(new.importance)?;
                let mut tx = self.pool.begin().await?;
                sqlx::query("UPDATE memories SET version = version WHERE id = $1 AND user_id = $2")
                    .bind(old.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                let mut previous = memory_in_tx(&mut tx, user, old).await?;
                let at = now();
                let memory = Memory {
                    id: MemoryId::new(),
                    kind: new.kind,
                    content: new.content,
                    source: new.source,
                    trust: new.trust,
                    importance: new.importance,
                    thread_id: new.thread_id,
                    source_refs: new.source_refs,
                    valid_from: new.created_at.map(|time| time.trunc_subsecs(6)).unwrap_or(at),
                    invalid_at: None,
                    supersedes: Some(old),
                    created_at: new.created_at.map(|time| time.trunc_subsecs(6)).unwrap_or(at),
                    updated_at: at,
                    last_accessed_at: None,
                    access_count: 0,
                    archived_at: None,
                    version: 1,
                    embedding_model: embedded.model,
                    superseded_by: None,
                    embedding: embedded.vector,
                };
                write_memory_row(&mut tx, user, &memory).await?;
                log_change(&mut tx, user, &memory, "created", LogOp::Upsert).await?;
                if previous.invalid_at.is_none() {
                    previous.invalid_at = Some(at);
                    previous.version += 1;
                    previous.updated_at = at;
                    write_memory_row(&mut tx, user, &previous).await?;
                    log_change(&mut tx, user, &previous, "superseded", LogOp::Upsert).await?;
                }
                tx.commit().await?;
                Ok(memory)
            }

            async fn delete_thread_memories(
                &self,
                user: UserId,
                thread: ThreadId,
            ) -> StoreResult<Vec<MemoryId>> {
                let mut tx = self.pool.begin().await?;
                sqlx::query($log_lock).execute(&mut *tx).await?;
                let found: Vec<uuid::Uuid> =
                    sqlx::query_scalar("SELECT id FROM memories WHERE user_id = $1 AND thread_id = $2")
                    .bind(user.as_uuid())
                    .bind(thread.as_uuid())
                    .fetch_all(&mut *tx)
                    .await?;
                let mut ids = Vec::with_capacity(found.len());
                for id in found {
                    let id = MemoryId::from_uuid(id);
                    sqlx::query("DELETE FROM memories WHERE id = $1")
                        .bind(id.as_uuid())
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("DELETE FROM memory_versions WHERE memory_id = $1")
                        .bind(id.as_uuid())
                        .execute(&mut *tx)
                        .await?;
                    append_log(&mut tx, user, Some(id), LogOp::Delete).await?;
                    ids.push(id);
                }
                tx.commit().await?;
                Ok(ids)
            }

            async fn set_embeddings(
                &self,
                items: &[(UserId, MemoryId, Embedded)],
            ) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                for (user, id, embedded) in items {
                    let done = sqlx::query(
                        "UPDATE memories SET embedding = $1, embedding_model = $2, embedding_dim = $3 \
                         WHERE id = $4 AND user_id = $5",
                    )
                    .bind(vector_to_bytes(&embedded.vector))
                    .bind(&embedded.model)
                    .bind(embedded.vector.len() as i64)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&mut *tx)
                    .await?;
                    if done.rows_affected() > 0 {
                        append_log(&mut tx, *user, Some(*id), LogOp::Upsert).await?;
                    }
                }
                tx.commit().await?;
                Ok(())
            }
        }
    };
}

pub(crate) use sql_memory_store;
