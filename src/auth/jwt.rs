//! JWT bearer tokens: exactly one configured algorithm (HS256 with a shared secret, or RS256
//! with a public key), with `exp`, `aud`, `iss` and `sub` required. Tokens with `alg: none`,
//! another algorithm (algorithm confusion), a wrong key, a wrong audience or issuer, an
//! expired `exp`, an `nbf` still in the future, or a `sub` longer than [`MAX_SUBJECT_BYTES`]
//! (it becomes part of a user name) are refused.

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::config::JwtSettings;

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("invalid jwt configuration: {0}")]
    Config(String),
    #[error("invalid token")]
    Invalid,
}

/// The longest `sub` accepted.
pub(crate) const MAX_SUBJECT_BYTES: usize = 256;

#[derive(Debug, Deserialize)]
pub(crate) struct Claims {
    pub sub: String,
    pub iss: String,
}

pub(crate) struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl JwtVerifier {
    /// Builds a verifier from settings; `None` when no JWT key is configured.
    pub(crate) fn from_settings(settings: &JwtSettings) -> Result<Option<Self>, JwtError> {
        let (algorithm, key) = if let Some(secret) = &settings.hs256_secret {
            (
                Algorithm::HS256,
                DecodingKey::from_secret(secret.expose_secret().as_bytes()),
            )
        } else {
            let pem = match (&settings.rs256_public_key, &settings.rs256_public_key_file) {
                (Some(pem), _) => pem.clone(),
                (None, Some(path)) => std::fs::read_to_string(path).map_err(|error| {
                    JwtError::Config(format!("reading {}: {error}", path.display()))
                })?,
                (None, None) => return Ok(None),
            };
            let key = DecodingKey::from_rsa_pem(pem.as_bytes())
                .map_err(|error| JwtError::Config(format!("rs256 public key: {error}")))?;
            (Algorithm::RS256, key)
        };
        let (Some(audience), Some(issuer)) = (&settings.audience, &settings.issuer) else {
            return Err(JwtError::Config("audience and issuer are required".into()));
        };
        let mut validation = Validation::new(algorithm);
        validation.algorithms = vec![algorithm];
        validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
        validation.set_audience(&[audience]);
        validation.set_issuer(&[issuer]);
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = 30;
        Ok(Some(Self { key, validation }))
    }

    /// Verifies signature, algorithm and claims; any failure is the same opaque `Invalid`.
    pub(crate) fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let header = decode_header(token).map_err(|_| JwtError::Invalid)?;
        if !self.validation.algorithms.contains(&header.alg) {
            return Err(JwtError::Invalid);
        }
        let data =
            decode::<Claims>(token, &self.key, &self.validation).map_err(|_| JwtError::Invalid)?;
        let sub = &data.claims.sub;
        if sub.is_empty() || sub.len() > MAX_SUBJECT_BYTES || sub.contains('\0') {
            return Err(JwtError::Invalid);
        }
        Ok(data.claims)
    }
}
