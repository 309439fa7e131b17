//! The final report, streamed with numbered citations (or an extractive digest without a
//! model), and the conclusions written to memory.

use crate::llm::prompts::Prompt;
use crate::research::request::{ReportKind, ReportStyle};
use crate::runs::events::Delta;
use crate::runs::stream::DeltaKind;
use crate::runs::stream_to_events;
use crate::store::MemoryKind;
use crate::store::MemorySource;
use crate::store::NewMemory;
use crate::store::Trust;
use std::collections::HashMap;

use super::*;

impl Research {
    /// Streams the report (`report_delta`), then the list of sources and, when something
    /// could not be researched, a section saying so. Citations that do not name a listed
    /// source never reach the stream nor the stored report (and are reported); every other
    /// one is checked against the text read from its source (`verify`), and those not found
    /// there are marked in the stored report, which `research_complete` carries.
    pub(super) async fn report(
        &self,
        brief: &str,
        findings: &[Findings],
        cited: &[(usize, Source)],
        gaps: &[String],
        earlier: &str,
    ) -> Result<(String, CitationCheck), RunFailure> {
        let number_of: HashMap<&str, usize> =
            cited.iter().map(|(n, s)| (s.url.as_str(), *n)).collect();
        let written = WrittenFrom {
            brief,
            findings,
            cited,
            gaps,
            earlier,
            number_of: &number_of,
        };
        let body = match self.role(ModelRole::FinalReport) {
            Some(role) => self.written_by_model(role, &written).await?,
            None => {
                self.stream_digest(findings, &number_of, "no language model is configured")
                    .await?
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
                    StepMeta { invalid_citations: Some(invalid.clone()), ..Default::default() },
                )
                .await?;
        }
        let texts: Vec<(usize, String)> = cited
            .iter()
            .map(|(n, source)| {
                let text = self
                    .sources
                    .text_of(&source.url)
                    .or_else(|| source.text.clone())
                    .unwrap_or_default();
                (*n, text)
            })
            .collect();
        let texts: Vec<(usize, &str)> = texts.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let (marked, checked) = verify::Checker::new(&texts).check(&report);
        report = marked;
        let tail = report_tail(gaps, cited);
        if !tail.is_empty() {
            self.progress
                .context
                .emit(RunEvent::ReportDelta(Delta {
                    content: tail.clone(),
                }))
                .await?;
            report.push_str(&tail);
        }
        Ok((report, checked))
    }

    /// The report's body written by the final-report model, streamed as it comes; when the
    /// model answers with nothing, the extractive digest of the passages read instead.
    async fn written_by_model(
        &self,
        role: &RoleModel,
        written: &WrittenFrom<'_>,
    ) -> Result<String, RunFailure> {
        let WrittenFrom {
            brief,
            findings,
            cited,
            gaps,
            earlier,
            number_of,
        } = *written;
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
        let text = Prompt::ResearchReport.render(&[
            ("date", &today()),
            ("style", &style_text(&self.config.report)),
            ("earlier", earlier),
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
        ])?;
        let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
        request.max_tokens = Some(role.max_tokens);
        let started = Instant::now();
        let mut filter = CitationFilter::new(cited.len());
        let (result, flushed) = stream_to_events(
            &self.progress.context,
            None,
            role,
            &request,
            self.deps.delta_interval,
            DeltaKind::Report,
            Some(&mut filter),
        )
        .await;
        Meter::add(&self.meter.model, started);
        flushed?;
        let response = result.map_err(llm_failure)?;
        self.account("final_report", role.model.model(), &response.usage)
            .await?;
        if response.content.trim().is_empty() {
            self.progress
                .fallback(
                    "final_report_generation",
                    "final_report",
                    "The report is an extractive digest of the passages read",
                    "the report model answered with nothing",
                    None,
                )
                .await?;
            // Findings the model compressed have no passages of their own: they get
            // the passages of the kept sources most similar to their topic.
            let urls: Vec<String> = cited.iter().map(|(_, s)| s.url.clone()).collect();
            let mut extractive = Vec::with_capacity(findings.len());
            for found in findings {
                let mut found = found.clone();
                if found.passages.is_empty() && found.failed.is_none() {
                    found.passages = self
                        .select_passages(&found.topic, &urls)
                        .await
                        .unwrap_or_default();
                }
                extractive.push(found);
            }
            self.stream_digest(&extractive, number_of, "the model's report was empty")
                .await
        } else {
            Ok(response.content)
        }
    }

