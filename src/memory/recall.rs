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

/// Fuses the two hit lists over the hydrated memories (already filtered to the user and the
/// request's filters), applies decay at `now`, removes near-duplicates, and keeps `k`.
pub fn rank(
    vector_hits: &[(MemoryId, f32)],
    keyword_hits: &[(MemoryId, f32)],
    memories: Vec<Memory>,
    settings: &MemorySettings,
    decay: bool,
    now: DateTime<Utc>,
    k: usize,
) -> Vec<Recalled> {
    let mut by_id: HashMap<MemoryId, Memory> = memories
        .into_iter()
        .map(|memory| (memory.id, memory))
        .collect();
    // Ranks count only hits that survived hydration, so a stale index entry cannot push a
    // real memory down.
    let vector_ids: Vec<MemoryId> = vector_hits
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| by_id.contains_key(id))
        .collect();
    let keyword_ids: Vec<MemoryId> = keyword_hits
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| by_id.contains_key(id))
        .collect();
    let vector_info: HashMap<MemoryId, (usize, f32)> = vector_ids
        .iter()
        .enumerate()
        .filter_map(|(rank, id)| {
            let score = vector_hits.iter().find(|(hit, _)| hit == id)?.1;
            Some((*id, (rank + 1, score)))
        })
        .collect();
    let keyword_info: HashMap<MemoryId, (usize, f32)> = keyword_ids
        .iter()
        .enumerate()
        .filter_map(|(rank, id)| {
            let score = keyword_hits.iter().find(|(hit, _)| hit == id)?.1;
            Some((*id, (rank + 1, score)))
        })
        .collect();
    let fused = reciprocal_rank_fusion(&[&vector_ids, &keyword_ids], settings.rrf_k);
    let mut scored: Vec<Recalled> = fused
        .into_iter()
        .filter_map(|(id, rrf)| {
            let memory = by_id.remove(&id)?;
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
            let vector = vector_info.get(&id);
            let keyword = keyword_info.get(&id);
            Some(Recalled {
                score: rrf * factor,
                signals: Signals {
                    vector_rank: vector.map(|(rank, _)| *rank),
                    vector_score: vector.map(|(_, score)| *score),
                    bm25_rank: keyword.map(|(rank, _)| *rank),
                    bm25_score: keyword.map(|(_, score)| *score),
                    rrf,
                    decay: factor,
                },
                memory,
            })
        })
        .collect();
    scored.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| b.memory.id.cmp(&a.memory.id))
    });
    let mut kept: Vec<Recalled> = Vec::with_capacity(k);
    for candidate in scored {
        if kept.len() == k {
            break;
        }
        let duplicate = kept.iter().any(|chosen| {
            near_duplicate(&chosen.memory, &candidate.memory, settings.dedupe_cosine)
        });
        if !duplicate {
            kept.push(candidate);
        }
    }
    kept
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
            Some(1),
            "a stale hit does not take a rank"
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
