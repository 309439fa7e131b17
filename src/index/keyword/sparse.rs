//! Keyword search as sparse vectors: the keyword index's own analysis turned into vectors that
//! a vector engine with an IDF modifier (Qdrant's `Modifier::Idf`) scores as this index's BM25.
//!
//! A view's text becomes one sparse vector. Each of its terms — the analysed words of the
//! words field, the Han characters and pairs of the Han field — gets an index: a 32-bit hash
//! of the field's tag and the term, so one vector holds both fields and the same term in two
//! fields is two entries (tantivy keeps separate statistics per field; so does the engine per
//! index). Its value is BM25's term-frequency part, `(k1 + 1)·tf / (tf + k1·(1 − b + b·len /
//! average))` with tantivy's k1 = 1.2 and b = 0.75, `len` the field's term count in this text
//! and `average` that field's average over the views indexed. The engine multiplies a matching
//! value by the query's weight of the index and by the index's idf over the points holding it,
//! `ln(1 + (N − n + 0.5) / (n + 0.5))` — the formula tantivy uses — so a score is the sum
//! tantivy computes, but for the averages, which the caller keeps (tantivy's change with every
//! write) and tantivy's one-byte length norm (exact below 40 terms).
//!
//! A query becomes the weights [`KeywordIndex::search_view`] gives its terms: 1 per word, 1
//! per Han pair or lone character of a Chinese query word ([`HAN_GRAM_BOOST`]), and
//! [`HAN_CHARACTER_BOOST`] per character of a longer Chinese word.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::index::vector::{KeywordQuery, MAX_SEARCH_LIMIT, PointKeywords, VectorIndex};

/// BM25's term-frequency saturation (tantivy's).
const K1: f32 = 1.2;
/// BM25's length normalisation (tantivy's).
const B: f32 = 0.75;

/// The field a term comes from, as its tag in the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SparseField {
    /// The analysed words (jieba, stemmed English).
    Words,
    /// The Han characters and pairs.
    Han,
}

impl SparseField {
    fn tag(self) -> u8 {
        match self {
            SparseField::Words => b'w',
            SparseField::Han => b'h',
        }
    }
}

/// The index of a term of `field`: FNV-1a over the field's tag, a zero byte and the term's
/// UTF-8. Fixed by this function alone (no seed, no library version), as the vectors stored
/// must keep meaning the same terms. Two terms sharing an index (a chance of about one in
/// 2³² per pair) are counted as one term.
fn term_index(field: SparseField, term: &str) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    std::iter::once(field.tag())
        .chain(std::iter::once(0))
        .chain(term.bytes())
        .fold(OFFSET, |hash, byte| {
            (hash ^ u32::from(byte)).wrapping_mul(PRIME)
        })
}

/// A sparse vector: indices strictly increasing, one value each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseVector {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl SparseVector {
    fn from_map(map: BTreeMap<u32, f32>) -> Self {
        let (indices, values) = map.into_iter().unzip();
        Self { indices, values }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The value at `index`, if the vector holds it.
    pub(crate) fn get(&self, index: u32) -> Option<f32> {
        self.indices
            .binary_search(&index)
            .ok()
            .map(|at| self.values[at])
    }
}

/// The number of terms of one view's text in each field: what a document vector's length
/// normalisation needs, and what the averages are made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldLengths {
    pub words: u32,
    pub han: u32,
}

/// The average number of terms of a view's text in each field, over the views indexed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AverageLengths {
    pub words: f32,
    pub han: f32,
}

impl Default for AverageLengths {
    fn default() -> Self {
        Self {
            words: 1.0,
            han: 1.0,
        }
    }
}

impl AverageLengths {
    /// The averages of `lengths` (1 for a field no text has terms in).
    #[cfg(test)]
    pub(crate) fn of(lengths: impl IntoIterator<Item = FieldLengths>) -> Self {
        let (mut count, mut words, mut han) = (0u64, 0u64, 0u64);
        for length in lengths {
            count += 1;
            words += u64::from(length.words);
            han += u64::from(length.han);
        }
        let average = |total: u64| {
            if total == 0 {
                1.0
            } else {
                total as f32 / count as f32
            }
        };
        Self {
            words: average(words),
            han: average(han),
        }
    }
}

