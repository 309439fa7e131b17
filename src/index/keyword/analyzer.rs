//! The keyword index's text analysis: English words (stemmed, stop words out) and Chinese words
//! (jieba) in one pass, Han character unigrams and bigrams for the second field, and what a
//! query's words are worth (question words, informative words, compounds). Pure functions over
//! tantivy's tokenizer traits; the index itself is in `mod.rs`.

use super::*;

/// Jieba segmentation that drops whitespace and punctuation tokens: jieba
/// emits every separator as its own token.
#[derive(Clone, Default)]
pub(super) struct MixedScriptTokenizer {
    jieba: JiebaTokenizer,
}

pub(super) struct WordTokens<'a> {
    inner: JiebaTokenStream<'a>,
}

impl Tokenizer for MixedScriptTokenizer {
    type TokenStream<'a> = WordTokens<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> WordTokens<'a> {
        WordTokens {
            inner: self.jieba.token_stream(text),
        }
    }
}

impl TokenStream for WordTokens<'_> {
    fn advance(&mut self) -> bool {
        while self.inner.advance() {
            if self.inner.token().text.chars().any(char::is_alphanumeric) {
                return true;
            }
        }
        false
    }

    fn token(&self) -> &Token {
        self.inner.token()
    }

    fn token_mut(&mut self) -> &mut Token {
        self.inner.token_mut()
    }
}

/// The `mnemo` analyzer: jieba words (English runs stay whole words),
/// long-token removal, lowercase, English stop words, English stemming.
pub(crate) fn mnemo_analyzer() -> Result<TextAnalyzer, IndexError> {
    let stop_words = StopWordFilter::new(Language::English).ok_or_else(|| {
        IndexError::Internal("tantivy built without the English stop-word list".into())
    })?;
    Ok(TextAnalyzer::builder(MixedScriptTokenizer::default())
        .filter(RemoveLongFilter::limit(MAX_TOKEN_BYTES))
        .filter(LowerCaser)
        .filter(stop_words)
        .filter(Stemmer::new(Language::English))
        .build())
}

/// Which n-grams [`han_grams`] makes of a run of Han characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Grams {
    /// What a memory is indexed under: every character and every pair of neighbours.
    Index,
    /// What a query word asks for: a lone character itself, a longer word its pairs (its
    /// characters alone would match every memory sharing one of them).
    Query,
}

/// The Han n-grams of `text` as `(byte from, byte to, gram)`, run by run: anything that is
/// not a Han character (punctuation, full-width or not, spaces, Latin, digits) ends a run
/// and is never part of a gram.
pub(super) fn han_grams(text: &str, grams: Grams) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut run: Vec<(usize, char)> = Vec::new();
    let mut flush = |run: &mut Vec<(usize, char)>| {
        let whole_run = run.len() == 1 || grams == Grams::Index;
        for (index, (from, c)) in run.iter().enumerate() {
            if whole_run {
                out.push((*from, from + c.len_utf8(), c.to_string()));
            }
            if let Some((next_from, next)) = run.get(index + 1) {
                out.push((*from, next_from + next.len_utf8(), format!("{c}{next}")));
            }
        }
        run.clear();
    };
    for (from, c) in text.char_indices() {
        if is_han(c) {
            run.push((from, c));
        } else if !run.is_empty() {
            flush(&mut run);
        }
    }
    flush(&mut run);
    out
}

/// The `mnemo_han` tokenizer: [`han_grams`] of the text, for indexing.
#[derive(Clone, Default)]
pub(super) struct HanGramTokenizer;

/// The tokens of one text, made up front (memories are short).
pub(super) struct HanGramTokens {
    tokens: std::vec::IntoIter<Token>,
    token: Token,
}

impl Tokenizer for HanGramTokenizer {
    type TokenStream<'a> = HanGramTokens;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> HanGramTokens {
        let tokens: Vec<Token> = han_grams(text, Grams::Index)
            .into_iter()
            .enumerate()
            .map(|(position, (offset_from, offset_to, text))| Token {
                offset_from,
                offset_to,
                position,
                text,
                position_length: 1,
            })
            .collect();
        HanGramTokens {
            tokens: tokens.into_iter(),
            token: Token::default(),
        }
    }
}

