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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use qdrant_client::qdrant::point_id::PointIdOptions;
use qdrant_client::qdrant::vectors_config::Config as VectorsConfigKind;
use qdrant_client::qdrant::{
    BoolIndexParamsBuilder, Condition, CountPointsBuilder, CreateCollectionBuilder,
    CreateFieldIndexCollectionBuilder, DeletePointsBuilder, Distance, FieldType, Filter,
    HnswConfigDiffBuilder, IntegerIndexParamsBuilder, KeywordIndexParamsBuilder, Modifier,
    NamedVectors, PointId, PointStruct, PointsIdsList, Query, QueryBatchPointsBuilder,
    QueryPointsBuilder, Range, ScrollPointsBuilder, SearchParamsBuilder, SparseVectorParamsBuilder,
    SparseVectorsConfigBuilder, UpsertPointsBuilder, Vector, VectorInput, VectorParamsBuilder,
    VectorsConfigBuilder, VectorsSelector, payload_index_params::IndexParams,
    with_vectors_selector::SelectorOptions,
};
use qdrant_client::{Payload, Qdrant, QdrantError};

use crate::index::keyword::sparse::SparseVector;
use crate::index::vector::{
    IndexError, KeywordHit, KeywordQuery, MAX_SEARCH_LIMIT, VectorFilter, VectorIndex,
    VectorLayout, VectorPoint, View, check_point, check_vector, fields,
};

/// The name of a view's keyword vector: its terms, valued by BM25's term-frequency part,
/// scored with the server's IDF ([`crate::index::keyword::sparse`]).
pub(crate) fn keyword_vector_name(view: View) -> String {
    format!("{}_bm25", view.as_str())
}

/// The collection's keyword vectors: one per view, idf computed by the server.
fn sparse_vectors_config() -> SparseVectorsConfigBuilder {
    let mut config = SparseVectorsConfigBuilder::default();
    for &view in View::ALL {
        config.add_named_vector_params(
            keyword_vector_name(view),
            SparseVectorParamsBuilder::default().modifier(Modifier::Idf),
        );
    }
    config
}

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
pub(crate) struct CollectionLayout {
    pub shard_number: Option<u32>,
    pub replication_factor: Option<u32>,
    pub write_consistency_factor: Option<u32>,
    /// The collection also keeps both views' keyword terms as sparse vectors, for keyword
    /// search on the server ([`QdrantServerIndex::keyword_search`]).
    pub keywords: bool,
}

/// A collection on a Qdrant server (or a cluster of them).
pub(crate) struct QdrantServerIndex {
    /// One client per peer, in the order configured.
    peers: Vec<Qdrant>,
    /// The peer that answered last: where the next request goes first.
    current: AtomicUsize,
    collection: String,
    dimension: usize,
    /// The collection keeps keyword vectors ([`CollectionLayout::keywords`]).
    keywords: bool,
    /// HNSW beam width for searches; 0 is the server's default.
    search_ef: AtomicUsize,
    /// The collection's point count, and when it was read ([`POINTS_FRESH`]).
    points: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// Users' point counts, and when each was read ([`POINTS_FRESH`],
    /// [`VectorIndex::recent_count`]): a user's is forgotten when this index writes their
    /// points, everyone's when it deletes any.
    user_points: parking_lot::Mutex<HashMap<UserId, (Instant, u64)>>,
}

/// Users whose recent point count is kept; past it the stale ones go, then all.
const USER_POINTS_KEPT: usize = 10_000;

/// How long a read of the collection's point count stands for it: the idf of a term no point
/// holds needs it, at every keyword search with coverage, and it moves slowly.
const POINTS_FRESH: Duration = Duration::from_secs(10);

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
    must.extend(filter_conditions(filter).must);
    Filter::must(must)
}

