//! The lexical side of relevance: a query's informative words and the share of them a text
//! holds, with the keyword index's own analysis (jieba words, English stop words and
//! stemming, Han pairs), so "held" means what it means to BM25.

use std::collections::HashSet;
use std::sync::OnceLock;

use tantivy::tokenizer::TextAnalyzer;

use crate::index::keyword;
use crate::text::script::is_han;

fn analyzer() -> Option<TextAnalyzer> {
    static ANALYZER: OnceLock<Option<TextAnalyzer>> = OnceLock::new();
    ANALYZER
        .get_or_init(|| keyword::mnemo_analyzer().ok())
        .clone()
}

/// Function words: they say how a sentence is built, not what it is about (the analyzer's
/// English stop list is short: it keeps "my", "about", "you"…).
const FUNCTION_WORDS: &[&str] = &[
    "i",
    "me",
    "my",
    "mine",
    "myself",
    "you",
    "your",
    "yours",
    "we",
    "us",
    "our",
    "ours",
    "he",
    "him",
    "his",
    "she",
    "her",
    "hers",
    "they",
    "them",
    "their",
    "theirs",
    "its",
    "about",
    "any",
    "some",
    "every",
    "everything",
    "anything",
    "something",
    "thing",
    "things",
    "all",
    "also",
    "just",
    "now",
    "really",
    "very",
    "much",
    "many",
    "more",
    "most",
    "other",
    "please",
    "tell",
    "know",
    "remember",
    "get",
    "got",
    "am",
    "im",
    "i'm",
    "i've",
    "ive",
    "i'd",
    "id",
    "from",
    "so",
    "than",
    "too",
    "here",
    "up",
    "out",
    "over",
    "what's",
    "whats",
    "我",
    "你",
    "他",
    "她",
    "它",
    "我们",
    "你们",
    "他们",
    "的",
    "地",
    "得",
    "了",
    "着",
    "过",
    "是",
    "在",
    "有",
    "和",
    "与",
    "跟",
    "就",
    "都",
    "也",
    "还",
    "又",
    "吧",
    "呢",
    "吗",
    "啊",
    "呀",
    "嘛",
    "那",
    "这",
    "那个",
    "这个",
    "那只",
    "这只",
    "那段",
    "这段",
    "那条",
    "这条",
    "一个",
    "一只",
    "个",
    "只",
    "事",
    "事情",
    "东西",
    "相关",
    "有关",
    "关于",
    "哪些",
    "多少",
    "几",
    "被",
    "把",
    "给",
    "让",
    "要",
    "会",
    "能",
    "可以",
    "自己",
    "家",
    "里",
    "上",
    "下",
];

/// The function words as the analyzer leaves them (stemmed, lower case).
fn function_words() -> &'static HashSet<String> {
    static WORDS: OnceLock<HashSet<String>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let Some(mut analyzer) = analyzer() else {
            return HashSet::new();
        };
        FUNCTION_WORDS
            .iter()
            .flat_map(|word| keyword::analyze(&mut analyzer, word))
            .chain(FUNCTION_WORDS.iter().map(ToString::to_string))
            .collect()
    })
}

/// The words of a query that say what it is about, each once: analysed as the keyword index
/// analyses it, without the words that only make it a question (what, did, 什么, 吗 …) and
/// without function words (my, about, 我, 的 …).
pub(crate) fn query_words(query: &str) -> Vec<String> {
    let Some(mut analyzer) = analyzer() else {
        return Vec::new();
    };
    let function = function_words();
    keyword::informative_words(&mut analyzer, query)
        .into_iter()
        .filter(|word| !function.contains(word))
        .collect()
}

/// What a text holds, for coverage: its analysed words, its Han characters and its pairs of
/// neighbouring Han characters.
#[derive(Debug, Clone, Default)]
pub struct Terms {
    words: HashSet<String>,
    han_pairs: HashSet<(char, char)>,
    han_chars: HashSet<char>,
}

