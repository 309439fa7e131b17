//! Per-role models from configuration: each role (chat, research, summarization, compression,
//! final_report, memory) gets the default model or its own, with its own `max_tokens`.

use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;
use serde::Serialize;

use super::chat::RoleModel;
use super::openai::{Endpoint, OpenAiChat};
use crate::config::{LlmSettings, ModelRole};
use strum::VariantArray;

/// The configured models; empty when no LLM endpoint is configured.
#[derive(Clone, Default)]
pub struct Models {
    roles: Vec<RoleModel>,
    pub structured_retries: u32,
    probe: Option<Arc<Probe>>,
}

/// Whether the endpoint answers, checked with `GET {base_url}/models` (cheap on every
/// OpenAI-compatible server) at most once per `PROBE_TTL`.
struct Probe {
    url: String,
    api_key: Option<String>,
    http: reqwest::Client,
    last: tokio::sync::Mutex<Option<(std::time::Instant, Reachability)>>,
}

/// What the last probe of the model endpoint found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Reachability {
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
    async fn check(&self) -> Reachability {
        let mut last = self.last.lock().await;
        if let Some((at, found)) = last.as_ref()
            && at.elapsed() < PROBE_TTL
        {
            return found.clone();
        }
        let mut request = self.http.get(&self.url);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let found = match request.send().await {
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
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list()).finish()
    }
}

impl Models {
    pub fn from_settings(settings: &LlmSettings) -> Self {
        let Some(base_url) = settings.base_url.as_ref().filter(|url| !url.is_empty()) else {
            return Self::default();
        };
        let endpoint = Endpoint {
            base_url: base_url.clone(),
            api_key: settings
                .api_key
                .as_ref()
                .map(|key| key.expose_secret().to_string()),
            timeout: Duration::from_secs(settings.timeout_secs.max(1)),
            retries: settings.max_retries,
            backoff: Duration::from_millis(settings.retry_backoff_ms),
            prices: settings.prices.clone(),
        };
        let roles = ModelRole::VARIANTS
            .iter()
            .filter_map(|&role| {
                let own = settings.roles.get(&role);
                let model = own
                    .and_then(|own| own.model.clone())
                    .or_else(|| settings.model.clone())?;
                Some(RoleModel {
                    role,
                    model: Arc::new(OpenAiChat::new(&endpoint, model)),
                    max_tokens: own
                        .and_then(|own| own.max_tokens)
                        .unwrap_or(role.default_max_tokens()),
                })
            })
            .collect();
        let probe = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .build()
            .ok()
            .map(|http| {
                Arc::new(Probe {
                    url: format!("{}/models", base_url.trim_end_matches('/')),
                    api_key: endpoint.api_key.clone(),
                    http,
                    last: tokio::sync::Mutex::new(None),
                })
            });
        Self {
            roles,
            structured_retries: settings.max_structured_output_retries,
            probe,
        }
    }

    /// Whether the model endpoint answers (cached for a few seconds); `None` when no model is
    /// configured.
    pub async fn reachability(&self) -> Option<Reachability> {
        if !self.configured() {
            return None;
        }
        match &self.probe {
            Some(probe) => Some(probe.check().await),
            None => Some(Reachability::Ok),
        }
    }

    /// The model for a role, if any is configured.
    pub fn role(&self, role: ModelRole) -> Option<&RoleModel> {
        self.roles.iter().find(|model| model.role == role)
    }

    /// A configured model by name, to answer as the chat role does (its token cap is the
    /// chat role's): the model of any role may be asked for by name.
    pub fn named(&self, name: &str) -> Option<RoleModel> {
        let model = self.roles.iter().find(|role| role.model.model() == name)?;
        Some(RoleModel {
            role: ModelRole::Chat,
            model: model.model.clone(),
            max_tokens: self
                .role(ModelRole::Chat)
                .map_or(model.max_tokens, |chat| chat.max_tokens),
        })
    }

    /// The distinct names of the configured models, the chat role's first.
    pub fn names(&self) -> Vec<String> {
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

    pub fn list(&self) -> Vec<ModelInfo> {
        self.roles
            .iter()
            .map(|role| ModelInfo {
                role: role.role,
                model: role.model.model().to_string(),
                max_tokens: role.max_tokens,
            })
            .collect()
    }
}
