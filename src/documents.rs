//! The user's own documents for local research. Ingestion extracts the text
//! (`extract::by_content_type`), cuts it into paragraph-aligned chunks with a small overlap,
//! and stores every chunk as a `document` memory through the memory engine, so chunks are
//! embedded, logged and indexed (vector + BM25) like any memory and isolated per user. A
//! document row (`DocumentStore`) keeps the title and counts; deleting a document deletes its
//! chunks through the engine's delete path, so both indexes drop them too.
//!
//! A document is identified by its source (a file's canonical path for `mnemo ingest`, the
//! `source` an API client gives), or, without one, by its content; its content by the sha256
//! of the bytes ingested. Ingesting an identity the user already has with the same content
//! and type is a no-op (`unchanged`: nothing is extracted, embedded or written). With other
//! content the document keeps its id and its chunks are `replaced`: the new ones are written,
//! then the old ones deleted through the engine's delete path (so no index recalls them).
//! The same content under two sources makes two documents, each replaced on its own.
//!
//! Concurrency and crashes: an ingest claims the row with a compare-and-set on its
//! `generation`, and records when it has written every chunk. The unique indexes on (user,
//! source) and (user, content without source) decide between two ingests inserting the same
//! document; the later one then finds the row. An ingest that finds a row whose chunks were
//! never all written (a crash, a Ctrl-C, an ingest still running elsewhere) claims it and
//! writes it again; the one that lost its claim deletes the chunks it wrote and answers with
//! the document (`unchanged` when the winner ingests the same content). Documents ingested
//! before content hashes were kept are replaced by the next ingest of their source, which
//! also deletes older copies of that source.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::enums::text_enum;
use crate::error::{ErrorKind, HasKind};
use crate::memory::{MemoryEngine, MemoryError, RecallRequest};
use crate::search::{Corpus, SearchError, SearchHit};
use crate::store::{
    Document, DocumentId, DocumentState, MemoryId, MemoryKind, MemorySource, NewDocument,
    NewMemory, StoreError, Trust, UserId, UserScope,
};
use crate::text::extract::{self, ExtractError};

/// Extracted text above this is refused rather than embedded for minutes.
pub(crate) const MAX_DOCUMENT_CHARS: usize = 2_000_000;
/// Chunks embedded and written per memory transaction.
const CHUNKS_PER_BATCH: usize = 32;
/// Titles are cut to this many characters.
const MAX_TITLE_CHARS: usize = 200;
/// Importance of chunk memories: 4 and above never decay and are never archived.
const CHUNK_IMPORTANCE: u8 = 4;
/// Times an ingest looks the document up again after losing a race to insert or claim it.
const CLAIM_ATTEMPTS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The content cannot be ingested: empty, no text, unsupported type, unreadable PDF.
    #[error("{0}")]
    BadInput(String),
    /// Past a limit of size, pages or extraction time.
    #[error("{0}")]
    TooLarge(String),
    /// The extraction worker could not be run (a deployment problem; nothing was stored).
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HasKind for DocumentError {
    fn kind(&self) -> ErrorKind {
        match self {
            DocumentError::BadInput(_) => ErrorKind::BadRequest,
            DocumentError::TooLarge(_) => ErrorKind::PayloadTooLarge,
            DocumentError::Unavailable(_) => ErrorKind::Unavailable,
            DocumentError::Memory(error) => error.kind(),
            DocumentError::Store(error) => error.kind(),
        }
    }
}

impl From<ExtractError> for DocumentError {
    fn from(error: ExtractError) -> Self {
        match error {
            ExtractError::Unsupported(kind) => DocumentError::BadInput(format!(
                "unsupported content type {kind:?}; send text/plain, text/markdown, text/html or application/pdf"
            )),
            ExtractError::Pdf(reason) => {
                DocumentError::BadInput(format!("the PDF could not be read: {reason}"))
            }
            ExtractError::TooLarge(reason) => DocumentError::TooLarge(reason),
            ExtractError::Unreadable(reason) => DocumentError::BadInput(reason),
            ExtractError::Worker(reason) => DocumentError::Unavailable(reason),
        }
    }
}

/// What to ingest: raw bytes of a given content type, with optional title and origin.
#[derive(Debug, Clone)]
pub struct NewUpload {
    pub title: Option<String>,
    /// Where it came from (a file path or URL), shown in lists. It identifies the document:
    /// an upload with the source of an existing document keeps or replaces that one.
    pub source: Option<String>,
    /// `text/plain`, `text/markdown`, `text/html`, `application/pdf`, …
    pub content_type: String,
    pub bytes: Vec<u8>,
}

