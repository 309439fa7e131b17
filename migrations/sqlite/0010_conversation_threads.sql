-- Threads that an OpenAI-compatible client's conversation maps to (`POST /v1/chat/completions`
-- without an `X-Mnemo-Thread` header): the key is a digest of the conversation's opening
-- messages, so every follow-up request of one conversation lands in the same thread.
ALTER TABLE threads ADD COLUMN conversation_key TEXT;
CREATE UNIQUE INDEX threads_user_conversation ON threads(user_id, conversation_key)
    WHERE conversation_key IS NOT NULL;
