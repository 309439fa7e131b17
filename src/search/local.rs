//! `local`: the user's own ingested documents, searched with the memory engine's hybrid recall
//! over their chunk memories.

use super::*;

/// The user's own ingested documents, found with the memory engine's hybrid recall restricted
/// to `document` chunks; recall filters by the user in both indexes and re-reads hits from SQL
/// for that user, so one user's search never sees another's documents.
pub struct Local {
    memory: Arc<MemoryEngine>,
}

impl Local {
    pub fn new(memory: Arc<MemoryEngine>) -> Self {
        Self { memory }
    }
}

/// Snippet length of a local hit, in characters.
const LOCAL_SNIPPET_CHARS: usize = 300;

/// The document and chunk a chunk memory's `source_refs` name (`doc:<id>`, `doc:<id>#<n>`).
pub fn chunk_reference(source_refs: &[String]) -> Option<(DocumentId, Option<usize>)> {
    let mut document = None;
    let mut chunk = None;
    for reference in source_refs {
        let Some(rest) = reference.strip_prefix("doc:") else {
            continue;
        };
        match rest.split_once('#') {
            Some((id, index)) => {
                document = document.or_else(|| id.parse::<DocumentId>().ok());
                chunk = chunk.or_else(|| index.parse::<usize>().ok());
            }
            None => document = document.or_else(|| rest.parse::<DocumentId>().ok()),
        }
    }
    document.map(|document| (document, chunk))
}

fn local_error(error: MemoryError) -> SearchError {
    match error.kind() {
        ErrorKind::BadRequest => SearchError::Config(error.to_string()),
        _ => SearchError::Network(format!("local search failed: {error}")),
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
        let k = max_results.clamp(1, self.memory.settings().max_k.max(1));
        let request = RecallRequest {
            query: query.to_string(),
            k: Some(k),
            kinds: Some(vec![MemoryKind::Document]),
            decay: false,
            ..RecallRequest::default()
        };
        let results = self
            .memory
            .recall(user, request)
            .await
            .map_err(local_error)?
            .results;
        let mut titles: HashMap<DocumentId, String> = HashMap::new();
        let mut hits = Vec::with_capacity(results.len());
        for result in results {
            let memory = result.memory;
            let reference = chunk_reference(&memory.source_refs);
            let (title, url) = match reference {
                Some((document, chunk)) => {
                    let title = match titles.get(&document) {
                        Some(title) => title.clone(),
                        None => {
                            // A document deleted since the recall keeps a generic title.
                            let title = self
                                .memory
                                .store()
                                .user(user)
                                .get_document(document)
                                .await
                                .map(|found| found.title)
                                .unwrap_or_else(|_| "document".to_string());
                            titles.insert(document, title.clone());
                            title
                        }
                    };
                    let url = match chunk {
                        Some(chunk) => format!("doc:{document}#{chunk}"),
                        None => format!("doc:{document}"),
                    };
                    (title, url)
                }
                None => ("document".to_string(), format!("memory:{}", memory.id)),
            };
            let snippet: String = memory.content.chars().take(LOCAL_SNIPPET_CHARS).collect();
            hits.push(SearchHit {
                title,
                url,
                snippet,
                content: Some(memory.content),
                score: Some(result.score),
            });
        }
        Ok(hits)
    }
}
