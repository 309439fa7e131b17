//! `mnemo mcp`: MCP over stdio for desktop clients (Claude Desktop, Cursor) that spawn a
//! command. It bridges each JSON-RPC line from stdin to the `/mcp` endpoint of the server the
//! usual routing picks (`--server/--key`, the server holding the data directory, or one
//! embedded in this process), as the routed user, and writes every message the server sends
//! back, as one line each, to stdout. stdout carries nothing else; notes go to stderr.

use parking_lot::Mutex;
use std::sync::Arc;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::Failure;
use super::chat::{Client, connect};
use super::connect::Target;
use mnemo::config::Settings;

const MCP_PATH: &str = "/mcp";
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

pub async fn run(settings: Settings, target: &Target) -> Result<(), Failure> {
    let (client, embedded) = connect(settings, target).await?;
    let result = bridge(&client).await;
    if let Some(server) = embedded {
        server.stop().await;
    }
    result
}

/// What the bridge learns from the server: the session and the negotiated protocol version.
#[derive(Default)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

async fn bridge(client: &Client) -> Result<(), Failure> {
    let (out, mut lines_out) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines_out.recv().await {
            let written = async {
                stdout.write_all(line.as_bytes()).await?;
                stdout.write_all(b"\n").await?;
                stdout.flush().await
            };
            if written.await.is_err() {
                return;
            }
        }
    });
    let session = Arc::new(Mutex::new(Session::default()));
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        let line = match input.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(error) => return Err(Failure::other(format!("reading stdin: {error}"))),
        };
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(error) => {
                let _ = out.send(
                    json!({ "jsonrpc": "2.0", "id": null,
                        "error": { "code": -32700, "message": format!("parse error: {error}") } })
                    .to_string(),
                );
                continue;
            }
        };
        let forward = forward(
            client.clone(),
            session.clone(),
            out.clone(),
            message.clone(),
        );
        // The session exists once `initialize` is answered: later messages wait for it.
        if message["method"] == "initialize" {
            forward.await;
        } else {
            in_flight.spawn(forward);
        }
    }
    while in_flight.join_next().await.is_some() {}
    let id = lock(&session).id.clone();
    if let Some(id) = id {
        let _ = client
            .request(reqwest::Method::DELETE, MCP_PATH)
            .header(SESSION_HEADER, id)
            .send()
            .await;
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

fn lock(session: &Mutex<Session>) -> parking_lot::MutexGuard<'_, Session> {
    session.lock()
}

/// Posts one message and relays what comes back (a JSON body or an event stream). A request
/// the server refuses gets a JSON-RPC error naming the HTTP status.
async fn forward(
    client: Client,
    session: Arc<Mutex<Session>>,
    out: mpsc::UnboundedSender<String>,
    message: Value,
) {
    let id = message.get("id").cloned();
    let mut request = client
        .request(reqwest::Method::POST, MCP_PATH)
        .header("accept", "application/json, text/event-stream")
        .json(&message);
    {
        let known = lock(&session);
        if let Some(session) = &known.id {
            request = request.header(SESSION_HEADER, session);
        }
        if let Some(version) = &known.version {
            request = request.header(VERSION_HEADER, version);
        }
    }
    let refused = |text: String| {
        if let Some(id) = &id {
            let _ = out.send(
                json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32000, "message": text } })
                    .to_string(),
            );
        }
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => return refused(format!("the mnemo server cannot be reached: {error}")),
    };
    if let Some(opened) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
    {
        lock(&session).id = Some(opened.to_string());
    }
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return refused(format!("mnemo answered HTTP {status}: {}", body.trim()));
    }
    let streamed = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"));
    let relay = |data: &str| {
        if let Ok(value) = serde_json::from_str::<Value>(data) {
            if message["method"] == "initialize"
                && let Some(version) = value["result"]["protocolVersion"].as_str()
            {
                lock(&session).version = Some(version.to_string());
            }
            let _ = out.send(value.to_string());
        }
    };
    if streamed {
        let mut events = eventsource_stream::EventStream::new(response.bytes_stream());
        while let Some(event) = events.next().await {
            match event {
                Ok(event) if !event.data.trim().is_empty() => relay(&event.data),
                Ok(_) => {}
                Err(error) => return refused(format!("the event stream broke: {error}")),
            }
        }
    } else if let Ok(body) = response.text().await
        && !body.trim().is_empty()
    {
        match serde_json::from_str::<Value>(&body) {
            Ok(Value::Array(batch)) => batch.iter().for_each(|one| relay(&one.to_string())),
            Ok(_) => relay(&body),
            Err(_) => refused(format!("mnemo answered something that is not JSON: {body}")),
        }
    }
}