/// One view's text analysed: each field's terms with their frequencies.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct AnalysedText {
    terms: BTreeMap<(SparseField, String), u32>,
    lengths: FieldLengths,
}

impl AnalysedText {
    #[cfg(test)]
    pub(crate) fn lengths(&self) -> FieldLengths {
        self.lengths
    }

    /// The document vector of this text, normalised against `average`.
    pub(crate) fn vector(&self, average: AverageLengths) -> SparseVector {
        let mut map = BTreeMap::new();
        for ((field, term), tf) in &self.terms {
            let (length, average) = match field {
                SparseField::Words => (self.lengths.words, average.words),
                SparseField::Han => (self.lengths.han, average.han),
            };
            let tf = *tf as f32;
            let norm = K1 * (1.0 - B + B * length as f32 / average.max(f32::MIN_POSITIVE));
            let value = (K1 + 1.0) * tf / (tf + norm);
            *map.entry(term_index(*field, term)).or_insert(0.0) += value;
        }
        SparseVector::from_map(map)
    }
}

/// The analysis of texts and queries into sparse vectors. Cheap to clone.
#[derive(Clone)]
pub struct SparseAnalyzer {
    words: TextAnalyzer,
}

impl std::fmt::Debug for SparseAnalyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseAnalyzer").finish_non_exhaustive()
    }
}

impl SparseAnalyzer {
    pub(crate) fn new() -> Result<Self, IndexError> {
        Ok(Self {
            words: mnemo_analyzer()?,
        })
    }

    /// A view's text as the keyword index would index it: the words of its compounds split
    /// apart, and every Han character and pair of neighbours.
    pub(crate) fn analyse(&self, text: &str) -> AnalysedText {
        let mut analysed = AnalysedText::default();
        let mut words = self.words.clone();
        for word in analyze(&mut words, &split_compounds(text)) {
            analysed.lengths.words += 1;
            *analysed
                .terms
                .entry((SparseField::Words, word))
                .or_insert(0) += 1;
        }
        for (_, _, gram) in han_grams(text, Grams::Index) {
            analysed.lengths.han += 1;
            *analysed.terms.entry((SparseField::Han, gram)).or_insert(0) += 1;
        }
        analysed
    }

    /// The query's informative words, each with the Han n-grams that find it inside other
    /// words — the words [`KeywordIndex::search_view`] asks for.
    pub(super) fn query_words(&self, query: &str) -> Vec<QueryWord> {
        let mut words = self.words.clone();
        informative_words(&mut words, query)
            .into_iter()
            .map(QueryWord::new)
            .collect()
    }

    /// The query vector of `query`: its words, weighed as the keyword index weighs them.
    /// Empty for a query of question words only.
    #[cfg(test)]
    pub(crate) fn query(&self, query: &str) -> SparseVector {
        query_vector(&self.query_words(query))
    }

    /// The index of `word` in the words field, and (a Chinese word) those of the Han n-grams
    /// that find it inside other words: a memory holds the word when its vector holds the
    /// first or every one of the others (`holding_query`).
    pub(super) fn holding_indices(word: &QueryWord) -> (u32, Vec<u32>) {
        (
            term_index(SparseField::Words, &word.word),
            word.grams
                .iter()
                .map(|gram| term_index(SparseField::Han, gram))
                .collect(),
        )
    }
}

/// The average number of terms of a view's text in each field, as the keyword vectors
/// written by the indexer assume them: tantivy's averages follow what the index holds, these
/// are fixed, so that every replica writes the same vector for the same text at any time.
/// Words: the LoCoMo dev conversations as the product stores them (a turn's own view about
/// 22 terms, with its neighbours about 59; a fact fewer). Han characters and pairs: the
/// Chinese set `eval/zh` (24 per memory); a text without Han characters has no such terms,
/// so this average only weighs Chinese texts against each other.
pub(crate) const AVERAGE_LENGTHS: [AverageLengths; 2] = [
    // Own view.
    AverageLengths {
        words: 20.0,
        han: 24.0,
    },
    // Context view.
    AverageLengths {
        words: 50.0,
        han: 24.0,
    },
];

