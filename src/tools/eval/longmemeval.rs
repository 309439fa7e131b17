//! LongMemEval (Wu et al., "LongMemEval: Benchmarking Chat Assistants on Long-Term Interactive
//! Memory", ICLR 2025): the adapter from its JSON (`longmemeval_s.json` / `_m.json` /
//! `_oracle.json` share one schema) to [`Conversation`]s.
//!
//! Every question comes with its own haystack (`haystack_sessions`, with ids in
//! `haystack_session_ids` and dates in `haystack_dates`), so each question becomes one
//! conversation — one fresh user — holding that haystack and that single question.
//!
//! - A turn's id is `<session id>:<turn number>` (1-based, counting every turn of the session).
//! - Evidence is the turns marked `has_answer: true`. An answer session (`answer_session_ids`)
//!   without any marked turn contributes all its turns instead (noted).
//! - Abstention questions (`question_id` ending in `_abs`) have nothing to retrieve and are
//!   skipped, as in LongMemEval's own retrieval evaluation (noted).
//! - The category is `question_type`; dates look like `2023/05/20 (Sat) 02:21` (read as UTC).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, bail};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::{Conversation, Dataset, Question, Session, Turn};
use mnemo::store::Role;

#[derive(Debug, Deserialize)]
struct Item {
    question_id: String,
    #[serde(default)]
    question_type: String,
    question: String,
    #[serde(default)]
    answer: Value,
    haystack_dates: Vec<String>,
    haystack_session_ids: Vec<String>,
    haystack_sessions: Vec<Vec<RawTurn>>,
    #[serde(default)]
    answer_session_ids: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RawTurn {
    role: String,
    content: String,
    #[serde(default)]
    has_answer: bool,
}

/// A loaded LongMemEval file.
#[derive(Debug, Clone)]
pub struct LongMemEval {
    conversations: Vec<Conversation>,
    categories: Vec<String>,
    notes: Vec<String>,
}

impl LongMemEval {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading LongMemEval data {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing LongMemEval data {}", path.display()))
    }

    pub fn parse(json: &str) -> anyhow::Result<Self> {
        let items: Vec<Item> = serde_json::from_str(json).context("expected a JSON list")?;
        let mut notes = Vec::new();
        let mut conversations = Vec::new();
        let mut categories: Vec<String> = Vec::new();
        let mut abstentions = 0usize;
        for item in items {
            if item.question_id.ends_with("_abs") {
                abstentions += 1;
                continue;
            }
            let id = item.question_id.clone();
            let conversation =
                convert(item, &mut notes).with_context(|| format!("question {id}"))?;
            for question in &conversation.questions {
                if !categories.contains(&question.category) {
                    categories.push(question.category.clone());
                }
            }
            conversations.push(conversation);
        }
        if abstentions > 0 {
            notes.push(format!(
                "{abstentions} abstention questions (`_abs`) skipped: they have no evidence to retrieve"
            ));
        }
        if conversations.is_empty() {
            bail!("no questions with evidence");
        }
        Ok(Self {
            conversations,
            categories,
            notes,
        })
    }
}

impl Dataset for LongMemEval {
    fn name(&self) -> &str {
        "LongMemEval"
    }

    fn conversations(&self) -> Vec<Conversation> {
        self.conversations.clone()
    }

