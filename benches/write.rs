//! `mnemo bench write` on the LLM path: the chat turn and the memory extraction go to the fake
//! OpenAI server at a fixed latency (default 300 ms per call), so the numbers show what mnemo
//! adds around the model. Prints the same table as `mnemo bench write`; asserts nothing.
//!
//! `cargo bench --bench write` (needs `scripts/fetch-model`); `MNEMO_BENCH_LLM_MS`,
//! `MNEMO_BENCH_TURNS` (default 30) and `MNEMO_BENCH_JOBS` (default 100) change the setup.

#[path = "../tests/api/support/fake_llm.rs"]
mod fake_llm;
mod support;

use std::time::Duration;

use fake_llm::{FakeLlm, Reply, prompt_text};
use serde_json::json;
use support::{env_number, model_dir};

/// The locker code a bench turn mentions (`bench00042x`).
fn token(text: &str) -> Option<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .find(|word| word.starts_with("bench") && word.len() > 5)
        .map(str::to_string)
}

fn main() {
    let runtime = support::runtime();
    runtime.block_on(async {
        let Some(model_dir) = model_dir() else {
            return;
        };
        let latency = env_number("MNEMO_BENCH_LLM_MS", 300);
        let llm = FakeLlm::start().await;
        llm.set_latency(Duration::from_millis(latency));
        llm.set_handler(|request| {
            let prompt = prompt_text(request);
            if prompt.contains("Decide what is worth remembering") {
                let memories: Vec<serde_json::Value> = token(&prompt)
                    .map(|code| {
                        json!({ "should_remember": true, "kind": "fact",
                                "content": format!("The user's locker code is {code}."), "importance": 3 })
                    })
                    .into_iter()
                    .collect();
                return Some(Reply::text(&json!({ "memories": memories }).to_string()));
            }
            if prompt.contains("Existing memories (id, then text)") {
                return Some(Reply::text(r#"{"action": "add"}"#));
            }
            Some(Reply::text("Noted, I will keep that in mind."))
        });
        let dir = tempfile::tempdir().expect("temp dir");
        println!("fake model latency {latency} ms per call");
        // `mnemo bench write` itself, against the fake model: the bench code lives in the
        // binary, not in the server library.
        let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_mnemo"))
            .arg("--data-dir")
            .arg(dir.path())
            .args(["bench", "write", "--llm-model", "fake-model", "--turns"])
            .arg(env_number("MNEMO_BENCH_TURNS", 30).to_string())
            .arg("--jobs")
            .arg(env_number("MNEMO_BENCH_JOBS", 100).to_string())
            .arg("--llm-url")
            .arg(&llm.base_url)
            .env("MNEMO__EMBEDDER__MODEL_DIR", model_dir)
            .status()
            .await
            .expect("run mnemo bench write");
        if !status.success() {
            eprintln!("bench failed: {status}");
        }
    });
}
