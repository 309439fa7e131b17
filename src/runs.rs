//! Durable runs: every chat turn and research job is a run whose events are appended to the
//! SQL run-event log with a per-run sequence. The SSE responses are live views of that log
//! (`follow`), so a client can disconnect and resume after any sequence number — after the run
//! ended and after a server restart.
//!
//! `RunHub` owns the runs executing in this process: their next sequence number, a watch
//! channel that wakes followers, a cancellation token, and a count of connected readers (a run
//! nobody follows for the configured grace period is cancelled).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::SecondsFormat;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{
    Run, RunId, RunKind, RunStatus, Store, StoreError, StoreResult, StoredEvent, ThreadId, UserId,
};

/// Every event type a run may emit. SSE `event:` names come only from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    SessionStart,
    StageUpdate,
    Thinking,
    ToolCall,
    ToolResult,
    MemoryRecalled,
    SourcesFound,
    PlanReview,
    MessageDelta,
    ReportDelta,
    Usage,
    MessageComplete,
    ResearchComplete,
    Error,
    Done,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::SessionStart => "session_start",
            EventType::StageUpdate => "stage_update",
            EventType::Thinking => "thinking",
            EventType::ToolCall => "tool_call",
            EventType::ToolResult => "tool_result",
            EventType::MemoryRecalled => "memory_recalled",
            EventType::SourcesFound => "sources_found",
            EventType::PlanReview => "plan_review",
            EventType::MessageDelta => "message_delta",
            EventType::ReportDelta => "report_delta",
            EventType::Usage => "usage",
            EventType::MessageComplete => "message_complete",
            EventType::ResearchComplete => "research_complete",
            EventType::Error => "error",
            EventType::Done => "done",
        }
    }
}

/// The closed set of `error_type`s carried by `error` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunErrorType {
    Llm,
    Tool,
    Search,
    Network,
    Validation,
    Internal,
}

impl RunErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            RunErrorType::Llm => "llm",
            RunErrorType::Tool => "tool",
            RunErrorType::Search => "search",
            RunErrorType::Network => "network",
            RunErrorType::Validation => "validation",
            RunErrorType::Internal => "internal",
        }
    }
}

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

impl From<StoreError> for RunFailure {
    fn from(error: StoreError) -> Self {
        RunFailure::Failed {
            error_type: RunErrorType::Internal,
            message: error.to_string(),
            retryable: true,
        }
    }
}

struct LiveRun {
    notify: watch::Sender<i64>,
    cancel: CancellationToken,
    readers: Arc<AtomicUsize>,
    input: Arc<RunInput>,
}

/// Input a run waits for from its user (a plan approval, an answer to a clarifying question).
struct RunInput {
    awaiting: std::sync::atomic::AtomicBool,
    sender: tokio::sync::mpsc::UnboundedSender<Value>,
    receiver: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Value>>,
}

/// Why input could not be delivered to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputRefused {
    /// The run is not executing in this process (finished, or on another replica).
    NotLive,
    /// The run is executing but is not waiting for input.
    NotAwaiting,
}

/// Runs executing in this process.
pub struct RunHub {
    store: Arc<dyn Store>,
    live: Mutex<HashMap<RunId, LiveRun>>,
    tracker: TaskTracker,
    /// Cancelled when the server shuts down; runs then end as `interrupted`.
    shutdown: CancellationToken,
    abandon_after: Option<Duration>,
}

/// The writing side of one run, handed to its body.
pub struct RunContext {
    pub run: Run,
    pub user: UserId,
    store: Arc<dyn Store>,
    next_seq: tokio::sync::Mutex<i64>,
    notify: watch::Sender<i64>,
    cancel: CancellationToken,
    input: Arc<RunInput>,
}

impl RunContext {
    /// Waits for the user's input (`POST /v1/runs/{id}/input`). The caller emits the event
    /// that asks for it first; cancellation ends the wait with the run.
    pub async fn wait_input(&self) -> Option<Value> {
        let mut receiver = self.input.receiver.lock().await;
        // Input sent while nobody waited is stale.
        while receiver.try_recv().is_ok() {}
        self.input.awaiting.store(true, Ordering::SeqCst);
        let value = receiver.recv().await;
        self.input.awaiting.store(false, Ordering::SeqCst);
        value
    }

