//! The indexer follows the SQL memory log and applies it to both derived indexes.
//!
//! It is idempotent: for every memory named in a batch it indexes the memory's *current* row
//! (or deletes it when the row is gone), so replaying any part of the log converges to SQL.
//! Watermarks: the tantivy commit payload holds the keyword index's applied seq; the vector
//! index's applied seq is a file beside the Qdrant Edge shard (each replica has its own shard),
//! or a row in `index_watermarks` for a shared Qdrant server. A watermark moves only after the
//! index has made the batch durable (tantivy commit; Edge flush).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::keyword::sparse::{SparseAnalyzer, keyword_vectors};
use super::keyword::{
    InformativeWords, KeywordDoc, KeywordFilter, KeywordOp, KeywordSearch, ViewHits,
};
use super::vector::{IndexError, PointKeywords, VectorIndex, VectorPoint, View};
use super::views;
use crate::store::{LogEntry, LogOp, MemoryId, MemoryKind, OwnedMemory, Store, StoreError, UserId};

const BATCH: i64 = 1000;
const POLL: Duration = Duration::from_millis(250);
/// While writes keep coming, the vector index is flushed (and its watermark recorded) at most
/// this often; a crash replays the log from the last recorded seq.
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// After applying what the log held, the follower waits this long before it looks again, so
/// writes that come in a stream are applied (and committed: a tantivy commit starts a segment
/// and fills a 4 MB term table) a few at a time. A write made while the follower is idle is
/// applied as soon as it is woken.
const GATHER: Duration = Duration::from_millis(20);
/// How often filling a new index in the background ([`Indexer::fill_behind`]) logs progress.
const FILL_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long, after a hand-over, the indexer handed over reports what its successor applies
/// ([`Indexer::hand_over`]): longer than anyone waits for a write to become recallable.
const HAND_OVER_FOR: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("vector watermark file: {0}")]
    Watermark(String),
}

/// Where the vector index's applied sequence number is kept.
#[derive(Debug, Clone)]
pub enum VectorWatermark {
    /// A file beside a local (per-replica) shard.
    File(PathBuf),
    /// A row in `index_watermarks`, for a shared Qdrant server.
    Sql(String),
}

/// Applied positions, for `/health` and `/metrics`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct IndexLag {
    pub log_head: i64,
    pub vector_applied: i64,
    pub keyword_applied: i64,
}

impl IndexLag {
    pub(crate) fn vector_lag(&self) -> i64 {
        (self.log_head - self.vector_applied).max(0)
    }

    pub(crate) fn keyword_lag(&self) -> i64 {
        (self.log_head - self.keyword_applied).max(0)
    }
}

pub struct Indexer {
    store: Arc<dyn Store>,
    vector: Arc<dyn VectorIndex>,
    keyword: KeywordSearch,
    watermark: VectorWatermark,
    /// Applied to the vector index (searchable).
    vector_applied: AtomicI64,
    /// Flushed and recorded in the watermark (survives a crash); behind `vector_applied`
    /// while an optimisation runs, since flushing would wait for it.
    vector_durable: AtomicI64,
    /// When the vector index was last flushed while writes kept coming.
    last_persist: parking_lot::Mutex<std::time::Instant>,
    dimension: usize,
    wake: Notify,
    /// The lower of both applied seqs; writers wait on it to know a memory is recallable.
    applied: watch::Sender<i64>,
    /// Points upserted since the last vector optimisation.
    pending_optimize: AtomicU64,
    optimize_after: u64,
    step_lock: tokio::sync::Mutex<()>,
    /// Which users have memories with a context view of their own (turns): recall skips the
    /// context view's searches for the others, where it is the own view again.
    context_users: ContextUsers,
    /// Background optimisations, waited for by [`Indexer::close`].
    tasks: tokio_util::task::TaskTracker,
}

impl Indexer {
    pub async fn new(
        store: Arc<dyn Store>,
        vector: Arc<dyn VectorIndex>,
        keyword: KeywordSearch,
        watermark: VectorWatermark,
        dimension: usize,
        optimize_after: u64,
    ) -> Result<Arc<Self>, IndexerError> {
        if matches!(keyword, KeywordSearch::Beside(_)) && !vector.keeps_keywords() {
            return Err(IndexerError::Index(IndexError::BadInput(format!(
                "keyword search beside the vectors needs an index that keeps keyword vectors, \
                 not {}",
                vector.name()
            ))));
        }
        let vector_applied = read_watermark(store.as_ref(), &watermark).await?;
        let applied = match &keyword {
            KeywordSearch::Local(local) => vector_applied.min(local.applied_seq()),
            KeywordSearch::Beside(_) => vector_applied,
        };
        Ok(Arc::new(Self {
            store,
            vector,
            keyword,
            watermark,
            vector_applied: AtomicI64::new(vector_applied),
            vector_durable: AtomicI64::new(vector_applied),
            last_persist: parking_lot::Mutex::new(std::time::Instant::now()),
            dimension,
            wake: Notify::new(),
            applied: watch::channel(applied).0,
            pending_optimize: AtomicU64::new(0),
            optimize_after,
            step_lock: tokio::sync::Mutex::new(()),
            context_users: ContextUsers::default(),
            tasks: tokio_util::task::TaskTracker::new(),
        }))
    }

