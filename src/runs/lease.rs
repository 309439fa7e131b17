//! Holding runs through leases: the lease on each run's row and its timing, the sweeper that
//! takes over runs whose owner's lease lapsed, and what it does with them (continued from
//! their checkpoint, or closed as `interrupted`).

use super::*;

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

impl RunHub {
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
    pub(super) async fn close_taken_over(
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
    pub(super) async fn resume_taken_over(
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

    pub(super) fn lease_span(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.leases.lease).unwrap_or(chrono::Duration::days(1))
    }

    pub(super) fn lease_until(&self) -> chrono::DateTime<chrono::Utc> {
        crate::store::now() + self.lease_span()
    }
}
