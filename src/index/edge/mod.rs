//! In-process [`VectorIndex`] backed by Qdrant Edge (`qdrant-edge` 0.7.2), cosine distance, a
//! tenant keyword index on `user_id` plus plain payload indexes for the filters.
//!
//! Tiered multitenancy: one shared shard (the configured directory) holds the points of most
//! users; a user who grows past [`EdgeVectorIndex::set_tenant_shard_points`] moves to a shard of
//! their own under `tenants/<user id>/`. Past a few thousand points a user's search in the
//! shared shard walks the graph of every user's points, skipping the foreign ones; in their own
//! shard it walks a graph of theirs only, which is faster and finds more of the true nearest
//! neighbours (`mnemo bench recall`). Every query still carries the user filter.
//!
//! A move ("promotion") runs at the start of [`VectorIndex::optimize`], which callers run in
//! the background. Writes go on while the user's points are copied; what they touch is
//! recorded and brought over at the end, under the routing gate. Its steps, and what opening
//! the index does after a crash in between:
//! 1. copy the user's points into `tenants/<id>/` (a directory without its `<id>.ready`
//!    marker is deleted on open; the points are still in the shared shard);
//! 2. under the routing gate: copy again the points written meanwhile, flush, and write the
//!    marker (the commit point: from here on the tenant shard is the user's whole set);
//! 3. route the user there and delete their points from the shared shard (open repeats this
//!    delete for every tenant shard, so an unflushed delete cannot leave copies behind).
//!
//! The engine is synchronous; every call runs on tokio's blocking pool.
//! Locking rules (the engine panics instead of waiting in `EdgeShard::flush`,
//! which `try_lock`s its WAL and segment holder):
//! * updates hold the index's `route_gate`, then the shard's `write_gate` (they lock the WAL);
//! * `optimize` holds the shard's `optimize_gate` (it write-locks the segment holder
//!   while swapping segments);
//! * `flush` holds both shard gates, so it waits for a running optimisation instead of
//!   racing it (`flush_if_idle` declines instead of waiting). Searches, counts and
//!   scrolls take no gate at all.
//!
//! Durability: Edge 0.7.2 writes a WAL but never replays it on load, so only
//! flushed data survives a crash. Call [`VectorIndex::flush`] after batches; it flushes every
//! shard (dropping the index also flushes).

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use async_trait::async_trait;
use qdrant_edge::external::serde_json::json;
use qdrant_edge::{
    NamedQuery, OperationError, PointId, PointOperations, PointStruct, PointStructPersisted,
    QueryEnum, SearchParams, SearchRequest, UpdateOperation, VectorInternal, Vectors,
    WithPayloadInterface, WithVector,
};

use crate::index::vector::{
    IndexError, MAX_SEARCH_LIMIT, VectorFilter, VectorIndex, VectorLayout, VectorPoint, View,
    check_point, check_vector, fields,
};
use crate::store::{MemoryId, UserId};

/// The vector layout: one unnamed vector for the own view and a named `context` one.
const LAYOUT: &str = "v2";

/// A user as the tenant bookkeeping sees them: the id their points carry in `user_id`. The
/// index never makes a `UserId` (only the store does); it routes by this key.
type Tenant = uuid::Uuid;

mod filters;
mod shard;
mod tiers;

use filters::*;
use shard::*;
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

/// Directory (inside the shared shard's) holding the shards of single users.
const TENANTS_DIR: &str = "tenants";

/// Suffix of the marker file that makes `tenants/<id>/` the user's shard.
const READY: &str = ".ready";

/// Largest users looked at per promotion pass.
const PROMOTION_CANDIDATES: usize = 64;

/// Default of [`EdgeVectorIndex::set_tenant_shard_points`].
pub(crate) use crate::config::DEFAULT_TENANT_SHARD_POINTS;

/// Qdrant Edge shards stored under one local directory.
#[derive(Clone)]
pub struct EdgeVectorIndex {
    inner: Arc<Tiers>,
}

