-- Users, API keys, threads, messages, runs and the run-event log (SQLite).
-- Timestamps are RFC 3339 text in UTC (microsecond precision), ids are UUIDs as 16-byte blobs.

CREATE TABLE users (
    id          BLOB PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL UNIQUE,
    kind        TEXT NOT NULL,
    created_at  TEXT NOT NULL
);

CREATE TABLE api_keys (
    id           BLOB PRIMARY KEY NOT NULL,
    user_id      BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    key_hash     TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    revoked_at   TEXT
);
CREATE INDEX api_keys_user ON api_keys(user_id);

CREATE TABLE threads (
    id          BLOB PRIMARY KEY NOT NULL,
    user_id     BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    title       TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX threads_user ON threads(user_id, id);

CREATE TABLE runs (
    id           BLOB PRIMARY KEY NOT NULL,
    user_id      BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    thread_id    BLOB REFERENCES threads(id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL,
    error        TEXT,
    last_seq     INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    finished_at  TEXT
);
CREATE INDEX runs_user ON runs(user_id, kind, id);
CREATE INDEX runs_status ON runs(status);

CREATE TABLE messages (
    id          BLOB PRIMARY KEY NOT NULL,
    thread_id   BLOB NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
    user_id     BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    run_id      BLOB,
    created_at  TEXT NOT NULL
);
CREATE INDEX messages_thread ON messages(thread_id, id);

CREATE TABLE run_events (
    run_id      BLOB NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    event_type  TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
