//! The deep-research state machine. One research runs inside one run (its events go to that
//! run's log): optional clarification → research brief (with the user's profile and recalled
//! memories) → plan, optionally reviewed by the user → research execution (a supervisor loop
//! dispatching researchers in parallel up to a cap, or the recursive breadth/depth mode) →
//! source scoring → final report streamed with numbered citations → conclusions to memory.
//!
//! Every step works without an LLM too: the brief is the query, the plan is the query itself,
//! a researcher searches and fetches, findings are the passages most similar to the topic
//! (embedding similarity with diversity), and the report is an extractive, cited digest.
//!
//! All researchers are futures inside the run's body (no detached tasks), so a cancel drops
//! every search, fetch and model call at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use super::fetch::{FetchedPage, Fetcher};
use super::request::{Mode, ResolvedConfig};
use super::search::{SearchHit, SearchProvider};
use crate::llm::chat::{
    ChatMessage, ChatRequest, ChatResponse, ChatRole, LlmError, RoleModel, ToolCall, ToolSpec,
    Usage, complete_json,
};
use crate::llm::prompts::{prompt, quote, render};
use crate::llm::roles::Models;
use crate::memory::recall::cosine;
use crate::memory::{MemoryEngine, RecallRequest};
use crate::runs::{EventType, RunContext, RunErrorType, RunFailure};
use crate::store::{
    MemoryKind, MemorySource, NewMemory, NewResearch, ResearchOutcome, RunId, Store, Trust, UserId,
};

/// What a research needs besides its configuration.
#[derive(Clone)]
pub struct ResearchDeps {
    pub store: Arc<dyn Store>,
    pub memory: Arc<MemoryEngine>,
    /// The models of this research (the request's choices and key applied).
    pub models: Models,
    pub search: Arc<dyn SearchProvider>,
    pub fetcher: Fetcher,
    pub delta_interval: Duration,
}

/// What a finished research produced.
#[derive(Debug, Clone, Serialize)]
pub struct ResearchSummary {
    pub research_id: RunId,
    pub report: String,
    pub sources: Vec<CitedSource>,
    pub word_count: usize,
    pub duration_ms: u64,
    pub usage: Usage,
    /// Milliseconds spent waiting for models, search providers and page fetches.
    pub model_ms: u64,
    pub search_ms: u64,
    pub fetch_ms: u64,
    pub memories_written: usize,
    pub gaps: Vec<String>,
}

/// A source the report may cite, as numbered in the report.
#[derive(Debug, Clone, Serialize)]
pub struct CitedSource {
    pub n: usize,
    pub url: String,
    pub title: String,
    pub relevance: f64,
    pub credibility: f64,
    pub score: f64,
}

/// Passages and compressed findings are cut to these sizes in prompts.
const SOURCE_EXCERPT_CHARS: usize = 3_000;
const CURATE_EXCERPT_CHARS: usize = 400;
/// A source's relevance is judged on its title and this much of its text (the embedding
/// model reads at most a few hundred tokens anyway).
const SCORE_EXCERPT_CHARS: usize = 600;
const PASSAGE_CHARS: usize = 600;
const PASSAGES_PER_TOPIC: usize = 6;
/// At most this many passages of one researcher are embedded for the extractive filter.
const MAX_PASSAGES_EMBEDDED: usize = 160;
const MAX_CONCLUSIONS: usize = 5;
/// Results of one search a researcher without a model fetches.
const FETCHES_PER_SEARCH: usize = 3;

/// Runs one research in `context`'s run and records it under `research_id`.
pub async fn run_research(
    context: Arc<RunContext>,
    deps: ResearchDeps,
    config: ResolvedConfig,
    research_id: RunId,
) -> Result<ResearchSummary, RunFailure> {
    let user = context.user;
    deps.store
        .create_research(
            user,
            &NewResearch {
                id: research_id,
                run_id: context.run.id,
                thread_id: config.thread_id,
                query: config.query.clone(),
                model: config.headline_model(),
                config: serde_json::to_value(&config).unwrap_or(Value::Null),
            },
        )
        .await?;
    let mut guard = RecordGuard {
        store: deps.store.clone(),
        user,
        id: research_id,
        armed: true,
    };
    let research = Research::new(context, deps, config, research_id);
    let result = research.execute().await;
    let outcome = match &result {
        Ok(summary) => ResearchOutcome {
            status: "completed".into(),
            report: Some(summary.report.clone()),
            sources: serde_json::to_value(&summary.sources).unwrap_or(Value::Null),
            usage: research.usage_json(),
            stage_timings: research.progress.timings(),
            word_count: summary.word_count as i64,
            source_count: summary.sources.len() as i64,
            duration_ms: Some(summary.duration_ms as i64),
            error: None,
        },
        Err(RunFailure::Failed { message, .. }) => ResearchOutcome {
            status: "failed".into(),
            usage: research.usage_json(),
            stage_timings: research.progress.timings(),
            duration_ms: Some(research.started.elapsed().as_millis() as i64),
            error: Some(message.clone()),
            sources: json!([]),
            ..ResearchOutcome::default()
        },
    };
    guard.armed = false;
    research
        .deps
        .store
        .finish_research(user, research_id, &outcome)
        .await?;
    result
}

/// Marks the research `cancelled` when its run is dropped before it recorded an end.
struct RecordGuard {
    store: Arc<dyn Store>,
    user: UserId,
    id: RunId,
    armed: bool,
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, user, id) = (self.store.clone(), self.user, self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let outcome = ResearchOutcome {
                    status: "cancelled".into(),
                    sources: json!([]),
                    usage: json!({}),
                    stage_timings: json!({}),
                    ..ResearchOutcome::default()
                };
                if let Err(error) = store.finish_research(user, id, &outcome).await {
                    tracing::warn!(%id, %error, "could not record a cancelled research");
                }
            });
        }
    }
}

// --- progress: events, stage timings, usage, time spent waiting ----------------------------

struct Progress {
    context: Arc<RunContext>,
    research_id: RunId,
    model: Option<String>,
    stages: Mutex<Vec<(String, Instant)>>,
}

impl Progress {
    async fn emit(&self, event: EventType, payload: Value) -> Result<(), RunFailure> {
        let mut payload = match payload {
            Value::Object(map) => map,
            other => {
                let mut map = serde_json::Map::new();
                map.insert("content".into(), other);
                map
            }
        };
        payload.insert("research_id".into(), json!(self.research_id));
        payload.entry("model").or_insert_with(|| json!(self.model));
        self.context.emit(event, Value::Object(payload)).await?;
        Ok(())
    }

    async fn stage(&self, stage: &str, content: &str) -> Result<(), RunFailure> {
        self.stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((stage.to_string(), Instant::now()));
        self.emit(
            EventType::StageUpdate,
            json!({ "stage": stage, "content": content, "metadata": {} }),
        )
        .await
    }

    /// Seconds per stage (a stage lasts until the next one starts).
    fn timings(&self) -> Value {
        let stages = self
            .stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = serde_json::Map::new();
        for (index, (name, started)) in stages.iter().enumerate() {
            let ended = stages
                .get(index + 1)
                .map(|(_, at)| *at)
                .unwrap_or_else(Instant::now);
            let seconds = ended.saturating_duration_since(*started).as_secs_f64();
            let total = out.get(name).and_then(Value::as_f64).unwrap_or(0.0) + seconds;
            out.insert(name.clone(), json!((total * 1000.0).round() / 1000.0));
        }
        Value::Object(out)
    }

    async fn error(
        &self,
        error_type: RunErrorType,
        message: &str,
        retryable: bool,
        metadata: Value,
    ) -> Result<(), RunFailure> {
        self.emit(
            EventType::Error,
            json!({
                "error_type": error_type.as_str(), "message": message, "retryable": retryable,
                "content": message, "metadata": metadata,
            }),
        )
        .await
    }
}

/// Time spent waiting on things outside mnemo, in microseconds.
#[derive(Default)]
struct Meter {
    model: AtomicU64,
    search: AtomicU64,
    fetch: AtomicU64,
}

impl Meter {
    fn add(counter: &AtomicU64, started: Instant) {
        counter.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    fn ms(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed) / 1000
    }
}

// --- sources ------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Source {
    url: String,
    title: String,
    /// The readable text, once fetched (or returned in full by the provider).
    text: Option<String>,
    relevance: f64,
    credibility: f64,
    score: f64,
}

