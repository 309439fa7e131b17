//! The production `ChatModel`: any OpenAI-compatible `/chat/completions` endpoint (OpenAI,
//! DeepSeek, Qwen, Ollama, vLLM, llama.cpp server, LiteLLM) through `async-openai`, with our
//! own request/response JSON ("bring your own types") so vendor differences stay tolerable.
//! Streaming with usage, tool calls (parallel ones too), timeouts, retries with backoff on
//! 429/5xx/connection errors, and cost from the price table. The key never appears in errors.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::chat::{
    ChatModel, ChatRequest, ChatResponse, ChatRole, DeltaSink, LlmError, LlmErrorKind, Price,
    ToolCall, Usage, cost, with_retries,
};

type ChunkStream = Pin<Box<dyn Stream<Item = Result<Value, OpenAIError>> + Send>>;

pub struct OpenAiChat {
    client: Client<OpenAIConfig>,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    idle_timeout: Duration,
    retries: u32,
    backoff: Duration,
    prices: HashMap<String, Price>,
}

/// Connection settings shared by every role's model.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub retries: u32,
    pub backoff: Duration,
    pub prices: HashMap<String, Price>,
}

impl OpenAiChat {
    pub fn new(endpoint: &Endpoint, model: impl Into<String>) -> Self {
        let mut config = OpenAIConfig::new().with_api_base(endpoint.base_url.trim_end_matches('/'));
        // Local servers (Ollama, vLLM) often need no key; the header is then a harmless dummy.
        config = config.with_api_key(endpoint.api_key.clone().unwrap_or_else(|| "none".into()));
        Self {
            client: Client::with_config(config),
            model: model.into(),
            api_key: endpoint.api_key.clone().filter(|key| !key.is_empty()),
            timeout: endpoint.timeout,
            idle_timeout: endpoint.timeout.min(Duration::from_secs(90)),
            retries: endpoint.retries,
            backoff: endpoint.backoff,
            prices: endpoint.prices.clone(),
        }
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Value {
        let messages: Vec<Value> = request.messages.iter().map(message_json).collect();
        let mut body = json!({ "model": self.model, "messages": messages, "stream": stream });
        if stream {
            body["stream_options"] = json!({ "include_usage": true });
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({ "type": "function", "function": {
                        "name": tool.name, "description": tool.description, "parameters": tool.parameters,
                    }})
                })
                .collect();
        }
        if let Some(max_tokens) = request.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(temperature) = request.temperature {
            body["temperature"] = json!(temperature);
        }
        if request.json {
            body["response_format"] = json!({ "type": "json_object" });
        }
        body
    }

    /// Maps a client error to ours, with the key scrubbed from the message.
    fn error(&self, error: OpenAIError) -> LlmError {
        let (kind, message) = match &error {
            OpenAIError::ApiError(response) => {
                let status = response.status_code.as_u16();
                let kind = match status {
                    429 => LlmErrorKind::RateLimited,
                    401 | 403 => LlmErrorKind::Auth,
                    408 => LlmErrorKind::Timeout,
                    500..=599 => LlmErrorKind::Unavailable,
                    _ => LlmErrorKind::BadRequest,
                };
                (
                    kind,
                    format!(
                        "model endpoint answered {status}: {}",
                        response.api_error.message
                    ),
                )
            }
            OpenAIError::Reqwest(inner) if inner.is_timeout() => (
                LlmErrorKind::Timeout,
                "model endpoint timed out".to_string(),
            ),
            OpenAIError::Reqwest(inner) => (
                LlmErrorKind::Unavailable,
                format!("model endpoint unreachable: {inner}"),
            ),
            OpenAIError::StreamError(inner) => (
                LlmErrorKind::Unavailable,
                format!("model stream failed: {inner}"),
            ),
            OpenAIError::JSONDeserialize(inner, _) => (
                LlmErrorKind::BadResponse,
                format!("unreadable model response: {inner}"),
            ),
            other => (LlmErrorKind::BadRequest, other.to_string()),
        };
        LlmError::new(kind, self.scrub(&message))
    }

    fn scrub(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if key.len() >= 4 => text.replace(key.as_str(), "[redacted]"),
            _ => text.to_string(),
        }
    }

    fn usage(&self, value: &Value) -> Usage {
        let mut usage = Usage {
            prompt_tokens: value["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: value["completion_tokens"].as_u64().unwrap_or(0),
            total_tokens: value["total_tokens"].as_u64().unwrap_or(0),
            cost_usd: None,
        };
        if usage.total_tokens == 0 {
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
        }
        usage.cost_usd = cost(&self.prices, &self.model, &usage);
        usage
    }

    async fn stream_once(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, LlmError> {
        let opened = tokio::time::timeout(
            self.timeout,
            self.client
                .chat()
                .create_stream_byot(self.body(request, true)),
        )
        .await
        .map_err(|_| LlmError::new(LlmErrorKind::Timeout, "model endpoint timed out"))?;
        let mut stream: ChunkStream = opened.map_err(|error| self.error(error))?;
        let mut response = ChatResponse {
            model: self.model.clone(),
            ..ChatResponse::default()
        };
        let mut calls: BTreeMap<u64, ToolCall> = BTreeMap::new();
        loop {
            let next = tokio::time::timeout(self.idle_timeout, stream.next())
                .await
                .map_err(|_| LlmError::new(LlmErrorKind::Timeout, "model stream stalled"))?;
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|error| self.error(error))?;
            if chunk["usage"].is_object() {
                response.usage = self.usage(&chunk["usage"]);
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            let delta = &choice["delta"];
            if let Some(text) = delta["content"].as_str().filter(|text| !text.is_empty()) {
                response.content.push_str(text);
                on_delta(text);
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().unwrap_or(calls.len() as u64);
                let entry = calls.entry(index).or_insert_with(|| ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                if let Some(id) = call["id"].as_str() {
                    entry.id = id.to_string();
                }
                if let Some(name) = call["function"]["name"].as_str() {
                    entry.name.push_str(name);
                }
                if let Some(arguments) = call["function"]["arguments"].as_str() {
                    entry.arguments.push_str(arguments);
                }
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                response.finish_reason = Some(reason.to_string());
            }
        }
        response.tool_calls = finish_calls(calls.into_values().collect());
        Ok(response)
    }

    async fn complete_once(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let answer: Value = tokio::time::timeout(
            self.timeout,
            self.client.chat().create_byot(self.body(request, false)),
        )
        .await
        .map_err(|_| LlmError::new(LlmErrorKind::Timeout, "model endpoint timed out"))?
        .map_err(|error| self.error(error))?;
        let message = &answer["choices"][0]["message"];
        let calls = message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|call| ToolCall {
                id: call["id"].as_str().unwrap_or_default().to_string(),
                name: call["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                arguments: call["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect();
        Ok(ChatResponse {
            content: message["content"].as_str().unwrap_or_default().to_string(),
            tool_calls: finish_calls(calls),
            usage: self.usage(&answer["usage"]),
            finish_reason: answer["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string),
            model: self.model.clone(),
        })
    }
}

/// Gives every call an id (some servers omit them) and `{}` for empty arguments.
fn finish_calls(mut calls: Vec<ToolCall>) -> Vec<ToolCall> {
    for (index, call) in calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = format!("call_{index}");
        }
        if call.arguments.trim().is_empty() {
            call.arguments = "{}".into();
        }
    }
    calls.retain(|call| !call.name.is_empty());
    calls
}

fn message_json(message: &super::chat::ChatMessage) -> Value {
    let role = match message.role {
        ChatRole::System => "system",
        ChatRole::User => "user",
        ChatRole::Assistant => "assistant",
        ChatRole::Tool => "tool",
    };
    let mut value = json!({ "role": role, "content": message.content });
    if !message.tool_calls.is_empty() {
        value["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({ "id": call.id, "type": "function",
                        "function": { "name": call.name, "arguments": call.arguments } })
            })
            .collect();
    }
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    value
}

#[async_trait]
impl ChatModel for OpenAiChat {
    fn model(&self) -> &str {
        &self.model
    }

    async fn stream(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, LlmError> {
        // Text already shown to the user cannot be taken back, so a stream that failed after its
        // first delta is not retried.
        let emitted = std::sync::atomic::AtomicBool::new(false);
        let sink = |text: &str| {
            emitted.store(true, std::sync::atomic::Ordering::Relaxed);
            on_delta(text);
        };
        let mut attempt = 0;
        loop {
            match self.stream_once(request, &sink).await {
                Err(error)
                    if error.retryable()
                        && attempt < self.retries
                        && !emitted.load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    let delay = self.backoff * 2u32.saturating_pow(attempt);
                    tracing::warn!(attempt, ?delay, error = %error.message, "model stream failed; retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        with_retries(self.retries, self.backoff, || self.complete_once(request)).await
    }
}
