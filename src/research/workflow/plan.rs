//! Before research: the optional clarifying question, the research brief, and the plan the
//! user may review.

use crate::llm::prompts::Prompt;
use crate::runs::events::Stage;

use super::*;

impl Research {
    pub(super) async fn clarify(&self, memories: &str) -> Result<Option<String>, RunFailure> {
        if !self.config.allow_clarification {
            return Ok(None);
        }
        let Some(role) = self.role(ModelRole::Research) else {
            return Ok(None);
        };
        self.progress
            .stage(
                "clarification",
                "Checking whether the request needs clarification",
            )
            .await?;
        let text = Prompt::ResearchClarify.render(&[
            ("memories", memories),
            ("query", &quote(&self.config.query)),
        ])?;
        let decision = match self
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
        {
            Ok(decision) => decision,
            Err(error) if unusable(&error) => {
                self.progress
                    .fallback(
                        "clarification",
                        "clarification",
                        "No clarifying question: the research goes on with the request as written",
                        &error.message,
                        None,
                    )
                    .await?;
                return Ok(None);
            }
            Err(error) => return Err(llm_failure(error)),
        };
        let (true, question) = decision else {
            return Ok(None);
        };
        if question.is_empty() {
            return Ok(None);
        }
        // Expected before it is asked for: a client may answer as soon as it sees the event.
        let wait = self.progress.context.expect_input().await;
        self.progress
            .emit(RunEvent::StageUpdate(Stage {
                stage: "clarification".into(),
                content: question.clone(),
                metadata: Some(StepMeta {
                    awaiting_input: Some(true),
                    input: Some("POST /v1/runs/{id}/input {\"content\": \"…\"}".into()),
                    ..Default::default()
                }),
            }))
            .await?;
        let answer = wait
            .recv()
            .await
            .ok_or_else(|| failure(RunErrorType::Internal, "the run stopped waiting for input"))?;
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

    pub(super) async fn brief(
        &self,
        memories: &str,
        clarification: Option<&str>,
        earlier: &str,
    ) -> Result<String, RunFailure> {
        self.progress
            .stage("research_brief", "Writing the research brief")
            .await?;
        // Without a model, the brief is the query (and the answer to a clarifying question).
        let extractive = || match clarification {
            Some(more) => format!("{}\n\n{more}", self.config.query),
            None => self.config.query.clone(),
        };
        let brief = match self.role(ModelRole::Research) {
            None => extractive(),
            Some(role) => {
                let text = Prompt::ResearchBrief.render(&[
                    ("date", &today()),
                    ("memories", memories),
                    ("earlier", earlier),
                    ("query", &quote(&self.config.query)),
                    ("clarification", clarification.unwrap_or("")),
                ])?;
                match self
                    .json("research_brief", role, text, |value| {
                        value["brief"]
                            .as_str()
                            .map(str::trim)
                            .filter(|brief| !brief.is_empty())
                            .map(str::to_string)
                            .ok_or_else(|| "brief must be a non-empty string".to_string())
                    })
                    .await
                {
                    Ok(brief) => brief,
                    Err(error) if unusable(&error) => {
                        self.progress
                            .fallback(
                                "research_brief",
                                "research_brief",
                                "The query is the research brief",
                                &error.message,
                                None,
                            )
                            .await?;
                        extractive()
                    }
                    Err(error) => return Err(llm_failure(error)),
                }
            }
        };
        self.progress
            .emit(RunEvent::thinking("research_brief", brief.clone(), None))
            .await?;
        Ok(brief)
    }

    /// Shows the plan and waits for approval or an edited list of topics.
    pub(super) async fn review(&self, topics: Vec<String>) -> Result<Vec<String>, RunFailure> {
        if !self.config.plan_review {
            return Ok(topics);
        }
        let plan = topics
            .iter()
            .enumerate()
            .map(|(index, topic)| format!("{}. {topic}", index + 1))
            .collect::<Vec<_>>()
            .join("\n");
        let wait = self.progress.context.expect_input().await;
        self.progress
            .emit(RunEvent::PlanReview(Stage {
                stage: "research_execution".into(),
                content: plan,
                metadata: Some(StepMeta {
                    topics: Some(topics.clone()),
                    awaiting_input: Some(true),
                    ..Default::default()
                }),
            }))
            .await?;
        let input = wait
            .recv()
            .await
            .ok_or_else(|| failure(RunErrorType::Internal, "the run stopped waiting for input"))?;
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
                    .emit(RunEvent::thinking(
                        "research_execution",
                        "The user edited the plan",
                        Some(StepMeta {
                            topics: Some(edited.clone()),
                            ..Default::default()
                        }),
                    ))
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
}
