//! Many concurrent chat streams against the release server: `mnemo serve` (embedded defaults,
//! scratch data directory) with the fake OpenAI server streaming every answer slowly, so that
//! all streams are open at once. Reports time to first event (p50/p99), the server's resident
//! memory per open stream, its file descriptors before, during and after, and checks every
//! stream's events: sequence numbers 1..n without gap or repeat, ending with `done`.
//!
//! `cargo bench --bench load` (needs `scripts/fetch-model`). `MNEMO_BENCH_STREAMS` (default
//! 1000), `MNEMO_BENCH_USERS` (default 50), `MNEMO_BENCH_RATE` (new streams a second, default
//! 100: every turn embeds its message for recall, which a burst of 1000 at one instant would
//! queue for seconds) and `MNEMO_BENCH_ANSWER_MS` (how long each answer streams, default 15000,
//! so that all streams are open at once) change the setup. Prints numbers; fails only when a
//! stream that was accepted lost, repeated or reordered an event or ended without `done`.
//! Streams refused with 429 (back-pressure) are counted apart.

#[path = "../tests/api/support/fake_llm.rs"]
mod fake_llm;
#[path = "../src/tools/stats.rs"]
mod stats;
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fake_llm::{FakeLlm, Reply, prompt_text};
use futures::StreamExt;
use serde_json::{Value, json};
use stats::percentile;
use support::{add_user, env_number, free_port, model_dir};

/// What one stream saw.
struct StreamOutcome {
    first_event: Option<Duration>,
    events: usize,
    /// Sequence numbers were 1, 2, … without a gap or a repeat.
    ordered: bool,
    /// Refused with 429 before anything was stored.
    refused: bool,
    ended_with_done: bool,
}

