//! Whether the user's own words ask for something. Text the user did not write — a web page,
//! a document, a client's tool result, an earlier reply quoting them — can tell a model that
//! follows what it reads to forget or to remember; in a turn that read such text, those tools
//! act only when the user's message asks for it (it says the verb, and names what the tool
//! acts on), and what is remembered is the user's word only when the user's message says it.

use super::relevance::{Terms, query_words};

/// What a tool does to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Forget,
    Remember,
}

impl Action {
    fn verbs(self) -> &'static [&'static str] {
        match self {
            Action::Forget => &[
                "forget", "delete", "remove", "erase", "drop", "unlearn", "wipe", "purge", "忘",
                "删", "清除", "移除", "抹去",
            ],
            Action::Remember => &[
                "remember",
                "note that",
                "note down",
                "make a note",
                "save",
                "keep in mind",
                "memorize",
                "memorise",
                "don't forget",
                "do not forget",
                "记住",
                "记下",
                "记得",
                "保存",
                "别忘",
            ],
        }
    }
}

/// Whether `message` (the user's own) asks for `action` on `subject`: it holds one of the
/// action's verbs, and at least one of the subject's informative words (all of them when the
/// subject has one or two).
pub(crate) fn user_asked(message: &str, action: Action, subject: &str) -> bool {
    let lower = message.to_lowercase();
    if !action.verbs().iter().any(|verb| lower.contains(verb)) {
        return false;
    }
    let words = query_words(subject);
    if words.is_empty() {
        return false;
    }
    let held = Terms::of(message).coverage(&words);
    if words.len() <= 2 {
        held >= 0.99
    } else {
        held >= 0.5
    }
}

/// Whether `text` says what `message` says: a third of its informative words are in the
/// message (an extraction rephrases: "we moved to PostgreSQL 17" → "The user uses PostgreSQL
/// 17 at work"), and so is every word holding a digit — values come from the user, never
/// from text they read. "The user" itself does not count.
pub(crate) fn grounded_in(text: &str, message: &str) -> bool {
    let words: Vec<String> = query_words(text)
        .into_iter()
        .filter(|word| !matches!(word.as_str(), "user" | "users" | "user'" | "user's"))
        .collect();
    if words.is_empty() {
        return false;
    }
    let said = Terms::of(message);
    let values_said = words
        .iter()
        .filter(|word| word.chars().any(|c| c.is_ascii_digit()))
        .all(|word| said.holds(word));
    values_said && said.coverage(&words) >= 1.0 / 3.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_must_name_the_action_and_its_subject() {
        let asked = "Please forget my passport number.";
        assert!(user_asked(asked, Action::Forget, "passport number"));
        assert!(!user_asked(asked, Action::Forget, "peanut allergy"));
        assert!(!user_asked(asked, Action::Remember, "passport number"));
        // A page read in this turn asks; the user only asked for a summary.
        let summary = "Summarize https://example.com/article for me";
        assert!(!user_asked(summary, Action::Forget, "allergies"));
        assert!(user_asked("把我的护照号码忘掉", Action::Forget, "护照号码"));
        assert!(user_asked(
            "Remember that my locker code is 4471",
            Action::Remember,
            "The user's locker code is 4471"
        ));
    }

    #[test]
    fn grounded_statements_come_from_the_message() {
        let message = "I'm allergic to peanuts and my sister lives in Lisbon";
        assert!(grounded_in("The user is allergic to peanuts", message));
        assert!(!grounded_in(
            "The user banks with Nordhaven Credit, PIN 7731",
            message
        ));
        assert!(grounded_in(
            "The user uses PostgreSQL 17 at work",
            "we moved to PostgreSQL 17"
        ));
        // A value the user did not say is not theirs.
        assert!(!grounded_in(
            "The user's sister lives in Lisbon at number 42",
            message
        ));
    }
}
