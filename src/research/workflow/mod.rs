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

mod citations;
mod follow;
mod plan;
mod progress;
mod recursive;
mod report;
mod sources;
mod supervisor;
mod text;
mod verify;

pub(crate) use crate::runs::events::{CitationCheck, CitedSource, UnsupportedCitation};
use citations::*;
pub(crate) use citations::{check_citations, citations};
use follow::Earlier;
use progress::*;
use sources::*;
use text::*;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::request::{Mode, ResolvedConfig};
use crate::config::ModelRole;
use crate::llm::chat::{
    ChatMessage, ChatRequest, ChatResponse, LlmError, LlmErrorKind, RoleModel, Usage, complete_json,
};
use crate::llm::prompts::quote;
use crate::llm::roles::Models;
use crate::memory::{MemoryEngine, RecallRequest};
use crate::runs::events::{
    DroppedSource, FoundSource, MemoryRecalled, RecalledMemory, ResearchComplete, ResearchStats,
    ResearchUsage, SessionMeta, SessionStart, SpendCap, StepMeta, UsageStep, Waiting,
};
use crate::runs::{ResearchEnvelope, RunContext, RunErrorType, RunEvent, RunFailure};
use crate::search::SearchProvider;
use crate::search::fetch::Fetcher;
use crate::store::RunKind;
use crate::store::{NewResearch, ResearchOutcome, RunId, RunStatus, Store, StoreError, UserId};

/// What a research needs besides its configuration.
#[derive(Clone)]
pub(crate) struct ResearchDeps {
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
pub(crate) struct ResearchSummary {
    pub research_id: RunId,
    /// `completed`, or `partial` when some topics could not be researched (`gaps`).
    pub status: RunStatus,
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

impl ResearchSummary {
    /// The sources without their excerpts (those stay in the stored record,
    /// `GET /research/{id}`): what events and tool results list.
    pub(crate) fn listed_sources(&self) -> Vec<CitedSource> {
        self.sources
            .iter()
            .map(|source| CitedSource {
                excerpt: None,
                ..source.clone()
            })
            .collect()
    }
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
/// A `stage_fallback` reason is cut to this size.
const FALLBACK_REASON_CHARS: usize = 300;

/// A research that checkpoints its finished steps with its run (a research in a run of its
/// own; one inside a chat turn is done again with the turn).
pub(crate) struct Durable {
    /// The request, without secrets, that the research is rebuilt from.
    pub request: Value,
    /// What the finished steps produced, when a new attempt continues the research.
    pub journal: Option<Journal>,
}

/// The finished steps of a research and what it had gathered when they finished: the body of
/// its run's checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Journal {
    /// Each finished step's result, by step (`brief`, `researcher.3`, `report`, …).
    steps: BTreeMap<String, Value>,
    sources: Vec<Source>,
    usage: Usage,
    usage_steps: Vec<UsageStep>,
    /// The stages announced (`stage_update`), not announced again.
    stages: Vec<String>,
    /// Seconds spent in each stage by earlier attempts.
    timings: BTreeMap<String, f64>,
    /// Time the earlier attempts took.
    elapsed_ms: u64,
}

/// A research run's checkpoint body.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SavedResearch {
    pub research: SavedState,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SavedState {
    pub request: Value,
    pub journal: Journal,
}

/// Runs one research in `context`'s run and records it under `research_id`. With `durable`,
/// it checkpoints every finished step, and continues from `durable.journal` when given one.
pub(crate) async fn run_research(
    context: Arc<RunContext>,
    deps: ResearchDeps,
    config: ResolvedConfig,
    research_id: RunId,
    durable: Option<Durable>,
) -> Result<ResearchSummary, RunFailure> {
    let user = context.user;
    let resuming = durable.as_ref().is_some_and(|d| d.journal.is_some());
    if !resuming {
        deps.store
            .user(user)
            .create_research(&NewResearch {
                id: research_id,
                run_id: context.run.id,
                thread_id: config.thread_id,
                query: config.query.clone(),
                model: config.headline_model(),
                config: serde_json::to_value(&config).unwrap_or(Value::Null),
            })
            .await?;
    }
    let mut guard = RecordGuard {
        store: deps.store.clone(),
        user,
        id: research_id,
        armed: true,
        context: context.clone(),
    };
    let research = Research::new(context.clone(), deps, config, research_id, durable);
    let result = research.execute().await;
    if context.lost() {
        // Another replica continues the research and records its end.
        guard.armed = false;
        return result;
    }
    let outcome = match &result {
        Ok(summary) => ResearchOutcome {
            status: summary.status,
            report: Some(summary.report.clone()),
            sources: serde_json::to_value(&summary.sources).unwrap_or(Value::Null),
            usage: json!(research.usage_record()),
            stage_timings: json!(research.progress.timings()),
            word_count: summary.word_count as i64,
            source_count: summary.sources.len() as i64,
            duration_ms: Some(summary.duration_ms as i64),
            error: None,
        },
        Err(RunFailure::Failed { message, .. }) => ResearchOutcome {
            usage: json!(research.usage_record()),
            stage_timings: json!(research.progress.timings()),
            duration_ms: Some(research.started.elapsed().as_millis() as i64),
            error: Some(message.clone()),
            sources: json!([]),
            ..ResearchOutcome::ended(RunStatus::Failed)
        },
    };
    guard.armed = false;
    research
        .deps
        .store
        .user(user)
        .finish_research(research_id, &outcome)
        .await?;
    result
}

/// Marks the research `cancelled` when its run is dropped before it recorded an end (unless
/// a shutdown left the run for another replica to continue).
struct RecordGuard {
    store: Arc<dyn Store>,
    user: UserId,
    id: RunId,
    armed: bool,
    context: Arc<RunContext>,
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if !self.armed || self.context.handed_over() {
            return;
        }
        let (store, user, id) = (self.store.clone(), self.user, self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let outcome = ResearchOutcome {
                    sources: json!([]),
                    usage: json!({}),
                    stage_timings: json!({}),
                    ..ResearchOutcome::ended(RunStatus::Cancelled)
                };
                if let Err(error) = store.user(user).finish_research(id, &outcome).await {
                    tracing::warn!(%id, %error, "could not record a cancelled research");
                }
            });
        }
    }
}