/// The conditions of `filter` alone, for every user's points.
fn filter_conditions(filter: &VectorFilter) -> Filter {
    let mut must = Vec::new();
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

/// The keyword vector `name` of a point as the server returned it (none stored: no terms).
fn stored_terms(
    vectors: Option<qdrant_client::qdrant::VectorsOutput>,
    name: &str,
) -> Result<SparseVector, IndexError> {
    use qdrant_client::qdrant::vector_output::Vector as Output;
    use qdrant_client::qdrant::vectors_output::VectorsOptions;
    let Some(VectorsOptions::Vectors(named)) = vectors.and_then(|v| v.vectors_options) else {
        return Ok(SparseVector::default());
    };
    match named
        .vectors
        .get(name)
        .cloned()
        .map(qdrant_client::qdrant::VectorOutput::into_vector)
    {
        Some(Output::Sparse(sparse)) => {
            let mut pairs: Vec<(u32, f32)> =
                sparse.indices.into_iter().zip(sparse.values).collect();
            pairs.sort_unstable_by_key(|(index, _)| *index);
            let (indices, values) = pairs.into_iter().unzip();
            Ok(SparseVector { indices, values })
        }
        None => Ok(SparseVector::default()),
        Some(_) => Err(IndexError::Internal(format!(
            "the server returned {name} as a dense vector"
        ))),
    }
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
    /// vectors per view, and keyword vectors beside them when `keywords`): a new layout starts
    /// a new collection, filled from the memory log, while replicas of another layout keep
    /// theirs.
    pub(crate) fn collection_name(prefix: &str, dimension: usize, keywords: bool) -> String {
        if keywords {
            format!("{prefix}_{dimension}_views_bm25")
        } else {
            format!("{prefix}_{dimension}_views")
        }
    }

    /// Connects to the server at `urls` (gRPC endpoints, usually port 6334; several peers of
    /// one cluster), creating the collection (spread as `layout` says) and payload indexes if
    /// they are missing. Fails with [`IndexError::BadInput`] if the collection exists with
    /// another dimension or distance.
    pub(crate) async fn connect(
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
            keywords: layout.keywords,
            search_ef: AtomicUsize::new(0),
            points: parking_lot::Mutex::new(None),
            user_points: parking_lot::Mutex::new(HashMap::new()),
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

    async fn ensure_collection(&self, layout: CollectionLayout) -> Result<(), IndexError> {
        if !self.collection_exists("check collection").await? {
            let mut create = CreateCollectionBuilder::new(self.collection.clone())
                .vectors_config(vectors_config(self.dimension))
                .hnsw_config(HnswConfigDiffBuilder::default().m(0).payload_m(16));
            if layout.keywords {
                create = create.sparse_vectors_config(sparse_vectors_config());
            }
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
        let params = info.result.and_then(|i| i.config).and_then(|c| c.params);
        if self.keywords {
            let sparse = params
                .as_ref()
                .and_then(|p| p.sparse_vectors_config.as_ref());
            for &view in View::ALL {
                let name = keyword_vector_name(view);
                let idf = sparse
                    .and_then(|config| config.map.get(&name))
                    .is_some_and(|p| p.modifier == Some(Modifier::Idf as i32));
                if !idf {
                    return Err(IndexError::BadInput(format!(
                        "collection {} has no {name} keyword vectors with the IDF modifier",
                        self.collection
                    )));
                }
            }
        }
        let params = params.and_then(|p| p.vectors_config).and_then(|v| v.config);
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

    /// One keyword search as the server takes it (within a batch).
    fn keyword_query(&self, search: &KeywordQuery) -> qdrant_client::qdrant::QueryPoints {
        let name = keyword_vector_name(search.view);
        let mut query = QueryPointsBuilder::new(self.collection.clone())
            .query(Query::new_nearest(VectorInput::new_sparse(
                search.terms.indices.clone(),
                search.terms.values.clone(),
            )))
            .using(name.clone())
            .limit(search.limit.min(MAX_SEARCH_LIMIT) as u64)
            .with_payload(false)
            .with_vectors::<SelectorOptions>(if search.with_terms {
                VectorsSelector { names: vec![name] }.into()
            } else {
                false.into()
            });
        query = match search.user {
            Some(user) => query.filter(build_filter(user, &search.filter)),
            None => query.filter(filter_conditions(&search.filter)),
        };
        query.build()
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
        {
            let mut counts = self.user_points.lock();
            for p in &points {
                counts.remove(&p.user_id);
            }
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
                if let Some(keywords) = p.keywords.filter(|_| self.keywords) {
                    // A text of stop words alone has no terms: no keyword vector.
                    for &view in View::ALL
                        .iter()
                        .filter(|&&view| !keywords.of(view).is_empty())
                    {
                        let terms = keywords.of(view).clone();
                        vectors = vectors.add_vector(
                            keyword_vector_name(view),
                            Vector::new_sparse(terms.indices, terms.values),
                        );
                    }
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
        self.user_points.lock().clear();
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
        self.user_points.lock().remove(&user);
        self.delete_points(
            "delete user",
            DeletePointsBuilder::new(self.collection.clone())
                .points(Filter::must([user_condition(user)]))
                .wait(true),
        )
        .await
    }

    async fn clear(&self) -> Result<(), IndexError> {
        self.user_points.lock().clear();
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

    fn keeps_keywords(&self) -> bool {
        self.keywords
    }

    async fn keyword_searches(
        &self,
        searches: Vec<KeywordQuery>,
    ) -> Result<Vec<Vec<KeywordHit>>, IndexError> {
        if !self.keywords {
            return Err(IndexError::BadInput(format!(
                "collection {} keeps no keyword vectors",
                self.collection
            )));
        }
        // Empty queries and impossible filters find nothing without asking the server.
        let asked: Vec<usize> = (0..searches.len())
            .filter(|&at| {
                let search = &searches[at];
                !search.terms.is_empty() && search.limit > 0 && !search.filter.is_unsatisfiable()
            })
            .collect();
        let mut answers: Vec<Vec<KeywordHit>> = vec![Vec::new(); searches.len()];
        if asked.is_empty() {
            return Ok(answers);
        }
        let batch = QueryBatchPointsBuilder::new(
            self.collection.clone(),
            asked
                .iter()
                .map(|&at| self.keyword_query(&searches[at]))
                .collect::<Vec<_>>(),
        );
        let response = self
            .request("keyword search", |client: Qdrant| {
                let request = batch.clone();
                async move { client.query_batch(request).await }
            })
            .await?;
        if response.result.len() != asked.len() {
            return Err(IndexError::Internal(format!(
                "the server answered {} of {} keyword searches",
                response.result.len(),
                asked.len()
            )));
        }
        for (&at, result) in asked.iter().zip(response.result) {
            let search = &searches[at];
            let name = keyword_vector_name(search.view);
            answers[at] = result
                .result
                .into_iter()
                .map(|point| {
                    let terms = if search.with_terms {
                        Some(stored_terms(point.vectors, &name)?)
                    } else {
                        None
                    };
                    Ok(KeywordHit {
                        id: memory_id(point.id)?,
                        score: point.score,
                        terms,
                    })
                })
                .collect::<Result<_, IndexError>>()?;
        }
        Ok(answers)
    }

    async fn keyword_points(&self) -> Result<u64, IndexError> {
        if let Some((at, points)) = *self.points.lock()
            && at.elapsed() < POINTS_FRESH
        {
            return Ok(points);
        }
        let count = CountPointsBuilder::new(self.collection.clone()).exact(false);
        let response = self
            .request("count", |client: Qdrant| {
                let request = count.clone();
                async move { client.count(request).await }
            })
            .await?;
        let points = response.result.map(|r| r.count).unwrap_or(0);
        *self.points.lock() = Some((Instant::now(), points));
        Ok(points)
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

    async fn recent_count(&self, user: UserId) -> Result<u64, IndexError> {
        if let Some(&(at, points)) = self.user_points.lock().get(&user)
            && at.elapsed() < POINTS_FRESH
        {
            return Ok(points);
        }
        let read = Instant::now();
        let points = self.count(user).await?;
        let mut counts = self.user_points.lock();
        if counts.len() >= USER_POINTS_KEPT {
            counts.retain(|_, (at, _)| at.elapsed() < POINTS_FRESH);
            if counts.len() >= USER_POINTS_KEPT {
                counts.clear();
            }
        }
        counts.insert(user, (read, points));
        Ok(points)
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

    /// The Qdrant server of `QDRANT_URL` (gRPC), `QDRANT_API_KEY` if set, and a new
    /// collection name starting `mnemo_{prefix}_`; none (the test is skipped, and says so)
    /// without a server.
    fn test_server(prefix: &str) -> Option<(String, Option<String>, String)> {
        let Ok(url) = std::env::var("QDRANT_URL") else {
            println!("skipped: QDRANT_URL is not set, no Qdrant server to test against");
            return None;
        };
        let api_key = std::env::var("QDRANT_API_KEY").ok();
        let collection = format!("mnemo_{prefix}_{}", uuid::Uuid::now_v7().simple());
        Some((url, api_key, collection))
    }

    /// Runs only when `QDRANT_URL` (gRPC, e.g. `http://localhost:6334`) is set;
    /// `QDRANT_API_KEY` is used if present.
    #[tokio::test]
    async fn qdrant_server_conformance() {
        let Some((url, api_key, collection)) = test_server("conformance") else {
            return;
        };
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

    /// A user's recent count is read again once this index wrote or deleted their points:
    /// without that, the count kept from before each write would stand for ten seconds.
    /// Runs only when `QDRANT_URL` is set.
    #[tokio::test]
    async fn a_recent_count_is_read_again_after_this_index_writes() {
        use crate::index::vector::conformance::point;
        let Some((url, api_key, collection)) = test_server("counts") else {
            return;
        };
        let index = connect(&[&url], api_key, &collection, DIM)
            .await
            .expect("connect");
        let (alice, bob) = (UserId::for_tests(), UserId::for_tests());
        assert_eq!(index.recent_count(alice).await.expect("count"), 0);
        let ids: Vec<MemoryId> = (0..3).map(|_| MemoryId::new()).collect();
        let points = ids
            .iter()
            .map(|id| point(*id, alice, 0, "fact", 0))
            .collect();
        index.upsert(points).await.expect("upsert");
        index
            .upsert(vec![point(MemoryId::new(), bob, 1, "fact", 0)])
            .await
            .expect("upsert");
        assert_eq!(index.recent_count(alice).await.expect("count"), 3);
        assert_eq!(index.recent_count(bob).await.expect("count"), 1);
        index.delete(&ids[..1]).await.expect("delete");
        assert_eq!(index.recent_count(alice).await.expect("count"), 2);
        index.delete_user(alice).await.expect("delete user");
        assert_eq!(index.recent_count(alice).await.expect("count"), 0);
        assert_eq!(
            index.recent_count(bob).await.expect("count"),
            1,
            "bystander"
        );
        index.peers[0]
            .delete_collection(collection.clone())
            .await
            .expect("drop test collection");
    }

    /// Keyword vectors on the server score as the tantivy index does: the same hits in the
    /// same order, each score within 2 % (the server's idf is tantivy's formula, over every
    /// user's points), another user's memories never among them, and each hit's stored terms
    /// returned as written. Runs only when `QDRANT_URL` is set.
    #[tokio::test]
    async fn keyword_search_on_the_server_ranks_as_the_keyword_index() {
        use crate::index::keyword::sparse::{SparseAnalyzer, corpus};
        use crate::index::vector::PointKeywords;
        let Some((url, api_key, collection)) = test_server("keywords") else {
            return;
        };
        let layout = CollectionLayout {
            keywords: true,
            ..CollectionLayout::default()
        };
        let index = QdrantServerIndex::connect(&[&url], api_key.clone(), &collection, DIM, layout)
            .await
            .expect("connect");
        let (alice, bob) = (UserId::for_tests(), UserId::for_tests());
        let (tantivy, ids) = corpus::tantivy(&[alice, bob]);
        let analyser = SparseAnalyzer::new().unwrap();
        let vectors = corpus::vectors(&analyser);
        let points: Vec<VectorPoint> = [alice, bob]
            .iter()
            .zip(&ids)
            .flat_map(|(user, ids)| {
                ids.iter().zip(&vectors).map(|(id, terms)| VectorPoint {
                    id: *id,
                    user_id: *user,
                    vector: vec![1.0; DIM],
                    context: None,
                    kind: "fact".into(),
                    importance: 3,
                    created_at_ms: 0,
                    archived: false,
                    valid: true,
                    keywords: Some(PointKeywords {
                        own: terms.clone(),
                        context: terms.clone(),
                    }),
                })
            })
            .collect();
        index.upsert(points).await.expect("upsert");
        let asking = |view: View, query: &str, with_terms: bool| KeywordQuery {
            user: Some(alice),
            view,
            terms: analyser.query(query),
            filter: VectorFilter::default(),
            limit: 10,
            with_terms,
        };
        async fn search(
            index: &QdrantServerIndex,
            search: KeywordQuery,
        ) -> Result<Vec<KeywordHit>, IndexError> {
            let mut answers = index.keyword_searches(vec![search.clone(), search]).await?;
            assert_eq!(answers[0], answers[1], "a batch answers each search");
            Ok(answers.remove(0))
        }
        for &view in View::ALL {
            for query in corpus::QUERIES {
                let hits = search(&index, asking(view, query, true))
                    .await
                    .expect("search");
                let found: Vec<(MemoryId, f32)> = hits.iter().map(|h| (h.id, h.score)).collect();
                corpus::assert_same_ranking(&tantivy, alice, query, &found);
                for hit in &hits {
                    let at = ids[0].iter().position(|id| *id == hit.id);
                    let at = at.expect("only alice's memories");
                    assert_eq!(hit.terms.as_ref(), Some(&vectors[at]), "{query}");
                }
            }
        }
        let asked_nothing = search(&index, asking(View::Own, "what did", false)).await;
        assert!(asked_nothing.expect("a query of question words").is_empty());
        // Across users (term statistics): both users' memories holding the term.
        let everyone = KeywordQuery {
            user: None,
            view: View::Own,
            terms: analyser.query("otters"),
            filter: VectorFilter::default(),
            limit: 10,
            with_terms: false,
        };
        let holders = index
            .keyword_searches(vec![everyone])
            .await
            .expect("search");
        let mut holders: Vec<MemoryId> = holders[0].iter().map(|hit| hit.id).collect();
        holders.sort();
        let mut expected = vec![ids[0][2], ids[1][2]];
        expected.sort();
        assert_eq!(holders, expected);
        // A collection made without keyword vectors is refused for keyword search, by the
        // index that knows it and at connecting with `keywords`.
        let plain = format!("{collection}_plain");
        let without = connect(&[&url], api_key.clone(), &plain, DIM)
            .await
            .expect("connect");
        let refused = search(&without, asking(View::Own, "moon", false)).await;
        assert!(
            matches!(refused, Err(IndexError::BadInput(_))),
            "{refused:?}"
        );
        let refused = QdrantServerIndex::connect(&[&url], api_key, &plain, DIM, layout).await;
        assert!(
            matches!(refused, Err(IndexError::BadInput(_))),
            "{refused:?}"
        );
        for name in [collection, plain] {
            index.peers[0]
                .delete_collection(name)
                .await
                .expect("drop test collection");
        }
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
