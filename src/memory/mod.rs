//! Episodic memory for each user: writes (SQL first, indexes follow the log), hybrid recall,
//! export/import, re-embedding after a model change, and the decay job. Every function takes
//! the owner's `UserId`.

pub mod decay;
pub mod extract;
pub mod recall;
pub mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::config::{MemorySettings, Settings};
use crate::index::edge::EdgeVectorIndex;
use crate::index::indexer::{Indexer, IndexerError, VectorWatermark};
use crate::index::keyword::KeywordIndex;
use crate::index::qdrant::QdrantServerIndex;
use crate::index::vector::{IndexError, VectorFilter, VectorIndex};
use crate::llm::embed::{EmbedError, Embedder, LocalEmbedder, OpenAiEmbedder};
use crate::store::{
    Embedded, ErrorKind, Memory, MemoryFilter, MemoryId, MemoryKind, MemoryPatch, MemorySource,
    MemoryVersion, NewMemory, Store, StoreError, ThreadId, Trust, UserId,
};
use recall::{RecallMode, Recalled};

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Indexer(#[from] IndexerError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error("{0}")]
    BadRequest(String),
}

impl MemoryError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            MemoryError::Store(error) => error.kind(),
            MemoryError::BadRequest(_) => ErrorKind::BadRequest,
            MemoryError::Embed(EmbedError::BadInput(_)) => ErrorKind::BadRequest,
            MemoryError::Embed(EmbedError::Unavailable(_)) => ErrorKind::Unavailable,
            MemoryError::Index(IndexError::Unavailable(_)) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }
}

pub type MemoryResult<T> = Result<T, MemoryError>;

/// Rows read from SQL in the first round of a recall (then doubling): enough for the top k
/// in the common case, where the best fused hits are the final ones.
const HYDRATE_CHUNK_MIN: usize = 16;

