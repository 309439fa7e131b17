//! The vector index contract shared by every backend: the [`VectorIndex`]
//! trait, its value types ([`VectorPoint`], [`VectorFilter`]), the shared
//! [`IndexError`] used by all index modules, the payload field names both
//! Qdrant backends agree on, and (under `cfg(test)`) the conformance suite
//! every backend must pass.
//!
//! Multi-tenancy is payload based: one collection holds every user's points,
//! each point carries a `user_id` keyword payload (indexed as the tenant key),
//! and every read is filtered by exactly one user. The user filter is not
//! optional anywhere in the API. (The embedded backend also moves very large users to shards
//! of their own; their points keep the payload and their reads keep the filter.)

use async_trait::async_trait;

use crate::enums::text_enum;
use crate::store::{MemoryId, MemoryKind, UserId};

/// Error shared by the index modules (vector backends and the keyword index).
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The backend cannot be reached or is not in a usable state right now;
    /// retrying later may succeed.
    #[error("index unavailable: {0}")]
    Unavailable(String),
    /// The caller passed something the index cannot accept (wrong dimension,
    /// non-finite values, ...). Retrying the same call will fail again.
    #[error("bad index input: {0}")]
    BadInput(String),
    /// A bug or an unexpected state inside the index.
    #[error("index internal error: {0}")]
    Internal(String),
}

impl IndexError {
    /// Stable, lowercase name of the variant, for metrics.
    #[cfg(test)]
    pub(crate) fn label(&self) -> &'static str {
        match self {
            IndexError::Unavailable(_) => "unavailable",
            IndexError::BadInput(_) => "bad_input",
            IndexError::Internal(_) => "internal",
        }
    }

    /// Maps a failed `spawn_blocking` join (panic or runtime shutdown).
    pub(crate) fn from_join(err: tokio::task::JoinError) -> Self {
        if err.is_cancelled() {
            IndexError::Unavailable(format!("blocking index task cancelled: {err}"))
        } else {
            IndexError::Internal(format!("blocking index task panicked: {err}"))
        }
    }
}

text_enum! {
    /// Which text of a memory a search looks at. Every memory is indexed under both: its own
    /// text, and its context — for a turn, the turn with its neighbours in the thread (for any
    /// other memory its own text again).
    #[derive(PartialOrd, Ord)]
    View("view") {
        Own => "own",
        Context => "context",
    }
}

/// One memory as stored in the vector index.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorPoint {
    pub id: MemoryId,
    pub user_id: UserId,
    /// The own view's vector.
    pub vector: Vec<f32>,
    /// The context view's vector: for a turn, its text with its neighbours embedded; `None`
    /// for every other memory, whose context is its own text (searches of the context view
    /// skip them; recall reads their own score in its place).
    pub context: Option<Vec<f32>>,
    /// Memory kind (e.g. `fact`, `preference`, `event`); matched exactly.
    pub kind: String,
    pub importance: u8,
    pub created_at_ms: i64,
    pub archived: bool,
    /// `false` once the memory has been superseded or contradicted.
    pub valid: bool,
    /// Both views' keyword terms as sparse vectors, for an index that keeps keyword search
    /// beside the vectors (a Qdrant collection with `keywords`); `None` elsewhere.
    pub keywords: Option<PointKeywords>,
}

/// A memory's keyword terms, one sparse vector per view
/// ([`crate::index::keyword::sparse`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PointKeywords {
    pub own: crate::index::keyword::sparse::SparseVector,
    pub context: crate::index::keyword::sparse::SparseVector,
}

impl PointKeywords {
    pub(crate) fn of(&self, view: View) -> &crate::index::keyword::sparse::SparseVector {
        match view {
            View::Own => &self.own,
            View::Context => &self.context,
        }
    }
}

/// Optional restrictions applied on top of the mandatory user filter.
///
/// * `kinds`: `None` means any kind; `Some(list)` keeps only those kinds
///   (an empty list therefore matches nothing).
/// * `since_ms` is inclusive, `until_ms` is exclusive: `[since, until)` on
///   `created_at_ms`.
/// * Archived and invalid memories are excluded unless the matching
///   `include_*` flag is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VectorFilter {
    pub kinds: Option<Vec<String>>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub include_archived: bool,
    pub include_invalid: bool,
}

