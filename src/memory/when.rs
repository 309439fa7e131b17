//! Time expressions in a recall query ("in May 2023", "last week", "in June", "去年", "上个月"),
//! read relative to a clock, as the span of time they name. Recall lifts memories from that
//! span (`memory.time_boost`); it never filters by it, since people misremember dates. Pure;
//! no I/O.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};

/// A span of time named by a query: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl Span {
    #[cfg(test)]
    pub(crate) fn contains(&self, time: DateTime<Utc>) -> bool {
        self.start <= time && time < self.end
    }
}

const MONTHS: [(&str, u32); 21] = [
    ("january", 1),
    ("february", 2),
    ("march", 3),
    ("april", 4),
    ("may", 5),
    ("june", 6),
    ("july", 7),
    ("august", 8),
    ("september", 9),
    ("october", 10),
    ("november", 11),
    ("december", 12),
    ("jan", 1),
    ("feb", 2),
    ("mar", 3),
    ("apr", 4),
    ("jun", 6),
    ("jul", 7),
    ("aug", 8),
    ("sep", 9),
    ("sept", 9),
];
const MORE_MONTHS: [(&str, u32); 3] = [("oct", 10), ("nov", 11), ("dec", 12)];

fn month_of(word: &str) -> Option<u32> {
    MONTHS
        .iter()
        .chain(&MORE_MONTHS)
        .find(|(name, _)| *name == word)
        .map(|(_, month)| *month)
}

fn day_start(date: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0).unwrap_or_default())
}

fn month_span(year: i32, month: u32) -> Option<Span> {
    let start = NaiveDate::from_ymd_opt(year, month, 1)?;
    let end = if month == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)?
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)?
    };
    Some(Span {
        start: day_start(start),
        end: day_start(end),
    })
}

fn year_span(year: i32) -> Option<Span> {
    Some(Span {
        start: day_start(NaiveDate::from_ymd_opt(year, 1, 1)?),
        end: day_start(NaiveDate::from_ymd_opt(year + 1, 1, 1)?),
    })
}

/// The span `days` long ending at the start of `now`'s day, shifted back by `back` days.
fn days_back(now: DateTime<Utc>, back: i64, days: i64) -> Span {
    let today = day_start(now.date_naive());
    Span {
        start: today - Duration::days(back + days - 1),
        end: today - Duration::days(back) + Duration::days(1),
    }
}

/// The span the query names, read at `now`; `None` when it names none.
pub(crate) fn span(query: &str, now: DateTime<Utc>) -> Option<Span> {
    chinese_span(query, now).or_else(|| english_span(query, now))
}

fn english_span(query: &str, now: DateTime<Utc>) -> Option<Span> {
    let lower = query.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    let year_at = |index: usize| {
        words
            .get(index)
            .and_then(|word| word.parse::<i32>().ok())
            .filter(|year| (1900..=2200).contains(year))
    };
    // "May 2023", "8 May 2023", "May 8, 2023", then "May" alone (the latest May up to now).
    for (index, word) in words.iter().enumerate() {
        let Some(month) = month_of(word) else {
            continue;
        };
        // "may" is also a verb: a bare "may" counts only next to a year or a day number.
        let year = year_at(index + 1).or_else(|| year_at(index + 2));
        let next_is_day = words
            .get(index + 1)
            .and_then(|word| word.parse::<u32>().ok())
            .is_some_and(|day| (1..=31).contains(&day));
        let previous_is_day = index
            .checked_sub(1)
            .and_then(|i| words.get(i))
            .and_then(|word| word.parse::<u32>().ok())
            .is_some_and(|day| (1..=31).contains(&day));
        if *word == "may" && year.is_none() && !next_is_day && !previous_is_day {
            continue;
        }
        let year = year.unwrap_or_else(|| {
            if month <= now.month() {
                now.year()
            } else {
                now.year() - 1
            }
        });
        return month_span(year, month);
    }
    let joined = words.join(" ");
    let relative = [
        ("yesterday", days_back(now, 1, 1)),
        ("today", days_back(now, 0, 1)),
        ("last week", days_back(now, 7, 7)),
        ("this week", days_back(now, 0, 7)),
        ("last weekend", days_back(now, 7, 7)),
    ];
    for (phrase, span) in relative {
        if joined.contains(phrase) {
            return Some(span);
        }
    }
    if joined.contains("last month") {
        let (year, month) = if now.month() == 1 {
            (now.year() - 1, 12)
        } else {
            (now.year(), now.month() - 1)
        };
        return month_span(year, month);
    }
    if joined.contains("this month") {
        return month_span(now.year(), now.month());
    }
    if joined.contains("last year") {
        return year_span(now.year() - 1);
    }
    if joined.contains("this year") {
        return year_span(now.year());
    }
    // "3 days ago", "two weeks ago"
    for (index, word) in words.iter().enumerate() {
        if *word != "ago" || index < 2 {
            continue;
        }
        let count = match words[index - 2] {
            "a" | "one" => 1,
            "two" | "couple" => 2,
            "three" | "few" => 3,
            "four" => 4,
            "five" => 5,
            number => number.parse::<i64>().ok()?,
        };
        let unit = words[index - 1].trim_end_matches('s');
        let days = match unit {
            "day" => 1,
            "week" => 7,
            "month" => 30,
            "year" => 365,
            _ => continue,
        };
        // A little slack either side: "two weeks ago" is rarely exact.
        let back = count * days;
        let slack = (days / 2).max(1);
        return Some(days_back(now, (back - slack).max(0), 2 * slack + 1));
    }
    // A year alone: "in 2022".
    words
        .iter()
        .filter_map(|word| word.parse::<i32>().ok())
        .find(|year| (1900..=2200).contains(year))
        .and_then(year_span)
}

