//! Citations checked against what their sources say, without a model. Every cited claim (the
//! sentence a citation ends, or the one before a citation standing alone) is looked for in
//! the text actually read from each source it cites: the claim's informative words — analysed
//! as the keyword index analyses them, Chinese by its characters' pairs — weighted by how
//! rare they are among all the passages of the report's sources, and the best share of that
//! weight one passage (two neighbouring sentences) of the cited source holds. Below the line
//! the citation is unsupported: marked in the report (`[n: not found in the source]`), counted
//! in `research_complete`, and its claim never becomes a conclusion.
//!
//! Rarity is what tells a wrong source from the right one: every source of a research shares
//! its topic's words, only the right one holds the claim's names, figures and particulars.
//! `tests/fixtures/citation-check.json` measures the check (reports with planted wrong and
//! made-up citations): see the test at the end of this file.

use std::collections::{BTreeSet, HashMap};

use super::citations::{rewrite_brackets, strip_citations};
use super::{CitationCheck, UnsupportedCitation};
use crate::memory::relevance::{Terms, query_words};
use crate::text::split::sentences;

/// What a citation the check could not find in its source says instead.
pub(crate) const NOT_FOUND: &str = "not found in the source";

/// The share of a claim's weighted words one passage of the cited source must hold. On the
/// fixture, claims cited to the wrong source or made up reach 0.00–0.46 (all but one ≤ 0.33)
/// and supported ones 0.35–1.00 (paraphrases from 0.35, verbatim from 0.66).
const SUPPORT: f64 = 0.35;
/// A claim with fewer informative words says too little to be checked (it passes).
const MIN_WORDS: usize = 2;
/// A source is checked on this much of its text at most.
const MAX_SOURCE_CHARS: usize = 60_000;
/// Sentences per passage.
const PASSAGE_SENTENCES: usize = 2;

/// The passages of every source of one report, and how rare each word is among them.
pub(crate) struct Checker {
    passages: HashMap<usize, Vec<Terms>>,
    all: usize,
    /// How many passages hold a word, by word (filled as claims ask).
    holders: HashMap<String, usize>,
}

impl Checker {
    /// `sources`: each citation number with the text read from its source.
    pub(crate) fn new(sources: &[(usize, &str)]) -> Self {
        let passages: HashMap<usize, Vec<Terms>> = sources
            .iter()
            .map(|(n, text)| (*n, passages(crate::text::prefix(text, MAX_SOURCE_CHARS))))
            .collect();
        let all = passages.values().map(Vec::len).sum();
        Self {
            passages,
            all,
            holders: HashMap::new(),
        }
    }

    fn idf(&mut self, word: &str) -> f64 {
        let holders = match self.holders.get(word) {
            Some(&count) => count,
            None => {
                let count = self
                    .passages
                    .values()
                    .flatten()
                    .filter(|terms| terms.holds(word))
                    .count();
                self.holders.insert(word.to_string(), count);
                count
            }
        };
        // A word no passage holds weighs as much as one only a single passage holds: the
        // claim's own wording (a paraphrase's verbs) must not outweigh what it shares.
        let holders = holders.max(1);
        let x = ((self.all - holders.min(self.all)) as f64 + 0.5) / (holders as f64 + 0.5);
        (1.0 + x).ln()
    }

    /// The best share of `words`' weight one passage of source `n` holds; `None` when the
    /// source has no text to look in.
    fn support(&mut self, words: &[String], n: usize) -> Option<f64> {
        let weights: Vec<f64> = words.iter().map(|word| self.idf(word)).collect();
        let whole: f64 = weights.iter().sum();
        let passages = self.passages.get(&n).filter(|found| !found.is_empty())?;
        if whole <= 0.0 {
            return Some(0.0);
        }
        let best = passages
            .iter()
            .map(|terms| {
                words
                    .iter()
                    .zip(&weights)
                    .filter(|(word, _)| terms.holds(word))
                    .map(|(_, weight)| weight)
                    .sum::<f64>()
            })
            .fold(0.0, f64::max);
        Some(best / whole)
    }

