//! Memory-quality evaluation (`mnemo eval locomo --data PATH`): evidence recall of the memory
//! engine on conversational benchmarks, without any LLM.
//!
//! Each conversation of a dataset is ingested as one fresh user's history through the paths a
//! real conversation takes: one thread per session (`Store::create_thread`), every turn
//! appended as a message (`Store::append_message`), and turn memories written with
//! `MemoryEngine::add` (kind `turn`, `created_at` = the session date, `source_refs` = the
//! dataset's turn ids, `thread_id` = the session's thread). Every question is then asked as the
//! agent would ask it — `recall` with the question text — and the returned memories are mapped
//! back to turn ids through their `source_refs` and scored ([`metrics`]).
//!
//! One run crosses *memory units* (what one memory holds: [`MemoryUnit`]) with *retrieval
//! variants* (BM25 only, vector only, hybrid RRF, hybrid + decay: [`Retrieval`]), and sweeps
//! the RRF constant for every unit. Each (unit, conversation) gets a fresh scratch store
//! (SQLite + Qdrant Edge + tantivy) under `settings.data_dir`, whatever the settings say about
//! PostgreSQL or a Qdrant server: the evaluation never writes into a real database.
//!
//! Repeatability: after ingestion the indexes are rebuilt from SQL (`Indexer::rebuild`, the
//! `mnemo reindex` path), so each user's keyword index is one tantivy segment in insertion
//! order; BM25 ties are then broken the same way on every run (with several segments their
//! order depends on tantivy's segment bookkeeping). Recall goes through
//! `MemoryEngine::recall_at`, which is `recall` at a fixed clock (the day after the
//! conversation's last session, so decay follows the dataset's timeline) and without access
//! recording (the evaluation's own reads must not refresh what decay sees).
//!
//! Datasets plug in through [`Dataset`]: [`locomo`], [`longmemeval`] and [`beam`] are the
//! adapters.
//! [`zh`] (`mnemo eval zh`) is separate: standalone memories rather than conversations, asked
//! on the product's path only, with BM25-only and vector-only rows beside it.
//! Output ([`report`]): `results.json` (everything), `results.md` (tables beside the
//! dataset's reference points), `recall.svg` (recall@k against k) and `per_question.jsonl`.

mod accumulate;
pub mod answer;
pub mod beam;
pub mod locomo;
pub mod longmemeval;
pub mod metrics;
pub mod relevance;
pub mod report;
mod scratch;
pub mod zh;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sha2::Digest;

use mnemo::config::ModelRole;
use mnemo::config::{FusionMethod, MemorySettings, RelevanceSettings, Settings};
use mnemo::llm::embed::Embedder;
use mnemo::memory::RecallRequest;
use mnemo::memory::rank::RecallMode;
use mnemo::store::Role;

use accumulate::*;
pub use report::{Foreign, NewestFirst, Report, RunResult};
use scratch::*;

// --- the dataset model ----------------------------------------------------------------------

/// One user's history: dated sessions of turns, and the questions asked about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conversation {
    pub id: String,
    pub sessions: Vec<Session>,
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Session {
    pub id: String,
    pub date: DateTime<Utc>,
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turn {
    /// The dataset's id for the turn (LoCoMo `D3:7`); memories carry it in `source_refs`.
    pub id: String,
    /// The speaker's name as it should appear in a memory ("Caroline", "User").
    pub speaker: String,
    /// Which seat the speaker takes in mnemo: `User` for the user whose history this is,
    /// `Assistant` for the other party.
    pub role: Role,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Question {
    pub id: String,
    pub text: String,
    pub category: String,
    /// Turn ids holding the answer, normalised and deduplicated; empty scores 1.
    pub evidence: Vec<String>,
    pub answer: String,
    /// Nothing in the history answers it (BEAM's abstention): it is not scored for recall;
    /// the right answer is that recall returns nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abstain: bool,
    /// A statement and the later one that updates or contradicts it (BEAM's knowledge update
    /// and contradiction resolution): recall should rank the later first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
}

/// The turns of an earlier statement and of the later one that changes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Order {
    pub older: Vec<String>,
    pub newer: Vec<String>,
}

impl Order {
    /// Where the first result holding a turn of each side stands in `refs` (one list of turn
    /// ids per result): `(older, newer)`. `None` when the two sides share a turn (nothing to
    /// order).
    pub fn ranks(&self, refs: &[Vec<String>]) -> Option<(Option<usize>, Option<usize>)> {
        if self.older.iter().any(|id| self.newer.contains(id)) {
            return None;
        }
        let first = |side: &[String]| {
            refs.iter()
                .position(|turns| turns.iter().any(|id| side.contains(id)))
        };
        Some((first(&self.older), first(&self.newer)))
    }
}

/// A published result on the same data, shown beside ours (percent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reference {
    pub name: String,
    pub recall_at_5: f64,
    pub recall_at_10: f64,
}

/// A benchmark adapter: adding a dataset is one file implementing this.
pub trait Dataset {
    fn name(&self) -> &str;
    fn conversations(&self) -> Vec<Conversation>;
    /// Category names in display order.
    fn categories(&self) -> Vec<String>;
    /// Published reference points on this data.
    fn references(&self) -> Vec<Reference> {
        Vec::new()
    }
    /// How the adapter read the data (normalised ids, skipped entries…), for the report.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

// --- what is measured -----------------------------------------------------------------------

/// What one memory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryUnit {
    /// What the product keeps: each session imported as a thread through the memory writer
    /// (turn memories `Speaker: text` and what the rules extract), so recall ranks exactly what
    /// a user's memory holds.
    Product,
    /// The turn's text as it was said.
    Raw,
    /// `[8 May 2023] Caroline: text` — the session date and the speaker's name.
    Dated,
    /// The dated turn with its neighbours in the session (±1 turn), one speaker per line;
    /// `source_refs` = [centre, previous, next].
    Window,
    /// Facts extracted by an LLM; skipped when none is configured.
    Facts,
}

impl MemoryUnit {
    pub const ALL: [MemoryUnit; 5] = [
        MemoryUnit::Product,
        MemoryUnit::Raw,
        MemoryUnit::Dated,
        MemoryUnit::Window,
        MemoryUnit::Facts,
    ];

