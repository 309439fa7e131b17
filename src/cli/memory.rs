//! `mnemo memory …`, `mnemo reindex` and `mnemo check`. Memory commands go where
//! `connect::route` says (a server, the server holding the data directory, or embedded, as
//! `--user`); reindex and check always run on the data directory and need it free.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Failure;
use super::connect::{Route, route};
use mnemo::config::Settings;
use mnemo::datadir::{DataDirLock, LockError};
use mnemo::memory::rank::RecallMode;
use mnemo::memory::{MemoryEngine, PortableMemory, RecallRequest};
use mnemo::store::{self, MemoryFilter, MemoryKind, NewMemory, Store, UserId};

pub use super::connect::Target;

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Remember a statement; prints the new memory's id.
    Add {
        /// The statement, e.g. "I prefer answers with sources".
        content: String,
        /// What it is: fact, preference, event, conclusion, profile or turn (document is for
        /// `mnemo ingest`).
        #[arg(long, default_value = "fact")]
        kind: String,
        /// 1 (trivia, may decay and be archived) to 5 (never forget).
        #[arg(long, default_value_t = 3)]
        importance: u8,
    },
    /// Hybrid recall: what mnemo would remember for a query, best first, with scores.
    Search {
        /// What to look for.
        query: String,
        /// How many memories to return.
        #[arg(short, long, default_value_t = 10)]
        k: usize,
        /// hybrid (dense vectors + BM25, fused), vector or keyword.
        #[arg(long, default_value = "hybrid")]
        mode: String,
        /// Also search archived (decayed) memories.
        #[arg(long)]
        include_archived: bool,
        /// Print the raw JSON response (per-signal details included).
        #[arg(long)]
        json: bool,
    },
    /// List memories, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Only these kinds, comma-separated (e.g. fact,preference).
        #[arg(long)]
        kinds: Option<String>,
        /// Include archived (decayed) memories.
        #[arg(long)]
        include_archived: bool,
        /// Print JSON instead of one line per memory.
        #[arg(long)]
        json: bool,
    },
    /// Forget what a description names: lists the memories that clearly match it, then asks
    /// before forgetting them (restorable for memory.forget_retention_days).
    Forget {
        /// What to forget, e.g. "my old address".
        query: String,
        /// Forget without asking.
        #[arg(long)]
        yes: bool,
    },
    /// The forgotten memories that can still be restored, newest first.
    Forgotten,
    /// Bring a forgotten memory back.
    Restore {
        /// The memory's id (as `mnemo memory forgotten` prints it).
        id: String,
    },
    /// Write every memory as JSON lines (to stdout or --output).
    Export {
        /// The file to write (default stdout).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Read JSON lines (as exported) from a file, or `-` for stdin.
    Import {
        /// The file, or `-` for stdin.
        path: PathBuf,
    },
}

/// Where memory commands go.
pub(super) enum Backend {
    Remote {
        base: String,
        key: String,
        http: reqwest::Client,
    },
    Embedded {
        engine: Arc<MemoryEngine>,
        store: Arc<dyn Store>,
        user: UserId,
        shutdown: CancellationToken,
        lock: DataDirLock,
    },
}

fn parse_mode(mode: &str) -> Result<RecallMode, Failure> {
    match mode {
        "hybrid" => Ok(RecallMode::Hybrid),
        "vector" => Ok(RecallMode::Vector),
        "keyword" => Ok(RecallMode::Keyword),
        other => Err(Failure::usage(format!(
            "--mode must be hybrid, vector or keyword, not {other:?}"
        ))),
    }
}

fn parse_kind(kind: &str) -> Result<MemoryKind, Failure> {
    MemoryKind::parse(kind).ok_or_else(|| {
        let kinds: Vec<&str> = MemoryKind::ALL.iter().map(|kind| kind.as_str()).collect();
        Failure::usage(format!(
            "unknown memory kind {kind:?}: use one of {}",
            kinds.join(", ")
        ))
    })
}