/// The run's sources by URL, and the fetches made (each URL is fetched once per run, even
/// when several researchers ask for it at the same time).
#[derive(Default)]
struct Sources {
    list: Mutex<Vec<Source>>,
    fetches: Mutex<HashMap<String, FetchCell>>,
}

/// One URL's fetch, shared by every researcher asking for it.
type FetchCell = Arc<tokio::sync::OnceCell<Result<Arc<FetchedPage>, String>>>;

impl Sources {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Source>> {
        self.list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds search hits; returns the ones not seen before.
    fn add_hits(&self, hits: &[SearchHit]) -> Vec<SearchHit> {
        let mut list = self.lock();
        let mut new = Vec::new();
        for hit in hits {
            match list.iter_mut().find(|source| source.url == hit.url) {
                Some(known) => {
                    if known.text.is_none() && hit.content.is_some() {
                        known.text = hit.content.clone();
                    }
                }
                None => {
                    list.push(Source {
                        url: hit.url.clone(),
                        title: hit.title.clone(),
                        text: hit.content.clone().filter(|text| !text.trim().is_empty()),
                        relevance: 0.0,
                        credibility: 0.0,
                        score: 0.0,
                    });
                    new.push(hit.clone());
                }
            }
        }
        new
    }

    fn set_text(&self, url: &str, page: &FetchedPage) {
        let mut list = self.lock();
        let title = page.title.clone().unwrap_or_else(|| url.to_string());
        match list.iter_mut().find(|source| source.url == url) {
            Some(source) => {
                source.text = Some(page.text.clone());
                if source.title.is_empty() || source.title == source.url {
                    source.title = title;
                }
            }
            None => list.push(Source {
                url: url.to_string(),
                title,
                text: Some(page.text.clone()),
                relevance: 0.0,
                credibility: 0.0,
                score: 0.0,
            }),
        }
    }

    fn text_of(&self, url: &str) -> Option<String> {
        self.lock()
            .iter()
            .find(|source| source.url == url)
            .and_then(|source| source.text.clone())
    }

    fn fetch_cell(&self, url: &str) -> FetchCell {
        self.fetches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(url.to_string())
            .or_default()
            .clone()
    }

    /// Sources whose text was read: only these may be cited.
    fn readable(&self) -> Vec<Source> {
        self.lock()
            .iter()
            .filter(|source| source.text.is_some())
            .cloned()
            .collect()
    }
}

/// A passage of a source, for the extractive path.
#[derive(Debug, Clone)]
struct Passage {
    url: String,
    text: String,
}

/// What one researcher (or one query of the recursive mode) brought back.
#[derive(Debug, Clone)]
struct Findings {
    topic: String,
    /// Compressed findings, each with its source URL.
    text: String,
    passages: Vec<Passage>,
    /// Why the topic could not be researched, when it could not.
    failed: Option<String>,
}

// --- the research -------------------------------------------------------------------------

struct Research {
    deps: ResearchDeps,
    config: ResolvedConfig,
    progress: Progress,
    meter: Meter,
    usage: Mutex<Usage>,
    steps: Mutex<Vec<Value>>,
    sources: Sources,
    started: Instant,
    user: UserId,
    running: AtomicUsize,
    peak: AtomicUsize,
}

impl Research {
    fn new(
        context: Arc<RunContext>,
        deps: ResearchDeps,
        config: ResolvedConfig,
        research_id: RunId,
    ) -> Self {
        let user = context.user;
        Self {
            progress: Progress {
                context,
                research_id,
                model: config.headline_model(),
                stages: Mutex::new(Vec::new()),
            },
            deps,
            config,
            meter: Meter::default(),
            usage: Mutex::new(Usage::default()),
            steps: Mutex::new(Vec::new()),
            sources: Sources::default(),
            started: Instant::now(),
            user,
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn usage_json(&self) -> Value {
        let total = *self
            .usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let steps = self
            .steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        json!({ "total": total, "steps": steps })
    }

    fn role(&self, role: &str) -> Option<&RoleModel> {
        self.deps.models.role(role)
    }

    async fn execute(&self) -> Result<ResearchSummary, RunFailure> {
        let config = &self.config;
        self.progress
            .emit(
                EventType::SessionStart,
                json!({
                    "kind": "research", "query": config.query, "content": config.query,
                    "metadata": { "config": config },
                }),
            )
            .await?;
        let memories = self.recall_context().await?;
        let clarification = self.clarify(&memories).await?;
        let brief = self.brief(&memories, clarification.as_deref()).await?;
        let findings = match config.mode {
            Mode::Supervisor => self.supervise(&brief).await?,
            Mode::Recursive => self.recursive(&brief).await?,
        };
        let gaps: Vec<String> = findings
            .iter()
            .filter_map(|found| {
                found
                    .failed
                    .as_ref()
                    .map(|why| format!("{}: {why}", found.topic))
            })
            .collect();
        self.progress
            .stage(
                "final_report_generation",
                "Scoring sources and writing the report",
            )
            .await?;
        let cited = self.score_sources(&brief).await?;
        let report = self.report(&brief, &findings, &cited, &gaps).await?;
        let memories_written = self.remember(&report, &cited).await?;
        self.progress
            .stage("completed", "Research complete")
            .await?;
        let total = *self
            .usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let summary = ResearchSummary {
            research_id: self.progress.research_id,
            word_count: word_count(&report),
            report,
            sources: cited
                .iter()
                .map(|(n, source)| CitedSource {
                    n: *n,
                    url: source.url.clone(),
                    title: source.title.clone(),
                    relevance: round3(source.relevance),
                    credibility: round3(source.credibility),
                    score: round3(source.score),
                })
                .collect(),
            duration_ms: self.started.elapsed().as_millis() as u64,
            usage: total,
            model_ms: Meter::ms(&self.meter.model),
            search_ms: Meter::ms(&self.meter.search),
            fetch_ms: Meter::ms(&self.meter.fetch),
            memories_written,
            gaps,
        };
        self.progress
            .emit(
                EventType::ResearchComplete,
                json!({
                    "content": summary.report,
                    "metadata": {
                        "duration_seconds": summary.duration_ms as f64 / 1000.0,
                        "sources": summary.sources,
                        "word_count": summary.word_count,
                        "usage": self.usage_json(),
                        "stage_timings": self.progress.timings(),
                        "waiting_ms": {
                            "model": summary.model_ms, "search": summary.search_ms,
                            "fetch": summary.fetch_ms,
                        },
                        "peak_concurrent_researchers": self.peak.load(Ordering::Relaxed),
                        "memories_written": summary.memories_written,
                        "gaps": summary.gaps,
                    },
                }),
            )
            .await?;
        Ok(summary)
    }

    // --- model calls, metered and accounted ------------------------------------------------

    async fn account(&self, step: &str, model: &str, usage: &Usage) -> Result<(), RunFailure> {
        self.usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(usage);
        let entry = json!({ "step": step, "model": model, "usage": usage });
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(entry.clone());
        self.progress.emit(EventType::Usage, entry).await
    }

    async fn complete(
        &self,
        step: &str,
        role: &RoleModel,
        request: ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        let started = Instant::now();
        let result = role.model.complete(&request).await;
        Meter::add(&self.meter.model, started);
        if let Ok(response) = &result {
            // A usage event that cannot be written fails the run at its next step.
            let _ = self
                .account(step, role.model.model(), &response.usage)
                .await;
        }
        result
    }

    async fn json<T>(
        &self,
        step: &str,
        role: &RoleModel,
        text: String,
        parse: impl Fn(Value) -> Result<T, String>,
    ) -> Result<T, LlmError> {
        let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
        request.max_tokens = Some(role.max_tokens);
        let started = Instant::now();
        let result = complete_json(
            role.model.as_ref(),
            request,
            self.deps.models.structured_retries,
            parse,
        )
        .await;
        Meter::add(&self.meter.model, started);
        let (value, usage) = result?;
        let _ = self.account(step, role.model.model(), &usage).await;
        Ok(value)
    }

    // --- stages ----------------------------------------------------------------------------

    /// The user's profile and the memories most related to the query, quoted as data.
    async fn recall_context(&self) -> Result<String, RunFailure> {
        let mut lines = Vec::new();
        match self.deps.memory.profile(self.user).await {
            Ok(Some(profile)) => lines.push(format!("Profile: {}", profile.content)),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "research: reading the profile failed"),
        }
        let request = RecallRequest {
            query: self.config.query.clone(),
            k: Some(5),
            decay: true,
            ..RecallRequest::default()
        };
        let recalled = match self.deps.memory.recall(self.user, request).await {
            Ok(response) => response.results,
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Internal,
                        &format!("recalling memories failed: {error}"),
                        true,
                        json!({ "stage": "research_brief" }),
                    )
                    .await?;
                Vec::new()
            }
        };
        let memories: Vec<Value> = recalled
            .iter()
            .map(|found| {
                json!({ "id": found.memory.id, "kind": found.memory.kind, "content": found.memory.content, "score": found.score })
            })
            .collect();
        self.progress
            .emit(
                EventType::MemoryRecalled,
                json!({ "query": self.config.query, "memories": memories }),
            )
            .await?;
        lines.extend(
            recalled
                .iter()
                .map(|found| format!("- ({}) {}", found.memory.kind, found.memory.content)),
        );
        Ok(if lines.is_empty() {
            "(nothing yet)".into()
        } else {
            quote(&lines.join("\n"))
        })
    }

