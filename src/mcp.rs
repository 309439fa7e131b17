//! mnemo as an MCP server (rmcp): the user's memory and deep research as tools for MCP clients
//! (Claude Desktop, Cursor, any agent). Served over Streamable HTTP at `/mcp` (`http::mcp`
//! authenticates each request and hands the `AuthUser` in through the request's parts) and,
//! for desktop clients that spawn a command, bridged from stdio by `mnemo mcp`.
//!
//! Every tool acts for the user the HTTP request authenticated, never for a user named in its
//! arguments.

use std::sync::Arc;
use std::time::Duration;

use ::http::request::Parts;
use futures::StreamExt;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::agent::chat::{forget_tool, recall_tool};
use crate::auth::AuthUser;
use crate::memory::MemoryEngine;
use crate::research::ResearchService;
use crate::research::request::ResearchRequest;
use crate::runs::RunHub;
use crate::store::{EventType, MemoryFilter, MemoryId, MemoryKind, NewMemory, UserId};

/// How long `remember` waits for the new memory to be searchable before it answers. Milliseconds
/// on an idle server; a busy one (a bulk import, a reindex, two cores shared with other work)
/// can take seconds, and an answer before then would make the tool's promise — recallable
/// right away — untrue. The answer says whether the wait ended in time (`recallable`).
const REMEMBERED_WAIT: Duration = Duration::from_secs(30);

