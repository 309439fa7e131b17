//! Hardening against a hostile client: slow bodies cannot hold every connection, a NUL in a
//! URL is a clear 400, `--dev` answers loopback pages only, and the per-user run cap holds
//! under simultaneous starts.

use crate::support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, TestApp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The status of the response on `stream`, if one arrives within `wait`.
async fn status_within(stream: &mut TcpStream, wait: Duration) -> Option<u16> {
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(wait, stream.read(&mut buffer))
        .await
        .ok()?
        .ok()?;
    let head = String::from_utf8_lossy(&buffer[..read]).to_string();
    head.split_whitespace().nth(1)?.parse().ok()
}

/// 1,030 authenticated POSTs trickling their bodies held every connection slot, and other
/// users timed out for as long as they trickled. A user may now have only so many requests
/// arriving at once (the rest are refused before their body is read, and their connection
/// closes), and a body must arrive within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_of_one_user_do_not_lock_out_the_others() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__SERVER__MAX_CONNECTIONS", "8"),
            ("MNEMO__SERVER__MAX_REQUESTS_PER_USER", "3"),
            ("MNEMO__SERVER__BODY_READ_TIMEOUT_SECS", "3"),
            ("MNEMO__SERVER__HEADER_READ_TIMEOUT_SECS", "1"),
        ],
    )
    .await;
    let mallory = app.user_key("mallory").await;
    let alice = app.user_key("alice").await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/memories HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {mallory}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        slow.push(stream);
    }
    let mut held = Vec::new();
    for mut stream in slow {
        if status_within(&mut stream, Duration::from_millis(500)).await != Some(429) {
            held.push(stream);
        }
    }
    assert_eq!(
        held.len(),
        3,
        "all but 3 of mallory's slow requests are refused at once"
    );
    // Alice gets a connection and an answer while mallory still trickles.
    let answered =
        tokio::time::timeout(Duration::from_secs(4), app.get("/v1/threads", Some(&alice)))
            .await
            .expect("alice is answered while mallory trickles");
    assert_eq!(answered.0, StatusCode::OK);
    // The bodies still trickling are cut off at their deadline.
    let mut cut = 0;
    for stream in &mut held {
        if let Some(status) = status_within(stream, Duration::from_secs(5)).await {
            assert_eq!(status, 400);
            cut += 1;
        }
    }
    assert_eq!(cut, 3);
    app.stop().await;
}

/// `GET /v1/jobs/%00` and `/v1/memories/import/%00` answered 500 on PostgreSQL.
#[tokio::test]
async fn a_nul_in_a_url_is_a_clear_400() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let home = Home::new(backend).await;
        let app = TestApp::spawn(&home).await;
        let key = app.user_key("alice").await;
        for path in [
            "/v1/jobs/%00",
            "/v1/memories/import/%00",
            "/v1/threads/%00",
            "/v1/memories?kinds=%00",
        ] {
            let (status, body) = app.get(path, Some(&key)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains("NUL"),
                "{body}"
            );
        }
        app.stop().await;
    }
}

/// Any web page could write the local user's memories in `--dev` (a cross-site form post),
/// and a DNS-rebinding page could read them (no `Host` check).
#[tokio::test]
async fn dev_mode_answers_loopback_pages_only() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &[("MNEMO__SERVER__DEV", "true")]).await;
    let port = app.base.rsplit(':').next().unwrap().to_string();
    let memory = json!({ "content": "My bike is a green Brompton.", "kind": "fact" });
    let send =
        |request: reqwest::RequestBuilder| async move { request.send().await.unwrap().status() };
    // A rebinding page reaches the server under its own name.
    let rebound = app
        .client
        .get(app.url("/v1/memories/export"))
        .header("host", format!("evil.example:{port}"));
    assert_eq!(send(rebound).await, StatusCode::FORBIDDEN);
    // A cross-site form post.
    let form = app
        .client
        .post(app.url("/v1/memories"))
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .body(memory.to_string());
    assert_eq!(send(form).await, StatusCode::FORBIDDEN);
    let no_origin = app
        .client
        .post(app.url("/v1/memories"))
        .header("content-type", "text/plain")
        .body(memory.to_string());
    assert_eq!(send(no_origin).await, StatusCode::FORBIDDEN);
    let (status, listed) = app.get("/v1/memories", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["memories"], json!([]), "nothing was written");
    // The app's own page, and a local client sending JSON, are served.
    let own = app
        .client
        .post(app.url("/v1/memories"))
        .header("origin", format!("http://127.0.0.1:{port}"))
        .json(&memory);
    assert_eq!(send(own).await, StatusCode::CREATED);
    let local = app
        .client
        .get(app.url("/v1/memories/export"))
        .header("host", format!("localhost:{port}"));
    assert_eq!(send(local).await, StatusCode::OK);
    app.stop().await;
}

/// 40 simultaneous chat turns ran 20 with a cap of 8, and 20 simultaneous researches all ran:
/// the cap was checked, then acted on. It is now taken in the transaction that stores the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_cap_holds_for_simultaneous_starts() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let home = Home::new(backend).await;
        let llm = FakeLlm::start().await;
        // Every model call hangs: runs stay running.
        llm.set_default(Reply::Hang);
        let app = TestApp::spawn_with_llm(
            &home,
            &llm,
            &[
                ("MNEMO__SERVER__MAX_RUNS_PER_USER", "4"),
                ("MNEMO__MEMORY__WRITER_WORKERS", "0"),
            ],
        )
        .await;
        let key = app.user_key("alice").await;
        let thread = app.create_thread(&key, "many").await["id"]
            .as_str()
            .unwrap()
            .to_string();
        let mut starts = Vec::new();
        for index in 0..24 {
            let client = app.client.clone();
            let key = key.clone();
            let request = if index % 2 == 0 {
                client
                    .post(app.url(&format!("/v1/threads/{thread}/messages")))
                    .json(&json!({ "content": format!("question number {index}") }))
            } else {
                client
                    .post(app.url("/research/stream"))
                    .json(&json!({ "query": format!("topic number {index}") }))
            };
            starts.push(tokio::spawn(async move {
                request.bearer_auth(key).send().await.unwrap().status()
            }));
        }
        let mut started = 0;
        for start in starts {
            let status = start.await.unwrap();
            if status.is_success() {
                started += 1;
            } else {
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            }
        }
        assert_eq!(started, 4, "{backend:?}");
        app.stop().await;
    }
}
