//! The SQL source of truth: domain types, the `Store` trait and its two implementations
//! (SQLite, the embedded default, and PostgreSQL), chosen once from the database URL scheme.
//!
//! Both implementations share their SQL text through the `sql_store!` macro in `sql.rs` and
//! read rows into the `sqlx::FromRow` structs of `rows.rs`; each has its own migrations under
//! `migrations/{sqlite,postgres}`.

mod account;
mod document;
mod ids;
mod memory;
mod postgres;
mod research;
mod rows;
mod run_control;
mod scope;
mod sql;
mod sql_accounts;
mod sql_documents;
mod sql_jobs;
mod sql_memory;
mod sql_research;
mod sql_run_control;
mod sqlite;
mod sqlite_rows;
pub(crate) mod text_enum;
/// How one recall result was found (the recall API's and the `memory_recalled` event's
/// explanation, kept with the domain types so both can show it): its rank (from 1) and score in each signal's list (the own
/// view's vector and BM25 lists, then the context view's), and the fused score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Signals {
    pub vector_rank: Option<usize>,
    pub vector_score: Option<f32>,
    pub bm25_rank: Option<usize>,
    pub bm25_score: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_vector_rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_vector_score: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_bm25_rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_bm25_score: Option<f32>,
    /// The fused score (`memory.fusion`) before decay and the other factors.
    pub rrf: f64,
    /// The decay multiplier applied to `rrf` (1.0 = no decay).
    pub decay: f64,
    /// The trust weight applied to `rrf`: 1 for the user's own words, `memory.assistant_weight`
    /// for what others said (left out when 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub trust: f64,
    /// The query's priors applied to `rrf`: a time span or a speaker it names matched, a
    /// question turn, a short turn (left out when 1). Ranking scores `rrf × decay × trust ×
    /// prior`; recall then weighs that by `relevance` (to the power
    /// `memory.relevance.rank_weight`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub prior: f64,
    /// The idf-weighted share of the query's informative words the memory holds (its BM25
    /// hits' coverage; 0 when no keyword list had it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub coverage: f32,
    /// The closer vector view's cosine as a z-score against the query's background (how far
    /// above "not about this" it is for this query and model), when the query was embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z: Option<f64>,
    /// How likely the memory is about the query (`memory::relevance`), when the query was
    /// embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevance: Option<f64>,
    /// A later turn that updates this one, ranked right above it in the same recall
    /// (`memory.updates_first`): what this turn says may have changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub later: Option<MemoryId>,
}

#[cfg(test)]
impl Signals {
    /// A result known only by its fused score (tests of what follows fusion).
    pub(crate) fn fused(score: f64) -> Self {
        Signals {
            vector_rank: None,
            vector_score: None,
            bm25_rank: None,
            bm25_score: None,
            context_vector_rank: None,
            context_vector_score: None,
            context_bm25_rank: None,
            context_bm25_score: None,
            rrf: score,
            decay: 1.0,
            trust: 1.0,
            prior: 1.0,
            coverage: 0.0,
            z: None,
            relevance: None,
            later: None,
        }
    }
}

fn is_zero(value: &f32) -> bool {
    *value == 0.0
}

fn one() -> f64 {
    1.0
}

fn is_one(value: &f64) -> bool {
    *value == 1.0
}

#[cfg(test)]
mod tests;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};

use crate::enums::text_enum;
use crate::error::{ErrorKind, HasKind};

use account::AccountStore;
pub use account::UserUpdate;
pub(crate) use account::{NewAccount, PasswordLogin, SessionUser};
pub(crate) use document::{Document, DocumentState, NewDocument};
pub(crate) use ids::{DocumentId, JobId, MessageId, ReplicaId};
pub use ids::{MemoryId, RunId, ThreadId, UserId};
pub use memory::{
    Embedded, ForgetVia, Memory, MemoryFilter, MemoryKind, MemorySource, NewMemory, Trust,
};
pub(crate) use memory::{
    ForgottenMemory, LogEntry, LogOp, MemoryPatch, MemoryVersion, OwnedMemory, vector_from_bytes,
    vector_to_bytes,
};
pub(crate) use postgres::PostgresStore;
use research::ResearchStore;
pub(crate) use research::{NewResearch, ResearchOutcome, ResearchRecord};
pub(crate) use run_control::{
    CommandSent, ExpiredRun, RunCommand, RunCommandKind, Sweep, WakeChannel,
};
use run_control::{RunControlStore, Wakeups};
pub(crate) use scope::UserScope;
pub use sqlite::SqliteStore;