struct Tiers {
    dimension: usize,
    path: PathBuf,
    /// Every user without a shard of their own.
    shared: Arc<Shard>,
    /// Users with a shard of their own; an entry is never removed while the index is open.
    tenants: RwLock<HashMap<Tenant, Arc<Shard>>>,
    /// Held by every update and by a promotion, so no write lands between copying a user's
    /// points and routing the user to the copy. Taken before any shard's gate.
    route_gate: Mutex<()>,
    /// HNSW beam width for searches; 0 is the engine's default.
    search_ef: AtomicUsize,
    /// Points a user needs in the shared shard to be moved to their own; 0 never moves anyone.
    tenant_shard_points: AtomicU64,
    /// The move in progress, if any; updates record what they touch in it (under `route_gate`).
    moving: Mutex<Option<Move>>,
    /// One promotion pass at a time (optimisations may overlap).
    promote_gate: Mutex<()>,
}

/// What the writes made during a move touched, to be copied again before it commits.
struct Move {
    user: Tenant,
    /// Points upserted for the user, and every point deleted by id (ids do not say whose).
    touched: std::collections::HashSet<PointId>,
    /// `delete_user` ran for the user.
    user_deleted: bool,
}

/// One Edge shard and the gates its engine needs.
struct Shard {
    /// Taken out and dropped under the gates by `Drop for Shard`: the engine flushes in its
    /// destructor and panics when that fails.
    shard: shard::Engine,
    path: PathBuf,
    write_gate: Mutex<()>,
    optimize_gate: Mutex<()>,
    /// Set by [`VectorIndex::close`]: the shard is flushed and takes no more writes.
    closed: std::sync::atomic::AtomicBool,
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
    m.lock()
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

impl EdgeVectorIndex {
    /// Where a data directory keeps the index for vectors of `dimension`. The name carries the
    /// layout: an index of an older layout is left behind (see [`Self::remove_older_layouts`])
    /// and the new one is filled from the memory log.
    pub fn dir(data_dir: &Path, dimension: usize) -> PathBuf {
        data_dir.join(format!("vectors-{LAYOUT}-{dimension}"))
    }

    /// Deletes indexes of earlier layouts for `dimension` (derived data; the log rebuilds it).
    pub(crate) fn remove_older_layouts(data_dir: &Path, dimension: usize) {
        let old = data_dir.join(format!("vectors-{dimension}"));
        if old.is_dir() {
            match std::fs::remove_dir_all(&old) {
                Ok(()) => tracing::info!(
                    path = %old.display(),
                    "removed a vector index of an older layout; the new one is built from the memory log"
                ),
                Err(error) => tracing::warn!(
                    path = %old.display(), %error,
                    "could not remove a vector index of an older layout"
                ),
            }
        }
    }

    /// Opens (or creates) the index in `dir` for vectors of `dimension`, with the tenant shards
    /// found under it.
    ///
    /// Fails with [`IndexError::BadInput`] if the directory already holds a
    /// shard of another dimension or distance.
    pub async fn open(dir: &Path, dimension: usize) -> Result<Self, IndexError> {
        if dimension == 0 {
            return Err(IndexError::BadInput("vector dimension must be > 0".into()));
        }
        let path = dir.to_path_buf();
        let tiers = tokio::task::spawn_blocking(move || Tiers::open(path, dimension))
            .await
            .map_err(IndexError::from_join)??;
        Ok(Self {
            inner: Arc::new(tiers),
        })
    }

    /// From the next optimisation on, users with at least `points` points in the shared shard
    /// move to a shard of their own (default [`DEFAULT_TENANT_SHARD_POINTS`]); 0 moves nobody.
    /// Users who already moved stay where they are.
    pub fn set_tenant_shard_points(&self, points: u64) {
        self.inner
            .tenant_shard_points
            .store(points, Ordering::Relaxed);
    }

