//! The results of an evaluation and their three renderings: `results.json` (everything),
//! `results.md` (tables beside the dataset's reference points) and `recall.svg` (recall@k
//! against k, one line per memory unit × retrieval variant, hand-written SVG).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;

use mnemo::config::MemorySettings;

use super::metrics::{Latency, Means};
use super::{Conversation, Dataset, EvalOptions, EvalSummary, Reference};

/// One memory unit's ingestion.
#[derive(Debug, Clone, Serialize)]
pub struct UnitResult {
    pub unit: String,
    pub description: String,
    /// `ok`, or why the unit was skipped.
    pub status: String,
    pub memories: usize,
    pub ingest_secs: f64,
    pub query_secs: f64,
    pub recalls: usize,
}

/// One row: a memory unit (with a crediting rule) × a retrieval variant.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// `dated/hybrid`, `window-centre/bm25`, `dated/hybrid rrf_k=10` (sweep rows).
    pub key: String,
    /// `raw`, `dated`, `window` (credited with all refs) or `window-centre`.
    pub unit: String,
    pub credit: String,
    /// Each returned memory credits at most one turn, so R@k compares at equal k.
    pub single_turn_credit: bool,
    pub retrieval: String,
    /// The RRF constant (fused retrievals only).
    pub rrf_k: Option<f64>,
    pub decay: bool,
    /// A row of a sweep (RRF constant, query gate) rather than of the main tables.
    pub sweep: bool,
    /// The query gate and floor thresholds recalled with (fused retrievals only).
    pub gate: Option<super::GatePoint>,
    /// What an `--ablate` row changed from the shipped memory settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ablation: Option<String>,
    pub overall: Means,
    pub categories: BTreeMap<String, Means>,
    /// Wall time of one `recall_at` call, query embedding included.
    pub latency: Latency,
    /// What the first `tokens_k` results hold, per question on average.
    pub tokens_k: usize,
    pub returned_at_tokens_k: f64,
    pub words_at_tokens_k: f64,
    pub wordpieces_at_tokens_k: Option<f64>,
    /// Questions of another conversation (fused retrievals only): what the relevance gate
    /// does with queries no memory is about.
    pub foreign: Option<Foreign>,
    /// The dataset's questions that nothing in the history answers (BEAM's abstention): the
    /// share that recalled nothing.
    pub abstention: Option<Foreign>,
    /// Questions naming an earlier statement and the later one that updates or contradicts
    /// it (BEAM): how often recall ranks the later first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_first: Option<NewestFirst>,
}

/// Does recall put the later of two statements first?
#[derive(Debug, Clone, Serialize)]
pub struct NewestFirst {
    pub asked: usize,
    /// Share where the later statement ranked above the earlier one, or was found alone.
    pub newer_first: f64,
    /// Share where both were found.
    pub both_found: f64,
}

/// Questions asked of a conversation that knows nothing about them.
#[derive(Debug, Clone, Serialize)]
pub struct Foreign {
    pub asked: usize,
    /// Share that returned no memory at all.
    pub nothing: f64,
    /// Memories returned per question (of at most `tokens_k`).
    pub returned: f64,
}

