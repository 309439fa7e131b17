//! The supervisor loop and its researchers: each researcher a ReAct loop of search → fetch →
//! think, its findings compressed (by the model, or by embedding similarity without one).

use crate::llm::chat::ChatRole;
use crate::llm::chat::ToolCall;
use crate::llm::chat::ToolSpec;
use crate::llm::prompts::Prompt;
use crate::memory::relevance::{Corpus, Terms};
use crate::runs::events::SourcesFound;
use crate::runs::events::ToolCall as ToolCallEvent;
use crate::search::SearchHit;
use crate::search::fetch::FetchedPage;
use futures::StreamExt;

use super::*;

impl Research {
    /// The supervisor loop: plan sub-topics, dispatch researchers (≤ the concurrency cap),
    /// read their findings, repeat for gaps, up to `max_researcher_iterations` rounds.
    pub(super) async fn supervise(&self, brief: &str) -> Result<Vec<Findings>, RunFailure> {
        self.progress
            .stage("research_execution", "Planning and dispatching researchers")
            .await?;
        let Some(role) = self.role(ModelRole::Research) else {
            let topics = self
                .step("review", || self.review(vec![self.config.query.clone()]))
                .await?;
            return Ok(self.dispatch(topics, 0).await);
        };
        let max_rounds = self.config.max_researcher_iterations;
        let system = Prompt::ResearchSupervisor.render(&[
            ("date", &today()),
            ("brief", brief),
            (
                "max_units",
                &self.config.max_concurrent_research_units.to_string(),
            ),
            ("max_rounds", &max_rounds.to_string()),
        ])?;
        let mut messages = vec![ChatMessage::system(system), ChatMessage::user(brief)];
        let mut all = Vec::new();
        for round in 0..max_rounds {
            if round > 0 && self.budget_spent().await {
                break;
            }
            let (content, tool_calls): (String, Vec<ToolCall>) = self
                .step(&format!("supervisor.{}", round + 1), || async {
                    let mut request = ChatRequest::new(messages.clone());
                    request.tools = supervisor_tools();
                    request.max_tokens = Some(role.max_tokens);
                    let response = self
                        .complete("supervisor", role, request)
                        .await
                        .map_err(llm_failure)?;
                    for call in response.tool_calls.iter().filter(|c| c.name == "think") {
                        let arguments = arguments(call);
                        let reflection = arguments["reflection"].as_str().unwrap_or_default();
                        self.progress
                            .emit(RunEvent::thinking(
                                "research_execution",
                                reflection,
                                Some(StepMeta {
                                    round: Some(round + 1),
                                    ..Default::default()
                                }),
                            ))
                            .await?;
                    }
                    Ok((response.content, response.tool_calls))
                })
                .await?;
            let response = ChatResponse {
                content,
                tool_calls,
                ..ChatResponse::default()
            };
            if response.tool_calls.is_empty() {
                break;
            }
            messages.push(assistant_with_calls(&response));
            let Planned {
                topics,
                topic_calls,
                complete,
            } = planned(&response.tool_calls, &mut messages);
            if topics.is_empty() {
                if complete {
                    break;
                }
                continue;
            }
            let reviewed = if round == 0 {
                self.step("review", || self.review(topics.clone())).await?
            } else {
                topics.clone()
            };
            let edited = reviewed != topics;
            let found = self.dispatch(reviewed, all.len()).await;
            answer_topic_calls(&topic_calls, &found, edited, &mut messages);
            all.extend(found);
            if complete {
                break;
            }
        }
        if all.is_empty() {
            // The supervisor ended without dispatching anything (a model that answers in
            // prose, or whose calls do not parse): one researcher studies the query, as
            // without a model.
            self.progress
                .fallback(
                    "research_execution",
                    "supervisor",
                    "One researcher studies the query",
                    "the supervisor model made no usable conduct_research call",
                    None,
                )
                .await?;
            let topics = self
                .step("review.fallback", || {
                    self.review(vec![self.config.query.clone()])
                })
                .await?;
            all = self.dispatch(topics, 0).await;
        }
        Ok(all)
    }

