//! mnemo through the clients people already use: the official `openai` Python package against
//! `/v1/chat/completions` and `/v1/models`, and the official MCP Python SDK (`mcp`) against
//! `/mcp` over Streamable HTTP and through `mnemo mcp` over stdio. The SDKs run in a venv made
//! once per target directory from `tests/clients/requirements.txt` (pinned); the scripts in
//! `tests/clients/` print what the SDK saw as JSON, and these tests check it together with the
//! fake model's request log and the server's state.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, prompt_text};
use support::{Backend, Home, TestApp};

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

/// The venv's python with the pinned SDKs. pip needs PyPI; without it the test fails, saying
/// so.
fn python() -> PathBuf {
    support::python_venv("py-clients", &Path::new(CLIENTS).join("requirements.txt"))
        .unwrap_or_else(|error| panic!("{error}"))
}

/// Runs one client script with `env`; its stdout parsed as JSON.
pub(crate) async fn run_client(script: &str, env: &[(&str, &str)]) -> Value {
    let python = tokio::task::spawn_blocking(python).await.expect("venv");
    let mut command = tokio::process::Command::new(python);
    command.arg(Path::new(CLIENTS).join(script));
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(240), command.output())
        .await
        .expect("the client script finishes within 4 minutes")
        .expect("run the client script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stderr}\n{stdout}",
        output.status
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("{script} printed no JSON ({error}):\n{stdout}\n{stderr}"))
}

