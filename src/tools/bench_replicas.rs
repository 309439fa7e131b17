//! `mnemo bench replicas`: several replicas of the real server (in one process, each with its
//! own data directory, tantivy index and HTTP listener) on one PostgreSQL database and one
//! Qdrant server or cluster, as `deploy/` runs them. Measured through the HTTP API: how long a
//! memory written through one replica takes to be recalled through each other one (the index
//! lag a user sees across replicas), and recall latency through every replica. With a cluster
//! the benchmark starts itself (`--qdrant-bin`), recall latency again with one peer SIGKILLed.
//! With `--memories N` the store first gets N memories of other users (written to SQL with
//! synthetic vectors, as another deployment's history), and at the end one more replica starts
//! on a fresh data directory: its time until it serves, which is what a new replica costs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::tools::bench_server::{bench_user, post_json, release, scratch_settings};
use crate::tools::qdrant_cluster::QdrantCluster;
use crate::tools::stats::percentile;

pub struct ReplicaBenchOptions {
    pub data_dir: PathBuf,
    pub model_dir: Option<PathBuf>,
    /// The PostgreSQL database every replica uses.
    pub database_url: String,
    pub qdrant: Qdrant,
    pub replicas: usize,
    /// Memories written (round robin over the replicas), each then looked for on the others.
    pub writes: usize,
    /// Recalls through each replica.
    pub queries: usize,
    /// Memories of other users written to SQL before the measurements.
    pub memories: usize,
}

/// Users the `--memories` are spread over.
const MEMORY_USERS: usize = 1000;
/// Memories written to SQL in one call.
const SEED_BATCH: usize = 500;

/// The Qdrant every replica uses.
pub enum Qdrant {
    /// A running server, or the peers of a running cluster (gRPC URLs separated by commas).
    Server(String),
    /// A cluster of `peers` peers of this server binary, started by the benchmark.
    Cluster { binary: PathBuf, peers: usize },
}

/// A recall through another replica gives up on a memory after this long.
const LAG_LIMIT: Duration = Duration::from_secs(30);

struct Replica {
    base: String,
}

struct Client {
    http: reqwest::Client,
    key: String,
}

impl Client {
    async fn post(&self, base: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        post_json(&self.http, &format!("{base}{path}"), &self.key, &body).await
    }

    /// Whether a recall through `base` for `query` returns the memory `id`.
    async fn recalls(&self, base: &str, query: &str, id: &str) -> anyhow::Result<bool> {
        let found = self
            .post(
                base,
                "/v1/memories/search",
                json!({ "query": query, "k": 5 }),
            )
            .await?;
        Ok(found["results"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|result| result["memory"]["id"] == id))
    }
}

const THINGS: [&str; 8] = [
    "bike lock",
    "garage door",
    "gym locker",
    "storage unit",
    "office safe",
    "mailbox",
    "shed padlock",
    "wifi router",
];

fn note(index: usize, run: &str) -> String {
    let thing = THINGS[index % THINGS.len()];
    format!(
        "The code of my {thing} number {index} is {run}-{:04}.",
        index * 7 + 13
    )
}

fn question(index: usize) -> String {
    let thing = THINGS[index % THINGS.len()];
    format!("what is the code of my {thing} (question {index})")
}

