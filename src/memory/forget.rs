//! Forgetting what the user names, and nothing else: a request is matched against the user's
//! memories by calibrated relevance at the `forget` operating point (set for precision), shown
//! first as a preview, and what is forgotten can be restored until the decay job purges it.
//! Duplicate detection lives here too: both ask "is this the same thing the user said?".

use serde::Serialize;

use super::extract::{chinese_slot_changed, same_statement};
use super::relevance::forget_subject;
use super::{MemoryEngine, MemoryResult, RecallRequest};
use crate::store::{ForgetVia, ForgottenMemory, Memory, MemoryId, MemoryKind, NewMemory, UserId};

/// Memories a forget request is matched against at most.
const FORGET_CANDIDATES: usize = 50;
/// Similar memories a new memory is compared with.
const DUPLICATE_CANDIDATES: usize = 5;

/// A memory a forget request would remove, and how likely it is about what was named.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ForgetMatch {
    pub memory: Memory,
    pub relevance: f64,
}

/// What a forget removed, and what it left.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct ForgetOutcome {
    pub forgotten: Vec<Memory>,
    /// Memories that matched too but were left because of the limit (ask again to forget
    /// them).
    pub more: usize,
    /// Until when the forgotten memories can be restored.
    pub restorable_until: chrono::DateTime<chrono::Utc>,
}

impl MemoryEngine {
    /// Forgets the memories `request` clearly names ([`MemoryEngine::forget_preview`]), the
    /// most relevant `limit` of them when a limit is given; they stay restorable for
    /// `memory.forget_retention_days`.
    pub(crate) async fn forget(
        &self,
        user: UserId,
        request: &str,
        via: ForgetVia,
        limit: Option<usize>,
    ) -> MemoryResult<ForgetOutcome> {
        let matches = self.forget_preview(user, request).await?;
        let take = limit.unwrap_or(usize::MAX).min(matches.len());
        let ids: Vec<MemoryId> = matches[..take].iter().map(|m| m.memory.id).collect();
        let forgotten = self.forget_ids(user, &ids, request, via).await?;
        Ok(ForgetOutcome {
            forgotten,
            more: matches.len() - take,
            restorable_until: self.restorable_until(),
        })
    }

    fn restorable_until(&self) -> chrono::DateTime<chrono::Utc> {
        crate::store::now()
            + chrono::Duration::days(self.settings.forget_retention_days.min(36_500) as i64)
    }