impl RunResult {
    /// The number a run is ranked by: the mean of R@5 and R@10 (or the largest k's recall).
    pub fn headline(&self) -> f64 {
        match (self.overall.recall.get(&5), self.overall.recall.get(&10)) {
            (Some(r5), Some(r10)) => (r5 + r10) / 2.0,
            _ => self
                .overall
                .recall
                .values()
                .next_back()
                .copied()
                .unwrap_or(0.0),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CategoryCount {
    pub name: String,
    pub questions: usize,
}

/// Settings that shape the results.
#[derive(Debug, Clone, Serialize)]
pub struct SettingsUsed {
    /// How the signals were fused (`memory.fusion`).
    pub fusion: String,
    pub rrf_k: f64,
    pub candidates: usize,
    pub decay_half_life_days: f64,
    pub decay_floor: f64,
    pub dedupe_cosine: f32,
    pub turn_importance: u8,
    pub embedder_model: String,
    pub dimension: usize,
}

/// The query gate and floor sweep: the product's row, the sweep rows and the ungated
/// ablation, with what each costs in recall and what it keeps from foreign questions.
fn gate_sweep(report: &Report, out: &mut String) {
    let mut rows: Vec<(&RunResult, super::GatePoint)> = report
        .runs
        .iter()
        .filter(|run| {
            run.unit == "product"
                && (run.key == "product"
                    || (run.sweep && run.gate.is_some())
                    || run.retrieval == "hybrid+decay-ungated")
        })
        .filter_map(|run| Some((run, run.gate?)))
        .collect();
    if !rows.iter().any(|(run, _)| run.sweep) {
        return;
    }
    rows.sort_by_key(|(_, gate)| gate.order());
    out.push_str(
        "\n## Relevance operating points (product, hybrid + decay)\n\n\
         A recall returns nothing unless a candidate is at least `gate` likely about the query \
         (`memory::relevance`); past it, results below `tail` are dropped. `foreign nothing` is \
         the share of another conversation's questions that returned no memory, `unanswerable \
         nothing` of the dataset's own questions nothing answers (BEAM's abstention).\n\n",
    );
    out.push_str(
        "| gate | tail | R@5 | R@10 | multi-hop R@10 | foreign nothing | foreign returned | unanswerable nothing |\n",
    );
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (run, gate) in rows {
        let mark = if run.key == "product" {
            " (setting)"
        } else {
            ""
        };
        let (nothing, returned) = run
            .foreign
            .as_ref()
            .map(|f| {
                (
                    format!("{:.1} %", f.nothing * 100.0),
                    format!("{:.1}", f.returned),
                )
            })
            .unwrap_or_else(|| ("–".into(), "–".into()));
        let multi_hop = run
            .categories
            .get("multi-hop")
            .map(|means| pct_at(&means.recall, 10))
            .unwrap_or_else(|| "–".into());
        let unanswerable = run
            .abstention
            .as_ref()
            .map(|a| format!("{:.1} %", a.nothing * 100.0))
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(
            out,
            "| {}{mark} | {} | {} | {} | {multi_hop} | {nothing} | {returned} | {unanswerable} |",
            number(gate.gate),
            number(gate.tail),
            pct_at(&run.overall.recall, 5),
            pct_at(&run.overall.recall, 10),
        );
    }
}

/// The fusion in words, for the report's header.
fn fusion_label(memory: &MemorySettings) -> String {
    let fusion = &memory.fusion;
    let method = match fusion.method {
        mnemo::config::FusionMethod::Rrf => format!("RRF k = {}", number(memory.rrf_k)),
        mnemo::config::FusionMethod::Score => "scores over each list's best, summed".to_string(),
        mnemo::config::FusionMethod::MinMax => "min-max per list, summed".to_string(),
    };
    format!(
        "{method} (weights: vector {}, BM25 {}, context vector {}, context BM25 {}; gate cosine {} / coverage {}, floor {} / {})",
        number(fusion.vector_weight),
        number(fusion.bm25_weight),
        number(fusion.context_vector_weight),
        number(fusion.context_bm25_weight),
        number(fusion.gate_cosine()),
        number(fusion.gate_coverage),
        number(fusion.floor_cosine()),
        number(fusion.floor_coverage),
    )
}

/// Everything an evaluation measured (`results.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub dataset: String,
    pub data_path: String,
    pub data_sha256: String,
    pub generated_at: DateTime<Utc>,
    pub elapsed_secs: f64,
    /// `release` or `debug`: latencies and run time depend on it.
    pub build: String,
    pub ks: Vec<usize>,
    pub settings: SettingsUsed,
    /// What `wordpieces_at_tokens_k` counts (or why it is absent).
    pub token_count: String,
    pub conversations: usize,
    pub questions: usize,
    pub categories: Vec<CategoryCount>,
    pub units: Vec<UnitResult>,
    /// Main rows first, then the RRF sweep rows (`sweep: true`).
    pub runs: Vec<RunResult>,
    /// The best main run whose memories credit one turn each, by mean of R@5 and R@10.
    pub best: Option<String>,
    /// The RRF constant that scored best (same measure) for the best run's memory unit.
    pub recommended_rrf_k: Option<f64>,
    pub references: Vec<Reference>,
    pub notes: Vec<String>,
    /// `--answer`: LLM-judge accuracy and token F1 of answers from recalled memories.
    pub answers: Option<super::answer::AnswerReport>,
}

/// Facts about the run that the report records.
pub struct RunInfo<'a> {
    pub data_sha256: String,
    pub conversations: &'a [Conversation],
    pub ks: Vec<usize>,
    pub candidates: usize,
    pub tokens_k: usize,
    pub turn_importance: u8,
    pub embedder_model: String,
    pub dimension: usize,
    pub wordpiece_tokenizer: bool,
    /// Every conversation id of the dataset, to drop notes about those not evaluated.
    pub all_conversations: Vec<String>,
    pub elapsed_secs: f64,
}

impl Report {
    pub fn new(
        dataset: &dyn Dataset,
        options: &EvalOptions,
        info: RunInfo<'_>,
        units: Vec<UnitResult>,
        mut runs: Vec<RunResult>,
    ) -> Self {
        runs.sort_by_key(|run| run.sweep);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for question in info.conversations.iter().flat_map(|c| &c.questions) {
            *counts.entry(question.category.as_str()).or_default() += 1;
        }
        let categories = dataset
            .categories()
            .into_iter()
            .filter_map(|name| {
                let questions = counts.get(name.as_str()).copied()?;
                Some(CategoryCount { name, questions })
            })
            .collect();
        let best = runs
            .iter()
            .filter(|run| !run.sweep && run.single_turn_credit)
            .max_by(|a, b| a.headline().total_cmp(&b.headline()))
            .map(|run| run.key.clone());
        let rrf = options.settings.memory.fusion.method == mnemo::config::FusionMethod::Rrf;
        let recommended_rrf_k = best.as_ref().filter(|_| rrf).and_then(|key| {
            let unit = &runs.iter().find(|run| &run.key == key)?.unit;
            runs.iter()
                .filter(|run| &run.unit == unit && run.retrieval == "hybrid")
                .max_by(|a, b| {
                    a.headline()
                        .total_cmp(&b.headline())
                        .then_with(|| a.rrf_k.unwrap_or(0.0).total_cmp(&b.rrf_k.unwrap_or(0.0)))
                })
                .and_then(|run| run.rrf_k)
        });
        let evaluated: Vec<&str> = info.conversations.iter().map(|c| c.id.as_str()).collect();
        let skipped: Vec<&String> = info
            .all_conversations
            .iter()
            .filter(|id| !evaluated.contains(&id.as_str()))
            .collect();
        let about_skipped = |note: &String| {
            skipped.iter().any(|id| {
                note.strip_prefix(id.as_str())
                    .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('/'))
            })
        };
        let notes = dataset
            .notes()
            .into_iter()
            .filter(|note| !about_skipped(note))
            .collect();
        let memory = &options.settings.memory;
        Self {
            dataset: dataset.name().to_string(),
            data_path: options.data.display().to_string(),
            data_sha256: info.data_sha256,
            generated_at: Utc::now().trunc_subsecs(0),
            elapsed_secs: info.elapsed_secs,
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_string(),
            ks: info.ks,
            settings: SettingsUsed {
                fusion: fusion_label(memory),
                rrf_k: memory.rrf_k,
                candidates: info.candidates,
                decay_half_life_days: memory.decay_half_life_days,
                decay_floor: memory.decay_floor,
                dedupe_cosine: memory.dedupe_cosine,
                turn_importance: info.turn_importance,
                embedder_model: info.embedder_model,
                dimension: info.dimension,
            },
            token_count: if info.wordpiece_tokenizer {
                format!(
                    "BERT WordPiece tokens of the embedding model's tokenizer.json (no special tokens) over the content of the first {} results",
                    info.tokens_k
                )
            } else {
                "not counted: no local tokenizer (words are whitespace-separated words)".into()
            },
            conversations: info.conversations.len(),
            // Scored questions: those nothing answers are reported apart.
            questions: info
                .conversations
                .iter()
                .map(|c| c.questions.iter().filter(|q| !q.abstain).count())
                .sum(),
            categories,
            units,
            runs,
            best,
            recommended_rrf_k,
            references: dataset.references(),
            notes,
            answers: None,
        }
    }