    /// Wakes the follower loop (called after every memory write in this process).
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// Where keyword search runs.
    pub fn keyword(&self) -> &KeywordSearch {
        &self.keyword
    }

    /// What the keyword index has applied of the log: the vector index's part when the
    /// keywords are written beside the vectors.
    fn keyword_applied(&self) -> i64 {
        match &self.keyword {
            KeywordSearch::Local(local) => local.applied_seq(),
            KeywordSearch::Beside(_) => self.vector_applied.load(Ordering::Acquire),
        }
    }

    /// One view's keyword search with coverage shared between views
    /// ([`KeywordIndex::search_view_sharing`]), wherever keyword search runs.
    pub(crate) async fn keyword_search_view(
        &self,
        user: UserId,
        query: String,
        view: View,
        filter: KeywordFilter,
        limit: usize,
        informative: Option<InformativeWords>,
    ) -> Result<ViewHits, IndexError> {
        match &self.keyword {
            KeywordSearch::Local(local) => {
                local
                    .search_view_sharing_async(user, query, view, filter, limit, informative)
                    .await
            }
            KeywordSearch::Beside(analyser) => {
                crate::index::keyword::sparse::search_view_sharing(
                    self.vector.as_ref(),
                    analyser,
                    user,
                    &query,
                    view,
                    &filter,
                    limit,
                    informative.as_ref(),
                )
                .await
            }
        }
    }

    pub fn vector(&self) -> &Arc<dyn VectorIndex> {
        &self.vector
    }

    /// Whether the user may have memories whose context view differs from their own view (turns,
    /// with their neighbours). False means the context view's searches would find what the own
    /// view's find: no point in the vector index's context view, the own text in the keyword
    /// index's context field. Asked of SQL once per user; the follower records every turn it
    /// indexes before applying it, so `false` never hides an indexed turn.
    pub(crate) async fn has_context_views(&self, user: UserId) -> Result<bool, IndexerError> {
        if let Some(known) = self.context_users.get(user) {
            return Ok(known);
        }
        let found = self.store.user(user).has_turns().await?;
        Ok(self.context_users.learn(user, found))
    }

    pub async fn lag(&self) -> Result<IndexLag, IndexerError> {
        Ok(IndexLag {
            log_head: self.store.maintenance().memory_log_head().await?,
            vector_applied: self.vector_applied.load(Ordering::Acquire),
            keyword_applied: self.keyword_applied(),
        })
    }

