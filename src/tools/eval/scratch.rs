//! One scratch store per (memory unit, conversation): ingestion through the real write path
//! and queries through the real recall.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use indicatif::ProgressBar;
use tokio_util::sync::CancellationToken;

use mnemo::config::Settings;
use mnemo::llm::embed::Embedder;
use mnemo::memory::rank::RecallMode;
use mnemo::memory::{MAX_MEMORY_CHARS, MemoryEngine};
use mnemo::store::{self, MemoryKind, MemorySource, NewMemory, Role, Store, Trust, UserKind};

use super::*;

pub(super) struct Scratch {
    pub(super) engine: Arc<MemoryEngine>,
    pub(super) store: Arc<dyn Store>,
    pub(super) shutdown: CancellationToken,
}

impl Scratch {
    /// SQLite + Qdrant Edge + tantivy in `dir`, laid out as `MemoryEngine::open` lays out a
    /// data directory, sharing one loaded embedder.
    pub(super) async fn open(
        dir: &Path,
        settings: &Settings,
        embedder: Arc<dyn Embedder>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let url = format!("sqlite://{}?mode=rwc", dir.join("mnemo.db").display());
        let store = store::connect(
            &url,
            settings.database.max_connections.max(2),
            settings.database.acquire_timeout(),
        )
        .await?;
        let shutdown = CancellationToken::new();
        let engine = mnemo::startup::open_memory_with(
            &scratch_settings(settings, dir),
            store.clone(),
            embedder,
            shutdown.clone(),
        )
        .await?;
        Ok(Self {
            engine,
            store,
            shutdown,
        })
    }

    pub(super) async fn close(self) {
        close_scratch(&self.engine, &self.shutdown).await;
        self.store.close().await;
    }
}

/// The settings of a scratch store in `dir`: its data directory there and, on a Qdrant server,
/// a collection of its own (each scratch's memories and statistics apart, as in its own data
/// directory).
pub fn scratch_settings(settings: &Settings, dir: &Path) -> Settings {
    let mut settings = settings.clone();
    settings.data_dir = dir.to_path_buf();
    if settings.qdrant.url.is_some() {
        settings.qdrant.collection = format!(
            "{}_eval_{}",
            settings.qdrant.collection,
            uuid::Uuid::now_v7().simple()
        );
    }
    settings
}

/// Stops a scratch engine; on a Qdrant server its points go too (the collection stays, empty).
pub async fn close_scratch(engine: &MemoryEngine, shutdown: &CancellationToken) {
    shutdown.cancel();
    engine.close(Duration::from_secs(10)).await;
    if engine.indexer().vector().name() == "qdrant"
        && let Err(error) = engine.indexer().vector().clear().await
    {
        eprintln!("clearing the scratch collection failed: {error}");
    }
}

/// Waits until everything written is recallable, then rebuilds the keyword index from SQL
/// (`mnemo reindex`'s path), so BM25 ties break the same way on every run.
pub(super) async fn settle(engine: &MemoryEngine) -> anyhow::Result<()> {
    if !engine.wait_recallable(Duration::from_secs(600)).await? {
        bail!("the indexes did not catch up with the memory log within 10 minutes");
    }
    engine.indexer().rebuild(|_, _| {}).await?;
    Ok(())
}

/// A conversation as stored: its user, how many memories, and the clock for its questions.
#[derive(Debug, Clone)]
pub(super) struct Ingested {
    /// Index into `Env::conversations`.
    pub(super) conversation: usize,
    pub(super) unit: MemoryUnit,
    pub(super) user: store::UserId,
    pub(super) memories: usize,
    /// The day after the last session: "now" for decay.
    pub(super) now: DateTime<Utc>,
    /// Message ids (what product memories cite) to the dataset's turn ids.
    pub(super) turn_of_message: std::collections::HashMap<String, String>,
}

