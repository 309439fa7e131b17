//! A SearXNG instance with the JSON format enabled (`GET /search?format=json`).

use super::*;

/// A SearXNG instance (`GET {base}/search?q=&format=json`; the instance must allow the JSON
/// format).
pub(crate) struct SearXng {
    http: reqwest::Client,
    retry: RetryPolicy,
    base: String,
}

impl SearXng {
    /// Tries a failed search again under `retry` (rate limits, server errors, network
    /// trouble).
    #[must_use]
    pub(crate) fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub(crate) fn new(base: &str, timeout: Duration) -> Result<Self, SearchError> {
        Ok(Self {
            http: client(timeout)?,
            retry: RetryPolicy::never(),
            base: base_url(base, "searxng")?,
        })
    }
}

#[derive(Deserialize)]
struct SearXngResponse {
    #[serde(default)]
    results: Vec<SearXngResult>,
}

#[derive(Deserialize)]
struct SearXngResult {
    #[serde(default)]
    title: String,
    url: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    score: Option<f64>,
}

#[async_trait]
impl SearchProvider for SearXng {
    fn name(&self) -> &'static str {
        "searxng"
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
        let request = self
            .http
            .get(format!("{}/search", self.base))
            .query(&[("q", query), ("format", "json")])
            .header("Accept", "application/json");
        let (_, body) = send("searxng", request, None, self.retry).await?;
        let parsed: SearXngResponse = parse_json("searxng", &body)?;
        Ok(parsed
            .results
            .into_iter()
            .take(max_results.max(1))
            .map(|result| SearchHit {
                title: result.title,
                url: result.url,
                snippet: result.content.unwrap_or_default(),
                content: None,
                score: result.score,
                provider: None,
            })
            .collect())
    }
}