    fn main_runs(&self) -> impl Iterator<Item = &RunResult> {
        self.runs.iter().filter(|run| !run.sweep)
    }
}

/// Writes `results.json`, `results.md` and `recall.svg` into `out_dir`.
pub fn write(report: Report, out_dir: &Path) -> anyhow::Result<EvalSummary> {
    let results_json = out_dir.join("results.json");
    let results_md = out_dir.join("results.md");
    let recall_svg = out_dir.join("recall.svg");
    let json = serde_json::to_string_pretty(&report).context("serialising the report")?;
    std::fs::write(&results_json, json + "\n")
        .with_context(|| format!("writing {}", results_json.display()))?;
    std::fs::write(&results_md, markdown(&report))
        .with_context(|| format!("writing {}", results_md.display()))?;
    std::fs::write(&recall_svg, svg(&report))
        .with_context(|| format!("writing {}", recall_svg.display()))?;
    Ok(EvalSummary {
        results_json,
        results_md,
        recall_svg,
        report,
    })
}

fn pct(value: f64) -> String {
    format!("{:.1}", 100.0 * value)
}

fn pct_at(map: &BTreeMap<usize, f64>, k: usize) -> String {
    map.get(&k).map(|v| pct(*v)).unwrap_or_default()
}

pub(super) fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

/// The markdown tables (`results.md`).
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    for section in [
        heading,
        recall_tables,
        rrf_sweep,
        gate_sweep,
        latency,
        foreign_questions,
        abstention,
        newest_first,
        answers,
        memory_units,
        definitions,
    ] {
        section(report, &mut out);
    }
    out
}

