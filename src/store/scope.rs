//! The store as the rest of the server sees it. The backend traits (`MemoryStore`, `JobStore`,
//! `DocumentStore`, `ResearchStore`, `StoreCore`) are visible only inside `store`; outside it an
//! `Arc<dyn Store>` offers three doors:
//!
//! - [`UserScope`] (`store.user(id)`): everything that touches one user's data. Its methods take
//!   no `UserId`: the scope was opened with one, and every statement filters on it.
//! - [`Maintenance`] (`store.maintenance()`): the cross-user work of indexers, the job queue,
//!   crash recovery and the decay job. Rows it returns carry their owner.
//! - [`Accounts`] (`store.accounts()`): users, their API keys, passwords and browser sessions,
//!   for the auth layer, the admin endpoints and the CLI.

use chrono::{DateTime, Utc};

use super::*;

/// Delegates to the backend trait method of the same name, with the scope's user first.
macro_rules! scoped {
    ($( $(#[$meta:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )*) => {
        $(
            $(#[$meta])*
            pub async fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.store.$name(self.user $(, $arg)*).await
            }
        )*
    };
}

/// Delegates to the backend trait method of the same name.
macro_rules! delegated {
    ($( $(#[$meta:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )*) => {
        $(
            $(#[$meta])*
            pub async fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.store.$name($($arg),*).await
            }
        )*
    };
}

impl dyn Store {
    /// The store seen by `user`.
    pub fn user(&self, user: UserId) -> UserScope<'_> {
        UserScope { store: self, user }
    }

    /// Cross-user work: indexers, jobs, recovery, decay.
    pub fn maintenance(&self) -> Maintenance<'_> {
        Maintenance { store: self }
    }

    /// Users and their API keys.
    pub fn accounts(&self) -> Accounts<'_> {
        Accounts { store: self }
    }

    /// "sqlite" or "postgres".
    pub(crate) fn backend(&self) -> &'static str {
        StoreCore::backend(self)
    }

    /// A cheap round trip, for `/health`.
    pub(crate) async fn ping(&self) -> StoreResult<()> {
        StoreCore::ping(self).await
    }

    /// Closes the pool after in-flight statements finish.
    pub async fn close(&self) {
        StoreCore::close(self).await;
    }
}

/// One user's data. Another user's object answers `NotFound`.
#[derive(Clone, Copy)]
pub struct UserScope<'a> {
    store: &'a dyn Store,
    user: UserId,
}

