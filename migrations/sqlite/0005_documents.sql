-- Documents a user ingested for local research (SQLite). Their text is stored as chunk
-- memories (kind 'document', source_refs ["doc:<id>", "doc:<id>#<n>"]) that the memory log
-- indexes; this table keeps what a document list shows.
CREATE TABLE documents (
    id            BLOB PRIMARY KEY NOT NULL,
    user_id       BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    title         TEXT NOT NULL,
    source        TEXT,
    content_type  TEXT NOT NULL,
    chars         INTEGER NOT NULL,
    chunks        INTEGER NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE INDEX documents_user ON documents(user_id, id);
