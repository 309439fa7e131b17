//! What executes runs: the chat turn (`chat`); deep research lives in `crate::research`.

pub mod chat;

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use crate::llm::chat::{ChatRequest, ChatResponse, LlmError, RoleModel};
use crate::runs::{EventType, RunContext, RunFailure};

/// Streams one model call, turning its text deltas into `event`s (`message_delta`,
/// `report_delta`) flushed every `interval`. Returns the model's result and whether every
/// delta was recorded.
pub(crate) async fn stream_to_events(
    context: &RunContext,
    model: &RoleModel,
    request: &ChatRequest,
    interval: Duration,
    event: EventType,
) -> (Result<ChatResponse, LlmError>, Result<(), RunFailure>) {
    let (sender, receiver) = mpsc::unbounded_channel::<String>();
    let call = async move {
        let sink = |text: &str| {
            let _ = sender.send(text.to_string());
        };
        let result = model.model.stream(request, &sink).await;
        drop(sender);
        result
    };
    tokio::join!(call, coalesce(context, receiver, interval, event))
}

async fn coalesce(
    context: &RunContext,
    mut receiver: mpsc::UnboundedReceiver<String>,
    interval: Duration,
    event: EventType,
) -> Result<(), RunFailure> {
    let mut buffer = String::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = receiver.recv() => match received {
                Some(text) => buffer.push_str(&text),
                None => break,
            },
            _ = ticker.tick() => {
                if !buffer.is_empty() {
                    let content = std::mem::take(&mut buffer);
                    context.emit(event, json!({ "content": content })).await?;
                }
            }
        }
    }
    if !buffer.is_empty() {
        context.emit(event, json!({ "content": buffer })).await?;
    }
    Ok(())
}
