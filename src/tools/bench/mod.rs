//! `mnemo bench recall`: a scale benchmark of the embedded stack (SQLite + Qdrant Edge +
//! tantivy in one data directory), printed as one markdown table.
//!
//! It builds a synthetic corpus — sentences drawn from a fixed Zipf vocabulary with a seeded
//! xorshift PRNG, each with a precomputed bag-of-words unit vector — and measures, in order:
//! ingest and query embedding with the real local model (if there is one), `Indexer::rebuild`
//! of a one-user store (the `mnemo reindex` path), SQL ingest and index catch-up of the full
//! corpus, recall latency for the big user before, during and after the HNSW optimisation, and
//! the lag from a committed write to recallable.
//!
//! The big user's vectors are, by default, the local model's embeddings of their texts,
//! computed before the insert (`--user-vectors synthetic` keeps bag-of-words vectors for them
//! too). Bag-of-words vectors are close to uniform in 384 dimensions, where an HNSW walk costs
//! nearly as much as a scan; a text model's vectors are not.
//!
//! Recall runs through `MemoryEngine::recall` with the bench's embedder, which hands out the
//! vectors of queries embedded before the series starts; every latency is the call's wall time
//! minus the query-embedding time the engine reports. Real query-embedding cost is measured on
//! its own.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use chrono::Utc;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use mnemo::config::{EmbedderSettings, MemorySettings, QdrantSettings};
use mnemo::index::edge::EdgeVectorIndex;
use mnemo::index::indexer::{Indexer, VectorWatermark};
use mnemo::index::keyword::{KeywordIndex, KeywordSearch};
use mnemo::index::vector::{VectorFilter, VectorIndex};
use mnemo::llm::embed::{EmbedError, Embedder, LocalEmbedder};
use mnemo::memory::rank::RecallMode;
use mnemo::memory::{MemoryEngine, RecallRequest, RecallTimings};
use mnemo::store::{
    Embedded, MemoryFilter, MemoryId, MemoryKind, MemorySource, NewMemory, SqliteStore, Store,
    Trust, UserId, UserKind,
};

/// Vector dimension of the synthetic corpus (that of all-MiniLM-L6-v2).
pub const DIMENSION: usize = 384;
mod corpus;
mod ingest;
mod machine;
mod model;
mod numbers;
mod optimize;
mod recall;

use corpus::*;
use machine::*;
use numbers::*;

const MODEL_ID: &str = "bench-synthetic-384";
const SEED: u64 = 0x6d6e_656d_6f5f_6265;
/// Words in the vocabulary: the English list below, then generated pseudo-words.
const VOCABULARY: usize = 20_000;
/// Zipf–Mandelbrot offset: the most frequent word is ~0.7% of all words, as for content words.
const ZIPF_OFFSET: f64 = 20.0;
/// Rows per `insert_memories` call (one transaction).
const SQL_BATCH: usize = 2000;
/// The corpus is written in this many rounds over all users, so users' memories interleave.
const ROUNDS: usize = 10;
/// The big user's memories are turns of threads this long (so recall searches their context
/// views too, as for a real conversation's turns).
const TURNS_PER_THREAD: usize = 50;
/// Memories per `MemoryEngine::add` call in the model ingest.
const MODEL_BATCH: usize = 16;
/// Texts per call when the model embeds the big user's memories or a set of queries.
const EMBED_CHUNK: usize = 256;
/// Queries prepared for the recall samples taken during the HNSW build (used in a cycle).
const OPTIMIZE_QUERY_POOL: usize = 1000;
const RECALL_K: usize = 10;
const WARMUP_QUERIES: usize = 10;

/// HNSW beam widths tried after the main series (`None`: the engine's default, 100).
const BEAM_WIDTHS: [Option<usize>; 3] = [None, Some(64), Some(50)];