/// Writes the conversation as one fresh user's history (threads, messages, turn memories),
/// waits until it is recallable, and rebuilds the indexes from SQL (see the module docs).
pub(super) async fn ingest(
    scratch: &Scratch,
    env: &Env<'_>,
    index: usize,
    unit: MemoryUnit,
    bar: &ProgressBar,
) -> anyhow::Result<Ingested> {
    let conversation = &env.conversations[index];
    let store = &scratch.store;
    let user = store
        .accounts()
        .create_user(
            &format!("{}-{}", slug(env.dataset), slug(&conversation.id)),
            UserKind::Key,
        )
        .await?;
    if unit == MemoryUnit::Product {
        return ingest_as_the_product(scratch, env, index, user.id, bar).await;
    }
    let mut memories = 0usize;
    // Memories are added in batches that span sessions, so the embedder can group texts of
    // similar length (see `EvalEmbedder`); each memory keeps its own session's thread and date.
    let mut pending: Vec<NewMemory> = Vec::new();
    let mut pending_turns = 0u64;
    for (position, session) in conversation.sessions.iter().enumerate() {
        let title = format!(
            "{} {} ({})",
            conversation.id,
            session.id,
            session.date.format("%-d %B %Y")
        );
        let thread = store.user(user.id).create_thread(&title, false).await?;
        for turn in session.turns.iter().filter(|t| !t.text.trim().is_empty()) {
            store
                .user(user.id)
                .append_message(
                    thread.id,
                    turn.role,
                    &turn.text,
                    None,
                    mnemo::store::Message::trust_of(turn.role),
                )
                .await?;
        }
        if let (MemoryUnit::Facts, Some((model, retries))) = (unit, &env.facts) {
            let date = session.date.format("%-d %B %Y").to_string();
            let turns: Vec<(String, String, String)> = session
                .turns
                .iter()
                .filter(|t| !t.text.trim().is_empty())
                .map(|t| (t.id.clone(), t.speaker.clone(), t.text.clone()))
                .collect();
            let facts = answer::extract_facts(model, *retries, &date, &turns)
                .await
                .map_err(|error| {
                    anyhow::anyhow!("extracting the facts of {}: {}", session.id, error.message)
                })?;
            pending.extend(facts.into_iter().map(|(content, refs)| {
                NewMemory {
                    kind: MemoryKind::Fact,
                    content: mnemo::text::prefix(&format!("[{date}] {content}"), MAX_MEMORY_CHARS)
                        .to_string(),
                    source: MemorySource::User,
                    trust: Trust::User,
                    importance: TURN_IMPORTANCE,
                    thread_id: Some(thread.id),
                    source_refs: refs,
                    created_at: Some(session.date),
                    supersedes: None,
                }
            }));
        } else {
            pending.extend(
                unit.memories(session)
                    .into_iter()
                    .map(|(content, refs, turn)| {
                        let (source, trust) = match turn.role {
                            Role::User => (MemorySource::User, Trust::User),
                            _ => (MemorySource::Assistant, Trust::Assistant),
                        };
                        NewMemory {
                            kind: MemoryKind::Turn,
                            content: mnemo::text::prefix(&content, MAX_MEMORY_CHARS).to_string(),
                            source,
                            trust,
                            importance: TURN_IMPORTANCE,
                            thread_id: Some(thread.id),
                            source_refs: refs,
                            created_at: Some(session.date),
                            supersedes: None,
                        }
                    }),
            );
        }
        pending_turns += session.turns.len() as u64;
        let last = position + 1 == conversation.sessions.len();
        if pending.len() >= ADD_BATCH || (last && !pending.is_empty()) {
            memories += pending.len();
            scratch
                .engine
                .add(user.id, std::mem::take(&mut pending))
                .await?;
        }
        if pending.is_empty() {
            bar.inc(std::mem::take(&mut pending_turns));
        }
    }
    bar.inc(pending_turns);
    settle(&scratch.engine).await?;
    let last = conversation
        .sessions
        .iter()
        .map(|session| session.date)
        .max()
        .unwrap_or(DateTime::UNIX_EPOCH);
    Ok(Ingested {
        conversation: index,
        unit,
        user: user.id,
        memories,
        now: last + chrono::Duration::days(1),
        turn_of_message: Default::default(),
    })
}