/// The title, the settings line, the data's digest and the best run.
fn heading(report: &Report, out: &mut String) {
    let file = Path::new(&report.data_path)
        .file_name()
        .map(|name| name.to_string_lossy().to_string())
        .unwrap_or_else(|| report.data_path.clone());
    let s = &report.settings;
    let _ = writeln!(out, "# Memory recall on {} ({file})\n", report.dataset);
    let _ = writeln!(
        out,
        "{} · {} conversations · {} questions · embedder `{}` ({}-d) · {} candidates per signal · \
         {} · decay half-life {} days, floor {} (hybrid+decay only) · {:.0} s ({} build)\n",
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        report.conversations,
        report.questions,
        s.embedder_model,
        s.dimension,
        s.candidates,
        s.fusion,
        number(s.decay_half_life_days),
        number(s.decay_floor),
        report.elapsed_secs,
        report.build
    );
    if !report.data_sha256.is_empty() {
        let _ = writeln!(
            out,
            "Data: `{file}`, sha256 `{}…`.\n",
            &report.data_sha256[..report.data_sha256.len().min(16)]
        );
    }
    if let Some(best) = &report.best {
        let _ = write!(out, "Best (one turn credited per memory): **{best}**.");
        if let Some(rrf_k) = report.recommended_rrf_k {
            let _ = write!(
                out,
                " Best RRF constant for its memory unit: **{}**.",
                number(rrf_k)
            );
        }
        out.push_str("\n\n");
    }
}

