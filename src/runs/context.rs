//! The writing side of one run ([`RunContext`]): appending its events under the lease (with
//! the envelope), checkpoints, token accounting, and the input it may wait for.

use super::*;

/// Input a run waits for from its user (a plan approval, an answer to a clarifying question).
pub(super) struct RunInput {
    pub(super) awaiting: AtomicBool,
    pub(super) sender: tokio::sync::mpsc::UnboundedSender<Value>,
    pub(super) receiver: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Value>>,
}

/// A run expecting its user's input ([`RunContext::expect_input`]).
pub struct InputWait<'a> {
    pub(super) context: &'a RunContext,
    pub(super) receiver: tokio::sync::MutexGuard<'a, tokio::sync::mpsc::UnboundedReceiver<Value>>,
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

/// What every event of a research carries besides its own fields.
#[derive(Debug, Clone)]
pub(crate) struct ResearchEnvelope {
    pub research_id: RunId,
    /// The research's main model (`null` without one).
    pub model: Option<String>,
}

/// An event's JSON as stored and sent: its own fields, `type`, and the envelope (`run_id`,
/// `seq`, `timestamp`; for research `research_id` and, when the event names none, `model`).
pub(super) fn event_data(
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
    pub(super) store: Arc<dyn Store>,
    /// The replica executing the run (its appends are fenced by it).
    pub(super) replica: ReplicaId,
    pub(super) next_seq: tokio::sync::Mutex<i64>,
    pub(super) notify: watch::Sender<i64>,
    pub(super) cancel: CancellationToken,
    pub(super) input: Arc<RunInput>,
    pub(super) limits: RunLimits,
    /// Model tokens this run has used so far (from its `usage` events).
    pub(super) spent: AtomicU64,
    /// Set when a budget stopped the run: the failure it ends with.
    pub(super) overrun: std::sync::OnceLock<String>,
    /// Which execution of the run this is (1 the first; more after takeovers).
    pub(super) attempt: u32,
    /// Set once the run saved a checkpoint: another attempt can continue it.
    pub(super) checkpointed: AtomicBool,
    /// The last checkpoint saved (for a handover to count itself in).
    pub(super) saved: tokio::sync::Mutex<Option<Checkpoint>>,
    /// Set when a write found the run owned by another replica (this one's lease lapsed and
    /// the run was taken over): the body is stopped and writes nothing more.
    pub(super) lost: AtomicBool,
    /// The server's shutdown (the run's own token is a child of it).
    pub(super) shutdown: CancellationToken,
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

    pub(super) async fn set_awaiting(&self, awaiting: bool) {
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
    pub(crate) async fn emit_for(
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
    pub(super) async fn append(
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
    pub(super) async fn resync_seq(&self) {
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
    pub(super) async fn emit_closing(
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
    pub(super) async fn charge(&self, tokens: u64) {
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
    pub(crate) fn attempt(&self) -> u32 {
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

    pub(super) async fn save(&self, checkpoint: &Checkpoint) -> StoreResult<()> {
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
    pub(super) async fn count_handover(&self) -> StoreResult<()> {
        let saved = self.saved.lock().await;
        let Some(mut checkpoint) = saved.clone() else {
            return Ok(());
        };
        checkpoint.handovers += 1;
        self.save(&checkpoint).await
    }

    /// Notes a write refused because another replica owns the run now, and stops the body.
    pub(super) fn lost_if_taken(&self, error: StoreError) -> StoreError {
        if matches!(error, StoreError::Conflict(_)) {
            self.lost.store(true, Ordering::SeqCst);
            self.cancel.cancel();
        }
        error
    }

    /// Whether another replica has taken the run over from this one (see `lost`).
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the run is being stopped by a shutdown and left for the next replica to
    /// continue from its checkpoint (rather than ended).
    pub(crate) fn handed_over(&self) -> bool {
        self.lost()
            || self.shutdown.is_cancelled()
                && self.checkpointed.load(Ordering::SeqCst)
                && self.overrun.get().is_none()
    }

    pub(crate) fn thread_id(&self) -> Option<ThreadId> {
        self.run.thread_id
    }
}
