//! The document SQL shared by both backends, expanded per backend by `sql_document_store!`.
//! `$has_ref` is the backend's test that a memory's JSON `source_refs` array holds the text
//! bound as `$3` (SQLite: `json_each`; PostgreSQL: jsonb containment).

macro_rules! sql_document_store {
    ($store:ty, $row:ty, $has_ref:literal) => {
        const DOCUMENT_COLUMNS: &str =
            "id, title, source, content_type, chars, chunks, created_at";

        fn document_row(row: &$row) -> Result<Document, sqlx::Error> {
            use sqlx::Row as _;
            Ok(Document {
                id: DocumentId::from_uuid(row.try_get("id")?),
                title: row.try_get("title")?,
                source: row.try_get("source")?,
                content_type: row.try_get("content_type")?,
                chars: row.try_get("chars")?,
                chunks: row.try_get("chunks")?,
                created_at: row.try_get("created_at")?,
            })
        }

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
                    chars: new.chars,
                    chunks: new.chunks,
                    created_at: now(),
                };
                sqlx::query(
                    "INSERT INTO documents (id, user_id, title, source, content_type, chars, chunks, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(document.id.as_uuid())
                .bind(user.as_uuid())
                .bind(&document.title)
                .bind(&document.source)
                .bind(&document.content_type)
                .bind(document.chars)
                .bind(document.chunks)
                .bind(document.created_at)
                .execute(&self.pool)
                .await?;
                Ok(document)
            }

            async fn list_documents(
                &self,
                user: UserId,
                limit: i64,
                before: Option<DocumentId>,
            ) -> StoreResult<Vec<Document>> {
                let rows = match before {
                    Some(cursor) => {
                        let sql = format!(
                            "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE user_id = $1 AND id < $2 \
                             ORDER BY id DESC LIMIT $3"
                        );
                        sqlx::query(&sql)
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
                        sqlx::query(&sql)
                            .bind(user.as_uuid())
                            .bind(limit)
                            .fetch_all(&self.pool)
                            .await?
                    }
                };
                Ok(rows.iter().map(document_row).collect::<Result<_, _>>()?)
            }

            async fn get_document(&self, user: UserId, id: DocumentId) -> StoreResult<Document> {
                let sql = format!(
                    "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE id = $1 AND user_id = $2"
                );
                let row = sqlx::query(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or(StoreError::NotFound("document"))?;
                Ok(document_row(&row)?)
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
