//! The rows the SQL store reads, one struct per result shape, each `#[derive(sqlx::FromRow)]`.
//! The derive is generic over the row type, so one struct reads a `PgRow` and a `SqliteRow`
//! alike: the fields hold what both backends decode (a `Uuid`, RFC 3339 text or timestamptz as
//! `DateTime<Utc>`, text or jsonb as `Json<…>`, bytes), and a column is read by its name.
//!
//! `TryFrom` turns a row into its domain type with the store's checks: text enums through
//! [`text_enum::decode`] (a corrupt row fails loudly, naming its column), `importance` clamped
//! to 1..=5, embedding bytes through [`vector_from_bytes`], user ids through
//! `UserId::from_trusted` (the store is the only maker of one).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use super::{
    ApiKeyInfo, Attachment, Document, DocumentState, Embedded, ExpiredRun, FailedJob,
    ForgottenMemory, Job, JobRecord, JobResult, LogEntry, Memory, MemoryId, MemoryVersion, Message,
    MessageId, OwnedMemory, ReplicaId, ResearchRecord, Run, RunCommand, RunCommandKind, RunId,
    StoredEvent, Thread, ThreadId, User, UserId, text_enum, vector_from_bytes,
};
use super::{DocumentId, JobId};

/// `users` with `USER_COLUMNS` (`sql.rs`): the key count and `has_password` are computed.
#[derive(sqlx::FromRow)]
pub(super) struct UserRow {
    id: Uuid,
    name: String,
    kind: String,
    created_at: DateTime<Utc>,
    active_keys: i64,
    memory_enabled: bool,
    is_admin: bool,
    disabled_at: Option<DateTime<Utc>>,
    has_password: bool,
}

impl TryFrom<UserRow> for User {
    type Error = sqlx::Error;

    fn try_from(row: UserRow) -> Result<Self, sqlx::Error> {
        Ok(User {
            id: UserId::from_trusted(row.id),
            name: row.name,
            kind: text_enum::decode("users.kind", &row.kind)?,
            created_at: row.created_at,
            active_keys: row.active_keys,
            memory_enabled: row.memory_enabled,
            is_admin: row.is_admin,
            disabled_at: row.disabled_at,
            has_password: row.has_password,
        })
    }
}

/// A user with the columns a password login checks.
#[derive(sqlx::FromRow)]
pub(super) struct PasswordLoginRow {
    #[sqlx(flatten)]
    pub(super) user: UserRow,
    pub(super) password_hash: Option<String>,
    pub(super) locked_until: Option<DateTime<Utc>>,
}

/// A user with their session's times.
#[derive(sqlx::FromRow)]
pub(super) struct SessionUserRow {
    #[sqlx(flatten)]
    pub(super) user: UserRow,
    pub(super) last_seen_at: DateTime<Utc>,
    pub(super) expires_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
pub(super) struct ApiKeyRow {
    prefix: String,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
}

impl TryFrom<ApiKeyRow> for ApiKeyInfo {
    type Error = sqlx::Error;

