//! The run-lease and run-command SQL shared by both backends, expanded per backend by
//! `sql_run_control_store!`. `$notify` is a statement run in the transaction that stores a
//! command (PostgreSQL's `pg_notify`, which wakes the owner at commit); `None` on SQLite.

macro_rules! sql_run_control_store {
    ($store:ty, $notify:expr) => {
        /// Wakes the owner of a run a command was stored for, in the storing transaction.
        const NOTIFY_COMMAND: Option<&str> = $notify;

        /// The part of a sweep's condition shared by the search and the take-over: `$1` now,
        /// `$2` the unclaimed cut-off, `$3` the predecessor.
        const TAKEABLE: &str = "(lease_expires_at < $1 \
             OR (owner IS NULL AND updated_at < $2) \
             OR owner = $3)";

        #[async_trait::async_trait]
        impl crate::store::RunControlStore for $store {
            async fn claim_run(
                &self,
                run: RunId,
                replica: ReplicaId,
                until: DateTime<Utc>,
            ) -> StoreResult<bool> {
                let done = sqlx::query(
                    "UPDATE runs SET owner = $1, lease_expires_at = $2 \
                     WHERE id = $3 AND status = 'running' AND owner IS NULL",
                )
                .bind(replica.as_uuid())
                .bind(until)
                .bind(run.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn renew_leases(
                &self,
                replica: ReplicaId,
                until: DateTime<Utc>,
            ) -> StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE runs SET lease_expires_at = $1 \
                     WHERE owner = $2 AND status = 'running'",
                )
                .bind(until)
                .bind(replica.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn expired_runs(&self, sweep: &Sweep) -> StoreResult<Vec<ExpiredRun>> {
                let sql = format!(
                    "SELECT id, user_id, owner FROM runs \
                     WHERE status = 'running' AND {TAKEABLE} ORDER BY id"
                );
                let found = sqlx::query_as::<_, rows::ExpiredRunRow>(&sql)
                    .bind(sweep.now)
                    .bind(sweep.unclaimed_before)
                    .bind(sweep.predecessor.map(|replica| replica.as_uuid()))
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows::all(found)?)
            }

            async fn take_over_run(
                &self,
                expired: &ExpiredRun,
                sweep: &Sweep,
                replica: ReplicaId,
                until: DateTime<Utc>,
            ) -> StoreResult<Option<i64>> {
                let sql = format!(
                    "UPDATE runs SET owner = $4, lease_expires_at = $5, awaiting_input = FALSE \
                     WHERE id = $6 AND user_id = $7 AND status = 'running' \
                     AND owner IS NOT DISTINCT FROM $8 AND {TAKEABLE} RETURNING last_seq"
                );
                let taken: Option<(i64,)> = sqlx::query_as(&sql)
                    .bind(sweep.now)
                    .bind(sweep.unclaimed_before)
                    .bind(sweep.predecessor.map(|replica| replica.as_uuid()))
                    .bind(replica.as_uuid())
                    .bind(until)
                    .bind(expired.run.as_uuid())
                    .bind(expired.user.as_uuid())
                    .bind(expired.owner.map(|owner| owner.as_uuid()))
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(taken.map(|(last_seq,)| last_seq))
            }

            async fn interrupt_research_of_run(&self, run: RunId) -> StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE research SET status = 'interrupted', finished_at = $1, \
                     error = 'the server stopped during this research' \
                     WHERE run_id = $2 AND status = 'running'",
                )
                .bind(now())
                .bind(run.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn interrupt_orphaned_research(
                &self,
                ended_before: DateTime<Utc>,
            ) -> StoreResult<u64> {
                let done = sqlx::query(
                    "UPDATE research SET status = 'interrupted', finished_at = $1, \
                     error = 'the server stopped during this research' \
                     WHERE status = 'running' AND NOT EXISTS (SELECT 1 FROM runs r \
                     WHERE r.id = research.run_id \
                     AND (r.status = 'running' OR r.finished_at >= $2))",
                )
                .bind(now())
                .bind(ended_before)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected())
            }

            async fn send_run_command(
                &self,
                user: UserId,
                run: RunId,
                command: &RunCommand,
            ) -> StoreResult<CommandSent> {
                let mut tx = self.pool.begin().await?;
                let (status, awaiting_input): (String, bool) = sqlx::query_as(
                    "SELECT status, awaiting_input FROM runs WHERE id = $1 AND user_id = $2",
                )
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound("run"))?;
                let status: RunStatus = text_enum::decode("runs.status", &status)?;
                if status.is_terminal() {
                    return Ok(CommandSent::NotRunning);
                }
                let payload = match command {
                    RunCommand::Cancel => serde_json::Value::Null,
                    RunCommand::Input(value) => {
                        if !awaiting_input {
                            return Ok(CommandSent::NotAwaiting);
                        }
                        value.clone()
                    }
                };
                sqlx::query(
                    "INSERT INTO run_commands (id, run_id, kind, payload, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(run.as_uuid())
                .bind(command.kind().as_str())
                .bind(sqlx::types::Json(payload))
                .bind(now())
                .execute(&mut *tx)
                .await?;
                if let Some(notify) = NOTIFY_COMMAND {
                    sqlx::query(notify).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(CommandSent::Sent)
            }

            async fn running_run_count(&self, user: UserId) -> StoreResult<i64> {
                let (count,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM runs WHERE user_id = $1 AND status = 'running'",
                )
                .bind(user.as_uuid())
                .fetch_one(&self.pool)
                .await?;
                Ok(count)
            }

            async fn running_runs_of_thread(
                &self,
                user: UserId,
                thread: ThreadId,
            ) -> StoreResult<Vec<RunId>> {
                let found: Vec<(uuid::Uuid,)> = sqlx::query_as(
                    "SELECT id FROM runs WHERE user_id = $1 AND thread_id = $2 \
                     AND status = 'running' ORDER BY id",
                )
                .bind(user.as_uuid())
                .bind(thread.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                Ok(found
                    .into_iter()
                    .map(|(id,)| RunId::from_uuid(id))
                    .collect())
            }

            async fn take_run_commands(
                &self,
                replica: ReplicaId,
            ) -> StoreResult<Vec<(RunId, RunCommand)>> {
                let found = sqlx::query_as::<_, rows::RunCommandRow>(
                    "DELETE FROM run_commands \
                     WHERE run_id IN (SELECT id FROM runs WHERE owner = $1) \
                     RETURNING id, run_id, kind, payload",
                )
                .bind(replica.as_uuid())
                .fetch_all(&self.pool)
                .await?;
                let mut taken: Vec<(uuid::Uuid, RunId, RunCommand)> = rows::all(found)?;
                // Ids are time-ordered: the order they were sent in.
                taken.sort_by_key(|(id, _, _)| *id);
                Ok(taken
                    .into_iter()
                    .map(|(_, run, command)| (run, command))
                    .collect())
            }

            async fn drop_stale_run_commands(&self, before: DateTime<Utc>) -> StoreResult<u64> {
                let done = sqlx::query("DELETE FROM run_commands WHERE created_at < $1")
                    .bind(before)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }

            async fn touch_run_reader(
                &self,
                user: UserId,
                run: RunId,
                until: DateTime<Utc>,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE runs SET read_until = $1 WHERE id = $2 AND user_id = $3 \
                     AND status = 'running' AND (read_until IS NULL OR read_until < $1)",
                )
                .bind(until)
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn remote_readers_until(&self, run: RunId) -> StoreResult<Option<DateTime<Utc>>> {
                let found: Option<(Option<DateTime<Utc>>,)> =
                    sqlx::query_as("SELECT read_until FROM runs WHERE id = $1")
                        .bind(run.as_uuid())
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(found.and_then(|(until,)| until))
            }

            async fn set_awaiting_input(
                &self,
                user: UserId,
                run: RunId,
                awaiting: bool,
            ) -> StoreResult<()> {
                sqlx::query("UPDATE runs SET awaiting_input = $1 WHERE id = $2 AND user_id = $3")
                    .bind(awaiting)
                    .bind(run.as_uuid())
                    .bind(user.as_uuid())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn save_run_checkpoint(
                &self,
                user: UserId,
                run: RunId,
                replica: ReplicaId,
                checkpoint: &serde_json::Value,
            ) -> StoreResult<()> {
                let saved = sqlx::query(
                    "UPDATE runs SET checkpoint = $1 \
                     WHERE id = $2 AND user_id = $3 AND status = 'running' AND owner = $4",
                )
                .bind(sqlx::types::Json(checkpoint))
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .bind(replica.as_uuid())
                .execute(&self.pool)
                .await?;
                if saved.rows_affected() == 1 {
                    return Ok(());
                }
                let owner: Option<(Option<uuid::Uuid>,)> = sqlx::query_as(
                    "SELECT owner FROM runs WHERE id = $1 AND user_id = $2 AND status = 'running'",
                )
                .bind(run.as_uuid())
                .bind(user.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
                Err(match owner {
                    Some(_) => StoreError::Conflict(format!(
                        "run {run} is executed by another replica now"
                    )),
                    None => StoreError::NotFound("run"),
                })
            }

            async fn release_run(&self, run: RunId, replica: ReplicaId) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE runs SET lease_expires_at = $1 \
                     WHERE id = $2 AND owner = $3 AND status = 'running'",
                )
                .bind(now())
                .bind(run.as_uuid())
                .bind(replica.as_uuid())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn run_checkpoint(
                &self,
                user: UserId,
                run: RunId,
            ) -> StoreResult<Option<serde_json::Value>> {
                let found: Option<(Option<sqlx::types::Json<serde_json::Value>>,)> =
                    sqlx::query_as("SELECT checkpoint FROM runs WHERE id = $1 AND user_id = $2")
                        .bind(run.as_uuid())
                        .bind(user.as_uuid())
                        .fetch_optional(&self.pool)
                        .await?;
                let (checkpoint,) = found.ok_or(StoreError::NotFound("run"))?;
                Ok(checkpoint.map(|json| json.0))
            }
        }
    };
}

pub(crate) use sql_run_control_store;
