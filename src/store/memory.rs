//! Episodic memory records and the memory log, as the SQL store sees them (DESIGN.md §2).
//! A memory row and its log row are always written in one transaction; indexers follow the log.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::enums::text_enum;

use super::ids::{MemoryId, ThreadId, UserId};

text_enum! {
    /// What a memory is.
    MemoryKind("memory kind") {
        Turn => "turn",
        Preference => "preference",
        Fact => "fact",
        Event => "event",
        Conclusion => "conclusion",
        Profile => "profile",
        Document => "document",
    }
}

text_enum! {
    /// Where a memory came from.
    MemorySource("memory source") {
        User => "user",
        Assistant => "assistant",
        Research => "research",
        Import => "import",
    }
}

text_enum! {
    /// How far a memory is trusted: user > assistant > document > tool > web. `user` is the
    /// user's own word; `assistant` what the assistant said from that; `document` the text of
    /// a document the user added (its author is not the user); `tool` what a client's own
    /// tools returned (OpenAI-compatible `tool` messages); `web` pages read by research or
    /// tools. A memory derived from several sources gets the lowest of their trusts.
    Trust("trust") {
        User => "user",
        Assistant => "assistant",
        Document => "document",
        Tool => "tool",
        Web => "web",
    }
}

impl MemoryKind {
    /// The kinds that recall and lists cover when no kinds are asked for: every kind but
    /// `document`. Chunks of ingested documents are found by the `local` search provider, or
    /// by asking for `document` explicitly, so they never crowd out what the user said.
    pub fn ordinary() -> Vec<MemoryKind> {
        Self::ALL
            .iter()
            .copied()
            .filter(|kind| *kind != MemoryKind::Document)
            .collect()
    }

    /// What a recall without kinds searches: the ordinary kinds but the profile, which the
    /// chat model is always shown whole and which would only repeat the facts it sums up.
    pub(crate) fn recalled() -> Vec<MemoryKind> {
        Self::ordinary()
            .into_iter()
            .filter(|kind| *kind != MemoryKind::Profile)
            .collect()
    }
}

impl Trust {
    fn rank(self) -> u8 {
        match self {
            Trust::Web => 0,
            Trust::Tool => 1,
            Trust::Document => 2,
            Trust::Assistant => 3,
            Trust::User => 4,
        }
    }

    /// Whether this trust is below `other`.
    pub(crate) fn below(self, other: Trust) -> bool {
        self.rank() < other.rank()
    }

    /// The lower of two trusts.
    pub(crate) fn min(self, other: Trust) -> Trust {
        if self.rank() <= other.rank() {
            self
        } else {
            other
        }
    }
}

/// A stored memory. `embedding` is loaded with the row but never serialised to clients.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Memory {
    #[schema(value_type = String, format = Uuid)]
    pub id: MemoryId,
    pub kind: MemoryKind,
    pub content: String,
    pub source: MemorySource,
    pub trust: Trust,
    /// 1 (trivia) to 5 (essential); 4 and 5 never decay.
    pub importance: u8,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub thread_id: Option<ThreadId>,
    /// Message ids, dataset ids (e.g. LoCoMo `D1:3`) or source URLs.
    pub source_refs: Vec<String>,
    pub valid_from: DateTime<Utc>,
    /// Set when a newer memory contradicts this one; the memory stays in history.
    pub invalid_at: Option<DateTime<Utc>>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub supersedes: Option<MemoryId>,
    /// The newer memory that superseded this one (set on single reads and lists over HTTP;
    /// derived from the newer memory's `supersedes`, not stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub superseded_by: Option<MemoryId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_accessed_at: Option<DateTime<Utc>>,
    pub access_count: i64,
    pub archived_at: Option<DateTime<Utc>>,
    pub version: i64,
    pub embedding_model: String,
    #[serde(skip)]
    pub embedding: Vec<f32>,
}

impl Memory {
    /// When the memory was last used (or created, if never recalled).
    pub(crate) fn last_activity(&self) -> DateTime<Utc> {
        self.last_accessed_at.unwrap_or(self.created_at)
    }
}

/// A vector and the model that produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    pub vector: Vec<f32>,
    pub model: String,
}

/// A memory to insert.
#[derive(Debug, Clone)]
pub struct NewMemory {
    pub kind: MemoryKind,
    pub content: String,
    pub source: MemorySource,
    pub trust: Trust,
    pub importance: u8,
    pub thread_id: Option<ThreadId>,
    pub source_refs: Vec<String>,
    /// When the memory was made; defaults to now. Imports and evaluations set past dates.
    pub created_at: Option<DateTime<Utc>>,
    pub supersedes: Option<MemoryId>,
}

