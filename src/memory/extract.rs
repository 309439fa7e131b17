//! Rule-based memory candidates from what the user wrote, in English and Chinese ("remember
//! that…", "from now on…", "always/never … when I …", "my … is …", "I prefer…";
//! 记住/记得/别忘了, 以后, 我(不)喜欢,
//! 我叫…, 我的…叫/是…), and the lexical tests consolidation uses (duplicate, same subject with
//! a new value; for Chinese also the slot a statement fills: 我的猫叫…, 我(不)喜欢…). A
//! Chinese question never becomes a memory. Pure; no I/O.

use crate::store::MemoryKind;
use crate::text::script::is_han;

/// A statement worth remembering, before consolidation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
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
pub(crate) fn rule_candidates(user_text: &str) -> Vec<Candidate> {
    let mut found = Vec::new();
    for (sentence, asked) in crate::text::split::clauses(user_text) {
        match english_candidate(sentence) {
            Some(item) => found.extend(item),
            // "你喜欢什么？", "我的生日是哪天": asking is not telling.
            None if asked || chinese_question(sentence) => {}
            None => found.extend(
                chinese_clauses(sentence)
                    .into_iter()
                    .filter_map(chinese_candidate),
            ),
        }
    }
    found.dedup_by(|a, b| a.content == b.content);
    found
}

/// The English rules: `None` when no trigger opens the sentence, `Some(None)` when one does
/// but what it holds is too short to keep.
fn english_candidate(sentence: &str) -> Option<Option<Candidate>> {
    let lower = sentence.to_lowercase();
    if let Some(rest) = after_prefix(
        sentence,
        &[
            "please remember that ",
            "remember that ",
            "please remember ",
            "remember: ",
            "remember ",
        ],
    ) {
        Some(candidate(MemoryKind::Fact, rest, 4))
    } else if let Some(rest) = after_prefix(sentence, &["from now on, ", "from now on "]) {
        Some(candidate(
            MemoryKind::Preference,
            &format!("From now on, {rest}"),
            4,
        ))
    } else if english_standing_instruction(&lower) {
        Some(candidate(MemoryKind::Preference, sentence, 4))
    } else if lower.starts_with("i prefer ")
        || lower.starts_with("i like ")
        || lower.starts_with("i love ")
        || lower.starts_with("i hate ")
        || lower.starts_with("i don't like ")
        || lower.starts_with("i do not like ")
    {
        Some(candidate(MemoryKind::Preference, sentence, 3))
    } else if lower.starts_with("my ") && lower.contains(" is ") {
        Some(candidate(MemoryKind::Fact, sentence, 3))
    } else {
        None
    }
}

/// A standing instruction in English, as 以后… is in Chinese: a sentence opening with "always"
/// or "never" (after an optional "please") that names the user or the assistant ("Always
/// include version numbers when I ask about libraries", "Never use emojis in your answers").
/// "Always happy to help" names neither, and is no instruction.
fn english_standing_instruction(lower: &str) -> bool {
    let rest = lower.strip_prefix("please ").unwrap_or(lower);
    ["always ", "never "]
        .iter()
        .find_map(|opening| rest.strip_prefix(opening))
        .is_some_and(|rest| {
            tokens(rest)
                .iter()
                .any(|word| matches!(word.as_str(), "i" | "me" | "my" | "you" | "your"))
        })
}

/// A candidate from one Chinese clause (not a question).
fn chinese_candidate(clause: &str) -> Option<Candidate> {
    if let Some(rest) = chinese_remember_request(clause) {
        candidate(MemoryKind::Fact, rest, 4)
    } else if chinese_standing_instruction(clause) {
        candidate(MemoryKind::Preference, clause, 4)
    } else if chinese_preference(clause).is_some()
        || clause.starts_with("我讨厌")
        || clause.starts_with("我更喜欢")
    {
        candidate(MemoryKind::Preference, clause, 3)
    } else if let Some((slot, _)) = chinese_attribute(clause) {
        // A favourite (我最喜欢的颜色是…) is a preference; the rest are facts.
        let kind = if slot.contains("喜欢的") || slot.contains("爱的") {
            MemoryKind::Preference
        } else {
            MemoryKind::Fact
        };
        candidate(kind, clause, 3)
    } else {
        None
    }
}

