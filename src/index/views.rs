//! The views a memory is indexed under (DESIGN.md §2, "Views"): its **own** text and its
//! **context**. For a turn, the own view is `[8 May 2023] Speaker: text` and the context view
//! adds the turns just before and after it in its thread, one per line; every other memory
//! has its own text as both. Views are derived data, built by the indexer from SQL rows (the
//! neighbours' current rows), so `mnemo reindex` rebuilds them and a new turn updates its
//! neighbour's context through a log entry, never by rewriting a row.

use chrono::{DateTime, Utc};

use crate::store::{Memory, MemoryKind};

/// The date prefix of a turn's views.
fn day(time: DateTime<Utc>) -> String {
    time.format("%-d %B %Y").to_string()
}

/// The memory's own view.
pub(crate) fn own_text(memory: &Memory) -> String {
    if memory.kind == MemoryKind::Turn {
        format!("[{}] {}", day(memory.created_at), memory.content)
    } else {
        memory.content.clone()
    }
}

/// The context view: a turn with its neighbours in the thread; other memories' own view.
pub(crate) fn context_text(
    previous: Option<&Memory>,
    memory: &Memory,
    next: Option<&Memory>,
) -> String {
    if memory.kind != MemoryKind::Turn {
        return own_text(memory);
    }
    let lines: Vec<&str> = previous
        .into_iter()
        .chain(std::iter::once(memory))
        .chain(next)
        .map(|turn| turn.content.as_str())
        .collect();
    format!("[{}] {}", day(memory.created_at), lines.join("\n"))
}

/// The longest context text embedded as a text: about the 512 tokens of English that
/// multilingual-e5-small reads. A longer one — a turn beside a long message's part — would
/// be read only as far as its first turn and a half, and embedding it doubled the import of
/// long conversations; its vector is the mean of the three turns' own vectors instead, as
/// good on BEAM and the same on LoCoMo's short turns (eval/README.md, 2026-12-07).
pub(crate) const CONTEXT_TEXT_CHARS: usize = 2_000;

/// How a turn's context vector is made.
#[derive(Debug, PartialEq)]
pub(crate) enum ContextEmbedding {
    /// Embedded from this text: the turn and its neighbours, one per line.
    Text(String),
    /// Nothing to embed: the normalised mean of the turns' own vectors.
    Mean(Vec<f32>),
}

/// A turn's context vector: the mean of the own vectors (all of the embedder `model`) when
/// the turn is alone or its context text is longer than [`CONTEXT_TEXT_CHARS`], else its
/// context text to embed.
pub(crate) fn context_embedding(
    previous: Option<&Memory>,
    memory: &Memory,
    next: Option<&Memory>,
    model: &str,
) -> ContextEmbedding {
    let own_vectors = [previous, Some(memory), next]
        .into_iter()
        .flatten()
        .all(|turn| turn.embedding_model == model);
    let alone = previous.is_none() && next.is_none();
    let text = context_embedding_text(previous, memory, next);
    if own_vectors && (alone || text.chars().count() > CONTEXT_TEXT_CHARS) {
        ContextEmbedding::Mean(context_vector(previous, memory, next))
    } else {
        ContextEmbedding::Text(text)
    }
}

