//! One retry policy for every call to something outside the process that can fail for a
//! moment: chat models, remote embedders, search providers, and the store's reads of a run's
//! log. [`RetryPolicy`] is backon's exponential backoff with full jitter (so many clients
//! refused together do not come back together), a ceiling on each wait, and the server's own
//! `Retry-After` when it sent one (cut to [`MAX_RETRY_AFTER`]). Which errors are worth another
//! try is the caller's to say ([`Attempt`]); everything else fails at once.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};

/// The longest wait a server's `Retry-After` may impose on one retry; a longer request is cut
/// to this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The wait a server asked for in its `Retry-After` header (seconds; at most an hour is
/// read, and [`RetryPolicy::run`] cuts it further to [`MAX_RETRY_AFTER`]).
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let seconds: f64 = value.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(3600.0)))
}

/// What a failed call says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Not passing (a refusal, a bad request, a parse error): fail now.
    Final,
    /// Passing (a rate limit, a server error, a timeout): try again after the policy's wait,
    /// or after what the server asked for.
    Again { after: Option<Duration> },
}

impl Attempt {
    /// `Again` without a wait asked for when `passing`, else `Final`.
    pub(crate) fn passing(passing: bool) -> Self {
        if passing {
            Attempt::Again { after: None }
        } else {
            Attempt::Final
        }
    }
}

/// How often and how patiently a call is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Extra attempts after the first.
    pub retries: u32,
    /// The first wait; each next one doubles it, and jitter adds up to as much again.
    pub base: Duration,
    /// No wait of the backoff is longer than this (a `Retry-After` is cut at
    /// [`MAX_RETRY_AFTER`] instead).
    pub max_wait: Duration,
}

impl RetryPolicy {
    /// `retries` extra attempts, starting at `base`, each wait at most 30 s.
    pub const fn new(retries: u32, base: Duration) -> Self {
        Self {
            retries,
            base,
            max_wait: Duration::from_secs(30),
        }
    }

    /// One attempt only.
    pub(crate) const fn never() -> Self {
        Self::new(0, Duration::ZERO)
    }

    /// The waits this policy would take, in order, when the server asks for none (for the
    /// tests and the docs; every call draws its own jitter).
    #[cfg(test)]
    pub(crate) fn waits(&self) -> Vec<Duration> {
        use backon::BackoffBuilder as _;
        self.backoff().build().collect()
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_jitter()
            .with_factor(2.0)
            .with_min_delay(self.base)
            .with_max_delay(self.max_wait)
            .with_max_times(self.retries as usize)
    }

    /// Runs `call` until it succeeds, fails in a way `classify` calls final, or the retries
    /// are spent; the last error is returned. Each retry is logged with `what` (never with
    /// the error's payload beyond its message).
    pub(crate) async fn run<T, E, F, Fut>(
        &self,
        what: &str,
        call: F,
        classify: impl Fn(&E) -> Attempt,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        call.retry(self.backoff())
            .sleep(tokio::time::sleep)
            .when(|error| classify(error) != Attempt::Final)
            .adjust(|error, wait| chosen_wait(classify(error), wait))
            .notify(|error, wait| {
                tracing::warn!(what, ?wait, error = %error, "call failed; retrying");
            })
            .await
    }
}

/// The wait before the next attempt: none when the backoff has no next attempt, else what
/// the server asked for (cut to [`MAX_RETRY_AFTER`]) or the backoff's own.
fn chosen_wait(attempt: Attempt, backoff: Option<Duration>) -> Option<Duration> {
    match attempt {
        Attempt::Again { after: Some(asked) } => backoff.map(|_| asked.min(MAX_RETRY_AFTER)),
        _ => backoff,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Failure(Attempt);

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }

    #[test]
    fn waits_double_from_the_base_with_jitter_up_to_as_much_again() {
        let policy = RetryPolicy::new(4, Duration::from_millis(100));
        for _ in 0..20 {
            let waits = policy.waits();
            assert_eq!(waits.len(), 4);
            for (i, wait) in waits.iter().enumerate() {
                let floor = Duration::from_millis(100 << i);
                assert!(
                    *wait >= floor && *wait <= floor * 2,
                    "wait {i} is {wait:?}, expected within [{floor:?}, {:?}]",
                    floor * 2
                );
            }
        }
        // Jitter: twenty draws of the first wait are not all alike.
        let firsts: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| policy.waits()[0]).collect();
        assert!(firsts.len() > 1, "no jitter: {firsts:?}");
    }

    #[test]
    fn no_wait_passes_the_ceiling() {
        let policy = RetryPolicy {
            retries: 8,
            base: Duration::from_millis(10),
            max_wait: Duration::from_millis(50),
        };
        assert!(
            policy
                .waits()
                .iter()
                .all(|wait| *wait <= Duration::from_millis(100))
        );
        assert!(RetryPolicy::never().waits().is_empty());
    }

    async fn calls_until(
        policy: RetryPolicy,
        failures: Vec<Attempt>,
    ) -> (Result<u32, String>, u32) {
        let calls = AtomicU32::new(0);
        let result = policy
            .run(
                "test",
                || {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    let outcome = match failures.get(n as usize) {
                        Some(attempt) => Err(Failure(*attempt)),
                        None => Ok(n),
                    };
                    async move { outcome }
                },
                |error: &Failure| error.0,
            )
            .await
            .map_err(|error| error.to_string());
        (result, calls.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn passing_failures_are_tried_again_final_ones_are_not() {
        let policy = RetryPolicy::new(3, Duration::from_millis(1));
        let again = Attempt::Again { after: None };
        assert_eq!(calls_until(policy, vec![again, again]).await, (Ok(2), 3));
        assert_eq!(
            calls_until(policy, vec![again, Attempt::Final]).await,
            (Err("Final".into()), 2)
        );
        // Retries spent: the last error comes back.
        assert_eq!(
            calls_until(policy, vec![again; 5]).await,
            (Err(format!("{again:?}")), 4)
        );
        assert_eq!(
            calls_until(RetryPolicy::never(), vec![again]).await,
            (Err(format!("{again:?}")), 1)
        );
    }

    #[tokio::test]
    async fn the_servers_retry_after_is_waited_for() {
        let policy = RetryPolicy::new(2, Duration::from_millis(1));
        let start = std::time::Instant::now();
        let asked = Attempt::Again {
            after: Some(Duration::from_millis(300)),
        };
        assert_eq!(calls_until(policy, vec![asked]).await, (Ok(1), 2));
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_retry_after_is_cut_at_the_ceiling_and_never_adds_an_attempt() {
        let asked = |secs| Attempt::Again {
            after: Some(Duration::from_secs(secs)),
        };
        let backoff = Some(Duration::from_millis(10));
        assert_eq!(chosen_wait(asked(3), backoff), Some(Duration::from_secs(3)));
        assert_eq!(chosen_wait(asked(3_600), backoff), Some(MAX_RETRY_AFTER));
        assert_eq!(chosen_wait(asked(3), None), None);
        assert_eq!(
            chosen_wait(Attempt::Again { after: None }, backoff),
            backoff
        );
    }

    #[test]
    fn retry_after_reads_seconds() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(reqwest::header::RETRY_AFTER, "0.5".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(500)));
        headers.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}