/// A Chinese sentence cut before every comma that opens a statement of its own, so each
/// statement keeps its own slot: 我的猫叫咪咪，我的生日是五月三日 is two facts, 对了，我的猫叫
/// 小黑 one, 我不喜欢鹦鹉，太吵了 one (the reason stays), and 请记住，我的猫叫小白 one request.
fn chinese_clauses(sentence: &str) -> Vec<&str> {
    let opens = |text: &str| {
        chinese_remember_request(text).is_some()
            || chinese_standing_instruction(text)
            || chinese_preference(text).is_some()
            || chinese_attribute(text).is_some()
    };
    let mut clauses = Vec::new();
    let mut start = 0;
    for (at, comma) in sentence.match_indices(['，', ',']) {
        let current = &sentence[start..at];
        let next = &sentence[at + comma.len()..];
        // A bare request ("请记住，…") asks to keep what follows it.
        let bare_request = chinese_remember_request(current).is_some_and(str::is_empty)
            || (chinese_standing_instruction(current) && trim_clause(current).chars().count() <= 4);
        if opens(next) && !bare_request {
            clauses.push(current);
            start = at + comma.len();
        }
    }
    clauses.push(&sentence[start..]);
    clauses
}

/// Punctuation and spaces around a Chinese clause.
fn trim_clause(text: &str) -> &str {
    text.trim_matches(|c: char| {
        c.is_whitespace() || matches!(c, '，' | ',' | '：' | ':' | '、' | '～' | '~' | '…')
    })
}

/// Words that make a Chinese sentence a question (unless 都/也 follows: 什么都吃 tells).
const CHINESE_QUESTION_WORDS: &[&str] = &[
    "什么",
    "什麼",
    "甚麼",
    "谁",
    "誰",
    "哪",
    "怎么",
    "怎麼",
    "为什么",
    "為什麼",
    "多少",
    "几点",
    "几个",
    "几岁",
    "几号",
    "几月",
    "几天",
    "是不是",
    "有没有",
    "对不对",
    "好不好",
];

/// A Chinese question without its question mark: a final 吗/呢, or a question word.
fn chinese_question(sentence: &str) -> bool {
    let sentence = trim_clause(sentence);
    if sentence.ends_with(['吗', '嗎', '呢', '么', '麼']) {
        return true;
    }
    CHINESE_QUESTION_WORDS.iter().any(|word| {
        sentence.match_indices(word).any(|(at, _)| {
            !sentence[at + word.len()..]
                .trim_start()
                .starts_with(['都', '也'])
        })
    })
}

/// Who a Chinese request may be addressed with before its verb: 请记住, 你要记得, 麻烦你以后.
const CHINESE_REQUEST_OPENERS: &[&str] = &[
    "请你",
    "你要",
    "你得",
    "麻烦你",
    "麻烦",
    "那你",
    "请",
    "你",
    "那",
    "还有",
];

/// The sentence without the politeness or address before a request's verb.
fn without_opener(sentence: &str) -> &str {
    let sentence = trim_clause(sentence);
    CHINESE_REQUEST_OPENERS
        .iter()
        .find_map(|opener| sentence.strip_prefix(opener))
        .map_or(sentence, trim_clause)
}

/// What an explicit Chinese remember request asks to keep: 记住…, 请记得…, 别忘了…
fn chinese_remember_request(sentence: &str) -> Option<&str> {
    if let Some(at) = sentence.find("记住") {
        return Some(trim_clause(&sentence[at + "记住".len()..]));
    }
    let request = without_opener(sentence);
    [
        "记得",
        "别忘了",
        "别忘记",
        "不要忘了",
        "不要忘记",
        "千万别忘了",
    ]
    .iter()
    .find_map(|verb| request.strip_prefix(verb))
    .map(trim_clause)
}

/// A standing instruction: 以后…, 请以后…, 今后…, 从现在起…
fn chinese_standing_instruction(sentence: &str) -> bool {
    let request = without_opener(sentence);
    [
        "以后",
        "今后",
        "从现在起",
        "从现在开始",
        "从今以后",
        "从今往后",
    ]
    .iter()
    .any(|opener| request.starts_with(opener))
}

/// Words that may stand between 我 and 喜欢: 我很喜欢, 我最喜欢, 我不太喜欢, 我不是很喜欢.
const CHINESE_DEGREE: &str = "很最特别比较更真挺超还也都太非常蛮一直向来其实是不";

