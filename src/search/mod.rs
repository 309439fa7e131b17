//! Finding and reading sources. Search providers behind one trait (DESIGN.md §3), one file
//! each: Tavily, Brave, SearXNG, DuckDuckGo's HTML page, and `local` — the user's own ingested
//! documents, searched with the same hybrid recall as memories. Beside them the SSRF-safe page
//! fetcher (`fetch`), which reads pages through `text::extract` as document ingestion does. Every web provider has a configurable base URL (tests point it at a local fake
//! that speaks the real wire format) and a client with a deadline. API keys travel only in
//! request headers and never appear in errors or logs.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use scraper::{Html, Selector};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::config::{SearchApi, SearchSettings};
use crate::error::{ErrorKind, HasKind};
use crate::retry::{Attempt, RetryPolicy};
use crate::store::UserId;
use strum::VariantArray;

mod brave;
mod duckduckgo;
pub mod fetch;
mod local;
mod multi;
mod searxng;
mod tavily;

pub(crate) use brave::Brave;
pub(crate) use duckduckgo::DuckDuckGo;
#[cfg(test)]
use duckduckgo::unwrap_duckduckgo_link;
pub(crate) use local::{Corpus, Local};
pub(crate) use multi::Multi;
pub(crate) use searxng::SearXng;
pub(crate) use tavily::Tavily;

/// Every provider by name, built once: a web provider holds its HTTP client (connection
/// pool); one that is not configured holds the reason.
pub(crate) type Providers =
    std::collections::HashMap<&'static str, Result<Arc<dyn SearchProvider>, String>>;

/// Builds every provider the settings can make (`local` searches `corpus`).
pub(crate) fn build_all(settings: &SearchSettings, corpus: Arc<dyn Corpus>) -> Providers {
    provider_names()
        .into_iter()
        .map(|name| {
            let built = provider(name, settings, corpus.clone()).map_err(|error| error.to_string());
            (name, built)
        })
        .collect()
}

/// The provider names `provider` resolves, in the order of [`SearchApi`].
pub(crate) fn provider_names() -> Vec<&'static str> {
    SearchApi::VARIANTS.iter().map(|api| api.as_str()).collect()
}

/// One search result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SearchHit {
    pub title: String,
    pub url: String,
    pub snippet: String,
    /// The full text when the provider returns it (Tavily's raw content, local chunks).
    pub content: Option<String>,
    pub score: Option<f64>,
    /// Which provider found it (set when a research searches several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The provider is not usable as configured (missing key or URL, unknown name), or the
    /// request itself is unusable (an empty query).
    #[error("search configuration: {0}")]
    Config(String),
    /// The provider answered with an error status.
    #[error("search provider answered {status}: {message}")]
    Http { status: u16, message: String },
    /// The provider could not be reached, or did not answer in time.
    #[error("search request failed: {0}")]
    Network(String),
    /// The provider's answer was not in the expected shape.
    #[error("unexpected search response: {0}")]
    Parse(String),
}

impl SearchError {
    /// Whether trying again later may succeed (rate limits, server errors, network trouble).
    pub(crate) fn retryable(&self) -> bool {
        match self {
            SearchError::Http { status, .. } => {
                matches!(status, 202 | 408 | 425 | 429) || *status >= 500
            }
            SearchError::Network(_) => true,
            SearchError::Config(_) | SearchError::Parse(_) => false,
        }
    }
}

impl HasKind for SearchError {
    fn kind(&self) -> ErrorKind {
        match self {
            SearchError::Config(_) => ErrorKind::BadRequest,
            SearchError::Http { status: 429, .. } => ErrorKind::RateLimited,
            SearchError::Http { .. } | SearchError::Network(_) => ErrorKind::Unavailable,
            SearchError::Parse(_) => ErrorKind::Internal,
        }
    }
}

#[async_trait]
pub trait SearchProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// The base URL a web provider asks (`None` for `local`): what `/health` probes.
    fn endpoint(&self) -> Option<&str> {
        None
    }
    /// At most `max_results` hits for `query`, best first. `user` matters to `local` only.
    async fn search(
        &self,
        user: UserId,
        query: &str,
        max_results: usize,
    ) -> Result<Vec<SearchHit>, SearchError>;
}

