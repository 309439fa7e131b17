//! Progress of a research: its events (with the research's id and model), stage timings,
//! and the time spent waiting on models, searches and fetches.

use crate::runs::ErrorEvent;
use crate::runs::events::StageFallback;
use std::sync::atomic::AtomicU64;

use super::*;

pub(super) struct Progress {
    pub(super) context: Arc<RunContext>,
    pub(super) research_id: RunId,
    pub(super) envelope: ResearchEnvelope,
    pub(super) stages: Mutex<Vec<(String, Instant)>>,
    /// Stages an earlier attempt announced: timed again, not announced again.
    pub(super) announced: Vec<String>,
    /// Seconds per stage spent by earlier attempts.
    pub(super) earlier: BTreeMap<String, f64>,
}

impl Progress {
    /// Appends an event carrying this research's id and model.
    pub(super) async fn emit(&self, event: RunEvent) -> Result<(), RunFailure> {
        self.context.emit_for(event, Some(&self.envelope)).await?;
        Ok(())
    }

    pub(super) async fn stage(&self, stage: &str, content: &str) -> Result<(), RunFailure> {
        self.stages.lock().push((stage.to_string(), Instant::now()));
        if self.announced.iter().any(|known| known == stage) {
            return Ok(());
        }
        self.emit(RunEvent::stage(stage, content)).await
    }

    /// Every stage announced so far, by this attempt or an earlier one.
    pub(super) fn announced(&self) -> Vec<String> {
        let mut names = self.announced.clone();
        for (name, _) in self.stages.lock().iter() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// Seconds per stage (a stage lasts until the next one starts).
    pub(super) fn timings(&self) -> BTreeMap<String, f64> {
        let stages = self.stages.lock();
        let mut out = self.earlier.clone();
        for (index, (name, started)) in stages.iter().enumerate() {
            let ended = stages
                .get(index + 1)
                .map(|(_, at)| *at)
                .unwrap_or_else(Instant::now);
            let seconds = ended.saturating_duration_since(*started).as_secs_f64();
            let total = out.get(name).copied().unwrap_or(0.0) + seconds;
            out.insert(name.clone(), (total * 1000.0).round() / 1000.0);
        }
        out
    }

    /// Says that `step` was done without the model's reply (`stage_fallback`), what was done
    /// instead and why. `reason` is an error message (bounded here), never the reply itself.
    pub(super) async fn fallback(
        &self,
        stage: &str,
        step: &str,
        instead: &str,
        reason: &str,
        metadata: Option<StepMeta>,
    ) -> Result<(), RunFailure> {
        tracing::info!(
            stage,
            step,
            reason,
            "research step falls back to the extractive path"
        );
        self.emit(RunEvent::StageFallback(StageFallback {
            stage: stage.to_string(),
            step: step.to_string(),
            reason: truncate(reason, FALLBACK_REASON_CHARS),
            content: instead.to_string(),
            metadata,
        }))
        .await
    }

    pub(super) async fn error(
        &self,
        error_type: RunErrorType,
        message: &str,
        retryable: bool,
        metadata: StepMeta,
    ) -> Result<(), RunFailure> {
        self.emit(RunEvent::Error(ErrorEvent {
            error_type,
            message: message.to_string(),
            retryable,
            content: Some(message.to_string()),
            metadata: Some(metadata),
        }))
        .await
    }
}

/// Time spent waiting on things outside mnemo, in microseconds.
#[derive(Default)]
pub(super) struct Meter {
    pub(super) model: AtomicU64,
    pub(super) search: AtomicU64,
    pub(super) fetch: AtomicU64,
}

impl Meter {
    pub(super) fn add(counter: &AtomicU64, started: Instant) {
        counter.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    pub(super) fn ms(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed) / 1000
    }
}