/// The MCP tool server; one per MCP session, all sharing the engines.
#[derive(Clone)]
pub(crate) struct McpServer {
    memory: Arc<MemoryEngine>,
    research: Arc<ResearchService>,
    runs: Arc<RunHub>,
    /// Cancelled at shutdown: open research follows end.
    stop: CancellationToken,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct RecallArgs {
    /// What to look for, in the user's words or yours.
    pub query: String,
    /// How many memories at most (1–20, default 5).
    pub k: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct RememberArgs {
    /// One short, self-contained statement about the user, e.g. "Ana is allergic to peanuts".
    pub content: String,
    /// preference, fact (default) or event.
    pub kind: Option<String>,
    /// 1 (trivia) to 5 (essential); default 3.
    pub importance: Option<u8>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct ForgetArgs {
    /// A description of what to forget; the memories that match it are deleted.
    pub query: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct ListArgs {
    /// Only this kind: turn, preference, fact, event, conclusion, profile or document.
    pub kind: Option<String>,
    /// How many, newest first (1–100, default 20).
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct HistoryArgs {
    /// The memory's id (as `recall_memory` or `list_memories` give it).
    pub id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct ResearchArgs {
    /// The research question, self-contained.
    pub query: String,
    /// Where to search: "local" (the user's own documents) or a configured web search
    /// provider; default the server's.
    pub search_api: Option<String>,
    /// Sources the report may cite at most.
    pub max_sources: Option<usize>,
    /// The id of an earlier research of the user's to follow up: the new research starts
    /// from its sources and report and goes further where `query` asks.
    pub follow_up_of: Option<String>,
    /// The report's type: "detailed" (default), "summary", "outline" or "resources".
    pub report_type: Option<String>,
}

/// A failed tool call the model can read (not a protocol error).
fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn json_result(value: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(value.to_string())])
}

/// The user the HTTP request authenticated (put into the request's parts by `http::mcp`).
fn caller(parts: &Parts) -> Result<UserId, ErrorData> {
    parts
        .extensions
        .get::<AuthUser>()
        .map(|user| user.user_id)
        .ok_or_else(|| ErrorData::invalid_request("the request is not authenticated", None))
}

/// The kind a tool argument names; `Err` says why the name is refused.
fn kind_named(name: Option<&str>) -> Result<Option<MemoryKind>, String> {
    match name.map(str::trim).filter(|name| !name.is_empty()) {
        None => Ok(None),
        Some(name) => MemoryKind::parse(name)
            .map(Some)
            .ok_or_else(|| format!("unknown memory kind {name:?}")),
    }
}

#[tool_router]
impl McpServer {
    pub(crate) fn new(
        memory: Arc<MemoryEngine>,
        research: Arc<ResearchService>,
        runs: Arc<RunHub>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            memory,
            research,
            runs,
            stop,
        }
    }

    #[tool(
        description = "Search what you remember about this user across all sessions (hybrid: meaning and keywords). Returns the best memories with their kind, date, trust and score.",
        annotations(read_only_hint = true)
    )]
    async fn recall_memory(
        &self,
        Parameters(args): Parameters<RecallArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let arguments = json!({ "query": args.query, "k": args.k });
        Ok(match recall_tool(&self.memory, user, &arguments).await {
            Ok((found, _)) => json_result(&found),
            Err(message) => tool_error(message),
        })
    }

    #[tool(
        description = "Store a short, self-contained statement about the user for later sessions (a preference, fact or event). It can be recalled right away."
    )]
    async fn remember(
        &self,
        Parameters(args): Parameters<RememberArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let content = args.content.trim();
        if content.is_empty() {
            return Ok(tool_error("remember needs content"));
        }
        let kind = match kind_named(args.kind.as_deref()) {
            Ok(kind) => kind.unwrap_or(MemoryKind::Fact),
            Err(refused) => return Ok(tool_error(refused)),
        };
        if !matches!(
            kind,
            MemoryKind::Preference | MemoryKind::Fact | MemoryKind::Event
        ) {
            return Ok(tool_error("kind must be preference, fact or event"));
        }
        let importance = args.importance.unwrap_or(3);
        if !(1..=5).contains(&importance) {
            return Ok(tool_error("importance must be between 1 and 5"));
        }
        let memory = NewMemory::from_user(kind, content, importance);
        let written = match self.memory.add_unique(user, vec![memory]).await {
            Ok(unique) if unique.written.is_empty() => {
                let known: Vec<&str> = unique.repeated.iter().map(|m| m.content.as_str()).collect();
                return Ok(json_result(&json!({
                    "remembered": [], "already_known": known, "recallable": true,
                })));
            }
            Ok(unique) => unique.written,
            Err(error) => return Ok(tool_error(crate::error::public_message(&error))),
        };
        // Searchable before the answer, so a recall right after finds it.
        let recallable = match self.memory.wait_recallable(REMEMBERED_WAIT).await {
            Ok(in_time) => in_time,
            Err(error) => {
                tracing::warn!(%error, "waiting for the index after remember");
                false
            }
        };
        if !recallable {
            tracing::warn!(
                wait_secs = REMEMBERED_WAIT.as_secs(),
                "remember answered before its memory was searchable"
            );
        }
        Ok(json_result(
            &json!({ "remembered": written, "recallable": recallable }),
        ))
    }

    #[tool(
        description = "Forget the user's memories that clearly match a description, when the user asks you to forget something: at most a few at once; returns what was forgotten, how many more matched, and until when the user can restore them.",
        annotations(destructive_hint = true)
    )]
    async fn forget(
        &self,
        Parameters(args): Parameters<ForgetArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        Ok(
            match forget_tool(
                &self.memory,
                user,
                &json!({ "query": args.query }),
                crate::store::ForgetVia::Mcp,
            )
            .await
            {
                Ok(forgotten) => json_result(&forgotten),
                Err(message) => tool_error(message),
            },
        )
    }

    #[tool(
        description = "List the user's memories, newest first, optionally of one kind.",
        annotations(read_only_hint = true)
    )]
    async fn list_memories(
        &self,
        Parameters(args): Parameters<ListArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let kind = match kind_named(args.kind.as_deref()) {
            Ok(kind) => kind,
            Err(refused) => return Ok(tool_error(refused)),
        };
        let filter = MemoryFilter {
            kinds: kind.map(|kind| vec![kind]),
            ..MemoryFilter::default()
        };
        let limit = i64::from(args.limit.unwrap_or(20).clamp(1, 100));
        Ok(match self.memory.list(user, &filter, limit, None).await {
            Ok(memories) => json_result(&json!({ "memories": memories })),
            Err(error) => tool_error(crate::error::public_message(&error)),
        })
    }

    #[tool(
        description = "One memory with every earlier version of it (what it said before it was corrected or superseded, and when).",
        annotations(read_only_hint = true)
    )]
    async fn get_memory_history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let Ok(id) = uuid::Uuid::parse_str(args.id.trim()) else {
            return Ok(tool_error("id must be a memory id (a UUID)"));
        };
        Ok(match self.memory.get(user, MemoryId::from_uuid(id)).await {
            Ok((memory, versions)) => {
                json_result(&json!({ "memory": memory, "versions": versions }))
            }
            Err(error) => tool_error(crate::error::public_message(&error)),
        })
    }

    #[tool(
        description = "Search the user's own ingested documents (passages, with their source).",
        annotations(read_only_hint = true)
    )]
    async fn search_documents(
        &self,
        Parameters(args): Parameters<RecallArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let arguments = json!({ "query": args.query, "k": args.k, "kinds": ["document"] });
        Ok(match recall_tool(&self.memory, user, &arguments).await {
            Ok((found, _)) => json_result(&json!({ "passages": found["memories"] })),
            Err(message) => tool_error(message),
        })
    }

    #[tool(
        description = "Research a question in depth (the web, or the user's documents with search_api \"local\") and return a cited report with its sources. Takes minutes; reports progress per stage and can be cancelled."
    )]
    async fn deep_research(
        &self,
        Parameters(args): Parameters<ResearchArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        cancel: CancellationToken,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let user = caller(&parts)?;
        let follow_up_of = match args.follow_up_of.as_deref().map(str::parse).transpose() {
            Ok(id) => id,
            Err(error) => return Ok(tool_error(format!("follow_up_of: {error}"))),
        };
        let request = ResearchRequest {
            query: args.query,
            search_api: args
                .search_api
                .map(crate::research::request::SearchApiChoice::One),
            max_sources: args.max_sources,
            follow_up_of,
            report: args
                .report_type
                .map(|kind| crate::research::request::ReportOptions {
                    kind: Some(kind),
                    ..Default::default()
                }),
            // Nobody can answer a question or review a plan from inside a tool call.
            allow_clarification: Some(false),
            plan_review: Some(false),
            ..ResearchRequest::default()
        };
        let run = match self.research.start(user, &request).await {
            Ok((run, _)) => run,
            Err(error) => return Ok(tool_error(error.to_string())),
        };
        let token = meta.get_progress_token();
        let mut events = Box::pin(self.runs.follow(user, run.id, 0, self.stop.clone()));
        let mut stages = 0u32;
        let mut report: Option<(String, Value)> = None;
        let mut failure: Option<String> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = cancel.cancelled() => {
                    self.runs.cancel(run.id);
                    return Ok(tool_error("the research was cancelled"));
                }
            };
            let Some(event) = event else { break };
            match event.event_type {
                EventType::StageUpdate => {
                    stages += 1;
                    if let Some(token) = &token {
                        let message = format!(
                            "{}: {}",
                            event.data["stage"].as_str().unwrap_or("research"),
                            event.data["content"].as_str().unwrap_or("")
                        );
                        let progress = ProgressNotificationParam::new(token.clone(), stages.into())
                            .with_message(message);
                        if let Err(error) = peer.notify_progress(progress).await {
                            tracing::debug!(%error, "a progress notification was not delivered");
                        }
                    }
                }
                EventType::ResearchComplete => {
                    report = Some((
                        event.data["content"].as_str().unwrap_or("").to_string(),
                        event.data["metadata"]["sources"].clone(),
                    ));
                }
                EventType::Error => {
                    failure = event.data["message"].as_str().map(str::to_string);
                }
                EventType::Done => break,
                _ => {}
            }
        }
        Ok(match report {
            Some((report, sources)) => {
                let sources = json!({ "research_id": run.id, "sources": sources });
                CallToolResult::success(vec![
                    ContentBlock::text(report),
                    ContentBlock::text(sources.to_string()),
                ])
            }
            None => {
                tool_error(failure.unwrap_or_else(|| "the research ended without a report".into()))
            }
        })
    }
}

#[tool_handler]
impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("mnemo", env!("CARGO_PKG_VERSION"))
                    .with_title("mnemo: a research assistant that remembers"),
            )
            .with_instructions(
                "The user's long-term memory and deep research. Recall before answering \
                 questions about the user; remember durable facts and preferences they state; \
                 forget only when asked.",
            )
    }
}