    /// Waits until both indexes have applied the log up to `seq`; false on timeout.
    pub(crate) async fn wait_for(&self, seq: i64, timeout: Duration) -> bool {
        let mut receiver = self.applied.subscribe();
        self.notify();
        tokio::time::timeout(timeout, receiver.wait_for(|applied| *applied >= seq))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// Applies everything in the log now; returns the applied seq.
    pub async fn catch_up(&self) -> Result<i64, IndexerError> {
        while self.step().await? > 0 {}
        Ok(self.applied_seq())
    }

    /// What both indexes have applied of the log.
    pub(crate) fn applied_seq(&self) -> i64 {
        self.vector_applied
            .load(Ordering::Acquire)
            .min(self.keyword_applied())
    }

    /// Applies one batch of the log; returns how many entries it covered.
    pub async fn step(&self) -> Result<usize, IndexerError> {
        let _step = self.step_lock.lock().await;
        let vector_from = self.vector_applied.load(Ordering::Acquire);
        let keyword_from = self.keyword_applied();
        let from = vector_from.min(keyword_from);
        let entries = self
            .store
            .maintenance()
            .memory_log_after(from, BATCH)
            .await?;
        let Some(last) = entries.last().map(|entry| entry.seq) else {
            return Ok(0);
        };
        let ids: Vec<MemoryId> = entries
            .iter()
            .filter_map(|entry| entry.memory)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let rows: HashMap<MemoryId, OwnedMemory> = self
            .store
            .maintenance()
            .owned_memories(&ids)
            .await?
            .into_iter()
            .map(|owned| (owned.memory.id, owned))
            .collect();
        let plan = plan_batch(&entries, &rows);
        self.context_users.note(&plan);
        let neighbours = self.neighbours(&plan).await?;
        if last > vector_from {
            self.apply_vector(&plan, &neighbours).await?;
            // Searchable now; durable (and in the watermark) once a flush has gone through:
            // when the log is quiet (the follower's idle turn), or every `PERSIST_EVERY` while
            // writes keep coming — not after every batch, where the flush and the watermark's
            // write would cost each single-memory write as much as its own indexing.
            self.vector_applied.store(last, Ordering::Release);
            if self.persist_due() {
                self.persist_vector().await?;
            }
        }
        if last > keyword_from
            && let KeywordSearch::Local(local) = &self.keyword
        {
            let ops = keyword_ops(&plan, &neighbours);
            local.apply_async(ops, last).await?;
        }
        let applied = self.applied_seq();
        self.applied.send_replace(applied);
        metrics::gauge!("mnemo_index_applied_seq", "index" => "vector")
            .set(self.vector_applied.load(Ordering::Acquire) as f64);
        metrics::gauge!("mnemo_index_applied_seq", "index" => "keyword")
            .set(self.keyword_applied() as f64);
        Ok(entries.len())
    }

    /// The current rows of the turns next to every upserted turn (their views include them).
    async fn neighbours(&self, plan: &[Segment<'_>]) -> Result<Neighbours, IndexerError> {
        let turns: Vec<MemoryId> = plan
            .iter()
            .flat_map(|segment| &segment.upserts)
            .filter(|owned| owned.memory.kind == MemoryKind::Turn)
            .map(|owned| owned.memory.id)
            .collect();
        let mut neighbours = Neighbours::default();
        if turns.is_empty() {
            return Ok(neighbours);
        }
        let maintenance = self.store.maintenance();
        let pairs = maintenance.turn_neighbours(&turns).await?;
        neighbours.contexts = maintenance
            .context_embeddings(&turns)
            .await?
            .into_iter()
            .map(|(id, embedded)| (id, embedded.vector))
            .collect();
        let wanted: Vec<MemoryId> = pairs
            .iter()
            .flat_map(|(_, previous, next)| previous.iter().chain(next))
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let rows: HashMap<MemoryId, crate::store::Memory> = maintenance
            .owned_memories(&wanted)
            .await?
            .into_iter()
            .map(|owned| (owned.memory.id, owned.memory))
            .collect();
        for (id, previous, next) in pairs {
            let row = |id: Option<MemoryId>| id.and_then(|id| rows.get(&id).cloned());
            neighbours.around.insert(id, (row(previous), row(next)));
        }
        Ok(neighbours)
    }

    async fn apply_vector(
        &self,
        plan: &[Segment<'_>],
        neighbours: &Neighbours,
    ) -> Result<(), IndexerError> {
        for segment in plan {
            let points: Vec<VectorPoint> = segment
                .upserts
                .iter()
                .filter(|owned| owned.memory.embedding.len() == self.dimension)
                .map(|owned| {
                    let mut point = vector_point(owned, neighbours);
                    if let KeywordSearch::Beside(analyser) = &self.keyword {
                        point.keywords = Some(point_keywords(analyser, owned, neighbours));
                    }
                    point
                })
                .collect();
            // A memory whose vector has another dimension awaits re-embedding: keep it out.
            let mut deletes = segment.deletes.clone();
            deletes.extend(
                segment
                    .upserts
                    .iter()
                    .filter(|owned| owned.memory.embedding.len() != self.dimension)
                    .map(|owned| owned.memory.id),
            );
            if !deletes.is_empty() {
                self.vector.delete(&deletes).await?;
            }
            if !points.is_empty() {
                self.pending_optimize
                    .fetch_add(points.len() as u64, Ordering::Relaxed);
                self.vector.upsert(points).await?;
            }
            if let Some(user) = segment.delete_user {
                self.vector.delete_user(user).await?;
            }
        }
        Ok(())
    }

    /// Whether `PERSIST_EVERY` has passed since the last flush.
    fn persist_due(&self) -> bool {
        self.last_persist.lock().elapsed() >= PERSIST_EVERY
    }

    /// Ends the indexer's part of a shutdown, after its follower has stopped: waits for a
    /// running optimisation, makes the vector index durable with its watermark recorded, and
    /// closes it (no write after this). The keyword index commits every batch it applies.
    pub(crate) async fn close(&self) -> Result<(), IndexerError> {
        self.tasks.close();
        self.tasks.wait().await;
        self.persist_vector_waiting().await?;
        self.vector.close().await?;
        Ok(())
    }

    /// `persist_vector`, waiting for a running optimisation if need be (at shutdown).
    async fn persist_vector_waiting(&self) -> Result<(), IndexerError> {
        let _step = self.step_lock.lock().await;
        let applied = self.vector_applied.load(Ordering::Acquire);
        self.vector.flush().await?;
        if self.vector_durable.load(Ordering::Acquire) < applied {
            write_watermark(self.store.as_ref(), &self.watermark, applied).await?;
            self.vector_durable.store(applied, Ordering::Release);
        }
        Ok(())
    }

    /// Flushes the vector index and records what it holds in the watermark — unless an
    /// optimisation is running: a flush would wait for it (minutes on a large index) and stall
    /// every write behind it, so the watermark waits instead and the follower retries when the
    /// log is quiet. A crash meanwhile replays the log from the last recorded seq. The caller
    /// holds `step_lock`.
    async fn persist_vector(&self) -> Result<(), IndexerError> {
        let applied = self.vector_applied.load(Ordering::Acquire);
        if self.vector_durable.load(Ordering::Acquire) >= applied {
            return Ok(());
        }
        if self.vector.flush_if_idle().await? {
            write_watermark(self.store.as_ref(), &self.watermark, applied).await?;
            self.vector_durable.store(applied, Ordering::Release);
            *self.last_persist.lock() = std::time::Instant::now();
        }
        Ok(())
    }

    /// Follows the log until `shutdown`: applies batches as soon as it is woken, polls for
    /// writes made by other replicas, and optimises the vector index when enough has changed
    /// and the log is quiet.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let indexer = self.clone();
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                match indexer.step().await {
                    Ok(0) => {
                        failures = 0;
                        // Quiet: flush what was applied, once `PERSIST_EVERY` has passed since
                        // the last flush (a client writing one memory at a time keeps the log
                        // quiet between its writes; a flush after each would cost each write).
                        let persisted = if indexer.persist_due() {
                            let _step = indexer.step_lock.lock().await;
                            indexer.persist_vector().await
                        } else {
                            Ok(())
                        };
                        if let Err(error) = persisted {
                            tracing::warn!(%error, "flushing the vector index failed; retrying");
                        }
                        indexer.maybe_optimize().await;
                    }
                    Ok(applied) => {
                        failures = 0;
                        if applied < BATCH as usize {
                            // Caught up. While writes keep coming, let the next few gather
                            // instead of committing each alone: a write that arrives now waits
                            // `GATHER` at most, and the indexes commit ≤ 1/`GATHER` times a
                            // second instead of once per write.
                            tokio::select! {
                                _ = tokio::time::sleep(GATHER) => {}
                                _ = shutdown.cancelled() => {}
                            }
                        }
                        // Stopped (a shutdown, or another indexer took over) while writes keep
                        // coming: what is left is applied by the next start or the successor.
                        if shutdown.is_cancelled() {
                            if let Err(error) = indexer.persist_vector_waiting().await {
                                tracing::warn!(%error, "flushing the vector index at shutdown failed");
                            }
                            return;
                        }
                        continue;
                    }
                    Err(error) => {
                        failures = failures.saturating_add(1);
                        tracing::warn!(%error, failures, "indexer step failed; retrying");
                    }
                }
                let backoff = POLL * failures.clamp(1, 20);
                tokio::select! {
                    _ = indexer.wake.notified() => {}
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.cancelled() => {
                        if let Err(error) = indexer.persist_vector_waiting().await {
                            tracing::warn!(%error, "flushing the vector index at shutdown failed");
                        }
                        return;
                    }
                }
            }
        })
    }

    /// Fills this indexer, which does not serve yet, from the memory log in the background
    /// until it has applied everything `serving` has, logging progress every
    /// [`FILL_PROGRESS_EVERY`]. Returns false when `shutdown` came first: what it applied is
    /// recorded in its watermark, and the next start goes on from there.
    pub(crate) async fn fill_behind(
        &self,
        serving: &Indexer,
        shutdown: &CancellationToken,
    ) -> Result<bool, IndexerError> {
        let started = std::time::Instant::now();
        let from = self.applied_seq();
        let mut logged = std::time::Instant::now();
        let mut failures = 0u32;
        loop {
            if shutdown.is_cancelled() {
                self.persist_vector_waiting().await?;
                return Ok(false);
            }
            let pause = match self.step().await {
                Ok(0) if self.applied_seq() >= serving.applied_seq() => {
                    tracing::info!(
                        applied = self.applied_seq(),
                        elapsed = ?started.elapsed(),
                        "the new index has caught up with the memory log"
                    );
                    return Ok(true);
                }
                Ok(applied) => {
                    failures = 0;
                    if self.persist_due() {
                        let _step = self.step_lock.lock().await;
                        self.persist_vector().await?;
                    }
                    if applied == 0 { POLL } else { Duration::ZERO }
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(%error, failures, "filling the new index failed; retrying");
                    POLL * failures.clamp(1, 20)
                }
            };
            if logged.elapsed() >= FILL_PROGRESS_EVERY {
                logged = std::time::Instant::now();
                let head = self
                    .store
                    .maintenance()
                    .memory_log_head()
                    .await
                    .unwrap_or(0);
                let applied = self.applied_seq();
                tracing::info!(
                    applied,
                    head,
                    percent =
                        ((applied - from) as f64 * 100.0 / (head - from).max(1) as f64).round(),
                    "filling the new index from the memory log"
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }

    /// Holds this indexer still: no batch is applied while the guard lives (for a hand-over,
    /// so that its successor is known to hold at least what it holds).
    pub(crate) async fn hold(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.step_lock.lock().await
    }

    /// After this indexer was replaced by `next`: whoever waits on it for a write to become
    /// recallable (a write begun before the hand-over) is told what `next` applies, for
    /// [`HAND_OVER_FOR`] or until `shutdown`.
    pub(crate) async fn hand_over(&self, next: &Indexer, shutdown: &CancellationToken) {
        let mut applied = next.applied.subscribe();
        let deadline = tokio::time::Instant::now() + HAND_OVER_FOR;
        loop {
            let seq = *applied.borrow_and_update();
            self.applied.send_if_modified(|current| {
                let newer = seq > *current;
                if newer {
                    *current = seq;
                }
                newer
            });
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = shutdown.cancelled() => return,
            }
        }
    }

    async fn maybe_optimize(&self) {
        if self.pending_optimize.load(Ordering::Relaxed) < self.optimize_after {
            return;
        }
        self.pending_optimize.store(0, Ordering::Relaxed);
        let vector = self.vector.clone();
        // Off the request path and off the follower loop: searches keep working meanwhile.
        self.tasks.spawn(async move {
            let started = std::time::Instant::now();
            match vector.optimize().await {
                Ok(()) => tracing::info!(elapsed = ?started.elapsed(), "vector index optimised"),
                Err(error) => tracing::warn!(%error, "vector index optimisation failed"),
            }
        });
    }

    /// Rebuilds both indexes from SQL without re-embedding. `progress(done, total)` is called
    /// after every page. The watermarks end at the log head read before the scan, so anything
    /// written during the rebuild is applied afterwards by the follower.
    pub async fn rebuild(&self, progress: impl Fn(u64, u64)) -> Result<u64, IndexerError> {
        let _step = self.step_lock.lock().await;
        let head = self.store.maintenance().memory_log_head().await?;
        let total = self.store.maintenance().count_memories().await?.max(0) as u64;
        if let KeywordSearch::Local(local) = &self.keyword {
            local.clear_async().await?;
        }
        self.vector.clear().await?;
        let mut done = 0u64;
        let mut cursor = None;
        loop {
            let page = self.store.maintenance().scan_memories(cursor, 2000).await?;
            let Some(last) = page.last() else { break };
            cursor = Some(last.memory.id);
            let segment = Segment {
                upserts: page.iter().collect(),
                deletes: Vec::new(),
                delete_user: None,
            };
            let plan = std::slice::from_ref(&segment);
            self.context_users.note(plan);
            let neighbours = self.neighbours(plan).await?;
            self.apply_vector(plan, &neighbours).await?;
            if let KeywordSearch::Local(local) = &self.keyword {
                local.apply_async(keyword_ops(plan, &neighbours), 0).await?;
            }
            done += page.len() as u64;
            progress(done, total);
        }
        if let KeywordSearch::Local(local) = &self.keyword {
            local.apply_async(Vec::new(), head).await?;
        }
        self.vector.flush().await?;
        write_watermark(self.store.as_ref(), &self.watermark, head).await?;
        self.vector_applied.store(head, Ordering::Release);
        self.vector_durable.store(head, Ordering::Release);
        self.applied.send_replace(self.applied_seq());
        Ok(done)
    }
}

/// How the indexes compare with SQL ([`Indexer::verify`]): per index, the memories SQL has that
/// the index lacks and the points the index has that SQL does not.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Consistency {
    pub memories: u64,
    pub users: u64,
    pub vector_missing: u64,
    pub vector_extra: u64,
    pub keyword_missing: u64,
    pub keyword_extra: u64,
}

