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
use mnemo::index::keyword::KeywordIndex;
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

    async fn model_phase(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let step = "2 ingest, local model";
        let Some(model) = &self.model else {
            let what = match &self.options.model_dir {
                Some(dir) => format!("skipped: no model in {}", dir.display()),
                None => "skipped: no model directory given".to_string(),
            };
            self.row(step, &what, "–", "")?;
            return Ok(());
        };
        let embedder = model.embedder.clone();
        let load_time = model.load_time;
        let model = embedder.model_id().to_string();
        let dimension = embedder.dimension();

        let n = self.options.model_memories;
        if n > 0 {
            self.model_ingest(embedder.clone(), dimension, n, shutdown)
                .await?;
        }
        // Query embedding: single short English queries, as recall embeds them.
        let queries = self.options.queries.clamp(1, 200);
        for _ in 0..3 {
            let text = self.corpus.english_text(&mut self.rng, 4, 8);
            embedder.embed_queries(&[text]).await?;
        }
        let bar = progress(queries as u64, "query embedding");
        let mut samples = Vec::with_capacity(queries);
        for _ in 0..queries {
            let text = self.corpus.english_text(&mut self.rng, 4, 8);
            let started = Instant::now();
            embedder.embed_queries(&[text]).await?;
            samples.push(millis(started.elapsed()));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let latency = Latency::of(samples, 0.0);
        self.row(
            "4 query embedding",
            &format!("{model}, one 4–8-word query per call, {queries} calls"),
            &format!("{} (model load {})", latency.short(), seconds(load_time)),
            "",
        )?;

        Ok(())
    }

    async fn model_ingest(
        &mut self,
        embedder: Arc<dyn Embedder>,
        dimension: usize,
        n: usize,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let step = "2 ingest, local model";
        let dir = self.options.data_dir.join("model");
        let store = open_sqlite(&dir).await?;
        let user = create_users(store.as_ref(), "bench-model", 1).await?[0];
        let (vector, keyword, watermark) = open_indexes(&dir, dimension, &self.options).await?;
        let token = shutdown.child_token();
        let engine = MemoryEngine::assemble(
            store.clone(),
            embedder,
            vector,
            keyword,
            watermark,
            MemorySettings::default(),
            u64::MAX,
            token.clone(),
        )
        .await?;
        let texts: Vec<String> = (0..n)
            .map(|_| self.corpus.english_text(&mut self.rng, 8, 16))
            .collect();
        let bar = progress(n as u64, "embed + insert");
        let started = Instant::now();
        for chunk in texts.chunks(MODEL_BATCH) {
            let memories = chunk
                .iter()
                .map(|text| NewMemory::from_user(MemoryKind::Fact, text.clone(), 3))
                .collect();
            engine.add(user, memories).await?;
            bar.inc(chunk.len() as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        let indexed = engine.wait_recallable(Duration::from_secs(600)).await?;
        let all_indexed = started.elapsed();
        self.row(
            step,
            &format!(
                "`MemoryEngine::add` of {} memories (8–16 English words), batches of \
                 {MODEL_BATCH}: embed + SQL, indexer running",
                count(n)
            ),
            &format!(
                "{} → **{}/s**; all recallable after {}{}",
                seconds(elapsed),
                rate(n, elapsed),
                seconds(all_indexed),
                if indexed { "" } else { " (timed out)" }
            ),
            "",
        )?;
        stop_engine(&engine, &token).await;
        store.close().await;
        Ok(())
    }

    // --- 3: reindex ------------------------------------------------------------------------

    async fn reindex_phase(&mut self) -> anyhow::Result<()> {
        let n = self.options.reindex_memories;
        if n == 0 {
            self.row("3 reindex", "skipped (0 memories)", "–", "")?;
            return Ok(());
        }
        let dir = self.options.data_dir.join("reindex");
        let store = open_sqlite(&dir).await?;
        let user = create_users(store.as_ref(), "bench-reindex", 1).await?[0];
        let bar = progress(n as u64, "reindex store: insert");
        let mut left = n;
        while left > 0 {
            let batch = left.min(SQL_BATCH);
            let memories = (0..batch)
                .map(|_| self.corpus.memory(&mut self.rng))
                .collect();
            store.user(user).insert_memories(memories).await?;
            left -= batch;
            bar.inc(batch as u64);
        }
        bar.finish_and_clear();
        let (vector, keyword, watermark) = open_indexes(&dir, DIMENSION, &self.options).await?;
        let indexer = Indexer::new(
            store.clone(),
            vector.clone(),
            keyword,
            watermark,
            DIMENSION,
            u64::MAX,
        )
        .await?;
        for (label, what) in [
            ("into empty indexes", "fresh data directory"),
            (
                "over existing indexes",
                "what `mnemo reindex` does: clear, then rebuild",
            ),
        ] {
            let bar = progress(n as u64, &format!("reindex {label}"));
            let started = Instant::now();
            let done = indexer
                .rebuild(|done, total| {
                    bar.set_length(total);
                    bar.set_position(done);
                })
                .await?;
            let elapsed = started.elapsed();
            bar.finish_and_clear();
            self.row(
                "3 reindex",
                &format!(
                    "`Indexer::rebuild` of {} memories (one user) {label}: {what}",
                    count(done as usize)
                ),
                &format!("**{}** ({}/s)", seconds(elapsed), rate(n, elapsed)),
                &verdict("≤ 60 s", elapsed <= Duration::from_secs(60)),
            )?;
        }
        if self.options.optimize {
            let spin = spinner("reindex: optimize (HNSW)");
            let started = Instant::now();
            vector.optimize().await?;
            let elapsed = started.elapsed();
            spin.finish_and_clear();
            self.row(
                "3 reindex",
                &format!(
                    "then `optimize` (HNSW) of those {} points, as the indexer does in the background",
                    count(n)
                ),
                &seconds(elapsed),
                "",
            )?;
        }
        drop(indexer);
        store.close().await;
        Ok(())
    }

    // --- 1: corpus ingest and catch-up -----------------------------------------------------

    async fn main_ingest(&mut self, shutdown: &CancellationToken) -> anyhow::Result<MainStack> {
        let dir = self.options.data_dir.clone();
        let store = open_sqlite(&dir).await?;
        let users = create_users(store.as_ref(), "bench-user", self.options.users).await?;

        let big_user = self.big_user_memories().await?;
        // The big user's threads: their memories are turns, each with its neighbours' view.
        let big_threads = {
            let scope = store.user(users[0]);
            let mut threads = Vec::new();
            for index in 0..self.options.user_memories.div_ceil(TURNS_PER_THREAD) {
                threads.push(
                    scope
                        .create_thread(&format!("bench thread {index}"), false)
                        .await?
                        .id,
                );
            }
            threads
        };
        let turns_since = Utc::now() - chrono::Duration::days(365);
        // The plan: ROUNDS passes over all users, each writing its share in batches.
        let mut plan = Vec::new();
        for round in 0..ROUNDS {
            for user in 0..self.options.users {
                let share = self.options.share(user);
                let mut left = share * (round + 1) / ROUNDS - share * round / ROUNDS;
                while left > 0 {
                    let batch = left.min(SQL_BATCH);
                    plan.push((user, batch));
                    left -= batch;
                }
            }
        }
        let calls = plan.len();
        let (sender, mut receiver) = tokio::sync::mpsc::channel(8);
        let producer = {
            let corpus = self.corpus.clone();
            let mut rng = Rng::new(self.rng.next_u64());
            let mut big_user = big_user.map(Vec::into_iter);
            let mut turns = 0usize;
            tokio::task::spawn_blocking(move || {
                for (user, batch) in plan {
                    let mut memories: Vec<(NewMemory, Embedded)> = match big_user.as_mut() {
                        Some(made) if user == 0 => made.by_ref().take(batch).collect(),
                        _ => (0..batch).map(|_| corpus.memory(&mut rng)).collect(),
                    };
                    if user == 0 {
                        for (memory, _) in &mut memories {
                            memory.kind = MemoryKind::Turn;
                            memory.thread_id = Some(big_threads[turns / TURNS_PER_THREAD]);
                            memory.created_at =
                                Some(turns_since + chrono::Duration::seconds(60 * turns as i64));
                            turns += 1;
                        }
                    }
                    if sender.blocking_send((user, memories)).is_err() {
                        return;
                    }
                }
            })
        };
        let total = self.options.total;
        let bar = progress(total as u64, "SQL insert");
        let started = Instant::now();
        let mut sql_time = Duration::ZERO;
        while let Some((user, memories)) = receiver.recv().await {
            let len = memories.len();
            let call = Instant::now();
            store.user(users[user]).insert_memories(memories).await?;
            sql_time += call.elapsed();
            bar.inc(len as u64);
        }
        let wall = started.elapsed();
        producer.await.context("generating the corpus")?;
        bar.finish_and_clear();
        self.row(
            "1 ingest, precomputed vectors",
            &format!(
                "`insert_memories` of {} memories in {} calls (≤ {SQL_BATCH} rows, one user \
                 each; the big user's are turns, {TURNS_PER_THREAD} per thread, indexed with \
                 their context views)",
                count(total),
                count(calls)
            ),
            &format!(
                "{} wall → **{}/s**; time inside `insert_memories` {} → {}/s",
                seconds(wall),
                rate(total, wall),
                seconds(sql_time),
                rate(total, sql_time)
            ),
            "",
        )?;

        let (vector, keyword, watermark) = open_indexes(&dir, DIMENSION, &self.options).await?;
        let indexer = Indexer::new(
            store.clone(),
            vector.clone(),
            keyword.clone(),
            watermark.clone(),
            DIMENSION,
            u64::MAX,
        )
        .await?;
        let head = store.maintenance().memory_log_head().await?;
        let bar = progress(head.max(0) as u64, "index catch-up");
        let started = Instant::now();
        loop {
            let applied = indexer.step().await?;
            if applied == 0 {
                break;
            }
            bar.inc(applied as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        drop(indexer);
        self.row(
            "1 index catch-up",
            &format!(
                "`Indexer` steps over {} log entries into Edge + tantivy (batches of 1000, \
                 flush + commit each)",
                count(head.max(0) as usize)
            ),
            &format!("{} → **{}/s**", seconds(elapsed), rate(total, elapsed)),
            "",
        )?;
        let sizes = format!(
            "SQLite {}, Edge {}, tantivy {}",
            bytes(dir_size(&dir.join("mnemo.db")) + wal_size(&dir)),
            bytes(dir_size(&EdgeVectorIndex::dir(&dir, DIMENSION))),
            bytes(dir_size(&dir.join("keyword")))
        );
        self.row("1 storage", "disk space used after catch-up", &sizes, "")?;

        let embedder: Arc<dyn Embedder> = self.vectors.clone();
        let stop = shutdown.child_token();
        let engine = MemoryEngine::assemble(
            store.clone(),
            embedder,
            vector.clone(),
            keyword,
            watermark,
            MemorySettings::default(),
            // Optimisation is started by the benchmark, never behind its back.
            u64::MAX,
            stop.clone(),
        )
        .await?;
        Ok(MainStack {
            store,
            stop,
            users,
            vector,
            engine,
        })
    }

    /// With model vectors: the big user's memories made up front and embedded by the model
    /// (timed, as a row); `None` with synthetic vectors, which are made as they are inserted.
    async fn big_user_memories(&mut self) -> anyhow::Result<Option<Vec<(NewMemory, Embedded)>>> {
        let Some(model) = self.vectors.model.clone() else {
            return Ok(None);
        };
        let n = self.options.user_memories;
        let mut rng = Rng::new(self.rng.next_u64());
        let mut memories: Vec<(NewMemory, Embedded)> =
            (0..n).map(|_| self.corpus.memory(&mut rng)).collect();
        let bar = progress(n as u64, "embedding the big user's memories");
        let started = Instant::now();
        for chunk in memories.chunks_mut(EMBED_CHUNK) {
            let texts: Vec<String> = chunk.iter().map(|(m, _)| m.content.clone()).collect();
            let vectors = self.vectors.compute(&texts, true).await?;
            for ((_, embedded), vector) in chunk.iter_mut().zip(vectors) {
                embedded.vector = vector;
            }
            bar.inc(chunk.len() as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        self.row(
            "1 big user's vectors",
            &format!(
                "{} embeds the big user's {} texts (6–14 words), before the SQL insert",
                model.model_id(),
                count(n)
            ),
            &format!("{} → {}/s", seconds(elapsed), rate(n, elapsed)),
            "",
        )?;
        Ok(Some(memories))
    }

    /// `n` recall queries for the big user (`big`) or another one, embedded now so that
    /// recall finds their vectors ready and times only its searches, SQL and ranking.
    async fn queries(&mut self, n: usize, big: bool) -> anyhow::Result<Vec<String>> {
        let texts: Vec<String> = (0..n).map(|_| self.corpus.query(&mut self.rng)).collect();
        self.vectors.prepare(&texts, big).await?;
        Ok(texts)
    }

    /// A new memory of the big user, with a vector of the kind the big user's others have.
    async fn big_user_memory(&mut self) -> anyhow::Result<(NewMemory, Embedded)> {
        let (memory, mut embedded) = self.corpus.memory(&mut self.rng);
        if self.vectors.model.is_some() {
            let text = [memory.content.clone()];
            embedded.vector = self.vectors.embed(&text).await?.pop().unwrap_or_default();
        }
        Ok((memory, embedded))
    }

    // --- 4: recall -------------------------------------------------------------------------

    async fn recall_rows(&mut self, stack: &MainStack, step: &str) -> anyhow::Result<()> {
        let n = self.options.queries;
        let quarter = (n / 4).max(1);
        let big = stack.users[0];
        self.notes.push(format!(
            "{step}: the keyword index has {} segment(s)",
            stack.engine.indexer().keyword().segments()
        ));
        let big_count = count(self.options.user_memories);
        let series = [
            (
                big,
                RecallMode::Hybrid,
                n,
                format!("big user ({big_count}), hybrid"),
            ),
            (
                big,
                RecallMode::Vector,
                quarter,
                "big user, vector only".to_string(),
            ),
            (
                big,
                RecallMode::Keyword,
                quarter,
                "big user, BM25 only".to_string(),
            ),
        ];
        for (index, (user, mode, queries, label)) in series.into_iter().enumerate() {
            let latency = self
                .recall_series(&stack.engine, user, true, mode, queries, &label)
                .await?;
            let target = if index == 0 {
                verdict(
                    "p50 ≤ 5 ms, p99 ≤ 20 ms",
                    latency.p50 <= 5.0 && latency.p99 <= 20.0,
                )
            } else {
                String::new()
            };
            self.row(
                step,
                &format!("{label}, {queries} queries"),
                &latency.long(),
                &target,
            )?;
        }
        if stack.users.len() > 1 && self.options.share(1) > 0 {
            let typical = count(self.options.share(1));
            for (mode, name) in [
                (RecallMode::Hybrid, "hybrid"),
                (RecallMode::Keyword, "BM25 only"),
            ] {
                let label = format!("typical user ({typical}), {name}");
                let latency = self
                    .recall_series(&stack.engine, stack.users[1], false, mode, quarter, &label)
                    .await?;
                let target = if self.options.share(1) == TYPICAL_MEMORIES {
                    verdict(
                        "p50 ≤ 1 ms, p99 ≤ 3 ms",
                        latency.p50 <= 1.0 && latency.p99 <= 3.0,
                    )
                } else {
                    String::new()
                };
                self.row(
                    step,
                    &format!("{label}, {quarter} queries"),
                    &latency.long(),
                    &target,
                )?;
            }
        }
        Ok(())
    }

    async fn recall_series(
        &mut self,
        engine: &MemoryEngine,
        user: UserId,
        big: bool,
        mode: RecallMode,
        queries: usize,
        label: &str,
    ) -> anyhow::Result<Latency> {
        let warmup = WARMUP_QUERIES.min(queries);
        let mut texts = self.queries(warmup + queries, big).await?.into_iter();
        for query in texts.by_ref().take(warmup) {
            recall_once(engine, user, query, mode).await?;
        }
        let bar = progress(queries as u64, label);
        let mut samples = Vec::with_capacity(queries);
        let mut stages: [Vec<f64>; 4] = Default::default();
        let mut results = 0usize;
        for query in texts {
            let (search_ms, found, timings) = recall_timed(engine, user, query, mode).await?;
            samples.push(search_ms);
            for (stage, ms) in stages.iter_mut().zip([
                timings.vector_ms,
                timings.keyword_ms,
                timings.hydrate_ms,
                timings.rank_ms,
            ]) {
                stage.push(ms);
            }
            results += found;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let [vector, keyword, hydrate, rank] = stages.map(|stage| Latency::of(stage, 0.0).p50);
        self.notes.push(format!(
            "{label}: stage p50s: vector search {}, BM25 search {} (in parallel), SQL \
             hydration {}, ranking {}",
            ms_text(vector),
            ms_text(keyword),
            ms_text(hydrate),
            ms_text(rank)
        ));
        Ok(Latency::of(samples, results as f64 / queries as f64))
    }

    /// The HNSW beam width against speed and quality: hybrid recall timed at each width, and
    /// the vector search's candidates compared with an exact scan of the big user's vectors.
    async fn beam_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let candidates = MemorySettings::default().candidates;
        let spin = spinner("beam widths: reading the big user's vectors for an exact scan");
        let filter = MemoryFilter {
            kinds: Some(MemoryKind::ordinary()),
            ..MemoryFilter::default()
        };
        let points: Vec<(MemoryId, Vec<f32>)> = stack
            .store
            .user(big)
            .all_memories(&filter)
            .await?
            .into_iter()
            .map(|memory| (memory.id, memory.embedding))
            .collect();
        let queries = self.query_vectors(BEAM_QUERIES).await?;
        let exact: Vec<HashSet<MemoryId>> = queries
            .iter()
            .map(|query| {
                let mut scored: Vec<(f32, MemoryId)> = points
                    .iter()
                    .map(|(id, vector)| (mnemo::memory::rank::cosine(query, vector), *id))
                    .collect();
                let n = candidates.min(scored.len());
                if n > 0 {
                    scored.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
                }
                scored.into_iter().take(n).map(|(_, id)| id).collect()
            })
            .collect();
        spin.finish_and_clear();
        let vector_filter = recall_vector_filter();
        for ef in BEAM_WIDTHS {
            stack.vector.set_search_ef(ef);
            let width = ef.map_or_else(|| "engine default (100)".to_string(), |ef| ef.to_string());
            let mut found = 0usize;
            let mut wanted = 0usize;
            for (query, exact) in queries.iter().zip(&exact) {
                let hits = stack
                    .vector
                    .search(big, query, &vector_filter, candidates)
                    .await?;
                found += hits.iter().filter(|(id, _)| exact.contains(id)).count();
                wanted += exact.len();
            }
            let label = format!("big user, hybrid, ef = {width}");
            let latency = self
                .recall_series(
                    &stack.engine,
                    big,
                    true,
                    RecallMode::Hybrid,
                    BEAM_QUERIES,
                    &label,
                )
                .await?;
            self.row(
                "6 HNSW beam width",
                &format!(
                    "{label}, {BEAM_QUERIES} queries; share of the exact top {candidates} among \
                     the vector candidates ({BEAM_QUERIES} other queries)"
                ),
                &format!(
                    "{}; **{:.1} %** of the exact neighbours",
                    latency.long(),
                    100.0 * found as f64 / wanted.max(1) as f64
                ),
                "",
            )?;
        }
        stack.vector.set_search_ef(self.options.search_ef);
        Ok(())
    }

    /// The vectors of `n` queries for the big user.
    async fn query_vectors(&mut self, n: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        let texts = self.queries(n, true).await?;
        Ok(self.vectors.embed(&texts).await?)
    }

    /// What the payload conditions of recall's vector search cost: the search alone (no
    /// embedding, no SQL), with recall's filter and with fewer conditions.
    async fn filter_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let candidates = MemorySettings::default().candidates;
        let queries = self.query_vectors(BEAM_QUERIES).await?;
        let ordinary = recall_vector_filter();
        let variants = [
            (
                "recall's filter: user, kind not `document`, not archived, valid",
                ordinary,
            ),
            ("user, not archived, valid", VectorFilter::default()),
            (
                "user only",
                VectorFilter {
                    include_archived: true,
                    include_invalid: true,
                    ..VectorFilter::default()
                },
            ),
        ];
        for (label, filter) in variants {
            let mut samples = Vec::with_capacity(queries.len());
            let mut results = 0usize;
            for query in &queries {
                let started = Instant::now();
                let hits = stack.vector.search(big, query, &filter, candidates).await?;
                samples.push(millis(started.elapsed()));
                results += hits.len();
            }
            let n = samples.len();
            let latency = Latency::of(samples, results as f64 / n.max(1) as f64);
            self.row(
                "7 vector search alone",
                &format!("big user, `VectorIndex::search` top {candidates}, {label}, {n} queries"),
                &latency.long(),
                "",
            )?;
        }
        Ok(())
    }

    async fn optimize_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let pool = self.queries(OPTIMIZE_QUERY_POOL, true).await?;
        let mut pool = pool.iter().cycle();
        let probe_memory = self.big_user_memory().await?;
        let mut probe_memory = Some(probe_memory);
        let spin = spinner("optimize (HNSW) of the corpus, sampling recall");
        let started = Instant::now();
        let mut task = {
            let vector = stack.vector.clone();
            tokio::spawn(async move { vector.optimize().await })
        };
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut samples = Vec::new();
        let mut results = 0usize;
        let mut probe: Option<tokio::task::JoinHandle<anyhow::Result<(bool, Duration)>>> = None;
        let outcome = loop {
            tokio::select! {
                joined = &mut task => break joined,
                _ = ticker.tick() => {
                    if probe.is_none() && started.elapsed() >= Duration::from_millis(500) {
                        // One write made while HNSW is being built: when is it recallable?
                        let memory = probe_memory.take().context("one probe write")?;
                        stack.store.user(big).insert_memories(vec![memory]).await?;
                        let committed = Instant::now();
                        let engine = stack.engine.clone();
                        probe = Some(tokio::spawn(async move {
                            let ok = engine.wait_recallable(Duration::from_secs(4 * 3600)).await?;
                            Ok::<_, anyhow::Error>((ok, committed.elapsed()))
                        }));
                    } else {
                        let query = pool.next().cloned().unwrap_or_default();
                        let (search_ms, found) =
                            recall_once(&stack.engine, big, query, RecallMode::Hybrid).await?;
                        samples.push(search_ms);
                        results += found;
                        spin.set_message(format!(
                            "optimize (HNSW) of the corpus, {} recall samples",
                            samples.len()
                        ));
                    }
                }
            }
        };
        let elapsed = started.elapsed();
        spin.finish_and_clear();
        outcome.context("optimize task")??;
        let points = self.options.total;
        let layout = match stack.vector.layout().await? {
            Some(l) => format!(
                ": {} segment(s), {} of {} points in HNSW graphs, {} user(s) in a shard of \
                 their own",
                l.segments,
                count(l.indexed_points),
                count(l.points),
                l.tenant_shards
            ),
            None => String::new(),
        };
        self.row(
            "optimize",
            &format!(
                "`VectorIndex::optimize` (Edge HNSW build, blocking) over {} points{layout}",
                count(points)
            ),
            &format!("**{}**", seconds(elapsed)),
            "",
        )?;
        if !samples.is_empty() {
            let n = samples.len();
            let latency = Latency::of(samples, results as f64 / n as f64);
            self.row(
                "4 recall, during optimize",
                &format!(
                    "big user, hybrid, one query every {} ms while optimize runs, {n} queries",
                    SAMPLE_EVERY.as_millis()
                ),
                &latency.long(),
                "",
            )?;
        }
        match probe {
            Some(probe) => {
                let waited = tokio::time::timeout(Duration::from_secs(600), probe).await;
                let mut stalled = true;
                let result = match waited {
                    Ok(joined) => {
                        let (ok, lag) = joined.context("lag probe")??;
                        stalled = !ok || lag > Duration::from_secs(5);
                        format!(
                            "recallable after **{}**{}",
                            seconds(lag),
                            if ok { "" } else { " (timed out)" }
                        )
                    }
                    Err(_) => "not recallable 10 min after optimize ended".into(),
                };
                self.row(
                    "5 index lag, during optimize",
                    "one write committed 0.5 s after optimize started",
                    &result,
                    "",
                )?;
                self.notes.push(if stalled {
                    "A write made during optimize waited for it to end.".to_string()
                } else {
                    "Writes made during optimize stay recallable: the indexer does not wait for \
                     the build's flush; the durable watermark catches up after it."
                        .to_string()
                });
            }
            None => self
                .notes
                .push("optimize ended within 0.5 s, so no write was made during it.".into()),
        }
        Ok(())
    }

    // --- 5: index lag ----------------------------------------------------------------------

    async fn lag_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let n = self.options.lag_writes;
        if n == 0 {
            return Ok(());
        }
        let big = stack.users[0];
        let bar = progress(n as u64, "index lag");
        let mut samples = Vec::with_capacity(n);
        let mut timeouts = 0;
        for _ in 0..n {
            let memory = self.big_user_memory().await?;
            stack.store.user(big).insert_memories(vec![memory]).await?;
            let committed = Instant::now();
            stack.engine.indexer().notify();
            if !stack
                .engine
                .wait_recallable(Duration::from_secs(60))
                .await?
            {
                timeouts += 1;
            }
            samples.push(millis(committed.elapsed()));
            bar.inc(1);
            // Independent writes, not a tight loop.
            let pause = self.rng.below(20) as u64;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        bar.finish_and_clear();
        let latency = Latency::of(samples, 0.0);
        let mut result = format!(
            "p50 {} / p95 **{}** / max {}",
            ms_text(latency.p50),
            ms_text(latency.p95),
            ms_text(latency.max)
        );
        if timeouts > 0 {
            result.push_str(&format!(" ({timeouts} timed out at 60 s)"));
        }
        self.row(
            "5 index lag",
            &format!(
                "`insert_memories` returned → recallable in both indexes, {n} sequential single \
                 writes (big user), indexer following"
            ),
            &result,
            &verdict("p95 ≤ 1 s", latency.p95 <= 1000.0 && timeouts == 0),
        )
    }
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
) -> anyhow::Result<(Arc<dyn VectorIndex>, KeywordIndex, VectorWatermark)> {
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
        keyword,
        VectorWatermark::File(vector_dir.join("applied.seq")),
    ))
}

/// Creates `dir` or checks that it is empty; true when it was created.
fn prepare_dir(dir: &Path) -> anyhow::Result<bool> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; the benchmark needs an empty or new directory",
                dir.display()
            );
        }
        Ok(false)
    } else {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(true)
    }
}

