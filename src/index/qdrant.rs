//! [`VectorIndex`] backed by a Qdrant server over gRPC (`qdrant-client`):
//! one collection for all users, cosine distance, `user_id` keyword payload
//! index marked `is_tenant`, plain indexes for the filter fields, and the
//! HNSW layout Qdrant recommends for payload-based multi-tenancy (no global
//! graph, per-tenant graphs via `payload_m`).
//!
//! Writes are sent with `wait=true`, so an acknowledged write is already in
//! the server's WAL; `flush` therefore only checks the collection is
//! reachable, and `optimize` leaves optimisation to the server's own
//! background optimizers.
//!
//! On a cluster the index is given several peers: every request goes to the
//! peer that answered last and, when that one cannot be reached (killed,
//! restarting, partitioned), to the next, so one peer down costs a refused
//! connection, not an error. The collection's shards and their copies
//! ([`CollectionLayout`]) are the cluster's business: any peer answers for all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use qdrant_client::qdrant::point_id::PointIdOptions;
use qdrant_client::qdrant::vectors_config::Config as VectorsConfigKind;
use qdrant_client::qdrant::{
    BoolIndexParamsBuilder, Condition, CountPointsBuilder, CreateCollectionBuilder,
    CreateFieldIndexCollectionBuilder, DeletePointsBuilder, Distance, FieldType, Filter,
    HnswConfigDiffBuilder, IntegerIndexParamsBuilder, KeywordIndexParamsBuilder, NamedVectors,
    PointId, PointStruct, PointsIdsList, QueryPointsBuilder, Range, ScrollPointsBuilder,
    SearchParamsBuilder, UpsertPointsBuilder, VectorParamsBuilder, VectorsConfigBuilder,
    payload_index_params::IndexParams,
};
use qdrant_client::{Payload, Qdrant, QdrantError};

use crate::index::vector::{
    IndexError, MAX_SEARCH_LIMIT, VectorFilter, VectorIndex, VectorLayout, VectorPoint, View,
    check_point, check_vector, fields,
};

/// The collection's vectors: one per view, both cosine.
fn vectors_config(dimension: usize) -> VectorsConfigBuilder {
    let mut config = VectorsConfigBuilder::default();
    for view in View::ALL {
        config.add_named_vector_params(
            view.as_str(),
            VectorParamsBuilder::new(dimension as u64, Distance::Cosine),
        );
    }
    config
}
use crate::store::{MemoryId, UserId};

/// Points per upsert request, to stay well under gRPC message limits.
const UPSERT_CHUNK: usize = 256;
/// Page size when scrolling all ids of a user.
const SCROLL_PAGE: u32 = 1024;
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection to a peer may take before the next peer is asked.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How a new collection is spread over a cluster's peers; `None` leaves the server's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectionLayout {
    pub shard_number: Option<u32>,
    pub replication_factor: Option<u32>,
    pub write_consistency_factor: Option<u32>,
}

/// A collection on a Qdrant server (or a cluster of them).
pub struct QdrantServerIndex {
    /// One client per peer, in the order configured.
    peers: Vec<Qdrant>,
    /// The peer that answered last: where the next request goes first.
    current: AtomicUsize,
    collection: String,
    dimension: usize,
    /// HNSW beam width for searches; 0 is the server's default.
    search_ef: AtomicUsize,
}

impl std::fmt::Debug for QdrantServerIndex {
    // The client holds the API key; never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantServerIndex")
            .field("peers", &self.peers.len())
            .field("collection", &self.collection)
            .field("dimension", &self.dimension)
            .finish_non_exhaustive()
    }
}