impl UserScope<'_> {
    /// For each of the user's turn memories among `ids`, the turns just before and after it.
    pub(crate) async fn turn_neighbours(
        &self,
        ids: &[MemoryId],
    ) -> StoreResult<Vec<(MemoryId, Option<MemoryId>, Option<MemoryId>)>> {
        self.store.turn_neighbours(Some(self.user), ids).await
    }

    scoped! {
        fn insert_memories(&self, memories: Vec<(NewMemory, Embedded)>) -> StoreResult<Vec<Memory>>;
        fn get_memory(&self, id: MemoryId) -> StoreResult<Memory>;
        fn memory_history(&self, id: MemoryId) -> StoreResult<Vec<MemoryVersion>>;
        fn update_memory(&self, id: MemoryId, patch: MemoryPatch) -> StoreResult<Memory>;
        /// Deletes the memory and its history.
        fn delete_memory(&self, id: MemoryId) -> StoreResult<()>;
        /// Deletes every memory of the user; returns how many.
        fn delete_all_memories(&self) -> StoreResult<u64>;
        /// Removes these memories, keeping them restorable until `purge_after`.
        fn forget_memories(&self, ids: &[MemoryId], request: &str, via: ForgetVia, purge_after: DateTime<Utc>) -> StoreResult<Vec<Memory>>;
        /// The forgotten memories that can still be restored, newest first.
        fn forgotten_memories(&self, limit: i64) -> StoreResult<Vec<ForgottenMemory>>;
        /// Puts a forgotten memory back as it was.
        fn restore_forgotten(&self, id: MemoryId) -> StoreResult<Memory>;
        /// Newest first, before an optional cursor.
        fn list_memories(&self, filter: &MemoryFilter, limit: i64, before: Option<MemoryId>) -> StoreResult<Vec<Memory>>;
        /// Every memory that passes `filter`, newest first, read page by page.
        fn all_memories(&self, filter: &MemoryFilter) -> StoreResult<Vec<Memory>>;
        /// The user's memories among `ids` (others' ids are silently absent).
        fn memories_by_ids(&self, ids: &[MemoryId]) -> StoreResult<Vec<Memory>>;
        fn fill_successors(&self, memories: &mut [Memory]) -> StoreResult<()>;
        /// The turn memories of one of the user's threads, oldest first (archived and
        /// invalid ones included).
        fn thread_turns(&self, thread: ThreadId) -> StoreResult<Vec<Memory>>;
        /// Whether the user has any turn memory (archived and invalid ones included).
        fn has_turns(&self) -> StoreResult<bool>;
        /// Counts `times` accesses of each of `ids`, the last at `at`; no log entry.
        fn record_access(&self, ids: &[MemoryId], times: u32, at: DateTime<Utc>) -> StoreResult<()>;
        /// Writes `new` as superseding `old` in one transaction.
        fn supersede_memory(&self, old: MemoryId, new: NewMemory, embedded: Embedded) -> StoreResult<Memory>;
        /// Deletes the memories made from one thread only; returns their ids.
        fn delete_thread_memories(&self, thread: ThreadId) -> StoreResult<Vec<MemoryId>>;
        /// Stores context views' vectors and logs an upsert for each memory.
        fn set_context_embeddings(&self, embeddings: Vec<(MemoryId, Embedded)>) -> StoreResult<()>;

        /// Queues a job; false when a job with this key already exists.
        fn enqueue_job(&self, kind: JobKind, key: &str, payload: &serde_json::Value, after_run: Option<RunId>) -> StoreResult<bool>;
        /// The status of the user's job with this key.
        fn job_status(&self, key: &str) -> StoreResult<Option<JobStatus>>;
        /// The `turn` job queued by `run` (the memory work of the turn it answered).
        fn run_memory_job(&self, run: RunId) -> StoreResult<Option<JobRecord>>;

        fn insert_document(&self, document: NewDocument) -> StoreResult<Document>;
        fn list_documents(&self, limit: i64, before: Option<DocumentId>) -> StoreResult<Vec<Document>>;
        fn get_document(&self, id: DocumentId) -> StoreResult<Document>;
        /// The document with its generation and whether its chunks are all written.
        fn document_state(&self, id: DocumentId) -> StoreResult<DocumentState>;
        /// The documents with this source, newest first (at most one with a content hash).
        fn documents_from_source(&self, source: &str) -> StoreResult<Vec<DocumentState>>;
        /// The document without a source whose content has this hash.
        fn document_with_content(&self, content_hash: &str) -> StoreResult<Option<DocumentState>>;
        /// Moves the row at `generation` to the next one, describing `new`; false when it was
        /// not at `generation` (another ingest claimed it) or is gone.
        fn claim_document(&self, id: DocumentId, generation: i64, new: NewDocument) -> StoreResult<bool>;
        /// Records that the chunks are all written, if the row is still at `generation`.
        fn finish_document(&self, id: DocumentId, generation: i64) -> StoreResult<bool>;
        fn delete_document(&self, id: DocumentId) -> StoreResult<()>;
        fn document_chunk_ids(&self, id: DocumentId) -> StoreResult<Vec<MemoryId>>;

        fn create_research(&self, research: &NewResearch) -> StoreResult<()>;
        fn finish_research(&self, id: RunId, outcome: &ResearchOutcome) -> StoreResult<()>;
        fn get_research(&self, id: RunId) -> StoreResult<ResearchRecord>;
        fn list_research(&self, limit: i64) -> StoreResult<Vec<ResearchRecord>>;
        fn delete_research(&self, id: RunId) -> StoreResult<()>;

        fn create_thread(&self, title: &str, temporary: bool) -> StoreResult<Thread>;
        fn list_threads(&self, limit: i64, before: Option<ThreadId>) -> StoreResult<Vec<Thread>>;
        /// Turns the user's memory switch on or off.
        fn set_memory_enabled(&self, enabled: bool) -> StoreResult<()>;
        /// Whether the user's chats recall and store memories.
        fn memory_enabled(&self) -> StoreResult<bool>;
        fn get_thread(&self, id: ThreadId) -> StoreResult<Thread>;
        /// The thread an outside client's conversation maps to, made on first use.
        fn conversation_thread(&self, conversation_key: &str, title: &str) -> StoreResult<Thread>;
        fn rename_thread(&self, id: ThreadId, title: &str) -> StoreResult<Thread>;
        fn delete_thread(&self, id: ThreadId) -> StoreResult<()>;
        /// Deletes the thread's messages from `from` on, and a summary covering them.
        fn truncate_messages(&self, thread: ThreadId, from: MessageId) -> StoreResult<Vec<MessageId>>;
        fn append_message(&self, thread: ThreadId, role: Role, content: &str, run: Option<RunId>, trust: Trust) -> StoreResult<Message>;
        /// Appends a past conversation's messages in order, in one transaction.
        fn import_messages(&self, thread: ThreadId, messages: Vec<NewMessage>) -> StoreResult<Vec<Message>>;
        fn list_messages(&self, thread: ThreadId) -> StoreResult<Vec<Message>>;
        /// The distinct author names of the user's messages.
        fn message_authors(&self) -> StoreResult<Vec<String>>;
        /// The rolling summary of a thread and the last message it covers.
        fn thread_summary(&self, thread: ThreadId) -> StoreResult<Option<(String, MessageId)>>;
        fn set_thread_summary(&self, thread: ThreadId, summary: &str, covered_until: MessageId) -> StoreResult<()>;

        /// Stores message, run and job in one transaction (see [`Store::begin_turn`]).
        fn begin_turn(&self, turn: NewTurn) -> StoreResult<BegunTurn>;
        fn create_run(&self, thread: Option<ThreadId>, kind: RunKind, max_running: Option<i64>) -> StoreResult<Run>;
        fn get_run(&self, id: RunId) -> StoreResult<Run>;
        /// Adds `tokens` to the user's count for `day` (UTC `YYYY-MM-DD`); the new count.
        fn add_token_usage(&self, day: &str, tokens: i64) -> StoreResult<i64>;
        /// The user's token count for `day`.
        fn token_usage(&self, day: &str) -> StoreResult<i64>;
        fn list_runs(&self, kind: RunKind, limit: i64) -> StoreResult<Vec<Run>>;
        /// Moves a running run to a terminal status; a run already terminal is left as it is.
        fn finish_run(&self, id: RunId, status: RunStatus, error: Option<&str>) -> StoreResult<()>;
        /// Appends an event with the given sequence number (the caller serialises appends per
        /// run); another user's run is `NotFound`, a run another replica owns `Conflict`.
        fn append_run_event(&self, run: RunId, seq: i64, event_type: EventType, data: &serde_json::Value, writer: ReplicaId) -> StoreResult<()>;
        /// Appends `done` and sets the terminal status in one transaction (fenced as above).
        fn append_final_run_event(&self, run: RunId, seq: i64, data: &serde_json::Value, status: RunStatus, error: Option<&str>, writer: ReplicaId) -> StoreResult<()>;
        /// How many of the user's runs are running, on every replica.
        fn running_run_count(&self) -> StoreResult<i64>;
        /// The runs of `thread` still running, wherever they execute.
        fn running_runs_of_thread(&self, thread: ThreadId) -> StoreResult<Vec<RunId>>;
        /// Stores a cancel or an input for whichever replica executes the run.
        fn send_run_command(&self, run: RunId, command: &RunCommand) -> StoreResult<CommandSent>;
        /// Records whether the run waits for input now (read by `send_run_command`).
        fn set_awaiting_input(&self, run: RunId, awaiting: bool) -> StoreResult<()>;
        /// Records that the running run is read through a replica not executing it, until
        /// `until` (the owner's no-reader watchdog counts it).
        fn touch_run_reader(&self, run: RunId, until: DateTime<Utc>) -> StoreResult<()>;
        /// Stores the running run's checkpoint if `replica` still owns it (`Conflict` when
        /// another replica took it over).
        fn save_run_checkpoint(&self, run: RunId, replica: ReplicaId, checkpoint: &serde_json::Value) -> StoreResult<()>;
        /// The run's last checkpoint, if it saved one.
        fn run_checkpoint(&self, run: RunId) -> StoreResult<Option<serde_json::Value>>;
        /// Events with `seq > after`, in order, at most `limit`.
        fn run_events_after(&self, run: RunId, after: i64, limit: i64) -> StoreResult<Vec<StoredEvent>>;
    }
}

