//! Calibrated relevance: how likely a text (a memory, a passage) is about a query, as a
//! probability every decision about meaning shares — recall's gate and tail, `forget`,
//! duplicate detection and research sources — each at its own operating point
//! (`memory.relevance`, [`crate::config::RelevanceSettings`]).
//!
//! Raw cosines cannot be compared across models (all-MiniLM-L6-v2 puts unrelated sentences
//! near 0.1–0.3, multilingual-e5 near 0.75–0.9), nor across queries of one model (a short
//! question sits closer to everything than a long statement). So a cosine is first turned
//! into a **z-score against the query's own background**: at load, the embedder embeds a fixed
//! set of unrelated statements (`background.txt`, English and Chinese); a query's mean cosine
//! to the background of its script is "not about this" for that query and that model, the
//! spread of the background statements' cosines among themselves the model's unit, and
//! `z = (cosine − mean) / spread`. The lexical evidence is the keyword
//! index's coverage: the idf-weighted share of the query's informative words (stemmed English
//! words, jieba words, Han pairs; informative = held by few texts) that the text holds. A small
//! model over the two (`coefficients.json`: a noisy OR of one logistic curve each, fitted by
//! `eval/relevance/fit.py` on the hand-written sets in `eval/relevance/` for both shipped
//! embedders at once) gives the probability.
//!
//! Pure apart from [`Relevance::calibrate`], which embeds the background once.

mod terms;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub(crate) use terms::query_words;
pub use terms::{Corpus, Terms, forget_subject};

use crate::llm::embed::{EmbedError, Embedder};

/// The background statements, `en<TAB>text` or `zh<TAB>text` per line.
const BACKGROUND: &str = include_str!("background.txt");
/// The fitted model (`eval/relevance/fit.py` writes it).
const COEFFICIENTS: &str = include_str!("coefficients.json");

/// The share of a query's background cosines, from the top, left out of its mean and spread:
/// a query that happens to be about one or two background statements keeps its baseline.
const BACKGROUND_TRIM: f64 = 0.1;
/// The spread never goes below this (a degenerate embedder that maps everything alike).
const MIN_SPREAD: f64 = 1e-3;

/// The fitted model: two pieces of evidence, each a logistic curve, combined as a noisy OR —
/// `p = 1 − (1 − σ(a + b·z + t·turn + h·han)) · (1 − σ(c + d·coverage + u·turn))`. Meaning
/// (the z-score) and words (the coverage of the query's informative words) can each show
/// that a text is about the query; neither has to. `turn` (1 for a conversation turn, 0 for a
/// statement) shifts each curve: a turn is chatty and long, close to many questions about its
/// conversation, so the same z says less of it. `han` (1 for a query in Chinese) shifts the
/// meaning curve: a model's cosines are not spread alike in every language.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Coefficients {
    pub meaning_intercept: f64,
    pub meaning_z: f64,
    #[serde(default)]
    pub meaning_turn: f64,
    #[serde(default)]
    pub meaning_han: f64,
    pub words_intercept: f64,
    pub words_coverage: f64,
    #[serde(default)]
    pub words_turn: f64,
}

/// The coefficients of each decision, each calibrated on its own pairs: recall (also research
/// sources: is this text about that question?), forget (is this memory what a short request
/// names, every word of it meant?) and duplicate (do two statements say the same thing?).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Calibration {
    pub recall: Coefficients,
    pub forget: Coefficients,
    pub duplicate: Coefficients,
}

/// `coefficients.json`: a calibration per embedder the fit saw, and one fitted on all of them
/// for any other embedder.
#[derive(Debug, Clone, Deserialize)]
struct CoefficientsFile {
    default: Calibration,
    #[serde(default)]
    models: std::collections::BTreeMap<String, Calibration>,
}

impl Calibration {
    /// The committed calibration for `model_id`: its own when the fit saw it, else the one
    /// fitted on every model.
    pub(crate) fn shipped(model_id: &str) -> Self {
        match serde_json::from_str::<CoefficientsFile>(COEFFICIENTS) {
            Ok(file) => file.models.get(model_id).copied().unwrap_or(file.default),
            Err(error) => {
                // The file is compiled in and checked by a test; this is a guard, not a path.
                tracing::error!(%error, "the relevance coefficients do not parse");
                let fallback = Coefficients {
                    meaning_intercept: -5.6,
                    meaning_z: 0.83,
                    meaning_turn: -3.0,
                    meaning_han: 0.0,
                    words_intercept: -6.8,
                    words_coverage: 9.1,
                    words_turn: 0.0,
                };
                Self {
                    recall: fallback,
                    forget: fallback,
                    duplicate: fallback,
                }
            }
        }
    }
}

/// The evidence that a text is about a query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Features {
    /// The cosine as a z-score against the query's background.
    pub z: f64,
    /// The share of the query's informative words the text holds, weighted by idf
    /// ([`Corpus::coverage`], or the keyword index's coverage in recall).
    pub coverage: f64,
    /// The text is a conversation turn.
    pub turn: bool,
    /// The query is in Chinese (has a Han character).
    pub han: bool,
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x.clamp(-40.0, 40.0)).exp())
}