impl Consistency {
    pub fn is_consistent(&self) -> bool {
        self.vector_missing == 0
            && self.vector_extra == 0
            && self.keyword_missing == 0
            && self.keyword_extra == 0
    }
}

impl Indexer {
    /// Applies the log, then compares every user's memory ids in SQL with the ids each index
    /// holds for them. Read-only; takes as long as reading every id once.
    pub async fn verify(&self) -> Result<Consistency, IndexerError> {
        self.catch_up().await?;
        let mut by_user: HashMap<UserId, HashSet<MemoryId>> = HashMap::new();
        let mut cursor = None;
        loop {
            let page = self.store.maintenance().scan_memories(cursor, 5000).await?;
            let Some(last) = page.last() else { break };
            cursor = Some(last.memory.id);
            for owned in &page {
                by_user
                    .entry(owned.user)
                    .or_default()
                    .insert(owned.memory.id);
            }
        }
        for user in self.store.accounts().list_users().await? {
            by_user.entry(user.id).or_default();
        }
        let mut report = Consistency {
            users: by_user.len() as u64,
            ..Consistency::default()
        };
        for (user, sql) in &by_user {
            report.memories += sql.len() as u64;
            let vector: HashSet<MemoryId> = self.vector.ids(*user).await?.into_iter().collect();
            // Keywords kept beside the vectors are in the same points.
            let keyword: HashSet<MemoryId> = match &self.keyword {
                KeywordSearch::Local(local) => local.ids_async(*user).await?.into_iter().collect(),
                KeywordSearch::Beside(_) => vector.clone(),
            };
            report.vector_missing += sql.difference(&vector).count() as u64;
            report.vector_extra += vector.difference(sql).count() as u64;
            report.keyword_missing += sql.difference(&keyword).count() as u64;
            report.keyword_extra += keyword.difference(sql).count() as u64;
        }
        Ok(report)
    }
}