    /// Asks the user one question when the model finds the query ambiguous, and waits for
    /// the answer (`POST /v1/runs/{id}/input`).
    async fn clarify(&self, memories: &str) -> Result<Option<String>, RunFailure> {
        if !self.config.allow_clarification {
            return Ok(None);
        }
        let Some(role) = self.role("research") else {
            return Ok(None);
        };
        self.progress
            .stage(
                "clarification",
                "Checking whether the request needs clarification",
            )
            .await?;
        let text = render(
            prompt("research_clarify").unwrap_or_default(),
            &[
                ("memories", memories),
                ("query", &quote(&self.config.query)),
            ],
        );
        let decision = self
            .json("clarification", role, text, |value| {
                let need = value["need_clarification"]
                    .as_bool()
                    .ok_or("need_clarification must be true or false")?;
                Ok((
                    need,
                    value["question"].as_str().unwrap_or("").trim().to_string(),
                ))
            })
            .await
            .map_err(llm_failure)?;
        let (true, question) = decision else {
            return Ok(None);
        };
        if question.is_empty() {
            return Ok(None);
        }
        self.progress
            .emit(
                EventType::StageUpdate,
                json!({
                    "stage": "clarification", "content": question,
                    "metadata": { "awaiting_input": true, "input": "POST /v1/runs/{id}/input {\"content\": \"…\"}" },
                }),
            )
            .await?;
        let answer =
            self.progress.context.wait_input().await.ok_or_else(|| {
                failure(RunErrorType::Internal, "the run stopped waiting for input")
            })?;
        let answer = answer["content"]
            .as_str()
            .unwrap_or_default()
            .trim()
            .to_string();
        Ok(Some(format!(
            "Asked: {question}\nThe user answered:\n{}",
            quote(&answer)
        )))
    }

    async fn brief(
        &self,
        memories: &str,
        clarification: Option<&str>,
    ) -> Result<String, RunFailure> {
        self.progress
            .stage("research_brief", "Writing the research brief")
            .await?;
        let brief = match self.role("research") {
            None => match clarification {
                Some(more) => format!("{}\n\n{more}", self.config.query),
                None => self.config.query.clone(),
            },
            Some(role) => {
                let text = render(
                    prompt("research_brief").unwrap_or_default(),
                    &[
                        ("date", &today()),
                        ("memories", memories),
                        ("query", &quote(&self.config.query)),
                        ("clarification", clarification.unwrap_or("")),
                    ],
                );
                self.json("research_brief", role, text, |value| {
                    value["brief"]
                        .as_str()
                        .map(str::trim)
                        .filter(|brief| !brief.is_empty())
                        .map(str::to_string)
                        .ok_or_else(|| "brief must be a non-empty string".to_string())
                })
                .await
                .map_err(llm_failure)?
            }
        };
        self.progress
            .emit(
                EventType::Thinking,
                json!({ "stage": "research_brief", "content": brief }),
            )
            .await?;
        Ok(brief)
    }

    /// Shows the plan and waits for approval or an edited list of topics.
    async fn review(&self, topics: Vec<String>) -> Result<Vec<String>, RunFailure> {
        if !self.config.plan_review {
            return Ok(topics);
        }
        let plan = topics
            .iter()
            .enumerate()
            .map(|(index, topic)| format!("{}. {topic}", index + 1))
            .collect::<Vec<_>>()
            .join("\n");
        self.progress
            .emit(
                EventType::PlanReview,
                json!({
                    "stage": "research_execution", "content": plan,
                    "metadata": { "topics": topics, "awaiting_input": true },
                }),
            )
            .await?;
        let input =
            self.progress.context.wait_input().await.ok_or_else(|| {
                failure(RunErrorType::Internal, "the run stopped waiting for input")
            })?;
        if let Some(edited) = input["topics"].as_array() {
            let edited: Vec<String> = edited
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .filter(|topic| !topic.is_empty())
                .map(str::to_string)
                .collect();
            if !edited.is_empty() {
                self.progress
                    .emit(
                        EventType::Thinking,
                        json!({ "stage": "research_execution", "content": "The user edited the plan", "metadata": { "topics": edited } }),
                    )
                    .await?;
                return Ok(edited);
            }
        }
        if input["approve"].as_bool() == Some(false) {
            return Err(failure(
                RunErrorType::Validation,
                "the user rejected the research plan",
            ));
        }
        Ok(topics)
    }

    /// The supervisor loop: plan sub-topics, dispatch researchers (≤ the concurrency cap),
    /// read their findings, repeat for gaps, up to `max_researcher_iterations` rounds.
    async fn supervise(&self, brief: &str) -> Result<Vec<Findings>, RunFailure> {
        self.progress
            .stage("research_execution", "Planning and dispatching researchers")
            .await?;
        let Some(role) = self.role("research") else {
            let topics = self.review(vec![self.config.query.clone()]).await?;
            return Ok(self.dispatch(topics, 0).await);
        };
        let max_rounds = self.config.max_researcher_iterations;
        let system = render(
            prompt("research_supervisor").unwrap_or_default(),
            &[
                ("date", &today()),
                ("brief", brief),
                (
                    "max_units",
                    &self.config.max_concurrent_research_units.to_string(),
                ),
                ("max_rounds", &max_rounds.to_string()),
            ],
        );
        let mut messages = vec![ChatMessage::system(system), ChatMessage::user(brief)];
        let mut all = Vec::new();
        for round in 0..max_rounds {
            let mut request = ChatRequest::new(messages.clone());
            request.tools = supervisor_tools();
            request.max_tokens = Some(role.max_tokens);
            let response = self
                .complete("supervisor", role, request)
                .await
                .map_err(llm_failure)?;
            if response.tool_calls.is_empty() {
                break;
            }
            messages.push(assistant_with_calls(&response));
            let mut topics = Vec::new();
            let mut topic_calls = Vec::new();
            let mut complete = false;
            for call in &response.tool_calls {
                let arguments = arguments(call);
                match call.name.as_str() {
                    "conduct_research" => {
                        match arguments["research_topic"]
                            .as_str()
                            .map(str::trim)
                            .filter(|topic| !topic.is_empty())
                        {
                            Some(topic) => {
                                topics.push(topic.to_string());
                                topic_calls.push(call.id.clone());
                            }
                            None => messages.push(ChatMessage::tool_result(
                                &call.id,
                                "error: research_topic must be a non-empty string",
                            )),
                        }
                    }
                    "think" => {
                        let reflection = arguments["reflection"].as_str().unwrap_or_default();
                        self.progress
                            .emit(
                                EventType::Thinking,
                                json!({ "stage": "research_execution", "content": reflection, "metadata": { "round": round + 1 } }),
                            )
                            .await?;
                        messages.push(ChatMessage::tool_result(&call.id, "Reflection recorded."));
                    }
                    "research_complete" => {
                        complete = true;
                        messages.push(ChatMessage::tool_result(&call.id, "Research complete."));
                    }
                    other => messages.push(ChatMessage::tool_result(
                        &call.id,
                        format!("error: unknown tool {other:?}"),
                    )),
                }
            }
            if topics.is_empty() {
                if complete {
                    break;
                }
                continue;
            }
            let reviewed = if round == 0 {
                self.review(topics.clone()).await?
            } else {
                topics.clone()
            };
            let edited = reviewed != topics;
            let found = self.dispatch(reviewed, all.len()).await;
            if edited {
                // The plan the model made was replaced: its calls are answered together.
                let summary = found
                    .iter()
                    .map(|f| format!("## {}\n{}", f.topic, f.text))
                    .collect::<Vec<_>>()
                    .join("\n\n");
                for (index, id) in topic_calls.iter().enumerate() {
                    let content = if index == 0 {
                        format!("The user replaced the plan. Findings:\n{summary}")
                    } else {
                        "See the first result.".to_string()
                    };
                    messages.push(ChatMessage::tool_result(id, content));
                }
            } else {
                for (id, found) in topic_calls.iter().zip(&found) {
                    let content = match &found.failed {
                        Some(why) => format!("This research failed: {why}\n{}", found.text),
                        None => found.text.clone(),
                    };
                    messages.push(ChatMessage::tool_result(id, content));
                }
            }
            all.extend(found);
            if complete {
                break;
            }
        }
        if all.is_empty() {
            // The supervisor ended without dispatching anything: research the brief itself.
            all = self.dispatch(vec![self.config.query.clone()], 0).await;
        }
        Ok(all)
    }