async fn remember(app: &TestApp, key: &str, content: &str) {
    let (status, body) = app
        .post(
            "/v1/memories",
            Some(key),
            Some(json!({ "content": content, "kind": "fact" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

const PEANUTS: &str = "You are allergic to peanuts, so skip the satay tonight.";
const SUNNY: &str = "It is sunny and 24 degrees in Lisbon.";

/// The fake model: a weather question with the client's tool gets a call of it, the tool's
/// result gets the weather, anything else the peanut answer.
fn script(llm: &FakeLlm) {
    llm.set_handler(|request| {
        let messages = request["messages"].as_array()?;
        let last = messages.last()?;
        if last["role"] == "tool" {
            return Some(Reply::slow_text(SUNNY, 12, 40));
        }
        let offers_weather = request["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "get_weather"));
        let asks_weather = last["content"]
            .as_str()
            .is_some_and(|text| text.contains("weather in Lisbon"));
        if offers_weather && asks_weather {
            return Some(Reply::tool("get_weather", json!({ "city": "Lisbon" })));
        }
        // In pieces, a little apart: mnemo's deltas (coalesced every 30 ms) become chunks.
        Some(Reply::slow_text(PEANUTS, 12, 40))
    });
}

/// The chat requests (mnemo's system prompt first) whose last user message is `content`.
fn upstream_prompts(llm: &FakeLlm, content: &str) -> Vec<String> {
    llm.requests()
        .iter()
        .filter(|request| {
            request["messages"]
                .as_array()
                .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
                .is_some_and(|message| message["content"] == content)
        })
        .map(prompt_text)
        .collect()
}

#[tokio::test]
async fn the_openai_sdk_chats_with_memory_streams_and_keeps_users_apart() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    script(&llm);
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    remember(&app, &alice, "I am allergic to peanuts").await;
    remember(&app, &bob, "I am allergic to shellfish").await;
    app.wait_indexed().await;

    let seen = run_client(
        "openai_client.py",
        &[("MNEMO_BASE", &app.base), ("MNEMO_KEY", &alice)],
    )
    .await;

    // A whole completion, answered by the model with the recalled memory in its prompt.
    let whole = &seen["whole"];
    assert_eq!(whole["content"], PEANUTS, "{seen}");
    assert_eq!(whole["finish_reason"], "stop");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "fake-model");
    assert_eq!(whole["usage"]["total_tokens"], 120, "{seen}");
    let prompts = upstream_prompts(&llm, "What am I allergic to?");
    assert!(!prompts.is_empty(), "the model was asked");
    assert!(
        prompts[0].contains("I am allergic to peanuts"),
        "the recalled memory is in the upstream prompt: {}",
        prompts[0]
    );
    assert!(
        !prompts[0].contains("shellfish"),
        "bob's memory never reaches alice's prompt"
    );

    // Streamed in several chunks, with usage last; the follow-up lands in the same thread.
    let stream = &seen["stream"];
    assert_eq!(stream["content"], PEANUTS, "{seen}");
    assert!(stream["chunks"].as_u64().unwrap() > 1, "{seen}");
    assert_eq!(stream["finish_reason"], "stop");
    assert_eq!(stream["usage"]["total_tokens"], 120, "{seen}");
    let thread = whole["thread"].as_str().expect("thread header");
    assert_eq!(stream["thread"], thread, "a follow-up continues the thread");
    let follow_up = upstream_prompts(&llm, "And what should I cook tonight?");
    assert!(
        follow_up[0].contains("What am I allergic to?") && follow_up[0].contains(PEANUTS),
        "the client's messages are the working memory: {}",
        follow_up[0]
    );
    let (status, stored) = app
        .get(&format!("/v1/threads/{thread}"), Some(&alice))
        .await;
    assert_eq!(status, StatusCode::OK);
    let contents: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        [
            "What am I allergic to?",
            PEANUTS,
            "And what should I cook tonight?",
            PEANUTS
        ]
    );

    // The client's tool call comes back unchanged, and its result continues the turn.
    let tool = &seen["tool"];
    assert_eq!(tool["finish_reason"], "tool_calls", "{seen}");
    assert_eq!(tool["name"], "get_weather");
    assert_eq!(tool["arguments"], json!({ "city": "Lisbon" }));
    assert_eq!(tool["answer"], SUNNY);

    // Models in OpenAI's list shape; refusals in OpenAI's error shape.
    assert_eq!(seen["models"], json!(["mnemo", "fake-model"]));
    let bad = &seen["bad_key"];
    assert_eq!(bad["status"], 401, "{seen}");
    assert_eq!(bad["class"], "AuthenticationError");
    assert_eq!(bad["body"]["type"], "authentication_error", "{seen}");
    assert_eq!(seen["unknown_model"]["status"], 404, "{seen}");
    assert_eq!(seen["unknown_model"]["class"], "NotFoundError");

    // The turn is remembered afterwards, as a thread turn is.
    let mut remembered = false;
    for _ in 0..120 {
        let (_, listed) = app.get("/v1/memories?kinds=turn", Some(&alice)).await;
        remembered = listed["memories"].as_array().is_some_and(|memories| {
            memories.iter().any(|m| {
                m["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("What am I allergic to?")
            })
        });
        if remembered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(remembered, "the completion's turn became a memory");

    // Bob, through the same SDK, never sees alice's memory.
    let seen = run_client(
        "openai_client.py",
        &[("MNEMO_BASE", &app.base), ("MNEMO_KEY", &bob)],
    )
    .await;
    assert_eq!(seen["whole"]["content"], PEANUTS);
    let prompts: Vec<String> = upstream_prompts(&llm, "What am I allergic to?");
    let bobs = prompts.last().expect("bob's request");
    assert!(bobs.contains("I am allergic to shellfish"), "{bobs}");
    assert!(!bobs.contains("I am allergic to peanuts"), "{bobs}");
    assert_ne!(
        seen["whole"]["thread"], thread,
        "bob's conversation is bob's thread"
    );
    app.stop().await;
}

#[tokio::test]
async fn completions_refuse_bad_requests_in_openais_error_shape() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    script(&llm);
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let alice = app.user_key("alice").await;
    let ask = json!({ "model": "mnemo", "messages": [{ "role": "user", "content": "hi" }] });

    let (status, body) = app
        .post("/v1/chat/completions", None, Some(ask.clone()))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
    assert!(body["error"]["message"].is_string());
    assert!(body["error"].get("param").is_some(), "{body}");

    for (request, expected) in [
        (
            json!({ "model": "mnemo", "messages": [] }),
            "messages must not be empty",
        ),
        (
            json!({ "model": "mnemo", "messages": [{ "role": "system", "content": "x" }] }),
            "user message",
        ),
        (
            json!({ "model": "mnemo", "messages": [{ "role": "user", "content": [
                { "type": "image_url", "image_url": { "url": "http://x" } }] }] }),
            "only text content",
        ),
        (
            json!({ "model": "mnemo", "messages": [{ "role": "user", "content": "hi" }],
                "tools": [{ "type": "function", "function": { "name": "remember" } }] }),
            "mnemo's own tools",
        ),
    ] {
        let (status, body) = app
            .post("/v1/chat/completions", Some(&alice), Some(request))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(expected),
            "{body}"
        );
    }
    // A thread header naming someone else's (or no) thread is 404.
    let bob = app.user_key("bob").await;
    let bobs = app.create_thread(&bob, "bob's").await;
    let response = app
        .client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&alice)
        .header("X-Mnemo-Thread", bobs["id"].as_str().unwrap())
        .json(&ask)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // The role view moved beside the OpenAI list.
    let (status, roles) = app.get("/v1/roles", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(roles["llm_configured"], true);
    app.stop().await;
}

const MIGRATION: &str = "The Quillfeather moth-whales of Vellacorn Bay migrate every November \
    to the basalt caves of Orrin Deep, where they feed on glowing krill until the spring thaw.";

#[tokio::test]
async fn the_mcp_sdk_remembers_recalls_and_researches_for_its_user_only() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let (status, document) = app
        .ingest_document(
            &alice,
            json!({ "content": format!("# Vellacorn notes\n\n{MIGRATION}"), "source": "notes/vellacorn.md" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.wait_indexed().await;

    let seen = run_client(
        "mcp_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", &alice),
            ("MNEMO_STEPS", "tools,remember,recall,research"),
        ],
    )
    .await;
    let tools = seen["tools"].as_object().expect("tools");
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "deep_research",
            "forget",
            "get_memory_history",
            "list_memories",
            "recall_memory",
            "remember",
            "search_documents"
        ]
    );
    for (name, tool) in tools {
        assert!(
            tool["description"].as_str().unwrap_or("").len() > 20,
            "{name} has a description a model can use"
        );
        assert_eq!(tool["schema"]["type"], "object", "{name}");
    }
    assert_eq!(
        tools["recall_memory"]["schema"]["required"],
        json!(["query"])
    );
    assert_eq!(seen["remember"]["error"], false, "{seen}");
    assert_remembered_recallable(&seen);
    let recalled = seen["recall"]["texts"][0].as_str().expect("recall text");
    assert!(
        recalled.contains("My favourite colour is teal"),
        "{recalled}"
    );

    let research = &seen["research"];
    assert_eq!(research["error"], false, "{seen}");
    let report = research["texts"][0].as_str().unwrap();
    assert!(
        report.contains("Orrin Deep"),
        "the report cites the document: {report}"
    );
    assert!(
        research["texts"][1]
            .as_str()
            .unwrap()
            .contains("Vellacorn notes"),
        "the sources come with the report: {research}"
    );
    let progress = research["progress"].as_array().unwrap();
    assert!(progress.len() >= 3, "progress per stage: {research}");
    // The follow-up, asked by the research's id, is linked to it in history.
    let follow = &seen["follow_up"];
    assert_eq!(follow["error"], false, "{seen}");
    let (_, history) = app.get("/research/history", Some(&alice)).await;
    assert!(
        history["research"]
            .as_array()
            .unwrap()
            .iter()
            .any(|item| item["follow_up_of"] == follow["of"]),
        "{history}"
    );
    let values: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert!(
        values.windows(2).all(|pair| pair[0] < pair[1]),
        "{values:?}"
    );

    // Bob's session sees nothing of alice's.
    let seen = run_client(
        "mcp_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", &bob),
            ("MNEMO_STEPS", "recall"),
        ],
    )
    .await;
    let recalled = seen["recall"]["texts"][0].as_str().expect("recall text");
    assert!(!recalled.contains("teal"), "{recalled}");

    // A bad key is refused by HTTP status before any MCP message.
    let seen = run_client(
        "mcp_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", "mnemo_not-a-key"),
            ("MNEMO_STEPS", "tools,refused"),
        ],
    )
    .await;
    assert!(seen["refused"].is_string(), "{seen}");
    assert!(seen.get("tools").is_none(), "{seen}");
    assert!(
        seen["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .all(|status| status == 401),
        "every request the SDK made was refused with 401: {seen}"
    );
    assert!(!seen["statuses"].as_array().unwrap().is_empty(), "{seen}");
    app.stop().await;
}