/// Errors of the SQL layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The user already has this many runs executing (`server.max_runs_per_user`).
    #[error("{0} runs of yours are already in progress; wait for one to finish (or cancel one)")]
    TooManyRuns(i64),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl HasKind for StoreError {
    fn kind(&self) -> ErrorKind {
        match self {
            StoreError::NotFound(_) => ErrorKind::NotFound,
            StoreError::Conflict(_) => ErrorKind::Conflict,
            StoreError::BadRequest(_) => ErrorKind::BadRequest,
            StoreError::Unavailable(_) => ErrorKind::Unavailable,
            StoreError::TooManyRuns(_) => ErrorKind::RateLimited,
            StoreError::Database(sqlx::Error::PoolTimedOut) => ErrorKind::Busy,
            StoreError::Database(sqlx::Error::Io(_)) => ErrorKind::Unavailable,
            StoreError::Database(_) | StoreError::Migrate(_) => ErrorKind::Internal,
        }
    }
}

pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// The current time, truncated to microseconds so it round-trips through both backends unchanged.
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

text_enum! {
    /// How a user authenticates: an API key issued by `mnemo user add`, or a verified JWT
    /// subject, or the single local user of `--dev`.
    UserKind("user kind") {
        Key => "key",
        Jwt => "jwt",
        Dev => "dev",
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct User {
    pub id: UserId,
    pub name: String,
    pub kind: UserKind,
    pub created_at: DateTime<Utc>,
    pub active_keys: i64,
    /// The user's memory switch: off, their chats neither recall nor store memories.
    pub memory_enabled: bool,
    /// May manage users and keys (`/v1/admin/*`).
    pub is_admin: bool,
    /// When an administrator disabled the user: their sessions, keys and tokens are refused.
    pub disabled_at: Option<DateTime<Utc>>,
    /// Whether the user can sign in with a password.
    pub has_password: bool,
}

/// One API key of a user, as listed (the key itself is never stored, only its hash).
#[derive(Debug, Clone, Serialize)]
pub struct ApiKeyInfo {
    /// The key's first characters, enough to tell keys apart.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Thread {
    #[schema(value_type = String, format = Uuid)]
    pub id: ThreadId,
    pub title: String,
    /// A temporary chat: its turns neither recall nor store memories.
    pub temporary: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

text_enum! {
    /// Who wrote a message.
    Role("message role") {
        User => "user",
        Assistant => "assistant",
        System => "system",
        Tool => "tool",
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Message {
    #[schema(value_type = String, format = Uuid)]
    pub id: MessageId,
    #[schema(value_type = String, format = Uuid)]
    pub thread_id: ThreadId,
    pub role: Role,
    pub content: String,
    /// Who wrote it, when known (an imported transcript names its speakers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub run_id: Option<RunId>,
    pub created_at: DateTime<Utc>,
    /// How far its text is trusted: `user` for the user's own messages; a reply is
    /// `assistant`, or lower when its turn read web pages, documents or tool results.
    #[serde(default = "Message::default_trust")]
    pub trust: Trust,
    /// The user's documents attached to it (a user's message only), in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// A document of the user's attached to a message: the turn answering the message reads its
/// text. The title is the document's when it was attached, so the message still says what was
/// attached after the document is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attachment {
    #[schema(value_type = String, format = Uuid)]
    pub document_id: DocumentId,
    pub title: String,
}

/// Most documents one message may attach.
pub(crate) const MAX_ATTACHMENTS: usize = 10;

impl Message {
    fn default_trust() -> Trust {
        Trust::User
    }

    /// The trust of a message of `role` that read nothing less trusted.
    pub fn trust_of(role: Role) -> Trust {
        match role {
            Role::User => Trust::User,
            Role::Tool => Trust::Tool,
            Role::Assistant | Role::System => Trust::Assistant,
        }
    }
}

/// Longest message a thread accepts (a chat turn or an imported one), in characters.
pub(crate) const MAX_MESSAGE_CHARS: usize = 1_000_000;

/// A user's message to store together with the run answering it and the turn's memory job
/// ([`Store::begin_turn`]). The ids are chosen by the caller so the job's payload can name them.
#[derive(Debug, Clone)]
pub struct NewTurn {
    pub thread: ThreadId,
    pub message_id: MessageId,
    pub run_id: RunId,
    pub content: String,
    /// Documents of the user's the message attaches (checked to be theirs by the caller).
    pub attachments: Vec<Attachment>,
    /// The client's `Idempotency-Key` and a digest of what it asked: a second request with the
    /// same key gets the first one's run.
    pub idempotency: Option<Idempotency>,
    pub job_kind: JobKind,
    pub job_key: String,
    pub job_payload: serde_json::Value,
    /// Refuse the turn (`TooManyRuns`) when the user has this many runs running.
    pub max_running: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    pub digest: String,
}

/// What [`Store::begin_turn`] did.
#[derive(Debug, Clone)]
pub enum BegunTurn {
    /// The message, the run and the job were stored.
    Started { message: Message, run: Run },
    /// The idempotency key was used before for the same request: nothing was stored, this is
    /// the run that request started.
    Replayed(Run),
}

/// A message of an imported conversation.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMessage {
    pub role: Role,
    pub content: String,
    /// The speaker's name; turn memories are written as `Name: text` when it is given.
    #[serde(default)]
    pub author: Option<String>,
    /// When it was said (default: now). Messages of one import given the same time (a
    /// session's date) keep their order: each is stored a microsecond after the one before.
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
}

text_enum! {
    /// What a run executes.
    RunKind("run kind") {
        Chat => "chat",
        Research => "research",
    }
}

text_enum! {
    /// Lifecycle of a run (and of a research). `Running` is the only non-terminal state.
    RunStatus("run status") {
        Running => "running",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
        /// The server stopped (shutdown or crash) while the run was in progress.
        Interrupted => "interrupted",
        /// A research that wrote its report although some of its topics could not be
        /// researched (its run is `completed`; the report says what is not covered).
        Partial => "partial",
    }
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Run {
    #[schema(value_type = String, format = Uuid)]
    pub id: RunId,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub thread_id: Option<ThreadId>,
    pub kind: RunKind,
    pub status: RunStatus,
    pub error: Option<String>,
    /// Sequence number of the last event appended to the run's log (0 when none).
    pub last_seq: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

text_enum! {
    /// The type of a run event: the SSE `event:` name (names come only from here).
    EventType("event type") {
        SessionStart => "session_start",
        StageUpdate => "stage_update",
        Thinking => "thinking",
        ToolCall => "tool_call",
        ToolResult => "tool_result",
        MemoryRecalled => "memory_recalled",
        SourcesFound => "sources_found",
        PlanReview => "plan_review",
        MessageDelta => "message_delta",
        ReportDelta => "report_delta",
        Usage => "usage",
        MessageComplete => "message_complete",
        ResearchComplete => "research_complete",
        StageFallback => "stage_fallback",
        RunResumed => "run_resumed",
        Error => "error",
        Done => "done",
    }
}

/// One entry of a run's event log. `data` is the JSON payload sent as the SSE `data:` field.
#[derive(Debug, Clone, Serialize)]
pub struct StoredEvent {
    pub seq: i64,
    pub event_type: EventType,
    pub data: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// The SQL store. Every method that touches user data takes the owner's `UserId` and answers
/// `NotFound` for another user's object.
/// The episodic-memory part of the store. Every write puts the memory row(s), a version row and
/// a memory-log row in one transaction. Methods without a `UserId` serve the indexers and
/// maintenance jobs, which work across users.
#[async_trait]
pub(in crate::store) trait MemoryStore: Send + Sync + 'static {
    async fn insert_memories(
        &self,
        user: UserId,
        memories: Vec<(NewMemory, Embedded)>,
    ) -> StoreResult<Vec<Memory>>;
    async fn get_memory(&self, user: UserId, id: MemoryId) -> StoreResult<Memory>;
    async fn memory_history(&self, user: UserId, id: MemoryId) -> StoreResult<Vec<MemoryVersion>>;
    async fn update_memory(
        &self,
        user: UserId,
        id: MemoryId,
        patch: MemoryPatch,
    ) -> StoreResult<Memory>;
    /// Deletes the memory and its history.
    async fn delete_memory(&self, user: UserId, id: MemoryId) -> StoreResult<()>;
    /// Deletes every memory of the user (and the content of what they forgot); returns how
    /// many.
    async fn delete_all_memories(&self, user: UserId) -> StoreResult<u64>;
    /// Removes these memories as `delete_memory` does, in one transaction, keeping each (row,
    /// history, vector) restorable until `purge_after` with the request and the door it came
    /// through; returns the memories removed (ids already gone are skipped).
    async fn forget_memories(
        &self,
        user: UserId,
        ids: &[MemoryId],
        request: &str,
        via: ForgetVia,
        purge_after: DateTime<Utc>,
    ) -> StoreResult<Vec<Memory>>;
    /// The user's forgotten memories that can still be restored, newest first.
    async fn forgotten_memories(
        &self,
        user: UserId,
        limit: i64,
    ) -> StoreResult<Vec<ForgottenMemory>>;
    /// Puts a forgotten memory back as it was (same id, history and vector).
    async fn restore_forgotten(&self, user: UserId, id: MemoryId) -> StoreResult<Memory>;
    /// Newest first, before an optional cursor.
    async fn list_memories(
        &self,
        user: UserId,
        filter: &MemoryFilter,
        limit: i64,
        before: Option<MemoryId>,
    ) -> StoreResult<Vec<Memory>>;
    /// Every memory of the user that passes `filter`, newest first, read page by page.
    async fn all_memories(&self, user: UserId, filter: &MemoryFilter) -> StoreResult<Vec<Memory>> {
        let mut all = Vec::new();
        let mut before = None;
        loop {
            let page = self.list_memories(user, filter, 1000, before).await?;
            let Some(last) = page.last() else {
                return Ok(all);
            };
            before = Some(last.id);
            all.extend(page);
        }
    }
    /// The user's memories among `ids` (others' ids are silently absent).
    async fn memories_by_ids(&self, user: UserId, ids: &[MemoryId]) -> StoreResult<Vec<Memory>>;
    /// Sets `superseded_by` on those of `memories` that a newer memory superseded.
    async fn fill_successors(&self, user: UserId, memories: &mut [Memory]) -> StoreResult<()>;
    /// The turn memories of one of the user's threads, oldest first.
    async fn thread_turns(&self, user: UserId, thread: ThreadId) -> StoreResult<Vec<Memory>>;
    /// Whether the user has any turn memory (archived and invalid ones included).
    async fn has_turns(&self, user: UserId) -> StoreResult<bool>;
    /// Counts `times` accesses of each of `ids`, the last at `at`; no log entry (access does
    /// not change what is indexed).
    async fn record_access(
        &self,
        user: UserId,
        ids: &[MemoryId],
        times: u32,
        at: DateTime<Utc>,
    ) -> StoreResult<()>;

    // --- for indexers and maintenance -----------------------------------------------------
    async fn memory_log_after(&self, after: i64, limit: i64) -> StoreResult<Vec<LogEntry>>;
    /// The highest sequence number in the memory log (0 when empty).
    async fn memory_log_head(&self) -> StoreResult<i64>;
    /// Current rows of these memories with their owners (missing ids are deleted ones).
    async fn owned_memories(&self, ids: &[MemoryId]) -> StoreResult<Vec<OwnedMemory>>;
    /// For each of these turn memories (of `user` when given), the turns just before and
    /// after it in its thread (by time, then id); memories that are not turns are absent.
    async fn turn_neighbours(
        &self,
        user: Option<UserId>,
        ids: &[MemoryId],
    ) -> StoreResult<Vec<(MemoryId, Option<MemoryId>, Option<MemoryId>)>>;
    /// Stores the context views' vectors of the user's memories and logs an upsert for each
    /// (so the indexes pick them up); ids of other users' memories are ignored.
    async fn set_context_embeddings(
        &self,
        user: UserId,
        embeddings: Vec<(MemoryId, Embedded)>,
    ) -> StoreResult<()>;
    /// The stored context vectors of these memories (missing ones are absent).
    async fn context_embeddings(&self, ids: &[MemoryId]) -> StoreResult<Vec<(MemoryId, Embedded)>>;
    /// Turn memories whose context vector is missing or was made by another model than
    /// `model`, oldest first.
    async fn turns_without_context(&self, model: &str, limit: i64)
    -> StoreResult<Vec<OwnedMemory>>;
    /// Every memory in id order after a cursor, for rebuilding indexes.
    async fn scan_memories(
        &self,
        after: Option<MemoryId>,
        limit: i64,
    ) -> StoreResult<Vec<OwnedMemory>>;
    async fn count_memories(&self) -> StoreResult<i64>;
    async fn watermark(&self, name: &str) -> StoreResult<i64>;
    async fn set_watermark(&self, name: &str, seq: i64) -> StoreResult<()>;
    /// Archives memories with `importance <= max_importance` whose last activity is before
    /// `now - unused_for`; `archived_at` is set to last activity + `unused_for`, so a rerun
    /// computes the same result. Returns the archived ids.
    async fn archive_unused(
        &self,
        now: DateTime<Utc>,
        unused_for: chrono::Duration,
        max_importance: u8,
    ) -> StoreResult<Vec<MemoryId>>;
    /// Clears the content of forgotten memories whose `purge_after` is before `now`; the
    /// rows stay as the record. Returns how many were purged.
    async fn purge_forgotten(&self, now: DateTime<Utc>) -> StoreResult<u64>;
    /// Memories whose vector was made by another model than `model`, oldest first.
    async fn memories_not_embedded_by(
        &self,
        model: &str,
        limit: i64,
    ) -> StoreResult<Vec<OwnedMemory>>;
    async fn count_memories_not_embedded_by(&self, model: &str) -> StoreResult<i64>;
    /// Records vectors stored under the embedder id `from` (memories' and context views') as
    /// made by `to`, without touching them or the log (the indexes do not keep the id).
    /// Returns how many were relabelled.
    async fn relabel_embeddings(&self, from: &str, to: &str) -> StoreResult<u64>;
    /// Writes `new` as superseding `old` in one transaction: the old memory gets `invalid_at`
    /// (and stays in history), the new one links back through `supersedes`.
    async fn supersede_memory(
        &self,
        user: UserId,
        old: MemoryId,
        new: NewMemory,
        embedded: Embedded,
    ) -> StoreResult<Memory>;
    /// Deletes the memories made from one thread only; returns their ids.
    async fn delete_thread_memories(
        &self,
        user: UserId,
        thread: ThreadId,
    ) -> StoreResult<Vec<MemoryId>>;
    /// Replaces memories' vectors (re-embedding after a model change), each under its
    /// owner, in one transaction; a memory that is gone (or not its owner's) is skipped.
    async fn set_embeddings(&self, items: &[(UserId, MemoryId, Embedded)]) -> StoreResult<()>;
}

text_enum! {
    /// What a background job does.
    JobKind("job kind") {
        /// Store a finished turn's messages and extract memories from it.
        Turn => "turn",
        /// Store what the model's `remember` tool asked for.
        Remember => "remember",
        /// Rebuild the user's profile.
        Profile => "profile",
        /// Import one batch of an export's lines.
        Import => "import",
        /// Store an imported conversation's messages as turn memories and extract from them.
        ImportChat => "import_chat",
    }
}

text_enum! {
    /// Where a job is in its life.
    JobStatus("job status") {
        Queued => "queued",
        Running => "running",
        Done => "done",
        Failed => "failed",
    }
}

/// A claimed background job.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: JobId,
    pub user: UserId,
    pub kind: JobKind,
    pub payload: serde_json::Value,
    pub attempts: i64,
    pub created_at: DateTime<Utc>,
}

/// What a finished memory job did, recorded with its completion (the `result` column): the
/// memories it stored or changed. The conversation's own record (its `turn` memories) is not
/// listed, nor a statement the user already had (a duplicate changes nothing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobResult {
    /// In the order the job wrote them; empty when it stored nothing.
    pub memories: Vec<ChangedMemory>,
}

/// How a job changed one memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryChange {
    /// A new memory.
    Added,
    /// A new memory that replaces an older one saying otherwise (`replaces`, kept in history).
    Superseded,
}

/// One memory a job stored or changed, as it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChangedMemory {
    pub change: MemoryChange,
    /// The memory now (`GET /v1/memories/{id}`).
    #[schema(value_type = String, format = Uuid)]
    pub id: MemoryId,
    pub kind: MemoryKind,
    pub content: String,
    /// For `superseded`: the memory it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub replaces: Option<MemoryId>,
}

/// A job as its owner sees it: where it is and, once done, what it did.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub key: String,
    pub kind: JobKind,
    pub status: JobStatus,
    /// Set when the job is done (absent for jobs finished before results were recorded).
    pub result: Option<JobResult>,
}

/// Queue depth and age, for `/health` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueStats {
    pub queued: i64,
    pub running: i64,
    pub failed: i64,
    /// Age of the oldest job waiting to run, in seconds.
    pub oldest_queued_secs: f64,
    /// The most recent jobs that failed for good, newest first.
    pub recent_failures: Vec<FailedJob>,
}

