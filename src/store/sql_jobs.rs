//! The job-queue SQL shared by both backends, expanded per backend by `sql_job_store!`.
//! `$skip_locked` is `FOR UPDATE SKIP LOCKED` on PostgreSQL (replicas claim different jobs
//! without waiting) and empty on SQLite, whose single writer makes the claim atomic.

macro_rules! sql_job_store {
    ($store:ty, $skip_locked:literal) => {
        #[async_trait::async_trait]
        impl crate::store::JobStore for $store {
            async fn enqueue_job(
                &self,
                user: UserId,
                kind: JobKind,
                key: &str,
                payload: &serde_json::Value,
                after_run: Option<RunId>,
            ) -> StoreResult<bool> {
                let at = now();
                let done = sqlx::query(
                    "INSERT INTO jobs (id, user_id, kind, run_id, key, payload, status, attempts, run_after, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'queued', 0, $7, $7) ON CONFLICT (key) DO NOTHING",
                )
                .bind(JobId::new().as_uuid())
                .bind(user.as_uuid())
                .bind(kind.as_str())
                .bind(after_run.map(|run| run.as_uuid()))
                .bind(key)
                .bind(sqlx::types::Json(payload))
                .bind(at)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn claim_job(
                &self,
                lease: chrono::Duration,
                max_attempts: i64,
            ) -> StoreResult<Option<Job>> {
                let at = now();
                sqlx::query(
                    "UPDATE jobs SET status = 'failed', finished_at = $1, locked_until = NULL, \
                     last_error = 'the worker stopped during every attempt' \
                     WHERE status = 'running' AND locked_until < $1 AND attempts >= $2",
                )
                .bind(at)
                .bind(max_attempts)
                .execute(&self.pool)
                .await?;
                let sql = concat!(
                    "UPDATE jobs SET status = 'running', attempts = attempts + 1, locked_until = $1 \
                     WHERE id = (SELECT id FROM jobs WHERE ((status = 'queued' AND run_after <= $2) \
                     OR (status = 'running' AND locked_until < $2 AND attempts < $3)) AND NOT EXISTS \
                     (SELECT 1 FROM runs r WHERE r.id = jobs.run_id AND r.status = 'running') \
                     ORDER BY run_after LIMIT 1 ",
                    $skip_locked,
                    ") RETURNING id, user_id, kind, payload, attempts, created_at"
                );
                let row = sqlx::query_as::<_, rows::JobRow>(sql)
                    .bind(at + lease)
                    .bind(at)
                    .bind(max_attempts)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(rows::optional(row)?)
            }

            async fn complete_job(&self, id: JobId, result: &JobResult) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE jobs SET status = 'done', finished_at = $1, locked_until = NULL, result = $2 \
                     WHERE id = $3",
                )
                .bind(now())
                .bind(sqlx::types::Json(result))
                .bind(id.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn fail_job(
                &self,
                id: JobId,
                error: &str,
                retry_at: Option<DateTime<Utc>>,
            ) -> StoreResult<()> {
                let (status, run_after, finished) = match retry_at {
                    Some(at) => ("queued", at, None),
                    None => ("failed", now(), Some(now())),
                };
                sqlx::query(
                    "UPDATE jobs SET status = $1, run_after = $2, finished_at = $3, last_error = $4, \
                     locked_until = NULL WHERE id = $5",
                )
                .bind(status)
                .bind(run_after)
                .bind(finished)
                .bind(error)
                .bind(id.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn queue_stats(&self) -> StoreResult<QueueStats> {
                let counts = sqlx::query_as::<_, rows::JobCountRow>(
                    "SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM jobs \
                     WHERE status IN ('queued', 'running', 'failed') GROUP BY status",
                )
                .fetch_all(&self.pool)
                .await?;
                let mut stats = QueueStats::default();
                for row in counts {
                    let count = row.n;
                    match row.status.as_str() {
                        "queued" => {
                            stats.queued = count;
                            stats.oldest_queued_secs = row
                                .oldest
                                .map(|oldest| (now() - oldest).num_milliseconds().max(0) as f64 / 1000.0)
                                .unwrap_or(0.0);
                        }
                        "running" => stats.running = count,
                        _ => stats.failed = count,
                    }
                }
                let failures = sqlx::query_as::<_, rows::FailedJobRow>(
                    "SELECT kind, attempts, last_error, finished_at FROM jobs WHERE status = 'failed' \
                     ORDER BY finished_at DESC LIMIT 5",
                )
                .fetch_all(&self.pool)
                .await?;
                stats.recent_failures = rows::all(failures)?;
                Ok(stats)
            }

            async fn job_status(&self, user: UserId, key: &str) -> StoreResult<Option<JobStatus>> {
                let status: Option<String> =
                    sqlx::query_scalar("SELECT status FROM jobs WHERE key = $1 AND user_id = $2")
                        .bind(key)
                        .bind(user.as_uuid())
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(status
                    .map(|status| text_enum::decode("jobs.status", &status))
                    .transpose()?)
            }

            async fn run_memory_job(
                &self,
                user: UserId,
                run: RunId,
            ) -> StoreResult<Option<JobRecord>> {
                let row = sqlx::query_as::<_, rows::JobRecordRow>(
                    "SELECT key, kind, status, result FROM jobs \
                     WHERE run_id = $1 AND user_id = $2 AND kind = 'turn' LIMIT 1",
                )
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                Ok(rows::optional(row)?)
            }
        }
    };
}

pub(crate) use sql_job_store;