/// Queries per beam width.
const BEAM_QUERIES: usize = 250;
/// Recall samples taken while the optimisation runs are this far apart.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What `run_recall_bench` does; `Default` is the full-size run.
#[derive(Debug, Clone)]
pub struct RecallBenchOptions {
    /// Scratch directory; must be empty or absent. Removed content at the end unless `keep_data`.
    pub data_dir: PathBuf,
    /// Memories in the corpus.
    pub total: usize,
    /// How many of them belong to the one big user whose recall is measured.
    pub user_memories: usize,
    /// Users, the big one included; the others share the rest evenly.
    pub users: usize,
    /// Recall queries per measured series.
    pub queries: usize,
    /// Local model for the ingest and query-embedding timings; `None` (or a directory without
    /// a model) skips them.
    pub model_dir: Option<PathBuf>,
    /// Memories embedded and added through `MemoryEngine::add` with the model.
    pub model_memories: usize,
    /// Memories in the separate store rebuilt by `Indexer::rebuild` (0 skips).
    pub reindex_memories: usize,
    /// Sequential single writes timed from commit to recallable.
    pub lag_writes: usize,
    /// Build HNSW (`VectorIndex::optimize`) and measure recall during and after it.
    pub optimize: bool,
    /// Leave the generated stores in `data_dir`.
    pub keep_data: bool,
    /// HNSW beam width of the main recall series (`qdrant.search_ef`); after them the bench
    /// also tries [`BEAM_WIDTHS`].
    pub search_ef: Option<usize>,
    /// Users with at least this many memories move to an Edge shard of their own when the
    /// index is optimised (`qdrant.tenant_shard_points`; 0 keeps everyone in the shared shard).
    pub tenant_shard_points: u64,
    /// Where the big user's vectors (and the queries run against them) come from.
    pub user_vectors: UserVectors,
}

/// Where the big user's vectors come from. The other users always get bag-of-words vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UserVectors {
    /// The local model embeds the big user's texts and the queries against them (needs the
    /// model; falls back to `synthetic` without it).
    Model,
    /// Bag-of-words unit vectors: every word a random direction. Nearly uniform in 384-d, so
    /// much harder for HNSW than a text model's embeddings.
    Synthetic,
}

/// Memories of the typical user, whose recall has its own target.
const TYPICAL_MEMORIES: usize = 1000;

impl Default for RecallBenchOptions {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("bench-data"),
            total: 1_000_000,
            user_memories: 100_000,
            users: 1000,
            queries: 1000,
            model_dir: Some(EmbedderSettings::default().model_dir),
            model_memories: 2000,
            reindex_memories: 100_000,
            lag_writes: 200,
            optimize: true,
            keep_data: false,
            search_ef: QdrantSettings::default().search_ef,
            tenant_shard_points: QdrantSettings::default().tenant_shard_points,
            user_vectors: UserVectors::Model,
        }
    }
}

impl RecallBenchOptions {
    fn validate(&self) -> anyhow::Result<()> {
        if self.users == 0 || self.user_memories == 0 || self.queries == 0 {
            bail!("users, user memories and queries must be positive");
        }
        if self.user_memories > self.total {
            bail!(
                "the big user's memories ({}) exceed the total ({})",
                self.user_memories,
                self.total
            );
        }
        if self.users == 1 && self.total > self.user_memories {
            bail!("with one user, the total must equal the big user's memories");
        }
        Ok(())
    }

    /// Memories of user `index`: 0 is the big user, 1 the typical user (`TYPICAL_MEMORIES`,
    /// when the rest allows it), the others share the rest.
    fn share(&self, index: usize) -> usize {
        if index == 0 {
            return self.user_memories;
        }
        let others = self.users - 1;
        let mut rest = self.total - self.user_memories;
        let typical = others > 1 && rest >= TYPICAL_MEMORIES * 2;
        if typical {
            if index == 1 {
                return TYPICAL_MEMORIES;
            }
            rest -= TYPICAL_MEMORIES;
            let (others, index) = (others - 1, index - 1);
            return rest / others + usize::from(index - 1 < rest % others);
        }
        rest / others + usize::from(index - 1 < rest % others)
    }
}