/// A job that failed for good, kept with its error.
#[derive(Debug, Clone, Serialize)]
pub struct FailedJob {
    pub kind: JobKind,
    pub attempts: i64,
    /// The error's first line, at most 200 characters.
    pub error: String,
    pub failed_at: Option<DateTime<Utc>>,
}

/// The durable job queue. Jobs are idempotent by `key` and carry their owner's `UserId`.
#[async_trait]
pub(in crate::store) trait JobStore: Send + Sync + 'static {
    /// Queues a job; false when a job with this key already exists. A job with `after_run`
    /// is not claimed while that run is still running (the turn's stream ends first).
    async fn enqueue_job(
        &self,
        user: UserId,
        kind: JobKind,
        key: &str,
        payload: &serde_json::Value,
        after_run: Option<RunId>,
    ) -> StoreResult<bool>;
    /// Claims the oldest ready job (or one whose lease expired) for `lease`. A job whose lease
    /// expired after `max_attempts` attempts (its worker died each time) fails for good here
    /// instead of being claimed again.
    async fn claim_job(
        &self,
        lease: chrono::Duration,
        max_attempts: i64,
    ) -> StoreResult<Option<Job>>;
    /// Marks the job done and records what it did, in one statement.
    async fn complete_job(&self, id: JobId, result: &JobResult) -> StoreResult<()>;
    /// Records a failure: retried at `retry_at`, or failed for good when `None`.
    async fn fail_job(
        &self,
        id: JobId,
        error: &str,
        retry_at: Option<DateTime<Utc>>,
    ) -> StoreResult<()>;
    async fn queue_stats(&self) -> StoreResult<QueueStats>;
    /// The status of the user's job with this key.
    async fn job_status(&self, user: UserId, key: &str) -> StoreResult<Option<JobStatus>>;
    /// The user's `turn` job queued by `run` (the memory work of the turn it answered).
    async fn run_memory_job(&self, user: UserId, run: RunId) -> StoreResult<Option<JobRecord>>;
}