pub(super) fn memory_failure(error: mnemo::memory::MemoryError) -> Failure {
    use mnemo::error::{ErrorKind, HasKind};
    match error.kind() {
        ErrorKind::BadRequest | ErrorKind::NotFound | ErrorKind::Conflict => {
            Failure::usage(error.to_string())
        }
        _ => Failure::other(error.to_string()),
    }
}

/// Opens the memory engine on the data directory (embedded commands and reindex), holding the
/// directory's lock.
async fn open_embedded(
    settings: &Settings,
) -> Result<
    (
        Arc<MemoryEngine>,
        Arc<dyn Store>,
        CancellationToken,
        DataDirLock,
    ),
    Failure,
> {
    let lock = DataDirLock::acquire(&settings.data_dir).map_err(|error| match error {
        held @ LockError::Held { .. } => {
            Failure::other(format!("{held}; stop it first (or wait for it to finish)"))
        }
        other => Failure::other(other.to_string()),
    })?;
    let store = store::connect(
        &settings.database_url(),
        settings.database.max_connections,
        settings.database.acquire_timeout(),
    )
    .await?;
    let shutdown = CancellationToken::new();
    let engine = mnemo::startup::open_memory(settings, store.clone(), shutdown.clone())
        .await
        .map_err(memory_failure)?;
    Ok((engine, store, shutdown, lock))
}

/// The user an embedded command acts as (`auth::local_user`), or a usage error naming the
/// command that creates it.
pub(super) async fn local_user(store: &dyn Store, name: &str) -> Result<UserId, Failure> {
    Ok(mnemo::auth::local_user(store, name)
        .await?
        .ok_or_else(|| {
            Failure::usage(format!(
                "no user named {name} (create one with `mnemo user add {name}`)"
            ))
        })?
        .id)
}

impl Backend {
    pub(super) async fn open(settings: &Settings, target: Target) -> Result<Self, Failure> {
        match route(settings, &target)? {
            Route::Remote { base, bearer } => Ok(Backend::Remote {
                base,
                key: bearer,
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(300))
                    .build()
                    .map_err(|e| Failure::other(e.to_string()))?,
            }),
            Route::Embedded { user } => {
                let (engine, store, shutdown, lock) = open_embedded(settings).await?;
                let user = match local_user(store.as_ref(), &user).await {
                    Ok(user) => user,
                    Err(failure) => {
                        shutdown.cancel();
                        engine.close(Duration::from_secs(10)).await;
                        store.close().await;
                        return Err(failure);
                    }
                };
                Ok(Backend::Embedded {
                    engine,
                    store,
                    user,
                    shutdown,
                    lock,
                })
            }
        }
    }

    /// Sends a request to the server and returns its JSON (or text) body.
    pub(super) async fn remote(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<RemoteBody>,
    ) -> Result<String, Failure> {
        let Backend::Remote { base, key, http } = self else {
            return Err(Failure::other("not a remote backend"));
        };
        let mut request = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(key);
        match body {
            Some(RemoteBody::Json(value)) => request = request.json(&value),
            Some(RemoteBody::Text(text)) => {
                request = request
                    .header("content-type", "application/x-ndjson")
                    .body(text);
            }
            Some(RemoteBody::Bytes {
                content_type,
                bytes,
            }) => request = request.header("content-type", content_type).body(bytes),
            None => {}
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::other(format!("cannot reach {base}: {e}")))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| Failure::other(e.to_string()))?;
        if status.is_success() {
            return Ok(text);
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|body| body["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(text);
        if status.is_client_error() {
            Err(Failure::usage(format!("{status}: {message}")))
        } else {
            Err(Failure::other(format!("{status}: {message}")))
        }
    }

    pub(super) async fn close(self) {
        if let Backend::Embedded {
            engine,
            store,
            shutdown,
            lock,
            ..
        } = self
        {
            if let Err(error) = engine.indexer().catch_up().await {
                tracing::warn!(%error, "indexing before exit failed");
            }
            shutdown.cancel();
            engine.close(Duration::from_secs(10)).await;
            store.close().await;
            drop(engine);
            lock.release();
        }
    }
}