/// Both views' keyword vectors of a memory whose views read `own` and `context`.
pub(crate) fn keyword_vectors(
    analyser: &SparseAnalyzer,
    own: &str,
    context: &str,
) -> PointKeywords {
    let own_terms = analyser.analyse(own);
    let own_vector = own_terms.vector(AVERAGE_LENGTHS[0]);
    let context = if context == own {
        own_terms.vector(AVERAGE_LENGTHS[1])
    } else {
        analyser.analyse(context).vector(AVERAGE_LENGTHS[1])
    };
    PointKeywords {
        own: own_vector,
        context,
    }
}

/// The query vector of analysed query words (see [`SparseAnalyzer::query`]).
pub(super) fn query_vector(words: &[QueryWord]) -> SparseVector {
    let grams: BTreeSet<&str> = words
        .iter()
        .flat_map(|word| word.grams.iter().map(String::as_str))
        .collect();
    let characters: BTreeSet<String> = words
        .iter()
        .filter(|word| !word.grams.is_empty() && word.word.chars().count() > 1)
        .flat_map(|word| word.word.chars().map(String::from))
        .filter(|character| !grams.contains(character.as_str()))
        .collect();
    let mut map = BTreeMap::new();
    for word in words {
        *map.entry(term_index(SparseField::Words, &word.word))
            .or_insert(0.0) += 1.0;
    }
    for gram in grams {
        *map.entry(term_index(SparseField::Han, gram)).or_insert(0.0) += HAN_GRAM_BOOST;
    }
    for character in &characters {
        *map.entry(term_index(SparseField::Han, character))
            .or_insert(0.0) += HAN_CHARACTER_BOOST;
    }
    SparseVector::from_map(map)
}

/// Whether a document vector holds `word` ([`SparseAnalyzer::holding_indices`]).
pub(super) fn holds(vector: &SparseVector, word: &QueryWord) -> bool {
    let (whole, grams) = SparseAnalyzer::holding_indices(word);
    vector.get(whole).is_some()
        || (!grams.is_empty() && grams.iter().all(|gram| vector.get(*gram).is_some()))
}

/// What the coverage of one query needs to know of its words, for every view's search of
/// the same recall ([`InformativeWords`]): which words single a memory of the user out, and
/// each word's idf in each view.
#[derive(Clone, Debug, Default)]
pub(super) struct WordStatistics {
    informative: BTreeSet<String>,
    idf: HashMap<(View, String), f64>,
}

/// Keyword search through an index that keeps keyword vectors ([`VectorIndex::keeps_keywords`]),
/// answering as [`KeywordIndex::search_view_sharing`] does: the same hits by the same BM25 and,
/// with `informative`, the same coverage — the idf of the informative query words a hit holds
/// over the idf of all the query's words, each idf read off the engine's own scores.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn search_view_sharing(
    index: &dyn VectorIndex,
    analyser: &SparseAnalyzer,
    user: UserId,
    query: &str,
    view: View,
    filter: &KeywordFilter,
    limit: usize,
    informative: Option<&InformativeWords>,
) -> Result<ViewHits, IndexError> {
    if limit == 0 || filter.is_unsatisfiable() {
        return Ok(ViewHits::default());
    }
    let words = analyser.query_words(query);
    if words.is_empty() {
        return Ok(ViewHits::default());
    }
    let search = KeywordQuery {
        user: Some(user),
        view,
        terms: query_vector(&words),
        filter: filter.clone(),
        limit,
        with_terms: informative.is_some(),
    };
    // The words' statistics do not depend on the hits: read them beside the search, so a
    // recall waits for one round of requests to the server instead of two.
    let statistics = async {
        match informative {
            Some(informative) => informative
                .statistics(|| word_statistics(index, user, &words))
                .await
                .map(Some),
            None => Ok(None),
        }
    };
    let (mut found, statistics) =
        futures::future::try_join(index.keyword_searches(vec![search]), statistics).await?;
    let found = found.pop().unwrap_or_default();
    let hits: Vec<(MemoryId, f32)> = found.iter().map(|hit| (hit.id, hit.score)).collect();
    let Some(statistics) = statistics.filter(|_| !found.is_empty()) else {
        return Ok(ViewHits {
            hits,
            coverage: Vec::new(),
        });
    };
    let weight = |word: &QueryWord| {
        statistics
            .idf
            .get(&(view, word.word.clone()))
            .copied()
            .unwrap_or_default()
    };
    let query_weight: f64 = words.iter().map(weight).sum();
    let coverage = found
        .iter()
        .map(|hit| {
            let terms = hit.terms.clone().unwrap_or_default();
            let held: f64 = words
                .iter()
                .filter(|word| statistics.informative.contains(&word.word))
                .filter(|word| holds(&terms, word))
                .map(weight)
                .sum();
            if query_weight > 0.0 {
                (held / query_weight) as f32
            } else {
                0.0
            }
        })
        .collect();
    Ok(ViewHits { hits, coverage })
}

