//! `mnemo research "question"`: one deep research from the terminal, against a running server
//! (`--server URL --key KEY`) or an embedded one on the data directory. Progress (stages,
//! searches, errors) goes to stderr as it happens; the report streams to stdout.

use std::io::Write;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Failure;
use super::chat::connect;
use crate::config::Settings;

#[derive(Debug, clap::Args)]
pub struct ResearchArgs {
    /// What to research.
    pub query: String,
    #[arg(long, env = "MNEMO_SERVER")]
    pub server: Option<String>,
    #[arg(long, env = "MNEMO_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Search provider: local (your ingested documents), tavily, brave, searxng, duckduckgo.
    #[arg(long)]
    pub search_api: Option<String>,
    /// The model for every role (default: the server's).
    #[arg(long)]
    pub model: Option<String>,
    /// supervisor (default) or recursive.
    #[arg(long)]
    pub mode: Option<String>,
    #[arg(long)]
    pub breadth: Option<u32>,
    #[arg(long)]
    pub depth: Option<u32>,
    /// Researchers running at once.
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    /// Do not write the conclusions to memory.
    #[arg(long)]
    pub no_remember: bool,
}

pub async fn run(settings: Settings, args: ResearchArgs) -> Result<(), Failure> {
    let stop = CancellationToken::new();
    let client = connect(settings, args.server.clone(), args.key.clone(), &stop).await?;
    let mut body = json!({ "query": args.query });
    let fields = [
        ("search_api", args.search_api.clone().map(Value::from)),
        ("model", args.model.clone().map(Value::from)),
        ("mode", args.mode.clone().map(Value::from)),
        ("breadth", args.breadth.map(Value::from)),
        ("depth", args.depth.map(Value::from)),
        (
            "max_concurrent_research_units",
            args.max_concurrent.map(Value::from),
        ),
        ("concurrency", args.max_concurrent.map(Value::from)),
        ("remember", args.no_remember.then_some(Value::from(false))),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            body[name] = value;
        }
    }
    let result = stream(&client, &body).await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    result
}

async fn stream(client: &super::chat::Client, body: &Value) -> Result<(), Failure> {
    let response = client
        .request(reqwest::Method::POST, "/research/stream")
        .json(body)
        .send()
        .await
        .map_err(|e| Failure::other(format!("cannot reach the server: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("request failed");
        return Err(if status.is_client_error() {
            Failure::usage(message)
        } else {
            Failure::other(format!("{status}: {message}"))
        });
    }
    let mut out = std::io::stdout();
    let mut events = response.bytes_stream().eventsource();
    let mut outcome = None;
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| Failure::other(format!("the stream broke: {e}")))?;
        let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        let text = |key: &str| data[key].as_str().unwrap_or("").to_string();
        match event.event.as_str() {
            "session_start" => eprintln!("research {}", text("research_id")),
            "stage_update" => eprintln!("== {}: {}", text("stage"), text("content")),
            "sources_found" => eprintln!("   {}", text("content")),
            "tool_call" => eprintln!("   {}", text("content")),
            "error" => eprintln!("   ! {} error: {}", text("error_type"), text("message")),
            "report_delta" => {
                let _ = write!(out, "{}", text("content"));
                let _ = out.flush();
            }
            "research_complete" => {
                let metadata = &data["metadata"];
                eprintln!(
                    "\n== done in {:.1} s: {} words, {} sources, {} memories written",
                    metadata["duration_seconds"].as_f64().unwrap_or(0.0),
                    metadata["word_count"],
                    metadata["sources"].as_array().map(Vec::len).unwrap_or(0),
                    metadata["memories_written"],
                );
            }
            "done" => {
                outcome = Some(text("status"));
                break;
            }
            _ => {}
        }
    }
    let _ = writeln!(out);
    match outcome.as_deref() {
        Some("completed") => Ok(()),
        Some(status) => Err(Failure::other(format!("the research ended {status}"))),
        None => Err(Failure::other("the stream ended before the research did")),
    }
}
