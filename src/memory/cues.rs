//! Phrases that tell how a query or a message stands to the rest of a history: a message
//! that says a value changed ("moved to", "increased to", "改成"), a query that
//! asks what the user themself said ("the order in which I brought up…", "我提到过"). Pure; no
//! I/O; English and Chinese.

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

/// Verbs of saying after "I" (with "have", "had" or "'ve" between, or none).
const SAYING_VERBS: &[&str] = &[
    "brought up",
    "bring up",
    "mentioned",
    "mention",
    "said",
    "say",
    "told",
    "tell",
    "asked",
    "ask",
    "discussed",
    "shared",
    "talked",
    "raised",
    "described",
    "reported",
    "noted",
    "stated",
];

/// Chinese "I said / I mentioned …".
const CHINESE_SAID_BY_ME: &[&str] = &[
    "我提到",
    "我提过",
    "我说过",
    "我讲过",
    "我问过",
    "我聊过",
    "我告诉",
    "我分享",
];

/// Whether `query` asks about what the user themself said — "the order in which I brought
/// up…", "what did I mention about…", "我提到过…" — so the user's own messages answer it
/// (recall lifts them by `memory.speaker_boost`).
pub(crate) fn names_the_user_as_speaker(query: &str) -> bool {
    let lower = query.to_lowercase().replace('\u{2019}', "'");
    if holds_phrase(&lower, CHINESE_SAID_BY_ME) {
        return true;
    }
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|word| !word.is_empty())
        .collect();
    words.iter().enumerate().any(|(at, word)| {
        let after_i = match *word {
            "i" => &words[at + 1..],
            "i've" => &words[at + 1..],
            _ => return false,
        };
        let after_i = match after_i.first() {
            Some(&("have" | "had" | "ever" | "already" | "just" | "first" | "previously")) => {
                &after_i[1..]
            }
            _ => after_i,
        };
        SAYING_VERBS.iter().any(|verb| {
            let verb: Vec<&str> = verb.split(' ').collect();
            after_i.starts_with(&verb)
        })
    })
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
    fn the_user_is_the_speaker_when_the_query_says_what_i_said() {
        for query in [
            "Can you list the order in which I brought up different aspects of my project?",
            "What did I mention about my sister's wedding?",
            "How many times have I asked about Flask routes?",
            "What have I told you about my diet?",
            "我提到过哪些旅行计划？",
        ] {
            assert!(names_the_user_as_speaker(query), "{query}");
        }
        for query in [
            "What did you recommend for my resume?",
            "Where did I move in June?",
            "What is the deadline for the first sprint?",
            "What did Melanie say about her painting?",
            "Did I say no?",
            "我住在哪里？",
        ] {
            let expected = query == "Did I say no?";
            assert_eq!(names_the_user_as_speaker(query), expected, "{query}");
        }
    }
}