    pub fn key(self) -> &'static str {
        match self {
            MemoryUnit::Product => "product",
            MemoryUnit::Raw => "raw",
            MemoryUnit::Dated => "dated",
            MemoryUnit::Window => "window",
            MemoryUnit::Facts => "facts",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            MemoryUnit::Product => {
                "what the product stores: sessions imported as threads through the memory writer"
            }
            MemoryUnit::Raw => "one memory per turn: the turn text",
            MemoryUnit::Dated => "one memory per turn: `[8 May 2023] Speaker: text`",
            MemoryUnit::Window => {
                "one memory per turn: the dated turn with the turns before and after it in the session"
            }
            MemoryUnit::Facts => "facts extracted by an LLM from the turns",
        }
    }

    /// How results are credited: every unit by all its refs; the window unit also by its
    /// centre turn alone, which makes it comparable with one-turn units at equal k.
    fn credits(self) -> &'static [Credit] {
        match self {
            MemoryUnit::Window => &[Credit::AllRefs, Credit::Centre],
            _ => &[Credit::AllRefs],
        }
    }

    /// The memories of one session: (content, refs, the centre turn).
    fn memories(self, session: &Session) -> Vec<(String, Vec<String>, &Turn)> {
        let date = session.date.format("%-d %B %Y").to_string();
        let turns = &session.turns;
        let line = |turn: &Turn| format!("{}: {}", turn.speaker, turn.text);
        turns
            .iter()
            .enumerate()
            .filter(|(_, turn)| !turn.text.trim().is_empty())
            .map(|(index, turn)| match self {
                MemoryUnit::Product | MemoryUnit::Raw | MemoryUnit::Facts => {
                    (turn.text.clone(), vec![turn.id.clone()], turn)
                }
                MemoryUnit::Dated => (
                    format!("[{date}] {}", line(turn)),
                    vec![turn.id.clone()],
                    turn,
                ),
                MemoryUnit::Window => {
                    let mut refs = vec![turn.id.clone()];
                    let mut lines = Vec::with_capacity(3);
                    if let Some(previous) = index.checked_sub(1).and_then(|i| turns.get(i)) {
                        refs.push(previous.id.clone());
                        lines.push(line(previous));
                    }
                    lines.push(line(turn));
                    if let Some(next) = turns.get(index + 1) {
                        refs.push(next.id.clone());
                        lines.push(line(next));
                    }
                    (format!("[{date}] {}", lines.join("\n")), refs, turn)
                }
            })
            .collect()
    }
}

/// Which refs of a returned memory count as retrieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// Every turn the memory was derived from (the protocol).
    AllRefs,
    /// Only the first ref, the turn the memory is about (window memories list it first).
    Centre,
}

/// How recall is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Retrieval {
    Bm25,
    Vector,
    Hybrid,
    HybridDecay,
    /// `HybridDecay` without the query gate and the relevance floor: what they cost.
    Ungated,
}

impl Retrieval {
    pub const ALL: [Retrieval; 5] = [
        Retrieval::Bm25,
        Retrieval::Vector,
        Retrieval::Hybrid,
        Retrieval::HybridDecay,
        Retrieval::Ungated,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Retrieval::Bm25 => "bm25",
            Retrieval::Vector => "vector",
            Retrieval::Hybrid => "hybrid",
            Retrieval::HybridDecay => "hybrid+decay",
            Retrieval::Ungated => "hybrid+decay-ungated",
        }
    }

    fn mode(self) -> RecallMode {
        match self {
            Retrieval::Bm25 => RecallMode::Keyword,
            Retrieval::Vector => RecallMode::Vector,
            Retrieval::Hybrid | Retrieval::HybridDecay | Retrieval::Ungated => RecallMode::Hybrid,
        }
    }

    fn decay(self) -> bool {
        matches!(self, Retrieval::HybridDecay | Retrieval::Ungated)
    }

    fn fuses(self) -> bool {
        self.mode() == RecallMode::Hybrid
    }
}

/// Recall's relevance operating points (`memory.relevance`: the gate, and the tail where a
/// result list stops): one point of the gate sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GatePoint {
    pub gate: f64,
    pub tail: f64,
}

impl GatePoint {
    /// No gate and no tail: every candidate may be returned.
    pub const OFF: GatePoint = GatePoint::new(0.0, 0.0);

    pub const fn new(gate: f64, tail: f64) -> Self {
        Self { gate, tail }
    }

    pub fn of(relevance: &RelevanceSettings) -> Self {
        Self::new(relevance.gate, relevance.tail)
    }

    fn apply(self, relevance: &mut RelevanceSettings) {
        relevance.gate = self.gate;
        relevance.tail = self.tail;
    }

    fn values(self) -> [f64; 2] {
        [self.gate, self.tail]
    }

    /// Thousandths, for ordering rows.
    fn order(self) -> [i64; 2] {
        self.values().map(|value| (value * 1000.0).round() as i64)
    }

    /// `gate 0.1 tail 0.05`.
    pub fn label(self) -> String {
        format!(
            "gate {} tail {}",
            report::number(self.gate),
            report::number(self.tail)
        )
    }
}

impl std::str::FromStr for GatePoint {
    type Err = String;

    /// `gate/tail`, e.g. `0.1/0.05`: probabilities between 0 and 1.
    fn from_str(text: &str) -> Result<Self, String> {
        let values: Vec<f64> = text
            .split('/')
            .map(|part| part.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{text:?}: two numbers gate/tail expected"))?;
        match values[..] {
            [gate, tail]
                if values
                    .iter()
                    .all(|v| v.is_finite() && (0.0..=1.0).contains(v)) =>
            {
                Ok(Self::new(gate, tail))
            }
            _ => Err(format!(
                "{text:?}: two probabilities between 0 and 1 expected (gate/tail)"
            )),
        }
    }
}

// --- options and entry points ---------------------------------------------------------------

/// What `mnemo eval` runs.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The dataset file (read only; never copied).
    pub data: PathBuf,
    /// Where results go (created): `results.json`, `results.md`, `recall.svg`,
    /// `per_question.jsonl`.
    pub out_dir: PathBuf,
    /// The k of recall@k and NDCG@k; the largest is what recall is asked for.
    pub ks: Vec<usize>,
    /// Memory units (`raw`, `dated`, `window`, `facts`) and/or retrieval variants (`bm25`,
    /// `vector`, `hybrid`, `hybrid+decay`) to run; a kind not named runs in full. `None`: all.
    pub variants: Option<Vec<String>>,
    /// Only the first N conversations.
    pub limit_conversations: Option<usize>,
    /// Embedder and memory settings. `data_dir` is the scratch directory: it must be absent,
    /// empty, or a previous evaluation's scratch; it is wiped at the start and removed at the
    /// end. An empty `data_dir` means `<out_dir>/scratch`. Database and Qdrant URLs are ignored.
    pub settings: Settings,
    /// Candidates per signal (vector top-N and BM25 top-N) for every recall; the product's
    /// `memory.candidates` unless changed.
    pub candidates: usize,
    /// RRF constants tried for every memory unit (hybrid, no decay), besides
    /// `settings.memory.rrf_k`, when the fusion is RRF (other fusions have no constant).
    pub rrf_sweep: Vec<f64>,
    /// Query gate and floor thresholds tried for the product's memories (hybrid + decay),
    /// besides the settings' own; each also asks the foreign questions.
    pub gate_sweep: Vec<GatePoint>,
    /// Answer every question from the memories recalled by `answer_unit` with hybrid recall,
    /// and score the answers with an LLM judge and token F1 (needs an LLM: the `chat` role
    /// answers, the `memory` role judges).
    pub answer: bool,
    pub answer_unit: MemoryUnit,
    /// Memories given to the answer model.
    pub answer_k: usize,
    /// Where to write the relevance features of the product's results without gate or tail,
    /// for its own questions and another conversation's (JSON lines, as `mnemo eval relevance
    /// --features` writes them; `eval/relevance/fit.py` fits on both).
    pub features: Option<PathBuf>,
    /// Changes to the memory settings each tried as one more row beside the product's (its
    /// memories, hybrid + decay, the shipped gate): ablations without another ingest.
    pub ablations: Vec<Ablation>,
    /// `--vector-cache`: memories' vectors kept in this file between runs.
    pub vector_cache: Option<PathBuf>,
}

