//! BEAM (Tavakoli et al., "Beyond a Million Tokens: Benchmarking and Enhancing Long-Term Memory
//! in LLMs", ICLR 2026): the adapter from its JSON (one object per conversation:
//! `conversation_id`, `messages`, `questions`; see `../shared/eval/README.md`) to
//! [`Conversation`]s.
//!
//! - Each conversation is one user's history. A message's `time_anchor` (e.g.
//!   "March-15-2024") holds until the next one: every run of messages under one anchor is a
//!   session dated that day (messages before the first anchor take the first anchor's date).
//! - A turn's id is the message's `id`; the user's messages are the user's, the assistant's
//!   the assistant's (the product stores both, as it stores a chat).
//! - The category is the question's ability. `abstention` questions have no evidence: they are
//!   asked, not scored for recall, and the share of them that recalled nothing is reported.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, bail};
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::{Conversation, Dataset, Order, Question, Reference, Session, Turn};
use mnemo::store::Role;

#[derive(Debug, Deserialize)]
struct RawConversation {
    conversation_id: String,
    messages: Vec<RawMessage>,
    #[serde(default)]
    questions: Vec<RawQuestion>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    id: Value,
    role: String,
    content: String,
    #[serde(default)]
    time_anchor: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawQuestion {
    #[serde(default)]
    qid: Value,
    category: String,
    question: String,
    #[serde(default)]
    answer: Value,
    #[serde(default)]
    evidence: Vec<Value>,
    /// Knowledge update: `original_info` / `updated_info`; contradiction resolution:
    /// `first_statement` / `second_statement` (message ids).
    /// (Other abilities give a list or nothing here.)
    #[serde(default)]
    evidence_detail: Option<Value>,
}

/// The earlier and the later statement's message ids of a knowledge update or a
/// contradiction, when the question names both.
fn order_of(detail: Option<&Value>) -> Option<Order> {
    let detail = detail?.as_object()?;
    let ids = |key: &str| -> Vec<String> {
        match detail.get(key) {
            Some(Value::Array(items)) => items.iter().filter_map(id_text).collect(),
            Some(other) => id_text(other).into_iter().collect(),
            None => Vec::new(),
        }
    };
    [
        ("original_info", "updated_info"),
        ("first_statement", "second_statement"),
    ]
    .into_iter()
    .map(|(older, newer)| Order {
        older: ids(older),
        newer: ids(newer),
    })
    .find(|order| !order.older.is_empty() && !order.newer.is_empty())
}

/// The abilities in the order the report shows them.
const ABILITIES: [&str; 10] = [
    "information_extraction",
    "multi_session_reasoning",
    "knowledge_update",
    "temporal_reasoning",
    "contradiction_resolution",
    "preference_following",
    "instruction_following",
    "event_ordering",
    "summarization",
    "abstention",
];

/// A loaded BEAM file.
#[derive(Debug, Clone)]
pub struct Beam {
    conversations: Vec<Conversation>,
    categories: Vec<String>,
    notes: Vec<String>,
}

impl Beam {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading BEAM data {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing BEAM data {}", path.display()))
    }

    pub fn parse(json: &str) -> anyhow::Result<Self> {
        let raw: Vec<RawConversation> =
            serde_json::from_str(json).context("expected a JSON list of conversations")?;
        let mut notes = Vec::new();
        let mut conversations = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut abstentions = 0usize;
        for conversation in raw {
            let id = conversation.conversation_id.clone();
            let converted = convert(conversation, &mut notes, &mut abstentions)
                .with_context(|| format!("conversation {id}"))?;
            // Recall is reported per ability; abstention has its own measure.
            for question in converted.questions.iter().filter(|q| !q.abstain) {
                seen.insert(question.category.clone());
            }
            conversations.push(converted);
        }
        if abstentions > 0 {
            notes.push(format!(
                "{abstentions} abstention questions are not scored for recall (nothing answers them): the share that recalled nothing is reported apart"
            ));
        }
        if conversations
            .iter()
            .all(|c| c.questions.iter().all(|q| q.abstain))
        {
            bail!("no questions with evidence");
        }
        let mut categories: Vec<String> = ABILITIES
            .iter()
            .filter(|ability| seen.contains(**ability))
            .map(ToString::to_string)
            .collect();
        let others: Vec<String> = seen
            .into_iter()
            .filter(|c| !ABILITIES.contains(&c.as_str()))
            .collect();
        categories.extend(others);
        Ok(Self {
            conversations,
            categories,
            notes,
        })
    }
}

impl Dataset for Beam {
    fn name(&self) -> &str {
        "BEAM"
    }

