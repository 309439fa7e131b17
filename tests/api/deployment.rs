//! The deployment of `deploy/` run for real, natively on loopback: PostgreSQL, a three-peer
//! Qdrant cluster, two mnemo replicas with the environment `deploy/compose.yaml` gives them
//! (only the addresses are this machine's), and Debian's nginx running `deploy/nginx.conf`
//! itself (linked, not copied; its two per-installation includes name this test's ports). A
//! chat turn streamed through nginx survives the replica it started on being SIGKILLed: the
//! client resumes through nginx with `Last-Event-ID`, another replica takes the turn over, and
//! the client gets every event once, in order, and one answer.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::binary::{
    Server, add_user_with, assistant_messages, call, read_log, start_server_with,
};
use support::fake_llm::{FakeLlm, Reply, last_user_text};
use support::qdrant_cluster::QdrantCluster;
use support::{ReceivedEvent, SseReader, collect, follow_to_done};
use tokio::process::{Child, Command};

const ANSWER: &str = "High tide at the harbour is at 14:20 today.";

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

/// The settings compose.yaml gives every replica (its `x-mnemo` environment), with the
/// addresses that name compose's services replaced by this machine's: each of those must be in
/// the file (a renamed setting fails here rather than being silently left out).
fn replica_env(database_url: &str, qdrant_urls: &[String]) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy_file("compose.yaml")).expect("deploy/compose.yaml");
    let compose: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("compose YAML");
    let environment = compose["x-mnemo"]["environment"]
        .as_mapping()
        .expect("x-mnemo.environment in compose.yaml");
    let mut env: BTreeMap<String, String> = environment
        .iter()
        .map(|(key, value)| {
            let key = key.as_str().expect("setting name").to_string();
            let value = match value {
                serde_yaml_ng::Value::String(text) => text.clone(),
                other => serde_yaml_ng::to_string(other)
                    .expect("setting value")
                    .trim()
                    .to_string(),
            };
            (key, value)
        })
        .collect();
    let here = [
        ("MNEMO__DATABASE__URL", Some(database_url.to_string())),
        ("MNEMO__QDRANT__URL", Some(qdrant_urls.join(","))),
        // The test's peers have no API key; the replicas' own data directories and ports are
        // given on their command lines.
        ("MNEMO__QDRANT__API_KEY", None),
        ("MNEMO__DATA_DIR", None),
        ("MNEMO__SERVER__ADDR", None),
    ];
    for (name, value) in here {
        assert!(
            env.remove(name).is_some(),
            "compose.yaml no longer sets {name}"
        );
        if let Some(value) = value {
            env.insert(name.to_string(), value);
        }
    }
    env.into_iter().collect()
}

/// Debian's nginx, when installed (`scripts/ensure-nginx`).
fn nginx_binary() -> Option<PathBuf> {
    [
        std::env::var("MNEMO_NGINX_BIN").ok().map(PathBuf::from),
        Some(PathBuf::from("/usr/sbin/nginx")),
    ]
    .into_iter()
    .flatten()
    .find(|path| path.is_file())
}

/// nginx running `deploy/nginx.conf` in front of `replicas`, listening on a free loopback port.
struct Proxy {
    child: Child,
    base: String,
    dir: PathBuf,
}

