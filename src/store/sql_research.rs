//! The research-record SQL shared by both backends, expanded per backend by
//! `sql_research_store!` like the other store macros.

macro_rules! sql_research_store {
    ($store:ty, $row:ty) => {
        fn research_row(row: &$row) -> Result<ResearchRecord, sqlx::Error> {
            use sqlx::Row as _;
            let json = |column: &str| -> Result<serde_json::Value, sqlx::Error> {
                let value: sqlx::types::Json<serde_json::Value> = row.try_get(column)?;
                Ok(value.0)
            };
            Ok(ResearchRecord {
                id: RunId::from_uuid(row.try_get("id")?),
                run_id: RunId::from_uuid(row.try_get("run_id")?),
                thread_id: row
                    .try_get::<Option<uuid::Uuid>, _>("thread_id")?
                    .map(ThreadId::from_uuid),
                query: row.try_get("query")?,
                model: row.try_get("model")?,
                status: text_enum::decode("research.status", row.try_get::<&str, _>("status")?)?,
                config: json("config")?,
                report: row.try_get("report")?,
                sources: json("sources")?,
                usage: json("usage")?,
                stage_timings: json("stage_timings")?,
                word_count: row.try_get("word_count")?,
                source_count: row.try_get("source_count")?,
                duration_ms: row.try_get("duration_ms")?,
                error: row.try_get("error")?,
                created_at: row.try_get("created_at")?,
                finished_at: row.try_get("finished_at")?,
            })
        }

        const RESEARCH_COLUMNS: &str = "id, run_id, thread_id, query, model, status, config, \
             report, sources, usage, stage_timings, word_count, source_count, duration_ms, error, \
             created_at, finished_at";

        #[async_trait::async_trait]
        impl crate::store::ResearchStore for $store {
            async fn create_research(
                &self,
                user: UserId,
                research: &NewResearch,
            ) -> StoreResult<()> {
                let empty = serde_json::json!({});
                sqlx::query(
                    "INSERT INTO research (id, user_id, run_id, thread_id, query, model, status, \
                     config, sources, usage, stage_timings, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, $8, $9, $9, $10)",
                )
                .bind(research.id.as_uuid())
                .bind(user.as_uuid())
                .bind(research.run_id.as_uuid())
                .bind(research.thread_id.map(|thread| thread.as_uuid()))
                .bind(&research.query)
                .bind(&research.model)
                .bind(sqlx::types::Json(&research.config))
                .bind(sqlx::types::Json(serde_json::json!([])))
                .bind(sqlx::types::Json(&empty))
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn finish_research(
                &self,
                user: UserId,
                id: RunId,
                outcome: &ResearchOutcome,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE research SET status = $3, report = $4, sources = $5, usage = $6, \
                     stage_timings = $7, word_count = $8, source_count = $9, duration_ms = $10, \
                     error = $11, finished_at = $12 \
                     WHERE id = $1 AND user_id = $2 AND status = 'running'",
                )
                .bind(id.as_uuid())
                .bind(user.as_uuid())
                .bind(outcome.status.as_str())
                .bind(&outcome.report)
                .bind(sqlx::types::Json(&outcome.sources))
                .bind(sqlx::types::Json(&outcome.usage))
                .bind(sqlx::types::Json(&outcome.stage_timings))
                .bind(outcome.word_count)
                .bind(outcome.source_count)
                .bind(outcome.duration_ms)
                .bind(&outcome.error)
                .bind(now())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn get_research(&self, user: UserId, id: RunId) -> StoreResult<ResearchRecord> {
                let sql = format!(
                    "SELECT {RESEARCH_COLUMNS} FROM research WHERE id = $1 AND user_id = $2"
                );
                let row = sqlx::query(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or(StoreError::NotFound("research"))?;
                Ok(research_row(&row)?)
            }

            async fn list_research(
                &self,
                user: UserId,
                limit: i64,
            ) -> StoreResult<Vec<ResearchRecord>> {
                let sql = format!(
                    "SELECT {RESEARCH_COLUMNS} FROM research WHERE user_id = $1 \
                     ORDER BY created_at DESC, id DESC LIMIT $2"
                );
                let rows = sqlx::query(&sql)
                    .bind(user.as_uuid())
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.iter().map(research_row).collect::<Result<_, _>>()?)
            }

            async fn delete_research(&self, user: UserId, id: RunId) -> StoreResult<()> {
                let done = sqlx::query("DELETE FROM research WHERE id = $1 AND user_id = $2")
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::NotFound("research"));
                }
                Ok(())
            }
        }
    };
}

pub(crate) use sql_research_store;
