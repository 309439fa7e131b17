//! Control of runs wherever they execute: cancel and input go to the owner directly when it
//! is this replica, else as command rows its command reader takes; deleting a thread cancels
//! its runs.

use super::*;

/// Commands nobody took for this long are deleted (their run ended on a replica that died).
pub(super) const STALE_COMMAND_AGE: chrono::Duration = chrono::Duration::minutes(10);

/// Why input could not be delivered to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputRefused {
    /// The run is not executing (it has ended).
    NotLive,
    /// The run is executing but is not waiting for input.
    NotAwaiting,
}

impl RunHub {
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
    pub(super) fn apply(&self, run: RunId, command: RunCommand) {
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
    pub(super) fn local_input(
        &self,
        run: RunId,
        value: Value,
    ) -> Result<Result<(), InputRefused>, Value> {
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
    pub(crate) fn run_in_background(&self, run: RunId) {
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
    pub(crate) fn send_input(&self, run: RunId, value: Value) -> Result<(), InputRefused> {
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
}
