//! Model-facing components: the text embedders (local candle BERT and OpenAI-compatible).

pub mod embed;
