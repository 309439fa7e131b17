//! Episodic memory for each user: writes (SQL first, indexes follow the log), hybrid recall,
//! export/import, re-embedding after a model change, and the decay job. Every function takes
//! the owner's `UserId`.

pub(crate) mod asked;
pub(crate) mod cues;
pub(crate) mod decay;
pub(crate) mod extract;
mod forget;
mod portable;
pub mod rank;
mod recall;
pub mod relevance;
pub(crate) mod when;
pub mod writer;

pub(crate) use forget::ForgetMatch;
pub use forget::values_differ;
pub(crate) use portable::ImportReport;
pub use portable::PortableMemory;
pub(crate) use recall::RecallResponse;
pub use recall::{RecallRequest, RecallTimings};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::MemorySettings;
use crate::error::{ErrorKind, HasKind};
use crate::index::indexer::{Indexer, IndexerError, VectorWatermark};
use crate::index::keyword::KeywordSearch;
use crate::index::vector::{IndexError, VectorIndex};
use crate::index::views::{self, ContextEmbedding};
use crate::llm::embed::{EmbedError, Embedder};
use crate::store::{
    Embedded, Memory, MemoryFilter, MemoryId, MemoryKind, MemoryPatch, MemoryVersion, NewMemory,
    Store, StoreError, UserId,
};
use relevance::{QueryProfile, Relevance};

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

impl HasKind for MemoryError {
    fn kind(&self) -> ErrorKind {
        match self {
            MemoryError::Store(error) => error.kind(),
            MemoryError::BadRequest(_) => ErrorKind::BadRequest,
            MemoryError::Embed(error) => error.kind(),
            // An index refusing its input is our bug, not the caller's.
            MemoryError::Index(IndexError::BadInput(_)) => ErrorKind::Internal,
            MemoryError::Index(error) => error.kind(),
            MemoryError::Indexer(error) => match error.kind() {
                kind @ (ErrorKind::Unavailable | ErrorKind::Busy) => kind,
                _ => ErrorKind::Internal,
            },
        }
    }
}

pub(crate) type MemoryResult<T> = Result<T, MemoryError>;

/// Memory content is capped so one memory stays a short statement.
pub const MAX_MEMORY_CHARS: usize = 8_000;
/// Memories re-embedded (and written in one transaction) at a time after a model change.
const REEMBED_BATCH: i64 = 256;

pub struct MemoryEngine {
    store: Arc<dyn Store>,
    embedder: Arc<dyn Embedder>,
    /// The indexer recall and writes go through; replaced once if keyword vectors are filled
    /// in the background ([`MemoryEngine::fill_keywords`]). Shared with the task that wakes it.
    indexer: Serving,
    /// The serving indexer's follower and what stops it (a child of the shutdown token).
    follower: parking_lot::Mutex<Option<Follower>>,
    settings: MemorySettings,
    access: mpsc::UnboundedSender<Access>,
    /// Background tasks that hold parts of the engine; joined at shutdown so the indexes are
    /// flushed and released before the process (or a restart in the same process) goes on.
    background: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Per user, the names of the speakers of their imported conversations (for the speaker
    /// prior); refreshed after new turns are written.
    speakers: parking_lot::Mutex<HashMap<UserId, Arc<Vec<String>>>>,
    /// The embedder's calibration: every decision about meaning goes through it.
    relevance: Arc<Relevance>,
}

/// What `/health` shows of the memory engine.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MemoryStatus {
    pub embedder_model: String,
    pub dimension: usize,
    pub vector_backend: &'static str,
}

