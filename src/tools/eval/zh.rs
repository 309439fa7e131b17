//! `mnemo eval zh`: recall on the hand-written Chinese set in `eval/zh` (`memories.json`,
//! `queries.json`; the query types are described in `eval/zh/README.md`), measured on the
//! product's own path.
//!
//! The memory engine is the one a server builds from the same settings
//! (`startup::open_memory`: the configured embedder behind the server's `EmbedQueue`, Qdrant
//! Edge and tantivy), over a scratch SQLite store under `<out>/scratch`; a Qdrant server or a
//! PostgreSQL database named in the settings is never touched. `embedder.model_dir` (or
//! `MNEMO__EMBEDDER__MODEL_DIR`) picks the model, as for the server.
//!
//! Every memory is written for one fresh user as `POST /v1/memories` writes it — one
//! `MemoryEngine::add` of `NewMemory::from_user(kind, content, 3)` per memory — and the
//! evaluation waits until the indexes have applied the memory log. The indexes are then rebuilt
//! from SQL (the `mnemo reindex` path), so the keyword index is one segment and BM25 ties break
//! the same way on every run, as `mnemo eval locomo` does.
//!
//! Every query is asked as `GET|POST /v1/memories/search` and the `recall_memory` tool ask
//! it: hybrid recall with decay and the shipped memory settings, k = 10. Recall goes through
//! `MemoryEngine::recall_at` with the engine's own settings at a fixed clock (the end of
//! ingestion), which is `recall` without recording accesses, so a query cannot change what
//! the next one sees. The same recall with `mode` = `keyword` (BM25 only) and `vector` (dense
//! only), the API's own switch, gives the two ablation rows.
//!
//! Output: a table on stdout (also `results.md`), `results.json` (everything), and
//! `per_query.jsonl` (one line per query and run, with the recalled dataset ids).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio_util::sync::CancellationToken;

use mnemo::config::Settings;
use mnemo::memory::rank::RecallMode;
use mnemo::memory::{MemoryEngine, RecallRequest};
use mnemo::store::{self, MemoryId, MemoryKind, NewMemory, Store, UserKind};

use super::metrics;

/// The query types of `eval/zh/README.md`, in display order; other types follow, sorted.
pub const QUERY_TYPES: [&str; 7] = [
    "single_char",
    "word",
    "subword",
    "paraphrase",
    "variant",
    "mixed",
    "question",
];

/// The k of recall@k and NDCG@k; the largest is what recall is asked for.
pub const KS: [usize; 3] = [1, 5, 10];

/// The importance `POST /v1/memories` gives a memory when the body names none.
const API_IMPORTANCE: u8 = 3;

/// The memory kinds the set may use (`eval/zh/README.md`).
const KINDS: [MemoryKind; 3] = [MemoryKind::Fact, MemoryKind::Preference, MemoryKind::Event];

/// Problems listed at most in one error.
const MAX_PROBLEMS: usize = 10;

// --- the data set ---------------------------------------------------------------------------

/// One entry of `memories.json`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ZhMemory {
    pub id: String,
    pub content: String,
    pub kind: String,
}

/// One entry of `queries.json`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ZhQuery {
    pub id: String,
    pub query: String,
    #[serde(rename = "type")]
    pub query_type: String,
    pub relevant: Vec<String>,
}

/// The set as read and checked: every kind known, every id unique, every relevant id a
/// memory of the set.
#[derive(Debug, Clone, PartialEq)]
pub struct ZhSet {
    pub memories: Vec<ZhMemory>,
    pub queries: Vec<ZhQuery>,
    /// sha256 of `memories.json` and `queries.json` as read.
    pub sha256: (String, String),
}

