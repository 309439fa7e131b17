//! The workflow's own text work: dates, word counts, passages, MMR (the shared helpers come
//! from `crate::text`).

use crate::memory::rank::cosine;
use crate::search::SearchHit;
pub(super) use crate::text::script::is_cjk;
pub(super) use crate::text::split::{fixed as chunks, sentences};
pub(super) use crate::text::truncate;

use super::*;

pub(super) fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

pub(super) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Words of a report (CJK characters count as words).
pub(super) fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .map(|word| {
            let cjk = word.chars().filter(|c| is_cjk(*c)).count();
            if cjk > 0 { cjk } else { 1 }
        })
        .sum()
}

pub(super) fn format_hits(hits: &[SearchHit]) -> String {
    if hits.is_empty() {
        return "No results.".into();
    }
    hits.iter()
        .map(|hit| {
            let body = match &hit.content {
                Some(content) => truncate(content, 1_200),
                None => hit.snippet.clone(),
            };
            format!("- {} — {}\n{}", hit.title, hit.url, quote(&body))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paragraphs, long ones split at sentence ends (as document chunks are), of at most
/// `PASSAGE_CHARS`; paragraphs too short to say anything are skipped.
pub(super) fn split_passages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut short = Vec::new();
    for paragraph in text.split("\n\n") {
        let paragraph = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
        // A Chinese, Japanese or Korean character says about as much as two Latin letters.
        let width: usize = paragraph
            .chars()
            .map(|c| if is_cjk(c) { 2 } else { 1 })
            .sum();
        if width < 40 {
            // Kept only for a source with nothing longer (a note of one sentence), and never
            // a heading or a fragment of a word or two.
            if word_count(&paragraph) >= 3 && !paragraph.starts_with('#') {
                short.push(paragraph);
            }
            continue;
        }
        let mut pieces = Vec::new();
        crate::text::split::split_long(&paragraph, PASSAGE_CHARS, &mut pieces);
        out.extend(pieces.into_iter().map(str::to_string));
    }
    if out.is_empty() { short } else { out }
}

pub(super) fn passages_text(passages: &[Passage]) -> String {
    passages
        .iter()
        .map(|passage| format!("- {} [{}]", passage.text, passage.url))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Maximal marginal relevance: `k` items similar to `query` and unlike each other.
/// Returns (index, similarity to the query).
pub(super) fn mmr(query: &[f32], items: &[Vec<f32>], k: usize, lambda: f32) -> Vec<(usize, f32)> {
    let similarity: Vec<f32> = items.iter().map(|item| cosine(query, item)).collect();
    let mut chosen: Vec<usize> = Vec::new();
    while chosen.len() < k.min(items.len()) {
        let best = (0..items.len())
            .filter(|index| !chosen.contains(index))
            .map(|index| {
                let redundancy = chosen
                    .iter()
                    .map(|&other| cosine(&items[index], &items[other]))
                    .fold(0.0f32, f32::max);
                (
                    index,
                    lambda * similarity[index] - (1.0 - lambda) * redundancy,
                )
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((index, _)) => chosen.push(index),
            None => break,
        }
    }
    chosen
        .into_iter()
        .map(|index| (index, similarity[index]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_passages;

    #[test]
    fn a_source_of_one_short_sentence_still_has_a_passage() {
        // 39 characters: below the passage minimum, but all the source says.
        let passages = split_passages("# Otters\n\nSea otters hold hands while they sleep.\n");
        assert_eq!(passages, ["Sea otters hold hands while they sleep."]);
        // With a longer paragraph beside it, short ones stay out.
        let long =
            "Sea otters wrap themselves in kelp so that the current does not carry them off.";
        let passages = split_passages(&format!("Tiny note here.\n\n{long}"));
        assert_eq!(passages, [long]);
        assert!(split_passages("# Title\n\nok").is_empty());
    }
}
