//! `TestApp`: the real application on 127.0.0.1:0 with a fresh database (SQLite file or a new
//! PostgreSQL database), one method per endpoint, and an SSE reader. Logs are silent unless
//! `TEST_LOG` is set.

#![allow(dead_code)]

pub mod binary;
pub mod databases;
pub mod fake_llm;
pub mod qdrant_cluster;
pub mod real_llm;
pub mod research_site;
pub mod site;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use mnemo::auth::keys;
use mnemo::config::{Overrides, Settings};
use mnemo::http::AppState;
use mnemo::startup;
use mnemo::store::UserKind;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The contents of a `/v1/memories/search` answer's results, in order.
pub fn result_contents(response: &Value) -> Vec<String> {
    response["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|result| result["memory"]["content"].as_str())
        .map(str::to_string)
        .collect()
}

/// Where a test app keeps its data, so it can be restarted on the same database.
pub struct Home {
    pub dir: tempfile::TempDir,
    pub database_url: String,
}

impl Home {
    pub async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let database_url = match backend {
            Backend::Sqlite => databases::sqlite_url(dir.path()),
            Backend::Postgres => databases::fresh_postgres_url().await,
        };
        Self { dir, database_url }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub state: AppState,
    shutdown: CancellationToken,
    server: JoinHandle<()>,
}

fn init_logs() {
    if std::env::var("TEST_LOG").is_ok() {
        mnemo::telemetry::init("info,mnemo=debug", false, false, std::io::stderr);
    } else {
        mnemo::telemetry::init("off", false, false, std::io::sink);
    }
}

/// The local embedding model fetched by `scripts/fetch-model`.
/// Settings that turn recall's relevance gate and tail off (and the raw-cosine gate of
/// ablations), for tests of fusion or of the evaluation's bookkeeping on haystacks too small
/// for operating points set on LoCoMo and the relevance sets.
pub const UNGATED: [(&str, &str); 6] = [
    ("MNEMO__MEMORY__RELEVANCE__GATE", "0"),
    ("MNEMO__MEMORY__RELEVANCE__TAIL", "0"),
    ("MNEMO__MEMORY__FUSION__GATE_COSINE", "0"),
    ("MNEMO__MEMORY__FUSION__GATE_COVERAGE", "0"),
    ("MNEMO__MEMORY__FUSION__FLOOR_COSINE", "0"),
    ("MNEMO__MEMORY__FUSION__FLOOR_COVERAGE", "0"),
];

pub fn model_dir() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/models/all-MiniLM-L6-v2");
    assert!(
        std::path::Path::new(dir).join("model.safetensors").exists(),
        "the embedding model is missing: run scripts/fetch-model"
    );
    dir.to_string()
}

/// The packed multilingual model fetched by `scripts/fetch-model`.
pub fn multilingual_model_dir() -> String {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/multilingual-e5-small-q4"
    );
    assert!(
        std::path::Path::new(dir).join("e5-small-q4.bin").exists(),
        "the multilingual embedding model is missing: run scripts/fetch-model"
    );
    dir.to_string()
}

/// A venv named `name` in the target's temporary directory with the pinned packages of
/// `requirements`, made on first use and again when the file changes (under a file lock, so
/// parallel tests make it once); its python. An error says why pip could not make it.
pub fn python_venv(name: &str, requirements: &Path) -> Result<PathBuf, String> {
    use std::process::Command;
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root).map_err(|e| format!("target tmp dir: {e}"))?;
    let lock = std::fs::File::create(root.join(format!("{name}.lock")))
        .map_err(|e| format!("lock file: {e}"))?;
    lock.lock().map_err(|e| format!("lock the venv: {e}"))?;
    let venv = root.join(name);
    let python = venv.join("bin/python");
    let wanted = std::fs::read_to_string(requirements)
        .map_err(|e| format!("read {}: {e}", requirements.display()))?;
    let ready = venv.join(".ready");
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    eprintln!(
        "making a venv with {} in {}",
        requirements.display(),
        venv.display()
    );
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map_err(|e| format!("python3 -m venv: {e}"))?;
    if !made.success() {
        return Err("python3 -m venv failed".into());
    }
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(requirements)
        .status()
        .map_err(|e| format!("pip: {e}"))?;
    if !installed.success() {
        return Err(format!(
            "pip could not install {} (is PyPI reachable?)",
            requirements.display()
        ));
    }
    std::fs::write(&ready, wanted).map_err(|e| format!("mark the venv ready: {e}"))?;
    Ok(python)
}

