//! Citation numbers in a report: which exist, and removing those that do not.

use std::collections::BTreeSet;

pub(super) fn strip_citations(text: &str) -> String {
    let (cleaned, _) = rewrite_citations(text, |_| false);
    cleaned.trim().to_string()
}

/// Checks `[n]` / `[n, m]` citations against `count` sources: returns the report with
/// citations of unknown sources removed, and the unknown numbers.
pub fn check_citations(report: &str, count: usize) -> (String, Vec<usize>) {
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
    let mut out = String::with_capacity(text.len());
    let mut kept = Vec::new();
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
                let good: Vec<usize> = numbers.into_iter().filter(|&n| keep(n)).collect();
                if !good.is_empty() {
                    let joined = good
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    out.push_str(&format!("[{joined}]"));
                    kept.extend(good);
                } else if out.ends_with(' ') {
                    out.pop();
                }
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
    (out, kept)
}

/// The citation numbers used in a report.
pub fn citations(report: &str) -> BTreeSet<usize> {
    let (_, kept) = rewrite_citations(report, |_| true);
    kept.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