/// Removes what the benchmark wrote (the directory was empty before it started).
fn remove_contents(dir: &Path, created: bool) -> anyhow::Result<()> {
    if created {
        return std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()));
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

fn dir_size(path: &Path) -> u64 {
    let Ok(metadata) = std::fs::metadata(path) else {
        return 0;
    };
    if !metadata.is_dir() {
        return allocated(&metadata);
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| dir_size(&entry.path()))
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes a file really occupies (sparse and preallocated files count what is allocated).
fn allocated(metadata: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        metadata.blocks() * 512
    }
    #[cfg(not(unix))]
    {
        metadata.len()
    }
}

/// The 1-, 5- and 15-minute load averages (Linux only): the machine may be shared.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(" / "))
}

fn wal_size(dir: &Path) -> u64 {
    dir_size(&dir.join("mnemo.db-wal"))
}

/// Peak resident set size (Linux only).
fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(bytes(kib * 1024))
}

// --- the synthetic corpus ------------------------------------------------------------------

/// xorshift64* — tiny, seeded, good enough for synthetic text.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so nearby seeds give unrelated streams (and never 0).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
}

/// Everyday content words (no stop words); they take the most frequent ranks.
const ENGLISH: &str = "project paper deadline meeting sister brother mother father friend \
    coffee tea dinner lunch breakfast book novel article chapter research study experiment \
    result data model training dataset benchmark python rust database server cloud budget \
    invoice travel flight hotel train ticket passport visa conference talk slides review \
    draft proposal grant funding team manager colleague student teacher course lecture exam \
    garden plant flower tree dog cat bird walk run bike swim gym doctor appointment medicine \
    allergy peanut gluten vegetarian recipe kitchen oven bread cheese wine beer birthday gift \
    wedding holiday summer winter spring autumn morning evening weekend monday friday music \
    piano guitar song concert film movie series podcast news election policy economy market \
    stock price rent house apartment car bicycle phone laptop keyboard screen camera photo \
    language german french spanish japanese chinese english learn practice lesson paris \
    berlin tokyo london york city country river mountain beach lake forest island museum \
    gallery painting history science physics chemistry biology math statistics algorithm \
    graph network memory storage index search query vector embedding latency throughput \
    cache bug release version feature design architecture contract client customer support \
    email calendar reminder task note list goal habit sleep health diet weight running \
    marathon yoga meditation therapy family child baby school university degree thesis \
    advisor professor lab office desk chair window door light energy solar battery \
    climate weather rain snow storm ocean ship port harbor bridge road map route";