/// Runs the benchmark and writes its markdown report to `out` (rows appear as they are
/// measured); progress bars go to stderr.
pub async fn run_recall_bench(
    options: RecallBenchOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    options.validate()?;
    let created_dir = prepare_dir(&options.data_dir)?;
    let corpus = Arc::new(
        tokio::task::spawn_blocking(|| Corpus::new(SEED))
            .await
            .context("building the vocabulary")?,
    );
    let model = load_model(options.model_dir.as_deref()).await?;
    let vectors = Arc::new(BenchEmbedder {
        corpus: corpus.clone(),
        model: match &model {
            Some(model)
                if options.user_vectors == UserVectors::Model
                    && model.embedder.dimension() == DIMENSION =>
            {
                Some(model.embedder.clone())
            }
            _ => None,
        },
        cache: parking_lot::Mutex::new(HashMap::new()),
    });
    let shutdown = CancellationToken::new();
    let mut bench = Bench {
        rng: Rng::new(SEED ^ 0x5eed),
        corpus,
        model,
        vectors,
        out,
        started: Instant::now(),
        notes: Vec::new(),
        options,
    };
    let result = bench.run(&shutdown).await;
    shutdown.cancel();
    // After an error, give the indexer followers a moment to see the cancellation and flush.
    if result.is_err() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let options = bench.options;
    let cleanup = if options.keep_data {
        writeln!(bench.out, "\nData kept in {}.", options.data_dir.display()).map_err(Into::into)
    } else {
        remove_contents(&options.data_dir, created_dir)
    };
    // The benchmark's own error matters more than a failed cleanup.
    result.and(cleanup)
}

/// The local model, loaded once.
struct LoadedModel {
    embedder: Arc<dyn Embedder>,
    load_time: Duration,
}

/// Loads the model in `dir`; `None` without a directory or without a model in it.
async fn load_model(dir: Option<&Path>) -> anyhow::Result<Option<LoadedModel>> {
    let Some(dir) = dir.filter(|dir| mnemo::llm::embed::is_model_dir(dir)) else {
        return Ok(None);
    };
    let loading = spinner("loading the model");
    let started = Instant::now();
    let dir = dir.to_path_buf();
    let embedder = tokio::task::spawn_blocking(move || LocalEmbedder::load(&dir)).await??;
    loading.finish_and_clear();
    Ok(Some(LoadedModel {
        embedder: Arc::new(embedder),
        load_time: started.elapsed(),
    }))
}

struct Bench<'a> {
    options: RecallBenchOptions,
    corpus: Arc<Corpus>,
    model: Option<LoadedModel>,
    /// The main engine's embedder; `vectors.model` is set when the big user's vectors are
    /// the model's.
    vectors: Arc<BenchEmbedder>,
    rng: Rng,
    out: &'a mut dyn Write,
    started: Instant,
    notes: Vec<String>,
}

/// The main corpus's moving parts.
struct MainStack {
    store: Arc<dyn Store>,
    stop: CancellationToken,
    users: Vec<UserId>,
    vector: Arc<dyn VectorIndex>,
    engine: Arc<MemoryEngine>,
}

