//! Several providers searched as one (`search_api: ["local", "searxng"]`): the user's
//! documents and the web in one research.

use super::*;

/// Providers asked at once for every query; their hits interleaved (each one's first, then
/// each one's second, …), a URL kept once, every hit labelled with the provider that found
/// it. A provider that fails costs its hits only; all failing is the search's failure, naming
/// each.
pub(crate) struct Multi {
    providers: Vec<Arc<dyn SearchProvider>>,
}

impl Multi {
    pub(crate) fn new(providers: Vec<Arc<dyn SearchProvider>>) -> Self {
        Self { providers }
    }
}

#[async_trait]
impl SearchProvider for Multi {
    fn name(&self) -> &'static str {
        "multi"
    }

    async fn search(
        &self,
        user: UserId,
        query: &str,
        max_results: usize,
    ) -> Result<Vec<SearchHit>, SearchError> {
        let answers = futures::future::join_all(
            self.providers
                .iter()
                .map(|provider| provider.search(user, query, max_results)),
        )
        .await;
        let mut lists = Vec::new();
        let mut failures = Vec::new();
        for (provider, answer) in self.providers.iter().zip(answers) {
            match answer {
                Ok(hits) => lists.push(
                    hits.into_iter()
                        .map(|hit| SearchHit {
                            provider: hit.provider.or(Some(provider.name().to_string())),
                            ..hit
                        })
                        .collect::<Vec<_>>(),
                ),
                Err(error) => {
                    tracing::warn!(provider = provider.name(), %error, "one of the providers of a search failed");
                    failures.push((error.retryable(), error.to_string()));
                }
            }
        }
        if lists.is_empty() {
            let message = failures
                .iter()
                .map(|(_, message)| message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            return Err(if failures.iter().any(|(retryable, _)| *retryable) {
                SearchError::Network(message)
            } else {
                SearchError::Config(message)
            });
        }
        let mut hits: Vec<SearchHit> = Vec::new();
        let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..longest {
            for list in &lists {
                if let Some(hit) = list.get(rank)
                    && !hits.iter().any(|known| known.url == hit.url)
                {
                    hits.push(hit.clone());
                }
            }
        }
        Ok(hits)
    }
}