/// Maps client errors without echoing request metadata (which may carry the key).
fn server_err(context: &str, err: QdrantError) -> IndexError {
    match err {
        QdrantError::ResponseError { status }
        | QdrantError::ResourceExhaustedError { status, .. } => {
            use tonic::Code;
            let msg = format!("{context}: {:?}: {}", status.code(), status.message());
            if connect_failed(&status) {
                return IndexError::Unavailable(msg);
            }
            match status.code() {
                Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                    IndexError::BadInput(msg)
                }
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::ResourceExhausted
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::NotFound
                | Code::Cancelled
                | Code::Aborted => IndexError::Unavailable(msg),
                _ => IndexError::Internal(msg),
            }
        }
        QdrantError::ConversionError(msg) => IndexError::Internal(format!("{context}: {msg}")),
        QdrantError::InvalidUri(e) => IndexError::BadInput(format!("{context}: invalid URL: {e}")),
        QdrantError::Io(e) => IndexError::Unavailable(format!("{context}: {e}")),
        other => IndexError::Unavailable(format!("{context}: {other}")),
    }
}

/// qdrant-client reports a connection it could not open as an `Internal` status with this
/// message (`channel_pool.rs`), not as `Unavailable`.
const CONNECT_FAILED: &str = "Failed to connect to ";

/// A request on an open connection to a peer that died (SIGKILL mid-request) ends with an
/// `Unknown` status with this message, from tonic's transport.
const TRANSPORT_FAILED: &str = "transport error";

/// The status says the server could not be reached: no connection could be opened, or the
/// open one broke under the request.
fn connect_failed(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Internal => status.message().starts_with(CONNECT_FAILED),
        tonic::Code::Unknown => status.message().starts_with(TRANSPORT_FAILED),
        _ => false,
    }
}

/// The request never reached a server able to answer: another peer may. Every request this
/// index sends is idempotent (upserts and deletes by id, reads), so sending it again to another
/// peer is safe even when the first one applied it before it died.
fn unreachable(err: &QdrantError) -> bool {
    match err {
        QdrantError::ResponseError { status } => {
            connect_failed(status)
                || matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                )
        }
        QdrantError::Io(_) => true,
        _ => false,
    }
}

fn user_condition(user: UserId) -> Condition {
    Condition::matches(fields::USER_ID, user.as_uuid().to_string())
}

fn build_filter(user: UserId, filter: &VectorFilter) -> Filter {
    let mut must = vec![user_condition(user)];
    if let Some(kinds) = &filter.kinds {
        must.push(Condition::matches(fields::KIND, kinds.clone()));
    }
    if filter.since_ms.is_some() || filter.until_ms.is_some() {
        must.push(Condition::range(
            fields::CREATED_AT_MS,
            Range {
                gte: filter.since_ms.map(|ms| ms as f64),
                lt: filter.until_ms.map(|ms| ms as f64),
                gt: None,
                lte: None,
            },
        ));
    }
    if !filter.include_archived {
        must.push(Condition::matches(fields::ARCHIVED, false));
    }
    if !filter.include_invalid {
        must.push(Condition::matches(fields::VALID, true));
    }
    Filter::must(must)
}

fn point_id(id: MemoryId) -> PointId {
    PointId::from(id.as_uuid().to_string())
}

fn memory_id(id: Option<PointId>) -> Result<MemoryId, IndexError> {
    match id.and_then(|p| p.point_id_options) {
        Some(PointIdOptions::Uuid(s)) => uuid::Uuid::parse_str(&s)
            .map(MemoryId::from_uuid)
            .map_err(|e| IndexError::Internal(format!("server returned bad uuid {s:?}: {e}"))),
        Some(PointIdOptions::Num(n)) => Err(IndexError::Internal(format!(
            "foreign numeric point id {n} in collection"
        ))),
        None => Err(IndexError::Internal(
            "server returned a point without id".into(),
        )),
    }
}

impl QdrantServerIndex {
    /// The collection that holds vectors of `dimension` under `prefix`, named by layout (named
    /// vectors per view): a new layout starts a new collection, filled from the memory log,
    /// while replicas of the older version keep theirs.
    pub fn collection_name(prefix: &str, dimension: usize) -> String {
        format!("{prefix}_{dimension}_views")
    }

