-- Rolling summaries of the older part of a thread (working memory).
CREATE TABLE thread_summaries (
    thread_id     UUID PRIMARY KEY REFERENCES threads(id) ON DELETE CASCADE,
    user_id       UUID NOT NULL,
    summary       TEXT NOT NULL,
    covered_until UUID NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);
