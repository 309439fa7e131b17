-- A client's Idempotency-Key for the request that started a run, and a digest of that
-- request: a retry with the same key gets the same run instead of a second message and run.
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
ALTER TABLE runs ADD COLUMN request_digest TEXT;
CREATE UNIQUE INDEX runs_idempotency ON runs(user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Tokens the models used for each user's runs, per UTC day, for the daily token budget.
CREATE TABLE token_usage (
    user_id  UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    day      TEXT NOT NULL,
    tokens   BIGINT NOT NULL,
    PRIMARY KEY (user_id, day)
);
