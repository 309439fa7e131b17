//! PostgreSQL, for production and for several replicas sharing one database.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::sql::sql_store;
use super::sql_documents::sql_document_store;
use super::sql_jobs::sql_job_store;
use super::sql_memory::sql_memory_store;
use super::sql_research::sql_research_store;
use super::*;

pub struct PostgresStore {
    pool: Pool<Postgres>,
}

impl PostgresStore {
    /// Connects and runs the PostgreSQL migrations.
    pub async fn connect(
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
}

sql_store!(PostgresStore, Postgres, sqlx::postgres::PgRow, "postgres");

sql_memory_store!(
    PostgresStore,
    Postgres,
    sqlx::postgres::PgRow,
    "SELECT pg_advisory_xact_lock(727362)"
);

sql_job_store!(
    PostgresStore,
    sqlx::postgres::PgRow,
    "FOR UPDATE SKIP LOCKED"
);

sql_research_store!(PostgresStore, sqlx::postgres::PgRow);

sql_document_store!(
    PostgresStore,
    sqlx::postgres::PgRow,
    "memories.source_refs @> jsonb_build_array($3::text)"
);
