//! `mnemo eval relevance`: every decision about meaning, measured on the hand-written sets of
//! `eval/relevance` (`en.json`, `zh.json`; schema and types in `eval/relevance/README.md`)
//! through the product's own paths, for each embedder asked for.
//!
//! For each model, each user of each set gets a fresh scratch store and the memory engine a
//! server builds (`startup::open_memory`); their memories are written as `POST /v1/memories`
//! writes them and the indexes settle. Then:
//! - **recall**: every query asked as `memories/search` asks it (hybrid, decay, shipped
//!   settings, k = 10): hits@3 for the query types with relevant memories, the share of
//!   `foreign` and `near_miss` queries answered with nothing;
//! - **forget**: every request's preview (`MemoryEngine::forget_preview`, what `forget` deletes):
//!   precision and recall against its targets, bystanders that would be deleted;
//! - **duplicates**: `MemoryEngine::find_duplicate` for every new statement: restatements
//!   caught, distinct statements wrongly merged;
//! - **sources**: each memory read as a passage for the query, kept when its relevance reaches
//!   the `source` operating point (what research does with a passage): precision, and passages
//!   kept for foreign questions.
//!
//! `--features FILE` also writes, per model, every (query, memory) pair's relevance features and
//! label as JSON lines: the data `eval/relevance/fit.py` fits the relevance model on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use mnemo::config::Settings;
use mnemo::memory::relevance::{Corpus, Terms, forget_subject};
use mnemo::memory::{MemoryEngine, RecallRequest};
use mnemo::store::{self, MemoryId, MemoryKind, NewMemory, Store, UserKind};

/// Query types whose relevant list is not empty, and those that must find nothing.
const FINDING: [&str; 3] = ["paraphrase", "lexical", "category"];
const EMPTY: [&str; 2] = ["foreign", "near_miss"];
/// Recall is asked for this many results; hits are counted in the first `HITS_AT`.
const K: usize = 10;
const HITS_AT: usize = 3;