    /// The ids of the users with a shard of their own.
    #[cfg(test)]
    pub(crate) fn tenant_shard_users(&self) -> Vec<uuid::Uuid> {
        let mut users: Vec<Tenant> = self.inner.tenants().keys().copied().collect();
        users.sort();
        users
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, IndexError>
    where
        T: Send + 'static,
        F: FnOnce(&Tiers) -> Result<T, IndexError> + Send + 'static,
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
            check_point(p, dimension)?;
        }
        self.blocking(move |tiers| {
            let _route = gate(&tiers.route_gate);
            // Routes change only under `route_gate`, held here.
            let tenants = tiers.tenants();
            tiers.record(|m| {
                let mover = m.user;
                m.touched.extend(
                    points
                        .iter()
                        .filter(|p| p.user_id.as_uuid() == mover)
                        .map(|p| PointId::Uuid(p.id.as_uuid())),
                );
            });
            let mut shared = Vec::new();
            let mut own: HashMap<Tenant, Vec<PointStructPersisted>> = HashMap::new();
            for p in points {
                let payload = json!({
                    fields::USER_ID: p.user_id.as_uuid().to_string(),
                    fields::KIND: p.kind,
                    fields::IMPORTANCE: p.importance,
                    fields::CREATED_AT_MS: p.created_at_ms,
                    fields::ARCHIVED: p.archived,
                    fields::VALID: p.valid,
                });
                let vectors = match p.context {
                    Some(context) => Vectors::new_named([
                        (shard::vector_name(View::Own), p.vector),
                        (shard::vector_name(View::Context), context),
                    ]),
                    None => Vectors::from(p.vector),
                };
                let point = PointStruct::new(PointId::Uuid(p.id.as_uuid()), vectors, payload);
                if tenants.contains_key(&p.user_id.as_uuid()) {
                    own.entry(p.user_id.as_uuid())
                        .or_default()
                        .push(point.into());
                } else {
                    shared.push(point.into());
                }
            }
            tiers.shared.upsert(shared)?;
            for (user, points) in own {
                if let Some(shard) = tenants.get(&user) {
                    shard.upsert(points)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn delete(&self, ids: &[MemoryId]) -> Result<(), IndexError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<PointId> = ids.iter().map(|id| PointId::Uuid(id.as_uuid())).collect();
        self.blocking(move |tiers| {
            // Ids do not say whose they are: every shard drops the ones it has.
            let _route = gate(&tiers.route_gate);
            tiers.record(|m| m.touched.extend(ids.iter().copied()));
            for shard in tiers.shards() {
                shard.update(
                    UpdateOperation::PointOperation(PointOperations::DeletePoints {
                        ids: ids.clone(),
                    }),
                    "delete",
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn delete_user(&self, user: UserId) -> Result<(), IndexError> {
        self.blocking(move |tiers| {
            let _route = gate(&tiers.route_gate);
            tiers.record(|m| m.user_deleted |= m.user == user.as_uuid());
            tiers.route(user.as_uuid()).delete_user(user.as_uuid())
        })
        .await
    }

    async fn clear(&self) -> Result<(), IndexError> {
        self.blocking(|tiers| {
            let _route = gate(&tiers.route_gate);
            tiers.record(|m| m.user_deleted = true);
            tiers.shards().iter().try_for_each(|shard| shard.clear())
        })
        .await
    }

    async fn search_view(
        &self,
        user: UserId,
        view: View,
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
                using: match view {
                    View::Own => None,
                    View::Context => Some(shard::vector_name(view).to_string()),
                },
            }),
            filter: Some(build_filter(user.as_uuid(), Some(filter))?),
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
        self.blocking(move |tiers| {
            let points = tiers
                .route(user.as_uuid())
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
        self.blocking(move |tiers| tiers.route(user.as_uuid()).count(user.as_uuid()))
            .await
    }

    async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        let filter = build_filter(user.as_uuid(), None)?;
        self.blocking(move |tiers| {
            let mut out = Vec::new();
            tiers
                .route(user.as_uuid())
                .scroll_pages(Some(filter), false, |records| {
                    for record in records {
                        out.push(memory_id(record.id)?);
                    }
                    Ok(())
                })?;
            Ok(out)
        })
        .await
    }

    /// Moves large users to their own shards, then optimises every shard (tenant shards first:
    /// they are small, and a user who just moved needs a graph of their own).
    async fn optimize(&self) -> Result<(), IndexError> {
        self.blocking(|tiers| {
            tiers.promote_large_users()?;
            let shards = tiers.shards();
            for shard in shards.iter().skip(1).chain(shards.first()) {
                shard.optimize()?;
            }
            Ok(())
        })
        .await
    }

    async fn flush(&self) -> Result<(), IndexError> {
        self.blocking(|tiers| {
            tiers.shards().iter().for_each(|shard| shard.flush());
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
        self.blocking(|tiers| {
            let mut layout = VectorLayout {
                segments: 0,
                points: 0,
                indexed_points: 0,
                tenant_shards: tiers.tenants().len(),
            };
            for shard in tiers.shards() {
                let info = shard.shard.info();
                layout.segments += info.segments_count;
                layout.points += info.points_count;
                layout.indexed_points += info.indexed_vectors_count;
            }
            Ok(Some(layout))
        })
        .await
    }

    async fn close(&self) -> Result<(), IndexError> {
        self.blocking(|tiers| {
            // After a promotion in progress, so no shard is made after this.
            let _promote = gate(&tiers.promote_gate);
            tiers.shards().iter().for_each(|shard| shard.close());
            Ok(())
        })
        .await
    }

    async fn flush_if_idle(&self) -> Result<bool, IndexError> {
        self.blocking(|tiers| {
            // Every shard gets its chance; true only when all of them flushed.
            let flushed: Vec<bool> = tiers
                .shards()
                .iter()
                .map(|shard| shard.flush_if_idle())
                .collect();
            Ok(flushed.into_iter().all(|one| one))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use qdrant_edge::{
        DEFAULT_VECTOR_NAME, Distance, EdgeConfig, EdgeOptimizersConfig, EdgeVectorParams,
    };

    use super::*;
    use crate::index::vector::conformance::{DIM, run_conformance};

    fn point(user: UserId, seed: usize) -> VectorPoint {
        // splitmix64: distinct pseudo-random directions per seed.
        let mut state = seed as u64;
        let vector: Vec<f32> = (0..DIM)
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
            context: None,
            vector,
            kind: "fact".into(),
            importance: 3,
            created_at_ms: seed as i64,
            archived: false,
            valid: true,
            keywords: None,
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
        let user = UserId::for_tests();
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
    async fn close_flushes_then_refuses_writes_and_reopens_with_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::for_tests();
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        let points: Vec<VectorPoint> = (0..20).map(|seed| point(user, seed)).collect();
        index.upsert(points.clone()).await.expect("upsert");
        index.close().await.expect("close");
        // Searches still answer; writes are refused with a clear error, not lost silently.
        assert_eq!(index.count(user).await.expect("count"), 20);
        let refused = index
            .upsert(vec![point(user, 99)])
            .await
            .expect_err("a closed index takes no writes");
        assert!(refused.to_string().contains("closed"), "{refused}");
        assert!(index.close().await.is_ok(), "closing twice is harmless");
        drop(index);
        let reopened = EdgeVectorIndex::open(dir.path(), DIM)
            .await
            .expect("reopen");
        assert_eq!(reopened.count(user).await.expect("count"), 20);
        let hits = reopened
            .search(user, &points[3].vector, &VectorFilter::default(), 1)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|(id, _)| *id), Some(points[3].id));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edge_optimize_keeps_results_and_concurrent_ops_are_safe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        // Tiny indexing threshold so optimize() really builds HNSW graphs here.
        index
            .inner
            .shared
            .shard
            .set_optimizers_config(EdgeOptimizersConfig {
                indexing_threshold: Some(1),
                ..optimizers_config()
            })
            .expect("optimizer config");
        let user = UserId::for_tests();
        let other = UserId::for_tests();
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
                .vector(
                    "context",
                    EdgeVectorParams::builder(DIM, Distance::Cosine).build(),
                )
                .build();
            let shard =
                qdrant_edge::EdgeShard::load(dir.path(), Some(config)).expect("engine defaults");
            assert_ne!(shard.config().optimizers, optimizers_config());
        }
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        assert_eq!(
            index.inner.shared.shard.config().optimizers,
            optimizers_config()
        );
        drop(index);
        let saved = EdgeConfig::load(dir.path())
            .expect("config file")
            .expect("readable config");
        assert_eq!(saved.optimizers, optimizers_config());
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edge_conformance_with_a_user_moved_to_their_own_shard() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        // At the suite's optimize, user a holds 3 points and user b 1: only a moves.
        index.set_tenant_shard_points(2);
        run_conformance(&index).await;
        assert_eq!(index.tenant_shard_users().len(), 1);
    }

    /// Ids of `user` in the shared shard alone.
    fn shared_count(index: &EdgeVectorIndex, user: UserId) -> u64 {
        index
            .inner
            .shared
            .count(user.as_uuid())
            .expect("shared count")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_user_moves_to_their_own_shard_and_stays_there_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = UserId::for_tests();
        let small = UserId::for_tests();
        // 2100 points: the copy spans three scroll pages.
        let points: Vec<VectorPoint> = (0..2100).map(|i| point(big, i)).collect();
        let probe = points[1234].clone();
        let mut expected: Vec<MemoryId> = points.iter().map(|p| p.id).collect();
        let small_points: Vec<VectorPoint> = (0..50).map(|i| point(small, 5000 + i)).collect();
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        index.set_tenant_shard_points(100);
        index.upsert(points).await.expect("upsert big");
        index
            .upsert(small_points.clone())
            .await
            .expect("upsert small");
        assert!(index.tenant_shard_users().is_empty());
        index.optimize().await.expect("optimize");
        assert_eq!(index.tenant_shard_users(), vec![big.as_uuid()]);
        assert!(
            dir.path()
                .join(TENANTS_DIR)
                .join(big.as_uuid().to_string())
                .is_dir()
        );
        assert_eq!(shared_count(&index, big), 0, "the shared shard kept copies");
        assert_eq!(shared_count(&index, small), 50);
        assert_eq!(index.count(big).await.expect("count"), 2100);
        let layout = index.layout().await.expect("layout").expect("edge layout");
        assert_eq!(
            (layout.points, layout.tenant_shards),
            (2150, 1),
            "{layout:?}"
        );

        // The copy kept vectors and payloads: the probe is found, filters still apply.
        let hits = index
            .search(big, &probe.vector, &VectorFilter::default(), 3)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(probe.id), "{hits:?}");
        let later = VectorFilter {
            since_ms: Some(2000),
            ..VectorFilter::default()
        };
        let hits = index
            .search(big, &probe.vector, &later, 50)
            .await
            .expect("search");
        assert_eq!(hits.len(), 50);
        // created_at_ms is the seed: only points 2000.. pass.
        assert!(
            hits.iter().all(|(id, _)| expected[2000..].contains(id)),
            "{hits:?}"
        );
        // Isolation both ways.
        let hits = index
            .search(small, &probe.vector, &VectorFilter::default(), 100)
            .await
            .expect("search small");
        let small_ids: Vec<MemoryId> = small_points.iter().map(|p| p.id).collect();
        assert_eq!(hits.len(), 50);
        assert!(
            hits.iter().all(|(id, _)| small_ids.contains(id)),
            "{hits:?}"
        );

        // Later writes follow the user; deletes by id find the point in either shard.
        let extra = point(big, 9000);
        expected.push(extra.id);
        index
            .upsert(vec![extra.clone()])
            .await
            .expect("upsert after move");
        assert_eq!(shared_count(&index, big), 0);
        index
            .delete(&[expected[0], small_ids[0]])
            .await
            .expect("delete");
        expected.remove(0);
        assert_eq!(index.count(big).await.expect("count"), 2100);
        assert_eq!(index.count(small).await.expect("count"), 49);
        index.flush().await.expect("flush");
        drop(index);

        // Reopened with the default threshold: the user is still routed to their shard.
        let index = EdgeVectorIndex::open(dir.path(), DIM)
            .await
            .expect("reopen");
        assert_eq!(index.tenant_shard_users(), vec![big.as_uuid()]);
        let mut ids = index.ids(big).await.expect("ids");
        ids.sort();
        expected.sort();
        assert_eq!(ids, expected);
        let hits = index
            .search(big, &extra.vector, &VectorFilter::default(), 1)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(extra.id));
        index.delete_user(big).await.expect("delete user");
        assert_eq!(index.count(big).await.expect("count"), 0);
        assert_eq!(index.count(small).await.expect("count"), 49);
        index.clear().await.expect("clear");
        assert_eq!(index.count(small).await.expect("count"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_during_a_move_reach_the_new_shard() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::for_tests();
        let other = UserId::for_tests();
        let points: Vec<VectorPoint> = (0..300).map(|i| point(user, i)).collect();
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        index.upsert(points.clone()).await.expect("upsert");
        let tiers = Arc::clone(&index.inner);
        let target = Arc::new(
            Shard::open(&tiers.tenant_dir(user.as_uuid(), ""), DIM).expect("tenant shard"),
        );
        tiers.start_move(user.as_uuid());
        assert_eq!(
            tiers.copy_points(user.as_uuid(), &target).expect("copy"),
            300
        );
        // Written after the copy, before the commit: they land in the shared shard.
        let added = point(user, 1000);
        let mut archived = points[5].clone();
        archived.archived = true;
        let foreign = point(other, 2000);
        index
            .upsert(vec![added.clone(), archived.clone(), foreign.clone()])
            .await
            .expect("upsert during the move");
        index
            .delete(&[points[9].id])
            .await
            .expect("delete during the move");
        {
            let _route = gate(&tiers.route_gate);
            assert_eq!(
                tiers.finish_move(user.as_uuid(), &target).expect("finish"),
                3
            );
            tiers
                .route_to(user.as_uuid(), Arc::clone(&target))
                .expect("route");
        }
        tiers.end_move();
        assert_eq!(index.tenant_shard_users(), vec![user.as_uuid()]);
        assert_eq!(shared_count(&index, user), 0);
        assert_eq!(index.count(user).await.expect("count"), 300);
        assert_eq!(index.count(other).await.expect("count"), 1);
        let mut ids = index.ids(user).await.expect("ids");
        ids.sort();
        let mut expected: Vec<MemoryId> = points
            .iter()
            .map(|p| p.id)
            .filter(|id| *id != points[9].id)
            .chain([added.id])
            .collect();
        expected.sort();
        assert_eq!(ids, expected);
        // The payload written during the move won: the point is archived now.
        let hits = index
            .search(user, &archived.vector, &VectorFilter::default(), 1)
            .await
            .expect("search");
        assert_ne!(hits.first().map(|h| h.0), Some(archived.id), "{hits:?}");
        let with_archived = VectorFilter {
            include_archived: true,
            ..VectorFilter::default()
        };
        let hits = index
            .search(user, &archived.vector, &with_archived, 1)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(archived.id), "{hits:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opening_undoes_an_uncommitted_move_and_completes_a_committed_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::for_tests();
        let points: Vec<VectorPoint> = (0..300).map(|i| point(user, i)).collect();
        let mut expected: Vec<MemoryId> = points.iter().map(|p| p.id).collect();
        expected.sort();
        {
            let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
            index.upsert(points).await.expect("upsert");
            index.flush().await.expect("flush");
            // A crash during step 1: a copy without its marker.
            let tiers = Arc::clone(&index.inner);
            let target =
                Shard::open(&tiers.tenant_dir(user.as_uuid(), ""), DIM).expect("tenant shard");
            tiers.start_move(user.as_uuid());
            tiers.copy_points(user.as_uuid(), &target).expect("copy");
        }
        {
            let index = EdgeVectorIndex::open(dir.path(), DIM)
                .await
                .expect("reopen");
            assert!(index.tenant_shard_users().is_empty());
            assert!(!index.inner.tenant_dir(user.as_uuid(), "").exists());
            assert_eq!(index.count(user).await.expect("count"), 300);
            // A crash after step 2: the marker is written, the shared shard still holds the
            // user and nothing routes to the copy yet.
            let tiers = Arc::clone(&index.inner);
            let target =
                Shard::open(&tiers.tenant_dir(user.as_uuid(), ""), DIM).expect("tenant shard");
            tiers.start_move(user.as_uuid());
            tiers.copy_points(user.as_uuid(), &target).expect("copy");
            {
                let _route = gate(&tiers.route_gate);
                tiers.finish_move(user.as_uuid(), &target).expect("finish");
            }
            assert!(tiers.tenant_dir(user.as_uuid(), READY).exists());
            assert_eq!(shared_count(&index, user), 300);
            index.flush().await.expect("flush");
        }
        let index = EdgeVectorIndex::open(dir.path(), DIM)
            .await
            .expect("reopen");
        assert_eq!(index.tenant_shard_users(), vec![user.as_uuid()]);
        assert_eq!(shared_count(&index, user), 0);
        let mut ids = index.ids(user).await.expect("ids");
        ids.sort();
        assert_eq!(ids, expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_threshold_of_zero_moves_nobody() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::for_tests();
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        index.set_tenant_shard_points(0);
        index
            .upsert((0..200).map(|i| point(user, i)).collect())
            .await
            .expect("upsert");
        index.optimize().await.expect("optimize");
        assert!(index.tenant_shard_users().is_empty());
        index.set_tenant_shard_points(200);
        index.optimize().await.expect("optimize");
        assert_eq!(index.tenant_shard_users(), vec![user.as_uuid()]);
    }
}