/// One `--ablate` row: the product's recall with `memory` instead of the shipped settings.
#[derive(Debug, Clone)]
pub struct Ablation {
    /// What was changed, e.g. `one_per_source=false`.
    pub label: String,
    pub memory: MemorySettings,
}

impl EvalOptions {
    pub const DEFAULT_KS: [usize; 6] = [1, 3, 5, 10, 25, 50];
    pub const DEFAULT_RRF_SWEEP: [f64; 4] = [60.0, 20.0, 10.0, 5.0];
    /// Gates and tails around the shipped operating points.
    pub const DEFAULT_GATE_SWEEP: [GatePoint; 8] = [
        GatePoint::new(0.0, 0.0),
        GatePoint::new(0.05, 0.005),
        GatePoint::new(0.1, 0.005),
        GatePoint::new(0.12, 0.005),
        GatePoint::new(0.15, 0.02),
        GatePoint::new(0.15, 0.05),
        GatePoint::new(0.2, 0.005),
        GatePoint::new(0.3, 0.005),
    ];

    /// Defaults for everything else; the scratch directory becomes `<out_dir>/scratch`.
    pub fn new(data: PathBuf, out_dir: PathBuf, mut settings: Settings) -> Self {
        settings.data_dir = out_dir.join("scratch");
        Self {
            data,
            out_dir,
            ks: Self::DEFAULT_KS.to_vec(),
            variants: None,
            limit_conversations: None,
            candidates: settings.memory.candidates,
            settings,
            rrf_sweep: Self::DEFAULT_RRF_SWEEP.to_vec(),
            gate_sweep: Self::DEFAULT_GATE_SWEEP.to_vec(),
            answer: false,
            answer_unit: MemoryUnit::Dated,
            answer_k: 10,
            features: None,
            ablations: Vec::new(),
            vector_cache: None,
        }
    }
}

/// What a finished evaluation returns (the report is also in `results.json`).
#[derive(Debug, Clone)]
pub struct EvalSummary {
    pub results_json: PathBuf,
    pub results_md: PathBuf,
    pub recall_svg: PathBuf,
    pub report: Report,
}

impl EvalSummary {
    /// One line for the terminal: the product's run (else the best one) and where the
    /// results are.
    pub fn headline(&self) -> String {
        let product = self.report.runs.iter().find(|run| run.key == "product");
        let best = product.or_else(|| {
            self.report
                .best
                .as_ref()
                .and_then(|key| self.report.runs.iter().find(|run| &run.key == key))
        });
        let label = if product.is_some() { "" } else { "best " };
        match best {
            Some(run) => format!(
                "{}: {label}{} R@5 {:.1} R@10 {:.1} ({} questions, {:.0} s); results in {}",
                self.report.dataset,
                run.key,
                100.0 * run.overall.recall.get(&5).copied().unwrap_or(0.0),
                100.0 * run.overall.recall.get(&10).copied().unwrap_or(0.0),
                self.report.questions,
                self.report.elapsed_secs,
                self.results_md.display()
            ),
            None => format!(
                "{}: no run completed; results in {}",
                self.report.dataset,
                self.results_md.display()
            ),
        }
    }
}

/// The answer and judge models for `--answer`; an error when no LLM is configured.
fn answer_models(
    options: &EvalOptions,
    models: &mnemo::llm::roles::Models,
) -> anyhow::Result<Option<(answer::AnswerModels, MemoryUnit, usize)>> {
    if !options.answer {
        return Ok(None);
    }
    let (Some(answer), Some(judge)) =
        (models.role(ModelRole::Chat), models.role(ModelRole::Memory))
    else {
        bail!("--answer needs an LLM (llm.base_url and llm.model)");
    };
    if options.answer_unit == MemoryUnit::Facts {
        bail!("--answer-unit must be raw, dated or window");
    }
    Ok(Some((
        answer::AnswerModels {
            answer: answer.clone(),
            judge: judge.clone(),
            structured_retries: models.structured_retries,
        },
        options.answer_unit,
        options.answer_k.max(1),
    )))
}

/// `mnemo eval locomo --data PATH`.
pub async fn run_locomo(options: EvalOptions) -> anyhow::Result<EvalSummary> {
    let data = locomo::Locomo::load(&options.data)?;
    run(&data, options).await
}

/// `mnemo eval beam --data PATH`.
pub async fn run_beam(options: EvalOptions) -> anyhow::Result<EvalSummary> {
    let data = beam::Beam::load(&options.data)?;
    run(&data, options).await
}

/// `mnemo eval longmemeval --data PATH`.
pub async fn run_longmemeval(options: EvalOptions) -> anyhow::Result<EvalSummary> {
    let data = longmemeval::LongMemEval::load(&options.data)?;
    run(&data, options).await
}