impl VectorFilter {
    /// True when no point can ever match (empty kind list or empty time range),
    /// so backends can skip the round trip.
    pub(crate) fn is_unsatisfiable(&self) -> bool {
        if self.kinds.as_ref().is_some_and(Vec::is_empty) {
            return true;
        }
        matches!((self.since_ms, self.until_ms), (Some(since), Some(until)) if since >= until)
    }

    /// The kind restriction in its shorter form. Every point has one of the known kinds, so
    /// "one of these" equals "none of the others"; for tantivy, excluding a short list costs
    /// far less than matching a long one (the default, every kind but `document`, becomes a
    /// single exclusion).
    pub(crate) fn kind_condition(&self) -> KindCondition {
        let Some(kinds) = &self.kinds else {
            return KindCondition::Any;
        };
        let known = |kind: &str| MemoryKind::parse(kind).is_some();
        if !kinds.iter().all(|kind| known(kind)) {
            return KindCondition::OneOf(kinds.clone());
        }
        let others: Vec<String> = MemoryKind::ALL
            .iter()
            .map(|kind| kind.as_str())
            .filter(|kind| !kinds.iter().any(|wanted| wanted == kind))
            .map(str::to_string)
            .collect();
        if others.is_empty() {
            KindCondition::Any
        } else if others.len() < kinds.len() {
            KindCondition::NoneOf(others)
        } else {
            KindCondition::OneOf(kinds.clone())
        }
    }
}

/// How a backend restricts kinds (see [`VectorFilter::kind_condition`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KindCondition {
    /// No restriction.
    Any,
    /// The kind is one of these.
    OneOf(Vec<String>),
    /// The kind is none of these.
    NoneOf(Vec<String>),
}

/// A per-user vector store with cosine similarity.
///
/// Scores returned by [`VectorIndex::search`] are cosine similarities in
/// `[-1, 1]`, highest first.
#[async_trait]
pub trait VectorIndex: Send + Sync {
    /// Short backend name for logs and metrics (`"qdrant-edge"`, `"qdrant"`).
    fn name(&self) -> &'static str;
    /// Inserts or replaces points; idempotent by id.
    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), IndexError>;
    /// Removes points by id; ids that do not exist are ignored.
    async fn delete(&self, ids: &[MemoryId]) -> Result<(), IndexError>;
    /// Removes every point of one user.
    async fn delete_user(&self, user: UserId) -> Result<(), IndexError>;
    /// Nearest neighbours of `vector` among `user`'s points that pass `filter`, by their own
    /// view; `limit` is clamped to [`MAX_SEARCH_LIMIT`].
    async fn search(
        &self,
        user: UserId,
        vector: &[f32],
        filter: &VectorFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
        self.search_view(user, View::Own, vector, filter, limit)
            .await
    }
    /// [`VectorIndex::search`] over one view's vectors. The context view holds only the
    /// points that have a context vector (turns).
    async fn search_view(
        &self,
        user: UserId,
        view: View,
        vector: &[f32],
        filter: &VectorFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError>;
    /// Exact number of points stored for `user` (archived and invalid included).
    async fn count(&self, user: UserId) -> Result<u64, IndexError>;
    /// [`VectorIndex::count`], possibly a moment old where the index keeps a recent answer:
    /// for statistics that a few writes do not change (coverage's informative share), so a
    /// recall need not wait for a count before its other requests.
    async fn recent_count(&self, user: UserId) -> Result<u64, IndexError> {
        self.count(user).await
    }
    /// Every point id stored for `user`, for consistency checks against the store.
    async fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError>;
    /// Removes every point of every user (index rebuilds).
    async fn clear(&self) -> Result<(), IndexError>;
    /// Builds/merges the ANN structures. May take minutes on large indexes;
    /// callers run it in the background, off the request path.
    async fn optimize(&self) -> Result<(), IndexError>;
    /// Makes every acknowledged write durable.
    async fn flush(&self) -> Result<(), IndexError>;
    /// Makes every acknowledged write durable and refuses writes from then on (after a
    /// running optimisation ends); searches may still answer. Called once, at shutdown,
    /// before the data directory is let go.
    async fn close(&self) -> Result<(), IndexError> {
        self.flush().await
    }
    /// Flushes unless that would wait for a running optimisation; true when it flushed.
    async fn flush_if_idle(&self) -> Result<bool, IndexError> {
        self.flush().await.map(|()| true)
    }
    /// Beam width of approximate (HNSW) searches from now on: `None` is the engine's default
    /// (its `ef_construct`, 100). A search asking for more results than `ef` uses its limit.
    /// Smaller is faster and misses more true neighbours (`mnemo bench recall` measures both).
    fn set_search_ef(&self, ef: Option<usize>);
    /// How the points are laid out in the engine (for benchmarks and operators), when the
    /// backend can tell.
    async fn layout(&self) -> Result<Option<VectorLayout>, IndexError> {
        Ok(None)
    }
    /// Whether the index keeps keyword search beside the vectors: it stores the points'
    /// [`VectorPoint::keywords`] and answers [`VectorIndex::keyword_searches`].
    fn keeps_keywords(&self) -> bool {
        false
    }
    /// Runs `searches` (one request where the engine can batch them) and returns each one's
    /// hits, best first. Refused by an index that keeps no keywords.
    async fn keyword_searches(
        &self,
        searches: Vec<KeywordQuery>,
    ) -> Result<Vec<Vec<KeywordHit>>, IndexError> {
        let _ = searches;
        Err(IndexError::BadInput(format!(
            "the {} index keeps no keyword vectors",
            self.name()
        )))
    }
    /// How many points of all users the keyword vectors' idf counts (`N`), possibly a moment
    /// old. Refused by an index that keeps no keywords.
    async fn keyword_points(&self) -> Result<u64, IndexError> {
        Err(IndexError::BadInput(format!(
            "the {} index keeps no keyword vectors",
            self.name()
        )))
    }
}

