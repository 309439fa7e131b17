//! What executes runs: the chat turn (`chat`); deep research lives in `crate::research`.

pub(crate) mod chat;