fn main() {
    let runtime = support::runtime();
    runtime.block_on(async {
        let Some(model_dir) = model_dir() else {
            return;
        };
        let streams = env_number("MNEMO_BENCH_STREAMS", 1000) as usize;
        let users = (env_number("MNEMO_BENCH_USERS", 50) as usize).clamp(1, streams.max(1));
        let answer_ms = env_number("MNEMO_BENCH_ANSWER_MS", 15000);
        let rate = env_number("MNEMO_BENCH_RATE", 100).max(1);
        let words = 40usize;
        let answer: Vec<String> = (0..words).map(|i| format!("word{i}")).collect();
        let answer = answer.join(" ");
        // About `answer_ms` for the whole answer: one chunk of ~2 words per step.
        let chunk_chars = 12;
        let steps = answer.len().div_ceil(chunk_chars) as u64;
        let llm = FakeLlm::start().await;
        llm.set_handler(move |request| {
            let prompt = prompt_text(request);
            if prompt.contains("Decide what is worth remembering") {
                return Some(Reply::text(r#"{"memories": []}"#));
            }
            None
        });
        llm.set_default(Reply::slow_text(
            &answer,
            chunk_chars,
            (answer_ms / steps.max(1)).max(1),
        ));
        let dir = tempfile::tempdir().expect("temp dir");
        let binary = env!("CARGO_BIN_EXE_mnemo");
        let port = free_port();
        let mut command = tokio::process::Command::new(binary);
        command
            .arg("--data-dir")
            .arg(dir.path())
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .env("MNEMO__EMBEDDER__MODEL_DIR", model_dir)
            .env(
                "MNEMO__SERVER__MAX_CONNECTIONS",
                (streams + 256).to_string(),
            )
            .env("MNEMO__SERVER__MAX_RUNS_PER_USER", streams.to_string())
            .env("MNEMO__SERVER__REQUESTS_PER_MINUTE", "0")
            .env("MNEMO__DATABASE__MAX_CONNECTIONS", "16")
            .env("MNEMO__LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (name, value) in llm.env() {
            command.env(name, value);
        }
        let mut server = command.spawn().expect("start mnemo serve");
        let pid = server.id().expect("server pid");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("client");
        wait_healthy(&client, &base).await;
        let mut keys = Vec::with_capacity(users);
        for index in 0..users {
            keys.push(add_user(binary, dir.path(), &format!("load{index}")).await);
        }
        let mut threads = Vec::with_capacity(streams);
        for index in 0..streams {
            let key = &keys[index % users];
            let thread: Value = client
                .post(format!("{base}/v1/threads"))
                .bearer_auth(key)
                .json(&json!({ "title": format!("load {index}") }))
                .send()
                .await
                .expect("create thread")
                .json()
                .await
                .expect("thread");
            threads.push((key.clone(), thread["id"].as_str().expect("id").to_string()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_before = rss_kib(pid);
        let fds_before = fd_count(pid);
        println!(
            "{streams} chat streams over {users} users, {rate} new a second; each answer \
             streams for about {answer_ms} ms ({words} words) from the fake model"
        );
        let open = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = threads
            .into_iter()
            .enumerate()
            .map(|(index, (key, thread))| {
                let client = client.clone();
                let base = base.clone();
                let open = open.clone();
                let start_at = started + Duration::from_micros(index as u64 * 1_000_000 / rate);
                tokio::spawn(async move {
                    tokio::time::sleep_until(start_at.into()).await;
                    stream_turn(&client, &base, &key, &thread, index, &open).await
                })
            })
            .collect();
        // Sample the server while the streams are open.
        let mut peak_rss = rss_before;
        let mut peak_fds = fds_before;
        let mut peak_open = 0;
        while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
            peak_rss = peak_rss.max(rss_kib(pid));
            peak_fds = peak_fds.max(fd_count(pid));
            peak_open = peak_open.max(open.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut outcomes = Vec::with_capacity(streams);
        for task in tasks {
            outcomes.push(task.await.expect("stream task"));
        }
        let elapsed = started.elapsed();
        // Connections close and the runs' tasks end; give the server a moment.
        let mut fds_after = fd_count(pid);
        for _ in 0..50 {
            if fds_after <= fds_before + 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            fds_after = fd_count(pid);
        }
        let rss_after = rss_kib(pid);
        let _ = server.start_kill();
        let _ = server.wait().await;

        let mut first: Vec<f64> = outcomes
            .iter()
            .filter_map(|outcome| outcome.first_event)
            .map(|latency| latency.as_secs_f64() * 1000.0)
            .collect();
        first.sort_by(f64::total_cmp);
        let refused = outcomes.iter().filter(|o| o.refused).count();
        let lost = outcomes
            .iter()
            .filter(|o| !o.refused && (!o.ordered || !o.ended_with_done))
            .count();
        let events: usize = outcomes.iter().map(|o| o.events).sum();
        let per_stream = (peak_rss.saturating_sub(rss_before) as f64) / peak_open.max(1) as f64;
        println!();
        println!("| measure | value |");
        println!("|---|---|");
        println!(
            "| streams completed | {} of {streams} in {:.1} s ({rate} new a second) |",
            outcomes.len() - lost - refused,
            elapsed.as_secs_f64()
        );
        println!("| streams refused with 429 (back-pressure, nothing stored) | {refused} |");
        println!("| most open at once | {peak_open} |");
        println!(
            "| time to first event | p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms |",
            percentile(&first, 0.50),
            percentile(&first, 0.99),
            first.last().copied().unwrap_or(0.0)
        );
        println!(
            "| events received | {events} ({:.1} per stream) |",
            events as f64 / streams.max(1) as f64
        );
        println!("| streams with a lost, repeated or out-of-order event, or no `done` | {lost} |");
        println!(
            "| server resident memory | {:.0} MiB before, {:.0} MiB peak, {:.0} MiB after |",
            rss_before as f64 / 1024.0,
            peak_rss as f64 / 1024.0,
            rss_after as f64 / 1024.0
        );
        println!("| resident memory per open stream | {per_stream:.1} KiB |");
        println!(
            "| server file descriptors | {fds_before} before, {peak_fds} peak, {fds_after} after |"
        );
        if lost > 0 {
            eprintln!("{lost} streams lost or repeated events");
            std::process::exit(1);
        }
    });
}

/// Posts a message with `stream: true` and reads its events to the end.
async fn stream_turn(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    thread: &str,
    index: usize,
    open: &AtomicUsize,
) -> StreamOutcome {
    let mut outcome = StreamOutcome {
        first_event: None,
        events: 0,
        ordered: true,
        refused: false,
        ended_with_done: false,
    };
    let sent = Instant::now();
    let response = match client
        .post(format!("{base}/v1/threads/{thread}/messages"))
        .bearer_auth(key)
        .json(&json!({ "content": format!("question number {index}: what do you know?") }))
        .send()
        .await
    {
        Ok(response) if response.status().is_success() => response,
        Ok(response) if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
            outcome.refused = true;
            return outcome;
        }
        Ok(response) => {
            eprintln!("stream {index}: status {}", response.status());
            outcome.ordered = false;
            return outcome;
        }
        Err(error) => {
            eprintln!("stream {index}: {error}");
            outcome.ordered = false;
            return outcome;
        }
    };
    open.fetch_add(1, Ordering::Relaxed);
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut expected = 1i64;
    let mut event = String::new();
    'read: while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            outcome.ordered = false;
            break;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let mut id = None;
            for line in frame.lines() {
                if let Some(value) = line.strip_prefix("id:") {
                    id = value.trim().parse::<i64>().ok();
                } else if let Some(value) = line.strip_prefix("event:") {
                    event = value.trim().to_string();
                }
            }
            let Some(id) = id else { continue };
            outcome.first_event.get_or_insert_with(|| sent.elapsed());
            outcome.events += 1;
            if id != expected {
                outcome.ordered = false;
            }
            expected = id + 1;
            if event == "done" {
                outcome.ended_with_done = true;
                break 'read;
            }
        }
    }
    open.fetch_sub(1, Ordering::Relaxed);
    outcome
}

async fn wait_healthy(client: &reqwest::Client, base: &str) {
    for _ in 0..600 {
        if let Ok(response) = client.get(format!("{base}/health")).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server did not become healthy");
}

/// Resident set size of a process in KiB (Linux).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

/// Open file descriptors of a process (Linux).
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}
