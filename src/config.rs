//! Layered settings: compiled defaults → `mnemo.toml` (or `--config FILE`) → `MNEMO__SECTION__KEY`
//! environment variables → command-line flags. Secrets are `SecretString`s: their `Debug` output
//! is redacted, so a settings dump in a log never shows them.
//!
//! This module is a leaf: it owns the enums its settings take (search provider, embedder
//! provider, log format, model roles, prices) and imports nothing from the rest of the crate
//! but `text_enum!`, the crate's one way of spelling an enum as words.
//! Every section rejects unknown keys, and an unknown `MNEMO__…` variable is named in the error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::enums::text_enum;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration: {0}")]
    Invalid(String),
}

text_enum! {
    /// A web search provider, or `local` (the user's own documents).
    #[derive(PartialOrd, Ord)]
    SearchApi("search provider") { Tavily => "tavily", Brave => "brave", Searxng => "searxng", Duckduckgo => "duckduckgo", Local => "local" }
}

text_enum! {
    /// Where embeddings come from.
    #[derive(PartialOrd, Ord)]
    EmbedderProvider("embedder provider") {
        /// the local BERT encoder (`crates/encoder`) on `embedder.model_dir`.
        Local => "local",
        /// An OpenAI-compatible `/embeddings` endpoint.
        Openai => "openai",
    }
}

text_enum! {
    /// How log lines are written.
    #[derive(PartialOrd, Ord)]
    LogFormat("log format") { Text => "text", Json => "json" }
}

text_enum! {
    /// How thoroughly Tavily searches (an advanced search costs two credits).
    #[derive(PartialOrd, Ord)]
    TavilyDepth("tavily search depth") { Basic => "basic", Advanced => "advanced" }
}

text_enum! {
    /// The jobs a language model does; each may have its own model and `max_tokens`.
    #[derive(PartialOrd, Ord)]
    ModelRole("model role") {
        Chat => "chat",
        Research => "research",
        Summarization => "summarization",
        Compression => "compression",
        FinalReport => "final_report",
        Memory => "memory",
    }
}

impl ModelRole {
    /// `max_tokens` of the role when the configuration sets none.
    pub(crate) fn default_max_tokens(self) -> u32 {
        match self {
            ModelRole::Chat => 2048,
            ModelRole::Research => 4096,
            ModelRole::Summarization => 1024,
            ModelRole::Compression => 4096,
            ModelRole::FinalReport => 8192,
            ModelRole::Memory => 1024,
        }
    }
}

/// Dollars per million tokens.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// Users with at least this many memories get a Qdrant Edge shard of their own.
pub(crate) const DEFAULT_TENANT_SHARD_POINTS: u64 = 20_000;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Directory holding the SQLite file, the Qdrant Edge shard and the tantivy index.
    pub data_dir: PathBuf,
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
    pub embedder: EmbedderSettings,
    pub qdrant: QdrantSettings,
    pub memory: MemorySettings,
    pub llm: LlmSettings,
    pub chat: ChatSettings,
    pub research: ResearchSettings,
    pub extract: ExtractSettings,
}

/// Reading uploaded documents and fetched pages: each is read by a child process (`mnemo
/// __extract`) under hard memory and CPU ceilings, so a hostile file costs that process, never
/// the server.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtractSettings {
    /// The executable run as the extraction worker; empty means this executable when it is
    /// `mnemo` (embedders of the library, and tests, name the `mnemo` binary here).
    pub worker: Option<PathBuf>,
    /// Memory one extraction may map (MiB of address space beyond the worker's start-up
    /// footprint); past it the worker dies and the document is refused (413).
    pub memory_mb: u64,
    /// CPU seconds one extraction may use; wall-clock time is capped at twice this.
    pub cpu_secs: u64,
    /// Bytes of text one extraction may produce; more is refused (413).
    pub max_text_bytes: usize,
    /// Extractions running at once; more wait their turn.
    pub concurrency: usize,
}

impl Default for ExtractSettings {
    fn default() -> Self {
        Self {
            worker: None,
            memory_mb: 1024,
            cpu_secs: 20,
            max_text_bytes: 16 * 1024 * 1024,
            concurrency: 2,
        }
    }
}

/// Search providers (`research::search`): which one is used by default, their endpoints and
/// keys. Keys are `SecretString`s, so a settings dump never shows them.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchSettings {
    /// `local` (the user's own documents), `tavily`, `brave`, `searxng` or `duckduckgo`.
    pub default_provider: SearchApi,
    /// Hits asked of a provider when the caller gives no number.
    pub max_results: usize,
    /// Deadline of one search request, in seconds.
    pub timeout_secs: u64,
    pub tavily_api_key: Option<SecretString>,
    pub tavily_base_url: String,
    /// `basic` or `advanced` (an advanced search costs two credits).
    pub tavily_search_depth: TavilyDepth,
    pub brave_api_key: Option<SecretString>,
    pub brave_base_url: String,
    /// The base URL of a SearXNG instance with the JSON format enabled; unset = not available.
    pub searxng_url: Option<String>,
    pub duckduckgo_base_url: String,
    /// Extra attempts of a failed search request (rate limits, server errors, network
    /// trouble), after jittered waits doubling from `retry_backoff_ms`.
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
}

impl Default for SearchSettings {
    fn default() -> Self {
        Self {
            default_provider: SearchApi::Local,
            max_results: 5,
            timeout_secs: 20,
            tavily_api_key: None,
            tavily_base_url: "https://api.tavily.com".into(),
            tavily_search_depth: TavilyDepth::Basic,
            brave_api_key: None,
            brave_base_url: "https://api.search.brave.com".into(),
            searxng_url: None,
            duckduckgo_base_url: "https://html.duckduckgo.com".into(),
            max_retries: 2,
            retry_backoff_ms: 500,
        }
    }
}

/// The language model endpoint (any OpenAI-compatible API) and per-role models.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmSettings {
    /// e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`; unset = no LLM.
    pub base_url: Option<String>,
    pub api_key: Option<SecretString>,
    /// The default model for every role.
    pub model: Option<String>,
    /// The default model's context window in tokens (prompt and answer together); prompts are
    /// fitted to it.
    pub context_tokens: u32,
    /// The default model's `tokenizer.json`, to count its tokens exactly; unset = a calibrated
    /// estimate.
    pub tokenizer: Option<PathBuf>,
    pub timeout_secs: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    pub max_structured_output_retries: u32,
    /// Per role (`chat`, `research`, `summarization`, `compression`, `final_report`, `memory`).
    pub roles: HashMap<ModelRole, RoleSettings>,
    /// Dollars per million tokens, by model name.
    pub prices: HashMap<String, Price>,
}