/// Builds the named provider from settings. Unknown names, and web providers without their
/// key or URL, are `Config` errors.
pub fn provider(
    name: &str,
    settings: &SearchSettings,
    corpus: Arc<dyn Corpus>,
) -> Result<Arc<dyn SearchProvider>, SearchError> {
    match name.parse::<SearchApi>() {
        Ok(SearchApi::Local) => Ok(Arc::new(Local::new(corpus))),
        _ => web_provider(name, settings),
    }
}

/// `provider` for every name but `local`: the web providers, which need no corpus.
pub(crate) fn web_provider(
    name: &str,
    settings: &SearchSettings,
) -> Result<Arc<dyn SearchProvider>, SearchError> {
    let timeout = Duration::from_secs(settings.timeout_secs.max(1));
    let retry = RetryPolicy::new(
        settings.max_retries,
        Duration::from_millis(settings.retry_backoff_ms),
    );
    let Ok(api) = name.parse::<SearchApi>() else {
        return Err(SearchError::Config(format!(
            "unknown search provider {name:?}; expected one of {}",
            provider_names().join(", ")
        )));
    };
    match api {
        SearchApi::Tavily => {
            let key = settings.tavily_api_key.clone().ok_or_else(|| {
                SearchError::Config(
                    "tavily needs research.search.tavily_api_key (MNEMO__RESEARCH__SEARCH__TAVILY_API_KEY)"
                        .into(),
                )
            })?;
            Ok(Arc::new(
                Tavily::new(
                    &settings.tavily_base_url,
                    key,
                    settings.tavily_search_depth.into(),
                    timeout,
                )?
                .with_retry(retry),
            ))
        }
        SearchApi::Brave => {
            let key = settings.brave_api_key.clone().ok_or_else(|| {
                SearchError::Config(
                    "brave needs research.search.brave_api_key (MNEMO__RESEARCH__SEARCH__BRAVE_API_KEY)"
                        .into(),
                )
            })?;
            Ok(Arc::new(
                Brave::new(&settings.brave_base_url, key, timeout)?.with_retry(retry),
            ))
        }
        SearchApi::Searxng => {
            let url = settings
                .searxng_url
                .as_deref()
                .filter(|url| !url.trim().is_empty())
                .ok_or_else(|| {
                    SearchError::Config(
                        "searxng needs research.search.searxng_url (MNEMO__RESEARCH__SEARCH__SEARXNG_URL)"
                            .into(),
                    )
                })?;
            Ok(Arc::new(SearXng::new(url, timeout)?.with_retry(retry)))
        }
        SearchApi::Duckduckgo => Ok(Arc::new(
            DuckDuckGo::new(&settings.duckduckgo_base_url, timeout)?.with_retry(retry),
        )),
        SearchApi::Local => Err(SearchError::Config(
            "the local provider searches the memory engine; build it with provider()".into(),
        )),
    }
}

// --- shared HTTP plumbing ------------------------------------------------------------------

/// Longest provider error text kept in an error message.
const MAX_ERROR_CHARS: usize = 300;

fn client(timeout: Duration) -> Result<reqwest::Client, SearchError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("mnemo/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| SearchError::Config(format!("cannot build an HTTP client: {error}")))
}

fn base_url(text: &str, what: &str) -> Result<String, SearchError> {
    let trimmed = text.trim().trim_end_matches('/');
    match url::Url::parse(trimmed) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(trimmed.to_string()),
        _ => Err(SearchError::Config(format!(
            "{what} base URL {trimmed:?} is not an http(s) URL"
        ))),
    }
}

fn check_query(query: &str) -> Result<&str, SearchError> {
    let query = query.trim();
    if query.is_empty() {
        return Err(SearchError::Config("the search query is empty".into()));
    }
    Ok(query)
}

