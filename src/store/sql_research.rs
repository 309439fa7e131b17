//! The research-record SQL shared by both backends, expanded per backend by
//! `sql_research_store!` like the other store macros.

macro_rules! sql_research_store {
    ($store:ty) => {
        /// The columns of `rows::ResearchRow`.
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
                let row = sqlx::query_as::<_, rows::ResearchRow>(&sql)
                    .bind(id.as_uuid())
                    .bind(user.as_uuid())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or(StoreError::NotFound("research"))?;
                Ok(row.try_into()?)
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
                let found = sqlx::query_as::<_, rows::ResearchRow>(&sql)
                    .bind(user.as_uuid())
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
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
