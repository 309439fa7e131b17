//! Deep research: the workflow (brief → supervisor → parallel researchers → compression →
//! cited report), search providers, safe page fetching and text extraction.
//!
//! `ResearchService` is what the HTTP layer, the chat agent's `deep_research` tool and the CLI
//! use: it checks a request, resolves its configuration and models, picks the search provider,
//! and runs the workflow in a run of its own or inside a chat run.

pub mod export;
pub mod request;
pub(crate) mod workflow;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Settings;
use crate::llm::roles::Models;
use crate::memory::MemoryEngine;
use crate::runs::{RunContext, RunFailure, RunHub};
use crate::search;
use crate::search::fetch::{FetchPolicy, Fetcher};
use crate::store::{Run, RunId, RunKind, Store, StoreError, UserId};
use request::{ResearchRequest, ResolvedConfig};
use workflow::{Durable, ResearchDeps, ResearchSummary, SavedResearch, run_research};

/// Why a research could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The request is wrong (a client mistake).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    NotAdmitted(#[from] crate::runs::NotAdmitted),
    /// The request is right but cannot run now (it follows up a research still running).
    #[error("{0}")]
    Conflict(String),
}

/// Why the research service could not be set up from the settings.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `research.fetch.allow_addrs` is not a list of `ip:port`.
    #[error("{0}")]
    AllowList(String),
    /// The page fetcher's HTTP client could not be built.
    #[error("the page fetcher: {0}")]
    Fetcher(#[from] crate::search::fetch::FetchError),
}

/// Starts and runs researches.
pub struct ResearchService {
    settings: Arc<Settings>,
    store: Arc<dyn Store>,
    memory: Arc<MemoryEngine>,
    runs: Arc<RunHub>,
    fetcher: Fetcher,
    /// The server's models, used by every request that chooses none of its own.
    models: Models,
    /// Every provider, built once: a web provider holds its HTTP client (connection pool);
    /// one that is not configured holds the reason.
    providers: search::Providers,
    /// The fonts a PDF export is written with, found once on the system.
    fonts: Arc<export::Fonts>,
    /// The last probe of the default search provider, and when it was made.
    probed: tokio::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>,
}

/// How long `/health` reuses a probe of the search provider.
const SEARCH_PROBE_TTL: Duration = Duration::from_secs(15);

/// A checked request: its configuration and everything it runs with.
pub(crate) struct Prepared {
    pub config: ResolvedConfig,
    pub deps: ResearchDeps,
    /// The request as a checkpoint keeps it, when another attempt could rebuild the research
    /// from it (not when it brings its own API key, which is never stored).
    pub recipe: Option<serde_json::Value>,
}

impl ResearchService {
    pub(crate) fn new(
        settings: Arc<Settings>,
        store: Arc<dyn Store>,
        memory: Arc<MemoryEngine>,
        runs: Arc<RunHub>,
        models: Models,
        providers: search::Providers,
    ) -> Result<Arc<Self>, SetupError> {
        let fetch = &settings.research.fetch;
        let allow = parse_allow(&fetch.allow_addrs).map_err(SetupError::AllowList)?;
        let policy = FetchPolicy {
            max_body_bytes: fetch.max_body_bytes,
            timeout: Duration::from_secs(fetch.timeout_secs.max(1)),
            max_redirects: fetch.max_redirects,
            allow,
            ..FetchPolicy::default()
        };
        let fetcher = Fetcher::new(policy)?;
        Ok(Arc::new(Self {
            settings,
            store,
            memory,
            runs,
            fetcher,
            models,
            providers,
            probed: tokio::sync::Mutex::new(None),
            fonts: Arc::new(export::Fonts::system()),
        }))
    }

    /// Every provider name with whether it can run here (its key or URL is configured) and,
    /// when it cannot, why; in the order of `search::provider_names`.
    pub(crate) fn search_providers(&self) -> Vec<(&'static str, Option<String>)> {
        search::provider_names()
            .into_iter()
            .map(|name| {
                let problem = match self.providers.get(name) {
                    Some(Ok(_)) => None,
                    Some(Err(reason)) => Some(reason.clone()),
                    None => Some("not built".to_string()),
                };
                (name, problem)
            })
            .collect()
    }

    /// `/health`'s view of the default search provider: `ok`, `down` (its address does not
    /// answer: the error says where and why) or `not_configured` (what is missing). A probe is
    /// reused for a few seconds.
    pub(crate) async fn search_health(&self) -> serde_json::Value {
        let mut last = self.probed.lock().await;
        if let Some((at, found)) = last.as_ref()
            && at.elapsed() < SEARCH_PROBE_TTL
        {
            return found.clone();
        }
        let name = self.default_search_api().to_string();
        let found = match self.providers.get(name.as_str()) {
            Some(Ok(provider)) => {
                let url = provider
                    .endpoint()
                    .and_then(|base| url::Url::parse(base).ok())
                    .map(|url| search::endpoint(&url));
                match search::probe(provider.as_ref()).await {
                    Ok(()) => serde_json::json!({ "status": "ok", "provider": name, "url": url }),
                    Err(error) => serde_json::json!({
                        "status": "down", "provider": name, "url": url, "error": error.to_string(),
                    }),
                }
            }
            Some(Err(reason)) => {
                serde_json::json!({ "status": "not_configured", "provider": name, "error": reason })
            }
            None => serde_json::json!({
                "status": "not_configured", "provider": name, "error": "unknown search provider",
            }),
        };
        *last = Some((std::time::Instant::now(), found.clone()));
        found
    }