/// The product's path: each session is a thread into which its turns are imported as a past
/// conversation (`MemoryWriter::import_conversation`, what `POST /v1/threads/{id}/import`
/// runs), with the speakers' names and the session's date; the memory writer's jobs then
/// write the turn memories and what the rules extract, exactly as for a user's import.
async fn ingest_as_the_product(
    scratch: &Scratch,
    env: &Env<'_>,
    index: usize,
    user: store::UserId,
    bar: &ProgressBar,
) -> anyhow::Result<Ingested> {
    let conversation = &env.conversations[index];
    let models = mnemo::llm::roles::Models::from_settings(&env.settings.llm);
    let writer = mnemo::memory::writer::MemoryWriter::new(
        scratch.store.clone(),
        scratch.engine.clone(),
        models,
    );
    let mut turn_of_message = std::collections::HashMap::new();
    for session in &conversation.sessions {
        let title = format!(
            "{} {} ({})",
            conversation.id,
            session.id,
            session.date.format("%-d %B %Y")
        );
        let thread = scratch
            .store
            .user(user)
            .create_thread(&title, false)
            .await?;
        let turns: Vec<&Turn> = session
            .turns
            .iter()
            .filter(|turn| !turn.text.trim().is_empty())
            .collect();
        if turns.is_empty() {
            continue;
        }
        let messages = turns
            .iter()
            .map(|turn| mnemo::store::NewMessage {
                role: turn.role,
                content: turn.text.clone(),
                author: Some(turn.speaker.clone()),
                created_at: Some(session.date),
            })
            .collect();
        let imported = writer
            .import_conversation(user, thread.id, messages)
            .await
            .map_err(|error| anyhow::anyhow!("importing {}: {error}", session.id))?;
        for (message, turn) in imported.messages.iter().zip(&turns) {
            turn_of_message.insert(message.to_string(), turn.id.clone());
        }
        while writer.work_one().await? {}
        bar.inc(session.turns.len() as u64);
    }
    let failed = scratch.store.maintenance().queue_stats().await?.failed;
    if failed > 0 {
        bail!(
            "{failed} memory jobs failed while importing {}",
            conversation.id
        );
    }
    settle(&scratch.engine).await?;
    let memories = scratch
        .store
        .user(user)
        .all_memories(&mnemo::store::MemoryFilter::default())
        .await?
        .len();
    let last = conversation
        .sessions
        .iter()
        .map(|session| session.date)
        .max()
        .unwrap_or(DateTime::UNIX_EPOCH);
    Ok(Ingested {
        conversation: index,
        unit: MemoryUnit::Product,
        user,
        memories,
        now: last + chrono::Duration::days(1),
        turn_of_message,
    })
}