/// A transport error naming where the provider was asked (scheme, host, port and path: never
/// the query, which carries the user's words, nor credentials) and why it failed, down to
/// the innermost cause ("Connection refused"), never with a key.
fn network(provider: &str, error: reqwest::Error) -> SearchError {
    let at = error
        .url()
        .map(|url| format!(" at {}", endpoint(url)))
        .unwrap_or_default();
    if error.is_timeout() {
        return SearchError::Network(format!("{provider}{at} did not answer in time"));
    }
    let what = if error.is_connect() {
        "cannot connect"
    } else if error.is_body() || error.is_decode() {
        "cannot read the answer"
    } else {
        "the request failed"
    };
    let mut causes: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !causes.iter().any(|known| known.contains(&text)) {
            causes.push(text);
        }
        source = cause.source();
    }
    let why = causes
        .last()
        .cloned()
        .unwrap_or_else(|| error.without_url().to_string());
    SearchError::Network(format!("{provider}{at}: {what}: {why}"))
}

/// How long `/health`'s probe of a search provider waits.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a web provider's address answers at all. Any HTTP answer counts: only reaching it
/// is checked, never a search (which would spend the operator's quota). `local` always does.
pub(crate) async fn probe(provider: &dyn SearchProvider) -> Result<(), SearchError> {
    let Some(base) = provider.endpoint() else {
        return Ok(());
    };
    client(PROBE_TIMEOUT)?
        .get(base)
        .send()
        .await
        .map(|_| ())
        .map_err(|error| network(provider.name(), error))
}

