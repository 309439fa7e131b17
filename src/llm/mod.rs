//! Model-facing components: the `ChatModel` seam and its OpenAI-compatible implementation,
//! per-role models from configuration, prompts, and the text embedders.

pub mod chat;
pub mod embed;
pub(crate) mod embed_queue;
pub mod fit;
pub mod openai;
pub mod prompts;
pub mod roles;
pub mod schemas;
pub(crate) mod unigram;
