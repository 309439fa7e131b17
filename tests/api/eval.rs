//! `mnemo eval … --answer` through the binary, with the fake OpenAI server answering and
//! judging: every question gets an answer from its recalled memories, a verdict and a token F1,
//! and the report says so per category.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::fake_llm::{FakeLlm, Reply, prompt_text};

/// Runs `mnemo eval longmemeval` on the fixture with `llm` as the model and `args`; fails the
/// test unless it succeeds; returns the results directory.
async fn run_eval(llm: &FakeLlm, dir: &Path, args: &[&str]) -> PathBuf {
    let out = dir.join("results");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/longmemeval-mini.json"
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_mnemo"));
    command
        .args(["eval", "longmemeval", "--data", fixture])
        .args(args)
        .arg("--out")
        .arg(&out)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("MNEMO__EMBEDDER__MODEL_DIR", support::model_dir())
        .env("MNEMO__LOG__LEVEL", "warn")
        // Three-question haystacks of a few turns: the gate's thresholds are not what these
        // tests are about (the LoCoMo run measures them).
        .envs(support::UNGATED);
    for (key, value) in llm.env() {
        command.env(key, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_generated_judged_and_reported() {
    let llm = FakeLlm::start().await;
    llm.set_handler(|request| {
        let prompt = prompt_text(request);
        if prompt.contains("You grade an answer") {
            // The judge accepts exactly the answers that name Lisbon.
            let answer = prompt
                .lines()
                .find_map(|line| line.strip_prefix("Answer to grade: "))
                .unwrap_or("");
            let label = if answer.contains("Lisbon") {
                "CORRECT"
            } else {
                "WRONG"
            };
            return Some(Reply::text(&format!("{{\"label\": \"{label}\"}}")));
        }
        if prompt.contains("using only the memories") {
            return Some(Reply::text(
                if prompt.contains("Lisbon") && prompt.contains("live") {
                    "Lisbon"
                } else {
                    "Not mentioned"
                },
            ));
        }
        None
    });
    let dir = tempfile::tempdir().unwrap();
    let out = run_eval(
        &llm,
        dir.path(),
        &["--answer", "--variants", "dated,hybrid"],
    )
    .await;

    let lines: Vec<Value> = std::fs::read_to_string(out.join("answers.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Four questions, one an abstention question the adapter skips.
    assert_eq!(lines.len(), 3, "one answer per question");
    let lisbon = lines.iter().find(|l| l["gold"] == "Lisbon").unwrap();
    assert_eq!(lisbon["answer"], "Lisbon");
    assert_eq!(lisbon["correct"], true);
    assert_eq!(lisbon["f1"], 1.0);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let answers = &report["answers"];
    assert_eq!(answers["run"], "dated/hybrid");
    assert_eq!(answers["overall"]["questions"], 3);
    assert_eq!(answers["overall"]["correct"], 1);
    assert_eq!(answers["overall"]["judge_accuracy"], 33.3);
    assert_eq!(
        answers["categories"]["knowledge-update"]["judge_accuracy"],
        100.0
    );
    let markdown = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        markdown.contains("## Answers from recalled memories"),
        "{markdown}"
    );
    // Each answer prompt carried recalled memories as quoted data.
    let prompts: Vec<String> = llm
        .requests()
        .iter()
        .map(prompt_text)
        .filter(|p| p.contains("using only the memories"))
        .collect();
    assert_eq!(prompts.len(), 3);
    assert!(prompts.iter().all(|p| p.contains("\n> ")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facts_unit_is_extracted_by_the_model_with_turn_references() {
    let llm = FakeLlm::start().await;
    llm.set_handler(|request| {
        let prompt = prompt_text(request);
        if !prompt.contains("You turn one session of a conversation into memories") {
            return None;
        }
        // One fact per turn, restated, plus one fact citing a turn that does not exist.
        let mut facts: Vec<Value> = prompt
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix('[')?;
                let (id, said) = rest.split_once("] ")?;
                Some(serde_json::json!({ "content": format!("Fact: {said}"), "turns": [id] }))
            })
            .collect();
        facts.push(serde_json::json!({ "content": "Invented", "turns": ["nowhere:1"] }));
        Some(Reply::text(
            &serde_json::json!({ "facts": facts }).to_string(),
        ))
    });
    let dir = tempfile::tempdir().unwrap();
    let out = run_eval(&llm, dir.path(), &["--variants", "facts,hybrid"]).await;
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let unit = report["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["unit"] == "facts")
        .unwrap();
    assert_eq!(unit["status"], "ok", "{unit}");
    let extraction_calls = llm
        .requests()
        .iter()
        .filter(|r| prompt_text(r).contains("You turn one session"))
        .count();
    let sessions = report["conversations"].as_u64().unwrap();
    assert!(extraction_calls as u64 >= sessions);
    // One fact per non-empty turn survived; the invented one (unknown turn id) did not.
    let memories = unit["memories"].as_u64().unwrap();
    assert!(memories > 0);
    let run = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "facts/hybrid")
        .unwrap();
    assert!(
        run["overall"]["recall"]["10"].as_f64().unwrap() > 0.5,
        "{run}"
    );
}
