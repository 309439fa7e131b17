-- Deep-research records: the request, its resolved configuration and what it produced. The
-- live progress is in the run-event log of `run_id`; this row is the durable result.
CREATE TABLE research (
    id            UUID PRIMARY KEY,
    user_id       UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    run_id        UUID NOT NULL,
    thread_id     UUID,
    query         TEXT NOT NULL,
    model         TEXT,
    status        TEXT NOT NULL,
    config        JSONB NOT NULL,
    report        TEXT,
    sources       JSONB NOT NULL,
    usage         JSONB NOT NULL,
    stage_timings JSONB NOT NULL,
    word_count    BIGINT NOT NULL DEFAULT 0,
    source_count  BIGINT NOT NULL DEFAULT 0,
    duration_ms   BIGINT,
    error         TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    finished_at   TIMESTAMPTZ
);
CREATE INDEX research_by_user ON research(user_id, created_at);
