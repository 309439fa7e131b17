//! The shared shard and the tenant shards, and the move of a large user to a shard of their
//! own (the protocol in the module docs of `edge`).

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use qdrant_edge::{
    FacetRequest, FacetValue, PointId, PointOperations, PointStructPersisted, UpdateOperation,
    VectorStructPersisted, WithPayloadInterface, WithVector,
};

use crate::index::vector::{IndexError, fields};

use super::*;

impl Tiers {
    pub(super) fn open(path: PathBuf, dimension: usize) -> Result<Self, IndexError> {
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
                let user = uuid;
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

    pub(super) fn tenants(&self) -> parking_lot::RwLockReadGuard<'_, HashMap<Tenant, Arc<Shard>>> {
        self.tenants.read()
    }

    /// The shard holding `user`'s points.
    pub(super) fn route(&self, user: Tenant) -> Arc<Shard> {
        self.tenants()
            .get(&user)
            .cloned()
            .unwrap_or_else(|| Arc::clone(&self.shared))
    }

    /// The shared shard first, then the tenant shards.
    pub(super) fn shards(&self) -> Vec<Arc<Shard>> {
        let mut all = vec![Arc::clone(&self.shared)];
        all.extend(self.tenants().values().cloned());
        all
    }

    pub(super) fn tenant_dir(&self, user: Tenant, suffix: &str) -> PathBuf {
        self.path.join(TENANTS_DIR).join(format!("{user}{suffix}"))
    }

    /// Moves every user of the shared shard holding at least the configured number of points
    /// to a shard of their own; returns who moved.
    pub(super) fn promote_large_users(&self) -> Result<Vec<Tenant>, IndexError> {
        let threshold = self.tenant_shard_points.load(Ordering::Relaxed);
        if threshold == 0 {
            return Ok(Vec::new());
        }
        let _one_pass = gate(&self.promote_gate);
        if self.shared.is_closed() {
            return Ok(Vec::new());
        }
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
            let user = uuid;
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
    pub(super) fn promote(&self, user: Tenant) -> Result<(), IndexError> {
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
    pub(super) fn start_move(&self, user: Tenant) {
        let _route = gate(&self.route_gate);
        *self.moving() = Some(Move {
            user,
            touched: std::collections::HashSet::new(),
            user_deleted: false,
        });
    }

    pub(super) fn end_move(&self) {
        let _route = gate(&self.route_gate);
        self.moving().take();
    }

    pub(super) fn moving(&self) -> MutexGuard<'_, Option<Move>> {
        self.moving.lock()
    }

    /// Step 1: copies `user`'s points from the shared shard into `target`, without holding
    /// the routing gate; returns how many it copied.
    pub(super) fn copy_points(&self, user: Tenant, target: &Shard) -> Result<u64, IndexError> {
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
    pub(super) fn finish_move(&self, user: Tenant, target: &Shard) -> Result<usize, IndexError> {
        let (touched, user_deleted) = match self.moving().as_mut() {
            Some(m) if m.user == user => {
                (m.touched.drain().collect::<Vec<PointId>>(), m.user_deleted)
            }
            _ => return Err(IndexError::Internal("the move's record is gone".into())),
        };
        if user_deleted {
            target.delete_user(user)?;
        }
        let owner = user.to_string();
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
    pub(super) fn route_to(&self, user: Tenant, target: Arc<Shard>) -> Result<(), IndexError> {
        self.tenants.write().insert(user, target);
        self.shared.delete_user(user)
    }

    /// Records an update for a move in progress (the caller holds `route_gate`).
    pub(super) fn record(&self, f: impl FnOnce(&mut Move)) {
        if let Some(m) = self.moving().as_mut() {
            f(m);
        }
    }
}

/// A scrolled or retrieved point, as an upsert.
pub(super) fn persisted(record: qdrant_edge::Record) -> Result<PointStructPersisted, IndexError> {
    let vector = record
        .vector
        .ok_or_else(|| IndexError::Internal("a point was read without its vector".into()))?;
    Ok(PointStructPersisted {
        id: record.id,
        vector: VectorStructPersisted::from(vector),
        payload: record.payload,
    })
}
