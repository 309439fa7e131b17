//! The OpenAI-compatible surface: `POST /v1/chat/completions` (JSON, or server-sent chunks
//! ending with `data: [DONE]`) and `GET /v1/models[/{id}]` in OpenAI's list shape.
//!
//! A completion is a mnemo chat turn for the authenticated user: recall, the model with
//! mnemo's tools (run here) and the client's tools (handed back), the reply stored and
//! remembered afterwards. The client's `messages` are the working memory. The conversation
//! maps to a thread named by `X-Mnemo-Thread`, or else to the thread keyed by a digest of its
//! first system and first user message, so every follow-up of one conversation lands in one
//! thread; the thread is named in the `X-Mnemo-Thread` response header.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody, ErrorKind};
use super::extract::{ApiJson, ApiPath};
use crate::agent::chat::{ClientConversation, SERVER_TOOLS};
use crate::auth::AuthUser;
use crate::config::ModelRole;
use crate::llm::chat::{ChatMessage, ChatRole, ToolCall, ToolSpec};
use crate::store::{EventType, Run, StoredEvent, Thread, ThreadId, UserId};

/// The model name that always means the chat role's model.
pub(crate) const MNEMO_MODEL: &str = "mnemo";
/// Names the thread a conversation belongs to, in requests and responses.
const THREAD_HEADER: &str = "x-mnemo-thread";
/// Longest thread title derived from a conversation's first message.
const TITLE_CHARS: usize = 80;

/// An OpenAI chat-completions request. Other OpenAI parameters (`temperature`, `max_tokens`,
/// `user`, …) are accepted and ignored.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct CompletionRequest {
    /// `mnemo` (the chat role's model) or the name of a configured model (`GET /v1/models`).
    pub model: String,
    /// The conversation so far: `system`/`developer`, `user`, `assistant` (with `tool_calls`)
    /// and `tool` messages, as the OpenAI API takes them. Text content only.
    #[schema(value_type = Vec<Object>, min_items = 1)]
    pub messages: Vec<Value>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Value>,
    /// The client's own function tools: offered to the model beside mnemo's, their calls
    /// returned unchanged (`finish_reason: tool_calls`).
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub owned_by: &'static str,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

fn model_object(id: String, created: i64) -> ModelObject {
    ModelObject {
        id,
        object: "model",
        created,
        owned_by: "mnemo",
    }
}

fn model_objects(state: &AppState) -> Vec<ModelObject> {
    // Models are as old as the server's configuration: its start.
    let created = chrono::Utc::now().timestamp() - state.started_at.elapsed().as_secs() as i64;
    std::iter::once(MNEMO_MODEL.to_string())
        .chain(state.models.names())
        .map(|id| model_object(id, created))
        .collect()
}

#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, body = ModelList, description = "`mnemo` (always the chat role's model) and every configured model, in OpenAI's list shape")),
    security(("bearer" = [])))]
pub(crate) async fn list_models(State(state): State<AppState>, _user: AuthUser) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: model_objects(&state),
    })
}

#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    params(("id" = String, Path)),
    responses((status = 200, body = ModelObject), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get_model(
    State(state): State<AppState>,
    _user: AuthUser,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<ModelObject>> {
    model_objects(&state)
        .into_iter()
        .find(|model| model.id == id)
        .map(Json)
        .ok_or_else(|| unknown_model(&id))
}

fn unknown_model(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "the model {name:?} does not exist here; GET /v1/models lists them (\"mnemo\" is the chat model)"
    ))
}

#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    params(("X-Mnemo-Thread" = Option<String>, Header, format = Uuid,
        description = "The thread this conversation continues; without it, the thread is found \
        (or made) from the conversation's first system and first user message. The response \
        names the thread in the same header.")),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "A `chat.completion` object, or with `stream: true` server-sent `chat.completion.chunk` objects ending with `data: [DONE]`"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "Unknown model or thread")),
    security(("bearer" = [])))]