/// Cross-user work of indexers, the job queue, crash recovery and the decay job.
#[derive(Clone, Copy)]
pub struct Maintenance<'a> {
    store: &'a dyn Store,
}

impl Maintenance<'_> {
    /// For each of these turn memories, the turns just before and after it in its thread.
    pub(crate) async fn turn_neighbours(
        &self,
        ids: &[MemoryId],
    ) -> StoreResult<Vec<(MemoryId, Option<MemoryId>, Option<MemoryId>)>> {
        self.store.turn_neighbours(None, ids).await
    }

    delegated! {
        fn memory_log_after(&self, after: i64, limit: i64) -> StoreResult<Vec<LogEntry>>;
        /// The highest sequence number in the memory log (0 when empty).
        fn memory_log_head(&self) -> StoreResult<i64>;
        /// Current rows of these memories with their owners (missing ids are deleted ones).
        fn owned_memories(&self, ids: &[MemoryId]) -> StoreResult<Vec<OwnedMemory>>;
        /// The stored context vectors of these memories (missing ones are absent).
        fn context_embeddings(&self, ids: &[MemoryId]) -> StoreResult<Vec<(MemoryId, Embedded)>>;
        /// Turn memories whose context vector is missing or another model's, oldest first.
        fn turns_without_context(&self, model: &str, limit: i64) -> StoreResult<Vec<OwnedMemory>>;
        /// Every memory in id order after a cursor, for rebuilding indexes.
        fn scan_memories(&self, after: Option<MemoryId>, limit: i64) -> StoreResult<Vec<OwnedMemory>>;
        fn count_memories(&self) -> StoreResult<i64>;
        fn watermark(&self, name: &str) -> StoreResult<i64>;
        fn set_watermark(&self, name: &str, seq: i64) -> StoreResult<()>;
        /// Archives low-importance memories unused since `now - unused_for`.
        fn archive_unused(&self, now: DateTime<Utc>, unused_for: chrono::Duration, max_importance: u8) -> StoreResult<Vec<MemoryId>>;
        /// Clears the content of forgotten memories past their `purge_after`.
        fn purge_forgotten(&self, now: DateTime<Utc>) -> StoreResult<u64>;
        /// Memories whose vector was made by another model than `model`, oldest first.
        fn memories_not_embedded_by(&self, model: &str, limit: i64) -> StoreResult<Vec<OwnedMemory>>;
        fn count_memories_not_embedded_by(&self, model: &str) -> StoreResult<i64>;
        /// Records vectors stored under the embedder id `from` as made by `to` (an id naming
        /// the same model and arithmetic); returns how many.
        fn relabel_embeddings(&self, from: &str, to: &str) -> StoreResult<u64>;
        /// Replaces memories' vectors, each under its owner, in one transaction.
        fn set_embeddings(&self, items: &[(UserId, MemoryId, Embedded)]) -> StoreResult<()>;

        /// Claims the oldest ready job (see `JobStore::claim_job`).
        fn claim_job(&self, lease: chrono::Duration, max_attempts: i64) -> StoreResult<Option<Job>>;
        /// Marks the job done and records what it did, in one statement.
        fn complete_job(&self, id: JobId, result: &JobResult) -> StoreResult<()>;
        /// Records a failure: retried at `retry_at`, or failed for good when `None`.
        fn fail_job(&self, id: JobId, error: &str, retry_at: Option<DateTime<Utc>>) -> StoreResult<()>;
        fn queue_stats(&self) -> StoreResult<QueueStats>;

        /// Makes `replica` the owner of a running run nobody claimed yet, leased until `until`.
        fn claim_run(&self, run: RunId, replica: ReplicaId, until: DateTime<Utc>) -> StoreResult<bool>;
        /// Moves the lease of every running run `replica` owns to `until`.
        fn renew_leases(&self, replica: ReplicaId, until: DateTime<Utc>) -> StoreResult<u64>;
        /// The running runs `sweep` may take over (their owner's lease expired).
        fn expired_runs(&self, sweep: &Sweep) -> StoreResult<Vec<ExpiredRun>>;
        /// Takes over an expired run if it is still as found; its last sequence number.
        fn take_over_run(&self, expired: &ExpiredRun, sweep: &Sweep, replica: ReplicaId, until: DateTime<Utc>) -> StoreResult<Option<i64>>;
        /// Marks the researches of `run` still running as `interrupted`.
        fn interrupt_research_of_run(&self, run: RunId) -> StoreResult<u64>;
        /// Marks `interrupted` the running researches whose run is gone or ended before
        /// `ended_before`.
        fn interrupt_orphaned_research(&self, ended_before: DateTime<Utc>) -> StoreResult<u64>;
        /// Takes the commands for runs `replica` owns, oldest first.
        fn take_run_commands(&self, replica: ReplicaId) -> StoreResult<Vec<(RunId, RunCommand)>>;
        /// Deletes commands nobody took before `before`.
        fn drop_stale_run_commands(&self, before: DateTime<Utc>) -> StoreResult<u64>;
        /// Until when readers on other replicas said they read the run.
        fn remote_readers_until(&self, run: RunId) -> StoreResult<Option<DateTime<Utc>>>;
        /// Lets the lease of a run `replica` owns expire now (it is handed to the next sweep).
        fn release_run(&self, run: RunId, replica: ReplicaId) -> StoreResult<()>;
    }

    /// Calls `wake` with every payload notified on `channel` until `stop` is cancelled, or
    /// at once returns where the backend cannot notify (or once it no longer can).
    pub(crate) async fn on_wakeups(
        &self,
        channel: WakeChannel,
        stop: &tokio_util::sync::CancellationToken,
        mut wake: impl FnMut(String),
    ) {
        let Some(mut wakeups) = self.wakeups(channel).await else {
            return;
        };
        loop {
            tokio::select! {
                next = futures::StreamExt::next(&mut wakeups) => match next {
                    Some(payload) => wake(payload),
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    }

    /// The payloads notified on `channel` (PostgreSQL's NOTIFY); `None` where the backend
    /// cannot notify, and readers only poll.
    pub(crate) async fn wakeups(
        &self,
        channel: WakeChannel,
    ) -> Option<futures::stream::BoxStream<'static, String>> {
        Wakeups::wakeups(self.store, channel).await
    }
}

/// Users and their API keys.
#[derive(Clone, Copy)]
pub struct Accounts<'a> {
    store: &'a dyn Store,
}