/// Asks every question of the conversation with every probe; returns how many recalls ran.
pub(super) async fn query(
    scratch: &Scratch,
    ingested: &Ingested,
    probes: &[Probe],
    env: &Env<'_>,
    sink: &mut Sink,
    bar: &ProgressBar,
) -> anyhow::Result<usize> {
    let plan = &env.plan;
    let unit = ingested.unit;
    let conversation = &env.conversations[ingested.conversation];
    let mut recalls = 0usize;
    for question in &conversation.questions {
        let evidence: BTreeSet<String> = question.evidence.iter().cloned().collect();
        for &probe in probes {
            let settings = plan.settings(probe);
            let request = probe.request(&question.text, plan.max_k, plan.candidates);
            let started = Instant::now();
            let response = scratch
                .engine
                .recall_at(ingested.user, request, &settings, ingested.now)
                .await
                .with_context(|| format!("recall for {}", question.id))?;
            // The query vector is cached across probes; its one real embedding time is
            // counted in every probe that uses vectors.
            let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0 - response.timings.embed_ms
                + if probe.retrieval.mode() == RecallMode::Keyword {
                    0.0
                } else {
                    env.embedder.embed_ms(question.text.trim()).unwrap_or(0.0)
                };
            recalls += 1;
            bar.inc(1);
            if let Some((models, answer_unit, answer_k)) = &env.answers
                && *answer_unit == unit
                && probe.retrieval == Retrieval::Hybrid
                && !probe.sweep
                && !answer::UNSCORED_CATEGORIES.contains(&question.category.as_str())
            {
                let given = &response.results[..response.results.len().min(*answer_k)];
                match answer::answer_and_judge(models, &question.text, &question.answer, given)
                    .await
                {
                    Ok((answer, correct, f1)) => {
                        sink.answers.add(&question.category, correct, f1);
                        if let Some(file) = sink.answers_file.as_mut() {
                            let line = serde_json::json!({
                                "question": question.id, "category": question.category,
                                "text": question.text, "gold": question.answer,
                                "answer": answer, "correct": correct, "f1": f1,
                            });
                            writeln!(file, "{line}").context("writing answers.jsonl")?;
                        }
                    }
                    Err(error) => {
                        sink.answers.failures += 1;
                        tracing::warn!(question = %question.id, error = %error.message, "answering failed");
                    }
                }
            }
            let results = &response.results;
            let top = &results[..results.len().min(plan.tokens_k)];
            if question.abstain {
                // Nothing answers it: not a recall question; recalling nothing is right.
                for &credit in unit.credits() {
                    let accumulator = sink
                        .accumulators
                        .entry(RunKey::new(unit, credit, probe))
                        .or_insert_with(|| Accumulator::new(probe, plan));
                    accumulator.abstain_asked += 1;
                    accumulator.abstain_nothing += usize::from(results.is_empty());
                    accumulator.abstain_returned += top.len();
                }
                continue;
            }
            let words: usize = top.iter().map(|r| metrics::words(&r.memory.content)).sum();
            let wordpieces: Option<usize> = sink
                .wordpieces
                .as_ref()
                .map(|counter| top.iter().map(|r| counter.count(&r.memory.content)).sum());
            for &credit in unit.credits() {
                let refs: Vec<Vec<String>> = results
                    .iter()
                    .map(|r| {
                        let refs = credited(&r.memory.source_refs, credit);
                        if ingested.turn_of_message.is_empty() {
                            refs
                        } else {
                            refs.iter()
                                .filter_map(|id| ingested.turn_of_message.get(id).cloned())
                                .collect()
                        }
                    })
                    .collect();
                let score = metrics::score(&evidence, &refs, &plan.ks);
                let key = RunKey::new(unit, credit, probe);
                let accumulator = sink
                    .accumulators
                    .entry(key)
                    .or_insert_with(|| Accumulator::new(probe, plan));
                if let Some((older, newer)) = question.order.as_ref().and_then(|o| o.ranks(&refs)) {
                    accumulator.order_asked += 1;
                    accumulator.order_both += usize::from(older.is_some() && newer.is_some());
                    accumulator.order_newer_first += usize::from(match (older, newer) {
                        (Some(older), Some(newer)) => newer < older,
                        (None, Some(_)) => true,
                        _ => false,
                    });
                }
                accumulator.aggregate.add(&question.category, &score);
                accumulator.latencies_ms.push(elapsed_ms);
                accumulator.returned += top.len();
                accumulator.words += words;
                accumulator.wordpieces = match (accumulator.wordpieces, wordpieces) {
                    (Some(sum), Some(count)) => Some(sum + count),
                    _ => None,
                };
                if probe.retrieval == Retrieval::Ungated {
                    let label = |refs: &Vec<String>| refs.iter().any(|id| evidence.contains(id));
                    let labels: Vec<bool> = refs.iter().map(label).collect();
                    write_features(sink, env, &question.id, false, results, &labels)?;
                }
                if !probe.sweep {
                    let line = serde_json::json!({
                        "run": key.label(probe.rrf_k, probe.gate, plan.ablation(probe)),
                        "question": question.id,
                        "category": question.category,
                        "evidence": question.evidence,
                        "retrieved": refs.iter().take(plan.tokens_k).collect::<Vec<_>>(),
                        "recall": plan.ks.iter().copied().zip(score.recall.iter().copied()).collect::<BTreeMap<usize, f64>>(),
                        "ndcg": plan.ks.iter().copied().zip(score.ndcg.iter().copied()).collect::<BTreeMap<usize, f64>>(),
                    });
                    writeln!(sink.per_question, "{line}").context("writing per_question.jsonl")?;
                }
            }
        }
    }
    recalls += ask_foreign(scratch, ingested, probes, env, sink, bar).await?;
    Ok(recalls)
}