impl LlmSettings {
    /// Where a role's model is served and with what limits: its own settings over the
    /// defaults; `None` when the role has no endpoint or no model.
    pub(crate) fn role_endpoint(&self, role: ModelRole) -> Option<RoleEndpoint> {
        let llm = self;
        let nonempty = |value: &Option<String>| {
            value
                .as_ref()
                .filter(|text| !text.trim().is_empty())
                .cloned()
        };
        let own = llm.roles.get(&role);
        let own_url = own.and_then(|own| nonempty(&own.base_url));
        let base_url = own_url.clone().or_else(|| nonempty(&llm.base_url))?;
        let model = own
            .and_then(|own| nonempty(&own.model))
            .or_else(|| nonempty(&llm.model))?;
        let api_key = match own.and_then(|own| own.api_key.clone()) {
            Some(key) => Some(key),
            // The default key goes only to the default endpoint.
            None if own_url.is_none() || own_url == nonempty(&llm.base_url) => llm.api_key.clone(),
            None => None,
        };
        Some(RoleEndpoint {
            base_url,
            api_key: api_key.filter(|key| !key.expose_secret().is_empty()),
            model,
            // A default cap leaves at least half the window to the prompt; a cap set by hand
            // is taken as set (and refused by `validate` when it leaves no room).
            max_tokens: own.and_then(|own| own.max_tokens).unwrap_or_else(|| {
                let context = own
                    .and_then(|own| own.context_tokens)
                    .unwrap_or(llm.context_tokens);
                role.default_max_tokens().min(context / 2)
            }),
            context_tokens: own
                .and_then(|own| own.context_tokens)
                .unwrap_or(llm.context_tokens),
            tokenizer: match own.and_then(|own| own.tokenizer.clone()) {
                Some(path) => Some(path),
                None if own.and_then(|own| nonempty(&own.model)).is_none() => llm.tokenizer.clone(),
                None => None,
            },
        })
    }
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            base_url: None,
            api_key: None,
            model: None,
            context_tokens: 32_768,
            tokenizer: None,
            timeout_secs: 120,
            max_retries: 3,
            retry_backoff_ms: 500,
            max_structured_output_retries: 3,
            roles: Default::default(),
            prices: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RoleSettings {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    /// This role's own endpoint (a small local model for memory work, a hosted one for
    /// research); unset = `llm.base_url`.
    pub base_url: Option<String>,
    /// The key for `base_url`; unset = `llm.api_key` when the endpoint is the default one, no
    /// key otherwise.
    pub api_key: Option<SecretString>,
    /// This role's model's context window; unset = `llm.context_tokens`.
    pub context_tokens: Option<u32>,
    /// This role's model's `tokenizer.json`; unset = `llm.tokenizer` when the model is the
    /// default one, else the estimate.
    pub tokenizer: Option<PathBuf>,
}

/// One role's model, resolved from its own settings and the defaults.
#[derive(Debug, Clone)]
pub(crate) struct RoleEndpoint {
    pub base_url: String,
    pub api_key: Option<SecretString>,
    pub model: String,
    pub max_tokens: u32,
    pub context_tokens: u32,
    pub tokenizer: Option<PathBuf>,
}

/// Limits of one chat turn.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatSettings {
    /// Tool calls allowed in one turn before the turn is stopped.
    pub max_tool_calls: usize,
    /// Completion tokens allowed in one turn, summed over model calls.
    pub max_turn_tokens: u64,
    /// Token budget (approximate) of the recent messages put in the prompt.
    pub history_tokens: usize,
    /// Token budget (approximate) of the text of documents attached to the message answered
    /// and to earlier messages in the prompt (the message answered first); what does not fit
    /// is left out, and the prompt says so.
    pub attachment_tokens: usize,
    /// Memories recalled automatically at the start of a turn.
    pub auto_recall: usize,
    /// How often streamed text is flushed into `message_delta` events, in milliseconds.
    pub delta_interval_ms: u64,
}

impl Default for ChatSettings {
    fn default() -> Self {
        Self {
            max_tool_calls: 8,
            max_turn_tokens: 16_000,
            history_tokens: 3_000,
            attachment_tokens: 6_000,
            auto_recall: 5,
            delta_interval_ms: 30,
        }
    }
}

/// Deep research: defaults of the per-request knobs, the server's limits on them, and the
/// page fetcher's caps.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResearchSettings {
    /// Ask the user a clarifying question first when the query is ambiguous (needs an LLM).
    pub allow_clarification: bool,
    /// Supervisor rounds (plan → dispatch → read findings).
    pub max_researcher_iterations: u32,
    /// Tool calls (search, fetch, think) per researcher.
    pub max_react_tool_calls: u32,
    /// Researchers running at the same time.
    pub max_concurrent_research_units: u32,
    /// Search results asked for per query.
    pub search_results: usize,
    /// Sources kept for the report after scoring (the weakest are dropped).
    pub max_sources: usize,
    /// Sources scoring below this (0–1) are dropped.
    pub min_source_score: f64,
    /// Recursive mode: queries per level, levels, and queries researched at once.
    pub breadth: u32,
    pub depth: u32,
    pub concurrency: u32,
    /// Write the conclusions of a finished report to the user's memory.
    pub remember_conclusions: bool,
    /// Upper bounds a request may ask for.
    pub limits: ResearchLimits,
    pub fetch: FetchSettings,
    pub search: SearchSettings,
}

impl Default for ResearchSettings {
    fn default() -> Self {
        Self {
            allow_clarification: false,
            max_researcher_iterations: 3,
            max_react_tool_calls: 6,
            max_concurrent_research_units: 3,
            search_results: 5,
            max_sources: 12,
            min_source_score: 0.15,
            breadth: 3,
            depth: 2,
            concurrency: 2,
            remember_conclusions: true,
            limits: ResearchLimits::default(),
            fetch: FetchSettings::default(),
            search: SearchSettings::default(),
        }
    }
}

/// The largest values a research request may set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResearchLimits {
    pub max_researcher_iterations: u32,
    pub max_react_tool_calls: u32,
    pub max_concurrent_research_units: u32,
    pub max_sources: usize,
    pub breadth: u32,
    pub depth: u32,
    pub concurrency: u32,
    /// The largest `budget.tokens` a request may set.
    pub budget_tokens: u64,
}

impl Default for ResearchLimits {
    fn default() -> Self {
        Self {
            max_researcher_iterations: 8,
            max_react_tool_calls: 20,
            max_concurrent_research_units: 8,
            max_sources: 40,
            breadth: 8,
            depth: 4,
            concurrency: 8,
            budget_tokens: 1_000_000,
        }
    }
}

/// Caps of the page fetcher.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchSettings {
    /// Largest decompressed body read from a page.
    pub max_body_bytes: usize,
    /// Deadline of one fetch, redirects and body included.
    pub timeout_secs: u64,
    pub max_redirects: usize,
    /// For tests only: comma-separated `ip:port` pairs the fetcher may reach although they
    /// are loopback or private. Leave empty in production.
    pub allow_addrs: String,
}

impl Default for FetchSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: 5 * 1024 * 1024,
            timeout_secs: 20,
            max_redirects: 5,
            allow_addrs: String::new(),
        }
    }
}

/// How token embeddings are reduced to one sentence vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// Average of the non-padding token embeddings.
    Mean,
    /// The `[CLS]` token embedding.
    Cls,
}

/// Which embedder turns text into vectors.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbedderSettings {
    /// `local` (our BERT encoder on `model_dir`) or `openai` (an OpenAI-compatible `/embeddings`).
    pub provider: EmbedderProvider,
    /// A BERT-family model directory in Hugging Face layout.
    pub model_dir: PathBuf,
    pub base_url: Option<String>,
    pub api_key: Option<SecretString>,
    pub model: Option<String>,
    pub dimension: Option<usize>,
    /// The embedding queue: how long an idle model waits for more texts to batch (ms).
    pub batch_wait_ms: u64,
    /// Texts per model call at most (a query waits for one such batch at most).
    pub max_batch: usize,
    /// Recent query vectors kept, so a repeated query is not embedded again (0: off).
    pub query_cache: usize,
    /// Threads the local model's matrix products use (0: one per core).
    pub threads: usize,
    /// The local model's matrix products: `int8` (8-bit integers, on CPUs with AVX-512 VNNI;
    /// `f32` elsewhere) or `f32`.
    pub precision: mnemo_encoder::Precision,
    /// Put before every search query (e5: `query: `); unset: what the model declares.
    pub query_prefix: Option<String>,
    /// Put before every stored text (e5: `passage: `); unset: what the model declares.
    pub passage_prefix: Option<String>,
    /// `mean` or `cls`; unset: what the model declares.
    pub pooling: Option<Pooling>,
    /// `openai`: extra attempts of a failed `/embeddings` call (rate limits, server errors,
    /// network trouble), after jittered waits doubling from `retry_backoff_ms`.
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
}