/// Documents and pages read outside a test app (a bare `Fetcher`) use the `mnemo` binary as
/// their extraction worker, as the server does.
pub fn use_extraction_worker() {
    mnemo::text::extract::configure(&mnemo::config::ExtractSettings {
        worker: Some(env!("CARGO_BIN_EXE_mnemo").into()),
        ..Default::default()
    });
}

/// The user named in `server.admin_users` of test apps.
pub const ADMIN: &str = "ops";

/// Settings for a test app in `home`, with extra `MNEMO__…` variables.
pub fn test_settings(home: &Home, env: &[(&str, &str)]) -> Settings {
    let mut vars: Vec<(String, String)> = vec![
        ("MNEMO__SERVER__ADDR".into(), "127.0.0.1:0".into()),
        ("MNEMO__DATABASE__URL".into(), home.database_url.clone()),
        ("MNEMO__EMBEDDER__MODEL_DIR".into(), model_dir()),
        // `/health`'s details are for administrators: `TestApp::health`.
        ("MNEMO__SERVER__ADMIN_USERS".into(), ADMIN.into()),
        // Documents and pages are read by the mnemo binary as a worker process.
        (
            "MNEMO__EXTRACT__WORKER".into(),
            env!("CARGO_BIN_EXE_mnemo").into(),
        ),
    ];
    for (key, value) in env {
        vars.retain(|(existing, _)| existing != key);
        vars.push((key.to_string(), value.to_string()));
    }
    let overrides = Overrides {
        data_dir: Some(home.data_dir()),
        ..Overrides::default()
    };
    Settings::load_from(&overrides, vars).expect("test settings")
}

impl TestApp {
    pub async fn spawn(home: &Home) -> Self {
        Self::spawn_with(home, &[]).await
    }

    pub async fn spawn_with(home: &Home, env: &[(&str, &str)]) -> Self {
        Self::spawn_settings(test_settings(home, env)).await
    }

    /// [`Self::spawn_with`] with owned values (built at run time).
    pub async fn spawn_with_owned(home: &Home, env: Vec<(&str, String)>) -> Self {
        let env: Vec<(&str, &str)> = env
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        Self::spawn_with(home, &env).await
    }

    /// A test app whose LLM is `llm`, with extra environment.
    pub async fn spawn_with_llm(
        home: &Home,
        llm: &fake_llm::FakeLlm,
        env: &[(&str, &str)],
    ) -> Self {
        let mut vars = llm.env();
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let borrowed: Vec<(&str, &str)> =
            vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Self::spawn_with(home, &borrowed).await
    }

