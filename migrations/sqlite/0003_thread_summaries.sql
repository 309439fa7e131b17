-- Rolling summaries of the older part of a thread (working memory).
CREATE TABLE thread_summaries (
    thread_id     BLOB PRIMARY KEY NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
    user_id       BLOB NOT NULL,
    summary       TEXT NOT NULL,
    covered_until BLOB NOT NULL,
    updated_at    TEXT NOT NULL
);
