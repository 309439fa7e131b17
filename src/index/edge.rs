//! In-process [`VectorIndex`] backed by Qdrant Edge (`qdrant-edge` 0.7.2):
//! one on-disk shard holding every user's points, cosine distance, a tenant
//! keyword index on `user_id` plus plain payload indexes for the filters.
//!
//! The engine is synchronous; every call runs on tokio's blocking pool.
//! Locking rules (the engine panics instead of waiting in `EdgeShard::flush`,
//! which `try_lock`s its WAL and segment holder):
//! * updates hold `write_gate` (they lock the WAL);
//! * `optimize` holds `optimize_gate` (it write-locks the segment holder
//!   while swapping segments);
//! * `flush` holds both, so it waits for a running optimisation instead of
//!   racing it (`flush_if_idle` declines instead of waiting). Searches, counts and
//!   scrolls take no gate at all.
//!
//! Durability: Edge 0.7.2 writes a WAL but never replays it on load, so only
//! flushed data survives a crash. Call [`VectorIndex::flush`] after batches
//! (dropping the index also flushes).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use qdrant_edge::external::ordered_float::OrderedFloat;
use qdrant_edge::external::serde_json::json;
use qdrant_edge::{
    BoolIndexParams, Condition, CountRequest, CreateIndex, DEFAULT_VECTOR_NAME, Distance,
    EdgeConfig, EdgeOptimizersConfig, EdgeShard, EdgeVectorParams, FieldCondition,
    FieldIndexOperations, Filter, IntegerIndexParams, JsonPath, KeywordIndexParams, Match,
    NamedQuery, OperationError, PayloadFieldSchema, PayloadSchemaParams, PointId,
    PointInsertOperations, PointOperations, PointStruct, QueryEnum, Range, ScrollRequest,
    SearchParams, SearchRequest, UpdateOperation, ValueVariants, VectorInternal,
    WithPayloadInterface, WithVector,
};

use crate::index::vector::{
    IndexError, MAX_SEARCH_LIMIT, VectorFilter, VectorIndex, VectorLayout, VectorPoint,
    check_vector, fields,
};
use crate::store::{MemoryId, UserId};

/// Page size used when scrolling all ids of a user.
const SCROLL_PAGE: usize = 1024;

/// Segments the optimizer merges towards. Edge searches its segments one after another on
/// the calling thread, so every extra segment is another whole HNSW search per query.
const TARGET_SEGMENTS: usize = 1;

/// Largest segment the optimizer builds, in KiB of vector data (~2.6M 384-d vectors). The
/// engine's default (256 MiB per indexing thread, ~170k such vectors on this 2-core machine)
/// split 1M points into about six graphs. Merges into a big segment reuse its graph
/// (incremental HNSW), so a large cap does not mean rebuilding it for each small batch.
const MAX_SEGMENT_KB: usize = 4 * 1024 * 1024;

/// Qdrant Edge shard stored in a local directory.
#[derive(Clone)]
pub struct EdgeVectorIndex {
    inner: Arc<Inner>,
}

struct Inner {
    /// Dropped by hand (see `Drop for Inner`): the engine flushes in its destructor and panics
    /// when that fails.
    shard: std::mem::ManuallyDrop<EdgeShard>,
    dimension: usize,
    path: PathBuf,
    write_gate: Mutex<()>,
    optimize_gate: Mutex<()>,
    /// HNSW beam width for searches; 0 is the engine's default.
    search_ef: AtomicUsize,
}

impl std::fmt::Debug for EdgeVectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeVectorIndex")
            .field("path", &self.inner.path)
            .field("dimension", &self.inner.dimension)
            .finish()
    }
}

