//! Rule-based memory candidates from what the user wrote, in English and Chinese ("remember
//! that…", "from now on…", "my … is …", "I prefer…", 记住, 以后, 我喜欢, 我的…是…), and the
//! lexical tests consolidation uses (duplicate, same subject with a new value). Pure; no I/O.

use crate::store::MemoryKind;

/// A statement worth remembering, before consolidation.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub kind: MemoryKind,
    pub content: String,
    pub importance: u8,
}

fn candidate(kind: MemoryKind, content: &str, importance: u8) -> Option<Candidate> {
    let content = content
        .trim()
        .trim_matches(|c: char| c == ',' || c == ':' || c == '：' || c == '，')
        .trim();
    if content.chars().count() < 3 {
        return None;
    }
    let mut chars = content.chars();
    let content = match chars.next() {
        Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
        None => return None,
    };
    Some(Candidate {
        kind,
        content,
        importance,
    })
}

/// Splits text into sentences on `.!?;。！？；` and newlines.
fn sentences(text: &str) -> Vec<&str> {
    text.split(['.', '!', '?', ';', '\n', '。', '！', '？', '；'])
        .map(str::trim)
        .filter(|sentence| !sentence.is_empty())
        .collect()
}

/// Strips a leading phrase (ASCII case-insensitive), returning the rest. The search runs on an
/// ASCII-lowercased copy, which keeps every byte offset of the original (full Unicode
/// lowercasing does not: "İ" grows from two bytes to three).
fn after_prefix<'a>(sentence: &'a str, prefixes: &[&str]) -> Option<&'a str> {
    let lower = sentence.to_ascii_lowercase();
    prefixes.iter().find_map(|prefix| {
        lower
            .find(prefix)
            .filter(|at| {
                *at == 0 || lower[..*at].trim().is_empty() || lower[..*at].trim_end().ends_with(',')
            })
            .map(|at| &sentence[at + prefix.len()..])
    })
}

/// Candidates from the user's own words. Assistant text is never passed here.
pub fn rule_candidates(user_text: &str) -> Vec<Candidate> {
    let mut found = Vec::new();
    for sentence in sentences(user_text) {
        let lower = sentence.to_lowercase();
        let item = if let Some(rest) = after_prefix(
            sentence,
            &[
                "please remember that ",
                "remember that ",
                "please remember ",
                "remember: ",
                "remember ",
            ],
        ) {
            candidate(MemoryKind::Fact, rest, 4)
        } else if let Some(rest) = after_prefix(sentence, &["from now on, ", "from now on "]) {
            candidate(MemoryKind::Preference, &format!("From now on, {rest}"), 4)
        } else if lower.starts_with("i prefer ")
            || lower.starts_with("i like ")
            || lower.starts_with("i love ")
            || lower.starts_with("i hate ")
            || lower.starts_with("i don't like ")
            || lower.starts_with("i do not like ")
        {
            candidate(MemoryKind::Preference, sentence, 3)
        } else if lower.starts_with("my ") && lower.contains(" is ") {
            candidate(MemoryKind::Fact, sentence, 3)
        } else if let Some(at) = sentence.find("记住") {
            let rest = &sentence[at + "记住".len()..];
            candidate(
                MemoryKind::Fact,
                rest.trim_start_matches(['，', ',', '：', ':']),
                4,
            )
        } else if sentence.starts_with("以后") || sentence.starts_with("从现在起") {
            candidate(MemoryKind::Preference, sentence, 4)
        } else if sentence.starts_with("我喜欢")
            || sentence.starts_with("我不喜欢")
            || sentence.starts_with("我爱")
            || sentence.starts_with("我讨厌")
            || sentence.starts_with("我更喜欢")
        {
            candidate(MemoryKind::Preference, sentence, 3)
        } else if sentence.starts_with("我的")
            && (sentence.contains('是') || sentence.contains('叫'))
        {
            candidate(MemoryKind::Fact, sentence, 3)
        } else {
            None
        };
        found.extend(item);
    }
    found.dedup_by(|a, b| a.content == b.content);
    found
}