/// Recall@k with the references beside, NDCG@k, and recall per category.
fn recall_tables(report: &Report, out: &mut String) {
    // Recall@k with the references beside.
    let ks = &report.ks;
    let header = |first: &str, second: &str, prefix: &str| {
        let mut line = format!("| {first} | {second} |");
        let mut rule = "|---|---|".to_string();
        for k in ks {
            let _ = write!(line, " {prefix}@{k} |");
            rule.push_str("---:|");
        }
        format!("{line}\n{rule}\n")
    };
    out.push_str("## Recall@k (%), all questions\n\n");
    out.push_str(&header("memory unit", "retrieval", "R"));
    for run in report.main_runs() {
        let _ = write!(out, "| {} | {} |", run.unit, retrieval_label(run));
        for &k in ks {
            let _ = write!(out, " {} |", pct_at(&run.overall.recall, k));
        }
        out.push('\n');
    }
    for reference in &report.references {
        let _ = write!(out, "| *reference* | *{}* |", reference.name);
        for &k in ks {
            let cell = match k {
                5 => format!("*{:.1}*", reference.recall_at_5),
                10 => format!("*{:.1}*", reference.recall_at_10),
                _ => String::new(),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }

    out.push_str("\n## NDCG@k (%), all questions\n\n");
    out.push_str(&header("memory unit", "retrieval", "NDCG"));
    for run in report.main_runs() {
        let _ = write!(out, "| {} | {} |", run.unit, retrieval_label(run));
        for &k in ks {
            let _ = write!(out, " {} |", pct_at(&run.overall.ndcg, k));
        }
        out.push('\n');
    }

    let pair = (5, 10);
    let _ = writeln!(out, "\n## Per category, R@{} / R@{} (%)\n", pair.0, pair.1);
    let mut line = "| memory unit | retrieval |".to_string();
    let mut rule = "|---|---|".to_string();
    for category in &report.categories {
        let _ = write!(line, " {} ({}) |", category.name, category.questions);
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{line}\n{rule}");
    for run in report.main_runs() {
        let _ = write!(out, "| {} | {} |", run.unit, retrieval_label(run));
        for category in &report.categories {
            let cell = run
                .categories
                .get(&category.name)
                .map(|means| {
                    format!(
                        "{} / {}",
                        pct_at(&means.recall, pair.0),
                        pct_at(&means.recall, pair.1)
                    )
                })
                .unwrap_or_default();
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
}

/// The hybrid runs by RRF constant, when a sweep ran.
fn rrf_sweep(report: &Report, out: &mut String) {
    let sweep: Vec<&RunResult> = {
        let mut rows: Vec<&RunResult> = report
            .runs
            .iter()
            .filter(|run| run.retrieval == "hybrid")
            .collect();
        rows.sort_by(|a, b| {
            a.unit
                .cmp(&b.unit)
                .then_with(|| b.rrf_k.unwrap_or(0.0).total_cmp(&a.rrf_k.unwrap_or(0.0)))
        });
        rows
    };
    if sweep.iter().any(|run| run.sweep) {
        out.push_str("\n## RRF constant sweep (hybrid, no decay)\n\n");
        out.push_str("| memory unit | rrf_k | R@1 | R@5 | R@10 | R@50 | NDCG@10 |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
        for run in sweep {
            let rrf = run.rrf_k.map(number).unwrap_or_default();
            let rrf = if run.sweep {
                rrf
            } else {
                format!("{rrf} (setting)")
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                run.unit,
                rrf,
                pct_at(&run.overall.recall, 1),
                pct_at(&run.overall.recall, 5),
                pct_at(&run.overall.recall, 10),
                pct_at(&run.overall.recall, 50),
                pct_at(&run.overall.ndcg, 10),
            );
        }
    }
}

/// Latency and the returned text of the main runs.
fn latency(report: &Report, out: &mut String) {
    let tokens_k = report.runs.first().map(|run| run.tokens_k).unwrap_or(10);
    let _ = writeln!(out, "\n## Latency and returned text (top {tokens_k})\n");
    let _ = writeln!(
        out,
        "| memory unit | retrieval | p50 ms | p95 ms | memories | words | WordPiece tokens |"
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for run in report.main_runs() {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} |",
            run.unit,
            retrieval_label(run),
            run.latency.p50_ms,
            run.latency.p95_ms,
            run.returned_at_tokens_k,
            run.words_at_tokens_k,
            run.wordpieces_at_tokens_k
                .map(|count| format!("{count:.0}"))
                .unwrap_or_else(|| "–".into())
        );
    }
}

/// How often questions of another conversation recalled nothing.
fn foreign_questions(report: &Report, out: &mut String) {
    let tokens_k = report.runs.first().map(|run| run.tokens_k).unwrap_or(10);
    let gated: Vec<&RunResult> = report
        .main_runs()
        .filter(|run| run.foreign.is_some())
        .collect();
    if !gated.is_empty() {
        let _ = writeln!(
            out,
            "\n## Relevance gate: questions of another conversation\n\n\
             Each conversation is also asked the next one's questions, which none of its memories \
             answer. `nothing` is the share that returned no memory; `returned` the memories per \
             question (of at most {tokens_k}).\n"
        );
        out.push_str("| memory unit | retrieval | questions | nothing | returned | R@5 | R@10 |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
        for run in gated {
            if let Some(foreign) = &run.foreign {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.1} % | {:.1} | {} | {} |",
                    run.unit,
                    retrieval_label(run),
                    foreign.asked,
                    foreign.nothing * 100.0,
                    foreign.returned,
                    pct_at(&run.overall.recall, 5),
                    pct_at(&run.overall.recall, 10),
                );
            }
        }
    }
}

/// How often questions nothing answers recalled nothing.
fn abstention(report: &Report, out: &mut String) {
    let tokens_k = report.runs.first().map(|run| run.tokens_k).unwrap_or(10);
    let abstaining: Vec<&RunResult> = report
        .runs
        .iter()
        .filter(|run| run.abstention.is_some() && !run.sweep)
        .collect();
    if !abstaining.is_empty() {
        let _ = writeln!(
            out,
            "\n## Abstention: questions nothing in the history answers\n\n\
             Not scored for recall. `nothing` is the share that recalled no memory (the right \
             answer); `returned` the memories per question (of at most {tokens_k}).\n"
        );
        out.push_str("| memory unit | retrieval | questions | nothing | returned |\n");
        out.push_str("|---|---|---:|---:|---:|\n");
        for run in abstaining {
            if let Some(abstention) = &run.abstention {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.1} % | {:.1} |",
                    run.unit,
                    retrieval_label(run),
                    abstention.asked,
                    abstention.nothing * 100.0,
                    abstention.returned,
                );
            }
        }
    }
}

/// Whether a later statement ranks above the earlier one it changes.
fn newest_first(report: &Report, out: &mut String) {
    let ordering: Vec<&RunResult> = report
        .runs
        .iter()
        .filter(|run| run.newest_first.is_some() && !run.sweep)
        .collect();
    if !ordering.is_empty() {
        let _ = writeln!(
            out,
            "\n## Newest first: an earlier statement and the later one changing it\n\n\
             Knowledge-update and contradiction questions that name both statements' turns. \
             `later first` is the share where the later statement's turn ranked above the \
             earlier one's (or was found alone); `both found` where both were recalled.\n"
        );
        out.push_str("| memory unit | retrieval | questions | later first | both found |\n");
        out.push_str("|---|---|---:|---:|---:|\n");
        for run in ordering {
            if let Some(order) = &run.newest_first {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.1} % | {:.1} % |",
                    run.unit,
                    retrieval_label(run),
                    order.asked,
                    order.newer_first * 100.0,
                    order.both_found * 100.0,
                );
            }
        }
    }
}

/// Answers from recalled memories, when `--answer` ran.
fn answers(report: &Report, out: &mut String) {
    if let Some(answers) = &report.answers {
        let _ = writeln!(
            out,
            "\n## Answers from recalled memories ({}, top {}; answer model `{}`, judge `{}`)\n",
            answers.run, answers.k, answers.answer_model, answers.judge_model
        );
        out.push_str(
            "| category | questions | LLM judge (J) % | token F1 % |\n|---|---:|---:|---:|\n",
        );
        for (category, scores) in &answers.categories {
            let _ = writeln!(
                out,
                "| {category} | {} | {:.1} | {:.1} |",
                scores.questions, scores.judge_accuracy, scores.f1
            );
        }
        let _ = writeln!(
            out,
            "| **overall** | {} | **{:.1}** | **{:.1}** |",
            answers.overall.questions, answers.overall.judge_accuracy, answers.overall.f1
        );
        if answers.failures > 0 {
            let _ = writeln!(
                out,
                "\n{} questions could not be answered or judged.",
                answers.failures
            );
        }
    }
}

