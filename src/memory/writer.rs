//! The background memory writer: workers claim jobs from the durable SQL queue (one per
//! finished turn, per explicit `remember`), turn them into memories, and consolidate each
//! candidate against what the user already has — a duplicate is a no-op that bumps access, a
//! contradiction supersedes the old memory (which stays in history), anything else is added.
//! Jobs survive restarts, are retried with backoff, are idempotent (keyed by source message)
//! and carry their owner's `UserId` end to end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::MemoryError;
use super::extract::{self, Candidate, rule_candidates, same_subject_new_value};
use super::rank::RecallMode;
use super::{MemoryEngine, RecallRequest};
use crate::config::ModelRole;
use crate::error::{ErrorKind, HasKind};
use crate::llm::chat::{ChatMessage, ChatRequest, LlmError, LlmErrorKind, complete_json};
use crate::llm::prompts::{Prompt, quote};
use crate::llm::roles::Models;
use crate::store::{
    Job, JobKind, JobStatus, MemoryId, MemoryKind, MemorySource, Message, MessageId, NewMemory,
    NewMessage, Role, Store, StoreError, ThreadId, Trust, UserId,
};

/// Attempts of a job before it fails for good (also the cap the claim enforces on jobs whose
/// worker died mid-job).
pub(crate) const MAX_ATTEMPTS: i64 = 5;
const LEASE_SECS: i64 = 120;

/// Why a memory job failed.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// The job's payload is not what its kind needs: retrying cannot help.
    #[error("malformed {kind} job payload: {source}")]
    Payload {
        kind: JobKind,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("memory model: {0}")]
    Llm(#[from] LlmError),
    #[error("{0}")]
    Internal(String),
    #[error("the job panicked: {0}")]
    Panicked(String),
    #[error(transparent)]
    Prompt(#[from] crate::llm::prompts::PromptError),
    /// The request is not one the writer accepts (a client mistake).
    #[error("{0}")]
    Refused(String),
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(std::string::ToString::to_string)
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

impl HasKind for WriterError {
    fn kind(&self) -> ErrorKind {
        match self {
            WriterError::Payload { .. } | WriterError::Refused(_) => ErrorKind::BadRequest,
            WriterError::Store(error) => error.kind(),
            WriterError::Memory(error) => error.kind(),
            WriterError::Llm(error) => error.kind(),
            WriterError::Internal(_) | WriterError::Panicked(_) | WriterError::Prompt(_) => {
                ErrorKind::Internal
            }
        }
    }
}

impl WriterError {
    /// Whether the job is worth another attempt: a client-side mistake in the job itself (bad
    /// payload, refused input) fails at once; anything else may pass.
    pub(crate) fn retry(&self) -> bool {
        !matches!(self, WriterError::Panicked(_))
            && !matches!(
                self.kind(),
                ErrorKind::BadRequest | ErrorKind::NotFound | ErrorKind::Conflict
            )
    }
}

fn parse_payload<T: serde::de::DeserializeOwned>(job: &Job) -> Result<T, WriterError> {
    serde_json::from_value(job.payload.clone()).map_err(|source| WriterError::Payload {
        kind: job.kind,
        source,
    })
}

/// Payload of a `turn` job.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub(crate) struct TurnJob {
    pub thread_id: ThreadId,
    pub user_message_id: MessageId,
    /// The run that answered; its assistant message (if any) is found by run id.
    pub run_id: Option<crate::store::RunId>,
}

/// Payload of an `import_chat` job: the messages of a past conversation, in order.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub(crate) struct ImportChatJob {
    pub thread_id: ThreadId,
    pub message_ids: Vec<MessageId>,
}

/// What an import stored, and the job that turns it into memories.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ImportedConversation {
    /// The new messages' ids, in order.
    #[schema(value_type = Vec<String>)]
    pub messages: Vec<MessageId>,
    /// The memory job (its status: `GET /v1/jobs/{job}`).
    pub job: String,
}

/// Messages one import may bring.
pub(crate) const MAX_IMPORTED_MESSAGES: usize = 10_000;

/// Turn memories written per transaction by an imported conversation.
const IMPORT_ADD_BATCH: usize = 256;

/// Longest part of a message kept as one turn memory; a longer message becomes several.
pub(crate) const TURN_PART_CHARS: usize = 2_000;