/// One keyword search over the keyword vectors of an index that keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct KeywordQuery {
    /// Whose memories are searched. `None` searches every user's, for the statistics of a
    /// term (its idf, read off a score) and never for results: such hits stay inside the
    /// keyword search.
    pub user: Option<UserId>,
    pub view: View,
    /// The query's terms, weighed.
    pub terms: crate::index::keyword::sparse::SparseVector,
    pub filter: VectorFilter,
    pub limit: usize,
    /// Return each hit's stored keyword vector (which terms it holds).
    pub with_terms: bool,
}

/// One hit of a keyword search: the memory, its BM25 score and, when asked for, the view's
/// keyword vector as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct KeywordHit {
    pub id: MemoryId,
    pub score: f32,
    pub terms: Option<crate::index::keyword::sparse::SparseVector>,
}

/// Storage layout of a vector index: a search visits every segment of the shard holding the
/// user's points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VectorLayout {
    /// Segments of all shards together.
    pub segments: usize,
    pub points: usize,
    /// Points in segments with an HNSW graph; the rest are searched exhaustively.
    pub indexed_points: usize,
    /// Users with a shard of their own (Qdrant Edge's tiered multitenancy); 0 on a server.
    pub tenant_shards: usize,
}

/// Upper bound applied to every `limit` (vector and keyword search): larger
/// requests are clamped, so a hostile limit cannot make an engine
/// pre-allocate a huge result heap.
pub(crate) const MAX_SEARCH_LIMIT: usize = 10_000;

/// Payload field names used by both Qdrant backends.
pub(crate) mod fields {
    pub(crate) const USER_ID: &str = "user_id";
    pub(crate) const KIND: &str = "kind";
    pub(crate) const IMPORTANCE: &str = "importance";
    pub(crate) const CREATED_AT_MS: &str = "created_at_ms";
    pub(crate) const ARCHIVED: &str = "archived";
    pub(crate) const VALID: &str = "valid";
}

/// Checks both vectors of a point (see [`check_vector`]).
pub(crate) fn check_point(point: &VectorPoint, dimension: usize) -> Result<(), IndexError> {
    check_vector(&point.vector, dimension)?;
    match &point.context {
        Some(context) => check_vector(context, dimension),
        None => Ok(()),
    }
}

/// Rejects vectors a cosine index cannot store or query meaningfully.
pub(crate) fn check_vector(vector: &[f32], dimension: usize) -> Result<(), IndexError> {
    if vector.len() != dimension {
        return Err(IndexError::BadInput(format!(
            "vector has dimension {}, index expects {dimension}",
            vector.len()
        )));
    }
    if vector.iter().any(|x| !x.is_finite()) {
        return Err(IndexError::BadInput(
            "vector contains NaN or infinite values".into(),
        ));
    }
    if vector.iter().all(|x| *x == 0.0) {
        return Err(IndexError::BadInput(
            "vector has zero norm; cosine similarity is undefined".into(),
        ));
    }
    Ok(())
}