    pub async fn spawn_settings(settings: Settings) -> Self {
        init_logs();
        let shutdown = CancellationToken::new();
        let listener = startup::bind(&settings).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let state = startup::build_state(settings, shutdown.clone())
            .await
            .expect("build state");
        let server_state = state.clone();
        let server = tokio::spawn(async move {
            mnemo::http::serve(listener, server_state)
                .await
                .expect("serve");
        });
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            state,
            shutdown,
            server,
        }
    }

    /// Graceful shutdown; waits for the server task to end.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .expect("server stops within 20 s")
            .expect("server task");
    }

    /// Waits until the memory writer's queue is empty and what it wrote is recallable (up to
    /// a minute: a loaded test machine embeds slowly).
    pub async fn wait_for_jobs(&self) {
        self.wait_for_jobs_within(Duration::from_secs(60)).await;
    }

    /// [`Self::wait_for_jobs`] with more patience (a real model on two cores is slow).
    pub async fn wait_for_jobs_within(&self, patience: Duration) {
        let started = std::time::Instant::now();
        while started.elapsed() < patience {
            let stats = self.state.store.maintenance().queue_stats().await.unwrap();
            if stats.queued == 0 && stats.running == 0 {
                assert!(
                    self.state
                        .memory
                        .wait_recallable(Duration::from_secs(10))
                        .await
                        .unwrap()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("memory jobs did not finish");
    }

    /// Waits until every memory written so far is in both indexes (at most a minute).
    pub async fn wait_indexed(&self) {
        assert!(
            self.state
                .memory
                .wait_recallable(Duration::from_secs(60))
                .await
                .expect("memory log head"),
            "memories were not indexed within a minute"
        );
    }

    /// `GET /health` as the administrator (`ADMIN`), with the details.
    pub async fn health(&self) -> (StatusCode, Value) {
        let accounts = self.state.store.accounts();
        let admin = match accounts.user_by_name(ADMIN).await {
            Ok(Some(user)) => user,
            _ => accounts
                .create_user(ADMIN, UserKind::Key)
                .await
                .expect("create user"),
        };
        let key = self.add_key(admin.id).await;
        self.get("/health", Some(&key)).await
    }

    /// Creates a user with an API key and returns the key.
    pub async fn user_key(&self, name: &str) -> String {
        let user = self
            .state
            .store
            .accounts()
            .create_user(name, UserKind::Key)
            .await
            .expect("create user");
        self.add_key(user.id).await
    }

    /// The user called `name`.
    pub async fn user_named(&self, name: &str) -> mnemo::store::User {
        self.state
            .store
            .accounts()
            .user_by_name(name)
            .await
            .expect("read the user")
            .expect("the user exists")
    }

    /// A new API key of the existing user called `name` (made by an earlier app on the same
    /// home).
    pub async fn key_of(&self, name: &str) -> String {
        let user = self.user_named(name).await;
        self.add_key(user.id).await
    }

    /// Stores each of `facts` as a fact of the user of `key` and waits until they are
    /// recallable.
    pub async fn remember_facts(&self, key: &str, facts: &[&str]) {
        for fact in facts {
            let (status, body) = self
                .post(
                    "/v1/memories",
                    Some(key),
                    Some(serde_json::json!({ "content": fact, "kind": "fact" })),
                )
                .await;
            assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
        }
        self.wait_indexed().await;
    }

    /// `POST /v1/memories/search` as the user of `key`; the answer, which must be 200.
    pub async fn search(&self, key: &str, query: &str, k: usize) -> Value {
        let (status, body) = self
            .post(
                "/v1/memories/search",
                Some(key),
                Some(serde_json::json!({ "query": query, "k": k })),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::OK, "{body}");
        body
    }

    /// A new API key of `user`.
    async fn add_key(&self, user: mnemo::store::UserId) -> String {
        let key = keys::generate();
        self.state
            .store
            .accounts()
            .add_api_key(user, &key.hash, &key.prefix)
            .await
            .expect("add key");
        key.plaintext
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `GET path`: status and parsed body.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        self.call(Method::GET, path, token, None).await
    }

    /// `POST path` with an optional JSON body.
    pub async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(Method::POST, path, token, body).await
    }

    /// `PATCH path` with an optional JSON body.
    pub async fn patch(
        &self,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(Method::PATCH, path, token, body).await
    }

    /// `PUT path` with an optional JSON body.
    pub async fn put(
        &self,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(Method::PUT, path, token, body).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, token, None).await
    }

    /// A request whose method is data (table-driven tests); the others use `get`, `post`, …
    /// Returns status and parsed body (`Value::Null` when the body is empty or not JSON).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn create_thread(&self, token: &str, title: &str) -> Value {
        let (status, body) = self
            .call(
                Method::POST,
                "/v1/threads",
                Some(token),
                Some(serde_json::json!({ "title": title })),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    /// A new thread's id.
    pub async fn new_thread(&self, token: &str) -> String {
        self.create_thread(token, "chat").await["id"]
            .as_str()
            .expect("thread id")
            .to_string()
    }

    /// Posts `body` as a message of `thread` (the caller sets `stream`); the status and the
    /// answer.
    pub async fn post_to_thread(
        &self,
        token: &str,
        thread: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/threads/{thread}/messages"),
            Some(token),
            Some(body),
        )
        .await
    }

    /// Posts `body` as a message of `thread` without streaming (202 asserted) and reads the
    /// turn's events to their end.
    pub async fn turn_in_thread(
        &self,
        token: &str,
        thread: &str,
        mut body: Value,
    ) -> Vec<ReceivedEvent> {
        body["stream"] = Value::Bool(false);
        let (status, run) = self.post_to_thread(token, thread, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{run}");
        let run = run["id"].as_str().expect("run id");
        self.events(token, run, None).await.collect().await
    }

    /// Posts a message without streaming; returns the run.
    pub async fn post_message(&self, token: &str, thread: &str, content: &str) -> Value {
        let (status, body) = self
            .call(
                Method::POST,
                &format!("/v1/threads/{thread}/messages"),
                Some(token),
                Some(serde_json::json!({ "content": content, "stream": false })),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body
    }

    /// Says `content` in `thread`, reads the turn's events to its end and waits until the
    /// memory writer is idle; returns the events.
    pub async fn say(&self, token: &str, thread: &str, content: &str) -> Vec<ReceivedEvent> {
        let run = self.post_message(token, thread, content).await;
        let run = run["id"].as_str().expect("run id");
        let events = self.events(token, run, None).await.collect().await;
        self.wait_for_jobs().await;
        events
    }

    /// Says `content` in a new thread and reads the turn's events to its end; returns the
    /// thread's id and the events.
    pub async fn say_in_new_thread(
        &self,
        token: &str,
        content: &str,
    ) -> (String, Vec<ReceivedEvent>) {
        let thread = self.create_thread(token, "chat").await["id"]
            .as_str()
            .expect("thread id")
            .to_string();
        let run = self.post_message(token, &thread, content).await;
        let run = run["id"].as_str().expect("run id");
        let events = self.events(token, run, None).await.collect().await;
        (thread, events)
    }

    /// Opens the event stream of a run after `last_event_id`.
    pub async fn events(&self, token: &str, run: &str, last_event_id: Option<i64>) -> SseReader {
        let mut request = self
            .client
            .get(self.url(&format!("/v1/runs/{run}/events")))
            .bearer_auth(token);
        if let Some(seq) = last_event_id {
            request = request.header("Last-Event-ID", seq.to_string());
        }
        let response = request.send().await.expect("events request");
        SseReader::new(response)
    }
}

/// One received SSE event.
#[derive(Debug, Clone)]
pub struct ReceivedEvent {
    pub id: i64,
    pub event: String,
    pub data: Value,
}

pub struct SseReader {
    /// The longest silence allowed between events before the test fails.
    pub patience: Duration,
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    stream: std::pin::Pin<
        Box<
            dyn futures::Stream<
                    Item = Result<
                        eventsource_stream::Event,
                        eventsource_stream::EventStreamError<reqwest::Error>,
                    >,
                > + Send,
        >,
    >,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            patience: Duration::from_secs(15),
            status: response.status(),
            headers: response.headers().clone(),
            stream: Box::pin(response.bytes_stream().eventsource()),
        }
    }

    /// Allows `patience` of silence between events (a real model on two cores is slow).
    pub fn patient(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// The next event, or `None` when the stream ends. Fails the test after `patience` (15 s
    /// unless set) of silence.
    pub async fn next(&mut self) -> Option<ReceivedEvent> {
        let item = tokio::time::timeout(self.patience, self.stream.next())
            .await
            .unwrap_or_else(|_| panic!("an SSE event within {:?}", self.patience))?;
        let event = item.ok()?;
        Some(ReceivedEvent {
            id: event.id.parse().expect("numeric event id"),
            event: event.event,
            data: serde_json::from_str(&event.data).expect("JSON event data"),
        })
    }

    /// Every remaining event up to the end of the stream.
    pub async fn collect(mut self) -> Vec<ReceivedEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

impl TestApp {
    /// `stop`, then waits until the memory engine's indexer (which owns the vector shard) has
    /// been dropped. The shard flushes into the data directory when it is dropped, and the
    /// background tasks holding it can outlive `stop`; a test that drops its `Home` right after
    /// `stop` would otherwise delete the directory under that last flush.
    pub async fn stop_and_release(self) {
        let indexer = std::sync::Arc::downgrade(&self.state.memory.indexer());
        self.stop().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while indexer.strong_count() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the memory indexer is still alive 20 s after shutdown"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Documents for local research.
impl TestApp {
    /// `POST /v1/documents` with a JSON body; returns status and body.
    pub async fn ingest_document(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/v1/documents", Some(token), Some(body))
            .await
    }

    /// `POST /v1/documents` with a raw body of `content_type` (none when `None`) and a query
    /// string such as `title=…`; returns status and body.
    pub async fn upload_document(
        &self,
        token: &str,
        content_type: Option<&str>,
        bytes: Vec<u8>,
        query: &str,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .post(self.url(&format!("/v1/documents?{query}")))
            .bearer_auth(token)
            .body(bytes);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.expect("upload request");
        let status = response.status();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `GET /v1/documents`; the documents.
    pub async fn list_documents(&self, token: &str) -> Vec<Value> {
        let (status, body) = self
            .call(Method::GET, "/v1/documents", Some(token), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["documents"].as_array().cloned().unwrap_or_default()
    }

    /// `DELETE /v1/documents/{id}`; the status.
    pub async fn delete_document(&self, token: &str, id: &str) -> StatusCode {
        self.call(
            Method::DELETE,
            &format!("/v1/documents/{id}"),
            Some(token),
            None,
        )
        .await
        .0
    }
}

/// Reads `reader` into `into` until the stream ends (the server dies) or `done`.
pub async fn collect(mut reader: SseReader, into: Arc<std::sync::Mutex<Vec<ReceivedEvent>>>) {
    while let Some(event) = reader.next().await {
        let done = event.event == "done";
        into.lock().expect("events").push(event);
        if done {
            return;
        }
    }
}

/// A client of one run: reads its stream and, whenever the stream ends before `done` (its
/// replica died), reconnects to the replicas (or the proxy) at `bases` in turn with
/// `Last-Event-ID`, starting after the events `seen` already holds.
pub async fn follow_to_done(
    client: reqwest::Client,
    bases: Vec<String>,
    key: String,
    run: String,
    first: Option<reqwest::Response>,
    seen: Arc<std::sync::Mutex<Vec<ReceivedEvent>>>,
) -> Vec<ReceivedEvent> {
    if let Some(response) = first {
        collect(SseReader::new(response), seen.clone()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut turn = 0usize;
    loop {
        let events = seen.lock().expect("events").clone();
        if events.last().is_some_and(|event| event.event == "done") {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} did not end: {events:?}"
        );
        let base = &bases[turn % bases.len()];
        turn += 1;
        let mut request = client
            .get(format!("{base}/v1/runs/{run}/events"))
            .bearer_auth(&key);
        if let Some(last) = events.last() {
            request = request.header("Last-Event-ID", last.id.to_string());
        }
        match request.send().await {
            Ok(response) if response.status() == StatusCode::OK => {
                // A run waiting to be taken over may be silent for a lease and a heartbeat.
                let reader = SseReader::new(response).patient(Duration::from_secs(60));
                collect(reader, seen.clone()).await;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
