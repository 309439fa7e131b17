//! Text helpers every other room uses, kept here so that none reaches into another for them:
//! which script a character is written in (`script`), sentences and pieces of bounded length
//! (`split`), truncation (`truncate`), and readable text from HTML, PDF and
//! plain text in a worker process under memory and CPU ceilings (`extract`). Pure functions
//! except `extract`'s worker; nothing here knows memories, runs or the store.

pub mod extract;
pub(crate) mod script;
pub(crate) mod split;

/// At most `max` characters of `text`, cut at a character boundary, with `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// At most `max` characters of `text`, cut at a character boundary, without a mark.
pub fn prefix(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("héllo wörld", 5), "héllo…");
        assert_eq!(truncate("猫猫猫", 5), "猫猫猫");
        assert_eq!(prefix("我的猫叫咪咪", 3), "我的猫");
        assert_eq!(prefix("", 3), "");
    }
}
