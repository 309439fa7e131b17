//! A soak with crashes: mixed traffic (memory adds and deletes, searches, streamed chat turns
//! against the fake model) on the release server, which is killed with SIGKILL every couple of
//! minutes and started again on the same data directory. After every kill, `mnemo check`
//! compares both indexes with SQL (after applying the memory log, as a start does), and every
//! acknowledged write is looked up: an add answered 201 must be there, a delete answered 204
//! must stay gone.
//!
//! `cargo bench --bench soak` (needs `scripts/fetch-model`). `MNEMO_BENCH_SOAK_SECS` (default
//! 600) and `MNEMO_BENCH_KILL_SECS` (default 120) change the schedule. Prints numbers and exits
//! 1 when a write was lost or an index differs from SQL.

#[path = "../tests/api/support/fake_llm.rs"]
mod fake_llm;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_llm::{FakeLlm, Reply, prompt_text};
use futures::StreamExt;
use serde_json::{Value, json};
use support::{add_user, env_number, free_port, model_dir};

/// What the clients were told, and what they could not know.
#[derive(Default)]
struct Ledger {
    /// Adds answered 201: id → owner's key index.
    added: BTreeMap<String, usize>,
    /// Deletes answered 204.
    deleted: BTreeSet<String>,
    /// Deletes whose answer never came (the server died): either outcome is right.
    unsure: BTreeSet<String>,
}

#[derive(Default)]
struct Counters {
    adds: AtomicU64,
    deletes: AtomicU64,
    searches: AtomicU64,
    turns: AtomicU64,
    refused: AtomicU64,
}

struct Server {
    binary: &'static str,
    data_dir: PathBuf,
    port: u16,
    env: Vec<(String, String)>,
    child: Option<tokio::process::Child>,
}

