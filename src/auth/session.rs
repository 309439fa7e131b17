//! Browser sessions: a random token in the `mnemo_session` cookie, of which only the sha256 is
//! stored. A session lasts `SESSION_DAYS` from its last use (sliding; its row is touched at
//! most once a `TOUCH_EVERY`). The cookie's attributes are the HTTP layer's (`http::accounts`).

use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// The cookie's name.
pub(crate) const COOKIE_NAME: &str = "mnemo_session";
/// A session ends this long after its last use.
pub(crate) const SESSION_DAYS: i64 = 30;
/// A session's last use is written at most this often.
const TOUCH_EVERY_SECS: i64 = 60;

/// A fresh token (shown once, in the cookie) and its stored hash.
pub(crate) struct NewSession {
    pub token: String,
    pub hash: String,
    pub expires_at: DateTime<Utc>,
}

pub(crate) fn generate(now: DateTime<Utc>) -> NewSession {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    NewSession {
        hash: hash(&token),
        token,
        expires_at: expiry(now),
    }
}

/// When a session used at `now` ends.
pub(crate) fn expiry(now: DateTime<Utc>) -> DateTime<Utc> {
    now + Duration::days(SESSION_DAYS)
}

/// Whether a session last written at `last_seen` should be written again at `now`.
pub(crate) fn needs_touch(last_seen: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now - last_seen >= Duration::seconds(TOUCH_EVERY_SECS)
}

/// The stored form of a token.
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether a cookie value has the shape of a session token (64 hex digits).
pub(crate) fn looks_like_token(token: &str) -> bool {
    token.len() == 64 && token.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// The session token among `Cookie` header values, if one is there.
pub(crate) fn token_from_cookies<'a>(
    headers: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    headers
        .into_iter()
        .flat_map(|header| header.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim().trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_among_other_cookies() {
        let token = generate(Utc::now()).token;
        let header = format!("theme=dark; {COOKIE_NAME}={token}; other=1");
        assert_eq!(token_from_cookies([header.as_str()]), Some(token.as_str()));
        assert_eq!(token_from_cookies(["theme=dark", "a=b"]), None);
        assert_eq!(token_from_cookies(["x_mnemo_session=1"]), None);
    }

    #[test]
    fn tokens_are_random_and_only_their_hash_is_kept() {
        let now = Utc::now();
        let first = generate(now);
        let second = generate(now);
        assert_ne!(first.token, second.token);
        assert!(looks_like_token(&first.token));
        assert_eq!(hash(&first.token), first.hash);
        assert_ne!(first.hash, first.token);
        assert_eq!(first.expires_at, now + Duration::days(SESSION_DAYS));
        assert!(!needs_touch(now, now + Duration::seconds(5)));
        assert!(needs_touch(now, now + Duration::seconds(61)));
    }
}