impl Proxy {
    async fn start(binary: &Path, dir: &Path, replicas: &[&Server]) -> Self {
        let dir = dir.join("nginx");
        std::fs::create_dir_all(&dir).expect("nginx dir");
        // nginx reads its includes beside the configuration file it was given: the shipped one,
        // linked, with this installation's two files next to the link.
        std::os::unix::fs::symlink(deploy_file("nginx.conf"), dir.join("nginx.conf"))
            .expect("link deploy/nginx.conf");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        std::fs::write(
            dir.join("mnemo-listen.conf"),
            format!("listen 127.0.0.1:{port};\n"),
        )
        .expect("mnemo-listen.conf");
        let servers: String = replicas
            .iter()
            .map(|replica| {
                let address = replica.base.trim_start_matches("http://");
                format!("server {address} max_fails=3 fail_timeout=10s;\n")
            })
            .collect();
        std::fs::write(dir.join("mnemo-replicas.conf"), servers).expect("mnemo-replicas.conf");
        let log = std::fs::File::create(dir.join("nginx.log")).expect("nginx log");
        let child = Command::new(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg("stderr")
            .arg("-g")
            .arg(format!(
                "daemon off; pid {};",
                dir.join("nginx.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn nginx");
        let mut proxy = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        };
        proxy.wait_ready().await;
        proxy
    }

    fn log(&self) -> String {
        read_log(&self.dir.join("nginx.log"))
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if reqwest::get(format!("{}/health", self.base))
                .await
                .is_ok_and(|response| response.status() == StatusCode::OK)
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nginx exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not answer /health within 20 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A model that holds the turn's first attempt until `released`, then answers.
async fn model(released: Arc<AtomicBool>) -> FakeLlm {
    let llm = FakeLlm::start().await;
    llm.set_handler(move |request: &Value| {
        if !last_user_text(request).contains("deploy-chat") {
            return None;
        }
        Some(if released.load(Ordering::SeqCst) {
            Reply::text(ANSWER)
        } else {
            Reply::Hang
        })
    });
    llm.set_default(Reply::text("{}"));
    llm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chat_through_nginx_outlives_the_replica_it_started_on() {
    let Some(nginx) = nginx_binary() else {
        println!("skipped: nginx is not installed (scripts/ensure-nginx)");
        return;
    };
    let Some(binary) = support::qdrant_cluster::binary() else {
        println!("skipped: no Qdrant server binary (../shared/bin/qdrant or MNEMO_QDRANT_BIN)");
        return;
    };
    let database_url = support::databases::fresh_postgres_url().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = QdrantCluster::start(&binary, 3, &dir.path().join("qdrant")).await;
    let released = Arc::new(AtomicBool::new(false));
    // One model endpoint per replica, the same answers: the one asked tells which replica
    // executes the turn.
    let models = [model(released.clone()).await, model(released.clone()).await];
    let shared = replica_env(&database_url, &cluster.grpc_urls());
    let env_of = |llm: &FakeLlm| {
        let mut env = shared.clone();
        env.extend(llm.env());
        env
    };
    let envs = [env_of(&models[0]), env_of(&models[1])];
    let env_refs: Vec<Vec<(&str, &str)>> = envs
        .iter()
        .map(|env| {
            env.iter()
                .map(|(key, value)| (key.as_str(), value.as_str()))
                .collect()
        })
        .collect();
    let key = add_user_with(&dir.path().join("a"), "dana", &env_refs[0]).await;
    let logs = [dir.path().join("a.log"), dir.path().join("b.log")];
    let mut replicas = [
        start_server_with(&dir.path().join("a"), &logs[0], &env_refs[0]).await,
        start_server_with(&dir.path().join("b"), &logs[1], &env_refs[1]).await,
    ];
    let proxy = Proxy::start(&nginx, dir.path(), &[&replicas[0], &replicas[1]]).await;
    let base = proxy.base.clone();
    let client = reqwest::Client::new();

    // The proxy as shipped: metrics are not served through it, health is.
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), StatusCode::NOT_FOUND);

    let (status, thread) = call(
        &client,
        &base,
        &key,
        "POST",
        "/v1/threads",
        json!({ "title": "tides" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    let thread = thread["id"].as_str().expect("thread id").to_string();
    let response = client
        .post(format!("{base}/v1/threads/{thread}/messages"))
        .bearer_auth(&key)
        .json(&json!({ "content": "deploy-chat: when is high tide today?" }))
        .send()
        .await
        .expect("post the message");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok()),
        Some("text/event-stream")
    );
    let mut reader = SseReader::new(response);
    // Events arrive while the model still holds the turn: nginx does not buffer the stream.
    let first = reader.next().await.expect("the turn's first event");
    let run = first.data["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("run id in {first:?}"))
        .to_string();
    let seen = Arc::new(std::sync::Mutex::new(vec![first]));
    let deadline = Instant::now() + Duration::from_secs(30);
    let executing = loop {
        if let Some(n) = models.iter().position(|llm| !llm.requests().is_empty()) {
            break n;
        }
        assert!(Instant::now() < deadline, "no replica asked its model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    replicas[executing].kill().await;
    released.store(true, Ordering::SeqCst);
    // The stream through nginx ends with the replica; what it carried until then is kept.
    collect(reader, seen.clone()).await;
    assert!(
        seen.lock()
            .expect("events")
            .last()
            .is_none_or(|event| event.event != "done"),
        "the turn ended before its replica was killed"
    );

    // Resumed through nginx from the last event seen, until the turn is done on the other
    // replica (it takes the turn over once the dead one's lease has run out).
    let events = follow_to_done(
        client.clone(),
        vec![base.clone()],
        key.clone(),
        run,
        None,
        seen,
    )
    .await;
    let seqs: Vec<i64> = events.iter().map(|event| event.id).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert_eq!(events.last().expect("done").data["status"], "completed");
    let resumed: Vec<&ReceivedEvent> = events
        .iter()
        .filter(|event| event.event == "run_resumed")
        .collect();
    assert_eq!(resumed.len(), 1, "taken over once: {events:?}");
    let completed: Vec<&ReceivedEvent> = events
        .iter()
        .filter(|event| event.event == "message_complete")
        .collect();
    assert_eq!(completed.len(), 1, "{events:?}");
    assert_eq!(completed[0].data["content"], ANSWER);
    assert!(
        !models[1 - executing].requests().is_empty(),
        "the other replica answered the turn"
    );
    let answers = assistant_messages(&client, &base, &key, &thread).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["content"], ANSWER);
}
