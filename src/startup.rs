//! Builds the application state from settings (`build_state`): opens the store, builds every
//! backend (embedder, vector and keyword indexes, models, search providers) and injects them as
//! trait objects; `http::serve(listener, state)` then serves it until the shutdown token is
//! cancelled. Shutdown order: stop accepting connections,
//! let running runs record their end (bounded by `server.shutdown_grace_secs`), end open event
//! streams, then close the database pool.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::agent::chat::{ChatDeps, ChatService};
use crate::auth::jwt::JwtVerifier;
use crate::auth::{Authenticator, DEV_USER};
use crate::config::KeywordPlace;
use crate::config::Settings;
use crate::http::AppState;
use crate::index::edge::EdgeVectorIndex;
use crate::index::indexer::VectorWatermark;
use crate::index::keyword::sparse::SparseAnalyzer;
use crate::index::keyword::{KeywordIndex, KeywordSearch};
use crate::index::qdrant::{CollectionLayout, QdrantServerIndex};
use crate::index::vector::{IndexError, VectorIndex};
use crate::llm::roles::Models;
use crate::memory::writer::MemoryWriter;
use crate::memory::{MemoryEngine, MemoryError};
use crate::research::ResearchService;
use crate::runs::{Leases, RunHub, RunLimits};
use crate::store::{self, Store, UserKind};
use secrecy::ExposeSecret as _;

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
    #[error("research: {0}")]
    Research(#[from] crate::research::SetupError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Held(#[from] crate::datadir::LockError),
}

/// Histogram buckets, in seconds, for every latency the server records.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// The process-wide Prometheus recorder (metrics macros use one global recorder).
pub(crate) fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Buckets, not summaries: Prometheus aggregates them across replicas, and a
            // summary's quantiles read 0 until an upkeep task drains its samples.
            let builder = PrometheusBuilder::new();
            let builder = match builder.set_buckets(LATENCY_BUCKETS) {
                Ok(builder) => builder,
                Err(_) => PrometheusBuilder::new(),
            };
            let recorder = builder.build_recorder();
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
    crate::llm::prompts::check().map_err(|error| StartupError::Refused(error.to_string()))?;
    crate::text::extract::configure(&settings.extract);
    let data_lock = Arc::new(crate::datadir::DataDirLock::acquire(&settings.data_dir)?);
    let url = settings.database_url();
    let store = store::connect(
        &url,
        settings.database.max_connections,
        settings.database.acquire_timeout(),
    )
    .await?;
    let jwt = JwtVerifier::from_settings(&settings.auth.jwt)?;
    let dev_user = if settings.server.dev {
        Some(
            store
                .accounts()
                .ensure_user(DEV_USER, UserKind::Dev)
                .await?,
        )
    } else {
        None
    };
    let auth = Arc::new(Authenticator::new(store.clone(), jwt, dev_user));
    let abandon = settings.server.abandon_run_after_secs;
    let runs = RunHub::new(
        store.clone(),
        shutdown.child_token(),
        (abandon > 0).then(|| Duration::from_secs(abandon)),
        RunLimits {
            max_per_user: settings.server.max_runs_per_user,
            run_tokens: (settings.server.run_token_budget > 0)
                .then_some(settings.server.run_token_budget),
            daily_tokens: (settings.server.daily_token_budget > 0)
                .then_some(settings.server.daily_token_budget),
        },
        Leases {
            lease: Duration::from_millis(settings.server.run_lease_ms),
            heartbeat: Duration::from_millis(settings.server.run_heartbeat_ms),
            command_poll: Duration::from_millis(settings.server.run_command_poll_ms),
        },
    );
    // The previous process of this data directory is gone (we hold its lock): its runs are
    // taken over now rather than when their leases run out.
    let predecessor = data_lock
        .swap_replica(runs.replica().as_uuid())
        .map_err(|error| {
            StartupError::Refused(format!(
                "could not record the replica id in {}: {error}",
                settings.data_dir.display()
            ))
        })?
        .map(crate::store::ReplicaId::from_uuid);
    let memory = open_memory(&settings, store.clone(), shutdown.child_token()).await?;
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
    let settings = Arc::new(settings);
    let research = ResearchService::new(
        settings.clone(),
        store.clone(),
        memory.clone(),
        runs.clone(),
        models.clone(),
        crate::search::build_all(
            &settings.research.search,
            Arc::new(crate::documents::DocumentCorpus::new(memory.clone())),
        ),
    )?;
    let chat = ChatService::new(
        ChatDeps {
            store: store.clone(),
            memory: memory.clone(),
            models: models.clone(),
            writer: writer.clone(),
            settings: settings.chat.clone(),
            research: Some(research.clone()),
            memory_on: true,
        },
        runs.clone(),
    );
    runs.set_resumer(Arc::new(Resumers {
        chat: chat.clone(),
        research: research.clone(),
    }));
    let recovered = runs.recover_interrupted(predecessor).await?;
    if recovered > 0 {
        tracing::warn!(recovered, "took over runs whose replica is gone");
    }
    runs.spawn_control();
    let rate_limit = Arc::new(crate::http::limits::UserRateLimit::new(
        settings.server.requests_per_minute,
        settings.server.max_requests_per_user,
    ));
    Ok(AppState {
        settings,
        research,
        chat,
        store,
        auth,
        rate_limit,
        runs,
        memory,
        models,
        writer,
        shutdown,
        streams_stop: CancellationToken::new(),
        metrics: metrics_handle(),
        started_at: Instant::now(),
        database_display: store::redact_url(&url),
        data_lock,
    })
}