impl ZhSet {
    /// Reads `memories.json` and `queries.json` from `dir`; a missing, malformed or
    /// inconsistent file is an error naming the file and every broken rule (up to ten).
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let read = |name: &str| -> anyhow::Result<Vec<u8>> {
            let path = dir.join(name);
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        let (memories_bytes, queries_bytes) = (read("memories.json")?, read("queries.json")?);
        let memories: Vec<ZhMemory> = serde_json::from_slice(&memories_bytes)
            .with_context(|| format!("parsing {}", dir.join("memories.json").display()))?;
        let queries: Vec<ZhQuery> = serde_json::from_slice(&queries_bytes)
            .with_context(|| format!("parsing {}", dir.join("queries.json").display()))?;
        let set = Self {
            memories,
            queries,
            sha256: (
                hex::encode(sha2::Sha256::digest(&memories_bytes)),
                hex::encode(sha2::Sha256::digest(&queries_bytes)),
            ),
        };
        set.check()
            .with_context(|| format!("the zh eval set in {} is inconsistent", dir.display()))?;
        Ok(set)
    }

    fn check(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        let mut memory_ids = BTreeSet::new();
        for memory in &self.memories {
            if !memory_ids.insert(memory.id.as_str()) {
                problems.push(format!("memory id {} appears twice", memory.id));
            }
            if memory.content.trim().is_empty() {
                problems.push(format!("memory {} has no content", memory.id));
            }
            if kind_of(&memory.kind).is_none() {
                problems.push(format!(
                    "memory {} has kind {:?}; expected fact, preference or event",
                    memory.id, memory.kind
                ));
            }
        }
        let mut query_ids = BTreeSet::new();
        for query in &self.queries {
            if !query_ids.insert(query.id.as_str()) {
                problems.push(format!("query id {} appears twice", query.id));
            }
            if query.query.trim().is_empty() {
                problems.push(format!("query {} has no text", query.id));
            }
            if query.query_type.trim().is_empty() {
                problems.push(format!("query {} has no type", query.id));
            }
            if query.relevant.is_empty() {
                problems.push(format!("query {} lists no relevant memory", query.id));
            }
            for id in &query.relevant {
                if !memory_ids.contains(id.as_str()) {
                    problems.push(format!("query {} names unknown memory {id}", query.id));
                }
            }
        }
        if self.memories.is_empty() {
            problems.push("memories.json holds no memory".to_string());
        }
        if self.queries.is_empty() {
            problems.push("queries.json holds no query".to_string());
        }
        if problems.is_empty() {
            return Ok(());
        }
        let more = problems.len().saturating_sub(MAX_PROBLEMS);
        problems.truncate(MAX_PROBLEMS);
        if more > 0 {
            problems.push(format!("and {more} more"));
        }
        bail!("{}", problems.join("; "))
    }

    /// The first `n` memories and the queries whose relevant memories are all among them.
    pub fn first_memories(mut self, n: usize) -> Self {
        self.memories.truncate(n);
        let kept: BTreeSet<&str> = self.memories.iter().map(|m| m.id.as_str()).collect();
        self.queries
            .retain(|query| query.relevant.iter().all(|id| kept.contains(id.as_str())));
        self
    }

    /// The query types present, in display order.
    pub fn query_types(&self) -> Vec<String> {
        let present: BTreeSet<&str> = self.queries.iter().map(|q| q.query_type.as_str()).collect();
        let mut types: Vec<String> = QUERY_TYPES
            .iter()
            .filter(|t| present.contains(*t))
            .map(ToString::to_string)
            .collect();
        types.extend(
            present
                .iter()
                .filter(|t| !QUERY_TYPES.contains(t))
                .map(ToString::to_string),
        );
        types
    }
}

fn kind_of(text: &str) -> Option<MemoryKind> {
    MemoryKind::parse(text).filter(|kind| KINDS.contains(kind))
}

// --- what is measured -----------------------------------------------------------------------

/// One row of the report: the product's hybrid recall, or an ablation by one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZhRetrieval {
    /// The product: hybrid recall, shipped settings.
    Hybrid,
    /// Ablation: BM25 alone (`mode: keyword`).
    Bm25,
    /// Ablation: dense vectors alone (`mode: vector`).
    Vector,
}

impl ZhRetrieval {
    pub const ALL: [ZhRetrieval; 3] = [ZhRetrieval::Hybrid, ZhRetrieval::Bm25, ZhRetrieval::Vector];