text_enum! {
    /// What an ingest did.
    IngestStatus("ingest status") {
        /// A new document was stored.
        Created => "created",
        /// The user has this document with the same content: nothing was written.
        Unchanged => "unchanged",
        /// The user's document with this source had other content (or an interrupted ingest
        /// had left it incomplete): its chunks were replaced, its id kept.
        Replaced => "replaced",
    }
}

/// An ingested document and what the ingest did.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct IngestedDocument {
    #[serde(flatten)]
    pub document: Document,
    pub status: IngestStatus,
}

/// The content hash of a document: sha256 of its bytes, lowercase hex (as `sha256sum`).
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Extracts, chunks and stores a document, or finds it already stored (see the module docs);
/// returns its row and what was done. Chunks are recallable once the indexer has applied them
/// (normally within milliseconds).
pub async fn ingest(
    memory: &MemoryEngine,
    user: UserId,
    upload: NewUpload,
) -> Result<IngestedDocument, DocumentError> {
    let content_type = essence(&upload.content_type);
    if upload.bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(DocumentError::BadInput("the document is empty".into()));
    }
    let content_hash = content_hash(&upload.bytes);
    let source = upload
        .source
        .as_deref()
        .map(str::trim)
        .filter(|source| !source.is_empty())
        .map(str::to_string);
    let store = memory.store().user(user);
    // A re-ingest of an unchanged document: nothing to extract, embed or write.
    let mut found = find(&store, source.as_deref(), &content_hash).await?;
    if let Some(current) = found.current.as_ref().filter(|current| {
        current.complete && holds(&current.document, &content_hash, &content_type)
    }) {
        return Ok(unchanged(current.document.clone()));
    }
    let (new, chunks) = prepare(memory, upload, content_type, source, content_hash).await?;
    for _ in 0..CLAIM_ATTEMPTS {
        let (claim, previous) = match found.current.take() {
            Some(current)
                if current.complete && holds(&current.document, hash(&new), &new.content_type) =>
            {
                return Ok(unchanged(current.document));
            }
            Some(current) => {
                let id = current.document.id;
                if !store
                    .claim_document(id, current.generation, new.clone())
                    .await?
                {
                    found = find(&store, new.source.as_deref(), hash(&new)).await?;
                    continue;
                }
                let claim = Claim {
                    id,
                    generation: current.generation + 1,
                };
                (claim, Some(current))
            }
            None => match store.insert_document(new.clone()).await {
                Ok(document) => {
                    let claim = Claim {
                        id: document.id,
                        generation: 0,
                    };
                    (claim, None)
                }
                // Another ingest inserted this document just now: look again.
                Err(StoreError::Conflict(_)) => {
                    found = find(&store, new.source.as_deref(), hash(&new)).await?;
                    continue;
                }
                Err(error) => return Err(error.into()),
            },
        };
        if !fill(memory, user, claim, &chunks, previous.as_ref()).await? {
            return lost(&store, &new).await;
        }
        // Copies of this source from before content hashes were kept go now (one left by a
        // failure here is found by the next ingest of the source, and goes then).
        for older in std::mem::take(&mut found.older) {
            match delete(memory, user, older.document.id).await {
                Ok(_) | Err(DocumentError::Store(StoreError::NotFound(_))) => {}
                Err(error) => {
                    let document = older.document.id;
                    tracing::warn!(%error, %document, "deleting an older copy of a document");
                }
            }
        }
        let status = match previous {
            Some(_) => IngestStatus::Replaced,
            None => IngestStatus::Created,
        };
        metrics::counter!("mnemo_documents_ingested_total", "status" => status.as_str())
            .increment(1);
        return Ok(IngestedDocument {
            document: store.get_document(claim.id).await?,
            status,
        });
    }
    Err(StoreError::Conflict(
        "other ingests of this document kept changing it; ingest it again".into(),
    )
    .into())
}

/// The document a user has under an identity: by source when there is one, else by content.
struct Found {
    /// The document itself.
    current: Option<DocumentState>,
    /// Other documents from the same source, ingested before content hashes were kept.
    older: Vec<DocumentState>,
}