/// Continues the runs this replica takes over: chat turns through the chat agent, researches
/// through the research service.
struct Resumers {
    chat: ChatService,
    research: Arc<ResearchService>,
}

#[async_trait::async_trait]
impl crate::runs::Resume for Resumers {
    async fn resume(
        &self,
        user: crate::store::UserId,
        run: &crate::store::Run,
        checkpoint: &crate::runs::Checkpoint,
    ) -> Result<crate::runs::ResumedBody, String> {
        match run.kind {
            crate::store::RunKind::Chat => self.chat.resume(user, run, checkpoint).await,
            crate::store::RunKind::Research => self.research.resume(checkpoint),
        }
    }
}

/// The memory engine over the backends the settings name: the embedder, the vector index
/// (Qdrant Edge in the data directory, or a Qdrant server) and the tantivy index.
pub async fn open_memory(
    settings: &Settings,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
) -> Result<Arc<MemoryEngine>, MemoryError> {
    crate::text::extract::configure(&settings.extract);
    let embedder: Arc<dyn crate::llm::embed::Embedder> =
        Arc::new(crate::llm::embed_queue::EmbedQueue::start(
            crate::llm::embed::from_settings(&settings.embedder).await?,
            crate::llm::embed_queue::QueueSettings {
                batch_wait: std::time::Duration::from_millis(settings.embedder.batch_wait_ms),
                max_batch: settings.embedder.max_batch,
                query_cache: settings.embedder.query_cache,
            },
        ));
    open_memory_with(settings, store, embedder, shutdown).await
}

/// [`open_memory`] with an embedder already loaded (the evals share one between scratch stores).
pub async fn open_memory_with(
    settings: &Settings,
    store: Arc<dyn Store>,
    embedder: Arc<dyn crate::llm::embed::Embedder>,
    shutdown: CancellationToken,
) -> Result<Arc<MemoryEngine>, MemoryError> {
    let dimension = embedder.dimension();
    let fill = keywords_to_fill(settings, store.as_ref(), dimension).await?;
    let place = if fill {
        KeywordPlace::Replica
    } else {
        settings.qdrant.keywords
    };
    let (vector, keyword, watermark) = open_indexes_at(settings, dimension, place).await?;
    if matches!(keyword, KeywordSearch::Beside(_)) {
        remove_keyword_dir(settings);
    }
    let engine = MemoryEngine::assemble(
        store,
        embedder,
        vector,
        keyword,
        watermark,
        settings.memory.clone(),
        settings.qdrant.optimize_after_upserts,
        shutdown.clone(),
    )
    .await?;
    if fill {
        let target = open_indexes_at(settings, dimension, KeywordPlace::Server).await?;
        engine
            .fill_keywords(target, settings.qdrant.optimize_after_upserts, shutdown)
            .await?;
    }
    Ok(engine)
}

/// Removes a keyword index an earlier run left in the data directory, once keyword search
/// runs on the Qdrant server.
fn remove_keyword_dir(settings: &Settings) {
    let dir = settings.data_dir.join("keyword");
    if !dir.exists() {
        return;
    }
    tracing::info!(
        dir = %dir.display(),
        "keyword search runs on the Qdrant server; removing this replica's keyword index"
    );
    if let Err(error) = std::fs::remove_dir_all(&dir) {
        tracing::warn!(%error, "removing the replica's keyword index failed");
    }
}

