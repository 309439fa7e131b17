//! Brave Search (`GET /res/v1/web/search`, key in `X-Subscription-Token`).

use super::*;

/// Brave Search (`GET {base}/res/v1/web/search?q=&count=`, `X-Subscription-Token: <key>`).
pub(crate) struct Brave {
    http: reqwest::Client,
    retry: RetryPolicy,
    base: String,
    key: SecretString,
}

impl Brave {
    /// Tries a failed search again under `retry` (rate limits, server errors, network
    /// trouble).
    #[must_use]
    pub(crate) fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub(crate) fn new(
        base: &str,
        key: SecretString,
        timeout: Duration,
    ) -> Result<Self, SearchError> {
        if key.expose_secret().trim().is_empty() {
            return Err(SearchError::Config("the brave api key is empty".into()));
        }
        Ok(Self {
            http: client(timeout)?,
            retry: RetryPolicy::never(),
            base: base_url(base, "brave")?,
            key,
        })
    }
}

#[derive(Deserialize)]
struct BraveResponse {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Deserialize)]
struct BraveResult {
    #[serde(default)]
    title: String,
    url: String,
    #[serde(default)]
    description: String,
}

#[async_trait]
impl SearchProvider for Brave {
    fn name(&self) -> &'static str {
        "brave"
    }

    fn endpoint(&self) -> Option<&str> {
        Some(&self.base)
    }

    async fn search(
        &self,
        _user: UserId,
        query: &str,
        max_results: usize,
    ) -> Result<Vec<SearchHit>, SearchError> {
        let query = check_query(query)?;
        let count = max_results.clamp(1, 20);
        let request = self
            .http
            .get(format!("{}/res/v1/web/search", self.base))
            .query(&[("q", query), ("count", &count.to_string())])
            .header("Accept", "application/json")
            .header("X-Subscription-Token", self.key.expose_secret());
        let (_, body) = send("brave", request, Some(&self.key), self.retry).await?;
        let parsed: BraveResponse = parse_json("brave", &body)?;
        Ok(parsed
            .web
            .map(|web| web.results)
            .unwrap_or_default()
            .into_iter()
            .take(count)
            .map(|result| SearchHit {
                title: fragment_text(&result.title),
                url: result.url,
                snippet: fragment_text(&result.description),
                content: None,
                score: None,
                provider: None,
            })
            .collect())
    }
}