/// Part of a batch between two `DeleteUser` entries, reduced to final states.
struct Segment<'a> {
    upserts: Vec<&'a OwnedMemory>,
    deletes: Vec<MemoryId>,
    delete_user: Option<UserId>,
}

/// Splits the batch at `DeleteUser` entries; within a segment every named memory becomes an
/// upsert of its current row, or a delete when the row is gone.
fn plan_batch<'a>(
    entries: &[LogEntry],
    rows: &'a HashMap<MemoryId, OwnedMemory>,
) -> Vec<Segment<'a>> {
    let mut segments = Vec::new();
    let mut seen = HashSet::new();
    let mut current = Segment {
        upserts: Vec::new(),
        deletes: Vec::new(),
        delete_user: None,
    };
    for entry in entries {
        match (entry.op, entry.memory) {
            (LogOp::DeleteUser, _) => {
                current.delete_user = Some(entry.user);
                segments.push(std::mem::replace(
                    &mut current,
                    Segment {
                        upserts: Vec::new(),
                        deletes: Vec::new(),
                        delete_user: None,
                    },
                ));
                seen.clear();
            }
            (_, Some(id)) => {
                if !seen.insert(id) {
                    continue;
                }
                match rows.get(&id) {
                    Some(owned) => current.upserts.push(owned),
                    None => current.deletes.push(id),
                }
            }
            (_, None) => {}
        }
    }
    segments.push(current);
    segments
}