    pub fn key(self) -> &'static str {
        match self {
            ZhRetrieval::Hybrid => "hybrid",
            ZhRetrieval::Bm25 => "bm25",
            ZhRetrieval::Vector => "vector",
        }
    }

    fn label(self) -> &'static str {
        match self {
            ZhRetrieval::Hybrid => "hybrid (product)",
            ZhRetrieval::Bm25 => "bm25 only",
            ZhRetrieval::Vector => "vector only",
        }
    }

    fn mode(self) -> RecallMode {
        match self {
            ZhRetrieval::Hybrid => RecallMode::Hybrid,
            ZhRetrieval::Bm25 => RecallMode::Keyword,
            ZhRetrieval::Vector => RecallMode::Vector,
        }
    }

    fn description(self) -> &'static str {
        match self {
            ZhRetrieval::Hybrid => {
                "the product's recall (memories/search, recall_memory): hybrid, decay, shipped settings"
            }
            ZhRetrieval::Bm25 => "ablation: the same recall with mode keyword (BM25 only)",
            ZhRetrieval::Vector => "ablation: the same recall with mode vector (dense only)",
        }
    }
}

/// What `mnemo eval zh` runs.
#[derive(Debug, Clone)]
pub struct ZhOptions {
    /// The directory holding `memories.json` and `queries.json` (read only).
    pub data: PathBuf,
    /// Where results go (created): `results.json`, `results.md`, `per_query.jsonl`; the
    /// scratch store lives in `<out_dir>/scratch` while the evaluation runs.
    pub out_dir: PathBuf,
    /// The embedder and memory settings, as the server would load them. Data directory,
    /// database and Qdrant URLs are replaced by the scratch store.
    pub settings: Settings,
    /// Only the first N memories, and the queries whose relevant memories are all among them.
    pub limit_memories: Option<usize>,
}

/// Scores of one row, overall and per query type.
#[derive(Debug, Clone, Serialize)]
pub struct ZhRun {
    pub key: String,
    pub product: bool,
    pub description: String,
    pub overall: metrics::Means,
    pub by_type: BTreeMap<String, metrics::Means>,
    /// Queries for which recall returned nothing (the query gate or the floor), per type.
    pub empty: usize,
    pub empty_by_type: BTreeMap<String, usize>,
    /// Wall time of one recall.
    pub latency: metrics::Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct ZhEmbedder {
    pub model_id: String,
    pub dimension: usize,
    pub provider: String,
    pub model_dir: String,
}

/// The recall settings every row used.
#[derive(Debug, Clone, Serialize)]
pub struct ZhRecallSettings {
    pub k: usize,
    pub decay: bool,
    pub candidates: usize,
    pub fusion: String,
    pub gate_cosine: f64,
    pub gate_coverage: f64,
    pub floor_cosine: f64,
    pub floor_coverage: f64,
    pub rrf_k: f64,
}

/// Everything `results.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct ZhReport {
    pub dataset: String,
    pub data: String,
    pub memories_sha256: String,
    pub queries_sha256: String,
    pub memories: usize,
    pub queries: usize,
    pub limit_memories: Option<usize>,
    pub embedder: ZhEmbedder,
    pub recall: ZhRecallSettings,
    pub ks: Vec<usize>,
    /// Query types present, in display order.
    pub types: Vec<String>,
    pub runs: Vec<ZhRun>,
    pub ingest_secs: f64,
    pub query_secs: f64,
    pub elapsed_secs: f64,
}

impl ZhReport {
    /// One line for the terminal: recall@5 of each row, and the model.
    pub fn headline(&self) -> String {
        let rows: Vec<String> = self
            .runs
            .iter()
            .map(|run| {
                let at5 = run.overall.recall.get(&5).copied().unwrap_or(0.0);
                format!("{} R@5 {at5:.3}", run.key)
            })
            .collect();
        format!(
            "zh: {} ({} queries, {}, {:.0} s)",
            rows.join(", "),
            self.queries,
            self.embedder.model_id,
            self.elapsed_secs
        )
    }
}

/// What a finished evaluation returns.
#[derive(Debug, Clone)]
pub struct ZhSummary {
    pub report: ZhReport,
    /// The table printed on stdout (also `results.md`).
    pub table: String,
    pub results_json: PathBuf,
    pub results_md: PathBuf,
    pub per_query: PathBuf,
}

// --- the run --------------------------------------------------------------------------------