const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
const VOWELS: &[u8] = b"aeiou";

/// The vocabulary with one fixed random direction and weight per word. A text's vector is the
/// normalised weighted sum of its words' directions, so texts sharing words are near each
/// other, as with a real embedder; rarer words weigh more.
struct Corpus {
    words: Vec<String>,
    english: usize,
    index: HashMap<String, usize>,
    directions: Vec<f32>,
    weights: Vec<f32>,
}

impl Corpus {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut seen: HashSet<String> = HashSet::new();
        let mut words: Vec<String> = Vec::with_capacity(VOCABULARY);
        for word in ENGLISH.split_whitespace() {
            if seen.insert(word.to_string()) {
                words.push(word.to_string());
            }
        }
        let english = words.len();
        while words.len() < VOCABULARY {
            let syllables = rng.between(2, 4);
            let mut word = String::with_capacity(syllables * 2);
            for _ in 0..syllables {
                word.push(char::from(CONSONANTS[rng.below(CONSONANTS.len())]));
                word.push(char::from(VOWELS[rng.below(VOWELS.len())]));
            }
            if seen.insert(word.clone()) {
                words.push(word);
            }
        }
        let directions = (0..VOCABULARY * DIMENSION)
            .map(|_| (rng.unit() * 2.0 - 1.0) as f32)
            .collect();
        let weights = (0..VOCABULARY)
            .map(|rank| (1.0 + (1.0 + rank as f64 / ZIPF_OFFSET).ln()) as f32)
            .collect();
        let index = words
            .iter()
            .enumerate()
            .map(|(rank, word)| (word.clone(), rank))
            .collect();
        Self {
            words,
            english,
            index,
            directions,
            weights,
        }
    }

    /// A word rank from the Zipf–Mandelbrot law over the first `among` words.
    fn rank(&self, rng: &mut Rng, among: usize) -> usize {
        let q = ZIPF_OFFSET;
        let x = q * ((among as f64 + q) / q).powf(rng.unit()) - q;
        (x as usize).min(among - 1)
    }

    fn ranks(&self, rng: &mut Rng, min: usize, max: usize, among: usize) -> Vec<usize> {
        let n = rng.between(min, max);
        (0..n).map(|_| self.rank(rng, among)).collect()
    }

    fn text(&self, ranks: &[usize]) -> String {
        let words: Vec<&str> = ranks
            .iter()
            .map(|&rank| self.words[rank].as_str())
            .collect();
        words.join(" ")
    }

    fn vector(&self, ranks: &[usize]) -> Vec<f32> {
        let mut vector = vec![0f32; DIMENSION];
        for &rank in ranks {
            let weight = self.weights[rank];
            let direction = &self.directions[rank * DIMENSION..(rank + 1) * DIMENSION];
            for (value, component) in vector.iter_mut().zip(direction) {
                *value += weight * component;
            }
        }
        normalise(&mut vector);
        vector
    }

    /// A memory of 6–14 words with its precomputed vector, made up to a year ago.
    fn memory(&self, rng: &mut Rng) -> (NewMemory, Embedded) {
        let ranks = self.ranks(rng, 6, 14, VOCABULARY);
        let kind = MemoryKind::ALL[rng.below(MemoryKind::ALL.len())];
        let age = chrono::Duration::seconds(rng.below(365 * 24 * 3600) as i64);
        let memory = NewMemory {
            kind,
            content: self.text(&ranks),
            source: MemorySource::User,
            trust: Trust::User,
            importance: rng.between(1, 5) as u8,
            thread_id: None,
            source_refs: Vec::new(),
            created_at: Some(Utc::now() - age),
            supersedes: None,
        };
        let embedded = Embedded {
            vector: self.vector(&ranks),
            model: MODEL_ID.to_string(),
        };
        (memory, embedded)
    }

    /// A recall query of 2–5 words from the same distribution.
    fn query(&self, rng: &mut Rng) -> String {
        let ranks = self.ranks(rng, 2, 5, VOCABULARY);
        self.text(&ranks)
    }

    /// Text from the English words only (for the real model).
    fn english_text(&self, rng: &mut Rng, min: usize, max: usize) -> String {
        let ranks = self.ranks(rng, min, max, self.english);
        self.text(&ranks)
    }

    /// The vector of any text: known words as in `vector`, unknown ones ignored; a text with
    /// no known word gets a direction derived from its hash.
    fn embed(&self, text: &str) -> Vec<f32> {
        let ranks: Vec<usize> = text
            .split_whitespace()
            .filter_map(|word| self.index.get(word).copied())
            .collect();
        if !ranks.is_empty() {
            return self.vector(&ranks);
        }
        // FNV-1a of the text seeds a random direction.
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut rng = Rng::new(hash);
        let mut vector: Vec<f32> = (0..DIMENSION)
            .map(|_| (rng.unit() * 2.0 - 1.0) as f32)
            .collect();
        normalise(&mut vector);
        vector
    }
}