impl TokenStream for HanGramTokens {
    fn advance(&mut self) -> bool {
        match self.tokens.next() {
            Some(token) => {
                self.token = token;
                true
            }
            None => false,
        }
    }

    fn token(&self) -> &Token {
        &self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.token
    }
}

/// The `mnemo_han` analyzer: every Han character and pair of neighbouring Han characters,
/// nothing else (English text leaves its `*_han` field empty).
pub(crate) fn han_analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(HanGramTokenizer).build()
}

/// Words that shape a question but name nothing, as the analyzer leaves them (stemmed):
/// left out of BM25 queries, where they would match every memory that asks something.
/// The Chinese ones as jieba cuts them, simplified and traditional.
pub(super) const QUESTION_WORDS: &[&str] = &[
    "what",
    "when",
    "where",
    "who",
    "whom",
    "whose",
    "which",
    "whi",
    "how",
    "do",
    "doe",
    "did",
    "has",
    "have",
    "had",
    "would",
    "could",
    "should",
    "can",
    "may",
    "might",
    "s",
    "t",
    "been",
    "being",
    "am",
    "were",
    "什么",
    "什麼",
    "甚麼",
    "吗",
    "嗎",
    "呢",
    "怎么",
    "怎麼",
    "怎么样",
    "怎麼樣",
    "为什么",
    "為什麼",
    "哪",
    "哪里",
    "哪裡",
    "哪儿",
    "哪兒",
    "哪个",
    "哪個",
    "哪些",
    "谁",
    "誰",
    "是否",
];

/// One analysed word of a query, and the Han n-grams ([`Grams::Query`]) that find it inside
/// other words: empty unless the word is all Han characters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct QueryWord {
    pub(super) word: String,
    pub(super) grams: Vec<String>,
}

impl QueryWord {
    pub(super) fn new(word: String) -> Self {
        let grams = if word.chars().all(is_han) {
            han_grams(&word, Grams::Query)
                .into_iter()
                .map(|(_, _, gram)| gram)
                .collect()
        } else {
            Vec::new()
        };
        Self { word, grams }
    }
}

/// "May" as the month ("in May", "May 2023", "early May"), which stays in the query.
pub(super) fn names_the_month_may(query: &str) -> bool {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.iter().enumerate().any(|(index, word)| {
        word == "may"
            && (index
                .checked_sub(1)
                .and_then(|i| words.get(i))
                .is_some_and(|before| {
                    matches!(
                        before.as_str(),
                        "in" | "on" | "of" | "early" | "late" | "mid"
                    )
                })
                || words
                    .get(index + 1)
                    .is_some_and(|after| after.chars().all(|c| c.is_ascii_digit())))
    })
}

/// The analysed words of a query, each once and sorted, without the words that only make it
/// a question ("what", "did", 什么, 吗, ...; "may" stays when it names the month).
pub(crate) fn informative_words(analyzer: &mut TextAnalyzer, query: &str) -> Vec<String> {
    let month_may = names_the_month_may(query);
    analyze(analyzer, &split_compounds(query))
        .into_iter()
        .filter(|word| !QUESTION_WORDS.contains(&word.as_str()) || (word == "may" && month_may))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect()
}

/// Splits hyphen-, slash- and underscore-joined compounds (`zq7-kestrel-4471`, `555-0142`,
/// `room_101`) so every part is its own term, in documents and queries alike.
pub(crate) fn split_compounds(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let joins = matches!(c, '-' | '/' | '_')
                && index > 0
                && chars[index - 1].is_alphanumeric()
                && chars
                    .get(index + 1)
                    .is_some_and(|next| next.is_alphanumeric());
            if joins { ' ' } else { *c }
        })
        .collect()
}

/// Runs `text` through `analyzer` and returns the token texts in order.
pub(crate) fn analyze(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stream = analyzer.token_stream(text);
    while stream.advance() {
        out.push(stream.token().text.clone());
    }
    out
}