// --- the research -------------------------------------------------------------------------

struct Research {
    /// Set when the research checkpoints its steps.
    durable: Option<Checkpoints>,
    deps: ResearchDeps,
    config: ResolvedConfig,
    progress: Progress,
    meter: Meter,
    usage: Mutex<Usage>,
    steps: Mutex<Vec<UsageStep>>,
    sources: Sources,
    started: Instant,
    user: UserId,
    running: AtomicUsize,
    peak: AtomicUsize,
    /// Set once researching has used its share of the budget.
    over_budget: std::sync::atomic::AtomicBool,
}

/// The journal of a research that checkpoints, and whether it continues an earlier attempt.
struct Checkpoints {
    request: Value,
    journal: Mutex<Journal>,
    resumed: bool,
    /// One checkpoint is written at a time, each with everything finished before it.
    saving: tokio::sync::Mutex<()>,
}

impl Research {
    fn new(
        context: Arc<RunContext>,
        deps: ResearchDeps,
        config: ResolvedConfig,
        research_id: RunId,
        durable: Option<Durable>,
    ) -> Self {
        let user = context.user;
        let journal = durable
            .as_ref()
            .and_then(|durable| durable.journal.clone())
            .unwrap_or_default();
        let sources = Sources::default();
        sources.restore(journal.sources.clone());
        Self {
            progress: Progress {
                context,
                research_id,
                envelope: ResearchEnvelope {
                    research_id,
                    model: config.headline_model(),
                },
                stages: Mutex::new(Vec::new()),
                announced: journal.stages.clone(),
                earlier: journal.timings.clone(),
            },
            durable: durable.map(|durable| Checkpoints {
                resumed: durable.journal.is_some(),
                request: durable.request,
                journal: Mutex::new(journal.clone()),
                saving: tokio::sync::Mutex::new(()),
            }),
            deps,
            config,
            meter: Meter::default(),
            usage: Mutex::new(journal.usage),
            steps: Mutex::new(journal.usage_steps.clone()),
            sources,
            started: Instant::now()
                .checked_sub(Duration::from_millis(journal.elapsed_ms))
                .unwrap_or_else(Instant::now),
            user,
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            over_budget: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this attempt continues an earlier one's checkpoint.
    fn resumed(&self) -> bool {
        self.durable.as_ref().is_some_and(|durable| durable.resumed)
    }

    /// Runs one step of the research. When the research checkpoints, a step an earlier attempt
    /// finished is not done again (its result comes from the journal and it emits nothing),
    /// and a step finished now is saved with the run's checkpoint before the research goes on.
    async fn step<T, F, Fut>(&self, key: &str, work: F) -> Result<T, RunFailure>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, RunFailure>>,
    {
        let Some(durable) = &self.durable else {
            return work().await;
        };
        let saved = durable.journal.lock().steps.get(key).cloned();
        if let Some(saved) = saved {
            match serde_json::from_value(saved) {
                Ok(result) => return Ok(result),
                Err(error) => {
                    tracing::warn!(key, %error, "a checkpointed step is unreadable; doing it again");
                }
            }
        }
        let result = work().await?;
        match serde_json::to_value(&result) {
            Ok(value) => self.save(durable, key, value).await?,
            Err(error) => tracing::warn!(key, %error, "a research step could not be checkpointed"),
        }
        Ok(result)
    }

    /// Records a finished step in the journal and saves it as the run's checkpoint. A failed
    /// save only costs work after a takeover; losing the run to another replica ends this one.
    async fn save(&self, durable: &Checkpoints, key: &str, value: Value) -> Result<(), RunFailure> {
        let _one_at_a_time = durable.saving.lock().await;
        let body = {
            let mut journal = durable.journal.lock();
            journal.steps.insert(key.to_string(), value);
            journal.sources = self.sources.snapshot();
            journal.usage = *self.usage.lock();
            journal.usage_steps = self.steps.lock().clone();
            journal.stages = self.progress.announced();
            journal.timings = self.progress.timings();
            journal.elapsed_ms = self.started.elapsed().as_millis() as u64;
            serde_json::to_value(SavedResearch {
                research: SavedState {
                    request: durable.request.clone(),
                    journal: journal.clone(),
                },
            })
        };
        let body = match body {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(key, %error, "a research checkpoint could not be written");
                return Ok(());
            }
        };
        match self.progress.context.checkpoint(Some(key), body).await {
            Ok(()) => Ok(()),
            Err(error @ StoreError::Conflict(_)) => Err(error.into()),
            Err(error) => {
                tracing::warn!(key, %error, "saving a research checkpoint failed");
                Ok(())
            }
        }
    }

    fn usage_record(&self) -> ResearchUsage {
        ResearchUsage {
            total: *self.usage.lock(),
            steps: self.steps.lock().clone(),
        }
    }

    fn role(&self, role: ModelRole) -> Option<&RoleModel> {
        self.deps.models.role(role)
    }

    async fn execute(&self) -> Result<ResearchSummary, RunFailure> {
        let config = &self.config;
        if !self.resumed() {
            self.begin().await?;
        }
        let memories = self.step("recall", || self.recall_context()).await?;
        let clarification = self
            .step("clarification", || self.clarify(&memories))
            .await?;
        let earlier: Option<Earlier> = self.step("earlier", || self.earlier()).await?;
        let earlier_text = Self::earlier_text(earlier.as_ref());
        let brief = self
            .step("brief", || {
                self.brief(&memories, clarification.as_deref(), &earlier_text)
            })
            .await?;
        let findings: Vec<Findings> = self
            .step("research", || async {
                let mut findings = match config.mode {
                    Mode::Supervisor => self.supervise(&brief).await?,
                    Mode::Recursive => self.recursive(&brief).await?,
                };
                if let Some(earlier) = &earlier
                    && let Some(found) = self.earlier_findings(earlier).await
                {
                    findings.insert(0, found);
                }
                Ok(findings)
            })
            .await?;
        let gaps = self.gaps(&findings);
        self.progress
            .stage(
                "final_report_generation",
                "Scoring sources and writing the report",
            )
            .await?;
        let cited = self.cite(&brief, &findings).await?;
        if cited.is_empty() {
            // Nothing to cite: a report would be empty words (or citations of nothing). The
            // research fails, saying why — what failed, where — and writes no conclusion.
            return Err(nothing_found(&findings, self.sources.readable().len()));
        }
        let (report, checked): (String, CitationCheck) = self
            .step("report", || {
                self.report(&brief, &findings, &cited, &gaps, &earlier_text)
            })
            .await?;
        // Claims whose citations were not found in their sources are never conclusions.
        let supported = verify::supported_only(&report);
        let memories_written: usize = self
            .step("remember", || self.remember(&supported, &cited))
            .await?;
        let written = Written {
            report,
            cited,
            checked,
            gaps,
            topics: findings.len(),
            memories_written,
        };
        self.finish(written).await
    }

    /// The research's first events: `session_start` with its configuration, then (when it is
    /// durable) the checkpoint from which another replica can continue it.
    async fn begin(&self) -> Result<(), RunFailure> {
        let config = &self.config;
        self.progress
            .emit(RunEvent::SessionStart(SessionStart {
                kind: RunKind::Research,
                model: None,
                thread_id: None,
                user_message_id: None,
                query: Some(config.query.clone()),
                content: Some(config.query.clone()),
                metadata: Some(SessionMeta {
                    config: serde_json::to_value(config).unwrap_or(Value::Null),
                }),
            }))
            .await?;
        if let Some(durable) = &self.durable {
            self.save(durable, "start", Value::Null).await?;
        }
        Ok(())
    }

    /// What the report cannot cover: each topic that could not be researched, and the budget
    /// when it stopped the research.
    fn gaps(&self, findings: &[Findings]) -> Vec<String> {
        let mut gaps: Vec<String> = findings
            .iter()
            .filter_map(|found| {
                found
                    .failed
                    .as_ref()
                    .map(|why| format!("{}: {why}", found.topic))
            })
            .collect();
        if self.over_budget.load(Ordering::SeqCst) {
            gaps.push(
                "Budget: the research reached its budget and stopped researching; the report rests on what was found until then".into(),
            );
        }
        gaps
    }

    /// The sources worth citing, numbered, each cut to the excerpt later steps quote (the
    /// checkpoint keeps no more).
    async fn cite(
        &self,
        brief: &str,
        findings: &[Findings],
    ) -> Result<Vec<(usize, Source)>, RunFailure> {
        self.step("sources", || async {
            let topics: Vec<&str> = findings.iter().map(|f| f.topic.as_str()).collect();
            let mut cited = self.score_sources(brief, &topics).await?;
            for (_, source) in &mut cited {
                source.text = source
                    .text
                    .as_deref()
                    .map(|text| truncate(text, SOURCE_EXCERPT_CHARS));
            }
            Ok(cited)
        })
        .await
    }

    /// The research's end: the `completed` stage, the summary, and `research_complete` with
    /// its statistics.
    async fn finish(&self, written: Written) -> Result<ResearchSummary, RunFailure> {
        let Written {
            report,
            cited,
            checked,
            gaps,
            topics,
            memories_written,
        } = written;
        let outcome = if gaps.is_empty() {
            RunStatus::Completed
        } else {
            RunStatus::Partial
        };
        let done = if outcome == RunStatus::Partial {
            format!(
                "Research complete, with gaps: {} of {topics} topics could not be researched",
                gaps.len(),
            )
        } else {
            "Research complete".to_string()
        };
        self.progress.stage("completed", &done).await?;
        let total = *self.usage.lock();
        let summary = ResearchSummary {
            research_id: self.progress.research_id,
            status: outcome,
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
                    provider: source.provider.clone(),
                    excerpt: source.text.clone(),
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
            .emit(RunEvent::ResearchComplete(ResearchComplete {
                content: summary.report.clone(),
                metadata: ResearchStats {
                    outcome: summary.status,
                    duration_seconds: summary.duration_ms as f64 / 1000.0,
                    sources: summary.listed_sources(),
                    word_count: summary.word_count,
                    usage: self.usage_record(),
                    stage_timings: self.progress.timings(),
                    waiting_ms: Waiting {
                        model: summary.model_ms,
                        search: summary.search_ms,
                        fetch: summary.fetch_ms,
                    },
                    peak_concurrent_researchers: self.peak.load(Ordering::Relaxed),
                    memories_written: summary.memories_written,
                    citations: checked,
                    gaps: summary.gaps.clone(),
                },
            }))
            .await?;
        Ok(summary)
    }

    // --- model calls, metered and accounted ------------------------------------------------

    async fn account(&self, step: &str, model: &str, usage: &Usage) -> Result<(), RunFailure> {
        let total = {
            let mut total = self.usage.lock();
            total.add(usage);
            *total
        };
        let entry = UsageStep {
            model: model.to_string(),
            step: step.to_string(),
            usage: *usage,
            total: Some(total),
            budget: self.config.budget.map(|budget| SpendCap {
                tokens: budget.tokens,
                cost_usd: budget.cost_usd,
            }),
        };
        self.steps.lock().push(entry.clone());
        self.progress.emit(RunEvent::Usage(entry)).await
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
        if let Some(schema) = crate::llm::schemas::research_step(step) {
            request = request.with_schema(schema);
        }
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

    /// Whether researching has used its share of the research's budget (tokens or dollars);
    /// the first time, an `error` of type `budget` says so. From then on no researcher starts,
    /// none is offered another tool, and the report is written from what was found.
    pub(super) async fn budget_spent(&self) -> bool {
        let Some(budget) = self.config.budget else {
            return false;
        };
        if self.over_budget.load(Ordering::SeqCst) {
            return true;
        }
        let total = *self.usage.lock();
        let share = budget.research_share;
        let tokens = budget
            .tokens
            .filter(|cap| total.total_tokens as f64 >= *cap as f64 * share);
        let cost = budget
            .cost_usd
            .filter(|cap| total.cost_usd.unwrap_or(0.0) >= cap * share);
        if tokens.is_none() && cost.is_none() {
            return false;
        }
        if !self.over_budget.swap(true, Ordering::SeqCst) {
            let spent = match (tokens, cost) {
                (Some(cap), _) => format!("{} of its {cap} tokens", total.total_tokens),
                (None, Some(cap)) => {
                    format!("${:.4} of its ${cap:.4}", total.cost_usd.unwrap_or(0.0))
                }
                (None, None) => String::new(),
            };
            let _ = self
                .progress
                .error(
                    RunErrorType::Budget,
                    &format!(
                        "the research used {spent} ({:.0} % may go to researching): it stops researching and writes its report from what it found",
                        share * 100.0
                    ),
                    false,
                    StepMeta { spent: Some(total), budget: Some(SpendCap { tokens: budget.tokens, cost_usd: budget.cost_usd }), ..Default::default() },
                )
                .await;
        }
        true
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
                        &format!(
                            "recalling memories failed: {}",
                            crate::error::public_message(&error)
                        ),
                        true,
                        StepMeta::stage("research_brief"),
                    )
                    .await?;
                Vec::new()
            }
        };
        let memories: Vec<RecalledMemory> = recalled
            .iter()
            .map(|found| RecalledMemory::new(&found.memory, found.score, &found.signals))
            .collect();
        self.progress
            .emit(RunEvent::MemoryRecalled(MemoryRecalled {
                query: self.config.query.clone(),
                memories,
            }))
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
}

/// Why a research with no source to cite failed: every topic's failure (each reason once:
/// researchers asking one provider that is down fail alike), or that nothing read was about
/// the question.
/// What the research wrote, handed to [`Research::finish`].
struct Written {
    report: String,
    cited: Vec<(usize, Source)>,
    checked: CitationCheck,
    gaps: Vec<String>,
    /// Topics researched (those that failed included).
    topics: usize,
    memories_written: usize,
}

fn nothing_found(findings: &[Findings], read: usize) -> RunFailure {
    let mut reasons: Vec<&str> = Vec::new();
    for why in findings.iter().filter_map(|found| found.failed.as_deref()) {
        if !reasons.contains(&why) {
            reasons.push(why);
        }
    }
    let message = if reasons.is_empty() {
        format!(
            "the research found no source to cite: none of the {read} sources read was about the question"
        )
    } else {
        let failed = findings
            .iter()
            .filter(|found| found.failed.is_some())
            .count();
        let whom = if failed == findings.len() {
            "every researcher failed".to_string()
        } else {
            format!("{failed} of {} researchers failed", findings.len())
        };
        format!(
            "the research found no source to cite: {whom}: {}",
            truncate(&reasons.join("; "), 1_500)
        )
    };
    RunFailure::Failed {
        error_type: RunErrorType::Search,
        retryable: !reasons.is_empty(),
        message,
    }
}

fn llm_failure(error: LlmError) -> RunFailure {
    RunFailure::Failed {
        error_type: RunErrorType::Llm,
        retryable: error.retryable(),
        message: error.message,
    }
}

/// Whether a failed model call is a reply that could not be used (no valid JSON after the
/// retries, an unreadable response), so the step is done the extractive way instead. A model
/// that could not be reached, refused the key or the request is not: that still fails.
fn unusable(error: &LlmError) -> bool {
    error.kind == LlmErrorKind::BadResponse
}

fn failure(error_type: RunErrorType, message: &str) -> RunFailure {
    RunFailure::Failed {
        error_type,
        message: message.to_string(),
        retryable: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::report::{digest, extractive_conclusions};
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
        // A short Chinese note is a passage (it had no spaces to count words by).
        assert_eq!(
            split_passages("# 潮汐笔记\n\n大潮发生在新月和满月的时候，因为引力叠加。"),
            vec!["大潮发生在新月和满月的时候，因为引力叠加。"]
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
        let report = digest(
            "why tides",
            &findings,
            &numbers,
            "no language model is configured",
            &Default::default(),
        );
        assert!(report.contains("- The moon pulls the sea toward it. [1]"));
        assert!(!report.contains("Unrelated"));
        assert_eq!(citations(&report), BTreeSet::from([1]));
        let conclusions = extractive_conclusions("why tides", &report);
        assert_eq!(
            conclusions,
            vec!["Research on \"why tides\": The moon pulls the sea toward it."]
        );
        // What was not covered, and the list of sources, are never conclusions.
        let with_tail = "# q\n\n- Short.\n\n## Not covered\n\n- broken mirror: fetching http://x failed (500)\n\n## Sources\n\n- [1] A long enough title of a source — http://a\n";
        assert!(extractive_conclusions("q", with_tail).is_empty());
        assert_eq!(word_count("三个字 and two"), 5);
    }
}
