-- How far a message's text is trusted (NULL: by its role, as before): a reply that read web
-- pages, documents or tool results is below the assistant's own word.
ALTER TABLE messages ADD COLUMN trust TEXT;

-- Chunks of the user's documents were stored at the user's trust; their author is not the
-- user.
UPDATE memories SET trust = 'document' WHERE kind = 'document' AND trust = 'user';
