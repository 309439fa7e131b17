//! Derived retrieval indexes, rebuilt from SQL at will: the `VectorIndex` trait with its Qdrant
//! Edge (embedded) and Qdrant server backends, the tantivy keyword index, the indexer that
//! follows the memory log, and pure ranking helpers (RRF, decay).

pub mod edge;
pub mod indexer;
pub mod keyword;
pub(crate) mod qdrant;
pub(crate) mod rrf;
pub mod vector;
pub(crate) mod views;
