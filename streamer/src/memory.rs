//! The memory plan: how one `memory_limit` is divided. Every share of the limit — the part a
//! binding keeps for the samples it holds, the fetch engine's budget, the largest ranged GET,
//! the reserve kept for the consumer's reads, the read-buffer pool — is computed here, in
//! [`MemoryPlan::new`], and nowhere else, so that the whole division can be read (and tested)
//! in one place. `docs/streaming.md` ("Memory plan") has the same table in words.
//!
//! | share | of what | rule |
//! |---|---|---|
//! | `binding` | the limit | a quarter when a binding (Python) holds samples between the engine and the user, else 0 |
//! | `engine` | the limit | the rest: the fetch engine's byte budget (one semaphore of bytes) |
//! | `chunk` | `engine` | a quarter, at most [`MAX_CHUNK_BYTES`]: the largest ranged GET / buffer |
//! | `read_reserve` | `engine` | a quarter, at most 4 MiB (four runs): never taken by downloads |
//! | `fetch` | `engine` | `engine - read_reserve`: what downloads may hold at once |
//! | `read_pool` | `engine` | a sixteenth, between one and sixteen runs of [`RUN_BYTES`]: kept read buffers |
//! | `binding_chunk` | `binding` | an eighth, at most 4 MiB: one hand-over of samples to Python |
//! | `batch_pool` | `binding` | a half: kept column buffers of `iter_batches` batches |

/// Default memory budget when none is given.
pub const DEFAULT_MEMORY_LIMIT: u64 = 512 << 20;
/// Largest ranged GET (and so the largest single buffer of a download).
pub const MAX_CHUNK_BYTES: u64 = 8 << 20;
/// Largest run of consecutive samples a stream reads at once.
pub const RUN_BYTES: u64 = 1 << 20;

/// Share of the limit kept by a binding that holds samples between the engine and its user
/// (chunks in the channel, the one being filled, the one being handed out, and the column
/// buffers of dropped `iter_batches` batches kept for reuse): 1/4.
const BINDING_SHARE: u64 = 4;
/// Largest hand-over of samples from the binding's reader thread to Python.
const MAX_BINDING_CHUNK: u64 = 4 << 20;
/// The read reserve's cap: four runs.
const MAX_READ_RESERVE: u64 = 4 * RUN_BYTES;
/// The largest budget a tokio semaphore can count.
const MAX_BUDGET: u64 = tokio::sync::Semaphore::MAX_PERMITS as u64;

/// How one `memory_limit` is divided (see the module doc for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The limit as given (or [`DEFAULT_MEMORY_LIMIT`]), at least 1.
    pub limit: u64,
    /// Kept by a binding for the samples it holds; 0 for the engine alone.
    pub binding: u64,
    /// The fetch engine's budget: `limit - binding`, at most what a semaphore counts.
    pub engine: u64,
    /// The largest ranged GET (and single download buffer).
    pub chunk: u64,
    /// Part of `engine` that downloads never take, for the consumer's reads.
    pub read_reserve: u64,
    /// Part of `engine` that downloads may hold at once.
    pub fetch: u64,
    /// Bytes of read buffers kept for reuse.
    pub read_pool: u64,
    /// Largest hand-over of samples from a binding's reader thread (0 without a binding).
    pub binding_chunk: u64,
    /// Bytes of `iter_batches` column buffers a binding keeps for reuse (0 without a binding).
    pub batch_pool: u64,
}

impl MemoryPlan {
    /// The plan of the fetch engine alone (the CLI, the mount, Rust users).
    pub fn new(memory_limit: Option<u64>) -> MemoryPlan {
        Self::split(memory_limit, 0)
    }

    /// The plan of a binding that holds samples between the engine and its user (Python).
    pub fn with_binding(memory_limit: Option<u64>) -> MemoryPlan {
        let limit = memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT).max(1);
        Self::split(Some(limit), limit / BINDING_SHARE)
    }

    /// The plan of `memory_limit` of which a binding keeps `binding` bytes.
    fn split(memory_limit: Option<u64>, binding: u64) -> MemoryPlan {
        let limit = memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT).max(1);
        let engine = (limit - binding).clamp(1, MAX_BUDGET);
        let read_reserve = (engine / 4).min(MAX_READ_RESERVE);
        let one_run = RUN_BYTES + 4096;
        MemoryPlan {
            limit,
            binding,
            engine,
            chunk: (engine / 4).clamp(1, MAX_CHUNK_BYTES),
            read_reserve,
            fetch: (engine - read_reserve).max(1),
            read_pool: (engine / 16).clamp(one_run, 16 * RUN_BYTES),
            binding_chunk: if binding == 0 {
                0
            } else {
                (binding / 8).clamp(1, MAX_BINDING_CHUNK)
            },
            batch_pool: binding / 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_plan() {
        let p = MemoryPlan::new(None);
        assert_eq!(p.limit, 512 << 20);
        assert_eq!(p.engine, 512 << 20);
        assert_eq!(p.chunk, 8 << 20);
        assert_eq!(p.read_reserve, 4 << 20);
        assert_eq!(p.fetch, 508 << 20);
        assert_eq!(p.read_pool, 16 << 20);
        assert_eq!((p.binding, p.binding_chunk, p.batch_pool), (0, 0, 0));
    }

    #[test]
    fn a_binding_keeps_a_quarter_and_the_engine_plans_the_rest() {
        let p = MemoryPlan::with_binding(Some(64 << 20));
        assert_eq!(p.binding, 16 << 20);
        assert_eq!(p.engine, 48 << 20);
        assert_eq!(p.binding_chunk, 2 << 20);
        assert_eq!(p.batch_pool, 8 << 20);
        // What the engine then plans from the budget it was passed is the same plan.
        let engine = MemoryPlan::new(Some(p.engine));
        assert_eq!(
            (
                engine.chunk,
                engine.read_reserve,
                engine.fetch,
                engine.read_pool
            ),
            (p.chunk, p.read_reserve, p.fetch, p.read_pool)
        );
    }

    #[test]
    fn shares_never_exceed_their_whole_and_small_limits_still_work() {
        for limit in [1, 3, 100, 4096, 1 << 20, 5 << 20, 1 << 30, u64::MAX] {
            for p in [
                MemoryPlan::new(Some(limit)),
                MemoryPlan::with_binding(Some(limit)),
            ] {
                assert!(
                    p.binding + p.engine <= p.limit.max(1) || p.engine == 1,
                    "{p:?}"
                );
                assert!(p.chunk >= 1 && p.chunk <= p.engine.max(1), "{p:?}");
                assert!(p.read_reserve + p.fetch <= p.engine.max(1) + 1, "{p:?}");
                assert!(p.binding_chunk <= p.binding.max(1), "{p:?}");
                assert!(p.batch_pool <= p.binding, "{p:?}");
            }
        }
    }
}
