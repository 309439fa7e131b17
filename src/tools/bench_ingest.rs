//! `mnemo bench ingest`: memories per second into the real server (in-process, on a scratch
//! data directory, the shipped defaults and the local model) through its HTTP API, the way
//! clients write: (a) one client posting one memory at a time, (b) eight clients at once,
//! (c) a bulk JSON-lines import, alone and again while a client recalls back to back; and
//! recall latency through the API during that import, against the same queries on an idle
//! server. Beside them, the model's own limit: sentences a
//! second in batches, and one sentence's latency, with nothing else running.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::tools::bench_server::{bench_user, post_json, release, scratch_settings};
use crate::tools::stats::percentile;
use mnemo::llm::embed::Embedder;

pub struct IngestBenchOptions {
    pub data_dir: PathBuf,
    pub model_dir: Option<PathBuf>,
    /// Memories posted one at a time by one client.
    pub sequential: usize,
    /// Memories posted by the concurrent clients together.
    pub concurrent: usize,
    pub clients: usize,
    /// Memories in the bulk import.
    pub bulk: usize,
}

const PLACES: [&str; 12] = [
    "harbour",
    "library",
    "climbing gym",
    "bakery",
    "train station",
    "museum",
    "dentist",
    "farmers market",
    "office",
    "swimming pool",
    "garden centre",
    "cinema",
];
const PEOPLE: [&str; 8] = [
    "sister",
    "manager",
    "neighbour",
    "old friend Tomas",
    "daughter",
    "landlord",
    "coach",
    "cousin Ines",
];
const TOPICS: [&str; 10] = [
    "the kitchen renovation",
    "a trip to Porto in the spring",
    "learning the cello",
    "the new budget for the allotment",
    "switching to a standing desk",
    "a recipe for lentil soup with smoked paprika",
    "why the car keeps stalling in the cold",
    "the school play next month",
    "a book about the history of lighthouses",
    "adopting a second cat",
];

/// The `index`-th synthetic memory: a first-person note of everyday length, unique by number.
fn memory_text(index: usize) -> String {
    let place = PLACES[index % PLACES.len()];
    let person = PEOPLE[(index / 3) % PEOPLE.len()];
    let topic = TOPICS[(index / 7) % TOPICS.len()];
    match index % 3 {
        0 => format!("Note {index}: I met my {person} at the {place} and we talked about {topic}."),
        1 => format!(
            "Note {index}: at the {place} this week I kept thinking about {topic}, and my {person} \
             thinks I should decide before the end of the month."
        ),
        _ => format!("Note {index}: remind me that my {person} recommended {topic}."),
    }
}

/// The `index`-th recall query, all different so none comes from the query cache.
fn query_text(index: usize) -> String {
    let topic = TOPICS[index % TOPICS.len()];
    let person = PEOPLE[(index / 10) % PEOPLE.len()];
    format!("what did my {person} say about {topic} (question {index})")
}

struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        post_json(
            &self.http,
            &format!("{}{path}", self.base),
            &self.key,
            &body,
        )
        .await
    }

    async fn add(&self, index: usize) -> anyhow::Result<()> {
        self.post(
            "/v1/memories",
            json!({ "content": memory_text(index), "kind": "fact" }),
        )
        .await
        .map(|_| ())
    }

    /// One recall through the API; its latency in ms.
    async fn recall(&self, index: usize) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.post(
            "/v1/memories/search",
            json!({ "query": query_text(index), "k": 5 }),
        )
        .await?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

