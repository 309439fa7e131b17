-- Who wrote a message, when it is known (an imported transcript names its speakers).
ALTER TABLE messages ADD COLUMN author TEXT;
-- Turn memories are ordered within their thread; views find a turn's neighbours this way.
CREATE INDEX memories_thread_turns ON memories(thread_id, created_at, id);
-- The context view's vector of a turn memory (the turn with its neighbours, embedded), kept
-- apart from the memory row: a new neighbour replaces it without rewriting the memory.
CREATE TABLE memory_contexts (
    memory_id        BLOB PRIMARY KEY NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    user_id          BLOB NOT NULL,
    embedding        BLOB NOT NULL,
    embedding_model  TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