/// Writes the relevance features of `results` (recalled for `question`, of another
/// conversation when `foreign`) when `--features` asked for them.
fn write_features(
    sink: &mut Sink,
    env: &Env<'_>,
    question: &str,
    foreign: bool,
    results: &[mnemo::memory::rank::Recalled],
    labels: &[bool],
) -> anyhow::Result<()> {
    let Some(file) = sink.features.as_mut() else {
        return Ok(());
    };
    for (result, label) in results.iter().zip(labels) {
        let signals = &result.signals;
        let (Some(z), Some(_)) = (signals.z, signals.relevance) else {
            continue;
        };
        let line = serde_json::json!({
            "model": env.embedder.model_id(), "language": "locomo", "decision": "recall",
            "query": format!("locomo/{question}"),
            "type": if foreign { "foreign" } else { "locomo" },
            "memory": result.memory.id.to_string(), "label": label,
            "z": z, "coverage": signals.coverage, "share": signals.coverage,
            "turn": result.memory.kind == mnemo::store::MemoryKind::Turn,
        });
        writeln!(file, "{line}").context("writing the features")?;
    }
    Ok(())
}

/// Asks the questions of the next conversation, which this one knows nothing about, with the
/// fused probes: how often recall rightly returns nothing (the query gate), and how much.
async fn ask_foreign(
    scratch: &Scratch,
    ingested: &Ingested,
    probes: &[Probe],
    env: &Env<'_>,
    sink: &mut Sink,
    bar: &ProgressBar,
) -> anyhow::Result<usize> {
    let plan = &env.plan;
    if env.conversations.len() < 2 {
        return Ok(0);
    }
    let foreign = &env.conversations[(ingested.conversation + 1) % env.conversations.len()];
    let mut recalls = 0;
    for &probe in probes.iter().filter(|p| p.asks_foreign()) {
        let settings = plan.settings(probe);
        let (mut nothing, mut returned) = (0usize, 0usize);
        for question in &foreign.questions {
            let request = probe.request(&question.text, plan.tokens_k, plan.candidates);
            let response = scratch
                .engine
                .recall_at(ingested.user, request, &settings, ingested.now)
                .await
                .with_context(|| format!("recall for {} (foreign)", question.id))?;
            nothing += usize::from(response.results.is_empty());
            returned += response.results.len();
            if probe.retrieval == Retrieval::Ungated {
                let labels = vec![false; response.results.len()];
                write_features(sink, env, &question.id, true, &response.results, &labels)?;
            }
            recalls += 1;
            bar.inc(1);
        }
        for &credit in ingested.unit.credits() {
            let accumulator = sink
                .accumulators
                .entry(RunKey::new(ingested.unit, credit, probe))
                .or_insert_with(|| Accumulator::new(probe, plan));
            accumulator.foreign_asked += foreign.questions.len();
            accumulator.foreign_nothing += nothing;
            accumulator.foreign_returned += returned;
        }
    }
    Ok(recalls)
}

pub(super) fn credited(refs: &[String], credit: Credit) -> Vec<String> {
    match credit {
        Credit::AllRefs => refs.to_vec(),
        Credit::Centre => refs.iter().take(1).cloned().collect(),
    }
}
