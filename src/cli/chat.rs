//! `mnemo chat`: an interactive terminal client. It goes where `connect::route` says (a
//! server, the server holding the data directory, or a server embedded in this process on
//! loopback, as `--user`), streams each answer as it is written, and shows tool calls as they
//! happen. A line `/quit` (or end of input) leaves; `/new` starts a new thread.

use std::io::{BufRead, Write};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Failure;
use super::connect::{Route, Target, route};
use mnemo::config::Settings;

#[derive(Clone)]
pub(super) struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub(super) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    async fn new_thread(&self) -> Result<String, Failure> {
        let response = self
            .request(reqwest::Method::POST, "/v1/threads")
            .json(&json!({ "title": "terminal chat" }))
            .send()
            .await
            .map_err(|e| Failure::other(format!("cannot reach {}: {e}", self.base)))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(Failure::usage(format!(
                "{status}: {}",
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("request failed")
            )));
        }
        body["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Failure::other("the server returned no thread id"))
    }

    /// Posts one message and prints the streamed answer.
    async fn say(&self, thread: &str, content: &str, out: &mut impl Write) -> Result<(), Failure> {
        let response = self
            .request(
                reqwest::Method::POST,
                &format!("/v1/threads/{thread}/messages"),
            )
            .json(&json!({ "content": content }))
            .send()
            .await
            .map_err(|e| Failure::other(format!("cannot reach {}: {e}", self.base)))?;
        if !response.status().is_success() {
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            return Err(Failure::usage(format!(
                "{status}: {}",
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("request failed")
            )));
        }
        let mut events = response.bytes_stream().eventsource();
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| Failure::other(format!("stream broke: {e}")))?;
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            let _ = match event.event.as_str() {
                "message_delta" => write!(out, "{}", data["content"].as_str().unwrap_or("")),
                "tool_call" => writeln!(
                    out,
                    "\n  [{} {}]",
                    data["name"].as_str().unwrap_or("tool"),
                    data["arguments"]
                ),
                "memory_recalled" => {
                    let count = data["memories"].as_array().map(Vec::len).unwrap_or(0);
                    if count > 0 {
                        writeln!(out, "  [recalled {count} memories]")
                    } else {
                        Ok(())
                    }
                }
                "error" => writeln!(
                    out,
                    "\n  [error ({}): {}]",
                    data["error_type"].as_str().unwrap_or("?"),
                    data["message"].as_str().unwrap_or("")
                ),
                "done" => {
                    let _ = writeln!(out);
                    break;
                }
                _ => Ok(()),
            };
            let _ = out.flush();
        }
        Ok(())
    }
}

pub async fn run(
    settings: Settings,
    target: &Target,
    thread: Option<String>,
) -> Result<(), Failure> {
    let (client, embedded) = connect(settings, target).await?;
    let mut thread = match thread {
        Some(thread) => thread,
        None => client.new_thread().await?,
    };
    eprintln!("thread {thread}; type a message, /new for a new thread, /quit to leave");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = std::io::stdout();
    loop {
        let _ = write!(out, "> ");
        let _ = out.flush();
        let Some(line) = lines.recv().await else {
            break;
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/new" => {
                thread = client.new_thread().await?;
                eprintln!("thread {thread}");
            }
            message => {
                if let Err(failure) = client.say(&thread, message, &mut out).await {
                    eprintln!("error: {}", failure.message);
                }
            }
        }
    }
    if let Some(server) = embedded {
        server.stop().await;
    }
    Ok(())
}

/// A server this command started on the data directory; `stop` shuts it down in order and
/// waits for it (runs end, the vector index flushes, the pool closes).
pub(super) struct EmbeddedServer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl EmbeddedServer {
    pub(super) async fn stop(self) {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::error!(%error, "the embedded server did not stop cleanly");
        }
    }
}

/// A client of the server `route` picks, or of a server embedded in this process on the data
/// directory (returned beside the client so it can be stopped), acting as the route's user.
pub(super) async fn connect(
    settings: Settings,
    target: &Target,
) -> Result<(Client, Option<EmbeddedServer>), Failure> {
    Ok(match route(&settings, target)? {
        Route::Remote { base, bearer } => (
            Client {
                base,
                key: Some(bearer),
                http: http_client()?,
            },
            None,
        ),
        Route::Embedded { user } => {
            let mut settings = settings;
            settings.server.addr = "127.0.0.1:0".into();
            settings.server.dev = false;
            let listener = mnemo::startup::bind(&settings).await?;
            let addr = listener
                .local_addr()
                .map_err(|e| Failure::other(e.to_string()))?;
            let stop = CancellationToken::new();
            let state = mnemo::startup::build_state(settings, stop.clone()).await?;
            let bearer = mnemo::auth::local_credential(state.auth.local_secret(), &user);
            // Other commands on this data directory meanwhile talk to this server.
            if let Err(error) = state.publish_address(addr) {
                tracing::warn!(%error, "cannot record the address in the data directory");
            }
            let task = tokio::spawn(async move {
                if let Err(error) = mnemo::http::serve(listener, state).await {
                    tracing::error!(%error, "embedded server failed");
                }
            });
            eprintln!("(embedded server on {addr}, as {user})");
            (
                Client {
                    base: format!("http://{addr}"),
                    key: Some(bearer),
                    http: http_client()?,
                },
                Some(EmbeddedServer { stop, task }),
            )
        }
    })
}

fn http_client() -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Failure::other(e.to_string()))
}
