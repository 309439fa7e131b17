//! Per-user request rate limits: every authenticated request counts against its user's quota
//! (`server.requests_per_minute`, a burst of as many); past it the answer is 429 with
//! `Retry-After`. Keyed by the user the credentials name, never by address.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::store::UserId;

/// Checks between two prunings of users idle long enough to be back at a full quota.
const CHECKS_PER_PRUNE: u64 = 4096;

pub struct UserRateLimit {
    limiter: Option<DefaultKeyedRateLimiter<UserId>>,
    checks: AtomicU64,
}

impl UserRateLimit {
    /// `per_minute` requests a minute per user; 0 turns the limit off.
    pub fn new(per_minute: u32) -> Self {
        Self {
            limiter: NonZeroU32::new(per_minute)
                .map(|rate| RateLimiter::keyed(Quota::per_minute(rate))),
            checks: AtomicU64::new(0),
        }
    }

    /// Counts one request of `user`; `Err(wait)` when over the quota.
    pub fn check(&self, user: UserId) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % CHECKS_PER_PRUNE == CHECKS_PER_PRUNE - 1 {
            limiter.retain_recent();
        }
        limiter
            .check_key(&user)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}