/// The documents a user ingested for local research. A document's text lives in its chunk
/// memories (kind `document`, `source_refs` = `["doc:<id>", "doc:<id>#<n>"]`), written through
/// the memory engine; this part keeps the document rows and finds a document's chunks.
#[async_trait]
pub(in crate::store) trait DocumentStore: Send + Sync + 'static {
    /// Inserts a row at generation 0, its chunks not yet written (`finish_document` records
    /// that they are). `Conflict` when the user already has a document with this source, or,
    /// for one without a source, with this content hash.
    async fn insert_document(&self, user: UserId, document: NewDocument) -> StoreResult<Document>;
    /// Newest first, before an optional cursor.
    async fn list_documents(
        &self,
        user: UserId,
        limit: i64,
        before: Option<DocumentId>,
    ) -> StoreResult<Vec<Document>>;
    async fn get_document(&self, user: UserId, id: DocumentId) -> StoreResult<Document>;
    /// The document with its generation and whether its chunks are all written.
    async fn document_state(&self, user: UserId, id: DocumentId) -> StoreResult<DocumentState>;
    /// The user's documents with this source, newest first: at most one with a content hash,
    /// the others ingested before content hashes were kept.
    async fn documents_from_source(
        &self,
        user: UserId,
        source: &str,
    ) -> StoreResult<Vec<DocumentState>>;
    /// The user's document without a source whose content has this hash.
    async fn document_with_content(
        &self,
        user: UserId,
        content_hash: &str,
    ) -> StoreResult<Option<DocumentState>>;
    /// Makes the row describe `new` (its source is kept) at the next generation, chunks not yet
    /// written, if it is still at `generation`. False when another ingest claimed it first, it
    /// is gone, or another row of the user already has the identity `new` would give it.
    async fn claim_document(
        &self,
        user: UserId,
        id: DocumentId,
        generation: i64,
        new: NewDocument,
    ) -> StoreResult<bool>;
    /// Records that the document's chunks are all written, if it is still at `generation`.
    async fn finish_document(
        &self,
        user: UserId,
        id: DocumentId,
        generation: i64,
    ) -> StoreResult<bool>;
    /// Deletes the document row (its chunk memories are deleted through the memory engine).
    async fn delete_document(&self, user: UserId, id: DocumentId) -> StoreResult<()>;
    /// The ids of the user's memories that are chunks of this document (archived or not).
    async fn document_chunk_ids(&self, user: UserId, id: DocumentId) -> StoreResult<Vec<MemoryId>>;
}