// --- the data set ---------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize)]
pub struct RelevanceSet {
    pub language: String,
    pub users: Vec<SetUser>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SetUser {
    pub id: String,
    pub memories: Vec<SetMemory>,
    pub queries: Vec<SetQuery>,
    #[serde(default)]
    pub forget: Vec<SetForget>,
    #[serde(default)]
    pub duplicates: Vec<SetDuplicate>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SetMemory {
    pub id: String,
    pub content: String,
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SetQuery {
    pub id: String,
    #[serde(rename = "type")]
    pub query_type: String,
    pub query: String,
    pub relevant: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SetForget {
    pub id: String,
    pub request: String,
    pub targets: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SetDuplicate {
    pub id: String,
    pub content: String,
    pub same_as: Option<String>,
}

impl RelevanceSet {
    /// Reads every `*.json` set in `dir` (sorted by name), checking that every id a query,
    /// request or statement names is a memory of its user.
    pub fn load_dir(dir: &Path) -> anyhow::Result<Vec<Self>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            bail!("no *.json relevance set in {}", dir.display());
        }
        paths
            .iter()
            .map(|path| {
                let bytes =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let set: Self = serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing {}", path.display()))?;
                set.check()
                    .with_context(|| format!("{} is inconsistent", path.display()))?;
                Ok(set)
            })
            .collect()
    }

    fn check(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        for user in &self.users {
            let ids: BTreeSet<&str> = user.memories.iter().map(|m| m.id.as_str()).collect();
            if ids.len() != user.memories.len() {
                problems.push(format!("{}: a memory id appears twice", user.id));
            }
            for memory in &user.memories {
                if kind_of(&memory.kind).is_none() {
                    problems.push(format!("{}: kind {:?}", memory.id, memory.kind));
                }
            }
            let named = user
                .queries
                .iter()
                .flat_map(|q| q.relevant.iter().map(move |id| (&q.id, id)))
                .chain(
                    user.forget
                        .iter()
                        .flat_map(|f| f.targets.iter().map(move |id| (&f.id, id))),
                )
                .chain(
                    user.duplicates
                        .iter()
                        .filter_map(|d| d.same_as.as_ref().map(|id| (&d.id, id))),
                );
            for (owner, id) in named {
                if !ids.contains(id.as_str()) {
                    problems.push(format!("{owner} names unknown memory {id}"));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            problems.truncate(10);
            bail!("{}", problems.join("; "))
        }
    }
}

fn kind_of(text: &str) -> Option<MemoryKind> {
    MemoryKind::parse(text).filter(|kind| {
        matches!(
            kind,
            MemoryKind::Fact | MemoryKind::Preference | MemoryKind::Event
        )
    })
}

// --- what is measured -----------------------------------------------------------------------

#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub n: usize,
    pub hit: usize,
}

impl Counts {
    fn add(&mut self, hit: bool) {
        self.n += 1;
        self.hit += usize::from(hit);
    }
}

/// One model's results on one language.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LanguageResult {
    pub language: String,
    /// Per query type: queries, and those with a relevant memory in the first three results
    /// (finding types) or with no result at all (foreign, near_miss).
    pub recall: BTreeMap<String, Counts>,
    /// Forget: memories the previews would delete that are targets / all they would delete,
    /// and targets found / all targets.
    pub forget_deleted: usize,
    pub forget_correct: usize,
    pub forget_targets: usize,
    pub forget_bystanders: Vec<String>,
    /// Duplicates: restatements caught / all restatements; distinct statements merged.
    pub duplicates: Counts,
    pub distinct: Counts,
    /// The statements judged wrongly: (id, the memory it repeats, the memory found).
    pub duplicate_errors: Vec<(String, Option<String>, Option<String>)>,
    /// The queries judged wrongly: (id, what recall returned in its first three).
    pub recall_errors: Vec<(String, Vec<String>)>,
    /// Sources: passages kept that are relevant / all kept for finding queries; passages
    /// kept for foreign queries.
    pub sources_kept: usize,
    pub sources_relevant: usize,
    pub sources_noise: usize,
    pub recall_latency: super::metrics::Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelResult {
    pub model_id: String,
    pub model_dir: String,
    pub languages: Vec<LanguageResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RelevanceReport {
    pub data: String,
    pub operating_points: mnemo::config::RelevanceSettings,
    pub models: Vec<ModelResult>,
    pub elapsed_secs: f64,
}

#[derive(Debug, Clone)]
pub struct RelevanceOptions {
    pub data: PathBuf,
    pub out_dir: PathBuf,
    pub settings: Settings,
    /// Embedders to measure (model directories); empty: the configured one.
    pub model_dirs: Vec<PathBuf>,
    /// Where to write the features of every pair (JSON lines), if anywhere.
    pub features: Option<PathBuf>,
}

pub struct RelevanceSummary {
    pub table: String,
}

// --- the run --------------------------------------------------------------------------------

pub async fn run_relevance(options: RelevanceOptions) -> anyhow::Result<RelevanceSummary> {
    let started = Instant::now();
    let sets = RelevanceSet::load_dir(&options.data)?;
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("creating {}", options.out_dir.display()))?;
    let mut features = match &options.features {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let model_dirs = if options.model_dirs.is_empty() {
        vec![options.settings.embedder.model_dir.clone()]
    } else {
        options.model_dirs.clone()
    };
    let mut models = Vec::new();
    for model_dir in model_dirs {
        let mut settings = options.settings.clone();
        settings.embedder.model_dir = model_dir.clone();
        let mut languages = Vec::new();
        let mut model_id = String::new();
        for set in &sets {
            let mut result = LanguageResult {
                language: set.language.clone(),
                ..LanguageResult::default()
            };
            let mut latencies = Vec::new();
            for user in &set.users {
                let root = options.out_dir.join("scratch");
                super::prepare_scratch(&root, &options.out_dir)?;
                let scratch = Scratch::open(&root, &settings).await?;
                model_id = scratch.engine.embedder().model_id().to_string();
                let outcome = measure_user(
                    &scratch,
                    user,
                    &mut result,
                    &mut latencies,
                    features.as_mut().map(|w| w as &mut dyn Write),
                )
                .await;
                scratch.close().await;
                let _ = std::fs::remove_dir_all(&root);
                outcome.with_context(|| format!("{} with {}", user.id, model_dir.display()))?;
            }
            result.recall_latency = super::metrics::latency(&latencies);
            eprintln!(
                "relevance: {model_id} {} done ({:.0} s)",
                set.language,
                started.elapsed().as_secs_f64()
            );
            languages.push(result);
        }
        models.push(ModelResult {
            model_id,
            model_dir: model_dir.display().to_string(),
            languages,
        });
    }
    if let Some(mut writer) = features {
        writer.flush().context("writing the features")?;
    }
    let report = RelevanceReport {
        data: options.data.display().to_string(),
        operating_points: options.settings.memory.relevance,
        models,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    let table = render_table(&report);
    std::fs::write(
        options.out_dir.join("results.json"),
        serde_json::to_vec_pretty(&report)?,
    )
    .context("writing results.json")?;
    std::fs::write(options.out_dir.join("results.md"), &table).context("writing results.md")?;
    Ok(RelevanceSummary { table })
}

async fn measure_user(
    scratch: &Scratch,
    user: &SetUser,
    result: &mut LanguageResult,
    latencies: &mut Vec<f64>,
    mut features: Option<&mut (dyn Write + '_)>,
) -> anyhow::Result<()> {
    let measured = Measured::store(scratch, user).await?;
    for query in &user.queries {
        measured
            .query(query, result, latencies, features.as_deref_mut())
            .await?;
    }
    for request in &user.forget {
        measured
            .forget(request, result, features.as_deref_mut())
            .await?;
    }
    for statement in &user.duplicates {
        measured
            .duplicate(statement, result, features.as_deref_mut())
            .await?;
    }
    Ok(())
}

/// One user of the set, stored through the engine, and what measuring their decisions needs.
struct Measured<'a> {
    engine: &'a MemoryEngine,
    owner: store::UserId,
    stored: Vec<store::Memory>,
    /// The set's id of each stored memory.
    dataset_id: HashMap<MemoryId, String>,
    corpus: Corpus,
    model: String,
    points: mnemo::config::RelevanceSettings,
}

impl<'a> Measured<'a> {
    /// Creates the user and stores their memories, then waits for the indexes.
    async fn store(scratch: &'a Scratch, user: &SetUser) -> anyhow::Result<Self> {
        let engine = scratch.engine.as_ref();
        let owner = scratch
            .store
            .accounts()
            .create_user(&user.id, UserKind::Key)
            .await?
            .id;
        let mut dataset_id: HashMap<MemoryId, String> = HashMap::new();
        let mut stored = Vec::new();
        for memory in &user.memories {
            let kind = kind_of(&memory.kind).context("memory kind")?;
            let written = engine
                .add(
                    owner,
                    vec![NewMemory::from_user(kind, memory.content.trim(), 3)],
                )
                .await?;
            for row in written {
                dataset_id.insert(row.id, memory.id.clone());
                stored.push(row);
            }
        }
        super::scratch::settle(engine).await?;
        let corpus = Corpus::new(stored.iter().map(|m| Terms::of(&m.content)).collect());
        Ok(Self {
            engine,
            owner,
            stored,
            dataset_id,
            corpus,
            model: engine.embedder().model_id().to_string(),
            points: engine.settings().relevance,
        })
    }

    /// The set's id of a stored memory.
    fn name(&self, id: &MemoryId) -> String {
        self.dataset_id
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    /// Recall of one query (hits in the first three, or nothing for foreign questions), and
    /// every stored memory judged as a research passage for it.
    async fn query(
        &self,
        query: &SetQuery,
        result: &mut LanguageResult,
        latencies: &mut Vec<f64>,
        mut features: Option<&mut (dyn Write + '_)>,
    ) -> anyhow::Result<()> {
        let engine = self.engine;
        let asked = Instant::now();
        let response = engine
            .recall(
                self.owner,
                RecallRequest {
                    query: query.query.clone(),
                    k: Some(K),
                    decay: true,
                    ..RecallRequest::default()
                },
            )
            .await?;
        latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
        let recalled: Vec<String> = response
            .results
            .iter()
            .map(|r| self.name(&r.memory.id))
            .collect();
        let relevant: BTreeSet<&str> = query.relevant.iter().map(String::as_str).collect();
        let counts = result.recall.entry(query.query_type.clone()).or_default();
        let right = if EMPTY.contains(&query.query_type.as_str()) {
            recalled.is_empty()
        } else {
            recalled
                .iter()
                .take(HITS_AT)
                .any(|id| relevant.contains(id.as_str()))
        };
        counts.add(right);
        if !right {
            let first = recalled.iter().take(HITS_AT).cloned().collect();
            result.recall_errors.push((query.id.clone(), first));
        }
        // Sources and features: every memory read as a passage for the query.
        let profile = engine.query_profile(&query.query).await?;
        for (memory, terms) in self.stored.iter().zip(self.corpus.texts()) {
            let id = self.name(&memory.id);
            let cosine = mnemo::memory::relevance::cosine(profile.vector(), &memory.embedding);
            let coverage = self.corpus.coverage(profile.words(), terms);
            let score = engine.relevance().score(&profile, cosine, coverage, false);
            let label = relevant.contains(id.as_str());
            if score >= self.points.source {
                if FINDING.contains(&query.query_type.as_str()) {
                    result.sources_kept += 1;
                    result.sources_relevant += usize::from(label);
                } else {
                    result.sources_noise += 1;
                }
            }
            if let Some(writer) = features.as_deref_mut() {
                let line = serde_json::json!({
                    "model": self.model, "language": result.language, "decision": "recall",
                    "query": query.id, "type": query.query_type, "memory": id,
                    "label": label, "z": profile.z(cosine), "cosine": cosine,
                    "coverage": coverage, "share": terms.coverage(profile.words()),
                    "turn": false, "han": result.language == "zh", "score": score,
                });
                writeln!(writer, "{line}")?;
            }
        }
        Ok(())
    }

    /// What one forget request's preview would delete: its targets, and any bystander.
    async fn forget(
        &self,
        request: &SetForget,
        result: &mut LanguageResult,
        features: Option<&mut (dyn Write + '_)>,
    ) -> anyhow::Result<()> {
        let engine = self.engine;
        let preview = engine.forget_preview(self.owner, &request.request).await?;
        let targets: BTreeSet<&str> = request.targets.iter().map(String::as_str).collect();
        result.forget_targets += targets.len();
        for found in &preview {
            let id = self.name(&found.memory.id);
            result.forget_deleted += 1;
            if targets.contains(id.as_str()) {
                result.forget_correct += 1;
            } else {
                result
                    .forget_bystanders
                    .push(format!("{}: {id}", request.id));
            }
        }
        if let Some(writer) = features {
            let subject = forget_subject(&request.request);
            let profile = engine.query_profile(&subject).await?;
            for (memory, terms) in self.stored.iter().zip(self.corpus.texts()) {
                let id = self.name(&memory.id);
                let cosine = mnemo::memory::relevance::cosine(profile.vector(), &memory.embedding);
                let coverage = self.corpus.coverage(profile.words(), terms);
                let line = serde_json::json!({
                    "model": self.model, "language": result.language, "decision": "forget",
                    "query": request.id, "type": "forget", "memory": id,
                    "label": targets.contains(id.as_str()), "z": profile.z(cosine),
                    "coverage": coverage, "share": terms.coverage(profile.words()),
                    "han": result.language == "zh",
                    "score": engine.relevance().forget_score(
                        &profile, cosine, terms.coverage(profile.words())),
                });
                writeln!(writer, "{line}")?;
            }
        }
        Ok(())
    }

    /// Whether a restatement is caught as the memory it repeats, and a new statement is not.
    async fn duplicate(
        &self,
        statement: &SetDuplicate,
        result: &mut LanguageResult,
        features: Option<&mut (dyn Write + '_)>,
    ) -> anyhow::Result<()> {
        let engine = self.engine;
        let kind = MemoryKind::Fact;
        let new = NewMemory::from_user(kind, statement.content.trim(), 3);
        if let Some(writer) = features {
            let vector = engine.embed_one(&new.content).await?.vector;
            for memory in &self.stored {
                let id = self.name(&memory.id);
                let found = engine.relevance().duplicate_features(
                    (&new.content, &vector),
                    (&memory.content, &memory.embedding),
                );
                let line = serde_json::json!({
                    "model": self.model, "language": result.language, "decision": "duplicate",
                    "query": statement.id, "type": "duplicate", "memory": id,
                    "label": statement.same_as.as_deref() == Some(id.as_str()),
                    "values_differ": mnemo::memory::values_differ(&memory.content, &new.content),
                    "z": found.z, "coverage": found.coverage, "share": found.coverage,
                    "han": found.han,
                });
                writeln!(writer, "{line}")?;
            }
        }
        let found = engine.find_duplicate(self.owner, &new).await?;
        let found = found.map(|memory| self.name(&memory.id));
        let right = match &statement.same_as {
            Some(same) => {
                let caught = found.as_deref() == Some(same.as_str());
                result.duplicates.add(caught);
                caught
            }
            None => {
                result.distinct.add(found.is_some());
                found.is_none()
            }
        };
        if !right {
            result
                .duplicate_errors
                .push((statement.id.clone(), statement.same_as.clone(), found));
        }
        Ok(())
    }
}

/// The server's memory engine over a scratch SQLite store.
struct Scratch {
    engine: Arc<MemoryEngine>,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
}

impl Scratch {
    async fn open(dir: &Path, settings: &Settings) -> anyhow::Result<Self> {
        let settings = super::scratch::scratch_settings(settings, dir);
        let url = format!("sqlite://{}?mode=rwc", dir.join("mnemo.db").display());
        let store = store::connect(&url, 4, settings.database.acquire_timeout()).await?;
        let shutdown = CancellationToken::new();
        let engine = mnemo::startup::open_memory(&settings, store.clone(), shutdown.clone())
            .await
            .context("opening the memory engine")?;
        Ok(Self {
            engine,
            store,
            shutdown,
        })
    }

    async fn close(self) {
        super::scratch::close_scratch(&self.engine, &self.shutdown).await;
        self.store.close().await;
    }
}

// --- the table ------------------------------------------------------------------------------

fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        "–".to_string()
    } else {
        format!("{:.1}", 100.0 * part as f64 / whole as f64)
    }
}

pub fn render_table(report: &RelevanceReport) -> String {
    let points = &report.operating_points;
    let mut out = format!(
        "# mnemo eval relevance\n\nSets in `{}`. Operating points: gate {}, tail {}, forget {}, duplicate {}, source {}.\n\n",
        report.data, points.gate, points.tail, points.forget, points.duplicate, points.source
    );
    out.push_str("| model | lang | paraphrase hits@3 | lexical hits@3 | category hits@3 | foreign empty | near-miss empty | forget precision | forget recall | bystanders deleted | duplicates caught | distinct merged | source precision | noise sources | recall p50 ms |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for model in &report.models {
        for language in &model.languages {
            let cell = |kind: &str| {
                language.recall.get(kind).map_or_else(
                    || "–".to_string(),
                    |c| format!("{} ({}/{})", percent(c.hit, c.n), c.hit, c.n),
                )
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {}/{} | {} | {} | {:.1} |\n",
                model.model_id,
                language.language,
                cell("paraphrase"),
                cell("lexical"),
                cell("category"),
                cell("foreign"),
                cell("near_miss"),
                percent(language.forget_correct, language.forget_deleted),
                percent(language.forget_correct, language.forget_targets),
                language.forget_bystanders.len(),
                language.duplicates.hit,
                language.duplicates.n,
                language.distinct.hit,
                language.distinct.n,
                percent(language.sources_relevant, language.sources_kept),
                language.sources_noise,
                language.recall_latency.p50_ms,
            ));
        }
    }
    out.push_str(&format!("\n{:.0} s in all.\n", report.elapsed_secs));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_sets() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/relevance")
    }

    #[test]
    fn the_sets_in_the_repository_load_and_are_consistent() {
        let sets = RelevanceSet::load_dir(&repo_sets()).unwrap();
        let languages: Vec<&str> = sets.iter().map(|s| s.language.as_str()).collect();
        assert_eq!(languages, ["en", "zh"]);
        let queries: usize = sets
            .iter()
            .flat_map(|set| &set.users)
            .map(|user| user.queries.len())
            .sum();
        assert!(queries >= 150, "{queries} queries");
        for set in &sets {
            for user in &set.users {
                assert_eq!(user.memories.len(), 30, "{}", user.id);
                assert!(
                    user.forget.iter().any(|f| f.targets.is_empty()),
                    "{}",
                    user.id
                );
            }
        }
    }

    /// The whole evaluation on one English user with MiniLM, features included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relevance_eval_end_to_end_on_one_user() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("sets");
        std::fs::create_dir_all(&data).unwrap();
        let mut set: serde_json::Value =
            serde_json::from_slice(&std::fs::read(repo_sets().join("en.json")).unwrap()).unwrap();
        set["users"] = serde_json::Value::Array(vec![set["users"][0].clone()]);
        std::fs::write(data.join("en.json"), set.to_string()).unwrap();
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2");
        let features = dir.path().join("features.jsonl");
        let summary = run_relevance(RelevanceOptions {
            data: data.clone(),
            out_dir: dir.path().join("out"),
            settings: Settings::default(),
            model_dirs: vec![model],
            features: Some(features.clone()),
        })
        .await
        .unwrap();
        let table = &summary.table;
        assert!(table.contains("| all-MiniLM-L6-v2 | en |"), "{table}");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("out/results.json")).unwrap())
                .unwrap();
        let english = &report["models"][0]["languages"][0];
        let user = &set["users"][0];
        let count = |kind: &str| {
            user["queries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|q| q["type"] == kind)
                .count()
        };
        assert_eq!(english["recall"]["paraphrase"]["n"], count("paraphrase"));
        assert_eq!(english["recall"]["foreign"]["n"], count("foreign"));
        let targets: usize = user["forget"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["targets"].as_array().unwrap().len())
            .sum();
        assert_eq!(english["forget_targets"], targets);
        let lines = std::fs::read_to_string(&features).unwrap();
        let decisions: BTreeSet<String> = lines
            .lines()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["decision"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            decisions.into_iter().collect::<Vec<_>>(),
            ["duplicate", "forget", "recall"]
        );
        assert!(!dir.path().join("out/scratch").exists());
    }
}
