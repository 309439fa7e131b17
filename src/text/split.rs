//! Text in pieces: sentences, clauses (the memory writer's statements), pieces of at most so
//! many characters cut at sentence ends, fixed-size pieces, and the paragraph chunks of
//! ingested documents. Lengths are counted in characters, and every cut falls between
//! characters, so Chinese text and other multi-byte UTF-8 is never broken.

/// A chunk grows by whole paragraphs up to about this many characters…
pub(crate) const CHUNK_TARGET_CHARS: usize = 1000;
/// …may grow to this many when it is still short (under `CHUNK_MIN_CHARS`)…
pub(crate) const CHUNK_MAX_CHARS: usize = 1200;
const CHUNK_MIN_CHARS: usize = 800;
/// …and starts with about this much of the previous chunk's end, for context.
pub(crate) const CHUNK_OVERLAP_CHARS: usize = 150;
/// Sentences, ended by `.`, `!`, `?` (before whitespace or the end) or their CJK forms.
pub(crate) fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let end = matches!(c, '。' | '！' | '？')
            || (matches!(c, '.' | '!' | '?')
                && chars.peek().is_none_or(|(_, next)| next.is_whitespace()));
        if end {
            let stop = at + c.len_utf8();
            out.push(&text[start..stop]);
            start = stop;
        }
    }
    if start < text.len() && !text[start..].trim().is_empty() {
        out.push(&text[start..]);
    }
    out
}

/// Clauses: text split on `.!?;。！？；` and newlines, trimmed, each with whether it ended with
/// a question mark (the memory writer's rules read statements this way).
pub(crate) fn clauses(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (at, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), '\n')))
    {
        if matches!(c, '.' | '!' | '?' | ';' | '\n' | '。' | '！' | '？' | '；') {
            let clause = text[start..at].trim();
            if !clause.is_empty() {
                out.push((clause, c == '?' || c == '？'));
            }
            start = (at + c.len_utf8()).min(text.len());
        }
    }
    out
}

/// Pieces of at most `size` characters, cut anywhere.
pub(crate) fn fixed(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|piece| piece.iter().collect())
        .collect()
}

/// Cuts text into chunks of whole paragraphs (blank-line separated): a chunk takes paragraphs
/// while it stays within `CHUNK_TARGET_CHARS` (or `CHUNK_MAX_CHARS` while shorter than
/// `CHUNK_MIN_CHARS`); a paragraph longer than a chunk is split at sentence ends, else at
/// spaces, else anywhere — always between characters, so Chinese text and other multi-byte
/// UTF-8 is never broken. Each chunk after the first starts with the last
/// `CHUNK_OVERLAP_CHARS` or so of the previous one. Lengths are counted in characters.
pub(crate) fn chunk(text: &str) -> Vec<String> {
    let mut pieces: Vec<&str> = Vec::new();
    for paragraph in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        split_long(paragraph, CHUNK_TARGET_CHARS, &mut pieces);
    }
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut current_chars = 0;
    for piece in pieces {
        let piece_chars = piece.chars().count();
        let joined = current_chars + 2 + piece_chars;
        let fits = current.is_empty()
            || joined <= CHUNK_TARGET_CHARS
            || (current_chars < CHUNK_MIN_CHARS && joined <= CHUNK_MAX_CHARS);
        if !fits {
            let overlap = overlap_of(&current);
            chunks.push(std::mem::take(&mut current));
            current = overlap;
            current_chars = current.chars().count();
        }
        if !current.is_empty() {
            current.push_str("\n\n");
            current_chars += 2;
        }
        current.push_str(piece);
        current_chars += piece_chars;
    }
    if !current.trim().is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Splits `paragraph` into pieces of at most `max` characters, preferring sentence ends.
pub(crate) fn split_long<'a>(paragraph: &'a str, max: usize, out: &mut Vec<&'a str>) {
    let mut rest = paragraph;
    while rest.chars().count() > max {
        let end = split_point(rest, max);
        let (head, tail) = rest.split_at(end);
        let head = head.trim();
        if !head.is_empty() {
            out.push(head);
        }
        rest = tail.trim_start();
    }
    if !rest.is_empty() {
        out.push(rest);
    }
}