/// The MCP protocol version the raw-HTTP tests speak (a session-based one).
const MCP_VERSION: &str = "2025-06-18";

/// A raw JSON-RPC `POST /mcp`, with `key` as bearer and, once there is one, the session.
fn mcp_post(
    app: &TestApp,
    key: Option<&str>,
    session: Option<&str>,
    body: &Value,
) -> reqwest::RequestBuilder {
    let mut request = app
        .client
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", MCP_VERSION);
    }
    request
}

fn mcp_initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": MCP_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "test", "version": "1" },
        },
    })
}

#[tokio::test]
async fn mcp_over_http_refuses_strangers_foreign_origins_and_borrowed_sessions() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let initialize = mcp_initialize();
    let post = |key: Option<&str>, body: &Value| mcp_post(&app, key, None, body);
    let response = post(None, &initialize).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let response = post(Some("mnemo_wrong"), &initialize).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let response = post(Some(&alice), &initialize)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);

    let response = post(Some(&alice), &initialize)
        .header("origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let response = mcp_post(&app, Some(&bob), Some(&session), &list)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "alice's session is not bob's"
    );
    app.stop().await;
}

#[tokio::test]
async fn mnemo_mcp_serves_the_tools_over_stdio_to_the_mcp_sdk() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let command = json!([
        env!("CARGO_BIN_EXE_mnemo"),
        "mcp",
        "--server",
        app.base,
        "--key",
        alice,
    ]);
    let seen = run_client(
        "mcp_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", &alice),
            ("MNEMO_MCP_COMMAND", &command.to_string()),
            ("MNEMO_STEPS", "tools,remember,recall"),
        ],
    )
    .await;
    assert_eq!(
        seen["tools"].as_object().map(serde_json::Map::len),
        Some(7),
        "{seen}"
    );
    assert_eq!(seen["remember"]["error"], false, "{seen}");
    assert_remembered_recallable(&seen);
    let recalled = seen["recall"]["texts"][0].as_str().expect("recall text");
    assert!(
        recalled.contains("My favourite colour is teal"),
        "{recalled}"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_mcp_deep_research_stops_when_the_client_cancels_it() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    // Every model call hangs: the research stays in its first stage until it is cancelled.
    llm.set_default(Reply::Hang);
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let alice = app.user_key("alice").await;
    let post =
        |session: Option<&str>, body: Value| mcp_post(&app, Some(&alice), session, &body).send();
    let opened = post(None, mcp_initialize()).await.unwrap();
    assert_eq!(opened.status(), StatusCode::OK);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    drop(opened);
    let initialized = post(
        Some(&session),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
    )
    .await
    .unwrap();
    assert_eq!(initialized.status(), StatusCode::ACCEPTED);

    let call = post(
        Some(&session),
        json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "deep_research",
            "arguments": { "query": "How do lighthouses work?", "search_api": "local" } } }),
    );
    let call = tokio::spawn(async move { call.await.map(|response| response.status()) });
    // The research is running once the model has been asked.
    let mut waited = 0;
    while llm.requests().is_empty() {
        assert!(waited < 300, "the research never asked the model");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let research = |app: &TestApp| {
        let alice = alice.clone();
        let url = app.url("/research/history");
        let client = app.client.clone();
        async move {
            let history: Value = client
                .get(url)
                .bearer_auth(alice)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            history["research"][0]["status"].clone()
        }
    };
    assert_eq!(research(&app).await, "running");

    let cancelled = post(
        Some(&session),
        json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": { "requestId": 7, "reason": "the user changed their mind" } }),
    )
    .await
    .unwrap();
    assert_eq!(cancelled.status(), StatusCode::ACCEPTED);
    let asked = std::time::Instant::now();
    loop {
        let status = research(&app).await;
        if status == "cancelled" {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "the research was still {status} 3 s after the cancel"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call.abort();
    app.stop().await;
}

/// The MCP `remember` tool answered once its memory was searchable (`recallable`).
fn assert_remembered_recallable(seen: &Value) {
    let remembered: Value = serde_json::from_str(
        seen["remember"]["texts"][0]
            .as_str()
            .expect("remember answers"),
    )
    .expect("remember answers JSON");
    assert_eq!(remembered["recallable"], true, "{remembered}");
}

/// After 10,000 sessions of one user the oldest lost their owner, and another user could use
/// or delete them; DELETE answered 202 (the SDK logs "Session termination failed: 202"). A
/// user now holds at most 64 sessions — opening more closes their oldest, which is then 404
/// for everybody — and DELETE answers 204. A NUL in a tool's arguments is a 400, not an
/// internal error.
#[tokio::test]
async fn mcp_sessions_are_bounded_per_user_and_never_change_hands() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let open = |key: String| {
        let request = mcp_post(&app, Some(&key), None, &mcp_initialize());
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_string()
        }
    };
    let mut sessions = Vec::new();
    for _ in 0..65 {
        sessions.push(open(alice.clone()).await);
    }
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let status = |key: &str, session: &str| {
        let request = mcp_post(&app, Some(key), Some(session), &list);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(
        status(&alice, &sessions[0]).await,
        StatusCode::NOT_FOUND,
        "evicted"
    );
    assert_eq!(status(&bob, &sessions[0]).await, StatusCode::NOT_FOUND);
    assert_eq!(status(&bob, &sessions[1]).await, StatusCode::NOT_FOUND);
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let response = mcp_post(&app, Some(&alice), Some(&sessions[64]), &initialized)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::ACCEPTED,
        "the newest session is alive"
    );

    let delete = |key: &str, session: &str| {
        let request = app
            .client
            .delete(app.url("/mcp"))
            .bearer_auth(key)
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", MCP_VERSION);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(delete(&bob, &sessions[1]).await, StatusCode::NOT_FOUND);
    assert_eq!(delete(&alice, &sessions[1]).await, StatusCode::NO_CONTENT);
    assert_eq!(status(&alice, &sessions[1]).await, StatusCode::NOT_FOUND);

    let call = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "remember", "arguments": { "content": "my code is 12\u{0}34" } } });
    let response = mcp_post(&app, Some(&alice), Some(&sessions[64]), &call)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    app.stop().await;
}