/// Recall latencies (sorted) of `count` queries from `first` on, one after another.
async fn recalls(client: &Client, first: usize, count: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(count);
    for index in first..first + count {
        times.push(client.recall(index).await?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// Starts importing `count` memories (from `first`) as one JSON-lines request; the task ends
/// with when the request was sent and when every line was stored.
async fn import(
    client: &Arc<Client>,
    first: usize,
    count: usize,
    body_limit: usize,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<(Instant, Instant)>>> {
    let mut lines = String::new();
    for index in first..first + count {
        lines.push_str(&json!({ "kind": "fact", "content": memory_text(index) }).to_string());
        lines.push('\n');
    }
    if lines.len() > body_limit {
        bail!(
            "the import is {} bytes, above server.max_body_bytes ({body_limit}); use fewer --bulk",
            lines.len()
        );
    }
    let importer = client.clone();
    Ok(tokio::spawn(async move {
        let started = Instant::now();
        let response = importer
            .http
            .post(format!("{}/v1/memories/import", importer.base))
            .bearer_auth(&importer.key)
            .header("content-type", "application/x-ndjson")
            .body(lines)
            .send()
            .await?;
        let status = response.status();
        let report: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("the import answered {status}: {report}");
        }
        if report["imported"].as_u64() != Some(count as u64) {
            bail!("the import did not take every line: {report}");
        }
        anyhow::Ok((started, Instant::now()))
    }))
}

/// The model alone: sentences a second in batches of 32, and one sentence's p50 latency.
async fn model_limit(embedder: &Arc<dyn Embedder>) -> anyhow::Result<(f64, f64)> {
    let texts: Vec<String> = (0..512)
        .map(|index| memory_text(1_000_000 + index))
        .collect();
    embedder.embed(&texts[..32]).await?; // warm-up
    let started = Instant::now();
    for chunk in texts.chunks(32) {
        embedder.embed(chunk).await?;
    }
    let batched = texts.len() as f64 / started.elapsed().as_secs_f64();
    let mut single = Vec::new();
    for text in texts.iter().take(60) {
        let started = Instant::now();
        embedder.embed(std::slice::from_ref(text)).await?;
        single.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    single.sort_by(f64::total_cmp);
    Ok((batched, percentile(&single, 0.5)))
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Runs the benchmark and writes a markdown table to `out`.
pub async fn run_ingest_bench(
    options: IngestBenchOptions,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    // Clients of a benchmark are not abusers.
    let unlimited = vec![("MNEMO__SERVER__REQUESTS_PER_MINUTE".into(), "0".into())];
    let settings = scratch_settings(&options.data_dir, options.model_dir.as_deref(), unlimited)?;
    let body_limit = settings.server.max_body_bytes;
    let arithmetic = settings.embedder.precision.on_this_cpu().name();

    eprintln!("measuring the model alone…");
    let raw = mnemo::llm::embed::from_settings(&settings.embedder).await?;
    let (model_batched, model_single) = model_limit(&raw).await?;
    drop(raw);

    let shutdown = CancellationToken::new();
    let listener = mnemo::startup::bind(&settings).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let state = mnemo::startup::build_state(settings, shutdown.clone()).await?;
    let server_state = state.clone();
    let server = tokio::spawn(async move { mnemo::http::serve(listener, server_state).await });
    let key = bench_user(&state.store, "bench").await?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?,
        base,
        key,
    });

    let mut next = 0usize;
    let (sequential_rate, latencies) = one_client(&client, options.sequential, &mut next).await?;
    let concurrent_rate =
        many_clients(&client, options.clients, options.concurrent, &mut next).await?;
    let (first_time, repeated) = query_vectors(state.memory.embedder()).await?;

    // Recall on an idle server, then during the bulk import.
    let queries = 100;
    state
        .memory
        .wait_recallable(Duration::from_secs(60))
        .await?;
    let idle = recalls(&client, 0, queries).await?;
    let (bulk_rate, busy_bulk_rate, busy) =
        bulk_imports(&client, options.bulk, body_limit, &mut next, queries).await?;

    shutdown.cancel();
    let _ = server.await;
    release(state).await;

    let measured = Measured {
        arithmetic,
        model_batched,
        model_single,
        sequential_rate,
        latencies,
        clients: options.clients,
        concurrent_rate,
        bulk: options.bulk,
        bulk_rate,
        busy_bulk_rate,
        first_time,
        repeated,
        idle,
        busy,
    };
    measured.write(out)
}

/// (a) One client posting `count` memories, one at a time: the rate and each request's
/// latency (ms, sorted).
async fn one_client(
    client: &Client,
    count: usize,
    next: &mut usize,
) -> anyhow::Result<(f64, Vec<f64>)> {
    eprintln!("(a) one client posting {count} memories…");
    let mut latencies = Vec::with_capacity(count);
    let started = Instant::now();
    for _ in 0..count {
        let one = Instant::now();
        client.add(*next).await?;
        latencies.push(one.elapsed().as_secs_f64() * 1000.0);
        *next += 1;
    }
    let rate = count as f64 / started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    Ok((rate, latencies))
}

/// (b) `clients` clients posting `total` memories between them at once: the rate.
async fn many_clients(
    client: &Arc<Client>,
    clients: usize,
    total: usize,
    next: &mut usize,
) -> anyhow::Result<f64> {
    eprintln!("(b) {clients} clients posting {total} memories…");
    let first = *next;
    *next += total;
    let clients = clients.max(1);
    let started = Instant::now();
    let workers = (0..clients).map(|worker| {
        let client = client.clone();
        tokio::spawn(async move {
            for index in (worker..total).step_by(clients) {
                client.add(first + index).await?;
            }
            anyhow::Ok(())
        })
    });
    for worker in futures::future::join_all(workers).await {
        worker??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// A query's vector through the server's queue, the first time and again (the cache): the
/// times of 50 queries each (ms, sorted).
async fn query_vectors(embedder: &Arc<dyn Embedder>) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut first_time, mut repeated) = (Vec::new(), Vec::new());
    for index in 0..50 {
        let query = format!("cache probe {index}: {}", query_text(index));
        let started = Instant::now();
        embedder.embed_query(&query).await?;
        first_time.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        embedder.embed_query(&query).await?;
        repeated.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    first_time.sort_by(f64::total_cmp);
    repeated.sort_by(f64::total_cmp);
    Ok((first_time, repeated))
}

/// (c) A bulk import of `count` alone, then another while a client recalls back to back
/// (queries numbered from `first_query`): both rates and the recall times (ms, sorted).
async fn bulk_imports(
    client: &Arc<Client>,
    count: usize,
    body_limit: usize,
    next: &mut usize,
    first_query: usize,
) -> anyhow::Result<(f64, f64, Vec<f64>)> {
    eprintln!("(c) importing {count} memories as JSON lines…");
    let (started, ended) = import(client, *next, count, body_limit).await?.await??;
    *next += count;
    let bulk_rate = count as f64 / (ended - started).as_secs_f64();
    eprintln!("(c) importing {count} more while a client recalls…");
    let running = import(client, *next, count, body_limit).await?;
    *next += count;
    let mut busy = Vec::new();
    let mut query = first_query;
    while !running.is_finished() {
        busy.push(client.recall(query).await?);
        query += 1;
    }
    let (started, ended) = running.await??;
    let busy_bulk_rate = count as f64 / (ended - started).as_secs_f64();
    busy.sort_by(f64::total_cmp);
    Ok((bulk_rate, busy_bulk_rate, busy))
}

/// What the benchmark measured (times in ms, sorted).
struct Measured {
    arithmetic: &'static str,
    model_batched: f64,
    model_single: f64,
    sequential_rate: f64,
    latencies: Vec<f64>,
    clients: usize,
    concurrent_rate: f64,
    bulk: usize,
    bulk_rate: f64,
    busy_bulk_rate: f64,
    first_time: Vec<f64>,
    repeated: Vec<f64>,
    idle: Vec<f64>,
    busy: Vec<f64>,
}

impl Measured {
    /// The markdown table, each figure beside its target.
    fn write(&self, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
        let Measured {
            arithmetic,
            model_batched,
            model_single,
            sequential_rate,
            latencies,
            clients,
            concurrent_rate,
            bulk,
            bulk_rate,
            busy_bulk_rate,
            first_time,
            repeated,
            idle,
            busy,
        } = self;
        let idle_p95 = percentile(idle, 0.95);
        let busy_p95 = percentile(busy, 0.95);
        writeln!(
            out,
            "| measure (local model, one view per fact memory) | value | target |"
        )?;
        writeln!(out, "|---|---|---|")?;
        writeln!(
            out,
            "| model alone ({arithmetic} products): batches of 32 / one sentence p50 | {model_batched:.0} sentences/s / {model_single:.1} ms | the limit |"
        )?;
        writeln!(
            out,
            "| (a) one client, one memory a request | {sequential_rate:.0} memories/s (p50 {:.1} ms, p95 {:.1} ms) | ≥ 60/s: {} |",
            percentile(latencies, 0.5),
            percentile(latencies, 0.95),
            verdict(*sequential_rate >= 60.0)
        )?;
        writeln!(
            out,
            "| (b) {clients} clients at once | {concurrent_rate:.0} memories/s | ≥ 150/s: {} |",
            verdict(*concurrent_rate >= 150.0)
        )?;
        writeln!(
            out,
            "| (c) bulk import of {bulk} (JSON lines) | {bulk_rate:.0} memories/s | ≥ 250/s: {} |",
            verdict(*bulk_rate >= 250.0)
        )?;
        writeln!(
            out,
            "| (c) the same size again while a client recalls back to back | {busy_bulk_rate:.0} memories/s | |"
        )?;
        writeln!(
            out,
            "| a query's vector through the queue: first time / repeated (cache) p50 | {:.2} ms / {:.4} ms | |",
            percentile(first_time, 0.5),
            percentile(repeated, 0.5)
        )?;
        writeln!(
            out,
            "| recall through the API, idle: p50 / p95 | {:.1} ms / {idle_p95:.1} ms | |",
            percentile(idle, 0.5)
        )?;
        writeln!(
            out,
            "| recall during the import ({} queries): p50 / p95 | {:.1} ms / {busy_p95:.1} ms | p95 ≤ 2× idle: {} |",
            busy.len(),
            percentile(busy, 0.5),
            verdict(busy_p95 <= 2.0 * idle_p95)
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_and_queries_are_all_different() {
        let memories: std::collections::HashSet<String> = (0..5000).map(memory_text).collect();
        assert_eq!(memories.len(), 5000);
        let queries: std::collections::HashSet<String> = (0..500).map(query_text).collect();
        assert_eq!(queries.len(), 500);
    }
}
