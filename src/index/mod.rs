//! Derived retrieval indexes, rebuilt from SQL at will: the `VectorIndex` trait with its Qdrant
//! Edge (embedded) and Qdrant server backends, the tantivy keyword index, the indexer that
//! follows the memory log, and the pure decay factor.

pub(crate) mod decay;
pub mod edge;
pub mod indexer;
pub mod keyword;
pub(crate) mod qdrant;
pub mod vector;
pub(crate) mod views;