    /// Checks every cited claim of `body`; returns it with unsupported citations marked, and
    /// what was found.
    pub(crate) fn check(&mut self, body: &str) -> (String, CitationCheck) {
        let mut found = CitationCheck::default();
        let mut out = String::with_capacity(body.len());
        for (index, line) in body.split('\n').enumerate() {
            if index > 0 {
                out.push('\n');
            }
            out.push_str(&self.check_line(line, &mut found));
        }
        (out, found)
    }

    fn check_line(&mut self, line: &str, found: &mut CitationCheck) -> String {
        // A citation standing alone after a sentence's end cites that sentence.
        let mut claims: Vec<(String, Vec<&str>)> = Vec::new();
        for sentence in sentences(line) {
            let claim = strip_citations(sentence);
            match claims.last_mut() {
                Some((_, pieces)) if claim.is_empty() => pieces.push(sentence),
                _ => claims.push((claim, vec![sentence])),
            }
        }
        let mut out = String::with_capacity(line.len());
        for (claim, pieces) in claims {
            let cited: BTreeSet<usize> = pieces
                .iter()
                .flat_map(|piece| super::citations(piece))
                .collect();
            let mut unsupported = BTreeSet::new();
            if !cited.is_empty() {
                let words = query_words(&claim);
                for n in cited {
                    let support = if words.len() < MIN_WORDS {
                        None
                    } else {
                        self.support(&words, n)
                    };
                    match support {
                        None => found.unchecked += 1,
                        Some(share) => {
                            found.checked += 1;
                            if share >= SUPPORT {
                                found.supported += 1;
                            } else {
                                unsupported.insert(n);
                                found.unsupported.push(UnsupportedCitation {
                                    n,
                                    claim: crate::text::truncate(claim.trim(), 300),
                                    support: (share * 1000.0).round() / 1000.0,
                                });
                            }
                        }
                    }
                }
            }
            for piece in pieces {
                out.push_str(&rewrite_brackets(piece, |numbers| {
                    mark(numbers, &unsupported)
                }));
            }
        }
        out
    }
}

/// A citation bracket with its unsupported numbers moved to brackets of their own that say so.
fn mark(numbers: &[usize], unsupported: &BTreeSet<usize>) -> String {
    let (bad, good): (Vec<usize>, Vec<usize>) =
        numbers.iter().partition(|n| unsupported.contains(n));
    let mut shown = Vec::new();
    if !good.is_empty() {
        let good: Vec<String> = good.iter().map(usize::to_string).collect();
        shown.push(format!("[{}]", good.join(", ")));
    }
    shown.extend(bad.iter().map(|n| format!("[{n}: {NOT_FOUND}]")));
    shown.join(" ")
}

/// The passages of a source: every run of `PASSAGE_SENTENCES` neighbouring sentences.
fn passages(text: &str) -> Vec<Terms> {
    let sentences: Vec<&str> = text
        .split('\n')
        .flat_map(sentences)
        .filter(|sentence| !sentence.trim().is_empty())
        .collect();
    if sentences.len() <= PASSAGE_SENTENCES {
        return vec![Terms::of(text)];
    }
    sentences
        .windows(PASSAGE_SENTENCES)
        .map(|pair| Terms::of(&pair.concat()))
        .collect()
}

