//! Retrieval metrics over dataset ids (e.g. LoCoMo `D3:7`), and their aggregation.
//!
//! A question has a set of evidence ids. Recall returns a ranked list of memories; each memory
//! carries the dataset ids it was derived from (`source_refs`). With `top(k)` = the first
//! `min(k, returned)` memories:
//!
//! - **recall@k** = |evidence ∩ ⋃ refs(top(k))| / |evidence|. An evidence id counts once, however
//!   many memories carry it; a memory counts for every id it was derived from.
//! - **NDCG@k** (binary relevance): the memory at rank `i` has gain 1 when it carries at least
//!   one evidence id that no higher-ranked memory carried, else 0 (so a second memory for the
//!   same evidence turn earns nothing). `DCG@k = Σ gain_i / log2(i + 1)`, and the ideal
//!   `IDCG@k = Σ_{i=1}^{min(|evidence|, k)} 1 / log2(i + 1)` (one new evidence id per rank), so
//!   NDCG ∈ [0, 1] even when one memory carries several evidence ids.
//! - A question with no evidence scores 1 on both (LoCoMo's convention for its 4 such
//!   questions).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;

/// One question's scores at each k of the `ks` they were computed for (same order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuestionScore {
    pub recall: Vec<f64>,
    pub ndcg: Vec<f64>,
}

/// Scores one ranked result list. `retrieved[i]` holds the refs of the memory at rank `i + 1`.
pub fn score(
    evidence: &BTreeSet<String>,
    retrieved: &[Vec<String>],
    ks: &[usize],
) -> QuestionScore {
    if evidence.is_empty() {
        return QuestionScore {
            recall: vec![1.0; ks.len()],
            ndcg: vec![1.0; ks.len()],
        };
    }
    let depth = ks.iter().copied().max().unwrap_or(0).min(retrieved.len());
    // found[i] and dcg[i]: after the first i memories.
    let mut found_after = Vec::with_capacity(depth + 1);
    let mut dcg_after = Vec::with_capacity(depth + 1);
    let mut found: HashSet<&str> = HashSet::new();
    let mut dcg = 0.0;
    found_after.push(0usize);
    dcg_after.push(0.0);
    for (index, refs) in retrieved.iter().take(depth).enumerate() {
        let mut new = false;
        for id in refs {
            if evidence.contains(id) && found.insert(id.as_str()) {
                new = true;
            }
        }
        if new {
            dcg += discount(index + 1);
        }
        found_after.push(found.len());
        dcg_after.push(dcg);
    }
    let total = evidence.len() as f64;
    let mut recall = Vec::with_capacity(ks.len());
    let mut ndcg = Vec::with_capacity(ks.len());
    for &k in ks {
        let seen = k.min(depth);
        recall.push(found_after[seen] as f64 / total);
        let ideal: f64 = (1..=k.min(evidence.len())).map(discount).sum();
        ndcg.push(if ideal > 0.0 {
            dcg_after[seen] / ideal
        } else {
            0.0
        });
    }
    QuestionScore { recall, ndcg }
}

/// `1 / log2(rank + 1)` for a 1-based rank.
fn discount(rank: usize) -> f64 {
    1.0 / ((rank + 1) as f64).log2()
}

/// Means of question scores, overall and per category.
#[derive(Debug, Clone, Default)]
pub struct Aggregate {
    ks: Vec<usize>,
    overall: Sums,
    categories: BTreeMap<String, Sums>,
}

#[derive(Debug, Clone, Default)]
struct Sums {
    n: usize,
    recall: Vec<f64>,
    ndcg: Vec<f64>,
}

impl Sums {
    fn add(&mut self, score: &QuestionScore) {
        if self.recall.is_empty() {
            self.recall = vec![0.0; score.recall.len()];
            self.ndcg = vec![0.0; score.ndcg.len()];
        }
        self.n += 1;
        for (sum, value) in self.recall.iter_mut().zip(&score.recall) {
            *sum += value;
        }
        for (sum, value) in self.ndcg.iter_mut().zip(&score.ndcg) {
            *sum += value;
        }
    }

