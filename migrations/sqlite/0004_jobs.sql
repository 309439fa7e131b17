-- The durable job queue of the background memory writer (SQLite).
CREATE TABLE jobs (
    id            BLOB PRIMARY KEY NOT NULL,
    user_id       BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL,
    -- The run that produced the job; the job waits until that run has ended.
    run_id        BLOB,
    key           TEXT NOT NULL UNIQUE,
    payload       TEXT NOT NULL,
    status        TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    run_after     TEXT NOT NULL,
    locked_until  TEXT,
    last_error    TEXT,
    created_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX jobs_ready ON jobs(status, run_after);