impl Default for EmbedderSettings {
    fn default() -> Self {
        Self {
            provider: EmbedderProvider::Local,
            model_dir: PathBuf::from("models/multilingual-e5-small-q4"),
            base_url: None,
            api_key: None,
            model: None,
            dimension: None,
            batch_wait_ms: 2,
            max_batch: 32,
            query_cache: 1024,
            threads: 0,
            precision: mnemo_encoder::Precision::default(),
            query_prefix: None,
            passage_prefix: None,
            pooling: None,
            max_retries: 3,
            retry_backoff_ms: 500,
        }
    }
}

/// The vector index: Qdrant Edge in the data directory unless `url` names a Qdrant server.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QdrantSettings {
    /// The server's gRPC endpoint, or several peers of one cluster separated by commas: each
    /// request goes to the peer that answered last and moves on to the next when one cannot be
    /// reached.
    pub url: Option<String>,
    pub api_key: Option<SecretString>,
    pub collection: String,
    /// The collection's layout on a cluster, used when mnemo creates it (an existing
    /// collection keeps its own): shards the points are spread over, copies of each shard on
    /// different peers, and copies that must take a write before it is acknowledged. Unset
    /// leaves the server's default (one shard per peer, one copy, one acknowledgement).
    pub shard_number: Option<u32>,
    pub replication_factor: Option<u32>,
    pub write_consistency_factor: Option<u32>,
    /// Optimise (build HNSW) after this many upserts, in the background.
    pub optimize_after_upserts: u64,
    /// HNSW beam width of searches; unset is the engine's default (100). Searches asking for
    /// more candidates than this use their own count.
    pub search_ef: Option<usize>,
    /// Embedded backend: a user with at least this many memories moves to a Qdrant Edge shard
    /// of their own at the next background optimisation (faster, more exact searches for very
    /// large users). 0 keeps everyone in the shared shard.
    pub tenant_shard_points: u64,
    /// Where keyword (BM25) search runs with a Qdrant server: `server` (the default), as
    /// sparse vectors in the server's collection beside the dense ones, so a replica holds no
    /// index; or `replica`, a tantivy index in each replica's data directory, rebuilt from the
    /// memory log. The embedded backend always keeps tantivy.
    pub keywords: KeywordPlace,
    /// With `keywords = "server"` on a deployment whose collection without keyword vectors
    /// is ahead (one that ran with `replica`): when the keyword vectors are more than this many
    /// memory-log entries behind, a replica answers from that collection and its tantivy index
    /// while it fills them in the background, and moves over once they have caught up; up to
    /// this many it fills them before it answers.
    pub keywords_fill_inline: u64,
}

impl QdrantSettings {
    /// The peers `url` names (one for a single server), without blanks.
    pub(crate) fn urls(&self) -> Vec<&str> {
        self.url
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .collect()
    }

    fn check_layout(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("shard_number", self.shard_number),
            ("replication_factor", self.replication_factor),
            ("write_consistency_factor", self.write_consistency_factor),
        ] {
            if value == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "qdrant.{name} must be positive (leave it unset for the server's default)"
                )));
            }
        }
        if let Some(acknowledging) = self.write_consistency_factor
            && acknowledging > self.replication_factor.unwrap_or(1)
        {
            return Err(ConfigError::Invalid(format!(
                "qdrant.write_consistency_factor ({acknowledging}) cannot exceed \
                 qdrant.replication_factor ({}): a write would wait for copies that do not exist",
                self.replication_factor.unwrap_or(1)
            )));
        }
        Ok(())
    }
}

impl Default for QdrantSettings {
    fn default() -> Self {
        Self {
            url: None,
            api_key: None,
            collection: "mnemo_memories".into(),
            shard_number: None,
            replication_factor: None,
            write_consistency_factor: None,
            optimize_after_upserts: 20_000,
            search_ef: None,
            tenant_shard_points: DEFAULT_TENANT_SHARD_POINTS,
            keywords: KeywordPlace::Server,
            keywords_fill_inline: 10_000,
        }
    }
}

text_enum! {
    /// Where keyword search runs with a Qdrant server.
    #[derive(Default)]
    KeywordPlace("place of keyword search") {
        /// A tantivy index in each replica's data directory.
        Replica => "replica",
        /// Sparse vectors in the Qdrant server's collection.
        #[default]
        Server => "server",
    }
}

text_enum! {
    /// How recall fuses its signals.
    #[derive(PartialOrd, Ord)]
    FusionMethod("fusion method") {
        /// Weighted Reciprocal Rank Fusion: `Σ weight / (rrf_k + rank)`.
        Rrf => "rrf",
        /// The weighted sum of each list's scores divided by its best score.
        Score => "score",
        /// The weighted sum of each list's min-max normalised scores (`(s - min) / (max - min)`
        /// over the list; a candidate missing from a list counts 0 there).
        MinMax => "minmax",
    }
}

/// How recall fuses the signals of its two views (own, context) × two searches (vector,
/// BM25), and which candidates it keeps at all.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FusionSettings {
    pub method: FusionMethod,
    pub vector_weight: f64,
    pub bm25_weight: f64,
    pub context_vector_weight: f64,
    pub context_bm25_weight: f64,
    /// A BM25 hit holding none of the query's informative words (it matched only words
    /// shared by more than 5 % of the user's texts) adds nothing to the fused score: min-max
    /// scaling otherwise gives the best of such weak hits a BM25 list's full weight, above a
    /// memory that says the same in other words. Off: it lifts paraphrases on the relevance
    /// sets (e5 hits@3 76.9 → 81.3 %) and keeps LoCoMo (72.7 / 81.5), but on BEAM, where a
    /// long conversation's topical words are in many messages, it costs R@10 8 points
    /// (`eval/README.md`). Applies where coverage is worked out (hybrid).
    pub bm25_needs_coverage: bool,
    /// A raw-cosine query gate, for ablations (the product's gate is calibrated relevance,
    /// `memory.relevance`): a recall returns nothing unless some candidate is at least
    /// `gate_cosine` similar to the query in a vector view, or covers at least
    /// `gate_coverage` of it in a BM25 view. Unset and 0: off.
    pub gate_cosine: Option<f64>,
    pub gate_coverage: f64,
    /// The candidate floor: past the gate, candidates below both of these are dropped.
    pub floor_cosine: Option<f64>,
    pub floor_coverage: f64,
}

impl FusionSettings {
    /// The ablation gate's cosine (0: off).
    pub fn gate_cosine(&self) -> f64 {
        self.gate_cosine.unwrap_or(0.0)
    }

    /// The ablation floor's cosine (0: off).
    pub fn floor_cosine(&self) -> f64 {
        self.floor_cosine.unwrap_or(0.0)
    }
}

impl Default for FusionSettings {
    /// The four lists min-max normalised and summed with equal weights: on the LoCoMo dev
    /// split this beat RRF (k 5–60), score/max, z-scores and every weighting of a 4×4 grid
    /// (`eval/README.md`).
    fn default() -> Self {
        Self {
            method: FusionMethod::MinMax,
            vector_weight: 1.0,
            bm25_weight: 1.0,
            context_vector_weight: 1.0,
            context_bm25_weight: 1.0,
            bm25_needs_coverage: false,
            // Off: the calibrated relevance (`memory.relevance`) gates and cuts instead.
            gate_cosine: None,
            gate_coverage: 0.0,
            floor_cosine: None,
            floor_coverage: 0.0,
        }
    }
}