async fn find(
    store: &UserScope<'_>,
    source: Option<&str>,
    content_hash: &str,
) -> Result<Found, StoreError> {
    match source {
        Some(source) => {
            let mut rows = store.documents_from_source(source).await?;
            // The row with a content hash is the document; without one, the newest copy from
            // before content hashes becomes it.
            let current = rows
                .iter()
                .position(|row| row.document.content_hash.is_some())
                .or_else(|| (!rows.is_empty()).then_some(0))
                .map(|index| rows.remove(index));
            Ok(Found {
                current,
                older: rows,
            })
        }
        None => Ok(Found {
            current: store.document_with_content(content_hash).await?,
            older: Vec::new(),
        }),
    }
}

fn hash(new: &NewDocument) -> &str {
    new.content_hash.as_deref().unwrap_or_default()
}

/// Whether the document holds this content, extracted as this type.
fn holds(document: &Document, content_hash: &str, content_type: &str) -> bool {
    document.content_hash.as_deref() == Some(content_hash) && document.content_type == content_type
}

fn unchanged(document: Document) -> IngestedDocument {
    metrics::counter!("mnemo_documents_ingested_total", "status" => "unchanged").increment(1);
    IngestedDocument {
        document,
        status: IngestStatus::Unchanged,
    }
}

/// Extracts the text and cuts it into chunks, within the limits: the row to store and its
/// chunks.
async fn prepare(
    memory: &MemoryEngine,
    upload: NewUpload,
    content_type: String,
    source: Option<String>,
    content_hash: String,
) -> Result<(NewDocument, Vec<String>), DocumentError> {
    // Parsing is CPU-bound and can be hostile: a worker process under ceilings does it.
    let extracted = extract::extract_isolated(&content_type, upload.bytes).await?;
    let text = extracted.text.trim();
    let chars = text.chars().count();
    if chars == 0 {
        return Err(DocumentError::BadInput(
            "no text could be extracted from the document".into(),
        ));
    }
    if chars > MAX_DOCUMENT_CHARS {
        return Err(DocumentError::TooLarge(format!(
            "the document has {chars} characters of text; at most {MAX_DOCUMENT_CHARS} are accepted"
        )));
    }
    let chunks = crate::text::split::chunk(text);
    let max_chunks = memory.settings().max_document_chunks;
    if chunks.len() > max_chunks {
        return Err(DocumentError::TooLarge(format!(
            "the document's text makes {} chunks; at most {max_chunks} are accepted \
             (memory.max_document_chunks)",
            chunks.len()
        )));
    }
    let title = pick_title(upload.title.as_deref(), extracted.title.as_deref(), text);
    let new = NewDocument {
        title,
        source,
        content_type,
        content_hash: Some(content_hash),
        chars: chars as i64,
        chunks: chunks.len() as i64,
    };
    Ok((new, chunks))
}

/// A row this ingest claimed: it writes the chunks while the row stays at this generation.
#[derive(Debug, Clone, Copy)]
struct Claim {
    id: DocumentId,
    generation: i64,
}

/// Writes the claimed document's chunks, then deletes the chunks it had before (an older
/// content's, or those an interrupted ingest left), then records it complete. False when
/// another ingest claimed the row meanwhile (or it was deleted): the chunks written here are
/// deleted again and the row is left to the other ingest. On an error the chunks written here
/// are deleted and the row goes back to `previous` (or goes, when this ingest inserted it).
async fn fill(
    memory: &MemoryEngine,
    user: UserId,
    claim: Claim,
    chunks: &[String],
    previous: Option<&DocumentState>,
) -> Result<bool, DocumentError> {
    let store = memory.store().user(user);
    // Read after the claim: any chunk written for a later claim comes after it, so it is not
    // among these (the check before the first batch makes sure no later claim came between).
    let stale = store.document_chunk_ids(claim.id).await?;
    let mut written: Vec<MemoryId> = Vec::with_capacity(chunks.len());
    for (batch_index, batch) in chunks.chunks(CHUNKS_PER_BATCH).enumerate() {
        let still_ours = match still_claimed(&store, claim).await {
            Ok(ours) => ours,
            Err(error) => {
                discard(memory, user, &written).await;
                return Err(error.into());
            }
        };
        if !still_ours {
            discard(memory, user, &written).await;
            return Ok(false);
        }
        let news: Vec<NewMemory> = batch
            .iter()
            .enumerate()
            .map(|(offset, text)| {
                chunk_memory(claim.id, batch_index * CHUNKS_PER_BATCH + offset, text)
            })
            .collect();
        match memory.add(user, news).await {
            Ok(memories) => written.extend(memories.into_iter().map(|memory| memory.id)),
            Err(error) => {
                // Leave nothing half-ingested behind: the chunks written so far go, and the row
                // describes what its chunks hold again.
                discard(memory, user, &written).await;
                match previous {
                    Some(previous) => {
                        let back = NewDocument::from(&previous.document);
                        if let Ok(true) =
                            store.claim_document(claim.id, claim.generation, back).await
                            && previous.complete
                        {
                            let _ = store.finish_document(claim.id, claim.generation + 1).await;
                        }
                    }
                    None => {
                        if let Ok(true) = still_claimed(&store, claim).await {
                            let _ = store.delete_document(claim.id).await;
                        }
                    }
                }
                return Err(error.into());
            }
        }
    }
    // The old chunks go once the new ones are in, so the document is recallable throughout.
    // A failure here leaves the row incomplete, and the next ingest writes it again.
    delete_chunks(memory, user, &stale).await?;
    if store.finish_document(claim.id, claim.generation).await? {
        Ok(true)
    } else {
        discard(memory, user, &written).await;
        Ok(false)
    }
}

