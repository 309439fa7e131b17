//! Run ownership and control across replicas. A run is owned by the replica executing it
//! through a lease on its row (`owner`, `lease_expires_at`), which the owner's heartbeat keeps
//! in the future; a sweeper on any replica takes over a run whose lease expired and closes it.
//! Cancels and inputs that arrive at a replica that does not execute the run become
//! `run_commands` rows, taken by the owner.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::enums::text_enum;

use super::{ReplicaId, RunId, StoreResult, ThreadId, UserId};

/// A running run nobody holds: its owner's lease expired, its owner is the dead predecessor
/// named to the sweep, or it was stored without ever being claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredRun {
    pub run: RunId,
    pub user: UserId,
    /// The replica that held it (`None`: it was never claimed).
    pub owner: Option<ReplicaId>,
}

/// What a sweep may take over: runs whose lease expired before `now`, runs never claimed and
/// not touched since `unclaimed_before`, and every running run of `predecessor` (a replica
/// known to be gone: the previous process of this data directory, whose lock we hold).
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    pub now: DateTime<Utc>,
    pub unclaimed_before: DateTime<Utc>,
    pub predecessor: Option<ReplicaId>,
}

text_enum! {
    /// What a command asks of a run's owner.
    RunCommandKind("run command") {
        Cancel => "cancel",
        Input => "input",
    }
}

/// A request for the replica executing a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunCommand {
    Cancel,
    /// The user's input to a run waiting for it (plan review, an answer to a question).
    Input(serde_json::Value),
}

impl RunCommand {
    pub(crate) fn kind(&self) -> RunCommandKind {
        match self {
            RunCommand::Cancel => RunCommandKind::Cancel,
            RunCommand::Input(_) => RunCommandKind::Input,
        }
    }
}

/// Whether a command was stored for the run's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSent {
    Sent,
    /// The run has ended.
    NotRunning,
    /// An input for a run that is not waiting for one.
    NotAwaiting,
}

#[async_trait]
pub(in crate::store) trait RunControlStore: Send + Sync + 'static {
    /// Makes `replica` the owner of a running run nobody claimed yet, its lease until `until`.
    /// False when the run is owned already or not running.
    async fn claim_run(
        &self,
        run: RunId,
        replica: ReplicaId,
        until: DateTime<Utc>,
    ) -> StoreResult<bool>;
    /// Moves the lease of every running run `replica` owns to `until`; returns how many.
    async fn renew_leases(&self, replica: ReplicaId, until: DateTime<Utc>) -> StoreResult<u64>;
    /// The running runs `sweep` may take over.
    async fn expired_runs(&self, sweep: &Sweep) -> StoreResult<Vec<ExpiredRun>>;
    /// Makes `replica` the owner of `expired` (lease until `until`) if it is still running,
    /// still held by the same owner and still takeable under `sweep`: of two sweepers only
    /// one gets it, and a run whose owner renewed its lease meanwhile is left alone. Returns
    /// the run's last sequence number when taken.
    async fn take_over_run(
        &self,
        expired: &ExpiredRun,
        sweep: &Sweep,
        replica: ReplicaId,
        until: DateTime<Utc>,
    ) -> StoreResult<Option<i64>>;
    /// Marks the researches of `run` still `running` as `interrupted`; returns how many.
    async fn interrupt_research_of_run(&self, run: RunId) -> StoreResult<u64>;
    /// Marks `interrupted` the researches still `running` whose run is gone or ended before
    /// `ended_before` (a crash between the run's end and the research's); returns how many.
    async fn interrupt_orphaned_research(&self, ended_before: DateTime<Utc>) -> StoreResult<u64>;

    /// Stores `command` for the owner of the user's run (the run's owner takes it). An input
    /// is stored only while the run waits for one. `NotFound` for another user's run.
    async fn send_run_command(
        &self,
        user: UserId,
        run: RunId,
        command: &RunCommand,
    ) -> StoreResult<CommandSent>;
    /// How many of the user's runs are running, on every replica.
    async fn running_run_count(&self, user: UserId) -> StoreResult<i64>;
    /// The user's runs of `thread` still running (wherever they execute).
    async fn running_runs_of_thread(
        &self,
        user: UserId,
        thread: ThreadId,
    ) -> StoreResult<Vec<RunId>>;
    /// Takes (deletes and returns) the commands for runs `replica` owns, oldest first.
    async fn take_run_commands(&self, replica: ReplicaId) -> StoreResult<Vec<(RunId, RunCommand)>>;
    /// Deletes commands stored before `before` that nobody took (their run ended).
    async fn drop_stale_run_commands(&self, before: DateTime<Utc>) -> StoreResult<u64>;
    /// Records whether the user's run waits for input now.
    async fn set_awaiting_input(&self, user: UserId, run: RunId, awaiting: bool)
    -> StoreResult<()>;
    /// Records that someone reads the user's running run through a replica that does not
    /// execute it, until `until` (a later time already recorded is kept).
    async fn touch_run_reader(
        &self,
        user: UserId,
        run: RunId,
        until: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// Until when readers on other replicas said they read the run (`None`: nobody did).
    async fn remote_readers_until(&self, run: RunId) -> StoreResult<Option<DateTime<Utc>>>;
    /// Stores the checkpoint of the user's running run, if `replica` still owns it:
    /// `Conflict` when another replica took it over, `NotFound` when it is not running.
    async fn save_run_checkpoint(
        &self,
        user: UserId,
        run: RunId,
        replica: ReplicaId,
        checkpoint: &serde_json::Value,
    ) -> StoreResult<()>;
    /// Lets the lease of a run `replica` owns expire now, so that the next sweep (of any
    /// replica, or of this data directory's next process) takes it over.
    async fn release_run(&self, run: RunId, replica: ReplicaId) -> StoreResult<()>;
    /// The user's run's last checkpoint (`None`: it never saved one).
    async fn run_checkpoint(
        &self,
        user: UserId,
        run: RunId,
    ) -> StoreResult<Option<serde_json::Value>>;
}

/// What a wake-up is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeChannel {
    /// A command was stored for some run (the payload is empty).
    RunCommands,
    /// An event was appended to a run's log (the payload is the run's id).
    RunEvents,
    /// Memories were written (the memory log grew; the payload is empty): indexers follow.
    MemoryLog,
}

impl WakeChannel {
    /// The PostgreSQL channel's name.
    pub(in crate::store) fn name(self) -> &'static str {
        match self {
            WakeChannel::RunCommands => "mnemo_run_commands",
            WakeChannel::RunEvents => "mnemo_run_events",
            WakeChannel::MemoryLog => "mnemo_memory_log",
        }
    }
}

/// Wake-ups across replicas: PostgreSQL's `LISTEN` on the channel a storing transaction
/// `NOTIFY`s; SQLite has none (readers poll, as they also do on PostgreSQL in case a
/// notification is lost).
#[async_trait]
pub(in crate::store) trait Wakeups: Send + Sync + 'static {
    /// A stream of the notifications' payloads; `None` when the backend cannot notify. The
    /// stream ends when the listening connection fails for good.
    async fn wakeups(
        &self,
        channel: WakeChannel,
    ) -> Option<futures::stream::BoxStream<'static, String>>;
}