/// Runs the benchmark and writes a markdown table to `out`.
pub async fn run_replica_bench(
    options: ReplicaBenchOptions,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    if options.replicas < 2 {
        bail!("--replicas must be at least 2");
    }
    let mut cluster = match &options.qdrant {
        Qdrant::Server(_) => None,
        Qdrant::Cluster { peers, .. } if *peers < 2 => bail!("--qdrant-peers must be at least 2"),
        Qdrant::Cluster { binary, peers } => {
            eprintln!("starting a Qdrant cluster of {peers} peers…");
            let dir = options.data_dir.join("qdrant-cluster");
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("clearing {}", dir.display()))?;
            }
            Some(QdrantCluster::start(binary, *peers, &dir).await)
        }
    };
    let shutdown = CancellationToken::new();
    let mut replicas = Vec::new();
    let mut states = Vec::new();
    let mut servers = Vec::new();
    for index in 0..options.replicas {
        eprintln!("starting replica {}…", index + 1);
        let (replica, state, server) =
            start_replica(&options, cluster.as_ref(), index, &shutdown).await?;
        replicas.push(replica);
        states.push(state);
        servers.push(server);
    }
    let seeded = if options.memories > 0 {
        Some(seed(&states, options.memories).await?)
    } else {
        None
    };
    // Recall is timed on a cluster at rest: while Qdrant still builds the graphs of the
    // points just written, its optimizers take the cores the searches and the model need.
    let optimized = match (&cluster, &options.qdrant) {
        (Some(cluster), Qdrant::Cluster { peers, .. }) if seeded.is_some() => {
            Some(wait_idle(cluster, *peers).await?)
        }
        _ => None,
    };
    // A user of this run only: the database may hold earlier runs.
    let run = uuid::Uuid::now_v7().simple().to_string()[24..].to_string();
    let key = bench_user(&states[0].store, &format!("bench-replicas-{run}")).await?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(32)
            .build()?,
        key,
    });

    let (lags, missed) = written_then_recalled(&client, &replicas, options.writes, &run).await?;
    let mut healthy = recall_times(&client, &replicas, options.queries, 0).await?;
    // A new replica on a fresh data directory: how long until it serves, and its first answer.
    let newcomer = if options.memories > 0 {
        eprintln!("starting a new replica…");
        let index = options.replicas;
        let started = Instant::now();
        let (replica, state, server) =
            start_replica(&options, cluster.as_ref(), index, &shutdown).await?;
        let serving = started.elapsed();
        client
            .post(
                &replica.base,
                "/v1/memories/search",
                json!({ "query": question(0), "k": 5 }),
            )
            .await?;
        let answered = started.elapsed();
        let keywords = state.memory.indexer().keyword().place();
        servers.push(server);
        states.push(state);
        Some((serving, answered, keywords))
    } else {
        None
    };
    let peer_down = match cluster.as_mut() {
        Some(cluster) => {
            eprintln!("killing the cluster's first peer…");
            cluster.kill(0).await;
            // Other questions than before: each embeds its query, as before (none is cached).
            let asked = options.queries * replicas.len();
            let series = recall_times(&client, &replicas, options.queries, asked).await?;
            let times = series.per_replica.into_iter().flatten().collect::<Vec<_>>();
            Some((times, series.stages))
        }
        None => None,
    };

    shutdown.cancel();
    for server in servers {
        let _ = server.await;
    }
    for state in states {
        release(state).await;
    }

    let qdrant = match &options.qdrant {
        Qdrant::Server(_) => "one Qdrant server".to_string(),
        Qdrant::Cluster { peers, .. } => format!("a Qdrant cluster of {peers} peers"),
    };
    write_table(
        out,
        replicas.len(),
        &qdrant,
        &lags,
        missed,
        &healthy.per_replica,
    )?;
    healthy.stages.write(out, "recall, every peer up")?;
    if let Some((mut times, mut stages)) = peer_down {
        times.sort_by(f64::total_cmp);
        writeln!(
            out,
            "| recall through any replica, the cluster's first peer down ({} queries) | {:.1} ms | {:.1} ms | {:.1} ms |",
            times.len(),
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.last().copied().unwrap_or(0.0),
        )?;
        stages.write(out, "recall, first peer down")?;
    }
    if let Some((count, indexed)) = seeded {
        writeln!(
            out,
            "\n{count} memories of {MEMORY_USERS} other users written to SQL: in every replica's indexes {:.1} s after the first write.",
            indexed.as_secs_f64()
        )?;
    }
    if let Some(optimized) = optimized {
        writeln!(
            out,
            "The cluster's optimizers were done with them {:.1} s later; recall was timed after that.",
            optimized.as_secs_f64()
        )?;
    }
    if let Some((serving, answered, keywords)) = newcomer {
        writeln!(
            out,
            "A new replica on a fresh data directory (keyword search {keywords}): serving {:.2} s after its start, first recall answered at {:.2} s.",
            serving.as_secs_f64(),
            answered.as_secs_f64()
        )?;
    }
    Ok(())
}

