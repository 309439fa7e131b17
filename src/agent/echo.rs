//! The placeholder chat turn: repeats the user's message back word by word as `message_delta`
//! events, stores the reply as the assistant message, and ends with `message_complete`.
//! It is honest about what it is: the reply says that no chat model is wired in yet.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::runs::{EventType, RunContext, RunFailure};
use crate::store::{MessageId, Role, Store};

/// Runs one echo turn for the user message `content` in the run's thread.
pub async fn run_echo_turn(
    context: Arc<RunContext>,
    store: Arc<dyn Store>,
    user_message: MessageId,
    content: String,
    word_delay: Duration,
) -> Result<(), RunFailure> {
    let Some(thread) = context.thread_id() else {
        return Err(RunFailure::Failed {
            error_type: crate::runs::RunErrorType::Validation,
            message: "a chat turn needs a thread".into(),
            retryable: false,
        });
    };
    context
        .emit(
            EventType::SessionStart,
            json!({ "thread_id": thread, "kind": "chat", "user_message_id": user_message }),
        )
        .await?;
    let reply = format!("(echo: no chat model is configured yet) {content}");
    let mut words = reply.split_inclusive(' ').peekable();
    while let Some(word) = words.next() {
        context
            .emit(EventType::MessageDelta, json!({ "content": word }))
            .await?;
        if words.peek().is_some() && !word_delay.is_zero() {
            tokio::time::sleep(word_delay).await;
        }
    }
    let stored = store
        .append_message(
            context.user,
            thread,
            Role::Assistant,
            &reply,
            Some(context.run.id),
        )
        .await?;
    context
        .emit(
            EventType::MessageComplete,
            json!({ "message_id": stored.id, "content": reply }),
        )
        .await?;
    Ok(())
}
