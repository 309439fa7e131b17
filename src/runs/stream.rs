//! A streamed model call turned into delta events: text arrives from the model and is
//! coalesced into one `message_delta` or `report_delta` per interval, by a task joined with the
//! call inside the run body (a cancel drops both, so no delta follows the run's `done`).

use std::time::Duration;

use tokio::sync::mpsc;

use super::events::Delta;
use super::{ResearchEnvelope, RunContext, RunEvent, RunFailure};
use crate::llm::chat::{ChatRequest, ChatResponse, LlmError, RoleModel};

/// Which delta event the text becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeltaKind {
    Message,
    Report,
}

impl DeltaKind {
    fn event(self, content: String) -> RunEvent {
        match self {
            DeltaKind::Message => RunEvent::MessageDelta(Delta { content }),
            DeltaKind::Report => RunEvent::ReportDelta(Delta { content }),
        }
    }
}

/// Rewrites streamed text before it becomes an event (a report's citations of sources that do
/// not exist are cut as they arrive). It may hold text back until it can decide.
pub(crate) trait DeltaFilter: Send {
    /// The text ready to emit after `text` arrived.
    fn push(&mut self, text: &str) -> String;
    /// What is still held when the stream ends.
    fn finish(&mut self) -> String;
}

/// Streams one model call, turning its text deltas into delta events flushed every
/// `interval` (through `filter`, when given). Returns the model's result and, once every
/// delta is recorded, how many delta events were emitted.
pub(crate) async fn stream_to_events(
    context: &RunContext,
    research: Option<&ResearchEnvelope>,
    model: &RoleModel,
    request: &ChatRequest,
    interval: Duration,
    kind: DeltaKind,
    filter: Option<&mut dyn DeltaFilter>,
) -> (Result<ChatResponse, LlmError>, Result<usize, RunFailure>) {
    let (sender, receiver) = mpsc::unbounded_channel::<String>();
    let call = async move {
        let sink = |text: &str| {
            let _ = sender.send(text.to_string());
        };
        let result = model.model.stream(request, &sink).await;
        drop(sender);
        result
    };
    tokio::join!(
        call,
        coalesce(context, research, receiver, interval, kind, filter)
    )
}

async fn coalesce(
    context: &RunContext,
    research: Option<&ResearchEnvelope>,
    mut receiver: mpsc::UnboundedReceiver<String>,
    interval: Duration,
    kind: DeltaKind,
    mut filter: Option<&mut dyn DeltaFilter>,
) -> Result<usize, RunFailure> {
    let mut emitted = 0;
    let mut buffer = String::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = receiver.recv() => match received {
                Some(text) => match filter.as_deref_mut() {
                    Some(filter) => buffer.push_str(&filter.push(&text)),
                    None => buffer.push_str(&text),
                },
                None => break,
            },
            _ = ticker.tick() => {
                if !buffer.is_empty() {
                    let content = std::mem::take(&mut buffer);
                    context.emit_for(kind.event(content), research).await?;
                    emitted += 1;
                }
            }
        }
    }
    if let Some(filter) = filter {
        buffer.push_str(&filter.finish());
    }
    if !buffer.is_empty() {
        context.emit_for(kind.event(buffer), research).await?;
        emitted += 1;
    }
    Ok(emitted)
}
