//! Hybrid recall: vector top-N and BM25 top-N in parallel → union → Reciprocal Rank Fusion →
//! bounded decay multiplier → near-duplicate removal → top-k with per-signal details.
//! The pure ranking step (`rank`) does no I/O and is table-tested.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::MemorySettings;
use crate::index::rrf::{decay_factor, reciprocal_rank_fusion};
use crate::store::{Memory, MemoryId};

/// Which signals take part: both (hybrid) or one alone (for ablations and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecallMode {
    #[default]
    Hybrid,
    Vector,
    Keyword,
}

/// How one result was found.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Signals {
    pub vector_rank: Option<usize>,
    pub vector_score: Option<f32>,
    pub bm25_rank: Option<usize>,
    pub bm25_score: Option<f32>,
    pub rrf: f64,
    /// The decay multiplier applied to `rrf` (1.0 = no decay).
    pub decay: f64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Recalled {
    pub memory: Memory,
    pub score: f64,
    pub signals: Signals,
}

/// A fused hit before its row is read: its RRF score and where each signal ranked it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: MemoryId,
    pub rrf: f64,
    /// Rank (from 1) and cosine in the vector list.
    pub vector: Option<(usize, f32)>,
    /// Rank (from 1) and BM25 score in the keyword list.
    pub keyword: Option<(usize, f32)>,
}

/// Fuses the two hit lists by Reciprocal Rank Fusion, best first. Ranks are positions in
/// the index's lists, so the order is known before any row is read; a hit whose row turns
/// out to be gone (an index lagging a delete by milliseconds) is dropped later but keeps its
/// slot.
pub fn fuse(
    vector_hits: &[(MemoryId, f32)],
    keyword_hits: &[(MemoryId, f32)],
    rrf_k: f64,
) -> Vec<Candidate> {
    let positions = |hits: &[(MemoryId, f32)]| {
        let mut at: HashMap<MemoryId, (usize, f32)> = HashMap::with_capacity(hits.len());
        for (index, (id, score)) in hits.iter().enumerate() {
            at.entry(*id).or_insert((index + 1, *score));
        }
        at
    };
    let vector_at = positions(vector_hits);
    let keyword_at = positions(keyword_hits);
    let vector_ids: Vec<MemoryId> = vector_hits.iter().map(|(id, _)| *id).collect();
    let keyword_ids: Vec<MemoryId> = keyword_hits.iter().map(|(id, _)| *id).collect();
    reciprocal_rank_fusion(&[&vector_ids, &keyword_ids], rrf_k)
        .into_iter()
        .map(|(id, rrf)| Candidate {
            id,
            rrf,
            vector: vector_at.get(&id).copied(),
            keyword: keyword_at.get(&id).copied(),
        })
        .collect()
}

/// Scores the candidates whose rows are in `memories` (read for the user and checked
/// against the request's filters; the others are skipped), applies decay at `now`, removes
/// near-duplicates and keeps the best `k`.
pub fn select(
    candidates: &[Candidate],
    memories: &HashMap<MemoryId, Memory>,
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
    k: usize,
) -> Vec<Recalled> {
    let mut scored: Vec<(f64, f64, &Candidate, &Memory)> = candidates
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
            Some((candidate.rrf * factor, factor, candidate, memory))
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.3.id.cmp(&a.3.id)));
    let mut kept: Vec<Recalled> = Vec::with_capacity(k);
    for (score, factor, candidate, memory) in scored {
        if kept.len() == k {
            break;
        }
        let duplicate = kept
            .iter()
            .any(|chosen| near_duplicate(&chosen.memory, memory, settings.dedupe_cosine));
        if !duplicate {
            kept.push(Recalled {
                memory: memory.clone(),
                score,
                signals: Signals {
                    vector_rank: candidate.vector.map(|(rank, _)| rank),
                    vector_score: candidate.vector.map(|(_, score)| score),
                    bm25_rank: candidate.keyword.map(|(rank, _)| rank),
                    bm25_score: candidate.keyword.map(|(_, score)| score),
                    rrf: candidate.rrf,
                    decay: factor,
                },
            });
        }
    }
    kept
}

/// True when reading more rows cannot change `kept`: every score is rrf × a decay factor of
/// at most 1, so a candidate not yet read (candidates are in fused order) scores at most its
/// rrf, and once that is below the k-th kept score it would sort after everything kept.
pub fn settled(kept: &[Recalled], k: usize, next_unread: Option<&Candidate>) -> bool {
    match next_unread {
        None => true,
        Some(next) => kept.len() == k && kept.last().is_some_and(|last| next.rrf < last.score),
    }
}

/// The top `k` of `fused`, reading rows through `read` in fused order: `first_chunk` ids,
/// then twice as many each round, until [`settled`]. `read` returns the rows it found for
/// the ids, already checked for the user and the request's filters; missing ones are
/// dropped. Returns the results and how many candidates were read.
pub async fn select_reading<F, Fut, E>(
    fused: &[Candidate],
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
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
    loop {
        let kept = select(fused, &memories, settings, decay, now, k);
        if settled(&kept, k, fused.get(done)) {
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
pub fn rank(
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
    select(&candidates, &by_id, settings, decay, now, k)
}

/// Same normalised text, or vectors of one model at least `threshold` similar.
fn near_duplicate(a: &Memory, b: &Memory, threshold: f32) -> bool {
    if normalise(&a.content) == normalise(&b.content) {
        return true;
    }
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
mod tests {
    use super::*;
    use crate::store::{MemoryKind, MemorySource, Trust};

    fn memory(content: &str, importance: u8, vector: Vec<f32>, age_days: i64) -> Memory {
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
            embedding: vector,
        }
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
            let (rounds, read) = select_reading(&fused, &settings, decay, now, k, 4, |ids| {
                let found: Vec<Memory> =
                    ids.iter().filter_map(|id| rows.get(id).cloned()).collect();
                async move { Ok::<_, std::convert::Infallible>(found) }
            })
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
}
