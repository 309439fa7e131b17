//! Per-user request limits, keyed by the user the credentials name, never by address: every
//! authenticated request counts against its user's quota (`server.requests_per_minute`, a
//! burst of as many; past it 429 with `Retry-After`), and a user may have at most
//! `server.max_requests_per_user` requests in progress (past it 429 at once, before the body
//! is read, so slow bodies of a few users cannot hold every connection).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
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
    in_flight: Arc<Mutex<HashMap<UserId, usize>>>,
    max_in_flight: usize,
}

/// One request in progress; dropping it (when the request's body has been read, or its
/// stream ended) frees its place.
pub(crate) struct InFlight {
    counts: Arc<Mutex<HashMap<UserId, usize>>>,
    user: UserId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(count) = counts.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.user);
            }
        }
    }
}

/// Where a request's [`InFlight`] lives: the request body holds the slot (see
/// `guard::check_request`), so the place is freed when the body has been read and dropped —
/// not when the extractors are done with the request's head, which happens before.
#[derive(Clone, Default)]
pub(crate) struct InFlightSlot(Arc<Mutex<Option<InFlight>>>);

impl InFlightSlot {
    /// Whether the request was counted already.
    pub(crate) fn is_filled(&self) -> bool {
        self.0.lock().is_some()
    }

    pub(crate) fn fill(&self, in_flight: InFlight) {
        *self.0.lock() = Some(in_flight);
    }
}

impl UserRateLimit {
    /// `per_minute` requests a minute per user (0 turns the limit off), `max_in_flight` in
    /// progress at once.
    pub(crate) fn new(per_minute: u32, max_in_flight: usize) -> Self {
        Self {
            limiter: NonZeroU32::new(per_minute)
                .map(|rate| RateLimiter::keyed(Quota::per_minute(rate))),
            checks: AtomicU64::new(0),
            in_flight: Arc::default(),
            max_in_flight,
        }
    }

    /// Counts a request of `user` in progress until the returned guard drops; `None` when
    /// they already have `max_in_flight`.
    pub(crate) fn enter(&self, user: UserId) -> Option<InFlight> {
        let mut counts = self.in_flight.lock();
        let count = counts.entry(user).or_insert(0);
        if *count >= self.max_in_flight {
            return None;
        }
        *count += 1;
        Some(InFlight {
            counts: self.in_flight.clone(),
            user,
        })
    }

    /// Counts one request of `user`; `Err(wait)` when over the quota.
    pub(crate) fn check(&self, user: UserId) -> Result<(), Duration> {
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