/// A provider's address as messages and `/health` show it: no credentials, query or fragment.
pub(crate) fn endpoint(url: &url::Url) -> String {
    let mut shown = url.clone();
    // Fails only for URLs that cannot carry credentials.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// Sends a request, again under `retry` while the provider fails in a passing way (rate
/// limits, server errors, network trouble; its `Retry-After` is honoured); a non-success
/// status becomes `Http` with the body's start as message, with `secret` (the key, when there
/// is one) blanked out in case the provider echoes it.
async fn send(
    provider: &str,
    request: reqwest::RequestBuilder,
    secret: Option<&SecretString>,
    retry: RetryPolicy,
) -> Result<(u16, String), SearchError> {
    retry
        .run(
            "search request",
            || async {
                // Our requests have small in-memory bodies, which clone.
                let request = request.try_clone().ok_or_else(|| SentFailed {
                    error: SearchError::Config("the search request cannot be repeated".into()),
                    after: None,
                })?;
                send_once(provider, request, secret).await
            },
            |failed: &SentFailed| {
                if failed.error.retryable() {
                    Attempt::Again {
                        after: failed.after,
                    }
                } else {
                    Attempt::Final
                }
            },
        )
        .await
        .map_err(|failed| failed.error)
}

/// A failed search request, with the wait the provider asked for.
struct SentFailed {
    error: SearchError,
    after: Option<Duration>,
}

impl std::fmt::Display for SentFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

async fn send_once(
    provider: &str,
    request: reqwest::RequestBuilder,
    secret: Option<&SecretString>,
) -> Result<(u16, String), SentFailed> {
    let failed = |error| SentFailed { error, after: None };
    let response = request
        .send()
        .await
        .map_err(|error| failed(network(provider, error)))?;
    let status = response.status().as_u16();
    let after = crate::retry::retry_after(response.headers());
    let body = response
        .text()
        .await
        .map_err(|error| failed(network(provider, error)))?;
    if !(200..300).contains(&status) {
        let mut message = crate::text::prefix(body.trim(), MAX_ERROR_CHARS).to_string();
        if let Some(secret) = secret {
            let key = secret.expose_secret();
            if !key.is_empty() {
                message = message.replace(key, "***");
            }
        }
        if message.is_empty() {
            message = format!("{provider} returned no error text");
        }
        return Err(SentFailed {
            error: SearchError::Http { status, message },
            after,
        });
    }
    Ok((status, body))
}

fn parse_json<T: serde::de::DeserializeOwned>(
    provider: &str,
    body: &str,
) -> Result<T, SearchError> {
    serde_json::from_str(body).map_err(|error| SearchError::Parse(format!("{provider}: {error}")))
}

/// The text of an HTML fragment (Brave marks matches with `<strong>`), entities decoded.
fn fragment_text(html: &str) -> String {
    let fragment = Html::parse_fragment(html);
    let text: String = fragment.root_element().text().collect();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::sync::Mutex;

    use axum::Router;
    use axum::extract::{Form, Query, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{Html as HtmlResponse, IntoResponse};
    use axum::routing::{get, post};
    use serde_json::{Value, json};

    /// What the fake saw of the last request.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(HeaderMap, Value)>>>);

    impl Seen {
        fn last(&self) -> (HeaderMap, Value) {
            self.0
                .lock()
                .unwrap()
                .last()
                .cloned()
                .expect("the fake saw a request")
        }
    }

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        format!("http://{addr}")
    }

    fn user() -> UserId {
        UserId::for_tests()
    }

    fn secret(text: &str) -> SecretString {
        SecretString::from(text.to_string())
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    async fn tavily_fake(seen: Seen, status: StatusCode) -> String {
        let handler = move |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
            let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            seen.0.lock().unwrap().push((headers, body));
            if status != StatusCode::OK {
                return (status, r#"{"detail":{"error":"Unauthorized: missing or invalid API key tvly-test-key."}}"#).into_response();
            }
            axum::Json(json!({
                "query": "rust async runtimes",
                "answer": null,
                "images": [],
                "results": [
                    {
                        "title": "Tokio - An asynchronous Rust runtime",
                        "url": "https://tokio.rs/",
                        "content": "Tokio is an asynchronous runtime for Rust.",
                        "raw_content": "Tokio is an asynchronous runtime for the Rust programming language. It provides the building blocks.",
                        "score": 0.91,
                        "favicon": "https://tokio.rs/favicon.ico"
                    },
                    {
                        "title": "async-std",
                        "url": "https://async.rs/",
                        "content": "Async version of the Rust standard library.",
                        "raw_content": null,
                        "score": 0.72
                    }
                ],
                "response_time": 1.67,
                "request_id": "123e4567-e89b-12d3-a456-426614174111"
            }))
            .into_response()
        };
        serve(
            Router::new()
                .route("/search", post(handler))
                .with_state(seen),
        )
        .await
    }

    #[tokio::test]
    async fn tavily_sends_the_key_as_bearer_and_parses_raw_content() {
        let seen = Seen::default();
        let base = tavily_fake(seen.clone(), StatusCode::OK).await;
        let tavily = Tavily::new(&base, secret("tvly-test-key"), "advanced", TIMEOUT).unwrap();
        let hits = tavily
            .search(user(), " rust async runtimes ", 3)
            .await
            .unwrap();
        let (headers, body) = seen.last();
        assert_eq!(headers["authorization"], "Bearer tvly-test-key");
        assert_eq!(body["query"], "rust async runtimes");
        assert_eq!(body["max_results"], 3);
        assert_eq!(body["include_raw_content"], true);
        assert_eq!(body["search_depth"], "advanced");
        assert!(
            body.get("api_key").is_none(),
            "the key travels only in the header"
        );
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0],
            SearchHit {
                title: "Tokio - An asynchronous Rust runtime".into(),
                url: "https://tokio.rs/".into(),
                snippet: "Tokio is an asynchronous runtime for Rust.".into(),
                content: Some("Tokio is an asynchronous runtime for the Rust programming language. It provides the building blocks.".into()),
                score: Some(0.91),
                provider: None,
            }
        );
        assert_eq!(hits[1].content, None);
    }

    #[tokio::test]
    async fn tavily_errors_carry_the_status_but_never_the_key() {
        let seen = Seen::default();
        let base = tavily_fake(seen.clone(), StatusCode::UNAUTHORIZED).await;
        let tavily = Tavily::new(&base, secret("tvly-test-key"), "basic", TIMEOUT).unwrap();
        let error = tavily.search(user(), "anything", 5).await.unwrap_err();
        match &error {
            SearchError::Http { status, message } => {
                assert_eq!(*status, 401);
                assert!(message.contains("Unauthorized"), "{message}");
            }
            other => panic!("expected an Http error, got {other:?}"),
        }
        assert!(!error.to_string().contains("tvly-test-key"), "{error}");
        assert!(!format!("{error:?}").contains("tvly-test-key"));
        assert!(!error.retryable());

        let base = tavily_fake(Seen::default(), StatusCode::TOO_MANY_REQUESTS).await;
        let tavily = Tavily::new(&base, secret("tvly-test-key"), "basic", TIMEOUT).unwrap();
        let error = tavily.search(user(), "anything", 5).await.unwrap_err();
        assert!(matches!(error, SearchError::Http { status: 429, .. }));
        assert!(error.retryable());
    }

    #[tokio::test]
    async fn brave_sends_the_subscription_token_and_strips_markup() {
        let seen = Seen::default();
        let handler = |State(seen): State<Seen>,
                       headers: HeaderMap,
                       Query(query): Query<HashMap<String, String>>| async move {
            seen.0
                .lock()
                .unwrap()
                .push((headers, serde_json::to_value(&query).unwrap()));
            axum::Json(json!({
                "type": "search",
                "query": { "original": query.get("q") },
                "mixed": { "type": "mixed", "main": [] },
                "web": {
                    "type": "search",
                    "results": [
                        {
                            "title": "The <strong>Rust</strong> Programming Language",
                            "url": "https://doc.rust-lang.org/book/",
                            "is_source_local": false,
                            "description": "Learn <strong>Rust</strong> &amp; ownership, step by step.",
                            "profile": { "name": "Rust" },
                            "language": "en"
                        }
                    ],
                    "family_friendly": true
                }
            }))
        };
        let base = serve(
            Router::new()
                .route("/res/v1/web/search", get(handler))
                .with_state(seen.clone()),
        )
        .await;
        let brave = Brave::new(&base, secret("brave-test-key"), TIMEOUT).unwrap();
        let hits = brave.search(user(), "rust book", 4).await.unwrap();
        let (headers, query) = seen.last();
        assert_eq!(headers["x-subscription-token"], "brave-test-key");
        assert_eq!(query["q"], "rust book");
        assert_eq!(query["count"], "4");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].title, "The Rust Programming Language");
        assert_eq!(hits[0].url, "https://doc.rust-lang.org/book/");
        assert_eq!(hits[0].snippet, "Learn Rust & ownership, step by step.");
    }

    #[tokio::test]
    async fn searxng_asks_for_json_and_honours_max_results() {
        let seen = Seen::default();
        let handler = |State(seen): State<Seen>,
                       headers: HeaderMap,
                       Query(query): Query<HashMap<String, String>>| async move {
            seen.0
                .lock()
                .unwrap()
                .push((headers, serde_json::to_value(&query).unwrap()));
            axum::Json(json!({
                "query": query.get("q"),
                "number_of_results": 0,
                "results": [
                    { "url": "https://a.example/", "title": "A", "content": "first", "engine": "bing", "score": 3.0 },
                    { "url": "https://b.example/", "title": "B", "content": "second", "engine": "brave", "score": 1.5 },
                    { "url": "https://c.example/", "title": "C", "engine": "wikipedia" }
                ],
                "answers": [], "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": []
            }))
        };
        let base = serve(
            Router::new()
                .route("/searx/search", get(handler))
                .with_state(seen.clone()),
        )
        .await;
        let searxng = SearXng::new(&format!("{base}/searx/"), TIMEOUT).unwrap();
        let hits = searxng.search(user(), "编程 语言", 2).await.unwrap();
        let (_, query) = seen.last();
        assert_eq!(query["q"], "编程 语言");
        assert_eq!(query["format"], "json");
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].url, "https://a.example/");
        assert_eq!(hits[0].snippet, "first");
        assert_eq!(hits[0].score, Some(3.0));
        assert_eq!(hits[1].title, "B");
    }

    const DDG_PAGE: &str = r#"<!DOCTYPE html><html><head><title>rust at DuckDuckGo</title></head><body>
