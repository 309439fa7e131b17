-- Users, API keys, threads, messages, runs and the run-event log (PostgreSQL).

CREATE TABLE users (
    id          UUID PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    kind        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE api_keys (
    id           UUID PRIMARY KEY,
    user_id      UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    key_hash     TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_keys_user ON api_keys(user_id);

CREATE TABLE threads (
    id          UUID PRIMARY KEY,
    user_id     UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    title       TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX threads_user ON threads(user_id, id);

CREATE TABLE runs (
    id           UUID PRIMARY KEY,
    user_id      UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    thread_id    UUID REFERENCES threads(id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    status       TEXT NOT NULL,
    error        TEXT,
    last_seq     BIGINT NOT NULL DEFAULT 0,
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL,
    finished_at  TIMESTAMPTZ
);
CREATE INDEX runs_user ON runs(user_id, kind, id);
CREATE INDEX runs_running ON runs(status) WHERE status = 'running';

CREATE TABLE messages (
    id          UUID PRIMARY KEY,
    thread_id   UUID NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
    user_id     UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    run_id      UUID,
    created_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX messages_thread ON messages(thread_id, id);

CREATE TABLE run_events (
    run_id      UUID NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    event_type  TEXT NOT NULL,
    data        JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, seq)
);
