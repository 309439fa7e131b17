//! Hybrid recall: vector top-N and BM25 top-N in parallel → union → Reciprocal Rank Fusion →
//! bounded decay multiplier → near-duplicate removal → top-k with per-signal details.
//! The pure ranking step (`rank`) does no I/O and is table-tested.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{FusionMethod, FusionSettings, MemorySettings};
use crate::index::decay::decay_factor;
use crate::memory::when::Span;
use crate::store::{Memory, MemoryId, MemoryKind, Trust};

/// Which signals take part: both (hybrid) or one alone (for ablations and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecallMode {
    #[default]
    Hybrid,
    Vector,
    Keyword,
}

pub(crate) use crate::store::Signals;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Recalled {
    pub memory: Memory,
    pub score: f64,
    pub signals: Signals,
}

/// What a query says beyond its words: the span of time it names, and the one speaker it
/// names — by name, or the user, by a query in the first person ("what did I mention…", "my
/// budget"). Each lifts matching memories
/// (`memory.time_boost`, `memory.speaker_boost`, `memory.user_boost`).
#[derive(Debug, Clone, Default)]
pub(crate) struct QueryHints {
    pub span: Option<Span>,
    pub speaker: Option<String>,
    /// The query asks about the user in the first person: the user's own memories (user
    /// trust) are lifted.
    pub user_speaks: bool,
}

impl QueryHints {
    /// The product of the priors for `memory`: time span, speaker, question turns, length.
    fn factor(&self, memory: &Memory, settings: &MemorySettings) -> f64 {
        let mut factor = 1.0;
        if let Some(span) = &self.span {
            let slack = chrono::Duration::days(settings.time_slack_days.max(0));
            if span.start - slack <= memory.created_at && memory.created_at < span.end + slack {
                factor *= settings.time_boost;
            }
        }
        if self.user_speaks && self.speaker.is_none() && memory.trust == Trust::User {
            factor *= settings.user_boost;
        }
        if memory.kind != MemoryKind::Turn {
            return factor;
        }
        let (speaker, text) = match memory.content.split_once(": ") {
            Some((speaker, text)) if !speaker.contains('\n') && speaker.len() <= 100 => {
                (Some(speaker), text)
            }
            _ => (None, memory.content.as_str()),
        };
        if let (Some(named), Some(speaker)) = (&self.speaker, speaker)
            && named.eq_ignore_ascii_case(speaker)
        {
            factor *= settings.speaker_boost;
        }
        if text.trim_end().ends_with('?') {
            factor *= settings.question_factor;
        }
        if settings.length_prior > 0.0 && settings.length_prior_words > 0 {
            let words = text
                .split_whitespace()
                .count()
                .min(settings.length_prior_words);
            factor *=
                (words as f64 / settings.length_prior_words as f64).powf(settings.length_prior);
        }
        factor
    }

    /// The largest factor any memory can get, for the early stop of `select_reading`.
    fn ceiling(&self, settings: &MemorySettings) -> f64 {
        let time = if self.span.is_some() {
            settings.time_boost.max(1.0)
        } else {
            1.0
        };
        let speaker = if self.speaker.is_some() {
            settings.speaker_boost.max(1.0)
        } else if self.user_speaks {
            settings.user_boost.max(1.0)
        } else {
            1.0
        };
        time * speaker * settings.question_factor.max(1.0)
    }
}

/// A fused hit before its row is read: its fused score and where each signal ranked it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub id: MemoryId,
    /// The fused score.
    pub rrf: f64,
    /// Rank (from 1) and cosine in the own view's vector list.
    pub vector: Option<(usize, f32)>,
    /// Rank (from 1) and BM25 score in the own view's keyword list.
    pub keyword: Option<(usize, f32)>,
    /// The same in the context view's lists.
    pub vector_context: Option<(usize, f32)>,
    pub keyword_context: Option<(usize, f32)>,
    /// Found by a list with a positive weight (min-max gives the last of a list 0).
    pub found: bool,
    /// The larger of its BM25 hits' coverage of the query (see `ViewHits::coverage`).
    pub coverage: f32,
    /// What the context view's vector list would add if the memory is not a turn: such a
    /// memory is its own context, so its own cosine stands in for the context one it was
    /// never given (only turns have context vectors). Known once the row is read;
    /// `rrf + fill` bounds the fused score until then.
    pub fill: f64,
}

impl Candidate {
    /// A hit no list has ranked yet. (Not `Default`: a default `MemoryId` is a fresh v7 id,
    /// which reads the clock and the random generator for every hit of every recall.)
    fn new(id: MemoryId) -> Self {
        Candidate {
            id,
            rrf: 0.0,
            vector: None,
            keyword: None,
            vector_context: None,
            keyword_context: None,
            found: false,
            coverage: 0.0,
            fill: 0.0,
        }
    }

    /// The fused score once the row says what the memory is.
    fn fused(&self, memory: &Memory) -> f64 {
        if memory.kind == MemoryKind::Turn {
            self.rrf
        } else {
            self.rrf + self.fill
        }
    }

    /// The most the fused score can be before the row is read.
    fn bound(&self) -> f64 {
        self.rrf + self.fill
    }
}

