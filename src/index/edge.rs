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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use qdrant_edge::external::ordered_float::OrderedFloat;
use qdrant_edge::external::serde_json::json;
use qdrant_edge::{
    BoolIndexParams, Condition, CountRequest, CreateIndex, DEFAULT_VECTOR_NAME, Distance,
    EdgeConfig, EdgeOptimizersConfig, EdgeShard, EdgeVectorParams, FacetRequest, FacetValue,
    FieldCondition, FieldIndexOperations, Filter, IntegerIndexParams, JsonPath, KeywordIndexParams,
    Match, NamedQuery, OperationError, PayloadFieldSchema, PayloadSchemaParams, PointId,
    PointInsertOperations, PointOperations, PointStruct, PointStructPersisted, QueryEnum, Range,
    ScrollRequest, SearchParams, SearchRequest, UpdateOperation, ValueVariants, VectorInternal,
    VectorStructPersisted, WithPayloadInterface, WithVector,
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

/// Directory (inside the shared shard's) holding the shards of single users.
const TENANTS_DIR: &str = "tenants";

/// Suffix of the marker file that makes `tenants/<id>/` the user's shard.
const READY: &str = ".ready";

/// Largest users looked at per promotion pass.
const PROMOTION_CANDIDATES: usize = 64;

/// Default of [`EdgeVectorIndex::set_tenant_shard_points`].
pub const DEFAULT_TENANT_SHARD_POINTS: u64 = 20_000;

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
    tenants: RwLock<HashMap<UserId, Arc<Shard>>>,
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
    user: UserId,
    /// Points upserted for the user, and every point deleted by id (ids do not say whose).
    touched: std::collections::HashSet<PointId>,
    /// `delete_user` ran for the user.
    user_deleted: bool,
}

/// One Edge shard and the gates its engine needs.
struct Shard {
    /// Dropped by hand (see `Drop for Shard`): the engine flushes in its destructor and panics
    /// when that fails.
    shard: std::mem::ManuallyDrop<EdgeShard>,
    path: PathBuf,
    write_gate: Mutex<()>,
    optimize_gate: Mutex<()>,
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

fn fs_err(what: &str, path: &Path, err: std::io::Error) -> IndexError {
    IndexError::Unavailable(format!("{what} {}: {err}", path.display()))
}

/// Makes a rename inside `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), IndexError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fs_err("sync directory", dir, e))
}