    /// Forgets exactly these memories (what a preview showed and the user confirmed): they
    /// leave recall, lists and the indexes at once and stay restorable for
    /// `memory.forget_retention_days`. A profile distilled from one of them is forgotten
    /// with them (the writer rebuilds it). Ids the user does not have are skipped.
    pub async fn forget_ids(
        &self,
        user: UserId,
        ids: &[MemoryId],
        request: &str,
        via: ForgetVia,
    ) -> MemoryResult<Vec<Memory>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let until = self.restorable_until();
        let scope = self.store.user(user);
        let forgotten = scope.forget_memories(ids, request, via, until).await?;
        if let Some(profile) = self.profile(user).await? {
            let derived = forgotten
                .iter()
                .any(|memory| profile.source_refs.contains(&memory.id.to_string()));
            if derived {
                scope
                    .forget_memories(&[profile.id], request, via, until)
                    .await?;
            }
        }
        self.indexer().notify();
        tracing::info!(
            user = %user,
            via = via.as_str(),
            forgotten = ?forgotten.iter().map(|m| m.id.to_string()).collect::<Vec<_>>(),
            "memories forgotten"
        );
        metrics::counter!("mnemo_memories_forgotten_total").increment(forgotten.len() as u64);
        Ok(forgotten)
    }

    /// Takes back what some of a thread's messages taught, when they are edited or answered
    /// again: deletes the memories made from those messages alone (their turns, and facts
    /// whose every source is one of them), makes valid again what such a fact had superseded,
    /// and drops a profile distilled from them (the writer rebuilds it). Memories that also
    /// rest on other messages stay. Returns the deleted memories.
    pub(crate) async fn unlearn_messages(
        &self,
        user: UserId,
        thread: crate::store::ThreadId,
        messages: &[crate::store::MessageId],
    ) -> MemoryResult<Vec<Memory>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let removed: std::collections::HashSet<String> =
            messages.iter().map(ToString::to_string).collect();
        let scope = self.store.user(user);
        let made = scope
            .all_memories(&crate::store::MemoryFilter {
                thread: Some(thread),
                include_archived: true,
                include_invalid: true,
                ..Default::default()
            })
            .await?;
        let taken: Vec<Memory> = made
            .into_iter()
            .filter(|memory| {
                !memory.source_refs.is_empty()
                    && memory.source_refs.iter().all(|r| removed.contains(r))
            })
            .collect();
        let taken_ids: std::collections::HashSet<MemoryId> =
            taken.iter().map(|memory| memory.id).collect();
        for memory in &taken {
            self.delete(user, memory.id).await?;
        }
        for memory in &taken {
            let Some(old) = memory.supersedes.filter(|old| !taken_ids.contains(old)) else {
                continue;
            };
            match scope.get_memory(old).await {
                Ok(previous) if previous.invalid_at.is_some() => {
                    scope
                        .update_memory(
                            old,
                            crate::store::MemoryPatch {
                                invalid_at: Some(None),
                                ..Default::default()
                            },
                        )
                        .await?;
                }
                Ok(_) | Err(crate::store::StoreError::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        if let Some(profile) = self.profile(user).await?
            && profile
                .source_refs
                .iter()
                .any(|r| taken.iter().any(|m| m.id.to_string() == *r))
        {
            self.delete(user, profile.id).await?;
        }
        self.indexer().notify();
        Ok(taken)
    }

    /// The user's forgotten memories that can still be restored, newest first.
    pub async fn forgotten(&self, user: UserId, limit: i64) -> MemoryResult<Vec<ForgottenMemory>> {
        Ok(self.store.user(user).forgotten_memories(limit).await?)
    }

    /// Brings a forgotten memory back as it was; it is recallable again once indexed.
    pub async fn restore_forgotten(&self, user: UserId, id: MemoryId) -> MemoryResult<Memory> {
        let memory = self.store.user(user).restore_forgotten(id).await?;
        self.indexer().notify();
        tracing::info!(user = %user, memory = %id, "forgotten memory restored");
        Ok(memory)
    }

    /// What `forget(request)` would remove, most relevant first: the memories (archived ones
    /// too, never the profile or document chunks) at least `memory.relevance.forget` likely
    /// about what the request names ("Forget everything about my passport" → "my passport").
    pub async fn forget_preview(
        &self,
        user: UserId,
        request: &str,
    ) -> MemoryResult<Vec<ForgetMatch>> {
        let subject = forget_subject(request);
        let recall = RecallRequest {
            query: subject.clone(),
            k: Some(FORGET_CANDIDATES.min(self.settings.max_k)),
            decay: false,
            include_archived: true,
            keep_irrelevant: true,
            ..RecallRequest::default()
        };
        let point = self.settings.relevance.forget;
        let found = self.recall(user, recall).await?.results;
        // What the request names is short and every word of it is meant: its words count
        // whether or not other memories hold them too (recall's coverage counts only the
        // words that single a memory out).
        let profile = self.query_profile(&subject).await?;
        let mut matches: Vec<ForgetMatch> = found
            .into_iter()
            .filter_map(|result| {
                let terms = super::relevance::Terms::of(&result.memory.content);
                let cosine = super::relevance::cosine(profile.vector(), &result.memory.embedding);
                let relevance =
                    self.relevance
                        .forget_score(&profile, cosine, terms.coverage(profile.words()));
                (relevance >= point).then_some(ForgetMatch {
                    memory: result.memory,
                    relevance,
                })
            })
            .collect();
        matches.sort_by(|a, b| b.relevance.total_cmp(&a.relevance));
        Ok(matches)
    }

    /// The user's memory that `memory` says again, if any ([`MemoryEngine::duplicate_of`]).
    pub async fn find_duplicate(
        &self,
        user: UserId,
        memory: &NewMemory,
    ) -> MemoryResult<Option<Memory>> {
        let vector = self.embed_one(&memory.content).await?.vector;
        self.settle().await?;
        self.duplicate_of(user, &memory.content, &vector).await
    }

    /// The user's fact, preference, event or conclusion that `content` (stored with `vector`)
    /// says again: the same words, or each at least `memory.relevance.duplicate` likely about
    /// the other with no value different ("my code is 4471" and "my code is 4472" are two
    /// statements). Compares stored vectors only, so it embeds nothing. Searches the indexes,
    /// which follow SQL a moment behind: the caller settles them first
    /// ([`MemoryEngine::settle`], once per batch) so that a memory written just before is seen.
    pub(crate) async fn duplicate_of(
        &self,
        user: UserId,
        content: &str,
        vector: &[f32],
    ) -> MemoryResult<Option<Memory>> {
        let filter = crate::index::vector::VectorFilter {
            kinds: Some(
                [
                    MemoryKind::Fact,
                    MemoryKind::Preference,
                    MemoryKind::Event,
                    MemoryKind::Conclusion,
                ]
                .iter()
                .map(|kind| kind.as_str().to_string())
                .collect(),
            ),
            ..crate::index::vector::VectorFilter::default()
        };
        let hits = self
            .indexer()
            .vector()
            .search(user, vector, &filter, DUPLICATE_CANDIDATES)
            .await?;
        if hits.is_empty() {
            return Ok(None);
        }
        let ids: Vec<MemoryId> = hits.iter().map(|(id, _)| *id).collect();
        let mut rows = self.store.user(user).memories_by_ids(&ids).await?;
        rows.retain(|row| row.invalid_at.is_none());
        rows.sort_by_key(|row| ids.iter().position(|id| *id == row.id));
        if let Some(same) = rows
            .iter()
            .find(|row| same_statement(&row.content, content))
        {
            return Ok(Some(same.clone()));
        }
        let point = self.settings.relevance.duplicate;
        for row in rows {
            if values_differ(&row.content, content) || row.embedding.len() != vector.len() {
                continue;
            }
            let p = self
                .relevance
                .duplicate_score((content, vector), (&row.content, &row.embedding));
            if p >= point {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }
}

/// What [`MemoryEngine::add_unique`] did.
#[derive(Debug, Clone, Default)]
pub struct Unique {
    /// The memories written.
    pub written: Vec<Memory>,
    /// For each memory not written, the one it says again.
    pub repeated: Vec<Memory>,
}

impl MemoryEngine {
    /// Adds those of `memories` the user does not have yet: each is checked with
    /// [`MemoryEngine::find_duplicate`] and against the earlier ones of the batch; a statement
    /// said again is not written, and the memory it repeats is counted as used instead.
    pub async fn add_unique(&self, user: UserId, memories: Vec<NewMemory>) -> MemoryResult<Unique> {
        let texts: Vec<String> = memories.iter().map(|m| m.content.clone()).collect();
        for memory in &memories {
            Self::check_content(&memory.content)?;
        }
        let embedded = self.embed(&texts).await?;
        let mut fresh: Vec<(NewMemory, crate::store::Embedded)> =
            Vec::with_capacity(memories.len());
        let mut repeated = Vec::new();
        self.settle().await?;
        for (memory, vector) in memories.into_iter().zip(embedded) {
            if fresh
                .iter()
                .any(|(earlier, _)| same_statement(&earlier.content, &memory.content))
            {
                continue;
            }
            match self
                .duplicate_of(user, &memory.content, &vector.vector)
                .await?
            {
                Some(known) => repeated.push(known),
                None => fresh.push((memory, vector)),
            }
        }
        if !repeated.is_empty() {
            let ids: Vec<MemoryId> = repeated.iter().map(|m| m.id).collect();
            self.store
                .user(user)
                .record_access(&ids, 1, crate::store::now())
                .await?;
        }
        let written = self.add_embedded(user, fresh).await?;
        Ok(Unique { written, repeated })
    }
}

/// The people a statement names by relation: two statements about a sister and a brother
/// are about two people, however alike they read.
const RELATIONS: &[&str] = &[
    "mother",
    "mum",
    "mom",
    "father",
    "dad",
    "sister",
    "brother",
    "son",
    "daughter",
    "wife",
    "husband",
    "partner",
    "boyfriend",
    "girlfriend",
    "fiance",
    "fiancee",
    "cousin",
    "aunt",
    "uncle",
    "niece",
    "nephew",
    "grandmother",
    "grandma",
    "gran",
    "grandfather",
    "grandpa",
    "grandson",
    "granddaughter",
    "twin",
    "stepmother",
    "stepfather",
    "roommate",
    "flatmate",
    "colleague",
    "boss",
    "neighbour",
    "neighbor",
    "friend",
    "妈妈",
    "母亲",
    "爸爸",
    "父亲",
    "姐姐",
    "妹妹",
    "哥哥",
    "弟弟",
    "表哥",
    "表姐",
    "表妹",
    "表弟",
    "堂哥",
    "堂姐",
    "堂妹",
    "堂弟",
    "儿子",
    "女儿",
    "老婆",
    "太太",
    "妻子",
    "丈夫",
    "老公",
    "先生",
    "男朋友",
    "女朋友",
    "外孙女",
    "外孙",
    "孙子",
    "孙女",
    "爷爷",
    "奶奶",
    "外公",
    "外婆",
    "姥姥",
    "姥爷",
    "叔叔",
    "阿姨",
    "舅舅",
    "姑姑",
    "室友",
    "同事",
    "老板",
    "邻居",
    "朋友",
    "老伴",
];

/// Two statements that name different values: different numbers, different names, different
/// relatives, or (Chinese) the same slot filled differently.
pub fn values_differ(old: &str, new: &str) -> bool {
    numbers(old) != numbers(new)
        || names_differ(old, new)
        || relations(old) != relations(new)
        || chinese_slot_changed(old, new)
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '’')
        .filter(|word| !word.is_empty())
}

/// Chinese numerals and the words that count years and days relative to now.
const CHINESE_NUMERALS: &str = "〇零一二两三四五六七八九十百千万亿半";
const CHINESE_RELATIVE: &[&str] = &[
    "今年",
    "明年",
    "后年",
    "去年",
    "前年",
    "今天",
    "明天",
    "后天",
    "昨天",
    "前天",
    "上个月",
    "下个月",
    "这个月",
    "上周",
    "下周",
    "本周",
];

/// The numbers a statement names: its runs of digits (so "7654321 TA" and "7654321TA" agree),
/// its runs of Chinese numerals, and Chinese relative dates.
fn numbers(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for numerals in [
        &(|c: char| c.is_ascii_digit()) as &dyn Fn(char) -> bool,
        &|c: char| CHINESE_NUMERALS.contains(c),
    ] {
        let mut run = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if numerals(c) {
                run.push(c);
            } else if !run.is_empty() {
                out.insert(std::mem::take(&mut run));
            }
        }
    }
    out.extend(
        CHINESE_RELATIVE
            .iter()
            .filter(|word| text.contains(*word))
            .map(ToString::to_string),
    );
    out
}

/// Capitalised words past a sentence's start (names of people, places, things), short
/// acronyms aside.
fn names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for sentence in text.split(['.', '!', '?', ';', '。', '！', '？', '；']) {
        for word in words(sentence).skip(1) {
            let word = word.trim_end_matches(['\'', '’']).trim_end_matches("'s");
            // Short acronyms (ID, PIN, TA) are words of the statement, not names.
            let acronym = word.chars().count() <= 3 && word.chars().all(char::is_uppercase);
            if word.chars().next().is_some_and(char::is_uppercase) && !acronym {
                out.insert(word.to_lowercase());
            }
        }
    }
    out
}