/// The hit lists of one recall, best first, one per signal; any may be empty.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Lists<'a> {
    pub vector: &'a [(MemoryId, f32)],
    pub keyword: &'a [(MemoryId, f32)],
    pub vector_context: &'a [(MemoryId, f32)],
    pub keyword_context: &'a [(MemoryId, f32)],
    /// The BM25 hits' coverage of the query, one per hit of `keyword` and of
    /// `keyword_context` (a hit without one covers nothing).
    pub keyword_coverage: &'a [f32],
    pub keyword_context_coverage: &'a [f32],
    /// Apply the query gate and the relevance floor (`FusionSettings`).
    pub gated: bool,
    /// How many hits each search was asked for: a BM25 list that came back shorter holds
    /// every memory sharing a term with the query, and is normalised from 0 (its only hit
    /// gets full weight, not none).
    pub requested: usize,
}

impl<'a> Lists<'a> {
    /// The own views' lists only.
    #[cfg(test)]
    pub(crate) fn own(vector: &'a [(MemoryId, f32)], keyword: &'a [(MemoryId, f32)]) -> Self {
        Self {
            vector,
            keyword,
            ..Self::default()
        }
    }

    fn each(&self) -> [&'a [(MemoryId, f32)]; 4] {
        [
            self.vector,
            self.keyword,
            self.vector_context,
            self.keyword_context,
        ]
    }
}

/// Fuses the own views' two lists by Reciprocal Rank Fusion with constant `rrf_k`.
#[cfg(test)]
pub(crate) fn fuse(
    vector_hits: &[(MemoryId, f32)],
    keyword_hits: &[(MemoryId, f32)],
    rrf_k: f64,
) -> Vec<Candidate> {
    let fusion = FusionSettings {
        method: FusionMethod::Rrf,
        context_vector_weight: 0.0,
        context_bm25_weight: 0.0,
        ..FusionSettings::default()
    };
    fuse_lists(&Lists::own(vector_hits, keyword_hits), &fusion, rrf_k)
}

/// Fuses every signal's list into one order, best first: weighted Reciprocal Rank Fusion
/// (`Σ w / (k + rank)`), or the weighted sum of each list's scores divided by its best score
/// or min-max normalised over the list. Ranks and scores come from the index's lists, so the
/// order is known before any row is read; a hit whose row turns out to be gone (an index
/// lagging a delete by milliseconds) is dropped later but keeps its slot. When the lists
/// carry coverage, the query gate may return nothing at all, and candidates below the
/// relevance floor are left out (`FusionSettings`).
pub(crate) fn fuse_lists(lists: &Lists<'_>, fusion: &FusionSettings, rrf_k: f64) -> Vec<Candidate> {
    let weights = [
        fusion.vector_weight,
        fusion.bm25_weight,
        fusion.context_vector_weight,
        fusion.context_bm25_weight,
    ];
    let mut by_id: HashMap<MemoryId, Candidate> = HashMap::new();
    for (signal, (list, weight)) in lists.each().into_iter().zip(weights).enumerate() {
        let scores = list.iter().map(|(_, score)| f64::from(*score));
        let best = scores.clone().fold(f64::NEG_INFINITY, f64::max);
        let mut worst = scores.fold(f64::INFINITY, f64::min);
        let keyword = matches!(signal, 1 | 3);
        if keyword && list.len() < lists.requested {
            worst = worst.min(0.0);
        }
        let coverage = match signal {
            1 => lists.keyword_coverage,
            3 => lists.keyword_context_coverage,
            _ => &[],
        };
        let mut seen = std::collections::HashSet::with_capacity(list.len());
        for (index, (id, score)) in list.iter().enumerate() {
            if !seen.insert(*id) {
                continue;
            }
            let rank = index + 1;
            let score64 = f64::from(*score);
            let candidate = by_id.entry(*id).or_insert_with(|| Candidate::new(*id));
            let slot = match signal {
                0 => &mut candidate.vector,
                1 => &mut candidate.keyword,
                2 => &mut candidate.vector_context,
                _ => &mut candidate.keyword_context,
            };
            *slot = Some((rank, *score));
            let covered = coverage.get(index).copied();
            if let Some(covered) = covered {
                candidate.coverage = candidate.coverage.max(covered);
            }
            if weight <= 0.0 {
                continue;
            }
            candidate.found = true;
            // A BM25 hit on none of the query's informative words is no evidence.
            let share = match covered {
                Some(covered) if fusion.bm25_needs_coverage && covered <= 0.0 => 0.0,
                _ => 1.0,
            };
            candidate.rrf += weight
                * share
                * match fusion.method {
                    FusionMethod::Rrf => 1.0 / (rrf_k.max(0.0) + rank as f64),
                    FusionMethod::Score if best > 0.0 => score64.max(0.0) / best,
                    FusionMethod::Score => 0.0,
                    // A list of one (or of equal scores) gives its hits full weight.
                    FusionMethod::MinMax if best > worst => (score64 - worst) / (best - worst),
                    FusionMethod::MinMax => 1.0,
                };
        }
    }
    if fusion.context_vector_weight > 0.0 {
        // The list such memories would have been in: the context view's hits, and the own
        // scores of the own view's hits missing there (with no turns at all, the own list).
        let in_context: std::collections::HashSet<MemoryId> =
            lists.vector_context.iter().map(|(id, _)| *id).collect();
        let reference: Vec<f32> = lists
            .vector_context
            .iter()
            .map(|(_, score)| *score)
            .chain(
                lists
                    .vector
                    .iter()
                    .filter(|(id, _)| !in_context.contains(id))
                    .map(|(_, score)| *score),
            )
            .collect();
        for candidate in by_id.values_mut() {
            if let (None, Some((_, own))) = (candidate.vector_context, candidate.vector) {
                candidate.fill =
                    fusion.context_vector_weight * placed(&reference, own, fusion.method, rrf_k);
                candidate.found |= candidate.fill > 0.0;
            }
        }
    }
    let passes = |candidate: &Candidate, cosine: f64, coverage: f64| {
        !lists.gated
            || candidate_cosine(candidate) >= cosine
            || f64::from(candidate.coverage) >= coverage
    };
    if !by_id
        .values()
        .any(|candidate| passes(candidate, fusion.gate_cosine(), fusion.gate_coverage))
    {
        // Nothing the query is about: no candidate is close enough in meaning or words.
        return Vec::new();
    }
    let mut fused: Vec<Candidate> = by_id
        .into_values()
        .filter(|candidate| {
            candidate.found && passes(candidate, fusion.floor_cosine(), fusion.floor_coverage)
        })
        .collect();
    fused.sort_by(|a, b| {
        b.bound()
            .total_cmp(&a.bound())
            .then_with(|| a.id.cmp(&b.id))
    });
    fused
}