<div class="serp__results"><div id="links" class="results">
  <div class="result results_links results_links_deep result--ad">
    <div class="links_main links_deep result__body">
      <h2 class="result__title"><a rel="nofollow" class="result__a" href="https://duckduckgo.com/y.js?ad_domain=ads.example&amp;u3=x">Sponsored thing</a></h2>
      <a class="result__snippet" href="https://duckduckgo.com/y.js?u3=x">Buy now</a>
    </div>
  </div>
  <div class="result results_links results_links_deep web-result ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title">
        <a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fwww.rust%2Dlang.org%2Flearn%3Fa%3D1%26b%3D2&amp;rut=abc123">Learn <b>Rust</b></a>
      </h2>
      <div class="result__extras"><div class="result__extras__url"><a class="result__url" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fwww.rust%2Dlang.org%2Flearn&amp;rut=abc123">www.rust-lang.org/learn</a></div></div>
      <a class="result__snippet" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fwww.rust%2Dlang.org%2Flearn&amp;rut=abc123">Get started with <b>Rust</b>: the book,
        Rust by Example and more.</a>
      <div class="clear"></div>
    </div>
  </div>
  <div class="result results_links results_links_deep web-result ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title"><a rel="nofollow" class="result__a" href="https://en.wikipedia.org/wiki/Rust_(programming_language)">Rust (programming language) - Wikipedia</a></h2>
      <a class="result__snippet" href="https://en.wikipedia.org/wiki/Rust_(programming_language)">Rust is a general-purpose programming language.</a>
    </div>
  </div>
  <div class="result results_links results_links_deep web-result ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title"><a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg=javascript%3Aalert(1)">Bad link</a></h2>
    </div>
  </div>