    fn means(&self, ks: &[usize]) -> Means {
        let mean = |sums: &[f64]| -> BTreeMap<usize, f64> {
            ks.iter()
                .enumerate()
                .map(|(i, &k)| {
                    let sum = sums.get(i).copied().unwrap_or(0.0);
                    (
                        k,
                        if self.n == 0 {
                            0.0
                        } else {
                            sum / self.n as f64
                        },
                    )
                })
                .collect()
        };
        Means {
            n: self.n,
            recall: mean(&self.recall),
            ndcg: mean(&self.ndcg),
        }
    }
}

/// Mean recall@k and NDCG@k over `n` questions, keyed by k.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Means {
    pub n: usize,
    pub recall: BTreeMap<usize, f64>,
    pub ndcg: BTreeMap<usize, f64>,
}

impl Aggregate {
    pub fn new(ks: &[usize]) -> Self {
        Self {
            ks: ks.to_vec(),
            ..Self::default()
        }
    }

    pub fn add(&mut self, category: &str, score: &QuestionScore) {
        self.overall.add(score);
        self.categories
            .entry(category.to_string())
            .or_default()
            .add(score);
    }

    pub fn overall(&self) -> Means {
        self.overall.means(&self.ks)
    }

    pub fn by_category(&self) -> BTreeMap<String, Means> {
        self.categories
            .iter()
            .map(|(category, sums)| (category.clone(), sums.means(&self.ks)))
            .collect()
    }
}

/// Latency summary in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub mean_ms: f64,
}

pub fn latency(samples_ms: &[f64]) -> Latency {
    if samples_ms.is_empty() {
        return Latency {
            p50_ms: 0.0,
            p95_ms: 0.0,
            mean_ms: 0.0,
        };
    }
    let mut sorted = samples_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    Latency {
        p50_ms: crate::tools::stats::percentile(&sorted, 0.50),
        p95_ms: crate::tools::stats::percentile(&sorted, 0.95),
        mean_ms: sorted.iter().sum::<f64>() / sorted.len() as f64,
    }
}

