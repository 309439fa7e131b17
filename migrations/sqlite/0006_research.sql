-- Deep-research records: the request, its resolved configuration and what it produced. The
-- live progress is in the run-event log of `run_id`; this row is the durable result.
CREATE TABLE research (
    id            BLOB PRIMARY KEY NOT NULL,
    user_id       BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    run_id        BLOB NOT NULL,
    thread_id     BLOB,
    query         TEXT NOT NULL,
    model         TEXT,
    status        TEXT NOT NULL,
    config        TEXT NOT NULL,
    report        TEXT,
    sources       TEXT NOT NULL,
    usage         TEXT NOT NULL,
    stage_timings TEXT NOT NULL,
    word_count    INTEGER NOT NULL DEFAULT 0,
    source_count  INTEGER NOT NULL DEFAULT 0,
    duration_ms   INTEGER,
    error         TEXT,
    created_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX research_by_user ON research(user_id, created_at);
