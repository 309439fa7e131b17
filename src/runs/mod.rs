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

pub mod events;
pub mod resume;
pub mod stream;

pub use events::{Envelope, ErrorEvent, RunErrorType, RunEvent};
pub use resume::{Checkpoint, Resume, ResumedBody};
pub use stream::stream_to_events;

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

/// Attempts at reading a run's log before a follower gives up.
const FOLLOW_READ_ATTEMPTS: u32 = 5;

/// `read` retried with a short backoff while the store is unavailable (a pool timeout under
/// load); `None` when every attempt failed or the failure is not passing.
async fn read_with_retries<T>(
    mut read: impl FnMut() -> futures::future::BoxFuture<'static, StoreResult<T>>,
) -> Option<T> {
    for attempt in 1..=FOLLOW_READ_ATTEMPTS {
        match read().await {
            Ok(value) => return Some(value),
            Err(error) => {
                let passing = crate::error::HasKind::kind(&error).retryable();
                tracing::warn!(%error, attempt, "reading a run's events failed");
                if !passing || attempt == FOLLOW_READ_ATTEMPTS {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
        }
    }
    None
}

/// What a follower ends with when the run's log cannot be read: `done` (cancelled) when the
/// run itself is gone (its thread was deleted, which cancels its runs first), else the
/// unreadable-log `error`.
async fn ending_event(hub: &RunHub, user: UserId, run: RunId, last: i64) -> StoredEvent {
    if let Err(StoreError::NotFound(_)) = hub.store.user(user).get_run(run).await {
        let done = RunEvent::done(RunStatus::Cancelled);
        return StoredEvent {
            seq: last,
            event_type: EventType::Done,
            data: event_data(&done, run, last, None, None).unwrap_or_else(|_| json!({})),
            created_at: chrono::Utc::now(),
        };
    }
    unreadable_log_event(run, last)
}

/// The `error` a follower ends with when the run's log cannot be read; it carries the last
/// delivered sequence number, so `Last-Event-ID` resumes from there.
fn unreadable_log_event(run: RunId, last: i64) -> StoredEvent {
    let error = RunEvent::Error(ErrorEvent {
        error_type: RunErrorType::Internal,
        message: "the run's events could not be read; reconnect to resume".into(),
        retryable: true,
        content: None,
        metadata: None,
    });
    StoredEvent {
        seq: last,
        event_type: EventType::Error,
        data: event_data(&error, run, last, None, None).unwrap_or_else(|_| json!({})),
        created_at: chrono::Utc::now(),
    }
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

/// Input a run waits for from its user (a plan approval, an answer to a clarifying question).
struct RunInput {
    awaiting: AtomicBool,
    sender: tokio::sync::mpsc::UnboundedSender<Value>,
    receiver: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Value>>,
}

/// A run expecting its user's input ([`RunContext::expect_input`]).
pub struct InputWait<'a> {
    context: &'a RunContext,
    receiver: tokio::sync::MutexGuard<'a, tokio::sync::mpsc::UnboundedReceiver<Value>>,
}

impl InputWait<'_> {
    /// The input, once sent (`None`: the run ends first).
    pub async fn recv(mut self) -> Option<Value> {
        let value = self.receiver.recv().await;
        self.context.input.awaiting.store(false, Ordering::SeqCst);
        self.context.set_awaiting(false).await;
        value
    }
}

/// Why input could not be delivered to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputRefused {
    /// The run is not executing (it has ended).
    NotLive,
    /// The run is executing but is not waiting for input.
    NotAwaiting,
}

/// How this replica holds its runs: the lease on each run's row, how often it is renewed
/// (and expired runs swept), and how often the replica looks for commands sent through other
/// replicas when nothing woke it.
#[derive(Debug, Clone, Copy)]
pub struct Leases {
    pub lease: Duration,
    pub heartbeat: Duration,
    pub command_poll: Duration,
}

impl Default for Leases {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            heartbeat: Duration::from_secs(5),
            command_poll: Duration::from_millis(500),
        }
    }
}

/// Commands nobody took for this long are deleted (their run ended on a replica that died).
const STALE_COMMAND_AGE: chrono::Duration = chrono::Duration::minutes(10);

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

/// What every event of a research carries besides its own fields.
#[derive(Debug, Clone)]
pub struct ResearchEnvelope {
    pub research_id: RunId,
    /// The research's main model (`null` without one).
    pub model: Option<String>,
}