pub(super) enum RemoteBody {
    Json(Value),
    Text(String),
    Bytes {
        content_type: &'static str,
        bytes: Vec<u8>,
    },
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Value, Failure> {
    serde_json::to_value(value).map_err(|e| Failure::other(e.to_string()))
}

pub(super) fn parse_json(text: &str) -> Result<Value, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::other(format!("unexpected response: {e}")))
}

fn print_memories(memories: &[Value]) {
    for memory in memories {
        println!(
            "{}  {:<10} {}  {}",
            memory["id"].as_str().unwrap_or("-"),
            memory["kind"].as_str().unwrap_or("-"),
            memory["importance"],
            memory["content"].as_str().unwrap_or("").replace('\n', " ")
        );
    }
}

/// `mnemo memory forget`: the preview, a question, then exactly the memories shown.
async fn forget(backend: &Backend, query: &str, yes: bool) -> Result<(), Failure> {
    use reqwest::Method;
    let matches: Vec<Value> = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(
                    Method::POST,
                    "/v1/memories/forget",
                    Some(RemoteBody::Json(json!({ "query": query, "dry_run": true }))),
                )
                .await?,
        )?["matches"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        Backend::Embedded { engine, user, .. } => to_json(
            &engine
                .forget_preview(*user, query)
                .await
                .map_err(memory_failure)?,
        )?
        .as_array()
        .cloned()
        .unwrap_or_default(),
    };
    if matches.is_empty() {
        eprintln!("nothing clearly matches {query:?}; nothing forgotten");
        return Ok(());
    }
    eprintln!("{} memories match {query:?}:", matches.len());
    let memories: Vec<Value> = matches.iter().map(|m| m["memory"].clone()).collect();
    for memory in &memories {
        eprintln!(
            "  {}  {}",
            memory["id"].as_str().unwrap_or("-"),
            memory["content"].as_str().unwrap_or("").replace('\n', " ")
        );
    }
    if !yes {
        eprint!("Forget them? They can be restored with `mnemo memory restore ID`. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(|e| Failure::other(e.to_string()))?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            eprintln!("nothing forgotten");
            return Ok(());
        }
    }
    let ids: Vec<String> = memories
        .iter()
        .filter_map(|memory| memory["id"].as_str().map(str::to_string))
        .collect();
    let forgotten = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(
                    Method::POST,
                    "/v1/memories/forget",
                    Some(RemoteBody::Json(json!({ "query": query, "ids": ids }))),
                )
                .await?,
        )?["forgotten"]
            .as_array()
            .map_or(0, Vec::len),
        Backend::Embedded { engine, user, .. } => {
            let ids: Vec<mnemo::store::MemoryId> =
                ids.iter().filter_map(|id| id.parse().ok()).collect();
            engine
                .forget_ids(*user, &ids, query, mnemo::store::ForgetVia::Cli)
                .await
                .map_err(memory_failure)?
                .len()
        }
    };
    println!("{forgotten} memories forgotten");
    Ok(())
}

pub async fn run(
    settings: &Settings,
    target: Target,
    command: MemoryCommand,
) -> Result<(), Failure> {
    let backend = Backend::open(settings, target).await?;
    let result = execute(&backend, command).await;
    backend.close().await;
    result
}

async fn execute(backend: &Backend, command: MemoryCommand) -> Result<(), Failure> {
    match command {
        MemoryCommand::Add {
            content,
            kind,
            importance,
        } => add(backend, content, kind, importance).await,
        MemoryCommand::Search {
            query,
            k,
            mode,
            include_archived,
            json,
        } => search(backend, query, k, mode, include_archived, json).await,
        MemoryCommand::Forget { query, yes } => forget(backend, &query, yes).await,
        MemoryCommand::Forgotten => forgotten(backend).await,
        MemoryCommand::Restore { id } => restore(backend, id).await,
        MemoryCommand::List {
            limit,
            kinds,
            include_archived,
            json,
        } => list(backend, limit, kinds, include_archived, json).await,
        MemoryCommand::Export { output } => export(backend, output).await,
        MemoryCommand::Import { path } => import(backend, path).await,
    }
}

