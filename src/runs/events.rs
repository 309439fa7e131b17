//! The typed events of a run. Every event a chat turn or a research emits is one [`RunEvent`]
//! variant; its JSON (the SSE `data:`) is the variant's fields plus `type`, and the envelope
//! `run_id`, `seq`, `timestamp` (and `research_id`, `model` for research) that
//! [`super::RunContext`] adds when it appends the event. The field names are the seed API's
//! and docs/design.md's; `tests/api` pins one example of every variant.
//!
//! Every payload is typed and in the OpenAPI document (`RunEvent`, from which the web app's
//! types are generated). Three fields carry JSON that is not ours to type: a tool call's
//! `arguments` and a tool's `result` (the model's and the tool's own JSON), and the research
//! configuration snapshot in `session_start` (the same JSON the research record keeps; its
//! schema is `ResolvedConfig`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::enums::text_enum;
use crate::llm::chat::Usage;
use crate::store::{
    EventType, Memory, MemoryId, MemoryKind, MemorySource, MessageId, RunId, RunKind, RunStatus,
    Signals, ThreadId, Trust,
};

/// One event of a run's log (the SSE `data:` without the envelope `run_id`, `seq`,
/// `timestamp`, `research_id` and `model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
    pub(crate) fn event_type(&self) -> EventType {
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
    pub(crate) fn stage(stage: impl Into<String>, content: impl Into<String>) -> Self {
        RunEvent::StageUpdate(Stage {
            stage: stage.into(),
            content: content.into(),
            metadata: Some(StepMeta::default()),
        })
    }

    /// A `thinking` event of a research stage.
    pub fn thinking(stage: &str, content: impl Into<String>, metadata: Option<StepMeta>) -> Self {
        RunEvent::Thinking(Stage {
            stage: stage.to_string(),
            content: content.into(),
            metadata,
        })
    }

    /// The end of a run.
    pub(crate) fn done(status: RunStatus) -> Self {
        RunEvent::Done(Done { status })
    }
}

/// What every stored and streamed event carries beside its own fields (the SSE `data:` is
/// a [`RunEvent`] and its envelope in one object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct Envelope {
    #[schema(value_type = String, format = Uuid)]
    pub run_id: RunId,
    /// The event's place in its run's log (1, 2, …): the SSE `id`, what `Last-Event-ID` and
    /// `?after=` resume after.
    pub seq: i64,
    /// When the event was appended (RFC 3339, UTC, milliseconds).
    pub timestamp: String,
    /// A research's events: the research (the run's own id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub research_id: Option<RunId>,
}

/// The start of a chat turn or of a research.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionStart {
    pub kind: RunKind,
    /// The model answering (`null` for a chat without a model).
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub thread_id: Option<ThreadId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub user_message_id: Option<MessageId>,
    /// The research question (research only; `content` repeats it, as the seed API does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<SessionMeta>,
}

/// What a research's `session_start` says besides the question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionMeta {
    /// The configuration the research runs with, after defaults and limits: the snapshot the
    /// research record keeps (`GET /research/{id}`'s `config`), of schema `ResolvedConfig`.
    #[schema(value_type = Object)]
    pub config: Value,
}

/// A research stage's progress: `stage_update`, `thinking` and `plan_review`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Stage {
    /// `clarification`, `research_brief`, `research_execution`, `final_report_generation`
    /// or `completed`.
    pub stage: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StepMeta>,
}

/// What a research event says about the step it comes from: the `metadata` of
/// `stage_update`, `thinking`, `plan_review`, `tool_call`, `sources_found`, `stage_fallback`
/// and `error`. Every field is optional; each event fills those of its step (an empty object
/// when none applies).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepMeta {
    /// The researcher (1, 2, …) the event belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub researcher: Option<usize>,
    /// That researcher's topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The supervisor's round (1, 2, …) a reflection belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// The plan's topics (in `plan_review`), or those the user's edit kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<String>>,
    /// The run waits for `POST /v1/runs/{id}/input` (a clarifying question, a plan review).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_input: Option<bool>,
    /// How to answer a clarifying question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Recursive mode: the level of the searches (1 is the question's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<u32>,
    /// Recursive mode: the queries planned for a level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<Vec<String>>,
    /// Recursive mode: the question a query plan was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The search query the event is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The stage an error happened in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The page a fetch failed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The search provider that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Results left out because their domain is excluded (or not included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded_by_domain: Option<usize>,
    /// The research a follow-up continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub follow_up_of: Option<RunId>,
    /// `sources_found`: the list is the numbered sources kept for the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curated: Option<bool>,
    /// `sources_found`: the sources not kept, with their scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Vec<DroppedSource>>,
    /// Citation numbers the report used that name no source (removed from the stored report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_citations: Option<Vec<usize>>,
    /// What the run has spent when its budget stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Usage>,
    /// The budget that stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SpendCap>,
    /// A chat tool call the client runs (the OpenAI-compatible endpoint hands it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<bool>,
}

impl StepMeta {
    /// The event of a researcher working on a topic.
    pub(crate) fn researcher(number: usize, topic: &str) -> Self {
        StepMeta {
            researcher: Some(number),
            topic: Some(topic.to_string()),
            ..Default::default()
        }
    }

    /// An event of a stage (an error's stage).
    pub(crate) fn stage(stage: &str) -> Self {
        StepMeta {
            stage: Some(stage.to_string()),
            ..Default::default()
        }
    }
}

/// A source a research found (`sources_found`): a search result (`url`, `title`, `snippet`),
/// or a numbered source kept for the report (`n`, `url`, `title` and its scores).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FoundSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    pub url: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snippet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevance: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credibility: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