impl Features {
    pub(crate) fn probability(&self, c: &Coefficients) -> f64 {
        let turn = if self.turn { 1.0 } else { 0.0 };
        let han = if self.han { 1.0 } else { 0.0 };
        let meaning = sigmoid(
            c.meaning_intercept
                + c.meaning_z * self.z
                + c.meaning_turn * turn
                + c.meaning_han * han,
        );
        let words =
            sigmoid(c.words_intercept + c.words_coverage * self.coverage + c.words_turn * turn);
        1.0 - (1.0 - meaning) * (1.0 - words)
    }
}

/// Which background a text is measured against: Chinese when it has a Han character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Latin,
    Han,
}

impl Script {
    fn of(text: &str) -> Self {
        if text.chars().any(crate::text::script::is_han) {
            Script::Han
        } else {
            Script::Latin
        }
    }
}

/// An embedder's calibration: the background vectors, per script, and the model.
pub struct Relevance {
    model_id: String,
    latin: Vec<Vec<f32>>,
    han: Vec<Vec<f32>>,
    /// Per script, the model's spread of unrelated cosines: the mean, over the background
    /// statements, of each one's spread against the others.
    latin_spread: f64,
    han_spread: f64,
    calibration: Calibration,
}

impl std::fmt::Debug for Relevance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relevance")
            .field("model_id", &self.model_id)
            .field("background", &(self.latin.len(), self.han.len()))
            .field("calibration", &self.calibration)
            .finish()
    }
}

/// A query made ready for scoring: its vector, its background and its informative words.
#[derive(Debug, Clone)]
pub struct QueryProfile {
    vector: Vec<f32>,
    mean: f64,
    spread: f64,
    words: Vec<String>,
    han: bool,
}

impl QueryProfile {
    pub fn vector(&self) -> &[f32] {
        &self.vector
    }

    /// The z-score of a cosine against this query's background.
    pub fn z(&self, cosine: f32) -> f64 {
        (f64::from(cosine) - self.mean) / self.spread
    }

    /// The query's informative words.
    pub fn words(&self) -> &[String] {
        &self.words
    }
}

fn background_texts() -> (Vec<String>, Vec<String>) {
    let mut latin = Vec::new();
    let mut han = Vec::new();
    for line in BACKGROUND.lines() {
        if line.starts_with('#') {
            continue;
        }
        match line.split_once('\t') {
            Some(("en", text)) => latin.push(text.trim().to_string()),
            Some(("zh", text)) => han.push(text.trim().to_string()),
            _ => {}
        }
    }
    (latin, han)
}

impl Relevance {
    /// Embeds the background statements with `embedder` (as stored texts, like memories and
    /// passages) once.
    pub(crate) async fn calibrate(embedder: &dyn Embedder) -> Result<Arc<Self>, EmbedError> {
        let (latin_texts, han_texts) = background_texts();
        let count = latin_texts.len();
        let all: Vec<String> = latin_texts.into_iter().chain(han_texts).collect();
        let mut vectors = embedder.embed(&all).await?;
        let han = vectors.split_off(count.min(vectors.len()));
        let spread = |background: &[Vec<f32>]| {
            let spreads: Vec<f64> = background
                .iter()
                .map(|vector| trimmed_mean_and_spread(background, vector).1)
                .collect();
            if spreads.is_empty() {
                1.0
            } else {
                spreads.iter().sum::<f64>() / spreads.len() as f64
            }
        };
        let (latin_spread, han_spread) = (spread(&vectors), spread(&han));
        Ok(Arc::new(Self {
            model_id: embedder.model_id().to_string(),
            latin: vectors,
            han,
            latin_spread,
            han_spread,
            calibration: Calibration::shipped(embedder.model_id()),
        }))
    }

    /// The background of a text's script and the model's spread there.
    fn background(&self, text: &str) -> (&[Vec<f32>], f64) {
        match Script::of(text) {
            Script::Han if !self.han.is_empty() => (&self.han, self.han_spread),
            _ => (&self.latin, self.latin_spread),
        }
    }

    /// Prepares `query` (its text and its vector, embedded as a query) for scoring: its mean
    /// cosine to the background of its script (the top `BACKGROUND_TRIM` left out) is its
    /// baseline, and the model's spread of unrelated cosines the unit. (The query's own
    /// spread, from 36 cosines, is too noisy a unit: it cost LoCoMo's held-out pairs 10 % more
    /// log loss.)
    pub(crate) fn profile(&self, query: &str, vector: Vec<f32>) -> QueryProfile {
        let (background, spread) = self.background(query);
        let (mean, _) = trimmed_mean_and_spread(background, &vector);
        QueryProfile {
            vector,
            mean,
            spread: spread.max(MIN_SPREAD),
            words: query_words(query),
            han: Script::of(query) == Script::Han,
        }
    }

    /// The probability that a text is about the query: its vector is `cosine` from the
    /// query's, it covers `coverage` of the query's informative words, and it is a
    /// conversation turn or not.
    pub fn score(&self, query: &QueryProfile, cosine: f32, coverage: f64, turn: bool) -> f64 {
        Features {
            z: query.z(cosine),
            coverage,
            turn,
            han: query.han,
        }
        .probability(&self.calibration.recall)
    }

