//! A fake OpenAI-compatible server for tests: real HTTP on 127.0.0.1:0, `POST
//! /v1/chat/completions` answering from a script (streamed SSE chunks or JSON, text or tool
//! calls, usage, HTTP errors, delays, or never answering), and a record of every request body
//! so tests can inspect prompts. When the script is empty it answers with `default_reply`.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Text, streamed in chunks of `chunk_chars` with `delay` between chunks.
    Text {
        content: String,
        chunk_chars: usize,
        delay: Duration,
    },
    /// Tool calls (name, JSON arguments); several make a parallel call.
    ToolCalls(Vec<(String, Value)>),
    /// An HTTP error with an OpenAI-style error body.
    Error { status: u16, message: String },
    /// Accept the request and never answer (until the client goes away).
    Hang,
    /// Wait until the flag is set, then answer with the reply.
    After(Arc<std::sync::atomic::AtomicBool>, Box<Reply>),
    /// Exactly these bytes, each chunk written on its own (a real server's stream replayed,
    /// split where it was split: between frames, or inside a UTF-8 character).
    Raw {
        status: u16,
        headers: Vec<(String, String)>,
        chunks: Vec<Vec<u8>>,
    },
}

impl Reply {
    pub fn text(content: &str) -> Self {
        Reply::Text {
            content: content.to_string(),
            chunk_chars: 4,
            delay: Duration::ZERO,
        }
    }

    pub fn slow_text(content: &str, chunk_chars: usize, delay_ms: u64) -> Self {
        Reply::Text {
            content: content.to_string(),
            chunk_chars,
            delay: Duration::from_millis(delay_ms),
        }
    }

    pub fn tool(name: &str, arguments: Value) -> Self {
        Reply::ToolCalls(vec![(name.to_string(), arguments)])
    }
}

/// Chooses the reply to a request (by its prompt, say); `None` falls back to the script.
pub type Handler = Arc<dyn Fn(&Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    /// The query string and headers of every request, in order.
    request_meta: Vec<(Option<String>, axum::http::HeaderMap)>,
    default_reply: Option<Reply>,
    handler: Option<Handler>,
    /// Waited before every answer.
    latency: Duration,
    /// When a hanging request's connection was dropped by the client.
    hang_dropped: Option<Instant>,
    /// How many hanging requests the client has dropped.
    hangs_dropped: usize,
}

#[derive(Clone)]
pub struct FakeLlm {
    pub base_url: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeLlm {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route(
                "/v1/models",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({
                        "object": "list",
                        "data": [{ "id": "fake-model", "object": "model", "owned_by": "tests" }],
                    }))
                }),
            )
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake llm");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            inner,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn push(&self, reply: Reply) {
        self.lock().script.push_back(reply);
    }

    /// The answer used once the script is empty.
    pub fn set_default(&self, reply: Reply) {
        self.lock().default_reply = Some(reply);
    }

    /// Answers requests by `handler` first; requests it declines go to the script.
    pub fn set_handler(&self, handler: impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static) {
        self.lock().handler = Some(Arc::new(handler));
    }

    /// A fixed delay before every answer (a model's latency).
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    pub fn hangs_dropped(&self) -> usize {
        self.lock().hangs_dropped
    }

    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// The query string and headers of every request, in order.
    pub fn request_meta(&self) -> Vec<(Option<String>, axum::http::HeaderMap)> {
        self.lock().request_meta.clone()
    }

    pub fn hang_dropped_at(&self) -> Option<Instant> {
        self.lock().hang_dropped
    }

    /// Environment for a `TestApp` using this server as its LLM.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("MNEMO__LLM__BASE_URL".into(), self.base_url.clone()),
            (
                "MNEMO__LLM__API_KEY".into(),
                "sk-test-secret-key-1234".into(),
            ),
            ("MNEMO__LLM__MODEL".into(), "fake-model".into()),
            ("MNEMO__LLM__RETRY_BACKOFF_MS".into(), "20".into()),
        ]
    }
}

/// The text of the last user message of a recorded request (a chat turn's own message comes
/// last; recalled memories of other turns come first); empty without one.
pub fn last_user_text(request: &Value) -> &str {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|message| message["role"] == "user")
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default()
}