/// The unweighted contribution a hit scoring `score` would have made in a list of `scores`
/// (one of them its own): by the rank it would have taken, or its score against the list's.
fn placed(scores: &[f32], score: f32, method: FusionMethod, rrf_k: f64) -> f64 {
    let all = scores.iter().map(|score| f64::from(*score));
    let best = all.clone().fold(f64::NEG_INFINITY, f64::max);
    let worst = all.fold(f64::INFINITY, f64::min);
    let score = f64::from(score);
    match method {
        FusionMethod::Rrf => {
            let rank = 1 + scores.iter().filter(|s| f64::from(**s) > score).count();
            1.0 / (rrf_k.max(0.0) + rank as f64)
        }
        FusionMethod::Score if best > 0.0 => score.max(0.0) / best,
        FusionMethod::Score => 0.0,
        FusionMethod::MinMax if best > worst => ((score - worst) / (best - worst)).clamp(0.0, 1.0),
        FusionMethod::MinMax => 1.0,
    }
}

/// The candidate's closer vector view to the query (0 when no vector list holds it).
fn candidate_cosine(candidate: &Candidate) -> f64 {
    [candidate.vector, candidate.vector_context]
        .into_iter()
        .flatten()
        .map(|(_, score)| f64::from(score))
        .fold(0.0, f64::max)
}

/// Scores the candidates whose rows are in `memories` (read for the user and checked
/// against the request's filters; the others are skipped), applies decay at `now`, removes
/// near-duplicates and keeps the best `k`.
pub(crate) fn select(
    candidates: &[Candidate],
    memories: &HashMap<MemoryId, Memory>,
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
    query: &QueryHints,
    k: usize,
) -> Vec<Recalled> {
    let mut scored: Vec<(f64, [f64; 3], &Candidate, &Memory)> = candidates
        .iter()
        .filter_map(|candidate| {
            let memory = memories.get(&candidate.id)?;
            let factor = if decay {
                decay_factor(
                    memory.importance,
                    memory.last_activity().timestamp_millis(),
                    now.timestamp_millis(),
                    settings.decay_half_life_days,
                    settings.decay_floor,
                )
            } else {
                1.0
            };
            let trust = if memory.trust == Trust::User {
                1.0
            } else {
                settings.assistant_weight
            };
            let prior = query.factor(memory, settings);
            Some((
                candidate.fused(memory) * factor * trust * prior,
                [factor, trust, prior],
                candidate,
                memory,
            ))
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.3.id.cmp(&a.3.id)));
    let mut kept: Vec<Recalled> = Vec::with_capacity(k);
    // The normalised text of each kept memory, computed once (every candidate is compared
    // with every kept one).
    let mut kept_texts: Vec<String> = Vec::with_capacity(k);
    // The messages the kept memories came from: a memory from messages already there (a
    // second part of one long message, the fact a kept turn said) waits until the distinct
    // ones run out.
    let mut sources: HashSet<&str> = HashSet::new();
    let mut waiting = Vec::new();
    let mut pending = scored.into_iter();
    loop {
        let next = match pending.next() {
            Some(next) => next,
            None if waiting.is_empty() => break,
            None => {
                pending = std::mem::take(&mut waiting).into_iter();
                sources.clear();
                continue;
            }
        };
        if kept.len() == k {
            break;
        }
        let (score, [factor, trust, prior], candidate, memory) = next;
        if settings.one_per_source
            && !memory.source_refs.is_empty()
            && memory
                .source_refs
                .iter()
                .all(|id| sources.contains(id.as_str()))
        {
            waiting.push(next);
            continue;
        }
        let text = normalise(&memory.content);
        let duplicate = kept.iter().zip(&kept_texts).any(|(chosen, chosen_text)| {
            *chosen_text == text || similar_vectors(&chosen.memory, memory, settings.dedupe_cosine)
        });
        if !duplicate {
            sources.extend(memory.source_refs.iter().map(String::as_str));
            kept_texts.push(text);
            kept.push(Recalled {
                memory: memory.clone(),
                score,
                signals: Signals {
                    vector_rank: candidate.vector.map(|(rank, _)| rank),
                    vector_score: candidate.vector.map(|(_, score)| score),
                    bm25_rank: candidate.keyword.map(|(rank, _)| rank),
                    bm25_score: candidate.keyword.map(|(_, score)| score),
                    context_vector_rank: candidate.vector_context.map(|(rank, _)| rank),
                    context_vector_score: candidate.vector_context.map(|(_, score)| score),
                    context_bm25_rank: candidate.keyword_context.map(|(rank, _)| rank),
                    context_bm25_score: candidate.keyword_context.map(|(_, score)| score),
                    rrf: candidate.fused(memory),
                    decay: factor,
                    trust,
                    prior,
                    coverage: candidate.coverage,
                    z: None,
                    relevance: None,
                    later: None,
                },
            });
        }
    }
    kept
}