    /// The probability that a memory is what a forget request names (`query`: the request's
    /// subject, [`forget_subject`]): its vector is `cosine` from the subject's and it holds
    /// `share` of the subject's words ([`Terms::coverage`]).
    pub fn forget_score(&self, query: &QueryProfile, cosine: f32, share: f64) -> f64 {
        Features {
            z: query.z(cosine),
            coverage: share,
            turn: false,
            han: query.han,
        }
        .probability(&self.calibration.forget)
    }

    /// The evidence that two stored statements say the same thing: each asked of the other
    /// (its vector's z-score against the asking one's background, the share of the asking
    /// one's words it holds), the weaker of the two directions of each.
    pub fn duplicate_features(&self, a: (&str, &[f32]), b: (&str, &[f32])) -> Features {
        let cosine = cosine(a.1, b.1);
        let (terms_a, terms_b) = (Terms::of(a.0), Terms::of(b.0));
        let profile_a = self.profile(a.0, a.1.to_vec());
        let profile_b = self.profile(b.0, b.1.to_vec());
        Features {
            z: profile_a.z(cosine).min(profile_b.z(cosine)),
            coverage: terms_b
                .coverage(profile_a.words())
                .min(terms_a.coverage(profile_b.words())),
            turn: false,
            han: profile_a.han || profile_b.han,
        }
    }

    /// The probability that two stored statements (text and vector each) say the same thing.
    pub(crate) fn duplicate_score(&self, a: (&str, &[f32]), b: (&str, &[f32])) -> f64 {
        self.duplicate_features(a, b)
            .probability(&self.calibration.duplicate)
    }

    /// [`Relevance::score`] for a text and its vector, with its coverage among `corpus` (the
    /// texts it was found with; every word counts as informative without one).
    pub(crate) fn score_text(
        &self,
        query: &QueryProfile,
        text: &Terms,
        vector: &[f32],
        corpus: Option<&Corpus>,
    ) -> f64 {
        let coverage = match corpus {
            Some(corpus) => corpus.coverage(query.words(), text),
            None => text.coverage(query.words()),
        };
        self.score(query, cosine(query.vector(), vector), coverage, false)
    }
}

/// The mean and spread of `vector`'s cosines to `background`, the top `BACKGROUND_TRIM` left
/// out (a query about one or two background statements keeps its baseline).
fn trimmed_mean_and_spread(background: &[Vec<f32>], vector: &[f32]) -> (f64, f64) {
    let mut cosines: Vec<f64> = background
        .iter()
        .map(|item| f64::from(cosine(vector, item)))
        .collect();
    cosines.sort_by(f64::total_cmp);
    let keep = ((cosines.len() as f64) * (1.0 - BACKGROUND_TRIM)).ceil() as usize;
    cosines.truncate(keep.max(2).min(cosines.len()));
    mean_and_spread(&cosines)
}

fn mean_and_spread(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 1.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, variance.sqrt().max(MIN_SPREAD))
}

/// The cosine of two vectors (0 when either is all zeros or their lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    crate::memory::rank::cosine(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_holds_both_scripts() {
        let (latin, han) = background_texts();
        assert_eq!((latin.len(), han.len()), (40, 40));
        assert!(latin.iter().all(|t| Script::of(t) == Script::Latin));
        assert!(han.iter().all(|t| Script::of(t) == Script::Han));
    }

    #[test]
    fn the_shipped_coefficients_parse() {
        let parsed: CoefficientsFile = serde_json::from_str(COEFFICIENTS).unwrap();
        for model in ["multilingual-e5-small-q4", "all-MiniLM-L6-v2"] {
            assert_eq!(Calibration::shipped(model), parsed.models[model], "{model}");
        }
        let shipped = Calibration::shipped("text-embedding-3-small");
        assert_eq!(shipped, parsed.default);
        for c in [shipped.recall, shipped.forget, shipped.duplicate] {
            assert!(c.meaning_z > 0.0 && c.words_coverage > 0.0, "{c:?}");
        }
    }

    #[test]
    fn probability_grows_with_each_feature() {
        let c = Calibration::shipped("any").recall;
        let at = |z: f64, coverage: f64, turn: bool| {
            Features {
                z,
                coverage,
                turn,
                han: false,
            }
            .probability(&c)
        };
        let base = at(1.0, 0.0, false);
        assert!(base < 0.05, "{base}");
        assert!(at(8.0, 0.0, false) > 0.5);
        assert!(at(1.0, 1.0, false) > 0.5);
        // The same z says less of a conversation turn.
        assert!(at(6.0, 0.0, true) < at(6.0, 0.0, false));
    }

    #[test]
    fn spread_and_mean_of_a_trimmed_background() {
        let (mean, spread) = mean_and_spread(&[0.1, 0.2, 0.3]);
        assert!((mean - 0.2).abs() < 1e-12);
        assert!((spread - (0.02f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_and_spread(&[0.5, 0.5]).1, MIN_SPREAD);
    }
}
