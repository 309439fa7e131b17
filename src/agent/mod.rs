//! What executes runs: the chat turn (`chat`), with deep research to come.

pub mod chat;
