//! API keys: `mnemo_` followed by 32 random bytes in hex. Only the SHA-256 of a key is stored,
//! with a short prefix for display; the plaintext is shown once, when the key is created.

use rand::RngCore;
use sha2::{Digest, Sha256};

pub(crate) const KEY_PREFIX: &str = "mnemo_";

/// A freshly generated key: the plaintext (shown once), its hash and display prefix.
pub struct NewKey {
    pub plaintext: String,
    pub hash: String,
    pub prefix: String,
}

pub fn generate() -> NewKey {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let plaintext = format!("{KEY_PREFIX}{}", hex::encode(bytes));
    NewKey {
        hash: hash(&plaintext),
        prefix: plaintext[..KEY_PREFIX.len() + 6].to_string(),
        plaintext,
    }
}

/// The stored form of a key.
pub(crate) fn hash(plaintext: &str) -> String {
    hex::encode(Sha256::digest(plaintext.as_bytes()))
}

/// Whether a bearer token has the shape of one of our API keys (as opposed to a JWT).
pub(crate) fn looks_like_key(token: &str) -> bool {
    token.starts_with(KEY_PREFIX)
        && token.len() == KEY_PREFIX.len() + 64
        && token[KEY_PREFIX.len()..]
            .bytes()
            .all(|byte| byte.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_unique_well_formed_and_hash_stably() {
        let first = generate();
        let second = generate();
        assert_ne!(first.plaintext, second.plaintext);
        assert!(looks_like_key(&first.plaintext));
        assert_eq!(hash(&first.plaintext), first.hash);
        assert_eq!(first.hash.len(), 64);
        assert!(!first.hash.contains(&first.plaintext[KEY_PREFIX.len()..]));
        assert!(first.plaintext.starts_with(&first.prefix));
    }

    #[test]
    fn only_key_shaped_tokens_look_like_keys() {
        for token in [
            "",
            "mnemo_",
            "mnemo_xyz",
            "eyJhbGciOiJIUzI1NiJ9.e30.sig",
            &format!("mnemo_{}", "g".repeat(64)),
        ] {
            assert!(!looks_like_key(token), "{token}");
        }
    }
}
