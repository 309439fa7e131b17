-- Episodic memory: memory rows, their version history, the memory log that indexers follow,
-- and index watermarks (SQLite).

CREATE TABLE memories (
    id                BLOB PRIMARY KEY NOT NULL,
    user_id           BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL,
    content           TEXT NOT NULL,
    source            TEXT NOT NULL,
    trust             TEXT NOT NULL,
    importance        INTEGER NOT NULL,
    thread_id         BLOB,
    source_refs       TEXT NOT NULL,
    valid_from        TEXT NOT NULL,
    invalid_at        TEXT,
    supersedes        BLOB,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    last_accessed_at  TEXT,
    access_count      INTEGER NOT NULL DEFAULT 0,
    archived_at       TEXT,
    version           INTEGER NOT NULL DEFAULT 1,
    embedding         BLOB NOT NULL,
    embedding_model   TEXT NOT NULL,
    embedding_dim     INTEGER NOT NULL
);
CREATE INDEX memories_user ON memories(user_id, id);
CREATE INDEX memories_model ON memories(embedding_model);

CREATE TABLE memory_versions (
    memory_id   BLOB NOT NULL,
    version     INTEGER NOT NULL,
    user_id     BLOB NOT NULL,
    change      TEXT NOT NULL,
    snapshot    TEXT NOT NULL,
    changed_at  TEXT NOT NULL,
    PRIMARY KEY (memory_id, version)
);

CREATE TABLE memory_log (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id     BLOB NOT NULL,
    memory_id   BLOB,
    op          TEXT NOT NULL,
    created_at  TEXT NOT NULL
);

CREATE TABLE index_watermarks (
    name        TEXT PRIMARY KEY NOT NULL,
    seq         INTEGER NOT NULL,
    updated_at  TEXT NOT NULL
);