pub(crate) async fn completions(
    State(state): State<AppState>,
    user: AuthUser,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CompletionRequest>,
) -> ApiResult<Response> {
    let user_id = user.user_id;
    let conversation = conversation(&state, &body)?;
    let model_name = conversation
        .model
        .as_ref()
        .map(|model| model.model.model().to_string())
        .unwrap_or_else(|| MNEMO_MODEL.to_string());
    let thread = thread_of(&state, user_id, &headers, &conversation.messages).await?;
    let run = state
        .chat
        .send_conversation(user_id, thread.id, conversation)
        .await
        .map_err(ApiError::from_error)?;
    let include_usage = body
        .stream_options
        .as_ref()
        .and_then(|options| options.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let reply = Reply {
        id: format!("chatcmpl-{}", run.id),
        created: chrono::Utc::now().timestamp(),
        model: model_name,
    };
    let mut response = if body.stream {
        stream_reply(&state, user_id, &run, reply, include_usage)
    } else {
        whole_reply(&state, user_id, &run, reply).await?
    };
    if let Ok(value) = HeaderValue::from_str(&thread.id.to_string()) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(THREAD_HEADER), value);
    }
    Ok(response)
}

/// The request as a conversation mnemo can run: its messages, its tools and its model.
fn conversation(state: &AppState, body: &CompletionRequest) -> ApiResult<ClientConversation> {
    let model = match body.model.trim() {
        MNEMO_MODEL => state.models.role(ModelRole::Chat).cloned(),
        "" => return Err(ApiError::bad_request("model must not be empty")),
        name => Some(
            state
                .models
                .named(name)
                .ok_or_else(|| unknown_model(name))?,
        ),
    };
    if body.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let messages = body
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| client_message(index, message))
        .collect::<ApiResult<Vec<_>>>()?;
    if !messages
        .iter()
        .any(|message| message.role == ChatRole::User)
    {
        return Err(ApiError::bad_request("messages must hold a user message"));
    }
    let tools = body
        .tools
        .iter()
        .enumerate()
        .map(|(index, tool)| client_tool(index, tool))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(ClientConversation {
        messages,
        tools,
        model,
    })
}

fn client_message(index: usize, message: &Value) -> ApiResult<ChatMessage> {
    let at = |what: &str| ApiError::bad_request(format!("messages[{index}]: {what}"));
    let role = match message.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => ChatRole::System,
        Some("user") => ChatRole::User,
        Some("assistant") => ChatRole::Assistant,
        Some("tool") => ChatRole::Tool,
        Some(other) => return Err(at(&format!("unknown role {other:?}"))),
        None => return Err(at("role is missing")),
    };
    let content = text_content(message.get("content")).map_err(|what| at(&what))?;
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) if role == ChatRole::Assistant => calls
            .iter()
            .map(|call| {
                let function = &call["function"];
                match (
                    call["id"].as_str(),
                    function["name"].as_str(),
                    function["arguments"].as_str(),
                ) {
                    (Some(id), Some(name), arguments) => Ok(ToolCall {
                        id: id.to_string(),
                        name: name.to_string(),
                        arguments: arguments.unwrap_or("{}").to_string(),
                    }),
                    _ => Err(at("a tool call needs id and function.name")),
                }
            })
            .collect::<ApiResult<_>>()?,
        Some(_) => return Err(at("tool_calls must be a list on an assistant message")),
    };
    let tool_call_id = match role {
        ChatRole::Tool => Some(
            message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| at("a tool message needs tool_call_id"))?
                .to_string(),
        ),
        _ => None,
    };
    if role == ChatRole::User && content.trim().is_empty() {
        return Err(at("a user message needs text content"));
    }
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id,
    })
}

/// A message's text: a string, or the text parts of a list of parts.
fn text_content(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => text.push(
                        part.get("text")
                            .and_then(Value::as_str)
                            .ok_or("a text part needs text")?,
                    ),
                    Some(other) => {
                        return Err(format!("only text content is supported, not {other:?}"));
                    }
                    None => return Err("a content part needs a type".into()),
                }
            }
            Ok(text.join("\n"))
        }
        Some(_) => Err("content must be a string or a list of parts".into()),
    }
}