fn normalise(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The main engine's embedder. Queries the benchmark prepared come from a cache, so
/// recall's own embedding takes microseconds and the searches run in parallel as they would
/// with a vector at hand. Other texts: the model's vectors when the big user has them
/// (`model`), the corpus's bag-of-words vectors otherwise.
struct BenchEmbedder {
    corpus: Arc<Corpus>,
    model: Option<Arc<dyn Embedder>>,
    cache: parking_lot::Mutex<HashMap<String, Vec<f32>>>,
}

impl BenchEmbedder {
    fn cached(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Vec<f32>>> {
        self.cache.lock()
    }

    /// The vectors of `texts`, computed: the model's when `model_vectors` and there is a
    /// model, the corpus's otherwise.
    async fn compute(
        &self,
        texts: &[String],
        model_vectors: bool,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        match &self.model {
            Some(model) if model_vectors => {
                let mut vectors = Vec::with_capacity(texts.len());
                for chunk in texts.chunks(EMBED_CHUNK) {
                    vectors.extend(model.embed(chunk).await?);
                }
                Ok(vectors)
            }
            _ => Ok(texts.iter().map(|text| self.corpus.embed(text)).collect()),
        }
    }

    /// Caches the vectors of `texts`: the model's for queries against the big user (`big`)
    /// when the big user has model vectors, the corpus's otherwise.
    async fn prepare(&self, texts: &[String], big: bool) -> Result<(), EmbedError> {
        let missing: Vec<String> = {
            let cache = self.cached();
            let missing: HashSet<&String> =
                texts.iter().filter(|t| !cache.contains_key(*t)).collect();
            missing.into_iter().cloned().collect()
        };
        let vectors = self.compute(&missing, big).await?;
        self.cached().extend(missing.into_iter().zip(vectors));
        Ok(())
    }
}

#[async_trait]
impl Embedder for BenchEmbedder {
    fn model_id(&self) -> &str {
        MODEL_ID
    }

    fn dimension(&self) -> usize {
        DIMENSION
    }

    /// Prepared texts from the cache; any other with the big user's kind of vector.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let found: Vec<Option<Vec<f32>>> = {
            let cache = self.cached();
            texts.iter().map(|text| cache.get(text).cloned()).collect()
        };
        let missing: Vec<String> = texts
            .iter()
            .zip(&found)
            .filter(|(_, vector)| vector.is_none())
            .map(|(text, _)| text.clone())
            .collect();
        let mut computed = self.compute(&missing, true).await?.into_iter();
        Ok(found
            .into_iter()
            .map(|vector| vector.or_else(|| computed.next()).unwrap_or_default())
            .collect())
    }
}

