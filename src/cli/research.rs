//! `mnemo research "question"`: one deep research from the terminal, where `connect::route`
//! says (a server, the server holding the data directory, or embedded on the data directory),
//! as `--user` (default the local dev user). Progress (stages, searches, errors) goes to stderr as it
//! happens; the report streams to stdout.

use std::io::Write;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Failure;
use super::chat::connect;
use super::connect::{Route, Target, route};
use mnemo::config::Settings;
use mnemo::research::request::ResearchRequest;

#[derive(Debug, clap::Args)]
pub struct ResearchArgs {
    /// What to research.
    pub query: String,
    /// Search provider: local (your ingested documents), tavily, brave, searxng, duckduckgo.
    #[arg(long)]
    pub search_api: Option<String>,
    /// The model for every role (default: the server's).
    #[arg(long)]
    pub model: Option<String>,
    /// supervisor (default) or recursive.
    #[arg(long)]
    pub mode: Option<String>,
    /// Recursive mode: search queries per level (how wide the research goes).
    #[arg(long)]
    pub breadth: Option<u32>,
    /// Recursive mode: levels of follow-up questions (how deep it goes).
    #[arg(long)]
    pub depth: Option<u32>,
    /// Researchers running at once.
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    /// Do not write the conclusions to memory.
    #[arg(long)]
    pub no_remember: bool,
}

pub async fn run(settings: Settings, target: &Target, args: ResearchArgs) -> Result<(), Failure> {
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
    match route(&settings, target)? {
        Route::Remote { .. } => {
            let (client, _) = connect(settings, target).await?;
            stream(&client, &body).await
        }
        Route::Embedded { user } => embedded(settings, &user, &body).await,
    }
}

/// Runs the research in this process on the data directory.
async fn embedded(settings: Settings, user: &str, body: &Value) -> Result<(), Failure> {
    let request: ResearchRequest =
        serde_json::from_value(body.clone()).map_err(|e| Failure::usage(e.to_string()))?;
    let state = mnemo::startup::build_state(settings, CancellationToken::new()).await?;
    // However the research goes, the state shuts down in order (the vector index flushes).
    let outcome = research_in(&state, user, &request).await;
    state.shut_down().await;
    outcome
}

async fn research_in(
    state: &mnemo::http::AppState,
    user: &str,
    request: &ResearchRequest,
) -> Result<(), Failure> {
    let user = super::memory::local_user(state.store.as_ref(), user).await?;
    let (run, _) = state
        .research
        .start(user, request)
        .await
        .map_err(|error| match error {
            mnemo::research::StartError::Invalid(message) => Failure::usage(message),
            mnemo::research::StartError::Store(error) => error.into(),
            mnemo::research::StartError::NotAdmitted(error) => Failure::other(error.to_string()),
        })?;
    let events = state.runs.follow(user, run.id, 0, CancellationToken::new());
    futures::pin_mut!(events);
    let mut out = std::io::stdout();
    let mut outcome = None;
    while let Some(event) = events.next().await {
        if let Some(status) = show(event.event_type.as_str(), &event.data, &mut out) {
            outcome = Some(status);
        }
    }
    finish(outcome, &mut out)
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
        if let Some(status) = show(&event.event, &data, &mut out) {
            outcome = Some(status);
            break;
        }
    }
    finish(outcome, &mut out)
}

/// Prints one event (progress to stderr, the report to `out`); returns the run's final
/// status at `done`.
fn show(kind: &str, data: &Value, out: &mut impl Write) -> Option<String> {
    let text = |key: &str| data[key].as_str().unwrap_or("").to_string();
    match kind {
        "session_start" => eprintln!("research {}", text("research_id")),
        "stage_update" => eprintln!("== {}: {}", text("stage"), text("content")),
        "sources_found" | "tool_call" => eprintln!("   {}", text("content")),
        "error" => eprintln!("   ! {} error: {}", text("error_type"), text("message")),
        "stage_fallback" => eprintln!(
            "   ~ {}: {} ({})",
            text("step"),
            text("content"),
            text("reason")
        ),
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
        "done" => return Some(text("status")),
        _ => {}
    }
    None
}

fn finish(outcome: Option<String>, out: &mut impl Write) -> Result<(), Failure> {
    let _ = writeln!(out);
    match outcome.as_deref() {
        Some("completed") => Ok(()),
        Some(status) => Err(Failure::other(format!("the research ended {status}"))),
        None => Err(Failure::other("the stream ended before the research did")),
    }
}