/// Whitespace-separated words, the model-independent size measure of returned text.
pub fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KS: [usize; 6] = [1, 3, 5, 10, 25, 50];

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(std::string::ToString::to_string).collect()
    }

    fn list(memories: &[&[&str]]) -> Vec<Vec<String>> {
        memories
            .iter()
            .map(|refs| refs.iter().map(std::string::ToString::to_string).collect())
            .collect()
    }

    fn d(rank: usize) -> f64 {
        1.0 / ((rank + 1) as f64).log2()
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn empty_evidence_counts_as_found() {
        let score = score(&set(&[]), &list(&[&["D1:1"]]), &KS);
        close(&score.recall, &[1.0; 6]);
        close(&score.ndcg, &[1.0; 6]);
        let nothing = super::score(&set(&[]), &[], &KS);
        close(&nothing.recall, &[1.0; 6]);
    }

    #[test]
    fn perfect_and_zero_rankings() {
        let evidence = set(&["D1:1", "D2:2"]);
        let perfect = score(&evidence, &list(&[&["D1:1"], &["D2:2"], &["D3:3"]]), &KS);
        close(&perfect.recall, &[0.5, 1.0, 1.0, 1.0, 1.0, 1.0]);
        close(&perfect.ndcg, &[1.0; 6]);
        let zero = score(&evidence, &list(&[&["D3:3"], &["D4:4"]]), &KS);
        close(&zero.recall, &[0.0; 6]);
        close(&zero.ndcg, &[0.0; 6]);
        let nothing = score(&evidence, &[], &KS);
        close(&nothing.recall, &[0.0; 6]);
        close(&nothing.ndcg, &[0.0; 6]);
    }

    #[test]
    fn partial_ranking_by_hand() {
        // Evidence {A, B, C}; ranks: 1 miss, 2 A, 3 miss, 4 C, 5 miss.
        let evidence = set(&["A", "B", "C"]);
        let retrieved = list(&[&["x"], &["A"], &["y"], &["C"], &["z"]]);
        let score = score(&evidence, &retrieved, &[1, 2, 3, 4, 10]);
        close(
            &score.recall,
            &[0.0, 1.0 / 3.0, 1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0],
        );
        // DCG@2 = 1/log2(3) = 0.6309; IDCG@2 = 1 + 1/log2(3) = 1.6309 → 0.3869.
        // DCG@4 = 1/log2(3) + 1/log2(5) = 0.6309 + 0.4307 = 1.0616;
        // IDCG@4 = 1 + 0.6309 + 0.5 = 2.1309 → 0.4982 (also at k = 10: only 3 evidence ids).
        let want2 = d(2) / (d(1) + d(2));
        let want4 = (d(2) + d(4)) / (d(1) + d(2) + d(3));
        let want3 = d(2) / (d(1) + d(2) + d(3));
        close(&score.ndcg, &[0.0, want2, want3, want4, want4]);
        assert!((want2 - 0.386_853).abs() < 1e-6);
        assert!((want4 - 0.498_182).abs() < 1e-5, "{want4}");
    }

    #[test]
    fn duplicate_refs_count_once() {
        // The same evidence turn twice (two memories for one turn) is found once and gains once.
        let evidence = set(&["D1:1", "D1:2"]);
        let retrieved = list(&[&["D1:1"], &["D1:1"], &["D1:2"]]);
        let score = score(&evidence, &retrieved, &[1, 2, 3]);
        close(&score.recall, &[0.5, 0.5, 1.0]);
        let idcg2 = d(1) + d(2);
        close(&score.ndcg, &[1.0, 1.0 / idcg2, (1.0 + d(3)) / idcg2]);
        // A memory listing one id twice is one memory with one id.
        let doubled = super::score(&set(&["D1:1"]), &list(&[&["D1:1", "D1:1"]]), &[1]);
        close(&doubled.recall, &[1.0]);
        close(&doubled.ndcg, &[1.0]);
    }

    #[test]
    fn a_memory_with_several_refs_counts_for_each() {
        // A ±1 window derived from D1:1..D1:3 finds both evidence turns at rank 1.
        let evidence = set(&["D1:1", "D1:3"]);
        let retrieved = list(&[&["D1:2", "D1:1", "D1:3"], &["D1:3"]]);
        let score = score(&evidence, &retrieved, &[1, 2]);
        close(&score.recall, &[1.0, 1.0]);
        // Rank 1 gains 1 (binary); rank 2 brings nothing new. IDCG@2 = 1 + 1/log2(3).
        close(&score.ndcg, &[1.0, 1.0 / (d(1) + d(2))]);
    }

    #[test]
    fn k_larger_than_the_result_list() {
        let evidence = set(&["A", "B"]);
        let retrieved = list(&[&["B"]]);
        let score = score(&evidence, &retrieved, &[1, 50]);
        close(&score.recall, &[0.5, 0.5]);
        close(&score.ndcg, &[1.0, 1.0 / (d(1) + d(2))]);
    }

    #[test]
    fn aggregate_means_overall_and_per_category() {
        let mut aggregate = Aggregate::new(&[1, 5]);
        aggregate.add(
            "single-hop",
            &QuestionScore {
                recall: vec![1.0, 1.0],
                ndcg: vec![1.0, 1.0],
            },
        );
        aggregate.add(
            "multi-hop",
            &QuestionScore {
                recall: vec![0.0, 0.5],
                ndcg: vec![0.0, 0.25],
            },
        );
        aggregate.add(
            "multi-hop",
            &QuestionScore {
                recall: vec![0.0, 1.0],
                ndcg: vec![0.0, 0.75],
            },
        );
        let overall = aggregate.overall();
        assert_eq!(overall.n, 3);
        assert!((overall.recall[&5] - 2.5 / 3.0).abs() < 1e-12);
        assert!((overall.recall[&1] - 1.0 / 3.0).abs() < 1e-12);
        let categories = aggregate.by_category();
        assert_eq!(categories["multi-hop"].n, 2);
        assert!((categories["multi-hop"].recall[&5] - 0.75).abs() < 1e-12);
        assert!((categories["multi-hop"].ndcg[&5] - 0.5).abs() < 1e-12);
        assert_eq!(categories["single-hop"].recall[&1], 1.0);
    }

    #[test]
    fn latency_percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=20).map(f64::from).collect();
        let summary = latency(&samples);
        assert_eq!(summary.p50_ms, 10.0);
        assert_eq!(summary.p95_ms, 19.0);
        assert!((summary.mean_ms - 10.5).abs() < 1e-12);
        assert_eq!(latency(&[]).p95_ms, 0.0);
        assert_eq!(latency(&[3.0]).p50_ms, 3.0);
    }

    #[test]
    fn words_split_on_whitespace() {
        assert_eq!(words("  [8 May 2023] Caroline:\n hi  there "), 6);
        assert_eq!(words(""), 0);
    }
}
