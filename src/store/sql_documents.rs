//! The document SQL shared by both backends, expanded per backend by `sql_document_store!`.
//! `$has_ref` is the backend's test that a memory's JSON `source_refs` array holds the text
//! bound as `$3` (SQLite: `json_each`; PostgreSQL: jsonb containment).
//!
//! A row is claimed by an ingest with a compare-and-set on its `generation`; the unique indexes
//! of migration 0009 keep one row per user and source (per user and content without a source),
//! so two ingests racing to insert the same document cannot both succeed.

macro_rules! sql_document_store {
    ($store:ty, $has_ref:literal) => {
        const DOCUMENT_COLUMNS: &str = "id, title, source, content_type, content_hash, chars, \
             chunks, created_at, generation, ingested_at";

        #[async_trait::async_trait]
        impl crate::store::DocumentStore for $store {
            async fn insert_document(
                &self,
                user: UserId,
                new: NewDocument,
            ) -> StoreResult<Document> {
                let document = Document {
                    id: DocumentId::new(),
                    title: new.title,
                    source: new.source,
                    content_type: new.content_type,
                    content_hash: new.content_hash,
                    chars: new.chars,
                    chunks: new.chunks,
                    created_at: now(),
                };
                let inserted = sqlx::query(
                    "INSERT INTO documents (id, user_id, title, source, content_type, content_hash, \
                     chars, chunks, created_at, generation, ingested_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, NULL)",
                )
                .bind(document.id.as_uuid())
                .bind(user.as_uuid())
                .bind(&document.title)
                .bind(&document.source)
                .bind(&document.content_type)
                .bind(&document.content_hash)
                .bind(document.chars)
                .bind(document.chunks)
                .bind(document.created_at)
                .execute(&self.pool)
                .await;
                match inserted {
                    Ok(_) => Ok(document),
                    Err(error) if unique_violation(&error) => Err(StoreError::Conflict(
                        match &document.source {
                            Some(_) => "a document with this source already exists",
                            None => "a document with this content already exists",
                        }
                        .into(),
                    )),
                    Err(error) => Err(error.into()),
                }
            }

            async fn list_documents(
                &self,
                user: UserId,
                limit: i64,
                before: Option<DocumentId>,
            ) -> StoreResult<Vec<Document>> {
                let found = match before {
                    Some(cursor) => {
                        let sql = format!(
                            "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE user_id = $1 AND id < $2 \
                             ORDER BY id DESC LIMIT $3"
                        );
                        sqlx::query_as::<_, rows::DocumentRow>(&sql)
                            .bind(user.as_uuid())
                            .bind(cursor.as_uuid())
                            .bind(limit)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    None => {
                        let sql = format!(
                            "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE user_id = $1 \
                             ORDER BY id DESC LIMIT $2"
                        );
                        sqlx::query_as::<_, rows::DocumentRow>(&sql)
                            .bind(user.as_uuid())
                            .bind(limit)
                            .fetch_all(&self.pool)
                            .await?
                    }
                };
                Ok(rows::all(found)?)
            }

            async fn get_document(&self, user: UserId, id: DocumentId) -> StoreResult<Document> {
                Ok(self.document_state(user, id).await?.document)
            }

            async fn document_state(
                &self,
                user: UserId,
                id: DocumentId,
            ) -> StoreResult<DocumentState> {
                let sql = format!(
                    "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE id = $1 AND user_id = $2"
                );
                let row = sqlx::query_as::<_, rows::DocumentStateRow>(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or(StoreError::NotFound("document"))?;
                Ok(row.try_into()?)
            }

            async fn documents_from_source(
                &self,
                user: UserId,
                source: &str,
            ) -> StoreResult<Vec<DocumentState>> {
                let sql = format!(
                    "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE user_id = $1 AND source = $2 \
                     ORDER BY id DESC"
                );
                let found = sqlx::query_as::<_, rows::DocumentStateRow>(&sql)
                    .bind(user.as_uuid())
                    .bind(source)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn document_with_content(
                &self,
                user: UserId,
                content_hash: &str,
            ) -> StoreResult<Option<DocumentState>> {
                let sql = format!(
                    "SELECT {DOCUMENT_COLUMNS} FROM documents \
                     WHERE user_id = $1 AND source IS NULL AND content_hash = $2"
                );
                let row = sqlx::query_as::<_, rows::DocumentStateRow>(&sql)
                    .bind(user.as_uuid())
                    .bind(content_hash)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(rows::optional(row)?)
            }

            async fn claim_document(
                &self,
                user: UserId,
                id: DocumentId,
                generation: i64,
                new: NewDocument,
            ) -> StoreResult<bool> {
                let claimed = sqlx::query(
                    "UPDATE documents SET title = $1, content_type = $2, content_hash = $3, \
                     chars = $4, chunks = $5, generation = generation + 1, ingested_at = NULL \
                     WHERE id = $6 AND user_id = $7 AND generation = $8",
                )
                .bind(&new.title)
                .bind(&new.content_type)
                .bind(&new.content_hash)
                .bind(new.chars)
                .bind(new.chunks)
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .bind(generation)
                .execute(&self.pool)
                .await;
                match claimed {
                    Ok(done) => Ok(done.rows_affected() == 1),
                    // Another row took this identity first (a row from before content hashes
                    // claimed by two ingests at once): this claim lost.
                    Err(error) if unique_violation(&error) => Ok(false),
                    Err(error) => Err(error.into()),
                }
            }

            async fn finish_document(
                &self,
                user: UserId,
                id: DocumentId,
                generation: i64,
            ) -> StoreResult<bool> {
                let done = sqlx::query(
                    "UPDATE documents SET ingested_at = $1 \
                     WHERE id = $2 AND user_id = $3 AND generation = $4",
                )
                .bind(now())
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .bind(generation)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn delete_document(&self, user: UserId, id: DocumentId) -> StoreResult<()> {
                let done = sqlx::query("DELETE FROM documents WHERE id = $1 AND user_id = $2")
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound("document"));
                }
                Ok(())
            }

            async fn document_chunk_ids(
                &self,
                user: UserId,
                id: DocumentId,
            ) -> StoreResult<Vec<MemoryId>> {
                let sql = concat!(
                    "SELECT id FROM memories WHERE user_id = $1 AND kind = $2 AND ",
                    $has_ref,
                    " ORDER BY id"
                );
                let ids: Vec<uuid::Uuid> = sqlx::query_scalar(sql)
                    .bind(user.as_uuid())
                    .bind(MemoryKind::Document.as_str())
                    .bind(format!("doc:{id}"))
                    .fetch_all(&self.pool)
                    .await?;
                Ok(ids.into_iter().map(MemoryId::from_uuid).collect())
            }
        }
    };
}

pub(crate) use sql_document_store;
