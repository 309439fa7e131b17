//! mnemo with a real language model: llama.cpp's OpenAI-compatible server running Gemma 3 270M
//! (`support::real_llm`). A model this small is good for the wire and the fallbacks, not for
//! answers, so these tests assert structure — events in order, nothing lost, no 5xx, fallbacks
//! named — never the model's words. They run one at a time (`.config/nextest.toml`): the
//! server answers one request after another.

use crate::clients::run_client;
use crate::support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::real_llm::RealLlm;
use support::{Backend, Home, ReceivedEvent, TestApp};

const PATIENCE: Duration = Duration::from_secs(240);

async fn spawn(home: &Home, llm: &RealLlm, extra: &[(&str, &str)]) -> TestApp {
    let mut env = llm.env();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    TestApp::spawn_with(home, &borrowed).await
}

fn kinds(events: &[ReceivedEvent]) -> Vec<&str> {
    events.iter().map(|event| event.event.as_str()).collect()
}

/// A chat turn streamed to `done`: the message and the answer stored, the memory tools offered;
/// then the writer reads the real reply (or falls back to its rules) and the turn is remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_turn_with_a_real_model_streams_to_done_and_is_remembered() {
    let llm = RealLlm::start().await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "real").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let said = "My sister Ines lives in Lisbon and I play the cello every evening.";
    let run = app.post_message(&key, &thread, said).await;
    // The test client's 30-second deadline is for requests; a slow model's stream gets longer.
    let response = app
        .client
        .get(app.url(&format!("/v1/runs/{}/events", run["id"].as_str().unwrap())))
        .bearer_auth(&key)
        .timeout(Duration::from_secs(900))
        .send()
        .await
        .expect("events request");
    let events = support::SseReader::new(response)
        .patient(PATIENCE)
        .collect()
        .await;
    let names = kinds(&events);
    assert_eq!(names.first(), Some(&"session_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"done"), "{events:?}");
    assert!(!names.contains(&"error"), "{events:?}");
    let complete = events
        .iter()
        .find(|event| event.event == "message_complete")
        .expect("message_complete");
    let usage = events
        .iter()
        .rfind(|event| event.event == "usage")
        .expect("usage from the real server");
    assert!(usage.data["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert!(
        usage.data["usage"]["completion_tokens"].as_u64().unwrap() <= 96 * 9,
        "the role's cap holds: {usage:?}"
    );
    let deltas: String = events
        .iter()
        .filter(|event| event.event == "message_delta")
        .map(|event| event.data["content"].as_str().unwrap_or_default())
        .collect();
    let (_, body) = app.get(&format!("/v1/threads/{thread}"), Some(&key)).await;
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(messages[0]["content"], said);
    assert_eq!(messages.last().unwrap()["role"], "assistant");
    let stored = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(
        stored.starts_with(deltas.trim()),
        "what was streamed is what was stored: {deltas:?} / {stored:?} / {complete:?}"
    );
    // The tools went to the real server, and its answers were read (whatever it did with them).
    app.wait_for_jobs_within(PATIENCE).await;
    let (status, memories) = app.get("/v1/memories?limit=500", Some(&key)).await;
    assert_eq!(status, StatusCode::OK);
    let contents: Vec<&str> = memories["memories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|memory| memory["content"].as_str())
        .collect();
    assert!(
        contents.iter().any(|text| text.contains("Lisbon")),
        "the turn is remembered, by the model or the rules: {contents:?}"
    );
    let stats = app.state.store.maintenance().queue_stats().await.unwrap();
    assert_eq!(stats.failed, 0, "no memory job failed: {stats:?}");
    app.stop().await;
}

/// A research over the user's own documents completes with the real model; wherever its output
/// was unusable the stage says so (`stage_fallback`) and the research still ends with a report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_over_local_documents_completes_with_a_real_model() {
    let llm = RealLlm::start().await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    for (source, text) in [
        (
            "notes/lighthouses.md",
            "# Lighthouses\n\nA lighthouse uses a Fresnel lens to focus its lamp into a beam \
             visible for more than twenty nautical miles. Each lighthouse has its own flash \
             pattern so that sailors can tell them apart at night.",
        ),
        (
            "notes/keepers.md",
            "# Keepers\n\nLighthouse keepers trimmed the wicks, wound the clockwork that turned \
             the lens and logged the weather. Most lights were automated by the 1990s.",
        ),
    ] {
        let (status, body) = app
            .ingest_document(&key, json!({ "content": text, "source": source }))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    app.wait_indexed().await;
    let response = app
        .client
        .post(app.url("/research/stream"))
        .bearer_auth(&key)
        .timeout(Duration::from_secs(900))
        .json(&json!({
            "query": "How do lighthouses work and who kept them?",
            "search_api": "local",
            "allow_clarification": false,
            "max_concurrent_research_units": 1,
            "max_researcher_iterations": 1,
            "max_react_tool_calls": 2,
        }))
        .send()
        .await
        .expect("research request");
    assert_eq!(response.status(), StatusCode::OK);
    let events = support::SseReader::new(response)
        .patient(PATIENCE)
        .collect()
        .await;
    let names = kinds(&events);
    let done = events.last().expect("events");
    assert_eq!(done.event, "done", "{names:?}");
    assert_eq!(done.data["status"], "completed", "{events:?}");
    let complete = events
        .iter()
        .find(|event| event.event == "research_complete")
        .expect("research_complete");
    let report = complete.data["content"].as_str().unwrap_or_default();
    assert!(!report.trim().is_empty(), "{complete:?}");
    for fallback in events
        .iter()
        .filter(|event| event.event == "stage_fallback")
    {
        assert!(
            fallback.data["stage"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
                && fallback.data["step"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
                && fallback.data["reason"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
            "a fallback names its stage and why: {fallback:?}"
        );
    }
    let usage: u64 = events
        .iter()
        .filter(|event| event.event == "usage")
        .filter_map(|event| event.data["usage"]["total_tokens"].as_u64())
        .sum();
    assert!(usage > 0, "the real model was used: {names:?}");
    app.stop().await;
}

/// `/v1/chat/completions` with a real upstream, through the official `openai` package:
/// whole and streamed answers, usage, the models list; no 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_endpoint_answers_with_a_real_upstream() {
    let llm = RealLlm::start().await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let seen = run_client(
        "openai_client.py",
        &[
            ("MNEMO_BASE", &app.base),
            ("MNEMO_KEY", &key),
            ("MNEMO_STEPS", "whole,stream,models"),
        ],
    )
    .await;
    let whole = &seen["whole"];
    assert!(whole["content"].is_string(), "{seen}");
    assert!(
        ["stop", "length"].contains(&whole["finish_reason"].as_str().unwrap_or_default()),
        "{seen}"
    );
    assert!(
        whole["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{seen}"
    );
    let stream = &seen["stream"];
    assert!(stream["chunks"].as_u64().unwrap() >= 1, "{seen}");
    assert!(
        ["stop", "length"].contains(&stream["finish_reason"].as_str().unwrap_or_default()),
        "{seen}"
    );
    assert!(
        stream["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{seen}"
    );
    assert_eq!(
        stream["thread"], whole["thread"],
        "one conversation: {seen}"
    );
    let models: Vec<&str> = seen["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(models.contains(&support::real_llm::MODEL), "{models:?}");
    app.stop().await;
}

/// The calibrated token estimate against Gemma 3's own tokenizer (262k pieces) on the texts of
/// `tests/fixtures/token-samples.txt` (eight languages, code, numbers, emoji): never more than
/// 15 % under, never twice over, about 1.2× on average.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_estimate_holds_against_the_models_tokenizer() {
    let llm = RealLlm::start().await;
    let samples = include_str!("../fixtures/token-samples.txt");
    let mut ratios = Vec::new();
    for sample in samples.lines().filter(|line| !line.trim().is_empty()) {
        let sample = sample.replace("\\n", "\n");
        let real = llm.count_tokens(&sample).await as f64;
        let estimated = mnemo::llm::fit::estimate(&sample) as f64;
        let ratio = estimated / real;
        assert!(
            (0.85..=2.0).contains(&ratio),
            "estimate {estimated} vs Gemma {real} for {sample:?}"
        );
        ratios.push(ratio);
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    eprintln!(
        "estimate / Gemma tokens over {} texts: mean {mean:.2}",
        ratios.len()
    );
    assert!((1.0..=1.4).contains(&mean), "{mean}");
}