/// An event's JSON as stored and sent: its own fields, `type`, and the envelope (`run_id`,
/// `seq`, `timestamp`; for research `research_id` and, when the event names none, `model`).
fn event_data(
    event: &RunEvent,
    run: RunId,
    seq: i64,
    research_id: Option<RunId>,
    model: Option<&Option<String>>,
) -> StoreResult<Value> {
    let Ok(Value::Object(mut data)) = serde_json::to_value(event) else {
        return Err(StoreError::BadRequest(format!(
            "a {} event did not serialise to an object",
            event.event_type().as_str()
        )));
    };
    let envelope = Envelope {
        run_id: run,
        seq,
        timestamp: chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        research_id,
    };
    if let Ok(Value::Object(fields)) = serde_json::to_value(&envelope) {
        data.extend(fields);
    }
    if let Some(model) = model
        && data.get("model").is_none_or(Value::is_null)
    {
        data.insert("model".into(), json!(model));
    }
    Ok(Value::Object(data))
}

/// The writing side of one run, handed to its body.
pub struct RunContext {
    pub run: Run,
    pub user: UserId,
    store: Arc<dyn Store>,
    /// The replica executing the run (its appends are fenced by it).
    replica: ReplicaId,
    next_seq: tokio::sync::Mutex<i64>,
    notify: watch::Sender<i64>,
    cancel: CancellationToken,
    input: Arc<RunInput>,
    limits: RunLimits,
    /// Model tokens this run has used so far (from its `usage` events).
    spent: AtomicU64,
    /// Set when a budget stopped the run: the failure it ends with.
    overrun: std::sync::OnceLock<String>,
    /// Which execution of the run this is (1 the first; more after takeovers).
    attempt: u32,
    /// Set once the run saved a checkpoint: another attempt can continue it.
    checkpointed: AtomicBool,
    /// The last checkpoint saved (for a handover to count itself in).
    saved: tokio::sync::Mutex<Option<Checkpoint>>,
    /// Set when a write found the run owned by another replica (this one's lease lapsed and
    /// the run was taken over): the body is stopped and writes nothing more.
    lost: AtomicBool,
    /// The server's shutdown (the run's own token is a child of it).
    shutdown: CancellationToken,
}