    /// Runs researchers for `topics`, at most `max_concurrent_research_units` at a time, and
    /// returns their findings in the order of `topics`.
    async fn dispatch(&self, topics: Vec<String>, first_index: usize) -> Vec<Findings> {
        let cap = self.config.max_concurrent_research_units.max(1) as usize;
        let mut found: Vec<(usize, Findings)> =
            futures::stream::iter(topics.into_iter().enumerate())
                .map(|(index, topic)| async move {
                    let number = first_index + index + 1;
                    let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                    self.peak.fetch_max(now, Ordering::SeqCst);
                    let findings = self.researcher(number, topic).await;
                    self.running.fetch_sub(1, Ordering::SeqCst);
                    (index, findings)
                })
                .buffer_unordered(cap)
                .collect()
                .await;
        found.sort_by_key(|(index, _)| *index);
        found.into_iter().map(|(_, findings)| findings).collect()
    }

    /// One researcher. Its failures are reported as `error` events and come back as findings
    /// that say what failed; they never end the research.
    async fn researcher(&self, number: usize, topic: String) -> Findings {
        let outcome = match self.role("research") {
            Some(role) => self.react(number, &topic, role).await,
            None => self.gather(number, &topic).await,
        };
        let mut findings = match outcome {
            Ok(findings) => findings,
            Err(message) => Findings {
                topic: topic.clone(),
                text: String::new(),
                passages: Vec::new(),
                failed: Some(message),
            },
        };
        if let Some(why) = &findings.failed {
            let _ = self
                .progress
                .error(
                    RunErrorType::Tool,
                    &format!("researcher {number} could not research {topic:?}: {why}"),
                    false,
                    json!({ "researcher": number, "topic": topic }),
                )
                .await;
        }
        if findings.text.is_empty() && !findings.passages.is_empty() {
            findings.text = passages_text(&findings.passages);
        }
        findings
    }

    /// The ReAct loop of a researcher with a model: search, fetch, think, then compress.
    async fn react(
        &self,
        number: usize,
        topic: &str,
        role: &RoleModel,
    ) -> Result<Findings, String> {
        let meta = json!({ "researcher": number, "topic": topic });
        let _ = self
            .progress
            .emit(
                EventType::Thinking,
                json!({ "stage": "research_execution", "content": format!("Researcher {number} started: {topic}"), "metadata": meta }),
            )
            .await;
        let system = render(
            prompt("research_researcher").unwrap_or_default(),
            &[
                ("date", &today()),
                ("topic", topic),
                ("max_calls", &self.config.max_react_tool_calls.to_string()),
            ],
        );
        let mut messages = vec![ChatMessage::system(system), ChatMessage::user(topic)];
        let mut calls = 0u32;
        let mut read: Vec<String> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let notes = loop {
            let mut request = ChatRequest::new(messages.clone());
            let budget_left = calls < self.config.max_react_tool_calls;
            if budget_left {
                request.tools = researcher_tools();
            }
            request.max_tokens = Some(role.max_tokens);
            let response = self
                .complete(&format!("researcher {number}"), role, request)
                .await
                .map_err(|error| format!("the research model failed: {}", error.message))?;
            if response.tool_calls.is_empty() || !budget_left {
                break response.content;
            }
            messages.push(assistant_with_calls(&response));
            for call in &response.tool_calls {
                calls += 1;
                let result = if calls > self.config.max_react_tool_calls {
                    "error: the tool-call budget is spent; answer with your findings now".into()
                } else {
                    self.researcher_tool(number, topic, call, &mut read, &mut failures)
                        .await
                };
                messages.push(ChatMessage::tool_result(&call.id, result));
            }
        };
        // A researcher that read nothing and could not fetch anything has failed.
        if read.is_empty() && !failures.is_empty() && notes.trim().is_empty() {
            return Err(failures.join("; "));
        }
        let text = self.compress(topic, &notes, &read).await;
        Ok(Findings {
            topic: topic.to_string(),
            text,
            passages: Vec::new(),
            failed: None,
        })
    }

    async fn researcher_tool(
        &self,
        number: usize,
        topic: &str,
        call: &ToolCall,
        read: &mut Vec<String>,
        failures: &mut Vec<String>,
    ) -> String {
        let arguments = arguments(call);
        let _ = self
            .progress
            .emit(
                EventType::ToolCall,
                json!({
                    "stage": "research_execution", "tool": call.name, "arguments": arguments,
                    "content": format!("{} {}", call.name, arguments),
                    "metadata": { "researcher": number, "topic": topic },
                }),
            )
            .await;
        match call.name.as_str() {
            "web_search" => {
                let Some(query) = arguments["query"].as_str().filter(|q| !q.trim().is_empty())
                else {
                    return "error: web_search needs a query".into();
                };
                match self.search(number, query).await {
                    Ok(hits) => {
                        for hit in &hits {
                            if hit.content.is_some() {
                                read.push(hit.url.clone());
                            }
                        }
                        format_hits(&hits)
                    }
                    Err(message) => {
                        failures.push(message.clone());
                        format!("error: {message}")
                    }
                }
            }
            "fetch_url" => {
                let Some(url) = arguments["url"].as_str().filter(|u| !u.trim().is_empty()) else {
                    return "error: fetch_url needs a url".into();
                };
                match self.fetch(number, url).await {
                    Ok(page) => {
                        read.push(url.to_string());
                        format!(
                            "Fetched {} ({}):\n{}",
                            page.url,
                            page.title.as_deref().unwrap_or(""),
                            quote(&truncate(&page.text, SOURCE_EXCERPT_CHARS))
                        )
                    }
                    Err(message) => {
                        failures.push(message.clone());
                        format!("error: {message}")
                    }
                }
            }
            "think" => {
                let reflection = arguments["reflection"].as_str().unwrap_or_default();
                let _ = self
                    .progress
                    .emit(
                        EventType::Thinking,
                        json!({ "stage": "research_execution", "content": reflection, "metadata": { "researcher": number } }),
                    )
                    .await;
                "Reflection recorded.".into()
            }
            other => format!("error: unknown tool {other:?}"),
        }
    }

    /// Searches and records the hits as sources (`sources_found`).
    async fn search(&self, number: usize, query: &str) -> Result<Vec<SearchHit>, String> {
        let started = Instant::now();
        let result = self
            .deps
            .search
            .search(self.user, query, self.config.search_results)
            .await;
        Meter::add(&self.meter.search, started);
        match result {
            Ok(hits) => {
                self.sources.add_hits(&hits);
                let listed: Vec<Value> = hits
                    .iter()
                    .map(
                        |hit| json!({ "url": hit.url, "title": hit.title, "snippet": hit.snippet }),
                    )
                    .collect();
                let _ = self
                    .progress
                    .emit(
                        EventType::SourcesFound,
                        json!({
                            "stage": "research_execution",
                            "content": format!("{} results for {query:?}", hits.len()),
                            "sources": listed,
                            "metadata": { "researcher": number, "query": query, "provider": self.deps.search.name() },
                        }),
                    )
                    .await;
                Ok(hits)
            }
            Err(error) => {
                let message = format!("search for {query:?} failed: {error}");
                let _ = self
                    .progress
                    .error(
                        RunErrorType::Search,
                        &message,
                        error.retryable(),
                        json!({ "researcher": number, "query": query }),
                    )
                    .await;
                Err(message)
            }
        }
    }