/// Whether keyword vectors are to be filled in the background
/// ([`MemoryEngine::fill_keywords`]): keyword search is set to run on the Qdrant server, the
/// collection with keyword vectors is more than `qdrant.keywords_fill_inline` entries of the
/// memory log behind, and the collection without them is ahead of it (a deployment that ran
/// with keyword search in its replicas), so this replica can answer from that one and its
/// tantivy index meanwhile. Otherwise the collection is filled before the replica answers.
async fn keywords_to_fill(
    settings: &Settings,
    store: &dyn Store,
    dimension: usize,
) -> Result<bool, MemoryError> {
    if settings.qdrant.urls().is_empty() || settings.qdrant.keywords != KeywordPlace::Server {
        return Ok(false);
    }
    let watermark = |keywords: bool| {
        format!(
            "qdrant:{}",
            QdrantServerIndex::collection_name(&settings.qdrant.collection, dimension, keywords)
        )
    };
    let maintenance = store.maintenance();
    let filled = maintenance.watermark(&watermark(true)).await?;
    let older = maintenance.watermark(&watermark(false)).await?;
    let head = maintenance.memory_log_head().await?;
    let behind = u64::try_from(head - filled).unwrap_or(0);
    Ok(behind > settings.qdrant.keywords_fill_inline && older > filled)
}

/// The vector index and keyword search the settings name, for vectors of `dimension`: Qdrant
/// Edge and tantivy in the data directory, or a Qdrant server's collection with tantivy in the
/// data directory or keyword vectors beside the dense ones (`place`); and where the vector
/// index records what it has applied of the memory log.
pub(crate) async fn open_indexes_at(
    settings: &Settings,
    dimension: usize,
    place: KeywordPlace,
) -> Result<(Arc<dyn VectorIndex>, KeywordSearch, VectorWatermark), IndexError> {
    let peers = settings.qdrant.urls();
    let server_keywords = !peers.is_empty() && place == KeywordPlace::Server;
    let (vector, watermark): (Arc<dyn VectorIndex>, VectorWatermark) = if peers.is_empty() {
        EdgeVectorIndex::remove_older_layouts(&settings.data_dir, dimension);
        let dir = EdgeVectorIndex::dir(&settings.data_dir, dimension);
        let index = EdgeVectorIndex::open(&dir, dimension).await?;
        index.set_tenant_shard_points(settings.qdrant.tenant_shard_points);
        (
            Arc::new(index),
            VectorWatermark::File(dir.join("applied.seq")),
        )
    } else {
        let collection = QdrantServerIndex::collection_name(
            &settings.qdrant.collection,
            dimension,
            server_keywords,
        );
        let index = QdrantServerIndex::connect(
            &peers,
            settings
                .qdrant
                .api_key
                .as_ref()
                .map(|key| key.expose_secret().to_string()),
            &collection,
            dimension,
            CollectionLayout {
                shard_number: settings.qdrant.shard_number,
                replication_factor: settings.qdrant.replication_factor,
                write_consistency_factor: settings.qdrant.write_consistency_factor,
                keywords: server_keywords,
            },
        )
        .await?;
        (
            Arc::new(index),
            VectorWatermark::Sql(format!("qdrant:{collection}")),
        )
    };
    vector.set_search_ef(settings.qdrant.search_ef);
    let keyword = if server_keywords {
        KeywordSearch::Beside(SparseAnalyzer::new()?)
    } else {
        let keyword_dir = settings.data_dir.join("keyword");
        KeywordSearch::Local(
            tokio::task::spawn_blocking(move || KeywordIndex::open(Some(&keyword_dir)))
                .await
                .map_err(|error| IndexError::Internal(error.to_string()))??,
        )
    };
    Ok((vector, keyword, watermark))
}

/// Re-embeds, in the background, memories made by another embedding model than the current
/// one, logging progress; then embeds the context views turns lack (older data, a crash
/// between a turn and its context, a model change).
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
        let outcome = tokio::select! {
            outcome = memory.reembed_stale_contexts() => outcome,
            _ = shutdown.cancelled() => return,
        };
        match outcome {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "embedded the context views of older turns"),
            Err(error) => tracing::error!(%error, "embedding the context views of turns failed"),
        }
    })
}

