//! Crash safety: the real binary is killed with SIGKILL at a random moment while several users
//! write, patch and delete memories, and restarted on the same data directory, three times.
//! Afterwards every acknowledged write is there with its acknowledged content (in-flight ones
//! may or may not be), deleted memories are gone, nothing unwritten appears, keyword and vector
//! search find every acknowledged content (and no replaced one), and — opened in-process once
//! the binary has stopped — SQL, the vector index and the keyword index hold exactly the same
//! memory ids for every user. The servers' logs must show no panic.
//!
//! The run is seeded (the seed is printed): `MNEMO_CRASH_SEED=<n>` replays the same operations
//! and kill delays (timing still varies). On failure the data dir and the server logs are kept
//! and their place is printed.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::binary::{Server, add_user, call, copy_dir, read_log, terminate};
use support::{Backend, Home, TestApp};

/// Optimise the vector index often, so some kills land during an optimisation, and move users
/// to vector shards of their own early, so some land during a move.
const CRASH_ENV: [(&str, &str); 3] = [
    ("MNEMO__QDRANT__OPTIMIZE_AFTER_UPSERTS", "25"),
    ("MNEMO__QDRANT__TENANT_SHARD_POINTS", "10"),
    (
        "MNEMO__LOG__LEVEL",
        "warn,mnemo::index::indexer=info,mnemo::index::edge=info",
    ),
];

async fn start_server(data_dir: &Path, log: &Path) -> Server {
    support::binary::start_server_with(data_dir, log, &CRASH_ENV).await
}

async fn start_server_with(data_dir: &Path, log: &Path, env: &[(&str, &str)]) -> Server {
    let mut all = CRASH_ENV.to_vec();
    all.extend_from_slice(env);
    support::binary::start_server_with(data_dir, log, &all).await
}

const USERS: usize = 3;
const WRITERS_PER_USER: usize = 2;
const CRASHES: usize = 3;

/// What a memory may look like in the end: `None` is "deleted". One possibility means every
/// write to it was acknowledged; more mean a write was in flight at a crash.
#[derive(Debug, Clone)]
struct Tracked {
    possible: Vec<Option<String>>,
    /// Unique tokens of acknowledged contents this memory no longer has.
    replaced_tokens: Vec<String>,
}

impl Tracked {
    fn certain_content(&self) -> Option<&str> {
        match self.possible.as_slice() {
            [Some(content)] => Some(content),
            _ => None,
        }
    }
}

/// One writer's view of its own memories (writers never touch each other's memories, so each
/// memory has at most one request in flight).
struct Writer {
    user: usize,
    name: String,
    key: String,
    rng: StdRng,
    counter: u64,
    memories: HashMap<String, Tracked>,
    /// Ids in creation order, for picking.
    order: Vec<String>,
    /// Contents of POSTs that were not acknowledged (they may or may not exist).
    unacked_posts: HashSet<String>,
    /// Non-2xx answers (never expected).
    unexpected: Vec<String>,
    acked: u64,
}

