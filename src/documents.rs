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

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ErrorKind, HasKind};
use crate::memory::{MemoryEngine, MemoryError};
use crate::search::extract::{self, ExtractError};
use crate::store::{
    Document, DocumentId, DocumentState, MemoryId, MemoryKind, MemorySource, NewDocument,
    NewMemory, StoreError, Trust, UserId, UserScope,
};

/// A chunk grows by whole paragraphs up to about this many characters…
pub const CHUNK_TARGET_CHARS: usize = 1000;
/// …may grow to this many when it is still short (under `CHUNK_MIN_CHARS`)…
pub const CHUNK_MAX_CHARS: usize = 1200;
const CHUNK_MIN_CHARS: usize = 800;
/// …and starts with about this much of the previous chunk's end, for context.
pub const CHUNK_OVERLAP_CHARS: usize = 150;
/// Extracted text above this is refused rather than embedded for minutes.
pub const MAX_DOCUMENT_CHARS: usize = 2_000_000;
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

/// What an ingest did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IngestStatus {
    /// A new document was stored.
    Created,
    /// The user has this document with the same content: nothing was written.
    Unchanged,
    /// The user's document with this source had other content (or an interrupted ingest had
    /// left it incomplete): its chunks were replaced, its id kept.
    Replaced,
}