/// The gates guard `()`, so a poisoned gate carries no broken state.
fn gate(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn engine_err(context: &str, err: OperationError) -> IndexError {
    match err {
        OperationError::WrongVectorDimension { .. }
        | OperationError::ValidationError { .. }
        | OperationError::WrongSparse
        | OperationError::WrongMulti
        | OperationError::NonFiniteNumber { .. } => {
            IndexError::BadInput(format!("{context}: {err}"))
        }
        OperationError::OutOfMemory { .. }
        | OperationError::Cancelled { .. }
        | OperationError::Timeout { .. } => IndexError::Unavailable(format!("{context}: {err}")),
        other => IndexError::Internal(format!("{context}: {other}")),
    }
}

fn key(name: &str) -> Result<JsonPath, IndexError> {
    JsonPath::try_from(name)
        .map_err(|()| IndexError::Internal(format!("invalid payload key {name:?}")))
}

fn field_match(name: &str, m: Match) -> Result<Condition, IndexError> {
    Ok(Condition::Field(FieldCondition::new_match(key(name)?, m)))
}

/// Mandatory `user_id` condition plus the optional restrictions of `filter`.
fn build_filter(user: UserId, filter: Option<&VectorFilter>) -> Result<Filter, IndexError> {
    let mut must = vec![field_match(
        fields::USER_ID,
        Match::new_value(ValueVariants::String(user.as_uuid().to_string())),
    )?];
    if let Some(f) = filter {
        // Kinds stay a positive match here: `must_not` on kind made the filtered HNSW search
        // of a 100k-memory user slower at 1M points (`mnemo bench recall`).
        if let Some(kinds) = &f.kinds {
            must.push(field_match(fields::KIND, Match::from(kinds.clone()))?);
        }
        if f.since_ms.is_some() || f.until_ms.is_some() {
            let range = Range {
                gte: f.since_ms.map(|ms| OrderedFloat(ms as f64)),
                lt: f.until_ms.map(|ms| OrderedFloat(ms as f64)),
                gt: None,
                lte: None,
            };
            must.push(Condition::Field(FieldCondition::new_range(
                key(fields::CREATED_AT_MS)?,
                range,
            )));
        }
        if !f.include_archived {
            must.push(field_match(fields::ARCHIVED, Match::from(false))?);
        }
        if !f.include_invalid {
            must.push(field_match(fields::VALID, Match::from(true))?);
        }
    }
    Ok(Filter {
        should: None,
        min_should: None,
        must: Some(must),
        must_not: None,
    })
}

fn memory_id(id: PointId) -> Result<MemoryId, IndexError> {
    match id {
        PointId::Uuid(uuid) => Ok(MemoryId::from_uuid(uuid)),
        PointId::NumId(n) => Err(IndexError::Internal(format!(
            "foreign numeric point id {n} in edge shard"
        ))),
    }
}

/// Few, large segments (see [`TARGET_SEGMENTS`]); the rest are the engine's defaults.
fn optimizers_config() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(TARGET_SEGMENTS),
        max_segment_size: Some(MAX_SEGMENT_KB),
        ..EdgeOptimizersConfig::default()
    }
}

/// Payload indexes the shard must have: (field, schema).
fn required_indexes() -> Vec<(&'static str, PayloadFieldSchema)> {
    vec![
        (
            fields::USER_ID,
            PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                is_tenant: Some(true),
                ..KeywordIndexParams::default()
            })),
        ),
        (
            fields::KIND,
            PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                enable_hnsw: Some(false),
                ..KeywordIndexParams::default()
            })),
        ),
        (
            fields::CREATED_AT_MS,
            PayloadFieldSchema::FieldParams(PayloadSchemaParams::Integer(IntegerIndexParams {
                lookup: Some(false),
                range: Some(true),
                enable_hnsw: Some(false),
                ..IntegerIndexParams::default()
            })),
        ),
        (
            fields::ARCHIVED,
            PayloadFieldSchema::FieldParams(PayloadSchemaParams::Bool(BoolIndexParams {
                enable_hnsw: Some(false),
                ..BoolIndexParams::default()
            })),
        ),
        (
            fields::VALID,
            PayloadFieldSchema::FieldParams(PayloadSchemaParams::Bool(BoolIndexParams {
                enable_hnsw: Some(false),
                ..BoolIndexParams::default()
            })),
        ),
    ]
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _optimize = gate(&self.optimize_gate);
        let _write = gate(&self.write_gate);
        // A failing final flush (e.g. the directory was removed) must not panic in a destructor.
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: `shard` is never used again after this point.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.shard) }
        }));
        if dropped.is_err() {
            tracing::error!(path = %self.path.display(), "the vector shard's final flush failed");
        }
    }
}

