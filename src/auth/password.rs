//! Passwords: argon2id (the `argon2` crate's defaults: 19 MiB, 2 passes, 1 lane) stored as a
//! PHC string. Hashing is CPU-heavy, so it runs on the blocking pool, at most a few at once
//! (a burst of sign-ins waits rather than taking every core). A sign-in for an unknown name
//! verifies against a dummy hash, so it costs as long as one for a known name.

use std::sync::LazyLock;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Semaphore;

/// Shortest and longest passwords accepted (in characters).
pub(crate) const MIN_PASSWORD_CHARS: usize = 8;
pub(crate) const MAX_PASSWORD_CHARS: usize = 1024;

/// Hashes running at once, across the process.
static HASHING: Semaphore = Semaphore::const_new(2);

/// A hash of a random password, verified against for names that have none.
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    hash_now(&hex::encode(bytes)).unwrap_or_default()
});

/// Whether a password is acceptable; `Err` says why not.
pub(crate) fn validate_password(password: &str) -> Result<(), String> {
    let chars = password.chars().count();
    if chars < MIN_PASSWORD_CHARS {
        return Err(format!(
            "the password is too short: use at least {MIN_PASSWORD_CHARS} characters"
        ));
    }
    if chars > MAX_PASSWORD_CHARS {
        return Err(format!(
            "the password is too long: use at most {MAX_PASSWORD_CHARS} characters"
        ));
    }
    if password.contains('\0') {
        return Err("the password must not contain NUL characters".into());
    }
    Ok(())
}

fn hash_now(password: &str) -> Result<String, argon2::password_hash::Error> {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt)?;
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

fn verify_now(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// The argon2id PHC string of `password`.
pub async fn hash(password: &SecretString) -> Result<String, PasswordError> {
    let password = password.clone();
    let _permit = HASHING.acquire().await.map_err(|_| PasswordError)?;
    tokio::task::spawn_blocking(move || hash_now(password.expose_secret()))
        .await
        .map_err(|_| PasswordError)?
        .map_err(|_| PasswordError)
}

/// Whether `password` matches `hash`; with no hash (an unknown name, a user without a
/// password), verifies against the dummy hash and says no.
pub(crate) async fn verify(password: &SecretString, hash: Option<&str>) -> bool {
    let password = password.clone();
    let hash = hash.map(str::to_string);
    let real = hash.is_some();
    let Ok(_permit) = HASHING.acquire().await else {
        return false;
    };
    let matched = tokio::task::spawn_blocking(move || {
        let hash = hash.as_deref().unwrap_or(DUMMY_HASH.as_str());
        verify_now(password.expose_secret(), hash)
    })
    .await
    .unwrap_or(false);
    matched && real
}

/// Hashing failed (never the password's fault).
#[derive(Debug, thiserror::Error)]
#[error("hashing the password failed")]
pub struct PasswordError;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_is_argon2id_and_verifies_only_its_password() {
        let password = SecretString::from("correct horse battery");
        let hashed = hash(&password).await.expect("hash");
        assert!(hashed.starts_with("$argon2id$"), "{hashed}");
        assert!(!hashed.contains("correct horse"));
        assert!(verify(&password, Some(&hashed)).await);
        assert!(!verify(&SecretString::from("wrong horse battery"), Some(&hashed)).await);
        assert!(!verify(&password, None).await);
        assert!(!verify(&password, Some("not a phc string")).await);
        assert_ne!(hash(&password).await.expect("hash"), hashed, "salted");
    }

    #[test]
    fn passwords_are_checked_for_length() {
        assert!(validate_password("short").is_err());
        assert!(validate_password("long enough").is_ok());
        assert!(validate_password(&"x".repeat(MAX_PASSWORD_CHARS + 1)).is_err());
    }
}
