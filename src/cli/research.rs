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
    /// What to research (with --follow-up: what to go further into).
    #[arg(required_unless_present = "export")]
    pub query: Option<String>,
    /// Search provider: local (your ingested documents), tavily, brave, searxng, duckduckgo;
    /// several, comma-separated, are searched together (e.g. local,searxng).
    #[arg(long)]
    pub search_api: Option<String>,
    /// Follow up an earlier research (its id): start from its sources and report.
    #[arg(long, value_name = "RESEARCH_ID")]
    pub follow_up: Option<String>,
    /// The report's type: detailed (default), summary, outline or resources.
    #[arg(long)]
    pub report_type: Option<String>,
    /// The report's tone, in a few words.
    #[arg(long)]
    pub tone: Option<String>,
    /// The report's target length in words (100–5,000).
    #[arg(long)]
    pub words: Option<u32>,
    /// The language to write the report in.
    #[arg(long)]
    pub language: Option<String>,
    /// Only use web sources on this domain (repeatable).
    #[arg(long = "include-domain", value_name = "DOMAIN")]
    pub include_domains: Vec<String>,
    /// Never use web sources on this domain (repeatable).
    #[arg(long = "exclude-domain", value_name = "DOMAIN")]
    pub exclude_domains: Vec<String>,
    /// Instead of researching: export a finished research (its id) as a file.
    #[arg(long, value_name = "RESEARCH_ID", conflicts_with = "follow_up")]
    pub export: Option<String>,
    /// With --export: markdown (default), docx or pdf.
    #[arg(long, default_value = "markdown", requires = "export")]
    pub format: String,
    /// With --export: the file to write (default: a name made from the question, here).
    #[arg(long, short, requires = "export")]
    pub output: Option<std::path::PathBuf>,
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
    if let Some(id) = &args.export {
        return export(settings, target, id, &args).await;
    }
    let mut body = json!({ "query": args.query.clone().unwrap_or_default() });
    let providers: Option<Value> = args.search_api.as_deref().map(|names| {
        let names: Vec<&str> = names
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        match names.as_slice() {
            [one] => Value::from(*one),
            many => json!(many),
        }
    });
    let report = json!({
        "type": args.report_type, "tone": args.tone, "words": args.words, "language": args.language,
    });
    let has_report = report
        .as_object()
        .is_some_and(|o| o.values().any(|v| !v.is_null()));
    let fields = [
        ("search_api", providers),
        ("follow_up_of", args.follow_up.clone().map(Value::from)),
        ("report", has_report.then_some(report)),
        (
            "include_domains",
            (!args.include_domains.is_empty()).then(|| json!(args.include_domains)),
        ),
        (
            "exclude_domains",
            (!args.exclude_domains.is_empty()).then(|| json!(args.exclude_domains)),
        ),
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
            mnemo::research::StartError::Conflict(message) => Failure::usage(message),
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
    // A follow-up goes to its own route (the server links it to the earlier research).
    let path = match body["follow_up_of"].as_str() {
        Some(id) => format!("/research/{id}/follow-up"),
        None => "/research/stream".to_string(),
    };
    let response = send(client.request(reqwest::Method::POST, &path).json(body)).await?;
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

/// `mnemo research --export ID`: the research as a Markdown, DOCX or PDF file.
async fn export(
    settings: Settings,
    target: &Target,
    id: &str,
    args: &ResearchArgs,
) -> Result<(), Failure> {
    use mnemo::research::export::{self, Format};
    let format: Format = serde_json::from_value(Value::from(args.format.as_str()))
        .map_err(|_| Failure::usage("--format is markdown, docx or pdf"))?;
    let id: mnemo::store::RunId = id.parse().map_err(Failure::usage)?;
    let (bytes, name) = match route(&settings, target)? {
        Route::Remote { .. } => {
            let (client, _) = connect(settings, target).await?;
            let response = send(client.request(
                reqwest::Method::GET,
                &format!("/research/{id}/export?format={}", format.extension()),
            ))
            .await?;
            let name = response
                .headers()
                .get(reqwest::header::CONTENT_DISPOSITION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.split("filename=\"").nth(1))
                .map(|rest| rest.trim_end_matches('"').to_string())
                .unwrap_or_else(|| format!("research.{}", format.extension()));
            let bytes = response
                .bytes()
                .await
                .map_err(|e| Failure::other(format!("the download broke: {e}")))?;
            (bytes.to_vec(), name)
        }
        Route::Embedded { user } => {
            let state = mnemo::startup::build_state(settings, CancellationToken::new()).await?;
            let found = async {
                let user = super::memory::local_user(state.store.as_ref(), &user).await?;
                let record = state.store.user(user).get_research(id).await?;
                let name = export::file_name(&record, format);
                let bytes = export::export(&record, format, &state.research.fonts())
                    .map_err(|error| Failure::other(error.to_string()))?;
                Ok::<_, Failure>((bytes, name))
            }
            .await;
            state.shut_down().await;
            found?
        }
    };
    // The file name comes from the server: only its last part is used, in this directory.
    let path = args.output.clone().unwrap_or_else(|| {
        std::path::Path::new(&name)
            .file_name()
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| format!("research.{}", format.extension()).into())
    });
    std::fs::write(&path, &bytes)
        .map_err(|e| Failure::other(format!("cannot write {}: {e}", path.display())))?;
    eprintln!("wrote {} ({} bytes)", path.display(), bytes.len());
    Ok(())
}

/// Sends a request to the server; an error status becomes a failure with the server's message
/// (a usage error for the client's mistakes).
async fn send(request: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
    let response = request
        .send()
        .await
        .map_err(|e| Failure::other(format!("cannot reach the server: {e}")))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("request failed");
    Err(if status.is_client_error() {
        Failure::usage(message)
    } else {
        Failure::other(format!("{status}: {message}"))
    })
}
