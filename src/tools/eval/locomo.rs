//! LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents",
//! ACL 2024): the adapter from its JSON (a list of samples with `conversation` and `qa`) to
//! [`Conversation`]s.
//!
//! Quirks handled here (see `../shared/eval/README.md`):
//! - evidence ids are normalised to `D<s>:<t>`: `"D:11:26"` → `D11:26`, `"D8:6; D9:17"` → two
//!   ids, `"D30:05"` → `D30:5`; a string with no session and turn number (`"D"`) is dropped;
//! - questions with empty evidence stay empty and score 1 ([`super::metrics::score`]);
//! - `session_N_date_time` keys without a `session_N` (conv-26) are ignored;
//! - a turn's `blip_caption` is appended to its text as `[shares a photo: …]`;
//! - category 5 carries `adversarial_answer` instead of `answer`.
//!
//! Every adjustment is reported in [`Dataset::notes`] so a reader of the results can see it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, bail};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use serde_json::Value;

use super::{Conversation, Dataset, Question, Reference, Session, Turn};
use mnemo::store::Role;

/// The LoCoMo categories by numeric id (the numeric ids are the truth; some papers relabel).
pub const CATEGORIES: [(u64, &str); 5] = [
    (1, "multi-hop"),
    (2, "temporal"),
    (3, "open-domain"),
    (4, "single-hop"),
    (5, "adversarial"),
];

/// A loaded LoCoMo file.
#[derive(Debug, Clone)]
pub struct Locomo {
    conversations: Vec<Conversation>,
    notes: Vec<String>,
}

impl Locomo {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading LoCoMo data {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing LoCoMo data {}", path.display()))
    }

    pub fn parse(json: &str) -> anyhow::Result<Self> {
        let samples: Vec<Value> = serde_json::from_str(json).context("expected a JSON list")?;
        let mut notes = Vec::new();
        let mut conversations = Vec::with_capacity(samples.len());
        for (index, sample) in samples.iter().enumerate() {
            let id = sample
                .get("sample_id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("sample-{}", index + 1));
            let conversation =
                parse_sample(&id, sample, &mut notes).with_context(|| format!("sample {id}"))?;
            conversations.push(conversation);
        }
        if conversations.is_empty() {
            bail!("no samples");
        }
        Ok(Self {
            conversations,
            notes,
        })
    }
}

impl Dataset for Locomo {
    fn name(&self) -> &str {
        "LoCoMo"
    }

    fn conversations(&self) -> Vec<Conversation> {
        self.conversations.clone()
    }

    fn categories(&self) -> Vec<String> {
        let mut names: Vec<String> = CATEGORIES.iter().map(|(_, n)| n.to_string()).collect();
        let extra: BTreeSet<String> = self
            .conversations
            .iter()
            .flat_map(|c| c.questions.iter().map(|q| q.category.clone()))
            .filter(|category| !names.contains(category))
            .collect();
        names.extend(extra);
        names
    }