    /// Fetches a page once per run; a failure is an `error` event and an error string.
    async fn fetch(&self, number: usize, url: &str) -> Result<Arc<FetchedPage>, String> {
        let cell = self.sources.fetch_cell(url);
        let mut first = false;
        let result = cell
            .get_or_init(|| async {
                first = true;
                let started = Instant::now();
                let fetched = self.deps.fetcher.fetch(url).await;
                Meter::add(&self.meter.fetch, started);
                fetched
                    .map(Arc::new)
                    .map_err(|error| format!("fetching {url} failed ({}): {error}", error.kind()))
            })
            .await
            .clone();
        if first {
            match &result {
                Ok(page) => self.sources.set_text(url, page),
                Err(message) => {
                    let _ = self
                        .progress
                        .error(
                            RunErrorType::Network,
                            message,
                            true,
                            json!({ "researcher": number, "url": url }),
                        )
                        .await;
                }
            }
        }
        result
    }

    /// Research without a model: search the topic, read the top results, keep the passages
    /// most similar to the topic.
    async fn gather(&self, number: usize, topic: &str) -> Result<Findings, String> {
        let hits = self.search(number, topic).await?;
        let mut read = Vec::new();
        let mut failures = Vec::new();
        for hit in &hits {
            if hit
                .content
                .as_deref()
                .is_some_and(|text| !text.trim().is_empty())
            {
                read.push(hit.url.clone());
            }
        }
        let to_fetch: Vec<&SearchHit> = hits
            .iter()
            .filter(|hit| hit.content.is_none())
            .take(FETCHES_PER_SEARCH)
            .collect();
        let fetched = futures::future::join_all(
            to_fetch
                .iter()
                .map(|hit| async move { (hit.url.clone(), self.fetch(number, &hit.url).await) }),
        )
        .await;
        for (url, result) in fetched {
            match result {
                Ok(_) => read.push(url),
                Err(message) => failures.push(message),
            }
        }
        if read.is_empty() {
            return Err(if failures.is_empty() {
                format!("no sources found for {topic:?}")
            } else {
                failures.join("; ")
            });
        }
        let passages = self.select_passages(topic, &read).await?;
        Ok(Findings {
            topic: topic.to_string(),
            text: String::new(),
            passages,
            failed: None,
        })
    }

    /// The passages of the read sources most similar to `topic`, diverse (MMR).
    async fn select_passages(&self, topic: &str, urls: &[String]) -> Result<Vec<Passage>, String> {
        let mut candidates: Vec<Passage> = Vec::new();
        for url in urls {
            if let Some(text) = self.sources.text_of(url) {
                candidates.extend(split_passages(&text).into_iter().map(|text| Passage {
                    url: url.clone(),
                    text,
                }));
            }
        }
        candidates.truncate(MAX_PASSAGES_EMBEDDED);
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let mut texts = vec![topic.to_string()];
        texts.extend(candidates.iter().map(|passage| passage.text.clone()));
        let vectors = self
            .deps
            .memory
            .embedder()
            .embed(&texts)
            .await
            .map_err(|error| format!("embedding passages failed: {error}"))?;
        let (query, rest) = vectors
            .split_first()
            .ok_or_else(|| "the embedder returned nothing".to_string())?;
        let chosen = mmr(query, rest, PASSAGES_PER_TOPIC, 0.7);
        Ok(chosen
            .into_iter()
            .map(|(index, _)| candidates[index].clone())
            .collect())
    }

    /// Compresses a researcher's notes and reading with the compression model; without one
    /// (or when it fails), keeps the passages most similar to the topic.
    async fn compress(&self, topic: &str, notes: &str, read: &[String]) -> String {
        let sources: Vec<String> = read
            .iter()
            .filter_map(|url| {
                self.sources.text_of(url).map(|text| {
                    format!(
                        "Source {url}:\n{}",
                        quote(&truncate(&text, SOURCE_EXCERPT_CHARS))
                    )
                })
            })
            .collect();
        if let Some(role) = self.role("compression") {
            let text = render(
                prompt("research_compress").unwrap_or_default(),
                &[
                    ("topic", topic),
                    ("notes", &quote(notes)),
                    ("sources", &sources.join("\n\n")),
                ],
            );
            let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
            request.max_tokens = Some(role.max_tokens);
            match self.complete("compression", role, request).await {
                Ok(response) if !response.content.trim().is_empty() => return response.content,
                Ok(_) => {}
                Err(error) => {
                    let _ = self
                        .progress
                        .error(
                            RunErrorType::Llm,
                            &format!("compressing the findings on {topic:?} failed: {}; keeping the most similar passages", error.message),
                            error.retryable(),
                            json!({ "topic": topic }),
                        )
                        .await;
                }
            }
        }
        match self.select_passages(topic, read).await {
            Ok(passages) if !passages.is_empty() => {
                let mut text = passages_text(&passages);
                if !notes.trim().is_empty() {
                    text = format!("{notes}\n\n{text}");
                }
                text
            }
            _ => notes.to_string(),
        }
    }

    /// The recursive breadth/depth mode: each level plans `breadth` queries from what was
    /// learned so far, researches them (`concurrency` at a time) and goes one level deeper
    /// with the follow-up questions, halving the breadth.
    async fn recursive(&self, brief: &str) -> Result<Vec<Findings>, RunFailure> {
        self.progress
            .stage("research_execution", "Recursive research (breadth × depth)")
            .await?;
        let mut found: Vec<Findings> = Vec::new();
        let mut frontier = vec![brief.to_string()];
        let mut breadth = self.config.breadth;
        for level in 1..=self.config.depth {
            let mut queries = Vec::new();
            for question in &frontier {
                let learned: Vec<String> = found.iter().map(|f| f.text.clone()).collect();
                queries.extend(self.plan_queries(question, breadth, &learned).await?);
            }
            queries.dedup();
            queries.truncate(self.config.breadth as usize * frontier.len().max(1));
            if level == 1 {
                queries = self.review(queries).await?;
            }
            self.progress
                .emit(
                    EventType::Thinking,
                    json!({ "stage": "research_execution", "content": format!("Level {level}: {} queries", queries.len()), "metadata": { "level": level, "queries": queries } }),
                )
                .await?;
            let cap = self.config.concurrency.max(1) as usize;
            let first = found.len();
            let results: Vec<(usize, (Findings, Vec<String>))> =
                futures::stream::iter(queries.into_iter().enumerate())
                    .map(|(index, query)| async move {
                        let number = first + index + 1;
                        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                        self.peak.fetch_max(now, Ordering::SeqCst);
                        let result = self.learn(number, &query).await;
                        self.running.fetch_sub(1, Ordering::SeqCst);
                        (index, result)
                    })
                    .buffer_unordered(cap)
                    .collect()
                    .await;
            let mut results = results;
            results.sort_by_key(|(index, _)| *index);
            frontier = Vec::new();
            for (_, (findings, follow_ups)) in results {
                if let Some(why) = &findings.failed {
                    let _ = self
                        .progress
                        .error(
                            RunErrorType::Tool,
                            &format!("could not research {:?}: {why}", findings.topic),
                            false,
                            json!({ "topic": findings.topic, "level": level }),
                        )
                        .await;
                }
                frontier.extend(follow_ups);
                found.push(findings);
            }
            breadth = breadth.div_ceil(2);
            if frontier.is_empty() {
                break;
            }
        }
        Ok(found)
    }

    async fn plan_queries(
        &self,
        question: &str,
        breadth: u32,
        learned: &[String],
    ) -> Result<Vec<String>, RunFailure> {
        let Some(role) = self.role("research") else {
            return Ok(vec![question.to_string()]);
        };
        let text = render(
            prompt("research_queries").unwrap_or_default(),
            &[
                ("breadth", &breadth.to_string()),
                ("query", &quote(question)),
                ("learnings", &quote(&learned.join("\n"))),
            ],
        );
        let queries = self
            .json("plan_queries", role, text, |value| {
                let queries: Vec<String> = value["queries"]
                    .as_array()
                    .ok_or("queries must be a list")?
                    .iter()
                    .filter_map(|q| q["query"].as_str().or_else(|| q.as_str()))
                    .map(str::trim)
                    .filter(|q| !q.is_empty())
                    .map(str::to_string)
                    .collect();
                if queries.is_empty() {
                    return Err("queries must not be empty".into());
                }
                Ok(queries)
            })
            .await
            .map_err(llm_failure)?;
        Ok(queries.into_iter().take(breadth as usize).collect())
    }