    /// Runs researchers for `topics`, at most `max_concurrent_research_units` at a time, and
    /// returns their findings in the order of `topics`.
    pub(super) async fn dispatch(&self, topics: Vec<String>, first_index: usize) -> Vec<Findings> {
        let cap = self.config.max_concurrent_research_units.max(1) as usize;
        let mut found: Vec<(usize, Findings)> =
            futures::stream::iter(topics.into_iter().enumerate())
                .map(|(index, topic)| async move {
                    let number = first_index + index + 1;
                    let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                    self.peak.fetch_max(now, Ordering::SeqCst);
                    let key = format!("researcher.{number}");
                    let findings = self
                        .step(&key, || async {
                            Ok(self.researcher(number, topic.clone()).await)
                        })
                        .await
                        .unwrap_or_else(|RunFailure::Failed { message, .. }| {
                            Findings::failed(topic, message)
                        });
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
    pub(super) async fn researcher(&self, number: usize, topic: String) -> Findings {
        if self.budget_spent().await {
            return Findings::failed(
                topic,
                "not researched: the research had reached its budget".to_string(),
            );
        }
        let outcome = match self.role(ModelRole::Research) {
            Some(role) => self.react(number, &topic, role).await,
            None => self.gather(number, &topic).await,
        };
        let mut findings = match outcome {
            Ok(findings) => findings,
            Err(message) => Findings::failed(topic.clone(), message),
        };
        if let Some(why) = &findings.failed {
            let _ = self
                .progress
                .error(
                    RunErrorType::Tool,
                    &format!("researcher {number} could not research {topic:?}: {why}"),
                    false,
                    StepMeta::researcher(number, &topic),
                )
                .await;
        }
        if findings.text.is_empty() && !findings.passages.is_empty() {
            findings.text = passages_text(&findings.passages);
        }
        findings
    }

    /// The ReAct loop of a researcher with a model: search, fetch, think, then compress.
    pub(super) async fn react(
        &self,
        number: usize,
        topic: &str,
        role: &RoleModel,
    ) -> Result<Findings, String> {
        let meta = StepMeta::researcher(number, topic);
        let _ = self
            .progress
            .emit(RunEvent::thinking(
                "research_execution",
                format!("Researcher {number} started: {topic}"),
                Some(meta),
            ))
            .await;
        let system = Prompt::ResearchResearcher
            .render(&[
                ("date", &today()),
                ("topic", topic),
                ("max_calls", &self.config.max_react_tool_calls.to_string()),
            ])
            .map_err(|error| error.to_string())?;
        let mut messages = vec![ChatMessage::system(system), ChatMessage::user(topic)];
        let mut calls = 0u32;
        let mut read: Vec<String> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let mut searched = false;
        let notes = loop {
            let mut request = ChatRequest::new(messages.clone());
            // Past the tool-call cap or the research's budget, the model answers with what
            // it has.
            let budget_left =
                calls < self.config.max_react_tool_calls && !self.budget_spent().await;
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
                    searched |= is_reading_call(call);
                    self.researcher_tool(number, topic, call, &mut read, &mut failures)
                        .await
                };
                messages.push(ChatMessage::tool_result(&call.id, result));
            }
        };
        if !searched {
            // The model never searched nor fetched (it answered in prose, or its calls did not
            // parse): research the topic as without a model, so the findings rest on sources.
            let _ = self
                .progress
                .fallback(
                    "research_execution",
                    "researcher",
                    &format!(
                        "Researcher {number} searches the topic and keeps the passages most similar to it"
                    ),
                    "the research model made no usable web_search or fetch_url call",
                    Some(StepMeta::researcher(number, topic)),
                )
                .await;
            return self.gather(number, topic).await;
        }
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

    pub(super) async fn researcher_tool(
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
            .emit(RunEvent::ToolCall(ToolCallEvent {
                id: None,
                name: None,
                tool: Some(call.name.clone()),
                arguments: arguments.clone(),
                stage: Some("research_execution".into()),
                content: Some(format!("{} {}", call.name, arguments)),
                metadata: Some(StepMeta::researcher(number, topic)),
            }))
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
                    .emit(RunEvent::thinking(
                        "research_execution",
                        reflection,
                        Some(StepMeta {
                            researcher: Some(number),
                            ..Default::default()
                        }),
                    ))
                    .await;
                "Reflection recorded.".into()
            }
            other => format!("error: unknown tool {other:?}"),
        }
    }