impl Drop for Shard {
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

impl Shard {
    /// Opens (or creates) the shard in `path`; fails with [`IndexError::BadInput`] if it holds
    /// vectors of another dimension or distance.
    fn open(path: &Path, dimension: usize) -> Result<Self, IndexError> {
        std::fs::create_dir_all(path).map_err(|e| fs_err("create edge dir", path, e))?;
        if let Some(existing) = EdgeConfig::load(path) {
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
        let shard = EdgeShard::load(path, Some(config)).map_err(|e| match e {
            OperationError::ServiceError { .. } => {
                IndexError::Unavailable(format!("open edge shard at {}: {e}", path.display()))
            }
            other => engine_err("open edge shard", other),
        })?;
        let shard = Self {
            shard: std::mem::ManuallyDrop::new(shard),
            path: path.to_path_buf(),
            write_gate: Mutex::new(()),
            optimize_gate: Mutex::new(()),
        };
        shard.ensure_indexes()?;
        Ok(shard)
    }

    fn update(&self, op: UpdateOperation, context: &str) -> Result<(), IndexError> {
        let _gate = gate(&self.write_gate);
        self.shard.update(op).map_err(|e| engine_err(context, e))
    }

    fn upsert(&self, points: Vec<PointStructPersisted>) -> Result<(), IndexError> {
        if points.is_empty() {
            return Ok(());
        }
        self.update(
            UpdateOperation::PointOperation(PointOperations::UpsertPoints(
                PointInsertOperations::PointsList(points),
            )),
            "upsert",
        )
    }

    fn delete_user(&self, user: UserId) -> Result<(), IndexError> {
        self.update(
            UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(build_filter(
                user, None,
            )?)),
            "delete user",
        )
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

    fn count(&self, user: UserId) -> Result<u64, IndexError> {
        let n = self
            .shard
            .count(CountRequest {
                filter: Some(build_filter(user, None)?),
                exact: true,
            })
            .map_err(|e| engine_err("count", e))?;
        Ok(n as u64)
    }

    /// Pages through the points matching `filter` (all points when `None`), `SCROLL_PAGE` at a
    /// time, with their vectors and payloads when `full`.
    fn scroll_pages(
        &self,
        filter: Option<Filter>,
        full: bool,
        mut each: impl FnMut(Vec<qdrant_edge::Record>) -> Result<(), IndexError>,
    ) -> Result<(), IndexError> {
        let mut offset = None;
        loop {
            let (records, next) = self
                .shard
                .scroll(ScrollRequest {
                    offset,
                    limit: Some(SCROLL_PAGE),
                    filter: filter.clone(),
                    with_payload: Some(WithPayloadInterface::Bool(full)),
                    with_vector: WithVector::Bool(full),
                    order_by: None,
                })
                .map_err(|e| engine_err("scroll", e))?;
            each(records)?;
            match next {
                Some(next) => offset = Some(next),
                None => return Ok(()),
            }
        }
    }

    fn clear(&self) -> Result<(), IndexError> {
        loop {
            let (records, _) = self
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
            self.update(
                UpdateOperation::PointOperation(PointOperations::DeletePoints { ids }),
                "clear",
            )?;
        }
    }

    fn optimize(&self) -> Result<(), IndexError> {
        let _gate = gate(&self.optimize_gate);
        self.shard
            .optimize()
            .map(|_| ())
            .map_err(|e| engine_err("optimize", e))
    }

    fn flush(&self) {
        // Same order as everywhere else: optimize gate before write gate.
        let _optimize = gate(&self.optimize_gate);
        let _write = gate(&self.write_gate);
        self.shard.flush();
    }

    fn flush_if_idle(&self) -> bool {
        let _optimize = match self.optimize_gate.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // An optimisation is running: flushing now would wait for all of it.
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let _write = gate(&self.write_gate);
        self.shard.flush();
        true
    }
}

impl Tiers {
    fn open(path: PathBuf, dimension: usize) -> Result<Self, IndexError> {
        let shared = Arc::new(Shard::open(&path, dimension)?);
        let mut tenants = HashMap::new();
        let dir = path.join(TENANTS_DIR);
        if dir.is_dir() {
            let entries = std::fs::read_dir(&dir).map_err(|e| fs_err("read", &dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| fs_err("read", &dir, e))?;
                let entry_path = entry.path();
                if !entry_path.is_dir() {
                    let marker = entry_path.extension().is_some_and(|ext| ext == "ready");
                    if marker && !entry_path.with_extension("").is_dir() {
                        std::fs::remove_file(&entry_path)
                            .map_err(|e| fs_err("remove", &entry_path, e))?;
                    }
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(uuid) = uuid::Uuid::parse_str(&name) else {
                    tracing::warn!(path = %entry_path.display(), "ignoring a stray entry among the tenant shards");
                    continue;
                };
                let user = UserId::from_trusted(uuid);
                if !dir.join(format!("{name}{READY}")).exists() {
                    // A move that did not commit: its user is still in the shared shard.
                    std::fs::remove_dir_all(&entry_path)
                        .map_err(|e| fs_err("remove", &entry_path, e))?;
                    continue;
                }
                let shard = Shard::open(&entry_path, dimension)?;
                // The move may have crashed before its delete from the shared shard was
                // flushed.
                shared.delete_user(user)?;
                tenants.insert(user, Arc::new(shard));
            }
        }
        Ok(Self {
            dimension,
            path,
            shared,
            tenants: RwLock::new(tenants),
            route_gate: Mutex::new(()),
            search_ef: AtomicUsize::new(0),
            tenant_shard_points: AtomicU64::new(DEFAULT_TENANT_SHARD_POINTS),
            moving: Mutex::new(None),
            promote_gate: Mutex::new(()),
        })
    }

    fn tenants(&self) -> std::sync::RwLockReadGuard<'_, HashMap<UserId, Arc<Shard>>> {
        self.tenants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shard holding `user`'s points.
    fn route(&self, user: UserId) -> Arc<Shard> {
        self.tenants()
            .get(&user)
            .cloned()
            .unwrap_or_else(|| Arc::clone(&self.shared))
    }

    /// The shared shard first, then the tenant shards.
    fn shards(&self) -> Vec<Arc<Shard>> {
        let mut all = vec![Arc::clone(&self.shared)];
        all.extend(self.tenants().values().cloned());
        all
    }

    fn tenant_dir(&self, user: UserId, suffix: &str) -> PathBuf {
        self.path
            .join(TENANTS_DIR)
            .join(format!("{}{suffix}", user.as_uuid()))
    }

    /// Moves every user of the shared shard holding at least the configured number of points
    /// to a shard of their own; returns who moved.
    fn promote_large_users(&self) -> Result<Vec<UserId>, IndexError> {
        let threshold = self.tenant_shard_points.load(Ordering::Relaxed);
        if threshold == 0 {
            return Ok(Vec::new());
        }
        let _one_pass = gate(&self.promote_gate);
        // Approximate counts from the tenant index (deleted points may still be counted);
        // a candidate is checked exactly before it moves.
        let largest = self
            .shared
            .shard
            .facet(FacetRequest {
                key: key(fields::USER_ID)?,
                limit: PROMOTION_CANDIDATES,
                filter: None,
                exact: false,
            })
            .map_err(|e| engine_err("facet", e))?;
        let mut moved = Vec::new();
        for hit in largest.hits {
            if (hit.count as u64) < threshold {
                break;
            }
            let FacetValue::Keyword(value) = hit.value else {
                continue;
            };
            let Ok(uuid) = uuid::Uuid::parse_str(&value) else {
                continue;
            };
            let user = UserId::from_trusted(uuid);
            if self.tenants().contains_key(&user) || self.shared.count(user)? < threshold {
                continue;
            }
            self.promote(user)?;
            moved.push(user);
        }
        Ok(moved)
    }

    /// Moves `user`'s points from the shared shard to a shard of their own (steps in the
    /// module documentation).
    fn promote(&self, user: UserId) -> Result<(), IndexError> {
        let started = std::time::Instant::now();
        let dir = self.tenant_dir(user, "");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| fs_err("remove", &dir, e))?;
        }
        let marker = self.tenant_dir(user, READY);
        if marker.exists() {
            std::fs::remove_file(&marker).map_err(|e| fs_err("remove", &marker, e))?;
        }
        let target = Arc::new(Shard::open(&dir, self.dimension)?);
        self.start_move(user);
        let copied = self.copy_points(user, &target);
        let committed = copied.and_then(|copied| {
            let _route = gate(&self.route_gate);
            let caught_up = self.finish_move(user, &target)?;
            self.route_to(user, Arc::clone(&target))?;
            Ok((copied, caught_up))
        });
        self.end_move();
        let (copied, caught_up) = committed?;
        tracing::info!(%user, copied, caught_up, elapsed = ?started.elapsed(), "user moved to their own vector shard");
        Ok(())
    }