    /// The fonts PDF exports are written with.
    pub fn fonts(&self) -> Arc<export::Fonts> {
        self.fonts.clone()
    }

    /// The search provider used when a request names none.
    pub(crate) fn default_search_api(&self) -> &str {
        self.settings.research.search.default_provider.as_str()
    }

    /// Checks a request and resolves what it would run with, without running it.
    pub(crate) fn prepare(&self, request: &ResearchRequest) -> Result<Prepared, StartError> {
        let (config, models) = request
            .resolve(
                &self.settings.research,
                &self.settings.llm,
                self.default_search_api(),
                Some(&self.models),
            )
            .map_err(StartError::Invalid)?;
        let mut chosen: Vec<Arc<dyn search::SearchProvider>> = Vec::new();
        for name in config.providers() {
            chosen.push(match self.providers.get(name.as_str()) {
                Some(Ok(provider)) => provider.clone(),
                Some(Err(reason)) => return Err(StartError::Invalid(reason.clone())),
                // Unknown: the constructor names the valid providers.
                None => search::web_provider(&name, &self.settings.research.search)
                    .map_err(|error| StartError::Invalid(error.to_string()))?,
            });
        }
        let search: Arc<dyn search::SearchProvider> = if chosen.len() == 1 {
            chosen.remove(0)
        } else {
            Arc::new(search::Multi::new(chosen))
        };
        let recipe = if request.api_key.is_some() {
            None
        } else {
            serde_json::to_value(request).ok()
        };
        Ok(Prepared {
            config,
            recipe,
            deps: ResearchDeps {
                store: self.store.clone(),
                memory: self.memory.clone(),
                models,
                search,
                fetcher: self.fetcher.clone(),
                delta_interval: Duration::from_millis(self.settings.chat.delta_interval_ms.max(1)),
            },
        })
    }

    /// Starts a research in a run of its own; its id is the run's id.
    pub async fn start(
        &self,
        user: UserId,
        request: &ResearchRequest,
    ) -> Result<(Run, ResolvedConfig), StartError> {
        self.start_prepared(user, self.prepare(request)?).await
    }

    /// `start` for a request already checked by `prepare`.
    pub(crate) async fn start_prepared(
        &self,
        user: UserId,
        prepared: Prepared,
    ) -> Result<(Run, ResolvedConfig), StartError> {
        if let Some(thread) = prepared.config.thread_id {
            self.store.user(user).get_thread(thread).await?;
        }
        self.check_follow_up(user, &prepared.config).await?;
        self.runs.admit(user).await?;
        let config = prepared.config.clone();
        let run = self
            .runs
            .start(user, config.thread_id, RunKind::Research, move |context| {
                let id = context.run.id;
                let durable = prepared.recipe.map(|request| Durable {
                    request,
                    journal: None,
                });
                async move {
                    run_research(context, prepared.deps, prepared.config, id, durable)
                        .await
                        .map(|_| ())
                }
            })
            .await?;
        Ok((run, config))
    }

    /// A follow-up must name one of the user's researches (another user's is not found) that
    /// has ended.
    async fn check_follow_up(
        &self,
        user: UserId,
        config: &ResolvedConfig,
    ) -> Result<(), StartError> {
        if let Some(id) = config.follow_up_of {
            let earlier = self.store.user(user).get_research(id).await?;
            if earlier.status == crate::store::RunStatus::Running {
                return Err(StartError::Conflict(
                    "the research to follow up is still running; follow it up when it has ended"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Runs a research inside another run (the chat agent's `deep_research` tool); its events
    /// go to that run's log.
    pub(crate) async fn run_inside(
        &self,
        context: Arc<RunContext>,
        request: &ResearchRequest,
    ) -> Result<ResearchSummary, RunFailure> {
        let invalid = |error: StartError| RunFailure::Failed {
            error_type: crate::runs::RunErrorType::Validation,
            message: error.to_string(),
            retryable: false,
        };
        let prepared = self.prepare(request).map_err(invalid)?;
        self.check_follow_up(context.user, &prepared.config)
            .await
            .map_err(invalid)?;
        run_research(context, prepared.deps, prepared.config, RunId::new(), None).await
    }

    /// The body continuing a research taken over from a replica that stopped: rebuilt from the
    /// request its checkpoint keeps, it goes on after the last step it finished.
    pub(crate) fn resume(
        &self,
        checkpoint: &crate::runs::Checkpoint,
    ) -> Result<crate::runs::ResumedBody, String> {
        let saved: SavedResearch = serde_json::from_value(checkpoint.body.clone())
            .map_err(|error| format!("not a research's checkpoint: {error}"))?;
        let request: ResearchRequest = serde_json::from_value(saved.research.request.clone())
            .map_err(|error| format!("the research's request is unreadable: {error}"))?;
        let prepared = self
            .prepare(&request)
            .map_err(|error| format!("the research cannot be prepared again: {error}"))?;
        let durable = Durable {
            request: saved.research.request,
            journal: Some(saved.research.journal),
        };
        Ok(Box::new(move |context| {
            Box::pin(async move {
                let id = context.run.id;
                run_research(context, prepared.deps, prepared.config, id, Some(durable))
                    .await
                    .map(|_| ())
            })
        }))
    }
}

/// `ip:port` pairs the fetcher may reach even though they are private (tests only).
fn parse_allow(text: &str) -> Result<Vec<SocketAddr>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<SocketAddr>()
                .map_err(|_| format!("research.fetch.allow_addrs: {part:?} is not an ip:port"))
        })
        .collect()
}
