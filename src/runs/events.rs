//! The typed events of a run. Every event a chat turn or a research emits is one [`RunEvent`]
//! variant; its JSON (the SSE `data:`) is the variant's fields plus `type`, and the envelope
//! `run_id`, `seq`, `timestamp` (and `research_id`, `model` for research) that
//! [`super::RunContext`] adds when it appends the event. The field names are the seed API's
//! and DESIGN.md's; `tests/api` pins one example of every variant.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::llm::chat::Usage;
use crate::store::{
    EventType, Memory, MemoryId, MemoryKind, MemorySource, MessageId, RunKind, RunStatus, Signals,
    ThreadId, Trust,
};

/// One event of a run's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    SessionStart(SessionStart),
    StageUpdate(Stage),
    Thinking(Stage),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    MemoryRecalled(MemoryRecalled),
    SourcesFound(SourcesFound),
    PlanReview(Stage),
    MessageDelta(Delta),
    ReportDelta(Delta),
    Usage(UsageStep),
    MessageComplete(MessageComplete),
    ResearchComplete(ResearchComplete),
    StageFallback(StageFallback),
    RunResumed(RunResumed),
    Error(ErrorEvent),
    Done(Done),
}

impl RunEvent {
    /// The SSE `event:` name.
    pub fn event_type(&self) -> EventType {
        match self {
            RunEvent::SessionStart(_) => EventType::SessionStart,
            RunEvent::StageUpdate(_) => EventType::StageUpdate,
            RunEvent::Thinking(_) => EventType::Thinking,
            RunEvent::ToolCall(_) => EventType::ToolCall,
            RunEvent::ToolResult(_) => EventType::ToolResult,
            RunEvent::MemoryRecalled(_) => EventType::MemoryRecalled,
            RunEvent::SourcesFound(_) => EventType::SourcesFound,
            RunEvent::PlanReview(_) => EventType::PlanReview,
            RunEvent::MessageDelta(_) => EventType::MessageDelta,
            RunEvent::ReportDelta(_) => EventType::ReportDelta,
            RunEvent::Usage(_) => EventType::Usage,
            RunEvent::MessageComplete(_) => EventType::MessageComplete,
            RunEvent::ResearchComplete(_) => EventType::ResearchComplete,
            RunEvent::StageFallback(_) => EventType::StageFallback,
            RunEvent::RunResumed(_) => EventType::RunResumed,
            RunEvent::Error(_) => EventType::Error,
            RunEvent::Done(_) => EventType::Done,
        }
    }

    /// A stage update (`stage_update`) with empty metadata.
    pub fn stage(stage: impl Into<String>, content: impl Into<String>) -> Self {
        RunEvent::StageUpdate(Stage {
            stage: stage.into(),
            content: content.into(),
            metadata: Some(Value::Object(Default::default())),
        })
    }

    /// A `thinking` event of a research stage.
    pub fn thinking(stage: &str, content: impl Into<String>, metadata: Option<Value>) -> Self {
        RunEvent::Thinking(Stage {
            stage: stage.to_string(),
            content: content.into(),
            metadata,
        })
    }

    /// The end of a run.
    pub fn done(status: RunStatus) -> Self {
        RunEvent::Done(Done { status })
    }
}

/// The start of a chat turn or of a research.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStart {
    pub kind: RunKind,
    /// The model answering (`null` for a chat without a model).
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_message_id: Option<MessageId>,
    /// The research question (research only; `content` repeats it, as the seed API does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A research stage's progress: `stage_update`, `thinking` and `plan_review`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// `clarification`, `research_brief`, `research_execution`, `final_report_generation`
    /// or `completed`.
    pub stage: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A tool the model called: in chat `id`, `name` and `arguments`; in research the seed
/// API's `stage`, `tool`, `arguments`, `content` and `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// What a chat tool returned to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub id: String,
    pub name: String,
    pub ok: bool,
    pub result: Value,
}