/// Reads [`WordStatistics`] off the engine in one batch of searches, after the user's point
/// count ([`VectorIndex::recent_count`]: usually kept from an earlier recall, so no wait):
/// - a word's idf in a view: its term alone asked of every user's memories, the best hit's
///   score over the value it stores (the engine's score is value × idf); a word no memory
///   holds has the idf of a term in none of the `N` points;
/// - a word is informative when at most 5 % of the user's memories (and at least one) hold it
///   in their own view: its term and Han n-grams asked of the user's memories, the hits that
///   hold it counted up to that share.
async fn word_statistics(
    index: &dyn VectorIndex,
    user: UserId,
    words: &[QueryWord],
) -> Result<WordStatistics, IndexError> {
    let memories = index.recent_count(user).await?;
    let most = ((INFORMATIVE_SHARE * memories as f64).floor() as u64).max(1);
    let every_memory = KeywordFilter {
        include_archived: true,
        include_invalid: true,
        ..KeywordFilter::default()
    };
    // Counting stops past the share; a search returns at most MAX_SEARCH_LIMIT hits, so at a
    // user with more than 20 times that many memories a word found that often counts as common.
    let probed = (most as usize + 1).min(MAX_SEARCH_LIMIT);
    let mut searches = Vec::new();
    for word in words {
        let (whole, grams) = SparseAnalyzer::holding_indices(word);
        let mut holding = BTreeMap::from([(whole, 1.0)]);
        holding.extend(grams.iter().map(|gram| (*gram, 1.0)));
        searches.push(KeywordQuery {
            user: Some(user),
            view: View::Own,
            terms: SparseVector::from_map(holding),
            filter: every_memory.clone(),
            limit: probed,
            with_terms: true,
        });
        for &view in View::ALL {
            searches.push(KeywordQuery {
                user: None,
                view,
                terms: SparseVector::from_map(BTreeMap::from([(whole, 1.0)])),
                filter: every_memory.clone(),
                limit: 1,
                with_terms: true,
            });
        }
    }
    let (answers, points) =
        futures::future::try_join(index.keyword_searches(searches), index.keyword_points()).await?;
    let unheld = bm25_idf(0, points);
    let mut statistics = WordStatistics::default();
    let mut answers = answers.into_iter();
    for word in words {
        let (whole, _) = SparseAnalyzer::holding_indices(word);
        let holders = answers.next().unwrap_or_default();
        let held = holders
            .iter()
            .filter(|hit| hit.terms.as_ref().is_some_and(|terms| holds(terms, word)))
            .count();
        if held < probed {
            statistics.informative.insert(word.word.clone());
        }
        for &view in View::ALL {
            let probe = answers.next().unwrap_or_default();
            let idf = probe
                .first()
                .and_then(|hit| {
                    let value = hit.terms.as_ref()?.get(whole)?;
                    (value > 0.0).then(|| f64::from(hit.score) / f64::from(value))
                })
                .unwrap_or(unheld);
            statistics.idf.insert((view, word.word.clone()), idf);
        }
    }
    Ok(statistics)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BM25 with Qdrant's idf over `documents`, each a vector: what the engine computes.
    fn engine_scores(documents: &[SparseVector], query: &SparseVector) -> Vec<f32> {
        let total = documents.len() as f32;
        documents
            .iter()
            .map(|document| {
                query
                    .indices
                    .iter()
                    .zip(&query.values)
                    .filter_map(|(index, weight)| {
                        let value = document.get(*index)?;
                        let holders =
                            documents.iter().filter(|d| d.get(*index).is_some()).count() as f32;
                        let idf = (1.0 + (total - holders + 0.5) / (holders + 0.5)).ln();
                        Some(weight * value * idf)
                    })
                    .sum()
            })
            .collect()
    }

    #[test]
    fn term_indices_are_fixed_and_keep_fields_apart() {
        // FNV-1a of "w\0tide": the index of a stored term never changes.
        assert_eq!(term_index(SparseField::Words, "tide"), 0xa5c1_949e);
        assert_ne!(
            term_index(SparseField::Words, "茶"),
            term_index(SparseField::Han, "茶")
        );
    }

    #[test]
    fn a_text_counts_its_words_and_han_grams_apart() {
        let analyser = SparseAnalyzer::new().unwrap();
        let analysed = analyser.analyse("The tides, the tides! 我喝乌龙茶 room_101");
        // tide ×2, room, 101; jieba: 我 喝 乌龙 乌龙茶 (the word and the shorter one in it);
        // Han: 5 characters and 4 pairs.
        assert_eq!(analysed.lengths(), FieldLengths { words: 8, han: 9 });
        let vector = analysed.vector(AverageLengths::default());
        let tide = vector.get(term_index(SparseField::Words, "tide")).unwrap();
        let room = vector.get(term_index(SparseField::Words, "room")).unwrap();
        assert!(tide > room, "a term said twice weighs more: {tide} {room}");
        assert!(vector.get(term_index(SparseField::Han, "龙茶")).is_some());
        assert!(vector.get(term_index(SparseField::Words, "the")).is_none());
    }

    #[test]
    fn a_longer_text_weighs_the_same_term_less() {
        let analyser = SparseAnalyzer::new().unwrap();
        let short = analyser.analyse("tides at full moon");
        let long = analyser.analyse("tides at full moon and also many other words about boats");
        let average = AverageLengths::of([short.lengths(), long.lengths()]);
        let index = term_index(SparseField::Words, "tide");
        assert!(
            short.vector(average).get(index).unwrap() > long.vector(average).get(index).unwrap()
        );
    }

    #[test]
    fn query_weights_follow_the_keyword_index() {
        let analyser = SparseAnalyzer::new().unwrap();
        let query = analyser.query("What did Alice drink? 喝茶");
        assert_eq!(query.get(term_index(SparseField::Words, "alic")), Some(1.0));
        assert_eq!(query.get(term_index(SparseField::Words, "what")), None);
        // 喝茶: its pair weighs a gram, its lone characters the least.
        assert_eq!(
            query.get(term_index(SparseField::Han, "喝茶")),
            Some(HAN_GRAM_BOOST)
        );
        assert_eq!(
            query.get(term_index(SparseField::Han, "茶")),
            Some(HAN_CHARACTER_BOOST)
        );
        assert!(analyser.query("what did").is_empty());
    }

    /// The engine's sums over these vectors rank a small corpus as tantivy's BM25 does (the
    /// same averages: tantivy's, over the same documents).
    #[test]
    fn the_engines_sums_rank_as_the_keyword_index() {
        let user = UserId::for_tests();
        let (tantivy, ids) = corpus::tantivy(&[user]);
        let analyser = SparseAnalyzer::new().unwrap();
        let documents = corpus::vectors(&analyser);
        for query in corpus::QUERIES {
            let scores = engine_scores(&documents, &analyser.query(query));
            let mut sparse: Vec<(MemoryId, f32)> = ids[0]
                .iter()
                .zip(&scores)
                .filter(|(_, score)| **score > 0.0)
                .map(|(id, score)| (*id, *score))
                .collect();
            sparse.sort_by(|a, b| b.1.total_cmp(&a.1));
            corpus::assert_same_ranking(&tantivy, user, query, &sparse);
        }
    }

    #[test]
    fn a_vector_holds_a_chinese_word_as_itself_or_as_all_its_pairs() {
        let analyser = SparseAnalyzer::new().unwrap();
        let words = analyser.query_words("乌龙茶");
        let word = words.iter().find(|w| w.word == "乌龙茶").unwrap();
        let vector = analyser
            .analyse("她喜欢喝乌龙茶")
            .vector(AverageLengths::default());
        assert!(holds(&vector, word));
        // Not as a word of its own, but as both its pairs: held.
        let inside = analyser
            .analyse("乌龙茶园")
            .vector(AverageLengths::default());
        assert!(holds(&inside, word));
        // Only one of its pairs: not held.
        let other = analyser.analyse("乌龙").vector(AverageLengths::default());
        assert!(!holds(&other, word));
    }
}

