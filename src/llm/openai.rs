//! The production `ChatModel`: any OpenAI-compatible `/chat/completions` endpoint (OpenAI,
//! Azure OpenAI, DeepSeek, Qwen, OpenRouter, Ollama, vLLM, LM Studio, llama.cpp's server,
//! LiteLLM), spoken directly over reqwest with server-sent events read by `eventsource-stream`,
//! so every quirk real servers have is ours to handle:
//! - the base URL's query (Azure's `api-version`) is kept on every request, and Azure's
//!   `api-key` header is sent beside the bearer token;
//! - `Retry-After` on 429/503 is honoured (capped) before retrying;
//! - an error object inside a 200 stream is an error, not an empty answer;
//! - a final usage-only chunk with empty `choices`, a missing `finish_reason`, tool-call ids only
//!   on the first chunk, parallel tool calls and a server that answers a streamed request with
//!   one JSON body are all read as the answer they are;
//! - reasoning is never the answer: `reasoning_content` deltas are dropped and a `<think>` block
//!   at the start of the content is cut out while streaming ([`ThinkFilter`]);
//! - a context-length refusal is its own error kind, so callers can shrink the prompt.
//!
//! Timeouts (to the first byte, then between events), retries with jittered backoff on
//! 429/5xx/connection errors, and cost from the price table. The key never appears in errors.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde_json::{Value, json};

use super::chat::{
    ChatModel, ChatRequest, ChatResponse, ChatRole, DeltaSink, LlmError, LlmErrorKind, Price,
    ToolCall, Usage, cost, with_retries,
};
use crate::retry::{RetryPolicy, retry_after};

/// The most an error body is read, to quote it.
const ERROR_BODY_LIMIT: usize = 16 * 1024;

pub struct OpenAiChat {
    http: reqwest::Client,
    /// `{base_url}/chat/completions` with the base URL's query.
    url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    idle_timeout: Duration,
    retry: RetryPolicy,
    prices: HashMap<String, Price>,
    /// How structured answers are asked of this server, learnt from its refusals: see
    /// [`Format`].
    format: std::sync::atomic::AtomicU8,
}

/// The ways of asking for JSON, best first. A server that refuses one (400 or 422: DeepSeek
/// and llama-cpp-python do not know `json_schema`, some servers no `response_format` at all)
/// is asked the next way, and that is remembered for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Format {
    /// `response_format: {"type": "json_schema", …}` when the request has a schema.
    Schema = 0,
    /// `response_format: {"type": "json_object"}`.
    Object = 1,
    /// Only the prompt asks for JSON.
    Prompt = 2,
}

impl Format {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => Format::Schema,
            1 => Format::Object,
            _ => Format::Prompt,
        }
    }
}

/// Where one role's model is served and how patiently it is asked.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    /// How failed calls are tried again.
    pub retry: RetryPolicy,
    pub prices: HashMap<String, Price>,
}

impl Endpoint {
    /// `{base_url}/{path}`, the base URL's query string kept after the path.
    pub(crate) fn url(&self, path: &str) -> String {
        let (base, query) = match self.base_url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (self.base_url.as_str(), None),
        };
        let mut url = format!("{}/{}", base.trim_end_matches('/'), path);
        if let Some(query) = query.filter(|query| !query.is_empty()) {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    fn azure(&self) -> bool {
        self.base_url
            .split_once('?')
            .is_some_and(|(_, query)| query.split('&').any(|p| p.starts_with("api-version=")))
    }

    /// The headers every request to this endpoint carries: the key as a bearer token (and as
    /// Azure's `api-key`). Local servers that need no key get none.
    pub(crate) fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = self.api_key.as_deref().filter(|key| !key.is_empty()) {
            if let Ok(value) = format!("Bearer {key}").parse() {
                headers.insert(reqwest::header::AUTHORIZATION, value);
            }
            if self.azure()
                && let Ok(value) = key.parse()
            {
                headers.insert("api-key", value);
            }
        }
        headers
    }
}