/// Memories recalled for the query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecalled {
    pub query: String,
    pub memories: Vec<RecalledMemory>,
}

/// One recalled memory as events show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecalledMemory {
    pub id: MemoryId,
    pub kind: MemoryKind,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<MemorySource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    pub score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<Trust>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<ThreadId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_refs: Vec<String>,
    /// Why it was recalled: its rank and score in each signal's list, the fused score, decay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,
}

impl RecalledMemory {
    /// The event's view of a recall result: the memory, its provenance and its signals (the
    /// model reads none of this; it gets the memories as quoted data).
    pub fn new(memory: &Memory, score: f64, signals: &Signals) -> Self {
        RecalledMemory {
            id: memory.id,
            kind: memory.kind,
            content: memory.content.clone(),
            source: Some(memory.source),
            created_at: Some(memory.created_at),
            score,
            trust: Some(memory.trust),
            thread_id: memory.thread_id,
            source_refs: memory.source_refs.clone(),
            signals: Some(signals.clone()),
        }
    }
}

/// Search results or the sources kept for the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourcesFound {
    pub stage: String,
    pub content: String,
    pub sources: Value,
    pub metadata: Value,
}

/// A chunk of streamed text (`message_delta`, `report_delta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub content: String,
}

/// Tokens of one model call (and the running total in chat).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageStep {
    pub model: String,
    pub step: String,
    pub usage: Usage,
    /// What the run has used so far, this call included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Usage>,
    /// The run's spending cap, when it has one (a research's `budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SpendCap>,
}

/// A cap on what a run may spend on models.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SpendCap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// The assistant's whole reply, stored as a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageComplete {
    pub message_id: MessageId,
    pub content: String,
    pub usage: Usage,
}

/// The finished report with its statistics in `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResearchComplete {
    pub content: String,
    pub metadata: Value,
}

/// A research step whose model reply could not be used (no valid JSON after the retries, no
/// usable tool call, an empty report), done the extractive way instead, as without a model:
/// the brief is the query, the plan one research unit on it, a researcher's findings the
/// passages of what it read, the report a digest of those passages with their citations.
/// The research goes on; a model that cannot be reached still fails it (`error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageFallback {
    /// The research stage it happened in (as in `stage_update`).
    pub stage: String,
    /// The step that fell back: `clarification`, `research_brief`, `supervisor`,
    /// `researcher`, `compression`, `plan_queries`, `learnings`, `curate_sources`,
    /// `final_report` or `conclusions`.
    pub step: String,
    /// Why the model's reply was not used: the parse or schema error, never the reply itself.
    pub reason: String,
    /// What was done instead, in a sentence.
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// The closed set of `error_type`s carried by `error` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunErrorType {
    Llm,
    Tool,
    Search,
    Network,
    Validation,
    /// A token budget stopped the run.
    Budget,
    Internal,
}

impl RunErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            RunErrorType::Llm => "llm",
            RunErrorType::Tool => "tool",
            RunErrorType::Search => "search",
            RunErrorType::Network => "network",
            RunErrorType::Validation => "validation",
            RunErrorType::Budget => "budget",
            RunErrorType::Internal => "internal",
        }
    }
}

/// Something went wrong; the run goes on or ends after it (then `done` says how).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    pub error_type: RunErrorType,
    pub message: String,
    pub retryable: bool,
    /// Research repeats the message here, as the seed API does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A run continued by a new attempt after the replica executing it stopped (it died, or the
/// server restarted). Events with `seq` above `superseded_after` and below this event's belong
/// to the attempt cut short: a client drops what it showed of them (a partial answer or report).
/// Events up to `superseded_after` stand: steps the run had finished are not done again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResumed {
    /// The new attempt's number (the first execution is attempt 1).
    pub attempt: u32,
    pub superseded_after: i64,
    /// The last step finished before the stop (`null`: the run starts over, as a chat turn does).
    pub resumed_from: Option<String>,
    pub content: String,
}

/// The last event of every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub status: RunStatus,
}
