-- Forgotten memories: what `forget` removed, kept restorable until `purge_after`, when the decay
-- job clears the content (snapshot, versions, embedding, request). The row stays as the record
-- of who forgot which memory, when, how (`via`: api, mcp, chat, cli) and whether it came
-- back (`restored_at`).
CREATE TABLE forgotten_memories (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    memory_id     BLOB NOT NULL,
    user_id       BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL,
    snapshot      TEXT,
    versions      TEXT,
    embedding     BLOB,
    request       TEXT,
    via           TEXT NOT NULL,
    forgotten_at  TEXT NOT NULL,
    purge_after   TEXT NOT NULL,
    restored_at   TEXT,
    purged_at     TEXT
);
CREATE INDEX forgotten_memories_user ON forgotten_memories(user_id, memory_id);
CREATE INDEX forgotten_memories_purge ON forgotten_memories(purge_after) WHERE purged_at IS NULL;
