//! `mnemo bench write`: how long from the end of a chat turn until what it taught is
//! recallable, and how many memory jobs per second the writer drains. Runs the real server
//! in-process on a scratch data directory; with `--llm-url` the turn and the extraction go
//! to that OpenAI-compatible endpoint (a real one, or the fake server that `cargo bench --bench
//! write` starts with a fixed latency).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio_util::sync::CancellationToken;

use crate::tools::bench_server::{release, scratch_settings};
use crate::tools::stats::percentile;
use mnemo::memory::RecallRequest;
use mnemo::memory::rank::RecallMode;
use mnemo::store::UserKind;

pub struct WriteBenchOptions {
    pub data_dir: PathBuf,
    pub model_dir: Option<PathBuf>,
    pub turns: usize,
    pub jobs: usize,
    /// An OpenAI-compatible endpoint for the LLM path.
    pub llm_url: Option<String>,
    pub llm_model: Option<String>,
}

/// Runs the benchmark and writes a markdown table to `out`.
pub async fn run_write_bench(
    options: WriteBenchOptions,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut llm: Vec<(String, String)> = Vec::new();
    if let Some(url) = &options.llm_url {
        llm.push(("MNEMO__LLM__BASE_URL".into(), url.clone()));
        llm.push((
            "MNEMO__LLM__MODEL".into(),
            options.llm_model.clone().unwrap_or_else(|| "bench".into()),
        ));
    }
    let settings = scratch_settings(&options.data_dir, options.model_dir.as_deref(), llm)?;
    let shutdown = CancellationToken::new();
    let state = mnemo::startup::build_state(settings, shutdown.clone()).await?;
    let user = state
        .store
        .accounts()
        .create_user("bench", UserKind::Key)
        .await?;
    let thread = state
        .store
        .user(user.id)
        .create_thread("bench", false)
        .await?;

    // End of turn → recallable.
    let mut latencies = Vec::with_capacity(options.turns);
    let mut turn_times = Vec::with_capacity(options.turns);
    for index in 0..options.turns {
        let token = format!("bench{index:05}x");
        let content = format!("Remember that my locker code is {token}.");
        let started = Instant::now();
        let run = state.chat.send(user.id, thread.id, &content).await?;
        // The turn ends when its run is no longer running.
        loop {
            let current = state.store.user(user.id).get_run(run.id).await?;
            if current.status.is_terminal() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let ended = Instant::now();
        turn_times.push((ended - started).as_secs_f64() * 1000.0);
        let deadline = ended + Duration::from_secs(30);
        loop {
            let request = RecallRequest {
                query: token.clone(),
                k: Some(3),
                mode: RecallMode::Keyword,
                kinds: Some(vec![mnemo::store::MemoryKind::Fact]),
                decay: false,
                ..RecallRequest::default()
            };
            let found = state.memory.recall(user.id, request).await?;
            if found
                .results
                .iter()
                .any(|result| result.memory.content.contains(&token))
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("turn {index} was not recallable within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(ended.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    turn_times.sort_by(f64::total_cmp);

    // Throughput: queue `jobs` remember jobs at once and time the drain.
    let started = Instant::now();
    for index in 0..options.jobs {
        let job = mnemo::memory::writer::RememberJob {
            content: format!("Throughput fact number {index} about project tern{index}"),
            kind: mnemo::store::MemoryKind::Fact,
            importance: 3,
            thread_id: None,
            source_message_id: None,
            trust: mnemo::store::Trust::User,
        };
        state
            .writer
            .enqueue_remember(user.id, &format!("bench:{index}"), &job)
            .await?;
    }
    loop {
        let stats = state.store.maintenance().queue_stats().await?;
        if stats.queued == 0 && stats.running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drain = started.elapsed().as_secs_f64();
    shutdown.cancel();
    release(state).await;

    let path = if options.llm_url.is_some() {
        "LLM (chat + extraction through the endpoint)"
    } else {
        "no LLM (rule extraction)"
    };
    writeln!(out, "| measure ({path}) | value |")?;
    writeln!(out, "|---|---|")?;
    writeln!(out, "| turns | {} |", options.turns)?;
    writeln!(
        out,
        "| turn duration p50 / p95 | {:.1} ms / {:.1} ms |",
        percentile(&turn_times, 0.5),
        percentile(&turn_times, 0.95)
    )?;
    writeln!(
        out,
        "| end of turn → recallable p50 / p95 / max | {:.1} ms / {:.1} ms / {:.1} ms |",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.95),
        latencies.last().copied().unwrap_or(0.0)
    )?;
    writeln!(
        out,
        "| writer throughput | {:.1} jobs/s ({} remember jobs in {:.2} s) |",
        options.jobs as f64 / drain.max(1e-9),
        options.jobs,
        drain
    )?;
    Ok(())
}