/// Starts replica number `index` (from 0) with a data directory of its own: its address, its
/// state and its HTTP server's task.
async fn start_replica(
    options: &ReplicaBenchOptions,
    cluster: Option<&QdrantCluster>,
    index: usize,
    shutdown: &CancellationToken,
) -> anyhow::Result<(
    Replica,
    mnemo::http::AppState,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let mut env: Vec<(String, String)> = vec![
        ("MNEMO__DATABASE__URL".into(), options.database_url.clone()),
        ("MNEMO__SERVER__REQUESTS_PER_MINUTE".into(), "0".into()),
    ];
    match (&options.qdrant, cluster) {
        (Qdrant::Server(url), _) => env.extend([
            ("MNEMO__QDRANT__URL".into(), url.clone()),
            (
                "MNEMO__QDRANT__COLLECTION".into(),
                "mnemo_bench_replicas".into(),
            ),
        ]),
        (Qdrant::Cluster { .. }, Some(cluster)) => {
            // Each replica asks another peer first, as replicas listing them in one order
            // would after their first peer failed.
            let mut peers = cluster.grpc_urls();
            let first = index % peers.len();
            peers.rotate_left(first);
            env.extend([
                ("MNEMO__QDRANT__URL".into(), peers.join(",")),
                (
                    "MNEMO__QDRANT__COLLECTION".into(),
                    "mnemo_bench_cluster".into(),
                ),
                (
                    "MNEMO__QDRANT__SHARD_NUMBER".into(),
                    peers.len().to_string(),
                ),
                ("MNEMO__QDRANT__REPLICATION_FACTOR".into(), "2".into()),
            ]);
        }
        (Qdrant::Cluster { .. }, None) => bail!("the cluster did not start"),
    }
    let settings = scratch_settings(
        &options.data_dir.join(format!("replica-{}", index + 1)),
        options.model_dir.as_deref(),
        env,
    )?;
    let listener = mnemo::startup::bind(&settings).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let state = mnemo::startup::build_state(settings, shutdown.clone())
        .await
        .with_context(|| format!("starting replica {}", index + 1))?;
    let server_state = state.clone();
    let server = tokio::spawn(async move { mnemo::http::serve(listener, server_state).await });
    Ok((Replica { base }, state, server))
}

/// Writes `count` memories of [`MEMORY_USERS`] new users straight to SQL (synthetic sentences
/// and unit vectors, marked as the replicas' model's so nothing is re-embedded), as the history
/// of a deployment, and waits until every replica's indexes hold them: how many, and how long
/// from the first write until then.
async fn seed(states: &[mnemo::http::AppState], count: usize) -> anyhow::Result<(usize, Duration)> {
    let store = &states[0].store;
    let model = states[0].memory.embedder().model_id().to_string();
    let dimension = states[0].memory.embedder().dimension();
    let run = uuid::Uuid::now_v7().simple().to_string()[24..].to_string();
    let mut users = Vec::with_capacity(MEMORY_USERS);
    for index in 0..MEMORY_USERS {
        users.push(
            store
                .accounts()
                .create_user(
                    &format!("bench-history-{run}-{index}"),
                    mnemo::store::UserKind::Key,
                )
                .await?
                .id,
        );
    }
    eprintln!("writing {count} memories of {MEMORY_USERS} users to SQL…");
    let started = Instant::now();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut written = 0;
    while written < count {
        let batch = SEED_BATCH.min(count - written);
        let user = users[(written / SEED_BATCH) % MEMORY_USERS];
        let memories = (0..batch)
            .map(|_| {
                let words: Vec<String> = (0..8 + next() % 10)
                    .map(|_| {
                        HISTORY_WORDS[(next() % HISTORY_WORDS.len() as u64) as usize].to_string()
                    })
                    .collect();
                let mut vector: Vec<f32> = (0..dimension)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                vector.iter_mut().for_each(|x| *x /= norm);
                (
                    mnemo::store::NewMemory::from_user(
                        mnemo::store::MemoryKind::Fact,
                        format!("{}.", words.join(" ")),
                        3,
                    ),
                    mnemo::store::Embedded {
                        vector,
                        model: model.clone(),
                    },
                )
            })
            .collect();
        store.user(user).insert_memories(memories).await?;
        written += batch;
    }
    eprintln!("waiting until every replica has indexed them…");
    for state in states {
        state.memory.indexer().notify();
        if !state
            .memory
            .wait_recallable(Duration::from_secs(3600))
            .await?
        {
            bail!("a replica did not index the memories within an hour");
        }
    }
    Ok((count, started.elapsed()))
}