/// The turn memories of one message: `Speaker: text` (the author's name when the message
/// has one, else `User` or `Assistant`), at the speaker's trust, with the message's time and
/// id. A message longer than [`TURN_PART_CHARS`] is cut into parts at sentence ends; a
/// content-free message (a greeting, thanks, a slash-command) gives none.
pub(crate) fn turn_memories(message: &Message) -> Vec<NewMemory> {
    if extract::content_free(&message.content) {
        return Vec::new();
    }
    let (source, label) = match message.role {
        Role::Assistant => (MemorySource::Assistant, "Assistant"),
        _ => (MemorySource::User, "User"),
    };
    // A reply that quoted pages or documents is as trusted as they are.
    let trust = message.trust;
    let speaker = message
        .author
        .as_deref()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .unwrap_or(label);
    let mut parts = Vec::new();
    crate::text::split::split_long(message.content.trim(), TURN_PART_CHARS, &mut parts);
    parts
        .into_iter()
        .map(|part| NewMemory {
            kind: MemoryKind::Turn,
            content: format!("{speaker}: {part}"),
            source,
            trust,
            importance: 2,
            thread_id: Some(message.thread_id),
            source_refs: vec![message.id.to_string()],
            created_at: Some(message.created_at),
            supersedes: None,
        })
        .collect()
}

/// Payload of a `remember` job (the `remember` tool).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct RememberJob {
    pub content: String,
    pub kind: MemoryKind,
    pub importance: u8,
    pub thread_id: Option<ThreadId>,
    pub source_message_id: Option<MessageId>,
    /// The least trusted text in the context the model asked from (`user` for jobs queued
    /// before this field existed).
    #[serde(default = "user_trust")]
    pub trust: Trust,
}

fn user_trust() -> Trust {
    Trust::User
}

/// Payload of an `import` job: one batch of an export's JSON lines.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub(crate) struct ImportJob {
    pub lines: String,
    /// The line number of the batch's first line in the whole upload (for messages).
    pub first_line: usize,
}

/// One queued import batch.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ImportBatch {
    pub id: String,
    pub first_line: usize,
    pub lines: usize,
}

/// Import job keys carry the owner, so a batch id alone never reaches another user's job.
fn import_key(user: UserId, batch: &str) -> String {
    format!("import:{user}:{batch}")
}

/// Lines per import job.
pub(crate) const IMPORT_BATCH_LINES: usize = 500;

/// What consolidation did with a candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// A message kept as the conversation's record (a `turn` memory), not something learnt.
    Recorded(MemoryId),
    Added(MemoryId),
    Duplicate(MemoryId),
    Superseded {
        old: MemoryId,
        new: MemoryId,
    },
}

/// The memory model's consolidation decision for one candidate.
enum Decision {
    Add,
    /// `noop`: the existing memories already say it.
    Keep,
    Supersede(MemoryId),
}

pub struct MemoryWriter {
    store: Arc<dyn Store>,
    memory: Arc<MemoryEngine>,
    models: Models,
    wake: Notify,
    /// Woken whenever this replica's workers finish a job (done or failed), for those waiting
    /// on one (`GET /v1/runs/{id}/memory?wait=`); a job another replica finishes is seen by
    /// their polling.
    finished: Notify,
}

impl MemoryWriter {
    pub fn new(store: Arc<dyn Store>, memory: Arc<MemoryEngine>, models: Models) -> Arc<Self> {
        Arc::new(Self {
            store,
            memory,
            models,
            wake: Notify::new(),
            finished: Notify::new(),
        })
    }

    /// Wakes the workers (after an enqueue or when a run ends).
    pub(crate) fn notify(&self) {
        self.wake.notify_waiters();
    }