/// The text embedded for a turn's context view: its neighbours and itself, one per line, no
/// date (own vectors are of the bare `Speaker: text` too).
fn context_embedding_text(
    previous: Option<&Memory>,
    memory: &Memory,
    next: Option<&Memory>,
) -> String {
    previous
        .into_iter()
        .chain(std::iter::once(memory))
        .chain(next)
        .map(|turn| turn.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The context view's vector: the normalised mean of the turn's and its neighbours' own
/// vectors (those of the memory's dimension); the memory's own vector for anything else.
pub(crate) fn context_vector(
    previous: Option<&Memory>,
    memory: &Memory,
    next: Option<&Memory>,
) -> Vec<f32> {
    let dimension = memory.embedding.len();
    if memory.kind != MemoryKind::Turn || dimension == 0 {
        return memory.embedding.clone();
    }
    let mut sum = memory.embedding.clone();
    for neighbour in previous.into_iter().chain(next) {
        if neighbour.embedding.len() == dimension {
            for (total, value) in sum.iter_mut().zip(&neighbour.embedding) {
                *total += value;
            }
        }
    }
    let norm = sum.iter().map(|value| value * value).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        sum.iter_mut().for_each(|value| *value /= norm);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryId, MemorySource, Trust};

    fn memory(kind: MemoryKind, content: &str, embedding: Vec<f32>) -> Memory {
        let at = DateTime::parse_from_rfc3339("2023-05-08T13:56:00Z")
            .unwrap()
            .to_utc();
        Memory {
            id: MemoryId::new(),
            kind,
            content: content.into(),
            source: MemorySource::User,
            trust: Trust::User,
            importance: 2,
            thread_id: None,
            source_refs: Vec::new(),
            valid_from: at,
            invalid_at: None,
            supersedes: None,
            created_at: at,
            updated_at: at,
            last_accessed_at: None,
            access_count: 0,
            archived_at: None,
            version: 1,
            embedding_model: "test".into(),
            superseded_by: None,
            embedding,
        }
    }

    #[test]
    fn turns_carry_their_date_and_neighbours() {
        let before = memory(
            MemoryKind::Turn,
            "Mel: How was the support group?",
            vec![1.0, 0.0],
        );
        let turn = memory(MemoryKind::Turn, "Caroline: It was great.", vec![0.0, 1.0]);
        let after = memory(MemoryKind::Turn, "Mel: Glad to hear!", vec![1.0, 0.0]);
        assert_eq!(own_text(&turn), "[8 May 2023] Caroline: It was great.");
        assert_eq!(
            context_text(Some(&before), &turn, Some(&after)),
            "[8 May 2023] Mel: How was the support group?\nCaroline: It was great.\nMel: Glad to hear!"
        );
        assert_eq!(
            context_text(None, &turn, None),
            "[8 May 2023] Caroline: It was great."
        );
        let vector = context_vector(Some(&before), &turn, Some(&after));
        let norm = (5.0f32).sqrt();
        assert!((vector[0] - 2.0 / norm).abs() < 1e-6 && (vector[1] - 1.0 / norm).abs() < 1e-6);
        assert_eq!(context_vector(None, &turn, None), vec![0.0, 1.0]);
    }

    /// A context that fits what the model reads is embedded as a text; one beside a long
    /// message's part, or a turn alone, takes the mean of the own vectors — unless a vector
    /// is of another model (then the text is embedded with the current one).
    #[test]
    fn a_long_context_takes_the_mean_of_the_own_vectors() {
        let question = memory(MemoryKind::Turn, "User: Which lens?", vec![1.0, 0.0]);
        let short = memory(MemoryKind::Turn, "Assistant: The 35 mm.", vec![0.0, 1.0]);
        let long_answer = format!("Assistant: {}", "The 35 mm suits street work. ".repeat(80));
        let long = memory(MemoryKind::Turn, &long_answer, vec![0.0, 1.0]);
        assert_eq!(
            context_embedding(None, &question, Some(&short), "test"),
            ContextEmbedding::Text("User: Which lens?\nAssistant: The 35 mm.".into())
        );
        assert_eq!(
            context_embedding(None, &question, Some(&long), "test"),
            ContextEmbedding::Mean(context_vector(None, &question, Some(&long)))
        );
        assert_eq!(
            context_embedding(None, &question, None, "test"),
            ContextEmbedding::Mean(vec![1.0, 0.0])
        );
        let mut older = long.clone();
        older.embedding_model = "older".into();
        assert!(matches!(
            context_embedding(None, &question, Some(&older), "test"),
            ContextEmbedding::Text(text) if text.chars().count() > CONTEXT_TEXT_CHARS
        ));
        assert!(matches!(
            context_embedding(None, &question, None, "older"),
            ContextEmbedding::Text(_)
        ));
    }

    #[test]
    fn other_memories_are_their_own_context() {
        let fact = memory(
            MemoryKind::Fact,
            "The user's cat is called Miso",
            vec![0.6, 0.8],
        );
        let turn = memory(MemoryKind::Turn, "User: hi", vec![1.0, 0.0]);
        assert_eq!(own_text(&fact), "The user's cat is called Miso");
        assert_eq!(context_text(Some(&turn), &fact, None), own_text(&fact));
        assert_eq!(context_vector(Some(&turn), &fact, None), vec![0.6, 0.8]);
    }
}