/// Shared behavioural tests; every [`VectorIndex`] backend runs them.
#[cfg(test)]
pub(crate) mod conformance {
    use super::*;

    /// Dimension the index under test must have been opened with.
    pub(crate) const DIM: usize = 8;

    fn basis(i: usize) -> Vec<f32> {
        let mut v = vec![0.01_f32; DIM];
        v[i] = 1.0;
        v
    }

    pub(crate) fn point(
        id: MemoryId,
        user: UserId,
        dir: usize,
        kind: &str,
        created: i64,
    ) -> VectorPoint {
        VectorPoint {
            id,
            user_id: user,
            vector: basis(dir),
            context: None,
            kind: kind.to_string(),
            importance: 2,
            created_at_ms: created,
            archived: false,
            valid: true,
            keywords: None,
        }
    }

    fn new_memory() -> MemoryId {
        MemoryId::new()
    }

    fn ids_of(hits: &[(MemoryId, f32)]) -> Vec<MemoryId> {
        hits.iter().map(|(id, _)| *id).collect()
    }

    fn sorted(mut ids: Vec<MemoryId>) -> Vec<MemoryId> {
        ids.sort();
        ids
    }

    /// Runs the full contract against `index` (opened with dimension [`DIM`]).
    /// Uses fresh random users so it can run against a shared server collection.
    pub(crate) async fn run_conformance(index: &dyn VectorIndex) {
        let a = UserId::for_tests();
        let b = UserId::for_tests();
        let (a1, a2, a3, a4, b1) = (
            new_memory(),
            new_memory(),
            new_memory(),
            new_memory(),
            new_memory(),
        );
        let mut archived = point(a3, a, 2, "fact", 3000);
        archived.archived = true;
        let mut invalid = point(a4, a, 3, "event", 4000);
        invalid.valid = false;
        index
            .upsert(vec![
                point(a1, a, 0, "fact", 1000),
                point(a2, a, 1, "preference", 2000),
                archived,
                invalid,
                point(b1, b, 0, "fact", 1000),
            ])
            .await
            .expect("upsert");

        assert_eq!(index.count(a).await.expect("count a"), 4);
        assert_eq!(index.count(b).await.expect("count b"), 1);

        // Search finds by vector; archived/invalid/other users are excluded by default.
        let all = VectorFilter::default();
        let hits = index.search(a, &basis(0), &all, 10).await.expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(a1), "{hits:?}");
        assert!(
            hits[0].1 > 0.99,
            "cosine of identical vectors: {}",
            hits[0].1
        );
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a1, a2]), "{hits:?}");
        for w in hits.windows(2) {
            assert!(w[0].1 >= w[1].1, "scores must be descending: {hits:?}");
        }
        let huge = index
            .search(a, &basis(0), &all, usize::MAX)
            .await
            .expect("huge limit is clamped");
        assert_eq!(huge.len(), 2);
        let top1 = index.search(a, &basis(1), &all, 1).await.expect("search");
        assert_eq!(ids_of(&top1), vec![a2]);
        assert!(
            index
                .search(a, &basis(0), &all, 0)
                .await
                .expect("limit 0")
                .is_empty()
        );

        // User isolation: B never sees A's points, even with A's exact vector.
        let everything = VectorFilter {
            include_archived: true,
            include_invalid: true,
            ..VectorFilter::default()
        };
        for dir in 0..4 {
            let hits = index
                .search(b, &basis(dir), &everything, 100)
                .await
                .expect("search b");
            assert_eq!(ids_of(&hits), vec![b1], "user b saw {hits:?}");
        }

        // Archived and invalid are opt-in.
        let hits = index.search(a, &basis(2), &all, 10).await.expect("search");
        assert!(!ids_of(&hits).contains(&a3));
        let with_archived = VectorFilter {
            include_archived: true,
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(2), &with_archived, 10)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(a3));
        assert!(!ids_of(&hits).contains(&a4));
        let with_invalid = VectorFilter {
            include_invalid: true,
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(3), &with_invalid, 10)
            .await
            .expect("search");
        assert_eq!(hits.first().map(|h| h.0), Some(a4));
        assert!(!ids_of(&hits).contains(&a3));
        let hits = index
            .search(a, &basis(3), &everything, 10)
            .await
            .expect("search");
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a1, a2, a3, a4]));

        // Kind filter.
        let prefs = VectorFilter {
            kinds: Some(vec!["preference".into()]),
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(0), &prefs, 10)
            .await
            .expect("search");
        assert_eq!(ids_of(&hits), vec![a2]);
        let facts_and_events = VectorFilter {
            kinds: Some(vec!["fact".into(), "event".into()]),
            include_archived: true,
            include_invalid: true,
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(0), &facts_and_events, 10)
            .await
            .expect("search");
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a1, a3, a4]));
        // Every kind but one (the keyword index sends this as an exclusion).
        let all_but_preference = VectorFilter {
            kinds: Some(
                MemoryKind::ALL
                    .iter()
                    .map(|kind| kind.as_str().to_string())
                    .filter(|kind| kind != "preference")
                    .collect(),
            ),
            include_archived: true,
            include_invalid: true,
            ..VectorFilter::default()
        };
        assert!(matches!(
            all_but_preference.kind_condition(),
            KindCondition::NoneOf(_)
        ));
        let hits = index
            .search(a, &basis(1), &all_but_preference, 10)
            .await
            .expect("search");
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a1, a3, a4]));
        let no_kinds = VectorFilter {
            kinds: Some(vec![]),
            ..VectorFilter::default()
        };
        assert!(
            index
                .search(a, &basis(0), &no_kinds, 10)
                .await
                .expect("search")
                .is_empty()
        );

        // Time range: since inclusive, until exclusive.
        let since = VectorFilter {
            since_ms: Some(2000),
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(0), &since, 10)
            .await
            .expect("search");
        assert_eq!(ids_of(&hits), vec![a2]);
        let window = VectorFilter {
            since_ms: Some(1500),
            until_ms: Some(4000),
            include_archived: true,
            include_invalid: true,
            ..VectorFilter::default()
        };
        let hits = index
            .search(a, &basis(0), &window, 10)
            .await
            .expect("search");
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a2, a3]));
        let until = VectorFilter {
            until_ms: Some(1000),
            ..VectorFilter::default()
        };
        assert!(
            index
                .search(a, &basis(0), &until, 10)
                .await
                .expect("search")
                .is_empty()
        );

        // The context view: only points with a context vector are in it, found by that
        // vector (not their own); the user filter holds there too.
        let (turn, other_turn) = (new_memory(), new_memory());
        let mut with_context = point(turn, a, 5, "turn", 5000);
        with_context.context = Some(basis(6));
        let mut b_turn = point(other_turn, b, 5, "turn", 5000);
        b_turn.context = Some(basis(6));
        index
            .upsert(vec![with_context, b_turn])
            .await
            .expect("upsert turns");
        let hits = index
            .search_view(a, View::Context, &basis(6), &all, 10)
            .await
            .expect("search context");
        assert_eq!(ids_of(&hits), vec![turn], "{hits:?}");
        assert!(hits[0].1 > 0.99, "{hits:?}");
        let hits = index
            .search_view(a, View::Context, &basis(0), &all, 10)
            .await
            .expect("search context");
        assert_eq!(
            ids_of(&hits),
            vec![turn],
            "memories without context stay out of it"
        );
        let own = index
            .search_view(a, View::Own, &basis(5), &all, 1)
            .await
            .expect("search own");
        assert_eq!(ids_of(&own), vec![turn]);
        let mut bad_context = point(new_memory(), a, 0, "turn", 1);
        bad_context.context = Some(vec![0.0; DIM]);
        assert!(matches!(
            index.upsert(vec![bad_context]).await,
            Err(IndexError::BadInput(_))
        ));
        index
            .delete(&[turn, other_turn])
            .await
            .expect("delete turns");

        // Idempotent upsert: same id twice counts once, payload is replaced.
        index
            .upsert(vec![point(a1, a, 0, "preference", 1000)])
            .await
            .expect("re-upsert");
        index
            .upsert(vec![point(a1, a, 0, "preference", 1000)])
            .await
            .expect("re-upsert");
        assert_eq!(index.count(a).await.expect("count"), 4);
        let hits = index
            .search(a, &basis(0), &prefs, 10)
            .await
            .expect("search");
        assert_eq!(sorted(ids_of(&hits)), sorted(vec![a1, a2]));

        assert_eq!(
            sorted(index.ids(a).await.expect("ids a")),
            sorted(vec![a1, a2, a3, a4])
        );
        assert_eq!(index.ids(b).await.expect("ids b"), vec![b1]);

        // Bad input is rejected, not stored.
        let mut wrong_dim = point(new_memory(), a, 0, "fact", 1);
        wrong_dim.vector.push(1.0);
        assert!(matches!(
            index.upsert(vec![wrong_dim]).await,
            Err(IndexError::BadInput(_))
        ));
        let mut nan = point(new_memory(), a, 0, "fact", 1);
        nan.vector[1] = f32::NAN;
        assert!(matches!(
            index.upsert(vec![nan]).await,
            Err(IndexError::BadInput(_))
        ));
        assert!(matches!(
            index.search(a, &[1.0, 2.0], &all, 10).await,
            Err(IndexError::BadInput(_))
        ));
        assert_eq!(index.count(a).await.expect("count"), 4);

        // Delete by id; unknown ids are fine.
        index.delete(&[a2, new_memory()]).await.expect("delete");
        index.delete(&[]).await.expect("empty delete");
        assert_eq!(index.count(a).await.expect("count"), 3);
        let hits = index
            .search(a, &basis(1), &everything, 10)
            .await
            .expect("search");
        assert!(!ids_of(&hits).contains(&a2));

        index.flush().await.expect("flush");
        index.optimize().await.expect("optimize");
        assert_eq!(index.count(a).await.expect("count after optimize"), 3);

        // delete_user removes only that user's points.
        index.delete_user(a).await.expect("delete_user");
        assert_eq!(index.count(a).await.expect("count"), 0);
        assert!(index.ids(a).await.expect("ids").is_empty());
        assert!(
            index
                .search(a, &basis(0), &everything, 10)
                .await
                .expect("search")
                .is_empty()
        );
        assert_eq!(index.count(b).await.expect("count b"), 1);

        index.delete_user(b).await.expect("cleanup");
        index.flush().await.expect("flush");
    }
}