/// Per user, whether they have turn memories: learnt from SQL on first asking, set by every turn
/// the indexer applies, forgotten when the user's memories are all deleted.
#[derive(Default)]
struct ContextUsers(parking_lot::RwLock<HashMap<UserId, bool>>);

impl ContextUsers {
    fn get(&self, user: UserId) -> Option<bool> {
        self.0.read().get(&user).copied()
    }

    /// Records what SQL said unless the follower has recorded a turn meanwhile; returns what is
    /// known now.
    fn learn(&self, user: UserId, has_turns: bool) -> bool {
        *self.0.write().entry(user).or_insert(has_turns)
    }

    /// Before a batch is applied: its turns' users have context views.
    fn note(&self, plan: &[Segment<'_>]) {
        let mut known = self.0.write();
        for segment in plan {
            for owned in &segment.upserts {
                if owned.memory.kind == MemoryKind::Turn {
                    known.insert(owned.user, true);
                }
            }
            if let Some(user) = segment.delete_user {
                known.remove(&user);
            }
        }
    }
}

/// The turns around each upserted turn of a batch: (previous, next).
#[derive(Default)]
struct Neighbours {
    around: HashMap<MemoryId, (Option<crate::store::Memory>, Option<crate::store::Memory>)>,
    /// The stored context vectors (the embedded context text).
    contexts: HashMap<MemoryId, Vec<f32>>,
}

impl Neighbours {
    fn of(&self, id: MemoryId) -> (Option<&crate::store::Memory>, Option<&crate::store::Memory>) {
        match self.around.get(&id) {
            Some((previous, next)) => (previous.as_ref(), next.as_ref()),
            None => (None, None),
        }
    }
}

fn vector_point(owned: &OwnedMemory, neighbours: &Neighbours) -> VectorPoint {
    let memory = &owned.memory;
    let (previous, next) = neighbours.of(memory.id);
    VectorPoint {
        id: memory.id,
        user_id: owned.user,
        vector: memory.embedding.clone(),
        // A turn's embedded context text when it is stored (and of this model's dimension);
        // until then the mean of the neighbours' vectors stands in. Other memories have none.
        context: (memory.kind == MemoryKind::Turn).then(|| {
            neighbours
                .contexts
                .get(&memory.id)
                .filter(|vector| vector.len() == memory.embedding.len())
                .cloned()
                .unwrap_or_else(|| views::context_vector(previous, memory, next))
        }),
        kind: memory.kind.as_str().to_string(),
        importance: memory.importance,
        created_at_ms: memory.created_at.timestamp_millis(),
        archived: memory.archived_at.is_some(),
        valid: memory.invalid_at.is_none(),
        keywords: None,
    }
}

/// Both views' keyword vectors of a memory: the texts the keyword index would index.
fn point_keywords(
    analyser: &SparseAnalyzer,
    owned: &OwnedMemory,
    neighbours: &Neighbours,
) -> PointKeywords {
    let memory = &owned.memory;
    let (previous, next) = neighbours.of(memory.id);
    keyword_vectors(
        analyser,
        &views::own_text(memory),
        &views::context_text(previous, memory, next),
    )
}

fn keyword_ops(plan: &[Segment<'_>], neighbours: &Neighbours) -> Vec<KeywordOp> {
    let mut ops = Vec::new();
    for segment in plan {
        ops.extend(segment.deletes.iter().map(|id| KeywordOp::Delete(*id)));
        ops.extend(segment.upserts.iter().map(|owned| {
            let memory = &owned.memory;
            let (previous, next) = neighbours.of(memory.id);
            KeywordOp::Upsert(KeywordDoc {
                id: memory.id,
                user_id: owned.user,
                content: views::own_text(memory),
                context: views::context_text(previous, memory, next),
                kind: memory.kind.as_str().to_string(),
                created_at_ms: memory.created_at.timestamp_millis(),
                archived: memory.archived_at.is_some(),
                valid: memory.invalid_at.is_none(),
            })
        }));
        if let Some(user) = segment.delete_user {
            ops.push(KeywordOp::DeleteUser(user));
        }
    }
    ops
}

async fn read_watermark(
    store: &dyn Store,
    watermark: &VectorWatermark,
) -> Result<i64, IndexerError> {
    match watermark {
        VectorWatermark::Sql(name) => Ok(store.maintenance().watermark(name).await?),
        VectorWatermark::File(path) => match tokio::fs::read_to_string(path).await {
            Ok(text) => text.trim().parse().map_err(|_| {
                IndexerError::Watermark(format!("{} is not a number", path.display()))
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(IndexerError::Watermark(format!(
                "{}: {error}",
                path.display()
            ))),
        },
    }
}

async fn write_watermark(
    store: &dyn Store,
    watermark: &VectorWatermark,
    seq: i64,
) -> Result<(), IndexerError> {
    match watermark {
        VectorWatermark::Sql(name) => Ok(store.maintenance().set_watermark(name, seq).await?),
        VectorWatermark::File(path) => {
            let temporary = path.with_extension("tmp");
            let failed = |error: std::io::Error| {
                IndexerError::Watermark(format!("{}: {error}", path.display()))
            };
            tokio::fs::write(&temporary, seq.to_string())
                .await
                .map_err(failed)?;
            let file = tokio::fs::File::open(&temporary).await.map_err(failed)?;
            file.sync_all().await.map_err(failed)?;
            tokio::fs::rename(&temporary, path).await.map_err(failed)?;
            Ok(())
        }
    }
}

impl crate::error::HasKind for IndexerError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            IndexerError::Store(error) => error.kind(),
            IndexerError::Index(error) => error.kind(),
            IndexerError::Watermark(_) => crate::error::ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::index::edge::EdgeVectorIndex;
    use crate::index::vector::{VectorFilter, VectorPoint, View};
    use crate::store::{Embedded, MemoryKind, NewMemory, UserKind};

    /// The Edge index, except that `flush_if_idle` declines while `optimizing` is set — what
    /// the real one does while an HNSW build runs.
    struct Optimizing {
        inner: Arc<dyn VectorIndex>,
        optimizing: AtomicBool,
    }

    #[async_trait::async_trait]
    impl VectorIndex for Optimizing {
        fn name(&self) -> &'static str {
            "optimizing"
        }
        async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), IndexError> {
            self.inner.upsert(points).await
        }
        async fn delete(&self, ids: &[MemoryId]) -> Result<(), IndexError> {
            self.inner.delete(ids).await
        }
        async fn delete_user(&self, user: UserId) -> Result<(), IndexError> {
            self.inner.delete_user(user).await
        }
        async fn search_view(
            &self,
            user: UserId,
            view: View,
            vector: &[f32],
            filter: &VectorFilter,
            limit: usize,
        ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
            self.inner
                .search_view(user, view, vector, filter, limit)
                .await
        }
        fn set_search_ef(&self, ef: Option<usize>) {
            self.inner.set_search_ef(ef);
        }
        async fn count(&self, user: UserId) -> Result<u64, IndexError> {
            self.inner.count(user).await
        }
        async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
            self.inner.ids(user).await
        }
        async fn clear(&self) -> Result<(), IndexError> {
            self.inner.clear().await
        }
        async fn optimize(&self) -> Result<(), IndexError> {
            self.inner.optimize().await
        }
        async fn flush(&self) -> Result<(), IndexError> {
            self.inner.flush().await
        }
        async fn flush_if_idle(&self) -> Result<bool, IndexError> {
            if self.optimizing.load(Ordering::SeqCst) {
                return Ok(false);
            }
            self.inner.flush().await.map(|()| true)
        }
    }

