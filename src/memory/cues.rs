//! Phrases that tell how a query or a message stands to the rest of a history: a message
//! that says a value changed ("moved to", "increased to", "改成"), a query that
//! asks about the user in the first person ("the order in which I brought up…", "my budget",
//! "我提到过"). Pure; no I/O; English and Chinese.

/// Whether `lower` (lowercased) holds one of `phrases`, an English one at the start of a word.
fn holds_phrase(lower: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|phrase| {
        lower.match_indices(phrase).any(|(at, _)| {
            !phrase.is_ascii()
                || lower[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric())
        })
    })
}

/// Words that say a value changed ("moved to", "increased to", "rescheduled", "no longer",
/// "改成", "不再"), an English one at the start of a word. Recall reads them, with a number in
/// the same sentence, as "this updates something said before" (`memory.updates_first`). A
/// denial ("I've never…") is not one: it corrects, it does not give a new value.
const CHANGE_PHRASES: &[&str] = &[
    "now ",
    "changed",
    "updated",
    "update ",
    "the new ",
    "increased",
    "decreased",
    "raised to",
    "lowered to",
    "reduced to",
    "dropped to",
    "grew to",
    "extended",
    "shortened to",
    "moved to",
    "moved the",
    "moving",
    "reschedul",
    "postponed",
    "pushed back",
    "brought forward",
    "adjusted",
    "switched to",
    "no longer",
    "anymore",
    "instead of",
    "actually",
    "recently",
    "has reached",
    "just found out",
    "turns out",
    "现在",
    "改成",
    "改为",
    "换成",
    "调整",
    "延长",
    "推迟",
    "提前到",
    "增加到",
    "减少到",
    "不再",
    "其实",
];

/// Whether `text` holds a digit (a quantity, a date, a version).
pub(crate) fn names_a_value(text: &str) -> bool {
    text.chars().any(char::is_numeric)
}

/// Whether a sentence of `text` says that a value changed: a phrase of change and a number
/// in the same sentence ("coverage has recently improved to 78%", "改成3点"). News ("I
/// recently went hiking") and a change far from any number are not.
pub(crate) fn states_a_changed_value(text: &str) -> bool {
    crate::text::split::sentences(text)
        .into_iter()
        .any(|sentence| {
            names_a_value(sentence)
                && holds_phrase(
                    &sentence.to_lowercase().replace('\u{2019}', "'"),
                    CHANGE_PHRASES,
                )
        })
}

/// Words by which a query points at the user: "what did I mention…", "my budget", "help me".
const FIRST_PERSON: &[&str] = &[
    "i", "i'm", "i've", "i'd", "i'll", "me", "my", "mine", "myself",
];

/// Past verbs of the assistant's giving, after "you" ("you recommended", "you've suggested").
const ASSISTANT_GAVE: &[&str] = &[
    "recommended",
    "suggested",
    "said",
    "told",
    "mentioned",
    "gave",
    "proposed",
    "explained",
    "advised",
    "shared",
    "wrote",
    "provided",
    "described",
    "offered",
    "outlined",
    "listed",
    "showed",
];

/// What the assistant gave, as a noun after "your" ("your advice").
const ASSISTANT_GIFTS: &[&str] = &[
    "advice",
    "recommendation",
    "recommendations",
    "suggestion",
    "suggestions",
    "answer",
    "explanation",
];

/// Chinese "you said / you suggested …": the assistant's words, not the user's.
const CHINESE_SAID_BY_YOU: &[&str] = &["你说", "你建议", "你推荐", "你提到", "你告诉", "你给"];

/// Whether `query` asks about the user in the first person — what I said, did, want or
/// have ("the order in which I brought up…", "how many columns did I want to add…", "my
/// budget", "我提到过…") — and not about what the assistant said or gave ("what did you
/// recommend for my resume?", "your advice", "你建议…"). The user's own messages answer such
/// a query: recall lifts them by `memory.user_boost`, unless the query also names one of the
/// user's speakers ("what did Melanie tell me?"), whose lift then wins.
pub(crate) fn asks_about_the_user(query: &str) -> bool {
    let lower = query.to_lowercase().replace('\u{2019}', "'");
    if lower.contains('我') {
        return !holds_phrase(&lower, CHINESE_SAID_BY_YOU);
    }
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|word| !word.is_empty())
        .collect();
    if !words.iter().any(|word| FIRST_PERSON.contains(word)) {
        return false;
    }
    let assistant_gave = words.windows(2).any(|pair| match pair {
        ["did", "you"] => true,
        ["you" | "you've", verb] => ASSISTANT_GAVE.contains(verb),
        ["your", gift] => ASSISTANT_GIFTS.contains(gift),
        _ => false,
    }) || words.windows(3).any(
        |three| matches!(three, ["you", "have" | "had", verb] if ASSISTANT_GAVE.contains(verb)),
    );
    !assistant_gave
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_value_is_a_word_of_change_and_a_number_in_one_sentence() {
        for text in [
            "The deadline was extended to May 20.",
            "My budget increased to $650 this month.",
            "I moved to Linz in April 2024.",
            "Hi! Coverage has recently improved to 78%, nice.",
            "The repository has now reached 165 commits.",
            "我们把会议改成周五3点了。",
        ] {
            assert!(states_a_changed_value(text), "{text}");
        }
        for text in [
            "The deadline is April 1.",
            "I recently went hiking.",
            "I'm now ready to start. My deadline is May 3.",
            "我喜欢喝茶",
            "Renewal notices go out on the 1st.",
        ] {
            assert!(!states_a_changed_value(text), "{text}");
        }
    }

    #[test]
    fn a_query_in_the_first_person_asks_about_the_user() {
        for query in [
            "Can you list the order in which I brought up different aspects of my project?",
            "What did I mention about my sister's wedding?",
            "How many times have I asked about Flask routes?",
            "What have I told you about my diet?",
            "Did I say no?",
            "How many new columns did I want to add to the transactions table?",
            "What\u{2019}s my budget for the trip?",
            "I'm looking to improve my app. What steps would you suggest I take?",
            "Where did I move in June?",
            "我提到过哪些旅行计划？",
            "我住在哪里？",
        ] {
            assert!(asks_about_the_user(query), "{query}");
        }
        for query in [
            "What did you recommend for my resume?",
            "How did you recommend organizing my writing process?",
            "Which library have you suggested for my charts?",
            "Remind me of your advice on my cover letter.",
            "What did Melanie say about her painting?",
            "What is the deadline for the first sprint?",
            "你建议我用什么工具？",
            "周五的会议几点？",
        ] {
            assert!(!asks_about_the_user(query), "{query}");
        }
    }
}
