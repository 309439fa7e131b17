//! DuckDuckGo through its HTML page (`POST /html/`), parsed with CSS selectors; its `/l/?uddg=`
//! redirect links are unwrapped and ads skipped.

use super::*;

/// DuckDuckGo's HTML results page (`POST {base}/html/` with the form field `q`), parsed with
/// CSS selectors. Result links are redirects (`//duckduckgo.com/l/?uddg=<target>`) and are
/// unwrapped to their target; ads are skipped.
pub(crate) struct DuckDuckGo {
    http: reqwest::Client,
    retry: RetryPolicy,
    base: String,
}

impl DuckDuckGo {
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
            base: base_url(base, "duckduckgo")?,
        })
    }
}

fn css(selector: &str) -> Result<Selector, SearchError> {
    Selector::parse(selector)
        .map_err(|error| SearchError::Parse(format!("bad selector {selector:?}: {error}")))
}

/// The target of a DuckDuckGo result link: `uddg` of a `/l/` redirect, or the link itself
/// when it already points elsewhere. `None` for ads and non-http(s) links.
pub(crate) fn unwrap_duckduckgo_link(href: &str, base: &str) -> Option<String> {
    let absolute = if href.starts_with("//") {
        format!("https:{href}")
    } else if href.starts_with('/') {
        format!("{}{href}", base.trim_end_matches('/'))
    } else {
        href.to_string()
    };
    let url = url::Url::parse(&absolute).ok()?;
    let on_duckduckgo = url
        .host_str()
        .is_some_and(|host| host == "duckduckgo.com" || host.ends_with(".duckduckgo.com"))
        || absolute.starts_with(base);
    let target = if on_duckduckgo {
        if url.path() != "/l/" {
            // `/y.js?…` is an ad click; anything else on DuckDuckGo itself is not a result.
            return None;
        }
        let (_, target) = url.query_pairs().find(|(name, _)| name == "uddg")?;
        url::Url::parse(&target).ok()?
    } else {
        url
    };
    matches!(target.scheme(), "http" | "https").then(|| target.to_string())
}

/// Parses DuckDuckGo's HTML results page.
pub(crate) fn parse_duckduckgo(
    html: &str,
    base: &str,
    max_results: usize,
) -> Result<Vec<SearchHit>, SearchError> {
    let document = Html::parse_document(html);
    let result = css("div.result, div.web-result")?;
    let link = css("a.result__a")?;
    let snippet = css(".result__snippet")?;
    let mut hits: Vec<SearchHit> = Vec::new();
    for element in document.select(&result) {
        let classes = element.value().attr("class").unwrap_or_default();
        if classes.contains("result--ad") {
            continue;
        }
        let Some(anchor) = element.select(&link).next() else {
            continue;
        };
        let Some(url) = anchor
            .value()
            .attr("href")
            .and_then(|href| unwrap_duckduckgo_link(href, base))
        else {
            continue;
        };
        if hits.iter().any(|hit| hit.url == url) {
            continue;
        }
        let collapse = |text: String| text.split_whitespace().collect::<Vec<_>>().join(" ");
        hits.push(SearchHit {
            title: collapse(anchor.text().collect()),
            url,
            snippet: element
                .select(&snippet)
                .next()
                .map(|s| collapse(s.text().collect()))
                .unwrap_or_default(),
            content: None,
            score: None,
            provider: None,
        });
        if hits.len() >= max_results {
            break;
        }
    }
    Ok(hits)
}

#[async_trait]
impl SearchProvider for DuckDuckGo {
    fn name(&self) -> &'static str {
        "duckduckgo"
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
            .post(format!("{}/html/", self.base))
            .form(&[("q", query)]);
        let (status, body) = send("duckduckgo", request, None, self.retry).await?;
        if status == 202 {
            // DuckDuckGo answers 202 with a challenge page when it rate-limits a client.
            return Err(SearchError::Http {
                status,
                message: "duckduckgo asked for a challenge (rate limited); try again later".into(),
            });
        }
        parse_duckduckgo(&body, &self.base, max_results.max(1))
    }
}
