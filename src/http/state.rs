//! `AppState`: everything a request handler may use — the backends as trait objects, the
//! services built on them, and the shutdown tokens.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::FromRef;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::agent::chat::ChatService;
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::llm::roles::Models;
use crate::memory::MemoryEngine;
use crate::memory::writer::MemoryWriter;
use crate::research::ResearchService;
use crate::runs::RunHub;
use crate::store::Store;

/// Everything a request handler may use.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub auth: Arc<Authenticator>,
    /// Per-user request quota, checked with authentication.
    pub rate_limit: Arc<super::limits::UserRateLimit>,
    pub runs: Arc<RunHub>,
    pub memory: Arc<MemoryEngine>,
    /// Per-role language models; empty when no LLM is configured.
    pub models: Models,
    pub writer: Arc<MemoryWriter>,
    pub research: Arc<ResearchService>,
    /// Starts chat turns.
    pub chat: ChatService,
    /// Cancelled to begin shutdown.
    pub shutdown: CancellationToken,
    /// Cancelled once runs have recorded their end; open event streams then close.
    pub streams_stop: CancellationToken,
    pub metrics: PrometheusHandle,
    pub started_at: Instant,
    /// The database URL with any password hidden.
    pub database_display: String,
    /// This process's hold on the data directory (released at shutdown).
    pub data_lock: Arc<crate::datadir::DataDirLock>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        state.auth.clone()
    }
}

impl FromRef<AppState> for Arc<super::limits::UserRateLimit> {
    fn from_ref(state: &AppState) -> Self {
        state.rate_limit.clone()
    }
}