/// A name one statement gives that the other does not hold as a word, in any case.
fn names_differ(old: &str, new: &str) -> bool {
    let lower = |text: &str| -> std::collections::BTreeSet<String> {
        words(text)
            .map(|word| {
                word.trim_end_matches(['\'', '’'])
                    .trim_end_matches("'s")
                    .to_lowercase()
            })
            .collect()
    };
    let (old_words, new_words) = (lower(old), lower(new));
    names(old).iter().any(|name| !new_words.contains(name))
        || names(new).iter().any(|name| !old_words.contains(name))
}

fn relations(text: &str) -> std::collections::BTreeSet<&'static str> {
    let lower = text.to_lowercase();
    let latin: std::collections::BTreeSet<String> = words(&lower)
        .map(|word| {
            word.trim_end_matches("'s")
                .trim_end_matches('s')
                .to_string()
        })
        .collect();
    RELATIONS
        .iter()
        .copied()
        .filter(|relation| {
            if relation.is_ascii() {
                latin.contains(*relation)
            } else {
                // The longest relation word a text holds counts, not the ones inside it
                // (外孙女 holds 孙女).
                lower.contains(relation)
                    && !RELATIONS.iter().any(|longer| {
                        longer.len() > relation.len()
                            && longer.contains(relation)
                            && lower.contains(longer)
                    })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_on_numbers_and_new_values() {
        assert!(values_differ(
            "My passport number is X1234567.",
            "My passport number is X7654321."
        ));
        assert!(values_differ(
            "I'm flying to Tokyo on 12 March.",
            "I'm flying to Tokyo on 14 March."
        ));
        assert!(!values_differ(
            "I'm allergic to peanuts.",
            "I have a peanut allergy."
        ));
        assert!(!values_differ("My PIN is 4471", "my pin is 4471!"));
        assert!(!values_differ(
            "My student ID number is 1008765432.",
            "My student number is 1008765432."
        ));
        assert!(values_differ(
            "My sister lives in Glasgow.",
            "My brother Sanjay lives in Glasgow with his wife."
        ));
        assert!(values_differ(
            "我表哥住在厦门。",
            "我表姐住在厦门，开了一家民宿。"
        ));
        assert!(!values_differ(
            "我老伴老刘以前是铁路上的工程师。",
            "我老伴叫老刘，以前是铁路工程师。"
        ));
        assert!(values_differ("我外孙女今年十二岁。", "我孙女今年十二岁。"));
        assert!(values_differ(
            "我养了一缸锦鲤，一共十二条。",
            "我养了一缸锦鲤，一共九条。"
        ));
        assert!(values_differ(
            "我的护照后年八月到期。",
            "我的护照明年八月到期。"
        ));
        assert!(!values_differ(
            "My PPS number is 7654321 TA.",
            "My PPS number is 7654321TA."
        ));
    }
}