    /// Starts recording what updates touch for `user`.
    fn start_move(&self, user: UserId) {
        let _route = gate(&self.route_gate);
        *self.moving() = Some(Move {
            user,
            touched: std::collections::HashSet::new(),
            user_deleted: false,
        });
    }

    fn end_move(&self) {
        let _route = gate(&self.route_gate);
        self.moving().take();
    }

    fn moving(&self) -> MutexGuard<'_, Option<Move>> {
        self.moving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Step 1: copies `user`'s points from the shared shard into `target`, without holding
    /// the routing gate; returns how many it copied.
    fn copy_points(&self, user: UserId, target: &Shard) -> Result<u64, IndexError> {
        let mut copied = 0u64;
        self.shared
            .scroll_pages(Some(build_filter(user, None)?), true, |records| {
                let points = records
                    .into_iter()
                    .map(persisted)
                    .collect::<Result<Vec<_>, _>>()?;
                copied += points.len() as u64;
                target.upsert(points)
            })?;
        target.flush();
        Ok(copied)
    }

    /// Step 2, under `route_gate`: brings over what was written during the copy, flushes and
    /// writes the marker. Returns how many points it looked at again.
    fn finish_move(&self, user: UserId, target: &Shard) -> Result<usize, IndexError> {
        let (touched, user_deleted) = match self.moving().as_mut() {
            Some(m) if m.user == user => {
                (m.touched.drain().collect::<Vec<PointId>>(), m.user_deleted)
            }
            _ => return Err(IndexError::Internal("the move's record is gone".into())),
        };
        if user_deleted {
            target.delete_user(user)?;
        }
        let owner = user.as_uuid().to_string();
        let current = self
            .shared
            .shard
            .retrieve(
                &touched,
                Some(WithPayloadInterface::Bool(true)),
                Some(WithVector::Bool(true)),
            )
            .map_err(|e| engine_err("retrieve", e))?;
        let mut keep = Vec::new();
        for record in current {
            let theirs = record
                .payload
                .as_ref()
                .and_then(|payload| payload.0.get(fields::USER_ID))
                .and_then(|value| value.as_str())
                == Some(owner.as_str());
            if theirs {
                keep.push(persisted(record)?);
            }
        }
        let kept: std::collections::HashSet<PointId> = keep.iter().map(|point| point.id).collect();
        let gone: Vec<PointId> = touched
            .iter()
            .filter(|id| !kept.contains(id))
            .copied()
            .collect();
        if !gone.is_empty() {
            target.update(
                UpdateOperation::PointOperation(PointOperations::DeletePoints { ids: gone }),
                "delete",
            )?;
        }
        target.upsert(keep)?;
        target.flush();
        let marker = self.tenant_dir(user, READY);
        std::fs::File::create(&marker)
            .and_then(|file| file.sync_all())
            .map_err(|e| fs_err("write", &marker, e))?;
        sync_dir(&self.path.join(TENANTS_DIR))?;
        Ok(touched.len())
    }

