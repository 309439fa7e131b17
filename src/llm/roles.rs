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
        Self {
            roles,
            structured_retries: settings.max_structured_output_retries,
        }
    }

    /// The model for a role, if any is configured.
    pub fn role(&self, role: ModelRole) -> Option<&RoleModel> {
        self.roles.iter().find(|model| model.role == role)
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