/// What a start-up banner says about a state: where the data lives and which backend, model
/// and provider serve it. URLs are shown without credentials; keys never.
pub fn describe(state: &AppState) -> Vec<(&'static str, String)> {
    let settings = &state.settings;
    let data_dir = settings.data_dir.display().to_string();
    let peers = settings.qdrant.urls();
    let vector = match peers.as_slice() {
        [url] => format!(
            "Qdrant server {} (collection {})",
            store::redact_url(url),
            settings.qdrant.collection
        ),
        [first, ..] => format!(
            "Qdrant cluster of {} peers listed, first {} (collection {})",
            peers.len(),
            store::redact_url(first),
            settings.qdrant.collection
        ),
        [] => format!(
            "Qdrant Edge in {}",
            EdgeVectorIndex::dir(&settings.data_dir, state.memory.embedder().dimension()).display()
        ),
    };
    let embedder = state.memory.embedder();
    let embedding = match settings.embedder.provider {
        crate::config::EmbedderProvider::Local => format!(
            "{} (local, {} dimensions, from {})",
            embedder.vectors_id(),
            embedder.dimension(),
            settings.embedder.model_dir.display()
        ),
        _ => format!(
            "{} ({} dimensions, at {})",
            embedder.model_id(),
            embedder.dimension(),
            settings
                .embedder
                .base_url
                .as_deref()
                .map(store::redact_url)
                .unwrap_or_default()
        ),
    };
    let chat = match settings.llm.role_endpoint(crate::config::ModelRole::Chat) {
        Some(chat) => format!("{} at {}", chat.model, store::redact_url(&chat.base_url)),
        None => "none (answers from memory only; set llm.base_url and llm.model)".into(),
    };
    let mut auth = vec!["api keys"];
    if state.auth.jwt_enabled() {
        auth.push("jwt");
    }
    if settings.server.dev {
        auth.push("dev (no key needed, loopback only)");
    }
    vec![
        (
            "database",
            format!("{} ({})", state.store.backend(), state.database_display),
        ),
        ("vectors", vector),
        (
            "keywords",
            match state.memory.indexer().keyword() {
                KeywordSearch::Local(_) => {
                    format!("tantivy in {}", settings.data_dir.join("keyword").display())
                }
                KeywordSearch::Beside(_) => "sparse vectors beside the dense ones, on the \
                                             Qdrant server"
                    .into(),
            },
        ),
        ("embedding", embedding),
        ("chat model", chat),
        (
            "search",
            format!(
                "{} (default provider)",
                settings.research.search.default_provider
            ),
        ),
        ("auth", auth.join(" + ")),
        ("data", data_dir),
        (
            "web app",
            if crate::http::web_app_built() {
                "/ (sign in with an API key)".into()
            } else {
                "not built into this binary (scripts/build-web, then rebuild)".into()
            },
        ),
        (
            "docs",
            "/docs (try the API), /redoc (API reference), /health, /metrics".into(),
        ),
    ]
}

/// Binds the configured address (a port of 0 picks a free one).
pub async fn bind(settings: &Settings) -> Result<TcpListener, StartupError> {
    let addr: SocketAddr = settings.listen_addr()?;
    Ok(TcpListener::bind(addr).await?)
}

impl AppState {
    pub(crate) fn grace(&self) -> Duration {
        Duration::from_secs(self.settings.server.shutdown_grace_secs)
    }

    /// Shuts a state down that serves no listener (an embedded command): runs record their
    /// end, background tasks stop (the vector index flushes), and the pool closes.
    pub async fn shut_down(&self) {
        self.shutdown.cancel();
        self.runs.shutdown(self.grace()).await;
        self.streams_stop.cancel();
        self.close_backends().await;
    }

    /// Waits for the background tasks (they stop on the cancelled shutdown token), closes
    /// the indexes (flushed, watermarks recorded), then the pool, and lets the data directory
    /// go last.
    pub(crate) async fn close_backends(&self) {
        self.memory.close(self.grace()).await;
        self.store.close().await;
        self.data_lock.release();
    }

    /// Writes where this server listens, and its local secret, into the data directory's
    /// owner-only lock file, for CLI commands on the same directory.
    pub fn publish_address(&self, addr: std::net::SocketAddr) -> std::io::Result<()> {
        self.data_lock
            .publish(&addr.to_string(), self.auth.local_secret())
    }
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
