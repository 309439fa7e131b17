-- Forgotten memories: what `forget` removed, kept restorable until `purge_after`, when the decay
-- job clears the content (snapshot, versions, embedding, request). The row stays as the record
-- of who forgot which memory, when, how (`via`: api, mcp, chat, cli) and whether it came
-- back (`restored_at`).
CREATE TABLE forgotten_memories (
    id            BIGSERIAL PRIMARY KEY,
    memory_id     UUID NOT NULL,
    user_id       UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL,
    snapshot      JSONB,
    versions      JSONB,
    embedding     BYTEA,
    request       TEXT,
    via           TEXT NOT NULL,
    forgotten_at  TIMESTAMPTZ NOT NULL,
    purge_after   TIMESTAMPTZ NOT NULL,
    restored_at   TIMESTAMPTZ,
    purged_at     TIMESTAMPTZ
);
CREATE INDEX forgotten_memories_user ON forgotten_memories(user_id, memory_id);
CREATE INDEX forgotten_memories_purge ON forgotten_memories(purge_after) WHERE purged_at IS NULL;
