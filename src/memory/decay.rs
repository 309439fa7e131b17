//! The decay job: periodically archives memories that are low-importance and unused for a
//! configured time. Archived memories leave default recall but stay listable, restorable and
//! exportable. The archive time is computed from absolute timestamps (last activity + the
//! configured period), so a rerun after a crash gives the same result. The same pass purges
//! forgotten memories whose time to be restored is over.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::MemorySettings;
use crate::index::indexer::Indexer;
use crate::store::{MemoryId, Store, StoreResult};

/// One pass at `now`; returns the archived ids.
pub(crate) async fn run_once(
    store: &dyn Store,
    settings: &MemorySettings,
    now: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Vec<MemoryId>> {
    if settings.archive_after_days == 0 {
        return Ok(Vec::new());
    }
    let unused_for = chrono::Duration::days(settings.archive_after_days as i64);
    store
        .maintenance()
        .archive_unused(now, unused_for, settings.archive_max_importance)
        .await
}

/// Runs the job every `decay_interval_secs` until shutdown.
pub(crate) fn spawn(
    store: Arc<dyn Store>,
    indexer: Arc<Indexer>,
    settings: MemorySettings,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let interval = Duration::from_secs(settings.decay_interval_secs.max(60));
        loop {
            let now = crate::store::now();
            match store.maintenance().purge_forgotten(now).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, "decay job purged forgotten memories"),
                Err(error) => tracing::warn!(%error, "purging forgotten memories failed"),
            }
            match run_once(store.as_ref(), &settings, now).await {
                Ok(archived) if !archived.is_empty() => {
                    tracing::info!(
                        archived = archived.len(),
                        "decay job archived unused memories"
                    );
                    metrics::counter!("mnemo_memories_archived_total")
                        .increment(archived.len() as u64);
                    indexer.notify();
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "decay job failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    })
}