/// Stores one memory and prints its id.
async fn add(
    backend: &Backend,
    content: String,
    kind: String,
    importance: u8,
) -> Result<(), Failure> {
    use reqwest::Method;
    let kind = parse_kind(&kind)?;
    let memory = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(
                    Method::POST,
                    "/v1/memories",
                    Some(RemoteBody::Json(
                        json!({ "content": content, "kind": kind, "importance": importance }),
                    )),
                )
                .await?,
        )?,
        Backend::Embedded { engine, user, .. } => {
            if !(1..=5).contains(&importance) {
                return Err(Failure::usage("--importance must be between 1 and 5"));
            }
            let written = engine
                .add(*user, vec![NewMemory::from_user(kind, content, importance)])
                .await
                .map_err(memory_failure)?;
            to_json(&written.first())?
        }
    };
    println!("{}", memory["id"].as_str().unwrap_or("-"));
    Ok(())
}

/// Recalls memories for a query, as lines or as the API's JSON.
async fn search(
    backend: &Backend,
    query: String,
    k: usize,
    mode: String,
    include_archived: bool,
    json: bool,
) -> Result<(), Failure> {
    use reqwest::Method;
    let mode = parse_mode(&mode)?;
    let response = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(
                    Method::POST,
                    "/v1/memories/search",
                    Some(RemoteBody::Json(json!({
                        "query": query, "k": k, "mode": mode_name(mode),
                        "include_archived": include_archived,
                    }))),
                )
                .await?,
        )?,
        Backend::Embedded { engine, user, .. } => {
            let request = RecallRequest {
                query,
                k: Some(k),
                include_archived,
                mode,
                decay: true,
                ..RecallRequest::default()
            };
            to_json(
                &engine
                    .recall(*user, request)
                    .await
                    .map_err(memory_failure)?,
            )?
        }
    };
    if json {
        println!("{response}");
    } else {
        for result in response["results"].as_array().into_iter().flatten() {
            let memory = &result["memory"];
            println!(
                "{:.4}  {:<10} {}",
                result["score"].as_f64().unwrap_or(0.0),
                memory["kind"].as_str().unwrap_or("-"),
                memory["content"].as_str().unwrap_or("").replace('\n', " ")
            );
        }
    }
    Ok(())
}

/// Lists the forgotten memories that can still be restored.
async fn forgotten(backend: &Backend) -> Result<(), Failure> {
    use reqwest::Method;
    let forgotten = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(Method::GET, "/v1/memories/forgotten", None)
                .await?,
        )?["forgotten"]
            .clone(),
        Backend::Embedded { engine, user, .. } => {
            to_json(&engine.forgotten(*user, 500).await.map_err(memory_failure)?)?
        }
    };
    for item in forgotten.as_array().into_iter().flatten() {
        let memory = &item["memory"];
        println!(
            "{}  forgotten {}  restorable until {}  {}",
            memory["id"].as_str().unwrap_or("-"),
            item["forgotten_at"].as_str().unwrap_or("-"),
            item["purge_after"].as_str().unwrap_or("-"),
            memory["content"].as_str().unwrap_or("").replace('\n', " ")
        );
    }
    Ok(())
}

/// Brings a forgotten memory back.
async fn restore(backend: &Backend, id: String) -> Result<(), Failure> {
    use reqwest::Method;
    let id: mnemo::store::MemoryId = id
        .parse()
        .map_err(|_| Failure::usage(format!("{id:?} is not a memory id")))?;
    let memory = match backend {
        Backend::Remote { .. } => parse_json(
            &backend
                .remote(
                    Method::POST,
                    &format!("/v1/memories/forgotten/{id}/restore"),
                    None,
                )
                .await?,
        )?,
        Backend::Embedded { engine, user, .. } => to_json(
            &engine
                .restore_forgotten(*user, id)
                .await
                .map_err(memory_failure)?,
        )?,
    };
    print_memories(std::slice::from_ref(&memory));
    Ok(())
}

