//! Deep-research records: one row per research (the request's resolved configuration, the
//! report, its sources, token usage and stage timings). The research's live progress is the
//! run-event log of the run that executed it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{RunId, RunStatus, StoreResult, ThreadId, UserId};

/// A research as stored.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResearchRecord {
    #[schema(value_type = String)]
    pub id: RunId,
    /// The run whose event log shows this research's progress (a chat run when the research
    /// was started by the chat agent's `deep_research` tool).
    #[schema(value_type = String)]
    pub run_id: RunId,
    #[schema(value_type = Option<String>)]
    pub thread_id: Option<ThreadId>,
    pub query: String,
    pub model: Option<String>,
    pub status: RunStatus,
    /// The resolved configuration the research ran with (no secrets).
    pub config: Value,
    pub report: Option<String>,
    /// The numbered sources the report cites, with their scores.
    pub sources: Value,
    /// Token usage per step and in total.
    pub usage: Value,
    /// Seconds spent in each stage.
    pub stage_timings: Value,
    pub word_count: i64,
    pub source_count: i64,
    pub duration_ms: Option<i64>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// What a research started with.
#[derive(Debug, Clone)]
pub struct NewResearch {
    pub id: RunId,
    pub run_id: RunId,
    pub thread_id: Option<ThreadId>,
    pub query: String,
    pub model: Option<String>,
    pub config: Value,
}

/// What a research ended with.
#[derive(Debug, Clone)]
pub struct ResearchOutcome {
    pub status: RunStatus,
    pub report: Option<String>,
    pub sources: Value,
    pub usage: Value,
    pub stage_timings: Value,
    pub word_count: i64,
    pub source_count: i64,
    pub duration_ms: Option<i64>,
    pub error: Option<String>,
}

impl ResearchOutcome {
    /// An end with `status` and nothing else to record.
    pub(crate) fn ended(status: RunStatus) -> Self {
        Self {
            status,
            report: None,
            sources: Value::Null,
            usage: Value::Null,
            stage_timings: Value::Null,
            word_count: 0,
            source_count: 0,
            duration_ms: None,
            error: None,
        }
    }
}

#[async_trait]
pub(in crate::store) trait ResearchStore: Send + Sync + 'static {
    async fn create_research(&self, user: UserId, research: &NewResearch) -> StoreResult<()>;
    /// Records the end of a research still `running`; a finished one is left as it is.
    async fn finish_research(
        &self,
        user: UserId,
        id: RunId,
        outcome: &ResearchOutcome,
    ) -> StoreResult<()>;
    async fn get_research(&self, user: UserId, id: RunId) -> StoreResult<ResearchRecord>;
    /// The user's researches, newest first.
    async fn list_research(&self, user: UserId, limit: i64) -> StoreResult<Vec<ResearchRecord>>;
    async fn delete_research(&self, user: UserId, id: RunId) -> StoreResult<()>;
}
