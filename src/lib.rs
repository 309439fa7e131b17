//! mnemo: a self-hosted research assistant that remembers.
//!
//! Code map:
//! - `config`    layered settings (defaults → mnemo.toml → `MNEMO__SECTION__KEY` → flags)
//! - `telemetry` the tracing subscriber
//! - `startup`   builds `AppState` from settings; `serve(listener, state)` with ordered shutdown
//! - `http`      router, `ApiError`, extractors, SSE, one file per resource, OpenAPI and /docs
//! - `auth`      API keys, JWT, the `AuthUser` extractor that alone yields a `UserId`
//! - `index`     derived indexes: vector (Qdrant Edge / server), keyword (tantivy), indexer, RRF
//! - `llm`       embedders (local candle BERT, OpenAI-compatible)
//! - `memory`    episodic memory: writes, hybrid recall (RRF + decay), export/import, decay job
//! - `research`  deep research: workflow, search providers, SSRF-safe fetcher, text extraction
//! - `runs`      durable runs: the run-event log, live following, cancellation
//! - `agent`     what executes runs: the chat turn (tool loop over memory tools)
//! - `store`     the `Store` trait (SQL source of truth), SQLite and PostgreSQL implementations
//! - `cli`       the `mnemo` command line (thin `main.rs` calls it)
//! - `bench`     `mnemo bench recall`: ingest, reindex, recall-latency and index-lag benchmark at scale
//! - `eval`      `mnemo eval locomo`: memory-quality evaluation (evidence recall@k, NDCG@k) on LoCoMo / LongMemEval
//! - `bench_write` `mnemo bench write`: end of turn → recallable latency, writer throughput
//! - `testing`   helpers shared by unit and integration tests (fresh databases)

pub mod agent;
pub mod auth;
pub mod bench;
pub mod bench_write;
pub mod cli;
pub mod config;
pub mod eval;
pub mod http;
pub mod index;
pub mod llm;
pub mod memory;
pub mod research;
pub mod runs;
pub mod startup;
pub mod store;
pub mod telemetry;
#[doc(hidden)]
pub mod testing;