/// Lists memories, newest first.
async fn list(
    backend: &Backend,
    limit: i64,
    kinds: Option<String>,
    include_archived: bool,
    json: bool,
) -> Result<(), Failure> {
    use reqwest::Method;
    let memories = match backend {
        Backend::Remote { .. } => {
            let mut path =
                format!("/v1/memories?limit={limit}&include_archived={include_archived}");
            if let Some(kinds) = &kinds {
                path.push_str(&format!("&kinds={kinds}"));
            }
            parse_json(&backend.remote(Method::GET, &path, None).await?)?["memories"].clone()
        }
        Backend::Embedded { engine, user, .. } => {
            let kinds = kinds
                .as_deref()
                .map(|text| {
                    text.split(',')
                        .map(|kind| parse_kind(kind.trim()))
                        .collect()
                })
                .transpose()?;
            let filter = MemoryFilter {
                kinds,
                include_archived,
                ..MemoryFilter::default()
            };
            to_json(
                &engine
                    .list(*user, &filter, limit.clamp(1, 10_000), None)
                    .await
                    .map_err(memory_failure)?,
            )?
        }
    };
    if json {
        println!("{memories}");
    } else {
        print_memories(memories.as_array().map(Vec::as_slice).unwrap_or_default());
    }
    Ok(())
}

/// Writes every memory as JSON lines to a file or stdout.
async fn export(backend: &Backend, output: Option<PathBuf>) -> Result<(), Failure> {
    use reqwest::Method;
    let lines = match backend {
        Backend::Remote { .. } => {
            backend
                .remote(Method::GET, "/v1/memories/export", None)
                .await?
        }
        Backend::Embedded { engine, user, .. } => {
            let mut text = String::new();
            for memory in engine.export(*user).await.map_err(memory_failure)? {
                let line = serde_json::to_string(&PortableMemory::from(&memory))
                    .map_err(|e| Failure::other(e.to_string()))?;
                text.push_str(&line);
                text.push('\n');
            }
            text
        }
    };
    match output {
        Some(path) => std::fs::write(&path, lines)
            .map_err(|e| Failure::other(format!("writing {}: {e}", path.display())))?,
        None => std::io::stdout()
            .write_all(lines.as_bytes())
            .map_err(|e| Failure::other(e.to_string()))?,
    }
    Ok(())
}

/// Imports JSON lines in pieces, with a progress bar.
async fn import(backend: &Backend, path: PathBuf) -> Result<(), Failure> {
    use reqwest::Method;
    let mut text = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Failure::usage(format!("reading stdin: {e}")))?;
    } else {
        text = std::fs::read_to_string(&path)
            .map_err(|e| Failure::usage(format!("reading {}: {e}", path.display())))?;
    }
    // In pieces, with a progress bar: a big file neither meets the server's body limit
    // nor sits silent.
    let pieces = import_pieces(&text);
    let bar = indicatif::ProgressBar::new(text.lines().count() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "importing {bar:40} {pos}/{len} lines ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut report = json!({ "imported": 0, "skipped": 0, "errors": [] });
    for (first_line, piece) in pieces {
        let part = match backend {
            Backend::Remote { .. } => parse_json(
                &backend
                    .remote(
                        Method::POST,
                        "/v1/memories/import",
                        Some(RemoteBody::Text(piece.to_string())),
                    )
                    .await?,
            )?,
            Backend::Embedded { engine, user, .. } => {
                to_json(&engine.import(*user, piece).await.map_err(memory_failure)?)?
            }
        };
        merge_import_report(&mut report, &part, first_line);
        bar.inc(piece.lines().count() as u64);
    }
    bar.finish_and_clear();
    println!("{report}");
    if report["errors"]
        .as_array()
        .is_some_and(|errors| !errors.is_empty())
    {
        return Err(Failure::usage(
            "some lines could not be imported (see errors above)",
        ));
    }
    Ok(())
}

/// Lines of one import request at most, and its size at most (under the default body limit).
const IMPORT_PIECE_LINES: usize = 1000;
const IMPORT_PIECE_BYTES: usize = 1024 * 1024;

/// The JSON-lines text cut into pieces of whole lines, each with the number of its first line.
fn import_pieces(text: &str) -> Vec<(usize, &str)> {
    let mut pieces = Vec::new();
    let (mut start, mut lines, mut first_line) = (0usize, 0usize, 1usize);
    let mut offset = 0usize;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if lines > 0
            && (lines == IMPORT_PIECE_LINES || offset - start + line.len() > IMPORT_PIECE_BYTES)
        {
            pieces.push((first_line, &text[start..offset]));
            start = offset;
            lines = 0;
            first_line = index + 1;
        }
        offset += line.len();
        lines += 1;
    }
    if start < text.len() {
        pieces.push((first_line, &text[start..]));
    }
    pieces
}

