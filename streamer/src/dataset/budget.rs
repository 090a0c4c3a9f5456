//! The one memory budget (`memory_limit`): a semaphore whose permits are bytes. Every buffer the
//! engine holds (a ranged-GET chunk on its way to the cache file, a decompression buffer, a read
//! of samples waiting for the consumer) takes its size in permits first and gives them back when
//! it is dropped, so the bytes held at once never exceed the limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Result, StreamerError};

/// Bytes of the budget held by one buffer; released on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    _permit: Option<OwnedSemaphorePermit>,
}

/// The shared byte budget.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    limit: u64,
}

/// The largest single request a tokio semaphore takes at once.
const MAX_ONE_ACQUIRE: u64 = u32::MAX as u64;

impl Budget {
    pub(crate) fn new(limit: u64) -> Budget {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS as u64);
        Budget {
            sem: Arc::new(Semaphore::new(limit as usize)),
            limit,
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
            return Ok(Lease { _permit: None });
        }
        let permit = Arc::clone(&self.sem)
            .acquire_many_owned(n)
            .await
            .map_err(|_| StreamerError::Engine("memory budget closed".into()))?;
        Ok(Lease {
            _permit: Some(permit),
        })
    }

    /// [`Budget::acquire`] for a plain thread (the consumer's).
    pub(crate) fn acquire_blocking(
        &self,
        what: &(dyn Fn() -> String + Sync),
        bytes: u64,
    ) -> Result<Lease> {
        let n = self.check(what, bytes)?;
        if n == 0 {
            return Ok(Lease { _permit: None });
        }
        if let Ok(permit) = Arc::clone(&self.sem).try_acquire_many_owned(n) {
            return Ok(Lease {
                _permit: Some(permit),
            });
        }
        futures::executor::block_on(self.acquire(what, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_bytes_until_dropped_and_refuses_oversized_requests() {
        let budget = Budget::new(100);
        let what = || "test".to_string();
        let a = budget.acquire_blocking(&what, 60).unwrap();
        assert_eq!(budget.in_use(), 60);
        assert!(Arc::clone(&budget.sem).try_acquire_many_owned(50).is_err());
        drop(a);
        assert_eq!(budget.in_use(), 0);
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
}