    /// The user's `turn` job queued by `run`, with what it did once done; waits up to `wait`
    /// for it to finish (woken by this replica's workers, else looking again every 500 ms).
    pub(crate) async fn run_memory_job(
        &self,
        user: UserId,
        run: crate::store::RunId,
        wait: Duration,
        stop: &CancellationToken,
    ) -> crate::store::StoreResult<Option<crate::store::JobRecord>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let finished = self.finished.notified();
            let record = self.store.user(user).run_memory_job(run).await?;
            let pending = record.as_ref().is_some_and(|record| {
                matches!(record.status, JobStatus::Queued | JobStatus::Running)
            });
            if !pending || tokio::time::Instant::now() >= deadline {
                return Ok(record);
            }
            tokio::select! {
                _ = finished => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = stop.cancelled() => return Ok(record),
            }
        }
    }

    /// What a job's outcomes did to the user's memories, as recorded with its completion: each
    /// memory added or superseding another, as it is stored now (one read).
    async fn job_result(
        &self,
        user: UserId,
        outcomes: &[Outcome],
    ) -> crate::store::StoreResult<crate::store::JobResult> {
        use crate::store::{ChangedMemory, JobResult, MemoryChange};
        let changed: Vec<(MemoryId, Option<MemoryId>)> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Added(id) => Some((*id, None)),
                Outcome::Superseded { old, new } => Some((*new, Some(*old))),
                Outcome::Recorded(_) | Outcome::Duplicate(_) => None,
            })
            .collect();
        if changed.is_empty() {
            return Ok(JobResult::default());
        }
        let ids: Vec<MemoryId> = changed.iter().map(|(id, _)| *id).collect();
        let stored = self.store.user(user).memories_by_ids(&ids).await?;
        let mut seen = std::collections::HashSet::new();
        let memories = changed
            .into_iter()
            .filter(|(id, _)| seen.insert(*id))
            .filter_map(|(id, replaces)| {
                // A memory deleted since (the thread was deleted) is no longer news.
                let memory = stored.iter().find(|memory| memory.id == id)?;
                Some(ChangedMemory {
                    change: if replaces.is_some() {
                        MemoryChange::Superseded
                    } else {
                        MemoryChange::Added
                    },
                    id,
                    kind: memory.kind,
                    content: memory.content.clone(),
                    replaces,
                })
            })
            .filter(|changed| changed.kind != MemoryKind::Turn)
            .collect();
        Ok(JobResult { memories })
    }

    /// Imports a past conversation into `thread`: its messages are stored in order (with their
    /// authors and times) and one job turns them into memories. Errors are the caller's
    /// mistakes (`BadRequest`) or the store's.
    pub async fn import_conversation(
        &self,
        user: UserId,
        thread: ThreadId,
        messages: Vec<NewMessage>,
    ) -> Result<ImportedConversation, WriterError> {
        if messages.is_empty() {
            return Err(WriterError::Refused(
                "a conversation needs at least one message".into(),
            ));
        }
        if messages.len() > MAX_IMPORTED_MESSAGES {
            return Err(WriterError::Refused(format!(
                "at most {MAX_IMPORTED_MESSAGES} messages per import"
            )));
        }
        for (index, message) in messages.iter().enumerate() {
            let number = index + 1;
            if !matches!(message.role, Role::User | Role::Assistant) {
                return Err(WriterError::Refused(format!(
                    "message {number}: role must be user or assistant"
                )));
            }
            if message.content.trim().is_empty() {
                return Err(WriterError::Refused(format!(
                    "message {number}: content is empty"
                )));
            }
            if message.content.chars().count() > crate::store::MAX_MESSAGE_CHARS {
                return Err(WriterError::Refused(format!(
                    "message {number}: longer than {} characters",
                    crate::store::MAX_MESSAGE_CHARS
                )));
            }
            if message
                .author
                .as_deref()
                .is_some_and(|author| author.chars().count() > 100)
            {
                return Err(WriterError::Refused(format!(
                    "message {number}: author is longer than 100 characters"
                )));
            }
        }
        let stored = self
            .store
            .user(user)
            .import_messages(thread, messages)
            .await?;
        let job = ImportChatJob {
            thread_id: thread,
            message_ids: stored.iter().map(|message| message.id).collect(),
        };
        let job_key = self.enqueue_import_chat(user, &job).await?;
        Ok(ImportedConversation {
            messages: job.message_ids,
            job: job_key,
        })
    }

    /// Queues the memory work of an imported conversation (one job for all its messages).
    pub(crate) async fn enqueue_import_chat(
        &self,
        user: UserId,
        job: &ImportChatJob,
    ) -> crate::store::StoreResult<String> {
        use sha2::Digest as _;
        let mut digest = sha2::Sha256::new();
        for id in &job.message_ids {
            digest.update(id.as_uuid().as_bytes());
        }
        let key = format!(
            "import_chat:{user}:{}",
            hex::encode(&digest.finalize()[..12])
        );
        let payload = serde_json::to_value(job).unwrap_or(Value::Null);
        self.store
            .user(user)
            .enqueue_job(JobKind::ImportChat, &key, &payload, None)
            .await?;
        self.notify();
        Ok(key)
    }

    /// The queue key and payload of a turn's job: one job per user message, so storing it
    /// twice is a no-op.
    pub(crate) fn turn_job_entry(job: &TurnJob) -> (String, Value) {
        let key = format!("turn:{}", job.user_message_id);
        (key, serde_json::to_value(job).unwrap_or(Value::Null))
    }

    /// Queues the memory work of a finished turn; runs once `run` has ended.
    pub(crate) async fn enqueue_turn(
        &self,
        user: UserId,
        job: &TurnJob,
    ) -> crate::store::StoreResult<()> {
        let run = job.run_id;
        let (key, payload) = Self::turn_job_entry(job);
        self.store
            .user(user)
            .enqueue_job(JobKind::Turn, &key, &payload, run)
            .await?;
        self.notify();
        Ok(())
    }

    pub async fn enqueue_remember(
        &self,
        user: UserId,
        key: &str,
        job: &RememberJob,
    ) -> crate::store::StoreResult<()> {
        let payload = serde_json::to_value(job).unwrap_or(Value::Null);
        self.store
            .user(user)
            .enqueue_job(JobKind::Remember, key, &payload, None)
            .await?;
        self.notify();
        Ok(())
    }

    /// Queues an upload's JSON lines as import jobs of `IMPORT_BATCH_LINES` lines; returns each
    /// batch's id (a digest of its lines: the same batch uploaded again is the same job).
    pub(crate) async fn enqueue_import(
        &self,
        user: UserId,
        jsonl: &str,
    ) -> crate::store::StoreResult<Vec<ImportBatch>> {
        use sha2::Digest as _;
        let lines: Vec<&str> = jsonl.lines().collect();
        let mut batches = Vec::new();
        for (index, chunk) in lines.chunks(IMPORT_BATCH_LINES).enumerate() {
            let text = chunk.join("\n");
            if text.trim().is_empty() {
                continue;
            }
            let id = hex::encode(&sha2::Sha256::digest(text.as_bytes())[..12]);
            let job = ImportJob {
                lines: text,
                first_line: index * IMPORT_BATCH_LINES + 1,
            };
            let payload = serde_json::to_value(&job).unwrap_or(Value::Null);
            self.store
                .user(user)
                .enqueue_job(JobKind::Import, &import_key(user, &id), &payload, None)
                .await?;
            batches.push(ImportBatch {
                id,
                first_line: job.first_line,
                lines: chunk.len(),
            });
        }
        self.notify();
        Ok(batches)
    }

    /// The state of one of the user's import batches (`queued`, `running`, `done`, `failed`).
    pub(crate) async fn import_status(
        &self,
        user: UserId,
        batch: &str,
    ) -> crate::store::StoreResult<Option<JobStatus>> {
        self.store
            .user(user)
            .job_status(&import_key(user, batch))
            .await
    }

    /// Starts `workers` loops that run until `shutdown` (0 leaves jobs queued).
    pub(crate) fn spawn(
        self: &Arc<Self>,
        workers: usize,
        shutdown: CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut handles = Vec::with_capacity(workers);
        for _ in 0..workers {
            let writer = self.clone();
            let shutdown = shutdown.clone();
            handles.push(tokio::spawn(async move {
                loop {
                    // Each job runs in a task of its own: a panic inside it is caught here, the
                    // job stays claimed until its lease ends (then the claim's attempt cap
                    // applies), and this worker goes on.
                    let attempt = tokio::spawn({
                        let writer = writer.clone();
                        async move { writer.work_one().await }
                    });
                    let worked = match attempt.await {
                        Ok(Ok(worked)) => worked,
                        Ok(Err(error)) => {
                            tracing::warn!(%error, "memory writer could not claim a job");
                            false
                        }
                        Err(panic) => {
                            tracing::error!(%panic, "a memory job panicked; the worker goes on");
                            metrics::counter!("mnemo_writer_jobs_total", "status" => "panicked")
                                .increment(1);
                            true
                        }
                    };
                    if worked {
                        continue;
                    }
                    tokio::select! {
                        _ = writer.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
            }));
        }
        handles
    }

    /// Claims and processes one job; false when none was ready.
    pub async fn work_one(&self) -> crate::store::StoreResult<bool> {
        let Some(job) = self
            .store
            .maintenance()
            .claim_job(chrono::Duration::seconds(LEASE_SECS), MAX_ATTEMPTS)
            .await?
        else {
            return Ok(false);
        };
        let started = Instant::now();
        // A panic is a bug that another attempt would hit again: the job fails at once, with
        // the panic as its error, and the worker goes on.
        let result = match std::panic::AssertUnwindSafe(self.process(&job))
            .catch_unwind()
            .await
        {
            Ok(result) => result,
            Err(panic) => Err(WriterError::Panicked(panic_message(panic.as_ref()))),
        };
        match result {
            Ok(outcomes) => {
                let result = self.job_result(job.user, &outcomes).await?;
                self.store
                    .maintenance()
                    .complete_job(job.id, &result)
                    .await?;
                metrics::counter!("mnemo_writer_jobs_total", "status" => "done").increment(1);
                tracing::debug!(kind = %job.kind, outcomes = outcomes.len(), changed = result.memories.len(), "memory job done");
            }
            Err(error) => {
                let retry = (error.retry() && job.attempts < MAX_ATTEMPTS).then(|| {
                    crate::store::now() + chrono::Duration::seconds(2i64.pow(job.attempts as u32))
                });
                tracing::warn!(kind = %job.kind, attempts = job.attempts, retry = retry.is_some(), %error, "memory job failed");
                metrics::counter!("mnemo_writer_jobs_total", "status" => "failed").increment(1);
                self.store
                    .maintenance()
                    .fail_job(job.id, &error.to_string(), retry)
                    .await?;
            }
        }
        self.finished.notify_waiters();
        let latency = (crate::store::now() - job.created_at)
            .num_milliseconds()
            .max(0) as f64;
        metrics::histogram!("mnemo_writer_job_latency_seconds").record(latency / 1000.0);
        metrics::histogram!("mnemo_writer_job_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(true)
    }

    async fn process(&self, job: &Job) -> Result<Vec<Outcome>, WriterError> {
        let outcomes = self.process_kind(job).await?;
        let learned = job.kind != JobKind::Profile
            && outcomes
                .iter()
                .any(|outcome| !matches!(outcome, Outcome::Duplicate(_)));
        if learned {
            self.schedule_profile(job.user).await?;
        }
        Ok(outcomes)
    }

    async fn process_kind(&self, job: &Job) -> Result<Vec<Outcome>, WriterError> {
        match job.kind {
            JobKind::Turn => {
                let payload: TurnJob = parse_payload(job)?;
                self.process_turn(job.user, &payload).await
            }
            JobKind::ImportChat => {
                let payload: ImportChatJob = parse_payload(job)?;
                self.process_import_chat(job.user, &payload).await
            }
            JobKind::Remember => {
                let payload: RememberJob = parse_payload(job)?;
                let mut memory =
                    NewMemory::from_user(payload.kind, payload.content, payload.importance);
                memory.thread_id = payload.thread_id;
                if payload.trust != Trust::User {
                    // Asked for by the model after it read text the user did not write.
                    memory.trust = payload.trust;
                    memory.source = MemorySource::Assistant;
                }
                memory.source_refs = payload
                    .source_message_id
                    .map(|id| vec![id.to_string()])
                    .unwrap_or_default();
                Ok(vec![self.consolidate(job.user, memory).await?])
            }
            JobKind::Profile => self.build_profile(job.user).await.map(|_| Vec::new()),
            JobKind::Import => {
                let payload: ImportJob = parse_payload(job)?;
                // Import skips contents the user already has, so a retried batch adds nothing
                // twice.
                let report = self.memory.import(job.user, &payload.lines).await?;
                tracing::info!(
                    imported = report.imported,
                    skipped = report.skipped,
                    invalid = report.errors.len(),
                    first_line = payload.first_line,
                    "import batch done"
                );
                Ok(Vec::new())
            }
        }
    }

    /// Queues a profile rebuild, at most one per `profile_interval_secs` for a user.
    async fn schedule_profile(&self, user: UserId) -> Result<(), WriterError> {
        let interval = self.memory.settings().profile_interval_secs.max(1) as i64;
        let bucket = crate::store::now().timestamp() / interval;
        self.store
            .user(user)
            .enqueue_job(
                JobKind::Profile,
                &format!("profile:{user}:{bucket}"),
                &json!({}),
                None,
            )
            .await?;
        Ok(())
    }

    /// Rebuilds (never appends to) the user's profile from their preferences and facts.
    pub async fn build_profile(&self, user: UserId) -> Result<Option<MemoryId>, WriterError> {
        let filter = crate::store::MemoryFilter {
            kinds: Some(vec![MemoryKind::Preference, MemoryKind::Fact]),
            ..Default::default()
        };
        let mut sources = self
            .store
            .user(user)
            .list_memories(&filter, 200, None)
            .await?;
        sources.sort_by(|a, b| b.importance.cmp(&a.importance).then(b.id.cmp(&a.id)));
        sources.truncate(30);
        let existing = self.memory.profile(user).await?;
        if sources.is_empty() {
            return Ok(existing.map(|profile| profile.id));
        }
        let content = match self.models.role(ModelRole::Memory) {
            Some(role) => {
                let listed = sources
                    .iter()
                    .map(|m| {
                        format!(
                            "[{} | {}]\n{}",
                            m.kind,
                            m.created_at.format("%Y-%m-%d"),
                            quote(&m.content)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let text = Prompt::BuildProfile.render(&[("memories", &listed)])?;
                let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
                request.max_tokens = Some(role.max_tokens);
                let response = role.model.complete(&request).await?;
                response.content.trim().to_string()
            }
            None => {
                let mut lines = Vec::new();
                for kind in [MemoryKind::Preference, MemoryKind::Fact] {
                    let items: Vec<String> = sources
                        .iter()
                        .filter(|m| m.kind == kind)
                        .take(8)
                        .map(|m| format!("- {}", m.content.replace('\n', " ")))
                        .collect();
                    if !items.is_empty() {
                        lines.push(
                            if kind == MemoryKind::Preference {
                                "Preferences:"
                            } else {
                                "Facts:"
                            }
                            .to_string(),
                        );
                        lines.extend(items);
                    }
                }
                lines.join("\n")
            }
        };
        if content.is_empty() {
            return Ok(existing.map(|profile| profile.id));
        }
        let trust = sources
            .iter()
            .fold(Trust::Assistant, |trust, m| trust.min(m.trust));
        let profile = NewMemory {
            kind: MemoryKind::Profile,
            content,
            source: MemorySource::Assistant,
            trust,
            importance: 5,
            thread_id: None,
            source_refs: sources.iter().map(|m| m.id.to_string()).collect(),
            created_at: None,
            supersedes: existing.as_ref().map(|profile| profile.id),
        };
        let written = self.memory.add(user, vec![profile]).await?;
        if let Some(old) = existing {
            self.memory.delete(user, old.id).await?;
        }
        Ok(written.first().map(|memory| memory.id))
    }

    async fn process_turn(&self, user: UserId, job: &TurnJob) -> Result<Vec<Outcome>, WriterError> {
        // A temporary chat, or a user whose memory switch is off: the turn is not remembered.
        match super::memory_on(self.store.as_ref(), user, job.thread_id).await {
            Ok(true) => {}
            Ok(false) | Err(StoreError::NotFound(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        }
        let messages = match self.store.user(user).list_messages(job.thread_id).await {
            Ok(messages) => messages,
            // The thread was deleted since: nothing to remember.
            Err(StoreError::NotFound(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let Some(user_message) = messages.iter().find(|m| m.id == job.user_message_id) else {
            // The thread or message was deleted since: nothing to remember.
            return Ok(Vec::new());
        };
        let assistant = job.run_id.and_then(|run| {
            messages
                .iter()
                .find(|m| m.role == Role::Assistant && m.run_id == Some(run))
        });
        // Every message is also a `turn` memory, so past conversation is searchable.
        let mut turns = turn_memories(user_message);
        // Without a chat model the reply only lists memories: nothing new to keep.
        if let Some(reply) = assistant.filter(|_| self.models.role(ModelRole::Chat).is_some()) {
            turns.extend(turn_memories(reply));
        }
        // A retry after a later step failed must not store the turns again: they are keyed
        // by their message's id (`source_refs`).
        let stored: std::collections::HashSet<String> = self
            .store
            .user(user)
            .thread_turns(job.thread_id)
            .await?
            .into_iter()
            .flat_map(|memory| memory.source_refs)
            .collect();
        turns.retain(|turn| !turn.source_refs.iter().any(|r| stored.contains(r)));
        let added = match self.memory.add(user, turns).await {
            Ok(added) => added,
            Err(error) => {
                // Deleted while this job ran (the memories' thread is gone): nothing to do.
                if let Err(StoreError::NotFound(_)) =
                    self.store.user(user).get_thread(job.thread_id).await
                {
                    return Ok(Vec::new());
                }
                return Err(error.into());
            }
        };
        let mut outcomes: Vec<Outcome> = added
            .into_iter()
            .map(|memory| Outcome::Recorded(memory.id))
            .collect();
        outcomes.extend(
            self.remember_what_was_said(user, user_message, assistant)
                .await?,
        );
        Ok(outcomes)
    }

    /// A past conversation (`POST /v1/threads/{id}/import`): every message becomes turn
    /// memories, and what the user said is extracted like a live turn's.
    async fn process_import_chat(
        &self,
        user: UserId,
        job: &ImportChatJob,
    ) -> Result<Vec<Outcome>, WriterError> {
        let messages = self.store.user(user).list_messages(job.thread_id).await?;
        let wanted: std::collections::HashSet<MessageId> =
            job.message_ids.iter().copied().collect();
        let imported: Vec<&Message> = messages.iter().filter(|m| wanted.contains(&m.id)).collect();
        let turns: Vec<NewMemory> = imported.iter().flat_map(|m| turn_memories(m)).collect();
        let mut outcomes = Vec::new();
        for batch in turns.chunks(IMPORT_ADD_BATCH) {
            outcomes.extend(
                self.memory
                    .add(user, batch.to_vec())
                    .await?
                    .into_iter()
                    .map(|memory| Outcome::Recorded(memory.id)),
            );
        }
        for (index, message) in imported.iter().enumerate() {
            if message.role != Role::User {
                continue;
            }
            let reply = imported
                .get(index + 1)
                .filter(|next| next.role == Role::Assistant);
            outcomes.extend(
                self.remember_what_was_said(user, message, reply.copied())
                    .await?,
            );
        }
        Ok(outcomes)
    }

    /// Candidates from the user's own words (the reply is context only), consolidated. A
    /// candidate the user's message does not say (a model took it from the reply, which may
    /// quote a page) is no more trusted than the reply.
    async fn remember_what_was_said(
        &self,
        user: UserId,
        message: &Message,
        reply: Option<&Message>,
    ) -> Result<Vec<Outcome>, WriterError> {
        if extract::content_free(&message.content) {
            return Ok(Vec::new());
        }
        let candidates = match self.models.role(ModelRole::Memory) {
            Some(_) => match self
                .llm_candidates(&message.content, reply.map(|m| m.content.as_str()))
                .await
            {
                Ok(candidates) => candidates,
                // A reply that is not the JSON asked for, even after the retries: the rules
                // extract instead, so what the user said is not lost with it.
                Err(WriterError::Llm(error)) if error.kind == LlmErrorKind::BadResponse => {
                    tracing::warn!(error = %error.message, "the memory model's extraction was unusable; rules extract");
                    metrics::counter!("mnemo_memory_extractions_by_rules_total").increment(1);
                    rule_candidates(&message.content)
                }
                Err(error) => return Err(error),
            },
            None => rule_candidates(&message.content),
        };
        let reply_trust = reply.map_or(Trust::Assistant, |m| m.trust.min(Trust::Assistant));
        let mut outcomes = Vec::new();
        for candidate in candidates {
            let said = message.trust == Trust::User
                && super::asked::grounded_in(&candidate.content, &message.content);
            let (source, trust) = if said {
                (MemorySource::User, Trust::User)
            } else {
                (MemorySource::Assistant, reply_trust.min(message.trust))
            };
            let memory = NewMemory {
                kind: candidate.kind,
                content: candidate.content,
                source,
                trust,
                importance: candidate.importance.clamp(1, 5),
                thread_id: Some(message.thread_id),
                source_refs: vec![message.id.to_string()],
                created_at: Some(message.created_at),
                supersedes: None,
            };
            outcomes.push(self.consolidate(user, memory).await?);
        }
        Ok(outcomes)
    }

    async fn llm_candidates(
        &self,
        user_text: &str,
        reply: Option<&str>,
    ) -> Result<Vec<Candidate>, WriterError> {
        let Some(role) = self.models.role(ModelRole::Memory) else {
            return Ok(Vec::new());
        };
        let text = Prompt::ExtractMemories.render(&[
            ("user", &quote(user_text)),
            ("assistant", &quote(reply.unwrap_or("(no reply)"))),
        ])?;
        let mut request = ChatRequest::new(vec![ChatMessage::user(text)])
            .with_schema(crate::llm::schemas::memories());
        request.max_tokens = Some(role.max_tokens);
        let (items, _) = complete_json(
            role.model.as_ref(),
            request,
            self.models.structured_retries,
            |value| {
                let items = value["memories"]
                    .as_array()
                    .ok_or_else(|| "expected {\"memories\": [...]}".to_string())?;
                let mut out = Vec::new();
                for item in items {
                    if item["should_remember"].as_bool() == Some(false) {
                        continue;
                    }
                    let kind = item["kind"]
                        .as_str()
                        .and_then(MemoryKind::parse)
                        .filter(|kind| {
                            matches!(
                                kind,
                                MemoryKind::Fact | MemoryKind::Preference | MemoryKind::Event
                            )
                        })
                        .ok_or_else(|| format!("bad kind in {item}"))?;
                    let content = item["content"]
                        .as_str()
                        .map(str::trim)
                        .filter(|content| !content.is_empty())
                        .ok_or_else(|| format!("missing content in {item}"))?;
                    let importance = item["importance"].as_u64().unwrap_or(3).clamp(1, 5) as u8;
                    out.push(Candidate {
                        kind,
                        content: content.to_string(),
                        importance,
                    });
                }
                Ok(out)
            },
        )
        .await?;
        Ok(items)
    }

    /// Adds, skips or supersedes one candidate against the user's similar memories.
    pub(crate) async fn consolidate(
        &self,
        user: UserId,
        memory: NewMemory,
    ) -> Result<Outcome, WriterError> {
        let request = RecallRequest {
            query: memory.content.clone(),
            k: Some(5),
            kinds: Some(vec![
                MemoryKind::Fact,
                MemoryKind::Preference,
                MemoryKind::Event,
                MemoryKind::Conclusion,
            ]),
            mode: RecallMode::Hybrid,
            decay: false,
            // The writer draws its own lines (duplicates, a changed value): it wants the
            // nearest memories whether or not recall would answer with them.
            keep_irrelevant: true,
            ..RecallRequest::default()
        };
        // What was written a moment ago is among the nearest: a turn's statements are
        // consolidated one after another, and the one before may have been written just now.
        self.memory.settle().await?;
        let similar = self.memory.recall(user, request).await?.results;
        let embedded = self.memory.embed_one(&memory.content).await?;
        // The same statement again, in these words or others, with no value changed ("my code
        // is 4471" and "my code is 4472" say different things).
        if let Some(duplicate) = self
            .memory
            .duplicate_of(user, &memory.content, &embedded.vector)
            .await?
        {
            let _ = self
                .store
                .user(user)
                .record_access(&[duplicate.id], 1, crate::store::now())
                .await;
            return Ok(Outcome::Duplicate(duplicate.id));
        }
        // The memories this one may change: likely about it (the recall's gate), or sharing
        // its words.
        let gate = self.memory.settings().relevance.gate;
        let related: Vec<super::rank::Recalled> = similar
            .into_iter()
            .filter(|r| {
                r.signals.relevance.is_some_and(|p| p >= gate) || r.signals.bm25_rank.is_some()
            })
            .collect();
        // Two statements about one subject share most words; names ("Rex", "Max") move the
        // vectors apart more than the words.
        let by_rules = |related: &[super::rank::Recalled]| {
            related
                .iter()
                .find(|r| {
                    r.memory.kind == memory.kind
                        && same_subject_new_value(&r.memory.content, &memory.content)
                })
                .map(|r| r.memory.id)
        };
        let contradicted = match self.models.role(ModelRole::Memory) {
            Some(_) if !related.is_empty() => match self.llm_decision(&memory, &related).await {
                Ok(Decision::Supersede(old)) => Some(old),
                Ok(Decision::Add) => None,
                Ok(Decision::Keep) => {
                    // The model says the user's memories already hold this: nothing to write.
                    let kept = related[0].memory.id;
                    let _ = self
                        .store
                        .user(user)
                        .record_access(&[kept], 1, crate::store::now())
                        .await;
                    return Ok(Outcome::Duplicate(kept));
                }
                // A model whose answer cannot be used decides nothing: the rules do, and the
                // memory is written rather than lost.
                Err(WriterError::Llm(error)) if error.kind == LlmErrorKind::BadResponse => {
                    tracing::warn!(error = %error.message, "the memory model's decision was unusable; rules decide");
                    metrics::counter!("mnemo_memory_decisions_by_rules_total").increment(1);
                    by_rules(&related)
                }
                Err(error) => return Err(error),
            },
            _ => by_rules(&related),
        };
        // Less trusted text never replaces more trusted: a page cannot overwrite what the
        // user said. Both are kept; recall ranks the user's word first.
        let contradicted = contradicted.filter(|old| {
            related
                .iter()
                .find(|r| r.memory.id == *old)
                .is_none_or(|r| !memory.trust.below(r.memory.trust))
        });
        match contradicted {
            Some(old) => {
                let new = self
                    .store
                    .user(user)
                    .supersede_memory(old, memory, embedded)
                    .await?;
                self.memory.indexer().notify();
                Ok(Outcome::Superseded { old, new: new.id })
            }
            None => {
                let written = self
                    .store
                    .user(user)
                    .insert_memories(vec![(memory, embedded)])
                    .await?;
                self.memory.indexer().notify();
                written
                    .first()
                    .map(|memory| Outcome::Added(memory.id))
                    .ok_or_else(|| WriterError::Internal("memory was not written".into()))
            }
        }
    }

    async fn llm_decision(
        &self,
        memory: &NewMemory,
        similar: &[super::rank::Recalled],
    ) -> Result<Decision, WriterError> {
        let Some(role) = self.models.role(ModelRole::Memory) else {
            return Ok(Decision::Add);
        };
        let existing = similar
            .iter()
            .map(|r| format!("[{}]\n{}", r.memory.id, quote(&r.memory.content)))
            .collect::<Vec<_>>()
            .join("\n");
        let text = Prompt::ConsolidateMemory
            .render(&[("new", &quote(&memory.content)), ("existing", &existing)])?;
        let ids: Vec<MemoryId> = similar.iter().map(|r| r.memory.id).collect();
        let mut request = ChatRequest::new(vec![ChatMessage::user(text)])
            .with_schema(crate::llm::schemas::decision());
        request.max_tokens = Some(role.max_tokens);
        let (target, _) = complete_json(
            role.model.as_ref(),
            request,
            self.models.structured_retries,
            |value| match value["action"].as_str() {
                Some("supersede") => {
                    let id: MemoryId = value["target_id"]
                        .as_str()
                        .and_then(|id| id.parse().ok())
                        .ok_or_else(|| "supersede needs target_id".to_string())?;
                    if ids.contains(&id) {
                        Ok(Decision::Supersede(id))
                    } else {
                        Err(format!(
                            "target_id {id} is not one of the existing memories"
                        ))
                    }
                }
                Some("add") => Ok(Decision::Add),
                Some("noop") => Ok(Decision::Keep),
                _ => Err("action must be add, noop or supersede".to_string()),
            },
        )
        .await?;
        Ok(target)
    }

    pub(crate) async fn health(&self) -> Value {
        match self.store.maintenance().queue_stats().await {
            Ok(stats) => {
                metrics::gauge!("mnemo_writer_queue_depth").set(stats.queued as f64);
                json!({ "status": "ok", "queued": stats.queued, "running": stats.running,
                        "failed": stats.failed, "oldest_queued_secs": stats.oldest_queued_secs,
                        "recent_failures": stats.recent_failures })
            }
            Err(error) => json!({ "status": "down", "error": error.to_string() }),
        }
    }
}
