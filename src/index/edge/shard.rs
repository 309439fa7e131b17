//! One Edge shard: opening it with our segment and payload-index settings, updates under its
//! gates, counts, scrolls, optimisation and flushes.

use parking_lot::Mutex;
use std::path::Path;

use qdrant_edge::{
    BoolIndexParams, CountRequest, CreateIndex, DEFAULT_VECTOR_NAME, Distance, EdgeConfig,
    EdgeOptimizersConfig, EdgeShard, EdgeVectorParams, FieldIndexOperations, Filter,
    IntegerIndexParams, KeywordIndexParams, OperationError, PayloadFieldSchema,
    PayloadSchemaParams, PointInsertOperations, PointOperations, PointStructPersisted,
    ScrollRequest, UpdateOperation, WithPayloadInterface, WithVector,
};

use crate::index::vector::{IndexError, View, fields};

use super::*;

/// The engine's name for a view's vectors: the own view is the default (unnamed) vector.
pub(super) fn vector_name(view: View) -> &'static str {
    match view {
        View::Own => DEFAULT_VECTOR_NAME,
        View::Context => "context",
    }
}

/// Few, large segments (see [`TARGET_SEGMENTS`]); the rest are the engine's defaults.
pub(super) fn optimizers_config() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(TARGET_SEGMENTS),
        max_segment_size: Some(MAX_SEGMENT_KB),
        ..EdgeOptimizersConfig::default()
    }
}

/// Payload indexes the shard must have: (field, schema).
pub(super) fn required_indexes() -> Vec<(&'static str, PayloadFieldSchema)> {
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

pub(super) fn fs_err(what: &str, path: &Path, err: std::io::Error) -> IndexError {
    IndexError::Unavailable(format!("{what} {}: {err}", path.display()))
}

/// Makes a rename inside `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), IndexError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fs_err("sync directory", dir, e))
}

/// The Edge engine of a shard, taken out only by `Drop for Shard` (so that it is dropped, and
/// flushes, while the shard's gates are held); it reads as the engine until then.
pub(super) struct Engine(Option<EdgeShard>);

impl std::ops::Deref for Engine {
    type Target = EdgeShard;

    fn deref(&self) -> &EdgeShard {
        self.0
            .as_ref()
            .expect("a shard's engine lives as long as the shard")
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        let _optimize = gate(&self.optimize_gate);
        let _write = gate(&self.write_gate);
        // The engine flushes in its destructor, under the gates; a failing final flush (e.g.
        // the directory was removed) must not panic in ours.
        let engine = self.shard.0.take();
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(engine)));
        if dropped.is_err() {
            tracing::error!(path = %self.path.display(), "the vector shard's final flush failed");
        }
    }
}

impl Shard {
    /// Opens (or creates) the shard in `path`; fails with [`IndexError::BadInput`] if it holds
    /// vectors of another dimension or distance.
    pub(super) fn open(path: &Path, dimension: usize) -> Result<Self, IndexError> {
        std::fs::create_dir_all(path).map_err(|e| fs_err("create edge dir", path, e))?;
        if let Some(existing) = EdgeConfig::load(path) {
            let existing = existing.map_err(|e| engine_err("read edge config", e))?;
            for &view in View::ALL {
                match existing.vectors.get(vector_name(view)) {
                    Some(params)
                        if params.size == dimension && params.distance == Distance::Cosine => {}
                    Some(params) => {
                        return Err(IndexError::BadInput(format!(
                            "edge shard at {} has {} vectors of dimension {} / {:?}, requested \
                             {dimension} / Cosine",
                            path.display(),
                            view.as_str(),
                            params.size,
                            params.distance
                        )));
                    }
                    None => {
                        return Err(IndexError::BadInput(format!(
                            "edge shard at {} has no {} vectors (an older layout)",
                            path.display(),
                            view.as_str()
                        )));
                    }
                }
            }
        }
        let config = EdgeConfig::builder()
            .vector(
                vector_name(View::Own),
                EdgeVectorParams::builder(dimension, Distance::Cosine).build(),
            )
            .vector(
                vector_name(View::Context),
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
            shard: Engine(Some(shard)),
            path: path.to_path_buf(),
            write_gate: Mutex::new(()),
            optimize_gate: Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        shard.ensure_indexes()?;
        Ok(shard)
    }

    pub(super) fn update(&self, op: UpdateOperation, context: &str) -> Result<(), IndexError> {
        let _gate = gate(&self.write_gate);
        if self.is_closed() {
            return Err(IndexError::Unavailable(format!(
                "{context}: the vector index is closed"
            )));
        }
        self.shard.update(op).map_err(|e| engine_err(context, e))
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits for a running optimisation, flushes, and refuses writes from then on (searches
    /// still answer). The engine itself goes with the last owner of the shard; by then it has
    /// nothing left to write.
    pub(super) fn close(&self) {
        let _optimize = gate(&self.optimize_gate);
        let _write = gate(&self.write_gate);
        if !self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.shard.flush();
        }
    }

    pub(super) fn upsert(&self, points: Vec<PointStructPersisted>) -> Result<(), IndexError> {
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

    pub(super) fn delete_user(&self, user: Tenant) -> Result<(), IndexError> {
        self.update(
            UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(build_filter(
                user, None,
            )?)),
            "delete user",
        )
    }

    pub(super) fn ensure_indexes(&self) -> Result<(), IndexError> {
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

    pub(super) fn count(&self, user: Tenant) -> Result<u64, IndexError> {
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
    pub(super) fn scroll_pages(
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

    pub(super) fn clear(&self) -> Result<(), IndexError> {
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

    pub(super) fn optimize(&self) -> Result<(), IndexError> {
        let _gate = gate(&self.optimize_gate);
        if self.is_closed() {
            return Ok(());
        }
        self.shard
            .optimize()
            .map(|_| ())
            .map_err(|e| engine_err("optimize", e))
    }

    pub(super) fn flush(&self) {
        // Same order as everywhere else: optimize gate before write gate.
        let _optimize = gate(&self.optimize_gate);
        let _write = gate(&self.write_gate);
        self.shard.flush();
    }

    pub(super) fn flush_if_idle(&self) -> bool {
        // An optimisation is running: flushing now would wait for all of it.
        let Some(_optimize) = self.optimize_gate.try_lock() else {
            return false;
        };
        let _write = gate(&self.write_gate);
        self.shard.flush();
        true
    }
}
