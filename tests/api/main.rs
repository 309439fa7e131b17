//! mnemo's integration tests, one binary: the real server on loopback (SQLite and PostgreSQL),
//! the `mnemo` binary itself, a fake web and a fake OpenAI server where the outside world would
//! be. Shared helpers are in `support`.

mod support;

mod abuse;
mod accounts;
mod attachments;
mod chat;
mod cli;
mod clients;
mod cluster;
mod crash;
mod deployment;
mod documents;
mod embedder;
mod engine;
mod eval;
mod http;
mod keywords;
mod memory;
mod memory_switch;
mod models;
mod quickstart;
mod quirks;
mod real_model;
mod relevance;
mod replicas;
mod research;
mod research_more;
mod retry;
mod ssrf;
mod takeover;
mod trust;
mod writer;
