//! The error vocabulary every layer shares: a closed set of [`ErrorKind`]s and the
//! [`HasKind`] trait through which each layer's error reports its kind. `http::ApiError` maps a
//! kind to a status with one exhaustive `match`; events and job retries use it to tell a
//! client's mistake from a passing fault.

/// What went wrong, in words every layer understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The caller sent something unusable; retrying the same request fails again.
    BadRequest,
    Unauthenticated,
    /// Authenticated or not, this caller may not do this (e.g. a foreign browser origin).
    Forbidden,
    NotFound,
    /// The HTTP method is not served on this path.
    MethodNotAllowed,
    Conflict,
    PayloadTooLarge,
    RateLimited,
    /// The server has no capacity for the request right now (every database connection is
    /// taken); nothing of it was done, and retrying in a moment may work.
    Busy,
    Timeout,
    /// A backend is down or overloaded; retrying later may work.
    Unavailable,
    /// This server is not set up to do it (a font or another component it needs is not
    /// installed); the message says what is missing, and retrying will not help.
    Unsupported,
    /// A bug or a corrupt state; never the caller's fault.
    Internal,
}

impl ErrorKind {
    /// Whether trying the same thing again later may succeed.
    pub(crate) fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Busy | ErrorKind::Timeout | ErrorKind::Unavailable
        )
    }

    /// The stable lowercase name used in API error bodies.
    pub(crate) fn code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::Conflict => "conflict",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Busy => "busy",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An error that knows its [`ErrorKind`].
pub trait HasKind {
    fn kind(&self) -> ErrorKind;
    /// For a refusal that ends at a known time: the seconds until a retry may succeed.
    fn retry_after(&self) -> Option<u64> {
        None
    }
}

impl ErrorKind {
    /// What a client may be told of an error of this kind: the error's own message for the
    /// client's mistakes, a fixed text for the server's faults, whose messages can name
    /// database or backend details.
    pub(crate) fn public_message(self, message: &str) -> String {
        match self {
            ErrorKind::Unavailable => "a backend is unavailable, try again later".to_string(),
            ErrorKind::Busy => "the server is busy, try again in a moment".to_string(),
            ErrorKind::Timeout => "the request timed out".to_string(),
            ErrorKind::Internal => "internal error".to_string(),
            _ => message.to_string(),
        }
    }
}

/// [`ErrorKind::public_message`] of `error`; a server fault is logged with its real message,
/// which the client does not see.
pub(crate) fn public_message<E: HasKind + std::fmt::Display>(error: &E) -> String {
    let kind = error.kind();
    let public = kind.public_message(&error.to_string());
    if matches!(
        kind,
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Internal
    ) {
        tracing::error!(%error, code = kind.code(), "an operation failed");
    }
    public
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_passing_faults_are_retryable() {
        let retryable: Vec<ErrorKind> = [
            ErrorKind::BadRequest,
            ErrorKind::Unauthenticated,
            ErrorKind::Forbidden,
            ErrorKind::NotFound,
            ErrorKind::MethodNotAllowed,
            ErrorKind::Conflict,
            ErrorKind::PayloadTooLarge,
            ErrorKind::RateLimited,
            ErrorKind::Busy,
            ErrorKind::Timeout,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ]
        .into_iter()
        .filter(|kind| kind.retryable())
        .collect();
        assert_eq!(
            retryable,
            [
                ErrorKind::RateLimited,
                ErrorKind::Busy,
                ErrorKind::Timeout,
                ErrorKind::Unavailable
            ]
        );
    }
}
