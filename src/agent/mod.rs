//! Agents that execute runs. For now the chat turn is answered by `echo`, a placeholder until
//! the model-backed chat agent lands; it exercises the real run, event log and SSE machinery.

pub mod echo;