impl OpenAiChat {
    pub fn new(endpoint: &Endpoint, model: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .default_headers(endpoint.headers())
            .connect_timeout(Duration::from_secs(10))
            // Idle connections to the model server are kept, but not one per finished stream.
            .pool_max_idle_per_host(16)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_default();
        Self {
            http,
            url: endpoint.url("chat/completions"),
            model: model.into(),
            api_key: endpoint.api_key.clone().filter(|key| !key.is_empty()),
            timeout: endpoint.timeout,
            idle_timeout: endpoint.timeout.min(Duration::from_secs(90)),
            retry: endpoint.retry,
            prices: endpoint.prices.clone(),
            format: std::sync::atomic::AtomicU8::new(Format::Schema as u8),
        }
    }

    fn format(&self) -> Format {
        Format::from_u8(self.format.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The way a JSON request is made now (`None` for requests that want text).
    fn format_for(&self, request: &ChatRequest) -> Option<Format> {
        if !request.json {
            return None;
        }
        Some(match self.format() {
            Format::Schema if request.schema.is_none() => Format::Object,
            format => format,
        })
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
        match (self.format_for(request), &request.schema) {
            (Some(Format::Schema), Some(schema)) => {
                body["response_format"] = json!({ "type": "json_schema", "json_schema": {
                    "name": schema.name, "schema": schema.schema, "strict": false,
                }});
            }
            (Some(Format::Schema | Format::Object), _) => {
                body["response_format"] = json!({ "type": "json_object" });
            }
            _ => {}
        }
        body
    }

    /// Sends `request`; a JSON request the server refuses as malformed is sent again the next
    /// simpler way (see [`Format`]), which is remembered.
    async fn send_request(
        &self,
        request: &ChatRequest,
        stream: bool,
    ) -> Result<reqwest::Response, LlmError> {
        loop {
            let used = self.format_for(request);
            match self.send(&self.body(request, stream)).await {
                Err(error)
                    if matches!(used, Some(Format::Schema | Format::Object))
                        && refuses_format(&error) =>
                {
                    let next = match used {
                        Some(Format::Schema) => Format::Object,
                        _ => Format::Prompt,
                    };
                    tracing::info!(
                        model = %self.model,
                        error = %error.message,
                        ?next,
                        "the model server refused the response format; asking more simply"
                    );
                    self.format
                        .fetch_max(next as u8, std::sync::atomic::Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }

    fn scrub(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if key.len() >= 4 => text.replace(key.as_str(), "[redacted]"),
            _ => text.to_string(),
        }
    }

    fn fail(&self, kind: LlmErrorKind, message: impl AsRef<str>) -> LlmError {
        LlmError::new(kind, self.scrub(message.as_ref()))
    }

    /// A transport failure: timeouts and connection errors are worth retrying.
    fn transport(&self, error: &reqwest::Error) -> LlmError {
        if error.is_timeout() {
            self.fail(LlmErrorKind::Timeout, "model endpoint timed out")
        } else if error.is_connect() {
            self.fail(
                LlmErrorKind::Unavailable,
                "model endpoint unreachable (connection refused or host unknown)",
            )
        } else {
            self.fail(
                LlmErrorKind::Unavailable,
                format!("model endpoint failed: {error}"),
            )
        }
    }

    fn usage(&self, value: &Value) -> Usage {
        let mut usage = Usage {
            prompt_tokens: value["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: value["completion_tokens"].as_u64().unwrap_or(0),
            total_tokens: value["total_tokens"].as_u64().unwrap_or(0),
            cost_usd: None,
            estimated: false,
        };
        if usage.total_tokens == 0 {
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
        }
        usage.cost_usd = cost(&self.prices, &self.model, &usage);
        usage
    }

    /// Sends the request; a non-success status becomes the error its body and headers say.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, LlmError> {
        let request = self.http.post(&self.url).json(body);
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| self.fail(LlmErrorKind::Timeout, "model endpoint timed out"))?
            .map_err(|error| self.transport(&error))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let text = read_capped(response, ERROR_BODY_LIMIT).await;
        let detail = error_detail(&text);
        let kind = match status.as_u16() {
            429 => LlmErrorKind::RateLimited,
            401 | 403 => LlmErrorKind::Auth,
            408 => LlmErrorKind::Timeout,
            500..=599 => LlmErrorKind::Unavailable,
            _ if is_context_length(&detail) => LlmErrorKind::ContextLength,
            _ => LlmErrorKind::BadRequest,
        };
        let mut error = self.fail(
            kind,
            format!("model endpoint answered {}: {detail}", status.as_u16()),
        );
        error.retry_after = retry_after;
        error.status = Some(status.as_u16());
        Err(error)
    }

    async fn stream_once(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, LlmError> {
        let response = self.send_request(request, true).await?;
        let mut answer = ChatResponse {
            model: self.model.clone(),
            ..ChatResponse::default()
        };
        let mut think = ThinkFilter::default();
        let streamed = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        if !streamed {
            // The server ignored `stream: true` and answered in one body.
            let text = tokio::time::timeout(self.timeout, response.text())
                .await
                .map_err(|_| self.fail(LlmErrorKind::Timeout, "model endpoint timed out"))?
                .map_err(|error| self.transport(&error))?;
            let answer = self.read_completion(&text)?;
            if !answer.content.is_empty() {
                on_delta(&answer.content);
            }
            return Ok(answer);
        }
        let mut events = response.bytes_stream().eventsource();
        let mut calls: BTreeMap<u64, ToolCall> = BTreeMap::new();
        loop {
            let next = tokio::time::timeout(self.idle_timeout, events.next())
                .await
                .map_err(|_| self.fail(LlmErrorKind::Timeout, "model stream stalled"))?;
            let Some(event) = next else { break };
            let event = event.map_err(|error| {
                self.fail(
                    LlmErrorKind::Unavailable,
                    format!("model stream broke: {error}"),
                )
            })?;
            let data = event.data.trim();
            if data.is_empty() {
                continue;
            }
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).map_err(|error| {
                self.fail(
                    LlmErrorKind::BadResponse,
                    format!("unreadable model stream chunk: {error}"),
                )
            })?;
            if let Some(error) = stream_error(&chunk) {
                return Err(self.fail(error.0, error.1));
            }
            if chunk["usage"].is_object() {
                answer.usage = self.usage(&chunk["usage"]);
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            let delta = &choice["delta"];
            if let Some(text) = delta["content"].as_str().filter(|text| !text.is_empty()) {
                let shown = think.push(text);
                if !shown.is_empty() {
                    answer.content.push_str(&shown);
                    on_delta(&shown);
                }
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().unwrap_or(calls.len() as u64);
                let entry = calls.entry(index).or_insert_with(|| ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                if let Some(id) = call["id"].as_str().filter(|id| !id.is_empty()) {
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
                answer.finish_reason = Some(reason.to_string());
            }
        }
        let rest = think.finish();
        if !rest.is_empty() {
            answer.content.push_str(&rest);
            on_delta(&rest);
        }
        answer.tool_calls = finish_calls(calls.into_values().collect());
        Ok(answer)
    }

    async fn complete_once(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let response = self.send_request(request, false).await?;
        let text = tokio::time::timeout(self.timeout, response.text())
            .await
            .map_err(|_| self.fail(LlmErrorKind::Timeout, "model endpoint timed out"))?
            .map_err(|error| self.transport(&error))?;
        self.read_completion(&text)
    }

    /// A whole (non-streamed) completion body.
    fn read_completion(&self, text: &str) -> Result<ChatResponse, LlmError> {
        let answer: Value = serde_json::from_str(text).map_err(|error| {
            self.fail(
                LlmErrorKind::BadResponse,
                format!("unreadable model response: {error}"),
            )
        })?;
        if let Some(error) = stream_error(&answer) {
            return Err(self.fail(error.0, error.1));
        }
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
                arguments: match &call["function"]["arguments"] {
                    Value::String(text) => text.clone(),
                    // Some servers send the arguments as an object rather than a string.
                    Value::Null => String::new(),
                    other => other.to_string(),
                },
            })
            .collect();
        Ok(ChatResponse {
            content: strip_think(message["content"].as_str().unwrap_or_default()),
            tool_calls: finish_calls(calls),
            usage: self.usage(&answer["usage"]),
            finish_reason: answer["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string),
            model: self.model.clone(),
        })
    }
}

/// Whether an error answers the response format rather than the request: a 400 or 422 (the
/// usual answer), or any status whose message names `response_format` (llama-cpp-python answers
/// an unknown format with a 500).
fn refuses_format(error: &LlmError) -> bool {
    matches!(error.status, Some(400 | 422)) && error.kind == LlmErrorKind::BadRequest
        || error.status.is_some() && error.message.contains("response_format")
}

/// `Retry-After` in seconds (the form model providers send).
/// Up to `limit` bytes of a response body, as text.
async fn read_capped(response: reqwest::Response, limit: usize) -> String {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= limit {
            body.truncate(limit);
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// What an error body says: `error.message` (OpenAI and most), `message`, `detail`, or the
/// text itself, shortened.
fn error_detail(text: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let said = parsed.as_ref().and_then(|body| {
        [
            &body["error"]["message"],
            &body["error"],
            &body["message"],
            &body["detail"],
        ]
        .into_iter()
        .find_map(|value| value.as_str().map(str::to_string))
    });
    let said = said.unwrap_or_else(|| text.trim().to_string());
    let mut said = crate::text::prefix(&said, 500).to_string();
    if said.is_empty() {
        said = "no details".into();
    }
    said
}

/// Whether a refusal says the prompt does not fit the model's context (OpenAI's
/// `context_length_exceeded`, vLLM's "maximum context length", llama.cpp's "exceeds the
/// available context size", Ollama's and others' variants).
pub(crate) fn is_context_length(detail: &str) -> bool {
    let detail = detail.to_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context window",
        "context size",
        "maximum context",
        "too many tokens",
        "prompt is too long",
        "input is too long",
    ]
    .iter()
    .any(|needle| detail.contains(needle))
}

/// An error object where an answer was expected (inside a 200 stream, or as a 200 body).
fn stream_error(chunk: &Value) -> Option<(LlmErrorKind, String)> {
    let error = chunk.get("error").filter(|error| !error.is_null())?;
    let message = error["message"]
        .as_str()
        .or_else(|| error.as_str())
        .unwrap_or("no details");
    let code = [&error["code"], &error["type"]]
        .into_iter()
        .filter_map(|value| match value {
            Value::String(text) => Some(text.to_lowercase()),
            Value::Number(number) => Some(number.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ");
    let kind = if code.contains("rate") || code.contains("429") {
        LlmErrorKind::RateLimited
    } else if is_context_length(&code) || is_context_length(message) {
        LlmErrorKind::ContextLength
    } else if code.contains("invalid_request") || code.contains("400") {
        LlmErrorKind::BadRequest
    } else {
        LlmErrorKind::Unavailable
    };
    let message = crate::text::prefix(message, 500);
    Some((kind, format!("model stream reported an error: {message}")))
}

/// Cuts a reasoning block (`<think>…</think>`, as Qwen3, DeepSeek-R1 distills and QwQ put at
/// the start of their content when served raw) out of streamed text, whatever the chunking: text
/// that may still turn out to be the opening tag is held back until it is known. Text after the
/// block loses its leading whitespace. A block never closed hides everything after it.
#[derive(Debug, Default)]
pub(crate) struct ThinkFilter {
    state: ThinkState,
    held: String,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum ThinkState {
    /// Nothing but whitespace seen yet.
    #[default]
    Start,
    Thinking,
    /// After a block: leading whitespace still to drop.
    AfterBlock,
    Passing,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkFilter {
    /// Feeds a chunk; returns the text to show now.
    pub(crate) fn push(&mut self, text: &str) -> String {
        let mut shown = String::new();
        self.held.push_str(text);
        loop {
            match self.state {
                ThinkState::Passing => {
                    shown.push_str(&self.held);
                    self.held.clear();
                    return shown;
                }
                ThinkState::Start => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() {
                        return shown;
                    }
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = ThinkState::Thinking;
                    } else if OPEN.starts_with(trimmed) {
                        return shown;
                    } else {
                        self.state = ThinkState::Passing;
                    }
                }
                ThinkState::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.state = ThinkState::AfterBlock;
                    }
                    None => {
                        // Keep only what could be the start of the closing tag.
                        let keep = CLOSE.len() - 1;
                        if self.held.len() > keep {
                            let mut cut = self.held.len() - keep;
                            while !self.held.is_char_boundary(cut) {
                                cut += 1;
                            }
                            self.held.drain(..cut);
                        }
                        return shown;
                    }
                },
                ThinkState::AfterBlock => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() {
                        self.held.clear();
                        return shown;
                    }
                    self.held = trimmed.to_string();
                    self.state = ThinkState::Passing;
                }
            }
        }
    }

    /// The end of the stream: text held back that was not a tag after all.
    pub(crate) fn finish(&mut self) -> String {
        let rest = match self.state {
            ThinkState::Start => self.held.trim_start().to_string(),
            _ => String::new(),
        };
        self.held.clear();
        rest
    }
}

/// The content without a leading reasoning block.
pub(crate) fn strip_think(text: &str) -> String {
    let mut filter = ThinkFilter::default();
    let mut shown = filter.push(text);
    shown.push_str(&filter.finish());
    shown
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
        with_retries(self.retry, || async {
            self.stream_once(request, &sink).await.map_err(|mut error| {
                if emitted.load(std::sync::atomic::Ordering::Relaxed) {
                    error.final_attempt = true;
                }
                error
            })
        })
        .await
    }

    async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        with_retries(self.retry, || self.complete_once(request)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filtered(chunks: &[&str]) -> String {
        let mut filter = ThinkFilter::default();
        let mut out: String = chunks.iter().map(|chunk| filter.push(chunk)).collect();
        out.push_str(&filter.finish());
        out
    }

    #[test]
    fn a_think_block_is_cut_however_it_is_chunked() {
        let text = "<think>The user wants a greeting. Hmm.</think>\n\nHello there!";
        assert_eq!(filtered(&[text]), "Hello there!");
        // Every split into two chunks, and one character at a time.
        for at in 1..text.len() {
            assert_eq!(
                filtered(&[&text[..at], &text[at..]]),
                "Hello there!",
                "{at}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(filtered(&chars), "Hello there!");
    }

    #[test]
    fn text_without_a_leading_block_passes_untouched() {
        assert_eq!(filtered(&["Hello ", "world"]), "Hello world");
        assert_eq!(filtered(&["<thin", "g> is a tag"]), "<thing> is a tag");
        assert_eq!(filtered(&["<", "b>bold</b>"]), "<b>bold</b>");
        assert_eq!(filtered(&["<"]), "<");
        assert_eq!(
            filtered(&["Use <think>tags</think> like this"]),
            "Use <think>tags</think> like this"
        );
        assert_eq!(filtered(&["  <think>never closed, all reasoning"]), "");
        assert_eq!(
            filtered(&["<think>好的，用户问候。</think>你好！"]),
            "你好！"
        );
    }

    #[test]
    fn the_base_urls_query_follows_the_path() {
        let endpoint = Endpoint {
            base_url: "https://x.openai.azure.com/openai/v1/?api-version=preview".into(),
            api_key: Some("k".into()),
            timeout: Duration::from_secs(1),
            retry: RetryPolicy::never(),
            prices: HashMap::new(),
        };
        assert_eq!(
            endpoint.url("chat/completions"),
            "https://x.openai.azure.com/openai/v1/chat/completions?api-version=preview"
        );
        assert!(endpoint.headers().contains_key("api-key"));
        let plain = Endpoint {
            base_url: "http://127.0.0.1:8080/v1/".into(),
            ..endpoint
        };
        assert_eq!(
            plain.url("chat/completions"),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert!(!plain.headers().contains_key("api-key"));
    }

    #[test]
    fn errors_are_classified_by_what_they_say() {
        assert!(is_context_length(
            "This model's maximum context length is 4096 tokens."
        ));
        assert!(is_context_length(
            "the request exceeds the available context size, try increasing it"
        ));
        assert!(!is_context_length("invalid model name"));
        let (kind, _) =
            stream_error(&json!({"error": {"message": "overloaded", "code": 503}})).unwrap();
        assert_eq!(kind, LlmErrorKind::Unavailable);
        let (kind, _) =
            stream_error(&json!({"error": {"message": "slow", "type": "rate_limit_error"}}))
                .unwrap();
        assert_eq!(kind, LlmErrorKind::RateLimited);
        assert!(stream_error(&json!({"choices": []})).is_none());
        assert!(stream_error(&json!({"error": null})).is_none());
        assert_eq!(
            error_detail(r#"{"error":{"message":"bad key sk-1"}}"#),
            "bad key sk-1"
        );
        assert_eq!(error_detail("<html>502</html>"), "<html>502</html>");
    }
}