impl crate::error::HasKind for IndexError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            IndexError::Unavailable(_) => ErrorKind::Unavailable,
            IndexError::BadInput(_) => ErrorKind::BadRequest,
            IndexError::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsatisfiable_filters() {
        assert!(!VectorFilter::default().is_unsatisfiable());
        let empty_kinds = VectorFilter {
            kinds: Some(vec![]),
            ..VectorFilter::default()
        };
        assert!(empty_kinds.is_unsatisfiable());
        let empty_range = VectorFilter {
            since_ms: Some(5),
            until_ms: Some(5),
            ..VectorFilter::default()
        };
        assert!(empty_range.is_unsatisfiable());
        let range = VectorFilter {
            since_ms: Some(5),
            until_ms: Some(6),
            ..VectorFilter::default()
        };
        assert!(!range.is_unsatisfiable());
    }

    #[test]
    fn kind_conditions_take_the_shorter_form() {
        let of = |kinds: Option<Vec<&str>>| {
            VectorFilter {
                kinds: kinds.map(|k| k.into_iter().map(str::to_string).collect()),
                ..VectorFilter::default()
            }
            .kind_condition()
        };
        assert_eq!(of(None), KindCondition::Any);
        assert_eq!(
            of(Some(vec!["fact"])),
            KindCondition::OneOf(vec!["fact".into()])
        );
        let ordinary: Vec<&str> = MemoryKind::ordinary()
            .into_iter()
            .map(MemoryKind::as_str)
            .collect();
        assert_eq!(
            of(Some(ordinary)),
            KindCondition::NoneOf(vec!["document".into()])
        );
        let all: Vec<&str> = MemoryKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(of(Some(all)), KindCondition::Any);
        // An unknown kind cannot be turned into an exclusion.
        assert_eq!(
            of(Some(vec![
                "fact",
                "turn",
                "event",
                "profile",
                "conclusion",
                "nope"
            ])),
            KindCondition::OneOf(
                ["fact", "turn", "event", "profile", "conclusion", "nope"]
                    .map(String::from)
                    .to_vec()
            )
        );
    }

    #[test]
    fn vector_checks() {
        assert!(check_vector(&[1.0, 0.0], 2).is_ok());
        assert!(matches!(
            check_vector(&[1.0], 2),
            Err(IndexError::BadInput(_))
        ));
        assert!(matches!(
            check_vector(&[f32::INFINITY, 0.0], 2),
            Err(IndexError::BadInput(_))
        ));
        assert!(matches!(
            check_vector(&[0.0, 0.0], 2),
            Err(IndexError::BadInput(_))
        ));
        assert_eq!(IndexError::Unavailable("x".into()).label(), "unavailable");
    }
}
