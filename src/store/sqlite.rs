//! The embedded default: SQLite in WAL mode with foreign keys on.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite};

use super::sql::sql_store;
use super::sql_accounts::sql_account_store;
use super::sql_documents::sql_document_store;
use super::sql_jobs::sql_job_store;
use super::sql_memory::sql_memory_store;
use super::sql_research::sql_research_store;
use super::sql_run_control::sql_run_control_store;
use super::sqlite_rows::RowReader;
use super::*;

/// Bytes of the database file mapped into memory (address space, not resident memory).
const MMAP_BYTES: u64 = 1 << 30;
/// Page cache per connection, in KiB.
const CACHE_KIB: u64 = 32 * 1024;

pub struct SqliteStore {
    pool: Pool<Sqlite>,
    /// Recall's reads by id, straight from the file; `None` for an in-memory database.
    rows: Option<RowReader>,
    /// A direct read has failed once (and was warned about).
    rows_failed: std::sync::atomic::AtomicBool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file and runs the SQLite migrations.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)?;
        let file = options.get_filename().to_path_buf();
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10))
            // Recall reads ~100 random rows of a table that can hold millions: mapped pages
            // and a larger page cache keep those reads off the read() path.
            .pragma("mmap_size", MMAP_BYTES.to_string())
            .pragma("cache_size", format!("-{CACHE_KIB}"));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            // The database is a file in this process: there is no link to test, and the
            // ping would cost a round trip to the connection's thread on every query.
            .test_before_acquire(false)
            .acquire_timeout(acquire_timeout)
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let rows =
            (!in_memory && file.is_file()).then(|| RowReader::new(&file, MMAP_BYTES, CACHE_KIB));
        Ok(Self {
            pool,
            rows,
            rows_failed: Default::default(),
        })
    }

    /// `user`'s memories among `ids` read by [`RowReader`]; `None` sends the read through
    /// the pool (an in-memory database, or the direct read failed: the pool's read reports
    /// what is wrong).
    fn read_rows_directly(&self, user: UserId, ids: &[MemoryId]) -> Option<Vec<Memory>> {
        match self.rows.as_ref()?.memories_by_ids(user, ids) {
            Ok(found) => Some(found),
            Err(error) => {
                if self
                    .rows_failed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::debug!(%error, "direct read of memory rows failed");
                } else {
                    tracing::warn!(%error, "direct read of memory rows failed; reading through the pool");
                }
                None
            }
        }
    }
}

sql_store!(SqliteStore, Sqlite, "sqlite", None);

sql_account_store!(SqliteStore);

// Any write statement takes SQLite's single write lock at once, so a transaction that reads
// before it writes cannot fail to upgrade its lock.
sql_memory_store!(
    SqliteStore,
    Sqlite,
    "UPDATE index_watermarks SET seq = seq WHERE name = ''",
    false
);

sql_job_store!(SqliteStore, "");

sql_research_store!(SqliteStore);

sql_document_store!(
    SqliteStore,
    "EXISTS (SELECT 1 FROM json_each(memories.source_refs) AS r WHERE r.value = $3)"
);

sql_run_control_store!(SqliteStore, None);

#[async_trait::async_trait]
impl run_control::Wakeups for SqliteStore {
    /// SQLite cannot notify: readers poll.
    async fn wakeups(
        &self,
        _channel: run_control::WakeChannel,
    ) -> Option<futures::stream::BoxStream<'static, String>> {
        None
    }
}
