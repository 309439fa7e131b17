//! The `mnemo` command line. Exit codes: 0 success, 2 bad usage or input, 1 other failure;
//! errors go to stderr in one line, results to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

mod chat;
mod connect;
mod import_chat;
mod ingest;
mod mcp;
mod memory;
mod research;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use mnemo::auth::{AuthError, keys, validate_user_name};
use mnemo::config::{Overrides, Settings};
use mnemo::error::{ErrorKind, HasKind};
use mnemo::startup;
use mnemo::store::{self, StoreError};

#[derive(Debug, Parser)]
#[command(name = "mnemo", version, about = "A research assistant that remembers")]
struct Cli {
    /// Directory for the SQLite file, vector shard and keyword index (default ./data).
    #[arg(long, global = true, env = "MNEMO__DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Settings file (default ./mnemo.toml when present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(flatten)]
    target: connect::Target,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server.
    Serve {
        /// Listen address, HOST:PORT (default 127.0.0.1:8080; port 0 picks a free port).
        #[arg(long)]
        addr: Option<String>,
        /// Serve a single local user without keys (loopback addresses only).
        #[arg(long)]
        dev: bool,
    },
    /// Manage users and their API keys.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Add, search, list, export and import a user's memories.
    Memory {
        #[command(subcommand)]
        command: memory::MemoryCommand,
    },
    /// Add documents (files, or directories recursively: .md .markdown .txt .html .htm .pdf)
    /// for local research; prints each document's id and chunk count.
    Ingest {
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Import a past conversation as a thread of your history, with its memories: mnemo's
    /// JSON (`{"title", "messages": [{"role", "content", "author"?, "created_at"?}]}`) or a
    /// ChatGPT export (`conversations.json`). Prints each new thread's id.
    ImportChat {
        /// The file to read.
        path: PathBuf,
    },
    /// Chat in the terminal: with --server/--key, the server holding the data directory, or
    /// an embedded one; as --user (default "dev").
    Chat {
        /// Continue an existing thread (its id).
        #[arg(long)]
        thread: Option<String>,
    },
    /// MCP over stdio for desktop clients (Claude Desktop, Cursor): relays to the `/mcp` of
    /// the server the routing picks (same as chat), as that route's user.
    Mcp,
    /// Run one deep research and stream its report (same routing and --user as chat).
    Research(research::ResearchArgs),
    /// Benchmarks that print numbers.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Memory-quality evaluation on public benchmarks. LoCoMo (Maharana et al., ACL 2024) is
    /// the snap-research/locomo repository's data/locomo10.json (CC BY-NC 4.0, not shipped);
    /// this workplace keeps a dev split at ../shared/eval/locomo-dev.json.
    Eval {
        #[command(subcommand)]
        command: EvalCommand,
    },
    /// Rebuild the vector and keyword indexes from SQL (no re-embedding). Stop the server first.
    Reindex,
    /// Compare both indexes with SQL (after applying the memory log, as a start does): every
    /// memory indexed, nothing else. Exits 1 on a difference. Stop the server first.
    Check,
    /// Print the OpenAPI document of the HTTP API (what `/openapi.json` serves), for client
    /// generators; the web app's types are generated from it.
    Openapi,
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Evidence recall@k and NDCG@k on LoCoMo: each conversation is ingested as one user's
    /// history through the product's own write and recall paths. The data file (locomo10.json
    /// from github.com/snap-research/locomo, or a split of it) is read from --data, never
    /// copied.
    Locomo(EvalArgs),
    /// The same on a LongMemEval-format file.
    Longmemeval(EvalArgs),
    /// The same on BEAM (ICLR 2026; e.g. ../shared/eval/beam-100k.json): each conversation
    /// one user's history, sessions by time anchor, recall per ability (abstention questions,
    /// which have no evidence, are left out of recall).
    Beam(EvalArgs),
    /// Recall@k and NDCG@10 per query type on the hand-written Chinese set (eval/zh): the
    /// memories written for one fresh user as POST /v1/memories does, every query recalled
    /// as memories/search does (hybrid, shipped settings), with BM25-only and vector-only rows
    /// beside it. The embedder is the configured one (embedder.model_dir).
    Zh(ZhEvalArgs),
    /// Every decision about meaning on the hand-written sets of eval/relevance (English and
    /// Chinese): recall hits@3 and empty answers to foreign questions, forget precision and
    /// recall, duplicates, research sources; for each --model-dir (default: the configured
    /// embedder).
    Relevance(RelevanceEvalArgs),
}

#[derive(Debug, clap::Args)]
struct RelevanceEvalArgs {
    /// The directory holding the sets (en.json, zh.json).
    #[arg(long, default_value = "eval/relevance")]
    data: PathBuf,
    /// Results directory (results.json, results.md).
    #[arg(long, default_value = "eval/results/relevance")]
    out: PathBuf,
    /// An embedding model directory to measure (repeat for several).
    #[arg(long = "model-dir")]
    model_dirs: Vec<PathBuf>,
    /// Also write every (query, memory) pair's relevance features here (JSON lines), the
    /// data eval/relevance/fit.py fits on.
    #[arg(long)]
    features: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct ZhEvalArgs {
    /// The directory holding memories.json and queries.json.
    #[arg(long, default_value = "eval/zh")]
    data: PathBuf,
    /// Results directory (results.json, results.md, per_query.jsonl).
    #[arg(long, default_value = "eval/results/zh")]
    out: PathBuf,
    /// Only the first N memories, and the queries whose relevant memories are all among them.
    #[arg(long)]
    limit_memories: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct EvalArgs {
    /// The dataset JSON file, e.g. ../shared/eval/locomo-dev.json.
    #[arg(long)]
    data: PathBuf,
    /// Results directory (results.json, results.md, recall.svg).
    #[arg(long, default_value = "eval/results/latest")]
    out: PathBuf,
    /// Only these memory units / retrieval variants (e.g. dated,hybrid).
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// Only the first N conversations.
    #[arg(long)]
    limit_conversations: Option<usize>,
    /// Also answer every question from the recalled memories and score the answers with an
    /// LLM judge and token F1 (needs an LLM configured).
    #[arg(long)]
    answer: bool,
    /// The memory unit answered from: raw, dated (default) or window.
    #[arg(long, default_value = "dated")]
    answer_unit: String,
    /// Also write the relevance features of the product's results without gate or tail
    /// (its own questions and another conversation's) here, for eval/relevance/fit.py.
    #[arg(long)]
    features: Option<PathBuf>,
    /// Relevance operating points tried beside the settings' for the product's memories, each
    /// `gate/tail` (probabilities, `memory.relevance`); `none` for no sweep. Default: a grid
    /// around the shipped values.
    #[arg(long, value_delimiter = ',')]
    gate_sweep: Option<Vec<String>>,
    /// One more row beside the product's, recalled with changed memory settings (no new
    /// ingest): `KEY=VALUE`, a `memory.` setting as in the config file, several joined by
    /// `;` (e.g. `one_per_source=false` or `assistant_weight=0.7;relevance.rank_weight=0`).
    /// Repeat for more rows.
    #[arg(long)]
    ablate: Vec<String>,
    /// Keep the memories' vectors in this file and take them from it on the next run (for
    /// runs that change only recall; ingest times are then not embedding times).
    #[arg(long)]
    vector_cache: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Recall latency, ingest, reindex and index lag at scale on the embedded defaults.
    Recall {
        /// Memories in the whole store.
        #[arg(long, default_value_t = 1_000_000)]
        total: usize,
        /// Memories of the one big user whose recall is timed.
        #[arg(long, default_value_t = 100_000)]
        user_memories: usize,
        /// Users the rest of the memories are spread over.
        #[arg(long, default_value_t = 1000)]
        users: usize,
        /// Recall queries timed.
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// Skip building HNSW (faster, slower searches).
        #[arg(long)]
        no_optimize: bool,
        /// Where the big user's vectors come from: the local model's embeddings of their
        /// texts, or bag-of-words vectors (random word directions: much harder for HNSW).
        #[arg(long, value_enum, default_value_t = crate::tools::bench::UserVectors::Model)]
        user_vectors: crate::tools::bench::UserVectors,
    },
    /// Memories a second into the server through its API (one client, concurrent clients, a
    /// bulk import) against the model's own limit, and recall latency during the import.
    Ingest {
        /// Memories posted one at a time by one client.
        #[arg(long, default_value_t = 300)]
        sequential: usize,
        /// Memories posted by the concurrent clients together.
        #[arg(long, default_value_t = 800)]
        concurrent: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Memories in the bulk import.
        #[arg(long, default_value_t = 3000)]
        bulk: usize,
    },
    /// Several replicas on one PostgreSQL and one Qdrant server or cluster: how long a memory
    /// written through one takes to be recalled through the others, and recall latency through
    /// each; on a cluster it starts itself, recall latency again with one peer down.
    Replicas {
        /// The PostgreSQL database the replicas share (postgres://…).
        #[arg(long)]
        database_url: String,
        /// The Qdrant server they share (its gRPC URL, e.g. http://127.0.0.1:6334; peers of a
        /// cluster separated by commas).
        #[arg(
            long,
            required_unless_present = "qdrant_bin",
            conflicts_with = "qdrant_bin"
        )]
        qdrant_url: Option<String>,
        /// Start a cluster of `--qdrant-peers` peers of this Qdrant server binary on loopback
        /// instead (one shard per peer, two copies of each), and time recall again with its
        /// first peer killed.
        #[arg(long)]
        qdrant_bin: Option<PathBuf>,
        /// Peers of the cluster `--qdrant-bin` starts (at least 2).
        #[arg(long, default_value_t = 3)]
        qdrant_peers: usize,
        /// Replicas started (at least 2).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Memories written (round robin), each looked for through the other replicas.
        #[arg(long, default_value_t = 100)]
        writes: usize,
        /// Recalls timed through each replica.
        #[arg(long, default_value_t = 300)]
        queries: usize,
        /// Memories of 1,000 other users written to SQL first (a deployment's history); then
        /// one more replica is started at the end and its time until it serves is measured.
        #[arg(long, default_value_t = 0)]
        memories: usize,
    },
    /// The extraction ceiling: hostile documents and random markup through the extraction
    /// worker, with what each cost it (peak memory, CPU) or why it was refused.
    Extract {
        /// Random markup soups run besides the hostile documents.
        #[arg(long, default_value_t = 64)]
        soups: usize,
        /// Seed of the soups.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Time from the end of a turn to its memory being recallable, and writer throughput.
    Write {
        /// Chat turns whose memories are timed from turn end to recallable.
        #[arg(long, default_value_t = 100)]
        turns: usize,
        /// Memory-writer jobs for the throughput measurement.
        #[arg(long, default_value_t = 500)]
        jobs: usize,
        /// An OpenAI-compatible endpoint for the LLM path (chat and extraction).
        #[arg(long)]
        llm_url: Option<String>,
        /// The model at --llm-url.
        #[arg(long)]
        llm_model: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Create a user and print a new API key (shown once) on stdout.
    Add {
        /// 1-64 letters, digits, '.', '_', '-' or '@'.
        name: String,
        /// Make the user an administrator (manages users and keys in the web app).
        #[arg(long)]
        admin: bool,
        /// Read a password for web sign-in from the first line of stdin.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a user's password for web sign-in, read from the first line of stdin (ends a
    /// lock after failed sign-ins).
    Password {
        /// The user's name.
        name: String,
    },
    /// List users and how many active keys each has.
    List,
    /// Revoke every API key of a user (the user and their memories stay).
    Revoke {
        /// The user's name.
        name: String,
    },
    /// Issue a new API key for an existing user (shown once) and revoke their other keys,
    /// unless --keep-old.
    Key {
        /// The user's name.
        name: String,
        /// Keep the user's existing keys working beside the new one.
        #[arg(long)]
        keep_old: bool,
    },
    /// List a user's API keys (prefix, created, revoked), newest first.
    Keys {
        /// The user's name.
        name: String,
    },
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    fn other(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        match error.kind() {
            ErrorKind::BadRequest | ErrorKind::NotFound | ErrorKind::Conflict => {
                Failure::usage(error.to_string())
            }
            _ => Failure::other(error.to_string()),
        }
    }
}

impl From<startup::StartupError> for Failure {
    fn from(error: startup::StartupError) -> Self {
        match error {
            startup::StartupError::Config(_) | startup::StartupError::Refused(_) => {
                Failure::usage(error.to_string())
            }
            startup::StartupError::Store(error) => error.into(),
            other => Failure::other(other.to_string()),
        }
    }
}

pub fn main() -> ExitCode {
    // Everything this process creates (the database, indexes, lock and export files) is its
    // owner's alone: files 0600, directories 0700.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let mut overrides = Overrides {
        config_file: cli.config,
        data_dir: cli.data_dir,
        ..Overrides::default()
    };
    match cli.command {
        Command::Serve { addr, dev } => {
            overrides.addr = addr;
            overrides.dev = dev;
            let settings = Settings::load(&overrides).map_err(|e| Failure::usage(e.to_string()))?;
            serve(settings).await
        }
        Command::User { command } => user(command, &overrides).await,
        Command::Memory { command } => {
            let settings = load_quiet(&overrides)?;
            memory::run(&settings, cli.target, command).await
        }
        Command::ImportChat { path } => {
            let settings = load_quiet(&overrides)?;
            import_chat::run(&settings, cli.target, &path).await
        }
        Command::Ingest { paths } => {
            let settings = load_quiet(&overrides)?;
            ingest::run(&settings, cli.target, paths).await
        }
        Command::Chat { thread } => {
            let settings = load_quiet(&overrides)?;
            chat::run(settings, &cli.target, thread).await
        }
        Command::Mcp => {
            let settings = load_quiet(&overrides)?;
            mcp::run(settings, &cli.target).await
        }
        Command::Research(args) => {
            let settings = load_quiet(&overrides)?;
            research::run(settings, &cli.target, args).await
        }
        Command::Bench { command } => bench(command, load_quiet(&overrides)?).await,
        Command::Eval { command } => eval(command, &overrides).await,
        Command::Reindex => {
            let settings = load_quiet(&overrides)?;
            memory::reindex(&settings).await
        }
        Command::Openapi => {
            let document = serde_json::to_string_pretty(&mnemo::http::openapi())
                .map_err(|error| Failure::other(format!("the OpenAPI document: {error}")))?;
            println!("{document}");
            Ok(())
        }
        Command::Check => {
            let settings = load_quiet(&overrides)?;
            memory::check(&settings).await
        }
    }
}

/// `mnemo bench …`: each benchmark's options from its flags and the settings; its figures on
/// stdout.
async fn bench(command: BenchCommand, settings: Settings) -> Result<(), Failure> {
    match command {
        BenchCommand::Ingest {
            sequential,
            concurrent,
            clients,
            bulk,
        } => {
            let options = crate::tools::bench_ingest::IngestBenchOptions {
                data_dir: settings.data_dir.join("bench-ingest"),
                model_dir: Some(settings.embedder.model_dir.clone()),
                sequential,
                concurrent,
                clients,
                bulk,
            };
            crate::tools::bench_ingest::run_ingest_bench(options, &mut std::io::stdout())
                .await
                .map_err(tool_failure)
        }
        BenchCommand::Extract { soups, seed } => {
            let options = crate::tools::bench_extract::ExtractBenchOptions {
                settings: settings.extract.clone(),
                soups,
                seed,
            };
            crate::tools::bench_extract::run_extract_bench(options, &mut std::io::stdout())
                .await
                .map_err(tool_failure)
        }
        BenchCommand::Replicas {
            database_url,
            qdrant_url,
            qdrant_bin,
            qdrant_peers,
            replicas,
            writes,
            queries,
            memories,
        } => {
            let qdrant = match (qdrant_url, qdrant_bin) {
                (Some(url), _) => crate::tools::bench_replicas::Qdrant::Server(url),
                (None, Some(binary)) => crate::tools::bench_replicas::Qdrant::Cluster {
                    binary,
                    peers: qdrant_peers,
                },
                (None, None) => {
                    return Err(Failure::other("give --qdrant-url or --qdrant-bin"));
                }
            };
            let options = crate::tools::bench_replicas::ReplicaBenchOptions {
                data_dir: settings.data_dir.join("bench-replicas"),
                model_dir: Some(settings.embedder.model_dir.clone()),
                database_url,
                qdrant,
                replicas,
                writes,
                queries,
                memories,
            };
            crate::tools::bench_replicas::run_replica_bench(options, &mut std::io::stdout())
                .await
                .map_err(tool_failure)
        }
        BenchCommand::Write {
            turns,
            jobs,
            llm_url,
            llm_model,
        } => {
            let options = crate::tools::bench_write::WriteBenchOptions {
                data_dir: settings.data_dir.join("bench-write"),
                model_dir: Some(settings.embedder.model_dir.clone()),
                turns,
                jobs,
                llm_url,
                llm_model,
            };
            crate::tools::bench_write::run_write_bench(options, &mut std::io::stdout())
                .await
                .map_err(tool_failure)
        }
        BenchCommand::Recall {
            total,
            user_memories,
            users,
            queries,
            no_optimize,
            user_vectors,
        } => {
            let options = crate::tools::bench::RecallBenchOptions {
                data_dir: settings.data_dir.join("bench-recall"),
                total,
                user_memories,
                users,
                queries,
                model_dir: Some(settings.embedder.model_dir.clone()),
                reindex_memories: user_memories.min(100_000),
                optimize: !no_optimize,
                search_ef: settings.qdrant.search_ef,
                tenant_shard_points: settings.qdrant.tenant_shard_points,
                user_vectors,
                ..crate::tools::bench::RecallBenchOptions::default()
            };
            crate::tools::bench::run_recall_bench(options, &mut std::io::stdout())
                .await
                .map_err(tool_failure)
        }
    }
}

/// A benchmark's or an evaluation's failure, with its causes.
fn tool_failure(error: anyhow::Error) -> Failure {
    Failure::other(format!("{error:#}"))
}

/// `mnemo eval locomo|longmemeval|beam|zh|relevance`: the run, its headline on stderr and where
/// its files went.
/// The memory settings of one `--ablate` row: the configuration loaded again with each
/// `KEY=VALUE` as its `MNEMO__MEMORY__KEY` variable (so it is checked like any setting).
fn ablation(
    changes: &str,
    overrides: &Overrides,
    environment: impl IntoIterator<Item = (String, String)>,
) -> Result<crate::tools::eval::Ablation, Failure> {
    let mut variables: Vec<(String, String)> = environment.into_iter().collect();
    let mut label = Vec::new();
    for change in changes.split(';').map(str::trim).filter(|c| !c.is_empty()) {
        let Some((key, value)) = change.split_once('=') else {
            return Err(Failure::usage(format!(
                "--ablate {change:?}: expected KEY=VALUE"
            )));
        };
        let key = key.trim().trim_start_matches("memory.");
        if key.is_empty() {
            return Err(Failure::usage(format!(
                "--ablate {change:?}: no setting named"
            )));
        }
        let variable = format!("MNEMO__MEMORY__{}", key.replace('.', "__").to_uppercase());
        variables.push((variable, value.trim().to_string()));
        label.push(format!("{key}={}", value.trim()));
    }
    if label.is_empty() {
        return Err(Failure::usage("--ablate needs at least one KEY=VALUE"));
    }
    let settings = Settings::load_from(overrides, variables)
        .map_err(|error| Failure::usage(format!("--ablate {changes:?}: {error}")))?;
    Ok(crate::tools::eval::Ablation {
        label: label.join(" "),
        memory: settings.memory,
    })
}

async fn eval(command: EvalCommand, overrides: &Overrides) -> Result<(), Failure> {
    let settings = load_quiet(overrides)?;
    let (args, dataset) = match command {
        EvalCommand::Locomo(args) => (args, "locomo"),
        EvalCommand::Longmemeval(args) => (args, "longmemeval"),
        EvalCommand::Beam(args) => (args, "beam"),
        EvalCommand::Zh(args) => return eval_zh(args, settings).await,
        EvalCommand::Relevance(args) => return eval_relevance(args, settings).await,
    };
    if !args.data.exists() {
        return Err(Failure::usage(format!(
            "no dataset at {}",
            args.data.display()
        )));
    }
    let mut options = crate::tools::eval::EvalOptions::new(args.data, args.out, settings);
    options.variants = args.variants;
    options.limit_conversations = args.limit_conversations;
    options.answer = args.answer;
    options.features = args.features;
    options.vector_cache = args.vector_cache;
    options.ablations = args
        .ablate
        .iter()
        .map(|changes| ablation(changes, overrides, std::env::vars()))
        .collect::<Result<_, _>>()?;
    if let Some(points) = args.gate_sweep {
        options.gate_sweep = points
            .iter()
            .filter(|point| !point.trim().eq_ignore_ascii_case("none"))
            .map(|point| point.parse())
            .collect::<Result<_, String>>()
            .map_err(|error| Failure::usage(format!("--gate-sweep {error}")))?;
    }
    options.answer_unit = match args.answer_unit.as_str() {
        "raw" => crate::tools::eval::MemoryUnit::Raw,
        "dated" => crate::tools::eval::MemoryUnit::Dated,
        "window" => crate::tools::eval::MemoryUnit::Window,
        other => {
            return Err(Failure::usage(format!(
                "--answer-unit {other:?}: use raw, dated or window"
            )));
        }
    };
    let summary = match dataset {
        "longmemeval" => crate::tools::eval::run_longmemeval(options).await,
        "beam" => crate::tools::eval::run_beam(options).await,
        _ => crate::tools::eval::run_locomo(options).await,
    };
    let summary = summary.map_err(tool_failure)?;
    eprintln!("{}", summary.headline());
    eprintln!(
        "files: {}, {}, {}",
        summary.results_json.display(),
        summary.results_md.display(),
        summary.recall_svg.display()
    );
    Ok(())
}

/// `mnemo user …`: straight on the database the settings name, never through a server.
async fn user(command: UserCommand, overrides: &Overrides) -> Result<(), Failure> {
    let settings = Settings::load(overrides).map_err(|e| Failure::usage(e.to_string()))?;
    std::fs::create_dir_all(&settings.data_dir)
        .map_err(|e| Failure::other(format!("creating the data directory: {e}")))?;
    let store = store::connect(
        &settings.database_url(),
        settings.database.max_connections,
        settings.database.acquire_timeout(),
    )
    .await?;
    let result = user_command(store.as_ref(), command).await;
    store.close().await;
    result
}

/// `mnemo eval zh`: the table on stdout, where the files went on stderr.
async fn eval_zh(args: ZhEvalArgs, settings: Settings) -> Result<(), Failure> {
    if !args.data.join("memories.json").exists() {
        return Err(Failure::usage(format!(
            "no zh eval set at {} (run from the repository root or pass --data)",
            args.data.display()
        )));
    }
    let options = crate::tools::eval::zh::ZhOptions {
        data: args.data,
        out_dir: args.out,
        settings,
        limit_memories: args.limit_memories,
    };
    let summary = crate::tools::eval::zh::run_zh(options)
        .await
        .map_err(|error| Failure::other(format!("{error:#}")))?;
    print!("{}", summary.table);
    eprintln!("{}", summary.report.headline());
    eprintln!(
        "files: {}, {}, {}",
        summary.results_json.display(),
        summary.results_md.display(),
        summary.per_query.display()
    );
    Ok(())
}

async fn eval_relevance(args: RelevanceEvalArgs, settings: Settings) -> Result<(), Failure> {
    if !args.data.is_dir() {
        return Err(Failure::usage(format!(
            "no relevance sets at {} (run from the repository root or pass --data)",
            args.data.display()
        )));
    }
    let options = crate::tools::eval::relevance::RelevanceOptions {
        data: args.data,
        out_dir: args.out,
        settings,
        model_dirs: args.model_dirs,
        features: args.features,
    };
    let summary = crate::tools::eval::relevance::run_relevance(options)
        .await
        .map_err(|error| Failure::other(format!("{error:#}")))?;
    print!("{}", summary.table);
    Ok(())
}

/// Settings for a one-shot command, with warnings (not info chatter) on stderr.
fn load_quiet(overrides: &Overrides) -> Result<Settings, Failure> {
    let settings = Settings::load(overrides).map_err(|e| Failure::usage(e.to_string()))?;
    mnemo::telemetry::init("warn", false, false, std::io::stderr);
    Ok(settings)
}

async fn serve(settings: Settings) -> Result<(), Failure> {
    // Before binding: a second server on the same directory would otherwise fail on the port.
    if let Some(holder) = mnemo::datadir::probe(&settings.data_dir) {
        let error = mnemo::datadir::LockError::Held {
            dir: settings.data_dir.clone(),
            holder,
        };
        return Err(Failure::other(format!(
            "{error}; stop it, or serve another --data-dir"
        )));
    }
    mnemo::telemetry::init(
        &settings.log.level,
        settings.log.format == mnemo::config::LogFormat::Json,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::io::stderr,
    );
    let shutdown = CancellationToken::new();
    let listener = startup::bind(&settings).await.map_err(|error| {
        Failure::other(format!(
            "cannot listen on {}: {error}",
            settings.server.addr
        ))
    })?;
    let dev = settings.server.dev;
    let state = startup::build_state(settings, shutdown.clone()).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::other(e.to_string()))?;
    if let Err(error) = state.publish_address(addr) {
        tracing::warn!(%error, "cannot record the address in the data directory's lock file");
    }
    if dev {
        eprintln!(
            "\n!!! DEV MODE: every request without a token is served as the local user \"dev\".\n\
             !!! Never expose this server; --dev is refused on non-loopback addresses.\n"
        );
        tracing::warn!("dev mode: requests without credentials act as the local dev user");
    }
    if !state.models.configured() {
        tracing::warn!(
            "no model configured (llm.base_url + llm.model): chat answers from memory only, \
             research is extractive"
        );
    } else if state.settings.chat_model().is_none() {
        tracing::warn!("no model for the chat role: chat answers from memory only");
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "mnemo listening on http://{addr}");
    for (label, value) in startup::describe(&state) {
        let _ = writeln!(out, "  {label:<10} {value}");
    }
    let _ = out.flush();
    drop(out);
    tokio::spawn(startup::shutdown_on_signal(shutdown));
    mnemo::http::serve(listener, state)
        .await
        .map_err(|error| Failure::other(format!("serving: {error}")))
}

async fn user_command(store: &dyn store::Store, command: UserCommand) -> Result<(), Failure> {
    match command {
        UserCommand::Add {
            name,
            admin,
            password_stdin,
        } => {
            validate_user_name(&name).map_err(Failure::usage)?;
            let password = if password_stdin {
                Some(read_password_line()?)
            } else {
                None
            };
            let user = mnemo::auth::create_account(store, &name, password.as_ref(), admin)
                .await
                .map_err(|error| match error {
                    AuthError::Store(StoreError::Conflict(_)) => Failure::usage(format!(
                        "user {name} already exists; `mnemo user key {name}` issues a new key"
                    )),
                    AuthError::BadInput(message) => Failure::usage(message),
                    other => Failure::other(other.to_string()),
                })?;
            let key = keys::generate();
            store
                .accounts()
                .add_api_key(user.id, &key.hash, &key.prefix)
                .await?;
            let role = if admin { "administrator" } else { "user" };
            let password = if password_stdin {
                " with a password for web sign-in"
            } else {
                ""
            };
            eprintln!("created {role} {name}{password}; the key below is shown only once");
            println!("{}", key.plaintext);
        }
        UserCommand::Password { name } => {
            let user = store
                .accounts()
                .user_by_name(&name)
                .await?
                .ok_or_else(|| Failure::usage(format!("no user named {name}")))?;
            let password = read_password_line()?;
            mnemo::auth::validate_new_password(&password)
                .map_err(|error| Failure::usage(error.to_string()))?;
            let hash = mnemo::auth::password::hash(&password)
                .await
                .map_err(|error| Failure::other(error.to_string()))?;
            store
                .accounts()
                .update_user(
                    user.id,
                    store::UserUpdate {
                        password_hash: Some(hash),
                        ..Default::default()
                    },
                )
                .await?;
            eprintln!("password of {name} set");
        }
        UserCommand::List => {
            let users = store.accounts().list_users().await?;
            println!(
                "{:<40} {:<5} {:>11}  {:<24} flags",
                "name", "kind", "active_keys", "created"
            );
            for user in users {
                let mut flags = Vec::new();
                if user.is_admin {
                    flags.push("admin");
                }
                if user.has_password {
                    flags.push("password");
                }
                if user.disabled_at.is_some() {
                    flags.push("disabled");
                }
                println!(
                    "{:<40} {:<5} {:>11}  {:<24} {}",
                    user.name,
                    user.kind.as_str(),
                    user.active_keys,
                    user.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    flags.join(",")
                );
            }
        }
        UserCommand::Revoke { name } => {
            let revoked = store.accounts().revoke_keys(&name).await?;
            eprintln!(
                "revoked {revoked} key(s) of {name}; `mnemo user key {name}` issues a new one"
            );
        }
        UserCommand::Key { name, keep_old } => {
            let key = keys::generate();
            let revoked = store
                .accounts()
                .rotate_key(&name, &key.hash, &key.prefix, !keep_old)
                .await
                .map_err(|error| match error {
                    StoreError::NotFound(_) => Failure::usage(format!(
                        "no user named {name} (create one with `mnemo user add {name}`)"
                    )),
                    other => other.into(),
                })?;
            if keep_old {
                eprintln!("new key for {name} (other keys kept); shown only once");
            } else {
                eprintln!("new key for {name}; revoked {revoked} older key(s); shown only once");
            }
            println!("{}", key.plaintext);
        }
        UserCommand::Keys { name } => {
            let listed = store
                .accounts()
                .api_keys(&name)
                .await
                .map_err(|error| match error {
                    StoreError::NotFound(_) => Failure::usage(format!("no user named {name}")),
                    other => other.into(),
                })?;
            println!("{:<16} {:<24} revoked", "prefix", "created");
            for key in listed {
                println!(
                    "{:<16} {:<24} {}",
                    key.prefix,
                    key.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    key.revoked_at
                        .map(|at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
    }
    Ok(())
}

/// A password from the first line of stdin (the line end removed).
fn read_password_line() -> Result<secrecy::SecretString, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|error| Failure::other(format!("reading the password from stdin: {error}")))?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Failure::usage(
            "no password on stdin: pipe it in, e.g. `printf '%s\\n' \"$PASSWORD\" | mnemo user password NAME`",
        ));
    }
    Ok(secrecy::SecretString::from(password))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for.
    #[test]
    fn every_argument_of_every_command_has_a_description() {
        fn visit(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                visit(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        visit(&super::Cli::command(), "mnemo", &mut missing);
        assert!(missing.is_empty(), "undocumented: {missing:#?}");
    }

    /// `--ablate` changes memory settings as the configuration would, and refuses what the
    /// configuration refuses.
    #[test]
    fn an_ablation_is_read_as_memory_settings() {
        let overrides = mnemo::config::Overrides::default();
        let environment = || vec![("MNEMO__MEMORY__TIME_BOOST".to_string(), "3".to_string())];
        let ablation = super::ablation(
            "one_per_source=false; memory.relevance.rank_weight=0",
            &overrides,
            environment(),
        )
        .unwrap_or_else(|failure| panic!("{}", failure.message));
        assert_eq!(
            ablation.label,
            "one_per_source=false relevance.rank_weight=0"
        );
        assert!(!ablation.memory.one_per_source);
        assert_eq!(ablation.memory.relevance.rank_weight, 0.0);
        assert_eq!(
            ablation.memory.time_boost, 3.0,
            "the rest comes from the configuration"
        );
        for bad in [
            "",
            "one_per_source",
            "no_such_setting=1",
            "assistant_weight=many",
        ] {
            assert!(
                super::ablation(bad, &overrides, environment()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn memory_add_help_lists_the_kinds() {
        let mut command = super::Cli::command();
        let help = command
            .find_subcommand_mut("memory")
            .and_then(|memory| memory.find_subcommand_mut("add"))
            .map(|add| add.render_long_help().to_string())
            .unwrap_or_default();
        for kind in ["fact", "preference", "event", "conclusion", "profile"] {
            assert!(help.contains(kind), "{help}");
        }
    }
}