// --- numbers -------------------------------------------------------------------------------

struct Latency {
    n: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    mean: f64,
    max: f64,
    results: f64,
}

impl Latency {
    fn of(mut samples: Vec<f64>, results: f64) -> Self {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |p: f64| {
            if n == 0 {
                return 0.0;
            }
            let rank = ((p / 100.0) * n as f64).ceil() as usize;
            samples[rank.clamp(1, n) - 1]
        };
        Self {
            n,
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
            mean: if n == 0 {
                0.0
            } else {
                samples.iter().sum::<f64>() / n as f64
            },
            max: samples.last().copied().unwrap_or(0.0),
            results,
        }
    }

    fn short(&self) -> String {
        format!(
            "p50 **{}** / p95 {} (mean {}, n = {})",
            ms_text(self.p50),
            ms_text(self.p95),
            ms_text(self.mean),
            self.n
        )
    }

    fn long(&self) -> String {
        format!(
            "p50 **{}** / p95 {} / p99 **{}** (mean {}, max {}; {:.1} results)",
            ms_text(self.p50),
            ms_text(self.p95),
            ms_text(self.p99),
            ms_text(self.mean),
            ms_text(self.max),
            self.results
        )
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn ms_text(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs >= 120.0 {
        format!("{secs:.0} s ({:.1} min)", secs / 60.0)
    } else {
        format!("{secs:.1} s")
    }
}

fn rate(n: usize, duration: Duration) -> String {
    let secs = duration.as_secs_f64().max(1e-9);
    count((n as f64 / secs).round() as usize)
}

/// `1234567` → `1,234,567`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn verdict(target: &str, met: bool) -> String {
    format!("{target}: {}", if met { "met" } else { "**missed**" })
}

fn progress(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>32} {bar:40} {human_pos}/{human_len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_string());
    bar
}

fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
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