impl Server {
    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(self.binary);
        command.arg("--data-dir").arg(&self.data_dir);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        command
    }

    async fn start(&mut self, client: &reqwest::Client) -> Duration {
        let started = Instant::now();
        let mut command = self.command();
        command
            .args(["serve", "--addr", &format!("127.0.0.1:{}", self.port)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        self.child = Some(command.spawn().expect("start mnemo serve"));
        let base = self.base();
        for _ in 0..1200 {
            if let Ok(response) = client.get(format!("{base}/health")).send().await
                && response.status().is_success()
            {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the server did not become healthy");
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `mnemo check` on the stopped server's data directory: its one output line and whether
    /// the indexes equal SQL.
    async fn check(&self) -> (bool, String) {
        let output = self
            .command()
            .arg("check")
            .output()
            .await
            .expect("mnemo check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout).trim(),
            if output.status.success() {
                String::new()
            } else {
                format!(" — {}", String::from_utf8_lossy(&output.stderr).trim())
            }
        );
        (output.status.success(), text)
    }
}

fn main() {
    let runtime = support::runtime();
    runtime.block_on(async {
        let Some(model_dir) = model_dir() else {
            return;
        };
        let total = Duration::from_secs(env_number("MNEMO_BENCH_SOAK_SECS", 600));
        let every = Duration::from_secs(env_number("MNEMO_BENCH_KILL_SECS", 120).max(5));
        let llm = FakeLlm::start().await;
        llm.set_handler(|request| {
            let prompt = prompt_text(request);
            if prompt.contains("Decide what is worth remembering") {
                return Some(Reply::text(r#"{"memories": []}"#));
            }
            None
        });
        llm.set_default(Reply::slow_text("Noted; I will keep that in mind.", 6, 40));
        let dir = tempfile::tempdir().expect("temp dir");
        let mut env = llm.env();
        env.push(("MNEMO__EMBEDDER__MODEL_DIR".into(), model_dir.into()));
        env.push(("MNEMO__SERVER__REQUESTS_PER_MINUTE".into(), "0".into()));
        env.push(("MNEMO__LOG__LEVEL".into(), "warn".into()));
        let mut server = Server {
            binary: env!("CARGO_BIN_EXE_mnemo"),
            data_dir: dir.path().to_path_buf(),
            port: free_port(),
            env,
            child: None,
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        let mut keys = Vec::new();
        for index in 0..3 {
            keys.push(add_user(server.binary, &server.data_dir, &format!("soak{index}")).await);
        }
        server.start(&client).await;
        let keys = Arc::new(keys);
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let base = server.base();
        let mut workers = Vec::new();
        for worker in 0..2 {
            workers.push(tokio::spawn(adder(
                client.clone(),
                base.clone(),
                keys.clone(),
                ledger.clone(),
                counters.clone(),
                stop.clone(),
                worker,
            )));
        }
        workers.push(tokio::spawn(deleter(
            client.clone(),
            base.clone(),
            keys.clone(),
            ledger.clone(),
            counters.clone(),
            stop.clone(),
        )));
        workers.push(tokio::spawn(chatter(
            client.clone(),
            base.clone(),
            keys.clone(),
            counters.clone(),
            stop.clone(),
        )));
        println!(
            "soak: {} s of mixed traffic, the server killed with SIGKILL every {} s",
            total.as_secs(),
            every.as_secs()
        );
        println!();
        println!("| kill | after | acknowledged adds / deletes | lost adds | deletes undone | indexes vs SQL (`mnemo check`) | back up in |");
        println!("|---|---|---|---|---|---|---|");
        let started = Instant::now();
        let mut kills = 0;
        let mut failures = 0;
        while started.elapsed() < total {
            let wait = every.min(total.saturating_sub(started.elapsed()));
            tokio::time::sleep(wait).await;
            server.kill().await;
            kills += 1;
            let (consistent, report) = server.check().await;
            let recovery = server.start(&client).await;
            let (lost, undone, adds, deletes) = audit(&client, &base, &keys, &ledger).await;
            if !consistent || lost > 0 || undone > 0 {
                failures += 1;
            }
            println!(
                "| {kills} | {:.0} s | {adds} / {deletes} | {lost} | {undone} | {report} | {:.1} s |",
                started.elapsed().as_secs_f64(),
                recovery.as_secs_f64()
            );
        }
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let _ = worker.await;
        }
        server.kill().await;
        println!();
        println!(
            "traffic: {} adds, {} deletes, {} searches, {} chat turns answered; {} requests \
             refused or cut by a kill",
            counters.adds.load(Ordering::Relaxed),
            counters.deletes.load(Ordering::Relaxed),
            counters.searches.load(Ordering::Relaxed),
            counters.turns.load(Ordering::Relaxed),
            counters.refused.load(Ordering::Relaxed)
        );
        if failures > 0 {
            eprintln!("{failures} of {kills} restarts lost a write or left an index unlike SQL");
            std::process::exit(1);
        }
    });
}

/// Adds memories, each with a word of its own, and searches for earlier ones.
async fn adder(
    client: reqwest::Client,
    base: String,
    keys: Arc<Vec<String>>,
    ledger: Arc<Mutex<Ledger>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    worker: usize,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let owner = (n as usize + worker) % keys.len();
        let word = format!("soak{worker}x{n}");
        let response = client
            .post(format!("{base}/v1/memories"))
            .bearer_auth(&keys[owner])
            .json(&json!({ "content": format!("The user keeps the code {word} in a drawer."), "kind": "fact" }))
            .send()
            .await;
        match response {
            Ok(response) if response.status() == reqwest::StatusCode::CREATED => {
                if let Ok(memory) = response.json::<Value>().await
                    && let Some(id) = memory["id"].as_str()
                {
                    lock(&ledger).added.insert(id.to_string(), owner);
                    counters.adds.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                counters.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        if n.is_multiple_of(5) {
            let probe = format!("soak{worker}x{}", n / 2);
            let found = client
                .post(format!("{base}/v1/memories/search"))
                .bearer_auth(&keys[owner])
                .json(&json!({ "query": probe, "k": 3 }))
                .send()
                .await;
            if found.is_ok_and(|r| r.status().is_success()) {
                counters.searches.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes one acknowledged memory every so often.
async fn deleter(
    client: reqwest::Client,
    base: String,
    keys: Arc<Vec<String>>,
    ledger: Arc<Mutex<Ledger>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        n += 1;
        let pick = {
            let ledger = lock(&ledger);
            let live: Vec<(&String, &usize)> = ledger
                .added
                .iter()
                .filter(|(id, _)| !ledger.deleted.contains(*id) && !ledger.unsure.contains(*id))
                .collect();
            (!live.is_empty()).then(|| {
                let (id, owner) = live[(n * 7919) % live.len()];
                (id.clone(), *owner)
            })
        };
        let Some((id, owner)) = pick else { continue };
        lock(&ledger).unsure.insert(id.clone());
        let response = client
            .delete(format!("{base}/v1/memories/{id}"))
            .bearer_auth(&keys[owner])
            .send()
            .await;
        match response {
            Ok(response) if response.status() == reqwest::StatusCode::NO_CONTENT => {
                let mut ledger = lock(&ledger);
                ledger.unsure.remove(&id);
                ledger.deleted.insert(id);
                counters.deletes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(response) if response.status().is_client_error() => {
                // Refused (not found, say): the memory stays as it was.
                lock(&ledger).unsure.remove(&id);
            }
            _ => {
                counters.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Streams chat turns, one after another.
async fn chatter(
    client: reqwest::Client,
    base: String,
    keys: Arc<Vec<String>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let mut thread: Option<String> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = &keys[0];
        if thread.is_none() {
            thread = create_thread(&client, &base, key).await;
            if thread.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            continue;
        }
        let Some(id) = thread.clone() else { continue };
        let response = client
            .post(format!("{base}/v1/threads/{id}/messages"))
            .bearer_auth(key)
            .json(&json!({ "content": format!("turn {n}: remember that the drawer is blue") }))
            .send()
            .await;
        let Ok(response) = response.map_err(|_| ()).and_then(|r| {
            if r.status().is_success() {
                Ok(r)
            } else {
                Err(())
            }
        }) else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut body = response.bytes_stream();
        let mut text = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("event: done") {
                counters.turns.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
}

async fn create_thread(client: &reqwest::Client, base: &str, key: &str) -> Option<String> {
    let response = client
        .post(format!("{base}/v1/threads"))
        .bearer_auth(key)
        .json(&json!({ "title": "soak" }))
        .send()
        .await
        .ok()
        .filter(|response| response.status().is_success())?;
    let thread: Value = response.json().await.ok()?;
    thread["id"].as_str().map(str::to_string)
}

/// Looks every acknowledged write up: (adds lost, deletes undone, adds, deletes).
async fn audit(
    client: &reqwest::Client,
    base: &str,
    keys: &[String],
    ledger: &Mutex<Ledger>,
) -> (usize, usize, usize, usize) {
    let (added, deleted, unsure) = {
        let ledger = lock(ledger);
        (
            ledger.added.clone(),
            ledger.deleted.clone(),
            ledger.unsure.clone(),
        )
    };
    let mut lost = 0;
    let mut undone = 0;
    for (id, owner) in &added {
        if unsure.contains(id) {
            continue;
        }
        let status = client
            .get(format!("{base}/v1/memories/{id}"))
            .bearer_auth(&keys[*owner])
            .send()
            .await
            .map(|response| response.status())
            .ok();
        let gone = status == Some(reqwest::StatusCode::NOT_FOUND);
        let there = status == Some(reqwest::StatusCode::OK);
        if deleted.contains(id) {
            undone += usize::from(there);
        } else if gone {
            // Traffic goes on during the audit: a delete sent since the snapshot explains it.
            let now = lock(ledger);
            if !now.deleted.contains(id) && !now.unsure.contains(id) {
                lost += 1;
            }
        }
    }
    (lost, undone, added.len(), deleted.len())
}

fn lock(ledger: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