impl Bench<'_> {
    async fn run(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        self.header()?;
        let stack = self.main_ingest(shutdown).await?;
        self.model_phase(shutdown).await?;
        self.reindex_phase().await?;
        self.recall_rows(&stack, "4 recall, plain index (no HNSW)")
            .await?;
        if self.options.optimize {
            self.optimize_phase(&stack).await?;
            self.recall_rows(&stack, "4 recall, after optimize").await?;
            self.beam_phase(&stack).await?;
            self.filter_phase(&stack).await?;
        } else {
            self.notes.push(
                "HNSW was not built (optimize off): recall ran on plain (brute-force) segments."
                    .into(),
            );
        }
        self.lag_phase(&stack).await?;
        stop_engine(&stack.engine, &stack.stop).await;
        stack.store.close().await;
        self.footer()
    }

    fn row(&mut self, step: &str, what: &str, result: &str, target: &str) -> anyhow::Result<()> {
        writeln!(self.out, "| {step} | {what} | {result} | {target} |")?;
        self.out.flush()?;
        Ok(())
    }

    fn header(&mut self) -> anyhow::Result<()> {
        let o = &self.options;
        let others = o.users - 1;
        let profile = if cfg!(debug_assertions) {
            "dev/test profile (mnemo crate unoptimised, dependencies at opt-level 3)"
        } else {
            "release profile"
        };
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let settings = MemorySettings::default();
        writeln!(self.out, "## mnemo recall benchmark\n")?;
        let spread = if others > 1 && o.share(1) == TYPICAL_MEMORIES {
            format!(
                "; a typical user with {}; {} other users with ~{} each",
                count(TYPICAL_MEMORIES),
                others - 1,
                count(o.share(2))
            )
        } else {
            match (o.total - o.user_memories).checked_div(others) {
                Some(each) => format!("; {others} other users with ~{} each", count(each)),
                None => String::new(),
            }
        };
        writeln!(
            self.out,
            "- corpus: {} memories, {} users (big user {}{spread}); synthetic text from a \
             {}-word Zipf vocabulary, precomputed bag-of-words unit vectors ({DIMENSION}-d), fixed seed",
            count(o.total),
            count(o.users),
            count(o.user_memories),
            count(VOCABULARY),
        )?;
        let user_vectors = match (&self.vectors.model, self.options.user_vectors) {
            (Some(model), _) => format!(
                "{} embeddings of the big user's texts and of the queries against them (the \
                 other users keep the bag-of-words vectors)",
                model.model_id()
            ),
            (None, UserVectors::Model) => "bag-of-words vectors: model vectors were asked for, \
                 but there is no 384-d model to make them"
                .to_string(),
            (None, UserVectors::Synthetic) => "bag-of-words vectors (`--user-vectors \
                 synthetic`)"
                .to_string(),
        };
        writeln!(self.out, "- big user's vectors: {user_vectors}")?;
        writeln!(
            self.out,
            "- stack: SQLite (WAL) + Qdrant Edge 0.7.2 (HNSW m = 16, ef_construct = 100, `user_id` \
             as tenant index, segments merged towards one; search ef = {}; users with {} or more \
             memories in a shard of their own) + tantivy, in {}",
            o.search_ef
                .map_or_else(|| "engine default (100)".to_string(), |ef| ef.to_string()),
            match o.tenant_shard_points {
                0 => "(never)".to_string(),
                n => count(n as usize),
            },
            o.data_dir.display()
        )?;
        let load = load_average().map_or_else(String::new, |load| {
            format!("; load average at start {load}")
        });
        writeln!(self.out, "- build: {profile}; {cpus} CPUs{load}")?;
        writeln!(
            self.out,
            "- recall: `MemoryEngine::recall`, hybrid with the shipped settings (vector and BM25 \
             over the own and context views, min-max fused, the query gate, decay) unless noted, \
             k = {RECALL_K}, {} candidates per signal; times are wall time minus query embedding \
             (queries embedded before each series), so they cover both searches, SQL hydration and ranking\n",
            settings.candidates
        )?;
        writeln!(self.out, "| step | what | result | target |")?;
        writeln!(self.out, "|---|---|---|---|")?;
        self.out.flush()?;
        Ok(())
    }

    fn footer(&mut self) -> anyhow::Result<()> {
        let mut notes = std::mem::take(&mut self.notes);
        if let Some(peak) = peak_rss() {
            notes.push(format!("peak resident memory of the process: {peak}"));
        }
        if let Some(load) = load_average() {
            notes.push(format!("load average at the end: {load}"));
        }
        notes.push(format!(
            "whole benchmark: {}",
            seconds(self.started.elapsed())
        ));
        writeln!(self.out)?;
        for note in notes {
            writeln!(self.out, "- {note}")?;
        }
        self.out.flush()?;
        Ok(())
    }

    // --- 2: the real local model -----------------------------------------------------------
}