/// Where each decision about meaning draws its line on the relevance probability
/// (`memory.relevance`). Each was chosen on the hand-written sets of `eval/relevance` for
/// both shipped embedders (`eval/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelevanceSettings {
    /// A recall returns nothing unless some candidate is at least this likely about the
    /// query.
    pub gate: f64,
    /// Past the gate, a recall's results stop at the first one below this.
    pub tail: f64,
    /// `forget` deletes only memories at least this likely about what the user named (set
    /// for precision: a bystander deleted is data lost).
    pub forget: f64,
    /// A new memory is the same statement as an existing one when each is at least this
    /// likely about the other and no value differs.
    pub duplicate: f64,
    /// A research passage or document is a source only at or above this.
    pub source: f64,
    /// Recall's scores are multiplied by the relevance raised to this power (0: relevance
    /// does not reorder results).
    pub rank_weight: f64,
}

impl Default for RelevanceSettings {
    fn default() -> Self {
        Self {
            gate: 0.15,
            tail: 0.005,
            forget: 0.9,
            duplicate: 0.5,
            source: 0.3,
            rank_weight: 0.25,
        }
    }
}

/// Recall and decay knobs (DESIGN.md §2).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySettings {
    /// Reciprocal Rank Fusion constant. 10 rather than the customary 60: on the LoCoMo dev
    /// split 60 lets weak matches of one signal outvote strong ones of the other (hybrid then
    /// trails BM25 alone); see `eval/README.md`.
    pub rrf_k: f64,
    /// Candidates taken from each of the vector and BM25 searches.
    pub candidates: usize,
    pub default_k: usize,
    pub max_k: usize,
    /// Memories below importance 4 lose half their weight per half-life without access.
    pub decay_half_life_days: f64,
    /// The decay multiplier never goes below this (decay ranks, it never filters).
    pub decay_floor: f64,
    /// Two results whose vectors are at least this similar are near-duplicates.
    pub dedupe_cosine: f32,
    /// The decay job archives memories of at most this importance…
    pub archive_max_importance: u8,
    /// …unused for this many days (0 disables the job).
    pub archive_after_days: u64,
    /// Forgotten memories can be restored for this many days, then the decay job purges them.
    pub forget_retention_days: u64,
    /// The chat model's and MCP's `forget` tools remove at most this many memories at once
    /// (and say how many more matched).
    pub forget_tool_limit: usize,
    pub decay_interval_secs: u64,
    /// Background memory-writer workers in this process.
    pub writer_workers: usize,
    /// The user profile is rebuilt at most once per this many seconds.
    pub profile_interval_secs: u64,
    /// How the views' signals are fused, and the relevance floor.
    pub fusion: FusionSettings,
    /// Where each decision about meaning draws its line on the calibrated relevance
    /// (`memory::relevance`): recall's gate and tail, forget, duplicates, research sources.
    pub relevance: RelevanceSettings,
    /// Scores of memories at assistant (or web) trust are multiplied by this: the user's own
    /// words rank first when both match.
    pub assistant_weight: f64,
    /// Scores of memories from the span of time the query names ("in May 2023", "last
    /// week"), widened by `time_slack_days` each side, are multiplied by this (1 = off).
    pub time_boost: f64,
    pub time_slack_days: i64,
    /// When the query names exactly one of the user's speakers (the authors of imported
    /// conversations), that speaker's turns are multiplied by this (1 = off).
    pub speaker_boost: f64,
    /// When the query names no speaker and asks about the user in the first person ("my
    /// budget", "what did I mention…", not "what did you recommend…"), the user's own
    /// memories (user trust) are multiplied by this (1 = off).
    pub user_boost: f64,
    /// Turns that are themselves questions (ending with `?`) are multiplied by this: they
    /// rarely hold the answer (1 = off).
    pub question_factor: f64,
    /// Turns of fewer than `length_prior_words` words are multiplied by
    /// `(words / length_prior_words) ^ length_prior` (0 = off): short turns are rarely what
    /// a question is after.
    pub length_prior: f64,
    pub length_prior_words: usize,
    /// A memory from the same messages as a better-ranked result (another part of one long
    /// message, a fact and the turn that said it) is returned only when the distinct ones run
    /// out: k results then name up to k messages.
    pub one_per_source: bool,
    /// A turn that says something changed ("moved to", "increased to", "rescheduled", "I've
    /// never…", "改成") is lifted right above the earlier turn of the same side closest to it
    /// among those ranked above it, and that one is marked as older (`signals.later`): the
    /// newest statement first. Only the order of the results changes.
    pub updates_first: bool,
    /// A document whose text makes more chunks than this is refused with 413 (each chunk is
    /// a memory to embed and index).
    pub max_document_chunks: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            rrf_k: 10.0,
            candidates: 50,
            default_k: 10,
            max_k: 100,
            decay_half_life_days: 30.0,
            decay_floor: 0.8,
            dedupe_cosine: 0.97,
            archive_max_importance: 2,
            archive_after_days: 90,
            decay_interval_secs: 3600,
            forget_retention_days: 30,
            forget_tool_limit: 5,
            writer_workers: 2,
            profile_interval_secs: 600,
            fusion: FusionSettings::default(),
            relevance: RelevanceSettings::default(),
            one_per_source: true,
            updates_first: true,
            // The priors as chosen on the LoCoMo dev split (each held up when chosen on four
            // conversations and scored on the fifth; `eval/README.md`).
            assistant_weight: 0.9,
            time_boost: 2.0,
            time_slack_days: 7,
            speaker_boost: 1.3,
            user_boost: 2.0,
            question_factor: 0.6,
            length_prior: 0.25,
            length_prior_words: 40,
            max_document_chunks: 2_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    pub addr: String,
    /// Serve one local user without keys; refused unless `addr` is a loopback address.
    pub dev: bool,
    pub max_body_bytes: usize,
    pub keep_alive_secs: u64,
    /// A streamed run nobody has followed for this long is cancelled, so a client that went
    /// away does not keep a model call running (0 disables). Runs started with
    /// `stream: false` run to their end.
    pub abandon_run_after_secs: u64,
    /// How long shutdown waits for runs to write their final events.
    pub shutdown_grace_secs: u64,
    /// A connection that has not sent a whole request head within this many seconds is
    /// closed (slow clients holding connections open).
    pub header_read_timeout_secs: u64,
    /// A request's whole body must arrive within this many seconds of its head (slow bodies
    /// holding connections open); past it the request is refused.
    pub body_read_timeout_secs: u64,
    /// Requests one user may have arriving at once (authenticated, body still being read);
    /// more are refused with 429 before their body is read, so a few users cannot hold every
    /// connection.
    pub max_requests_per_user: usize,
    /// Open connections at most; more wait in the listen queue until one closes.
    pub max_connections: usize,
    /// Chat turns and researches one user may have running at once (more get 429).
    pub max_runs_per_user: usize,
    /// Authenticated requests one user may make a minute, in bursts of as many (more get 429
    /// with `Retry-After`); 0 turns the limit off.
    pub requests_per_minute: u32,
    /// Model tokens (prompt and completion, all calls) one chat turn or research may use;
    /// past it the run stops with an `error` of type `budget`. 0 turns the limit off.
    pub run_token_budget: u64,
    /// Model tokens one user's runs may use per UTC day; past it runs stop and new ones get
    /// 429 until midnight. 0 turns the limit off.
    pub daily_token_budget: u64,
    /// Browser origins (`scheme://host[:port]`, comma-separated) allowed to call `/mcp`
    /// besides loopback ones; a request from any other `Origin` is refused (403).
    pub allowed_origins: String,
    /// Users (names, comma-separated) who see `/health`'s details with their key.
    pub admin_users: String,
    /// A run is leased to the replica executing it for this long; a run whose lease was not
    /// renewed in time (its replica died) is closed by another replica's sweeper.
    pub run_lease_ms: u64,
    /// How often a replica renews its runs' leases and sweeps runs whose lease expired
    /// (shorter than `run_lease_ms`).
    pub run_heartbeat_ms: u64,
    /// How often a replica executing runs looks for cancels and inputs sent through another
    /// replica when nothing woke it (PostgreSQL wakes it at once with NOTIFY).
    pub run_command_poll_ms: u64,
}

