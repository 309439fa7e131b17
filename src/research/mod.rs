//! Deep research: the workflow (brief → supervisor → parallel researchers → compression →
//! cited report), search providers, safe page fetching and text extraction.

pub mod documents;
pub mod extract;
pub mod search;