impl IngestStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            IngestStatus::Created => "created",
            IngestStatus::Unchanged => "unchanged",
            IngestStatus::Replaced => "replaced",
        }
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
pub fn content_hash(bytes: &[u8]) -> String {
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
    let chunks = chunk(text);
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
pub async fn list(
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
pub struct DocumentChunk {
    pub n: usize,
    #[schema(value_type = String, format = Uuid)]
    pub memory_id: MemoryId,
    pub content: String,
}

/// A document with its chunks in order. Another user's document is `NotFound`.
pub async fn get(
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
            n: crate::search::chunk_reference(&chunk.source_refs)
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
pub async fn delete(
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
pub fn essence(content_type: &str) -> String {
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
    cut(&title, MAX_TITLE_CHARS)
}

fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Cuts text into chunks of whole paragraphs (blank-line separated): a chunk takes paragraphs
/// while it stays within `CHUNK_TARGET_CHARS` (or `CHUNK_MAX_CHARS` while shorter than
/// `CHUNK_MIN_CHARS`); a paragraph longer than a chunk is split at sentence ends, else at
/// spaces, else anywhere — always between characters, so Chinese text and other multi-byte
/// UTF-8 is never broken. Each chunk after the first starts with the last
/// `CHUNK_OVERLAP_CHARS` or so of the previous one. Lengths are counted in characters.
pub fn chunk(text: &str) -> Vec<String> {
    let mut pieces: Vec<&str> = Vec::new();
    for paragraph in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        split_long(paragraph, CHUNK_TARGET_CHARS, &mut pieces);
    }
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut current_chars = 0;
    for piece in pieces {
        let piece_chars = piece.chars().count();
        let joined = current_chars + 2 + piece_chars;
        let fits = current.is_empty()
            || joined <= CHUNK_TARGET_CHARS
            || (current_chars < CHUNK_MIN_CHARS && joined <= CHUNK_MAX_CHARS);
        if !fits {
            let overlap = overlap_of(&current);
            chunks.push(std::mem::take(&mut current));
            current = overlap;
            current_chars = current.chars().count();
        }
        if !current.is_empty() {
            current.push_str("\n\n");
            current_chars += 2;
        }
        current.push_str(piece);
        current_chars += piece_chars;
    }
    if !current.trim().is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Splits `paragraph` into pieces of at most `max` characters, preferring sentence ends.
pub(crate) fn split_long<'a>(paragraph: &'a str, max: usize, out: &mut Vec<&'a str>) {
    let mut rest = paragraph;
    while rest.chars().count() > max {
        let end = split_point(rest, max);
        let (head, tail) = rest.split_at(end);
        let head = head.trim();
        if !head.is_empty() {
            out.push(head);
        }
        rest = tail.trim_start();
    }
    if !rest.is_empty() {
        out.push(rest);
    }
}

/// A byte offset (on a char boundary) at which to cut `text` so the head has at most `max`
/// characters: after the last sentence end in the second half of that window, else at the
/// last whitespace there, else exactly at `max` characters.
fn split_point(text: &str, max: usize) -> usize {
    let window_end = text
        .char_indices()
        .nth(max)
        .map(|(index, _)| index)
        .unwrap_or(text.len());
    let window = &text[..window_end];
    let half = text
        .char_indices()
        .nth(max / 2)
        .map(|(index, _)| index)
        .unwrap_or(0);
    let mut sentence_end = None;
    let mut space = None;
    let mut previous: Option<char> = None;
    for (index, ch) in window.char_indices() {
        if index >= half {
            if matches!(ch, '。' | '！' | '？' | '；' | '…') {
                sentence_end = Some(index + ch.len_utf8());
            } else if ch.is_whitespace() {
                if matches!(previous, Some('.' | '!' | '?' | ';' | ':')) {
                    sentence_end = Some(index);
                }
                space = Some(index);
            }
        }
        previous = Some(ch);
    }
    sentence_end
        .or(space)
        .filter(|&end| end > 0)
        .unwrap_or(window_end)
}

/// The end of a chunk to repeat at the start of the next: about `CHUNK_OVERLAP_CHARS`
/// characters, starting after a space when there is one near the cut (so no half word).
fn overlap_of(chunk: &str) -> String {
    let total = chunk.chars().count();
    if total <= CHUNK_OVERLAP_CHARS {
        return String::new();
    }
    let start = chunk
        .char_indices()
        .nth(total - CHUNK_OVERLAP_CHARS)
        .map(|(index, _)| index)
        .unwrap_or(0);
    let tail = &chunk[start..];
    let tail = match tail
        .char_indices()
        .take(40)
        .find(|(_, ch)| ch.is_whitespace())
    {
        Some((index, _)) => &tail[index..],
        None => tail,
    };
    let tail = tail.trim();
    if tail.is_empty() {
        String::new()
    } else {
        format!("…{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn chunks_stay_bounded_and_lose_no_character(
            text in "([a-z]{1,12}|[\u{4e00}-\u{9fa5}]{1,40}|[ .。!\n]|\n\n){0,600}"
        ) {
            let chunks = chunk(&text);
            for piece in &chunks {
                proptest::prop_assert!(piece.chars().count() <= CHUNK_MAX_CHARS);
                proptest::prop_assert!(!piece.trim().is_empty());
            }
            // Chunking only drops whitespace and repeats overlaps: every other character
            // is kept at least as often as the text has it.
            let count = |s: &str| {
                let mut counts = std::collections::HashMap::new();
                for c in s.chars().filter(|c| !c.is_whitespace()) {
                    *counts.entry(c).or_insert(0usize) += 1;
                }
                counts
            };
            let joined = count(&chunks.concat());
            for (c, n) in count(&text) {
                proptest::prop_assert!(joined.get(&c).copied().unwrap_or(0) >= n, "{c:?} lost");
            }
        }
    }

    fn sentence(index: usize) -> String {
        format!("Sentence number {index} talks about the sea otter colony near the harbour. ")
    }

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(chunk("Hello.\n\nWorld."), vec!["Hello.\n\nWorld."]);
        assert!(chunk("  \n\n ").is_empty());
    }

    #[test]
    fn paragraphs_are_kept_whole_with_a_small_overlap() {
        let paragraphs: Vec<String> = (0..12)
            .map(|p| {
                (0..4)
                    .map(|s| sentence(p * 10 + s))
                    .collect::<String>()
                    .trim()
                    .to_string()
            })
            .collect();
        let text = paragraphs.join("\n\n");
        let chunks = chunk(&text);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        for (index, piece) in chunks.iter().enumerate() {
            let chars = piece.chars().count();
            assert!(chars <= CHUNK_MAX_CHARS, "chunk {index} has {chars} chars");
            if index + 1 < chunks.len() {
                assert!(
                    chars >= CHUNK_MIN_CHARS / 2,
                    "chunk {index} has only {chars} chars"
                );
            }
            if index > 0 {
                assert!(piece.starts_with('…'), "chunk {index} starts with overlap");
                let previous = &chunks[index - 1];
                let overlap = piece[3..].split("\n\n").next().unwrap();
                assert!(
                    previous.ends_with(overlap),
                    "overlap {overlap:?} ends chunk {}",
                    index - 1
                );
                assert!(overlap.chars().count() <= CHUNK_OVERLAP_CHARS);
            }
        }
        // Every paragraph appears whole in some chunk.
        for paragraph in &paragraphs {
            assert!(
                chunks.iter().any(|c| c.contains(paragraph.as_str())),
                "{paragraph}"
            );
        }
    }

    #[test]
    fn long_paragraphs_split_at_sentence_ends() {
        let paragraph: String = (0..60).map(sentence).collect::<String>().trim().to_string();
        let chunks = chunk(&paragraph);
        assert!(chunks.len() >= 4);
        for piece in &chunks {
            assert!(piece.chars().count() <= CHUNK_MAX_CHARS);
            let body = piece.rsplit("\n\n").next().unwrap();
            assert!(body.ends_with('.'), "cut at a sentence end: {body:?}");
        }
    }

    #[test]
    fn chinese_text_is_cut_between_characters() {
        let sentence = "海獭在港口附近的海藻林里生活，它们用石头敲开贝壳。";
        let paragraph = sentence.repeat(120);
        let text = format!(
            "标题：海獭\n\n{paragraph}\n\n{}",
            "没有标点的长段落".repeat(300)
        );
        let chunks = chunk(&text);
        assert!(chunks.len() > 3);
        let mut total = 0;
        for piece in &chunks {
            let chars = piece.chars().count();
            assert!(chars <= CHUNK_MAX_CHARS, "{chars}");
            total += chars;
        }
        assert!(total >= text.chars().count());
        // Sentence-bearing chunks end at a full stop.
        assert!(chunks[1].ends_with('。'), "{}", chunks[1]);
    }

    #[test]
    fn split_points_fall_on_char_boundaries() {
        for text in [
            "ééééééééééééééééé",
            "日本語のテキスト日本語のテキスト",
            "a b c d e f g h i j",
        ] {
            for max in 1..10 {
                let end = split_point(text, max);
                assert!(text.is_char_boundary(end));
                assert!(text[..end].chars().count() <= max);
                assert!(end > 0);
            }
        }
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