/// A byte offset (on a char boundary) at which to cut `text` so the head has at most `max`
/// characters: after the last sentence end in the second half of that window, else at the
/// last whitespace there, else exactly at `max` characters.
fn split_point(text: &str, max: usize) -> usize {
    let window_end = text
        .char_indices()
        .nth(max)
        .map(|(index, _)| index)
        .unwrap_or(text.len());
    let window = &text[..window_end];
    let half = text
        .char_indices()
        .nth(max / 2)
        .map(|(index, _)| index)
        .unwrap_or(0);
    let mut sentence_end = None;
    let mut space = None;
    let mut previous: Option<char> = None;
    for (index, ch) in window.char_indices() {
        if index >= half {
            if matches!(ch, '。' | '！' | '？' | '；' | '…') {
                sentence_end = Some(index + ch.len_utf8());
            } else if ch.is_whitespace() {
                if matches!(previous, Some('.' | '!' | '?' | ';' | ':')) {
                    sentence_end = Some(index);
                }
                space = Some(index);
            }
        }
        previous = Some(ch);
    }
    sentence_end
        .or(space)
        .filter(|&end| end > 0)
        .unwrap_or(window_end)
}

/// The end of a chunk to repeat at the start of the next: about `CHUNK_OVERLAP_CHARS`
/// characters, starting after a space when there is one near the cut (so no half word).
fn overlap_of(chunk: &str) -> String {
    let total = chunk.chars().count();
    if total <= CHUNK_OVERLAP_CHARS {
        return String::new();
    }
    let start = chunk
        .char_indices()
        .nth(total - CHUNK_OVERLAP_CHARS)
        .map(|(index, _)| index)
        .unwrap_or(0);
    let tail = &chunk[start..];
    let tail = match tail
        .char_indices()
        .take(40)
        .find(|(_, ch)| ch.is_whitespace())
    {
        Some((index, _)) => &tail[index..],
        None => tail,
    };
    let tail = tail.trim();
    if tail.is_empty() {
        String::new()
    } else {
        format!("…{tail}")
    }
}

