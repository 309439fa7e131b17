//! Orchestration overhead of deep research: wall time minus the time spent waiting for the
//! model, the search provider and page fetches, with a fake OpenAI server at a fixed latency
//! and a fake web on loopback. Researchers run one at a time so the waits do not overlap and
//! the subtraction is exact. Prints a table; asserts nothing.
//!
//! `cargo bench --bench research_overhead` (needs `scripts/fetch-model`).
//! `MNEMO_BENCH_LLM_MS` (default 1000: a fast hosted model) and `MNEMO_BENCH_RUNS` (default 3) change the setup.

#[path = "../tests/api/support/fake_llm.rs"]
mod fake_llm;
#[path = "../tests/api/support/research_site.rs"]
mod research_site;
mod support;

use std::time::Duration;

use fake_llm::{FakeLlm, Reply, prompt_text};
use futures::StreamExt;
use mnemo::config::{Overrides, Settings};
use mnemo::research::request::ResearchRequest;
use mnemo::store::UserKind;
use research_site::ResearchSite;
use serde_json::{Value, json};
use support::{env_number, model_dir};
use tokio_util::sync::CancellationToken;

/// The supervisor dispatches three topics; each researcher searches, reads one page, answers.
fn script(llm: &FakeLlm) {
    llm.set_handler(|request| {
        let prompt = prompt_text(request);
        let tools: Vec<&str> = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str())
            .collect();
        if prompt.contains("You are the research supervisor") {
            return Some(if tools.is_empty() {
                Reply::ToolCalls(
                    ["tides moon", "harbour tides", "lighthouse lens"]
                        .iter()
                        .map(|t| ("conduct_research".to_string(), json!({ "research_topic": t })))
                        .collect(),
                )
            } else {
                Reply::tool("research_complete", json!({}))
            });
        }
        if prompt.contains("You are a researcher") {
            return Some(match tools.as_slice() {
                [] => Reply::tool(
                    "web_search",
                    json!({ "query": request["messages"][1]["content"] }),
                ),
                [search] => Reply::tool(
                    "fetch_url",
                    json!({ "url": search.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or("http://127.0.0.1:9/") }),
                ),
                _ => Reply::text("Findings: tides follow the Moon."),
            });
        }
        if prompt.contains("You write the research brief") {
            return Some(Reply::text(r#"{"brief": "Tides and lighthouses."}"#));
        }
        if prompt.contains("You score the sources") {
            return Some(Reply::text(r#"{"sources": []}"#));
        }
        if prompt.contains("worth remembering from a finished research") {
            return Some(Reply::text(r#"{"conclusions": ["Tides follow the Moon."]}"#));
        }
        if prompt.contains("You write the final report") {
            return Some(Reply::text("# Report\n\nTides follow the Moon [1]."));
        }
        Some(Reply::text("- compressed findings"))
    });
}

fn main() {
    let runtime = support::runtime();
    runtime.block_on(bench());
}

async fn bench() {
    let latency = Duration::from_millis(env_number("MNEMO_BENCH_LLM_MS", 1000));
    let runs = env_number("MNEMO_BENCH_RUNS", 3);
    let Some(model_dir) = model_dir() else {
        return;
    };
    let llm = FakeLlm::start().await;
    llm.set_latency(latency);
    script(&llm);
    let site = ResearchSite::start(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut vars = llm.env();
    vars.extend(site.env());
    vars.push(("MNEMO__EMBEDDER__MODEL_DIR".into(), model_dir.into()));
    vars.push(("MNEMO__SERVER__ADDR".into(), "127.0.0.1:0".into()));
    let overrides = Overrides {
        data_dir: Some(dir.path().to_path_buf()),
        ..Overrides::default()
    };
    let settings = Settings::load_from(&overrides, vars).expect("settings");
    let shutdown = CancellationToken::new();
    let state = mnemo::startup::build_state(settings, shutdown.clone())
        .await
        .expect("state");
    let user = state
        .store
        .accounts()
        .create_user("bench", UserKind::Key)
        .await
        .expect("user");
    println!(
        "deep research orchestration overhead (fake model {} ms per call, search 100 ms, 3 researchers one at a time)",
        latency.as_millis()
    );
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "run", "wall ms", "model ms", "search ms", "fetch ms", "overhead ms", "overhead"
    );
    let mut shares = Vec::new();
    for run in 1..=runs {
        let request = ResearchRequest {
            query: format!("How do tides and lighthouses work? ({run})"),
            max_concurrent_research_units: Some(1),
            ..ResearchRequest::default()
        };
        let (started, _) = state
            .research
            .start(user.id, &request)
            .await
            .unwrap_or_else(|error| panic!("start: {error}"));
        let events = state
            .runs
            .follow(user.id, started.id, 0, CancellationToken::new());
        futures::pin_mut!(events);
        let mut metadata = Value::Null;
        while let Some(event) = events.next().await {
            if event.event_type == "research_complete" {
                metadata = event.data["metadata"].clone();
            }
        }
        let waiting = &metadata["waiting_ms"];
        let wall = metadata["duration_seconds"].as_f64().unwrap_or(0.0) * 1000.0;
        let model = waiting["model"].as_f64().unwrap_or(0.0);
        let search = waiting["search"].as_f64().unwrap_or(0.0);
        let fetch = waiting["fetch"].as_f64().unwrap_or(0.0);
        let overhead = wall - model - search - fetch;
        let share = if wall > 0.0 {
            overhead / wall * 100.0
        } else {
            0.0
        };
        shares.push(share);
        println!(
            "{run:>4} {wall:>9.0} {model:>9.0} {search:>9.0} {fetch:>9.0} {overhead:>11.0} {share:>8.2}%   stages (s): {}",
            metadata["stage_timings"]
        );
    }
    shares.sort_by(f64::total_cmp);
    let median = shares.get(shares.len() / 2).copied().unwrap_or(0.0);
    println!("median overhead: {median:.2}% of the research's wall time (target < 2%)");
    shutdown.cancel();
    state.runs.shutdown(Duration::from_secs(5)).await;
    state.memory.join_background(Duration::from_secs(10)).await;
    // The vector shard flushes when its last owner is dropped; let that happen here, inside
    // the runtime.
    let indexer = std::sync::Arc::downgrade(&state.memory.indexer());
    drop(state);
    for _ in 0..200 {
        if indexer.strong_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
