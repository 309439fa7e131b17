//! Export and import: every memory of a user as JSON lines (without vectors), and back.
//! Importing the same file twice adds nothing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{MemoryEngine, MemoryResult};
use crate::store::{
    Memory, MemoryFilter, MemoryKind, MemoryPatch, MemorySource, NewMemory, Trust, UserId,
};

/// One line of an export (and of an import): the memory without its vector.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortableMemory {
    pub kind: MemoryKind,
    #[schema(min_length = 1, max_length = 8000)]
    pub content: String,
    #[serde(default)]
    pub source: Option<MemorySource>,
    #[serde(default)]
    pub trust: Option<Trust>,
    #[serde(default = "default_importance")]
    #[schema(minimum = 1, maximum = 5)]
    pub importance: u8,
    #[serde(default)]
    pub source_refs: Vec<String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub archived_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub invalid_at: Option<DateTime<Utc>>,
}

fn default_importance() -> u8 {
    3
}

impl From<&Memory> for PortableMemory {
    fn from(memory: &Memory) -> Self {
        Self {
            kind: memory.kind,
            content: memory.content.clone(),
            source: Some(memory.source),
            trust: Some(memory.trust),
            importance: memory.importance,
            source_refs: memory.source_refs.clone(),
            created_at: Some(memory.created_at),
            archived_at: memory.archived_at,
            invalid_at: memory.invalid_at,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct ImportReport {
    pub imported: usize,
    /// Lines whose exact content the user already has.
    pub skipped: usize,
    pub errors: Vec<ImportLineError>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ImportLineError {
    pub line: usize,
    pub message: String,
}

impl MemoryEngine {
    /// Every memory of the user (archived and superseded ones too), oldest first.
    pub async fn export(&self, user: UserId) -> MemoryResult<Vec<Memory>> {
        let filter = MemoryFilter {
            include_archived: true,
            include_invalid: true,
            ..MemoryFilter::default()
        };
        let mut all = self.store.user(user).all_memories(&filter).await?;
        all.reverse();
        Ok(all)
    }

    /// Imports JSONL lines (the export format). Lines whose content the user already has are
    /// skipped, so importing the same file twice adds nothing; so are statements the user
    /// already has in other words ([`MemoryEngine::duplicate_of`]). `source` becomes `import`;
    /// trust is kept (never raised above what the line says).
    pub async fn import(&self, user: UserId, jsonl: &str) -> MemoryResult<ImportReport> {
        let mut report = ImportReport::default();
        let existing: std::collections::HashSet<String> = self
            .export(user)
            .await?
            .into_iter()
            .map(|memory| memory.content)
            .collect();
        let mut seen = existing;
        let mut batch: Vec<(usize, PortableMemory)> = Vec::new();
        for (index, line) in jsonl.lines().enumerate() {
            let line_number = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<PortableMemory>(line) {
                Ok(item) => {
                    if let Err(error) = Self::check_content(&item.content) {
                        report.errors.push(ImportLineError {
                            line: line_number,
                            message: error.to_string(),
                        });
                    } else if !(1..=5).contains(&item.importance) {
                        report.errors.push(ImportLineError {
                            line: line_number,
                            message: "importance must be between 1 and 5".into(),
                        });
                    } else if !seen.insert(item.content.clone()) {
                        report.skipped += 1;
                    } else {
                        batch.push((line_number, item));
                    }
                }
                Err(error) => report.errors.push(ImportLineError {
                    line: line_number,
                    message: format!("invalid memory: {error}"),
                }),
            }
        }
        for chunk in batch.chunks(256) {
            let news: Vec<NewMemory> = chunk
                .iter()
                .map(|(_, item)| NewMemory {
                    kind: item.kind,
                    content: item.content.clone(),
                    source: MemorySource::Import,
                    trust: item.trust.unwrap_or(Trust::User),
                    importance: item.importance,
                    thread_id: None,
                    source_refs: item.source_refs.clone(),
                    created_at: item.created_at,
                    supersedes: None,
                })
                .collect();
            // A statement the user already has in other words is skipped like an exact one.
            let texts: Vec<String> = news.iter().map(|m| m.content.clone()).collect();
            let embedded = self.embed(&texts).await?;
            // The chunk before was written a moment ago: the indexes hold it before the search.
            self.settle().await?;
            let mut fresh = Vec::with_capacity(news.len());
            let mut items = Vec::with_capacity(news.len());
            for ((new, vector), (_, item)) in news.into_iter().zip(embedded).zip(chunk) {
                let statement = matches!(
                    new.kind,
                    MemoryKind::Fact
                        | MemoryKind::Preference
                        | MemoryKind::Event
                        | MemoryKind::Conclusion
                );
                if statement
                    && self
                        .duplicate_of(user, &new.content, &vector.vector)
                        .await?
                        .is_some()
                {
                    report.skipped += 1;
                    continue;
                }
                fresh.push((new, vector));
                items.push(item);
            }
            let written = self.add_embedded(user, fresh).await?;
            for (item, memory) in items.into_iter().zip(&written) {
                if item.archived_at.is_some() || item.invalid_at.is_some() {
                    let patch = MemoryPatch {
                        archived: item.archived_at.map(|_| true),
                        invalid_at: item.invalid_at.map(Some),
                        ..MemoryPatch::default()
                    };
                    self.store
                        .user(user)
                        .update_memory(memory.id, patch)
                        .await?;
                }
            }
            report.imported += written.len();
        }
        self.indexer().notify();
        Ok(report)
    }
}