impl MemoryEngine {
    /// Wires the given backends (built by `startup`, or by benchmarks that bring their own),
    /// catches the indexes up with the log, and starts the follower and the access recorder.
    #[allow(clippy::too_many_arguments)]
    pub async fn assemble(
        store: Arc<dyn Store>,
        embedder: Arc<dyn Embedder>,
        vector: Arc<dyn VectorIndex>,
        keyword: KeywordSearch,
        watermark: VectorWatermark,
        settings: MemorySettings,
        optimize_after: u64,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> MemoryResult<Arc<Self>> {
        let relevance = Relevance::calibrate(embedder.as_ref()).await?;
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
        let follower = Follower::start(&indexer, &shutdown);
        let indexer: Serving = Arc::new(parking_lot::RwLock::new(indexer));
        let woken = spawn_log_wakeups(store.clone(), indexer.clone(), shutdown.clone());
        let (access, receiver) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(record_accesses(store.clone(), receiver, shutdown));
        Ok(Arc::new(Self {
            store,
            embedder,
            indexer,
            follower: parking_lot::Mutex::new(Some(follower)),
            settings,
            access,
            background: parking_lot::Mutex::new(vec![woken, recorder]),
            speakers: parking_lot::Mutex::new(HashMap::new()),
            relevance,
        }))
    }

    /// Adds a background task to be joined at shutdown.
    pub(crate) fn track(&self, task: tokio::task::JoinHandle<()>) {
        self.background.lock().push(task);
    }

    /// Waits (up to `limit`) for the background tasks, which end once their shutdown token is
    /// cancelled; tasks still running after that are aborted.
    pub async fn join_background(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let tasks: Vec<_> = std::mem::take(&mut *self.background.lock());
        for task in tasks {
            join_by(task, deadline).await;
        }
        // The follower last: a hand-over (one of the tasks above) may have replaced it.
        let follower = self.follower.lock().take();
        if let Some(follower) = follower {
            follower.stop(deadline).await;
        }
    }

    /// The engine's part of a shutdown whose token was cancelled: its background tasks end
    /// (aborted past `grace`), then the indexes are made durable and closed. Nothing is
    /// written to them after this; the caller closes the store and lets the data directory go.
    pub async fn close(&self, grace: Duration) {
        self.join_background(grace).await;
        if let Err(error) = self.indexer().close().await {
            tracing::warn!(%error, "closing the indexes failed; the memory log replays on the next start");
        }
    }

    /// The indexer serving now.
    pub fn indexer(&self) -> Arc<Indexer> {
        self.indexer.read().clone()
    }

    /// Moves keyword search onto `target` (the vector index with keyword vectors beside the
    /// dense ones) without keeping anyone waiting: a background task fills it from the memory
    /// log, logging progress, while the serving indexer answers; once it holds everything the
    /// serving one holds, it serves instead and the old follower stops. A shutdown meanwhile
    /// keeps what was filled (its watermark) for the next start.
    pub(crate) async fn fill_keywords(
        self: &Arc<Self>,
        target: (Arc<dyn VectorIndex>, KeywordSearch, VectorWatermark),
        optimize_after: u64,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> MemoryResult<()> {
        let (vector, keyword, watermark) = target;
        let next = Indexer::new(
            self.store.clone(),
            vector,
            keyword,
            watermark,
            self.embedder.dimension(),
            optimize_after,
        )
        .await?;
        let engine = self.clone();
        self.track(tokio::spawn(async move {
            if let Err(error) = engine.take_over(next, &shutdown).await {
                tracing::error!(
                    %error,
                    "filling the keyword vectors failed; keyword search stays in this replica until the next start"
                );
            }
        }));
        Ok(())
    }

    async fn take_over(
        &self,
        next: Arc<Indexer>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> MemoryResult<()> {
        let serving = self.indexer();
        tracing::info!("filling keyword vectors on the Qdrant server in the background");
        if !next.fill_behind(&serving, shutdown).await? {
            return Ok(());
        }
        let old = {
            // The serving indexer applies nothing more until `next` serves: `next` holds at
            // least what any recall or write has seen.
            let _held = serving.hold().await;
            next.catch_up().await?;
            *self.indexer.write() = next.clone();
            self.follower
                .lock()
                .replace(Follower::start(&next, shutdown))
        };
        // The old follower stops after the batch it may be applying (it waited on the hold).
        if let Some(old) = old {
            old.stop(tokio::time::Instant::now() + Duration::from_secs(30))
                .await;
        }
        tracing::info!(
            "keyword search runs on the Qdrant server now; this replica's keyword index is removed at its next start"
        );
        serving.hand_over(&next, shutdown).await;
        Ok(())
    }

    /// The SQL store the engine writes to (document rows live beside the memories).
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    pub fn settings(&self) -> &MemorySettings {
        &self.settings
    }

    /// The embedder's relevance calibration.
    pub fn relevance(&self) -> &Arc<Relevance> {
        &self.relevance
    }

    /// A query embedded (as a query) and made ready for relevance scoring.
    pub async fn query_profile(&self, query: &str) -> MemoryResult<QueryProfile> {
        let vector = self.embedder.embed_query(query).await?;
        Ok(self.relevance.profile(query, vector))
    }

    pub(crate) fn status(&self) -> MemoryStatus {
        MemoryStatus {
            embedder_model: self.embedder.model_id().to_string(),
            dimension: self.embedder.dimension(),
            vector_backend: self.indexer().vector().name(),
        }
    }

    async fn embed(&self, texts: &[String]) -> MemoryResult<Vec<Embedded>> {
        let vectors = self.embedder.embed(texts).await?;
        Ok(vectors
            .into_iter()
            .map(|vector| Embedded {
                vector,
                model: self.embedder.vectors_id().to_string(),
            })
            .collect())
    }

    /// The user's current profile text, if one has been built.
    pub(crate) async fn profile(&self, user: UserId) -> MemoryResult<Option<Memory>> {
        let filter = MemoryFilter {
            kinds: Some(vec![MemoryKind::Profile]),
            ..MemoryFilter::default()
        };
        Ok(self
            .store
            .user(user)
            .list_memories(&filter, 1, None)
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
        self.add_embedded(user, memories.into_iter().zip(embedded).collect())
            .await
    }

    /// [`MemoryEngine::add`] for memories already embedded with the current model.
    pub(crate) async fn add_embedded(
        &self,
        user: UserId,
        memories: Vec<(NewMemory, Embedded)>,
    ) -> MemoryResult<Vec<Memory>> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        let written = self.store.user(user).insert_memories(memories).await?;
        self.indexer().notify();
        let turns: Vec<MemoryId> = written
            .iter()
            .filter(|memory| memory.kind == MemoryKind::Turn)
            .map(|memory| memory.id)
            .collect();
        if !turns.is_empty() {
            self.speakers.lock().remove(&user);
            self.refresh_contexts(user, &turns, true).await?;
        }
        metrics::counter!("mnemo_memories_written_total").increment(written.len() as u64);
        Ok(written)
    }

    /// The one speaker of the user's conversations the query names (a whole word, any
    /// case), if it names exactly one.
    pub(crate) async fn speaker_named_in(
        &self,
        user: UserId,
        query: &str,
    ) -> MemoryResult<Option<String>> {
        let cached = self.speakers.lock().get(&user).cloned();
        let speakers = match cached {
            Some(speakers) => speakers,
            None => {
                let found = Arc::new(self.store.user(user).message_authors().await?);
                self.speakers.lock().insert(user, found.clone());
                found
            }
        };
        let words: std::collections::HashSet<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|word| !word.is_empty())
            .map(str::to_lowercase)
            .collect();
        let named: Vec<&String> = speakers
            .iter()
            .filter(|speaker| words.contains(&speaker.to_lowercase()))
            .collect();
        Ok(match named.as_slice() {
            [one] => Some((*one).clone()),
            _ => None,
        })
    }

    /// Waits until everything written so far is in both indexes; false on timeout.
    pub async fn wait_recallable(&self, timeout: Duration) -> MemoryResult<bool> {
        let head = self.store.maintenance().memory_log_head().await?;
        Ok(self.indexer().wait_for(head, timeout).await)
    }

    /// Waits (up to [`SETTLE_WAIT`]) until the indexes hold everything written before this
    /// call, by any replica, so that a search for what the user already has sees the user's
    /// latest writes: the indexes follow the log a moment behind SQL, and a statement written
    /// just now is otherwise written again. After the wait the search goes on with what the
    /// indexes hold (an index that cannot be reached fails the search itself).
    pub(crate) async fn settle(&self) -> MemoryResult<()> {
        if !self.wait_recallable(SETTLE_WAIT).await? {
            tracing::warn!(
                wait = ?SETTLE_WAIT,
                "the indexes are behind the memory log; a statement written just now may be written again"
            );
        }
        Ok(())
    }

    pub(crate) async fn get(
        &self,
        user: UserId,
        id: MemoryId,
    ) -> MemoryResult<(Memory, Vec<MemoryVersion>)> {
        let mut memory = self.store.user(user).get_memory(id).await?;
        self.store
            .user(user)
            .fill_successors(std::slice::from_mut(&mut memory))
            .await?;
        let history = self.store.user(user).memory_history(id).await?;
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
        let mut memories = self
            .store
            .user(user)
            .list_memories(&filter, limit, before)
            .await?;
        self.store.user(user).fill_successors(&mut memories).await?;
        Ok(memories)
    }

    /// Changes content (re-embedding it), kind, importance, or archives/restores.
    pub(crate) async fn update(
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
                self.store.user(user).get_memory(id).await?;
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
        let memory = self.store.user(user).update_memory(id, patch).await?;
        self.indexer().notify();
        Ok(memory)
    }

    pub(crate) async fn delete(&self, user: UserId, id: MemoryId) -> MemoryResult<()> {
        let scope = self.store.user(user);
        let around: Vec<MemoryId> = scope
            .turn_neighbours(&[id])
            .await?
            .into_iter()
            .flat_map(|(_, previous, next)| previous.into_iter().chain(next))
            .collect();
        scope.delete_memory(id).await?;
        // The neighbours' context views held the deleted turn: embed them again without it.
        self.refresh_contexts(user, &around, false).await?;
        self.indexer().notify();
        Ok(())
    }

    /// Makes the context views' vectors of the user's turn memories `ids` (and, with
    /// `with_neighbours`, of the turns around them, whose contexts now include them) — the
    /// context text embedded, or the mean of the own vectors where that text is long
    /// (`views::context_embedding`) — and stores them; the indexes follow through the log.
    async fn refresh_contexts(
        &self,
        user: UserId,
        ids: &[MemoryId],
        with_neighbours: bool,
    ) -> MemoryResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let scope = self.store.user(user);
        let mut wanted: Vec<MemoryId> = ids.to_vec();
        if with_neighbours {
            for (_, previous, next) in scope.turn_neighbours(ids).await? {
                wanted.extend(previous.into_iter().chain(next));
            }
            wanted.sort_unstable();
            wanted.dedup();
        }
        let around: HashMap<MemoryId, (Option<MemoryId>, Option<MemoryId>)> = scope
            .turn_neighbours(&wanted)
            .await?
            .into_iter()
            .map(|(id, previous, next)| (id, (previous, next)))
            .collect();
        let mut rows_wanted: Vec<MemoryId> = wanted
            .iter()
            .copied()
            .chain(
                around
                    .values()
                    .flat_map(|(previous, next)| previous.iter().chain(next))
                    .copied(),
            )
            .collect();
        rows_wanted.sort_unstable();
        rows_wanted.dedup();
        let rows: HashMap<MemoryId, Memory> = scope
            .memories_by_ids(&rows_wanted)
            .await?
            .into_iter()
            .map(|memory| (memory.id, memory))
            .collect();
        let model = self.embedder.vectors_id();
        let mut contexts = Vec::new();
        let mut targets = Vec::new();
        let mut texts = Vec::new();
        for id in &wanted {
            let Some(memory) = rows
                .get(id)
                .filter(|memory| memory.kind == MemoryKind::Turn)
            else {
                continue;
            };
            let (previous, next) = around.get(id).copied().unwrap_or_default();
            let (previous, next) = (
                previous.and_then(|id| rows.get(&id)),
                next.and_then(|id| rows.get(&id)),
            );
            match views::context_embedding(previous, memory, next, model) {
                ContextEmbedding::Mean(vector) => contexts.push((
                    *id,
                    Embedded {
                        vector,
                        model: model.to_string(),
                    },
                )),
                ContextEmbedding::Text(text) => {
                    targets.push(*id);
                    texts.push(text);
                }
            }
        }
        let embedded = self.embed(&texts).await?;
        contexts.extend(targets.into_iter().zip(embedded));
        scope.set_context_embeddings(contexts).await?;
        Ok(())
    }

    pub(crate) async fn delete_all(&self, user: UserId) -> MemoryResult<u64> {
        let deleted = self.store.user(user).delete_all_memories().await?;
        self.indexer().notify();
        Ok(deleted)
    }

    /// Relabels vectors stored under an id of an earlier version that this embedder makes the
    /// same way ([`Embedder::earlier_vectors_id`]: the bare model id, when the arithmetic is
    /// the default's), so that recording the arithmetic does not make them all again. Returns
    /// how many memories' and context views' vectors were relabelled.
    pub(crate) async fn adopt_earlier_vectors(&self) -> MemoryResult<u64> {
        let Some(earlier) = self.embedder.earlier_vectors_id() else {
            return Ok(0);
        };
        let current = self.embedder.vectors_id();
        if earlier == current {
            return Ok(0);
        }
        let relabelled = self
            .store
            .maintenance()
            .relabel_embeddings(earlier, current)
            .await?;
        if relabelled > 0 {
            tracing::info!(
                relabelled,
                from = earlier,
                to = current,
                "vectors of the same model and arithmetic kept under the id that names both"
            );
        }
        Ok(relabelled)
    }

    /// Embeds the context views of turns that have none of the current model (after a crash
    /// between a turn and its context, or a model change), in batches. Returns how many.
    pub(crate) async fn reembed_stale_contexts(&self) -> MemoryResult<u64> {
        self.adopt_earlier_vectors().await?;
        let model = self.embedder.vectors_id().to_string();
        let mut done = 0u64;
        loop {
            let stale = self
                .store
                .maintenance()
                .turns_without_context(&model, 64)
                .await?;
            if stale.is_empty() {
                return Ok(done);
            }
            let mut by_user: HashMap<UserId, Vec<MemoryId>> = HashMap::new();
            for owned in &stale {
                by_user.entry(owned.user).or_default().push(owned.memory.id);
            }
            for (user, ids) in by_user {
                self.refresh_contexts(user, &ids, false).await?;
            }
            done += stale.len() as u64;
            self.indexer().notify();
        }
    }

    /// Re-embeds memories made by another model (after a model change), in batches, calling
    /// `progress(done, total)`. Returns how many were re-embedded.
    pub(crate) async fn reembed_stale(&self, progress: impl Fn(u64, u64)) -> MemoryResult<u64> {
        self.adopt_earlier_vectors().await?;
        let model = self.embedder.vectors_id().to_string();
        let total = self
            .store
            .maintenance()
            .count_memories_not_embedded_by(&model)
            .await?
            .max(0) as u64;
        let mut done = 0u64;
        loop {
            let stale = self
                .store
                .maintenance()
                .memories_not_embedded_by(&model, REEMBED_BATCH)
                .await?;
            if stale.is_empty() {
                break;
            }
            let texts: Vec<String> = stale
                .iter()
                .map(|owned| owned.memory.content.clone())
                .collect();
            let embedded = self.embed(&texts).await?;
            let items: Vec<(UserId, MemoryId, Embedded)> = stale
                .iter()
                .zip(embedded)
                .map(|(owned, embedded)| (owned.user, owned.memory.id, embedded))
                .collect();
            // One transaction a batch.
            self.store.maintenance().set_embeddings(&items).await?;
            done += stale.len() as u64;
            progress(done, total.max(done));
            self.indexer().notify();
        }
        Ok(done)
    }
}

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// Wakes the indexer when any replica wrote memories (PostgreSQL's NOTIFY on the memory log),
/// so a write made through another replica is recallable here without waiting for the
/// indexer's poll; where the backend cannot notify, the task ends and the poll remains.
fn spawn_log_wakeups(
    store: Arc<dyn Store>,
    indexer: Serving,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        store
            .maintenance()
            .on_wakeups(crate::store::WakeChannel::MemoryLog, &shutdown, |_| {
                indexer.read().notify();
            })
            .await;
    })
}

