-- Episodic memory: memory rows, their version history, the memory log that indexers follow,
-- and index watermarks (PostgreSQL).

CREATE TABLE memories (
    id                UUID PRIMARY KEY,
    user_id           UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL,
    content           TEXT NOT NULL,
    source            TEXT NOT NULL,
    trust             TEXT NOT NULL,
    importance        BIGINT NOT NULL,
    thread_id         UUID,
    source_refs       JSONB NOT NULL,
    valid_from        TIMESTAMPTZ NOT NULL,
    invalid_at        TIMESTAMPTZ,
    supersedes        UUID,
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL,
    last_accessed_at  TIMESTAMPTZ,
    access_count      BIGINT NOT NULL DEFAULT 0,
    archived_at       TIMESTAMPTZ,
    version           BIGINT NOT NULL DEFAULT 1,
    embedding         BYTEA NOT NULL,
    embedding_model   TEXT NOT NULL,
    embedding_dim     BIGINT NOT NULL
);
CREATE INDEX memories_user ON memories(user_id, id);
CREATE INDEX memories_model ON memories(embedding_model);

CREATE TABLE memory_versions (
    memory_id   UUID NOT NULL,
    version     BIGINT NOT NULL,
    user_id     UUID NOT NULL,
    change      TEXT NOT NULL,
    snapshot    JSONB NOT NULL,
    changed_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (memory_id, version)
);

-- Appends are serialised with a transaction-level advisory lock, so sequence numbers become
-- visible in order and an indexer reading "after its watermark" never skips one.
CREATE TABLE memory_log (
    seq         BIGSERIAL PRIMARY KEY,
    user_id     UUID NOT NULL,
    memory_id   UUID,
    op          TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE index_watermarks (
    name        TEXT PRIMARY KEY,
    seq         BIGINT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
