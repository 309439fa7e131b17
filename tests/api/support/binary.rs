//! The `mnemo` binary as a child process: `mnemo serve` on a free port (killed with SIGKILL or
//! stopped with SIGTERM by the tests), `mnemo user add`, and a JSON call helper.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The binary with a clean `MNEMO__*` environment, `env` applied (warnings on stderr unless
/// `env` sets the log level).
pub fn mnemo(data_dir: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mnemo"));
    for (key, _) in std::env::vars() {
        if key.starts_with("MNEMO__") {
            command.env_remove(key);
        }
    }
    command
        .arg("--data-dir")
        .arg(data_dir)
        .env("MNEMO__LOG__LEVEL", "warn")
        .env("MNEMO__EMBEDDER__MODEL_DIR", super::model_dir())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// `mnemo user add <name>`; the new user's key.
pub async fn add_user(data_dir: &Path, name: &str) -> String {
    add_user_with(data_dir, name, &[]).await
}

/// `add_user` with settings in the environment (the database of the servers, say).
pub async fn add_user_with(data_dir: &Path, name: &str, env: &[(&str, &str)]) -> String {
    let output = mnemo(data_dir, env)
        .args(["user", "add", name])
        .stderr(Stdio::null())
        .output()
        .await
        .expect("run mnemo user add");
    assert!(output.status.success(), "user add {name}: {output:?}");
    String::from_utf8(output.stdout)
        .expect("utf-8 key")
        .trim()
        .to_string()
}

/// A running `mnemo serve`.
pub struct Server {
    pub child: Child,
    pub base: String,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Server {
    /// SIGKILL: no shutdown at all.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL");
    }
}

/// `mnemo serve` on 127.0.0.1, a free port, with `env`; its stderr goes to `log`.
pub async fn start_server_with(data_dir: &Path, log: &Path, env: &[(&str, &str)]) -> Server {
    let log_file = std::fs::File::create(log).expect("server log file");
    let mut child = mnemo(data_dir, env)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("spawn mnemo serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "mnemo serve did not start within 60 s; log:\n{}",
                read_log(log)
            )
        })
        .expect("read stdout");
    let Some(first) = first else {
        let status = child.wait().await.expect("wait");
        let kept = keep_evidence(data_dir, log.parent().expect("log dir"));
        panic!(
            "mnemo serve exited before listening ({status}); data dir and logs kept in {}; \
             log:\n{}",
            kept.display(),
            read_log(log)
        );
    };
    let base = first
        .strip_prefix("mnemo listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    Server {
        child,
        base,
        _stdout: lines,
    }
}

/// Copies the data dir and the logs to a directory that outlives the test; returns it.
pub fn keep_evidence(data_dir: &Path, logs: &Path) -> PathBuf {
    let kept = tempfile::Builder::new()
        .prefix("mnemo-crash-")
        .tempdir()
        .expect("evidence dir")
        .keep();
    copy_dir(data_dir, &kept.join("data"));
    copy_dir(logs, &kept.join("logs"));
    kept
}

pub fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// SIGTERM, and the server exits 0 within 20 s.
pub async fn terminate(mut server: Server, log: &Path) {
    let pid = server.child.id().expect("pid").to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill -TERM");
    assert!(sent.success());
    let exit = tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .unwrap_or_else(|_| panic!("serve did not stop on SIGTERM; log:\n{}", read_log(log)))
        .expect("wait");
    assert!(
        exit.success(),
        "serve exits 0 on SIGTERM: {exit}; log:\n{}",
        read_log(log)
    );
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// A JSON request with the user's key; the status and the body (`null` when not JSON).
pub async fn call(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = client
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if !body.is_null() {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A GET with the user's key that must answer 200; its JSON body.
pub async fn get_json(client: &reqwest::Client, base: &str, key: &str, path: &str) -> Value {
    let (status, body) = call(client, base, key, "GET", path, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
    body
}

/// The assistant messages of `thread`, read through `base`.
pub async fn assistant_messages(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    thread: &str,
) -> Vec<Value> {
    let messages = get_json(client, base, key, &format!("/v1/threads/{thread}")).await;
    messages["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|message| message["role"] == "assistant")
        .cloned()
        .collect()
}