/// A small corpus in English and Chinese, and tantivy's answers over it: what the sparse
/// path must answer the same (here with the engine's arithmetic, in the Qdrant server's tests
/// with the server's).
#[cfg(test)]
pub(crate) mod corpus {
    use super::*;

    pub(crate) const TEXTS: [&str; 7] = [
        "Spring tides happen when the sun and the moon line up, at new and full moon.",
        "Neap tides come at the quarter moons, when the tidal range is smallest.",
        "Sea otters hold hands in rafts and eat sea urchins.",
        "The moon was full when we sailed out of the harbour at dawn.",
        "我昨天在杭州喝了龙井茶",
        "她喜欢喝乌龙茶和咖啡",
        "Full moon party on the beach with friends, full of music.",
    ];

    pub(crate) const QUERIES: [&str; 5] = [
        "why are spring tides stronger at full moon",
        "sea otters",
        "喝茶",
        "乌龙茶",
        "moon",
    ];

    /// A tantivy index holding [`TEXTS`] for each of `users`, and each user's memory ids in
    /// the order of the texts.
    pub(crate) fn tantivy(users: &[UserId]) -> (KeywordIndex, Vec<Vec<MemoryId>>) {
        let index = KeywordIndex::open(None).unwrap();
        let mut ids = Vec::new();
        let mut ops = Vec::new();
        for user in users {
            let mine: Vec<MemoryId> = TEXTS.iter().map(|_| MemoryId::new()).collect();
            for (text, id) in TEXTS.iter().zip(&mine) {
                ops.push(KeywordOp::Upsert(KeywordDoc {
                    id: *id,
                    user_id: *user,
                    content: text.to_string(),
                    context: text.to_string(),
                    kind: "fact".into(),
                    created_at_ms: 0,
                    archived: false,
                    valid: true,
                }));
            }
            ids.push(mine);
        }
        index.apply(&ops, 1).unwrap();
        (index, ids)
    }

    /// The document vectors of [`TEXTS`], against their own averages (which are tantivy's
    /// over any number of copies of them).
    pub(crate) fn vectors(analyser: &SparseAnalyzer) -> Vec<SparseVector> {
        let analysed: Vec<AnalysedText> = TEXTS.iter().map(|t| analyser.analyse(t)).collect();
        let average = AverageLengths::of(analysed.iter().map(AnalysedText::lengths));
        analysed.iter().map(|a| a.vector(average)).collect()
    }

    /// `sparse` (best first) are tantivy's hits for `query`, in its order, each score within
    /// 2 % of tantivy's.
    pub(crate) fn assert_same_ranking(
        tantivy: &KeywordIndex,
        user: UserId,
        query: &str,
        sparse: &[(MemoryId, f32)],
    ) {
        let expected = tantivy
            .search(user, query, &KeywordFilter::default(), 10)
            .unwrap();
        assert_eq!(
            sparse.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            expected.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            "{query}: {sparse:?} vs {expected:?}"
        );
        for ((_, a), (_, b)) in sparse.iter().zip(&expected) {
            assert!((a - b).abs() <= 0.02 * b.abs(), "{query}: {a} vs {b}");
        }
    }
}
