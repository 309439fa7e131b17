-- The durable job queue of the background memory writer (PostgreSQL; claimed with
-- FOR UPDATE SKIP LOCKED so several replicas can share it).
CREATE TABLE jobs (
    id            UUID PRIMARY KEY,
    user_id       UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL,
    -- The run that produced the job; the job waits until that run has ended.
    run_id        UUID,
    key           TEXT NOT NULL UNIQUE,
    payload       JSONB NOT NULL,
    status        TEXT NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    run_after     TIMESTAMPTZ NOT NULL,
    locked_until  TIMESTAMPTZ,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    finished_at   TIMESTAMPTZ
);
CREATE INDEX jobs_ready ON jobs(status, run_after);