fn client_tool(index: usize, tool: &Value) -> ApiResult<ToolSpec> {
    let at = |what: &str| ApiError::bad_request(format!("tools[{index}]: {what}"));
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(at("only function tools are supported"));
    }
    let function = &tool["function"];
    let name = function["name"]
        .as_str()
        .filter(|name| !name.trim().is_empty())
        .ok_or_else(|| at("function.name is missing"))?;
    if SERVER_TOOLS.contains(&name) {
        return Err(at(&format!(
            "{name:?} is one of mnemo's own tools; name yours differently"
        )));
    }
    Ok(ToolSpec {
        name: name.to_string(),
        description: function["description"].as_str().unwrap_or("").to_string(),
        parameters: match &function["parameters"] {
            Value::Null => json!({ "type": "object", "properties": {} }),
            parameters => parameters.clone(),
        },
    })
}

/// The thread a request continues: the one its header names (the user's own, else 404), or
/// the one keyed by the conversation's opening.
async fn thread_of(
    state: &AppState,
    user: UserId,
    headers: &HeaderMap,
    messages: &[ChatMessage],
) -> ApiResult<Thread> {
    if let Some(value) = headers.get(THREAD_HEADER) {
        let id = value
            .to_str()
            .ok()
            .and_then(|text| uuid::Uuid::parse_str(text.trim()).ok())
            .ok_or_else(|| ApiError::bad_request("X-Mnemo-Thread must be a thread id (a UUID)"))?;
        return Ok(state
            .store
            .user(user)
            .get_thread(ThreadId::from_uuid(id))
            .await?);
    }
    let first = |role: ChatRole| {
        messages
            .iter()
            .find(|message| message.role == role)
            .map_or("", |message| message.content.as_str())
    };
    let opening = first(ChatRole::User);
    let key = conversation_key(first(ChatRole::System), opening);
    let mut title: String = opening.split_whitespace().collect::<Vec<_>>().join(" ");
    if title.chars().count() > TITLE_CHARS {
        title = crate::text::truncate(&title, TITLE_CHARS - 1);
    }
    Ok(state
        .store
        .user(user)
        .conversation_thread(&key, &title)
        .await?)
}

/// The digest naming a conversation: its first system message and its first user message.
fn conversation_key(system: &str, first_user: &str) -> String {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    digest.update(b"openai-conversation\0");
    digest.update(system.as_bytes());
    digest.update(b"\0");
    digest.update(first_user.as_bytes());
    hex::encode(digest.finalize())
}

/// What every chunk and the whole completion carry.
struct Reply {
    id: String,
    created: i64,
    model: String,
}

impl Reply {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
        })
    }
}

/// A run event as OpenAI output.
enum Piece {
    Text(String),
    ClientCall(Value),
    Usage(Value),
    /// The run's reply could not be made.
    Failed(String),
    End,
    Other,
}

fn piece(event: &StoredEvent) -> Piece {
    let data = &event.data;
    match event.event_type {
        EventType::MessageDelta => Piece::Text(data["content"].as_str().unwrap_or("").into()),
        EventType::ToolCall if data["metadata"]["client"] == json!(true) => {
            Piece::ClientCall(json!({
                "id": data["id"],
                "type": "function",
                "function": { "name": data["name"], "arguments": data["arguments"] },
            }))
        }
        EventType::Usage => match data.get("total") {
            Some(total) if total.is_object() => Piece::Usage(json!({
                "prompt_tokens": total["prompt_tokens"],
                "completion_tokens": total["completion_tokens"],
                "total_tokens": total["total_tokens"],
            })),
            _ => Piece::Other,
        },
        // A turn that cannot reach its model says so and still answers from memory; only
        // an error that ends the run fails the completion (its `done` is not `completed`).
        EventType::Error => Piece::Failed(data["message"].as_str().unwrap_or("").into()),
        EventType::Done if data["status"] != json!("completed") => {
            Piece::Failed(format!("the turn ended {}", data["status"]))
        }
        EventType::Done => Piece::End,
        _ => Piece::Other,
    }
}