/// A Chinese like or dislike as `(object, likes)`: 我喜欢喝乌龙茶 → ("喝乌龙茶", true),
/// 我不喜欢香菜 and 我讨厌香菜 → ("香菜", false). 不喜欢 is never read as 喜欢. A phrase
/// about a favourite (我最喜欢的颜色是…) is an attribute, not a preference slot.
fn chinese_preference(sentence: &str) -> Option<(&str, bool)> {
    let rest = trim_clause(sentence).strip_prefix('我')?;
    let verb_at = rest
        .char_indices()
        .find(|(_, c)| !CHINESE_DEGREE.contains(*c))
        .map_or(rest.len(), |(at, _)| at);
    let (degree, rest) = rest.split_at(verb_at);
    if degree.chars().count() > 4 {
        return None;
    }
    let negated = degree.contains('不');
    let (object, likes) = if let Some(object) = rest.strip_prefix("喜欢") {
        (object, !negated)
    } else if let Some(object) = rest.strip_prefix("讨厌") {
        (object, false)
    } else if let Some(object) = rest.strip_prefix('爱').filter(|o| !o.starts_with('人')) {
        // 我爱人 is "my spouse".
        (object, !negated)
    } else {
        return None;
    };
    let object = trim_clause(object);
    if object.is_empty() || object.starts_with('的') {
        return None;
    }
    Some((object, likes))
}

/// Who a Chinese statement of the user's is about before its 叫/是: 我的猫, 我家的狗, 我女儿
/// (and 我最喜欢的颜色, see [`chinese_attribute`]).
const CHINESE_OWNERS: &[&str] = &[
    "我们家的",
    "我家的",
    "我们的",
    "我的",
    "我家",
    "我爱人",
    "我老婆",
    "我老公",
    "我太太",
    "我先生",
    "我女儿",
    "我儿子",
    "我妈妈",
    "我爸爸",
    "我妈",
    "我爸",
];

/// A Chinese statement filling a slot as `(slot, value)`: 我的猫叫小白 → ("我的猫叫", "小白"),
/// 我叫张伟 → ("我叫", "张伟"), 我的生日是五月三日 → ("我的生日是", "五月三日"),
/// 我最喜欢的颜色是蓝色 → ("我最喜欢的颜色是", "蓝色"). The slot ends at the first 叫 or 是
/// after the owner; "我是…" names no slot (I am many things at once).
fn chinese_attribute(sentence: &str) -> Option<(&str, &str)> {
    let sentence = trim_clause(sentence);
    let slot_end = if sentence.starts_with("我叫") {
        "我叫".len()
    } else {
        let owner_len = match CHINESE_OWNERS
            .iter()
            .find(|owner| sentence.starts_with(*owner))
        {
            Some(owner) => owner.len(),
            // 我最喜欢的…, 我不太喜欢的…: a favourite, named like an owned thing.
            None => {
                let rest = sentence.strip_prefix('我')?;
                let degree = rest
                    .char_indices()
                    .find(|(_, c)| !CHINESE_DEGREE.contains(*c))
                    .map_or(rest.len(), |(at, _)| at);
                let favourite = ["喜欢的", "爱的"]
                    .iter()
                    .find(|phrase| rest[degree..].starts_with(*phrase))?;
                '我'.len_utf8() + degree + favourite.len()
            }
        };
        let (verb_at, verb) = sentence[owner_len..]
            .char_indices()
            .find(|(_, c)| matches!(c, '叫' | '是'))?;
        // After 的 the thing owned must be named: 我的是… says nothing (我妈是… does).
        if verb_at == 0 && sentence[..owner_len].ends_with('的') {
            return None;
        }
        owner_len + verb_at + verb.len_utf8()
    };
    let value = trim_clause(&sentence[slot_end..]);
    // 我叫了外卖 orders food; 我的猫叫过 is no name.
    if value.is_empty() || value.starts_with(['了', '过', '着']) {
        return None;
    }
    Some((&sentence[..slot_end], value))
}

