//! Memory rows read by id straight from the SQLite file, on the calling thread: recall's
//! reads on the embedded store.
//!
//! Recall reads 16–200 rows by primary key per request. Through sqlx every read is a round
//! trip to the pool connection's worker thread, each value of each row is copied into the row
//! sqlx sends back over a channel (the 1.5 KB embedding included) and copied again into our
//! `Memory`, and the `IN (…)` list is built into a temporary b-tree: 0.6 ms for 16 rows at a
//! user with 1,000 memories, twice the BM25 search. Here the same statement runs on a
//! read-only connection to the same file and is decoded from SQLite's own buffers: the ids go
//! in as one JSON array of hex strings joined to the primary key (one cached statement for
//! any number of ids, one read snapshot, no temporary b-tree).
//!
//! WAL mode lets readers run beside the pool's writer and see every committed write, so this
//! reads what the sqlx path would. Reading a few dozen rows from the page cache takes tens of
//! microseconds, less than a hand-off to another thread; the caller's task runs it. Any
//! failure here (the file cannot be opened, a row does not decode) sends the read back to the
//! sqlx path, which reports it as before.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDateTime, Utc};
use rusqlite::{Connection, OpenFlags, Row};
use uuid::Uuid;

use super::{Memory, MemoryId, ThreadId, UserId, vector_from_bytes};
use crate::enums::UnknownText;

/// Idle connections kept for reuse (more are opened when more readers run at once).
const IDLE_CONNECTIONS: usize = 4;

/// The memory columns in the order `decode` reads them.
const SELECT: &str = "SELECT m.id, m.kind, m.content, m.source, m.trust, m.importance, \
    m.thread_id, m.source_refs, m.valid_from, m.invalid_at, m.supersedes, m.created_at, \
    m.updated_at, m.last_accessed_at, m.access_count, m.archived_at, m.version, m.embedding, \
    m.embedding_model \
    FROM json_each(?1) AS wanted CROSS JOIN memories AS m ON m.id = unhex(wanted.value) \
    WHERE m.user_id = ?2";

/// Read-only connections to one database file.
pub(crate) struct RowReader {
    path: PathBuf,
    mmap_bytes: u64,
    cache_kib: u64,
    idle: Mutex<Vec<Connection>>,
}

/// Why a direct read did not give rows (the caller reads through sqlx instead).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Value(#[from] rusqlite::types::FromSqlError),
    #[error("column {0}: {1}")]
    Decode(&'static str, String),
}

