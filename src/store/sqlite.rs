//! The embedded default: SQLite in WAL mode with foreign keys on.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite};

use super::sql::sql_store;
use super::sql_documents::sql_document_store;
use super::sql_jobs::sql_job_store;
use super::sql_memory::sql_memory_store;
use super::sql_research::sql_research_store;
use super::*;

pub struct SqliteStore {
    pool: Pool<Sqlite>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file and runs the SQLite migrations.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }
}

sql_store!(SqliteStore, Sqlite, sqlx::sqlite::SqliteRow, "sqlite");

// Any write statement takes SQLite's single write lock at once, so a transaction that reads
// before it writes cannot fail to upgrade its lock.
sql_memory_store!(
    SqliteStore,
    Sqlite,
    sqlx::sqlite::SqliteRow,
    "UPDATE index_watermarks SET seq = seq WHERE name = ''"
);

sql_job_store!(SqliteStore, sqlx::sqlite::SqliteRow, "");

sql_research_store!(SqliteStore, sqlx::sqlite::SqliteRow);

sql_document_store!(
    SqliteStore,
    sqlx::sqlite::SqliteRow,
    "EXISTS (SELECT 1 FROM json_each(memories.source_refs) AS r WHERE r.value = $3)"
);