/// The slot a Chinese statement fills and its value: an attribute (我的猫叫 → 小白) or a
/// like/dislike (喜欢 → 乌龙茶, the value says which). Two statements with the same slot
/// and different values say the same thing changed.
fn chinese_slot(statement: &str) -> Option<(String, String)> {
    let compact: String = statement.chars().filter(|c| !c.is_whitespace()).collect();
    let trimmed = compact.trim_end_matches(['。', '！', '.', '!', '；', ';']);
    if let Some((slot, value)) = chinese_attribute(trimmed) {
        return Some((slot.to_string(), value.to_string()));
    }
    chinese_preference(trimmed).map(|(object, likes)| {
        let feeling = if likes { "喜欢" } else { "不喜欢" };
        (format!("喜欢:{object}"), feeling.to_string())
    })
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
pub(crate) fn content_free(text: &str) -> bool {
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
pub(crate) fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() && !is_han(c) {
            word.extend(c.to_lowercase());
        } else {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            if is_han(c) {
                out.push(c.to_string());
            }
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Two Chinese statements that fill the same slot (我的猫叫…, 喜欢…) with different values.
pub(crate) fn chinese_slot_changed(old: &str, new: &str) -> bool {
    matches!(
        (chinese_slot(old), chinese_slot(new)),
        (Some((old_slot, old_value)), Some((new_slot, new_value)))
            if old_slot == new_slot && old_value != new_value
    )
}

/// Same statement: equal token sequences (case, spacing and punctuation aside), the speaker
/// named either way — "I am vegetarian", "I'm vegetarian" and "The user is vegetarian" are
/// one statement (the rules write the first person, models often the third).
pub(crate) fn same_statement(a: &str, b: &str) -> bool {
    first_person(tokens(a)) == first_person(tokens(b))
}

/// `tokens` with the user named in the first person and its contractions spelt out: "the
/// user is" → "i am", "the user's" → "my", "the user has" → "i have", "i'm" → "i am".
fn first_person(mut tokens: Vec<String>) -> Vec<String> {
    // "User watches films" is a model's note about the user, as "The user watches films".
    if tokens.first().map(String::as_str) == Some("user") {
        tokens.insert(0, "the".to_string());
    }
    const REWRITES: &[(&[&str], &[&str])] = &[
        (&["the", "user", "is"], &["i", "am"]),
        (&["the", "user", "was"], &["i", "was"]),
        (&["the", "user", "has"], &["i", "have"]),
        (&["the", "user", "does"], &["i", "do"]),
        (&["the", "user", "s"], &["my"]),
        (&["the", "user"], &["i"]),
        (&["i", "m"], &["i", "am"]),
        (&["i", "ve"], &["i", "have"]),
        (&["i", "d"], &["i", "would"]),
        (&["i", "ll"], &["i", "will"]),
        (&["their"], &["my"]),
        (&["them"], &["me"]),
    ];
    let mut out = Vec::with_capacity(tokens.len());
    let mut rest = tokens.as_slice();
    while !rest.is_empty() {
        let rewrite = REWRITES.iter().find(|(from, _)| {
            rest.len() >= from.len() && rest.iter().zip(from.iter()).all(|(t, f)| t == f)
        });
        match rewrite {
            Some((from, to)) => {
                out.extend(to.iter().map(ToString::to_string));
                rest = &rest[from.len()..];
            }
            None => {
                out.push(rest[0].clone());
                rest = &rest[1..];
            }
        }
        // Third-person verbs after the rewritten subject ("the user likes" → "i like").
        if out.last().map(String::as_str) == Some("i")
            && let Some(stem) = rest.first().and_then(|verb| third_person_stem(verb))
        {
            out.push(stem);
            rest = &rest[1..];
        }
    }
    out
}

/// "likes" → "like", "watches" → "watch", "studies" → "study"; `None` for a word that is not
/// a regular third-person verb form (or could be a noun: only after a rewritten subject).
fn third_person_stem(word: &str) -> Option<String> {
    const KEEP: &[&str] = &[
        "is", "was", "has", "does", "s", "as", "us", "this", "always",
    ];
    if KEEP.contains(&word) || word.len() < 3 || !word.ends_with('s') || word.ends_with("ss") {
        return None;
    }
    if let Some(stem) = word.strip_suffix("ies") {
        return Some(format!("{stem}y"));
    }
    for ending in ["ches", "shes", "xes", "zes", "oes", "sses"] {
        if word.ends_with(ending) {
            return Some(word[..word.len() - 2].to_string());
        }
    }
    word.strip_suffix('s').map(str::to_string)
}

/// Same subject with a new value: most words shared, but not all — e.g. "I use PostgreSQL 16
/// at work" and "I use PostgreSQL 17 at work", or "My dentist is Dr. Wu" and "My dentist is
/// Dr. Lee". Returns false for equal statements.
pub(crate) fn same_subject_new_value(old: &str, new: &str) -> bool {
    // Chinese statements that name their slot: the same slot with another value, or not at
    // all (我的猫叫小白 and 我的狗叫豆豆 share most characters but no subject).
    if let (Some((old_slot, old_value)), Some((new_slot, new_value))) =
        (chinese_slot(old), chinese_slot(new))
    {
        return old_slot == new_slot && old_value != new_value;
    }
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
            // Two statements, two slots.
            (
                "我的猫叫咪咪，我的生日是五月三日",
                vec![
                    (MemoryKind::Fact, "我的猫叫咪咪"),
                    (MemoryKind::Fact, "我的生日是五月三日"),
                ],
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

    fn expect_all(cases: Vec<(&str, Vec<(MemoryKind, &str)>)>) {
        let mut mismatches = Vec::new();
        for (text, expected) in cases {
            let expected: Vec<(MemoryKind, String)> = expected
                .into_iter()
                .map(|(kind, content)| (kind, content.to_string()))
                .collect();
            let got = contents(text);
            if got != expected {
                mismatches.push(format!("{text}: got {got:?}, want {expected:?}"));
            }
        }
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    }

    #[test]
    fn chinese_names_with_jiao() {
        expect_all(vec![
            ("我的猫叫小白", vec![(MemoryKind::Fact, "我的猫叫小白")]),
            ("我叫张伟。", vec![(MemoryKind::Fact, "我叫张伟")]),
            (
                "我家的狗叫豆豆！",
                vec![(MemoryKind::Fact, "我家的狗叫豆豆")],
            ),
            ("我叫了外卖", vec![]),
            ("我的猫叫什么？", vec![]),
            ("你叫什么名字", vec![]),
        ]);
    }

    #[test]
    fn chinese_attributes_with_shi() {
        expect_all(vec![
            (
                "我的生日是五月三日",
                vec![(MemoryKind::Fact, "我的生日是五月三日")],
            ),
            ("我的血型是A型。", vec![(MemoryKind::Fact, "我的血型是A型")]),
            ("我妈是老师", vec![(MemoryKind::Fact, "我妈是老师")]),
            ("我的是红色的", vec![]),
            (
                "我最喜欢的颜色是蓝色",
                vec![(MemoryKind::Preference, "我最喜欢的颜色是蓝色")],
            ),
            ("我的生日是哪天？", vec![]),
            ("我的生日是哪天", vec![]),
            ("我是说明天", vec![]),
        ]);
    }

    #[test]
    fn chinese_likes_and_dislikes() {
        expect_all(vec![
            (
                "我喜欢喝乌龙茶。",
                vec![(MemoryKind::Preference, "我喜欢喝乌龙茶")],
            ),
            (
                "我很喜欢周杰伦",
                vec![(MemoryKind::Preference, "我很喜欢周杰伦")],
            ),
            (
                "我不喜欢香菜",
                vec![(MemoryKind::Preference, "我不喜欢香菜")],
            ),
            (
                "我不太喜欢鹦鹉，太吵了",
                vec![(MemoryKind::Preference, "我不太喜欢鹦鹉，太吵了")],
            ),
            ("你喜欢什么？", vec![]),
            ("你喜欢什么", vec![]),
            ("我喜欢什么？", vec![]),
            ("我喜欢吃什么来着", vec![]),
            // 我爱人 is "my spouse", not "I love people".
            ("我爱人是医生", vec![(MemoryKind::Fact, "我爱人是医生")]),
        ]);
        // 不喜欢 is read as a dislike, never as 喜欢.
        assert_eq!(chinese_preference("我喜欢香菜"), Some(("香菜", true)));
        assert_eq!(chinese_preference("我不喜欢香菜"), Some(("香菜", false)));
        assert_eq!(
            chinese_preference("我不是很喜欢香菜"),
            Some(("香菜", false))
        );
        assert_eq!(chinese_preference("我讨厌香菜"), Some(("香菜", false)));
        // Liking something else is another slot, not a change: both stay.
        assert!(!same_subject_new_value("我喜欢喝咖啡", "我喜欢喝茶"));
        assert!(same_subject_new_value("我喜欢香菜", "我不喜欢香菜"));
        assert!(same_subject_new_value("我不喜欢香菜", "我很喜欢香菜"));
        assert!(!same_subject_new_value("我喜欢香菜", "我很喜欢香菜"));
    }

    #[test]
    fn english_standing_instructions_open_with_always_or_never() {
        expect_all(vec![
            (
                "Always include version numbers when I ask about software dependencies. ->-> 2,26",
                vec![(
                    MemoryKind::Preference,
                    "Always include version numbers when I ask about software dependencies",
                )],
            ),
            (
                "please never use emojis in your answers",
                vec![(
                    MemoryKind::Preference,
                    "Please never use emojis in your answers",
                )],
            ),
            // Neither the user nor the assistant named: small talk, not an instruction.
            ("Always happy to help!", vec![]),
            ("Never again, that trip was awful.", vec![]),
            // Not at the start: a remark about what always happens.
            ("I always forget my keys", vec![]),
        ]);
        let instruction = rule_candidates("Always confirm exact dates when I ask about deadlines.");
        assert_eq!(instruction[0].importance, 4, "standing, like 以后…");
    }

    #[test]
    fn chinese_standing_instructions_with_yihou() {
        expect_all(vec![
            (
                "以后都用中文回答我",
                vec![(MemoryKind::Preference, "以后都用中文回答我")],
            ),
            (
                "请你以后回答短一点。",
                vec![(MemoryKind::Preference, "请你以后回答短一点")],
            ),
            (
                "从现在开始叫我老王",
                vec![(MemoryKind::Preference, "从现在开始叫我老王")],
            ),
            ("以后会下雨吗", vec![]),
            ("以后怎么办？", vec![]),
        ]);
    }

    #[test]
    fn chinese_remember_requests() {
        expect_all(vec![
            ("记得我对花生过敏", vec![(MemoryKind::Fact, "我对花生过敏")]),
            (
                "请记得，我周三下午要开会。",
                vec![(MemoryKind::Fact, "我周三下午要开会")],
            ),
            (
                "别忘了我女儿六月考试",
                vec![(MemoryKind::Fact, "我女儿六月考试")],
            ),
            (
                "你要记得：房租每月五号交",
                vec![(MemoryKind::Fact, "房租每月五号交")],
            ),
            ("不要忘记我不吃香菜", vec![(MemoryKind::Fact, "我不吃香菜")]),
            (
                "请记住，我在公司用PostgreSQL 16。",
                vec![(MemoryKind::Fact, "我在公司用PostgreSQL 16")],
            ),
            ("你还记得我的猫叫什么吗？", vec![]),
            ("你记得我喜欢什么吗", vec![]),
            ("我记得小时候很冷", vec![]),
        ]);
    }

    /// The Chinese slot mirrors "my cat is called X": a new value supersedes, another
    /// subject does not.
    #[test]
    fn chinese_supersede() {
        let cases = [
            ("我的猫叫小白", "我的猫叫小黑", true),
            ("我的猫叫小白", "我的猫叫大黄", true),
            ("我叫张伟", "我叫李明远", true),
            ("我的生日是五月三日", "我的生日是六月一日。", true),
            ("我最喜欢的颜色是蓝色", "我最喜欢的颜色是绿色", true),
            ("我的猫叫小白", "我的猫叫小白。", false),
            ("我的猫叫小白", "我的狗叫豆豆", false),
            ("我的猫叫小白", "我的猫是橘猫", false),
            ("我的生日是五月三日", "我的电话是5550142", false),
        ];
        for (old, new, expected) in cases {
            assert_eq!(same_subject_new_value(old, new), expected, "{old} -> {new}");
        }
        // What the rules extract keeps its slot.
        let old = &rule_candidates("我的猫叫小白。")[0].content;
        let new = &rule_candidates("对了，我的猫叫小黑！")[0].content;
        assert!(same_subject_new_value(old, new), "{old} -> {new}");
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
        // The speaker named either way (a model's "the user", the rules' "I") is one
        // statement; a different value or another person is not.
        for (a, b) in [
            ("The user is vegetarian.", "I am vegetarian"),
            ("The user is vegetarian.", "I'm vegetarian!"),
            (
                "The user's sister lives in Graz.",
                "My sister lives in Graz",
            ),
            (
                "The user likes hiking in the Alps.",
                "I like hiking in the Alps.",
            ),
            ("The user has two cats.", "I have two cats"),
            ("User watches films on Fridays", "I watch films on Fridays"),
        ] {
            assert!(same_statement(a, b), "{a} / {b}");
        }
        for (a, b) in [
            ("The user is vegetarian.", "I am vegan"),
            (
                "The user's sister lives in Graz.",
                "My brother lives in Graz",
            ),
            ("The user has two cats.", "I have three cats"),
            ("Anna is vegetarian.", "I am vegetarian"),
        ] {
            assert!(!same_statement(a, b), "{a} / {b}");
        }
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