/// The SQL source of truth, as one trait object. Its backend traits are sealed inside `store`;
/// callers go through `user(id)`, `maintenance()` and `accounts()` (see `scope`).
#[allow(private_bounds)]
pub trait Store:
    AccountStore
    + MemoryStore
    + JobStore
    + DocumentStore
    + ResearchStore
    + RunControlStore
    + Wakeups
    + StoreCore
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: AccountStore
        + MemoryStore
        + JobStore
        + DocumentStore
        + ResearchStore
        + RunControlStore
        + Wakeups
        + StoreCore
        + Send
        + Sync
        + 'static
{
}

/// Users, keys, threads, messages and runs (the rest of the backend).
#[async_trait]
pub(in crate::store) trait StoreCore: Send + Sync + 'static {
    /// "sqlite" or "postgres".
    fn backend(&self) -> &'static str;
    /// A cheap round trip, for `/health`.
    async fn ping(&self) -> StoreResult<()>;
    /// Close the pool after in-flight statements finish.
    async fn close(&self);

    // --- users and keys -------------------------------------------------------------------
    async fn create_user(&self, name: &str, kind: UserKind) -> StoreResult<User>;
    /// Finds or creates the user behind an external identity (JWT issuer + subject, dev user).
    async fn ensure_user(&self, name: &str, kind: UserKind) -> StoreResult<User>;
    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>>;
    async fn list_users(&self) -> StoreResult<Vec<User>>;
    /// Turns the user's memory switch on or off.
    async fn set_memory_enabled(&self, user: UserId, enabled: bool) -> StoreResult<()>;
    async fn memory_enabled(&self, user: UserId) -> StoreResult<bool>;
    async fn add_api_key(&self, user: UserId, key_hash: &str, prefix: &str) -> StoreResult<()>;
    /// The user owning an unrevoked key with this hash.
    async fn user_by_key_hash(&self, key_hash: &str) -> StoreResult<Option<User>>;
    /// Revokes every key of the named user; returns how many were revoked.
    async fn revoke_keys(&self, name: &str) -> StoreResult<u64>;
    /// Adds a key to the named user, first revoking the user's other keys when `revoke_others`,
    /// in one transaction; returns how many were revoked.
    async fn rotate_key(
        &self,
        name: &str,
        key_hash: &str,
        prefix: &str,
        revoke_others: bool,
    ) -> StoreResult<u64>;
    /// Every key of the named user, newest first, revoked ones included.
    async fn api_keys(&self, name: &str) -> StoreResult<Vec<ApiKeyInfo>>;

    // --- threads and messages (working memory) --------------------------------------------
    async fn create_thread(
        &self,
        user: UserId,
        title: &str,
        temporary: bool,
    ) -> StoreResult<Thread>;
    /// Deletes the thread's messages from `from` on (it included), and a rolling summary that
    /// covers any of them; returns the ids removed.
    async fn truncate_messages(
        &self,
        user: UserId,
        thread: ThreadId,
        from: MessageId,
    ) -> StoreResult<Vec<MessageId>>;
    async fn list_threads(
        &self,
        user: UserId,
        limit: i64,
        before: Option<ThreadId>,
    ) -> StoreResult<Vec<Thread>>;
    async fn get_thread(&self, user: UserId, id: ThreadId) -> StoreResult<Thread>;
    /// The user's thread keyed by `conversation_key`, created (with `title`) when there is none;
    /// two concurrent calls with one key get the same thread.
    async fn conversation_thread(
        &self,
        user: UserId,
        conversation_key: &str,
        title: &str,
    ) -> StoreResult<Thread>;
    /// Sets a thread's title (and `updated_at`).
    async fn rename_thread(&self, user: UserId, id: ThreadId, title: &str) -> StoreResult<Thread>;
    async fn delete_thread(&self, user: UserId, id: ThreadId) -> StoreResult<()>;
    /// Appends a message; `trust` is that of the least trusted text it rests on (see
    /// [`Message::trust`]).
    async fn append_message(
        &self,
        user: UserId,
        thread: ThreadId,
        role: Role,
        content: &str,
        run: Option<RunId>,
        trust: Trust,
    ) -> StoreResult<Message>;
    /// Appends a past conversation's messages in order, in one transaction.
    async fn import_messages(
        &self,
        user: UserId,
        thread: ThreadId,
        messages: Vec<NewMessage>,
    ) -> StoreResult<Vec<Message>>;
    async fn list_messages(&self, user: UserId, thread: ThreadId) -> StoreResult<Vec<Message>>;
    /// The distinct author names of the user's messages.
    async fn message_authors(&self, user: UserId) -> StoreResult<Vec<String>>;
    /// The rolling summary of a thread and the last message it covers.
    async fn thread_summary(
        &self,
        user: UserId,
        thread: ThreadId,
    ) -> StoreResult<Option<(String, MessageId)>>;
    async fn set_thread_summary(
        &self,
        user: UserId,
        thread: ThreadId,
        summary: &str,
        covered_until: MessageId,
    ) -> StoreResult<()>;

    // --- runs and their event log ---------------------------------------------------------
    /// Stores the user's message, the run answering it and the turn's job in one transaction:
    /// either all three are stored or none. A key already used by this user with the same
    /// digest stores nothing and returns that run; with another digest, `Conflict`.
    async fn begin_turn(&self, user: UserId, turn: NewTurn) -> StoreResult<BegunTurn>;
    /// Stores a running run; with `max_running`, refuses (`TooManyRuns`) when the user has
    /// that many running, atomically across replicas.
    async fn create_run(
        &self,
        user: UserId,
        thread: Option<ThreadId>,
        kind: RunKind,
        max_running: Option<i64>,
    ) -> StoreResult<Run>;
    async fn get_run(&self, user: UserId, id: RunId) -> StoreResult<Run>;
    /// Adds `tokens` to the user's count for `day` (`YYYY-MM-DD`, UTC); returns the new count.
    async fn add_token_usage(&self, user: UserId, day: &str, tokens: i64) -> StoreResult<i64>;
    /// The user's token count for `day` (0 when nothing was counted).
    async fn token_usage(&self, user: UserId, day: &str) -> StoreResult<i64>;
    async fn list_runs(&self, user: UserId, kind: RunKind, limit: i64) -> StoreResult<Vec<Run>>;
    /// Moves a running run to a terminal status; a run already terminal is left as it is.
    async fn finish_run(
        &self,
        user: UserId,
        id: RunId,
        status: RunStatus,
        error: Option<&str>,
    ) -> StoreResult<()>;
    /// Appends the run's `done` event and moves it to `status` (when still running) in one
    /// transaction: a reader that sees the event sees the terminal status. Only the run's
    /// owner `writer` (or anyone while the run has no owner) may append; another replica's
    /// append is `Conflict`.
    #[allow(clippy::too_many_arguments)]
    async fn append_final_run_event(
        &self,
        user: UserId,
        run: RunId,
        seq: i64,
        data: &serde_json::Value,
        status: RunStatus,
        error: Option<&str>,
        writer: ReplicaId,
    ) -> StoreResult<()>;
    /// Appends an event with the given sequence number (the caller serialises appends per run);
    /// fenced by `writer` like `append_final_run_event`.
    async fn append_run_event(
        &self,
        user: UserId,
        run: RunId,
        seq: i64,
        event_type: EventType,
        data: &serde_json::Value,
        writer: ReplicaId,
    ) -> StoreResult<()>;
    /// Events with `seq > after`, in order, at most `limit`.
    async fn run_events_after(
        &self,
        user: UserId,
        run: RunId,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>>;
}

/// Opens the store named by the URL scheme (`sqlite:` or `postgres:`) and runs its migrations.
/// `max_connections` sizes the pool; a caller waits at most `acquire_timeout` for one of
/// them, then gets [`ErrorKind::Busy`].
pub async fn connect(
    url: &str,
    max_connections: u32,
    acquire_timeout: std::time::Duration,
) -> StoreResult<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(
            SqliteStore::connect(url, max_connections, acquire_timeout).await?,
        ))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(
            PostgresStore::connect(url, max_connections, acquire_timeout).await?,
        ))
    } else {
        Err(StoreError::BadRequest(
            "database url must start with sqlite: or postgres:".into(),
        ))
    }
}

/// A database URL with any password replaced, for logs and `/health`.
pub(crate) fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((credentials, host)) => {
                let user = credentials.split(':').next().unwrap_or("");
                format!("{scheme}://{user}:***@{host}")
            }
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn redact_url_hides_passwords() {
        let cases = [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u@h/db", "postgres://u:***@h/db"),
            ("sqlite://data/mnemo.db", "sqlite://data/mnemo.db"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_url(input), expected);
        }
    }
}