async fn still_claimed(store: &UserScope<'_>, claim: Claim) -> Result<bool, StoreError> {
    match store.document_state(claim.id).await {
        Ok(state) => Ok(state.generation == claim.generation),
        Err(StoreError::NotFound(_)) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Deletes chunks through the engine (so both indexes drop them); already gone is fine.
async fn delete_chunks(
    memory: &MemoryEngine,
    user: UserId,
    chunks: &[MemoryId],
) -> Result<usize, DocumentError> {
    let mut deleted = 0;
    for chunk in chunks {
        match memory.delete(user, *chunk).await {
            Ok(()) => deleted += 1,
            // Already gone (a concurrent delete): nothing left to do for this one.
            Err(MemoryError::Store(StoreError::NotFound(_))) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(deleted)
}

/// Deletes the chunks this ingest wrote, on its way out; a failure is logged (the next ingest
/// of the document deletes what is left).
async fn discard(memory: &MemoryEngine, user: UserId, chunks: &[MemoryId]) {
    if let Err(error) = delete_chunks(memory, user, chunks).await {
        tracing::warn!(%error, "deleting the chunks of an abandoned ingest");
    }
}

/// This ingest lost its claim to another one: the document as that one left it, `unchanged`
/// when it holds the same content, else `Conflict`.
async fn lost(store: &UserScope<'_>, new: &NewDocument) -> Result<IngestedDocument, DocumentError> {
    let found = find(store, new.source.as_deref(), hash(new)).await?;
    match found.current {
        Some(current) if holds(&current.document, hash(new), &new.content_type) => {
            Ok(unchanged(current.document))
        }
        Some(_) => Err(StoreError::Conflict(
            "another ingest replaced this document meanwhile; ingest it again to keep this content"
                .into(),
        )
        .into()),
        None => Err(StoreError::Conflict(
            "the document was deleted while it was being ingested".into(),
        )
        .into()),
    }
}

fn chunk_memory(document: DocumentId, index: usize, text: &str) -> NewMemory {
    NewMemory {
        kind: MemoryKind::Document,
        content: text.to_string(),
        source: MemorySource::Import,
        // The user added the document; its author is not the user.
        trust: Trust::Document,
        importance: CHUNK_IMPORTANCE,
        thread_id: None,
        source_refs: vec![format!("doc:{document}"), format!("doc:{document}#{index}")],
        created_at: None,
        supersedes: None,
    }
}

/// Newest first, before an optional cursor.
pub(crate) async fn list(
    memory: &MemoryEngine,
    user: UserId,
    limit: i64,
    before: Option<DocumentId>,
) -> Result<Vec<Document>, DocumentError> {
    Ok(memory
        .store()
        .user(user)
        .list_documents(limit, before)
        .await?)
}

/// One chunk of a document: its number (from 0), the memory that holds it, its text.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct DocumentChunk {
    pub n: usize,
    #[schema(value_type = String, format = Uuid)]
    pub memory_id: MemoryId,
    pub content: String,
}

/// A document with its chunks in order. Another user's document is `NotFound`.
pub(crate) async fn get(
    memory: &MemoryEngine,
    user: UserId,
    id: DocumentId,
) -> Result<(Document, Vec<DocumentChunk>), DocumentError> {
    let store = memory.store();
    let document = store.user(user).get_document(id).await?;
    let ids = store.user(user).document_chunk_ids(id).await?;
    let mut chunks: Vec<DocumentChunk> = store
        .user(user)
        .memories_by_ids(&ids)
        .await?
        .into_iter()
        .map(|chunk| DocumentChunk {
            n: chunk_reference(&chunk.source_refs)
                .and_then(|(_, n)| n)
                .unwrap_or(usize::MAX),
            memory_id: chunk.id,
            content: chunk.content,
        })
        .collect();
    chunks.sort_by_key(|chunk| (chunk.n, chunk.memory_id));
    Ok((document, chunks))
}

/// Deletes a document and its chunk memories (from SQL and, through the memory log, from both
/// indexes); returns how many chunks went. Another user's document is `NotFound`.
pub(crate) async fn delete(
    memory: &MemoryEngine,
    user: UserId,
    id: DocumentId,
) -> Result<usize, DocumentError> {
    let store = memory.store();
    store.user(user).get_document(id).await?;
    let chunks = store.user(user).document_chunk_ids(id).await?;
    let deleted = delete_chunks(memory, user, &chunks).await?;
    // The row goes last, so a delete interrupted half-way can simply be repeated.
    store.user(user).delete_document(id).await?;
    Ok(deleted)
}

/// The media type without parameters, lowercased (`text/HTML; charset=utf-8` → `text/html`).
pub(crate) fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The given title, else the document's own (an HTML `<title>`), else its first line
/// (without a Markdown heading's `#`s).
fn pick_title(given: Option<&str>, extracted: Option<&str>, text: &str) -> String {
    let first_line = text
        .lines()
        .map(|line| line.trim().trim_start_matches('#').trim())
        .find(|line| !line.is_empty());
    let title = [given, extracted, first_line]
        .into_iter()
        .flatten()
        .map(|title| title.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|title| !title.is_empty())
        .unwrap_or_else(|| "untitled".to_string());
    crate::text::truncate(&title, MAX_TITLE_CHARS)
}

/// Snippet length of a `local` search hit, in characters.
const LOCAL_SNIPPET_CHARS: usize = 300;

/// The user's documents as research's `local` provider searches them: the memory engine's
/// hybrid recall restricted to `document` chunks; recall filters by the user in both indexes
/// and re-reads hits from SQL for that user.
pub struct DocumentCorpus {
    memory: Arc<MemoryEngine>,
}

impl DocumentCorpus {
    pub fn new(memory: Arc<MemoryEngine>) -> Self {
        Self { memory }
    }
}

fn local_error(error: MemoryError) -> SearchError {
    match error.kind() {
        ErrorKind::BadRequest => SearchError::Config(error.to_string()),
        _ => SearchError::Network(format!("local search failed: {error}")),
    }
}

#[async_trait::async_trait]
impl Corpus for DocumentCorpus {
    async fn search(
        &self,
        user: UserId,
        query: &str,
        k: usize,
    ) -> Result<Vec<SearchHit>, SearchError> {
        let k = k.clamp(1, self.memory.settings().max_k.max(1));
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
            let snippet = crate::text::prefix(&memory.content, LOCAL_SNIPPET_CHARS).to_string();
            hits.push(SearchHit {
                title,
                url,
                snippet,
                content: Some(memory.content),
                score: Some(result.score),
                provider: None,
            });
        }
        Ok(hits)
    }
}

/// The document and chunk a chunk memory's `source_refs` name (`doc:<id>`, `doc:<id>#<n>`).
pub(crate) fn chunk_reference(source_refs: &[String]) -> Option<(DocumentId, Option<usize>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_references_name_the_document_and_chunk() {
        let id = DocumentId::new();
        assert_eq!(
            chunk_reference(&[format!("doc:{id}"), format!("doc:{id}#7")]),
            Some((id, Some(7)))
        );
        assert_eq!(chunk_reference(&[format!("doc:{id}")]), Some((id, None)));
        assert_eq!(
            chunk_reference(&["https://x".into(), "doc:nope".into()]),
            None
        );
    }

    #[test]
    fn titles_come_from_the_caller_the_document_or_its_first_line() {
        assert_eq!(pick_title(Some(" Given "), Some("Html"), "line"), "Given");
        assert_eq!(pick_title(None, Some("Html title"), "line"), "Html title");
        assert_eq!(
            pick_title(Some("  "), None, "\n## Otters  of the bay\nbody"),
            "Otters of the bay"
        );
        assert_eq!(pick_title(None, None, ""), "untitled");
        assert_eq!(
            pick_title(None, None, &"长".repeat(300)).chars().count(),
            MAX_TITLE_CHARS + 1
        );
    }

    #[test]
    fn content_types_lose_their_parameters() {
        assert_eq!(essence("Text/HTML; charset=utf-8"), "text/html");
        assert_eq!(essence("application/pdf"), "application/pdf");
    }
}
