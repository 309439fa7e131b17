//! What real model servers send, replayed: `tests/fixtures/llm-quirks.json` holds, for each
//! provider quirk, the bytes a server sends (split between frames, or inside UTF-8 characters)
//! and what mnemo's client must make of them. Each case goes through the production
//! `OpenAiChat` against the fake server; a chat turn then shows that a reasoning block is
//! neither shown nor stored.

use crate::support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mnemo::llm::chat::{ChatMessage, ChatModel, ChatRequest, LlmErrorKind};
use mnemo::llm::openai::{Endpoint, OpenAiChat};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, TestApp};

const KEY: &str = "sk-quirk-secret-1234";

fn corpus() -> Vec<Value> {
    let text = include_str!("../fixtures/llm-quirks.json");
    serde_json::from_str(text).expect("the quirks corpus is JSON")
}

/// The case's body as the server wrote it, in the chunks it wrote.
fn replay(case: &Value) -> Reply {
    let mut body = String::new();
    if let Some(events) = case["events"].as_array() {
        for event in events {
            match event {
                Value::String(text) => body.push_str(&format!("data: {text}\n\n")),
                Value::Object(object) if object.contains_key("raw") => {
                    body.push_str(event["raw"].as_str().unwrap_or_default());
                }
                other => body.push_str(&format!("data: {other}\n\n")),
            }
        }
    }
    match &case["body"] {
        Value::String(text) => body.push_str(text),
        Value::Null => {}
        other => body.push_str(&other.to_string()),
    }
    let bytes = body.into_bytes();
    let chunks: Vec<Vec<u8>> = if case["split"] == "bytes" {
        bytes.iter().map(|byte| vec![*byte]).collect()
    } else {
        bytes
            .split_inclusive(|byte| *byte == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    };
    let headers = case["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.clone(), value.as_str().unwrap_or_default().to_string()))
        .collect();
    Reply::Raw {
        status: case["status"].as_u64().unwrap_or(200) as u16,
        headers,
        chunks,
    }
}

fn client(base_url: &str) -> OpenAiChat {
    OpenAiChat::new(
        &Endpoint {
            base_url: base_url.to_string(),
            api_key: Some(KEY.into()),
            timeout: Duration::from_secs(10),
            retry: mnemo::retry::RetryPolicy::new(2, Duration::from_millis(20)),
            prices: Default::default(),
        },
        "m",
    )
}

fn kind_name(kind: LlmErrorKind) -> &'static str {
    match kind {
        LlmErrorKind::RateLimited => "rate_limited",
        LlmErrorKind::Unavailable => "unavailable",
        LlmErrorKind::Timeout => "timeout",
        LlmErrorKind::Auth => "auth",
        LlmErrorKind::BadRequest => "bad_request",
        LlmErrorKind::BadResponse => "bad_response",
        LlmErrorKind::ContextLength => "context_length",
    }
}

#[tokio::test]
async fn every_quirk_in_the_corpus_is_handled() {
    let cases = corpus();
    assert!(cases.len() >= 15, "the corpus has its cases");
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        assert!(
            case["provider"].as_str().is_some_and(|p| !p.is_empty()),
            "{name} names its provider"
        );
        let expect = &case["expect"];
        let llm = FakeLlm::start().await;
        llm.push(replay(case));
        if let Some(then) = case["then"].as_str() {
            llm.push(Reply::text(then));
        }
        let model = client(&llm.base_url);
        let request = ChatRequest::new(vec![ChatMessage::user("hi")]);
        let deltas = Mutex::new(String::new());
        let sink = |text: &str| deltas.lock().unwrap().push_str(text);
        let started = Instant::now();
        let result = model.stream(&request, &sink).await;
        let waited = started.elapsed();
        let deltas = deltas.into_inner().unwrap();
        assert_eq!(
            llm.requests().len() as u64,
            expect["requests"].as_u64().unwrap_or(1),
            "{name}: requests made"
        );
        if let Some(kind) = expect["error"].as_str() {
            let error = result.expect_err(name);
            assert_eq!(kind_name(error.kind), kind, "{name}: {}", error.message);
            assert!(!error.message.contains(KEY), "{name}: the key is quoted");
            if let Some(said) = expect["message"].as_str() {
                assert!(error.message.contains(said), "{name}: {}", error.message);
            }
            assert_eq!(
                deltas,
                expect["deltas"].as_str().unwrap_or_default(),
                "{name}: shown before the error"
            );
            continue;
        }
        let answer = result.unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(
            answer.content,
            expect["content"].as_str().unwrap_or_default(),
            "{name}: content"
        );
        assert_eq!(
            deltas, answer.content,
            "{name}: what was streamed is the answer"
        );
        if let Some(reason) = expect.get("finish_reason") {
            assert_eq!(
                answer.finish_reason.as_deref(),
                reason.as_str(),
                "{name}: finish reason"
            );
        }
        if let Some(total) = expect["usage_total"].as_u64() {
            assert_eq!(answer.usage.total_tokens, total, "{name}: usage");
        }
        let calls: Vec<Value> = answer
            .tool_calls
            .iter()
            .map(|call| {
                let arguments: Value = serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|error| panic!("{name}: arguments {error}"));
                json!([call.id, call.name, arguments])
            })
            .collect();
        let wanted = expect["tool_calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(calls, wanted, "{name}: tool calls");
        if let Some(ms) = expect["waited_ms"].as_u64() {
            assert!(
                waited >= Duration::from_millis(ms),
                "{name}: Retry-After was honoured ({waited:?})"
            );
        }
    }
}