/// True when reading more rows cannot change `kept`: every score is the fused score times
/// factors of at most `ceiling` (decay and trust are at most 1; the time boost may be more),
/// so a candidate not yet read (candidates are in fused order) scores at most its fused score
/// × `ceiling`, and once that is below the k-th kept score it would sort after everything kept.
/// With `one_per_source`, not while a kept memory repeats a source ([`repeats_a_source`]).
pub(crate) fn settled(
    kept: &[Recalled],
    k: usize,
    next_unread: Option<&Candidate>,
    ceiling: f64,
    one_per_source: bool,
) -> bool {
    match next_unread {
        None => true,
        Some(next) => {
            kept.len() == k
                && !(one_per_source && repeats_a_source(kept))
                && kept
                    .last()
                    .is_some_and(|last| next.bound() * ceiling < last.score)
        }
    }
}

/// Whether a kept memory came only from messages an earlier one came from: [`select`] keeps
/// such a memory only when the read candidates held too few distinct ones, so an unread
/// candidate, however low it scores, could still take its place.
fn repeats_a_source(kept: &[Recalled]) -> bool {
    let mut sources: HashSet<&str> = HashSet::new();
    kept.iter().any(|recalled| {
        let refs = &recalled.memory.source_refs;
        let repeat = !refs.is_empty() && refs.iter().all(|id| sources.contains(id.as_str()));
        sources.extend(refs.iter().map(String::as_str));
        repeat
    })
}

