//! Citation numbers in a report: which exist, and removing those that do not.

use std::collections::BTreeSet;

pub(super) fn strip_citations(text: &str) -> String {
    let (cleaned, _) = rewrite_citations(text, |_| false);
    cleaned.trim().to_string()
}

/// Checks `[n]` / `[n, m]` citations against `count` sources: returns the report with
/// citations of unknown sources removed, and the unknown numbers.
pub(crate) fn check_citations(report: &str, count: usize) -> (String, Vec<usize>) {
    let mut invalid = BTreeSet::new();
    let (cleaned, _) = rewrite_citations(report, |n| {
        let ok = (1..=count).contains(&n);
        if !ok {
            invalid.insert(n);
        }
        ok
    });
    (cleaned, invalid.into_iter().collect())
}

/// Rewrites every citation bracket keeping the numbers `keep` accepts; a bracket left empty
/// disappears. Returns the text and the numbers kept.
pub(super) fn rewrite_citations(
    text: &str,
    mut keep: impl FnMut(usize) -> bool,
) -> (String, Vec<usize>) {
    let mut kept = Vec::new();
    let out = rewrite_brackets(text, |numbers| {
        let good: Vec<usize> = numbers.iter().copied().filter(|&n| keep(n)).collect();
        let shown = if good.is_empty() {
            String::new()
        } else {
            format!("[{}]", joined(&good))
        };
        kept.extend(good);
        shown
    });
    (out, kept)
}

fn joined(numbers: &[usize]) -> String {
    numbers
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Replaces every citation bracket (`[n]`, `[n, m]`; not a link's `[text](…)` nor any other
/// bracket) with what `replace` makes of its numbers; a bracket replaced by nothing takes the
/// space before it along.
pub(super) fn rewrite_brackets(text: &str, mut replace: impl FnMut(&[usize]) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let inside = &after[..close];
        let numbers: Option<Vec<usize>> = if inside.trim().is_empty() {
            None
        } else {
            inside
                .split(',')
                .map(|part| part.trim().parse::<usize>().ok())
                .collect()
        };
        // `[text](link)` and other brackets are not citations.
        let is_link = after[close + 1..].starts_with('(');
        match numbers {
            Some(numbers) if !is_link => {
                let shown = replace(&numbers);
                if shown.is_empty() && out.ends_with(' ') {
                    out.pop();
                }
                out.push_str(&shown);
            }
            _ => {
                out.push('[');
                out.push_str(inside);
                out.push(']');
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Streams a report with the citations of sources that do not exist cut out as they arrive,
/// as [`check_citations`] cuts them from the stored report: text passes at once, except from
/// an unclosed `[` that could still be a citation (and spaces, which a cut citation may take
/// with it), which is held
/// until its `]` and the character after it (a `(` makes it a link) decide.
pub(super) struct CitationFilter {
    count: usize,
    held: String,
}

/// A bracket longer than this is not a citation.
const LONGEST_CITATION: usize = 40;

impl CitationFilter {
    pub(super) fn new(count: usize) -> Self {
        Self {
            count,
            held: String::new(),
        }
    }

    fn rewrite(&self, text: &str) -> String {
        let count = self.count;
        rewrite_citations(text, |n| (1..=count).contains(&n)).0
    }
}

impl crate::runs::stream::DeltaFilter for CitationFilter {
    fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        let open = self.held.rfind('[').filter(|&open| {
            let inside = &self.held[open + 1..];
            match inside.find(']') {
                // Closed: held while the next character is unknown.
                Some(close) => close + 1 == inside.len(),
                None => {
                    inside.len() <= LONGEST_CITATION
                        && inside
                            .chars()
                            .all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
                }
            }
        });
        // Trailing spaces wait too: a citation cut after them takes one with it.
        let cut = match open {
            Some(open) => self.held[..open].trim_end_matches(' ').len(),
            None => self.held.trim_end_matches(' ').len(),
        };
        let ready: String = self.held.drain(..cut).collect();
        self.rewrite(&ready)
    }

    fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.held);
        self.rewrite(&rest)
    }
}

/// The citation numbers used in a report.
pub(crate) fn citations(report: &str) -> BTreeSet<usize> {
    let (_, kept) = rewrite_citations(report, |_| true);
    kept.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::stream::DeltaFilter;

    /// Streamed in any pieces, the filtered report is the checked one: no citation of a
    /// source that does not exist is ever shown, links and other brackets pass.
    #[test]
    fn a_streamed_report_never_shows_a_citation_the_stored_one_lacks() {
        let report = "Tides follow the moon [1]. Springs are higher [2, 5] and [9]. See [docs](http://x) and [4](http://y), [note] [3]\n[12";
        let (stored, _) = check_citations(report, 3);
        for size in 1..=report.len() {
            let mut filter = CitationFilter::new(3);
            let mut shown = String::new();
            let mut rest = report;
            while !rest.is_empty() {
                let mut end = size.min(rest.len());
                while !rest.is_char_boundary(end) {
                    end += 1;
                }
                shown.push_str(&filter.push(&rest[..end]));
                rest = &rest[end..];
            }
            shown.push_str(&filter.finish());
            assert_eq!(shown, stored, "pieces of {size}");
        }
        assert!(!stored.contains('9') && !stored.contains("5]"));
    }

    proptest::proptest! {
        #[test]
        fn checked_reports_cite_only_existing_sources(
            text in "([a-z ]{0,8}|\\[[0-9]{1,2}(, ?[0-9]{1,2}){0,2}\\]|\\[x\\]\\(y\\)|\\[|\\]){0,40}",
            count in 0usize..8,
        ) {
            let (cleaned, invalid) = check_citations(&text, count);
            for n in citations(&cleaned) {
                proptest::prop_assert!((1..=count).contains(&n));
            }
            for n in &invalid {
                proptest::prop_assert!(!(1..=count).contains(n));
            }
            // Checking again finds nothing more to remove.
            let (again, none) = check_citations(&cleaned, count);
            proptest::prop_assert_eq!(again, cleaned);
            proptest::prop_assert!(none.is_empty());
        }
    }
}