/// `chunk` without the overlap [`chunk`] gave it from `previous` (the chunk before it), so
/// that consecutive chunks read as the text once; the first chunk (`None`), or one that does
/// not start with its predecessor's tail, is returned whole.
pub(crate) fn without_overlap<'a>(previous: Option<&str>, chunk: &'a str) -> &'a str {
    let Some(previous) = previous else {
        return chunk;
    };
    let Some(rest) = chunk.strip_prefix('…') else {
        return chunk;
    };
    // The overlap is the previous chunk's tail, which may hold paragraph breaks itself: the
    // longest start of `rest` up to a break that the previous chunk ends with.
    let previous = previous.trim_end();
    rest.match_indices("\n\n")
        .filter(|&(at, _)| at > 0 && previous.ends_with(&rest[..at]))
        .last()
        .map_or(chunk, |(at, _)| &rest[at + 2..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_without_their_overlap_read_as_the_text_once() {
        let paragraphs: Vec<String> = (0..40)
            .map(|n| {
                format!("Paragraph {n} says something about otters and their rafts, at length.")
            })
            .collect();
        let text = paragraphs.join("\n\n");
        let chunks = chunk(&text);
        assert!(chunks.len() > 1, "{chunks:?}");
        assert!(
            chunks[1].starts_with('…'),
            "the second chunk overlaps: {}",
            chunks[1]
        );
        let mut previous = None;
        let mut read = Vec::new();
        for piece in &chunks {
            read.push(without_overlap(previous, piece));
            previous = Some(piece.as_str());
        }
        assert_eq!(read.join("\n\n"), text);
        assert_eq!(
            without_overlap(Some("unrelated"), "…tail\n\nnext"),
            "…tail\n\nnext"
        );
    }

    proptest::proptest! {
        #[test]
        fn chunks_stay_bounded_and_lose_no_character(
            text in "([a-z]{1,12}|[\u{4e00}-\u{9fa5}]{1,40}|[ .。!\n]|\n\n){0,600}"
        ) {
            let chunks = chunk(&text);
            for piece in &chunks {
                proptest::prop_assert!(piece.chars().count() <= CHUNK_MAX_CHARS);
                proptest::prop_assert!(!piece.trim().is_empty());
            }
            // Chunking only drops whitespace and repeats overlaps: every other character
            // is kept at least as often as the text has it.
            let count = |s: &str| {
                let mut counts = std::collections::HashMap::new();
                for c in s.chars().filter(|c| !c.is_whitespace()) {
                    *counts.entry(c).or_insert(0usize) += 1;
                }
                counts
            };
            let joined = count(&chunks.concat());
            for (c, n) in count(&text) {
                proptest::prop_assert!(joined.get(&c).copied().unwrap_or(0) >= n, "{c:?} lost");
            }
        }
    }

    fn sentence(index: usize) -> String {
        format!("Sentence number {index} talks about the sea otter colony near the harbour. ")
    }

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(chunk("Hello.\n\nWorld."), vec!["Hello.\n\nWorld."]);
        assert!(chunk("  \n\n ").is_empty());
    }

    #[test]
    fn paragraphs_are_kept_whole_with_a_small_overlap() {
        let paragraphs: Vec<String> = (0..12)
            .map(|p| {
                (0..4)
                    .map(|s| sentence(p * 10 + s))
                    .collect::<String>()
                    .trim()
                    .to_string()
            })
            .collect();
        let text = paragraphs.join("\n\n");
        let chunks = chunk(&text);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        for (index, piece) in chunks.iter().enumerate() {
            let chars = piece.chars().count();
            assert!(chars <= CHUNK_MAX_CHARS, "chunk {index} has {chars} chars");
            if index + 1 < chunks.len() {
                assert!(
                    chars >= CHUNK_MIN_CHARS / 2,
                    "chunk {index} has only {chars} chars"
                );
            }
            if index > 0 {
                assert!(piece.starts_with('…'), "chunk {index} starts with overlap");
                let previous = &chunks[index - 1];
                let overlap = piece[3..].split("\n\n").next().unwrap();
                assert!(
                    previous.ends_with(overlap),
                    "overlap {overlap:?} ends chunk {}",
                    index - 1
                );
                assert!(overlap.chars().count() <= CHUNK_OVERLAP_CHARS);
            }
        }
        // Every paragraph appears whole in some chunk.
        for paragraph in &paragraphs {
            assert!(
                chunks.iter().any(|c| c.contains(paragraph.as_str())),
                "{paragraph}"
            );
        }
    }

    #[test]
    fn long_paragraphs_split_at_sentence_ends() {
        let paragraph: String = (0..60).map(sentence).collect::<String>().trim().to_string();
        let chunks = chunk(&paragraph);
        assert!(chunks.len() >= 4);
        for piece in &chunks {
            assert!(piece.chars().count() <= CHUNK_MAX_CHARS);
            let body = piece.rsplit("\n\n").next().unwrap();
            assert!(body.ends_with('.'), "cut at a sentence end: {body:?}");
        }
    }

    #[test]
    fn chinese_text_is_cut_between_characters() {
        let sentence = "海獭在港口附近的海藻林里生活，它们用石头敲开贝壳。";
        let paragraph = sentence.repeat(120);
        let text = format!(
            "标题：海獭\n\n{paragraph}\n\n{}",
            "没有标点的长段落".repeat(300)
        );
        let chunks = chunk(&text);
        assert!(chunks.len() > 3);
        let mut total = 0;
        for piece in &chunks {
            let chars = piece.chars().count();
            assert!(chars <= CHUNK_MAX_CHARS, "{chars}");
            total += chars;
        }
        assert!(total >= text.chars().count());
        // Sentence-bearing chunks end at a full stop.
        assert!(chunks[1].ends_with('。'), "{}", chunks[1]);
    }

    #[test]
    fn split_points_fall_on_char_boundaries() {
        for text in [
            "ééééééééééééééééé",
            "日本語のテキスト日本語のテキスト",
            "a b c d e f g h i j",
        ] {
            for max in 1..10 {
                let end = split_point(text, max);
                assert!(text.is_char_boundary(end));
                assert!(text[..end].chars().count() <= max);
                assert!(end > 0);
            }
        }
    }

    #[test]
    fn sentences_and_clauses() {
        assert_eq!(
            sentences("Pi is 3.14. Really? 好的。再见"),
            ["Pi is 3.14.", " Really?", " 好的。", "再见"]
        );
        assert_eq!(
            clauses("I live in Graz; where do you live?\n我喜欢茶。"),
            [
                ("I live in Graz", false),
                ("where do you live", true),
                ("我喜欢茶", false)
            ]
        );
        assert_eq!(fixed("猫猫猫猫猫", 2), ["猫猫", "猫猫", "猫"]);
    }
}
