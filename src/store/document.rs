//! Documents a user ingested for local research, as the SQL store sees them. The text itself
//! is stored as chunk memories of kind `document`; a document row keeps what a list shows.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ids::DocumentId;

/// An ingested document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Document {
    #[schema(value_type = String, format = Uuid)]
    pub id: DocumentId,
    pub title: String,
    /// Where the document came from (a file path or URL), as the client said.
    pub source: Option<String>,
    /// The content type it was extracted as, e.g. `text/markdown` or `application/pdf`.
    pub content_type: String,
    /// Characters of extracted text.
    pub chars: i64,
    /// Chunk memories made from it.
    pub chunks: i64,
    pub created_at: DateTime<Utc>,
}

/// A document to insert.
#[derive(Debug, Clone)]
pub struct NewDocument {
    pub title: String,
    pub source: Option<String>,
    pub content_type: String,
    pub chars: i64,
    pub chunks: i64,
}