/// After writing access stats, the recorder gathers what comes for this long before it writes
/// again. Every write to the memories table makes SQLite drop the page cache of every other
/// connection, so a write per recall would make the next recalls read their rows from disk
/// pages again; one write a second keeps the cache warm under a stream of recalls. A lone
/// recall is still written at once.
const ACCESS_EVERY: Duration = Duration::from_secs(1);

/// How long a search for what the user already has waits for the indexes to catch up with
/// the log ([`MemoryEngine::settle`]). They are milliseconds behind when healthy.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

type Access = (UserId, Vec<MemoryId>, DateTime<Utc>);

/// The serving indexer, replaceable ([`MemoryEngine::fill_keywords`]).
type Serving = Arc<parking_lot::RwLock<Arc<Indexer>>>;

/// An indexer's follower task ([`Indexer::spawn`]) and the token that stops it.
struct Follower {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    /// Starts `indexer`'s follower, stopped by `shutdown` or by [`Follower::stop`].
    fn start(indexer: &Arc<Indexer>, shutdown: &tokio_util::sync::CancellationToken) -> Self {
        let stop = shutdown.child_token();
        let task = indexer.spawn(stop.clone());
        Self { stop, task }
    }

    /// Stops it and waits until it has (aborted at `deadline`).
    async fn stop(self, deadline: tokio::time::Instant) {
        self.stop.cancel();
        join_by(self.task, deadline).await;
    }
}

