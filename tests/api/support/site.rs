//! Local servers for fetcher tests: a `TestSite` (axum on 127.0.0.1:0) with pages, redirects,
//! errors, a gzip bomb and a body that trickles one byte per second; a `Canary` listener that
//! counts every connection it accepts; and a raw server that trickles its response headers.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use flate2::Compression;
use flate2::write::GzEncoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const PAGE_HTML: &str = "<!doctype html><html><head><title>Canary-free page</title>\
    <script>steal()</script></head><body><nav>menu</nav><article><h1>Safe fetching</h1>\
    <p>Every   hop is checked.</p></article></body></html>";

/// Size of the gzip bomb once inflated.
pub const BOMB_INFLATED: usize = 50 * 1024 * 1024;

/// A local web site the fetcher is allowed to reach (its address goes into `policy.allow`).
pub struct TestSite {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct SiteState {
    hits: Arc<AtomicUsize>,
    bomb: Arc<Vec<u8>>,
}

impl TestSite {
    pub async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let state = SiteState {
            hits: hits.clone(),
            bomb: Arc::new(gzip_zeros(BOMB_INFLATED)),
        };
        let app = Router::new()
            .route("/page", get(page))
            .route("/redirect", get(redirect))
            .route("/chain/{n}", get(chain))
            .route("/missing", get(missing))
            .route("/image", get(image))
            .route("/bomb", get(bomb))
            .route("/trickle", get(trickle))
            .layer(axum::middleware::from_fn_with_state(state.clone(), count))
            .with_state(state);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind site");
        let addr = listener.local_addr().expect("site addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, hits }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A URL of the site that answers `status` with `Location: location`.
    pub fn redirect(&self, status: u16, location: &str) -> String {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("status", &status.to_string())
            .append_pair("to", location)
            .finish();
        self.url(&format!("/redirect?{query}"))
    }

    /// Requests the site has answered.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn count(
    State(state): State<SiteState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    state.hits.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

async fn page() -> Response {
    html(PAGE_HTML)
}

fn html(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

async fn redirect(Query(query): Query<HashMap<String, String>>) -> Response {
    let status = query
        .get("status")
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::FOUND);
    let location = query.get("to").cloned().unwrap_or_default();
    let Ok(location) = HeaderValue::from_str(&location) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    (status, [(header::LOCATION, location)]).into_response()
}

/// `/chain/n` redirects (relatively) to `/chain/n-1`; `/chain/0` is a page.
async fn chain(Path(n): Path<usize>) -> Response {
    if n == 0 {
        return html("<title>End of the chain</title><p>arrived</p>");
    }
    let location = HeaderValue::from_str(&(n - 1).to_string()).expect("header");
    (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
}

async fn missing() -> Response {
    (StatusCode::NOT_FOUND, html("<title>Not found</title>")).into_response()
}

async fn image() -> Response {
    (
        [(header::CONTENT_TYPE, "image/png")],
        b"\x89PNG\r\n\x1a\n not really".as_slice(),
    )
        .into_response()
}

async fn bomb(State(state): State<SiteState>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html"),
            (header::CONTENT_ENCODING, "gzip"),
        ],
        Bytes::from(state.bomb.as_ref().clone()),
    )
        .into_response()
}

/// A plain-text body that arrives one byte per second, forever.
async fn trickle() -> Response {
    let body = futures::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((Ok::<_, Infallible>(Bytes::from_static(b"a")), ()))
    });
    (
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(body),
    )
        .into_response()
}

/// `len` zero bytes, gzip-compressed without ever holding them all in memory.
pub fn gzip_zeros(len: usize) -> Vec<u8> {
    let zeros = vec![0u8; 64 * 1024];
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len());
        encoder.write_all(&zeros[..n]).expect("compress");
        left -= n;
    }
    encoder.finish().expect("finish gzip")
}

/// A listener that must never be reached: it counts the connections it accepts. It listens on
/// 127.0.0.1 and, when the machine has IPv6 loopback, on [::1] with the same port.
pub struct Canary {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Canary {
    pub async fn start() -> Self {
        let accepted = Arc::new(AtomicUsize::new(0));
        let v4 = TcpListener::bind("127.0.0.1:0").await.expect("bind canary");
        let port = v4.local_addr().expect("canary addr").port();
        let mut listeners = vec![v4];
        if let Ok(v6) = TcpListener::bind(("::1", port)).await {
            listeners.push(v6);
        }
        for listener in listeners {
            let accepted = accepted.clone();
            tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    drop(socket);
                }
            });
        }
        Self { port, accepted }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A raw HTTP server that sends its status line and headers one byte per second, forever.
pub async fn trickling_headers_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind trickle");
    let addr = listener.local_addr().expect("trickle addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // Read the request head first: a response sent before the request is an error.
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: ";
                for byte in head.iter().chain(std::iter::repeat(&b'a')) {
                    if socket.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
    });
    addr
}
