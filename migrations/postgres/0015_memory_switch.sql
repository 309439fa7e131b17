-- A temporary chat neither recalls nor stores memories; a user's memory switch, off, makes
-- every chat of theirs behave so (what is already remembered stays, untouched).
ALTER TABLE threads ADD COLUMN temporary BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE users ADD COLUMN memory_enabled BOOLEAN NOT NULL DEFAULT TRUE;