    /// Appends an event to the log and wakes followers. The payload must be a JSON object; the
    /// common fields `type`, `run_id`, `seq` and `timestamp` are added here.
    pub async fn emit(&self, event: EventType, payload: Value) -> StoreResult<i64> {
        let mut data = match payload {
            Value::Object(map) => map,
            other => {
                let mut map = serde_json::Map::new();
                map.insert("content".into(), other);
                map
            }
        };
        let mut next = self.next_seq.lock().await;
        let seq = *next + 1;
        data.insert("type".into(), json!(event.as_str()));
        data.insert("run_id".into(), json!(self.run.id));
        data.insert("seq".into(), json!(seq));
        data.insert(
            "timestamp".into(),
            json!(chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)),
        );
        if self.run.kind == RunKind::Research {
            data.insert("research_id".into(), json!(self.run.id));
        }
        self.store
            .append_run_event(self.run.id, seq, event.as_str(), &Value::Object(data))
            .await?;
        *next = seq;
        self.notify.send_replace(seq);
        Ok(seq)
    }

    /// Cancelled when the user cancels the run, nobody follows it, or the server shuts down.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    pub fn thread_id(&self) -> Option<ThreadId> {
        self.run.thread_id
    }
}

impl RunHub {
    pub fn new(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        abandon_after: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            live: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            shutdown,
            abandon_after,
        })
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks runs left `running` by a previous process as interrupted, appending an `error`
    /// and a `done` event so that followers see them end. Returns how many were recovered.
    pub async fn recover_interrupted(&self) -> StoreResult<usize> {
        let stale = self.store.running_runs().await?;
        for (run, last_seq) in &stale {
            let message = "the server stopped while this run was in progress";
            let error = json!({
                "type": "error", "run_id": run, "seq": last_seq + 1,
                "timestamp": chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
                "error_type": RunErrorType::Internal.as_str(), "retryable": true, "message": message,
            });
            let done = json!({
                "type": "done", "run_id": run, "seq": last_seq + 2,
                "timestamp": chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
                "status": RunStatus::Interrupted.as_str(),
            });
            self.store
                .append_run_event(*run, last_seq + 1, "error", &error)
                .await?;
            self.store
                .append_run_event(*run, last_seq + 2, "done", &done)
                .await?;
            self.store
                .finish_run(*run, RunStatus::Interrupted, Some(message))
                .await?;
        }
        Ok(stale.len())
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
        let run = self.store.create_run(user, thread, kind).await?;
        let (notify, _) = watch::channel(0);
        let cancel = self.shutdown.child_token();
        let readers = Arc::new(AtomicUsize::new(0));
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let input = Arc::new(RunInput {
            awaiting: std::sync::atomic::AtomicBool::new(false),
            sender,
            receiver: tokio::sync::Mutex::new(receiver),
        });
        self.live().insert(
            run.id,
            LiveRun {
                notify: notify.clone(),
                cancel: cancel.clone(),
                readers: readers.clone(),
                input: input.clone(),
            },
        );
        metrics::counter!("mnemo_runs_started_total", "kind" => kind.as_str()).increment(1);
        metrics::gauge!("mnemo_runs_active").increment(1.0);
        let context = Arc::new(RunContext {
            run: run.clone(),
            user,
            store: self.store.clone(),
            next_seq: tokio::sync::Mutex::new(0),
            notify,
            cancel: cancel.clone(),
            input,
        });
        let hub = self.clone();
        self.tracker.spawn(async move {
            let watchdog = hub.watch_readers(cancel.clone(), readers);
            let outcome = tokio::select! {
                outcome = body(context.clone()) => Some(outcome),
                _ = cancel.cancelled() => None,
            };
            watchdog.abort();
            let status = hub.finish(&context, outcome).await;
            hub.live().remove(&context.run.id);
            metrics::gauge!("mnemo_runs_active").decrement(1.0);
            metrics::counter!("mnemo_runs_finished_total", "status" => status.as_str())
                .increment(1);
        });
        Ok(run)
    }

    /// Cancels the run when it has had no reader for the grace period.
    fn watch_readers(
        &self,
        cancel: CancellationToken,
        readers: Arc<AtomicUsize>,
    ) -> tokio::task::JoinHandle<()> {
        let grace = self.abandon_after;
        tokio::spawn(async move {
            let Some(grace) = grace else { return };
            let tick = Duration::from_millis(250).min(grace);
            let mut unread_for = Duration::ZERO;
            loop {
                tokio::time::sleep(tick).await;
                if readers.load(Ordering::Relaxed) == 0 {
                    unread_for += tick;
                    if unread_for >= grace {
                        tracing::info!("cancelling a run nobody has followed for {grace:?}");
                        cancel.cancel();
                        return;
                    }
                } else {
                    unread_for = Duration::ZERO;
                }
            }
        })
    }

    async fn finish(
        &self,
        context: &RunContext,
        outcome: Option<Result<(), RunFailure>>,
    ) -> RunStatus {
        let (status, error) = match outcome {
            Some(Ok(())) => (RunStatus::Completed, None),
            Some(Err(RunFailure::Failed {
                error_type,
                message,
                retryable,
            })) => (RunStatus::Failed, Some((error_type, message, retryable))),
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
        if let Some((error_type, message, retryable)) = &error {
            let payload = json!({
                "error_type": error_type.as_str(), "message": message, "retryable": retryable,
            });
            if let Err(failure) = context.emit(EventType::Error, payload).await {
                tracing::error!(run = %context.run.id, %failure, "could not record a run error");
            }
        }
        if let Err(failure) = context
            .emit(EventType::Done, json!({ "status": status.as_str() }))
            .await
        {
            tracing::error!(run = %context.run.id, %failure, "could not record the end of a run");
        }
        let message = error.as_ref().map(|(_, message, _)| message.as_str());
        if let Err(failure) = self.store.finish_run(context.run.id, status, message).await {
            tracing::error!(run = %context.run.id, %failure, "could not record a run's status");
        }
        status
    }

    /// Requests cancellation; false when the run is not executing in this process.
    pub fn cancel(&self, run: RunId) -> bool {
        match self.live().get(&run) {
            Some(live) => {
                live.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Delivers the user's input to a run that waits for it. The owner check must have been
    /// done by the caller.
    pub fn send_input(&self, run: RunId, value: Value) -> Result<(), InputRefused> {
        let live = self.live();
        let live = live.get(&run).ok_or(InputRefused::NotLive)?;
        if !live.input.awaiting.load(Ordering::SeqCst) {
            return Err(InputRefused::NotAwaiting);
        }
        live.input
            .sender
            .send(value)
            .map_err(|_| InputRefused::NotLive)
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
    }

    /// Number of runs executing in this process.
    pub fn active(&self) -> usize {
        self.live().len()
    }

    /// A stream of the run's events with `seq > after`: first the log, then live events as they
    /// are appended, ending after the `done` event (or when `stop` is cancelled). The owner
    /// check must have been done by the caller (`Store::get_run`).
    pub fn follow(
        self: &Arc<Self>,
        user: UserId,
        run: RunId,
        after: i64,
        stop: CancellationToken,
    ) -> impl Stream<Item = StoredEvent> + Send + 'static {
        let hub = self.clone();
        let (receiver, readers) = match hub.live().get(&run) {
            Some(live) => (Some(live.notify.subscribe()), Some(live.readers.clone())),
            None => (None, None),
        };
        let guard = readers.map(ReaderGuard::new);
        async_stream(move |sender| async move {
            let _guard = guard;
            let mut receiver = receiver;
            let mut last = after;
            let mut stopping = false;
            loop {
                let events = match hub.store.run_events_after(user, run, last, 500).await {
                    Ok(events) => events,
                    Err(error) => {
                        tracing::warn!(%run, %error, "reading run events failed");
                        return;
                    }
                };
                let full_page = events.len() == 500;
                for event in events {
                    last = event.seq;
                    let is_done = event.event_type == EventType::Done.as_str();
                    if sender.send(event).await.is_err() || is_done {
                        return;
                    }
                }
                if full_page {
                    continue;
                }
                if stopping {
                    // Shutdown: what was written before it has been delivered.
                    return;
                }
                match hub.store.get_run(user, run).await {
                    Ok(state) if state.status.is_terminal() && state.last_seq <= last => return,
                    Ok(_) => {}
                    Err(_) => return,
                }
                let wait = async {
                    match receiver.as_mut() {
                        Some(receiver) => {
                            if receiver.changed().await.is_err() {
                                // The run ended in this process; read what is left.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                        // Executing elsewhere (another replica) or recovered: poll the log.
                        None => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                };
                tokio::select! {
                    _ = wait => {}
                    _ = stop.cancelled() => stopping = true,
                    _ = sender.closed() => return,
                }
            }
        })
    }
}

/// Counts a connected reader for as long as it lives.
struct ReaderGuard(Arc<AtomicUsize>);

impl ReaderGuard {
    fn new(readers: Arc<AtomicUsize>) -> Self {
        readers.fetch_add(1, Ordering::Relaxed);
        Self(readers)
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream fed by a producer task through a small channel; the task stops when the receiver
/// is dropped.
fn async_stream<T, F, Fut>(producer: F) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(producer(sender));
    let aborter = AbortOnDrop(task);
    futures::stream::unfold((receiver, aborter), |(mut receiver, aborter)| async move {
        receiver
            .recv()
            .await
            .map(|item| (item, (receiver, aborter)))
    })
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