/// Stops the engine's background tasks and closes its indexes (flushed, no writes after),
/// so their files can be removed afterwards.
async fn stop_engine(engine: &Arc<MemoryEngine>, token: &CancellationToken) {
    token.cancel();
    engine.close(Duration::from_secs(30)).await;
}

/// One recall; returns the latency without query embedding, and the number of results.
async fn recall_once(
    engine: &MemoryEngine,
    user: UserId,
    query: String,
    mode: RecallMode,
) -> anyhow::Result<(f64, usize)> {
    let (search_ms, found, _) = recall_timed(engine, user, query, mode).await?;
    Ok((search_ms, found))
}

/// [`recall_once`] with the engine's per-stage timings.
async fn recall_timed(
    engine: &MemoryEngine,
    user: UserId,
    query: String,
    mode: RecallMode,
) -> anyhow::Result<(f64, usize, RecallTimings)> {
    let request = RecallRequest {
        query,
        k: Some(RECALL_K),
        mode,
        decay: true,
        ..RecallRequest::default()
    };
    let started = Instant::now();
    let response = engine.recall(user, request).await?;
    let wall = millis(started.elapsed());
    Ok((
        (wall - response.timings.embed_ms).max(0.0),
        response.results.len(),
        response.timings,
    ))
}

// --- stores and indexes --------------------------------------------------------------------

async fn open_sqlite(dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let url = format!("sqlite://{}?mode=rwc", dir.join("mnemo.db").display());
    Ok(Arc::new(
        SqliteStore::connect(&url, 4, std::time::Duration::from_secs(10)).await?,
    ))
}

async fn create_users(store: &dyn Store, prefix: &str, n: usize) -> anyhow::Result<Vec<UserId>> {
    let mut users = Vec::with_capacity(n);
    for index in 0..n {
        let user = store
            .accounts()
            .create_user(&format!("{prefix}-{index:05}"), UserKind::Key)
            .await?;
        users.push(user.id);
    }
    Ok(users)
}

/// The vector filter of a default recall: every kind but `document`, not archived, valid.
fn recall_vector_filter() -> VectorFilter {
    VectorFilter {
        kinds: Some(
            MemoryKind::ordinary()
                .iter()
                .map(|kind| kind.as_str().to_string())
                .collect(),
        ),
        ..VectorFilter::default()
    }
}