impl Inner {
    fn update(&self, op: UpdateOperation, context: &str) -> Result<(), IndexError> {
        let _gate = gate(&self.write_gate);
        self.shard.update(op).map_err(|e| engine_err(context, e))
    }

    fn ensure_indexes(&self) -> Result<(), IndexError> {
        let existing = self.shard.info().payload_schema;
        for (name, schema) in required_indexes() {
            let path = key(name)?;
            if existing.contains_key(&path) {
                continue;
            }
            self.update(
                UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(
                    CreateIndex {
                        field_name: path,
                        field_schema: Some(schema),
                    },
                )),
                "create payload index",
            )?;
        }
        Ok(())
    }
}

impl EdgeVectorIndex {
    /// Opens (or creates) the shard in `dir` for vectors of `dimension`.
    ///
    /// Fails with [`IndexError::BadInput`] if the directory already holds a
    /// shard of another dimension or distance.
    pub async fn open(dir: &Path, dimension: usize) -> Result<Self, IndexError> {
        if dimension == 0 {
            return Err(IndexError::BadInput("vector dimension must be > 0".into()));
        }
        let path = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(path, dimension))
            .await
            .map_err(IndexError::from_join)?
    }

    fn open_blocking(path: PathBuf, dimension: usize) -> Result<Self, IndexError> {
        std::fs::create_dir_all(&path).map_err(|e| {
            IndexError::Unavailable(format!("create edge dir {}: {e}", path.display()))
        })?;
        if let Some(existing) = EdgeConfig::load(&path) {
            let existing = existing.map_err(|e| engine_err("read edge config", e))?;
            match existing.vectors.get(DEFAULT_VECTOR_NAME) {
                Some(params) if params.size == dimension && params.distance == Distance::Cosine => {
                }
                Some(params) => {
                    return Err(IndexError::BadInput(format!(
                        "edge shard at {} has dimension {} / {:?}, requested {dimension} / Cosine",
                        path.display(),
                        params.size,
                        params.distance
                    )));
                }
                None => {
                    return Err(IndexError::BadInput(format!(
                        "edge shard at {} has no default dense vector",
                        path.display()
                    )));
                }
            }
        }
        let config = EdgeConfig::builder()
            .vector(
                DEFAULT_VECTOR_NAME,
                EdgeVectorParams::builder(dimension, Distance::Cosine).build(),
            )
            // The default graph (m = 16) over all points; the big tenants also get their own
            // links (the `user_id` index is a tenant index). Graphs per tenant only
            // (m = 0, payload_m = 16, as on the server collection) built faster here but
            // searched a 100k-memory user slower: 2.9-3.4 ms against 2.3-2.5 ms at 200k
            // points (`mnemo bench recall`).
            .optimizers(optimizers_config())
            .build();
        let shard = EdgeShard::load(&path, Some(config)).map_err(|e| match e {
            OperationError::ServiceError { .. } => {
                IndexError::Unavailable(format!("open edge shard at {}: {e}", path.display()))
            }
            other => engine_err("open edge shard", other),
        })?;
        let inner = Inner {
            shard: std::mem::ManuallyDrop::new(shard),
            dimension,
            path,
            write_gate: Mutex::new(()),
            optimize_gate: Mutex::new(()),
            search_ef: AtomicUsize::new(0),
        };
        inner.ensure_indexes()?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Dimension the shard was opened with.
    pub fn dimension(&self) -> usize {
        self.inner.dimension
    }

    /// Directory holding the shard.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, IndexError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, IndexError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(IndexError::from_join)?
    }
}