/// Waits for `task` until `deadline`, then aborts it.
async fn join_by(mut task: tokio::task::JoinHandle<()>, deadline: tokio::time::Instant) {
    if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
        tracing::warn!("a background task did not stop in time; aborting it");
        task.abort();
        let _ = task.await;
    }
}

/// Writes access stats in the background, merging what arrives within [`ACCESS_EVERY`] of the
/// last write, so recall never waits on them. At shutdown what is pending is written.
async fn record_accesses(
    store: Arc<dyn Store>,
    mut receiver: mpsc::UnboundedReceiver<Access>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut next_write = tokio::time::Instant::now();
    loop {
        let first = tokio::select! {
            item = receiver.recv() => item,
            _ = shutdown.cancelled() => None,
        };
        let Some(first) = first else {
            // Shutting down (or every sender gone): write what was sent and not yet taken.
            let mut rest = Vec::new();
            while let Ok(item) = receiver.try_recv() {
                rest.push(item);
            }
            write_accesses(store.as_ref(), rest).await;
            return;
        };
        let mut batch = vec![first];
        tokio::select! {
            _ = tokio::time::sleep_until(next_write) => {}
            _ = shutdown.cancelled() => {}
        }
        while let Ok(item) = receiver.try_recv() {
            batch.push(item);
        }
        write_accesses(store.as_ref(), batch).await;
        next_write = tokio::time::Instant::now() + ACCESS_EVERY;
    }
}