/// The same replies through `complete` (no streaming): the body's error object, a think block
/// and arguments sent as an object are read as what they are.
#[tokio::test]
async fn whole_answers_have_the_same_quirks() {
    let llm = FakeLlm::start().await;
    let raw = |body: Value| Reply::Raw {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        chunks: vec![body.to_string().into_bytes()],
    };
    llm.push(raw(json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "<think>\nplan the answer\n</think>\n\n{\"facts\": []}"}}]})));
    llm.push(raw(
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "recall_memory", "arguments": {"query": "cats"}}}]}}]}),
    ));
    llm.push(raw(
        json!({"error": {"message": "model is loading", "code": 503}}),
    ));
    llm.push(Reply::text("loaded"));
    let model = client(&llm.base_url);
    let request = ChatRequest::new(vec![ChatMessage::user("hi")]);
    let first = model.complete(&request).await.unwrap();
    assert_eq!(first.content, "{\"facts\": []}");
    let second = model.complete(&request).await.unwrap();
    assert_eq!(second.tool_calls[0].name, "recall_memory");
    assert_eq!(second.tool_calls[0].arguments, r#"{"query":"cats"}"#);
    let third = model.complete(&request).await.unwrap();
    assert_eq!(
        third.content, "loaded",
        "the error in a 200 body was retried"
    );
    assert_eq!(llm.requests().len(), 4);
}

/// Azure OpenAI: the base URL's `api-version` goes on every request and the key in `api-key`
/// as well as the bearer token.
#[tokio::test]
async fn an_azure_base_url_keeps_its_api_version() {
    let llm = FakeLlm::start().await;
    llm.push(Reply::text("hi from azure"));
    let model = client(&format!("{}?api-version=2024-10-21", llm.base_url));
    let answer = model
        .complete(&ChatRequest::new(vec![ChatMessage::user("hi")]))
        .await
        .unwrap();
    assert_eq!(answer.content, "hi from azure");
    let (query, headers) = llm.request_meta().remove(0);
    assert_eq!(query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(headers["api-key"], KEY);
    assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
}

/// Through a whole chat turn: the reasoning block streamed by a model served raw is neither
/// shown (no delta carries it), nor stored in the thread, nor remembered.
#[tokio::test]
async fn a_reasoning_block_is_never_the_answer_nor_a_memory() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    // Every call (the chat turn and the writer's extraction) thinks aloud first.
    llm.set_handler(|request| {
        let json = request["response_format"].is_object();
        let answer = if json {
            r#"{"memories": []}"#
        } else {
            "Nice, Graz is lovely!"
        };
        Some(Reply::slow_text(
            &format!("<think>The user lives in Graz. I should answer warmly.</think>\n\n{answer}"),
            3,
            0,
        ))
    });
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let (thread, events) = app
        .say_in_new_thread(&key, "I live in Graz, by the way.")
        .await;
    let streamed: String = events
        .iter()
        .filter(|event| event.event == "message_delta")
        .map(|event| event.data["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(streamed, "Nice, Graz is lovely!");
    assert!(
        events
            .iter()
            .all(|event| !event.data.to_string().contains("answer warmly")),
        "no event carries the reasoning"
    );
    let (_, body) = app.get(&format!("/v1/threads/{thread}"), Some(&key)).await;
    assert_eq!(body["messages"][1]["content"], "Nice, Graz is lovely!");
    app.wait_for_jobs().await;
    let (status, memories) = app.get("/v1/memories?limit=500", Some(&key)).await;
    assert_eq!(status, StatusCode::OK);
    let text = memories.to_string();
    assert!(text.contains("Graz"), "the turn was remembered: {text}");
    assert!(!text.contains("answer warmly"), "{text}");
    app.stop().await;
}

/// A server that does not know `json_schema` (DeepSeek answers 400, vLLM-style validation 422,
/// llama-cpp-python 0.3 a 500 naming `response_format`) is asked with `json_object` instead, and
/// that is remembered: the next structured request goes straight to what works.
#[tokio::test]
async fn a_refused_response_format_is_asked_more_simply_and_remembered() {
    let refusals: [(u16, &str); 3] = [
        (
            400,
            r#"{"error":{"message":"This response_format type is unavailable now","type":"invalid_request_error","code":"invalid_request_error"}}"#,
        ),
        (
            422,
            r#"{"detail":[{"type":"literal_error","loc":["body","response_format","type"],"msg":"Input should be 'text' or 'json_object'"}]}"#,
        ),
        (
            500,
            r#"{"error":{"message":"1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\"}","type":"internal_server_error","param":null,"code":null}}"#,
        ),
    ];
    for (status, body) in refusals {
        let llm = FakeLlm::start().await;
        llm.set_handler(move |request| {
            Some(match request["response_format"]["type"].as_str() {
                Some("json_schema") => Reply::Raw {
                    status,
                    headers: vec![("content-type".into(), "application/json".into())],
                    chunks: vec![body.as_bytes().to_vec()],
                },
                _ => Reply::text(r#"{"memories": []}"#),
            })
        });
        let model = client(&llm.base_url);
        for _ in 0..2 {
            let request = ChatRequest::new(vec![ChatMessage::user("extract")])
                .with_schema(mnemo::llm::schemas::memories());
            let (value, _) = mnemo::llm::chat::complete_json(&model, request, 0, Ok)
                .await
                .unwrap_or_else(|error| panic!("{status}: {error}"));
            assert_eq!(value, json!({"memories": []}));
        }
        let formats: Vec<String> = llm
            .requests()
            .iter()
            .map(|request| {
                request["response_format"]["type"]
                    .as_str()
                    .unwrap_or("none")
                    .to_string()
            })
            .collect();
        assert_eq!(
            formats,
            ["json_schema", "json_object", "json_object"],
            "{status}"
        );
    }
}