impl FoundSource {
    /// A source with its address and title only.
    pub(crate) fn new(url: &str, title: &str) -> Self {
        FoundSource {
            n: None,
            url: url.to_string(),
            title: title.to_string(),
            snippet: None,
            relevance: None,
            credibility: None,
            score: None,
        }
    }
}

/// A source left out of the report, with the score that left it out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DroppedSource {
    pub url: String,
    pub score: f64,
}

/// A tool the model called: in chat `id`, `name` and `arguments`; in research the seed
/// API's `stage`, `tool`, `arguments`, `content` and `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The arguments as the model wrote them (a JSON object, or the raw text of a client
    /// tool's arguments).
    #[schema(value_type = Object)]
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StepMeta>,
}

/// What a chat tool returned to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolResult {
    pub id: String,
    pub name: String,
    pub ok: bool,
    /// The tool's JSON result.
    #[schema(value_type = Object)]
    pub result: Value,
}

/// Memories recalled for the query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MemoryRecalled {
    pub query: String,
    pub memories: Vec<RecalledMemory>,
}

/// One recalled memory as events show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RecalledMemory {
    #[schema(value_type = String, format = Uuid)]
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
    #[schema(value_type = Option<String>, format = Uuid)]
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
    pub(crate) fn new(memory: &Memory, score: f64, signals: &Signals) -> Self {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SourcesFound {
    pub stage: String,
    pub content: String,
    pub sources: Vec<FoundSource>,
    pub metadata: StepMeta,
}

/// A chunk of streamed text (`message_delta`, `report_delta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delta {
    pub content: String,
}

/// Tokens of one model call (and the running total in chat).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpendCap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// The assistant's whole reply, stored as a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MessageComplete {
    #[schema(value_type = String, format = Uuid)]
    pub message_id: MessageId,
    pub content: String,
    pub usage: Usage,
}

/// The finished report with its statistics in `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResearchComplete {
    pub content: String,
    pub metadata: ResearchStats,
}

/// What a finished research reports about itself (`research_complete`'s `metadata`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResearchStats {
    /// `completed`, or `partial` when some topics could not be researched (`gaps`).
    pub outcome: RunStatus,
    pub duration_seconds: f64,
    /// The numbered sources the report may cite (without their excerpts).
    pub sources: Vec<CitedSource>,
    pub word_count: usize,
    pub usage: ResearchUsage,
    /// Seconds spent in each stage, attempts before a takeover included.
    pub stage_timings: BTreeMap<String, f64>,
    pub waiting_ms: Waiting,
    pub peak_concurrent_researchers: usize,
    pub memories_written: usize,
    /// What the check of the report's citations against their sources found.
    pub citations: CitationCheck,
    /// Topics that could not be researched.
    pub gaps: Vec<String>,
}

/// A research's tokens: the total and every model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResearchUsage {
    pub total: Usage,
    pub steps: Vec<UsageStep>,
}

/// Milliseconds spent waiting for models, search providers and page fetches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Waiting {
    pub model: u64,
    pub search: u64,
    pub fetch: u64,
}

/// A source the report may cite, as numbered in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CitedSource {
    pub n: usize,
    pub url: String,
    pub title: String,
    pub relevance: f64,
    pub credibility: f64,
    pub score: f64,
    /// The provider that found it, when the research searched several (`local` is the
    /// user's own documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The start of the text read from it: what the report's claims were checked against,
    /// and what a follow-up starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excerpt: Option<String>,
}

/// What the check of a report's citations found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CitationCheck {
    /// Citations (claim and source) checked.
    pub checked: usize,
    /// Those whose claim was found in the source.
    pub supported: usize,
    /// Citations left unchecked: their claim says too little, or the source's text is gone.
    pub unchecked: usize,
    pub unsupported: Vec<UnsupportedCitation>,
}

/// A citation whose claim was not found in its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UnsupportedCitation {
    pub n: usize,
    pub claim: String,
    /// The best share of the claim's weighted words one passage of the source held.
    pub support: f64,
}

/// A research step whose model reply could not be used (no valid JSON after the retries, no
/// usable tool call, an empty report), done the extractive way instead, as without a model:
/// the brief is the query, the plan one research unit on it, a researcher's findings the
/// passages of what it read, the report a digest of those passages with their citations.
/// The research goes on; a model that cannot be reached still fails it (`error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
    pub metadata: Option<StepMeta>,
}

text_enum! {
    /// The closed set of `error_type`s carried by `error` events.
    RunErrorType("error type") {
        Llm => "llm",
        Tool => "tool",
        Search => "search",
        Network => "network",
        Validation => "validation",
        /// A token budget stopped the run.
        Budget => "budget",
        Internal => "internal",
    }
}

/// Something went wrong; the run goes on or ends after it (then `done` says how).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorEvent {
    pub error_type: RunErrorType,
    pub message: String,
    pub retryable: bool,
    /// Research repeats the message here, as the seed API does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<StepMeta>,
}

/// A run continued by a new attempt after the replica executing it stopped (it died, or the
/// server restarted). Events with `seq` above `superseded_after` and below this event's belong
/// to the attempt cut short: a client drops what it showed of them (a partial answer or report).
/// Events up to `superseded_after` stand: steps the run had finished are not done again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunResumed {
    /// The new attempt's number (the first execution is attempt 1).
    pub attempt: u32,
    pub superseded_after: i64,
    /// The last step finished before the stop (`null`: the run starts over, as a chat turn does).
    pub resumed_from: Option<String>,
    pub content: String,
}

/// The last event of every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Done {
    pub status: RunStatus,
}