    /// Streams the extractive digest of `findings` as the report's body.
    async fn stream_digest(
        &self,
        findings: &[Findings],
        number_of: &HashMap<&str, usize>,
        why: &str,
    ) -> Result<String, RunFailure> {
        let digest = digest(
            &self.config.query,
            findings,
            number_of,
            why,
            &self.config.report,
        );
        for chunk in chunks(&digest, 400) {
            self.progress
                .context
                .emit(RunEvent::ReportDelta(Delta { content: chunk }))
                .await?;
        }
        Ok(digest)
    }

    /// Writes the report's conclusions to the user's memory (`source = research`, refs: the
    /// research and its sources). Only a report with cited sources has conclusions: one
    /// written from failed searches would remember the failure. Failures to write are
    /// reported; the research still completes.
    pub(super) async fn remember(
        &self,
        report: &str,
        cited: &[(usize, Source)],
    ) -> Result<usize, RunFailure> {
        if !self.config.remember || cited.is_empty() {
            return Ok(0);
        }
        let conclusions = match self.role(ModelRole::Memory) {
            Some(role) => {
                let text = Prompt::ResearchConclusions.render(&[
                    ("max", &MAX_CONCLUSIONS.to_string()),
                    ("query", &quote(&self.config.query)),
                    ("report", &quote(&truncate(report, 12_000))),
                ])?;
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
                    Err(error) if unusable(&error) => {
                        self.progress
                            .fallback(
                                "completed",
                                "conclusions",
                                "The conclusions are the first sentences of the report's points",
                                &error.message,
                                None,
                            )
                            .await?;
                        extractive_conclusions(&self.config.query, report)
                    }
                    Err(error) => {
                        self.progress
                            .error(
                                RunErrorType::Llm,
                                &format!(
                                    "picking conclusions to remember failed: {}",
                                    error.message
                                ),
                                error.retryable(),
                                StepMeta::stage("completed"),
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
        // The same conclusion researched again is the memory it repeats, not a second copy.
        match self.deps.memory.add_unique(self.user, memories).await {
            Ok(unique) => Ok(unique.written.len()),
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Internal,
                        &format!(
                            "writing the conclusions to memory failed: {}",
                            crate::error::public_message(&error)
                        ),
                        true,
                        StepMeta::stage("completed"),
                    )
                    .await?;
                Ok(0)
            }
        }
    }
}

/// What a digest says when no passage read is about the question: it quotes nothing rather
/// than the least unrelated text.
pub(super) const NOTHING_ANSWERS: &str =
    "Nothing in the sources read answers this question, so nothing is quoted here.";

/// What the report prompt asks for, from the request's report options.
pub(super) fn style_text(style: &ReportStyle) -> String {
    let mut out = match style.kind {
        ReportKind::Detailed => "A detailed report: a title, a direct answer first, then sections that develop it, then what remains uncertain.",
        ReportKind::Summary => "A short summary: a title, then a few paragraphs that answer directly, without sections.",
        ReportKind::Outline => "An outline: a title, then nested bullet points, each one line with its citations.",
        ReportKind::Resources => "An annotated list of resources: a title, then one bullet per useful source — its citation number, what it covers and how it helps answer — best first.",
    }
    .to_string();
    if let Some(tone) = &style.tone {
        out.push_str(&format!(" Tone: {}.", quote_inline(tone)));
    }
    if let Some(words) = style.words {
        out.push_str(&format!(" Length: about {words} words."));
    }
    match &style.language {
        Some(language) => out.push_str(&format!(" Write in {}.", quote_inline(language))),
        None => out.push_str(" Write in the language of the request."),
    }
    out
}

/// A short option of the user's, quoted inside an instruction.
fn quote_inline(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "'"))
}