    /// One query of the recursive mode: search, read, extract learnings and follow-ups.
    async fn learn(&self, number: usize, query: &str) -> (Findings, Vec<String>) {
        let gathered = self.gather(number, query).await;
        let findings = match gathered {
            Ok(findings) => findings,
            Err(why) => {
                return (
                    Findings {
                        topic: query.to_string(),
                        text: String::new(),
                        passages: Vec::new(),
                        failed: Some(why),
                    },
                    Vec::new(),
                );
            }
        };
        let Some(role) = self.role("research") else {
            let text = passages_text(&findings.passages);
            return (Findings { text, ..findings }, Vec::new());
        };
        let urls: BTreeSet<String> = findings.passages.iter().map(|p| p.url.clone()).collect();
        let sources: Vec<String> = urls
            .iter()
            .filter_map(|url| {
                self.sources.text_of(url).map(|text| {
                    format!(
                        "Source {url}:\n{}",
                        quote(&truncate(&text, SOURCE_EXCERPT_CHARS))
                    )
                })
            })
            .collect();
        let text = render(
            prompt("research_learnings").unwrap_or_default(),
            &[
                ("query", &quote(query)),
                ("sources", &sources.join("\n\n")),
                ("follow_ups", "3"),
            ],
        );
        let parsed = self
            .json("learnings", role, text, |value| {
                let strings = |key: &str| -> Vec<String> {
                    value[key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                };
                Ok((strings("learnings"), strings("follow_up_questions")))
            })
            .await;
        match parsed {
            Ok((learnings, follow_ups)) if !learnings.is_empty() => (
                Findings {
                    text: learnings
                        .iter()
                        .map(|l| format!("- {l}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    ..findings
                },
                follow_ups,
            ),
            _ => {
                let text = passages_text(&findings.passages);
                (Findings { text, ..findings }, Vec::new())
            }
        }
    }

    /// Scores every read source for relevance (embedding similarity to the brief, and the
    /// model's judgement when one is configured) and credibility, drops the weakest, and
    /// numbers the rest for citation.
    async fn score_sources(&self, brief: &str) -> Result<Vec<(usize, Source)>, RunFailure> {
        let mut sources = self.sources.readable();
        if sources.is_empty() {
            return Ok(Vec::new());
        }
        let mut texts = vec![brief.to_string()];
        texts.extend(sources.iter().map(|source| {
            format!(
                "{}\n{}",
                source.title,
                truncate(source.text.as_deref().unwrap_or(""), SCORE_EXCERPT_CHARS)
            )
        }));
        // The similarity embedding runs while the model judges the sources.
        let embedder = self.deps.memory.embedder().clone();
        let similarity = async move { embedder.embed(&texts).await };
        let judgement = async {
            match self.role("research") {
                Some(role) => Some(self.curate(role, brief, &sources).await),
                None => None,
            }
        };
        let (similarity, judgement) = tokio::join!(similarity, judgement);
        match similarity {
            Ok(vectors) => {
                if let Some((query, rest)) = vectors.split_first() {
                    for (source, vector) in sources.iter_mut().zip(rest) {
                        source.relevance = f64::from(cosine(query, vector).max(0.0));
                    }
                }
            }
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Internal,
                        &format!("scoring sources by similarity failed: {error}"),
                        true,
                        json!({ "stage": "final_report_generation" }),
                    )
                    .await?;
            }
        }
        for source in &mut sources {
            source.credibility = credibility(&source.url, source.text.as_deref().unwrap_or(""));
        }
        match judgement {
            None => {}
            Some(Ok(items)) => {
                for (id, relevance, credibility) in items {
                    if let Some(source) = id.checked_sub(1).and_then(|i| sources.get_mut(i)) {
                        source.relevance = 0.5 * source.relevance + 0.5 * relevance;
                        source.credibility = 0.5 * source.credibility + 0.5 * credibility;
                    }
                }
            }
            Some(Err(error)) => {
                self.progress
                    .error(
                        RunErrorType::Llm,
                        &format!(
                            "curating sources failed: {}; using similarity scores",
                            error.message
                        ),
                        error.retryable(),
                        json!({ "stage": "final_report_generation" }),
                    )
                    .await?;
            }
        }
        for source in &mut sources {
            source.score = 0.7 * source.relevance + 0.3 * source.credibility;
        }
        sources.sort_by(|a, b| b.score.total_cmp(&a.score));
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for source in sources {
            let keep = kept.is_empty()
                || (source.score >= self.config.min_source_score
                    && kept.len() < self.config.max_sources);
            if keep {
                kept.push(source);
            } else {
                dropped.push(source);
            }
        }
        let numbered: Vec<(usize, Source)> = kept
            .into_iter()
            .enumerate()
            .map(|(index, source)| (index + 1, source))
            .collect();
        let listed: Vec<Value> = numbered
            .iter()
            .map(|(n, source)| {
                json!({
                    "n": n, "url": source.url, "title": source.title,
                    "relevance": round3(source.relevance), "credibility": round3(source.credibility),
                    "score": round3(source.score),
                })
            })
            .collect();
        let dropped: Vec<Value> = dropped
            .iter()
            .map(|source| json!({ "url": source.url, "score": round3(source.score) }))
            .collect();
        self.progress
            .emit(
                EventType::SourcesFound,
                json!({
                    "stage": "final_report_generation",
                    "content": format!("{} sources kept for the report, {} dropped", listed.len(), dropped.len()),
                    "sources": listed,
                    "metadata": { "curated": true, "dropped": dropped },
                }),
            )
            .await?;
        Ok(numbered)
    }

    /// The model's relevance and credibility judgement of each source (1-based ids).
    async fn curate(
        &self,
        role: &RoleModel,
        brief: &str,
        sources: &[Source],
    ) -> Result<Vec<(usize, f64, f64)>, LlmError> {
        let listed: Vec<String> = sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                format!(
                    "Source {} — {} ({})\n{}",
                    index + 1,
                    source.title,
                    source.url,
                    quote(&truncate(
                        source.text.as_deref().unwrap_or(""),
                        CURATE_EXCERPT_CHARS
                    ))
                )
            })
            .collect();
        let text = render(
            prompt("research_curate").unwrap_or_default(),
            &[("brief", brief), ("sources", &listed.join("\n\n"))],
        );
        self.json("curate_sources", role, text, |value| {
            let items = value["sources"]
                .as_array()
                .ok_or("sources must be a list")?;
            Ok(items
                .iter()
                .filter_map(|item| {
                    Some((
                        item["id"].as_u64()? as usize,
                        item["relevance"].as_f64()?.clamp(0.0, 1.0),
                        item["credibility"].as_f64()?.clamp(0.0, 1.0),
                    ))
                })
                .collect::<Vec<_>>())
        })
        .await
    }

    /// Streams the report (`report_delta`), then the list of sources and, when something
    /// could not be researched, a section saying so. Citations that do not name a listed
    /// source are removed from the stored report and reported.
    async fn report(
        &self,
        brief: &str,
        findings: &[Findings],
        cited: &[(usize, Source)],
        gaps: &[String],
    ) -> Result<String, RunFailure> {
        let number_of: HashMap<&str, usize> =
            cited.iter().map(|(n, s)| (s.url.as_str(), *n)).collect();
        let body = match self.role("final_report") {
            Some(role) => {
                let findings_text = findings
                    .iter()
                    .filter(|found| !found.text.trim().is_empty())
                    .map(|found| format!("## {}\n{}", found.topic, quote(&found.text)))
                    .collect::<Vec<_>>()
                    .join("\n\n");
                let sources_text = cited
                    .iter()
                    .map(|(n, source)| {
                        format!(
                            "[{n}] {} — {}\n{}",
                            source.title,
                            source.url,
                            quote(&truncate(source.text.as_deref().unwrap_or(""), 600))
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n\n");
                let text = render(
                    prompt("research_report").unwrap_or_default(),
                    &[
                        ("date", &today()),
                        ("brief", brief),
                        ("findings", &findings_text),
                        ("sources", &sources_text),
                        (
                            "gaps",
                            &if gaps.is_empty() {
                                "(nothing)".to_string()
                            } else {
                                gaps.join("\n")
                            },
                        ),
                    ],
                );
                let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
                request.max_tokens = Some(role.max_tokens);
                let started = Instant::now();
                let (result, flushed) = crate::agent::stream_to_events(
                    &self.progress.context,
                    role,
                    &request,
                    self.deps.delta_interval,
                    EventType::ReportDelta,
                )
                .await;
                Meter::add(&self.meter.model, started);
                flushed?;
                let response = result.map_err(llm_failure)?;
                self.account("final_report", role.model.model(), &response.usage)
                    .await?;
                response.content
            }
            None => {
                let digest = digest(&self.config.query, findings, &number_of);
                for chunk in chunks(&digest, 400) {
                    self.progress
                        .context
                        .emit(EventType::ReportDelta, json!({ "content": chunk }))
                        .await?;
                }
                digest
            }
        };
        let (mut report, invalid) = check_citations(&body, cited.len());
        if !invalid.is_empty() {
            self.progress
                .error(
                    RunErrorType::Validation,
                    &format!(
                        "the report cited sources that do not exist ({}); those citations were removed from the stored report",
                        invalid.iter().map(|n| format!("[{n}]")).collect::<Vec<_>>().join(", ")
                    ),
                    false,
                    json!({ "invalid_citations": invalid }),
                )
                .await?;
        }
        let mut tail = String::new();
        if !gaps.is_empty() {
            tail.push_str("\n\n## Not covered\n\n");
            for gap in gaps {
                tail.push_str(&format!("- {gap}\n"));
            }
        }
        if !cited.is_empty() {
            tail.push_str("\n\n## Sources\n\n");
            for (n, source) in cited {
                tail.push_str(&format!("[{n}] {} — {}\n", source.title, source.url));
            }
        }
        if !tail.is_empty() {
            self.progress
                .context
                .emit(EventType::ReportDelta, json!({ "content": tail }))
                .await?;
            report.push_str(&tail);
        }
        Ok(report)
    }

    /// Writes the report's conclusions to the user's memory (`source = research`, refs: the
    /// research and its sources). Failures are reported; the research still completes.
    async fn remember(&self, report: &str, cited: &[(usize, Source)]) -> Result<usize, RunFailure> {
        if !self.config.remember {
            return Ok(0);
        }
        let conclusions = match self.role("memory") {
            Some(role) => {
                let text = render(
                    prompt("research_conclusions").unwrap_or_default(),
                    &[
                        ("max", &MAX_CONCLUSIONS.to_string()),
                        ("query", &quote(&self.config.query)),
                        ("report", &quote(&truncate(report, 12_000))),
                    ],
                );
                match self
                    .json("conclusions", role, text, |value| {
                        Ok(value["conclusions"]
                            .as_array()
                            .ok_or("conclusions must be a list")?
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::trim)
                            .filter(|c| !c.is_empty())
                            .map(str::to_string)
                            .collect::<Vec<_>>())
                    })
                    .await
                {
                    Ok(conclusions) => conclusions,
                    Err(error) => {
                        self.progress
                            .error(
                                RunErrorType::Llm,
                                &format!(
                                    "picking conclusions to remember failed: {}",
                                    error.message
                                ),
                                error.retryable(),
                                json!({ "stage": "completed" }),
                            )
                            .await?;
                        Vec::new()
                    }
                }
            }
            None => extractive_conclusions(&self.config.query, report),
        };
        if conclusions.is_empty() {
            return Ok(0);
        }
        let mut refs = vec![format!("research:{}", self.progress.research_id)];
        refs.extend(cited.iter().take(10).map(|(_, source)| source.url.clone()));
        let memories: Vec<NewMemory> = conclusions
            .into_iter()
            .take(MAX_CONCLUSIONS)
            .map(|content| NewMemory {
                kind: MemoryKind::Conclusion,
                content: truncate(&content, 2_000),
                source: MemorySource::Research,
                trust: Trust::Web,
                importance: 3,
                thread_id: self.config.thread_id,
                source_refs: refs.clone(),
                created_at: None,
                supersedes: None,
            })
            .collect();
        match self.deps.memory.add(self.user, memories).await {
            Ok(written) => Ok(written.len()),
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Internal,
                        &format!("writing the conclusions to memory failed: {error}"),
                        true,
                        json!({ "stage": "completed" }),
                    )
                    .await?;
                Ok(0)
            }
        }
    }
}