/// What each memory unit holds and what it cost.
fn memory_units(report: &Report, out: &mut String) {
    out.push_str("\n## Memory units\n\n");
    out.push_str(
        "| unit | one memory holds | status | memories | ingest s | recall s | recalls |\n",
    );
    out.push_str("|---|---|---|---:|---:|---:|---:|\n");
    for unit in &report.units {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {:.1} | {} |",
            unit.unit,
            unit.description,
            unit.status,
            unit.memories,
            unit.ingest_secs,
            unit.query_secs,
            unit.recalls
        );
    }
}

/// What the figures mean, and the data notes.
fn definitions(report: &Report, out: &mut String) {
    out.push_str(
        "\n## Definitions\n\n\
         - **recall@k**: |evidence ∩ turn ids of the top-k memories| / |evidence|, averaged over \
         questions; an evidence turn counts once. A question without evidence scores 1.\n\
         - **NDCG@k**: binary gain 1 at rank i when the memory there carries an evidence turn \
         not carried higher up; DCG = Σ gain / log2(i + 1), divided by the ideal \
         Σ_{i ≤ min(|evidence|, k)} 1 / log2(i + 1).\n\
         - **window** memories hold a turn with its neighbours and are credited with all three \
         turns (the protocol: a memory counts for every turn it was derived from); \
         **window-centre** scores the same results crediting only the centre turn, comparable \
         with one-turn memories at equal k. The returned-text columns show the price.\n\
         - **hybrid** = BM25 and vector top-N fused by RRF; **hybrid+decay** multiplies by the \
         decay factor with \"now\" = the day after the conversation's last session.\n\
         - **latency**: wall time of one recall call (query embedding, both searches, SQL \
         hydration, fusion), sequential, on this machine.\n",
    );
    let _ = writeln!(out, "- **WordPiece tokens**: {}.", report.token_count);

    if !report.notes.is_empty() {
        out.push_str("\n## Data notes\n\n");
        for note in &report.notes {
            let _ = writeln!(out, "- {note}");
        }
    }
}

fn retrieval_label(run: &RunResult) -> String {
    match &run.ablation {
        Some(change) => format!("{}, {change}", run.retrieval),
        None => run.retrieval.clone(),
    }
}

// --- the plot -------------------------------------------------------------------------------

const WIDTH: f64 = 1080.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 50.0;
const PLOT_W: f64 = 560.0;
const PLOT_H: f64 = 420.0;

fn unit_colour(unit: &str) -> &'static str {
    match unit {
        "raw" => "#1f77b4",
        "dated" => "#d62728",
        "window" => "#2ca02c",
        "window-centre" => "#9467bd",
        _ => "#8c564b",
    }
}

fn retrieval_dash(retrieval: &str) -> &'static str {
    match retrieval {
        "bm25" => "7 4",
        "vector" => "2 3",
        "hybrid+decay" => "10 3 2 3",
        _ => "",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Where a point of the plot goes: k on a log scale, recall from 0 to 1.
struct Scale {
    max_k: f64,
}

impl Scale {
    fn x(&self, k: usize) -> f64 {
        if self.max_k <= 1.0 {
            LEFT + PLOT_W / 2.0
        } else {
            LEFT + PLOT_W * (k as f64).ln() / self.max_k.ln()
        }
    }

    fn y(&self, value: f64) -> f64 {
        TOP + PLOT_H * (1.0 - value.clamp(0.0, 1.0))
    }
}

/// Recall@k against k (log scale), one line per main run, references as grey markers.
pub fn svg(report: &Report) -> String {
    let scale = Scale {
        max_k: report.ks.last().copied().unwrap_or(1).max(1) as f64,
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}: recall@k by memory unit and retrieval ({} questions)</text>"#,
        LEFT + PLOT_W / 2.0,
        escape(&report.dataset),
        report.questions
    );
    axes(&mut out, &report.ks, &scale);
    let legend_y = run_lines(&mut out, report, &scale);
    reference_marks(&mut out, report, &scale, legend_y);
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" font-size="11" fill="#555555">colour = memory unit, dash = retrieval (solid hybrid, long dash BM25, dots vector, dash-dot hybrid+decay)</text>"##,
        HEIGHT - 12.0
    );
    out.push_str("</svg>\n");
    out
}