    /// Step 3, under `route_gate`: routes `user` to `target` and drops their shared points.
    fn route_to(&self, user: UserId, target: Arc<Shard>) -> Result<(), IndexError> {
        self.tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(user, target);
        self.shared.delete_user(user)
    }

    /// Records an update for a move in progress (the caller holds `route_gate`).
    fn record(&self, f: impl FnOnce(&mut Move)) {
        if let Some(m) = self.moving().as_mut() {
            f(m);
        }
    }
}

/// A scrolled or retrieved point, as an upsert.
fn persisted(record: qdrant_edge::Record) -> Result<PointStructPersisted, IndexError> {
    let vector = record
        .vector
        .ok_or_else(|| IndexError::Internal("a point was read without its vector".into()))?;
    Ok(PointStructPersisted {
        id: record.id,
        vector: VectorStructPersisted::from(vector),
        payload: record.payload,
    })
}

impl EdgeVectorIndex {
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

    /// Dimension the shard was opened with.
    pub fn dimension(&self) -> usize {
        self.inner.dimension
    }

    /// Directory holding the shared shard (tenant shards are below it).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// From the next optimisation on, users with at least `points` points in the shared shard
    /// move to a shard of their own (default [`DEFAULT_TENANT_SHARD_POINTS`]); 0 moves nobody.
    /// Users who already moved stay where they are.
    pub fn set_tenant_shard_points(&self, points: u64) {
        self.inner
            .tenant_shard_points
            .store(points, Ordering::Relaxed);
    }

