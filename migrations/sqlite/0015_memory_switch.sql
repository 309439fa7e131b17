-- A temporary chat neither recalls nor stores memories; a user's memory switch, off, makes
-- every chat of theirs behave so (what is already remembered stays, untouched).
ALTER TABLE threads ADD COLUMN temporary INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN memory_enabled INTEGER NOT NULL DEFAULT 1;