/// A recall request (`recall_memory(query, k, kinds?, since?, until?)`).
#[derive(Debug, Clone, Default)]
pub struct RecallRequest {
    pub query: String,
    pub k: Option<usize>,
    pub kinds: Option<Vec<MemoryKind>>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub include_archived: bool,
    pub mode: RecallMode,
    /// Apply the decay multiplier (default on).
    pub decay: bool,
    /// Candidates per signal; defaults to `memory.candidates`.
    pub candidates: Option<usize>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecallTimings {
    /// Embedding the query.
    pub embed_ms: f64,
    /// The vector search alone (runs alongside the keyword search).
    pub vector_ms: f64,
    /// The BM25 search alone.
    pub keyword_ms: f64,
    /// Re-reading the candidates from SQL after fusion. The rows of the best keyword hits
    /// are read while the vector search still runs and are not counted here.
    pub hydrate_ms: f64,
    /// Fusion, decay, near-duplicate removal.
    pub rank_ms: f64,
    /// Everything but the query embedding.
    pub search_ms: f64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecallResponse {
    pub results: Vec<Recalled>,
    pub timings: RecallTimings,
}

/// One line of an export (and of an import): the memory without its vector.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortableMemory {
    pub kind: MemoryKind,
    pub content: String,
    #[serde(default)]
    pub source: Option<MemorySource>,
    #[serde(default)]
    pub trust: Option<Trust>,
    #[serde(default = "default_importance")]
    pub importance: u8,
    #[serde(default)]
    pub source_refs: Vec<String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub invalid_at: Option<DateTime<Utc>>,
}

fn default_importance() -> u8 {
    3
}

impl From<&Memory> for PortableMemory {
    fn from(memory: &Memory) -> Self {
        Self {
            kind: memory.kind,
            content: memory.content.clone(),
            source: Some(memory.source),
            trust: Some(memory.trust),
            importance: memory.importance,
            source_refs: memory.source_refs.clone(),
            created_at: Some(memory.created_at),
            archived_at: memory.archived_at,
            invalid_at: memory.invalid_at,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct ImportReport {
    pub imported: usize,
    /// Lines whose exact content the user already has.
    pub skipped: usize,
    pub errors: Vec<ImportLineError>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ImportLineError {
    pub line: usize,
    pub message: String,
}

/// Memory content is capped so one memory stays a short statement.
pub const MAX_MEMORY_CHARS: usize = 8_000;

pub struct MemoryEngine {
    store: Arc<dyn Store>,
    embedder: Arc<dyn Embedder>,
    indexer: Arc<Indexer>,
    settings: MemorySettings,
    access: mpsc::UnboundedSender<(UserId, Vec<MemoryId>, DateTime<Utc>)>,
    /// Background tasks that hold parts of the engine; joined at shutdown so the indexes are
    /// flushed and released before the process (or a restart in the same process) goes on.
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What `/health` shows of the memory engine.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryStatus {
    pub embedder_model: String,
    pub dimension: usize,
    pub vector_backend: &'static str,
}

impl MemoryEngine {
    /// Builds the embedder and both indexes from settings, catches the indexes up with the
    /// log, and starts the follower and the access recorder.
    pub async fn open(
        settings: &Settings,
        store: Arc<dyn Store>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> MemoryResult<Arc<Self>> {
        let embedder = open_embedder(settings).await?;
        let dimension = embedder.dimension();
        let (vector, watermark): (Arc<dyn VectorIndex>, VectorWatermark) =
            match &settings.qdrant.url {
                Some(url) if !url.is_empty() => {
                    let collection = format!("{}_{dimension}", settings.qdrant.collection);
                    let index = QdrantServerIndex::connect(
                        url,
                        settings
                            .qdrant
                            .api_key
                            .as_ref()
                            .map(|key| key.expose_secret().to_string()),
                        &collection,
                        dimension,
                    )
                    .await?;
                    (
                        Arc::new(index),
                        VectorWatermark::Sql(format!("qdrant:{collection}")),
                    )
                }
                _ => {
                    let dir = settings.data_dir.join(format!("vectors-{dimension}"));
                    let index = EdgeVectorIndex::open(&dir, dimension).await?;
                    index.set_tenant_shard_points(settings.qdrant.tenant_shard_points);
                    (
                        Arc::new(index),
                        VectorWatermark::File(dir.join("applied.seq")),
                    )
                }
            };
        vector.set_search_ef(settings.qdrant.search_ef);
        let keyword_dir = settings.data_dir.join("keyword");
        let keyword = tokio::task::spawn_blocking(move || KeywordIndex::open(Some(&keyword_dir)))
            .await
            .map_err(|error| IndexError::Internal(error.to_string()))??;
        Self::assemble(
            store,
            embedder,
            vector,
            keyword,
            watermark,
            settings.memory.clone(),
            settings.qdrant.optimize_after_upserts,
            shutdown,
        )
        .await
    }

    /// Wires given parts (used by `open` and by benchmarks that bring their own parts).
    #[allow(clippy::too_many_arguments)]
    pub async fn assemble(
        store: Arc<dyn Store>,
        embedder: Arc<dyn Embedder>,
        vector: Arc<dyn VectorIndex>,
        keyword: KeywordIndex,
        watermark: VectorWatermark,
        settings: MemorySettings,
        optimize_after: u64,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> MemoryResult<Arc<Self>> {
        let indexer = Indexer::new(
            store.clone(),
            vector,
            keyword,
            watermark,
            embedder.dimension(),
            optimize_after,
        )
        .await?;
        indexer.catch_up().await?;
        let follower = indexer.spawn(shutdown.clone());
        let (access, receiver) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(record_accesses(store.clone(), receiver, shutdown));
        Ok(Arc::new(Self {
            store,
            embedder,
            indexer,
            settings,
            access,
            background: std::sync::Mutex::new(vec![follower, recorder]),
        }))
    }

    /// Adds a background task to be joined at shutdown.
    pub fn track(&self, task: tokio::task::JoinHandle<()>) {
        self.background
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(task);
    }

    /// Waits (up to `limit`) for the background tasks, which end once their shutdown token is
    /// cancelled; tasks still running after that are aborted.
    pub async fn join_background(&self, limit: Duration) {
        let tasks: Vec<_> = std::mem::take(
            &mut *self
                .background
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        let deadline = tokio::time::Instant::now() + limit;
        for mut task in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::warn!("a background task did not stop in time; aborting it");
                task.abort();
                let _ = task.await;
            }
        }
    }

    pub fn indexer(&self) -> &Arc<Indexer> {
        &self.indexer
    }

    /// The SQL store the engine writes to (document rows live beside the memories).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    pub fn settings(&self) -> &MemorySettings {
        &self.settings
    }

    pub fn status(&self) -> MemoryStatus {
        MemoryStatus {
            embedder_model: self.embedder.model_id().to_string(),
            dimension: self.embedder.dimension(),
            vector_backend: self.indexer.vector().name(),
        }
    }

    async fn embed(&self, texts: &[String]) -> MemoryResult<Vec<Embedded>> {
        let vectors = self.embedder.embed(texts).await?;
        Ok(vectors
            .into_iter()
            .map(|vector| Embedded {
                vector,
                model: self.embedder.model_id().to_string(),
            })
            .collect())
    }

    /// Deletes the memories that clearly match `query` (found by both signals, or very close
    /// in meaning) and returns them. Used by the `forget` tool and API.
    pub async fn forget(&self, user: UserId, query: &str) -> MemoryResult<Vec<Memory>> {
        let request = RecallRequest {
            query: query.to_string(),
            k: Some(10),
            decay: false,
            include_archived: true,
            ..RecallRequest::default()
        };
        let mut forgotten = Vec::new();
        for result in self.recall(user, request).await?.results {
            let signals = &result.signals;
            let strong = (signals.bm25_rank.is_some()
                && signals.vector_score.is_some_and(|s| s >= 0.5))
                || signals.vector_score.is_some_and(|score| score >= 0.7);
            if strong && result.memory.kind != MemoryKind::Profile {
                self.store.delete_memory(user, result.memory.id).await?;
                forgotten.push(result.memory);
            }
        }
        // A profile distilled from a forgotten memory goes too; the writer rebuilds it.
        if let Some(profile) = self.profile(user).await? {
            let derived = forgotten
                .iter()
                .any(|memory| profile.source_refs.contains(&memory.id.to_string()));
            if derived {
                self.store.delete_memory(user, profile.id).await?;
            }
        }
        self.indexer.notify();
        Ok(forgotten)
    }

    /// The user's current profile text, if one has been built.
    pub async fn profile(&self, user: UserId) -> MemoryResult<Option<Memory>> {
        let filter = MemoryFilter {
            kinds: Some(vec![MemoryKind::Profile]),
            ..MemoryFilter::default()
        };
        Ok(self
            .store
            .list_memories(user, &filter, 1, None)
            .await?
            .into_iter()
            .next())
    }

    /// One text's vector with the current model.
    pub async fn embed_one(&self, text: &str) -> MemoryResult<Embedded> {
        self.embed(&[text.to_string()])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| MemoryError::Embed(EmbedError::Internal("no vector returned".into())))
    }

    fn check_content(content: &str) -> MemoryResult<()> {
        if content.trim().is_empty() {
            return Err(MemoryError::BadRequest(
                "memory content must not be empty".into(),
            ));
        }
        if content.chars().count() > MAX_MEMORY_CHARS {
            return Err(MemoryError::BadRequest(format!(
                "memory content is longer than {MAX_MEMORY_CHARS} characters"
            )));
        }
        Ok(())
    }

    /// Embeds and stores new memories; they are acknowledged when this returns and become
    /// recallable once the indexer has applied them (`wait_recallable`).
    pub async fn add(&self, user: UserId, memories: Vec<NewMemory>) -> MemoryResult<Vec<Memory>> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        for memory in &memories {
            Self::check_content(&memory.content)?;
        }
        let texts: Vec<String> = memories.iter().map(|m| m.content.clone()).collect();
        let embedded = self.embed(&texts).await?;
        let written = self
            .store
            .insert_memories(user, memories.into_iter().zip(embedded).collect())
            .await?;
        self.indexer.notify();
        metrics::counter!("mnemo_memories_written_total").increment(written.len() as u64);
        Ok(written)
    }

    /// Waits until everything written so far is in both indexes; false on timeout.
    pub async fn wait_recallable(&self, timeout: Duration) -> MemoryResult<bool> {
        let head = self.store.memory_log_head().await?;
        Ok(self.indexer.wait_for(head, timeout).await)
    }

    pub async fn recall(
        &self,
        user: UserId,
        request: RecallRequest,
    ) -> MemoryResult<RecallResponse> {
        self.recall_with(user, request, &self.settings, Utc::now(), true)
            .await
    }

    /// `recall` replayed at a fixed clock `now`, ranked with `settings` instead of the
    /// engine's, and recording no access. Evaluations use it: decay is computed against the
    /// dataset's timeline (and not disturbed by the evaluation's own reads), one index can be
    /// ranked with several fusion constants, and reruns give the same results.
    pub async fn recall_at(
        &self,
        user: UserId,
        request: RecallRequest,
        settings: &MemorySettings,
        now: DateTime<Utc>,
    ) -> MemoryResult<RecallResponse> {
        self.recall_with(user, request, settings, now, false).await
    }

    async fn recall_with(
        &self,
        user: UserId,
        request: RecallRequest,
        settings: &MemorySettings,
        now: DateTime<Utc>,
        record_access: bool,
    ) -> MemoryResult<RecallResponse> {
        let started = Instant::now();
        let query = request.query.trim();
        if query.is_empty() {
            return Err(MemoryError::BadRequest("query must not be empty".into()));
        }
        let k = request.k.unwrap_or(settings.default_k);
        if k == 0 || k > settings.max_k {
            return Err(MemoryError::BadRequest(format!(
                "k must be between 1 and {}",
                settings.max_k
            )));
        }
        let candidates = request
            .candidates
            .unwrap_or(settings.candidates)
            .max(k)
            .min(1000);
        // No kinds asked for means the ordinary ones: document chunks only when asked.
        let kinds = request.kinds.clone().unwrap_or_else(MemoryKind::ordinary);
        let filter = VectorFilter {
            kinds: Some(kinds.iter().map(|kind| kind.as_str().to_string()).collect()),
            since_ms: request.since.map(|time| time.timestamp_millis()),
            // The index filter's upper bound is exclusive; ours is inclusive.
            until_ms: request.until.map(|time| time.timestamp_millis() + 1),
            include_archived: request.include_archived,
            include_invalid: false,
        };
        let first_chunk = (2 * k).max(HYDRATE_CHUNK_MIN);
        let (vector_hits, keyword_hits, prefetched, embed_ms, vector_ms, keyword_ms) = {
            let use_vector = request.mode != RecallMode::Keyword;
            let use_keyword = request.mode != RecallMode::Vector;
            let keyword = self.indexer.keyword().clone();
            let keyword_search = async {
                if !use_keyword {
                    return Ok((Vec::new(), 0.0, Vec::new()));
                }
                let started = Instant::now();
                let hits = keyword
                    .search_async(user, query.to_string(), filter.clone(), candidates)
                    .await?;
                let keyword_ms = elapsed_ms(started);
                // The vector side (embedding the query, then searching) takes longer: read
                // the rows of the best keyword hits meanwhile, as the first reading round
                // after fusion will want most of them.
                let prefetched = if use_vector && !hits.is_empty() {
                    let ids: Vec<MemoryId> =
                        hits.iter().take(first_chunk).map(|(id, _)| *id).collect();
                    self.store.memories_by_ids(user, &ids).await?
                } else {
                    Vec::new()
                };
                Ok::<_, MemoryError>((hits, keyword_ms, prefetched))
            };
            let vector_search = async {
                if !use_vector {
                    return Ok::<_, MemoryError>((Vec::new(), 0.0, 0.0));
                }
                let embed_started = Instant::now();
                let embedded = self.embedder.embed(&[query.to_string()]).await?;
                let embed_ms = elapsed_ms(embed_started);
                let vector = embedded.into_iter().next().unwrap_or_default();
                let search_started = Instant::now();
                let hits = self
                    .indexer
                    .vector()
                    .search(user, &vector, &filter, candidates)
                    .await?;
                Ok((hits, embed_ms, elapsed_ms(search_started)))
            };
            let (keyword_result, vector_result) = tokio::join!(keyword_search, vector_search);
            let (vector_hits, embed_ms, vector_ms) = vector_result?;
            let (keyword_hits, keyword_ms, prefetched) = keyword_result?;
            (
                vector_hits,
                keyword_hits,
                prefetched,
                embed_ms,
                vector_ms,
                keyword_ms,
            )
        };
        let sql_filter = MemoryFilter {
            kinds: Some(kinds),
            since: request.since,
            until: request.until,
            include_archived: request.include_archived,
            include_invalid: false,
        };
        let fused = recall::fuse(&vector_hits, &keyword_hits, settings.rrf_k);
        // SQL is the truth: hits are re-read for this user and re-checked against the filter,
        // in fused order and only as far as they can still change the top k.
        let select_started = Instant::now();
        let hydrate_ns = AtomicU64::new(0);
        let mut prefetched: std::collections::HashMap<MemoryId, Memory> = prefetched
            .into_iter()
            .map(|memory| (memory.id, memory))
            .collect();
        let (results, _) = recall::select_reading(
            &fused,
            settings,
            request.decay,
            now,
            k,
            first_chunk,
            |ids| {
                let started = Instant::now();
                let mut rows = Vec::with_capacity(ids.len());
                let mut missing = Vec::new();
                for id in ids {
                    match prefetched.remove(&id) {
                        Some(memory) => rows.push(memory),
                        None => missing.push(id),
                    }
                }
                let store = &self.store;
                let sql_filter = &sql_filter;
                let hydrate_ns = &hydrate_ns;
                async move {
                    if !missing.is_empty() {
                        rows.extend(store.memories_by_ids(user, &missing).await?);
                    }
                    hydrate_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    Ok::<_, MemoryError>(
                        rows.into_iter()
                            .filter(|memory| sql_filter.admits(memory))
                            .collect(),
                    )
                }
            },
        )
        .await?;
        let hydrate_ms = hydrate_ns.into_inner() as f64 / 1e6;
        let rank_ms = elapsed_ms(select_started) - hydrate_ms;
        let recalled: Vec<MemoryId> = results.iter().map(|r| r.memory.id).collect();
        if record_access && !recalled.is_empty() {
            let _ = self.access.send((user, recalled, crate::store::now()));
        }
        let total_ms = elapsed_ms(started);
        metrics::histogram!("mnemo_recall_duration_seconds").record(total_ms / 1000.0);
        Ok(RecallResponse {
            results,
            timings: RecallTimings {
                embed_ms,
                vector_ms,
                keyword_ms,
                hydrate_ms,
                rank_ms,
                search_ms: total_ms - embed_ms,
                total_ms,
            },
        })
    }

    pub async fn get(
        &self,
        user: UserId,
        id: MemoryId,
    ) -> MemoryResult<(Memory, Vec<MemoryVersion>)> {
        let memory = self.store.get_memory(user, id).await?;
        let history = self.store.memory_history(user, id).await?;
        Ok((memory, history))
    }

    /// Newest first. Without kinds in the filter, the ordinary kinds (no document chunks).
    pub async fn list(
        &self,
        user: UserId,
        filter: &MemoryFilter,
        limit: i64,
        before: Option<MemoryId>,
    ) -> MemoryResult<Vec<Memory>> {
        let mut filter = filter.clone();
        if filter.kinds.is_none() {
            filter.kinds = Some(MemoryKind::ordinary());
        }
        Ok(self
            .store
            .list_memories(user, &filter, limit, before)
            .await?)
    }

    /// Changes content (re-embedding it), kind, importance, or archives/restores.
    pub async fn update(
        &self,
        user: UserId,
        id: MemoryId,
        content: Option<String>,
        kind: Option<MemoryKind>,
        importance: Option<u8>,
        archived: Option<bool>,
    ) -> MemoryResult<Memory> {
        let content = match content {
            Some(content) => {
                Self::check_content(&content)?;
                // Ownership first, so another user's id costs no embedding.
                self.store.get_memory(user, id).await?;
                let embedded = self.embed(std::slice::from_ref(&content)).await?;
                embedded
                    .into_iter()
                    .next()
                    .map(|embedded| (content, embedded))
            }
            None => None,
        };
        let patch = MemoryPatch {
            content,
            kind,
            importance,
            archived,
            invalid_at: None,
        };
        let memory = self.store.update_memory(user, id, patch).await?;
        self.indexer.notify();
        Ok(memory)
    }

    pub async fn delete(&self, user: UserId, id: MemoryId) -> MemoryResult<()> {
        self.store.delete_memory(user, id).await?;
        self.indexer.notify();
        Ok(())
    }

    pub async fn delete_all(&self, user: UserId) -> MemoryResult<u64> {
        let deleted = self.store.delete_all_memories(user).await?;
        self.indexer.notify();
        Ok(deleted)
    }

    /// Every memory of the user (archived and superseded ones too), oldest first.
    pub async fn export(&self, user: UserId) -> MemoryResult<Vec<Memory>> {
        let filter = MemoryFilter {
            include_archived: true,
            include_invalid: true,
            ..MemoryFilter::default()
        };
        let mut all = self.store.all_memories(user, &filter).await?;
        all.reverse();
        Ok(all)
    }

    /// Imports JSONL lines (the export format). Lines whose content the user already has are
    /// skipped, so importing the same file twice adds nothing. `source` becomes `import`;
    /// trust is kept (never raised above what the line says).
    pub async fn import(&self, user: UserId, jsonl: &str) -> MemoryResult<ImportReport> {
        let mut report = ImportReport::default();
        let existing: std::collections::HashSet<String> = self
            .export(user)
            .await?
            .into_iter()
            .map(|memory| memory.content)
            .collect();
        let mut seen = existing;
        let mut batch: Vec<(usize, PortableMemory)> = Vec::new();
        for (index, line) in jsonl.lines().enumerate() {
            let line_number = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<PortableMemory>(line) {
                Ok(item) => {
                    if let Err(error) = Self::check_content(&item.content) {
                        report.errors.push(ImportLineError {
                            line: line_number,
                            message: error.to_string(),
                        });
                    } else if !(1..=5).contains(&item.importance) {
                        report.errors.push(ImportLineError {
                            line: line_number,
                            message: "importance must be between 1 and 5".into(),
                        });
                    } else if !seen.insert(item.content.clone()) {
                        report.skipped += 1;
                    } else {
                        batch.push((line_number, item));
                    }
                }
                Err(error) => report.errors.push(ImportLineError {
                    line: line_number,
                    message: format!("invalid memory: {error}"),
                }),
            }
        }
        for chunk in batch.chunks(256) {
            let news: Vec<NewMemory> = chunk
                .iter()
                .map(|(_, item)| NewMemory {
                    kind: item.kind,
                    content: item.content.clone(),
                    source: MemorySource::Import,
                    trust: item.trust.unwrap_or(Trust::User),
                    importance: item.importance,
                    thread_id: None,
                    source_refs: item.source_refs.clone(),
                    created_at: item.created_at,
                    supersedes: None,
                })
                .collect();
            let written = self.add(user, news).await?;
            for ((_, item), memory) in chunk.iter().zip(&written) {
                if item.archived_at.is_some() || item.invalid_at.is_some() {
                    let patch = MemoryPatch {
                        archived: item.archived_at.map(|_| true),
                        invalid_at: item.invalid_at.map(Some),
                        ..MemoryPatch::default()
                    };
                    self.store.update_memory(user, memory.id, patch).await?;
                }
            }
            report.imported += written.len();
        }
        self.indexer.notify();
        Ok(report)
    }

    /// Re-embeds memories made by another model (after a model change), in batches, calling
    /// `progress(done, total)`. Returns how many were re-embedded.
    pub async fn reembed_stale(&self, progress: impl Fn(u64, u64)) -> MemoryResult<u64> {
        let model = self.embedder.model_id().to_string();
        let total = self
            .store
            .count_memories_not_embedded_by(&model)
            .await?
            .max(0) as u64;
        let mut done = 0u64;
        loop {
            let stale = self.store.memories_not_embedded_by(&model, 64).await?;
            if stale.is_empty() {
                break;
            }
            let texts: Vec<String> = stale
                .iter()
                .map(|owned| owned.memory.content.clone())
                .collect();
            let embedded = self.embed(&texts).await?;
            for (owned, embedded) in stale.iter().zip(embedded) {
                self.store.set_embedding(owned.memory.id, &embedded).await?;
            }
            done += stale.len() as u64;
            progress(done, total.max(done));
            self.indexer.notify();
        }
        Ok(done)
    }

    /// Adds a memory on behalf of the user from a thread (used by the chat agent and writer).
    pub fn new_user_memory(
        kind: MemoryKind,
        content: String,
        importance: u8,
        thread: Option<ThreadId>,
    ) -> NewMemory {
        let mut memory = NewMemory::from_user(kind, content, importance);
        memory.thread_id = thread;
        memory
    }
}

async fn open_embedder(settings: &Settings) -> MemoryResult<Arc<dyn Embedder>> {
    let config = &settings.embedder;
    if config.provider == "openai" {
        let (Some(base_url), Some(model), Some(dimension)) =
            (&config.base_url, &config.model, config.dimension)
        else {
            return Err(MemoryError::BadRequest(
                "embedder.provider = openai needs embedder.base_url, embedder.model and embedder.dimension".into(),
            ));
        };
        let key = config
            .api_key
            .as_ref()
            .map(|key| key.expose_secret().to_string());
        return Ok(Arc::new(OpenAiEmbedder::new(
            base_url, key, model, dimension,
        )?));
    }
    let dir = config.model_dir.clone();
    if !Path::new(&dir).join("config.json").exists() {
        return Err(MemoryError::Embed(EmbedError::Unavailable(format!(
            "no embedding model in {} (run scripts/fetch-model, or set embedder.model_dir)",
            dir.display()
        ))));
    }
    let embedder = tokio::task::spawn_blocking(move || LocalEmbedder::load(&dir))
        .await
        .map_err(|error| EmbedError::Internal(error.to_string()))??;
    Ok(Arc::new(embedder))
}

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// Writes access stats in the background, merging bursts, so recall never waits on them.
async fn record_accesses(
    store: Arc<dyn Store>,
    mut receiver: mpsc::UnboundedReceiver<(UserId, Vec<MemoryId>, DateTime<Utc>)>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        let first = tokio::select! {
            item = receiver.recv() => item,
            _ = shutdown.cancelled() => None,
        };
        let Some(first) = first else { return };
        let mut pending: std::collections::HashMap<UserId, (Vec<MemoryId>, DateTime<Utc>)> =
            std::collections::HashMap::new();
        let mut add = |(user, ids, at): (UserId, Vec<MemoryId>, DateTime<Utc>)| {
            let entry = pending.entry(user).or_insert_with(|| (Vec::new(), at));
            entry.0.extend(ids);
            entry.1 = entry.1.max(at);
        };
        add(first);
        while let Ok(item) = receiver.try_recv() {
            add(item);
        }
        for (user, (mut ids, at)) in pending {
            ids.sort();
            ids.dedup();
            if let Err(error) = store.record_access(user, &ids, at).await {
                tracing::warn!(%error, "recording memory access failed");
            }
        }
    }
}
