//! Builds the application state from settings and serves it: `build_state`, then `serve(listener,
//! state)` until the shutdown token is cancelled. Shutdown order: stop accepting connections,
//! let running runs record their end (bounded by `server.shutdown_grace_secs`), end open event
//! streams, then close the database pool.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::FromRef;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::jwt::JwtVerifier;
use crate::auth::{Authenticator, DEV_USER};
use crate::config::Settings;
use crate::llm::roles::Models;
use crate::memory::writer::MemoryWriter;
use crate::memory::{MemoryEngine, MemoryError};
use crate::research::ResearchService;
use crate::runs::RunHub;
use crate::store::{self, Store, UserKind};

/// Everything a request handler may use.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub auth: Arc<Authenticator>,
    pub runs: Arc<RunHub>,
    pub memory: Arc<MemoryEngine>,
    /// Per-role language models; empty when no LLM is configured.
    pub models: Models,
    pub writer: Arc<MemoryWriter>,
    pub research: Arc<ResearchService>,
    /// Cancelled to begin shutdown.
    pub shutdown: CancellationToken,
    /// Cancelled once runs have recorded their end; open event streams then close.
    pub streams_stop: CancellationToken,
    pub metrics: PrometheusHandle,
    pub started_at: Instant,
    /// The database URL with any password hidden.
    pub database_display: String,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        state.auth.clone()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Jwt(#[from] crate::auth::jwt::JwtError),
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// The process-wide Prometheus recorder (metrics macros use one global recorder).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by an embedding program); the
            // handle still renders what this recorder sees.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Opens the store (running migrations), recovers runs interrupted by a crash, and wires the
/// state. Refuses `--dev` on a non-loopback address.
pub async fn build_state(
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<AppState, StartupError> {
    let addr = settings.listen_addr()?;
    if settings.server.dev && !addr.ip().is_loopback() {
        return Err(StartupError::Refused(format!(
            "--dev serves a user without keys and is allowed only on a loopback address, not {addr}"
        )));
    }
    std::fs::create_dir_all(&settings.data_dir)?;
    let url = settings.database_url();
    let store = store::connect(&url, settings.database.max_connections).await?;
    let jwt = JwtVerifier::from_settings(&settings.auth.jwt)?;
    let dev_user = if settings.server.dev {
        Some(store.ensure_user(DEV_USER, UserKind::Dev).await?)
    } else {
        None
    };
    let auth = Arc::new(Authenticator::new(store.clone(), jwt, dev_user));
    let abandon = settings.server.abandon_run_after_secs;
    let runs = RunHub::new(
        store.clone(),
        shutdown.child_token(),
        (abandon > 0).then(|| Duration::from_secs(abandon)),
    );
    let memory = MemoryEngine::open(&settings, store.clone(), shutdown.child_token()).await?;
    memory.track(spawn_reembedding(memory.clone(), shutdown.child_token()));
    let decay = crate::memory::decay::spawn(
        store.clone(),
        memory.indexer().clone(),
        settings.memory.clone(),
        shutdown.child_token(),
    );
    let models = Models::from_settings(&settings.llm);
    let writer = MemoryWriter::new(store.clone(), memory.clone(), models.clone());
    memory.track(decay);
    for worker in writer.spawn(settings.memory.writer_workers, shutdown.child_token()) {
        memory.track(worker);
    }
    let recovered = runs.recover_interrupted().await?;
    if recovered > 0 {
        tracing::warn!(recovered, "marked runs interrupted by the previous process");
    }
    let interrupted = store.interrupt_running_research().await?;
    if interrupted > 0 {
        tracing::warn!(
            interrupted,
            "marked researches interrupted by the previous process"
        );
    }
    let settings = Arc::new(settings);
    let research = ResearchService::new(
        settings.clone(),
        store.clone(),
        memory.clone(),
        runs.clone(),
        models.clone(),
    )
    .map_err(StartupError::Refused)?;
    Ok(AppState {
        settings,
        research,
        store,
        auth,
        runs,
        memory,
        models,
        writer,
        shutdown,
        streams_stop: CancellationToken::new(),
        metrics: metrics_handle(),
        started_at: Instant::now(),
        database_display: store::redact_url(&url),
    })
}

/// Re-embeds, in the background, memories made by another embedding model than the current
/// one, logging progress.
fn spawn_reembedding(
    memory: Arc<MemoryEngine>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let progress = |done: u64, total: u64| {
            if done == total || done % 1024 < 64 {
                tracing::info!(done, total, "re-embedding memories for the current model");
            }
        };
        let outcome = tokio::select! {
            outcome = memory.reembed_stale(progress) => outcome,
            _ = shutdown.cancelled() => return,
        };
        match outcome {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "re-embedding finished"),
            Err(error) => tracing::error!(%error, "re-embedding failed"),
        }
    })
}

/// Binds the configured address (a port of 0 picks a free one).
pub async fn bind(settings: &Settings) -> Result<TcpListener, StartupError> {
    let addr: SocketAddr = settings.listen_addr()?;
    Ok(TcpListener::bind(addr).await?)
}

/// Serves until `state.shutdown` is cancelled, then shuts down in order.
pub async fn serve(listener: TcpListener, state: AppState) -> Result<(), StartupError> {
    let app = crate::http::router(state.clone());
    let shutdown = state.shutdown.clone();
    let runs = state.runs.clone();
    let streams_stop = state.streams_stop.clone();
    let grace = Duration::from_secs(state.settings.server.shutdown_grace_secs);
    let signal = async move {
        shutdown.cancelled().await;
        tracing::info!("shutting down: finishing runs and closing streams");
        runs.shutdown(grace).await;
        streams_stop.cancel();
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await?;
    state.memory.join_background(grace).await;
    state.store.close().await;
    Ok(())
}

/// Cancels `token` on Ctrl-C or SIGTERM.
pub async fn shutdown_on_signal(token: CancellationToken) {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    token.cancel();
}