/// Runs the evaluation of `dataset` and writes the results into `options.out_dir`.
pub async fn run(dataset: &dyn Dataset, options: EvalOptions) -> anyhow::Result<EvalSummary> {
    let started = Instant::now();
    let embedder = mnemo::llm::embed::from_settings(&options.settings.embedder).await?;
    let plan = Plan::new(&options)?;
    let mut conversations = dataset.conversations();
    if let Some(limit) = options.limit_conversations {
        conversations.truncate(limit);
    }
    if conversations.is_empty() {
        bail!("the dataset has no conversations");
    }
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("creating {}", options.out_dir.display()))?;
    let scratch_root = if options.settings.data_dir.as_os_str().is_empty() {
        options.out_dir.join("scratch")
    } else {
        options.settings.data_dir.clone()
    };
    prepare_scratch(&scratch_root, &options.out_dir)?;
    let data_sha256 = std::fs::read(&options.data)
        .map(|bytes| hex::encode(sha2::Sha256::digest(&bytes)))
        .unwrap_or_default();

    let models = mnemo::llm::roles::Models::from_settings(&options.settings.llm);
    let env = Env {
        dataset: dataset.name(),
        conversations: &conversations,
        scratch_root: scratch_root.clone(),
        settings: &options.settings,
        embedder: Arc::new(match &options.vector_cache {
            Some(path) => EvalEmbedder::new(embedder).with_cache(VectorCache::open(path)?),
            None => EvalEmbedder::new(embedder),
        }),
        plan,
        answers: answer_models(&options, &models)?,
        facts: models
            .role(ModelRole::Memory)
            .cloned()
            .map(|role| (role, models.structured_retries)),
    };
    let mut sink = open_sink(&options)?;
    // Main pass: every memory unit with every retrieval variant.
    let mut units = Vec::new();
    for &unit in &env.plan.units {
        if unit == MemoryUnit::Facts && env.facts.is_none() {
            units.push(report::UnitResult {
                unit: unit.key().to_string(),
                description: unit.description().to_string(),
                status: "skipped (no LLM configured)".to_string(),
                memories: 0,
                ingest_secs: 0.0,
                query_secs: 0.0,
                recalls: 0,
            });
            continue;
        }
        units.push(run_unit(&env, unit, &mut sink).await?);
    }

    sink.per_question
        .flush()
        .context("writing per_question.jsonl")?;

    let runs: Vec<RunResult> = sink
        .accumulators
        .iter()
        .map(|(key, accumulator)| accumulator.result(key, &env.plan))
        .collect();
    let report = Report::new(
        dataset,
        &options,
        report::RunInfo {
            data_sha256,
            conversations: &conversations,
            ks: env.plan.ks.clone(),
            candidates: env.plan.candidates,
            tokens_k: env.plan.tokens_k,
            turn_importance: TURN_IMPORTANCE,
            embedder_model: env.embedder.model_id().to_string(),
            dimension: env.embedder.dimension(),
            wordpiece_tokenizer: sink.wordpieces.is_some(),
            all_conversations: dataset.conversations().into_iter().map(|c| c.id).collect(),
            elapsed_secs: started.elapsed().as_secs_f64(),
        },
        units,
        runs,
    );
    let mut report = report;
    if let Some((models, unit, k)) = &env.answers {
        if let Some(file) = sink.answers_file.as_mut() {
            file.flush().context("writing answers.jsonl")?;
        }
        report.answers = Some(sink.answers.report(
            format!("{}/{}", unit.key(), Retrieval::Hybrid.key()),
            *k,
            models,
        ));
    }
    let summary = report::write(report, &options.out_dir)?;
    if let Err(error) = std::fs::remove_dir_all(&scratch_root) {
        tracing::warn!(%error, dir = %scratch_root.display(), "removing the eval scratch directory failed");
    }
    Ok(summary)
}

/// Where the results of the run go: the accumulators and the per-question, answer and
/// feature files.
fn open_sink(options: &EvalOptions) -> anyhow::Result<Sink> {
    Ok(Sink {
        accumulators: BTreeMap::new(),
        per_question: std::io::BufWriter::new(
            std::fs::File::create(options.out_dir.join("per_question.jsonl"))
                .context("creating per_question.jsonl")?,
        ),
        wordpieces: WordPieces::load(&options.settings),
        answers: answer::AnswerTally::default(),
        answers_file: if options.answer {
            Some(std::io::BufWriter::new(
                std::fs::File::create(options.out_dir.join("answers.jsonl"))
                    .context("creating answers.jsonl")?,
            ))
        } else {
            None
        },
        features: match &options.features {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            )),
            None => None,
        },
    })
}

/// The main pass of one memory unit: every conversation ingested, then every question asked
/// with every retrieval variant (and, with two conversations or more, of another one).
async fn run_unit(
    env: &Env<'_>,
    unit: MemoryUnit,
    sink: &mut Sink,
) -> anyhow::Result<report::UnitResult> {
    let conversations = env.conversations;
    let total_turns: u64 = conversations
        .iter()
        .flat_map(|c| &c.sessions)
        .map(|s| s.turns.len() as u64)
        .sum();
    let total_questions: usize = conversations.iter().map(|c| c.questions.len()).sum();
    let bars = indicatif::MultiProgress::new();
    let ingest_bar = bars.add(progress_bar(total_turns, &format!("ingest {}", unit.key())));
    // Every question with every probe, and (with two conversations or more) each
    // conversation's questions asked of another one with the fused probes.
    let probes = env.plan.probes_for(unit);
    let foreign_probes = if conversations.len() > 1 {
        probes.iter().filter(|p| p.asks_foreign()).count()
    } else {
        0
    };
    let query_bar = bars.add(progress_bar(
        (total_questions * (probes.len() + foreign_probes)) as u64,
        &format!("recall {}", unit.key()),
    ));
    let mut memories = 0usize;
    let (mut ingest_secs, mut query_secs, mut recalls) = (0.0, 0.0, 0usize);
    for (index, conversation) in conversations.iter().enumerate() {
        let ingest_started = Instant::now();
        let scratch = env.open(unit, index).await?;
        let ingested = ingest(&scratch, env, index, unit, &ingest_bar)
            .await
            .with_context(|| format!("ingesting {} ({})", conversation.id, unit.key()))?;
        memories += ingested.memories;
        ingest_secs += ingest_started.elapsed().as_secs_f64();
        let query_started = Instant::now();
        recalls += query(&scratch, &ingested, &probes, env, sink, &query_bar)
            .await
            .with_context(|| format!("querying {} ({})", conversation.id, unit.key()))?;
        query_secs += query_started.elapsed().as_secs_f64();
        scratch.close().await;
    }
    ingest_bar.finish_and_clear();
    query_bar.finish_and_clear();
    eprintln!(
        "{:>8}: {memories} memories ingested in {ingest_secs:.1} s; {recalls} recalls in {query_secs:.1} s",
        unit.key()
    );
    Ok(report::UnitResult {
        unit: unit.key().to_string(),
        description: unit.description().to_string(),
        status: "ok".to_string(),
        memories,
        ingest_secs,
        query_secs,
        recalls,
    })
}

// --- the plan of one evaluation -------------------------------------------------------------

/// Importance of turn memories: ordinary (3), so they decay.
const TURN_IMPORTANCE: u8 = 3;
/// Memories per `MemoryEngine::add` call during ingestion.
const ADD_BATCH: usize = 256;
/// The returned text is measured over this many top results (or fewer if k is smaller).
const TOKENS_AT: usize = 10;
const SCRATCH_MARKER: &str = ".mnemo-eval-scratch";

/// One recall asked per question and memory unit.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Probe {
    retrieval: Retrieval,
    rrf_k: f64,
    /// Gate and floor thresholds other than the settings' (the gate sweep).
    gate: Option<GatePoint>,
    /// Part of a sweep rather than the main table.
    sweep: bool,
    /// An `--ablate` row: its index in [`Plan::ablations`].
    ablation: Option<usize>,
}

impl Probe {
    fn main(retrieval: Retrieval, rrf_k: f64) -> Self {
        Self {
            retrieval,
            rrf_k,
            gate: None,
            sweep: false,
            ablation: None,
        }
    }