impl Terms {
    pub fn of(text: &str) -> Self {
        let words = match analyzer() {
            Some(mut analyzer) => keyword::analyze(&mut analyzer, &keyword::split_compounds(text))
                .into_iter()
                .collect(),
            None => HashSet::new(),
        };
        let mut han_pairs = HashSet::new();
        let mut han_chars = HashSet::new();
        let mut previous: Option<char> = None;
        for c in text.chars() {
            if is_han(c) {
                han_chars.insert(c);
                if let Some(before) = previous {
                    han_pairs.insert((before, c));
                }
                previous = Some(c);
            } else {
                previous = None;
            }
        }
        Self {
            words,
            han_pairs,
            han_chars,
        }
    }

    /// Whether the text holds `word`: as a word, or — for a Chinese word — as all its pairs
    /// (a single character: the character).
    pub(crate) fn holds(&self, word: &str) -> bool {
        if self.words.contains(word) {
            return true;
        }
        let chars: Vec<char> = word.chars().collect();
        if chars.is_empty() || !chars.iter().all(|c| is_han(*c)) {
            return false;
        }
        if chars.len() == 1 {
            return self.han_chars.contains(&chars[0]);
        }
        chars
            .windows(2)
            .all(|pair| self.han_pairs.contains(&(pair[0], pair[1])))
    }

    /// The share of `words` the text holds (0 for no words).
    pub fn coverage(&self, words: &[String]) -> f64 {
        if words.is_empty() {
            return 0.0;
        }
        let held = words.iter().filter(|word| self.holds(word)).count();
        held as f64 / words.len() as f64
    }
}

/// The share of texts a word may be in and still single a text out (the keyword index's
/// rule for coverage).
const INFORMATIVE_SHARE: f64 = 0.05;

/// A set of texts as the keyword index sees a user's memories: how many hold each word. What
/// [`Corpus::coverage`] counts as informative and how much each word weighs follow from it.
#[derive(Debug, Default)]
pub struct Corpus {
    texts: Vec<Terms>,
}

impl Corpus {
    pub fn new(texts: Vec<Terms>) -> Self {
        Self { texts }
    }

    pub fn texts(&self) -> &[Terms] {
        &self.texts
    }

    fn holders(&self, word: &str) -> usize {
        self.texts.iter().filter(|text| text.holds(word)).count()
    }

    /// The keyword index's coverage of `words` by `text`: the idf of the informative words it
    /// holds (those in at most 5 % of the corpus, or in one text) over the idf of all of
    /// them. Common words count in the whole but never as held.
    pub fn coverage(&self, words: &[String], text: &Terms) -> f64 {
        let total = self.texts.len();
        let most = ((INFORMATIVE_SHARE * total as f64).floor() as usize).max(1);
        let mut whole = 0.0;
        let mut held = 0.0;
        for word in words {
            let holders = self.holders(word);
            let weight = idf(holders, total);
            whole += weight;
            if holders <= most && text.holds(word) {
                held += weight;
            }
        }
        if whole > 0.0 { held / whole } else { 0.0 }
    }
}

/// BM25's idf, as the keyword index weighs words.
fn idf(holders: usize, total: usize) -> f64 {
    let x = ((total - holders.min(total)) as f64 + 0.5) / (holders as f64 + 0.5);
    (1.0 + x).ln()
}