// --- tools, parsing, text helpers -----------------------------------------------------------

fn supervisor_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "conduct_research".into(),
            description: "Hand one self-contained sub-topic to a researcher.".into(),
            parameters: json!({
                "type": "object",
                "properties": { "research_topic": { "type": "string", "description": "The sub-topic, described in full." } },
                "required": ["research_topic"],
            }),
        },
        ToolSpec {
            name: "research_complete".into(),
            description: "Say that the findings answer the brief.".into(),
            parameters: json!({ "type": "object", "properties": {} }),
        },
        think_tool(),
    ]
}

fn researcher_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "web_search".into(),
            description: "Search for sources; returns titles, URLs and snippets.".into(),
            parameters: json!({
                "type": "object",
                "properties": { "query": { "type": "string" } },
                "required": ["query"],
            }),
        },
        ToolSpec {
            name: "fetch_url".into(),
            description: "Read a page in full (http or https).".into(),
            parameters: json!({
                "type": "object",
                "properties": { "url": { "type": "string" } },
                "required": ["url"],
            }),
        },
        think_tool(),
    ]
}

fn think_tool() -> ToolSpec {
    ToolSpec {
        name: "think".into(),
        description: "Reflect on what you have found and what is missing.".into(),
        parameters: json!({
            "type": "object",
            "properties": { "reflection": { "type": "string" } },
            "required": ["reflection"],
        }),
    }
}

fn assistant_with_calls(response: &ChatResponse) -> ChatMessage {
    ChatMessage {
        role: ChatRole::Assistant,
        content: response.content.clone(),
        tool_calls: response.tool_calls.clone(),
        tool_call_id: None,
    }
}

fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({ "raw": call.arguments }))
}

fn llm_failure(error: LlmError) -> RunFailure {
    RunFailure::Failed {
        error_type: RunErrorType::Llm,
        retryable: error.retryable(),
        message: error.message,
    }
}

fn failure(error_type: RunErrorType, message: &str) -> RunFailure {
    RunFailure::Failed {
        error_type,
        message: message.to_string(),
        retryable: false,
    }
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Words of a report (CJK characters count as words).
fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .map(|word| {
            let cjk = word.chars().filter(|c| is_cjk(*c)).count();
            if cjk > 0 { cjk } else { 1 }
        })
        .sum()
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x3040..=0x30FF | 0xAC00..=0xD7AF)
}

/// At most `max` characters, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Pieces of at most `size` characters.
fn chunks(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|piece| piece.iter().collect())
        .collect()
}

fn format_hits(hits: &[SearchHit]) -> String {
    if hits.is_empty() {
        return "No results.".into();
    }
    hits.iter()
        .map(|hit| {
            let body = match &hit.content {
                Some(content) => truncate(content, 1_200),
                None => hit.snippet.clone(),
            };
            format!("- {} — {}\n{}", hit.title, hit.url, quote(&body))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paragraphs, long ones split at sentence ends (as document chunks are), of at most
/// `PASSAGE_CHARS`; paragraphs too short to say anything are skipped.
fn split_passages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for paragraph in text.split("\n\n") {
        let paragraph = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
        if paragraph.chars().count() < 40 {
            continue;
        }
        let mut pieces = Vec::new();
        super::documents::split_long(&paragraph, PASSAGE_CHARS, &mut pieces);
        out.extend(pieces.into_iter().map(str::to_string));
    }
    out
}

/// Sentences, ended by `.`, `!`, `?` or their CJK forms.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let end = matches!(c, '。' | '！' | '？')
            || (matches!(c, '.' | '!' | '?')
                && chars.peek().is_none_or(|(_, next)| next.is_whitespace()));
        if end {
            let stop = at + c.len_utf8();
            out.push(&text[start..stop]);
            start = stop;
        }
    }
    if start < text.len() && !text[start..].trim().is_empty() {
        out.push(&text[start..]);
    }
    out
}