/// The grid, both axes and their labels.
fn axes(out: &mut String, ks: &[usize], scale: &Scale) {
    // Grid and y axis.
    for step in 0..=10 {
        let value = step as f64 / 10.0;
        let yy = scale.y(value);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/>"##,
            LEFT + PLOT_W
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            yy + 4.0,
            step * 10
        );
    }
    // x axis ticks.
    for &k in ks {
        let xx = scale.x(k);
        let _ = writeln!(
            out,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##,
            TOP + PLOT_H
        );
        let _ = writeln!(
            out,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{k}</text>"#,
            TOP + PLOT_H + 18.0
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#333333"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">k (log scale)</text>"#,
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H + 38.0
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">recall@k (%)</text>"#,
        TOP + PLOT_H / 2.0,
        TOP + PLOT_H / 2.0
    );
}

/// One line per main run with its legend entry; returns where the legend goes on.
fn run_lines(out: &mut String, report: &Report, scale: &Scale) -> f64 {
    let ks = &report.ks;
    // Lines.
    let legend_x = LEFT + PLOT_W + 30.0;
    let mut legend_y = TOP + 6.0;
    for run in report.main_runs() {
        let colour = unit_colour(&run.unit);
        let dash = retrieval_dash(&run.retrieval);
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let points: Vec<String> = ks
            .iter()
            .filter_map(|&k| {
                let value = run.overall.recall.get(&k)?;
                Some(format!("{:.1},{:.1}", scale.x(k), scale.y(*value)))
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>"#,
            points.join(" ")
        );
        for point in &points {
            let (px, py) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                r#"<circle cx="{px}" cy="{py}" r="2.5" fill="{colour}"/>"#
            );
        }
        let _ = writeln!(
            out,
            r#"<line x1="{legend_x:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{colour}" stroke-width="2"{dash_attr}/>"#,
            legend_x + 34.0
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            legend_x + 42.0,
            legend_y + 4.0,
            escape(&run.key)
        );
        legend_y += 17.0;
    }
    legend_y
}

/// The reference points at k = 5 and 10, each with its legend entry below the runs'.
fn reference_marks(out: &mut String, report: &Report, scale: &Scale, legend_y: f64) {
    let ks = &report.ks;
    let legend_x = LEFT + PLOT_W + 30.0;
    let mut legend_y = legend_y;
    // References at k = 5 and 10.
    let shapes = ["diamond", "square", "triangle", "circle", "cross", "star"];
    legend_y += 8.0;
    if !report.references.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{legend_x:.1}" y="{legend_y:.1}" font-weight="bold">reference points (R@5, R@10)</text>"#
        );
        legend_y += 16.0;
    }
    for (index, reference) in report.references.iter().enumerate() {
        let shape = shapes[index % shapes.len()];
        let mut marks = Vec::new();
        for (k, value) in [(5, reference.recall_at_5), (10, reference.recall_at_10)] {
            if ks.contains(&k) {
                marks.push((scale.x(k), scale.y(value / 100.0)));
            }
        }
        if let [(x1, y1), (x2, y2)] = marks.as_slice() {
            let _ = writeln!(
                out,
                r##"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="#777777" stroke-width="1" stroke-dasharray="1 2"/>"##
            );
        }
        for (mx, my) in &marks {
            out.push_str(&marker(shape, *mx, *my));
        }
        out.push_str(&marker(shape, legend_x + 17.0, legend_y));
        let name = mnemo::text::prefix(&reference.name, 44).to_string();
        let ellipsis = if reference.name.chars().count() > 44 {
            "…"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11">{}{ellipsis} ({:.1}, {:.1})</text>"#,
            legend_x + 42.0,
            legend_y + 4.0,
            escape(&name),
            reference.recall_at_5,
            reference.recall_at_10
        );
        legend_y += 16.0;
    }
}

