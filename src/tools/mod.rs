//! Commands of the `mnemo` binary that are not the server: the memory-quality evaluation
//! (`mnemo eval`) and the benchmarks (`mnemo bench recall|write|ingest|replicas|extract`). They drive the server
//! library through its public API, so the library itself carries none of their code.

pub mod bench;
pub mod bench_extract;
pub mod bench_ingest;
pub mod bench_replicas;
pub mod bench_server;
pub mod bench_write;
pub mod eval;
/// Qdrant peers on loopback: the integration tests' helper, compiled in for
/// `mnemo bench replicas --qdrant-bin` (the tests use more of it).
#[allow(dead_code)]
#[path = "../../tests/api/support/qdrant_cluster.rs"]
pub mod qdrant_cluster;
pub mod stats;