impl NewMemory {
    /// A memory stated by the user, with defaults for everything else.
    pub fn from_user(kind: MemoryKind, content: impl Into<String>, importance: u8) -> Self {
        Self {
            kind,
            content: content.into(),
            source: MemorySource::User,
            trust: Trust::User,
            importance,
            thread_id: None,
            source_refs: Vec::new(),
            created_at: None,
            supersedes: None,
        }
    }
}

/// A change to a memory; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct MemoryPatch {
    /// New content with its new embedding.
    pub content: Option<(String, Embedded)>,
    pub kind: Option<MemoryKind>,
    pub importance: Option<u8>,
    /// `Some(true)` archives now, `Some(false)` restores.
    pub archived: Option<bool>,
    /// `Some(Some(t))` marks the memory invalid from `t`, `Some(None)` makes it valid again.
    pub invalid_at: Option<Option<DateTime<Utc>>>,
}

/// One entry of a memory's history: what changed and the record as it was after the change.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryVersion {
    pub version: i64,
    /// created, updated, archived, restored, invalidated, superseded, reembedded, decayed
    pub change: String,
    #[schema(value_type = Object)]
    pub snapshot: serde_json::Value,
    pub changed_at: DateTime<Utc>,
}

text_enum! {
    /// Which door a forget request came through (recorded with what it forgot).
    ForgetVia("forget route") {
        Api => "api",
        Mcp => "mcp",
        Chat => "chat",
        Cli => "cli",
    }
}

/// A forgotten memory that can still be restored.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ForgottenMemory {
    pub memory: Memory,
    /// What the user asked to forget.
    pub request: Option<String>,
    pub via: ForgetVia,
    pub forgotten_at: DateTime<Utc>,
    /// After this the decay job purges it for good.
    pub purge_after: DateTime<Utc>,
}

/// Which memories a list or a search may return.
#[derive(Debug, Clone, Default)]
pub struct MemoryFilter {
    pub kinds: Option<Vec<MemoryKind>>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub include_archived: bool,
    pub include_invalid: bool,
    /// Only memories at one of these trust levels (listing; recall re-checks with `admits`).
    pub trusts: Option<Vec<Trust>>,
    /// Only memories made in this thread (listing; recall re-checks with `admits`).
    pub thread: Option<ThreadId>,
}

impl MemoryFilter {
    /// Whether a memory passes the filter (used to re-check index hits against SQL).
    pub(crate) fn admits(&self, memory: &Memory) -> bool {
        (self.include_archived || memory.archived_at.is_none())
            && (self.include_invalid || memory.invalid_at.is_none())
            && self
                .trusts
                .as_ref()
                .is_none_or(|trusts| trusts.contains(&memory.trust))
            && self
                .thread
                .is_none_or(|thread| memory.thread_id == Some(thread))
            && self
                .kinds
                .as_ref()
                .is_none_or(|kinds| kinds.contains(&memory.kind))
            && self.since.is_none_or(|since| memory.created_at >= since)
            && self.until.is_none_or(|until| memory.created_at <= until)
    }
}

text_enum! {
    /// What happened to the memory named by a log entry.
    LogOp("memory log operation") {
        /// The memory was created or changed: index its current row.
        Upsert => "upsert",
        /// The memory was deleted.
        Delete => "delete",
        /// Every memory of the user was deleted.
        DeleteUser => "delete_user",
    }
}

#[derive(Debug, Clone)]
pub struct LogEntry {
    pub seq: i64,
    pub user: UserId,
    pub memory: Option<MemoryId>,
    pub op: LogOp,
}

/// A memory with its owner, as indexers need it.
#[derive(Debug, Clone)]
pub struct OwnedMemory {
    pub user: UserId,
    pub memory: Memory,
}

/// Little-endian f32 bytes, the stored form of a vector.
pub(crate) fn vector_to_bytes(vector: &[f32]) -> Vec<u8> {
    vector
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

pub(crate) fn vector_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_through_bytes() {
        let vector = vec![0.0, -1.5, 3.25, f32::MIN_POSITIVE];
        assert_eq!(vector_from_bytes(&vector_to_bytes(&vector)), vector);
    }

    #[test]
    fn trust_takes_the_lowest() {
        assert_eq!(Trust::User.min(Trust::Web), Trust::Web);
        assert_eq!(Trust::Assistant.min(Trust::User), Trust::Assistant);
        assert_eq!(Trust::User.min(Trust::User), Trust::User);
    }
}
