//! mnemo: a self-hosted research assistant that remembers.
//!
//! Code map:
//! - `enums`     `text_enum!`: enums spelled as a closed set of words (settings, columns, wire)
//! - `config`    layered settings (defaults → mnemo.toml → `MNEMO__SECTION__KEY` → flags)
//! - `telemetry` the tracing subscriber
//! - `datadir`   the data directory's lock: who holds it, where a server on it listens
//! - `startup`   builds `AppState` from settings; `serve(listener, state)` with ordered shutdown
//! - `http`      router, `ApiError`, extractors, SSE, one file per resource, OpenAPI and /docs
//! - `auth`      API keys, JWT, passwords and browser sessions, the `AuthUser` that alone yields a `UserId`
//! - `index`     derived indexes: vector (Qdrant Edge / server), keyword (tantivy), indexer, decay
//! - `llm`       embedders (local BERT on our encoder, OpenAI-compatible)
//! - `memory`    episodic memory: writes, hybrid recall (RRF + decay), export/import, decay job
//! - `research`  deep research: the request, the workflow (brief → supervisor → researchers → report)
//! - `retry`     the one retry policy of outside calls (models, embedders, search, run logs)
//! - `search`    search providers (one file each), the SSRF-safe fetcher
//! - `text`      shared text helpers: scripts, sentences, splitting, truncation, HTML/PDF → text
//! - `documents` the user's own documents: extract → paragraph chunks → `document` memories
//! - `runs`      durable runs: the run-event log, live following, cancellation
//! - `agent`     what executes runs: the chat turn (tool loop over memory tools)
//! - `store`     the `Store` trait (SQL source of truth), SQLite and PostgreSQL implementations
//!
//! The facade: the `pub mod` list below is the library's whole public surface, the modules the
//! binary (`src/main.rs`, `cli/`, `tools/`), `tests/api` and `benches/` use. Inside them only
//! what those name, and the types their signatures carry, is `pub`; the rest of the crate is
//! `pub(crate)`, so rustc's dead-code lint sees whatever nothing uses. `scripts/check-invariants`
//! keeps the list as it is here.

// Crate-private: nothing outside the library names them.
pub(crate) mod agent;
pub(crate) mod enums;
pub(crate) mod mcp;

// The facade.
pub mod auth;
pub mod config;
pub mod datadir;
pub mod documents;
pub mod error;
pub mod http;
pub mod index;
pub mod llm;
pub mod memory;
pub mod research;
pub mod retry;
pub mod runs;
pub mod search;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod text;

/// Fresh test databases, shared with the integration tests (compiled only for tests).
#[cfg(test)]
#[path = "../tests/api/support/databases.rs"]
mod testing;