    fn conversations(&self) -> Vec<Conversation> {
        self.conversations.clone()
    }

    fn categories(&self) -> Vec<String> {
        self.categories.clone()
    }

    /// Plain Okapi BM25 over the user's messages, one message per document (the eval
    /// README's reference point on the 100K scale).
    fn references(&self) -> Vec<Reference> {
        vec![Reference {
            name: "BM25, user messages only (eval README)".into(),
            recall_at_5: 44.7,
            recall_at_10: 51.1,
        }]
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// An id as text: BEAM's are integers, some files write them as strings.
fn id_text(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) => Some(number.to_string()),
        Value::String(text) if !text.trim().is_empty() => Some(text.trim().to_string()),
        _ => None,
    }
}

fn convert(
    raw: RawConversation,
    notes: &mut Vec<String>,
    abstentions: &mut usize,
) -> anyhow::Result<Conversation> {
    let first_anchor = raw
        .messages
        .iter()
        .find_map(|message| message.time_anchor.as_deref())
        .map(parse_beam_date)
        .transpose()?
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
    let mut sessions: Vec<Session> = Vec::new();
    let mut anchor = first_anchor;
    let mut ids: BTreeSet<String> = BTreeSet::new();
    for (index, message) in raw.messages.into_iter().enumerate() {
        let id = id_text(&message.id).unwrap_or_else(|| format!("m{}", index + 1));
        let new_day = match message.time_anchor.as_deref() {
            Some(text) => {
                let date = parse_beam_date(text)?;
                let changed = date != anchor;
                anchor = date;
                changed
            }
            None => false,
        };
        if sessions.is_empty() || new_day {
            sessions.push(Session {
                id: format!("{}-s{}", raw.conversation_id, sessions.len() + 1),
                date: anchor,
                turns: Vec::new(),
            });
        }
        let (role, speaker) = if message.role == "user" {
            (Role::User, "User")
        } else {
            (Role::Assistant, "Assistant")
        };
        let text = message.content.trim().to_string();
        if text.is_empty() {
            notes.push(format!(
                "{}: message {id} is empty and skipped",
                raw.conversation_id
            ));
            continue;
        }
        ids.insert(id.clone());
        if let Some(session) = sessions.last_mut() {
            session.turns.push(Turn {
                id,
                speaker: speaker.to_string(),
                role,
                text,
            });
        }
    }
    let mut questions = Vec::new();
    for (index, question) in raw.questions.into_iter().enumerate() {
        let qid = id_text(&question.qid)
            .map(|qid| format!("{}/{qid}", raw.conversation_id))
            .unwrap_or_else(|| format!("{}/q{}", raw.conversation_id, index + 1));
        let evidence: Vec<String> = question.evidence.iter().filter_map(id_text).collect();
        let abstain = question.category == "abstention";
        if evidence.is_empty() && !abstain {
            notes.push(format!("{qid}: no evidence ids; skipped"));
            continue;
        }
        if abstain {
            *abstentions += 1;
        }
        let missing: Vec<&String> = evidence.iter().filter(|id| !ids.contains(*id)).collect();
        if !missing.is_empty() {
            notes.push(format!("{qid}: evidence {missing:?} names no message"));
        }
        let order = order_of(question.evidence_detail.as_ref()).filter(|order| {
            order
                .older
                .iter()
                .chain(&order.newer)
                .all(|id| ids.contains(id))
        });
        let answer = match &question.answer {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        questions.push(Question {
            id: qid,
            text: question.question.trim().to_string(),
            category: question.category,
            evidence: evidence
                .into_iter()
                .filter(|id| ids.contains(id))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            answer,
            abstain,
            order,
        });
    }
    Ok(Conversation {
        id: raw.conversation_id,
        sessions,
        questions,
    })
}

/// Parses BEAM's `March-15-2024` (also `March 15, 2024`), as midnight UTC.
pub fn parse_beam_date(text: &str) -> anyhow::Result<DateTime<Utc>> {
    let cleaned = text.replace([',', '-'], " ");
    let fields: Vec<&str> = cleaned.split_whitespace().collect();
    let [month, day, year] = fields.as_slice() else {
        bail!("expected `<Month>-<day>-<year>`, got {text:?}");
    };
    let month = super::locomo::month_number(&month.to_lowercase())
        .with_context(|| format!("unknown month in {text:?}"))?;
    let day: u32 = day.parse().with_context(|| format!("day in {text:?}"))?;
    let year: i32 = year.parse().with_context(|| format!("year in {text:?}"))?;
    let date = NaiveDate::from_ymd_opt(year, month, day)
        .with_context(|| format!("no such date {text:?}"))?;
    Ok(date
        .and_hms_opt(0, 0, 0)
        .map(|time| time.and_utc())
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_make_dated_sessions_and_abstentions_are_noted() {
        let json = r#"[{
            "conversation_id": "100K-1",
            "messages": [
                {"id": 0, "role": "user", "content": "I moved to Graz.", "time_anchor": "March-15-2024"},
                {"id": 1, "role": "assistant", "content": "Graz is lovely."},
                {"id": 2, "role": "user", "content": "Now I live in Linz.", "time_anchor": "April-2-2024"},
                {"id": 3, "role": "assistant", "content": "  "}
            ],
            "questions": [
                {"qid": 1, "category": "knowledge_update", "question": "Where do I live?", "answer": "Linz", "evidence": [2, 0], "evidence_detail": {"original_info": [0], "updated_info": [2]}},
                {"qid": 2, "category": "abstention", "question": "What is my cat called?", "answer": "not said", "evidence": []}
            ]
        }]"#;
        let beam = Beam::parse(json).unwrap();
        let conversation = &beam.conversations()[0];
        assert_eq!(conversation.sessions.len(), 2);
        assert_eq!(
            conversation.sessions[1].date,
            parse_beam_date("April-2-2024").unwrap()
        );
        assert_eq!(conversation.sessions[0].turns[1].role, Role::Assistant);
        assert_eq!(conversation.questions.len(), 2);
        assert_eq!(conversation.questions[0].evidence, vec!["0", "2"]);
        assert!(conversation.questions[1].abstain && !conversation.questions[0].abstain);
        let order = conversation.questions[0]
            .order
            .clone()
            .expect("an update names both");
        assert_eq!(
            (order.older.clone(), order.newer.clone()),
            (vec!["0".to_string()], vec!["2".to_string()])
        );
        let refs = |ids: &[&str]| -> Vec<Vec<String>> {
            ids.iter().map(|id| vec![id.to_string()]).collect()
        };
        assert_eq!(
            order.ranks(&refs(&["1", "2", "0"])),
            Some((Some(2), Some(1)))
        );
        assert_eq!(order.ranks(&refs(&["0"])), Some((Some(0), None)));
        let same = Order {
            older: vec!["5".into()],
            newer: vec!["5".into()],
        };
        assert_eq!(
            same.ranks(&refs(&["5"])),
            None,
            "one turn on both sides orders nothing"
        );
        assert_eq!(beam.categories(), vec!["knowledge_update"]);
        assert!(
            beam.notes()
                .iter()
                .any(|note| note.contains("1 abstention"))
        );
        assert!(
            beam.notes()
                .iter()
                .any(|note| note.contains("message 3 is empty"))
        );
        assert_eq!(
            parse_beam_date("March 15, 2024").unwrap(),
            parse_beam_date("March-15-2024").unwrap()
        );
    }
}