</div></div></body></html>"#;

    #[tokio::test]
    async fn duckduckgo_posts_the_query_and_unwraps_result_links() {
        let seen = Seen::default();
        let handler = |State(seen): State<Seen>,
                       headers: HeaderMap,
                       Form(form): Form<HashMap<String, String>>| async move {
            seen.0
                .lock()
                .unwrap()
                .push((headers, serde_json::to_value(&form).unwrap()));
            HtmlResponse(DDG_PAGE)
        };
        let base = serve(
            Router::new()
                .route("/html/", post(handler))
                .with_state(seen.clone()),
        )
        .await;
        let ddg = DuckDuckGo::new(&base, TIMEOUT).unwrap();
        let hits = ddg.search(user(), "rust", 10).await.unwrap();
        let (_, form) = seen.last();
        assert_eq!(form["q"], "rust");
        assert_eq!(
            hits,
            vec![
                SearchHit {
                    title: "Learn Rust".into(),
                    url: "https://www.rust-lang.org/learn?a=1&b=2".into(),
                    snippet: "Get started with Rust: the book, Rust by Example and more.".into(),
                    content: None,
                    score: None,
                    provider: None,
                },
                SearchHit {
                    title: "Rust (programming language) - Wikipedia".into(),
                    url: "https://en.wikipedia.org/wiki/Rust_(programming_language)".into(),
                    snippet: "Rust is a general-purpose programming language.".into(),
                    content: None,
                    score: None,
                    provider: None,
                },
            ]
        );
        let one = ddg.search(user(), "rust", 1).await.unwrap();
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn duckduckgo_links_unwrap_to_their_target() {
        let base = "https://html.duckduckgo.com";
        let cases = [
            (
                "//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2Fa%20b&rut=x",
                Some("https://example.com/a%20b"),
            ),
            (
                "https://duckduckgo.com/l/?uddg=http%3A%2F%2Fexample.org%2F",
                Some("http://example.org/"),
            ),
            (
                "/l/?uddg=https%3A%2F%2Fexample.net%2F",
                Some("https://example.net/"),
            ),
            (
                "https://example.com/direct",
                Some("https://example.com/direct"),
            ),
            ("https://duckduckgo.com/y.js?ad_domain=x", None),
            ("//duckduckgo.com/l/?uddg=ftp%3A%2F%2Fexample.com%2F", None),
            ("//duckduckgo.com/l/?rut=only", None),
            ("not a url", None),
        ];
        for (href, expected) in cases {
            assert_eq!(
                unwrap_duckduckgo_link(href, base).as_deref(),
                expected,
                "{href}"
            );
        }
    }

    #[tokio::test]
    async fn error_statuses_are_http_errors_and_unreachable_hosts_network_errors() {
        let handler = || async { (StatusCode::SERVICE_UNAVAILABLE, "engine overloaded") };
        let base = serve(
            Router::new()
                .route("/search", get(handler))
                .route("/html/", post(handler)),
        )
        .await;
        let searxng = SearXng::new(&base, TIMEOUT).unwrap();
        let error = searxng.search(user(), "q", 5).await.unwrap_err();
        assert!(
            matches!(&error, SearchError::Http { status: 503, message } if message == "engine overloaded"),
            "{error:?}"
        );
        assert!(error.retryable());
        let ddg = DuckDuckGo::new(&base, TIMEOUT).unwrap();
        assert!(matches!(
            ddg.search(user(), "q", 5).await,
            Err(SearchError::Http { status: 503, .. })
        ));
        // Nothing listens on a port that was just freed.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let brave = Brave::new(&closed, secret("brave-test-key"), TIMEOUT).unwrap();
        let error = brave.search(user(), "q", 5).await.unwrap_err();
        assert!(matches!(error, SearchError::Network(_)), "{error:?}");
        assert!(error.retryable());
        assert!(!error.to_string().contains("brave-test-key"));
        // A body that is not the provider's shape.
        let garbage =
            serve(Router::new().route("/search", get(|| async { "<html>oops</html>" }))).await;
        let searxng = SearXng::new(&garbage, TIMEOUT).unwrap();
        assert!(matches!(
            searxng.search(user(), "q", 5).await,
            Err(SearchError::Parse(_))
        ));
        assert!(matches!(
            searxng.search(user(), "   ", 5).await,
            Err(SearchError::Config(_))
        ));
    }

    #[tokio::test]
    async fn passing_failures_are_tried_again_with_the_providers_wait_and_refusals_are_not() {
        use std::sync::atomic::{AtomicU32, Ordering};
        // A provider that is overloaded once (asking for 200 ms), then answers.
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let base = serve(Router::new().route(
            "/search",
            get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            [("retry-after", "0.2")],
                            "slow down",
                        )
                            .into_response()
                    } else {
                        axum::Json(json!({"results": [{"title": "t", "url": "https://a.example/", "content": "c"}]}))
                            .into_response()
                    }
                }
            }),
        ))
        .await;
        let retry = RetryPolicy::new(2, Duration::from_millis(1));
        let searxng = SearXng::new(&base, TIMEOUT).unwrap().with_retry(retry);
        let start = std::time::Instant::now();
        let hits = searxng.search(user(), "q", 5).await.unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );
        // A refused key is not asked again.
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let base = serve(Router::new().route(
            "/search",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::UNAUTHORIZED, "bad key") }
            }),
        ))
        .await;
        let searxng = SearXng::new(&base, TIMEOUT).unwrap().with_retry(retry);
        assert!(matches!(
            searxng.search(user(), "q", 5).await,
            Err(SearchError::Http { status: 401, .. })
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn missing_keys_and_unknown_names_are_config_errors() {
        let settings = SearchSettings::default();
        let missing = |error: SearchError, needle: &str| match error {
            SearchError::Config(message) => assert!(message.contains(needle), "{message}"),
            other => panic!("expected a Config error, got {other:?}"),
        };
        missing(
            web_provider("tavily", &settings).err().expect("no key"),
            "tavily_api_key",
        );
        missing(
            web_provider("brave", &settings).err().expect("no key"),
            "brave_api_key",
        );
        missing(
            web_provider("searxng", &settings).err().expect("no url"),
            "searxng_url",
        );
        missing(
            web_provider("bing", &settings).err().expect("unknown"),
            "tavily, brave, searxng, duckduckgo, local",
        );
        assert!(web_provider("duckduckgo", &settings).is_ok());
        let with_keys = SearchSettings {
            tavily_api_key: Some(secret("k1")),
            brave_api_key: Some(secret("k2")),
            searxng_url: Some("http://127.0.0.1:1".into()),
            ..SearchSettings::default()
        };
        for name in ["tavily", "brave", "searxng", "duckduckgo"] {
            let provider = web_provider(name, &with_keys).unwrap();
            assert_eq!(provider.name(), name);
        }
        let bad_base = SearchSettings {
            duckduckgo_base_url: "file:///etc".into(),
            ..SearchSettings::default()
        };
        assert!(matches!(
            web_provider("duckduckgo", &bad_base),
            Err(SearchError::Config(_))
        ));
    }
}