/// The top `k` of `fused`, reading rows through `read` in fused order: `first_chunk` ids,
/// then twice as many each round, until [`settled`]. `read` returns the rows it found for
/// the ids, already checked for the user and the request's filters; missing ones are
/// dropped. Returns the results and how many candidates were read.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn select_reading<F, Fut, E>(
    fused: &[Candidate],
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
    query: &QueryHints,
    k: usize,
    first_chunk: usize,
    mut read: F,
) -> Result<(Vec<Recalled>, usize), E>
where
    F: FnMut(Vec<MemoryId>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Memory>, E>>,
{
    let mut memories: HashMap<MemoryId, Memory> = HashMap::with_capacity(fused.len());
    let mut done = 0;
    let mut chunk = first_chunk.max(1);
    let ceiling = settings.assistant_weight.max(1.0) * query.ceiling(settings);
    loop {
        let kept = select(fused, &memories, settings, decay, now, query, k);
        if settled(&kept, k, fused.get(done), ceiling, settings.one_per_source) {
            return Ok((kept, done));
        }
        let end = (done + chunk).min(fused.len());
        let ids = fused[done..end].iter().map(|c| c.id).collect();
        for memory in read(ids).await? {
            memories.insert(memory.id, memory);
        }
        done = end;
        chunk *= 2;
    }
}

/// [`fuse`] then [`select`] over rows already read (tests and one-shot callers).
#[cfg(test)]
pub(crate) fn rank(
    vector_hits: &[(MemoryId, f32)],
    keyword_hits: &[(MemoryId, f32)],
    memories: Vec<Memory>,
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
    k: usize,
) -> Vec<Recalled> {
    let by_id: HashMap<MemoryId, Memory> = memories
        .into_iter()
        .map(|memory| (memory.id, memory))
        .collect();
    let candidates = fuse(vector_hits, keyword_hits, settings.rrf_k);
    select(
        &candidates,
        &by_id,
        settings,
        decay,
        now,
        &QueryHints::default(),
        k,
    )
}

/// Vectors of one model at least `threshold` similar (near duplicates, with the same
/// normalised text).
fn similar_vectors(a: &Memory, b: &Memory, threshold: f32) -> bool {
    a.embedding_model == b.embedding_model
        && a.embedding.len() == b.embedding.len()
        && !a.embedding.is_empty()
        && cosine(&a.embedding, &b.embedding) >= threshold
}

fn normalise(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm_a: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let norm_b: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm_a == 0.0 || norm_b == 0.0 {
        0.0
    } else {
        dot / (norm_a * norm_b)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::{MemoryKind, MemorySource, Trust};

    /// A user's fact `age_days` old (recall's tests make turns of it).
    pub(in crate::memory) fn memory(
        content: &str,
        importance: u8,
        vector: Vec<f32>,
        age_days: i64,
    ) -> Memory {
        let created = Utc::now() - chrono::Duration::days(age_days);
        Memory {
            id: MemoryId::new(),
            kind: MemoryKind::Fact,
            content: content.into(),
            source: MemorySource::User,
            trust: Trust::User,
            importance,
            thread_id: None,
            source_refs: Vec::new(),
            valid_from: created,
            invalid_at: None,
            supersedes: None,
            created_at: created,
            updated_at: created,
            last_accessed_at: None,
            access_count: 0,
            archived_at: None,
            version: 1,
            embedding_model: "m".into(),
            superseded_by: None,
            embedding: vector,
        }
    }

    /// "What did I mention…" lifts the user's own memories by the user boost, and the
    /// early stop's ceiling allows for it; a speaker named in the query takes precedence.
    #[test]
    fn a_query_about_what_i_said_lifts_the_users_memories() {
        let settings = MemorySettings::default();
        let mine = memory("I brought up the budget tracker", 3, vec![1.0], 1);
        let mut reply = mine.clone();
        reply.trust = Trust::Assistant;
        let hints = QueryHints {
            user_speaks: true,
            ..QueryHints::default()
        };
        assert_eq!(hints.factor(&mine, &settings), settings.user_boost);
        assert_eq!(hints.factor(&reply, &settings), 1.0);
        assert!(hints.ceiling(&settings) >= settings.user_boost);
        let named = QueryHints {
            speaker: Some("Melanie".into()),
            user_speaks: true,
            ..QueryHints::default()
        };
        assert_eq!(named.factor(&mine, &settings), 1.0);
        assert_eq!(QueryHints::default().factor(&mine, &settings), 1.0);
    }

    /// The query gate returns nothing unless some candidate is close in meaning or covers
    /// the query's words; past it, candidates weak in both are dropped.
    #[test]
    fn the_gate_and_the_floor_keep_only_what_the_query_is_about() {
        // The raw-cosine gate of an ablation, at MiniLM's old thresholds.
        let fusion = FusionSettings {
            gate_cosine: Some(0.47),
            gate_coverage: 0.35,
            floor_cosine: Some(0.35),
            floor_coverage: 0.05,
            ..FusionSettings::default()
        };
        let (close, worded, weak, vague) = (
            MemoryId::new(),
            MemoryId::new(),
            MemoryId::new(),
            MemoryId::new(),
        );
        let ids = |fused: &[Candidate]| {
            let mut ids: Vec<MemoryId> = fused.iter().map(|c| c.id).collect();
            ids.sort();
            ids
        };
        // Nothing near: the best cosine 0.40 < 0.47, the best coverage 0.2 < 0.35.
        let vector = [(vague, 0.40), (weak, 0.2)];
        let keyword = [(weak, 3.0)];
        let coverage = [0.2];
        let lists = Lists {
            vector: &vector,
            keyword: &keyword,
            keyword_coverage: &coverage,
            requested: 50,
            gated: true,
            ..Lists::default()
        };
        assert!(fuse_lists(&lists, &fusion, 10.0).is_empty());
        // Ungated, the same lists give both.
        let open = Lists {
            gated: false,
            ..lists
        };
        assert_eq!(fuse_lists(&open, &fusion, 10.0).len(), 2);
        // One close memory opens the gate; the floor then drops what is weak in both
        // signals (cosine < 0.35 and coverage < 0.05) and keeps a hit by words alone.
        let vector = [(close, 0.6), (vague, 0.40), (weak, 0.2)];
        let keyword = [(worded, 9.0), (weak, 3.0)];
        let coverage = [0.5, 0.01];
        let lists = Lists {
            vector: &vector,
            keyword: &keyword,
            keyword_coverage: &coverage,
            requested: 50,
            gated: true,
            ..Lists::default()
        };
        let mut expected = vec![close, worded, vague];
        expected.sort();
        assert_eq!(ids(&fuse_lists(&lists, &fusion, 10.0)), expected);
        // A short BM25 list is normalised from 0: its last hit still counts (3 / 9; the
        // vector list's last counts 0).
        let fused = fuse_lists(
            &Lists {
                gated: false,
                ..lists
            },
            &fusion,
            10.0,
        );
        let weak_hit = fused.iter().find(|c| c.id == weak).unwrap();
        assert!((weak_hit.rrf - 1.0 / 3.0).abs() < 1e-6, "{weak_hit:?}");
    }

    /// "Which antibiotic do I react badly to?" shares no informative word with "I'm allergic to
    /// penicillin" but a common one with another memory: that BM25 hit (coverage 0) must not
    /// outrank the memory the query means.
    #[test]
    fn a_bm25_hit_on_no_informative_word_adds_nothing() {
        let (meant, worded, other) = (MemoryId::new(), MemoryId::new(), MemoryId::new());
        let vector = [(meant, 0.86), (worded, 0.84), (other, 0.70)];
        let keyword = [(worded, 2.5)];
        let coverage = [0.0];
        // A user without turns: the context view's BM25 list is the own one again.
        let lists = Lists {
            vector: &vector,
            keyword: &keyword,
            keyword_context: &keyword,
            keyword_coverage: &coverage,
            keyword_context_coverage: &coverage,
            requested: 50,
            ..Lists::default()
        };
        let needs_coverage = FusionSettings {
            bm25_needs_coverage: true,
            ..FusionSettings::default()
        };
        let fused = fuse_lists(&lists, &needs_coverage, 10.0);
        assert_eq!(fused.first().map(|c| c.id), Some(meant), "{fused:?}");
        let worded_hit = fused
            .iter()
            .find(|c| c.id == worded)
            .expect("still a candidate");
        assert_eq!(worded_hit.keyword.map(|(rank, _)| rank), Some(1));
        // Without (the default, for BEAM's sake): the weak hit takes the BM25 list's full
        // weight and ranks first.
        let before = FusionSettings {
            bm25_needs_coverage: false,
            ..FusionSettings::default()
        };
        assert_eq!(
            fuse_lists(&lists, &before, 10.0).first().map(|c| c.id),
            Some(worded)
        );
        // A hit on an informative word keeps its full weight.
        let coverage = [0.4];
        let lists = Lists {
            keyword_coverage: &coverage,
            keyword_context_coverage: &coverage,
            ..lists
        };
        assert_eq!(
            fuse_lists(&lists, &needs_coverage, 10.0)
                .first()
                .map(|c| c.id),
            Some(worded)
        );
    }

    /// Only turns have context vectors; a fact is its own context, so its own cosine counts
    /// in the context view's place, and it is not outranked by a turn for lacking one.
    #[test]
    fn memories_without_a_context_vector_take_their_own_cosine_there() {
        let fusion = FusionSettings {
            method: FusionMethod::MinMax,
            context_vector_weight: 1.0,
            ..FusionSettings::default()
        };
        let settings = MemorySettings {
            fusion: fusion.clone(),
            length_prior: 0.0,
            ..MemorySettings::default()
        };
        let fact = memory("The user's boat is called Seabiscuit", 3, vec![1.0, 0.0], 0);
        let mut turn = memory("User: my boat is Seabiscuit", 3, vec![0.0, 1.0], 0);
        turn.kind = MemoryKind::Turn;
        let mut weak_turn = memory("User: hello", 3, vec![0.6, 0.8], 0);
        weak_turn.kind = MemoryKind::Turn;
        let own = [(fact.id, 0.9), (turn.id, 0.9), (weak_turn.id, 0.2)];
        let context = [(turn.id, 0.9), (weak_turn.id, 0.2)];
        let lists = Lists {
            vector: &own,
            vector_context: &context,
            ..Lists::default()
        };
        let fused = fuse_lists(&lists, &fusion, 10.0);
        let by_id = |id| fused.iter().find(|c| c.id == id).unwrap().clone();
        assert!((by_id(fact.id).fill - 1.0).abs() < 1e-9, "{fused:?}");
        assert_eq!(by_id(turn.id).fill, 0.0);
        let rows: HashMap<MemoryId, Memory> = [fact.clone(), turn.clone(), weak_turn.clone()]
            .into_iter()
            .map(|memory| (memory.id, memory))
            .collect();
        let ranked = select(
            &fused,
            &rows,
            &settings,
            false,
            Utc::now(),
            &QueryHints::default(),
            3,
        );
        let scores: HashMap<MemoryId, f64> =
            ranked.iter().map(|r| (r.memory.id, r.score)).collect();
        assert!(
            (scores[&fact.id] - scores[&turn.id]).abs() < 1e-9,
            "{scores:?}"
        );
        assert!(scores[&weak_turn.id] < scores[&turn.id]);
        // A turn missing from the context list gets nothing in its place.
        let mut lonely = memory("User: Seabiscuit", 3, vec![1.0, 0.0], 0);
        lonely.kind = MemoryKind::Turn;
        let own = [(lonely.id, 0.9), (turn.id, 0.9)];
        let context = [(turn.id, 0.9), (weak_turn.id, 0.2)];
        let fused = fuse_lists(
            &Lists {
                vector: &own,
                vector_context: &context,
                ..Lists::default()
            },
            &fusion,
            10.0,
        );
        let rows: HashMap<MemoryId, Memory> = [lonely.clone(), turn.clone(), weak_turn]
            .into_iter()
            .map(|memory| (memory.id, memory))
            .collect();
        let ranked = select(
            &fused,
            &rows,
            &settings,
            false,
            Utc::now(),
            &QueryHints::default(),
            2,
        );
        assert_eq!(ranked[0].memory.id, turn.id, "{ranked:?}");
        assert_eq!(ranked[1].memory.id, lonely.id);
    }

    #[test]
    fn keyword_only_and_vector_only_hits_both_survive_fusion() {
        let settings = MemorySettings::default();
        let only_vector = memory("semantic match", 3, vec![1.0, 0.0], 0);
        let only_keyword = memory("literal token match", 3, vec![0.0, 1.0], 0);
        let both = memory("in both lists", 3, vec![0.7, 0.7], 0);
        let vector_hits = vec![(only_vector.id, 0.9), (both.id, 0.8)];
        let keyword_hits = vec![(only_keyword.id, 5.0), (both.id, 4.0)];
        let ranked = rank(
            &vector_hits,
            &keyword_hits,
            vec![only_vector.clone(), only_keyword.clone(), both.clone()],
            &settings,
            true,
            Utc::now(),
            10,
        );
        let ids: Vec<MemoryId> = ranked.iter().map(|r| r.memory.id).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[0], both.id, "a hit in both lists ranks first");
        assert!(ids.contains(&only_vector.id) && ids.contains(&only_keyword.id));
        let keyword = ranked
            .iter()
            .find(|r| r.memory.id == only_keyword.id)
            .unwrap();
        assert_eq!(keyword.signals.bm25_rank, Some(1));
        assert_eq!(keyword.signals.vector_rank, None);
        assert!((keyword.signals.rrf - 1.0 / 11.0).abs() < 1e-12);
    }

    #[test]
    fn signals_name_every_factor_of_the_score() {
        let settings = MemorySettings::default();
        let mine = memory("I keep bees", 3, vec![1.0, 0.0], 0);
        let mut theirs = memory("Bees keep you", 3, vec![0.0, 1.0], 0);
        theirs.trust = Trust::Assistant;
        let hits = vec![(theirs.id, 0.9), (mine.id, 0.8)];
        let ranked = rank(
            &hits,
            &[],
            vec![mine.clone(), theirs.clone()],
            &settings,
            true,
            Utc::now(),
            10,
        );
        for result in &ranked {
            let s = &result.signals;
            assert!(
                (result.score - s.rrf * s.decay * s.trust * s.prior).abs() < 1e-12,
                "{s:?}"
            );
        }
        let assistant = ranked.iter().find(|r| r.memory.id == theirs.id).unwrap();
        assert_eq!(assistant.signals.trust, settings.assistant_weight);
        let user = ranked.iter().find(|r| r.memory.id == mine.id).unwrap();
        assert_eq!((user.signals.trust, user.signals.prior), (1.0, 1.0));
        // A factor of 1 is left out of the JSON, another is shown.
        let json = serde_json::to_value(&user.signals).unwrap();
        assert!(
            json.get("trust").is_none() && json.get("prior").is_none(),
            "{json}"
        );
        if settings.assistant_weight != 1.0 {
            let json = serde_json::to_value(&assistant.signals).unwrap();
            assert_eq!(json["trust"], settings.assistant_weight);
        }
    }

    #[test]
    fn decay_reorders_but_never_drops_and_spares_important_memories() {
        let settings = MemorySettings::default();
        let stale = memory("old trivia", 2, vec![1.0, 0.0], 120);
        let fresh = memory("new trivia", 2, vec![0.0, 1.0], 0);
        let important_old = memory("old but essential", 5, vec![0.6, 0.8], 400);
        let hits = vec![(stale.id, 0.9), (important_old.id, 0.85), (fresh.id, 0.8)];
        let ranked = rank(
            &hits,
            &[],
            vec![stale.clone(), fresh.clone(), important_old.clone()],
            &settings,
            true,
            Utc::now(),
            10,
        );
        let order: Vec<&str> = ranked.iter().map(|r| r.memory.content.as_str()).collect();
        assert_eq!(order, ["old but essential", "new trivia", "old trivia"]);
        let stale_result = ranked.iter().find(|r| r.memory.id == stale.id).unwrap();
        assert!((stale_result.signals.decay - settings.decay_floor).abs() < 1e-9);
        let important = ranked
            .iter()
            .find(|r| r.memory.id == important_old.id)
            .unwrap();
        assert_eq!(important.signals.decay, 1.0);
        // Without decay the raw vector order stands.
        let plain = rank(
            &hits,
            &[],
            vec![stale, fresh, important_old],
            &settings,
            false,
            Utc::now(),
            10,
        );
        assert_eq!(plain[0].memory.content, "old trivia");
    }

    /// Reading rows only while they can matter gives exactly what reading all of them gives,
    /// whatever the decay factors, duplicates and missing rows.
    #[tokio::test]
    async fn reading_in_rounds_equals_reading_everything() {
        let settings = MemorySettings::default();
        let now = Utc::now();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let mut fewer_reads = 0;
        for case in 0..300 {
            let n = 1 + next(120) as usize;
            let memories: Vec<Memory> = (0..n)
                .map(|i| {
                    let mut m = memory(
                        &format!("memory {}", next(n as u64 * 2)),
                        1 + next(5) as u8,
                        vec![1.0, next(3) as f32],
                        next(400) as i64,
                    );
                    if next(10) == 0 {
                        m.last_accessed_at = Some(now - chrono::Duration::days(i as i64 % 7));
                    }
                    // Most memories come from messages, several from the same one.
                    let messages = 1 + n as u64 / 3;
                    m.source_refs = (0..next(3))
                        .map(|_| format!("message {}", next(messages)))
                        .collect();
                    m
                })
                .collect();
            let pick = |count: usize, next: &mut dyn FnMut(u64) -> u64| {
                let mut hits: Vec<(MemoryId, f32)> = Vec::new();
                for _ in 0..count {
                    let m = &memories[next(n as u64) as usize];
                    if !hits.iter().any(|(id, _)| *id == m.id) {
                        hits.push((m.id, 1.0));
                    }
                }
                hits
            };
            let mut vector_hits = pick(1 + next(60) as usize, &mut next);
            let keyword_hits = pick(next(60) as usize, &mut next);
            vector_hits.push((MemoryId::new(), 0.5)); // a row that is gone
            // Some rows fail the filter.
            let present: Vec<Memory> = memories.iter().filter(|_| next(12) != 0).cloned().collect();
            let k = 1 + next(12) as usize;
            let decay = case % 5 != 0;
            let everything = rank(
                &vector_hits,
                &keyword_hits,
                present.clone(),
                &settings,
                decay,
                now,
                k,
            );
            let fused = fuse(&vector_hits, &keyword_hits, settings.rrf_k);
            let rows: HashMap<MemoryId, Memory> = present.into_iter().map(|m| (m.id, m)).collect();
            let (rounds, read) = select_reading(
                &fused,
                &settings,
                decay,
                now,
                &QueryHints::default(),
                k,
                4,
                |ids| {
                    let found: Vec<Memory> =
                        ids.iter().filter_map(|id| rows.get(id).cloned()).collect();
                    async move { Ok::<_, std::convert::Infallible>(found) }
                },
            )
            .await
            .expect("infallible");
            let ids = |results: &[Recalled]| -> Vec<(MemoryId, u64)> {
                results
                    .iter()
                    .map(|r| (r.memory.id, r.score.to_bits()))
                    .collect()
            };
            assert_eq!(ids(&rounds), ids(&everything), "case {case}");
            if read < fused.len() {
                fewer_reads += 1;
            }
        }
        assert!(
            fewer_reads > 50,
            "rounds stopped early in {fewer_reads} cases"
        );
    }

    #[test]
    fn near_duplicates_and_missing_rows_are_dropped_and_k_is_respected() {
        let settings = MemorySettings::default();
        let first = memory("I use PostgreSQL", 3, vec![1.0, 0.0, 0.0], 0);
        let copy = memory("i use  postgresql", 3, vec![0.0, 1.0, 0.0], 0);
        let close = memory("I am using PostgreSQL", 3, vec![0.999, 0.01, 0.0], 0);
        let other = memory("I like tea", 3, vec![0.0, 0.0, 1.0], 0);
        let gone = MemoryId::new();
        let hits = vec![
            (gone, 0.99),
            (first.id, 0.9),
            (copy.id, 0.8),
            (close.id, 0.7),
            (other.id, 0.6),
        ];
        let ranked = rank(
            &hits,
            &[],
            vec![first.clone(), copy, close, other.clone()],
            &settings,
            false,
            Utc::now(),
            10,
        );
        let contents: Vec<&str> = ranked.iter().map(|r| r.memory.content.as_str()).collect();
        assert_eq!(contents, ["I use PostgreSQL", "I like tea"]);
        assert_eq!(
            ranked[0].signals.vector_rank,
            Some(2),
            "a stale hit is dropped but keeps its index rank"
        );
        let one = rank(
            &hits,
            &[],
            vec![first, other],
            &settings,
            false,
            Utc::now(),
            1,
        );
        assert_eq!(one.len(), 1);
    }

    /// Another part of a message already in the results, or the fact a kept turn said, waits
    /// until the memories from other messages run out; a memory from no message never waits.
    #[test]
    fn memories_from_a_message_already_returned_come_after_the_others() {
        let settings = MemorySettings::default();
        let from = |content: &str, refs: &[&str], vector: Vec<f32>| {
            let mut m = memory(content, 3, vector, 0);
            m.source_refs = refs.iter().map(ToString::to_string).collect();
            m
        };
        let part_one = from(
            "Assistant: the schema has three tables",
            &["7"],
            vec![1.0, 0.0, 0.0, 0.0],
        );
        let part_two = from(
            "Assistant: the index covers user_id",
            &["7"],
            vec![0.0, 1.0, 0.0, 0.0],
        );
        let said = from(
            "User: my project uses Postgres",
            &["8"],
            vec![0.0, 0.0, 1.0, 0.0],
        );
        let loose = from("Prefers short answers", &[], vec![0.0, 0.0, 0.0, 1.0]);
        let both = from("Both messages", &["7", "8"], vec![0.5, 0.0, 0.5, 0.5]);
        let hits = vec![
            (part_one.id, 0.9),
            (part_two.id, 0.8),
            (both.id, 0.75),
            (said.id, 0.7),
            (loose.id, 0.6),
        ];
        let rows = vec![part_one, part_two, said, loose, both];
        let contents = |k: usize, settings: &MemorySettings| -> Vec<String> {
            rank(&hits, &[], rows.clone(), settings, false, Utc::now(), k)
                .into_iter()
                .map(|r| r.memory.content)
                .collect()
        };
        assert_eq!(
            contents(10, &settings),
            [
                "Assistant: the schema has three tables",
                "Both messages",
                "Prefers short answers",
                "Assistant: the index covers user_id",
                "User: my project uses Postgres",
            ],
            "one memory per message first, in score order; then the rest"
        );
        assert_eq!(
            contents(3, &settings),
            [
                "Assistant: the schema has three tables",
                "Both messages",
                "Prefers short answers",
            ]
        );
        let off = MemorySettings {
            one_per_source: false,
            ..MemorySettings::default()
        };
        assert_eq!(
            contents(3, &off),
            [
                "Assistant: the schema has three tables",
                "Assistant: the index covers user_id",
                "Both messages",
            ]
        );
    }
}