fn marker(shape: &str, x: f64, y: f64) -> String {
    let style = r##"fill="#777777" stroke="#333333" stroke-width="0.8""##;
    match shape {
        "diamond" => format!(
            "<polygon points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" {style}/>\n",
            x,
            y - 5.0,
            x + 5.0,
            y,
            x,
            y + 5.0,
            x - 5.0,
            y
        ),
        "square" => format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"8\" height=\"8\" {style}/>\n",
            x - 4.0,
            y - 4.0
        ),
        "triangle" => format!(
            "<polygon points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" {style}/>\n",
            x,
            y - 5.0,
            x + 5.0,
            y + 4.0,
            x - 5.0,
            y + 4.0
        ),
        "cross" => format!(
            "<path d=\"M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}\" stroke=\"#333333\" stroke-width=\"2\"/>\n",
            x - 4.0,
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0,
            y + 4.0,
            x + 4.0,
            y - 4.0
        ),
        "star" => format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"14\" fill=\"#555555\">★</text>\n",
            x,
            y + 5.0
        ),
        _ => format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" {style}/>\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn means(r5: f64, r10: f64) -> Means {
        Means {
            n: 2,
            recall: [(1, r5 / 2.0), (5, r5), (10, r10)].into_iter().collect(),
            ndcg: [(1, 0.1), (5, 0.2), (10, 0.3)].into_iter().collect(),
        }
    }

    fn run(
        unit: &str,
        retrieval: &str,
        rrf_k: Option<f64>,
        sweep: bool,
        r5: f64,
        r10: f64,
    ) -> RunResult {
        RunResult {
            key: match (sweep, rrf_k) {
                (true, Some(k)) => format!("{unit}/{retrieval} rrf_k={k}"),
                _ => format!("{unit}/{retrieval}"),
            },
            unit: unit.into(),
            credit: "all refs".into(),
            single_turn_credit: unit != "window",
            retrieval: retrieval.into(),
            rrf_k,
            decay: false,
            sweep,
            gate: None,
            ablation: None,
            overall: means(r5, r10),
            categories: [("single-hop".to_string(), means(r5, r10))]
                .into_iter()
                .collect(),
            latency: Latency {
                p50_ms: 1.0,
                p95_ms: 2.0,
                mean_ms: 1.2,
            },
            tokens_k: 10,
            returned_at_tokens_k: 10.0,
            words_at_tokens_k: 200.0,
            wordpieces_at_tokens_k: Some(260.0),
            foreign: None,
            abstention: None,
            newest_first: None,
        }
    }

    fn report() -> Report {
        Report {
            dataset: "LoCoMo".into(),
            data_path: "/data/locomo-dev.json".into(),
            data_sha256: "ab".repeat(32),
            generated_at: DateTime::UNIX_EPOCH,
            elapsed_secs: 1.0,
            build: "debug".into(),
            ks: vec![1, 5, 10],
            settings: SettingsUsed {
                fusion: "RRF k = 60".into(),
                rrf_k: 60.0,
                candidates: 100,
                decay_half_life_days: 30.0,
                decay_floor: 0.5,
                dedupe_cosine: 0.97,
                turn_importance: 3,
                embedder_model: "m".into(),
                dimension: 384,
            },
            token_count: "WordPiece".into(),
            conversations: 1,
            questions: 2,
            categories: vec![CategoryCount {
                name: "single-hop".into(),
                questions: 2,
            }],
            units: vec![UnitResult {
                unit: "facts".into(),
                description: "facts".into(),
                status: "skipped (no LLM configured)".into(),
                memories: 0,
                ingest_secs: 0.0,
                query_secs: 0.0,
                recalls: 0,
            }],
            runs: vec![
                run("dated", "bm25", None, false, 0.5, 0.6),
                run("dated", "hybrid", Some(60.0), false, 0.55, 0.65),
                run("window", "hybrid", Some(60.0), false, 0.9, 0.95),
                run("dated", "hybrid", Some(10.0), true, 0.6, 0.7),
            ],
            best: Some("dated/hybrid".into()),
            recommended_rrf_k: Some(10.0),
            references: vec![Reference {
                name: "DRAGON <paper>".into(),
                recall_at_5: 56.7,
                recall_at_10: 66.2,
            }],
            notes: vec!["conv-x/q2: evidence \"D\" dropped".into()],
            answers: None,
        }
    }

    #[test]
    fn markdown_has_every_table_and_the_references() {
        let text = markdown(&report());
        for needle in [
            "## Recall@k (%), all questions",
            "| dated | hybrid | 27.5 | 55.0 | 65.0 |",
            "| *reference* | *DRAGON <paper>* |  | *56.7* | *66.2* |",
            "## NDCG@k (%)",
            "single-hop (2)",
            "| dated | bm25 | 50.0 / 60.0 |",
            "## RRF constant sweep",
            "| dated | 60 (setting) |",
            "| dated | 10 | 30.0 | 60.0 | 70.0 |",
            "skipped (no LLM configured)",
            "evidence \"D\" dropped",
            "Best (one turn credited per memory): **dated/hybrid**",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        // Sweep rows stay out of the main tables.
        assert_eq!(text.matches("rrf_k=10").count(), 0, "{text}");
    }

    #[test]
    fn svg_is_well_formed_with_a_line_per_main_run() {
        let text = svg(&report());
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        assert_eq!(text.matches("<polyline").count(), 3);
        assert!(text.contains("DRAGON &lt;paper&gt;"));
        assert!(text.contains("k (log scale)") && text.contains("recall@k (%)"));
        assert!(!text.contains("NaN"));
    }

    #[test]
    fn headline_is_the_mean_of_r5_and_r10() {
        let row = run("dated", "hybrid", Some(60.0), false, 0.5, 0.7);
        assert!((row.headline() - 0.6).abs() < 1e-12);
    }
}