impl RunContext {
    /// Starts expecting the user's input (`POST /v1/runs/{id}/input`): from now on input is
    /// accepted. Call it *before* emitting the event that asks for the input, so a client that
    /// answers as soon as it sees the event is not refused; then [`InputWait::recv`].
    pub async fn expect_input(&self) -> InputWait<'_> {
        let mut receiver = self.input.receiver.lock().await;
        // Input sent while nobody waited is stale.
        while receiver.try_recv().is_ok() {}
        self.input.awaiting.store(true, Ordering::SeqCst);
        // Other replicas read it from the run's row to accept input for this run.
        self.set_awaiting(true).await;
        InputWait {
            context: self,
            receiver,
        }
    }

    /// Waits for the user's input, expected from now on ([`Self::expect_input`]);
    /// cancellation ends the wait with the run.
    pub async fn wait_input(&self) -> Option<Value> {
        self.expect_input().await.recv().await
    }

    async fn set_awaiting(&self, awaiting: bool) {
        if let Err(error) = self
            .store
            .user(self.user)
            .set_awaiting_input(self.run.id, awaiting)
            .await
        {
            tracing::warn!(run = %self.run.id, %error, "could not record whether a run waits for input");
        }
    }

    /// Appends an event to the log and wakes followers. The envelope `run_id`, `seq` and
    /// `timestamp` (and `research_id` in a research run) are added here.
    pub async fn emit(&self, event: RunEvent) -> StoreResult<i64> {
        self.emit_for(event, None).await
    }

    /// As `emit`, for an event of a research running inside this run: it carries that
    /// research's id and, when the event names none, its model.
    pub async fn emit_for(
        &self,
        event: RunEvent,
        research: Option<&ResearchEnvelope>,
    ) -> StoreResult<i64> {
        let seq = self
            .append(&event, research, None)
            .await
            .map_err(|error| self.lost_if_taken(error))?;
        if let RunEvent::Usage(step) = &event {
            self.charge(step.usage.total_tokens).await;
        }
        Ok(seq)
    }

    /// Writes `event` at the next sequence number and wakes followers; with `finish`, also
    /// the run's terminal status, in the same transaction (for its `done`: a client that has
    /// read `done` finds the run ended, and a cancel then answers 409).
    async fn append(
        &self,
        event: &RunEvent,
        research: Option<&ResearchEnvelope>,
        finish: Option<(RunStatus, Option<&str>)>,
    ) -> StoreResult<i64> {
        let mut next = self.next_seq.lock().await;
        let seq = *next + 1;
        let research_id = research
            .map(|research| research.research_id)
            .or((self.run.kind == RunKind::Research).then_some(self.run.id));
        let model = research.map(|research| &research.model);
        let data = event_data(event, self.run.id, seq, research_id, model)?;
        let scope = self.store.user(self.user);
        match finish {
            None => {
                scope
                    .append_run_event(self.run.id, seq, event.event_type(), &data, self.replica)
                    .await?;
            }
            Some((status, error)) => {
                scope
                    .append_final_run_event(self.run.id, seq, &data, status, error, self.replica)
                    .await?;
            }
        }
        *next = seq;
        self.notify.send_replace(seq);
        Ok(seq)
    }

    /// Catches the sequence counter up with the log. A body dropped by cancellation while
    /// an append was in flight may have left that event committed without counting it; the
    /// events written after it (the final `error` and `done`) must not reuse its number.
    async fn resync_seq(&self) {
        let mut next = self.next_seq.lock().await;
        match self.store.user(self.user).get_run(self.run.id).await {
            Ok(run) => *next = (*next).max(run.last_seq),
            Err(error) => {
                tracing::warn!(run = %self.run.id, %error, "could not re-read a run's last event");
            }
        }
    }

    /// Appends one of the events that close the run: its `error`, or its `done` with
    /// `finish`. An append of the body's still in flight when the body was dropped can commit
    /// after `resync_seq` read the log; its number is then taken (a conflict, though the run
    /// is still ours: the owner check comes first), so the log is read again and the event
    /// written after it.
    async fn emit_closing(
        &self,
        event: &RunEvent,
        finish: Option<(RunStatus, Option<&str>)>,
    ) -> StoreResult<i64> {
        let mut retries = 3;
        loop {
            match self.append(event, None, finish).await {
                Err(StoreError::Conflict(_)) if retries > 0 => {
                    retries -= 1;
                    self.resync_seq().await;
                }
                written => return written,
            }
        }
    }

    /// Counts a model call's tokens against the run's and the day's budget; past either, the
    /// run is stopped (it ends with an `error` saying which budget, then `done`). The call
    /// that crosses a budget has already run, so a run overshoots by at most one call.
    async fn charge(&self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let spent = self.spent.fetch_add(tokens, Ordering::Relaxed) + tokens;
        let (day, _) = usage_day();
        let today = match self
            .store
            .user(self.user)
            .add_token_usage(&day, i64::try_from(tokens).unwrap_or(i64::MAX))
            .await
        {
            Ok(total) => u64::try_from(total).unwrap_or(0),
            Err(error) => {
                tracing::warn!(run = %self.run.id, %error, "could not count a run's tokens");
                0
            }
        };
        let overrun = if let Some(budget) = self.limits.run_tokens.filter(|b| spent > *b) {
            Some(format!(
                "this run used {spent} model tokens, more than its budget of {budget} \
                 (server.run_token_budget)"
            ))
        } else {
            self.limits
                .daily_tokens
                .filter(|budget| today > *budget)
                .map(|budget| {
                    format!(
                        "your runs have used today's budget of {budget} model tokens \
                         (server.daily_token_budget); it renews at 00:00 UTC"
                    )
                })
        };
        if let Some(message) = overrun {
            tracing::warn!(run = %self.run.id, user = %self.user, "{message}");
            let _ = self.overrun.set(message);
            self.cancel.cancel();
        }
    }

    /// Which execution of the run this is: 1 the first, more when it was taken over.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Saves the run's checkpoint: `body` says how to rebuild the body and what its finished
    /// steps produced, `step` names the last one. Events appended before it stand when the run
    /// is continued by another attempt; later ones are superseded. Fails when another replica
    /// has taken the run over (`Conflict`).
    pub async fn checkpoint(&self, step: Option<&str>, body: Value) -> StoreResult<()> {
        let next = self.next_seq.lock().await;
        let mut saved = self.saved.lock().await;
        let checkpoint = Checkpoint {
            attempt: self.attempt,
            seq: *next,
            step: step.map(str::to_string),
            body,
            handovers: saved.as_ref().map_or(0, |saved| saved.handovers),
        };
        self.save(&checkpoint).await?;
        *saved = Some(checkpoint);
        self.checkpointed.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn save(&self, checkpoint: &Checkpoint) -> StoreResult<()> {
        let value = serde_json::to_value(checkpoint)
            .map_err(|error| StoreError::BadRequest(format!("a checkpoint: {error}")))?;
        self.store
            .user(self.user)
            .save_run_checkpoint(self.run.id, self.replica, &value)
            .await
            .map_err(|error| self.lost_if_taken(error))
    }

    /// Counts this attempt as ended by a handover in the run's checkpoint (a shutdown, not a
    /// crash), so that restarts do not use up the run's attempts.
    async fn count_handover(&self) -> StoreResult<()> {
        let saved = self.saved.lock().await;
        let Some(mut checkpoint) = saved.clone() else {
            return Ok(());
        };
        checkpoint.handovers += 1;
        self.save(&checkpoint).await
    }

    /// Notes a write refused because another replica owns the run now, and stops the body.
    fn lost_if_taken(&self, error: StoreError) -> StoreError {
        if matches!(error, StoreError::Conflict(_)) {
            self.lost.store(true, Ordering::SeqCst);
            self.cancel.cancel();
        }
        error
    }

    /// Whether another replica has taken the run over from this one (see `lost`).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the run is being stopped by a shutdown and left for the next replica to
    /// continue from its checkpoint (rather than ended).
    pub fn handed_over(&self) -> bool {
        self.lost()
            || self.shutdown.is_cancelled()
                && self.checkpointed.load(Ordering::SeqCst)
                && self.overrun.get().is_none()
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
    pub fn max_running(&self) -> i64 {
        i64::try_from(self.limits.max_per_user).unwrap_or(i64::MAX)
    }

    fn live(&self) -> parking_lot::MutexGuard<'_, HashMap<RunId, LiveRun>> {
        self.live.lock()
    }

    /// Closes the runs nobody holds any more — their owner's lease expired, or their owner is
    /// `predecessor` (the previous process of this data directory, known to be gone) — as
    /// `interrupted`, with an `error` and a `done` event so that followers see them end. Runs
    /// whose owner is alive are left alone. Returns how many were closed.
    pub async fn recover_interrupted(
        self: &Arc<Self>,
        predecessor: Option<ReplicaId>,
    ) -> StoreResult<usize> {
        *self.predecessor.lock() = predecessor;
        self.sweep().await
    }

    /// One sweep: takes over and closes every run whose lease expired (see
    /// [`RunHub::recover_interrupted`]), then closes researches left running by a run that
    /// ended.
    pub async fn sweep(self: &Arc<Self>) -> StoreResult<usize> {
        let now = crate::store::now();
        let lease = self.lease_span();
        let sweep = Sweep {
            now,
            unclaimed_before: now - lease,
            predecessor: *self.predecessor.lock(),
        };
        let maintenance = self.store.maintenance();
        let expired = maintenance.expired_runs(&sweep).await?;
        let mut closed = 0;
        for run in expired {
            // Our own run whose lease lapsed (renewals failed for a while) is still ours.
            if run.owner == Some(self.replica) && self.live().contains_key(&run.run) {
                continue;
            }
            match self.close_taken_over(&run, &sweep).await {
                Ok(true) => closed += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(run = %run.run, %error, "could not close a run whose owner is gone");
                    // Not left held by this replica (its heartbeat would keep it for ever):
                    // the next sweep tries again.
                    if let Err(error) = maintenance.release_run(run.run, self.replica).await {
                        tracing::warn!(run = %run.run, %error, "could not let go of a run");
                    }
                }
            }
        }
        let orphaned = maintenance.interrupt_orphaned_research(now - lease).await?;
        if orphaned > 0 {
            tracing::warn!(orphaned, "marked researches of ended runs interrupted");
        }
        Ok(closed)
    }

    /// Takes over one expired run and continues it from its checkpoint, or closes it when it
    /// cannot be continued; false when another replica took it first or its owner renewed the
    /// lease meanwhile.
    async fn close_taken_over(
        self: &Arc<Self>,
        expired: &ExpiredRun,
        sweep: &Sweep,
    ) -> StoreResult<bool> {
        if self.shutdown.is_cancelled() {
            // Shutting down: the run is for a replica that stays.
            return Ok(false);
        }
        let maintenance = self.store.maintenance();
        let Some(last_seq) = maintenance
            .take_over_run(expired, sweep, self.replica, self.lease_until())
            .await?
        else {
            return Ok(false);
        };
        let run = expired.run;
        match self.resume_taken_over(expired, last_seq).await {
            Ok(attempt) => {
                tracing::warn!(%run, owner = ?expired.owner, attempt, "continuing a run whose owner is gone");
                metrics::counter!("mnemo_runs_resumed_total").increment(1);
                return Ok(true);
            }
            Err(why) => {
                tracing::warn!(%run, owner = ?expired.owner, why, "closing a run whose owner is gone");
            }
        }
        let message = "the server stopped while this run was in progress";
        let error = RunEvent::Error(ErrorEvent {
            error_type: RunErrorType::Internal,
            message: message.into(),
            retryable: true,
            content: None,
            metadata: None,
        });
        let scope = self.store.user(expired.user);
        let data = event_data(&error, run, last_seq + 1, None, None)?;
        scope
            .append_run_event(run, last_seq + 1, error.event_type(), &data, self.replica)
            .await?;
        let done = RunEvent::done(RunStatus::Interrupted);
        let data = event_data(&done, run, last_seq + 2, None, None)?;
        scope
            .append_final_run_event(
                run,
                last_seq + 2,
                &data,
                RunStatus::Interrupted,
                Some(message),
                self.replica,
            )
            .await?;
        maintenance.interrupt_research_of_run(run).await?;
        Ok(true)
    }

    /// Continues a run this replica has just taken over from its last checkpoint (see
    /// [`resume`]); the new attempt's number, or why the run cannot be continued.
    async fn resume_taken_over(
        self: &Arc<Self>,
        expired: &ExpiredRun,
        last_seq: i64,
    ) -> Result<u32, String> {
        let resumer = self
            .resumer
            .lock()
            .clone()
            .ok_or("this process continues no runs")?;
        let scope = self.store.user(expired.user);
        let saved = scope
            .run_checkpoint(expired.run)
            .await
            .map_err(|error| error.to_string())?
            .ok_or("the run saved no checkpoint")?;
        let mut checkpoint: Checkpoint = serde_json::from_value(saved)
            .map_err(|error| format!("its checkpoint is unreadable: {error}"))?;
        if checkpoint.unhanded() >= resume::MAX_ATTEMPTS {
            return Err(format!(
                "it was started {} times already, {} of them not handed over",
                checkpoint.attempt,
                checkpoint.unhanded()
            ));
        }
        let run = scope
            .get_run(expired.run)
            .await
            .map_err(|error| error.to_string())?;
        let body = resumer.resume(expired.user, &run, &checkpoint).await?;
        let superseded_after = checkpoint.seq;
        // Counted before the body runs: a body that brings its replica down every time is not
        // started for ever.
        checkpoint.attempt += 1;
        let value = serde_json::to_value(&checkpoint).map_err(|error| error.to_string())?;
        scope
            .save_run_checkpoint(run.id, self.replica, &value)
            .await
            .map_err(|error| error.to_string())?;
        let attempt = checkpoint.attempt;
        let content = match &checkpoint.step {
            Some(step) => format!(
                "The server executing this run stopped; attempt {attempt} goes on after {step}."
            ),
            None => {
                format!("The server executing this run stopped; attempt {attempt} starts it over.")
            }
        };
        let resumed = events::RunResumed {
            attempt,
            superseded_after,
            resumed_from: checkpoint.step.clone(),
            content,
        };
        self.execute(
            expired.user,
            run,
            Holding::TakenOver {
                last_seq,
                resumed,
                checkpoint,
            },
            body,
        );
        Ok(attempt)
    }

    fn lease_span(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.leases.lease).unwrap_or(chrono::Duration::days(1))
    }

    fn lease_until(&self) -> chrono::DateTime<chrono::Utc> {
        crate::store::now() + self.lease_span()
    }

    /// Starts the replica's background work: the lease keeper (renews this replica's leases and
    /// sweeps expired runs every heartbeat) and the command reader (takes the cancels and inputs
    /// other replicas stored for runs executing here). Both stop after [`RunHub::shutdown`].
    pub fn spawn_control(self: &Arc<Self>) {
        let hub = self.clone();
        tokio::spawn(async move {
            let mut last_cleanup = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(hub.leases.heartbeat) => {}
                    _ = hub.control_stop.cancelled() => return,
                }
                if hub.shutdown.is_cancelled() {
                    // Shutting down: runs write their end or let go of their lease; none is
                    // renewed (one let go must stay takeable) and no new work is taken.
                    continue;
                }
                let maintenance = hub.store.maintenance();
                if let Err(error) = maintenance
                    .renew_leases(hub.replica, hub.lease_until())
                    .await
                {
                    tracing::warn!(%error, "could not renew this replica's run leases");
                }
                match hub.sweep().await {
                    Ok(0) => {}
                    Ok(taken) => tracing::warn!(taken, "took over runs whose replica is gone"),
                    Err(error) => tracing::warn!(%error, "sweeping expired runs failed"),
                }
                if last_cleanup.elapsed() >= Duration::from_secs(60) {
                    last_cleanup = std::time::Instant::now();
                    let before = crate::store::now() - STALE_COMMAND_AGE;
                    if let Err(error) = maintenance.drop_stale_run_commands(before).await {
                        tracing::warn!(%error, "could not delete stale run commands");
                    }
                }
            }
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let store = hub.store.clone();
            store
                .maintenance()
                .on_wakeups(WakeChannel::RunEvents, &hub.control_stop, |payload| {
                    if let Ok(run) = payload.parse::<RunId>() {
                        // Nobody listening is fine: no follower of a remote run.
                        let _ = hub.remote_events.send(run);
                    }
                })
                .await;
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let mut wakeups = hub
                .store
                .maintenance()
                .wakeups(WakeChannel::RunCommands)
                .await;
            loop {
                let woken = async {
                    match wakeups.as_mut() {
                        Some(stream) => futures::StreamExt::next(stream).await,
                        None => futures::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(hub.leases.command_poll) => {}
                    next = woken => {
                        if next.is_none() {
                            wakeups = None;
                        }
                    }
                    _ = hub.control_stop.cancelled() => return,
                }
                if hub.live().is_empty() {
                    continue;
                }
                match hub.store.maintenance().take_run_commands(hub.replica).await {
                    Ok(commands) => {
                        for (run, command) in commands {
                            hub.apply(run, command);
                        }
                    }
                    Err(error) => tracing::warn!(%error, "could not read run commands"),
                }
            }
        });
    }

    /// Carries out a command another replica stored for a run executing here.
    fn apply(&self, run: RunId, command: RunCommand) {
        match command {
            RunCommand::Cancel => {
                self.cancel(run);
            }
            RunCommand::Input(value) => {
                if let Err(refused) = self.send_input(run, value) {
                    tracing::info!(%run, ?refused, "dropped input the run no longer waits for");
                }
            }
        }
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
    pub fn launch<F, Fut>(self: &Arc<Self>, user: UserId, run: Run, body: F)
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

    /// Cancels the run when it has had no reader for the grace period, here or (through the
    /// run's `read_until`) on another replica.
    /// A run taken over runs in the background (its readers lost their stream with the
    /// replica that died), except while it waits for its user's input: with nobody reading, it
    /// would wait for ever.
    fn watch_readers(
        &self,
        run: RunId,
        cancel: CancellationToken,
        readers: Arc<AtomicUsize>,
        background: Arc<AtomicBool>,
        input: Arc<RunInput>,
        taken_over: bool,
    ) -> tokio::task::JoinHandle<()> {
        let grace = self.abandon_after;
        let store = self.store.clone();
        tokio::spawn(async move {
            let Some(grace) = grace else { return };
            let tick = Duration::from_millis(250).min(grace);
            let mut unread_for = Duration::ZERO;
            loop {
                tokio::time::sleep(tick).await;
                if background.load(Ordering::Relaxed) {
                    if !taken_over {
                        return;
                    }
                    if !input.awaiting.load(Ordering::Relaxed) {
                        unread_for = Duration::ZERO;
                        continue;
                    }
                }
                if readers.load(Ordering::Relaxed) == 0 {
                    unread_for += tick;
                    if unread_for >= grace {
                        let remote = store.maintenance().remote_readers_until(run).await;
                        if let Ok(Some(until)) = remote
                            && until > crate::store::now()
                        {
                            // Someone follows it through another replica.
                            unread_for = Duration::ZERO;
                            continue;
                        }
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

    /// Requests the cancellation of the user's run wherever it executes: at once when it runs
    /// here, else through a command its owner takes. False when the run has ended. The owner
    /// check must have been done by the caller.
    pub async fn request_cancel(&self, user: UserId, run: RunId) -> StoreResult<bool> {
        if self.cancel(run) {
            return Ok(true);
        }
        let sent = self
            .store
            .user(user)
            .send_run_command(run, &RunCommand::Cancel)
            .await?;
        Ok(sent == CommandSent::Sent)
    }

    /// Delivers the user's input to their run wherever it executes (see
    /// [`RunHub::request_cancel`]); refused when the run has ended or does not wait for input.
    pub async fn request_input(
        &self,
        user: UserId,
        run: RunId,
        value: Value,
    ) -> StoreResult<Result<(), InputRefused>> {
        let value = match self.local_input(run, value) {
            Ok(result) => return Ok(result),
            Err(value) => value,
        };
        let sent = self
            .store
            .user(user)
            .send_run_command(run, &RunCommand::Input(value))
            .await?;
        Ok(match sent {
            CommandSent::Sent => Ok(()),
            CommandSent::NotRunning => Err(InputRefused::NotLive),
            CommandSent::NotAwaiting => Err(InputRefused::NotAwaiting),
        })
    }

    /// The input delivered to a run executing here (`Ok` with the outcome), or handed back
    /// when the run does not execute here.
    fn local_input(&self, run: RunId, value: Value) -> Result<Result<(), InputRefused>, Value> {
        if !self.live().contains_key(&run) {
            return Err(value);
        }
        Ok(self.send_input(run, value))
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

    /// Lets `run` go on without readers (a client's `stream: false`): the abandon watchdog
    /// leaves it alone.
    pub fn run_in_background(&self, run: RunId) {
        if let Some(live) = self.live().get(&run) {
            live.background.store(true, Ordering::Relaxed);
        }
    }

    /// Cancels the user's runs of `thread`, here and (through their owners) on other replicas,
    /// and waits, at most `wait`, until they have ended: their followers get `done` before the
    /// thread is deleted.
    pub async fn cancel_thread(&self, user: UserId, thread: ThreadId, wait: Duration) {
        let mut ending: Vec<watch::Receiver<i64>> = Vec::new();
        for live in self
            .live()
            .values()
            .filter(|live| live.user == user && live.thread == Some(thread))
        {
            live.cancel.cancel();
            ending.push(live.notify.subscribe());
        }
        // Runs of the thread executing on other replicas get the cancel through their owner.
        let scope = self.store.user(user);
        let elsewhere: Vec<RunId> = match scope.running_runs_of_thread(thread).await {
            Ok(runs) => runs
                .into_iter()
                .filter(|run| !self.live().contains_key(run))
                .collect(),
            Err(error) => {
                tracing::warn!(%thread, %error, "could not list a deleted thread's runs");
                Vec::new()
            }
        };
        for &run in &elsewhere {
            if let Err(error) = scope.send_run_command(run, &RunCommand::Cancel).await {
                tracing::warn!(%run, %error, "could not cancel a run on another replica");
            }
        }
        let all_ended = async {
            for mut receiver in ending {
                // The sender goes with the run's entry, once its last event is written.
                while receiver.changed().await.is_ok() {}
            }
            for run in elsewhere {
                loop {
                    match scope.get_run(run).await {
                        Ok(state) if !state.status.is_terminal() => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        _ => break,
                    }
                }
            }
        };
        if tokio::time::timeout(wait, all_ended).await.is_err() {
            tracing::warn!(%thread, "a cancelled run of a deleted thread did not end in time");
        }
    }

    /// Delivers the user's input to a run executing here that waits for it. The owner check
    /// must have been done by the caller.
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
        self.control_stop.cancel();
        self.resumer.lock().take();
    }

    /// Tells the owner of a run executing elsewhere that it has a reader here (its
    /// no-reader watchdog reads `read_until`), at most every third of the grace period.
    async fn tell_remote_reader(
        &self,
        user: UserId,
        run: RunId,
        told: &mut Option<std::time::Instant>,
    ) {
        let Some(grace) = self.abandon_after else {
            return;
        };
        if told.is_some_and(|at| at.elapsed() < grace / 3) {
            return;
        }
        *told = Some(std::time::Instant::now());
        let until = crate::store::now()
            + chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::days(1));
        if let Err(error) = self.store.user(user).touch_run_reader(run, until).await {
            tracing::warn!(%run, %error, "could not record a reader of a run on another replica");
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
        // Wakes a follower of a run executing on another replica (NOTIFY on PostgreSQL).
        let mut remote = receiver.is_none().then(|| hub.remote_events.subscribe());
        async_stream(move |sender| async move {
            let _guard = guard;
            let mut receiver = receiver;
            let mut last = after;
            let mut stopping = false;
            let mut reader_told: Option<std::time::Instant> = None;
            loop {
                let Some(events) = read_with_retries(|| {
                    let hub = hub.clone();
                    Box::pin(
                        async move { hub.store.user(user).run_events_after(run, last, 500).await },
                    )
                })
                .await
                else {
                    // The log cannot be read: the client learns it and may resume later.
                    let _ = sender.send(ending_event(&hub, user, run, last).await).await;
                    return;
                };
                let full_page = events.len() == 500;
                for event in events {
                    last = event.seq;
                    let is_done = event.event_type == EventType::Done;
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
                match read_with_retries(|| {
                    let hub = hub.clone();
                    Box::pin(async move { hub.store.user(user).get_run(run).await })
                })
                .await
                {
                    Some(state) if state.status.is_terminal() && state.last_seq <= last => {
                        if last == after {
                            // Asked from the end or past it: nothing was delivered, and the
                            // final `done` still tells the client how the run ended.
                            let from = state.last_seq - 1;
                            if let Some(done) = read_with_retries(|| {
                                let hub = hub.clone();
                                Box::pin(async move {
                                    hub.store.user(user).run_events_after(run, from, 1).await
                                })
                            })
                            .await
                            .and_then(|events| events.into_iter().next())
                                && done.event_type == EventType::Done
                            {
                                let _ = sender.send(done).await;
                            }
                        }
                        return;
                    }
                    Some(_) => {}
                    None => {
                        let _ = sender.send(ending_event(&hub, user, run, last).await).await;
                        return;
                    }
                }
                if receiver.is_none() {
                    hub.tell_remote_reader(user, run, &mut reader_told).await;
                }
                let mut left_here = false;
                let wait = async {
                    match (receiver.as_mut(), remote.as_mut()) {
                        (Some(receiver), _) => {
                            if receiver.changed().await.is_err() {
                                // The run stopped executing in this process (it ended, or
                                // another replica goes on with it): read what is left, then
                                // follow it as a remote run.
                                left_here = true;
                            }
                        }
                        // Executing elsewhere (another replica) or recovered: poll the log,
                        // sooner when the owner's append is notified.
                        (None, remote) => {
                            let notified = async {
                                let Some(remote) = remote else {
                                    return futures::future::pending().await;
                                };
                                loop {
                                    match remote.recv().await {
                                        Ok(id) if id == run => return,
                                        Ok(_) => {}
                                        Err(tokio::sync::broadcast::error::RecvError::Lagged(
                                            _,
                                        )) => {
                                            return;
                                        }
                                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                            return futures::future::pending().await;
                                        }
                                    }
                                }
                            };
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                                _ = notified => {}
                            }
                        }
                    }
                };
                tokio::select! {
                    _ = wait => {}
                    _ = stop.cancelled() => stopping = true,
                    _ = sender.closed() => return,
                }
                if left_here {
                    receiver = None;
                    remote = Some(hub.remote_events.subscribe());
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

#[cfg(test)]
mod wire_tests {
    //! The wire format of every event type, pinned: what `emit` stores and SSE sends (the
    //! envelope included; `timestamp` is checked for shape and left out of the comparison).

    use serde_json::{Value, json};

    use super::events::*;
    use super::{RunEvent, event_data};
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
                            bm25_rank: None,
                            bm25_score: None,
                            context_vector_rank: None,
                            context_vector_score: None,
                            context_bm25_rank: Some(2),
                            context_bm25_score: Some(1.5),
                            rrf: 0.5,
                            decay: 1.0,
                            coverage: 0.0,
                            z: None,
                            relevance: None,
                            later: None,
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
