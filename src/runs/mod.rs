//! Durable runs: every chat turn and research job is a run whose events are appended to the
//! SQL run-event log with a per-run sequence. The SSE responses are live views of that log
//! (`follow`), so a client can disconnect and resume after any sequence number — after the run
//! ended and after a server restart.
//!
//! `RunHub` owns the runs executing in this process: their next sequence number, a watch
//! channel that wakes followers, a cancellation token, and a count of connected readers (a run
//! nobody follows for the configured grace period is cancelled).
//!
//! Several replicas may share one database. The hub is one replica (a `ReplicaId` made at
//! start): it claims each run it executes through a lease on the run's row and renews the
//! leases on a heartbeat; its sweeper takes over (and closes as `interrupted`) only runs whose
//! owner's lease expired. A cancel or an input for a run executing on another replica becomes
//! a command row that the owner takes (polling; woken by NOTIFY on PostgreSQL).
//!
//! The hub lives here with admission and the execution of a run (`start`, `execute`,
//! `finish`); `lease.rs` holds runs through leases and sweeps the lapsed ones, `control.rs`
//! carries cancels and inputs to wherever a run executes, `follow.rs` streams a run's log and
//! counts its readers, `context.rs` is the writing side a run's body gets.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::SecondsFormat;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod context;
mod control;
pub(crate) mod events;
mod follow;
mod lease;
pub(crate) mod resume;
pub(crate) mod stream;

pub(crate) use context::{ResearchEnvelope, RunContext};
use context::{RunInput, event_data};
pub use control::InputRefused;
pub use events::RunEvent;
pub(crate) use events::{Envelope, ErrorEvent, RunErrorType};
pub use lease::Leases;
pub use resume::{Checkpoint, Resume, ResumedBody};
pub(crate) use stream::stream_to_events;

use crate::store::{
    CommandSent, EventType, ExpiredRun, ReplicaId, Run, RunCommand, RunId, RunKind, RunStatus,
    Store, StoreError, StoreResult, StoredEvent, Sweep, ThreadId, UserId, WakeChannel,
};

/// How a run body ended when it was not cancelled.
#[derive(Debug)]
pub enum RunFailure {
    /// The body failed; an `error` event with this type is written before `done`.
    Failed {
        error_type: RunErrorType,
        message: String,
        retryable: bool,
    },
}

impl From<crate::llm::prompts::PromptError> for RunFailure {
    fn from(error: crate::llm::prompts::PromptError) -> Self {
        RunFailure::Failed {
            error_type: RunErrorType::Internal,
            message: error.to_string(),
            retryable: false,
        }
    }
}

impl From<StoreError> for RunFailure {
    /// A database message never reaches the run's events: the client gets the kind's text.
    fn from(error: StoreError) -> Self {
        RunFailure::Failed {
            error_type: RunErrorType::Internal,
            message: crate::error::public_message(&error),
            retryable: crate::error::HasKind::kind(&error).retryable(),
        }
    }
}

/// Why a user may not start a run now. Checked before anything of the run is stored.
#[derive(Debug, thiserror::Error)]
pub enum NotAdmitted {
    /// The user already has the most runs they may have executing at once.
    #[error("{0} runs of yours are already in progress; wait for one to finish (or cancel one)")]
    TooManyRuns(usize),
    /// The user's runs have used today's token budget.
    #[error("your runs have used today's budget of {budget} model tokens; it renews at 00:00 UTC")]
    BudgetSpent { budget: u64, renews_in_secs: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl crate::error::HasKind for NotAdmitted {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            NotAdmitted::TooManyRuns(_) | NotAdmitted::BudgetSpent { .. } => {
                crate::error::ErrorKind::RateLimited
            }
            NotAdmitted::Store(error) => error.kind(),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            NotAdmitted::BudgetSpent { renews_in_secs, .. } => Some(*renews_in_secs),
            _ => None,
        }
    }
}

/// What one user's runs may use: how many at once and how many model tokens (prompt and
/// completion) per run and per UTC day. `None` is no limit.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub max_per_user: usize,
    pub run_tokens: Option<u64>,
    pub daily_tokens: Option<u64>,
}

/// Today's date (UTC) as the token counter's key, and the seconds until it changes.
fn usage_day() -> (String, u64) {
    let now = chrono::Utc::now();
    let tomorrow = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .map(|midnight| midnight.and_utc());
    let renews_in = tomorrow.map_or(86_400, |at| (at - now).num_seconds().max(1) as u64);
    (now.format("%Y-%m-%d").to_string(), renews_in)
}