#[async_trait]
impl VectorIndex for EdgeVectorIndex {
    fn name(&self) -> &'static str {
        "qdrant-edge"
    }

    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), IndexError> {
        if points.is_empty() {
            return Ok(());
        }
        let dimension = self.inner.dimension;
        for p in &points {
            check_vector(&p.vector, dimension)?;
        }
        self.blocking(move |inner| {
            let structs = points
                .into_iter()
                .map(|p| {
                    let payload = json!({
                        fields::USER_ID: p.user_id.as_uuid().to_string(),
                        fields::KIND: p.kind,
                        fields::IMPORTANCE: p.importance,
                        fields::CREATED_AT_MS: p.created_at_ms,
                        fields::ARCHIVED: p.archived,
                        fields::VALID: p.valid,
                    });
                    PointStruct::new(PointId::Uuid(p.id.as_uuid()), p.vector, payload).into()
                })
                .collect();
            inner.update(
                UpdateOperation::PointOperation(PointOperations::UpsertPoints(
                    PointInsertOperations::PointsList(structs),
                )),
                "upsert",
            )
        })
        .await
    }

    async fn delete(&self, ids: &[MemoryId]) -> Result<(), IndexError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<PointId> = ids.iter().map(|id| PointId::Uuid(id.as_uuid())).collect();
        self.blocking(move |inner| {
            inner.update(
                UpdateOperation::PointOperation(PointOperations::DeletePoints { ids }),
                "delete",
            )
        })
        .await
    }

    async fn delete_user(&self, user: UserId) -> Result<(), IndexError> {
        let filter = build_filter(user, None)?;
        self.blocking(move |inner| {
            inner.update(
                UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(filter)),
                "delete user",
            )
        })
        .await
    }

    async fn clear(&self) -> Result<(), IndexError> {
        self.blocking(|inner| {
            loop {
                let (records, _) = inner
                    .shard
                    .scroll(ScrollRequest {
                        offset: None,
                        limit: Some(SCROLL_PAGE),
                        filter: None,
                        with_payload: Some(WithPayloadInterface::Bool(false)),
                        with_vector: WithVector::Bool(false),
                        order_by: None,
                    })
                    .map_err(|e| engine_err("scroll", e))?;
                if records.is_empty() {
                    return Ok(());
                }
                let ids = records.into_iter().map(|record| record.id).collect();
                inner.update(
                    UpdateOperation::PointOperation(PointOperations::DeletePoints { ids }),
                    "clear",
                )?;
            }
        })
        .await
    }

    async fn search(
        &self,
        user: UserId,
        vector: &[f32],
        filter: &VectorFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
        check_vector(vector, self.inner.dimension)?;
        if limit == 0 || filter.is_unsatisfiable() {
            return Ok(Vec::new());
        }
        let request = SearchRequest {
            query: QueryEnum::Nearest(NamedQuery {
                query: VectorInternal::from(vector.to_vec()),
                using: None,
            }),
            filter: Some(build_filter(user, Some(filter))?),
            params: match self.inner.search_ef.load(Ordering::Relaxed) {
                0 => None,
                ef => Some(SearchParams {
                    hnsw_ef: Some(ef),
                    ..SearchParams::default()
                }),
            },
            limit: limit.min(MAX_SEARCH_LIMIT),
            offset: 0,
            with_payload: Some(WithPayloadInterface::Bool(false)),
            with_vector: Some(WithVector::Bool(false)),
            score_threshold: None,
        };
        self.blocking(move |inner| {
            let points = inner
                .shard
                .search(request)
                .map_err(|e| engine_err("search", e))?;
            points
                .into_iter()
                .map(|p| Ok((memory_id(p.id)?, p.score)))
                .collect()
        })
        .await
    }

    async fn count(&self, user: UserId) -> Result<u64, IndexError> {
        let filter = build_filter(user, None)?;
        self.blocking(move |inner| {
            let n = inner
                .shard
                .count(CountRequest {
                    filter: Some(filter),
                    exact: true,
                })
                .map_err(|e| engine_err("count", e))?;
            Ok(n as u64)
        })
        .await
    }

    async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        let filter = build_filter(user, None)?;
        self.blocking(move |inner| {
            let mut out = Vec::new();
            let mut offset = None;
            loop {
                let (records, next) = inner
                    .shard
                    .scroll(ScrollRequest {
                        offset,
                        limit: Some(SCROLL_PAGE),
                        filter: Some(filter.clone()),
                        with_payload: Some(WithPayloadInterface::Bool(false)),
                        with_vector: WithVector::Bool(false),
                        order_by: None,
                    })
                    .map_err(|e| engine_err("scroll", e))?;
                for record in records {
                    out.push(memory_id(record.id)?);
                }
                match next {
                    Some(next) => offset = Some(next),
                    None => return Ok(out),
                }
            }
        })
        .await
    }

    async fn optimize(&self) -> Result<(), IndexError> {
        self.blocking(|inner| {
            let _gate = gate(&inner.optimize_gate);
            inner
                .shard
                .optimize()
                .map(|_| ())
                .map_err(|e| engine_err("optimize", e))
        })
        .await
    }

    async fn flush(&self) -> Result<(), IndexError> {
        self.blocking(|inner| {
            // Same order as everywhere else: optimize gate before write gate.
            let _optimize = gate(&inner.optimize_gate);
            let _write = gate(&inner.write_gate);
            inner.shard.flush();
            Ok(())
        })
        .await
    }

    fn set_search_ef(&self, ef: Option<usize>) {
        self.inner
            .search_ef
            .store(ef.unwrap_or_default(), Ordering::Relaxed);
    }

    async fn layout(&self) -> Result<Option<VectorLayout>, IndexError> {
        self.blocking(|inner| {
            let info = inner.shard.info();
            Ok(Some(VectorLayout {
                segments: info.segments_count,
                points: info.points_count,
                indexed_points: info.indexed_vectors_count,
            }))
        })
        .await
    }

    async fn flush_if_idle(&self) -> Result<bool, IndexError> {
        self.blocking(|inner| {
            let _optimize = match inner.optimize_gate.try_lock() {
                Ok(guard) => guard,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                // An optimisation is running: flushing now would wait for all of it.
                Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
            };
            let _write = gate(&inner.write_gate);
            inner.shard.flush();
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::vector::conformance::{DIM, run_conformance};

    fn point(user: UserId, seed: usize) -> VectorPoint {
        // splitmix64: distinct pseudo-random directions per seed.
        let mut state = seed as u64;
        let vector = (0..DIM)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        VectorPoint {
            id: MemoryId::new(),
            user_id: user,
            vector,
            kind: "fact".into(),
            importance: 3,
            created_at_ms: seed as i64,
            archived: false,
            valid: true,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edge_conformance() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        assert_eq!(index.name(), "qdrant-edge");
        run_conformance(&index).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edge_reopen_keeps_data_and_rejects_other_dimension() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::from_trusted(uuid::Uuid::now_v7());
        let points: Vec<VectorPoint> = (0..2500).map(|i| point(user, i)).collect();
        let probe = points[42].clone();
        let mut expected: Vec<MemoryId> = points.iter().map(|p| p.id).collect();
        expected.sort();
        {
            let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
            index.upsert(points).await.expect("upsert");
            index.flush().await.expect("flush");
        }
        let index = EdgeVectorIndex::open(dir.path(), DIM)
            .await
            .expect("reopen");
        assert_eq!(index.count(user).await.expect("count"), 2500);
        // ids() pages through the scroll API (page size 1024).
        let mut ids = index.ids(user).await.expect("ids");
        ids.sort();
        assert_eq!(ids, expected);
        let hits = index
            .search(user, &probe.vector, &VectorFilter::default(), 5)
            .await
            .expect("search");
        assert!(
            hits.iter()
                .any(|(id, score)| *id == probe.id && *score > 0.99)
        );
        // Payload indexes survive too: filters still work after reopen.
        let none = VectorFilter {
            since_ms: Some(10_000),
            ..VectorFilter::default()
        };
        assert!(
            index
                .search(user, &probe.vector, &none, 5)
                .await
                .expect("search")
                .is_empty()
        );
        drop(index);
        let err = EdgeVectorIndex::open(dir.path(), DIM + 1)
            .await
            .expect_err("dimension mismatch");
        assert!(matches!(err, IndexError::BadInput(_)), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edge_optimize_keeps_results_and_concurrent_ops_are_safe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        // Tiny indexing threshold so optimize() really builds HNSW graphs here.
        index
            .inner
            .shard
            .set_optimizers_config(EdgeOptimizersConfig {
                indexing_threshold: Some(1),
                ..optimizers_config()
            })
            .expect("optimizer config");
        let user = UserId::from_trusted(uuid::Uuid::now_v7());
        let other = UserId::from_trusted(uuid::Uuid::now_v7());
        let points: Vec<VectorPoint> = (0..3000).map(|i| point(user, i)).collect();
        let probe = points[7].clone();
        index.upsert(points).await.expect("upsert");
        index
            .upsert((0..500).map(|i| point(other, i)).collect())
            .await
            .expect("upsert other");

        let optimizer = {
            let index = index.clone();
            tokio::spawn(async move { index.optimize().await })
        };
        let mut tasks = Vec::new();
        for i in 0..8 {
            let index = index.clone();
            let probe = probe.clone();
            tasks.push(tokio::spawn(async move {
                index
                    .upsert(vec![point(user, 10_000 + i)])
                    .await
                    .expect("upsert during optimize");
                index.flush().await.expect("flush during optimize");
                index
                    .search(user, &probe.vector, &VectorFilter::default(), 3)
                    .await
                    .expect("search during optimize")
            }));
        }
        for t in tasks {
            t.await.expect("join");
        }
        optimizer.await.expect("join").expect("optimize");
        let layout = index
            .layout()
            .await
            .expect("layout")
            .expect("edge reports its layout");
        assert!(
            layout.indexed_points > 0,
            "optimize built no vector index: {layout:?}"
        );
        assert_eq!(layout.points, 3508, "{layout:?}");
        // A beam narrower than the limit still returns the limit.
        index.set_search_ef(Some(1));
        let narrow = index
            .search(user, &probe.vector, &VectorFilter::default(), 5)
            .await
            .expect("search with a narrow beam");
        assert_eq!(narrow.len(), 5, "{narrow:?}");
        index.set_search_ef(None);
        assert_eq!(index.count(user).await.expect("count"), 3008);
        assert_eq!(index.count(other).await.expect("count"), 500);
        let hits = index
            .search(user, &probe.vector, &VectorFilter::default(), 3)
            .await
            .expect("search");
        assert!(hits.iter().any(|(id, _)| *id == probe.id), "{hits:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shard_made_with_engine_defaults_takes_our_segment_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let config = EdgeConfig::builder()
                .vector(
                    DEFAULT_VECTOR_NAME,
                    EdgeVectorParams::builder(DIM, Distance::Cosine).build(),
                )
                .build();
            let shard = EdgeShard::load(dir.path(), Some(config)).expect("engine defaults");
            assert_ne!(shard.config().optimizers, optimizers_config());
        }
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        assert_eq!(index.inner.shard.config().optimizers, optimizers_config());
        drop(index);
        let saved = EdgeConfig::load(dir.path())
            .expect("config file")
            .expect("readable config");
        assert_eq!(saved.optimizers, optimizers_config());
    }
}
