//! Documents a user ingested for local research, as the SQL store sees them. The text itself
//! is stored as chunk memories of kind `document`; a document row keeps what a list shows and
//! what identifies the document for the next ingest: its source and a hash of its content.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ids::DocumentId;

/// An ingested document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Document {
    #[schema(value_type = String, format = Uuid)]
    pub id: DocumentId,
    pub title: String,
    /// Where the document came from (a file path or URL), as the client said. A user has at
    /// most one document per source: ingesting the source again keeps or replaces it.
    pub source: Option<String>,
    /// The content type it was extracted as, e.g. `text/markdown` or `application/pdf`.
    pub content_type: String,
    /// sha256 of the bytes ingested, in lowercase hex (what `sha256sum` prints for the file;
    /// for an inline JSON document, of its `content` in UTF-8). Absent on documents ingested
    /// before content hashes were kept.
    #[serde(default)]
    pub content_hash: Option<String>,
    /// Characters of extracted text.
    pub chars: i64,
    /// Chunk memories made from it.
    pub chunks: i64,
    pub created_at: DateTime<Utc>,
}

/// A document to insert, or what a claimed document is to describe.
#[derive(Debug, Clone)]
pub struct NewDocument {
    pub title: String,
    pub source: Option<String>,
    pub content_type: String,
    pub content_hash: Option<String>,
    pub chars: i64,
    pub chunks: i64,
}

impl From<&Document> for NewDocument {
    fn from(document: &Document) -> Self {
        Self {
            title: document.title.clone(),
            source: document.source.clone(),
            content_type: document.content_type.clone(),
            content_hash: document.content_hash.clone(),
            chars: document.chars,
            chunks: document.chunks,
        }
    }
}

/// A document row as ingestion sees it: which ingest claimed it last and whether that one
/// wrote every chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentState {
    pub document: Document,
    /// How many ingests claimed the row (0: only the one that inserted it). A claim names the
    /// generation it saw, and only one claim of a generation succeeds.
    pub generation: i64,
    /// The ingest of this generation wrote every chunk. False while it writes them, or when it
    /// died doing so.
    pub complete: bool,
}
