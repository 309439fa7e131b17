-- Accounts for the web app: a password (an argon2id PHC string, never the password), an admin
-- flag, a disabled mark, and the failed sign-ins that lock a name for a while. A session is a
-- browser's sign-in: only the sha256 of its cookie's token is stored. `account_setup` holds
-- one row once the first admin was made from the browser, so a second setup cannot race in.
ALTER TABLE users ADD COLUMN password_hash TEXT;
ALTER TABLE users ADD COLUMN is_admin INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN disabled_at TEXT;
ALTER TABLE users ADD COLUMN failed_logins INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN locked_until TEXT;

CREATE TABLE sessions (
    token_hash    TEXT PRIMARY KEY NOT NULL,
    user_id       BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at    TEXT NOT NULL,
    last_seen_at  TEXT NOT NULL,
    expires_at    TEXT NOT NULL
);
CREATE INDEX sessions_user ON sessions(user_id);

CREATE TABLE account_setup (
    singleton   INTEGER PRIMARY KEY NOT NULL CHECK (singleton = 1),
    user_id     BLOB NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  TEXT NOT NULL
);
