//! Which script a character is written in, for the places that treat Chinese, Japanese and
//! Korean text differently from text with spaces between words (keyword analysis, word counts,
//! token estimates, the memory writer's rules).

/// A Han character (CJK unified ideographs and their extensions, compatibility ideographs,
/// 〇), simplified or traditional alike. Punctuation, kana, Hangul, Latin and digits are not.
pub(crate) fn is_han(c: char) -> bool {
    matches!(
        c as u32,
        0x3007
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xF900..=0xFAFF
            | 0x2_0000..=0x2_A6DF
            | 0x2_A700..=0x2_EBEF
            | 0x2_F800..=0x2_FA1F
            | 0x3_0000..=0x3_23AF
    )
}

/// A character of a script written without spaces between words: Han, kana or Hangul. Each
/// such character counts as a word.
pub(crate) fn is_cjk(c: char) -> bool {
    is_han(c) || matches!(c as u32, 0x3040..=0x30FF | 0xAC00..=0xD7AF)
}

/// A character that takes about one token of a language model's tokenizer: CJK (as
/// [`is_cjk`]), CJK punctuation and radicals, and full-width forms.
pub(crate) fn is_wide(c: char) -> bool {
    is_cjk(c) || matches!(c as u32, 0x2E80..=0x303F | 0xFF00..=0xFFEF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_told_apart() {
        for c in ['猫', '貓', '〇', '𠀀'] {
            assert!(is_han(c) && is_cjk(c) && is_wide(c), "{c}");
        }
        for c in ['ね', 'カ', '한'] {
            assert!(!is_han(c) && is_cjk(c), "{c}");
        }
        for c in ['，', '。', '「'] {
            assert!(!is_cjk(c) && is_wide(c), "{c}");
        }
        for c in ['a', 'é', 'Я', '1', ' '] {
            assert!(!is_wide(c), "{c}");
        }
    }
}