/// Largest `max_tokens` (completion tokens of one call) a role may be given.
pub(crate) const MAX_COMPLETION_TOKENS: u32 = 131_072;

impl ServerSettings {
    /// Whether `name` is one of `admin_users`.
    pub(crate) fn is_admin(&self, name: &str) -> bool {
        self.admin_users
            .split(',')
            .map(str::trim)
            .any(|admin| !admin.is_empty() && admin == name)
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:8080".into(),
            dev: false,
            max_body_bytes: 2 * 1024 * 1024,
            keep_alive_secs: 15,
            abandon_run_after_secs: 10,
            shutdown_grace_secs: 10,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 30,
            max_requests_per_user: 64,
            max_connections: 1024,
            max_runs_per_user: 8,
            requests_per_minute: 600,
            run_token_budget: 1_000_000,
            daily_token_budget: 5_000_000,
            allowed_origins: String::new(),
            admin_users: String::new(),
            run_lease_ms: 15_000,
            run_heartbeat_ms: 5_000,
            run_command_poll_ms: 500,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `sqlite://…` or `postgres://…`; empty means `sqlite://<data_dir>/mnemo.db`.
    pub url: Option<SecretString>,
    pub max_connections: u32,
    /// How long a request waits for a free connection before it is refused with 429 and
    /// `Retry-After` (nothing of it stored).
    pub acquire_timeout_ms: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: None,
            max_connections: 8,
            acquire_timeout_ms: 3_000,
        }
    }
}

impl DatabaseSettings {
    pub fn acquire_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.acquire_timeout_ms.max(1))
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    pub jwt: JwtSettings,
}

/// JWT bearer tokens: either an HS256 shared secret or an RS256 public key (PEM text or file).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    pub hs256_secret: Option<SecretString>,
    pub rs256_public_key: Option<String>,
    pub rs256_public_key_file: Option<PathBuf>,
    pub audience: Option<String>,
    pub issuer: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// An `EnvFilter` directive, e.g. `info` or `mnemo=debug,tower_http=info`.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// A deserialization error with the dotted key it concerns and, when an environment variable
/// set that key, the variable's name.
fn describe(
    error: &serde_path_to_error::Error<config::ConfigError>,
    variables: &[String],
) -> String {
    let inner = error.inner().to_string();
    // The config crate appends the key it was reading; the path already names it.
    let inner = match inner.rfind(" for key ") {
        Some(at) => inner[..at].to_string(),
        None => inner,
    };
    let mut key = error.path().to_string();
    if key == "." {
        key.clear();
    }
    // serde names an unknown field in backticks: "unknown field `baseurl`, expected …".
    if let Some(field) = inner
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
        && !(key == field || key.ends_with(&format!(".{field}")))
    {
        key = if key.is_empty() {
            field.to_string()
        } else {
            format!("{key}.{field}")
        };
    }
    let inner = inner.replace('`', "");
    let variable = variables.iter().find(|name| {
        name.strip_prefix("MNEMO__")
            .is_some_and(|rest| rest.to_lowercase().replace("__", ".") == key)
    });
    match variable {
        Some(variable) => format!("{variable} ({key}): {inner}"),
        None if key.is_empty() => inner,
        None => format!("{key}: {inner}"),
    }
}

/// A settings file that does not parse, as `FILE:LINE:COLUMN: message` followed by the lines
/// the parser shows (the offending line with a caret under the column).
fn parse_error(error: config::ConfigError) -> ConfigError {
    let config::ConfigError::FileParse { uri, cause } = &error else {
        return ConfigError::Load(error);
    };
    let file = uri.clone().unwrap_or_else(|| "the settings file".into());
    let text = cause.to_string();
    let mut lines = text.lines();
    let head = lines.next().unwrap_or_default();
    let rest: Vec<&str> = lines.collect();
    // toml: "TOML parse error at line 3, column 7", then the snippet, then the message.
    let position = head.split_once(" at line ").and_then(|(_, at)| {
        let (line, column) = at.split_once(", column ")?;
        Some((
            line.trim().parse::<u32>().ok()?,
            column.trim().parse::<u32>().ok()?,
        ))
    });
    let Some((line, column)) = position else {
        return ConfigError::Invalid(format!("{file}: {}", text.trim()));
    };
    let message = rest
        .iter()
        .rev()
        .find(|line| !line.trim().is_empty() && !line.trim_start().starts_with('|'))
        .filter(|line| !line.contains(" | "))
        .map(|line| line.trim().to_string())
        .unwrap_or_else(|| "invalid TOML".into());
    let snippet: Vec<&str> = rest
        .iter()
        .copied()
        .filter(|line| line.contains('|'))
        .collect();
    ConfigError::Invalid(format!(
        "{file}:{line}:{column}: {message}\n{}",
        snippet.join("\n")
    ))
}

/// Command-line overrides, applied after the file and the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub addr: Option<String>,
    pub dev: bool,
}

impl Settings {
    /// Loads the layers. A `--config` file must exist; the default `mnemo.toml` is optional.
    pub fn load(overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::load_from(overrides, std::env::vars())
    }