/// Runs the evaluation and writes its results into `options.out_dir`.
pub async fn run_zh(options: ZhOptions) -> anyhow::Result<ZhSummary> {
    let started = Instant::now();
    let mut set = ZhSet::load(&options.data)?;
    if let Some(limit) = options.limit_memories {
        set = set.first_memories(limit);
        if set.queries.is_empty() {
            bail!("no query has all its relevant memories among the first {limit}");
        }
    }
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("creating {}", options.out_dir.display()))?;
    let scratch_root = options.out_dir.join("scratch");
    super::prepare_scratch(&scratch_root, &options.out_dir)?;

    let scratch = ProductScratch::open(&scratch_root, &options.settings).await?;
    let outcome = evaluate(&scratch, &set, &options, started).await;
    scratch.close().await;
    if let Err(error) = std::fs::remove_dir_all(&scratch_root) {
        tracing::warn!(%error, dir = %scratch_root.display(), "removing the eval scratch directory failed");
    }
    outcome
}

async fn evaluate(
    scratch: &ProductScratch,
    set: &ZhSet,
    options: &ZhOptions,
    started: Instant,
) -> anyhow::Result<ZhSummary> {
    let engine = &scratch.engine;
    let ingest_started = Instant::now();
    let (user, dataset_id) = ingest(scratch, set).await?;
    let ingest_secs = ingest_started.elapsed().as_secs_f64();
    eprintln!(
        "zh: {} memories written and indexed in {ingest_secs:.1} s",
        set.memories.len()
    );

    let per_query_path = options.out_dir.join("per_query.jsonl");
    let mut per_query = std::io::BufWriter::new(
        std::fs::File::create(&per_query_path)
            .with_context(|| format!("creating {}", per_query_path.display()))?,
    );
    let memory_settings = engine.settings().clone();
    let k = KS[KS.len() - 1];
    let now = chrono::Utc::now();
    let query_started = Instant::now();
    let mut runs = Vec::new();
    for retrieval in ZhRetrieval::ALL {
        let mut aggregate = metrics::Aggregate::new(&KS);
        let mut empty_by_type: BTreeMap<String, usize> = BTreeMap::new();
        let mut latencies = Vec::with_capacity(set.queries.len());
        for query in &set.queries {
            let request = RecallRequest {
                query: query.query.clone(),
                k: Some(k),
                mode: retrieval.mode(),
                decay: true,
                ..RecallRequest::default()
            };
            let asked = Instant::now();
            let response = engine
                .recall_at(user, request, &memory_settings, now)
                .await
                .with_context(|| format!("recall for {} ({})", query.id, retrieval.key()))?;
            latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
            let recalled: Vec<String> = response
                .results
                .iter()
                .map(|r| {
                    dataset_id
                        .get(&r.memory.id)
                        .cloned()
                        .unwrap_or_else(|| r.memory.id.to_string())
                })
                .collect();
            let relevant: BTreeSet<String> = query.relevant.iter().cloned().collect();
            let refs: Vec<Vec<String>> = recalled.iter().map(|id| vec![id.clone()]).collect();
            let score = metrics::score(&relevant, &refs, &KS);
            aggregate.add(&query.query_type, &score);
            let entry = empty_by_type.entry(query.query_type.clone()).or_default();
            *entry += usize::from(recalled.is_empty());
            let line = serde_json::json!({
                "run": retrieval.key(),
                "query": query.id,
                "type": query.query_type,
                "text": query.query,
                "relevant": query.relevant,
                "recalled": recalled,
                "first_relevant_rank": recalled
                    .iter()
                    .position(|id| relevant.contains(id))
                    .map(|index| index + 1),
                "recall": KS.iter().copied().zip(score.recall.iter().copied())
                    .collect::<BTreeMap<usize, f64>>(),
                "ndcg": KS.iter().copied().zip(score.ndcg.iter().copied())
                    .collect::<BTreeMap<usize, f64>>(),
            });
            writeln!(per_query, "{line}").context("writing per_query.jsonl")?;
        }
        latencies.sort_by(f64::total_cmp);
        runs.push(ZhRun {
            key: retrieval.key().to_string(),
            product: retrieval == ZhRetrieval::Hybrid,
            description: retrieval.description().to_string(),
            overall: aggregate.overall(),
            by_type: aggregate.by_category(),
            empty: empty_by_type.values().sum(),
            empty_by_type,
            latency: metrics::latency(&latencies),
        });
    }
    per_query.flush().context("writing per_query.jsonl")?;
    let query_secs = query_started.elapsed().as_secs_f64();

    let embedder = engine.embedder();
    let fusion = &memory_settings.fusion;
    let report = ZhReport {
        dataset: "eval/zh".to_string(),
        data: options.data.display().to_string(),
        memories_sha256: set.sha256.0.clone(),
        queries_sha256: set.sha256.1.clone(),
        memories: set.memories.len(),
        queries: set.queries.len(),
        limit_memories: options.limit_memories,
        embedder: ZhEmbedder {
            model_id: embedder.model_id().to_string(),
            dimension: embedder.dimension(),
            provider: options.settings.embedder.provider.as_str().to_string(),
            model_dir: options.settings.embedder.model_dir.display().to_string(),
        },
        recall: ZhRecallSettings {
            k,
            decay: true,
            candidates: memory_settings.candidates,
            fusion: fusion.method.as_str().to_string(),
            gate_cosine: fusion.gate_cosine(),
            gate_coverage: fusion.gate_coverage,
            floor_cosine: fusion.floor_cosine(),
            floor_coverage: fusion.floor_coverage,
            rrf_k: memory_settings.rrf_k,
        },
        ks: KS.to_vec(),
        types: set.query_types(),
        runs,
        ingest_secs,
        query_secs,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    let table = render_table(&report);
    let results_json = options.out_dir.join("results.json");
    let results_md = options.out_dir.join("results.md");
    std::fs::write(&results_json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", results_json.display()))?;
    std::fs::write(&results_md, &table)
        .with_context(|| format!("writing {}", results_md.display()))?;
    Ok(ZhSummary {
        report,
        table,
        results_json,
        results_md,
        per_query: per_query_path,
    })
}

/// Writes every memory for one fresh user as `POST /v1/memories` does, one call each, and
/// waits until recall sees them; returns the user and the dataset id of each memory.
async fn ingest(
    scratch: &ProductScratch,
    set: &ZhSet,
) -> anyhow::Result<(store::UserId, HashMap<MemoryId, String>)> {
    let user = scratch
        .store
        .accounts()
        .create_user("zh-eval", UserKind::Key)
        .await?
        .id;
    let mut dataset_id = HashMap::with_capacity(set.memories.len());
    for memory in &set.memories {
        let kind = kind_of(&memory.kind)
            .with_context(|| format!("memory {} has kind {:?}", memory.id, memory.kind))?;
        let new = NewMemory::from_user(kind, memory.content.trim(), API_IMPORTANCE);
        let written = scratch
            .engine
            .add(user, vec![new])
            .await
            .with_context(|| format!("adding memory {}", memory.id))?;
        for stored in written {
            dataset_id.insert(stored.id, memory.id.clone());
        }
    }
    super::scratch::settle(&scratch.engine).await?;
    Ok((user, dataset_id))
}

/// The server's memory engine (`startup::open_memory`) over a scratch SQLite store.
struct ProductScratch {
    engine: Arc<MemoryEngine>,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
}

impl ProductScratch {
    async fn open(dir: &Path, settings: &Settings) -> anyhow::Result<Self> {
        let settings = super::scratch::scratch_settings(settings, dir);
        let url = format!("sqlite://{}?mode=rwc", dir.join("mnemo.db").display());
        let store = store::connect(
            &url,
            settings.database.max_connections.max(2),
            settings.database.acquire_timeout(),
        )
        .await?;
        let shutdown = CancellationToken::new();
        let engine = mnemo::startup::open_memory(&settings, store.clone(), shutdown.clone())
            .await
            .context("opening the memory engine")?;
        Ok(Self {
            engine,
            store,
            shutdown,
        })
    }

    /// Stops the indexer and closes the indexes before the pool goes.
    async fn close(self) {
        super::scratch::close_scratch(&self.engine, &self.shutdown).await;
        self.store.close().await;
    }
}

// --- the table ------------------------------------------------------------------------------

/// The markdown table: one block of rows per retrieval, `all` first, then each type.
pub fn render_table(report: &ZhReport) -> String {
    let mut out = String::new();
    let recall = &report.recall;
    out.push_str(&format!(
        "# mnemo eval zh\n\n{} memories, {} queries ({}); embedder `{}` ({}, {} dimensions)\n\n",
        report.memories,
        report.queries,
        report.data,
        report.embedder.model_id,
        report.embedder.provider,
        report.embedder.dimension,
    ));
    out.push_str(&format!(
        "Recall as `memories/search` and `recall_memory` run it: k = {}, decay on, {} candidates per list, {} fusion, gate {}/{}, floor {}/{}. `empty`: queries that got no memory at all.\n\n",
        recall.k,
        recall.candidates,
        recall.fusion,
        recall.gate_cosine,
        recall.gate_coverage,
        recall.floor_cosine,
        recall.floor_coverage,
    ));
    out.push_str("| run | type | n | R@1 | R@5 | R@10 | NDCG@10 | empty |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for run in &report.runs {
        let label = ZhRetrieval::ALL
            .iter()
            .find(|r| r.key() == run.key)
            .map_or(run.key.as_str(), |r| r.label());
        let mut row = |name: &str, means: &metrics::Means, empty: usize| {
            let at = |map: &BTreeMap<usize, f64>, k: usize| {
                map.get(&k)
                    .map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
            };
            out.push_str(&format!(
                "| {label} | {name} | {} | {} | {} | {} | {} | {empty} |\n",
                means.n,
                at(&means.recall, 1),
                at(&means.recall, 5),
                at(&means.recall, 10),
                at(&means.ndcg, 10),
            ));
        };
        row("all", &run.overall, run.empty);
        for query_type in &report.types {
            if let Some(means) = run.by_type.get(query_type) {
                let empty = run.empty_by_type.get(query_type).copied().unwrap_or(0);
                row(query_type, means, empty);
            }
        }
    }
    out.push_str(&format!(
        "\nRecall latency (p50): {}. Ingest {:.1} s, queries {:.1} s.\n",
        report
            .runs
            .iter()
            .map(|run| format!("{} {:.1} ms", run.key, run.latency.p50_ms))
            .collect::<Vec<_>>()
            .join(", "),
        report.ingest_secs,
        report.query_secs,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_set_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/zh")
    }

    fn model_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2")
    }

    fn write_set(dir: &Path, memories: &str, queries: &str) {
        std::fs::write(dir.join("memories.json"), memories).unwrap();
        std::fs::write(dir.join("queries.json"), queries).unwrap();
    }

    #[test]
    fn the_zh_set_in_the_repository_loads_and_subsets() {
        let set = ZhSet::load(&repo_set_dir()).unwrap();
        assert_eq!((set.memories.len(), set.queries.len()), (250, 135));
        assert_eq!(set.query_types(), QUERY_TYPES);
        let subset = set.first_memories(30);
        assert_eq!(subset.memories.len(), 30);
        let ids: BTreeSet<&str> = subset.memories.iter().map(|m| m.id.as_str()).collect();
        assert!(!subset.queries.is_empty());
        assert!(
            subset
                .queries
                .iter()
                .all(|q| q.relevant.iter().all(|id| ids.contains(id.as_str())))
        );
        // 乌龙茶 (q-020) finds zh-013 only, which is among the first 30.
        assert!(subset.queries.iter().any(|q| q.id == "q-020"));
    }

    #[test]
    fn a_broken_zh_set_is_refused_with_every_problem_named() {
        let dir = tempfile::tempdir().unwrap();
        write_set(
            dir.path(),
            r#"[{"id": "zh-001", "content": "我养了一只猫。", "kind": "fact"},
                {"id": "zh-001", "content": " ", "kind": "turn"}]"#,
            r#"[{"id": "q-001", "query": "猫", "type": "single_char", "relevant": ["zh-009"]}]"#,
        );
        let error = format!("{:#}", ZhSet::load(dir.path()).unwrap_err());
        for expected in [
            "memory id zh-001 appears twice",
            "has no content",
            "kind \"turn\"",
            "query q-001 names unknown memory zh-009",
        ] {
            assert!(error.contains(expected), "{expected}: {error}");
        }
        write_set(dir.path(), "[{\"id\": 1}]", "[]");
        let error = format!("{:#}", ZhSet::load(dir.path()).unwrap_err());
        assert!(
            error.contains("parsing") && error.contains("memories.json"),
            "{error}"
        );
        let missing = dir.path().join("absent");
        let error = format!("{:#}", ZhSet::load(&missing).unwrap_err());
        assert!(
            error.contains("reading") && error.contains("memories.json"),
            "{error}"
        );
    }

    /// The whole evaluation on the first 50 memories (25 queries, every type) with the local
    /// model, through the server's memory engine.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zh_eval_end_to_end_on_a_subset() {
        assert!(
            model_dir().join("model.safetensors").exists(),
            "the embedding model is missing in {}: run scripts/fetch-model",
            model_dir().display()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        settings.embedder.model_dir = model_dir();
        let out = dir.path().join("results");
        let summary = run_zh(ZhOptions {
            data: repo_set_dir(),
            out_dir: out.clone(),
            settings,
            limit_memories: Some(50),
        })
        .await
        .unwrap();
        let report = &summary.report;
        assert_eq!(report.memories, 50);
        let expected = ZhSet::load(&repo_set_dir()).unwrap().first_memories(50);
        assert_eq!(report.queries, expected.queries.len());
        assert_eq!(
            report.types, QUERY_TYPES,
            "the first 50 memories cover every type"
        );
        assert_eq!(report.embedder.model_id, "all-MiniLM-L6-v2");
        assert!(!out.join("scratch").exists(), "scratch removed");

        let keys: Vec<&str> = report.runs.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["hybrid", "bm25", "vector"]);
        for run in &report.runs {
            let types: Vec<&String> = run.by_type.keys().collect();
            assert_eq!(types.len(), QUERY_TYPES.len(), "{}: {types:?}", run.key);
            assert_eq!(run.overall.n, report.queries);
            let ks: Vec<usize> = run.overall.recall.keys().copied().collect();
            assert_eq!(ks, KS);
        }

        // Per query: the recalled dataset ids, one line per query and run.
        let text = std::fs::read_to_string(&summary.per_query).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 3 * report.queries);
        let rank = |run: &str, query: &str| -> Option<u64> {
            let line = lines
                .iter()
                .find(|l| l["run"] == run && l["query"] == query)
                .unwrap_or_else(|| panic!("{run} {query}"));
            line["first_relevant_rank"].as_u64()
        };
        // Words that occur literally in one memory each: 乌龙茶 (zh-013), 柯基 (zh-002).
        for query in ["q-020", "q-022"] {
            for run in ["hybrid", "bm25"] {
                let found = rank(run, query);
                assert!(
                    found.is_some_and(|r| r <= 5),
                    "{run} {query}: first relevant at {found:?}"
                );
            }
        }
        let tea = lines
            .iter()
            .find(|l| l["run"] == "hybrid" && l["query"] == "q-020")
            .unwrap();
        assert!(
            tea["recalled"]
                .as_array()
                .unwrap()
                .iter()
                .all(|id| id.as_str().is_some_and(|id| id.starts_with("zh-"))),
            "{tea}"
        );

        // The files and the table say the same.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary.results_json).unwrap()).unwrap();
        assert_eq!(json["embedder"]["model_id"], "all-MiniLM-L6-v2");
        assert_eq!(json["runs"][0]["product"], true);
        let table = &summary.table;
        assert!(table.contains("`all-MiniLM-L6-v2`"), "{table}");
        for query_type in QUERY_TYPES {
            assert!(
                table.contains(&format!("| hybrid (product) | {query_type} |")),
                "{query_type}: {table}"
            );
        }
        assert!(table.contains("| bm25 only | all |"), "{table}");
        assert!(table.contains("| vector only | all |"), "{table}");
        assert_eq!(
            std::fs::read_to_string(&summary.results_md).unwrap(),
            *table
        );
        let headline = report.headline();
        assert!(
            headline.starts_with("zh: hybrid R@5 ") && headline.contains("all-MiniLM-L6-v2"),
            "{headline}"
        );
    }
}