struct LiveRun {
    user: UserId,
    thread: Option<ThreadId>,
    notify: watch::Sender<i64>,
    cancel: CancellationToken,
    readers: Arc<AtomicUsize>,
    /// Started in the background (`stream: false`): never cancelled for want of a reader.
    background: Arc<AtomicBool>,
    input: Arc<RunInput>,
}

/// Runs executing in this process.
pub struct RunHub {
    store: Arc<dyn Store>,
    live: Mutex<HashMap<RunId, LiveRun>>,
    tracker: TaskTracker,
    /// Cancelled when the server shuts down; runs then end as `interrupted`.
    shutdown: CancellationToken,
    abandon_after: Option<Duration>,
    /// Runs one user may have executing at once.
    limits: RunLimits,
    /// This process as the owner of the runs it executes.
    replica: ReplicaId,
    leases: Leases,
    /// The previous process of this data directory, known to be gone (we hold its lock):
    /// its runs are taken over without waiting for their leases.
    predecessor: Mutex<Option<ReplicaId>>,
    /// Stops the lease keeper and the command reader, after the runs wrote their end.
    control_stop: CancellationToken,
    /// Runs that another replica appended an event to (PostgreSQL's NOTIFY), for followers of
    /// runs not executing here.
    remote_events: tokio::sync::broadcast::Sender<RunId>,
    /// Rebuilds the bodies of runs taken over (set once the services exist); without one,
    /// runs taken over are closed as `interrupted`.
    /// Cleared at shutdown (the services it holds hold the hub).
    resumer: Mutex<Option<Arc<dyn Resume>>>,
}

/// How `execute` comes to hold a run.
enum Holding {
    /// A run just stored: claimed first.
    Claim,
    /// A run this replica took over: its log goes on after `last_seq`, starting with
    /// `resumed`.
    TakenOver {
        last_seq: i64,
        resumed: events::RunResumed,
        /// As saved on the row for this attempt.
        checkpoint: Checkpoint,
    },
}