    /// The memory settings this probe recalls with: the shipped ones (`base`) or its
    /// ablation's.
    fn settings(self, base: &MemorySettings, ablations: &[Ablation]) -> MemorySettings {
        let mut settings = match self.ablation.and_then(|index| ablations.get(index)) {
            Some(ablation) => ablation.memory.clone(),
            None => base.clone(),
        };
        settings.rrf_k = self.rrf_k;
        if self.retrieval == Retrieval::Ungated {
            GatePoint::OFF.apply(&mut settings.relevance);
        }
        if let Some(gate) = self.gate {
            gate.apply(&mut settings.relevance);
        }
        settings
    }

    /// The recall this probe asks for `query`: `k` results from `candidates` per list.
    fn request(self, query: &str, k: usize, candidates: usize) -> RecallRequest {
        RecallRequest {
            query: query.to_string(),
            k: Some(k),
            mode: self.retrieval.mode(),
            decay: self.retrieval.decay(),
            candidates: Some(candidates),
            ..RecallRequest::default()
        }
    }

    /// The gate this probe recalls with (fused retrievals only).
    fn gate_used(self, base: &MemorySettings, ablations: &[Ablation]) -> Option<GatePoint> {
        self.retrieval
            .fuses()
            .then(|| GatePoint::of(&self.settings(base, ablations).relevance))
    }

    /// Asked the questions of another conversation too: the main fused retrievals and the
    /// gate sweep.
    fn asks_foreign(self) -> bool {
        self.retrieval.fuses() && (!self.sweep || self.gate.is_some())
    }
}

struct Plan {
    units: Vec<MemoryUnit>,
    /// The main retrieval variants.
    probes: Vec<Probe>,
    /// The RRF sweep (hybrid with other constants).
    sweep: Vec<Probe>,
    ks: Vec<usize>,
    max_k: usize,
    tokens_k: usize,
    candidates: usize,
    memory: MemorySettings,
    ablations: Vec<Ablation>,
}

impl Plan {
    /// The memory settings `probe` recalls with.
    fn settings(&self, probe: Probe) -> MemorySettings {
        probe.settings(&self.memory, &self.ablations)
    }

    /// What `probe` changed from the shipped settings (`--ablate`), if anything.
    fn ablation(&self, probe: Probe) -> Option<&str> {
        probe
            .ablation
            .and_then(|index| self.ablations.get(index))
            .map(|ablation| ablation.label.as_str())
    }

    /// The main retrieval variants, then the sweeps; the gate sweep for the product's
    /// memories only.
    fn probes_for(&self, unit: MemoryUnit) -> Vec<Probe> {
        self.probes
            .iter()
            .filter(|p| p.ablation.is_none() || unit == MemoryUnit::Product)
            .chain(
                self.sweep
                    .iter()
                    .filter(|p| p.gate.is_none() || unit == MemoryUnit::Product),
            )
            .copied()
            .collect()
    }

    fn new(options: &EvalOptions) -> anyhow::Result<Self> {
        let mut ks = options.ks.clone();
        ks.sort_unstable();
        ks.dedup();
        if ks.is_empty() || ks[0] == 0 {
            bail!("ks must be positive and not empty");
        }
        let max_k = ks[ks.len() - 1];
        let memory = options.settings.memory.clone();
        if max_k > memory.max_k {
            bail!(
                "the largest k ({max_k}) exceeds memory.max_k ({})",
                memory.max_k
            );
        }
        if options.candidates == 0 {
            bail!("candidates must be positive");
        }
        let (units, retrievals) = parse_variants(options.variants.as_deref())?;
        let base = memory.rrf_k;
        let mut probes: Vec<Probe> = retrievals
            .iter()
            .map(|&retrieval| Probe::main(retrieval, base))
            .collect();
        if !options.ablations.is_empty() && !units.contains(&MemoryUnit::Product) {
            bail!("--ablate changes the product's recall: run the product unit");
        }
        probes.extend((0..options.ablations.len()).map(|index| Probe {
            ablation: Some(index),
            ..Probe::main(Retrieval::HybridDecay, base)
        }));
        let mut sweep = Vec::new();
        if retrievals.contains(&Retrieval::Hybrid) && memory.fusion.method == FusionMethod::Rrf {
            let mut seen = vec![base];
            for &rrf_k in &options.rrf_sweep {
                if !rrf_k.is_finite() || rrf_k < 0.0 {
                    bail!("rrf_k values must be finite and >= 0, not {rrf_k}");
                }
                if !seen.contains(&rrf_k) {
                    seen.push(rrf_k);
                    sweep.push(Probe {
                        sweep: true,
                        ..Probe::main(Retrieval::Hybrid, rrf_k)
                    });
                }
            }
        }
        if retrievals.contains(&Retrieval::HybridDecay) && units.contains(&MemoryUnit::Product) {
            let mut seen = vec![GatePoint::of(&memory.relevance)];
            for &point in &options.gate_sweep {
                if !point.values().iter().all(|v| v.is_finite() && *v >= 0.0) {
                    bail!("gate sweep values must be finite and >= 0");
                }
                if !seen.contains(&point) {
                    seen.push(point);
                    sweep.push(Probe {
                        gate: Some(point),
                        sweep: true,
                        ..Probe::main(Retrieval::HybridDecay, base)
                    });
                }
            }
        }
        Ok(Self {
            units,
            probes,
            sweep,
            tokens_k: TOKENS_AT.min(max_k),
            ks,
            max_k,
            candidates: options.candidates,
            memory,
            ablations: options.ablations.clone(),
        })
    }
}

/// Splits variant names into memory units and retrieval variants; a kind not named runs in
/// full.
fn parse_variants(names: Option<&[String]>) -> anyhow::Result<(Vec<MemoryUnit>, Vec<Retrieval>)> {
    let mut units = Vec::new();
    let mut retrievals = Vec::new();
    for name in names.unwrap_or_default() {
        let name = name.trim().to_lowercase();
        if let Some(unit) = MemoryUnit::ALL.iter().find(|u| u.key() == name) {
            if !units.contains(unit) {
                units.push(*unit);
            }
        } else if let Some(retrieval) = Retrieval::ALL
            .iter()
            .find(|r| r.key() == name || (name == "decay" && **r == Retrieval::HybridDecay))
        {
            if !retrievals.contains(retrieval) {
                retrievals.push(*retrieval);
            }
        } else {
            let known: Vec<&str> = MemoryUnit::ALL
                .iter()
                .map(|u| u.key())
                .chain(Retrieval::ALL.iter().map(|r| r.key()))
                .collect();
            bail!("unknown variant {name:?}; known: {}", known.join(", "));
        }
    }
    if units.is_empty() {
        units = MemoryUnit::ALL.to_vec();
    }
    if retrievals.is_empty() {
        retrievals = Retrieval::ALL.to_vec();
    }
    units.sort();
    retrievals.sort();
    Ok((units, retrievals))
}

// --- helpers --------------------------------------------------------------------------------

