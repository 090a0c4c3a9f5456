//! Limits shared by every upload of one [`crate::RankWriter`]: a byte budget for part buffers,
//! a cap on requests in flight, and an optional PUT-rate cap (a token bucket).

use crate::error::{CheckpointError, Result};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Permits are counted in KiB so that a 5 GiB part fits tokio's `u32` acquire count.
const UNIT: u64 = 1024;

/// Host memory for part buffers, in bytes. A buffer holds its permit from the moment it is
/// allocated until its upload finishes.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    sem: Arc<Semaphore>,
    units: u64,
}

/// A held share of a [`ByteBudget`]; dropping it returns the bytes.
#[derive(Debug)]
pub struct BudgetPermit {
    _permit: OwnedSemaphorePermit,
}

impl ByteBudget {
    /// A budget of `bytes` (rounded down to whole KiB, at least 1 KiB).
    pub fn new(bytes: u64) -> Self {
        let units = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
        Self {
            sem: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Waits until `bytes` are free and takes them.
    pub async fn acquire(&self, bytes: u64) -> Result<BudgetPermit> {
        let want = bytes.div_ceil(UNIT).clamp(1, self.units);
        let n = u32::try_from(want).map_err(|_| {
            CheckpointError::InvalidConfig(format!("a {bytes}-byte buffer exceeds the budget"))
        })?;
        let permit = self
            .sem
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| CheckpointError::InvalidConfig("budget closed".into()))?;
        Ok(BudgetPermit { _permit: permit })
    }

    /// Bytes not held right now.
    #[cfg(test)]
    pub fn available(&self) -> u64 {
        self.sem.available_permits() as u64 * UNIT
    }
}

/// Caps requests per second. Waiting callers are served in arrival order because each one
/// reserves its slot under the lock before sleeping.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    next: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// A limiter of `per_second` requests per second, with a burst of one request.
    pub fn new(per_second: f64) -> Self {
        let secs = if per_second.is_finite() && per_second > 0.0 {
            1.0 / per_second
        } else {
            0.0
        };
        Self {
            interval: Duration::from_secs_f64(secs.min(3_600.0)),
            next: Mutex::new(None),
        }
    }

    /// Waits for this caller's slot.
    pub async fn acquire(&self) {
        let slot = {
            let now = Instant::now();
            let mut next = match self.next.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            let slot = next.map_or(now, |n| n.max(now));
            *next = Some(slot + self.interval);
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_blocks_until_released() {
        let b = ByteBudget::new(10 * 1024);
        let p1 = b.acquire(6 * 1024).await.unwrap();
        assert_eq!(b.available(), 4 * 1024);
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.acquire(6 * 1024).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(p1);
        waiter.await.unwrap().unwrap();
        assert_eq!(b.available(), 10 * 1024);
    }

    #[tokio::test]
    async fn oversized_request_takes_whole_budget() {
        let b = ByteBudget::new(4096);
        let p = b.acquire(1 << 40).await.unwrap();
        assert_eq!(b.available(), 0);
        drop(p);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_spaces_requests() {
        let r = RateLimiter::new(10.0);
        let start = Instant::now();
        for _ in 0..21 {
            r.acquire().await;
        }
        // 21 requests at 10/s: the last one starts 2 s after the first.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
