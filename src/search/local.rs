//! `local`: the user's own ingested documents, searched through the [`Corpus`] seam (the
//! documents room implements it with the memory engine's hybrid recall over chunk memories), so
//! that search knows nothing of memories.

use super::*;

/// The documents `local` searches, for one user at a time.
#[async_trait]
pub trait Corpus: Send + Sync {
    /// At most `k` passages of `user`'s documents for `query` (already checked), best first.
    async fn search(
        &self,
        user: UserId,
        query: &str,
        k: usize,
    ) -> Result<Vec<SearchHit>, SearchError>;
}

/// The user's own ingested documents. The corpus filters by the user, so one user's search never
/// sees another's documents.
pub(crate) struct Local {
    corpus: Arc<dyn Corpus>,
}

impl Local {
    pub(crate) fn new(corpus: Arc<dyn Corpus>) -> Self {
        Self { corpus }
    }
}

#[async_trait]
impl SearchProvider for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn search(
        &self,
        user: UserId,
        query: &str,
        max_results: usize,
    ) -> Result<Vec<SearchHit>, SearchError> {
        let query = check_query(query)?;
        self.corpus.search(user, query, max_results.max(1)).await
    }
}