impl RowReader {
    /// A reader of the database at `path`, with the pool's memory map and page cache sizes.
    pub(crate) fn new(path: &Path, mmap_bytes: u64, cache_kib: u64) -> Self {
        Self {
            path: path.to_path_buf(),
            mmap_bytes,
            cache_kib,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// `user`'s memories among `ids` (each id once; missing or other users' ids are left
    /// out), in no particular order.
    pub(crate) fn memories_by_ids(
        &self,
        user: UserId,
        ids: &[MemoryId],
    ) -> Result<Vec<Memory>, ReadError> {
        let taken = self.idle.lock().pop();
        let connection = match taken {
            Some(connection) => connection,
            None => self.open()?,
        };
        let found = read(&connection, user, ids);
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(connection);
        }
        found
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        let connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.busy_timeout(std::time::Duration::from_secs(10))?;
        connection.pragma_update(None, "mmap_size", self.mmap_bytes)?;
        connection.pragma_update(None, "cache_size", format!("-{}", self.cache_kib))?;
        Ok(connection)
    }
}

fn read(connection: &Connection, user: UserId, ids: &[MemoryId]) -> Result<Vec<Memory>, ReadError> {
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    let mut wanted = String::with_capacity(ids.len() * 35 + 2);
    wanted.push('[');
    for id in ids.iter().filter(|id| seen.insert(**id)) {
        if wanted.len() > 1 {
            wanted.push(',');
        }
        wanted.push('"');
        wanted.push_str(&id.as_uuid().simple().to_string());
        wanted.push('"');
    }
    wanted.push(']');
    let mut statement = connection.prepare_cached(SELECT)?;
    let mut rows = statement.query((wanted, user.as_uuid().as_bytes().as_slice()))?;
    let mut found = Vec::with_capacity(seen.len());
    while let Some(row) = rows.next()? {
        found.push(decode(row)?);
    }
    Ok(found)
}

fn decode(row: &Row<'_>) -> Result<Memory, ReadError> {
    let refs: String = row.get(7)?;
    let embedding = row.get_ref(17)?.as_blob()?;
    Ok(Memory {
        id: MemoryId::from_uuid(uuid(row, 0, "id")?),
        kind: text_enum(row, 1, "kind")?,
        content: row.get(2)?,
        source: text_enum(row, 3, "source")?,
        trust: text_enum(row, 4, "trust")?,
        importance: row.get::<_, i64>(5)?.clamp(1, 5) as u8,
        thread_id: optional_uuid(row, 6, "thread_id")?.map(ThreadId::from_uuid),
        source_refs: serde_json::from_str(&refs)
            .map_err(|e| ReadError::Decode("source_refs", e.to_string()))?,
        valid_from: time(row, 8, "valid_from")?,
        invalid_at: optional_time(row, 9, "invalid_at")?,
        supersedes: optional_uuid(row, 10, "supersedes")?.map(MemoryId::from_uuid),
        created_at: time(row, 11, "created_at")?,
        updated_at: time(row, 12, "updated_at")?,
        last_accessed_at: optional_time(row, 13, "last_accessed_at")?,
        access_count: row.get(14)?,
        archived_at: optional_time(row, 15, "archived_at")?,
        version: row.get(16)?,
        embedding: vector_from_bytes(embedding),
        embedding_model: row.get(18)?,
        superseded_by: None,
    })
}

fn text_enum<T: std::str::FromStr<Err = UnknownText>>(
    row: &Row<'_>,
    index: usize,
    column: &'static str,
) -> Result<T, ReadError> {
    let text = row.get_ref(index)?.as_str()?;
    text.parse()
        .map_err(|error: UnknownText| ReadError::Decode(column, error.to_string()))
}

fn uuid(row: &Row<'_>, index: usize, column: &'static str) -> Result<Uuid, ReadError> {
    optional_uuid(row, index, column)?.ok_or(ReadError::Decode(column, "null".into()))
}

fn optional_uuid(
    row: &Row<'_>,
    index: usize,
    column: &'static str,
) -> Result<Option<Uuid>, ReadError> {
    match row.get_ref(index)?.as_blob_or_null()? {
        None => Ok(None),
        Some(bytes) => Uuid::from_slice(bytes)
            .map(Some)
            .map_err(|e| ReadError::Decode(column, e.to_string())),
    }
}

fn time(row: &Row<'_>, index: usize, column: &'static str) -> Result<DateTime<Utc>, ReadError> {
    optional_time(row, index, column)?.ok_or(ReadError::Decode(column, "null".into()))
}

/// Times as sqlx writes them (RFC 3339), or SQLite's own `YYYY-MM-DD HH:MM:SS[.fff]` (UTC).
fn optional_time(
    row: &Row<'_>,
    index: usize,
    column: &'static str,
) -> Result<Option<DateTime<Utc>>, ReadError> {
    let Some(text) = row.get_ref(index)?.as_str_or_null()? else {
        return Ok(None);
    };
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(time.with_timezone(&Utc)));
    }
    ["%F %T%.f", "%FT%T%.f"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
        .map(|time| Some(time.and_utc()))
        .ok_or_else(|| ReadError::Decode(column, format!("not a time: {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Embedded, MemoryKind, NewMemory, UserKind};

    /// The reader itself (not the pool it falls back to) reads what the pool wrote, including
    /// a write made after its connection was opened.
    #[tokio::test]
    async fn reads_what_the_pool_wrote_and_commits_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::connect(
            &crate::testing::sqlite_url(dir.path()),
            2,
            std::time::Duration::from_secs(10),
        )
        .await
        .unwrap();
        let alice = store.create_user("alice", UserKind::Key).await.unwrap();
        let add = |text: &'static str, x: f32| {
            let store = store.clone();
            async move {
                let fact = NewMemory::from_user(MemoryKind::Fact, text, 3);
                let embedded = Embedded {
                    vector: vec![x, 0.5],
                    model: "m".into(),
                };
                store
                    .insert_memories(alice.id, vec![(fact, embedded)])
                    .await
                    .unwrap()
            }
        };
        let first = add("owns a red bike", 0.25).await;
        let reader = RowReader::new(&dir.path().join("mnemo.db"), 1 << 20, 1024);
        let read = reader.memories_by_ids(alice.id, &[first[0].id]).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].content, "owns a red bike");
        assert_eq!(read[0].embedding, vec![0.25, 0.5]);
        assert_eq!(read[0].created_at, first[0].created_at);
        let second = add("sold the red bike", 0.75).await;
        let mut read = reader
            .memories_by_ids(alice.id, &[second[0].id, first[0].id, second[0].id])
            .unwrap();
        read.sort_by_key(|memory| memory.id);
        let contents: Vec<&str> = read.iter().map(|memory| memory.content.as_str()).collect();
        assert_eq!(contents, ["owns a red bike", "sold the red bike"]);
        let bob = store.create_user("bob", UserKind::Key).await.unwrap();
        assert!(
            reader
                .memories_by_ids(bob.id, &[first[0].id])
                .unwrap()
                .is_empty()
        );
    }
}