/// The batch's accesses written per user: each memory counted as often as it was recalled,
/// at the latest time seen; one statement per user and count.
async fn write_accesses(store: &dyn Store, batch: Vec<Access>) {
    let mut pending: HashMap<UserId, (HashMap<MemoryId, u32>, DateTime<Utc>)> = HashMap::new();
    for (user, ids, at) in batch {
        let entry = pending.entry(user).or_insert_with(|| (HashMap::new(), at));
        for id in ids {
            *entry.0.entry(id).or_default() += 1;
        }
        entry.1 = entry.1.max(at);
    }
    for (user, (counts, at)) in pending {
        let mut by_times: std::collections::BTreeMap<u32, Vec<MemoryId>> = Default::default();
        for (id, times) in counts {
            by_times.entry(times).or_default().push(id);
        }
        for (times, mut ids) in by_times {
            ids.sort();
            if let Err(error) = store.user(user).record_access(&ids, times, at).await {
                tracing::warn!(%error, "recording memory access failed");
            }
        }
    }
}

/// Whether a chat turn in `thread` may recall and store memories: not in a temporary chat,
/// and not while the user's memory switch is off.
pub(crate) async fn memory_on(
    store: &dyn crate::store::Store,
    user: crate::store::UserId,
    thread: crate::store::ThreadId,
) -> Result<bool, crate::store::StoreError> {
    let scope = store.user(user);
    Ok(!scope.get_thread(thread).await?.temporary && scope.memory_enabled().await?)
}