/// Wipes and recreates the scratch directory — only if it is new, empty, or ours.
fn prepare_scratch(root: &Path, out_dir: &Path) -> anyhow::Result<()> {
    if out_dir.starts_with(root) {
        bail!(
            "the scratch directory {} must not contain the output directory {}",
            root.display(),
            out_dir.display()
        );
    }
    if root.exists() {
        let empty = std::fs::read_dir(root)
            .with_context(|| format!("reading {}", root.display()))?
            .next()
            .is_none();
        if !empty && !root.join(SCRATCH_MARKER).exists() {
            bail!(
                "refusing to wipe {}: it is not empty and is not an evaluation scratch directory (pass a new or empty data directory)",
                root.display()
            );
        }
        std::fs::remove_dir_all(root).with_context(|| format!("wiping {}", root.display()))?;
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    std::fs::write(
        root.join(SCRATCH_MARKER),
        "scratch data of `mnemo eval`; wiped by the next run\n",
    )
    .context("marking the scratch directory")?;
    Ok(())
}

fn progress_bar(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>16} {bar:40} {human_pos}/{human_len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_string());
    bar
}

/// A file-name-safe form of an id.
fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn model_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2")
    }

    fn session() -> Session {
        let turn = |id: &str, speaker: &str, role, text: &str| Turn {
            id: id.into(),
            speaker: speaker.into(),
            role,
            text: text.into(),
        };
        Session {
            id: "session_1".into(),
            date: Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap(),
            turns: vec![
                turn("D1:1", "Caroline", Role::User, "Hey Mel!"),
                turn("D1:2", "Melanie", Role::Assistant, "Hi! I went hiking."),
                turn("D1:3", "Caroline", Role::User, "   "),
                turn("D1:4", "Caroline", Role::User, "Where?"),
            ],
        }
    }

    #[test]
    fn memory_units_format_turns_and_carry_their_refs() {
        let session = session();
        let raw = MemoryUnit::Raw.memories(&session);
        assert_eq!(raw.len(), 3, "an empty turn makes no memory");
        assert_eq!(
            (raw[0].0.as_str(), raw[0].1.as_slice()),
            ("Hey Mel!", &["D1:1".to_string()][..])
        );
        let dated = MemoryUnit::Dated.memories(&session);
        assert_eq!(dated[1].0, "[8 May 2023] Melanie: Hi! I went hiking.");
        assert_eq!(dated[1].1, ["D1:2"]);
        let window = MemoryUnit::Window.memories(&session);
        assert_eq!(
            window[0].0,
            "[8 May 2023] Caroline: Hey Mel!\nMelanie: Hi! I went hiking."
        );
        assert_eq!(window[0].1, ["D1:1", "D1:2"]);
        // The centre comes first; neighbours are the adjacent turns of the session.
        assert_eq!(window[1].1, ["D1:2", "D1:1", "D1:3"]);
        assert_eq!(window[2].1, ["D1:4", "D1:3"]);
        assert_eq!(window[2].2.id, "D1:4");
        assert_eq!(credited(&window[1].1, Credit::Centre), ["D1:2"]);
        assert_eq!(credited(&window[1].1, Credit::AllRefs), window[1].1);
    }

    #[test]
    fn variants_split_into_units_and_retrievals() {
        let names = |list: &[&str]| {
            list.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
        };
        let (units, retrievals) = parse_variants(None).unwrap();
        assert_eq!(units, MemoryUnit::ALL);
        assert_eq!(retrievals, Retrieval::ALL);
        let (units, retrievals) =
            parse_variants(Some(&names(&["hybrid", "Dated", "bm25"]))).unwrap();
        assert_eq!(units, [MemoryUnit::Dated]);
        assert_eq!(retrievals, [Retrieval::Bm25, Retrieval::Hybrid]);
        let (units, retrievals) = parse_variants(Some(&names(&["window", "decay"]))).unwrap();
        assert_eq!(units, [MemoryUnit::Window]);
        assert_eq!(retrievals, [Retrieval::HybridDecay]);
        let error = parse_variants(Some(&names(&["dense"]))).unwrap_err();
        assert!(
            error.to_string().contains("known: product, raw, dated"),
            "{error}"
        );
    }

    #[test]
    fn the_plan_sweeps_rrf_only_with_hybrid_and_checks_k() {
        let mut options = EvalOptions::new("d.json".into(), "out".into(), Settings::default());
        let shipped = GatePoint::of(&options.settings.memory.relevance);
        let stricter: GatePoint = "0.5/0.3".parse().unwrap();
        options.gate_sweep = vec![stricter, shipped];
        // The shipped fusion has no constant to sweep; the gate sweep skips the settings' own
        // thresholds and runs for the product's memories only.
        let plan = Plan::new(&options).unwrap();
        assert_eq!((plan.probes.len(), plan.sweep.len()), (5, 1));
        assert_eq!(plan.candidates, options.settings.memory.candidates);
        let gate = plan.sweep[0];
        assert_eq!(gate.gate, Some(GatePoint::new(0.5, 0.3)));
        assert!(gate.asks_foreign() && gate.retrieval == Retrieval::HybridDecay);
        let relevance = plan.settings(gate).relevance;
        assert_eq!((relevance.gate, relevance.tail), (0.5, 0.3));
        assert_eq!(plan.probes_for(MemoryUnit::Dated).len(), 5);
        assert_eq!(plan.probes_for(MemoryUnit::Product).len(), 6);
        let ungated = plan
            .probes
            .iter()
            .find(|p| p.retrieval == Retrieval::Ungated);
        assert_eq!(
            ungated.and_then(|p| p.gate_used(&plan.memory, &plan.ablations)),
            Some(GatePoint::OFF)
        );
        for bad in ["1/2/3", "a/b", "-1/0", "0.5/2", "0.1"] {
            assert!(bad.parse::<GatePoint>().is_err(), "{bad}");
        }
        options.gate_sweep.clear();
        options.settings.memory.fusion.method = FusionMethod::Rrf;
        let plan = Plan::new(&options).unwrap();
        // The five retrievals in the main pass; the sweep holds the values other than the
        // setting (10).
        assert_eq!(plan.probes.len(), 5);
        assert!(plan.probes.iter().all(|p| !p.sweep && p.rrf_k == 10.0));
        let sweep: Vec<f64> = plan.sweep.iter().map(|p| p.rrf_k).collect();
        assert_eq!(sweep, [60.0, 20.0, 5.0]);
        assert!(
            plan.sweep
                .iter()
                .all(|p| p.sweep && p.retrieval == Retrieval::Hybrid)
        );
        assert_eq!((plan.max_k, plan.tokens_k), (50, 10));
        options.variants = Some(vec!["bm25".into()]);
        let plan = Plan::new(&options).unwrap();
        assert_eq!((plan.probes.len(), plan.sweep.len()), (1, 0));
        options.ks = vec![500];
        assert!(Plan::new(&options).is_err());
        options.ks = vec![0, 1];
        assert!(Plan::new(&options).is_err());
    }

    #[test]
    fn an_ablation_is_one_more_product_probe_with_its_own_settings() {
        let mut options = EvalOptions::new("d.json".into(), "out".into(), Settings::default());
        let mut changed = options.settings.memory.clone();
        changed.one_per_source = false;
        options.ablations = vec![Ablation {
            label: "one_per_source=false".into(),
            memory: changed,
        }];
        let plan = Plan::new(&options).unwrap();
        let ablated: Vec<Probe> = plan
            .probes
            .iter()
            .copied()
            .filter(|p| p.ablation.is_some())
            .collect();
        assert_eq!(ablated.len(), 1);
        let probe = ablated[0];
        assert_eq!(probe.retrieval, Retrieval::HybridDecay);
        assert!(!plan.settings(probe).one_per_source);
        assert!(
            plan.settings(Probe::main(Retrieval::HybridDecay, 10.0))
                .one_per_source
        );
        assert_eq!(plan.ablation(probe), Some("one_per_source=false"));
        assert!(plan.probes_for(MemoryUnit::Product).contains(&probe));
        assert!(!plan.probes_for(MemoryUnit::Dated).contains(&probe));
        // An ablation changes the product's recall: without the product unit it is refused.
        options.variants = Some(vec!["dated".into()]);
        assert!(Plan::new(&options).is_err());
    }

    #[test]
    fn a_foreign_directory_is_never_wiped() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let foreign = dir.path().join("data");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join("mnemo.db"), "precious").unwrap();
        let error = prepare_scratch(&foreign, &out).unwrap_err();
        assert!(error.to_string().contains("refusing to wipe"), "{error}");
        assert!(foreign.join("mnemo.db").exists());
        // New, then ours: wiped and re-marked.
        let scratch = dir.path().join("scratch");
        prepare_scratch(&scratch, &out).unwrap();
        std::fs::write(scratch.join("left-over"), "x").unwrap();
        prepare_scratch(&scratch, &out).unwrap();
        assert!(!scratch.join("left-over").exists());
        assert!(scratch.join(SCRATCH_MARKER).exists());
        assert!(
            prepare_scratch(dir.path(), &out).is_err(),
            "scratch must not hold the output"
        );
    }

    /// Records the batches it sees; a text's vector is `[length, call number]`.
    #[derive(Default)]
    struct Recording {
        batches: std::sync::Mutex<Vec<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl Embedder for Recording {
        fn model_id(&self) -> &str {
            "recording"
        }

        fn dimension(&self) -> usize {
            2
        }

        async fn embed(
            &self,
            texts: &[String],
        ) -> Result<Vec<Vec<f32>>, mnemo::llm::embed::EmbedError> {
            let mut batches = self.batches.lock().unwrap();
            batches.push(texts.to_vec());
            let call = batches.len() as f32;
            Ok(texts.iter().map(|t| vec![t.len() as f32, call]).collect())
        }
    }

    #[tokio::test]
    async fn the_eval_embedder_sorts_batches_and_caches_queries() {
        let inner = Arc::new(Recording::default());
        let embedder = EvalEmbedder::new(inner.clone());
        let texts: Vec<String> = ["ccc", "a", "bb", "a"]
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        let vectors = embedder.embed(&texts).await.unwrap();
        let lengths: Vec<f32> = vectors.iter().map(|v| v[0]).collect();
        assert_eq!(
            lengths,
            [3.0, 1.0, 2.0, 1.0],
            "results in the caller's order"
        );
        assert_eq!(inner.batches.lock().unwrap()[0], ["a", "a", "bb", "ccc"]);
        let query = vec!["what did I say?".to_string()];
        let first = embedder.embed_queries(&query).await.unwrap();
        let again = embedder.embed_queries(&query).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(
            inner.batches.lock().unwrap().len(),
            2,
            "the second query came from the cache"
        );
        assert!(embedder.embed_ms("what did I say?").is_some());
        assert!(embedder.embed_ms("never asked").is_none());
    }

    #[tokio::test]
    async fn the_vector_cache_embeds_a_text_once_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vectors.bin");
        let texts: Vec<String> = vec!["alpha".into(), "be".into()];
        let inner = Arc::new(Recording::default());
        let first = EvalEmbedder::new(inner.clone()).with_cache(VectorCache::open(&path).unwrap());
        let vectors = first.embed(&texts).await.unwrap();
        assert_eq!(vectors, [vec![5.0, 1.0], vec![2.0, 1.0]]);
        drop(first);
        // A crash mid-record leaves a tail that must not spoil what was written before it.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[7; 11]);
        std::fs::write(&path, &bytes).unwrap();

        let inner = Arc::new(Recording::default());
        let second = EvalEmbedder::new(inner.clone()).with_cache(VectorCache::open(&path).unwrap());
        let more: Vec<String> = vec!["be".into(), "gamma".into(), "alpha".into()];
        let vectors = second.embed(&more).await.unwrap();
        assert_eq!(
            vectors,
            [vec![2.0, 1.0], vec![5.0, 1.0], vec![5.0, 1.0]],
            "stored vectors come back as they were, the new one from this run's first call"
        );
        assert_eq!(
            *inner.batches.lock().unwrap(),
            [vec!["gamma".to_string()]],
            "only the text not seen before is embedded"
        );
        drop(second);
        let third = VectorCache::open(&path).unwrap();
        assert!(third.get(&VectorCache::key("recording", "gamma")).is_some());
        assert!(
            third
                .get(&VectorCache::key("other-model", "gamma"))
                .is_none()
        );
    }

    /// The whole pipeline on the hand-written LongMemEval fixture with the real local model.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn longmemeval_fixture_end_to_end() {
        assert!(
            model_dir().join("model.safetensors").exists(),
            "the embedding model is missing in {}: run scripts/fetch-model",
            model_dir().display()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        settings.embedder.model_dir = model_dir();
        // A few turns per haystack: the operating points are measured on LoCoMo, not here
        // (the ungated row below is what the default rows would be).
        (
            settings.memory.relevance.gate,
            settings.memory.relevance.tail,
        ) = (0.0, 0.0);
        let mut options = EvalOptions::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/longmemeval-mini.json"),
            dir.path().join("results"),
            settings,
        );
        options.ks = vec![1, 3, 10];
        // One gate sweep point that no candidate passes: nothing recalled, foreign or not.
        options.gate_sweep = vec![GatePoint::new(1.0, 1.0)];
        // One ablation row: the product's recall with a gate nothing passes.
        let mut closed = options.settings.memory.clone();
        closed.relevance.gate = 1.0;
        options.ablations = vec![Ablation {
            label: "relevance.gate=1".into(),
            memory: closed,
        }];
        let summary = run_longmemeval(options).await.unwrap();
        for path in [
            &summary.results_json,
            &summary.results_md,
            &summary.recall_svg,
        ] {
            assert!(path.exists(), "{}", path.display());
        }
        assert!(
            !dir.path().join("results/scratch").exists(),
            "scratch removed"
        );
        let report = &summary.report;
        assert_eq!((report.conversations, report.questions), (3, 3));
        let facts = report.units.iter().find(|u| u.unit == "facts").unwrap();
        assert_eq!(facts.status, "skipped (no LLM configured)");
        let run = |key: &str| {
            report
                .runs
                .iter()
                .find(|r| r.key == key)
                .unwrap_or_else(|| panic!("{key}"))
        };
        // Each haystack has at most 8 turns, so k = 10 returns every memory the vector side
        // sees: full recall. BM25 returns only turns sharing a word with the question ("We
        // finally moved to Lisbon" shares none with "Which city do I live in now?").
        // In a two-turn session both ±1 windows hold the same text, and recall drops one as a
        // duplicate: credited by its centre turn alone, the other turn is then missing.
        assert!(run("raw/bm25").overall.recall[&10] < 1.0);
        assert!(run("window-centre/hybrid").overall.recall[&10] < 1.0);
        for key in ["dated/vector", "dated/hybrid", "window/hybrid+decay"] {
            assert_eq!(run(key).overall.recall[&10], 1.0, "{key}");
        }
        // "What degree did I graduate with?" finds its turn first by keywords.
        let degree = report.runs.iter().find(|r| r.key == "dated/bm25").unwrap();
        assert!(degree.categories["single-session-user"].recall[&1] == 1.0);
        // Min-max fusion has no constant to sweep; the one gate sweep row is the product's.
        let swept: Vec<&RunResult> = report.runs.iter().filter(|r| r.sweep).collect();
        assert_eq!(swept.len(), 1);
        let closed = swept[0];
        assert_eq!(closed.key, "product gate 1 tail 1");
        assert_eq!(closed.gate, Some(GatePoint::new(1.0, 1.0)));
        assert_eq!(closed.overall.recall[&10], 0.0);
        let foreign = closed
            .foreign
            .as_ref()
            .expect("the gate sweep asks foreign questions");
        assert_eq!((foreign.asked, foreign.nothing), (3, 1.0));
        assert!(report.recommended_rrf_k.is_none());
        // Each conversation was also asked another one's questions, by the fused retrievals.
        let product = run("product");
        let foreign = product.foreign.as_ref().expect("foreign questions");
        assert_eq!(foreign.asked, 3);
        assert!(run("dated/bm25").foreign.is_none());
        let lines = std::fs::read_to_string(dir.path().join("results/per_question.jsonl")).unwrap();
        // 3 questions × 5 retrievals × (product, raw, dated, window, window-centre), and the
        // ablation row's 3.
        assert_eq!(lines.lines().count(), 3 * 5 * 5 + 3);
        let ablated = run("product relevance.gate=1");
        assert_eq!(ablated.overall.recall[&10], 0.0);
        assert_eq!(ablated.ablation.as_deref(), Some("relevance.gate=1"));
        assert_eq!(ablated.foreign.as_ref().map(|f| f.nothing), Some(1.0));
        // The product's own path is the first row, under its own name.
        assert_eq!(report.runs[0].key, "product");
        assert_eq!(run("product").overall.recall[&10], 1.0);
        let markdown = std::fs::read_to_string(&summary.results_md).unwrap();
        assert!(markdown.contains("| dated | hybrid |"), "{markdown}");
        assert!(
            markdown.contains("| product | hybrid+decay, relevance.gate=1 |"),
            "{markdown}"
        );
        assert!(
            markdown.contains("## Relevance operating points"),
            "{markdown}"
        );
        assert!(markdown.contains("| 0 (setting) | 0 |"), "{markdown}");
        assert!(
            markdown.contains("| 1 | 1 |  | 0.0 | – | 100.0 % |"),
            "{markdown}"
        );
        assert!(
            summary.headline().starts_with("LongMemEval: product R@5"),
            "{}",
            summary.headline()
        );
    }

    /// Options for a full run of `../shared/eval/{data}` with the shipped settings, results in
    /// `eval/results/{results}` (`MNEMO_EVAL_OUT` overrides).
    fn full_run(data: &str, results: &str) -> EvalOptions {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = std::env::var("MNEMO_EVAL_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("eval/results").join(results));
        let mut settings = Settings::default();
        settings.embedder.model_dir = model_dir();
        EvalOptions::new(root.join("../shared/eval").join(data), out, settings)
    }

    /// The full LoCoMo dev evaluation (minutes). Run it with
    /// `cargo test --lib eval -- --ignored --nocapture`; results go to `eval/results/dev`
    /// (`MNEMO_EVAL_OUT` overrides; `MNEMO_EVAL_VARIANTS=dated,hybrid` and
    /// `MNEMO_EVAL_LIMIT=2` narrow it down; `MNEMO_EVAL_RRF_K=10` sets `memory.rrf_k` and
    /// `MNEMO_EVAL_RRF_SWEEP=3,2,1` the sweep).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "full LoCoMo dev evaluation; needs ../shared/eval/locomo-dev.json and the model"]
    async fn locomo_dev_full() {
        let mut options = full_run("locomo-dev.json", "dev");
        if let Ok(variants) = std::env::var("MNEMO_EVAL_VARIANTS") {
            options.variants = Some(variants.split(',').map(str::to_string).collect());
        }
        if let Ok(rrf_k) = std::env::var("MNEMO_EVAL_RRF_K") {
            options.settings.memory.rrf_k = rrf_k.parse().expect("MNEMO_EVAL_RRF_K");
        }
        if let Ok(sweep) = std::env::var("MNEMO_EVAL_RRF_SWEEP") {
            options.rrf_sweep = sweep
                .split(',')
                .map(|k| k.trim().parse().expect("MNEMO_EVAL_RRF_SWEEP"))
                .collect();
        }
        if let Ok(limit) = std::env::var("MNEMO_EVAL_LIMIT") {
            options.limit_conversations = Some(limit.parse().expect("MNEMO_EVAL_LIMIT"));
        }
        let summary = run_locomo(options).await.expect("evaluation");
        println!("{}", std::fs::read_to_string(&summary.results_md).unwrap());
        println!("{}", summary.headline());
    }

    /// The whole BEAM 100K file through the product's path (tens of minutes on 2 cores; the
    /// command is `mnemo eval beam --data ../shared/eval/beam-100k.json --variants product`).
    /// Results go to `eval/results/beam` (`MNEMO_EVAL_OUT` overrides; `MNEMO_EVAL_LIMIT=3`
    /// takes the first conversations).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "full BEAM 100K evaluation; needs ../shared/eval/beam-100k.json and the model"]
    async fn beam_100k_full() {
        let mut options = full_run("beam-100k.json", "beam");
        options.variants = Some(vec!["product".into()]);
        options.gate_sweep.clear();
        if let Ok(limit) = std::env::var("MNEMO_EVAL_LIMIT") {
            options.limit_conversations = Some(limit.parse().expect("MNEMO_EVAL_LIMIT"));
        }
        let summary = run_beam(options).await.expect("evaluation");
        println!("{}", std::fs::read_to_string(&summary.results_md).unwrap());
        println!("{}", summary.headline());
        assert!(summary.report.questions > 0);
    }
}