/// Words that carry nothing to remember on their own: greetings, thanks, acknowledgements
/// (English, and Chinese by character).
const FILLER_WORDS: &[&str] = &[
    "hi",
    "hello",
    "hey",
    "hiya",
    "yo",
    "there",
    "all",
    "everyone",
    "good",
    "morning",
    "afternoon",
    "evening",
    "night",
    "bye",
    "goodbye",
    "see",
    "you",
    "later",
    "soon",
    "thanks",
    "thank",
    "thx",
    "ty",
    "so",
    "very",
    "much",
    "a",
    "lot",
    "ok",
    "okay",
    "k",
    "kk",
    "yes",
    "yeah",
    "yep",
    "yup",
    "no",
    "nope",
    "nah",
    "sure",
    "cool",
    "great",
    "nice",
    "awesome",
    "perfect",
    "fine",
    "alright",
    "right",
    "got",
    "it",
    "i",
    "see",
    "lol",
    "haha",
    "hahaha",
    "hmm",
    "mm",
    "um",
    "uh",
    "oh",
    "ah",
    "wow",
    "cheers",
    "please",
    "welcome",
    "sounds",
    "np",
    "noted",
    "understood",
    "agreed",
    "indeed",
    "exactly",
    "true",
    "same",
    "me",
    "too",
    "and",
    "to",
];
const FILLER_CHARS: &str =
    "你您好嗨哈啊呀吧了呢嗯哦喔噢谢再见拜早上午下晚安收到没问题对是的行可以嘿哟啦嘛";

/// A message with nothing to remember: a greeting, thanks, an acknowledgement, a lone
/// slash-command (`/help`), or no letters or digits at all. Such turns are not stored.
pub fn content_free(text: &str) -> bool {
    let text = text.trim();
    if text.starts_with('/') && !text.contains(char::is_whitespace) {
        return true;
    }
    let words = tokens(text);
    words.iter().all(|word| {
        FILLER_WORDS.contains(&word.as_str())
            || (word.chars().count() == 1 && word.chars().all(|c| FILLER_CHARS.contains(c)))
    })
}

/// Lowercased word tokens; CJK characters count one each.
pub fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() && !is_cjk(c) {
            word.extend(c.to_lowercase());
        } else {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            if is_cjk(c) {
                out.push(c.to_string());
            }
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0xF900..=0xFAFF)
}

/// Same statement: equal token sequences (case, spacing and punctuation aside).
pub fn same_statement(a: &str, b: &str) -> bool {
    tokens(a) == tokens(b)
}

