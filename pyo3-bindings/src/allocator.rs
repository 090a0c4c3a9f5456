//! The two places where the binding steers glibc's malloc, which allocates every Python object
//! (and so every sample's `bytes`) and every Rust buffer of the process.
//!
//! - [`trim`] returns the free memory of malloc's arenas to the kernel before a DataLoader
//!   forks its workers, so that they do not inherit the read buffers the parent just freed.
//! - [`prime_for`] raises malloc's mmap and trim thresholds to fit large samples, through
//!   malloc's own adaptive rule. glibc serves an allocation of 128 KiB or more with a fresh
//!   `mmap` and trims the heap's top once more than 128 KiB is free there, until it sees such a
//!   mapped block freed: then the mmap threshold becomes that block's size and the trim
//!   threshold twice it. Where they stand when the first large samples arrive depends on the
//!   process's history, and when they are low every sample's `bytes` lands on fresh pages: 1 MB
//!   samples read warm in the benchmark's child process (`benches/lib/consume.py`, after a cold
//!   epoch) took 114 page faults a sample and ran at 2,800-3,150 samples/s, against 34-278
//!   faults per 100 samples and 5,000-7,800 samples/s primed (commit 90d5eb2's message;
//!   benches/README.md). Freeing one block of four times the sample's size raises them as the
//!   program's own free of such a block would. It may not: if malloc serves that block from
//!   free heap memory, the thresholds are already above it. A threshold the user set
//!   (`mallopt`, `MALLOC_MMAP_THRESHOLD_`) turns the rule off and is left alone, and a Python
//!   whose objects do not come from glibc's malloc (`PYTHONMALLOC=mimalloc`, free-threaded
//!   builds) gains nothing from it and loses nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Below glibc's initial mmap threshold, a sample's `bytes` comes from the heap anyway.
const PRIME_FROM: usize = 128 << 10;
/// glibc adapts only to freed blocks of at most 32 MiB (`DEFAULT_MMAP_THRESHOLD_MAX`).
const PRIME_MAX: usize = 16 << 20;
/// The largest stored sample size this process primed malloc for (0: none yet). Inherited
/// through `fork` with malloc's own state, which is what it describes.
static PRIMED_FOR: AtomicUsize = AtomicUsize::new(0);

/// Makes malloc keep the memory of samples of `bytes` for reuse (module doc). Costs one atomic
/// load for a small sample or one already primed for, else one `malloc` and `free`.
pub fn prime_for(bytes: usize) {
    if bytes < PRIME_FROM {
        return;
    }
    let primed = PRIMED_FOR.load(Ordering::Relaxed);
    // Samples of about one size do not prime again; one twice as large does.
    if bytes <= primed.saturating_mul(2) {
        return;
    }
    PRIMED_FOR.fetch_max(bytes, Ordering::Relaxed);
    raise_thresholds(bytes.saturating_mul(4).min(PRIME_MAX));
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // a malloc and a free of one untouched block
fn raise_thresholds(size: usize) {
    // SAFETY: the block is freed at once, with the allocator it came from, and never touched.
    // `black_box` keeps the compiler from eliding the pair, which it may for an unused block.
    unsafe {
        let block = std::hint::black_box(libc::malloc(size));
        if !block.is_null() {
            libc::free(block);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn raise_thresholds(_size: usize) {}

/// Returns malloc's free memory to the kernel (before a fork; see the module doc).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // one FFI call without arguments to free memory
pub fn trim() {
    // SAFETY: malloc_trim takes no pointers and only returns free memory of the allocator's
    // own arenas to the kernel; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sample_twice_as_large_primes_again() {
        prime_for(1 << 10);
        assert_eq!(
            PRIMED_FOR.load(Ordering::Relaxed),
            0,
            "small samples never prime"
        );
        prime_for(1 << 20);
        assert_eq!(PRIMED_FOR.load(Ordering::Relaxed), 1 << 20);
        prime_for((1 << 20) + 4096);
        assert_eq!(PRIMED_FOR.load(Ordering::Relaxed), 1 << 20);
        prime_for(3 << 20);
        assert_eq!(PRIMED_FOR.load(Ordering::Relaxed), 3 << 20);
    }
}
