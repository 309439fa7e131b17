//! Continuing a run after the replica executing it stopped (it died, or the server restarted).
//!
//! A run's body saves checkpoints through [`RunContext::checkpoint`]: how the body is rebuilt
//! (a chat turn's message, a research's request without secrets) and the results of the steps
//! it finished. The replica that takes the run over asks a [`Resume`] for a body continuing
//! from the last checkpoint and executes it under the same run id; the run's log goes on at
//! the next sequence number after a `run_resumed` event. A run that saved no checkpoint, whose
//! body cannot be rebuilt, or that was started [`MAX_ATTEMPTS`] times already, is closed as
//! `interrupted` instead.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{RunContext, RunFailure};
use crate::store::{Run, UserId};

/// A run is continued after at most this many attempts that did not end by a handover (a body
/// that kills its replica every time, such as a page that exhausts memory, is not retried for
/// ever; restarts that hand runs over do not count).
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// What a run saved to be continued by another attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The attempt that saved it (the first execution is attempt 1).
    pub attempt: u32,
    /// The run's last event when it was saved: events after it belong to a step not finished.
    pub seq: i64,
    /// The last step finished (`None`: none yet; the body starts over).
    pub step: Option<String>,
    /// The body's own state: how to rebuild it and what its finished steps produced.
    pub body: Value,
    /// How many of the attempts ended by a shutdown handing the run over (not a crash).
    #[serde(default)]
    pub handovers: u32,
}

impl Checkpoint {
    /// Attempts that did not end by a handover: those that crashed or are still running.
    pub(crate) fn unhanded(&self) -> u32 {
        self.attempt.saturating_sub(self.handovers)
    }
}

/// A body continuing a run, built by a [`Resume`].
pub type ResumedBody =
    Box<dyn FnOnce(Arc<RunContext>) -> BoxFuture<'static, Result<(), RunFailure>> + Send>;

/// Rebuilds the bodies of runs from their checkpoints (the chat agent's and the research
/// service's, dispatched by the run's kind).
#[async_trait::async_trait]
pub trait Resume: Send + Sync {
    /// The body continuing the user's `run` from `checkpoint`, or why it cannot be continued.
    async fn resume(
        &self,
        user: UserId,
        run: &Run,
        checkpoint: &Checkpoint,
    ) -> Result<ResumedBody, String>;
}