/// The extractive report written without a model (or instead of an empty one; `why` says
/// which): per topic, the selected passages with their citation numbers — all of them for a
/// detailed report, the first for a summary, their first sentences for an outline, one line
/// per source for a list of resources — up to the report's target length.
pub(super) fn digest(
    query: &str,
    findings: &[Findings],
    number_of: &HashMap<&str, usize>,
    why: &str,
    style: &ReportStyle,
) -> String {
    let mut out = format!(
        "# {query}\n\nAn extractive digest: the passages of the sources read that are most similar to each question, quoted as found ({why}).\n"
    );
    let quoted = findings.iter().any(|found| {
        found
            .passages
            .iter()
            .any(|passage| number_of.contains_key(passage.url.as_str()))
    });
    if !quoted {
        out.push_str(&format!("\n{NOTHING_ANSWERS}\n"));
    }
    let budget = style.words.map(|words| words as usize);
    let mut written = 0;
    let mut listed: Vec<usize> = Vec::new();
    for found in findings {
        let passages: Vec<&Passage> = found
            .passages
            .iter()
            .filter(|passage| number_of.contains_key(passage.url.as_str()))
            .collect();
        if passages.is_empty() {
            continue;
        }
        let mut lines = Vec::new();
        for passage in passages {
            if budget.is_some_and(|budget| written >= budget) {
                break;
            }
            let n = number_of[passage.url.as_str()];
            let text = match style.kind {
                ReportKind::Detailed => passage.text.clone(),
                ReportKind::Summary if !lines.is_empty() => break,
                ReportKind::Summary => passage.text.clone(),
                ReportKind::Outline | ReportKind::Resources => sentences(&passage.text)
                    .first()
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
            };
            if style.kind == ReportKind::Resources {
                if listed.contains(&n) {
                    continue;
                }
                listed.push(n);
            }
            written += word_count(&text);
            lines.push(format!("- {text} [{n}]\n"));
        }
        if lines.is_empty() {
            continue;
        }
        if findings.len() > 1 && style.kind != ReportKind::Resources {
            out.push_str(&format!("\n## {}\n", found.topic));
        }
        out.push('\n');
        for line in lines {
            out.push_str(&line);
        }
    }
    out
}

/// Without a model: the first sentence of each of the report's first points (the digest's
/// passages), never of what was not covered nor of the list of sources.
pub(super) fn extractive_conclusions(query: &str, report: &str) -> Vec<String> {
    report
        .lines()
        .take_while(|line| !matches!(line.trim(), "## Not covered" | "## Sources"))
        .filter(|line| !line.contains(verify::NOT_FOUND))
        .filter_map(|line| line.strip_prefix("- "))
        .filter_map(|passage| sentences(passage).first().map(|s| s.trim().to_string()))
        .map(|sentence| strip_citations(&sentence))
        .filter(|sentence| sentence.chars().count() >= 20)
        .take(3)
        .map(|sentence| format!("Research on \"{query}\": {sentence}"))
        .collect()
}

/// What the report is written from.
#[derive(Clone, Copy)]
struct WrittenFrom<'a> {
    brief: &'a str,
    findings: &'a [Findings],
    cited: &'a [(usize, Source)],
    gaps: &'a [String],
    earlier: &'a str,
    /// Each cited source's number, by URL.
    number_of: &'a HashMap<&'a str, usize>,
}

/// What follows the report's body: what could not be researched, and the numbered sources
/// (each labelled with its provider when the research used several).
fn report_tail(gaps: &[String], cited: &[(usize, Source)]) -> String {
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
            let label = match source.provider.as_deref() {
                Some("local") => " (your documents)".to_string(),
                Some(provider) => format!(" ({provider})"),
                None => String::new(),
            };
            tail.push_str(&format!("[{n}] {} — {}{label}\n", source.title, source.url));
        }
    }
    tail
}