/// Flattens every message content of a recorded request into one string.
pub fn prompt_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|message| message["content"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn usage() -> Value {
    json!({ "prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120 })
}

struct DropFlag(Arc<Mutex<Inner>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hang_dropped = Some(Instant::now());
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hangs_dropped += 1;
    }
}

async fn chat(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let request = body.0;
    let stream = request["stream"].as_bool().unwrap_or(false);
    let (handler, latency) = {
        let mut state = inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.requests.push(request.clone());
        state
            .request_meta
            .push((uri.query().map(str::to_string), headers));
        (state.handler.clone(), state.latency)
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let handled = handler.and_then(|handler| handler(&request));
    let reply = match handled {
        Some(reply) => reply,
        None => {
            let mut state = inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state
                .script
                .pop_front()
                .or_else(|| state.default_reply.clone())
                .unwrap_or_else(|| Reply::text("ok"))
        }
    };
    let model = request["model"].as_str().unwrap_or("fake").to_string();
    let mut reply = reply;
    while let Reply::After(gate, then) = reply {
        while !gate.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        reply = *then;
    }
    match reply {
        Reply::Error { status, message } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(json!({ "error": { "message": message, "type": "error", "param": null, "code": null } })),
        )
            .into_response(),
        Reply::Hang => {
            let flag = DropFlag(inner.clone());
            let body = futures::stream::once(async move {
                let _flag = flag;
                std::future::pending::<()>().await;
                Ok::<_, std::io::Error>(String::new())
            });
            sse_response(Body::from_stream(body))
        }
        Reply::After(..) => unreachable!("waited for above"),
        Reply::Raw {
            status,
            headers,
            chunks,
        } => {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
            for (name, value) in headers {
                response = response.header(name, value);
            }
            // A pause between chunks so that each reaches the client on its own.
            let body = futures::stream::iter(chunks).then(|chunk| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, std::io::Error>(chunk)
            });
            response
                .body(Body::from_stream(body))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Reply::Text {
            content,
            chunk_chars,
            delay,
        } => {
            if !stream {
                return axum::Json(json!({
                    "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                    "choices": [{ "index": 0, "finish_reason": "stop",
                                  "message": { "role": "assistant", "content": content } }],
                    "usage": usage(),
                }))
                .into_response();
            }
            let chars: Vec<char> = content.chars().collect();
            let mut frames: Vec<String> = chars
                .chunks(chunk_chars.max(1))
                .map(|chunk| {
                    let text: String = chunk.iter().collect();
                    chunk_frame(&model, json!({ "content": text }), None)
                })
                .collect();
            frames.push(chunk_frame(&model, json!({}), Some("stop")));
            frames.push(usage_frame(&model));
            frames.push("data: [DONE]\n\n".into());
            let body = futures::stream::iter(frames.into_iter().enumerate()).then(move |(i, frame)| async move {
                if i > 0 && !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok::<_, std::io::Error>(frame)
            });
            sse_response(Body::from_stream(body))
        }
        Reply::ToolCalls(calls) => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(index, (name, arguments))| {
                    json!({ "index": index, "id": format!("call_{index}_{name}"), "type": "function",
                            "function": { "name": name, "arguments": arguments.to_string() } })
                })
                .collect();
            if !stream {
                return axum::Json(json!({
                    "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                    "choices": [{ "index": 0, "finish_reason": "tool_calls",
                                  "message": { "role": "assistant", "content": null, "tool_calls": tool_calls } }],
                    "usage": usage(),
                }))
                .into_response();
            }
            // Split each call's arguments across two chunks, as real servers do.
            let mut frames = Vec::new();
            for call in &tool_calls {
                let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
                let middle = arguments.len() / 2;
                let middle = (0..=middle).rev().find(|i| arguments.is_char_boundary(*i)).unwrap_or(0);
                let mut first = call.clone();
                first["function"]["arguments"] = json!(&arguments[..middle]);
                frames.push(chunk_frame(&model, json!({ "tool_calls": [first] }), None));
                let rest = json!({ "index": call["index"], "function": { "arguments": &arguments[middle..] } });
                frames.push(chunk_frame(&model, json!({ "tool_calls": [rest] }), None));
            }
            frames.push(chunk_frame(&model, json!({}), Some("tool_calls")));
            frames.push(usage_frame(&model));
            frames.push("data: [DONE]\n\n".into());
            sse_response(Body::from_stream(futures::stream::iter(
                frames.into_iter().map(Ok::<_, std::io::Error>),
            )))
        }
    }
}

fn chunk_frame(model: &str, delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    });
    format!("data: {chunk}\n\n")
}

fn usage_frame(model: &str) -> String {
    let chunk = json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
        "choices": [], "usage": usage(),
    });
    format!("data: {chunk}\n\n")
}

fn sse_response(body: Body) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
