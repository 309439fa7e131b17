//! The `ChatModel` seam: messages, tools, streaming deltas, token usage and cost, errors with a
//! retryable flag, retry with backoff, and structured (JSON) output with repair and retries.
//! Only `llm/openai.rs` knows the wire client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::retry::{Attempt, RetryPolicy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The raw JSON arguments as the model produced them.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: String,
    /// Tool calls made by an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub(crate) fn system(content: impl Into<String>) -> Self {
        Self::text(ChatRole::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::text(ChatRole::User, content)
    }

    pub(crate) fn assistant(content: impl Into<String>) -> Self {
        Self::text(ChatRole::Assistant, content)
    }

    pub(crate) fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: ChatRole::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }

    fn text(role: ChatRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A function the model may call, with JSON-schema parameters.
#[derive(Debug, Clone, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// Ask for a JSON object (`response_format: json_object`).
    pub json: bool,
    /// The object's schema, for servers that can constrain their output to it
    /// (`response_format: json_schema`); used only with `json`.
    pub schema: Option<crate::llm::schemas::JsonSchema>,
}

impl ChatRequest {
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self {
            messages,
            tools: Vec::new(),
            max_tokens: None,
            temperature: None,
            json: false,
            schema: None,
        }
    }

    /// Asks for a JSON object of this schema.
    pub fn with_schema(mut self, schema: crate::llm::schemas::JsonSchema) -> Self {
        self.json = true;
        self.schema = Some(schema);
        self
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// From the configured price table; absent when the model has no price.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The server reported no usage (llama-cpp-python's streams, some gateways): the counts are
    /// mnemo's own, from the same token counting that fits prompts, so budgets still hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Usage {
    pub(crate) fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.estimated |= other.estimated;
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

#[derive(Debug, Clone, Default)]
pub struct ChatResponse {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    pub model: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmErrorKind {
    /// 429 or a provider's rate-limit error.
    RateLimited,
    /// 5xx, connection failures, broken streams.
    Unavailable,
    Timeout,
    /// 401/403: the key is wrong.
    Auth,
    /// 4xx other than the above: the request is wrong.
    BadRequest,
    /// The reply could not be understood (malformed JSON, schema mismatch).
    BadResponse,
    /// The prompt does not fit the model's context window: a shorter one may work.
    ContextLength,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    pub kind: LlmErrorKind,
    pub message: String,
    /// How long the server asked us to wait before trying again (`Retry-After`).
    pub retry_after: Option<Duration>,
    /// Set when trying again would repeat something already done (text already streamed).
    pub final_attempt: bool,
    /// The HTTP status the server answered with, when it answered with an error status.
    pub status: Option<u16>,
}

impl LlmError {
    pub(crate) fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            final_attempt: false,
            status: None,
        }
    }

    /// Whether trying again later may succeed.
    pub(crate) fn retryable(&self) -> bool {
        !self.final_attempt
            && matches!(
                self.kind,
                LlmErrorKind::RateLimited | LlmErrorKind::Unavailable | LlmErrorKind::Timeout
            )
    }
}

impl crate::error::HasKind for LlmError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self.kind {
            LlmErrorKind::RateLimited => ErrorKind::RateLimited,
            LlmErrorKind::Timeout => ErrorKind::Timeout,
            // The model endpoint is ours to configure: none of these is the caller's mistake.
            LlmErrorKind::Unavailable | LlmErrorKind::Auth | LlmErrorKind::BadResponse => {
                ErrorKind::Unavailable
            }
            LlmErrorKind::BadRequest | LlmErrorKind::ContextLength => ErrorKind::Internal,
        }
    }
}

impl From<crate::llm::prompts::PromptError> for LlmError {
    /// A prompt that does not render is a request we cannot make.
    fn from(error: crate::llm::prompts::PromptError) -> Self {
        LlmError::new(LlmErrorKind::BadRequest, error.to_string())
    }
}

/// Receives streamed text as it arrives.
pub type DeltaSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// A chat-completion backend. `stream` sends text deltas to `on_delta` as they arrive and
/// returns the whole response (text, tool calls, usage).
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// The model name sent to the provider.
    fn model(&self) -> &str;
    async fn stream(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, LlmError>;
    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError>;
}

pub(crate) use crate::config::Price;

/// Cost of usage under a price table keyed by model name.
pub(crate) fn cost(prices: &HashMap<String, Price>, model: &str, usage: &Usage) -> Option<f64> {
    prices.get(model).map(|price| {
        (usage.prompt_tokens as f64 * price.input_per_mtok
            + usage.completion_tokens as f64 * price.output_per_mtok)
            / 1_000_000.0
    })
}

/// Retries `call` on retryable errors under `policy` (the server's `Retry-After` when it sent
/// one): the one retry policy of every outside call, [`crate::retry::RetryPolicy`].
pub(crate) async fn with_retries<T, F, Fut>(policy: RetryPolicy, call: F) -> Result<T, LlmError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LlmError>>,
{
    policy
        .run("model call", call, |error: &LlmError| {
            if error.retryable() {
                Attempt::Again {
                    after: error.retry_after,
                }
            } else {
                Attempt::Final
            }
        })
        .await
}