/// Waits until every peer of the cluster reports each collection green (no optimisation
/// pending or running), and returns how long that took; progress on stderr.
async fn wait_idle(cluster: &QdrantCluster, peers: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let http = reqwest::Client::new();
    let get = |url: String| {
        let http = http.clone();
        async move {
            let answer: Value = http
                .get(url)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(answer)
        }
    };
    eprintln!("waiting until the cluster's optimizers are done…");
    loop {
        let mut busy = Vec::new();
        for peer in 0..peers {
            let base = cluster.http_url(peer);
            let listed = get(format!("{base}/collections")).await?;
            let names = listed["result"]["collections"].as_array().cloned();
            for collection in names.unwrap_or_default() {
                let name = collection["name"].as_str().unwrap_or_default();
                let info = get(format!("{base}/collections/{name}")).await?;
                let status = info["result"]["status"].as_str().unwrap_or("unknown");
                if status != "green" {
                    busy.push(format!("peer {} {name}: {status}", peer + 1));
                }
            }
        }
        if busy.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(3600) {
            bail!(
                "the cluster was still optimising after an hour: {}",
                busy.join(", ")
            );
        }
        eprintln!(
            "  {:.0} s: {}",
            started.elapsed().as_secs_f64(),
            busy.join(", ")
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// The words of the seeded history's sentences.
const HISTORY_WORDS: [&str; 48] = [
    "garden",
    "tomatoes",
    "planted",
    "sister",
    "visited",
    "Lisbon",
    "train",
    "ticket",
    "concert",
    "violin",
    "lesson",
    "Tuesday",
    "recipe",
    "lentil",
    "soup",
    "marathon",
    "training",
    "knee",
    "doctor",
    "appointment",
    "birthday",
    "present",
    "novel",
    "chapter",
    "finished",
    "bicycle",
    "repair",
    "chain",
    "holiday",
    "Norway",
    "fjord",
    "camera",
    "lens",
    "photographs",
    "project",
    "deadline",
    "meeting",
    "colleague",
    "apartment",
    "rent",
    "landlord",
    "kitchen",
    "painted",
    "blue",
    "puppy",
    "walks",
    "morning",
    "coffee",
];

/// Writes `writes` memories round robin over the replicas, each looked for through the other
/// replicas until it is recalled (at most `LAG_LIMIT`): the lags (ms, sorted) and how many
/// lookups never found it.
async fn written_then_recalled(
    client: &Arc<Client>,
    replicas: &[Replica],
    writes: usize,
    run: &str,
) -> anyhow::Result<(Vec<f64>, usize)> {
    eprintln!("writing {writes} memories, each looked for through the other replicas…");
    let mut lags = Vec::new();
    let mut missed = 0usize;
    for index in 0..writes {
        let writer = index % replicas.len();
        let content = note(index, run);
        let written = client
            .post(
                &replicas[writer].base,
                "/v1/memories",
                json!({ "content": content, "kind": "fact" }),
            )
            .await?;
        let written_at = Instant::now();
        let id = written["id"]
            .as_str()
            .context("the written memory has no id")?
            .to_string();
        let lookups = replicas
            .iter()
            .enumerate()
            .filter(|(reader, _)| *reader != writer)
            .map(|(_, replica)| {
                let (client, base, query, id) = (
                    client.clone(),
                    replica.base.clone(),
                    content.clone(),
                    id.clone(),
                );
                tokio::spawn(async move {
                    while written_at.elapsed() < LAG_LIMIT {
                        if client.recalls(&base, &query, &id).await? {
                            return anyhow::Ok(Some(written_at.elapsed()));
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Ok(None)
                })
            })
            .collect::<Vec<_>>();
        for lookup in lookups {
            match lookup.await?? {
                Some(lag) => lags.push(lag.as_secs_f64() * 1000.0),
                None => missed += 1,
            }
        }
    }
    lags.sort_by(f64::total_cmp);
    Ok((lags, missed))
}

/// Recall times of one series: the client's time per replica (ms, sorted), and the stages the
/// server reported for each answer ([`Stages`]).
struct Series {
    per_replica: Vec<Vec<f64>>,
    stages: Stages,
}

/// The server's own timings of each recall of a series (`timings` in the answer), by stage.
#[derive(Default)]
struct Stages {
    embed: Vec<f64>,
    vector: Vec<f64>,
    keyword: Vec<f64>,
    hydrate: Vec<f64>,
    rank: Vec<f64>,
    total: Vec<f64>,
    /// The client's time less the server's total: HTTP, JSON, the listener's queue.
    outside: Vec<f64>,
}

impl Stages {
    fn add(&mut self, answer: &Value, wall: f64) {
        let timings = &answer["timings"];
        let ms = |name: &str| timings[name].as_f64().unwrap_or(0.0);
        self.embed.push(ms("embed_ms"));
        self.vector.push(ms("vector_ms"));
        self.keyword.push(ms("keyword_ms"));
        self.hydrate.push(ms("hydrate_ms"));
        self.rank.push(ms("rank_ms"));
        self.total.push(ms("total_ms"));
        self.outside.push((wall - ms("total_ms")).max(0.0));
    }

    /// One table row per stage: p50, p99 and max over the series.
    fn write(&mut self, out: &mut dyn std::io::Write, series: &str) -> anyhow::Result<()> {
        for (stage, times) in [
            ("embedding the query", &mut self.embed),
            (
                "vector searches (beside the keyword side)",
                &mut self.vector,
            ),
            ("keyword searches and their coverage", &mut self.keyword),
            ("reading rows from SQL", &mut self.hydrate),
            ("ranking", &mut self.rank),
            ("the server's total", &mut self.total),
            ("outside the recall (HTTP, JSON)", &mut self.outside),
        ] {
            times.sort_by(f64::total_cmp);
            writeln!(
                out,
                "| {series}: {stage} | {:.1} ms | {:.1} ms | {:.1} ms |",
                percentile(times, 0.5),
                percentile(times, 0.99),
                times.last().copied().unwrap_or(0.0),
            )?;
        }
        Ok(())
    }
}

/// `queries` recalls through each replica, of distinct questions numbered from `first`.
async fn recall_times(
    client: &Client,
    replicas: &[Replica],
    queries: usize,
    first: usize,
) -> anyhow::Result<Series> {
    eprintln!("{queries} recalls through each replica…");
    let mut series = Series {
        per_replica: Vec::new(),
        stages: Stages::default(),
    };
    for (at, replica) in replicas.iter().enumerate() {
        let mut times = Vec::with_capacity(queries);
        let from = first + at * queries;
        for index in from..from + queries {
            let started = Instant::now();
            let answer = client
                .post(
                    &replica.base,
                    "/v1/memories/search",
                    json!({ "query": question(index), "k": 5 }),
                )
                .await?;
            let wall = started.elapsed().as_secs_f64() * 1000.0;
            series.stages.add(&answer, wall);
            times.push(wall);
        }
        times.sort_by(f64::total_cmp);
        series.per_replica.push(times);
    }
    Ok(series)
}

/// The markdown table: the write-to-recall lag, then recall times per replica and over all.
fn write_table(
    out: &mut dyn std::io::Write,
    replicas: usize,
    qdrant: &str,
    lags: &[f64],
    missed: usize,
    per_replica: &[Vec<f64>],
) -> anyhow::Result<()> {
    let mut all: Vec<f64> = per_replica.iter().flatten().copied().collect();
    all.sort_by(f64::total_cmp);
    writeln!(
        out,
        "| measure ({replicas} replicas, one PostgreSQL, {qdrant}) | p50 | p99 | max |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    writeln!(
        out,
        "| written through one replica → recalled through another ({} lookups, {missed} not within {}s) | {:.1} ms | {:.1} ms | {:.1} ms |",
        lags.len(),
        LAG_LIMIT.as_secs(),
        percentile(lags, 0.5),
        percentile(lags, 0.99),
        lags.last().copied().unwrap_or(0.0),
    )?;
    for (index, times) in per_replica.iter().enumerate() {
        writeln!(
            out,
            "| recall through replica {} ({} queries) | {:.1} ms | {:.1} ms | {:.1} ms |",
            index + 1,
            times.len(),
            percentile(times, 0.5),
            percentile(times, 0.99),
            times.last().copied().unwrap_or(0.0),
        )?;
    }
    writeln!(
        out,
        "| recall through any replica | {:.1} ms | {:.1} ms | {:.1} ms |",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(0.0),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stages come from the answer's own `timings`, and what the client waited beyond
    /// the server's total is counted outside the recall.
    #[test]
    fn the_stages_are_read_off_the_answer() {
        let mut stages = Stages::default();
        let answer = json!({
            "results": [],
            "timings": {
                "embed_ms": 6.5, "vector_ms": 2.0, "keyword_ms": 7.3, "hydrate_ms": 0.5,
                "rank_ms": 0.25, "search_ms": 4.0, "total_ms": 10.5
            }
        });
        stages.add(&answer, 12.0);
        let mut out = Vec::new();
        stages.write(&mut out, "up").expect("write");
        let table = String::from_utf8(out).expect("utf-8");
        assert!(
            table.contains("| up: embedding the query | 6.5 ms |"),
            "{table}"
        );
        assert!(
            table.contains("| up: keyword searches and their coverage | 7.3 ms |"),
            "{table}"
        );
        assert!(
            table.contains("| up: the server's total | 10.5 ms |"),
            "{table}"
        );
        assert!(
            table.contains("| up: outside the recall (HTTP, JSON) | 1.5 ms |"),
            "{table}"
        );
        assert_eq!(table.lines().count(), 7);
    }
}