    /// Users with a shard of their own.
    pub fn tenant_shard_users(&self) -> Vec<UserId> {
        let mut users: Vec<UserId> = self.inner.tenants().keys().copied().collect();
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
            check_vector(&p.vector, dimension)?;
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
                        .filter(|p| p.user_id == mover)
                        .map(|p| PointId::Uuid(p.id.as_uuid())),
                );
            });
            let mut shared = Vec::new();
            let mut own: HashMap<UserId, Vec<PointStructPersisted>> = HashMap::new();
            for p in points {
                let payload = json!({
                    fields::USER_ID: p.user_id.as_uuid().to_string(),
                    fields::KIND: p.kind,
                    fields::IMPORTANCE: p.importance,
                    fields::CREATED_AT_MS: p.created_at_ms,
                    fields::ARCHIVED: p.archived,
                    fields::VALID: p.valid,
                });
                let point = PointStruct::new(PointId::Uuid(p.id.as_uuid()), p.vector, payload);
                if tenants.contains_key(&p.user_id) {
                    own.entry(p.user_id).or_default().push(point.into());
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
            tiers.record(|m| m.user_deleted |= m.user == user);
            tiers.route(user).delete_user(user)
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
        self.blocking(move |tiers| {
            let points = tiers
                .route(user)
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
        self.blocking(move |tiers| tiers.route(user).count(user))
            .await
    }

    async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        let filter = build_filter(user, None)?;
        self.blocking(move |tiers| {
            let mut out = Vec::new();
            tiers
                .route(user)
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
            .shared
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
        index.inner.shared.count(user).expect("shared count")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_user_moves_to_their_own_shard_and_stays_there_after_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = UserId::from_trusted(uuid::Uuid::now_v7());
        let small = UserId::from_trusted(uuid::Uuid::now_v7());
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
        assert_eq!(index.tenant_shard_users(), vec![big]);
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
        assert_eq!(index.tenant_shard_users(), vec![big]);
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
        let user = UserId::from_trusted(uuid::Uuid::now_v7());
        let other = UserId::from_trusted(uuid::Uuid::now_v7());
        let points: Vec<VectorPoint> = (0..300).map(|i| point(user, i)).collect();
        let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
        index.upsert(points.clone()).await.expect("upsert");
        let tiers = Arc::clone(&index.inner);
        let target = Arc::new(Shard::open(&tiers.tenant_dir(user, ""), DIM).expect("tenant shard"));
        tiers.start_move(user);
        assert_eq!(tiers.copy_points(user, &target).expect("copy"), 300);
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
            assert_eq!(tiers.finish_move(user, &target).expect("finish"), 3);
            tiers.route_to(user, Arc::clone(&target)).expect("route");
        }
        tiers.end_move();
        assert_eq!(index.tenant_shard_users(), vec![user]);
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
        let user = UserId::from_trusted(uuid::Uuid::now_v7());
        let points: Vec<VectorPoint> = (0..300).map(|i| point(user, i)).collect();
        let mut expected: Vec<MemoryId> = points.iter().map(|p| p.id).collect();
        expected.sort();
        {
            let index = EdgeVectorIndex::open(dir.path(), DIM).await.expect("open");
            index.upsert(points).await.expect("upsert");
            index.flush().await.expect("flush");
            // A crash during step 1: a copy without its marker.
            let tiers = Arc::clone(&index.inner);
            let target = Shard::open(&tiers.tenant_dir(user, ""), DIM).expect("tenant shard");
            tiers.start_move(user);
            tiers.copy_points(user, &target).expect("copy");
        }
        {
            let index = EdgeVectorIndex::open(dir.path(), DIM)
                .await
                .expect("reopen");
            assert!(index.tenant_shard_users().is_empty());
            assert!(!index.inner.tenant_dir(user, "").exists());
            assert_eq!(index.count(user).await.expect("count"), 300);
            // A crash after step 2: the marker is written, the shared shard still holds the
            // user and nothing routes to the copy yet.
            let tiers = Arc::clone(&index.inner);
            let target = Shard::open(&tiers.tenant_dir(user, ""), DIM).expect("tenant shard");
            tiers.start_move(user);
            tiers.copy_points(user, &target).expect("copy");
            {
                let _route = gate(&tiers.route_gate);
                tiers.finish_move(user, &target).expect("finish");
            }
            assert!(tiers.tenant_dir(user, READY).exists());
            assert_eq!(shared_count(&index, user), 300);
            index.flush().await.expect("flush");
        }
        let index = EdgeVectorIndex::open(dir.path(), DIM)
            .await
            .expect("reopen");
        assert_eq!(index.tenant_shard_users(), vec![user]);
        assert_eq!(shared_count(&index, user), 0);
        let mut ids = index.ids(user).await.expect("ids");
        ids.sort();
        assert_eq!(ids, expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_threshold_of_zero_moves_nobody() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = UserId::from_trusted(uuid::Uuid::now_v7());
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
        assert_eq!(index.tenant_shard_users(), vec![user]);
    }
}
