//! PostgreSQL, for production and for several replicas sharing one database.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::sql::sql_store;
use super::sql_accounts::sql_account_store;
use super::sql_documents::sql_document_store;
use super::sql_jobs::sql_job_store;
use super::sql_memory::sql_memory_store;
use super::sql_research::sql_research_store;
use super::sql_run_control::sql_run_control_store;
use super::*;

pub(crate) struct PostgresStore {
    pool: Pool<Postgres>,
}

impl PostgresStore {
    /// Connects and runs the PostgreSQL migrations.
    pub(crate) async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(acquire_timeout)
            .connect(url)
            .await
            .map_err(|error| StoreError::Unavailable(error.to_string()))?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        Ok(Self { pool })
    }

    /// Every read goes through the pool (see `SqliteStore::read_rows_directly`).
    fn read_rows_directly(&self, _user: UserId, _ids: &[MemoryId]) -> Option<Vec<Memory>> {
        None
    }
}

sql_store!(
    PostgresStore,
    Postgres,
    "postgres",
    Some("SELECT pg_notify('mnemo_run_events', $1)")
);

sql_account_store!(PostgresStore);

sql_memory_store!(
    PostgresStore,
    Postgres,
    // The lock serialises log appends; the notification (sent at commit) wakes the indexers
    // of the other replicas at once rather than at their next poll.
    "SELECT pg_advisory_xact_lock(727362), pg_notify('mnemo_memory_log', '')",
    true
);

sql_job_store!(PostgresStore, "FOR UPDATE SKIP LOCKED");

sql_research_store!(PostgresStore);

sql_document_store!(
    PostgresStore,
    "memories.source_refs @> jsonb_build_array($3::text)"
);

sql_run_control_store!(
    PostgresStore,
    Some("SELECT pg_notify('mnemo_run_commands', '')")
);

#[async_trait::async_trait]
impl run_control::Wakeups for PostgresStore {
    async fn wakeups(
        &self,
        channel: run_control::WakeChannel,
    ) -> Option<futures::stream::BoxStream<'static, String>> {
        use futures::StreamExt as _;
        // A pool of its own, so the listening connection is not taken from the statements'.
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(options);
        let name = channel.name();
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, channel = name, "could not listen; polling only");
                return None;
            }
        };
        if let Err(error) = listener.listen(name).await {
            tracing::warn!(%error, channel = name, "could not listen; polling only");
            return None;
        }
        // `recv` reconnects after a lost connection (notifications sent meanwhile are lost:
        // polling picks up what they were about); an error ends the stream.
        let wakeups = futures::stream::unfold(listener, move |mut listener| async move {
            match listener.recv().await {
                Ok(notification) => Some((notification.payload().to_string(), listener)),
                Err(error) => {
                    tracing::warn!(%error, channel = name, "listening failed; polling only");
                    None
                }
            }
        });
        Some(wakeups.boxed())
    }
}