    #[tokio::test]
    async fn writes_stay_recallable_while_an_optimisation_holds_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::connect(
            &crate::testing::sqlite_url(dir.path()),
            4,
            std::time::Duration::from_secs(10),
        )
        .await
        .unwrap();
        let user = store
            .accounts()
            .create_user("u", UserKind::Key)
            .await
            .unwrap();
        let vector = Arc::new(Optimizing {
            inner: Arc::new(
                EdgeVectorIndex::open(&dir.path().join("vectors"), 4)
                    .await
                    .unwrap(),
            ),
            optimizing: AtomicBool::new(true),
        });
        let watermark_file = dir.path().join("applied.seq");
        let indexer = Indexer::new(
            store.clone(),
            vector.clone(),
            KeywordSearch::Local(crate::index::keyword::KeywordIndex::open(None).unwrap()),
            VectorWatermark::File(watermark_file.clone()),
            4,
            u64::MAX,
        )
        .await
        .unwrap();
        let add = |text: &str, direction: f32| {
            let store = store.clone();
            let text = text.to_string();
            async move {
                let memory = NewMemory::from_user(MemoryKind::Fact, text, 3);
                let embedded = Embedded {
                    vector: vec![direction, 1.0, 0.0, 0.0],
                    model: "test".into(),
                };
                store
                    .user(user.id)
                    .insert_memories(vec![(memory, embedded)])
                    .await
                    .unwrap()
            }
        };
        add("the heron nests by the lake", 1.0).await;
        indexer.catch_up().await.unwrap();
        // The write is searchable and counted as applied, though nothing could be flushed.
        let lag = indexer.lag().await.unwrap();
        assert_eq!(lag.vector_lag(), 0);
        assert_eq!(vector.count(user.id).await.unwrap(), 1);
        assert!(
            !watermark_file.exists(),
            "the watermark waits for a flush that went through"
        );
        // Once the optimisation is over, the quiet loop's persist records it.
        vector.optimizing.store(false, Ordering::SeqCst);
        {
            let _step = indexer.step_lock.lock().await;
            indexer.persist_vector().await.unwrap();
        }
        let head = store.maintenance().memory_log_head().await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&watermark_file).unwrap().trim(),
            head.to_string()
        );
        // A later write during another optimisation: applied, not yet durable; a waiting
        // persist (shutdown) flushes and records it.
        vector.optimizing.store(true, Ordering::SeqCst);
        add("the heron left in October", 0.5).await;
        indexer.catch_up().await.unwrap();
        assert_eq!(indexer.lag().await.unwrap().vector_lag(), 0);
        assert_eq!(
            std::fs::read_to_string(&watermark_file).unwrap().trim(),
            head.to_string()
        );
        indexer.persist_vector_waiting().await.unwrap();
        let head = store.maintenance().memory_log_head().await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&watermark_file).unwrap().trim(),
            head.to_string()
        );
    }

    /// Recall asks SQL whether a user has turns while the follower may be indexing their first
    /// one: what the follower recorded meanwhile wins over SQL's older answer.
    #[test]
    fn an_indexed_turn_outlives_an_older_answer_from_sql() {
        let users = ContextUsers::default();
        let (quiet, chatty) = (UserId::for_tests(), UserId::for_tests());
        assert!(!users.learn(quiet, false));
        assert_eq!(users.get(quiet), Some(false));
        // The follower records `chatty`'s first turn between SQL's answer and its recording.
        users.0.write().insert(chatty, true);
        assert!(users.learn(chatty, false));
        assert_eq!(users.get(chatty), Some(true));
    }
}