fn token(rng: &mut StdRng) -> String {
    (0..12)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// The unique token of a content made by `Writer::content`.
fn token_of(content: &str) -> &str {
    content.rsplit(' ').next().expect("token")
}

impl Writer {
    fn content(&mut self, round: usize) -> String {
        self.counter += 1;
        let token = token(&mut self.rng);
        format!(
            "{} noted item {} during round {round} with marker {token}",
            self.name, self.counter
        )
    }

    /// Writes until the server goes away.
    async fn run(mut self, base: String, round: usize, acks: Arc<AtomicU64>) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
            .expect("client");
        loop {
            let certain: Vec<String> = self
                .order
                .iter()
                .filter(|id| self.memories[*id].certain_content().is_some())
                .cloned()
                .collect();
            let roll = self.rng.random_range(0..100);
            let alive = if certain.is_empty() || roll < 65 {
                self.post(&client, &base, round).await
            } else {
                let id = certain[self.rng.random_range(0..certain.len())].clone();
                if roll < 85 {
                    self.patch(&client, &base, round, &id).await
                } else {
                    self.delete(&client, &base, &id).await
                }
            };
            match alive {
                Some(true) => {
                    self.acked += 1;
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                Some(false) => {}
                None => return self,
            }
        }
    }

    /// Status and body, or `None` when the server is gone (no answer, or a cut-off one).
    async fn send(
        &mut self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Option<(StatusCode, Value)> {
        let response = request.bearer_auth(&self.key).send().await.ok()?;
        let status = response.status();
        let text = response.text().await.ok()?;
        if !status.is_success() {
            self.unexpected.push(format!("{what}: {status} {text}"));
        }
        Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Each operation answers `Some(true)` when acknowledged, `Some(false)` when refused, and
    /// `None` when the server is gone.
    async fn post(&mut self, client: &reqwest::Client, base: &str, round: usize) -> Option<bool> {
        let content = self.content(round);
        self.unacked_posts.insert(content.clone());
        let request = client
            .post(format!("{base}/v1/memories"))
            .json(&json!({ "content": content, "kind": "fact" }));
        let (status, body) = self.send(request, "POST /v1/memories").await?;
        if status != StatusCode::CREATED {
            return Some(false);
        }
        assert_eq!(body["content"], json!(content), "{body}");
        let id = body["id"].as_str().expect("memory id").to_string();
        self.unacked_posts.remove(&content);
        self.order.push(id.clone());
        self.memories.insert(
            id,
            Tracked {
                possible: vec![Some(content)],
                replaced_tokens: Vec::new(),
            },
        );
        Some(true)
    }

    async fn patch(
        &mut self,
        client: &reqwest::Client,
        base: &str,
        round: usize,
        id: &str,
    ) -> Option<bool> {
        let old = self.memories[id]
            .certain_content()
            .expect("certain")
            .to_string();
        let new = self.content(round);
        // Until acknowledged, either content may survive.
        self.memories.get_mut(id).expect("tracked").possible =
            vec![Some(old.clone()), Some(new.clone())];
        let request = client
            .patch(format!("{base}/v1/memories/{id}"))
            .json(&json!({ "content": new }));
        let (status, body) = self.send(request, "PATCH /v1/memories/{id}").await?;
        if status != StatusCode::OK {
            return Some(false);
        }
        assert_eq!(body["content"], json!(new), "{body}");
        let tracked = self.memories.get_mut(id).expect("tracked");
        tracked.possible = vec![Some(new)];
        tracked.replaced_tokens.push(token_of(&old).to_string());
        Some(true)
    }

    async fn delete(&mut self, client: &reqwest::Client, base: &str, id: &str) -> Option<bool> {
        let old = self.memories[id].certain_content().map(str::to_string);
        self.memories.get_mut(id).expect("tracked").possible = vec![old, None];
        let request = client.delete(format!("{base}/v1/memories/{id}"));
        let (status, _) = self.send(request, "DELETE /v1/memories/{id}").await?;
        if status != StatusCode::NO_CONTENT {
            return Some(false);
        }
        self.memories.get_mut(id).expect("tracked").possible = vec![None];
        Some(true)
    }
}

/// Every memory of a user (archived and superseded too), id → content, via the HTTP API.
async fn list_all(client: &reqwest::Client, base: &str, key: &str) -> HashMap<String, String> {
    let mut all = HashMap::new();
    let mut before: Option<String> = None;
    loop {
        let mut url =
            format!("{base}/v1/memories?include_archived=true&include_invalid=true&limit=500");
        if let Some(before) = &before {
            url.push_str(&format!("&before={before}"));
        }
        let response = client.get(url).bearer_auth(key).send().await.expect("list");
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.expect("list body");
        for memory in body["memories"].as_array().expect("memories") {
            let id = memory["id"].as_str().expect("id").to_string();
            let content = memory["content"].as_str().expect("content").to_string();
            assert!(all.insert(id, content).is_none(), "a memory listed twice");
        }
        match body["next_before"].as_str() {
            Some(next) => before = Some(next.to_string()),
            None => return all,
        }
    }
}

/// A search; returns `(id, vector score)` best first.
async fn search(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    mode: &str,
    query: &str,
) -> Vec<(String, Option<f64>)> {
    let response = client
        .post(format!("{base}/v1/memories/search"))
        .bearer_auth(key)
        .json(&json!({ "query": query, "mode": mode, "k": 20 }))
        .send()
        .await
        .expect("search");
    let status = response.status();
    let body: Value = response.json().await.expect("search body");
    assert_eq!(status, StatusCode::OK, "{body}");
    body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|result| {
            (
                result["memory"]["id"].as_str().expect("id").to_string(),
                result["signals"]["vector_score"].as_f64(),
            )
        })
        .collect()
}

#[test]
fn acknowledged_writes_survive_sigkill_and_indexes_match_sql() {
    // `home` is declared first so it is dropped last: the in-process app's background tasks
    // keep the Qdrant Edge shard open until the runtime is dropped, and the shard flushes
    // into the data dir when it is dropped.
    let home: Home;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    home = runtime.block_on(Home::new(Backend::Sqlite));
    runtime.block_on(crash_and_check(&home));
    drop(runtime);
}

async fn crash_and_check(home: &Home) {
    let started = Instant::now();
    let seed: u64 = std::env::var("MNEMO_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    println!("crash test seed: {seed} (replay with MNEMO_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let data_dir = home.data_dir();
    let logs = tempfile::tempdir().expect("log dir");
    let mut log_paths: Vec<PathBuf> = Vec::new();

    let mut names = Vec::new();
    let mut keys = Vec::new();
    for user in 0..USERS {
        let name = format!("crasher{user}");
        keys.push(add_user(&data_dir, &name).await);
        names.push(name);
    }
    let mut writers: Vec<Writer> = (0..USERS * WRITERS_PER_USER)
        .map(|index| {
            let user = index / WRITERS_PER_USER;
            Writer {
                user,
                name: format!("{}w{}", names[user], index % WRITERS_PER_USER),
                key: keys[user].clone(),
                rng: StdRng::seed_from_u64(rng.random()),
                counter: 0,
                memories: HashMap::new(),
                order: Vec::new(),
                unacked_posts: HashSet::new(),
                unexpected: Vec::new(),
                acked: 0,
            }
        })
        .collect();

    for round in 0..CRASHES {
        let log = logs.path().join(format!("serve-{round}.log"));
        log_paths.push(log.clone());
        let mut server = start_server(&data_dir, &log).await;
        let acks = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = writers
            .drain(..)
            .map(|writer| tokio::spawn(writer.run(server.base.clone(), round, acks.clone())))
            .collect();
        // A random moment, once writes are flowing.
        let delay = Duration::from_millis(rng.random_range(150..2500));
        tokio::time::sleep(delay).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while acks.load(Ordering::Relaxed) < 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.child.start_kill().expect("SIGKILL");
        let status = server
            .child
            .wait()
            .await
            .expect("wait for the killed server");
        assert!(!status.success(), "the server was killed: {status}");
        for task in tasks {
            let writer = tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("writers notice the crash")
                .expect("writer task");
            writers.push(writer);
        }
        println!(
            "round {round}: killed after {delay:?} with {} acknowledged writes",
            acks.load(Ordering::Relaxed)
        );
    }

    // Restart and check what the API shows.
    let log = logs.path().join("serve-final.log");
    log_paths.push(log.clone());
    let server = start_server(&data_dir, &log).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("client");
    let mut listed: Vec<HashMap<String, String>> = Vec::new();
    for key in &keys {
        listed.push(list_all(&client, &server.base, key).await);
    }
    let mut problems = Vec::new();
    let mut searched = 0;
    for writer in &writers {
        let actual = &listed[writer.user];
        for (id, tracked) in &writer.memories {
            let found = actual.get(id).cloned();
            if !tracked.possible.contains(&found) {
                problems.push(format!(
                    "{}: memory {id} is {found:?}, expected one of {:?}",
                    writer.name, tracked.possible
                ));
            }
        }
        // Both indexes hold every acknowledged content: its unique token finds it by keyword,
        // the content itself finds it first by vector; replaced contents find it no more.
        for id in &writer.order {
            let tracked = &writer.memories[id];
            let Some(content) = tracked.certain_content() else {
                continue;
            };
            let token = token_of(content);
            let hits = search(&client, &server.base, &writer.key, "keyword", token).await;
            searched += 1;
            if !hits.iter().any(|(hit, _)| hit == id) {
                problems.push(format!(
                    "{}: keyword search for {token:?} misses memory {id} ({content:?}); \
                     hits {hits:?}",
                    writer.name
                ));
            }
            let hits = search(&client, &server.base, &writer.key, "vector", content).await;
            searched += 1;
            match hits.first() {
                Some((hit, Some(score))) if hit == id && *score > 0.99 => {}
                top => problems.push(format!(
                    "{}: vector search for {content:?} does not find memory {id} first \
                     (top hit {top:?})",
                    writer.name
                )),
            }
            for old in &tracked.replaced_tokens {
                let hits = search(&client, &server.base, &writer.key, "keyword", old).await;
                searched += 1;
                if hits.iter().any(|(hit, _)| hit == id) {
                    problems.push(format!(
                        "{}: keyword search for the replaced token {old:?} still finds {id}",
                        writer.name
                    ));
                }
            }
        }
    }
    // Anything else a user has must come from a POST that was in flight at a kill.
    for (user, actual) in listed.iter().enumerate() {
        let user_writers: Vec<&Writer> = writers.iter().filter(|w| w.user == user).collect();
        for (id, content) in actual {
            let tracked = user_writers.iter().any(|w| w.memories.contains_key(id));
            let in_flight = user_writers
                .iter()
                .any(|w| w.unacked_posts.contains(content));
            if !tracked && !in_flight {
                problems.push(format!(
                    "{}: memory {id} ({content:?}) was never written",
                    names[user]
                ));
            }
        }
    }
    terminate(server, &log).await;
    // What the binary left behind, kept (with the logs) if the test fails.
    let evidence = tempfile::Builder::new()
        .prefix("mnemo-crash-")
        .tempdir()
        .expect("evidence dir");
    copy_dir(&data_dir, &evidence.path().join("data"));
    copy_dir(logs.path(), &evidence.path().join("logs"));

    // The same data dir in-process: SQL and both indexes hold exactly the same ids.
    let app = TestApp::spawn(home).await;
    app.wait_indexed().await;
    let lag = app.state.memory.indexer().lag().await.expect("lag");
    for (user, name) in names.iter().enumerate() {
        let user_id = app
            .state
            .store
            .accounts()
            .user_by_name(name)
            .await
            .expect("user lookup")
            .expect("user exists")
            .id;
        let sql: Vec<String> = app
            .state
            .memory
            .export(user_id)
            .await
            .expect("export")
            .iter()
            .map(|memory| memory.id.to_string())
            .collect();
        let vector: Vec<String> = app
            .state
            .memory
            .indexer()
            .vector()
            .ids(user_id)
            .await
            .expect("vector ids")
            .iter()
            .map(ToString::to_string)
            .collect();
        let keyword: Vec<String> = app
            .state
            .memory
            .indexer()
            .keyword()
            .local()
            .expect("the embedded backend keeps tantivy")
            .ids_async(user_id)
            .await
            .expect("keyword ids")
            .iter()
            .map(ToString::to_string)
            .collect();
        let sql_set: HashSet<&String> = sql.iter().collect();
        let vector_set: HashSet<&String> = vector.iter().collect();
        let keyword_set: HashSet<&String> = keyword.iter().collect();
        let listed_set: HashSet<&String> = listed[user].keys().collect();
        if sql_set != listed_set {
            problems.push(format!(
                "{name}: SQL after SIGTERM differs from the API before it: {} vs {}",
                sql_set.len(),
                listed_set.len()
            ));
        }
        for (index, ids, set) in [
            ("vector", &vector, &vector_set),
            ("keyword", &keyword, &keyword_set),
        ] {
            if ids.len() != set.len() {
                problems.push(format!(
                    "{name}: the {index} index holds {} documents for {} ids",
                    ids.len(),
                    set.len()
                ));
            }
            let missing: Vec<_> = sql_set.difference(set).collect();
            let extra: Vec<_> = set.difference(&sql_set).collect();
            if !missing.is_empty() || !extra.is_empty() {
                problems.push(format!(
                    "{name}: the {index} index differs from SQL ({} ids): missing {missing:?}, \
                     extra {extra:?} (lag {lag:?})",
                    sql_set.len()
                ));
            }
        }
        println!(
            "{name}: {} memories in SQL, {} in the vector index, {} in the keyword index",
            sql.len(),
            vector.len(),
            keyword.len()
        );
    }
    app.stop().await;

    for writer in &writers {
        for unexpected in &writer.unexpected {
            problems.push(format!("{}: unexpected answer {unexpected}", writer.name));
        }
    }
    let mut moves = 0;
    for path in &log_paths {
        let text = read_log(path);
        for line in text.lines().filter(|line| line.contains("panicked")) {
            problems.push(format!("{}: {line}", path.display()));
        }
        let optimised = text
            .lines()
            .filter(|line| line.contains("vector index optimised"))
            .count();
        let moved = text
            .lines()
            .filter(|line| line.contains("moved to their own vector shard"))
            .count();
        moves += moved;
        println!(
            "{}: {optimised} vector optimisations, {moved} users moved to their own shard",
            path.display()
        );
        let warnings = text
            .lines()
            .filter(|line| line.contains("WARN") || line.contains("ERROR"))
            .count();
        if warnings > 0 {
            println!("{}: {warnings} warnings/errors:\n{text}", path.display());
        }
    }
    let acked: u64 = writers.iter().map(|w| w.acked).sum();
    let tracked: usize = writers.iter().map(|w| w.memories.len()).sum();
    let in_flight: usize = writers
        .iter()
        .map(|w| {
            w.unacked_posts.len() + w.memories.values().filter(|t| t.possible.len() > 1).count()
        })
        .sum();
    println!(
        "{acked} acknowledged writes, {tracked} memories tracked, {in_flight} writes in flight \
         at a kill, {searched} searches, {moves} moves to a tenant shard, {:?}",
        started.elapsed()
    );
    assert!(acked >= (CRASHES * 3) as u64, "writes were acknowledged");
    if !problems.is_empty() {
        problems.push(format!(
            "the data dir as the binary left it, and its logs, are kept in {}",
            evidence.keep().display()
        ));
    }
    assert!(
        problems.is_empty(),
        "seed {seed}: {} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The on-disk state a SIGKILL leaves in the middle of a tantivy commit: the new delete file
/// (`<segment>.<opstamp>.del`) is written, `meta.json` is not. The indexer then replays the
/// same batch at the next start, which must succeed (and keep succeeding).
#[test]
fn keyword_index_replays_a_commit_killed_after_its_delete_file() {
    use mnemo::index::keyword::{KeywordDoc, KeywordIndex, KeywordOp};
    use mnemo::index::vector::VectorFilter;
    use mnemo::store::{MemoryId, UserKind};

    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let user = runtime.block_on(async {
        let store = mnemo::store::connect(
            &support::databases::sqlite_url(dir.path()),
            1,
            std::time::Duration::from_secs(10),
        )
        .await
        .expect("store");
        store
            .accounts()
            .create_user("keyword", UserKind::Key)
            .await
            .expect("user")
            .id
    });
    let (memory, other) = (MemoryId::new(), MemoryId::new());
    let doc = |id: MemoryId, content: &str| {
        KeywordOp::Upsert(KeywordDoc {
            id,
            user_id: user,
            content: content.to_string(),
            context: content.to_string(),
            kind: "fact".into(),
            created_at_ms: 0,
            archived: false,
            valid: true,
        })
    };
    let upsert = |content: &str| vec![doc(memory, content)];
    let live = dir.path().join("live");
    let crashed = dir.path().join("crashed");
    KeywordIndex::open(Some(&live))
        .expect("open")
        .apply(&[doc(memory, "first version"), doc(other, "unrelated")], 1)
        .expect("first commit");
    copy_dir(&live, &crashed);
    KeywordIndex::open(Some(&live))
        .expect("reopen")
        .apply(&upsert("second version"), 2)
        .expect("second commit");
    // A SIGKILL after the second commit wrote its files (the new segment, the delete file of
    // the first segment, the managed-file list) but before `meta.json`.
    let mut delete_files = 0;
    for entry in std::fs::read_dir(&live).expect("read dir") {
        let name = entry.expect("entry").file_name();
        if name == "meta.json" {
            continue;
        }
        if name.to_string_lossy().ends_with(".del") && !crashed.join(&name).exists() {
            delete_files += 1;
        }
        std::fs::copy(live.join(&name), crashed.join(&name)).expect("copy");
    }
    assert_eq!(delete_files, 1, "the second commit wrote one delete file");

    // The next start replays the batch; then the index is as if nothing had happened.
    let index = KeywordIndex::open(Some(&crashed)).expect("open after the crash");
    assert_eq!(index.applied_seq(), 1);
    if let Err(error) = index.apply(&upsert("second version"), 2) {
        panic!("replaying the interrupted commit fails: {error}");
    }
    drop(index);
    let index = KeywordIndex::open(Some(&crashed)).expect("open after the replay");
    assert_eq!(index.applied_seq(), 2);
    let filter = VectorFilter::default();
    let found = |query: &str| -> Vec<MemoryId> {
        let hits = index.search(user, query, &filter, 10).expect("search");
        hits.into_iter().map(|(id, _)| id).collect()
    };
    assert_eq!(found("second"), vec![memory]);
    assert!(found("first").is_empty());
    assert_eq!(found("unrelated"), vec![other]);
    let mut ids = index.ids(user).expect("ids");
    ids.sort();
    let mut expected = vec![memory, other];
    expected.sort();
    assert_eq!(ids, expected);
}

/// Turn jobs queued when the server is killed (SIGKILL, no shutdown at all) all run after the
/// restart: the memories they write appear, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_pending_at_a_sigkill_all_run_after_the_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let key = add_user(&data_dir, "kim").await;
    let client = reqwest::Client::new();
    // No writer workers: every turn's job stays queued.
    let mut server = start_server_with(
        &data_dir,
        &log,
        &[
            ("MNEMO__MEMORY__WRITER_WORKERS", "0"),
            ("MNEMO__SERVER__ADMIN_USERS", "kim"),
        ],
    )
    .await;
    let (status, thread) = call(
        &client,
        &server.base,
        &key,
        "POST",
        "/v1/threads",
        json!({ "title": "t" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    let thread = thread["id"].as_str().unwrap().to_string();
    let subjects = [
        "bike lock code",
        "garage code",
        "gym locker number",
        "desk number",
        "parking spot",
        "badge number",
    ];
    let codes: Vec<String> = (0..subjects.len()).map(|i| format!("77{i}3")).collect();
    for (subject, code) in subjects.iter().zip(&codes) {
        let (status, run) = call(
            &client,
            &server.base,
            &key,
            "POST",
            &format!("/v1/threads/{thread}/messages"),
            json!({ "content": format!("My {subject} is {code}."), "stream": false }),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{run}");
        let run = run["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, state) = call(
                &client,
                &server.base,
                &key,
                "GET",
                &format!("/v1/runs/{run}"),
                Value::Null,
            )
            .await;
            if state["status"] != "running" {
                break;
            }
            assert!(Instant::now() < deadline, "the turn ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (_, health) = call(&client, &server.base, &key, "GET", "/health", Value::Null).await;
    assert_eq!(
        health["components"]["memory_writer"]["queued"],
        codes.len(),
        "{health}"
    );
    server.child.kill().await.expect("SIGKILL");

    let server = start_server(&data_dir, &dir.path().join("serve-2.log")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let found = loop {
        let (_, listed) = call(
            &client,
            &server.base,
            &key,
            "GET",
            "/v1/memories?kinds=fact&limit=100&include_invalid=true",
            Value::Null,
        )
        .await;
        let contents: Vec<String> = listed["memories"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect();
        if codes
            .iter()
            .all(|code| contents.iter().any(|c| c.contains(code.as_str())))
        {
            break contents;
        }
        assert!(
            Instant::now() < deadline,
            "every queued job ran after the restart: {contents:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for code in &codes {
        let copies = found.iter().filter(|c| c.contains(code.as_str())).count();
        assert_eq!(copies, 1, "{code} stored once: {found:?}");
    }
    let log_text = read_log(&log) + &read_log(&dir.path().join("serve-2.log"));
    assert!(!log_text.contains("panicked"), "{log_text}");
}