fn passages_text(passages: &[Passage]) -> String {
    passages
        .iter()
        .map(|passage| format!("- {} [{}]", passage.text, passage.url))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Maximal marginal relevance: `k` items similar to `query` and unlike each other.
/// Returns (index, similarity to the query).
fn mmr(query: &[f32], items: &[Vec<f32>], k: usize, lambda: f32) -> Vec<(usize, f32)> {
    let similarity: Vec<f32> = items.iter().map(|item| cosine(query, item)).collect();
    let mut chosen: Vec<usize> = Vec::new();
    while chosen.len() < k.min(items.len()) {
        let best = (0..items.len())
            .filter(|index| !chosen.contains(index))
            .map(|index| {
                let redundancy = chosen
                    .iter()
                    .map(|&other| cosine(&items[index], &items[other]))
                    .fold(0.0f32, f32::max);
                (
                    index,
                    lambda * similarity[index] - (1.0 - lambda) * redundancy,
                )
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((index, _)) => chosen.push(index),
            None => break,
        }
    }
    chosen
        .into_iter()
        .map(|index| (index, similarity[index]))
        .collect()
}

/// A source's credibility from what can be seen without a model: the user's own documents
/// rank highest, then institutional domains, https, and pages with substance.
fn credibility(url: &str, text: &str) -> f64 {
    if url.starts_with("doc:") {
        return 0.9;
    }
    let mut score: f64 = 0.4;
    let host = url::Url::parse(url)
        .ok()
        .and_then(|parsed| parsed.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    if url.starts_with("https://") {
        score += 0.1;
    }
    if [".gov", ".edu", ".int", ".mil"]
        .iter()
        .any(|suffix| host.ends_with(suffix) || host.contains(&format!("{suffix}.")))
    {
        score += 0.3;
    } else if host.ends_with(".org") || host.contains("wikipedia") {
        score += 0.15;
    }
    let length = text.chars().count();
    if length >= 2_000 {
        score += 0.15;
    } else if length < 200 {
        score -= 0.2;
    }
    score.clamp(0.0, 1.0)
}

/// The extractive report written without a model: per topic, the selected passages with
/// their citation numbers.
fn digest(query: &str, findings: &[Findings], number_of: &HashMap<&str, usize>) -> String {
    let mut out = format!(
        "# {query}\n\nAn extractive digest: the passages of the sources read that are most similar to each question, quoted as found (no language model is configured).\n"
    );
    for found in findings {
        let passages: Vec<&Passage> = found
            .passages
            .iter()
            .filter(|passage| number_of.contains_key(passage.url.as_str()))
            .collect();
        if passages.is_empty() {
            continue;
        }
        if findings.len() > 1 {
            out.push_str(&format!("\n## {}\n", found.topic));
        }
        out.push('\n');
        for passage in passages {
            let n = number_of[passage.url.as_str()];
            out.push_str(&format!("- {} [{n}]\n", passage.text));
        }
    }
    out
}

/// Without a model: the first sentence of each of the digest's first passages.
fn extractive_conclusions(query: &str, report: &str) -> Vec<String> {
    report
        .lines()
        .filter_map(|line| line.strip_prefix("- "))
        .filter_map(|passage| sentences(passage).first().map(|s| s.trim().to_string()))
        .map(|sentence| strip_citations(&sentence))
        .filter(|sentence| sentence.chars().count() >= 20)
        .take(3)
        .map(|sentence| format!("Research on \"{query}\": {sentence}"))
        .collect()
}

fn strip_citations(text: &str) -> String {
    let (cleaned, _) = rewrite_citations(text, |_| false);
    cleaned.trim().to_string()
}

/// Checks `[n]` / `[n, m]` citations against `count` sources: returns the report with
/// citations of unknown sources removed, and the unknown numbers.
pub fn check_citations(report: &str, count: usize) -> (String, Vec<usize>) {
    let mut invalid = BTreeSet::new();
    let (cleaned, _) = rewrite_citations(report, |n| {
        let ok = (1..=count).contains(&n);
        if !ok {
            invalid.insert(n);
        }
        ok
    });
    (cleaned, invalid.into_iter().collect())
}

/// Rewrites every citation bracket keeping the numbers `keep` accepts; a bracket left empty
/// disappears. Returns the text and the numbers kept.
fn rewrite_citations(text: &str, mut keep: impl FnMut(usize) -> bool) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut kept = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let inside = &after[..close];
        let numbers: Option<Vec<usize>> = if inside.trim().is_empty() {
            None
        } else {
            inside
                .split(',')
                .map(|part| part.trim().parse::<usize>().ok())
                .collect()
        };
        // `[text](link)` and other brackets are not citations.
        let is_link = after[close + 1..].starts_with('(');
        match numbers {
            Some(numbers) if !is_link => {
                let good: Vec<usize> = numbers.into_iter().filter(|&n| keep(n)).collect();
                if !good.is_empty() {
                    let joined = good
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    out.push_str(&format!("[{joined}]"));
                    kept.extend(good);
                } else if out.ends_with(' ') {
                    out.pop();
                }
            }
            _ => {
                out.push('[');
                out.push_str(inside);
                out.push(']');
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    (out, kept)
}

/// The citation numbers used in a report.
pub fn citations(report: &str) -> BTreeSet<usize> {
    let (_, kept) = rewrite_citations(report, |_| true);
    kept.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citations_are_checked_and_unknown_ones_removed() {
        let report = "Tides follow the moon [1]. Springs are higher [2, 5]. See [docs](http://x) and [note]. Bad [9].";
        let (cleaned, invalid) = check_citations(report, 3);
        assert_eq!(invalid, vec![5, 9]);
        assert_eq!(
            cleaned,
            "Tides follow the moon [1]. Springs are higher [2]. See [docs](http://x) and [note]. Bad."
        );
        assert_eq!(citations(&cleaned), BTreeSet::from([1, 2]));
        assert_eq!(citations("none here [a] [ ]"), BTreeSet::new());
    }

    #[test]
    fn passages_split_at_sentences_and_mmr_prefers_diverse_relevant_ones() {
        let long = "First sentence about tides and the moon. ".repeat(30);
        let passages = split_passages(&format!("short\n\n{long}"));
        assert!(passages.len() >= 2);
        assert!(
            passages
                .iter()
                .all(|p| p.chars().count() <= PASSAGE_CHARS + 50)
        );
        assert_eq!(
            sentences("一句。两句！ok. end"),
            vec!["一句。", "两句！", "ok.", " end"]
        );

        let query = [1.0, 0.0];
        let items = vec![vec![1.0, 0.0], vec![0.99, 0.01], vec![0.7, 0.7]];
        let chosen: Vec<usize> = mmr(&query, &items, 2, 0.5)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            chosen,
            vec![0, 2],
            "the near-duplicate of the first is passed over"
        );
    }

    #[test]
    fn credibility_prefers_own_documents_and_institutions() {
        let long = "x".repeat(3_000);
        assert!(credibility("doc:1#2", "") > credibility("https://example.com/a", &long));
        assert!(
            credibility("https://nasa.gov/a", &long)
                > credibility("http://blog.example.com/a", &long)
        );
        assert!(
            credibility("http://blog.example.com/a", &long)
                > credibility("http://blog.example.com/a", "tiny")
        );
    }

    #[test]
    fn the_digest_cites_only_kept_sources() {
        let findings = vec![Findings {
            topic: "tides".into(),
            text: String::new(),
            passages: vec![
                Passage {
                    url: "http://a".into(),
                    text: "The moon pulls the sea toward it.".into(),
                },
                Passage {
                    url: "http://dropped".into(),
                    text: "Unrelated text.".into(),
                },
            ],
            failed: None,
        }];
        let numbers = HashMap::from([("http://a", 1)]);
        let report = digest("why tides", &findings, &numbers);
        assert!(report.contains("- The moon pulls the sea toward it. [1]"));
        assert!(!report.contains("Unrelated"));
        assert_eq!(citations(&report), BTreeSet::from([1]));
        let conclusions = extractive_conclusions("why tides", &report);
        assert_eq!(
            conclusions,
            vec!["Research on \"why tides\": The moon pulls the sea toward it."]
        );
        assert_eq!(word_count("三个字 and two"), 5);
    }
}