/// The indexes at the places `MemoryEngine::open` uses.
async fn open_indexes(
    dir: &Path,
    dimension: usize,
    options: &RecallBenchOptions,
) -> anyhow::Result<(Arc<dyn VectorIndex>, KeywordSearch, VectorWatermark)> {
    let vector_dir = EdgeVectorIndex::dir(dir, dimension);
    let vector = EdgeVectorIndex::open(&vector_dir, dimension).await?;
    vector.set_search_ef(options.search_ef);
    vector.set_tenant_shard_points(options.tenant_shard_points);
    let keyword_dir = dir.join("keyword");
    let keyword = tokio::task::spawn_blocking(move || KeywordIndex::open(Some(&keyword_dir)))
        .await
        .context("opening the keyword index")??;
    Ok((
        Arc::new(vector),
        KeywordSearch::Local(keyword),
        VectorWatermark::File(vector_dir.join("applied.seq")),
    ))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_deterministic_and_vectors_are_unit() {
        let corpus = Corpus::new(SEED);
        let again = Corpus::new(SEED);
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let (first, first_vector) = corpus.memory(&mut a);
        let (second, _) = again.memory(&mut b);
        assert_eq!(first.content, second.content);
        let norm: f32 = first_vector.vector.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        // The embedder reproduces the precomputed vector from the text.
        let embedded = corpus.embed(&first.content);
        let dot: f32 = embedded
            .iter()
            .zip(&first_vector.vector)
            .map(|(x, y)| x * y)
            .sum();
        assert!(dot > 0.9999, "{dot}");
        assert_eq!(corpus.embed("zzz qqq").len(), DIMENSION);
    }

    #[test]
    fn shares_add_up_and_numbers_format() {
        let options = RecallBenchOptions {
            total: 1003,
            user_memories: 100,
            users: 10,
            ..RecallBenchOptions::default()
        };
        let sum: usize = (0..options.users).map(|user| options.share(user)).sum();
        assert_eq!(sum, 1003);
        // At full size the second user is the typical one, and the shares still add up.
        let full = RecallBenchOptions::default();
        assert_eq!(full.share(1), TYPICAL_MEMORIES);
        let sum: usize = (0..full.users).map(|user| full.share(user)).sum();
        assert_eq!(sum, full.total);
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(999), "999");
        let latency = Latency::of((1..=100).map(f64::from).collect(), 10.0);
        assert_eq!((latency.p50, latency.p95, latency.p99), (50.0, 95.0, 99.0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tiny_bench_prints_the_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_dir = dir.path().join("bench");
        let options = RecallBenchOptions {
            data_dir: data_dir.clone(),
            total: 2000,
            user_memories: 500,
            users: 10,
            queries: 50,
            model_dir: None,
            model_memories: 0,
            reindex_memories: 1000,
            lag_writes: 10,
            optimize: true,
            keep_data: false,
            search_ef: None,
            // The big user (500) moves to a shard of their own; the others (166 each) stay.
            tenant_shard_points: 200,
            user_vectors: UserVectors::Synthetic,
        };
        expect_rows(
            options,
            &[
                "| step | what | result | target |",
                "| 1 ingest, precomputed vectors |",
                "| 1 index catch-up |",
                "| 3 reindex |",
                "| 4 recall, plain index (no HNSW) | big user (500), hybrid",
                "| 4 recall, after optimize |",
                "| 5 index lag |",
                "| 6 HNSW beam width | big user, hybrid, ef = 64,",
                // Too few points for an HNSW graph: the search is exact, and so must agree with
                // the bench's own full scan.
                "**100.0 %** of the exact neighbours",
                "10.0 results",
                "1 user(s) in a shard of their own",
                "| 7 vector search alone | big user, `VectorIndex::search` top 50, user only,",
            ],
        )
        .await;
        assert!(!data_dir.exists(), "the bench left its data behind");
    }

    fn model_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2")
    }

    /// The default model is a packed file without `config.json`: the bench loads it (it once
    /// fell back to bag-of-words vectors for it).
    #[tokio::test]
    async fn the_packed_default_model_is_loaded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(EmbedderSettings::default().model_dir);
        assert!(
            mnemo::llm::embed::is_model_dir(&dir),
            "the default embedding model is missing in {}: run scripts/fetch-model",
            dir.display()
        );
        let loaded = load_model(Some(&dir))
            .await
            .expect("load")
            .expect("a model");
        assert_eq!(loaded.embedder.model_id(), "multilingual-e5-small-q4");
        assert!(
            load_model(Some(Path::new("/nonexistent")))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prepared_queries_get_the_model_vectors_only_for_the_big_user() {
        let model = load_model(Some(&model_dir()))
            .await
            .expect("load")
            .unwrap_or_else(|| {
                panic!(
                    "the embedding model is missing in {}: run scripts/fetch-model",
                    model_dir().display()
                )
            });
        let corpus = Arc::new(Corpus::new(SEED));
        let vectors = BenchEmbedder {
            corpus: corpus.clone(),
            model: Some(model.embedder.clone()),
            cache: parking_lot::Mutex::new(HashMap::new()),
        };
        let big = vec!["project deadline paper".to_string()];
        let other = vec!["meeting sister friend".to_string()];
        vectors.prepare(&big, true).await.expect("prepare");
        vectors.prepare(&other, false).await.expect("prepare");
        let from_model = model.embedder.embed(&big).await.expect("embed");
        let got = vectors.embed(&[big[0].clone(), other[0].clone()]).await;
        let got = got.expect("embed");
        assert_eq!(got[0], from_model[0]);
        assert_eq!(got[1], corpus.embed(&other[0]));
        assert_ne!(got[0], corpus.embed(&big[0]));
        // A text nobody prepared is embedded by the model.
        let fresh = vec!["brother paper friend".to_string()];
        let embedded = vectors.embed(&fresh).await.expect("embed");
        assert_eq!(embedded, model.embedder.embed(&fresh).await.expect("embed"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tiny_bench_with_model_vectors_for_the_big_user() {
        assert!(
            model_dir().join("config.json").exists(),
            "the embedding model is missing in {}: run scripts/fetch-model",
            model_dir().display()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let options = RecallBenchOptions {
            data_dir: dir.path().join("bench"),
            total: 600,
            user_memories: 300,
            users: 3,
            queries: 20,
            model_dir: Some(model_dir()),
            model_memories: 0,
            reindex_memories: 0,
            lag_writes: 3,
            optimize: true,
            keep_data: false,
            search_ef: None,
            // The big user (300) moves to a shard of their own; the others (150 each) stay.
            tenant_shard_points: 200,
            user_vectors: UserVectors::Model,
        };
        expect_rows(
            options,
            &[
                "- big user's vectors: all-MiniLM-L6-v2 embeddings of the big user's texts",
                "| 1 big user's vectors | all-MiniLM-L6-v2 embeds the big user's 300 texts",
                // The index holds the model's vectors and the queries are the model's too: the
                // exact search of a small shard agrees with the bench's scan of the SQL vectors.
                "**100.0 %** of the exact neighbours",
                "| 4 recall, after optimize | big user (300), hybrid, 20 queries |",
                "| 5 index lag |",
            ],
        )
        .await;
    }

    /// Runs the bench with `options` and checks that its output holds every one of `needles`.
    async fn expect_rows(options: RecallBenchOptions, needles: &[&str]) {
        let mut out = Vec::new();
        run_recall_bench(options, &mut out).await.expect("bench");
        let text = String::from_utf8(out).expect("utf-8");
        for needle in needles {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    /// The full-size run: `cargo test --release --lib bench -- --ignored --nocapture`.
    /// Scale with MNEMO_BENCH_TOTAL, _USER, _USERS, _QUERIES, _REINDEX, _LAG, _OPTIMIZE=0,
    /// _TENANT_SHARD (points; 0 keeps every user in the shared shard),
    /// _MODEL (a directory, or "none"), _VECTORS ("model" or "synthetic": the big user's),
    /// _DIR (an empty scratch directory).
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "takes minutes to tens of minutes"]
    async fn full_recall_bench() {
        let number = |name: &str, default: usize| {
            std::env::var(format!("MNEMO_BENCH_{name}"))
                .ok()
                .map_or(default, |value| value.parse().expect(name))
        };
        let defaults = RecallBenchOptions::default();
        let scratch = tempfile::tempdir().expect("tempdir");
        let data_dir = std::env::var_os("MNEMO_BENCH_DIR")
            .map_or_else(|| scratch.path().join("bench"), PathBuf::from);
        let model_dir = match std::env::var("MNEMO_BENCH_MODEL") {
            Ok(value) if value == "none" => None,
            Ok(value) => Some(PathBuf::from(value)),
            Err(_) => defaults.model_dir.clone(),
        };
        let options = RecallBenchOptions {
            data_dir,
            total: number("TOTAL", defaults.total),
            user_memories: number("USER", defaults.user_memories),
            users: number("USERS", defaults.users),
            queries: number("QUERIES", defaults.queries),
            model_dir,
            model_memories: number("MODEL_MEMORIES", defaults.model_memories),
            reindex_memories: number("REINDEX", defaults.reindex_memories),
            lag_writes: number("LAG", defaults.lag_writes),
            optimize: number("OPTIMIZE", 1) != 0,
            keep_data: false,
            search_ef: defaults.search_ef,
            tenant_shard_points: number("TENANT_SHARD", defaults.tenant_shard_points as usize)
                as u64,
            user_vectors: match std::env::var("MNEMO_BENCH_VECTORS").as_deref() {
                Ok("synthetic") => UserVectors::Synthetic,
                _ => UserVectors::Model,
            },
        };
        let mut out = std::io::stdout();
        run_recall_bench(options, &mut out).await.expect("bench");
    }
}
