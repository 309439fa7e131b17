//! Recall orchestration: embed the query; the vector and BM25 searches of both views (the
//! best BM25 rows read from SQL meanwhile) in parallel; fusion and ranking (`rank`, pure); the rows
//! re-read from SQL in fused order only while they can still reach the top k; access recorded
//! in the background.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::rank::{self, RecallMode, Recalled};
use super::{MemoryEngine, MemoryError, MemoryResult, elapsed_ms};
use crate::config::MemorySettings;
use crate::index::keyword::{InformativeWords, ViewHits};
use crate::index::vector::{VectorFilter, View};
use crate::store::{Memory, MemoryFilter, MemoryId, MemoryKind, Trust, UserId};

/// Rows read from SQL in the first round of a recall (then doubling): enough for the top k
/// in the common case, where the best fused hits are the final ones.
const HYDRATE_CHUNK_MIN: usize = 16;

/// A recall request (`recall_memory(query, k, kinds?, since?, until?)`).
#[derive(Debug, Clone, Default)]
pub struct RecallRequest {
    pub query: String,
    pub k: Option<usize>,
    pub kinds: Option<Vec<MemoryKind>>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub include_archived: bool,
    pub mode: RecallMode,
    /// Apply the decay multiplier (default on).
    pub decay: bool,
    /// Candidates per signal; defaults to `memory.candidates`.
    pub candidates: Option<usize>,
    /// Keep results the relevance gate and tail would drop (each still carries its
    /// `signals.relevance`): for callers that draw their own line, such as `forget`.
    pub keep_irrelevant: bool,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecallTimings {
    /// Embedding the query.
    pub embed_ms: f64,
    /// The vector searches alone (both views; they run alongside the keyword searches).
    pub vector_ms: f64,
    /// The BM25 search alone.
    pub keyword_ms: f64,
    /// Re-reading the candidates from SQL after fusion. The rows of the best keyword hits
    /// are read while the vector search still runs and are not counted here.
    pub hydrate_ms: f64,
    /// Fusion, decay, near-duplicate removal.
    pub rank_ms: f64,
    /// Everything but the query embedding.
    pub search_ms: f64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecallResponse {
    pub results: Vec<Recalled>,
    pub timings: RecallTimings,
}

/// What a recall will search and read: worked out from the request before any search.
struct Plan {
    k: usize,
    /// Candidates per signal.
    candidates: usize,
    /// Rows read in the first round after fusion.
    first_chunk: usize,
    /// The indexes' filter and SQL's (the truth) for the same request.
    filter: VectorFilter,
    sql_filter: MemoryFilter,
    /// The ablation's raw-cosine gate and floor apply (`memory.fusion`).
    gated: bool,
}

impl Plan {
    fn new(request: &RecallRequest, settings: &MemorySettings, k: usize) -> Self {
        let candidates = request
            .candidates
            .unwrap_or(settings.candidates)
            .max(k)
            .min(1000);
        // No kinds asked for means the ordinary ones but the profile: document chunks and the
        // profile only when asked.
        let kinds = request.kinds.clone().unwrap_or_else(MemoryKind::recalled);
        let filter = VectorFilter {
            kinds: Some(kinds.iter().map(|kind| kind.as_str().to_string()).collect()),
            since_ms: request.since.map(|time| time.timestamp_millis()),
            // The index filter's upper bound is exclusive; ours is inclusive.
            until_ms: request.until.map(|time| time.timestamp_millis() + 1),
            include_archived: request.include_archived,
            include_invalid: false,
        };
        let sql_filter = MemoryFilter {
            kinds: Some(kinds),
            since: request.since,
            until: request.until,
            include_archived: request.include_archived,
            include_invalid: false,
            trusts: None,
            thread: None,
        };
        // The product's recall (hybrid) decides relevance: it needs the keyword coverage, and
        // answers content-free queries with nothing. The raw-cosine gate and floor of
        // `memory.fusion` apply only when set (ablations).
        let fusion = &settings.fusion;
        let gated = request.mode == RecallMode::Hybrid
            && [
                fusion.gate_cosine.unwrap_or(0.0),
                fusion.gate_coverage,
                fusion.floor_cosine.unwrap_or(0.0),
                fusion.floor_coverage,
            ]
            .iter()
            .any(|threshold| *threshold > 0.0);
        Self {
            k,
            candidates,
            first_chunk: (2 * k).max(HYDRATE_CHUNK_MIN),
            filter,
            sql_filter,
            gated,
        }
    }
}

/// Every signal's list, with the rows read ahead and the time each search took.
struct Found {
    vector: Vec<(MemoryId, f32)>,
    vector_context: Vec<(MemoryId, f32)>,
    keyword: ViewHits,
    keyword_context: ViewHits,
    /// Rows of the best keyword hits, read while the vector search ran.
    prefetched: Vec<Memory>,
    embed_ms: f64,
    vector_ms: f64,
    keyword_ms: f64,
    /// The query's vector (none in a keyword-only recall).
    query_vector: Option<Vec<f32>>,
}

impl MemoryEngine {
    pub async fn recall(
        &self,
        user: UserId,
        request: RecallRequest,
    ) -> MemoryResult<RecallResponse> {
        self.recall_with(user, request, &self.settings, Utc::now(), true)
            .await
    }

    /// `recall` replayed at a fixed clock `now`, ranked with `settings` instead of the
    /// engine's, and recording no access. Evaluations use it: decay is computed against the
    /// dataset's timeline (and not disturbed by the evaluation's own reads), one index can be
    /// ranked with several fusion constants, and reruns give the same results.
    pub async fn recall_at(
        &self,
        user: UserId,
        request: RecallRequest,
        settings: &MemorySettings,
        now: DateTime<Utc>,
    ) -> MemoryResult<RecallResponse> {
        self.recall_with(user, request, settings, now, false).await
    }

    /// The product's recall in named steps: check the request; answer a content-free query
    /// with nothing; [`search`](Self::search) every signal's list; fuse the lists (`rank`);
    /// [`read_in_order`](Self::read_in_order) the rows from SQL as far as they can reach the
    /// top k; [`judge`](Self::judge) each result's relevance, reorder and gate; record access.
    async fn recall_with(
        &self,
        user: UserId,
        request: RecallRequest,
        settings: &MemorySettings,
        now: DateTime<Utc>,
        record_access: bool,
    ) -> MemoryResult<RecallResponse> {
        let started = Instant::now();
        let query = request.query.trim();
        if query.is_empty() {
            return Err(MemoryError::BadRequest("query must not be empty".into()));
        }
        let k = request.k.unwrap_or(settings.default_k);
        if k == 0 || k > settings.max_k {
            return Err(MemoryError::BadRequest(format!(
                "k must be between 1 and {}",
                settings.max_k
            )));
        }
        // A greeting or thanks ("hello", "你好", "thanks!") is about nothing: the gate answers
        // it before any search, whatever the model's cosines (e5 puts a short Chinese greeting
        // at 0.85 from a short Chinese statement, above its gate).
        let hybrid = request.mode == RecallMode::Hybrid;
        if hybrid && !request.keep_irrelevant && super::extract::content_free(query) {
            let total_ms = elapsed_ms(started);
            return Ok(RecallResponse {
                results: Vec::new(),
                timings: RecallTimings {
                    embed_ms: 0.0,
                    vector_ms: 0.0,
                    keyword_ms: 0.0,
                    hydrate_ms: 0.0,
                    rank_ms: 0.0,
                    search_ms: total_ms,
                    total_ms,
                },
            });
        }
        // "Updates first" reorders within the first `default_k` results whatever k is asked,
        // so a longer list starts with what a default one returns.
        let ranked = if settings.updates_first {
            k.max(settings.default_k)
        } else {
            k
        };
        let plan = Plan::new(&request, settings, ranked);
        let found = self.search(user, query, &request, settings, &plan).await?;
        let lists = rank::Lists {
            vector: &found.vector,
            keyword: &found.keyword.hits,
            vector_context: &found.vector_context,
            keyword_context: &found.keyword_context.hits,
            keyword_coverage: &found.keyword.coverage,
            keyword_context_coverage: &found.keyword_context.coverage,
            requested: plan.candidates,
            gated: plan.gated,
        };
        let fused = rank::fuse_lists(&lists, &settings.fusion, settings.rrf_k);
        let hints = rank::QueryHints {
            span: super::when::span(query, now),
            speaker: if settings.speaker_boost != 1.0 {
                self.speaker_named_in(user, query).await?
            } else {
                None
            },
            user_speaks: settings.user_boost != 1.0 && super::cues::asks_about_the_user(query),
        };
        let select_started = Instant::now();
        let (mut results, hydrate_ms) = self
            .read_in_order(
                user,
                &plan,
                &fused,
                found.prefetched,
                settings,
                request.decay,
                now,
                &hints,
            )
            .await?;
        if let Some(vector) = found.query_vector {
            self.judge(query, vector, &request, settings, &mut results);
        }
        results.truncate(k);
        let rank_ms = elapsed_ms(select_started) - hydrate_ms;
        let recalled: Vec<MemoryId> = results.iter().map(|r| r.memory.id).collect();
        if record_access && !recalled.is_empty() {
            let _ = self.access.send((user, recalled, crate::store::now()));
        }
        let total_ms = elapsed_ms(started);
        metrics::histogram!("mnemo_recall_duration_seconds").record(total_ms / 1000.0);
        Ok(RecallResponse {
            results,
            timings: RecallTimings {
                embed_ms: found.embed_ms,
                vector_ms: found.vector_ms,
                keyword_ms: found.keyword_ms,
                hydrate_ms,
                rank_ms,
                search_ms: total_ms - found.embed_ms,
                total_ms,
            },
        })
    }

    /// The searches of a recall, run together: the query embedded, then the vector search of
    /// both views; the BM25 search of both views (their coverage of the query's informative
    /// words worked out once), then the rows of the best keyword hits read from SQL while the
    /// vector side still runs.
    async fn search(
        &self,
        user: UserId,
        query: &str,
        request: &RecallRequest,
        settings: &MemorySettings,
        plan: &Plan,
    ) -> MemoryResult<Found> {
        let fusion = &settings.fusion;
        let filter = &plan.filter;
        let candidates = plan.candidates;
        let use_vector = request.mode != RecallMode::Keyword;
        let use_keyword = request.mode != RecallMode::Vector;
        // A user without turns has no context views: their context view is the own view
        // again, so its keyword hits are the own view's and its vector view is empty.
        // One indexer for the whole recall, even if another takes over meanwhile.
        let indexer = self.indexer();
        let context_views = indexer.has_context_views(user).await?;
        let wants_context_keyword = use_keyword && fusion.context_bm25_weight > 0.0;
        let use_context_keyword = wants_context_keyword && context_views;
        // Coverage feeds relevance (and the legacy gate and floor); a search by one signal
        // alone (an ablation, a diagnostic) keeps what it finds.
        let informative = (request.mode == RecallMode::Hybrid).then(InformativeWords::default);
        let indexer = &indexer;
        let context_keyword_search = async {
            if !use_context_keyword {
                return Ok::<_, MemoryError>(ViewHits::default());
            }
            Ok(indexer
                .keyword_search_view(
                    user,
                    query.to_string(),
                    View::Context,
                    filter.clone(),
                    candidates,
                    informative.clone(),
                )
                .await?)
        };
        let keyword_search = async {
            if !use_keyword {
                return Ok((ViewHits::default(), 0.0, Vec::new()));
            }
            let started = Instant::now();
            let hits = indexer
                .keyword_search_view(
                    user,
                    query.to_string(),
                    View::Own,
                    filter.clone(),
                    candidates,
                    informative.clone(),
                )
                .await?;
            let keyword_ms = elapsed_ms(started);
            // The vector side (embedding the query, then searching) takes longer: read the
            // rows of the best keyword hits meanwhile, as the first reading round after
            // fusion will want most of them.
            let prefetched = if use_vector && !hits.hits.is_empty() {
                let ids: Vec<MemoryId> = hits
                    .hits
                    .iter()
                    .take(plan.first_chunk)
                    .map(|(id, _)| *id)
                    .collect();
                self.store.user(user).memories_by_ids(&ids).await?
            } else {
                Vec::new()
            };
            Ok::<_, MemoryError>((hits, keyword_ms, prefetched))
        };
        let vector_search = async {
            if !use_vector {
                return Ok::<_, MemoryError>((Vec::new(), Vec::new(), 0.0, 0.0, None));
            }
            let embed_started = Instant::now();
            let vector = self.embedder.embed_query(query).await?;
            let embed_ms = elapsed_ms(embed_started);
            let search_started = Instant::now();
            let index = indexer.vector();
            let context_search = async {
                if fusion.context_vector_weight <= 0.0 || !context_views {
                    return Ok(Vec::new());
                }
                index
                    .search_view(user, View::Context, &vector, filter, candidates)
                    .await
            };
            let (own, context) = tokio::join!(
                index.search(user, &vector, filter, candidates),
                context_search
            );
            Ok((
                own?,
                context?,
                embed_ms,
                elapsed_ms(search_started),
                Some(vector),
            ))
        };
        let (keyword_result, context_keyword_result, vector_result) =
            tokio::join!(keyword_search, context_keyword_search, vector_search);
        let (vector, vector_context, embed_ms, vector_ms, query_vector) = vector_result?;
        let (keyword, keyword_ms, prefetched) = keyword_result?;
        let mut keyword_context = context_keyword_result?;
        if wants_context_keyword && !context_views {
            keyword_context = keyword.clone();
        }
        Ok(Found {
            vector,
            vector_context,
            keyword,
            keyword_context,
            prefetched,
            embed_ms,
            vector_ms,
            keyword_ms,
            query_vector,
        })
    }

    /// The fused candidates' rows, re-read for this user and re-checked against the filter
    /// (SQL is the truth), in fused order and only as far as they can still change the top
    /// k; scored with decay and the query's hints. Returns the results and the time spent
    /// reading rows (ms).
    #[allow(clippy::too_many_arguments)]
    async fn read_in_order(
        &self,
        user: UserId,
        plan: &Plan,
        fused: &[rank::Candidate],
        prefetched: Vec<Memory>,
        settings: &MemorySettings,
        decay: bool,
        now: DateTime<Utc>,
        hints: &rank::QueryHints,
    ) -> MemoryResult<(Vec<Recalled>, f64)> {
        let hydrate_ns = AtomicU64::new(0);
        let mut prefetched: std::collections::HashMap<MemoryId, Memory> = prefetched
            .into_iter()
            .map(|memory| (memory.id, memory))
            .collect();
        let (results, _) = rank::select_reading(
            fused,
            settings,
            decay,
            now,
            hints,
            plan.k,
            plan.first_chunk,
            |ids| {
                let started = Instant::now();
                let mut rows = Vec::with_capacity(ids.len());
                let mut missing = Vec::new();
                for id in ids {
                    match prefetched.remove(&id) {
                        Some(memory) => rows.push(memory),
                        None => missing.push(id),
                    }
                }
                let store = &self.store;
                let sql_filter = &plan.sql_filter;
                let hydrate_ns = &hydrate_ns;
                async move {
                    if !missing.is_empty() {
                        rows.extend(store.user(user).memories_by_ids(&missing).await?);
                    }
                    hydrate_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    Ok::<_, MemoryError>(
                        rows.into_iter()
                            .filter(|memory| sql_filter.admits(memory))
                            .collect(),
                    )
                }
            },
        )
        .await?;
        Ok((results, hydrate_ns.into_inner() as f64 / 1e6))
    }

    /// Lifts each of the user's turns that says a value changed
    /// (`cues::states_a_changed_value`) right above the user's earlier turn with a number
    /// that it updates, and marks that one (`signals.later`): "improved to 250 ms" comes
    /// before the "150 ms" it updates. It updates the one closest to it (cosine of their
    /// vectors) among the earlier ones ranked above it, when it is also the closest to that
    /// one among the later changes in the results: a pair, not just a neighbour. News ("I
    /// recently went hiking") is not an update, nor is the assistant restating a value.
    /// Closest is a rank among the results, not a threshold, so it means the same for every
    /// model. Only the order changes (the caller passes the first `memory.default_k`).
    fn updates_first(results: &mut [Recalled]) {
        let mut changes: Vec<bool> = results
            .iter()
            .map(|r| {
                r.memory.kind == MemoryKind::Turn
                    && r.memory.trust == Trust::User
                    && !r.memory.embedding.is_empty()
                    && super::cues::states_a_changed_value(&r.memory.content)
            })
            .collect();
        let closest =
            |results: &[Recalled], to: &Memory, among: &mut dyn Iterator<Item = usize>| {
                among
                    .filter(|&at| results[at].memory.embedding.len() == to.embedding.len())
                    .map(|at| {
                        let similarity =
                            super::relevance::cosine(&results[at].memory.embedding, &to.embedding);
                        (at, similarity)
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(at, _)| at)
            };
        for j in 1..results.len() {
            if !changes[j] {
                continue;
            }
            let newer = &results[j].memory;
            let Some(i) = closest(
                results,
                newer,
                &mut (0..j).filter(|&i| {
                    let older = &results[i].memory;
                    older.kind == MemoryKind::Turn
                        && older.trust == Trust::User
                        && older.created_at < newer.created_at
                        && super::cues::names_a_value(&older.content)
                }),
            ) else {
                continue;
            };
            let older = &results[i].memory;
            let paired = closest(
                results,
                older,
                &mut (0..results.len())
                    .filter(|&at| changes[at] && results[at].memory.created_at > older.created_at),
            );
            if paired != Some(j) {
                continue;
            }
            let newer_id = newer.id;
            let score = results[i].score;
            results[i].signals.later = Some(newer_id);
            results[i..=j].rotate_right(1);
            changes[i..=j].rotate_right(1);
            results[i].score = results[i].score.max(score);
        }
    }

    /// Every result says how likely it is about the query; in the product's recall (hybrid)
    /// relevance also reorders the results, nothing is returned unless one is likely enough,
    /// and the list stops where relevance drops (`memory.relevance`).
    fn judge(
        &self,
        query: &str,
        vector: Vec<f32>,
        request: &RecallRequest,
        settings: &MemorySettings,
        results: &mut Vec<Recalled>,
    ) {
        let profile = self.relevance.profile(query, vector);
        for result in results.iter_mut() {
            let closest = [
                Some(super::relevance::cosine(
                    profile.vector(),
                    &result.memory.embedding,
                )),
                result.signals.context_vector_score,
            ]
            .into_iter()
            .flatten()
            .fold(f32::MIN, f32::max);
            let turn = result.memory.kind == MemoryKind::Turn;
            let coverage = f64::from(result.signals.coverage);
            result.signals.z = Some(profile.z(closest));
            result.signals.relevance =
                Some(self.relevance.score(&profile, closest, coverage, turn));
        }
        if request.mode != RecallMode::Hybrid {
            return;
        }
        // Relevance ranks too: each score is weighed by its probability.
        let weight = settings.relevance.rank_weight;
        if weight > 0.0 {
            for result in results.iter_mut() {
                let p = result.signals.relevance.unwrap_or(0.0).max(1e-6);
                result.score *= p.powf(weight);
            }
            results.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then_with(|| b.memory.id.cmp(&a.memory.id))
            });
        }
        if settings.updates_first {
            let window = results.len().min(settings.default_k);
            Self::updates_first(&mut results[..window]);
        }
        if !request.keep_irrelevant {
            let points = &settings.relevance;
            let best = results
                .iter()
                .filter_map(|result| result.signals.relevance)
                .fold(0.0, f64::max);
            if best < points.gate {
                results.clear();
            }
            results.retain(|result| {
                result
                    .signals
                    .relevance
                    .is_some_and(|relevance| relevance >= points.tail)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Signals;

    fn turn(text: &str, trust: Trust, day: i64, embedding: Vec<f32>, score: f64) -> Recalled {
        let mut memory = super::super::rank::tests::memory(text, 2, embedding, 0);
        memory.kind = MemoryKind::Turn;
        memory.trust = trust;
        memory.created_at = DateTime::UNIX_EPOCH + chrono::Duration::days(19_800 + day);
        Recalled {
            memory,
            score,
            signals: Signals::fused(score),
        }
    }

    /// A user's turn saying a value changed moves right above the user's earlier turn
    /// closest to it, which is marked; a change said before the turns above it, the
    /// assistant's turns and news without a value stay where they are.
    #[test]
    fn a_later_turn_that_states_a_change_comes_before_the_turn_it_updates() {
        let mut results = vec![
            turn(
                "Ann: my sprint deadline is April 1",
                Trust::User,
                0,
                vec![1.0, 0.0, 0.0],
                0.9,
            ),
            turn(
                "Bot: here is a plan for April 1",
                Trust::Assistant,
                0,
                vec![0.9, 0.1, 0.0],
                0.8,
            ),
            turn(
                "Ann: I plan 3 sprints on a Trello board",
                Trust::User,
                1,
                vec![0.0, 1.0, 0.0],
                0.7,
            ),
            turn(
                "Ann: the deadline moved to April 5",
                Trust::User,
                2,
                vec![0.95, 0.05, 0.0],
                0.6,
            ),
            turn(
                "Ann: now I plan 4 sprints in Notion",
                Trust::User,
                3,
                vec![0.0, 0.9, 0.1],
                0.5,
            ),
            turn(
                "Bot: no longer April 1, then",
                Trust::Assistant,
                0,
                vec![0.9, 0.0, 0.1],
                0.4,
            ),
            turn(
                "Ann: I recently adopted 2 cats",
                Trust::User,
                -5,
                vec![0.0, 0.0, 1.0],
                0.3,
            ),
        ];
        // News is not an update: no number in it.
        results.push(turn(
            "Ann: I recently went hiking",
            Trust::User,
            9,
            vec![1.0, 0.0, 0.0],
            0.2,
        ));
        let ids: Vec<MemoryId> = results.iter().map(|r| r.memory.id).collect();
        MemoryEngine::updates_first(&mut results);
        let order: Vec<&str> = results.iter().map(|r| r.memory.content.as_str()).collect();
        assert_eq!(
            order,
            [
                "Ann: the deadline moved to April 5",
                "Ann: my sprint deadline is April 1",
                "Bot: here is a plan for April 1",
                "Ann: now I plan 4 sprints in Notion",
                "Ann: I plan 3 sprints on a Trello board",
                "Bot: no longer April 1, then",
                "Ann: I recently adopted 2 cats",
                "Ann: I recently went hiking",
            ]
        );
        assert_eq!(results[1].signals.later, Some(ids[3]));
        assert_eq!(results[4].signals.later, Some(ids[4]));
        assert_eq!(results[2].signals.later, None, "the same day is not later");
        assert!(
            results
                .windows(2)
                .all(|pair| pair[0].score >= pair[1].score),
            "scores stay in order"
        );
    }
}