/// Adds a piece's import report to the whole file's, its error lines counted from the file's
/// first line.
fn merge_import_report(report: &mut Value, part: &Value, first_line: usize) {
    for field in ["imported", "skipped"] {
        let sum = report[field].as_u64().unwrap_or(0) + part[field].as_u64().unwrap_or(0);
        report[field] = json!(sum);
    }
    if let (Some(errors), Some(found)) =
        (report["errors"].as_array_mut(), part["errors"].as_array())
    {
        for error in found {
            let mut error = error.clone();
            if let Some(line) = error["line"].as_u64() {
                error["line"] = json!(line + first_line as u64 - 1);
            }
            errors.push(error);
        }
    }
}

fn mode_name(mode: RecallMode) -> &'static str {
    match mode {
        RecallMode::Hybrid => "hybrid",
        RecallMode::Vector => "vector",
        RecallMode::Keyword => "keyword",
    }
}

/// `mnemo reindex`: rebuilds both local indexes from SQL without re-embedding.
pub async fn reindex(settings: &Settings) -> Result<(), Failure> {
    let (engine, store, shutdown, _lock) = open_embedded(settings).await?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "reindexing {bar:40} {pos}/{len} memories ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let result = engine
        .indexer()
        .rebuild(|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .await;
    bar.finish_and_clear();
    shutdown.cancel();
    engine.close(Duration::from_secs(10)).await;
    store.close().await;
    let count = result.map_err(|error| Failure::other(error.to_string()))?;
    eprintln!(
        "reindexed {count} memories in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `mnemo check`: the indexes against SQL; a difference is a failure (exit 1).
pub async fn check(settings: &Settings) -> Result<(), Failure> {
    let (engine, store, shutdown, _lock) = open_embedded(settings).await?;
    let result = engine.indexer().verify().await;
    shutdown.cancel();
    engine.close(Duration::from_secs(10)).await;
    store.close().await;
    let report = result.map_err(|error| Failure::other(error.to_string()))?;
    println!(
        "{} memories of {} users; vector index: {} missing, {} extra; keyword index: {} missing, {} extra",
        report.memories,
        report.users,
        report.vector_missing,
        report.vector_extra,
        report.keyword_missing,
        report.keyword_extra
    );
    if report.is_consistent() {
        Ok(())
    } else {
        Err(Failure::other(
            "the indexes differ from SQL: run `mnemo reindex` to rebuild them",
        ))
    }
}

#[cfg(test)]
mod import_tests {
    use super::*;

    #[test]
    fn pieces_are_whole_lines_and_error_lines_count_from_the_file() {
        let text: String = (1..=2500).map(|i| format!("{{\"n\": {i}}}\n")).collect();
        let pieces = import_pieces(&text);
        assert_eq!(
            pieces.iter().map(|(first, _)| *first).collect::<Vec<_>>(),
            [1, 1001, 2001]
        );
        assert_eq!(pieces.iter().map(|(_, p)| *p).collect::<String>(), text);
        assert!(pieces[1].1.starts_with("{\"n\": 1001}"));
        let mut report = json!({ "imported": 0, "skipped": 0, "errors": [] });
        merge_import_report(
            &mut report,
            &json!({ "imported": 998, "skipped": 1, "errors": [{ "line": 5, "message": "bad" }] }),
            1001,
        );
        merge_import_report(
            &mut report,
            &json!({ "imported": 2, "skipped": 0, "errors": [] }),
            2001,
        );
        assert_eq!(report["imported"], 1000);
        assert_eq!(report["skipped"], 1);
        assert_eq!(report["errors"][0]["line"], 1005);
        // A line without a newline at the end, and big lines cut by size.
        let big = format!("{}\n{}", "x".repeat(700_000), "y".repeat(700_000));
        assert_eq!(import_pieces(&big).len(), 2);
    }
}
