//! The recursive breadth/depth mode: queries per level, learnings and follow-up questions.

use crate::llm::prompts::Prompt;
use futures::StreamExt;
use std::collections::BTreeSet;

use super::*;

impl Research {
    /// The recursive breadth/depth mode: each level plans `breadth` queries from what was
    /// learned so far, researches them (`concurrency` at a time) and goes one level deeper
    /// with the follow-up questions, halving the breadth.
    pub(super) async fn recursive(&self, brief: &str) -> Result<Vec<Findings>, RunFailure> {
        self.progress
            .stage("research_execution", "Recursive research (breadth × depth)")
            .await?;
        let mut found: Vec<Findings> = Vec::new();
        let mut frontier = vec![brief.to_string()];
        let mut breadth = self.config.breadth;
        for level in 1..=self.config.depth {
            if level > 1 && self.budget_spent().await {
                break;
            }
            let known = found.len();
            let (level_found, next): (Vec<Findings>, Vec<String>) = self
                .step(&format!("level.{level}"), || {
                    self.level(level, known, &found, &frontier, breadth)
                })
                .await?;
            found.extend(level_found);
            frontier = next;
            breadth = breadth.div_ceil(2);
            if frontier.is_empty() {
                break;
            }
        }
        Ok(found)
    }

    /// One level of the recursive research: the queries for `frontier` (reviewed by the user
    /// on the first level), each searched and learnt from; its findings and the follow-up
    /// questions for the next level. Planning and each query are checkpointed steps.
    async fn level(
        &self,
        level: u32,
        known: usize,
        found: &[Findings],
        frontier: &[String],
        breadth: u32,
    ) -> Result<(Vec<Findings>, Vec<String>), RunFailure> {
        let queries: Vec<String> = self
            .step(&format!("level.{level}.queries"), || async {
                let mut queries = Vec::new();
                for question in frontier {
                    let learned: Vec<String> = found.iter().map(|f| f.text.clone()).collect();
                    // Planned without the model, the first level searches the query (the brief
                    // may be long), the next ones the follow-up questions themselves.
                    let plain = if level == 1 {
                        &self.config.query
                    } else {
                        question
                    };
                    queries.extend(
                        self.plan_queries(question, plain, breadth, &learned)
                            .await?,
                    );
                }
                queries.dedup();
                queries.truncate(self.config.breadth as usize * frontier.len().max(1));
                if level == 1 {
                    queries = self.review(queries).await?;
                }
                self.progress
                    .emit(RunEvent::thinking(
                        "research_execution",
                        format!("Level {level}: {} queries", queries.len()),
                        Some(StepMeta {
                            level: Some(level),
                            queries: Some(queries.clone()),
                            ..Default::default()
                        }),
                    ))
                    .await?;
                Ok(queries)
            })
            .await?;
        let cap = self.config.concurrency.max(1) as usize;
        let mut results: Vec<(usize, (Findings, Vec<String>))> =
            futures::stream::iter(queries.into_iter().enumerate())
                .map(|(index, query)| async move {
                    let number = known + index + 1;
                    let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                    self.peak.fetch_max(now, Ordering::SeqCst);
                    let result = self
                        .step(&format!("learn.{number}"), || async {
                            Ok(self.learn(number, &query).await)
                        })
                        .await
                        .unwrap_or_else(|RunFailure::Failed { message, .. }| {
                            (Findings::failed(query.clone(), message), Vec::new())
                        });
                    self.running.fetch_sub(1, Ordering::SeqCst);
                    (index, result)
                })
                .buffer_unordered(cap)
                .collect()
                .await;
        results.sort_by_key(|(index, _)| *index);
        let mut level_found = Vec::new();
        let mut next = Vec::new();
        for (_, (findings, follow_ups)) in results {
            if let Some(why) = &findings.failed {
                let _ = self
                    .progress
                    .error(
                        RunErrorType::Tool,
                        &format!("could not research {:?}: {why}", findings.topic),
                        false,
                        StepMeta {
                            topic: Some(findings.topic.clone()),
                            level: Some(level),
                            ..Default::default()
                        },
                    )
                    .await;
            }
            next.extend(follow_ups);
            level_found.push(findings);
        }
        Ok((level_found, next))
    }

    /// The searches for `question`: planned by the model, or `plain` alone without one (or
    /// when its reply cannot be used).
    pub(super) async fn plan_queries(
        &self,
        question: &str,
        plain: &str,
        breadth: u32,
        learned: &[String],
    ) -> Result<Vec<String>, RunFailure> {
        let Some(role) = self.role(ModelRole::Research) else {
            return Ok(vec![plain.to_string()]);
        };
        let text = Prompt::ResearchQueries.render(&[
            ("breadth", &breadth.to_string()),
            ("query", &quote(question)),
            ("learnings", &quote(&learned.join("\n"))),
        ])?;
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
            .await;
        match queries {
            Ok(queries) => Ok(queries.into_iter().take(breadth as usize).collect()),
            Err(error) if unusable(&error) => {
                self.progress
                    .fallback(
                        "research_execution",
                        "plan_queries",
                        &format!("One search for {plain:?}"),
                        &error.message,
                        Some(StepMeta {
                            question: Some(truncate(question, 200)),
                            ..Default::default()
                        }),
                    )
                    .await?;
                Ok(vec![plain.to_string()])
            }
            Err(error) => Err(llm_failure(error)),
        }
    }

    /// One query of the recursive mode: search, read, extract learnings and follow-ups.
    pub(super) async fn learn(&self, number: usize, query: &str) -> (Findings, Vec<String>) {
        let gathered = self.gather(number, query).await;
        let findings = match gathered {
            Ok(findings) => findings,
            Err(why) => {
                return (Findings::failed(query, why), Vec::new());
            }
        };
        let Some(role) = self.role(ModelRole::Research) else {
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
        let text = match Prompt::ResearchLearnings.render(&[
            ("query", &quote(query)),
            ("sources", &sources.join("\n\n")),
            ("follow_ups", "3"),
        ]) {
            Ok(text) => text,
            Err(error) => {
                let failed = Some(error.to_string());
                return (Findings { failed, ..findings }, Vec::new());
            }
        };
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
        if let Err(error) = &parsed
            && unusable(error)
        {
            let _ = self
                .progress
                .fallback(
                    "research_execution",
                    "learnings",
                    "The learnings are the passages most similar to the query, without follow-up questions",
                    &error.message,
                    Some(StepMeta { query: Some(query.to_string()), ..Default::default() }),
                )
                .await;
        }
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
}
