-- Who wrote a message, when it is known (an imported transcript names its speakers).
ALTER TABLE messages ADD COLUMN author TEXT;
-- Turn memories are ordered within their thread; views find a turn's neighbours this way.
CREATE INDEX memories_thread_turns ON memories(thread_id, created_at, id);