fn chinese_span(query: &str, now: DateTime<Utc>) -> Option<Span> {
    let digits = |text: &str| -> Option<i32> { text.parse().ok() };
    // 2023年5月, 2023年
    if let Some((before, after)) = query.split_once('年') {
        let year: String = before
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if let Some(year) = digits(&year).filter(|year| (1900..=2200).contains(year)) {
            let month: String = after.chars().take_while(char::is_ascii_digit).collect();
            if let Some(month) = digits(&month).filter(|month| (1..=12).contains(month))
                && after[month.to_string().len()..].starts_with('月')
            {
                return month_span(year, month as u32);
            }
            return year_span(year);
        }
    }
    let relative = [
        ("昨天", days_back(now, 1, 1)),
        ("今天", days_back(now, 0, 1)),
        ("上周", days_back(now, 7, 7)),
        ("上星期", days_back(now, 7, 7)),
        ("这周", days_back(now, 0, 7)),
        ("本周", days_back(now, 0, 7)),
    ];
    for (phrase, span) in relative {
        if query.contains(phrase) {
            return Some(span);
        }
    }
    if query.contains("上个月") || query.contains("上月") {
        let (year, month) = if now.month() == 1 {
            (now.year() - 1, 12)
        } else {
            (now.year(), now.month() - 1)
        };
        return month_span(year, month);
    }
    if query.contains("去年") {
        return year_span(now.year() - 1);
    }
    if query.contains("今年") {
        return year_span(now.year());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn named(query: &str) -> Option<(String, String)> {
        span(query, at("2023-08-20T10:00:00Z")).map(|span| {
            (
                span.start.format("%Y-%m-%d").to_string(),
                span.end.format("%Y-%m-%d").to_string(),
            )
        })
    }

    #[test]
    fn spans_named_in_english_and_chinese() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            (
                "What did Caroline do in May 2023?",
                Some(("2023-05-01", "2023-06-01")),
            ),
            (
                "When did Melanie go camping in June?",
                Some(("2023-06-01", "2023-07-01")),
            ),
            ("pride parade in August", Some(("2023-08-01", "2023-09-01"))),
            ("the trip in December", Some(("2022-12-01", "2023-01-01"))),
            ("on 8 May 2023", Some(("2023-05-01", "2023-06-01"))),
            ("May I ask what you remember?", None),
            (
                "what happened last week",
                Some(("2023-08-07", "2023-08-14")),
            ),
            ("yesterday's meeting", Some(("2023-08-19", "2023-08-20"))),
            ("last month", Some(("2023-07-01", "2023-08-01"))),
            ("last year", Some(("2022-01-01", "2023-01-01"))),
            ("two weeks ago", Some(("2023-08-03", "2023-08-10"))),
            ("in 2022", Some(("2022-01-01", "2023-01-01"))),
            ("2023年5月我去了哪里", Some(("2023-05-01", "2023-06-01"))),
            ("去年的旅行", Some(("2022-01-01", "2023-01-01"))),
            ("上个月", Some(("2023-07-01", "2023-08-01"))),
            ("昨天说了什么", Some(("2023-08-19", "2023-08-20"))),
            ("What is my cat called?", None),
        ];
        for (query, expected) in cases {
            let expected = expected.map(|(a, b)| (a.to_string(), b.to_string()));
            assert_eq!(named(query), expected, "{query}");
        }
    }

    #[test]
    fn spans_hold_their_start_and_not_their_end() {
        let span = span("in May 2023", at("2023-08-20T10:00:00Z")).unwrap();
        assert!(span.contains(at("2023-05-01T00:00:00Z")));
        assert!(span.contains(at("2023-05-31T23:59:59Z")));
        assert!(!span.contains(at("2023-06-01T00:00:00Z")));
    }
}
