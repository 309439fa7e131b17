-- Accounts for the web app: a password (an argon2id PHC string, never the password), an admin
-- flag, a disabled mark, and the failed sign-ins that lock a name for a while. A session is a
-- browser's sign-in: only the sha256 of its cookie's token is stored. `account_setup` holds
-- one row once the first admin was made from the browser, so a second setup cannot race in.
ALTER TABLE users ADD COLUMN password_hash TEXT;
ALTER TABLE users ADD COLUMN is_admin BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE users ADD COLUMN disabled_at TIMESTAMPTZ;
ALTER TABLE users ADD COLUMN failed_logins BIGINT NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN locked_until TIMESTAMPTZ;

CREATE TABLE sessions (
    token_hash    TEXT PRIMARY KEY,
    user_id       UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at    TIMESTAMPTZ NOT NULL,
    last_seen_at  TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX sessions_user ON sessions(user_id);

CREATE TABLE account_setup (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    user_id     UUID NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  TIMESTAMPTZ NOT NULL
);