    /// Searches and records the hits as sources (`sources_found`).
    pub(super) async fn search(
        &self,
        number: usize,
        query: &str,
    ) -> Result<Vec<SearchHit>, String> {
        let started = Instant::now();
        let result = self
            .deps
            .search
            .search(self.user, query, self.config.search_results)
            .await;
        Meter::add(&self.meter.search, started);
        match result {
            Ok(found) => {
                // Sources on domains the request leaves out are never used.
                let (hits, excluded): (Vec<SearchHit>, Vec<SearchHit>) = found
                    .into_iter()
                    .partition(|hit| self.config.allows(&hit.url));
                self.sources.add_hits(&hits);
                let listed: Vec<FoundSource> = hits
                    .iter()
                    .map(|hit| FoundSource {
                        snippet: Some(hit.snippet.clone()),
                        ..FoundSource::new(&hit.url, &hit.title)
                    })
                    .collect();
                let _ = self
                    .progress
                    .emit(RunEvent::SourcesFound(SourcesFound {
                        stage: "research_execution".into(),
                        content: format!("{} results for {query:?}", hits.len()),
                        sources: listed,
                        metadata: StepMeta {
                            researcher: Some(number),
                            query: Some(query.to_string()),
                            provider: Some(self.deps.search.name().to_string()),
                            excluded_by_domain: Some(excluded.len()),
                            ..Default::default()
                        },
                    }))
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
                        StepMeta {
                            researcher: Some(number),
                            query: Some(query.to_string()),
                            ..Default::default()
                        },
                    )
                    .await;
                Err(message)
            }
        }
    }

    /// Fetches a page once per run; a failure is an `error` event and an error string. A page
    /// that cannot be read (too large, its text not extractable, refused) is remembered as a
    /// bad source and never fetched again, by this attempt or a resumed one.
    pub(super) async fn fetch(&self, number: usize, url: &str) -> Result<Arc<FetchedPage>, String> {
        if !self.config.allows(url) {
            return Err(format!(
                "{url} is on a domain this research leaves out (include_domains / exclude_domains)"
            ));
        }
        if let Some(reason) = self.sources.refused(url) {
            return Err(format!("{url} was not read: {reason}"));
        }
        let cell = self.sources.fetch_cell(url);
        let mut first = false;
        let result = cell
            .get_or_init(|| async {
                first = true;
                let started = Instant::now();
                let fetched = self.deps.fetcher.fetch(url).await;
                Meter::add(&self.meter.fetch, started);
                fetched.map(Arc::new).map_err(|error| {
                    if error.is_permanent() {
                        self.sources.refuse(url, &error.to_string());
                    }
                    format!("fetching {url} failed ({}): {error}", error.label())
                })
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
                            StepMeta {
                                researcher: Some(number),
                                url: Some(url.to_string()),
                                ..Default::default()
                            },
                        )
                        .await;
                }
            }
        }
        result
    }

    /// Research without a model: search the topic, read the top results, keep the passages
    /// most similar to the topic.
    pub(super) async fn gather(&self, number: usize, topic: &str) -> Result<Findings, String> {
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

    /// The passages of the read sources most similar to `topic` among those likely about it,
    /// diverse (MMR).
    pub(super) async fn select_passages(
        &self,
        topic: &str,
        urls: &[String],
    ) -> Result<Vec<Passage>, String> {
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
        let texts: Vec<String> = candidates
            .iter()
            .map(|passage| passage.text.clone())
            .collect();
        let embedder = self.deps.memory.embedder();
        // The topic is a search query (models with a query prompt get it), the passages are
        // what is searched.
        let (query, rest) = tokio::try_join!(embedder.embed_query(topic), embedder.embed(&texts))
            .map_err(|error| format!("embedding passages failed: {error}"))?;
        // Only passages likely about the topic (the calibrated relevance's `source` point)
        // are candidates at all: a topic nothing read answers gets no passage, not the least
        // unrelated ones.
        let relevance = self.deps.memory.relevance();
        let point = self.deps.memory.settings().relevance.source;
        let profile = relevance.profile(topic, query);
        let corpus = Corpus::new(texts.iter().map(|text| Terms::of(text)).collect());
        let relevant: Vec<usize> = (0..candidates.len())
            .filter(|&index| {
                relevance.score_text(
                    &profile,
                    &corpus.texts()[index],
                    &rest[index],
                    Some(&corpus),
                ) >= point
            })
            .collect();
        let vectors: Vec<Vec<f32>> = relevant.iter().map(|&index| rest[index].clone()).collect();
        let chosen = mmr(profile.vector(), &vectors, PASSAGES_PER_TOPIC, 0.7);
        Ok(chosen
            .into_iter()
            .map(|(index, _)| candidates[relevant[index]].clone())
            .collect())
    }

    /// Compresses a researcher's notes and reading with the compression model; without one
    /// (or when it fails), keeps the passages most similar to the topic.
    pub(super) async fn compress(&self, topic: &str, notes: &str, read: &[String]) -> String {
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
        let text = Prompt::ResearchCompress
            .render(&[
                ("topic", topic),
                ("notes", &quote(notes)),
                ("sources", &sources.join("\n\n")),
            ])
            .inspect_err(|error| tracing::error!(%error, "compression falls back to passages"));
        if let Some(role) = self.role(ModelRole::Compression)
            && let Ok(text) = text
        {
            let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
            request.max_tokens = Some(role.max_tokens);
            match self.complete("compression", role, request).await {
                Ok(response) if !response.content.trim().is_empty() => return response.content,
                Ok(_) => {
                    let _ = self
                        .progress
                        .fallback(
                            "research_execution",
                            "compression",
                            "The findings are the passages most similar to the topic",
                            "the compression model answered with nothing",
                            Some(StepMeta {
                                topic: Some(topic.to_string()),
                                ..Default::default()
                            }),
                        )
                        .await;
                }
                Err(error) => {
                    let _ = self
                        .progress
                        .error(
                            RunErrorType::Llm,
                            &format!("compressing the findings on {topic:?} failed: {}; keeping the most similar passages", error.message),
                            error.retryable(),
                            StepMeta { topic: Some(topic.to_string()), ..Default::default() },
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
}

pub(super) fn supervisor_tools() -> Vec<ToolSpec> {
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

pub(super) fn researcher_tools() -> Vec<ToolSpec> {
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

pub(super) fn think_tool() -> ToolSpec {
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

pub(super) fn assistant_with_calls(response: &ChatResponse) -> ChatMessage {
    ChatMessage {
        role: ChatRole::Assistant,
        content: response.content.clone(),
        tool_calls: response.tool_calls.clone(),
        tool_call_id: None,
    }
}

/// Whether a researcher's tool call is a search or a fetch with the argument it needs (what
/// `researcher_tool` runs).
pub(super) fn is_reading_call(call: &ToolCall) -> bool {
    let key = match call.name.as_str() {
        "web_search" => "query",
        "fetch_url" => "url",
        _ => return false,
    };
    arguments(call)[key]
        .as_str()
        .is_some_and(|value| !value.trim().is_empty())
}

pub(super) fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({ "raw": call.arguments }))
}

/// The topics one supervisor round asked to research, the ids of the calls that asked, and
/// whether it called the research complete.
struct Planned {
    topics: Vec<String>,
    topic_calls: Vec<String>,
    complete: bool,
}

/// Reads a supervisor round's tool calls: `conduct_research` topics are collected (their
/// calls answered later, by [`answer_topic_calls`]); `think`, `research_complete`, a topic
/// that is not a non-empty string and an unknown tool are answered now.
fn planned(calls: &[ToolCall], messages: &mut Vec<ChatMessage>) -> Planned {
    let mut planned = Planned {
        topics: Vec::new(),
        topic_calls: Vec::new(),
        complete: false,
    };
    for call in calls {
        let arguments = arguments(call);
        match call.name.as_str() {
            "conduct_research" => match arguments["research_topic"]
                .as_str()
                .map(str::trim)
                .filter(|topic| !topic.is_empty())
            {
                Some(topic) => {
                    planned.topics.push(topic.to_string());
                    planned.topic_calls.push(call.id.clone());
                }
                None => messages.push(ChatMessage::tool_result(
                    &call.id,
                    "error: research_topic must be a non-empty string",
                )),
            },
            "think" => {
                messages.push(ChatMessage::tool_result(&call.id, "Reflection recorded."));
            }
            "research_complete" => {
                planned.complete = true;
                messages.push(ChatMessage::tool_result(&call.id, "Research complete."));
            }
            other => messages.push(ChatMessage::tool_result(
                &call.id,
                format!("error: unknown tool {other:?}"),
            )),
        }
    }
    planned
}

/// Answers a round's `conduct_research` calls with what their researchers found; when the
/// user replaced the plan (`edited`), the calls are answered together, the first with every
/// finding.
fn answer_topic_calls(
    topic_calls: &[String],
    found: &[Findings],
    edited: bool,
    messages: &mut Vec<ChatMessage>,
) {
    if edited {
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
        for (id, found) in topic_calls.iter().zip(found) {
            let content = match &found.failed {
                Some(why) => format!("This research failed: {why}\n{}", found.text),
                None => found.text.clone(),
            };
            messages.push(ChatMessage::tool_result(id, content));
        }
    }
}