/// The report without the sentences whose citations were not found (conclusions are drawn
/// from what remains).
pub(crate) fn supported_only(report: &str) -> String {
    let mut out = String::with_capacity(report.len());
    for (index, line) in report.split('\n').enumerate() {
        if index > 0 {
            out.push('\n');
        }
        if line.contains(NOT_FOUND) {
            let kept: String = sentences(line)
                .into_iter()
                .filter(|sentence| !sentence.contains(NOT_FOUND))
                .collect();
            out.push_str(kept.trim_end());
        } else {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn a_claim_cited_to_the_wrong_source_is_marked_and_the_right_one_kept() {
        let sources = [
            (
                1,
                "The Rance tidal station in Brittany opened in 1966. It produces about 500 GWh a year from a barrage across the estuary.",
            ),
            (
                2,
                "Tidal stream turbines work like underwater windmills. The MeyGen array in the Pentland Firth installed its first four turbines in 2016.",
            ),
        ];
        let mut checker = Checker::new(&sources);
        let body = "The Rance station in Brittany has produced power since 1966 [1]. MeyGen put its first four turbines into the Pentland Firth in 2016 [1, 2]. Turbines. [2]";
        let (marked, found) = checker.check(body);
        assert_eq!(
            marked,
            "The Rance station in Brittany has produced power since 1966 [1]. MeyGen put its first four turbines into the Pentland Firth in 2016 [2] [1: not found in the source]. Turbines. [2]"
        );
        assert_eq!(found.checked, 3);
        assert_eq!(found.supported, 2);
        assert_eq!(found.unchecked, 1, "one word says too little to check");
        assert_eq!(found.unsupported.len(), 1);
        assert_eq!(found.unsupported[0].n, 1);
        assert!(found.unsupported[0].claim.starts_with("MeyGen put"));
        assert_eq!(
            supported_only(&marked),
            "The Rance station in Brittany has produced power since 1966 [1]. Turbines. [2]"
        );
    }

    #[derive(Deserialize)]
    struct Fixture {
        sets: Vec<Set>,
    }

    #[derive(Deserialize)]
    struct Set {
        topic: String,
        sources: Vec<FixtureSource>,
        claims: Vec<Claim>,
    }

    #[derive(Deserialize)]
    struct FixtureSource {
        n: usize,
        text: String,
    }

    #[derive(Deserialize)]
    struct Claim {
        claim: String,
        cites: usize,
        supported: bool,
        kind: String,
    }

    /// The check measured on reports with planted wrong and made-up citations: precision and
    /// recall of "unsupported" (the figures are quoted in README's research section).
    #[test]
    fn the_check_finds_planted_wrong_citations() {
        let fixture: Fixture =
            serde_json::from_str(include_str!("../../../tests/fixtures/citation-check.json"))
                .expect("the fixture parses");
        let (mut flagged_right, mut flagged, mut planted) = (0usize, 0usize, 0usize);
        let mut by_kind: HashMap<String, (usize, usize)> = HashMap::new();
        for set in &fixture.sets {
            let texts: Vec<(usize, &str)> = set
                .sources
                .iter()
                .map(|source| (source.n, source.text.as_str()))
                .collect();
            let mut checker = Checker::new(&texts);
            for claim in &set.claims {
                let body = format!("{} [{}]", claim.claim, claim.cites);
                let (_, found) = checker.check(&body);
                let said_unsupported = !found.unsupported.is_empty();
                let entry = by_kind.entry(claim.kind.clone()).or_default();
                entry.1 += 1;
                if said_unsupported != claim.supported {
                    entry.0 += 1;
                } else {
                    eprintln!(
                        "missed ({}, {}): {:?} → [{}] {:?}",
                        set.topic, claim.kind, claim.claim, claim.cites, found
                    );
                }
                flagged += usize::from(said_unsupported);
                planted += usize::from(!claim.supported);
                flagged_right += usize::from(said_unsupported && !claim.supported);
            }
        }
        let precision = flagged_right as f64 / flagged.max(1) as f64;
        let recall = flagged_right as f64 / planted.max(1) as f64;
        let mut kinds: Vec<_> = by_kind.into_iter().collect();
        kinds.sort();
        eprintln!(
            "citation check: precision {precision:.3} recall {recall:.3} ({flagged_right} of {planted} planted found, {flagged} flagged); right by kind: {kinds:?}"
        );
        assert!(planted >= 20, "the fixture plants enough wrong citations");
        assert!(precision >= 0.9, "precision {precision:.3}");
        assert!(recall >= 0.9, "recall {recall:.3}");
    }
}