impl Accounts<'_> {
    delegated! {
        fn create_user(&self, name: &str, kind: UserKind) -> StoreResult<User>;
        /// Finds or creates the user behind an external identity (JWT subject, dev user).
        fn ensure_user(&self, name: &str, kind: UserKind) -> StoreResult<User>;
        fn user_by_name(&self, name: &str) -> StoreResult<Option<User>>;
        fn list_users(&self) -> StoreResult<Vec<User>>;
        fn add_api_key(&self, user: UserId, key_hash: &str, prefix: &str) -> StoreResult<()>;
        /// The user owning an unrevoked key with this hash.
        fn user_by_key_hash(&self, key_hash: &str) -> StoreResult<Option<User>>;
        /// Revokes every key of the named user; returns how many were revoked.
        fn revoke_keys(&self, name: &str) -> StoreResult<u64>;
        fn rotate_key(
            &self,
            name: &str,
            key_hash: &str,
            prefix: &str,
            revoke_others: bool,
        ) -> StoreResult<u64>;
        fn api_keys(&self, name: &str) -> StoreResult<Vec<ApiKeyInfo>>;

        /// Creates a local account, with a password (an argon2id PHC string) or without.
        fn create_account(&self, account: NewAccount<'_>) -> StoreResult<User>;
        /// Creates the first administrator, only while there is no administrator and no user
        /// with a password, and only once (`Conflict` otherwise).
        fn create_first_admin(&self, name: &str, password_hash: &str) -> StoreResult<User>;
        /// Whether the first administrator can still be made from the browser.
        fn setup_open(&self) -> StoreResult<bool>;
        /// The user with this id, if any (an id from a request path).
        fn user_by_id(&self, id: uuid::Uuid) -> StoreResult<Option<User>>;
        /// The user with this name, their password hash and lock.
        fn password_login(&self, name: &str) -> StoreResult<Option<PasswordLogin>>;
        /// Counts a failed sign-in; the count since the last success or lock.
        fn count_failed_login(&self, user: UserId) -> StoreResult<i64>;
        /// Refuses sign-in until `until` and starts counting failures again.
        fn lock_login(&self, user: UserId, until: DateTime<Utc>) -> StoreResult<()>;
        /// A successful sign-in: the failures and any lock are forgotten.
        fn clear_failed_logins(&self, user: UserId) -> StoreResult<()>;
        /// Changes a user; disabling deletes their sessions in the same transaction.
        fn update_user(&self, user: UserId, update: UserUpdate) -> StoreResult<User>;
        /// Stores a browser session by the sha256 of its token.
        fn create_session(&self, user: UserId, token_hash: &str, expires_at: DateTime<Utc>) -> StoreResult<()>;
        /// The session's user, when it is unexpired at `now` and the user not disabled.
        fn session_user(&self, token_hash: &str, now: DateTime<Utc>) -> StoreResult<Option<SessionUser>>;
        /// Records the session's use at `now`, its expiry moved to `expires_at`.
        fn touch_session(&self, token_hash: &str, now: DateTime<Utc>, expires_at: DateTime<Utc>) -> StoreResult<()>;
        /// Deletes the session; false when there was none.
        fn delete_session(&self, token_hash: &str) -> StoreResult<bool>;
        /// Deletes the sessions expired before `now`; how many.
        fn delete_expired_sessions(&self, now: DateTime<Utc>) -> StoreResult<u64>;
    }
}