    fn categories(&self) -> Vec<String> {
        self.categories.clone()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

fn convert(item: Item, notes: &mut Vec<String>) -> anyhow::Result<Conversation> {
    let count = item.haystack_sessions.len();
    if item.haystack_session_ids.len() != count || item.haystack_dates.len() != count {
        bail!(
            "haystack_sessions ({count}), haystack_session_ids ({}) and haystack_dates ({}) differ in length",
            item.haystack_session_ids.len(),
            item.haystack_dates.len()
        );
    }
    let answer_sessions: BTreeSet<&str> =
        item.answer_session_ids.iter().map(String::as_str).collect();
    let mut sessions = Vec::with_capacity(count);
    let mut evidence = BTreeSet::new();
    for ((session_id, date_text), raw_turns) in item
        .haystack_session_ids
        .iter()
        .zip(&item.haystack_dates)
        .zip(&item.haystack_sessions)
    {
        let date = parse_longmemeval_date(date_text)
            .with_context(|| format!("session {session_id}: date {date_text:?}"))?;
        let mut turns = Vec::with_capacity(raw_turns.len());
        let mut marked = false;
        for (index, raw) in raw_turns.iter().enumerate() {
            let id = format!("{session_id}:{}", index + 1);
            let (role, speaker) = if raw.role == "user" {
                (Role::User, "User")
            } else {
                (Role::Assistant, "Assistant")
            };
            if raw.has_answer {
                marked = true;
                evidence.insert(id.clone());
            }
            turns.push(Turn {
                id,
                speaker: speaker.to_string(),
                role,
                text: raw.content.trim().to_string(),
            });
        }
        if !marked && answer_sessions.contains(session_id.as_str()) {
            notes.push(format!(
                "{}: answer session {session_id} marks no turn with has_answer; all its turns count as evidence",
                item.question_id
            ));
            evidence.extend(turns.iter().map(|turn| turn.id.clone()));
        }
        sessions.push(Session {
            id: session_id.clone(),
            date,
            turns,
        });
    }
    let answer = match &item.answer {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let category = if item.question_type.is_empty() {
        "uncategorised".to_string()
    } else {
        item.question_type.clone()
    };
    Ok(Conversation {
        id: item.question_id.clone(),
        sessions,
        questions: vec![Question {
            id: item.question_id,
            text: item.question.trim().to_string(),
            category,
            evidence: evidence.into_iter().collect(),
            answer,
            abstain: false,
            order: None,
        }],
    })
}

/// Parses `2023/05/20 (Sat) 02:21` (the weekday is optional and not checked), as UTC.
pub fn parse_longmemeval_date(text: &str) -> anyhow::Result<DateTime<Utc>> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (Some(date), Some(clock)) = (fields.first(), fields.last()) else {
        bail!("empty date");
    };
    let parts: Vec<&str> = date.split(['/', '-']).collect();
    let [year, month, day] = parts.as_slice() else {
        bail!("expected YYYY/MM/DD");
    };
    let date = NaiveDate::from_ymd_opt(
        year.parse().context("year")?,
        month.parse().context("month")?,
        day.parse().context("day")?,
    )
    .context("no such date")?;
    let time = if fields.len() == 1 {
        NaiveTime::MIN
    } else {
        let (hour, minute) = clock.split_once(':').context("expected HH:MM")?;
        NaiveTime::from_hms_opt(
            hour.parse().context("hour")?,
            minute.parse().context("minute")?,
            0,
        )
        .context("no such time")?
    };
    Ok(NaiveDateTime::new(date, time).and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn fixture() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/longmemeval-mini.json"
        );
        std::fs::read_to_string(path).expect("fixture")
    }

    #[test]
    fn dates_parse() {
        assert_eq!(
            parse_longmemeval_date("2023/05/20 (Sat) 02:21").unwrap(),
            Utc.with_ymd_and_hms(2023, 5, 20, 2, 21, 0).unwrap()
        );
        assert_eq!(
            parse_longmemeval_date("2023/05/20").unwrap(),
            Utc.with_ymd_and_hms(2023, 5, 20, 0, 0, 0).unwrap()
        );
        assert!(parse_longmemeval_date("May 20").is_err());
        assert!(parse_longmemeval_date("2023/02/30 (Thu) 10:00").is_err());
    }

    #[test]
    fn fixture_questions_become_one_conversation_each() {
        let data = LongMemEval::parse(&fixture()).unwrap();
        let conversations = data.conversations();
        // Four questions, one of them an abstention question that is skipped.
        assert_eq!(conversations.len(), 3);
        assert_eq!(
            data.categories(),
            ["single-session-user", "multi-session", "knowledge-update"]
        );
        let degree = &conversations[0];
        assert_eq!(degree.id, "lme-mini-01");
        assert_eq!(degree.sessions.len(), 3);
        assert_eq!(
            degree.sessions[1].date,
            Utc.with_ymd_and_hms(2023, 5, 21, 14, 5, 0).unwrap()
        );
        let question = &degree.questions[0];
        assert_eq!(question.evidence, ["answer_deg_1:1"]);
        assert_eq!(question.answer, "Business Administration");
        let turn = &degree.sessions[1].turns[0];
        assert_eq!((turn.role, turn.speaker.as_str()), (Role::User, "User"));
        assert_eq!(degree.sessions[1].turns[1].role, Role::Assistant);
        // Evidence spread over two sessions.
        let instruments = &conversations[1].questions[0];
        assert_eq!(instruments.evidence, ["answer_ins_1:1", "answer_ins_2:3"]);
        assert_eq!(instruments.answer, "4");
        // An answer session without has_answer marks counts whole.
        let moved = &conversations[2].questions[0];
        assert_eq!(
            moved.evidence,
            ["answer_mov_1:1", "answer_mov_2:1", "answer_mov_2:2"]
        );
        let notes = data.notes().join("\n");
        assert!(notes.contains("1 abstention questions"), "{notes}");
        assert!(notes.contains("answer_mov_2 marks no turn"), "{notes}");
    }

    #[test]
    fn mismatched_haystack_lengths_are_refused() {
        let json = r#"[{"question_id": "q", "question": "?", "answer": "a",
            "haystack_dates": ["2023/01/01 (Sun) 10:00"], "haystack_session_ids": [],
            "haystack_sessions": [[{"role": "user", "content": "hi"}]], "answer_session_ids": []}]"#;
        let error = LongMemEval::parse(json).unwrap_err();
        assert!(
            format!("{error:#}").contains("differ in length"),
            "{error:#}"
        );
    }
}
