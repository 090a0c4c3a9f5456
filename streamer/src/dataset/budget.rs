//! The one memory budget (`memory_limit`): a semaphore whose permits are bytes. Every buffer the
//! engine holds (a ranged-GET chunk on its way to the cache file, a decompression buffer, a read
//! of samples waiting for the consumer) takes its size in permits first and gives them back when
//! it is dropped, so the bytes held at once never exceed the limit.
//!
//! Downloads hold at most `limit - read reserve` of it ([`Budget::acquire_fetch`]): the reserve
//! (the memory plan's `read_reserve`, [`MemoryPlan`]) is left for the consumer's reads, so a first sample is never queued behind
//! every chunk the prefetch has asked for, and a read never waits on a server that is slow to
//! answer requests of other bytes.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Result, StreamerError};
use crate::memory::MemoryPlan;

/// Bytes of the budget held by one buffer; released on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    _permit: Option<OwnedSemaphorePermit>,
    /// A download's share of the fetch allowance.
    _fetch: Option<OwnedSemaphorePermit>,
}

impl Lease {
    fn of(permit: Option<OwnedSemaphorePermit>) -> Lease {
        Lease {
            _permit: permit,
            _fetch: None,
        }
    }
}

/// The shared byte budget.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    /// The part downloads may hold (the plan's `fetch`).
    fetch: Arc<Semaphore>,
    limit: u64,
    fetch_limit: u64,
}

/// The largest single request a tokio semaphore takes at once.
const MAX_ONE_ACQUIRE: u64 = u32::MAX as u64;

impl Budget {
    /// The budget of a memory plan: `engine` bytes, of which downloads hold at most `fetch`.
    pub(crate) fn new(plan: &MemoryPlan) -> Budget {
        Budget {
            sem: Arc::new(Semaphore::new(plan.engine as usize)),
            fetch: Arc::new(Semaphore::new(plan.fetch as usize)),
            limit: plan.engine,
            fetch_limit: plan.fetch,
        }
    }

    /// The limit in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub(crate) fn in_use(&self) -> u64 {
        self.limit - self.sem.available_permits() as u64
    }

    /// Bytes free now.
    pub(crate) fn free(&self) -> u64 {
        self.sem.available_permits() as u64
    }

    fn check(&self, what: &(dyn Fn() -> String + Sync), bytes: u64) -> Result<u32> {
        if bytes > self.limit || bytes > MAX_ONE_ACQUIRE {
            return Err(StreamerError::BudgetExceeded {
                what: what(),
                need: bytes,
                limit: self.limit,
            });
        }
        // Checked just above.
        Ok(bytes as u32)
    }

    /// Waits until `bytes` are free and takes them. A request larger than the whole budget is
    /// an error, never a wait that could not end.
    pub(crate) async fn acquire(
        &self,
        what: &(dyn Fn() -> String + Sync),
        bytes: u64,
    ) -> Result<Lease> {
        let n = self.check(what, bytes)?;
        if n == 0 {
            return Ok(Lease::of(None));
        }
        let permit = Arc::clone(&self.sem)
            .acquire_many_owned(n)
            .await
            .map_err(|_| StreamerError::Engine("memory budget closed".into()))?;
        Ok(Lease::of(Some(permit)))
    }

    /// [`Budget::acquire`] for a download's buffer: also inside the fetch allowance, so that
    /// the read reserve stays free for the consumer. A chunk larger than the allowance is
    /// charged the whole allowance.
    pub(crate) async fn acquire_fetch(
        &self,
        what: &(dyn Fn() -> String + Sync),
        bytes: u64,
    ) -> Result<Lease> {
        let n = self.check(what, bytes)?;
        let share = u64::from(n).min(self.fetch_limit()) as u32;
        let fetch = match share {
            0 => None,
            share => Some(
                Arc::clone(&self.fetch)
                    .acquire_many_owned(share)
                    .await
                    .map_err(|_| StreamerError::Engine("memory budget closed".into()))?,
            ),
        };
        let mut lease = self.acquire(what, bytes).await?;
        lease._fetch = fetch;
        Ok(lease)
    }

    /// Bytes downloads may hold at once.
    fn fetch_limit(&self) -> u64 {
        self.fetch_limit
    }

    /// Takes `bytes` if they are free now; `None` (nothing taken) if they are not, or if the
    /// request could never fit.
    pub(crate) fn try_acquire(&self, bytes: u64) -> Option<Lease> {
        let n = u32::try_from(bytes).ok().filter(|_| bytes <= self.limit)?;
        if n == 0 {
            return Some(Lease::of(None));
        }
        let permit = Arc::clone(&self.sem).try_acquire_many_owned(n).ok()?;
        Some(Lease::of(Some(permit)))
    }

    /// [`Budget::acquire`] for a plain thread (the consumer's).
    pub(crate) fn acquire_blocking(
        &self,
        what: &(dyn Fn() -> String + Sync),
        bytes: u64,
    ) -> Result<Lease> {
        self.check(what, bytes)?;
        if let Some(lease) = self.try_acquire(bytes) {
            return Ok(lease);
        }
        futures::executor::block_on(self.acquire(what, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_bytes_until_dropped_and_refuses_oversized_requests() {
        let budget = Budget::new(&MemoryPlan::new(Some(100)));
        let what = || "test".to_string();
        let a = budget.acquire_blocking(&what, 60).unwrap();
        assert_eq!(budget.in_use(), 60);
        assert!(Arc::clone(&budget.sem).try_acquire_many_owned(50).is_err());
        drop(a);
        assert_eq!(budget.in_use(), 0);
        // Downloads leave the read reserve free.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let big = Budget::new(&MemoryPlan::new(Some(16 << 20)));
        let chunks: Vec<Lease> = (0..3)
            .map(|_| rt.block_on(big.acquire_fetch(&what, 4 << 20)).unwrap())
            .collect();
        assert_eq!(big.in_use(), 12 << 20);
        assert!(Arc::clone(&big.fetch).try_acquire_many_owned(1).is_err());
        let read = big
            .acquire_blocking(&what, MemoryPlan::new(Some(16 << 20)).read_reserve)
            .unwrap();
        assert_eq!(big.in_use(), 16 << 20);
        drop((chunks, read));
        let err = budget.acquire_blocking(&what, 101).unwrap_err();
        assert!(matches!(
            err,
            StreamerError::BudgetExceeded {
                need: 101,
                limit: 100,
                ..
            }
        ));
    }

    #[test]
    fn try_acquire_takes_only_what_is_free_now() {
        let budget = Budget::new(&MemoryPlan::new(Some(100)));
        let a = budget.try_acquire(70).unwrap();
        assert_eq!(budget.in_use(), 70);
        assert!(budget.try_acquire(31).is_none(), "only 30 are free");
        assert_eq!(budget.in_use(), 70, "a refused request takes nothing");
        let b = budget.try_acquire(30).unwrap();
        assert_eq!(budget.in_use(), 100);
        drop((a, b));
        assert!(
            budget.try_acquire(101).is_none(),
            "larger than the whole budget"
        );
        assert!(budget.try_acquire(0).is_some());
        assert_eq!(budget.in_use(), 0);
    }
}