    /// Connects to the server at `urls` (gRPC endpoints, usually port 6334; several peers of
    /// one cluster), creating the collection (spread as `layout` says) and payload indexes if
    /// they are missing. Fails with [`IndexError::BadInput`] if the collection exists with
    /// another dimension or distance.
    pub async fn connect(
        urls: &[&str],
        api_key: Option<String>,
        collection: &str,
        dimension: usize,
        layout: CollectionLayout,
    ) -> Result<Self, IndexError> {
        if dimension == 0 {
            return Err(IndexError::BadInput("vector dimension must be > 0".into()));
        }
        if collection.is_empty() {
            return Err(IndexError::BadInput("collection name is empty".into()));
        }
        if urls.is_empty() {
            return Err(IndexError::BadInput("no Qdrant server URL".into()));
        }
        let peers = urls
            .iter()
            .map(|url| {
                Qdrant::from_url(url)
                    .api_key(api_key.clone())
                    .timeout(REQUEST_TIMEOUT)
                    .connect_timeout(CONNECT_TIMEOUT)
                    .skip_compatibility_check()
                    .build()
                    .map_err(|e| server_err("build qdrant client", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let index = Self {
            peers,
            current: AtomicUsize::new(0),
            collection: collection.to_string(),
            dimension,
            search_ef: AtomicUsize::new(0),
        };
        index.ensure_collection(layout).await?;
        index.ensure_indexes().await?;
        Ok(index)
    }

    /// Sends `request` to the peer that answered last and, while the peer asked cannot be
    /// reached, to each other peer in turn; the first answer, or the first error a server gave,
    /// ends it. With every peer unreachable, the last peer's error.
    async fn request<T, Sent>(
        &self,
        context: &str,
        request: impl Fn(Qdrant) -> Sent,
    ) -> Result<T, IndexError>
    where
        Sent: std::future::Future<Output = Result<T, QdrantError>>,
    {
        let first = self.current.load(Ordering::Relaxed) % self.peers.len();
        let mut at = first;
        loop {
            match request(self.peers[at].clone()).await {
                Ok(answer) => {
                    if at != first {
                        self.current.store(at, Ordering::Relaxed);
                        tracing::warn!(
                            peer = at,
                            unreachable = first,
                            "qdrant: a peer cannot be reached; requests go to another one"
                        );
                    }
                    return Ok(answer);
                }
                Err(err) => {
                    let next = (at + 1) % self.peers.len();
                    if !unreachable(&err) || next == first {
                        return Err(server_err(context, err));
                    }
                    at = next;
                }
            }
        }
    }

    /// Collection name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// Vector dimension of the collection.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    async fn ensure_collection(&self, layout: CollectionLayout) -> Result<(), IndexError> {
        if !self.collection_exists("check collection").await? {
            let mut create = CreateCollectionBuilder::new(self.collection.clone())
                .vectors_config(vectors_config(self.dimension))
                .hnsw_config(HnswConfigDiffBuilder::default().m(0).payload_m(16));
            if let Some(shards) = layout.shard_number {
                create = create.shard_number(shards);
            }
            if let Some(copies) = layout.replication_factor {
                create = create.replication_factor(copies);
            }
            if let Some(acknowledging) = layout.write_consistency_factor {
                create = create.write_consistency_factor(acknowledging);
            }
            let created = self
                .request("create collection", |client: Qdrant| {
                    let request = create.clone();
                    async move { client.create_collection(request).await }
                })
                .await;
            // Another replica may have created it concurrently.
            if let Err(err) = created
                && !self
                    .collection_exists("check collection")
                    .await
                    .unwrap_or(false)
            {
                return Err(err);
            }
        }
        self.check_vector_params().await
    }

    async fn collection_exists(&self, context: &str) -> Result<bool, IndexError> {
        self.request(context, |client: Qdrant| {
            let request = self.collection.clone();
            async move { client.collection_exists(request).await }
        })
        .await
    }

    async fn delete_points(
        &self,
        context: &str,
        delete: DeletePointsBuilder,
    ) -> Result<(), IndexError> {
        self.request(context, |client: Qdrant| {
            let request = delete.clone();
            async move { client.delete_points(request).await }
        })
        .await
        .map(drop)
    }

    async fn collection_info(
        &self,
    ) -> Result<qdrant_client::qdrant::GetCollectionInfoResponse, IndexError> {
        self.request("collection info", |client: Qdrant| {
            let request = self.collection.clone();
            async move { client.collection_info(request).await }
        })
        .await
    }

    async fn check_vector_params(&self) -> Result<(), IndexError> {
        let info = self.collection_info().await?;
        let params = info
            .result
            .and_then(|i| i.config)
            .and_then(|c| c.params)
            .and_then(|p| p.vectors_config)
            .and_then(|v| v.config);
        let Some(VectorsConfigKind::ParamsMap(map)) = params else {
            return Err(IndexError::BadInput(format!(
                "collection {} does not have the named vectors {:?} (an older layout?)",
                self.collection,
                View::ALL
                    .iter()
                    .map(|view| view.as_str())
                    .collect::<Vec<_>>()
            )));
        };
        for view in View::ALL {
            match map.map.get(view.as_str()) {
                Some(p)
                    if p.size == self.dimension as u64 && p.distance == Distance::Cosine as i32 => {
                }
                Some(p) => {
                    return Err(IndexError::BadInput(format!(
                        "collection {} has {} vectors of dimension {} / distance {}, expected {} \
                         / Cosine",
                        self.collection,
                        view.as_str(),
                        p.size,
                        Distance::try_from(p.distance)
                            .map(|d| d.as_str_name())
                            .unwrap_or("unknown"),
                        self.dimension
                    )));
                }
                None => {
                    return Err(IndexError::BadInput(format!(
                        "collection {} has no {} vectors",
                        self.collection,
                        view.as_str()
                    )));
                }
            }
        }
        Ok(())
    }

    async fn ensure_indexes(&self) -> Result<(), IndexError> {
        let info = self.collection_info().await?;
        let existing = info.result.map(|i| i.payload_schema).unwrap_or_default();
        let wanted: [(&str, FieldType, IndexParams); 5] = [
            (
                fields::USER_ID,
                FieldType::Keyword,
                KeywordIndexParamsBuilder::default().is_tenant(true).into(),
            ),
            (
                fields::KIND,
                FieldType::Keyword,
                KeywordIndexParamsBuilder::default()
                    .enable_hnsw(false)
                    .into(),
            ),
            (
                fields::CREATED_AT_MS,
                FieldType::Integer,
                IntegerIndexParamsBuilder::new(false, true)
                    .enable_hnsw(false)
                    .into(),
            ),
            (
                fields::ARCHIVED,
                FieldType::Bool,
                BoolIndexParamsBuilder::new().enable_hnsw(false).into(),
            ),
            (
                fields::VALID,
                FieldType::Bool,
                BoolIndexParamsBuilder::new().enable_hnsw(false).into(),
            ),
        ];
        for (name, field_type, params) in wanted {
            if existing.contains_key(name) {
                continue;
            }
            let create =
                CreateFieldIndexCollectionBuilder::new(self.collection.clone(), name, field_type)
                    .field_index_params(params)
                    .wait(true);
            self.request("create payload index", |client: Qdrant| {
                let request = create.clone();
                async move { client.create_field_index(request).await }
            })
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl VectorIndex for QdrantServerIndex {
    fn name(&self) -> &'static str {
        "qdrant"
    }

    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), IndexError> {
        for p in &points {
            check_point(p, self.dimension)?;
        }
        let mut structs: Vec<PointStruct> = points
            .into_iter()
            .map(|p| {
                let mut payload = Payload::new();
                payload.insert(fields::USER_ID, p.user_id.as_uuid().to_string());
                payload.insert(fields::KIND, p.kind);
                payload.insert(fields::IMPORTANCE, i64::from(p.importance));
                payload.insert(fields::CREATED_AT_MS, p.created_at_ms);
                payload.insert(fields::ARCHIVED, p.archived);
                payload.insert(fields::VALID, p.valid);
                let mut vectors = NamedVectors::default().add_vector(View::Own.as_str(), p.vector);
                if let Some(context) = p.context {
                    vectors = vectors.add_vector(View::Context.as_str(), context);
                }
                PointStruct::new(point_id(p.id), vectors, payload)
            })
            .collect();
        while !structs.is_empty() {
            let rest = structs.split_off(structs.len().min(UPSERT_CHUNK));
            let upsert = UpsertPointsBuilder::new(self.collection.clone(), structs).wait(true);
            self.request("upsert", |client: Qdrant| {
                let request = upsert.clone();
                async move { client.upsert_points(request).await }
            })
            .await?;
            structs = rest;
        }
        Ok(())
    }

    async fn delete(&self, ids: &[MemoryId]) -> Result<(), IndexError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<PointId> = ids.iter().copied().map(point_id).collect();
        self.delete_points(
            "delete",
            DeletePointsBuilder::new(self.collection.clone())
                .points(PointsIdsList { ids })
                .wait(true),
        )
        .await
    }

    async fn delete_user(&self, user: UserId) -> Result<(), IndexError> {
        self.delete_points(
            "delete user",
            DeletePointsBuilder::new(self.collection.clone())
                .points(Filter::must([user_condition(user)]))
                .wait(true),
        )
        .await
    }

    async fn clear(&self) -> Result<(), IndexError> {
        self.delete_points(
            "clear",
            DeletePointsBuilder::new(self.collection.clone())
                .points(Filter::default())
                .wait(true),
        )
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
        check_vector(vector, self.dimension)?;
        if limit == 0 || filter.is_unsatisfiable() {
            return Ok(Vec::new());
        }
        let mut query = QueryPointsBuilder::new(self.collection.clone())
            .query(vector.to_vec())
            .using(view.as_str())
            .filter(build_filter(user, filter))
            .limit(limit.min(MAX_SEARCH_LIMIT) as u64)
            .with_payload(false)
            .with_vectors(false);
        match self.search_ef.load(Ordering::Relaxed) {
            0 => {}
            ef => query = query.params(SearchParamsBuilder::default().hnsw_ef(ef as u64)),
        }
        let response = self
            .request("search", |client: Qdrant| {
                let request = query.clone();
                async move { client.query(request).await }
            })
            .await?;
        response
            .result
            .into_iter()
            .map(|p| Ok((memory_id(p.id)?, p.score)))
            .collect()
    }

    async fn count(&self, user: UserId) -> Result<u64, IndexError> {
        let count = CountPointsBuilder::new(self.collection.clone())
            .filter(Filter::must([user_condition(user)]))
            .exact(true);
        let response = self
            .request("count", |client: Qdrant| {
                let request = count.clone();
                async move { client.count(request).await }
            })
            .await?;
        response
            .result
            .map(|r| r.count)
            .ok_or_else(|| IndexError::Internal("count response without result".into()))
    }

    async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        let mut out = Vec::new();
        let mut offset: Option<PointId> = None;
        loop {
            let mut request = ScrollPointsBuilder::new(self.collection.clone())
                .filter(Filter::must([user_condition(user)]))
                .limit(SCROLL_PAGE)
                .with_payload(false)
                .with_vectors(false);
            if let Some(offset) = offset.take() {
                request = request.offset(offset);
            }
            let response = self
                .request("scroll", |client: Qdrant| {
                    let request = request.clone();
                    async move { client.scroll(request).await }
                })
                .await?;
            for point in response.result {
                out.push(memory_id(point.id)?);
            }
            match response.next_page_offset {
                Some(next) => offset = Some(next),
                None => return Ok(out),
            }
        }
    }

    fn set_search_ef(&self, ef: Option<usize>) {
        self.search_ef
            .store(ef.unwrap_or_default(), Ordering::Relaxed);
    }

    async fn layout(&self) -> Result<Option<VectorLayout>, IndexError> {
        let info = self.collection_info().await?;
        Ok(info.result.map(|info| VectorLayout {
            segments: info.segments_count as usize,
            points: info.points_count.unwrap_or_default() as usize,
            indexed_points: info.indexed_vectors_count.unwrap_or_default() as usize,
            tenant_shards: 0,
        }))
    }

    async fn optimize(&self) -> Result<(), IndexError> {
        // The server schedules its own optimizers; confirm the collection is healthy.
        self.check_vector_params().await
    }

    async fn flush(&self) -> Result<(), IndexError> {
        // Writes use wait=true: acknowledged means persisted in the server WAL.
        if self.collection_exists("flush check").await? {
            Ok(())
        } else {
            Err(IndexError::Unavailable(format!(
                "collection {} no longer exists",
                self.collection
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::vector::conformance::{DIM, run_conformance};

    /// The collection on the server at `urls`, with the server's default layout.
    async fn connect(
        urls: &[&str],
        api_key: Option<String>,
        collection: &str,
        dimension: usize,
    ) -> Result<QdrantServerIndex, IndexError> {
        QdrantServerIndex::connect(
            urls,
            api_key,
            collection,
            dimension,
            CollectionLayout::default(),
        )
        .await
    }

    /// Runs only when `QDRANT_URL` (gRPC, e.g. `http://localhost:6334`) is set;
    /// `QDRANT_API_KEY` is used if present.
    #[tokio::test]
    async fn qdrant_server_conformance() {
        let Ok(url) = std::env::var("QDRANT_URL") else {
            println!("skipped: QDRANT_URL is not set, no Qdrant server to test against");
            return;
        };
        let api_key = std::env::var("QDRANT_API_KEY").ok();
        let collection = format!("mnemo_conformance_{}", uuid::Uuid::now_v7().simple());
        let index = connect(&[&url], api_key.clone(), &collection, DIM)
            .await
            .expect("connect");
        assert_eq!(index.name(), "qdrant");
        run_conformance(&index).await;
        // Reconnecting to the existing collection works; another dimension is refused.
        connect(&[&url], api_key.clone(), &collection, DIM)
            .await
            .expect("reconnect");
        let err = connect(&[&url], api_key.clone(), &collection, DIM + 1)
            .await
            .expect_err("dimension mismatch");
        assert!(matches!(err, IndexError::BadInput(_)), "{err}");

        // A peer that cannot be reached is passed over: the one listed first here refuses
        // connections, and every request (the first and the later ones) is answered by the next.
        let refusing = refusing_url();
        let failing_over = connect(&[&refusing, &url], api_key, &collection, DIM)
            .await
            .expect("connect past a peer that refuses");
        assert_eq!(failing_over.current.load(Ordering::Relaxed), 1);
        let someone = UserId::for_tests();
        failing_over.count(someone).await.expect("count");
        failing_over
            .flush()
            .await
            .expect("flush through the live peer");
        index.peers[0]
            .delete_collection(collection.clone())
            .await
            .expect("drop test collection");
    }

    /// A loopback URL on which nothing listens (a port bound, then released).
    fn refusing_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        format!("http://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn with_every_peer_unreachable_the_error_says_unavailable() {
        let Err(err) = connect(&[&refusing_url(), &refusing_url()], None, "nowhere", DIM).await
        else {
            panic!("connected to nothing");
        };
        assert!(matches!(err, IndexError::Unavailable(_)), "{err}");
    }

    #[test]
    fn a_peer_that_refused_or_died_mid_request_is_unreachable_and_unavailable() {
        let died = tonic::Status::unknown("transport error");
        let refused = tonic::Status::internal(
            "Failed to connect to http://127.0.0.1:1/: tonic::transport::Error(Transport, ...)",
        );
        for status in [died, refused, tonic::Status::unavailable("peer down")] {
            let err = QdrantError::ResponseError { status };
            assert!(unreachable(&err), "{err}");
            assert!(matches!(
                server_err("search", err),
                IndexError::Unavailable(_)
            ));
        }
        let refused_by_the_server = QdrantError::ResponseError {
            status: tonic::Status::invalid_argument("wrong vector size"),
        };
        assert!(!unreachable(&refused_by_the_server));
        let other = QdrantError::ResponseError {
            status: tonic::Status::unknown("something else"),
        };
        assert!(!unreachable(&other));
    }

    #[test]
    fn filter_always_has_user_condition() {
        let user = UserId::for_tests();
        let f = build_filter(user, &VectorFilter::default());
        // user + archived + valid
        assert_eq!(f.must.len(), 3);
        assert_eq!(f.must[0], user_condition(user));
        let everything = VectorFilter {
            include_archived: true,
            include_invalid: true,
            ..VectorFilter::default()
        };
        assert_eq!(
            build_filter(user, &everything).must,
            vec![user_condition(user)]
        );
    }
}
