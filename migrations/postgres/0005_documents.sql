-- Documents a user ingested for local research (PostgreSQL). Their text is stored as chunk
-- memories (kind 'document', source_refs ["doc:<id>", "doc:<id>#<n>"]) that the memory log
-- indexes; this table keeps what a document list shows.
CREATE TABLE documents (
    id            UUID PRIMARY KEY,
    user_id       UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    title         TEXT NOT NULL,
    source        TEXT,
    content_type  TEXT NOT NULL,
    chars         BIGINT NOT NULL,
    chunks        BIGINT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX documents_user ON documents(user_id, id);