    fn try_from(row: ApiKeyRow) -> Result<Self, sqlx::Error> {
        Ok(ApiKeyInfo {
            prefix: row.prefix,
            created_at: row.created_at,
            revoked_at: row.revoked_at,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct ThreadRow {
    id: Uuid,
    title: String,
    temporary: bool,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<ThreadRow> for Thread {
    type Error = sqlx::Error;

    fn try_from(row: ThreadRow) -> Result<Self, sqlx::Error> {
        Ok(Thread {
            id: ThreadId::from_uuid(row.id),
            title: row.title,
            temporary: row.temporary,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// A message; rows written before `trust` existed take the trust of their role.
#[derive(sqlx::FromRow)]
pub(super) struct MessageRow {
    id: Uuid,
    thread_id: Uuid,
    role: String,
    content: String,
    author: Option<String>,
    run_id: Option<Uuid>,
    created_at: DateTime<Utc>,
    trust: Option<String>,
    attachments: Option<Json<Vec<Attachment>>>,
}

impl TryFrom<MessageRow> for Message {
    type Error = sqlx::Error;

    fn try_from(row: MessageRow) -> Result<Self, sqlx::Error> {
        let role = text_enum::decode("messages.role", &row.role)?;
        Ok(Message {
            id: MessageId::from_uuid(row.id),
            thread_id: ThreadId::from_uuid(row.thread_id),
            role,
            content: row.content,
            author: row.author,
            run_id: row.run_id.map(RunId::from_uuid),
            created_at: row.created_at,
            trust: match row.trust {
                Some(trust) => text_enum::decode("messages.trust", &trust)?,
                None => Message::trust_of(role),
            },
            attachments: row
                .attachments
                .map(|attached| attached.0)
                .unwrap_or_default(),
        })
    }
}

/// `runs` with `RUN_COLUMNS` (`sql.rs`).
#[derive(sqlx::FromRow)]
pub(super) struct RunRow {
    id: Uuid,
    thread_id: Option<Uuid>,
    kind: String,
    status: String,
    error: Option<String>,
    last_seq: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl TryFrom<RunRow> for Run {
    type Error = sqlx::Error;

    fn try_from(row: RunRow) -> Result<Self, sqlx::Error> {
        Ok(Run {
            id: RunId::from_uuid(row.id),
            thread_id: row.thread_id.map(ThreadId::from_uuid),
            kind: text_enum::decode("runs.kind", &row.kind)?,
            status: text_enum::decode("runs.status", &row.status)?,
            error: row.error,
            last_seq: row.last_seq,
            created_at: row.created_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
        })
    }
}

/// A run found by its idempotency key, with the digest of the request that started it.
#[derive(sqlx::FromRow)]
pub(super) struct IdempotentRunRow {
    #[sqlx(flatten)]
    pub(super) run: RunRow,
    pub(super) request_digest: Option<String>,
}

#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    seq: i64,
    event_type: String,
    #[sqlx(json)]
    data: Value,
    created_at: DateTime<Utc>,
}

impl TryFrom<EventRow> for StoredEvent {
    type Error = sqlx::Error;

    fn try_from(row: EventRow) -> Result<Self, sqlx::Error> {
        Ok(StoredEvent {
            seq: row.seq,
            event_type: text_enum::decode("run_events.event_type", &row.event_type)?,
            data: row.data,
            created_at: row.created_at,
        })
    }
}

/// `memories` with `memory_rows::COLUMNS` (`sql_memory.rs`); `superseded_by` is filled later.
#[derive(sqlx::FromRow)]
pub(super) struct MemoryRow {
    id: Uuid,
    kind: String,
    content: String,
    source: String,
    trust: String,
    importance: i64,
    thread_id: Option<Uuid>,
    source_refs: Json<Vec<String>>,
    valid_from: DateTime<Utc>,
    invalid_at: Option<DateTime<Utc>>,
    supersedes: Option<Uuid>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    last_accessed_at: Option<DateTime<Utc>>,
    access_count: i64,
    archived_at: Option<DateTime<Utc>>,
    version: i64,
    embedding: Vec<u8>,
    embedding_model: String,
}

impl TryFrom<MemoryRow> for Memory {
    type Error = sqlx::Error;

    fn try_from(row: MemoryRow) -> Result<Self, sqlx::Error> {
        Ok(Memory {
            id: MemoryId::from_uuid(row.id),
            kind: text_enum::decode("memories.kind", &row.kind)?,
            content: row.content,
            source: text_enum::decode("memories.source", &row.source)?,
            trust: text_enum::decode("memories.trust", &row.trust)?,
            importance: row.importance.clamp(1, 5) as u8,
            thread_id: row.thread_id.map(ThreadId::from_uuid),
            source_refs: row.source_refs.0,
            valid_from: row.valid_from,
            invalid_at: row.invalid_at,
            supersedes: row.supersedes.map(MemoryId::from_uuid),
            created_at: row.created_at,
            updated_at: row.updated_at,
            last_accessed_at: row.last_accessed_at,
            access_count: row.access_count,
            archived_at: row.archived_at,
            version: row.version,
            embedding_model: row.embedding_model,
            superseded_by: None,
            embedding: vector_from_bytes(&row.embedding),
        })
    }
}

/// A memory with its owner, for the maintenance passes that read across users.
#[derive(sqlx::FromRow)]
pub(super) struct OwnedMemoryRow {
    user_id: Uuid,
    #[sqlx(flatten)]
    memory: MemoryRow,
}

impl TryFrom<OwnedMemoryRow> for OwnedMemory {
    type Error = sqlx::Error;

    fn try_from(row: OwnedMemoryRow) -> Result<Self, sqlx::Error> {
        Ok(OwnedMemory {
            user: UserId::from_trusted(row.user_id),
            memory: row.memory.try_into()?,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct LogEntryRow {
    seq: i64,
    user_id: Uuid,
    memory_id: Option<Uuid>,
    op: String,
}

impl TryFrom<LogEntryRow> for LogEntry {
    type Error = sqlx::Error;

    fn try_from(row: LogEntryRow) -> Result<Self, sqlx::Error> {
        Ok(LogEntry {
            seq: row.seq,
            user: UserId::from_trusted(row.user_id),
            memory: row.memory_id.map(MemoryId::from_uuid),
            op: text_enum::decode("memory_log.op", &row.op)?,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct MemoryVersionRow {
    version: i64,
    change: String,
    #[sqlx(json)]
    snapshot: Value,
    changed_at: DateTime<Utc>,
}

impl TryFrom<MemoryVersionRow> for MemoryVersion {
    type Error = sqlx::Error;

    fn try_from(row: MemoryVersionRow) -> Result<Self, sqlx::Error> {
        Ok(MemoryVersion {
            version: row.version,
            change: row.change,
            snapshot: row.snapshot,
            changed_at: row.changed_at,
        })
    }
}

/// A forgotten memory not yet purged: its snapshot, with the embedding kept beside it.
#[derive(sqlx::FromRow)]
pub(super) struct ForgottenRow {
    snapshot: Json<Memory>,
    embedding: Option<Vec<u8>>,
    request: Option<String>,
    via: String,
    forgotten_at: DateTime<Utc>,
    purge_after: DateTime<Utc>,
}

impl TryFrom<ForgottenRow> for ForgottenMemory {
    type Error = sqlx::Error;

    fn try_from(row: ForgottenRow) -> Result<Self, sqlx::Error> {
        let mut memory = row.snapshot.0;
        memory.embedding = row
            .embedding
            .map(|bytes| vector_from_bytes(&bytes))
            .unwrap_or_default();
        Ok(ForgottenMemory {
            memory,
            request: row.request,
            via: text_enum::decode("forgotten_memories.via", &row.via)?,
            forgotten_at: row.forgotten_at,
            purge_after: row.purge_after,
        })
    }
}

/// What a restore reads of a forgotten memory: the entry's id, the snapshot, its history.
#[derive(sqlx::FromRow)]
pub(super) struct RestorableRow {
    pub(super) id: i64,
    pub(super) snapshot: Json<Memory>,
    pub(super) versions: Option<Json<Vec<MemoryVersion>>>,
    pub(super) embedding: Option<Vec<u8>>,
}

/// A turn's context-view embedding.
#[derive(sqlx::FromRow)]
pub(super) struct ContextEmbeddingRow {
    memory_id: Uuid,
    embedding: Vec<u8>,
    embedding_model: String,
}

impl TryFrom<ContextEmbeddingRow> for (MemoryId, Embedded) {
    type Error = sqlx::Error;

    fn try_from(row: ContextEmbeddingRow) -> Result<Self, sqlx::Error> {
        Ok((
            MemoryId::from_uuid(row.memory_id),
            Embedded {
                vector: vector_from_bytes(&row.embedding),
                model: row.embedding_model,
            },
        ))
    }
}

/// A turn with the turns before and after it in its thread.
#[derive(sqlx::FromRow)]
pub(super) struct TurnNeighboursRow {
    id: Uuid,
    previous: Option<Uuid>,
    following: Option<Uuid>,
}

impl TryFrom<TurnNeighboursRow> for (MemoryId, Option<MemoryId>, Option<MemoryId>) {
    type Error = sqlx::Error;

    fn try_from(row: TurnNeighboursRow) -> Result<Self, sqlx::Error> {
        Ok((
            MemoryId::from_uuid(row.id),
            row.previous.map(MemoryId::from_uuid),
            row.following.map(MemoryId::from_uuid),
        ))
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct JobRow {
    id: Uuid,
    user_id: Uuid,
    kind: String,
    #[sqlx(json)]
    payload: Value,
    attempts: i64,
    created_at: DateTime<Utc>,
}

impl TryFrom<JobRow> for Job {
    type Error = sqlx::Error;

    fn try_from(row: JobRow) -> Result<Self, sqlx::Error> {
        Ok(Job {
            id: JobId::from_uuid(row.id),
            user: UserId::from_trusted(row.user_id),
            kind: text_enum::decode("jobs.kind", &row.kind)?,
            payload: row.payload,
            attempts: row.attempts,
            created_at: row.created_at,
        })
    }
}

/// One status's count of jobs, with its oldest job's creation time.
#[derive(sqlx::FromRow)]
pub(super) struct JobCountRow {
    pub(super) status: String,
    pub(super) n: i64,
    pub(super) oldest: Option<DateTime<Utc>>,
}

/// A failed job for the queue's statistics: its error is cut to the first line's 200 chars.
#[derive(sqlx::FromRow)]
pub(super) struct FailedJobRow {
    kind: String,
    attempts: i64,
    last_error: Option<String>,
    finished_at: Option<DateTime<Utc>>,
}

impl TryFrom<FailedJobRow> for FailedJob {
    type Error = sqlx::Error;

    fn try_from(row: FailedJobRow) -> Result<Self, sqlx::Error> {
        let first_line = row
            .last_error
            .as_deref()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        Ok(FailedJob {
            kind: text_enum::decode("jobs.kind", &row.kind)?,
            attempts: row.attempts,
            error: crate::text::prefix(first_line, 200).to_string(),
            failed_at: row.finished_at,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct JobRecordRow {
    key: String,
    kind: String,
    status: String,
    result: Option<Json<JobResult>>,
}

impl TryFrom<JobRecordRow> for JobRecord {
    type Error = sqlx::Error;

    fn try_from(row: JobRecordRow) -> Result<Self, sqlx::Error> {
        Ok(JobRecord {
            key: row.key,
            kind: text_enum::decode("jobs.kind", &row.kind)?,
            status: text_enum::decode("jobs.status", &row.status)?,
            result: row.result.map(|result| result.0),
        })
    }
}

/// `documents` with `DOCUMENT_COLUMNS` (`sql_documents.rs`).
#[derive(sqlx::FromRow)]
pub(super) struct DocumentRow {
    id: Uuid,
    title: String,
    source: Option<String>,
    content_type: String,
    content_hash: Option<String>,
    chars: i64,
    chunks: i64,
    created_at: DateTime<Utc>,
}

impl TryFrom<DocumentRow> for Document {
    type Error = sqlx::Error;

    fn try_from(row: DocumentRow) -> Result<Self, sqlx::Error> {
        Ok(Document {
            id: DocumentId::from_uuid(row.id),
            title: row.title,
            source: row.source,
            content_type: row.content_type,
            content_hash: row.content_hash,
            chars: row.chars,
            chunks: row.chunks,
            created_at: row.created_at,
        })
    }
}

/// A document with its ingest state: complete once `ingested_at` is set.
#[derive(sqlx::FromRow)]
pub(super) struct DocumentStateRow {
    #[sqlx(flatten)]
    document: DocumentRow,
    generation: i64,
    ingested_at: Option<DateTime<Utc>>,
}

impl TryFrom<DocumentStateRow> for DocumentState {
    type Error = sqlx::Error;

    fn try_from(row: DocumentStateRow) -> Result<Self, sqlx::Error> {
        Ok(DocumentState {
            document: row.document.try_into()?,
            generation: row.generation,
            complete: row.ingested_at.is_some(),
        })
    }
}

/// `research` with `RESEARCH_COLUMNS` (`sql_research.rs`).
#[derive(sqlx::FromRow)]
pub(super) struct ResearchRow {
    id: Uuid,
    run_id: Uuid,
    thread_id: Option<Uuid>,
    query: String,
    model: Option<String>,
    status: String,
    #[sqlx(json)]
    config: Value,
    report: Option<String>,
    #[sqlx(json)]
    sources: Value,
    #[sqlx(json)]
    usage: Value,
    #[sqlx(json)]
    stage_timings: Value,
    word_count: i64,
    source_count: i64,
    duration_ms: Option<i64>,
    error: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl TryFrom<ResearchRow> for ResearchRecord {
    type Error = sqlx::Error;

    fn try_from(row: ResearchRow) -> Result<Self, sqlx::Error> {
        Ok(ResearchRecord {
            id: RunId::from_uuid(row.id),
            run_id: RunId::from_uuid(row.run_id),
            thread_id: row.thread_id.map(ThreadId::from_uuid),
            query: row.query,
            model: row.model,
            status: text_enum::decode("research.status", &row.status)?,
            config: row.config,
            report: row.report,
            sources: row.sources,
            usage: row.usage,
            stage_timings: row.stage_timings,
            word_count: row.word_count,
            source_count: row.source_count,
            duration_ms: row.duration_ms,
            error: row.error,
            created_at: row.created_at,
            finished_at: row.finished_at,
        })
    }
}

/// A running run a sweep may take over.
#[derive(sqlx::FromRow)]
pub(super) struct ExpiredRunRow {
    id: Uuid,
    user_id: Uuid,
    owner: Option<Uuid>,
}

impl TryFrom<ExpiredRunRow> for ExpiredRun {
    type Error = sqlx::Error;

    fn try_from(row: ExpiredRunRow) -> Result<Self, sqlx::Error> {
        Ok(ExpiredRun {
            run: RunId::from_uuid(row.id),
            user: UserId::from_trusted(row.user_id),
            owner: row.owner.map(ReplicaId::from_uuid),
        })
    }
}

/// A command taken for a run; its time-ordered `id` gives the order it was sent in.
#[derive(sqlx::FromRow)]
pub(super) struct RunCommandRow {
    id: Uuid,
    run_id: Uuid,
    kind: String,
    #[sqlx(json)]
    payload: Value,
}

impl TryFrom<RunCommandRow> for (Uuid, RunId, RunCommand) {
    type Error = sqlx::Error;

    fn try_from(row: RunCommandRow) -> Result<Self, sqlx::Error> {
        let kind: RunCommandKind = text_enum::decode("run_commands.kind", &row.kind)?;
        let command = match kind {
            RunCommandKind::Cancel => RunCommand::Cancel,
            RunCommandKind::Input => RunCommand::Input(row.payload),
        };
        Ok((row.id, RunId::from_uuid(row.run_id), command))
    }
}

/// Rows read into their domain type, failing on the first that does not decode.
pub(super) fn all<R, T: TryFrom<R, Error = sqlx::Error>>(
    rows: Vec<R>,
) -> Result<Vec<T>, sqlx::Error> {
    rows.into_iter().map(T::try_from).collect()
}

/// An optional row read into its domain type.
pub(super) fn optional<R, T: TryFrom<R, Error = sqlx::Error>>(
    row: Option<R>,
) -> Result<Option<T>, sqlx::Error> {
    row.map(T::try_from).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn importance_is_clamped_and_enums_decoded() {
        let row = |importance, kind: &str| MemoryRow {
            id: Uuid::nil(),
            kind: kind.into(),
            content: "c".into(),
            source: "user".into(),
            trust: "user".into(),
            importance,
            thread_id: None,
            source_refs: Json(Vec::new()),
            valid_from: DateTime::<Utc>::MIN_UTC,
            invalid_at: None,
            supersedes: None,
            created_at: DateTime::<Utc>::MIN_UTC,
            updated_at: DateTime::<Utc>::MIN_UTC,
            last_accessed_at: None,
            access_count: 0,
            archived_at: None,
            version: 1,
            embedding: 1.0f32.to_le_bytes().to_vec(),
            embedding_model: "m".into(),
        };
        let memory = Memory::try_from(row(9, "fact")).unwrap();
        assert_eq!(memory.importance, 5);
        assert_eq!(memory.embedding, vec![1.0]);
        assert_eq!(Memory::try_from(row(-3, "fact")).unwrap().importance, 1);
        let error = Memory::try_from(row(3, "fcat")).unwrap_err().to_string();
        assert!(error.contains("memories.kind"), "{error}");
    }
}