impl RunHub {
    pub fn new(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        abandon_after: Option<Duration>,
        limits: RunLimits,
        leases: Leases,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            live: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            shutdown,
            abandon_after,
            limits,
            replica: ReplicaId::new(),
            leases,
            predecessor: Mutex::new(None),
            control_stop: CancellationToken::new(),
            remote_events: tokio::sync::broadcast::channel(1024).0,
            resumer: Mutex::new(None),
        })
    }

    /// Lets this replica continue the runs it takes over from their checkpoints (set before
    /// the first sweep).
    pub fn set_resumer(&self, resumer: Arc<dyn Resume>) {
        *self.resumer.lock() = Some(resumer);
    }

    /// This process's id as the owner of its runs.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// Whether `user` may start another run: fewer than the per-user cap of their runs
    /// execute here, and today's token budget is not used up. Checked before anything of the
    /// new run is stored.
    pub async fn admit(&self, user: UserId) -> Result<(), NotAdmitted> {
        let here = self
            .live()
            .values()
            .filter(|live| live.user == user)
            .count();
        // Runs on every replica (SQL), or this replica's when some are still being created.
        let everywhere =
            usize::try_from(self.store.user(user).running_run_count().await?).unwrap_or(0);
        if here.max(everywhere) >= self.limits.max_per_user {
            return Err(NotAdmitted::TooManyRuns(self.limits.max_per_user));
        }
        if let Some(budget) = self.limits.daily_tokens {
            let (day, renews_in_secs) = usage_day();
            let used = self.store.user(user).token_usage(&day).await?;
            if u64::try_from(used).unwrap_or(0) >= budget {
                return Err(NotAdmitted::BudgetSpent {
                    budget,
                    renews_in_secs,
                });
            }
        }
        Ok(())
    }

    /// The per-user cap as the store enforces it when a run is stored.
    pub(crate) fn max_running(&self) -> i64 {
        i64::try_from(self.limits.max_per_user).unwrap_or(i64::MAX)
    }

    fn live(&self) -> parking_lot::MutexGuard<'_, HashMap<RunId, LiveRun>> {
        self.live.lock()
    }

    /// Creates a run row and executes `body` in the background. The body's future is dropped
    /// (stopping any upstream request) as soon as the run is cancelled. The hub writes the
    /// terminal `error`/`done` events and the final status.
    pub async fn start<F, Fut>(
        self: &Arc<Self>,
        user: UserId,
        thread: Option<ThreadId>,
        kind: RunKind,
        body: F,
    ) -> StoreResult<Run>
    where
        F: FnOnce(Arc<RunContext>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RunFailure>> + Send + 'static,
    {
        let run = self
            .store
            .user(user)
            .create_run(thread, kind, Some(self.max_running()))
            .await?;
        self.launch(user, run.clone(), body);
        Ok(run)
    }

    /// Executes `body` in the background for a run row the caller has just stored (in the
    /// transaction that stored what the run answers), as [`RunHub::start`] does for its own.
    pub(crate) fn launch<F, Fut>(self: &Arc<Self>, user: UserId, run: Run, body: F)
    where
        F: FnOnce(Arc<RunContext>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RunFailure>> + Send + 'static,
    {
        self.execute(user, run, Holding::Claim, body);
    }

    fn execute<F, Fut>(self: &Arc<Self>, user: UserId, run: Run, holding: Holding, body: F)
    where
        F: FnOnce(Arc<RunContext>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), RunFailure>> + Send + 'static,
    {
        let thread = run.thread_id;
        let kind = run.kind;
        let (notify, _) = watch::channel(0);
        let cancel = self.shutdown.child_token();
        let readers = Arc::new(AtomicUsize::new(0));
        // A run taken over goes on to its end: its readers lost their stream with the replica
        // that died, and may come back later.
        let taken_over = matches!(holding, Holding::TakenOver { .. });
        let background = Arc::new(AtomicBool::new(taken_over));
        let (first_seq, attempt, saved) = match &holding {
            Holding::Claim => (0, 1, None),
            Holding::TakenOver {
                last_seq,
                resumed,
                checkpoint,
            } => (*last_seq, resumed.attempt, Some(checkpoint.clone())),
        };
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let input = Arc::new(RunInput {
            awaiting: AtomicBool::new(false),
            sender,
            receiver: tokio::sync::Mutex::new(receiver),
        });
        self.live().insert(
            run.id,
            LiveRun {
                user,
                thread,
                notify: notify.clone(),
                cancel: cancel.clone(),
                readers: readers.clone(),
                background: background.clone(),
                input: input.clone(),
            },
        );
        metrics::counter!("mnemo_runs_started_total", "kind" => kind.as_str()).increment(1);
        metrics::gauge!("mnemo_runs_active").increment(1.0);
        let context = Arc::new(RunContext {
            run: run.clone(),
            user,
            store: self.store.clone(),
            replica: self.replica,
            next_seq: tokio::sync::Mutex::new(first_seq),
            notify,
            cancel: cancel.clone(),
            input,
            limits: self.limits,
            spent: AtomicU64::new(0),
            overrun: std::sync::OnceLock::new(),
            attempt,
            // A run taken over continues from the checkpoint just saved on its row.
            checkpointed: AtomicBool::new(taken_over),
            saved: tokio::sync::Mutex::new(saved),
            lost: AtomicBool::new(false),
            shutdown: self.shutdown.clone(),
        });
        let hub = self.clone();
        self.tracker.spawn(async move {
            let claimed = match holding {
                Holding::Claim => {
                    hub.store
                        .maintenance()
                        .claim_run(context.run.id, hub.replica, hub.lease_until())
                        .await
                }
                Holding::TakenOver { resumed, .. } => context
                    .emit(RunEvent::RunResumed(resumed))
                    .await
                    .map(|_| true),
            };
            let watchdog = hub.watch_readers(
                context.run.id,
                cancel.clone(),
                readers,
                background,
                context.input.clone(),
                taken_over,
            );
            let outcome = match claimed {
                Ok(true) => tokio::select! {
                    outcome = body(context.clone()) => Some(outcome),
                    _ = cancel.cancelled() => None,
                },
                Ok(false) => {
                    // Not running any more, or another replica holds it: nothing to do here.
                    tracing::warn!(run = %context.run.id, "a run to start was already taken");
                    watchdog.abort();
                    hub.live().remove(&context.run.id);
                    metrics::gauge!("mnemo_runs_active").decrement(1.0);
                    return;
                }
                Err(error) => Some(Err(RunFailure::from(error))),
            };
            watchdog.abort();
            if context.lost() {
                // Another replica executes the run now: its end is that replica's to write.
                tracing::warn!(run = %context.run.id, "another replica took this run over");
                hub.live().remove(&context.run.id);
                metrics::gauge!("mnemo_runs_active").decrement(1.0);
                return;
            }
            if outcome.is_none() && context.handed_over() {
                // A shutdown: the run is left running, its lease let go, for the next sweep
                // (another replica's, or this data directory's next process) to continue.
                if let Err(error) = context.count_handover().await {
                    tracing::warn!(run = %context.run.id, %error, "could not count a handover");
                }
                if let Err(error) = hub
                    .store
                    .maintenance()
                    .release_run(context.run.id, hub.replica)
                    .await
                {
                    tracing::warn!(run = %context.run.id, %error, "could not let go of a run's lease");
                }
                tracing::info!(run = %context.run.id, "left a run for the next replica to continue");
                hub.live().remove(&context.run.id);
                metrics::gauge!("mnemo_runs_active").decrement(1.0);
                metrics::counter!("mnemo_runs_handed_over_total").increment(1);
                return;
            }
            let status = hub.finish(&context, outcome).await;
            hub.live().remove(&context.run.id);
            metrics::gauge!("mnemo_runs_active").decrement(1.0);
            metrics::counter!("mnemo_runs_finished_total", "status" => status.as_str())
                .increment(1);
        });
    }

    async fn finish(
        &self,
        context: &RunContext,
        outcome: Option<Result<(), RunFailure>>,
    ) -> RunStatus {
        let outcome_was_cancelled = outcome.is_none();
        let (status, error) = match outcome {
            Some(Ok(())) => (RunStatus::Completed, None),
            Some(Err(RunFailure::Failed {
                error_type,
                message,
                retryable,
            })) => (RunStatus::Failed, Some((error_type, message, retryable))),
            None if context.overrun.get().is_some() => (
                RunStatus::Failed,
                Some((
                    RunErrorType::Budget,
                    context.overrun.get().cloned().unwrap_or_default(),
                    false,
                )),
            ),
            None if self.shutdown.is_cancelled() => (
                RunStatus::Interrupted,
                Some((
                    RunErrorType::Internal,
                    "the server shut down during this run".to_string(),
                    true,
                )),
            ),
            None => (RunStatus::Cancelled, None),
        };
        if outcome_was_cancelled {
            context.resync_seq().await;
        }
        if let Some((error_type, message, retryable)) = &error {
            let event = RunEvent::Error(ErrorEvent {
                error_type: *error_type,
                message: message.clone(),
                retryable: *retryable,
                content: None,
                metadata: None,
            });
            if let Err(failure) = context.emit_closing(&event, None).await {
                tracing::error!(run = %context.run.id, %failure, "could not record a run error");
            }
        }
        let message = error.as_ref().map(|(_, message, _)| message.as_str());
        let done = RunEvent::done(status);
        if let Err(failure) = context.emit_closing(&done, Some((status, message))).await {
            tracing::error!(run = %context.run.id, %failure, "could not record the end of a run");
            // At least the status, so the run does not stay `running`.
            if let Err(failure) = self
                .store
                .user(context.user)
                .finish_run(context.run.id, status, message)
                .await
            {
                tracing::error!(run = %context.run.id, %failure, "could not record a run's status");
            }
        }
        status
    }

    /// Cancels every run (shutdown) and waits up to `grace` for them to record their end.
    pub async fn shutdown(&self, grace: Duration) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some runs did not finish writing within {grace:?}");
        }
        self.control_stop.cancel();
        self.resumer.lock().take();
    }

    /// Number of runs executing in this process.
    pub fn active(&self) -> usize {
        self.live().len()
    }
}