/// Same subject with a new value: most words shared, but not all — e.g. "I use PostgreSQL 16
/// at work" and "I use PostgreSQL 17 at work", or "My dentist is Dr. Wu" and "My dentist is
/// Dr. Lee". Returns false for equal statements.
pub fn same_subject_new_value(old: &str, new: &str) -> bool {
    let old_tokens = tokens(old);
    let new_tokens = tokens(new);
    if old_tokens == new_tokens || old_tokens.is_empty() || new_tokens.is_empty() {
        return false;
    }
    let old_set: std::collections::HashSet<&String> = old_tokens.iter().collect();
    let new_set: std::collections::HashSet<&String> = new_tokens.iter().collect();
    let shared = old_set.intersection(&new_set).count();
    let union = old_set.union(&new_set).count();
    let jaccard = shared as f64 / union as f64;
    // The shared part must start the statement (the subject), and something must change.
    let common_prefix = old_tokens
        .iter()
        .zip(&new_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    jaccard >= 0.5 && common_prefix >= 2
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn rules_never_panic_and_give_short_statements(text in "\\PC{0,200}") {
            for found in rule_candidates(&text) {
                proptest::prop_assert!(found.content.chars().count() >= 3);
                proptest::prop_assert!((1..=5).contains(&found.importance));
            }
        }

        #[test]
        fn rules_survive_any_casing_around_their_triggers(
            head in "\\PC{0,12}",
            tail in "[a-zA-Z\u{4e00}-\u{9fa5}İß ]{3,40}",
        ) {
            let text = format!("{head}, Remember that {tail}");
            let _ = rule_candidates(&text);
            let _ = rule_candidates(&text.to_uppercase());
        }

        #[test]
        fn tokens_are_lowercase_and_never_empty(text in "\\PC{0,200}") {
            for token in tokens(&text) {
                proptest::prop_assert!(!token.is_empty());
                proptest::prop_assert_eq!(token.to_lowercase(), token.clone());
            }
        }
    }

    #[test]
    fn content_free_turns_are_recognised() {
        for text in [
            "hello",
            "Hi there!",
            "thanks a lot :)",
            "OK",
            "/help",
            "/new",
            "👍",
            "...",
            "你好",
            "谢谢！",
            "好的",
            "嗯嗯",
            "再见",
        ] {
            assert!(content_free(text), "{text:?}");
        }
        for text in [
            "hello, my name is Ada",
            "thanks, I moved to Lisbon",
            "/help me plan a trip to Kyoto",
            "my cat is called Miso",
            "我的猫叫小白",
            "好的，我明天去北京",
            "42",
        ] {
            assert!(!content_free(text), "{text:?}");
        }
    }

    #[test]
    fn offsets_survive_letters_whose_lowercase_is_longer() {
        // "İ" lowercases to three bytes; slicing the original at offsets of the lowercased
        // text used to panic on a char boundary and stop the writer's worker.
        assert!(rule_candidates("İ, remember 茶").is_empty());
        let found = rule_candidates("İ, remember the tea is 乌龙茶");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].content, "The tea is 乌龙茶");
        assert_eq!(
            rule_candidates("REMEMBER THAT Straße ends in ß")[0].content,
            "Straße ends in ß"
        );
    }

    fn contents(text: &str) -> Vec<(MemoryKind, String)> {
        rule_candidates(text)
            .into_iter()
            .map(|c| (c.kind, c.content))
            .collect()
    }

    #[test]
    fn english_triggers() {
        let cases: Vec<(&str, Vec<(MemoryKind, &str)>)> = vec![
            (
                "Hi! Remember that I use PostgreSQL 16 at work.",
                vec![(MemoryKind::Fact, "I use PostgreSQL 16 at work")],
            ),
            (
                "From now on, answer in French please",
                vec![(
                    MemoryKind::Preference,
                    "From now on, answer in French please",
                )],
            ),
            (
                "My daughter's name is Priya. I prefer tea over coffee!",
                vec![
                    (MemoryKind::Fact, "My daughter's name is Priya"),
                    (MemoryKind::Preference, "I prefer tea over coffee"),
                ],
            ),
            ("What is the weather like?", vec![]),
            ("I went to the store", vec![]),
        ];
        for (text, expected) in cases {
            let expected: Vec<(MemoryKind, String)> = expected
                .into_iter()
                .map(|(kind, content)| (kind, content.to_string()))
                .collect();
            assert_eq!(contents(text), expected, "{text}");
        }
    }

    #[test]
    fn chinese_triggers() {
        let cases: Vec<(&str, Vec<(MemoryKind, &str)>)> = vec![
            (
                "请记住，我在公司用PostgreSQL 16。",
                vec![(MemoryKind::Fact, "我在公司用PostgreSQL 16")],
            ),
            (
                "以后请用中文回答我",
                vec![(MemoryKind::Preference, "以后请用中文回答我")],
            ),
            (
                "我喜欢周末去爬山",
                vec![(MemoryKind::Preference, "我喜欢周末去爬山")],
            ),
            (
                "我的猫叫咪咪，我的生日是五月三日",
                vec![(MemoryKind::Fact, "我的猫叫咪咪，我的生日是五月三日")],
            ),
            (
                "我的生日是五月三日",
                vec![(MemoryKind::Fact, "我的生日是五月三日")],
            ),
            ("今天天气怎么样？", vec![]),
        ];
        for (text, expected) in cases {
            let expected: Vec<(MemoryKind, String)> = expected
                .into_iter()
                .map(|(kind, content)| (kind, content.to_string()))
                .collect();
            assert_eq!(contents(text), expected, "{text}");
        }
    }

    #[test]
    fn duplicates_and_contradictions() {
        assert!(same_statement(
            "I use PostgreSQL 16 at work",
            "i use  PostgreSQL 16 at work!"
        ));
        assert!(!same_statement(
            "I use PostgreSQL 16 at work",
            "I use PostgreSQL 17 at work"
        ));
        let cases = [
            (
                "I use PostgreSQL 16 at work",
                "I use PostgreSQL 17 at work",
                true,
            ),
            ("My dentist is Dr. Wu", "My dentist is Dr. Lee", true),
            (
                "I use PostgreSQL 16 at work",
                "I use PostgreSQL 16 at work",
                false,
            ),
            ("I like tea", "My dog is called Rex", false),
            ("I prefer tea over coffee", "I prefer coffee over tea", true),
        ];
        for (old, new, expected) in cases {
            assert_eq!(same_subject_new_value(old, new), expected, "{old} -> {new}");
        }
    }
}
