//! Tavily (`POST /search`, API key in the `Authorization` header): search results with their
//! raw page content, so a research can cite them without fetching.

use super::*;

/// Tavily (`POST {base}/search`, `Authorization: Bearer <key>`), asking for each page's raw
/// content so research can skip fetching it.
pub(crate) struct Tavily {
    http: reqwest::Client,
    retry: RetryPolicy,
    base: String,
    key: SecretString,
    depth: String,
}

impl Tavily {
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
        search_depth: &str,
        timeout: Duration,
    ) -> Result<Self, SearchError> {
        if key.expose_secret().trim().is_empty() {
            return Err(SearchError::Config("the tavily api key is empty".into()));
        }
        Ok(Self {
            http: client(timeout)?,
            retry: RetryPolicy::never(),
            base: base_url(base, "tavily")?,
            key,
            depth: search_depth.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct TavilyResponse {
    #[serde(default)]
    results: Vec<TavilyResult>,
}

#[derive(Deserialize)]
struct TavilyResult {
    #[serde(default)]
    title: String,
    url: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    raw_content: Option<String>,
    #[serde(default)]
    score: Option<f64>,
}

#[async_trait]
impl SearchProvider for Tavily {
    fn name(&self) -> &'static str {
        "tavily"
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
            .post(format!("{}/search", self.base))
            .bearer_auth(self.key.expose_secret())
            .json(&serde_json::json!({
                "query": query,
                "max_results": count,
                "search_depth": self.depth,
                "include_raw_content": true,
            }));
        let (_, body) = send("tavily", request, Some(&self.key), self.retry).await?;
        let parsed: TavilyResponse = parse_json("tavily", &body)?;
        Ok(parsed
            .results
            .into_iter()
            .take(count)
            .map(|result| SearchHit {
                title: result.title,
                url: result.url,
                snippet: result.content,
                content: result.raw_content.filter(|text| !text.trim().is_empty()),
                score: result.score,
                provider: None,
            })
            .collect())
    }
}