    fn references(&self) -> Vec<Reference> {
        let reference = |name: &str, r5: f64, r10: f64| Reference {
            name: name.to_string(),
            recall_at_5: r5,
            recall_at_10: r10,
        };
        vec![
            reference(
                "LoCoMo paper's best retriever (DRAGON, all ten conversations)",
                56.7,
                66.2,
            ),
            reference(
                "plain BM25 (Okapi k1=1.5, b=0.75, lowercase alphanumeric tokens)",
                47.1,
                54.9,
            ),
            reference(
                "all-MiniLM-L6-v2 alone, text `Speaker said, \"text\"`",
                40.9,
                50.7,
            ),
            reference(
                "BM25 + MiniLM fused by RRF (k = 60), top-100 each",
                50.3,
                59.0,
            ),
            reference("BM25, English stop words + Snowball stemming", 58.4, 65.5),
            reference(
                "parameter-free fusion of 4 normalised scores (BM25 + MiniLM × turn + ±1 window)",
                68.8,
                78.4,
            ),
        ]
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

fn parse_sample(id: &str, sample: &Value, notes: &mut Vec<String>) -> anyhow::Result<Conversation> {
    let conversation = sample
        .get("conversation")
        .and_then(Value::as_object)
        .context("no `conversation` object")?;
    let speaker_a = conversation
        .get("speaker_a")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (sessions_raw, dates) = session_keys(id, conversation, notes);
    let mut sessions = Vec::with_capacity(sessions_raw.len());
    let mut turn_ids = BTreeSet::new();
    let mut captions = 0usize;
    for (number, turns_raw) in sessions_raw {
        let date_text = dates
            .get(&number)
            .with_context(|| format!("session_{number} has no session_{number}_date_time"))?;
        let date = parse_locomo_date(date_text)
            .with_context(|| format!("session_{number}_date_time {date_text:?}"))?;
        let turns: Vec<Turn> = turns_raw
            .iter()
            .enumerate()
            .map(|(index, turn)| parse_turn(turn, number, index, speaker_a, &mut captions))
            .collect();
        turn_ids.extend(turns.iter().map(|turn| turn.id.clone()));
        sessions.push(Session {
            id: format!("session_{number}"),
            date,
            turns,
        });
    }
    if captions > 0 {
        notes.push(format!(
            "{id}: {captions} turns share a photo; its caption is part of the turn text"
        ));
    }
    let qa = sample
        .get("qa")
        .and_then(Value::as_array)
        .context("no `qa` list")?;
    let questions = qa
        .iter()
        .enumerate()
        .filter_map(|(index, item)| parse_question(id, index, item, &turn_ids, notes))
        .collect();
    Ok(Conversation {
        id: id.to_string(),
        sessions,
        questions,
    })
}

/// A conversation's sessions (`session_<n>`: turns) and their dates (`session_<n>_date_time`),
/// by number; dates without a session are noted and ignored.
fn session_keys<'a>(
    id: &str,
    conversation: &'a serde_json::Map<String, Value>,
    notes: &mut Vec<String>,
) -> (BTreeMap<u32, &'a Vec<Value>>, BTreeMap<u32, &'a str>) {
    let mut sessions_raw: BTreeMap<u32, &Vec<Value>> = BTreeMap::new();
    let mut dates: BTreeMap<u32, &str> = BTreeMap::new();
    for (key, value) in conversation {
        let Some(rest) = key.strip_prefix("session_") else {
            continue;
        };
        if let Some(number) = rest.strip_suffix("_date_time") {
            if let (Ok(number), Some(date)) = (number.parse::<u32>(), value.as_str()) {
                dates.insert(number, date);
            }
        } else if let (Ok(number), Some(turns)) = (rest.parse::<u32>(), value.as_array()) {
            sessions_raw.insert(number, turns);
        }
    }
    let orphan_dates: Vec<String> = dates
        .keys()
        .filter(|number| !sessions_raw.contains_key(number))
        .map(|number| format!("session_{number}"))
        .collect();
    if let (Some(first), Some(last)) = (orphan_dates.first(), orphan_dates.last()) {
        notes.push(format!(
            "{id}: {} date keys without a session ignored ({first} … {last})",
            orphan_dates.len(),
        ));
    }
    (sessions_raw, dates)
}

/// One turn of session `number`: its id (as the scorer reads it), speaker, role (the first
/// speaker is the user) and text, a shared photo's caption included (counted in `captions`).
fn parse_turn(
    turn: &Value,
    number: u32,
    index: usize,
    speaker_a: &str,
    captions: &mut usize,
) -> Turn {
    let speaker = turn
        .get("speaker")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let raw_id = turn
        .get("dia_id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("D{number}:{}", index + 1));
    let turn_id = match normalise_dia_id(&raw_id).as_slice() {
        [one] => one.clone(),
        _ => raw_id,
    };
    let mut text = turn
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim()
        .to_string();
    if let Some(caption) = turn.get("blip_caption").and_then(Value::as_str)
        && !caption.trim().is_empty()
    {
        *captions += 1;
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&format!("[shares a photo: {}]", caption.trim()));
    }
    let role = if speaker == speaker_a {
        Role::User
    } else {
        Role::Assistant
    };
    Turn {
        id: turn_id,
        speaker,
        role,
        text,
    }
}

/// Question `index` of conversation `id` with its category, answer and evidence (normalised;
/// every reading and every evidence that names no turn noted), or `None` when it is empty.
fn parse_question(
    id: &str,
    index: usize,
    item: &Value,
    turn_ids: &BTreeSet<String>,
    notes: &mut Vec<String>,
) -> Option<Question> {
    let question_id = format!("{id}/q{}", index + 1);
    let text = item
        .get("question")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim()
        .to_string();
    if text.is_empty() {
        notes.push(format!("{question_id}: empty question skipped"));
        return None;
    }
    let category_id = item.get("category").and_then(Value::as_u64);
    let category = category_id
        .and_then(|c| CATEGORIES.iter().find(|(n, _)| *n == c))
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| match category_id {
            Some(c) => format!("category {c}"),
            None => "uncategorised".to_string(),
        });
    let answer = item
        .get("answer")
        .or_else(|| item.get("adversarial_answer"))
        .map(value_text)
        .unwrap_or_default();
    let raw_evidence: Vec<String> = item
        .get("evidence")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut evidence = BTreeSet::new();
    for raw in &raw_evidence {
        let normalised = normalise_dia_id(raw);
        if normalised.is_empty() {
            notes.push(format!(
                "{question_id}: evidence {raw:?} names no turn and is dropped"
            ));
        } else if normalised.len() > 1 || normalised[0] != *raw {
            notes.push(format!(
                "{question_id}: evidence {raw:?} read as {}",
                normalised.join(", ")
            ));
        }
        for evidence_id in normalised {
            if !turn_ids.contains(&evidence_id) {
                notes.push(format!(
                    "{question_id}: evidence {evidence_id} is not a turn of {id} (kept; it can never be retrieved)"
                ));
            }
            evidence.insert(evidence_id);
        }
    }
    if raw_evidence.is_empty() {
        notes.push(format!(
            "{question_id}: no evidence; scored as recall 1 (the paper's convention)"
        ));
    }
    Some(Question {
        id: question_id,
        text,
        category,
        evidence: evidence.into_iter().collect(),
        answer,
        abstain: false,
        order: None,
    })
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Normalises a LoCoMo evidence string to `D<session>:<turn>` ids, as the reference scorer
/// reads them: every `D` starts an id, whatever joins them (`;`, `,`, whitespace — "D1:3 D1:5"
/// is two ids), and an id is the two numbers after its `D` (leading zeros and LoCoMo's slips
/// such as "D:11:26" forgiven); a `D` not followed by exactly two numbers is dropped.
pub fn normalise_dia_id(raw: &str) -> Vec<String> {
    raw.split('D')
        .skip(1)
        .filter_map(|piece| {
            let id = piece.split([';', ',']).next().unwrap_or("");
            let numbers: Vec<u64> = id
                .split(|c: char| !c.is_ascii_digit())
                .filter(|run| !run.is_empty())
                .map(|run| run.parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()?;
            match numbers.as_slice() {
                [session, turn] => Some(format!("D{session}:{turn}")),
                _ => None,
            }
        })
        .collect()
}

/// Parses LoCoMo's `"1:56 pm on 8 May, 2023"` (as UTC).
pub fn parse_locomo_date(text: &str) -> anyhow::Result<DateTime<Utc>> {
    let lower = text.trim().to_lowercase();
    let (time_part, date_part) = lower
        .split_once(" on ")
        .context("expected `<time> on <date>`")?;
    let time = parse_clock(time_part)?;
    let cleaned = date_part.replace(',', " ");
    let fields: Vec<&str> = cleaned.split_whitespace().collect();
    let [day, month, year] = fields.as_slice() else {
        bail!("expected `<day> <month>, <year>`");
    };
    let day: u32 = day.parse().context("day")?;
    let month = month_number(month).with_context(|| format!("unknown month {month:?}"))?;
    let year: i32 = year.parse().context("year")?;
    let date = NaiveDate::from_ymd_opt(year, month, day).context("no such date")?;
    Ok(NaiveDateTime::new(date, time).and_utc())
}

/// `"1:56 pm"`, `"12:05 am"`, or a 24-hour `"13:56"`.
fn parse_clock(text: &str) -> anyhow::Result<NaiveTime> {
    let text = text.trim();
    let (clock, meridiem) = match text.rsplit_once(' ') {
        Some((clock, m)) if m == "am" || m == "pm" => (clock.trim(), Some(m)),
        _ => match text.strip_suffix("am").or_else(|| text.strip_suffix("pm")) {
            Some(clock) => (clock.trim(), Some(&text[text.len() - 2..])),
            None => (text, None),
        },
    };
    let (hour, minute) = clock.split_once(':').context("expected h:mm")?;
    let mut hour: u32 = hour.trim().parse().context("hour")?;
    let minute: u32 = minute.trim().parse().context("minute")?;
    match meridiem {
        Some("am") if hour == 12 => hour = 0,
        Some("pm") if hour < 12 => hour += 12,
        _ => {}
    }
    NaiveTime::from_hms_opt(hour, minute, 0).context("no such time")
}

pub(super) fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ];
    let name = name.trim_end_matches('.');
    MONTHS
        .iter()
        .position(|month| *month == name || (name.len() >= 3 && month.starts_with(name)))
        .map(|index| index as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn malformed_evidence_ids_are_normalised() {
        assert_eq!(normalise_dia_id("D3:7"), ["D3:7"]);
        assert_eq!(normalise_dia_id("D:11:26"), ["D11:26"]);
        assert_eq!(normalise_dia_id("D8:6; D9:17"), ["D8:6", "D9:17"]);
        assert_eq!(normalise_dia_id("D30:05"), ["D30:5"]);
        // Joined by whitespace (held-back conversations have these): each id counts. They
        // used to be dropped, and the question scored as fully recalled.
        assert_eq!(normalise_dia_id("D1:3 D1:5"), ["D1:3", "D1:5"]);
        assert_eq!(normalise_dia_id("D2:1\nD2:14"), ["D2:1", "D2:14"]);
        assert_eq!(normalise_dia_id("D4:4,D4:9 D5:1"), ["D4:4", "D4:9", "D5:1"]);
        assert_eq!(normalise_dia_id(" D1:2 "), ["D1:2"]);
        assert!(normalise_dia_id("D").is_empty());
        assert!(normalise_dia_id("").is_empty());
        assert!(normalise_dia_id("D1:2:3").is_empty());
    }

    #[test]
    fn session_dates_parse() {
        let at = |y, mo, d, h, mi| Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap();
        assert_eq!(
            parse_locomo_date("1:56 pm on 8 May, 2023").unwrap(),
            at(2023, 5, 8, 13, 56)
        );
        assert_eq!(
            parse_locomo_date("12:09 am on 13 September, 2023").unwrap(),
            at(2023, 9, 13, 0, 9)
        );
        assert_eq!(
            parse_locomo_date("12:30 pm on 1 Jan, 2024").unwrap(),
            at(2024, 1, 1, 12, 30)
        );
        assert_eq!(
            parse_locomo_date("10:04am on 19 December 2023").unwrap(),
            at(2023, 12, 19, 10, 4)
        );
        assert!(parse_locomo_date("sometime in May").is_err());
        assert!(parse_locomo_date("1:56 pm on 31 February, 2023").is_err());
    }

    const SAMPLE: &str = r#"[{
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hey Mel!"},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "Look at this.",
                 "blip_caption": "a photo of a dog", "img_url": ["x"]}
            ],
            "session_2_date_time": "9:00 am on 9 May, 2023",
            "session_2": [
                {"speaker": "Caroline", "dia_id": "D2:1", "text": "I went to a support group."}
            ],
            "session_3_date_time": "9:00 am on 19 May, 2023"
        },
        "qa": [
            {"question": "What did Melanie share?", "answer": "a dog photo",
             "evidence": ["D1:2"], "category": 4},
            {"question": "When did Caroline go?", "answer": 2023,
             "evidence": ["D2:1; D1:1", "D", "D:2:1", "D02:01"], "category": 2},
            {"question": "Is Melanie an ally?", "answer": "Yes", "evidence": [], "category": 3},
            {"question": "What did Melanie adopt?", "adversarial_answer": "a cat",
             "evidence": ["D1:2"], "category": 5}
        ]
    }]"#;

    #[test]
    fn samples_become_conversations_with_their_quirks_handled() {
        let locomo = Locomo::parse(SAMPLE).unwrap();
        let conversations = locomo.conversations();
        assert_eq!(conversations.len(), 1);
        let conversation = &conversations[0];
        assert_eq!(conversation.id, "conv-x");
        // The date key without a session is ignored.
        assert_eq!(conversation.sessions.len(), 2);
        let first = &conversation.sessions[0];
        assert_eq!(
            first.date,
            Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap()
        );
        assert_eq!(first.turns[0].role, Role::User);
        assert_eq!(first.turns[1].role, Role::Assistant);
        assert_eq!(
            first.turns[1].text,
            "Look at this. [shares a photo: a photo of a dog]"
        );
        let questions = &conversation.questions;
        assert_eq!(questions.len(), 4);
        assert_eq!(questions[0].category, "single-hop");
        assert_eq!(questions[1].category, "temporal");
        assert_eq!(questions[1].evidence, ["D1:1", "D2:1"]);
        assert_eq!(questions[1].answer, "2023");
        assert!(questions[2].evidence.is_empty());
        assert_eq!(questions[3].category, "adversarial");
        assert_eq!(questions[3].answer, "a cat");
        let notes = locomo.notes().join("\n");
        assert!(notes.contains("date keys without a session"), "{notes}");
        assert!(notes.contains("\"D\" names no turn"), "{notes}");
        assert!(
            notes.contains("\"D2:1; D1:1\" read as D2:1, D1:1"),
            "{notes}"
        );
        assert!(notes.contains("no evidence"), "{notes}");
        assert_eq!(
            locomo.categories(),
            [
                "multi-hop",
                "temporal",
                "open-domain",
                "single-hop",
                "adversarial"
            ]
        );
    }
}