/// Asks for a JSON object and validates it with `parse` (which also checks the schema's
/// requirements). A malformed reply is first repaired locally (code fences, text around the
/// object, trailing commas); if that fails, the model is told what was wrong and asked again,
/// up to `retries` times.
pub async fn complete_json<T>(
    model: &dyn ChatModel,
    mut request: ChatRequest,
    retries: u32,
    parse: impl Fn(Value) -> Result<T, String>,
) -> Result<(T, Usage), LlmError> {
    request.json = true;
    let mut usage = Usage::default();
    let mut last_error = String::new();
    for _ in 0..=retries {
        let response = model.complete(&request).await?;
        usage.add(&response.usage);
        match repair_json(&response.content)
            .map_err(|e| e.to_string())
            .and_then(&parse)
        {
            Ok(value) => return Ok((value, usage)),
            Err(error) => {
                last_error = error;
                request
                    .messages
                    .push(ChatMessage::assistant(response.content));
                request.messages.push(ChatMessage::user(format!(
                    "That reply was not valid: {last_error}. Answer again with only the JSON object."
                )));
            }
        }
    }
    Err(LlmError::new(
        LlmErrorKind::BadResponse,
        format!("no valid JSON after {} attempts: {last_error}", retries + 1),
    ))
}

/// Extracts and parses the JSON object in a model's reply.
pub(crate) fn repair_json(text: &str) -> Result<Value, serde_json::Error> {
    if let Ok(value) = serde_json::from_str::<Value>(text.trim()) {
        return Ok(value);
    }
    let start = text.find(['{', '[']).unwrap_or(0);
    let end = text
        .rfind(['}', ']'])
        .map(|end| end + 1)
        .unwrap_or(text.len());
    let inner = if start < end { &text[start..end] } else { text };
    match serde_json::from_str::<Value>(inner) {
        Ok(value) => Ok(value),
        Err(error) => {
            let without_trailing_commas = remove_trailing_commas(inner);
            serde_json::from_str::<Value>(&without_trailing_commas).map_err(|_| error)
        }
    }
}

fn remove_trailing_commas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut in_string = false;
    let mut escaped = false;
    for (index, c) in chars.iter().enumerate() {
        if in_string {
            out.push(*c);
            if escaped {
                escaped = false;
            } else if *c == '\\' {
                escaped = true;
            } else if *c == '"' {
                in_string = false;
            }
            continue;
        }
        if *c == '"' {
            in_string = true;
        }
        if *c == ',' {
            let next = chars[index + 1..].iter().find(|c| !c.is_whitespace());
            if matches!(next, Some('}' | ']')) {
                continue;
            }
        }
        out.push(*c);
    }
    out
}

/// A model for one role (chat, research, summarization, compression, final_report, memory).
#[derive(Clone)]
pub struct RoleModel {
    pub role: crate::config::ModelRole,
    pub model: Arc<dyn ChatModel>,
    pub max_tokens: u32,
    /// The model's context window in tokens, prompt and answer together.
    pub context_tokens: u32,
    /// Where it is served (host and port), for display.
    pub provider: String,
    /// Whether its endpoint answers; shared by the roles served by one endpoint.
    pub probe: Option<Arc<crate::llm::roles::Probe>>,
}

impl RoleModel {
    /// A role model around any `ChatModel` (tests, fakes), with a generous window.
    pub fn new(role: crate::config::ModelRole, model: Arc<dyn ChatModel>, max_tokens: u32) -> Self {
        Self {
            role,
            model,
            max_tokens,
            context_tokens: 32_768,
            provider: "local".into(),
            probe: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_repair_table() {
        let cases = [
            (r#"{"a": 1}"#, Some(serde_json::json!({"a": 1}))),
            (
                "```json\n{\"a\": [1, 2,]}\n```",
                Some(serde_json::json!({"a": [1, 2]})),
            ),
            (
                "Sure! Here it is: {\"ok\": true, } thanks",
                Some(serde_json::json!({"ok": true})),
            ),
            (
                r#"{"text": "a, }"}"#,
                Some(serde_json::json!({"text": "a, }"})),
            ),
            ("no json here", None),
            ("{\"a\": ", None),
        ];
        for (input, expected) in cases {
            assert_eq!(repair_json(input).ok(), expected, "{input}");
        }
    }

    #[test]
    fn usage_adds_and_costs() {
        let mut prices = HashMap::new();
        prices.insert(
            "m".to_string(),
            Price {
                input_per_mtok: 2.0,
                output_per_mtok: 8.0,
            },
        );
        let usage = Usage {
            prompt_tokens: 1000,
            completion_tokens: 500,
            total_tokens: 1500,
            cost_usd: None,
            estimated: false,
        };
        assert_eq!(cost(&prices, "m", &usage), Some(0.006));
        assert_eq!(cost(&prices, "other", &usage), None);
        let mut total = Usage::default();
        total.add(&Usage {
            cost_usd: Some(0.5),
            ..usage
        });
        total.add(&usage);
        assert_eq!(total.total_tokens, 3000);
        assert_eq!(total.cost_usd, Some(0.5));
    }

    #[tokio::test]
    async fn retries_stop_at_the_limit_and_only_for_retryable_errors() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let policy = RetryPolicy::new(2, Duration::from_millis(1));
        let result: Result<(), LlmError> = with_retries(policy, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(LlmError::new(LlmErrorKind::RateLimited, "slow down"))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 3);
        calls.store(0, std::sync::atomic::Ordering::Relaxed);
        let _ = with_retries(policy, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err::<(), _>(LlmError::new(LlmErrorKind::Auth, "bad key"))
        })
        .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