/// Words of a forget request that name the request, not its subject.
const FORGET_WORDS: &[&str] = &[
    "forget",
    "forgot",
    "forgotten",
    "delete",
    "deleted",
    "erase",
    "erased",
    "remove",
    "removed",
    "wipe",
    "drop",
    "clear",
    "purge",
    "discard",
    "stop",
    "remembering",
    "remember",
    "remembered",
    "everything",
    "anything",
    "all",
    "whatever",
    "please",
    "know",
    "knew",
    "knowledge",
    "want",
    "wanted",
    "don't",
    "dont",
    "do",
    "not",
    "no",
    "longer",
    "more",
    "anymore",
    "any",
    "again",
    "info",
    "information",
    "memory",
    "memories",
    "details",
    "detail",
    "data",
    "record",
    "records",
    "thing",
    "things",
    "stuff",
    "about",
    "regarding",
    "concerning",
    "related",
    "you",
    "your",
    "can",
    "could",
    "would",
    "will",
    "i",
    "i'd",
    "i'm",
    "like",
    "to",
    "that",
    "the",
    "of",
    "me",
    "keep",
    "kept",
    "store",
    "stored",
    "saved",
    "save",
    "said",
    "told",
    "tell",
];

/// Chinese phrases of a forget request that name the request, longest first.
const FORGET_PHRASES_ZH: &[&str] = &[
    "不要再记着",
    "不要再记住",
    "不要再记得",
    "别再记着",
    "别再记住",
    "别再记得",
    "不用再记",
    "别再记",
    "不要记",
    "请你",
    "帮我",
    "你知道的",
    "相关的记忆",
    "相关的信息",
    "相关信息",
    "相关记忆",
    "的记忆",
    "的信息",
    "的事情",
    "的内容",
    "有关的",
    "所有",
    "一切",
    "全部",
    "忘掉",
    "忘记",
    "忘了",
    "删掉",
    "删除",
    "清除",
    "抹掉",
    "去掉",
    "关于",
    "有关",
    "信息",
    "记忆",
    "请",
    "把",
    "吧",
    "了",
    "都",
    "记着",
    "记住",
    "记得",
];

/// What a forget request is about: "Forget everything about my passport." → "my passport",
/// 把关于我妹妹的记忆删掉 → 我妹妹. The request itself when nothing is left.
pub fn forget_subject(request: &str) -> String {
    let mut text = request.to_string();
    if text.chars().any(is_han) {
        for phrase in FORGET_PHRASES_ZH {
            text = text.replace(phrase, " ");
        }
    }
    let kept: Vec<&str> = text
        .split_whitespace()
        .filter(|word| {
            let bare: String = word
                .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_lowercase()
                .replace('’', "'");
            !bare.is_empty() && !FORGET_WORDS.contains(&bare.as_str())
        })
        .collect();
    let subject = kept
        .join(" ")
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    if subject.is_empty() {
        request.trim().to_string()
    } else {
        subject
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_counts_the_informative_words_a_text_holds() {
        let text = Terms::of("My passport number is X1234567 and it expires in 2031.");
        let words = query_words("What is my passport number?");
        assert_eq!(words, ["number", "passport"]);
        assert_eq!(text.coverage(&words), 1.0);
        let words = query_words("Where does my sister live?");
        assert_eq!(text.coverage(&words), 0.0);
        assert_eq!(text.coverage(&[]), 0.0);
    }

    #[test]
    fn chinese_words_are_held_by_their_pairs() {
        let text = Terms::of("我每天早上喝一杯乌龙茶。");
        assert!(text.holds("乌龙茶"));
        assert!(text.holds("茶"));
        assert!(text.holds("乌龙"));
        assert!(!text.holds("咖啡"));
        let words = query_words("我喜欢喝什么茶？");
        assert!(text.coverage(&words) > 0.0, "{words:?}");
    }

    #[test]
    fn forget_requests_keep_their_subject() {
        for (request, subject) in [
            ("Forget everything about my passport.", "my passport"),
            ("Please forget my passport number", "my passport number"),
            (
                "I don't want you to remember my address any more.",
                "my address",
            ),
            ("forget that I play the cello", "play cello"),
            ("forget", "forget"),
            ("把关于我妹妹的记忆删掉。", "我妹妹"),
            ("忘掉我的护照信息。", "我的护照"),
            ("别再记着我的地址了。", "我的地址"),
        ] {
            assert_eq!(forget_subject(request), subject, "{request}");
        }
    }
}