fn no_usage() -> Value {
    json!({ "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0 })
}

/// Follows the run to its end and answers with one `chat.completion`.
async fn whole_reply(
    state: &AppState,
    user: UserId,
    run: &Run,
    reply: Reply,
) -> ApiResult<Response> {
    let mut events = Box::pin(
        state
            .runs
            .follow(user, run.id, 0, state.streams_stop.clone()),
    );
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut usage = no_usage();
    let mut failure: Option<String> = None;
    while let Some(event) = events.next().await {
        match piece(&event) {
            Piece::Text(text) => content.push_str(&text),
            Piece::ClientCall(call) => calls.push(call),
            Piece::Usage(total) => usage = total,
            Piece::Failed(message) => {
                failure.get_or_insert(message);
                if event.event_type == EventType::Done {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        failure.unwrap_or_default(),
                    ));
                }
            }
            Piece::End => break,
            Piece::Other => {}
        }
    }
    let finish_reason = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Ok(Json(json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
        "usage": usage,
    }))
    .into_response())
}

/// Streams the run as `chat.completion.chunk` events ending with `[DONE]`.
fn stream_reply(
    state: &AppState,
    user: UserId,
    run: &Run,
    reply: Reply,
    include_usage: bool,
) -> Response {
    let events = state
        .runs
        .follow(user, run.id, 0, state.streams_stop.clone());
    let guard = super::sse::OpenStream::new();
    let first = reply.chunk(json!({ "role": "assistant", "content": "" }), None);
    let mut calls = 0usize;
    let mut usage = no_usage();
    let mut ended = false;
    let mut last_error: Option<String> = None;
    let chunks = events
        .flat_map(move |event| {
            let mut out: Vec<Value> = Vec::new();
            match piece(&event) {
                Piece::Text(text) if !text.is_empty() => {
                    out.push(reply.chunk(json!({ "content": text }), None));
                }
                Piece::ClientCall(mut call) => {
                    call["index"] = json!(calls);
                    calls += 1;
                    out.push(reply.chunk(json!({ "tool_calls": [call] }), None));
                }
                Piece::Usage(total) => usage = total,
                Piece::Failed(message) if event.event_type != EventType::Done => {
                    last_error = Some(message);
                }
                Piece::Failed(message) if !ended => {
                    ended = true;
                    out.push(json!({ "error": {
                        "message": last_error.take().unwrap_or(message),
                        "type": "server_error",
                        "param": null,
                        "code": "unavailable",
                    }}));
                }
                Piece::End if !ended => {
                    ended = true;
                    let finish = if calls == 0 { "stop" } else { "tool_calls" };
                    out.push(reply.chunk(json!({}), Some(finish)));
                    if include_usage {
                        out.push(json!({
                            "id": reply.id,
                            "object": "chat.completion.chunk",
                            "created": reply.created,
                            "model": reply.model,
                            "choices": [],
                            "usage": usage,
                        }));
                    }
                }
                _ => {}
            }
            futures::stream::iter(out)
        })
        .map(move |chunk| {
            let _alive = &guard;
            Event::default().data(chunk.to_string())
        });
    let events = futures::stream::once(async move { Event::default().data(first.to_string()) })
        .chain(chunks)
        .chain(futures::stream::once(async {
            Event::default().data("[DONE]")
        }))
        .map(Ok::<_, Infallible>);
    super::sse::event_stream(state, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_parts_are_joined_and_images_refused() {
        let parts = json!([{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }]);
        assert_eq!(text_content(Some(&parts)).unwrap(), "a\nb");
        let image = json!([{ "type": "image_url", "image_url": { "url": "x" } }]);
        assert!(
            text_content(Some(&image))
                .unwrap_err()
                .contains("image_url")
        );
        assert_eq!(text_content(Some(&Value::Null)).unwrap(), "");
    }

    #[test]
    fn one_conversation_one_key_whatever_follows() {
        let key = conversation_key("be brief", "hello there");
        assert_eq!(key, conversation_key("be brief", "hello there"));
        assert_ne!(key, conversation_key("", "hello there"));
        assert_ne!(key, conversation_key("be brief", "hello"));
        // The separator keeps the two parts apart.
        assert_ne!(conversation_key("ab", "c"), conversation_key("a", "bc"));
    }

    #[test]
    fn client_tools_may_not_take_mnemos_names() {
        let tool = json!({ "type": "function", "function": { "name": "recall_memory" } });
        assert!(
            client_tool(0, &tool)
                .unwrap_err()
                .message
                .contains("mnemo's own")
        );
        let tool = json!({ "type": "function", "function": { "name": "get_weather" } });
        assert_eq!(client_tool(0, &tool).unwrap().name, "get_weather");
    }
}