#[cfg(test)]
mod wire_tests {
    //! The wire format of every event type, pinned: what `emit` stores and SSE sends (the
    //! envelope included; `timestamp` is checked for shape and left out of the comparison).

    use serde_json::{Value, json};

    use super::RunEvent;
    use super::context::event_data;
    use super::events::*;
    use crate::llm::chat::Usage;
    use crate::store::{
        MemoryId, MemoryKind, MemorySource, MessageId, RunId, RunKind, RunStatus, ThreadId,
    };

    fn uuid(text: &str) -> uuid::Uuid {
        uuid::Uuid::parse_str(text).unwrap()
    }

    const RUN: &str = "01900000-0000-7000-8000-000000000001";
    const THREAD: &str = "01900000-0000-7000-8000-000000000002";
    const MESSAGE: &str = "01900000-0000-7000-8000-000000000003";
    const MEMORY: &str = "01900000-0000-7000-8000-000000000004";
    const RESEARCH: &str = "01900000-0000-7000-8000-000000000005";

    /// `event` as stored: in a chat run, or (with `research`) as part of a research.
    fn wire(event: RunEvent, research: Option<Option<&str>>) -> Value {
        let run = RunId::from_uuid(uuid(RUN));
        let research_id = research.map(|_| RunId::from_uuid(uuid(RESEARCH)));
        let model = research.map(|model| model.map(str::to_string));
        let mut data = event_data(&event, run, 7, research_id, model.as_ref()).unwrap();
        let timestamp = data.as_object_mut().unwrap().remove("timestamp").unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(timestamp.as_str().unwrap()).is_ok(),
            "{timestamp}"
        );
        data
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            cost_usd: None,
            estimated: false,
        }
    }

    fn envelope(mut value: Value, research: bool) -> Value {
        value["run_id"] = json!(RUN);
        value["seq"] = json!(7);
        if research {
            value["research_id"] = json!(RESEARCH);
        }
        value
    }

    #[test]
    fn every_event_type_keeps_its_wire_format() {
        let usage_json = json!({ "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost_usd": null });
        let cases: Vec<(RunEvent, Option<Option<&str>>, Value)> = vec![
            (
                RunEvent::SessionStart(SessionStart {
                    kind: RunKind::Chat,
                    model: None,
                    thread_id: Some(ThreadId::from_uuid(uuid(THREAD))),
                    user_message_id: Some(MessageId::from_uuid(uuid(MESSAGE))),
                    query: None,
                    content: None,
                    metadata: None,
                }),
                None,
                envelope(
                    json!({ "type": "session_start", "kind": "chat", "model": null,
                            "thread_id": THREAD, "user_message_id": MESSAGE }),
                    false,
                ),
            ),
            (
                RunEvent::SessionStart(SessionStart {
                    kind: RunKind::Research,
                    model: None,
                    thread_id: None,
                    user_message_id: None,
                    query: Some("tides".into()),
                    content: Some("tides".into()),
                    metadata: Some(SessionMeta {
                        config: json!({ "max_sources": 12 }),
                    }),
                }),
                Some(Some("writer")),
                envelope(
                    json!({ "type": "session_start", "kind": "research", "model": "writer",
                            "query": "tides", "content": "tides",
                            "metadata": { "config": { "max_sources": 12 } } }),
                    true,
                ),
            ),
            (
                RunEvent::stage("research_brief", "Writing the brief"),
                Some(None),
                envelope(
                    json!({ "type": "stage_update", "stage": "research_brief",
                            "content": "Writing the brief", "metadata": {}, "model": null }),
                    true,
                ),
            ),
            (
                RunEvent::thinking(
                    "research_execution",
                    "Level 1",
                    Some(StepMeta {
                        level: Some(1),
                        ..Default::default()
                    }),
                ),
                Some(Some("m")),
                envelope(
                    json!({ "type": "thinking", "stage": "research_execution", "content": "Level 1",
                            "metadata": { "level": 1 }, "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::PlanReview(Stage {
                    stage: "research_execution".into(),
                    content: "1. tides".into(),
                    metadata: Some(StepMeta {
                        topics: Some(vec!["tides".into()]),
                        awaiting_input: Some(true),
                        ..Default::default()
                    }),
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "plan_review", "stage": "research_execution", "content": "1. tides",
                            "metadata": { "topics": ["tides"], "awaiting_input": true }, "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::ToolCall(ToolCall {
                    id: Some("call_1".into()),
                    name: Some("recall_memory".into()),
                    tool: None,
                    arguments: json!({ "query": "tea" }),
                    stage: None,
                    content: None,
                    metadata: None,
                }),
                None,
                envelope(
                    json!({ "type": "tool_call", "id": "call_1", "name": "recall_memory",
                            "arguments": { "query": "tea" } }),
                    false,
                ),
            ),
            (
                RunEvent::ToolCall(ToolCall {
                    id: None,
                    name: None,
                    tool: Some("web_search".into()),
                    arguments: json!({ "query": "tides" }),
                    stage: Some("research_execution".into()),
                    content: Some("web_search {\"query\":\"tides\"}".into()),
                    metadata: Some(StepMeta::researcher(1, "tides")),
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "tool_call", "tool": "web_search", "arguments": { "query": "tides" },
                            "stage": "research_execution", "content": "web_search {\"query\":\"tides\"}",
                            "metadata": { "researcher": 1, "topic": "tides" }, "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::ToolResult(ToolResult {
                    id: "call_1".into(),
                    name: "remember".into(),
                    ok: true,
                    result: json!({ "queued": true }),
                }),
                None,
                envelope(
                    json!({ "type": "tool_result", "id": "call_1", "name": "remember", "ok": true,
                            "result": { "queued": true } }),
                    false,
                ),
            ),
            (
                RunEvent::MemoryRecalled(MemoryRecalled {
                    query: "tea".into(),
                    memories: vec![RecalledMemory {
                        id: MemoryId::from_uuid(uuid(MEMORY)),
                        kind: MemoryKind::Preference,
                        content: "I like oolong".into(),
                        source: Some(MemorySource::User),
                        created_at: Some(
                            chrono::DateTime::parse_from_rfc3339("2026-05-01T10:00:00Z")
                                .unwrap()
                                .to_utc(),
                        ),
                        score: 0.5,
                        trust: Some(crate::store::Trust::User),
                        thread_id: None,
                        source_refs: vec!["msg-1".into()],
                        signals: Some(crate::store::Signals {
                            vector_rank: Some(1),
                            vector_score: Some(0.75),
                            context_bm25_rank: Some(2),
                            context_bm25_score: Some(1.5),
                            ..crate::store::Signals::fused(0.5)
                        }),
                    }],
                }),
                None,
                envelope(
                    json!({ "type": "memory_recalled", "query": "tea", "memories": [
                        { "id": MEMORY, "kind": "preference", "content": "I like oolong",
                          "source": "user", "created_at": "2026-05-01T10:00:00Z", "score": 0.5,
                          "trust": "user", "source_refs": ["msg-1"],
                          "signals": { "vector_rank": 1, "vector_score": 0.75, "bm25_rank": null,
                                       "bm25_score": null, "context_bm25_rank": 2,
                                       "context_bm25_score": 1.5, "rrf": 0.5, "decay": 1.0 } }
                    ] }),
                    false,
                ),
            ),
            (
                RunEvent::SourcesFound(SourcesFound {
                    stage: "research_execution".into(),
                    content: "1 results for \"tides\"".into(),
                    sources: vec![FoundSource::new("https://example.org", "Tides")],
                    metadata: StepMeta {
                        researcher: Some(1),
                        ..Default::default()
                    },
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "sources_found", "stage": "research_execution",
                            "content": "1 results for \"tides\"",
                            "sources": [{ "url": "https://example.org", "title": "Tides" }],
                            "metadata": { "researcher": 1 }, "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::MessageDelta(Delta {
                    content: "Hel".into(),
                }),
                None,
                envelope(json!({ "type": "message_delta", "content": "Hel" }), false),
            ),
            (
                RunEvent::ReportDelta(Delta {
                    content: "# Tides".into(),
                }),
                None,
                envelope(
                    json!({ "type": "report_delta", "content": "# Tides" }),
                    false,
                ),
            ),
            (
                RunEvent::Usage(UsageStep {
                    model: "m".into(),
                    step: "chat".into(),
                    usage: usage(),
                    total: Some(usage()),
                    budget: None,
                }),
                None,
                envelope(
                    json!({ "type": "usage", "model": "m", "step": "chat", "usage": usage_json,
                            "total": usage_json }),
                    false,
                ),
            ),
            (
                RunEvent::Usage(UsageStep {
                    model: "writer".into(),
                    step: "final_report".into(),
                    usage: usage(),
                    total: None,
                    budget: None,
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "usage", "model": "writer", "step": "final_report",
                            "usage": usage_json }),
                    true,
                ),
            ),
            (
                RunEvent::MessageComplete(MessageComplete {
                    message_id: MessageId::from_uuid(uuid(MESSAGE)),
                    content: "Hello".into(),
                    usage: usage(),
                }),
                None,
                envelope(
                    json!({ "type": "message_complete", "message_id": MESSAGE, "content": "Hello",
                            "usage": usage_json }),
                    false,
                ),
            ),
            (
                RunEvent::ResearchComplete(ResearchComplete {
                    content: "# Tides".into(),
                    metadata: ResearchStats {
                        outcome: RunStatus::Completed,
                        duration_seconds: 1.5,
                        sources: vec![CitedSource {
                            n: 1,
                            url: "https://example.org".into(),
                            title: "Tides".into(),
                            relevance: 0.9,
                            credibility: 0.5,
                            score: 0.7,
                            provider: None,
                            excerpt: None,
                        }],
                        word_count: 2,
                        usage: ResearchUsage::default(),
                        stage_timings: [("research_brief".to_string(), 0.25)].into(),
                        waiting_ms: Waiting {
                            model: 3,
                            search: 2,
                            fetch: 1,
                        },
                        peak_concurrent_researchers: 1,
                        memories_written: 0,
                        citations: CitationCheck::default(),
                        gaps: vec![],
                    },
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "research_complete", "content": "# Tides",
                            "metadata": {
                                "outcome": "completed", "duration_seconds": 1.5,
                                "sources": [{ "n": 1, "url": "https://example.org", "title": "Tides",
                                              "relevance": 0.9, "credibility": 0.5, "score": 0.7 }],
                                "word_count": 2,
                                "usage": { "total": { "prompt_tokens": 0, "completion_tokens": 0,
                                                      "total_tokens": 0, "cost_usd": null },
                                           "steps": [] },
                                "stage_timings": { "research_brief": 0.25 },
                                "waiting_ms": { "model": 3, "search": 2, "fetch": 1 },
                                "peak_concurrent_researchers": 1, "memories_written": 0,
                                "citations": { "checked": 0, "supported": 0, "unchecked": 0,
                                               "unsupported": [] },
                                "gaps": [] },
                            "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::StageFallback(StageFallback {
                    stage: "research_brief".into(),
                    step: "research_brief".into(),
                    reason: "no valid JSON after 3 attempts: expected value at line 1 column 1"
                        .into(),
                    content: "The query is the brief".into(),
                    metadata: None,
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "stage_fallback", "stage": "research_brief",
                            "step": "research_brief",
                            "reason": "no valid JSON after 3 attempts: expected value at line 1 column 1",
                            "content": "The query is the brief", "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::RunResumed(crate::runs::events::RunResumed {
                    attempt: 2,
                    superseded_after: 7,
                    resumed_from: Some("brief".into()),
                    content: "attempt 2 goes on after brief".into(),
                }),
                None,
                envelope(
                    json!({ "type": "run_resumed", "attempt": 2, "superseded_after": 7,
                            "resumed_from": "brief",
                            "content": "attempt 2 goes on after brief" }),
                    false,
                ),
            ),
            (
                RunEvent::Error(ErrorEvent {
                    error_type: RunErrorType::Llm,
                    message: "the model is down".into(),
                    retryable: true,
                    content: None,
                    metadata: None,
                }),
                None,
                envelope(
                    json!({ "type": "error", "error_type": "llm", "message": "the model is down",
                            "retryable": true }),
                    false,
                ),
            ),
            (
                RunEvent::Error(ErrorEvent {
                    error_type: RunErrorType::Search,
                    message: "search failed".into(),
                    retryable: false,
                    content: Some("search failed".into()),
                    metadata: Some(StepMeta {
                        researcher: Some(2),
                        ..Default::default()
                    }),
                }),
                Some(Some("m")),
                envelope(
                    json!({ "type": "error", "error_type": "search", "message": "search failed",
                            "retryable": false, "content": "search failed",
                            "metadata": { "researcher": 2 }, "model": "m" }),
                    true,
                ),
            ),
            (
                RunEvent::done(RunStatus::Completed),
                None,
                envelope(json!({ "type": "done", "status": "completed" }), false),
            ),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (event, research, expected) in cases {
            seen.insert(event.event_type().as_str());
            let sent = wire(event, research);
            assert_eq!(sent, expected);
            // Clients can read every event back into its type.
            let read: RunEvent = serde_json::from_value(sent).unwrap();
            assert_eq!(wire(read, research), expected);
        }
        let all: std::collections::BTreeSet<&str> = crate::store::EventType::ALL
            .iter()
            .map(|t| t.as_str())
            .collect();
        assert_eq!(seen, all, "every event type has a pinned example");
    }
}
