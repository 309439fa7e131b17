-- The user's documents a message attaches (`[{"document_id", "title"}]`), read by the turn
-- answering it; NULL when it attaches none.
ALTER TABLE messages ADD COLUMN attachments JSONB;
