//! The web app's chat conveniences seen from the API: a message answered by a model the user
//! picked from the configured ones, and what the memory writer did with a turn, read from the
//! turn's run (`GET /v1/runs/{id}/memory`, with its long-poll).

use crate::support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, ReceivedEvent, TestApp};

/// These tests look at the chat turn's requests; the writer's own model calls would mix in.
const NO_WRITER: (&str, &str) = ("MNEMO__MEMORY__WRITER_WORKERS", "0");

/// Reads the run's events to its end.
async fn read_run(app: &TestApp, key: &str, run: &str) -> Vec<ReceivedEvent> {
    app.events(key, run, None).await.collect().await
}

async fn message_count(app: &TestApp, key: &str, thread: &str) -> usize {
    let (status, body) = app.get(&format!("/v1/threads/{thread}"), Some(key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"].as_array().unwrap().len()
}

#[tokio::test]
async fn a_message_is_answered_by_the_configured_model_it_names_and_an_unknown_one_is_refused() {
    let home = Home::new(Backend::Sqlite).await;
    let llm = FakeLlm::start().await;
    let app = TestApp::spawn_with_llm(
        &home,
        &llm,
        &[
            NO_WRITER,
            ("MNEMO__LLM__ROLES__RESEARCH__MODEL", "fake-large"),
        ],
    )
    .await;
    let key = app.user_key("alice").await;
    let thread = app.new_thread(&key).await;

    // The roles list both models: the picker's choices.
    let (status, roles) = app.get("/v1/roles", Some(&key)).await;
    assert_eq!(status, StatusCode::OK, "{roles}");
    let listed: Vec<&str> = roles["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["model"].as_str().unwrap())
        .collect();
    assert!(
        listed.contains(&"fake-model") && listed.contains(&"fake-large"),
        "{listed:?}"
    );

    let (status, body) = app
        .post_to_thread(
            &key,
            &thread,
            json!({ "content": "hello there", "stream": false, "model": "gpt-unknown" }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("gpt-unknown")
            && message.contains("fake-model")
            && message.contains("fake-large"),
        "{message}"
    );
    assert_eq!(
        message_count(&app, &key, &thread).await,
        0,
        "a refused message is not stored"
    );
    assert!(llm.requests().is_empty());

    llm.push(Reply::text("Answered by the large one."));
    let events = app
        .turn_in_thread(
            &key,
            &thread,
            json!({ "content": "Which model are you?", "stream": false, "model": "fake-large" }),
        )
        .await;
    let start = events
        .iter()
        .find(|event| event.event == "session_start")
        .unwrap();
    assert_eq!(
        start.data["model"], "fake-large",
        "the run records its model"
    );
    let complete = events
        .iter()
        .find(|event| event.event == "message_complete")
        .unwrap();
    assert_eq!(complete.data["content"], "Answered by the large one.");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["model"], "fake-large");

    // Without `model`, the chat role's.
    llm.push(Reply::text("Answered by the default."));
    app.turn_in_thread(
        &key,
        &thread,
        json!({ "content": "And now?", "stream": false }),
    )
    .await;
    assert_eq!(llm.requests()[1]["model"], "fake-model");
    app.stop().await;
}

#[tokio::test]
async fn naming_a_model_on_a_server_without_models_is_refused() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = app.new_thread(&key).await;
    let (status, body) = app
        .post_to_thread(
            &key,
            &thread,
            json!({ "content": "hello", "stream": false, "model": "fake-model" }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no model is configured"),
        "{body}"
    );
    assert_eq!(message_count(&app, &key, &thread).await, 0);
    app.stop().await;
}

/// The turn's memory job, waited for up to `wait` seconds.
async fn run_memory(app: &TestApp, key: &str, run: &str, wait: u64) -> (StatusCode, Value) {
    app.get(&format!("/v1/runs/{run}/memory?wait={wait}"), Some(key))
        .await
}

#[tokio::test]
async fn a_turns_memory_job_lists_what_it_stored_and_the_wait_returns_when_it_is_done() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = app.new_thread(&key).await;

    let run = app
        .post_message(&key, &thread, "Remember that my sister lives in Graz")
        .await;
    let run = run["id"].as_str().unwrap().to_string();
    // Asked at once, before the turn (and so its job) has ended: the wait holds the answer
    // until the job is done, not for its whole length.
    let asked = Instant::now();
    let (status, memory) = run_memory(&app, &key, &run, 30).await;
    assert_eq!(status, StatusCode::OK, "{memory}");
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(memory["status"], "done", "{memory}");
    assert!(memory["job"].as_str().unwrap().starts_with("turn:"));
    let changed = memory["result"]["memories"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "only the fact, not the turn: {memory}");
    assert_eq!(changed[0]["change"], "added");
    assert_eq!(changed[0]["kind"], "fact");
    let content = changed[0]["content"].as_str().unwrap();
    assert!(content.contains("sister lives in Graz"), "{content}");
    let id = changed[0]["id"].as_str().unwrap();
    let (status, stored) = app.get(&format!("/v1/memories/{id}"), Some(&key)).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(stored["memory"]["content"], content);
    assert_eq!(stored["memory"]["kind"], "fact");

    // A question stores nothing worth a notice (its turn record is not listed).
    let question = app
        .post_message(&key, &thread, "Where does my sister live?")
        .await;
    let question = question["id"].as_str().unwrap().to_string();
    read_run(&app, &key, &question).await;
    let (status, memory) = run_memory(&app, &key, &question, 30).await;
    assert_eq!(status, StatusCode::OK, "{memory}");
    assert_eq!(memory["status"], "done", "{memory}");
    assert_eq!(memory["result"]["memories"], json!([]), "{memory}");

    // Without a wait the answer is immediate; a wait past 30 s is refused; another user's run
    // is not found.
    let (status, memory) = app.get(&format!("/v1/runs/{run}/memory"), Some(&key)).await;
    assert_eq!(
        (status, &memory["status"]),
        (StatusCode::OK, &json!("done"))
    );
    let (status, body) = run_memory(&app, &key, &run, 31).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("30"));
    let bob = app.user_key("bob").await;
    let (status, _) = run_memory(&app, &bob, &run, 0).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test]
async fn a_temporary_chats_memory_job_stores_nothing() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let (status, thread) = app
        .post(
            "/v1/threads",
            Some(&key),
            Some(json!({ "title": "off the record", "temporary": true })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    let thread = thread["id"].as_str().unwrap();
    let run = app
        .post_message(&key, thread, "Remember that my brother lives in Linz")
        .await;
    let run = run["id"].as_str().unwrap();
    let (status, memory) = run_memory(&app, &key, run, 30).await;
    assert_eq!(status, StatusCode::OK, "{memory}");
    assert_eq!(memory["status"], "done", "{memory}");
    assert_eq!(memory["result"]["memories"], json!([]));
    app.stop().await;
}