    /// As `load`, with the environment given explicitly (for tests).
    pub fn load_from(
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let file = match &overrides.config_file {
            Some(path) => config::File::from(path.as_path()).required(true),
            None => config::File::from(Path::new("mnemo.toml")).required(false),
        };
        let env: config::Map<String, String> = env
            .into_iter()
            .filter(|(key, _)| key.starts_with("MNEMO__"))
            .collect();
        let variables: Vec<String> = env.keys().cloned().collect();
        let built = config::Config::builder()
            .add_source(file)
            .add_source(
                config::Environment::with_prefix("MNEMO")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(env)),
            )
            .build()
            .map_err(parse_error)?;
        let mut settings: Settings = serde_path_to_error::deserialize(built)
            .map_err(|error| ConfigError::Invalid(describe(&error, &variables)))?;
        if let Some(dir) = &overrides.data_dir {
            settings.data_dir = dir.clone();
        }
        if settings.data_dir.as_os_str().is_empty() {
            settings.data_dir = PathBuf::from("data");
        }
        if let Some(addr) = &overrides.addr {
            settings.server.addr = addr.clone();
        }
        settings.server.dev |= overrides.dev;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.extract.memory_mb < 64
            || self.extract.cpu_secs == 0
            || self.extract.max_text_bytes == 0
            || self.extract.concurrency == 0
        {
            return Err(ConfigError::Invalid(
                "extract.memory_mb must be at least 64, and extract.cpu_secs, \
                 extract.max_text_bytes and extract.concurrency positive"
                    .into(),
            ));
        }
        if self.server.header_read_timeout_secs == 0
            || self.server.body_read_timeout_secs == 0
            || self.server.max_requests_per_user == 0
            || self.server.max_connections == 0
            || self.server.max_runs_per_user == 0
        {
            return Err(ConfigError::Invalid(
                "server.header_read_timeout_secs, server.body_read_timeout_secs, \
                 server.max_requests_per_user, server.max_connections and \
                 server.max_runs_per_user must be positive"
                    .into(),
            ));
        }
        if self.server.run_heartbeat_ms == 0
            || self.server.run_command_poll_ms == 0
            || self.server.run_lease_ms <= self.server.run_heartbeat_ms
        {
            return Err(ConfigError::Invalid(
                "server.run_heartbeat_ms and server.run_command_poll_ms must be positive, and \
                 server.run_lease_ms longer than server.run_heartbeat_ms"
                    .into(),
            ));
        }
        for (role, own) in &self.llm.roles {
            if own
                .max_tokens
                .is_some_and(|tokens| tokens == 0 || tokens > MAX_COMPLETION_TOKENS)
            {
                return Err(ConfigError::Invalid(format!(
                    "llm.roles.{}.max_tokens must be between 1 and {MAX_COMPLETION_TOKENS}",
                    role.as_str()
                )));
            }
        }
        if self.server.max_body_bytes == 0 {
            return Err(ConfigError::Invalid(
                "server.max_body_bytes must be positive".into(),
            ));
        }
        let jwt = &self.auth.jwt;
        let configured = jwt.hs256_secret.is_some()
            || jwt.rs256_public_key.is_some()
            || jwt.rs256_public_key_file.is_some();
        if configured && (jwt.audience.is_none() || jwt.issuer.is_none()) {
            return Err(ConfigError::Invalid(
                "auth.jwt needs both audience and issuer when a key is set".into(),
            ));
        }
        if jwt.hs256_secret.is_some()
            && (jwt.rs256_public_key.is_some() || jwt.rs256_public_key_file.is_some())
        {
            return Err(ConfigError::Invalid(
                "auth.jwt: set either hs256_secret or an rs256 public key, not both".into(),
            ));
        }
        if let Some(secret) = &jwt.hs256_secret
            && secret.expose_secret().len() < 32
        {
            return Err(ConfigError::Invalid(
                "auth.jwt.hs256_secret must be at least 32 bytes".into(),
            ));
        }
        self.qdrant.check_layout()?;
        if self.qdrant.search_ef == Some(0) {
            return Err(ConfigError::Invalid(
                "qdrant.search_ef must be positive (leave it unset for the engine's default)"
                    .into(),
            ));
        }
        let memory = &self.memory;
        if memory.rrf_k.is_nan()
            || memory.rrf_k < 0.0
            || memory.candidates == 0
            || memory.max_k == 0
        {
            return Err(ConfigError::Invalid(
                "memory.rrf_k must be >= 0 and memory.candidates, memory.max_k positive".into(),
            ));
        }
        if !(0.0..=1.0).contains(&memory.decay_floor)
            || memory.decay_half_life_days.is_nan()
            || memory.decay_half_life_days <= 0.0
        {
            return Err(ConfigError::Invalid(
                "memory.decay_floor must be in [0, 1] and decay_half_life_days positive".into(),
            ));
        }
        self.validate_llm()?;
        let search = &self.research.search;
        if search.max_results == 0 || search.timeout_secs == 0 {
            return Err(ConfigError::Invalid(
                "research.search.max_results and timeout_secs must be positive".into(),
            ));
        }
        Ok(())
    }

    /// A model section is all or nothing: an endpoint without a model, or a model without an
    /// endpoint, is refused at start instead of serving a chat that says no model is set; so is
    /// a role whose answer cap leaves no room for its prompt.
    fn validate_llm(&self) -> Result<(), ConfigError> {
        let llm = &self.llm;
        let set =
            |value: &Option<String>| value.as_ref().is_some_and(|text| !text.trim().is_empty());
        let key = llm
            .api_key
            .as_ref()
            .is_some_and(|key| !key.expose_secret().is_empty());
        let any_endpoint = set(&llm.base_url) || llm.roles.values().any(|own| set(&own.base_url));
        let any_model = set(&llm.model) || llm.roles.values().any(|own| set(&own.model));
        if set(&llm.base_url) && !any_model {
            return Err(ConfigError::Invalid(
                "llm.base_url is set but no model is: set llm.model (MNEMO__LLM__MODEL), e.g. \
                 gpt-4.1-mini, llama3.1 or deepseek-chat, or a model per role under llm.roles"
                    .into(),
            ));
        }
        if !any_endpoint && (any_model || key) {
            let what = if any_model { "a model" } else { "llm.api_key" };
            return Err(ConfigError::Invalid(format!(
                "{what} is set but llm.base_url is not: set llm.base_url \
                 (MNEMO__LLM__BASE_URL), e.g. https://api.openai.com/v1 or \
                 http://127.0.0.1:11434/v1 for Ollama"
            )));
        }
        for (role, own) in &llm.roles {
            let role = role.as_str();
            if set(&own.base_url) && !set(&own.model) && !set(&llm.model) {
                return Err(ConfigError::Invalid(format!(
                    "llm.roles.{role}.base_url is set but no model is: set \
                     llm.roles.{role}.model or llm.model"
                )));
            }
            if set(&own.model) && !set(&own.base_url) && !set(&llm.base_url) {
                return Err(ConfigError::Invalid(format!(
                    "llm.roles.{role}.model is set but no endpoint is: set \
                     llm.roles.{role}.base_url or llm.base_url"
                )));
            }
        }
        for role in <ModelRole as strum::VariantArray>::VARIANTS {
            if let Some(endpoint) = llm.role_endpoint(*role)
                && endpoint.max_tokens >= endpoint.context_tokens
            {
                return Err(ConfigError::Invalid(format!(
                    "the {} role may answer {} tokens but its model's context window \
                     (llm.context_tokens or llm.roles.{}.context_tokens) is {}: lower its \
                     max_tokens or raise the window",
                    role.as_str(),
                    endpoint.max_tokens,
                    role.as_str(),
                    endpoint.context_tokens
                )));
            }
        }
        Ok(())
    }

    /// The chat role's model, when an endpoint and a model for it are configured.
    pub fn chat_model(&self) -> Option<String> {
        self.llm
            .role_endpoint(ModelRole::Chat)
            .map(|role| role.model)
    }

    /// The database URL, defaulting to a SQLite file in the data directory.
    pub fn database_url(&self) -> String {
        match &self.database.url {
            Some(url) if !url.expose_secret().is_empty() => url.expose_secret().to_string(),
            _ => format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("mnemo.db").display()
            ),
        }
    }

    /// The listen address, parsed.
    pub(crate) fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.server.addr.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "server.addr {:?} is not HOST:PORT with a numeric host",
                self.server.addr
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    /// The raw-cosine gate and floor are off unless set; the calibrated operating points
    /// have their defaults and can be set like any setting.
    #[test]
    fn the_cosine_gate_is_off_and_the_operating_points_are_settings() {
        let fusion = FusionSettings::default();
        assert_eq!((fusion.gate_cosine(), fusion.floor_cosine()), (0.0, 0.0));
        assert_eq!((fusion.gate_coverage, fusion.floor_coverage), (0.0, 0.0));
        let settings = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__MEMORY__RELEVANCE__FORGET", "0.95")]),
        )
        .unwrap();
        assert_eq!(settings.memory.relevance.forget, 0.95);
        assert_eq!(
            settings.memory.relevance.gate,
            RelevanceSettings::default().gate
        );
        assert_eq!(
            settings.embedder.model_dir,
            PathBuf::from("models/multilingual-e5-small-q4")
        );
    }

    #[test]
    fn defaults_need_no_configuration() {
        let settings = Settings::load_from(&Overrides::default(), env(&[])).unwrap();
        assert_eq!(settings.server.addr, "127.0.0.1:8080");
        assert_eq!(settings.data_dir, PathBuf::from("data"));
        assert!(
            settings
                .database_url()
                .starts_with("sqlite://data/mnemo.db")
        );
        assert!(!settings.server.dev);
        let search = &settings.research.search;
        assert_eq!(search.default_provider, SearchApi::Local);
        assert_eq!(search.max_results, 5);
        assert_eq!(search.tavily_base_url, "https://api.tavily.com");
        assert_eq!(search.brave_base_url, "https://api.search.brave.com");
        assert_eq!(search.duckduckgo_base_url, "https://html.duckduckgo.com");
        assert!(search.tavily_api_key.is_none() && search.searxng_url.is_none());
    }

    /// A role may have its own endpoint, key and context window; the default key never goes
    /// to another endpoint, and a cap that leaves no room for the prompt is refused.
    #[test]
    fn each_role_may_have_its_own_endpoint() {
        let settings = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LLM__BASE_URL", "https://api.example.com/v1"),
                ("MNEMO__LLM__API_KEY", "sk-hosted"),
                ("MNEMO__LLM__MODEL", "big"),
                (
                    "MNEMO__LLM__ROLES__MEMORY__BASE_URL",
                    "http://127.0.0.1:8081/v1",
                ),
                ("MNEMO__LLM__ROLES__MEMORY__MODEL", "small"),
                ("MNEMO__LLM__ROLES__MEMORY__CONTEXT_TOKENS", "4096"),
                ("MNEMO__LLM__ROLES__MEMORY__MAX_TOKENS", "300"),
            ]),
        )
        .unwrap();
        let memory = settings.llm.role_endpoint(ModelRole::Memory).unwrap();
        assert_eq!(memory.base_url, "http://127.0.0.1:8081/v1");
        assert_eq!(
            (memory.model.as_str(), memory.context_tokens),
            ("small", 4096)
        );
        assert!(
            memory.api_key.is_none(),
            "the hosted key stays with its host"
        );
        let chat = settings.llm.role_endpoint(ModelRole::Chat).unwrap();
        assert_eq!(chat.base_url, "https://api.example.com/v1");
        assert_eq!(chat.api_key.unwrap().expose_secret(), "sk-hosted");
        assert_eq!(chat.context_tokens, 32_768);
        let only_memory = Settings::load_from(
            &Overrides::default(),
            env(&[
                (
                    "MNEMO__LLM__ROLES__MEMORY__BASE_URL",
                    "http://127.0.0.1:8081/v1",
                ),
                ("MNEMO__LLM__ROLES__MEMORY__MODEL", "small"),
            ]),
        )
        .unwrap();
        assert!(only_memory.llm.role_endpoint(ModelRole::Memory).is_some());
        assert!(only_memory.chat_model().is_none());
        // Default caps shrink to half a small window; a cap set by hand that leaves no room
        // is refused.
        let small = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LLM__BASE_URL", "http://127.0.0.1:8081/v1"),
                ("MNEMO__LLM__MODEL", "small"),
                ("MNEMO__LLM__CONTEXT_TOKENS", "4096"),
            ]),
        )
        .unwrap();
        let report = small.llm.role_endpoint(ModelRole::FinalReport).unwrap();
        assert_eq!((report.max_tokens, report.context_tokens), (2048, 4096));
        let too_long = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LLM__BASE_URL", "http://127.0.0.1:8081/v1"),
                ("MNEMO__LLM__MODEL", "small"),
                ("MNEMO__LLM__CONTEXT_TOKENS", "4096"),
                ("MNEMO__LLM__ROLES__FINAL_REPORT__MAX_TOKENS", "8192"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            too_long.contains("the final_report role may answer 8192 tokens"),
            "{too_long}"
        );
        let orphan = Settings::load_from(
            &Overrides::default(),
            env(&[(
                "MNEMO__LLM__ROLES__MEMORY__BASE_URL",
                "http://127.0.0.1:8081/v1",
            )]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            orphan.contains("llm.roles.memory.base_url is set but no model"),
            "{orphan}"
        );
    }

    #[test]
    fn a_half_configured_model_section_is_refused_with_what_to_set() {
        let no_model = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__LLM__BASE_URL", "http://127.0.0.1:11434/v1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            no_model.contains("llm.base_url is set but no model"),
            "{no_model}"
        );
        assert!(no_model.contains("MNEMO__LLM__MODEL"), "{no_model}");
        let no_endpoint = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__LLM__MODEL", "llama3.1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(no_endpoint.contains("llm.base_url is not"), "{no_endpoint}");
        let key_only = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__LLM__API_KEY", "sk-secret-value")]),
        )
        .unwrap_err()
        .to_string();
        assert!(key_only.contains("llm.api_key is set"), "{key_only}");
        assert!(!key_only.contains("sk-secret-value"), "{key_only}");
        let whole = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LLM__BASE_URL", "http://127.0.0.1:11434/v1"),
                ("MNEMO__LLM__MODEL", "llama3.1"),
            ]),
        )
        .unwrap();
        assert_eq!(whole.chat_model().as_deref(), Some("llama3.1"));
        let per_role = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LLM__BASE_URL", "http://127.0.0.1:11434/v1"),
                ("MNEMO__LLM__ROLES__RESEARCH__MODEL", "qwen3"),
            ]),
        )
        .unwrap();
        assert_eq!(per_role.chat_model(), None);
    }

    #[test]
    fn a_corrupt_settings_file_names_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mnemo.toml");
        std::fs::write(
            &file,
            "[server]\naddr = \"127.0.0.1:9000\"\nmax_body_bytes = = 3\n",
        )
        .unwrap();
        let error = Settings::load_from(
            &Overrides {
                config_file: Some(file),
                ..Overrides::default()
            },
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        let first = error.lines().next().unwrap();
        // The settings library names the file relative to the working directory when it can.
        assert!(first.contains("mnemo.toml:3:18: extra `=`"), "{error}");
        assert!(error.contains("max_body_bytes = = 3"), "{error}");
        assert!(error.contains('^'), "{error}");
    }

    #[test]
    fn search_settings_come_from_the_research_section() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mnemo.toml");
        std::fs::write(
            &file,
            "[research.search]\ndefault_provider = \"searxng\"\nsearxng_url = \"http://127.0.0.1:8888\"\nmax_results = 8\n",
        )
        .unwrap();
        let overrides = Overrides {
            config_file: Some(file),
            ..Overrides::default()
        };
        let settings = Settings::load_from(&overrides, env(&[])).unwrap();
        let search = &settings.research.search;
        assert_eq!(search.default_provider, SearchApi::Searxng);
        assert_eq!(search.searxng_url.as_deref(), Some("http://127.0.0.1:8888"));
        assert_eq!(search.max_results, 8);
        let unknown = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__RESEARCH__SEARCH__DEFAULT_PROVIDER", "bing")]),
        );
        let message = unknown.unwrap_err().to_string();
        assert!(message.contains("tavily, brave"), "{message}");
    }

    #[test]
    fn environment_overrides_file_and_flags_override_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mnemo.toml");
        std::fs::write(
            &file,
            "[server]\naddr = \"127.0.0.1:9000\"\nmax_body_bytes = 1000\n[database]\nmax_connections = 3\n",
        )
        .unwrap();
        let overrides = Overrides {
            config_file: Some(file),
            data_dir: Some(PathBuf::from("/tmp/flag-dir")),
            ..Overrides::default()
        };
        let settings = Settings::load_from(
            &overrides,
            env(&[
                ("MNEMO__SERVER__ADDR", "127.0.0.1:9100"),
                ("MNEMO__DATA_DIR", "/tmp/env-dir"),
                ("MNEMO__DATABASE__URL", "postgres://u:pw@localhost/db"),
                ("MNEMO_SERVER", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.server.addr, "127.0.0.1:9100");
        assert_eq!(settings.server.max_body_bytes, 1000);
        assert_eq!(settings.database.max_connections, 3);
        assert_eq!(settings.data_dir, PathBuf::from("/tmp/flag-dir"));
        assert_eq!(settings.database_url(), "postgres://u:pw@localhost/db");
    }

    #[test]
    fn secrets_are_redacted_in_debug_output() {
        let settings = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__DATABASE__URL", "postgres://u:hunter2hunter2@h/db"),
                (
                    "MNEMO__AUTH__JWT__HS256_SECRET",
                    "0123456789abcdef0123456789abcdef-secret",
                ),
                ("MNEMO__AUTH__JWT__AUDIENCE", "mnemo"),
                ("MNEMO__AUTH__JWT__ISSUER", "issuer"),
                (
                    "MNEMO__RESEARCH__SEARCH__TAVILY_API_KEY",
                    "tvly-secret-tavily-key",
                ),
                ("MNEMO__RESEARCH__SEARCH__BRAVE_API_KEY", "secret-brave-key"),
            ]),
        )
        .unwrap();
        let dump = format!("{settings:?}");
        assert!(!dump.contains("hunter2"), "{dump}");
        assert!(!dump.contains("abcdef-secret"), "{dump}");
        assert!(!dump.contains("secret-tavily-key"), "{dump}");
        assert!(!dump.contains("secret-brave-key"), "{dump}");
        let search = &settings.research.search;
        assert_eq!(
            search
                .tavily_api_key
                .as_ref()
                .map(|key| key.expose_secret().to_string())
                .as_deref(),
            Some("tvly-secret-tavily-key")
        );
    }

    #[test]
    fn invalid_settings_are_refused_with_a_reason() {
        let short = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__AUTH__JWT__HS256_SECRET", "short"),
                ("MNEMO__AUTH__JWT__AUDIENCE", "a"),
                ("MNEMO__AUTH__JWT__ISSUER", "i"),
            ]),
        );
        assert!(short.unwrap_err().to_string().contains("at least 32 bytes"));
        let no_audience = Settings::load_from(
            &Overrides::default(),
            env(&[(
                "MNEMO__AUTH__JWT__HS256_SECRET",
                "0123456789abcdef0123456789abcdef",
            )]),
        );
        assert!(no_audience.unwrap_err().to_string().contains("audience"));
        let missing = Settings::load_from(
            &Overrides {
                config_file: Some(PathBuf::from("/nonexistent/mnemo.toml")),
                ..Overrides::default()
            },
            env(&[]),
        );
        assert!(missing.is_err());
        let zero_ef = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__QDRANT__SEARCH_EF", "0")]),
        );
        assert!(zero_ef.unwrap_err().to_string().contains("search_ef"));
        let ef = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__QDRANT__SEARCH_EF", "64")]),
        )
        .unwrap();
        assert_eq!(ef.qdrant.search_ef, Some(64));
        assert_eq!(ef.qdrant.tenant_shard_points, 20_000);
        let never = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__QDRANT__TENANT_SHARD_POINTS", "0")]),
        )
        .unwrap();
        assert_eq!(never.qdrant.tenant_shard_points, 0);
        let negative = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__QDRANT__TENANT_SHARD_POINTS", "-5")]),
        );
        assert!(negative.is_err());
    }

    #[test]
    fn a_qdrant_cluster_is_listed_peers_and_a_layout_that_can_hold() {
        let cluster = Settings::load_from(
            &Overrides::default(),
            env(&[
                (
                    "MNEMO__QDRANT__URL",
                    "http://q1:6334, http://q2:6334,,http://q3:6334 ",
                ),
                ("MNEMO__QDRANT__SHARD_NUMBER", "3"),
                ("MNEMO__QDRANT__REPLICATION_FACTOR", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            cluster.qdrant.urls(),
            ["http://q1:6334", "http://q2:6334", "http://q3:6334"]
        );
        assert_eq!(cluster.qdrant.shard_number, Some(3));
        assert_eq!(cluster.qdrant.replication_factor, Some(2));
        assert_eq!(cluster.qdrant.write_consistency_factor, None);
        assert!(Settings::default().qdrant.urls().is_empty());
        let no_copies = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__QDRANT__REPLICATION_FACTOR", "0")]),
        );
        assert!(
            no_copies
                .unwrap_err()
                .to_string()
                .contains("qdrant.replication_factor must be positive")
        );
        let waits_for_ghosts = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__QDRANT__REPLICATION_FACTOR", "2"),
                ("MNEMO__QDRANT__WRITE_CONSISTENCY_FACTOR", "3"),
            ]),
        );
        assert!(
            waits_for_ghosts
                .unwrap_err()
                .to_string()
                .contains("cannot exceed qdrant.replication_factor (2)")
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mnemo.toml");
        std::fs::write(&file, "[servr]\naddr = \"127.0.0.1:9000\"\n").unwrap();
        let overrides = Overrides {
            config_file: Some(file.clone()),
            ..Overrides::default()
        };
        let message = Settings::load_from(&overrides, env(&[]))
            .unwrap_err()
            .to_string();
        assert!(message.contains("unknown field servr"), "{message}");
        std::fs::write(&file, "[server]\nadress = \"127.0.0.1:9000\"\n").unwrap();
        let message = Settings::load_from(&overrides, env(&[]))
            .unwrap_err()
            .to_string();
        assert!(message.contains("server.adress"), "{message}");
        let message = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__LLM__BASEURL", "http://127.0.0.1:1/v1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(message.contains("MNEMO__LLM__BASEURL"), "{message}");
        assert!(message.contains("llm.baseurl"), "{message}");
        let message = Settings::load_from(
            &Overrides::default(),
            env(&[("MNEMO__LLM__ROLES__CHATT__MODEL", "m")]),
        )
        .unwrap_err()
        .to_string();
        assert!(message.contains("chatt"), "{message}");
        // Variables of the command line (one underscore) are not settings.
        Settings::load_from(&Overrides::default(), env(&[("MNEMO_SERVER", "x")])).unwrap();
    }

    #[test]
    fn enums_parse_from_files_and_variables() {
        let settings = Settings::load_from(
            &Overrides::default(),
            env(&[
                ("MNEMO__LOG__FORMAT", "json"),
                ("MNEMO__EMBEDDER__PROVIDER", "openai"),
                ("MNEMO__RESEARCH__SEARCH__TAVILY_SEARCH_DEPTH", "advanced"),
                ("MNEMO__LLM__ROLES__FINAL_REPORT__MAX_TOKENS", "100"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.log.format, LogFormat::Json);
        assert_eq!(settings.embedder.provider, EmbedderProvider::Openai);
        assert_eq!(
            settings.research.search.tavily_search_depth,
            TavilyDepth::Advanced
        );
        assert_eq!(
            settings.llm.roles[&ModelRole::FinalReport].max_tokens,
            Some(100)
        );
        let message =
            Settings::load_from(&Overrides::default(), env(&[("MNEMO__LOG__FORMAT", "xml")]))
                .unwrap_err()
                .to_string();
        assert!(
            message.contains("log.format") && message.contains("xml"),
            "{message}"
        );
    }
}
