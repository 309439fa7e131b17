-- The user's documents a message attaches (`[{"document_id", "title"}]`, JSON text), read by
-- the turn answering it; NULL when it attaches none.
ALTER TABLE messages ADD COLUMN attachments TEXT;
