//! Per-role models from configuration: each role (chat, research, summarization, compression,
//! final_report, memory) gets the default model or its own, at the default endpoint or its own
//! (with its own key), with its own `max_tokens` and context window. Roles served by one
//! endpoint share one reachability probe.

use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;
use serde::Serialize;

use super::chat::{ChatModel, RoleModel};
use super::fit::{Fitted, TokenCounter};
use super::openai::{Endpoint, OpenAiChat};
use crate::config::{LlmSettings, ModelRole};
use strum::VariantArray;

/// The configured models; empty when no LLM endpoint is configured.
#[derive(Clone, Default)]
pub struct Models {
    roles: Vec<RoleModel>,
    pub structured_retries: u32,
}

/// Whether the endpoint answers, checked with `GET {base_url}/models` (cheap on every
/// OpenAI-compatible server) at most once per `PROBE_TTL`.
pub struct Probe {
    url: String,
    http: reqwest::Client,
    last: tokio::sync::Mutex<Option<(std::time::Instant, Reachability)>>,
}

/// What the last probe of the model endpoint found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum Reachability {
    Ok,
    /// The endpoint did not answer, or answered with an error; `error` says how (never the
    /// key).
    Down {
        error: String,
    },
}

const PROBE_TTL: Duration = Duration::from_secs(15);
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl Probe {
    fn new(endpoint: &Endpoint) -> Self {
        Self {
            url: endpoint.url("models"),
            http: reqwest::Client::builder()
                .timeout(PROBE_TIMEOUT)
                .default_headers(endpoint.headers())
                .build()
                .unwrap_or_default(),
            last: tokio::sync::Mutex::new(None),
        }
    }

    async fn check(&self) -> Reachability {
        let mut last = self.last.lock().await;
        if let Some((at, found)) = last.as_ref()
            && at.elapsed() < PROBE_TTL
        {
            return found.clone();
        }
        let found = match self.http.get(&self.url).send().await {
            Ok(response) if response.status().is_success() => Reachability::Ok,
            Ok(response) => Reachability::Down {
                error: format!("GET /models answered {}", response.status()),
            },
            Err(error) if error.is_timeout() => Reachability::Down {
                error: format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
            },
            Err(error) if error.is_connect() => Reachability::Down {
                error: "connection refused or host unreachable".into(),
            },
            Err(_) => Reachability::Down {
                error: "the request failed".into(),
            },
        };
        *last = Some((std::time::Instant::now(), found.clone()));
        found
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ModelInfo {
    pub role: ModelRole,
    pub model: String,
    pub max_tokens: u32,
    /// The model's context window in tokens (prompt and answer); prompts are fitted to it.
    pub context_tokens: u32,
    /// Where the model is served: the endpoint's host and port (never a path, query or key).
    pub provider: String,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list()).finish()
    }
}

/// `host[:port]` of a base URL, for display.
fn provider(base_url: &str) -> String {
    url::Url::parse(base_url)
        .ok()
        .and_then(|url| {
            let host = url.host_str()?.to_string();
            Some(match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

impl Models {
    pub fn from_settings(settings: &LlmSettings) -> Self {
        let mut probes: Vec<Arc<Probe>> = Vec::new();
        let roles = ModelRole::VARIANTS
            .iter()
            .filter_map(|&role| {
                let resolved = settings.role_endpoint(role)?;
                let endpoint = Endpoint {
                    base_url: resolved.base_url.clone(),
                    api_key: resolved
                        .api_key
                        .as_ref()
                        .map(|key| key.expose_secret().to_string()),
                    timeout: Duration::from_secs(settings.timeout_secs.max(1)),
                    retry: crate::retry::RetryPolicy::new(
                        settings.max_retries,
                        Duration::from_millis(settings.retry_backoff_ms),
                    ),
                    prices: settings.prices.clone(),
                };
                let probe = match probes
                    .iter()
                    .find(|probe| probe.url == endpoint.url("models"))
                {
                    Some(probe) => probe.clone(),
                    None => {
                        let probe = Arc::new(Probe::new(&endpoint));
                        probes.push(probe.clone());
                        probe
                    }
                };
                let counter = match &resolved.tokenizer {
                    Some(path) => TokenCounter::from_file(path).unwrap_or_else(|error| {
                        tracing::warn!(%error, "counting tokens by estimate instead");
                        TokenCounter::Estimate
                    }),
                    None => TokenCounter::Estimate,
                };
                let wire: Arc<dyn ChatModel> = Arc::new(OpenAiChat::new(&endpoint, resolved.model));
                Some(RoleModel {
                    role,
                    model: Arc::new(Fitted::new(
                        wire,
                        resolved.context_tokens,
                        resolved.max_tokens,
                        counter,
                    )),
                    max_tokens: resolved.max_tokens,
                    context_tokens: resolved.context_tokens,
                    provider: provider(&resolved.base_url),
                    probe: Some(probe),
                })
            })
            .collect();
        Self {
            roles,
            structured_retries: settings.max_structured_output_retries,
        }
    }

    /// Whether every model endpoint answers (each cached for a few seconds); the first one
    /// down is named with the roles it serves. `None` when no model is configured.
    pub(crate) async fn reachability(&self) -> Option<Reachability> {
        if !self.configured() {
            return None;
        }
        let mut checked: Vec<&Arc<Probe>> = Vec::new();
        for role in &self.roles {
            let Some(probe) = &role.probe else { continue };
            if checked.iter().any(|seen| Arc::ptr_eq(seen, probe)) {
                continue;
            }
            checked.push(probe);
            if let Reachability::Down { error } = probe.check().await {
                let roles: Vec<&str> = self
                    .roles
                    .iter()
                    .filter(|other| {
                        other
                            .probe
                            .as_ref()
                            .is_some_and(|other| Arc::ptr_eq(other, probe))
                    })
                    .map(|other| other.role.as_str())
                    .collect();
                return Some(Reachability::Down {
                    error: format!("{} ({}): {error}", role.provider, roles.join(", ")),
                });
            }
        }
        Some(Reachability::Ok)
    }

    /// The model for a role, if any is configured.
    pub fn role(&self, role: ModelRole) -> Option<&RoleModel> {
        self.roles.iter().find(|model| model.role == role)
    }

    /// A configured model by name, to answer as the chat role does (its token cap is the
    /// chat role's): the model of any role may be asked for by name.
    pub(crate) fn named(&self, name: &str) -> Option<RoleModel> {
        let model = self.roles.iter().find(|role| role.model.model() == name)?;
        Some(RoleModel {
            role: ModelRole::Chat,
            max_tokens: self
                .role(ModelRole::Chat)
                .map_or(model.max_tokens, |chat| chat.max_tokens)
                .min(model.context_tokens / 2),
            ..model.clone()
        })
    }

    /// The distinct names of the configured models, the chat role's first.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let chat = self.role(ModelRole::Chat).into_iter();
        for role in chat.chain(self.roles.iter()) {
            let name = role.model.model().to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    pub fn configured(&self) -> bool {
        !self.roles.is_empty()
    }

    pub(crate) fn list(&self) -> Vec<ModelInfo> {
        self.roles
            .iter()
            .map(|role| ModelInfo {
                role: role.role,
                model: role.model.model().to_string(),
                max_tokens: role.max_tokens,
                context_tokens: role.context_tokens,
                provider: role.provider.clone(),
            })
            .collect()
    }
}
